//! Waiting on a condition in a test, the one way every test here waits: poll, and fail with what
//! was awaited after a liveness bound (never a timing assertion). Included by path (`#[path]`)
//! in the e2e tests and the store's tests; the async form for tests on a tokio runtime.

#![allow(dead_code)]

use std::time::{Duration, Instant};

/// How often a condition is polled.
pub const POLL: Duration = Duration::from_millis(50);

/// Polls `f` until it gives a value; fails the test after `within`.
pub fn eventually_within<T>(within: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        std::thread::sleep(POLL);
    }
}

/// [`eventually_within`] `secs` seconds.
pub fn eventually<T>(secs: u64, what: &str, f: impl FnMut() -> Option<T>) -> T {
    eventually_within(Duration::from_secs(secs), what, f)
}

/// The same on a tokio runtime: polls the future `f` makes until it is true; fails after
/// `within`.
pub async fn eventually_async<F, Fut>(within: Duration, what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    while !f().await {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        tokio::time::sleep(POLL).await;
    }
}
