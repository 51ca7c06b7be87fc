//! Fan-out of durable changes to watchers.
//!
//! The hub keeps the last `history` events in memory. A watcher starting after revision `r`
//! first receives the retained events newer than `r`, then live ones; if events newer than `r`
//! were already dropped from the history, the watch is refused as [`StorageError::Expired`] and
//! the client re-lists. Only durable events are published, in revision order.
//!
//! Every watcher has a bounded queue. A watcher that falls behind is closed (its stream ends with
//! an error saying so) and counted, never silently skipped past: skipping would leave its client
//! with a wrong picture it cannot detect.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{StorageError, Value};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    Put,
    Delete,
}

/// One durable change of one key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchEvent {
    pub kind: EventKind,
    pub key: String,
    /// The revision of the change.
    pub revision: u64,
    /// The new value (`Put`) or the last value before deletion (`Delete`).
    pub value: Value,
    /// The value before this change, if the key existed.
    pub prev_value: Option<Value>,
    /// Creation revision of the key (of the deleted incarnation for `Delete`).
    pub create_revision: u64,
}

/// Why a watch stream ended.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WatchClosed {
    #[error("the watcher fell behind by more than {0} events and was closed; re-list and watch again")]
    TooSlow(usize),
    #[error("the storage was closed")]
    StorageClosed,
}

/// Events for one watcher: first the replayed history, then live events.
pub struct WatchStream {
    replay: VecDeque<Arc<WatchEvent>>,
    rx: mpsc::Receiver<Arc<WatchEvent>>,
    lagged: CancellationToken,
    capacity: usize,
    /// the revision the stream starts after. A write is readable a moment before it is
    /// published, so a watch started after a read that saw it may receive its event live: such
    /// an event is dropped here, never delivered twice.
    after: u64,
}

impl std::fmt::Debug for WatchStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchStream")
            .field("replay", &self.replay.len())
            .finish()
    }
}

impl WatchStream {
    /// The next event, or why the stream ended.
    pub async fn next(&mut self) -> Result<Arc<WatchEvent>, WatchClosed> {
        loop {
            let ev = match self.replay.pop_front() {
                Some(ev) => ev,
                None => match self.rx.recv().await {
                    Some(ev) => ev,
                    None if self.lagged.is_cancelled() => return Err(WatchClosed::TooSlow(self.capacity)),
                    None => return Err(WatchClosed::StorageClosed),
                },
            };
            if ev.revision > self.after {
                return Ok(ev);
            }
        }
    }

    /// Resolves once the hub has closed this stream as too slow: a caller blocked on writing to
    /// a client that does not read learns it here, without reading the stream.
    pub async fn lagged(&self) {
        self.lagged.cancelled().await;
    }
}

struct Watcher {
    prefix: String,
    tx: mpsc::Sender<Arc<WatchEvent>>,
    lagged: CancellationToken,
}

/// What a hub holds, for metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HubFigures {
    /// keys and values (new and previous) the history keeps alive
    pub history_bytes: usize,
    pub watchers: usize,
}

impl WatchEvent {
    /// The bytes this event keeps alive (a value may be shared with the index too).
    fn footprint(&self) -> usize {
        std::mem::size_of::<WatchEvent>()
            + self.key.len()
            + self.value.len()
            + self.prev_value.as_ref().map_or(0, |v| v.len())
    }
}

struct HubState {
    history: VecDeque<Arc<WatchEvent>>,
    /// the sum of `history`'s footprints
    history_bytes: usize,
    /// Every event with a revision at or above this one is still in `history`.
    complete_from: u64,
    watchers: Vec<Watcher>,
}

/// The watch fan-out shared by a storage implementation.
pub struct Hub {
    state: Mutex<HubState>,
    history_limit: usize,
    queue_limit: usize,
    closed_slow: AtomicU64,
}

impl Hub {
    /// A hub keeping `history_limit` events for watchers that start in the past, and queueing
    /// `queue_limit` events per watcher before closing it as too slow. Its history starts after
    /// revision 0 until the storage says where it starts ([`Hub::start_after`]).
    pub fn new(history_limit: usize, queue_limit: usize) -> Self {
        Hub {
            state: Mutex::new(HubState {
                history: VecDeque::with_capacity(history_limit.min(4096)),
                history_bytes: 0,
                complete_from: 1,
                watchers: Vec::new(),
            }),
            history_limit: history_limit.max(1),
            queue_limit: queue_limit.max(1),
            closed_slow: AtomicU64::new(0),
        }
    }

    /// The history starts after `revision` (the state the storage recovered at start-up):
    /// watches from before it answer `Expired`.
    pub fn start_after(&self, revision: u64) {
        let mut st = self.state.lock();
        st.history.clear();
        st.history_bytes = 0;
        st.complete_from = revision + 1;
    }

    /// Watchers closed because they fell behind, since start.
    pub fn closed_slow_watchers(&self) -> u64 {
        self.closed_slow.load(Ordering::Relaxed)
    }

    /// The history's size and the watchers fed, now.
    pub fn figures(&self) -> HubFigures {
        let st = self.state.lock();
        HubFigures {
            history_bytes: st.history_bytes,
            watchers: st.watchers.iter().filter(|w| !w.tx.is_closed()).count(),
        }
    }

    /// Subscribes to events under `prefix` newer than `after`.
    pub fn subscribe(&self, prefix: &str, after: u64) -> Result<WatchStream, StorageError> {
        let mut st = self.state.lock();
        if after + 1 < st.complete_from {
            return Err(StorageError::Expired {
                requested: after,
                oldest: st.complete_from - 1,
            });
        }
        let replay: VecDeque<_> = st
            .history
            .iter()
            .filter(|e| e.revision > after && e.key.starts_with(prefix))
            .cloned()
            .collect();
        let (tx, rx) = mpsc::channel(self.queue_limit);
        let lagged = CancellationToken::new();
        st.watchers.push(Watcher {
            prefix: prefix.to_owned(),
            tx,
            lagged: lagged.clone(),
        });
        Ok(WatchStream {
            replay,
            rx,
            lagged,
            capacity: self.queue_limit,
            after,
        })
    }

    /// Publishes durable events, in revision order.
    pub fn publish(&self, events: Vec<WatchEvent>) {
        if events.is_empty() {
            return;
        }
        let mut st = self.state.lock();
        let mut slow = 0;
        for ev in events {
            let ev = Arc::new(ev);
            st.watchers.retain(|w| {
                if !ev.key.starts_with(&w.prefix) {
                    return !w.tx.is_closed();
                }
                match w.tx.try_send(ev.clone()) {
                    Ok(()) => true,
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        w.lagged.cancel();
                        slow += 1;
                        false
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => false,
                }
            });
            if st.history.len() == self.history_limit
                && let Some(dropped) = st.history.pop_front()
            {
                st.complete_from = dropped.revision + 1;
                st.history_bytes -= dropped.footprint();
            }
            st.history_bytes += ev.footprint();
            st.history.push_back(ev);
        }
        if slow > 0 {
            self.closed_slow.fetch_add(slow, Ordering::Relaxed);
            tracing::warn!(watchers = slow, "closed watchers that fell behind");
        }
    }

    /// Ends every stream (used when the storage shuts down).
    pub fn close_all(&self) {
        self.state.lock().watchers.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(rev: u64, key: &str) -> WatchEvent {
        WatchEvent {
            kind: EventKind::Put,
            key: key.into(),
            revision: rev,
            value: Arc::from(&b"v"[..]),
            prev_value: None,
            create_revision: rev,
        }
    }

    #[tokio::test]
    async fn replays_history_then_live_events_under_prefix() {
        let hub = Hub::new(10, 10);
        hub.publish(vec![ev(1, "/a/1"), ev(2, "/b/1"), ev(3, "/a/2")]);
        let mut w = hub.subscribe("/a/", 1).unwrap();
        hub.publish(vec![ev(4, "/a/3"), ev(5, "/b/2")]);
        assert_eq!(w.next().await.unwrap().revision, 3);
        assert_eq!(w.next().await.unwrap().revision, 4);
        drop(hub);
        assert_eq!(w.next().await.unwrap_err(), WatchClosed::StorageClosed);
    }

    #[tokio::test]
    async fn an_event_published_after_a_watch_that_starts_past_it_is_not_delivered() {
        // a read saw revision 2 before the hub had it, and the watch starts after 2
        let hub = Hub::new(10, 10);
        hub.publish(vec![ev(1, "k")]);
        let mut w = hub.subscribe("", 2).unwrap();
        hub.publish(vec![ev(2, "k"), ev(3, "k"), ev(3, "j")]);
        let (a, b) = (w.next().await.unwrap(), w.next().await.unwrap());
        assert_eq!((a.revision, a.key.as_str()), (3, "k"));
        assert_eq!(
            (b.revision, b.key.as_str()),
            (3, "j"),
            "every event of one revision is delivered"
        );
    }

    #[test]
    fn compacted_history_answers_expired() {
        let hub = Hub::new(2, 10);
        hub.start_after(10);
        assert!(hub.subscribe("", 10).is_ok());
        assert!(matches!(hub.subscribe("", 9), Err(StorageError::Expired { .. })));
        hub.publish(vec![ev(11, "k"), ev(12, "k"), ev(13, "k")]);
        // 11 was dropped: a watch after 10 would miss it.
        assert!(matches!(
            hub.subscribe("", 10),
            Err(StorageError::Expired { oldest: 11, .. })
        ));
        assert!(hub.subscribe("", 11).is_ok());
    }

    #[tokio::test]
    async fn slow_watcher_is_closed_not_skipped() {
        let hub = Hub::new(100, 2);
        let mut w = hub.subscribe("", 0).unwrap();
        hub.publish(vec![ev(1, "k"), ev(2, "k"), ev(3, "k")]);
        assert_eq!(w.next().await.unwrap().revision, 1);
        assert_eq!(w.next().await.unwrap().revision, 2);
        assert_eq!(w.next().await.unwrap_err(), WatchClosed::TooSlow(2));
        assert_eq!(hub.closed_slow_watchers(), 1);
    }

    #[test]
    fn figures_follow_the_history_and_the_open_watchers() {
        let hub = Hub::new(2, 10);
        let one = ev(1, "k").footprint();
        assert!(one > 0);
        let w = hub.subscribe("", 0).unwrap();
        hub.publish(vec![ev(1, "k"), ev(2, "k")]);
        assert_eq!(
            hub.figures(),
            HubFigures {
                history_bytes: 2 * one,
                watchers: 1
            }
        );
        // the oldest event leaves the history as a new one enters; a dropped stream is not fed
        drop(w);
        hub.publish(vec![ev(3, "k")]);
        assert_eq!(
            hub.figures(),
            HubFigures {
                history_bytes: 2 * one,
                watchers: 0
            }
        );
        hub.start_after(3);
        assert_eq!(hub.figures().history_bytes, 0);
    }
}
