//! KV events: what each tenant's cache holds, as it changes, for KV-aware routers
//! (`Store.WatchBlocks`).
//!
//! Every tenant has a log ([`BlockLog`]): a committed put is `BlockStored`, a value that stops
//! being readable is `BlockRemoved` with why ("removed", "evicted", "ledger", "member"). Live
//! events are numbered per tenant from 1 within the leader's epoch. A stream starts with
//! `AllBlocksCleared` and the blocks held (`snapshot` set, carrying the id of the last live event
//! before them), read from the tenant's index a page at a time, then the live events; a page may
//! already show what a live event after it says, and applying both in order leaves each key as
//! the log does. A stream that falls behind the log starts over the same way. A new term
//! replaces the leader's whole state, which closes every log: the streams end with
//! `NOT_SERVING`, and a router that reconnects to the new leader receives `AllBlocksCleared` and
//! the blocks adopted so far, then each member's adopted blocks as a live `BlockStored` when it
//! mounts (`adoption.rs`).
//!
//! Access is checked again whenever the ledger is replaced: a stream whose credential is no
//! longer its tenant's (rotated out, or the Binding gone) ends with the refusal a new call would
//! get, since the keys it carries are derived from that tenant's prompts.

use std::collections::BTreeMap;

use tokio::sync::{broadcast, mpsc};
use tonic::Status;

use super::Leader;
use crate::error::{ErrorCode, Result, StoreError};
use crate::proto::block_event::Event;
use crate::proto::{AllBlocksCleared, BlockEvent, BlockRemoved, BlockStored, Scope};
use crate::readiness::Readiness;

/// Live events a slow stream may be behind before it starts over.
const LOG_CAPACITY: usize = 4096;
/// Keys per snapshot event.
const SNAPSHOT_BATCH: usize = 512;
/// Slots of a tenant's objects a snapshot page looks at (`index.rs`): the state lock is taken
/// once a page, so a tenant's millions of blocks never hold it for long, nor are all copied at
/// once.
pub const PAGE_SLOTS: usize = 4096;
/// Streams one tenant may have open at once: each holds a page of keys while it sends it, and a
/// log receiver, so their number bounds what a watcher can make the leader spend.
pub const MAX_WATCHES: usize = 16;

/// Why blocks stopped being readable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    /// `Remove` asked for it.
    Removed,
    /// Eviction took it.
    Evicted,
    /// Its tenant left the ledger.
    Ledger,
    /// The member holding its bytes went away.
    Member,
    /// Never readable (an uncommitted reservation given back): nothing to report.
    Unpublished,
}

impl Removal {
    fn reason(self) -> Option<&'static str> {
        match self {
            Self::Removed => Some("removed"),
            Self::Evicted => Some("evicted"),
            Self::Ledger => Some("ledger"),
            Self::Member => Some("member"),
            Self::Unpublished => None,
        }
    }
}

/// One tenant's live events.
#[derive(Debug)]
pub struct BlockLog {
    tx: broadcast::Sender<BlockEvent>,
    last_id: u64,
}

impl Default for BlockLog {
    fn default() -> Self {
        Self {
            tx: broadcast::channel(LOG_CAPACITY).0,
            last_id: 0,
        }
    }
}

impl BlockLog {
    /// Numbers the next event and sends it to the streams (built only when one listens).
    fn emit(&mut self, epoch: u64, event: impl FnOnce() -> Event) {
        self.last_id += 1;
        if self.tx.receiver_count() > 0 {
            let _ = self.tx.send(BlockEvent {
                epoch,
                id: self.last_id,
                snapshot: false,
                event: Some(event()),
            });
        }
    }

    pub fn stored(&mut self, epoch: u64, key: &str, size: u64) {
        self.emit(epoch, || {
            Event::Stored(BlockStored {
                keys: vec![key.to_owned()],
                size,
            })
        });
    }

    /// Blocks of one size that became readable at once (a member's values adopted by a new term).
    pub fn stored_keys(&mut self, epoch: u64, keys: &[&str], size: u64) {
        for chunk in keys.chunks(SNAPSHOT_BATCH) {
            self.emit(epoch, || {
                Event::Stored(BlockStored {
                    keys: chunk.iter().map(|k| (*k).to_owned()).collect(),
                    size,
                })
            });
        }
    }

    pub fn removed(&mut self, epoch: u64, keys: Vec<String>, why: Removal) {
        if keys.is_empty() {
            return;
        }
        self.removed_with(epoch, why, || keys);
    }

    /// Blocks that stopped being readable at once (at least one), their keys made by `keys` only
    /// when a stream listens ([`listening`](Self::listening)); in events of at most
    /// [`SNAPSHOT_BATCH`] keys, as a snapshot's, however many went (a member's removal can take
    /// millions). Unheard, they take one number.
    pub fn removed_with(&mut self, epoch: u64, why: Removal, keys: impl FnOnce() -> Vec<String>) {
        let Some(reason) = why.reason() else { return };
        if !self.listening() {
            // numbered as `emit` numbers what no stream hears
            self.last_id += 1;
            return;
        }
        let keys = keys();
        for chunk in keys.chunks(SNAPSHOT_BATCH) {
            self.emit(epoch, || {
                Event::Removed(BlockRemoved {
                    keys: chunk.to_vec(),
                    reason: reason.to_owned(),
                })
            });
        }
    }

    /// A receiver of the live events from now on, as a stream's (tests).
    #[cfg(test)]
    pub fn listen(&self) -> broadcast::Receiver<BlockEvent> {
        self.tx.subscribe()
    }

    /// The last event's number (tests).
    #[cfg(test)]
    pub fn last_id(&self) -> u64 {
        self.last_id
    }

    /// Whether a stream receives this log's events: they are made only then.
    pub fn listening(&self) -> bool {
        self.tx.receiver_count() > 0
    }
}

/// A stream's start: the live events from now on, and the state they follow.
#[derive(Debug)]
pub struct Subscription {
    rx: broadcast::Receiver<BlockEvent>,
    epoch: u64,
    last_id: u64,
    /// the ledger's generation: a change means the stream's access is checked again
    ledger: tokio::sync::watch::Receiver<u64>,
}

impl Subscription {
    /// A stream's start on `log`: its live events from now on, after the snapshot ([`feed`]
    /// sends it in pages), watching the ledger's generation `ledger`. A new stream (`restart`
    /// false) is refused while the tenant has [`MAX_WATCHES`] open; a stream starting over after
    /// falling behind keeps its place.
    pub fn start(
        tenant: &str,
        log: &BlockLog,
        epoch: u64,
        mut ledger: tokio::sync::watch::Receiver<u64>,
        restart: bool,
    ) -> Result<Subscription> {
        if !restart && log.tx.receiver_count() >= MAX_WATCHES {
            return Err(StoreError::new(
                ErrorCode::TenantQuotaExceeded,
                format!(
                    "tenant {tenant:?} has {MAX_WATCHES} WatchBlocks streams open, the most it may; close one (a router \
                     needs one stream per leader)"
                ),
            ));
        }
        ledger.mark_unchanged();
        Ok(Subscription {
            rx: log.tx.subscribe(),
            epoch,
            last_id: log.last_id,
            ledger,
        })
    }
}

/// `BlockStored` events of a page of blocks, grouped by size.
fn stored(blocks: Vec<(String, u64)>) -> Vec<Event> {
    let mut by_size: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for (k, size) in blocks {
        by_size.entry(size).or_default().push(k);
    }
    let mut out = Vec::new();
    for (size, keys) in by_size {
        for chunk in keys.chunks(SNAPSHOT_BATCH) {
            out.push(Event::Stored(BlockStored {
                keys: chunk.to_vec(),
                size,
            }));
        }
    }
    out
}

/// Sends `AllBlocksCleared`, then the tenant's blocks a page at a time ([`PAGE_SLOTS`]), all
/// marked `snapshot` with the id of the last live event before them. A page is taken after the
/// stream subscribed, so it may already show what a live event still to come says: applied in
/// order after the snapshot, the live events leave each key as the log does. `false` when the
/// stream ended.
async fn send_snapshot(
    leader: &Leader,
    scope: Option<&Scope>,
    sub: &Subscription,
    tx: &mpsc::Sender<Result<BlockEvent, Status>>,
) -> bool {
    let event = |e: Event| BlockEvent {
        epoch: sub.epoch,
        id: sub.last_id,
        snapshot: true,
        event: Some(e),
    };
    if tx.send(Ok(event(Event::Cleared(AllBlocksCleared {})))).await.is_err() {
        return false;
    }
    let mut from = Some(0);
    while let Some(at) = from {
        let page = match leader.serving(|s| s.blocks_page(scope, sub.epoch, at)) {
            Ok(page) => page,
            Err(e) => {
                let _ = tx.send(Err(e.into())).await;
                return false;
            }
        };
        for e in stored(page.blocks) {
            if tx.send(Ok(event(e))).await.is_err() {
                return false;
            }
        }
        from = page.next;
    }
    true
}

/// Feeds one stream until the client goes, the leader stops serving or the tenant's log closes.
pub(super) async fn feed(
    leader: Leader,
    scope: Option<Scope>,
    mut sub: Subscription,
    tx: mpsc::Sender<Result<BlockEvent, Status>>,
) {
    let mut readiness = leader.readiness().subscribe();
    loop {
        if !send_snapshot(&leader, scope.as_ref(), &sub, &tx).await {
            return;
        }
        loop {
            // the ledger first: an event sent after a ledger change never reaches a caller that
            // change shut out
            let next = tokio::select! {
                biased;
                changed = sub.ledger.changed() => match changed {
                    Ok(()) => None,
                    // the state it belonged to was replaced (a new term)
                    Err(_) => Some(Err(broadcast::error::RecvError::Closed)),
                },
                r = sub.rx.recv() => Some(r),
                _ = readiness.wait_for(|r| matches!(r, Readiness::Stopping | Readiness::Standby)) => {
                    Some(Err(broadcast::error::RecvError::Closed))
                }
                () = tx.closed() => return,
            };
            let Some(next) = next else {
                // the ledger was replaced: is this caller still admitted?
                if let Err(e) = leader.serving(|s| s.tenant_name(scope.as_ref())) {
                    let _ = tx.send(Err(e.into())).await;
                    return;
                }
                continue;
            };
            match next {
                Ok(e) => {
                    if tx.send(Ok(e)).await.is_err() {
                        return;
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => break,
                Err(broadcast::error::RecvError::Closed) => {
                    let end = StoreError::new(
                        ErrorCode::NotServing,
                        "this leader no longer serves this tenant's blocks (a new term started, the tenant left the \
                         ledger, or the leader is stopping); watch again through the Client endpoint",
                    );
                    let _ = tx.send(Err(end.into())).await;
                    return;
                }
            }
        }
        // fell behind: start over from the state now
        match leader.serving(|s| s.watch_blocks(scope.as_ref(), true)) {
            Ok(s) => sub = s,
            Err(e) => {
                let _ = tx.send(Err(e.into())).await;
                return;
            }
        }
    }
}
