//! Polling instead of sleeping, for a short while, on the request path.
//!
//! On virtual machines an idle vCPU halts, and waking it again (an interrupt through the
//! hypervisor) costs tens of microseconds: on the 2-vCPU VM the benchmarks run on, a 64-byte TCP
//! ping-pong between two processes takes ~104 µs at p50 when both sides sleep in `recv`, ~24 µs
//! when one side polls and ~11 µs when both do. A put is three such round trips, so the wake-ups,
//! not the work, set its latency.
//!
//! Two tools, each bounded in time so an idle process costs nothing:
//! - [`HotWindow`] (servers): for `window` after the last request, a task keeps the runtime turning
//!   (every turn polls the reactor without blocking), so the next request is noticed without the
//!   thread ever going idle;
//! - [`until_readable`] (clients): after sending a request, peek at the socket until the reply's
//!   bytes are there or a deadline has passed, then wait the usual way. One deadline covers a
//!   whole reply: a fresh budget per chunk of a large value measured worse than never polling
//!   (1 MiB reads: 470–650 µs p50 against 272 µs), because a budget that runs out mid-transfer
//!   adds a sleep and a wake-up per chunk.
//!
//! Both give the CPU away (`sched_yield`) on every turn, so on a machine with more runnable
//! threads than CPUs a poller never keeps the process it waits for from running.

use std::mem::MaybeUninit;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// The default polling time: longer than a metadata round trip between hot processes (~20 µs)
/// and the gap between the calls of one put, short enough to cost nothing noticeable when idle.
pub const DEFAULT_SPIN: Duration = Duration::from_micros(200);

/// Keeps a runtime polling for `window` after each [`touch`](Self::touch).
#[derive(Debug)]
pub struct HotWindow {
    window: Duration,
    base: Instant,
    /// nanoseconds after `base` until which the runtime stays hot
    until: AtomicU64,
    /// whether the polling task is in its loop (a touch then needs no notification)
    polling: AtomicBool,
    /// set by [`stop`](Self::stop): the polling task ends
    stopped: AtomicBool,
    wake: Notify,
}

impl HotWindow {
    /// A window of `window` (zero: never poll), with its task spawned on the current runtime.
    pub fn start(window: Duration) -> Arc<Self> {
        let hot = Arc::new(Self {
            window,
            base: Instant::now(),
            until: AtomicU64::new(0),
            polling: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
            wake: Notify::new(),
        });
        if !window.is_zero() {
            tokio::spawn(poll_while_hot(hot.clone()));
        }
        hot
    }

    /// Marks a request served now: stay hot for another `window`.
    pub fn touch(&self) {
        if self.window.is_zero() || self.stopped.load(Ordering::Relaxed) {
            return;
        }
        let until = self.nanos() + self.window.as_nanos() as u64;
        self.until.fetch_max(until, Ordering::SeqCst);
        if !self.polling.load(Ordering::SeqCst) {
            self.wake.notify_one();
        }
    }

    /// Ends the polling task (the server it kept hot has stopped); later touches do nothing.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        self.until.store(0, Ordering::SeqCst);
        self.wake.notify_one();
    }

    fn nanos(&self) -> u64 {
        self.base.elapsed().as_nanos() as u64
    }

    fn hot(&self) -> bool {
        self.nanos() < self.until.load(Ordering::SeqCst)
    }
}

/// The polling task: sleeps until touched, then turns the runtime over until the window closes.
/// It lives until [`HotWindow::stop`] (or as long as the runtime it was spawned on).
async fn poll_while_hot(hot: Arc<HotWindow>) {
    loop {
        let notified = hot.wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if hot.stopped.load(Ordering::SeqCst) {
            return;
        }
        if !hot.hot() {
            notified.await;
            continue;
        }
        hot.polling.store(true, Ordering::SeqCst);
        while hot.hot() {
            std::thread::yield_now();
            tokio::task::yield_now().await;
        }
        hot.polling.store(false, Ordering::SeqCst);
    }
}

/// The polling budget for a reply that comes with or after `bytes` crossing the connection: `spin`
/// plus the time the bytes take at 1 GB/s (a slow loopback), at most 10 ms. A reply to a 4 MiB
/// write comes a millisecond or more after the last byte was sent; sleeping through that gap
/// would add a wake-up to every large put.
pub fn after_transfer(spin: Duration, bytes: u64) -> Duration {
    if spin.is_zero() {
        return spin;
    }
    (spin + Duration::from_nanos(bytes)).min(Duration::from_millis(10))
}

/// Waits, polling until `until` at the latest, until `s` has bytes to read (or the peer closed
/// it); after `until` it returns and the caller's read waits the usual way.
pub fn until_readable(s: &impl std::os::fd::AsFd, until: Instant) {
    if Instant::now() >= until {
        return;
    }
    let sock = socket2::SockRef::from(s);
    let mut one = [MaybeUninit::<u8>::uninit(); 1];
    loop {
        match sock.peek(&mut one) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            // data, end of stream, or an error the caller's read will report
            _ => return,
        }
        if Instant::now() >= until {
            return;
        }
        std::thread::yield_now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpStream;

    #[test]
    fn a_transfer_adds_its_time_at_one_gigabyte_per_second_up_to_ten_ms() {
        let spin = Duration::from_micros(200);
        assert_eq!(after_transfer(spin, 0), spin);
        assert_eq!(after_transfer(spin, 1_000_000), Duration::from_micros(1200));
        assert_eq!(after_transfer(spin, 1 << 40), Duration::from_millis(10));
        assert_eq!(after_transfer(Duration::ZERO, 1 << 20), Duration::ZERO);
    }

    /// Polled every millisecond: the window it watches lasts 20 ms.
    async fn wait_for(mut cond: impl FnMut() -> bool) {
        let every = Duration::from_millis(1);
        crate::eventually::eventually_async_every(Duration::from_secs(2), every, "the condition", || {
            std::future::ready(cond())
        })
        .await
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_touch_polls_for_the_window_then_the_task_sleeps_again() {
        let hot = HotWindow::start(Duration::from_millis(20));
        tokio::task::yield_now().await;
        assert!(!hot.polling.load(Ordering::SeqCst), "polls before any request");
        hot.touch();
        wait_for(|| hot.polling.load(Ordering::SeqCst)).await;
        // the runtime keeps running other tasks while it polls
        let other = tokio::spawn(async { 7 });
        assert_eq!(other.await.unwrap(), 7);
        wait_for(|| !hot.polling.load(Ordering::SeqCst)).await;
        assert!(!hot.hot());
        // and a later touch starts it again
        hot.touch();
        wait_for(|| hot.polling.load(Ordering::SeqCst)).await;
        // a stop ends the task, even mid-window
        hot.stop();
        wait_for(|| Arc::strong_count(&hot) == 1).await;
        hot.touch();
        assert!(!hot.hot());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_zero_window_never_polls() {
        let hot = HotWindow::start(Duration::ZERO);
        hot.touch();
        // on this one-thread runtime a polling task, had one been spawned, runs during these turns
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(!hot.polling.load(Ordering::SeqCst));
        assert!(!hot.hot());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn until_readable_returns_once_bytes_wait_and_after_its_budget_when_none_do() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (mut server, _) = l.accept().await.unwrap();
        // nothing to read: gives up at the deadline
        until_readable(&client, Instant::now() + Duration::from_millis(2));
        server.write_all(b"x").await.unwrap();
        let forever = Instant::now() + Duration::from_secs(600);
        until_readable(&client, forever);
        let mut one = [MaybeUninit::<u8>::uninit(); 1];
        assert_eq!(socket2::SockRef::from(&client).peek(&mut one).unwrap(), 1);
        // end of stream counts as readable too
        let mut b = [0u8; 1];
        assert_eq!(
            std::io::Read::read(&mut &*socket2::SockRef::from(&client), &mut b).unwrap(),
            1
        );
        drop(server);
        until_readable(&client, forever);
    }
}
