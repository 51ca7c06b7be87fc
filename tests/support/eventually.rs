//! Waiting on a condition in a test, the one way every test here waits: poll, and fail with what
//! was awaited after a liveness bound (never a timing assertion). Included by path (`#[path]`)
//! in the e2e tests, the store's tests and both crates' unit tests; the async forms for tests on
//! a tokio runtime.

#![allow(dead_code)]

use std::time::{Duration, Instant};

/// How often a condition is polled.
pub const POLL: Duration = Duration::from_millis(50);

/// Polls `f` every `every` until it gives a value; `None` once `within` has passed without one
/// (for a caller that reports the timeout itself, with logs).
pub fn poll_within<T>(within: Duration, every: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(every);
    }
}

/// Polls `f` until it gives a value; fails the test after `within`.
pub fn eventually_within<T>(within: Duration, what: &str, f: impl FnMut() -> Option<T>) -> T {
    poll_within(within, POLL, f).unwrap_or_else(|| panic!("{what}: not within {within:?}"))
}

/// [`eventually_within`] `secs` seconds.
pub fn eventually<T>(secs: u64, what: &str, f: impl FnMut() -> Option<T>) -> T {
    eventually_within(Duration::from_secs(secs), what, f)
}

/// The same on a tokio runtime: polls the future `f` makes until it is true; fails after
/// `within`.
pub async fn eventually_async<F, Fut>(within: Duration, what: &str, f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    eventually_async_every(within, POLL, what, f).await
}

/// [`eventually_async`] polling every `every`, for a condition that holds only briefly.
pub async fn eventually_async_every<F, Fut>(within: Duration, every: Duration, what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    while !f().await {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        tokio::time::sleep(every).await;
    }
}
