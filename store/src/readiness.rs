//! Readiness as an explicit state, shared by everything that serves or reports it.
//!
//! A process starts in [`Readiness::Starting`], moves to [`Readiness::Serving`] once it can answer
//! (a leader: listeners bound and housekeeping running; a member: segment mounted at a leader),
//! may be put in [`Readiness::Standby`] (a leader that does not hold the election: nobody sets it
//! yet), and ends in [`Readiness::Stopping`] once its cancellation token fires. `Stopping` is
//! final: later changes are ignored, so a stop is never undone by a late mount or election.
//!
//! [`ReadinessHandle`] is a cheap clone over a `tokio::sync::watch` channel: `/readyz`, `Health`
//! and metrics read it, tests and a future election await or drive it. Reading takes a short read
//! lock, so the per-request paths (the fast port, the data port) never consult it.

use std::fmt;
use std::sync::Arc;

use tokio::sync::watch;

/// Where a process is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Readiness {
    /// Binding, mounting, or otherwise not yet able to answer.
    Starting,
    /// Answering requests: the only state in which `/readyz` is 200.
    Serving,
    /// Up, but another process serves (a leader that lost the election).
    Standby,
    /// Its cancellation token fired: draining and about to exit.
    Stopping,
}

impl Readiness {
    /// The lower-case name `/readyz` answers with.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Starting => "starting",
            Self::Serving => "serving",
            Self::Standby => "standby",
            Self::Stopping => "stopping",
        }
    }
}

impl fmt::Display for Readiness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A shared, observable [`Readiness`]; clones see and change the same state.
#[derive(Debug, Clone)]
pub struct ReadinessHandle {
    tx: Arc<watch::Sender<Readiness>>,
}

impl Default for ReadinessHandle {
    fn default() -> Self {
        Self::new()
    }
}

impl ReadinessHandle {
    /// A new handle in [`Readiness::Starting`].
    pub fn new() -> Self {
        Self {
            tx: Arc::new(watch::Sender::new(Readiness::Starting)),
        }
    }

    /// The current state.
    pub fn get(&self) -> Readiness {
        *self.tx.borrow()
    }

    pub fn is_serving(&self) -> bool {
        self.get() == Readiness::Serving
    }

    /// Moves to `next`, unless the process is already stopping. Returns whether the state is now
    /// `next`.
    pub fn set(&self, next: Readiness) -> bool {
        self.tx.send_if_modified(|cur| {
            if *cur == Readiness::Stopping || *cur == next {
                return false;
            }
            tracing::info!(from = %cur, to = %next, "readiness");
            *cur = next;
            true
        });
        self.get() == next
    }

    /// A receiver that sees every later change.
    pub fn subscribe(&self) -> watch::Receiver<Readiness> {
        self.tx.subscribe()
    }

    /// Waits until the state is `want` (at once if it already is). Returns `false` if the process
    /// stopped first (and `want` is not `Stopping`).
    pub async fn wait_for(&self, want: Readiness) -> bool {
        let mut rx = self.subscribe();
        let reached = rx
            .wait_for(|s| *s == want || *s == Readiness::Stopping)
            .await
            .map(|s| *s == want);
        // the sender lives in `self`, so the channel cannot close while we wait
        reached.unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_starting_and_stopping_is_final() {
        let r = ReadinessHandle::new();
        assert_eq!(r.get(), Readiness::Starting);
        assert!(r.set(Readiness::Serving));
        assert!(r.clone().is_serving(), "clones share the state");
        assert!(r.set(Readiness::Standby));
        assert!(r.set(Readiness::Stopping));
        assert!(!r.set(Readiness::Serving), "a stop is not undone");
        assert_eq!(r.get(), Readiness::Stopping);
        assert_eq!(r.get().to_string(), "stopping");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn waiters_see_the_state_they_wait_for_or_the_stop() {
        let r = ReadinessHandle::new();
        let waiter = tokio::spawn({
            let r = r.clone();
            async move { r.wait_for(Readiness::Serving).await }
        });
        tokio::task::yield_now().await;
        r.set(Readiness::Serving);
        assert!(waiter.await.unwrap());
        assert!(r.wait_for(Readiness::Serving).await, "already there");

        let standby = tokio::spawn({
            let r = r.clone();
            async move { r.wait_for(Readiness::Standby).await }
        });
        tokio::task::yield_now().await;
        r.set(Readiness::Stopping);
        assert!(!standby.await.unwrap(), "stopped before standby");
        assert!(r.wait_for(Readiness::Stopping).await);
    }
}
