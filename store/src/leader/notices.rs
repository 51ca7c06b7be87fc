//! What a leader must tell each member about the values it holds, in order: the seal of each value
//! committed (only a sealed value is handed to a next leader), each range freed (removed,
//! evicted, dropped, reclaimed: no longer to be handed over), and for a member with a disk tier
//! each disk copy to remove and each to load into memory (a get of a value only on disk waits
//! for the member to have applied its load). Each notice is numbered; a heartbeat
//! answer carries the oldest ones the member has not said it applied (at most [`PER_ANSWER`]) and
//! the number of the last (`HeartbeatResponse.through`), and the member's next heartbeat says how
//! far it applied them (`HeartbeatRequest.applied_through`). A notice is kept until then: an
//! answer lost on the way (the member's call timed out while the leader was slow) is sent again,
//! so no seal, free or load is ever skipped.
//!
//! Members ask with `wait_ms` (long polling): a leader holds a heartbeat with nothing to tell until
//! a notice is queued ([`Notices::news`], then [`GATHER`] for more, unless a removal waits for it:
//! [`Notices::hurry`]) or the wait ends, so notices reach members within a round trip, not a
//! heartbeat interval. A `Remove` is answered only once its member applied the free
//! ([`Notices::applied`], awaited by `calls.rs`): a value a client removed does not come back after
//! a failover.
//!
//! A member that falls [`QUEUED`] notices behind (it stopped answering under a storm of evictions)
//! is unmounted at the next housekeeping round ([`Notices::overflowed`]): what it holds can no
//! longer be told apart from what this leader freed, so none of it may reach a next leader.

use std::collections::VecDeque;
use std::sync::Arc;

use crate::grant::MAC_LEN;
use crate::proto::HeartbeatResponse;

/// How long a held heartbeat, once woken by a notice, waits for more before it answers: a member
/// gets at most a few hundred answers a second however many values are committed, and each notice
/// arrives within this and a round trip.
pub const GATHER: std::time::Duration = std::time::Duration::from_millis(5);

/// Most notices one heartbeat answer carries; the rest come with the next answers.
pub const PER_ANSWER: usize = 65_536;
/// Most notices queued for one member before it is unmounted.
pub const QUEUED: usize = 1 << 20;

/// One thing a member must be told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    Sealed {
        offset: u64,
        allocation: u64,
        seal: [u8; MAC_LEN],
    },
    Freed {
        offset: u64,
        allocation: u64,
    },
    /// Remove a disk copy (its value is gone).
    DiskFreed {
        disk_id: u64,
    },
    /// Read a disk copy into the range, as the allocation, sealed.
    Load {
        disk_id: u64,
        offset: u64,
        allocation: u64,
        seal: [u8; MAC_LEN],
        tag: Arc<[u8]>,
    },
}

/// One member's notices.
#[derive(Debug)]
pub struct Notices {
    /// the notices the member has not said it applied, the oldest first
    queue: VecDeque<Notice>,
    /// the number of the last notice queued (the first is 1)
    queued: u64,
    /// the number of the last notice an answer carried
    sent: u64,
    /// fires when a notice is queued: a held heartbeat answers
    news: Arc<tokio::sync::Notify>,
    /// how far the member applied them, as its heartbeats say
    applied: tokio::sync::watch::Sender<u64>,
    overflowed: bool,
    /// a caller waits for the member to apply a notice queued (a removal): answer at once, not
    /// after [`GATHER`]
    urgent: bool,
}

impl Default for Notices {
    fn default() -> Self {
        Notices {
            queue: VecDeque::new(),
            queued: 0,
            sent: 0,
            news: Arc::default(),
            applied: tokio::sync::watch::Sender::new(0),
            overflowed: false,
            urgent: false,
        }
    }
}

/// What a caller waits for: a member's having applied its notices through a number.
#[derive(Debug)]
pub struct Applied {
    rx: tokio::sync::watch::Receiver<u64>,
    through: u64,
}

impl Applied {
    /// Resolves once the member applied every notice through the number (or went away).
    pub async fn wait(mut self) {
        let through = self.through;
        let _ = self.rx.wait_for(|n| *n >= through).await;
    }

    /// Whether it already has.
    pub fn done(&self) -> bool {
        *self.rx.borrow() >= self.through
    }
}

impl Notices {
    fn push(&mut self, n: Notice) {
        if self.queue.len() >= QUEUED {
            self.overflowed = true;
            return;
        }
        self.queue.push_back(n);
        self.queued += 1;
        self.news.notify_one();
    }

    /// Queues a committed value's seal.
    pub fn sealed(&mut self, offset: u64, allocation: u64, seal: [u8; MAC_LEN]) {
        self.push(Notice::Sealed {
            offset,
            allocation,
            seal,
        });
    }

    /// Queues a freed range.
    pub fn freed(&mut self, offset: u64, allocation: u64) {
        self.push(Notice::Freed { offset, allocation });
    }

    /// Queues the removal of a disk copy.
    pub fn disk_freed(&mut self, disk_id: u64) {
        self.push(Notice::DiskFreed { disk_id });
    }

    /// Queues the load of a disk copy into a range of memory (a get waits for it: [`Notices::hurry`]);
    /// returns the notice's number.
    pub fn load(&mut self, disk_id: u64, offset: u64, allocation: u64, seal: [u8; MAC_LEN], tag: Arc<[u8]>) -> u64 {
        self.push(Notice::Load {
            disk_id,
            offset,
            allocation,
            seal,
            tag,
        });
        self.queued
    }

    /// How far the member applied them.
    pub fn applied_through(&self) -> u64 {
        *self.applied.borrow()
    }

    /// Marks what is queued as awaited (a removal's answer waits for it): a held heartbeat answers
    /// without gathering more.
    pub fn hurry(&mut self) {
        self.urgent = true;
        self.news.notify_one();
    }

    /// Whether a caller waits on what is queued.
    pub fn urgent(&self) -> bool {
        self.urgent
    }

    /// Whether a heartbeat would carry something.
    pub fn pending(&self) -> bool {
        !self.queue.is_empty()
    }

    /// What a held heartbeat waits on.
    pub fn news(&self) -> Arc<tokio::sync::Notify> {
        self.news.clone()
    }

    /// The member fell too far behind: unmount it.
    pub fn overflowed(&self) -> bool {
        self.overflowed
    }

    /// What waits until the member applied every notice queued so far.
    pub fn applied(&self) -> Applied {
        Applied {
            rx: self.applied.subscribe(),
            through: self.queued,
        }
    }

    /// Records how far the member says it applied them (never backwards, never past what was
    /// sent), and forgets those.
    pub fn acknowledge(&mut self, through: u64) {
        let applied = *self.applied.borrow();
        let through = through.min(self.sent);
        if through <= applied {
            return;
        }
        let done = usize::try_from(through - applied)
            .unwrap_or(usize::MAX)
            .min(self.queue.len());
        self.queue.drain(..done);
        self.applied.send_replace(through);
    }

    /// Fills a heartbeat answer with the oldest notices the member has not said it applied (at
    /// most [`PER_ANSWER`]); they stay until it does.
    pub fn answer(&mut self, answer: &mut HeartbeatResponse) {
        self.urgent = false;
        let n = self.queue.len().min(PER_ANSWER);
        for notice in self.queue.iter().take(n).cloned() {
            match notice {
                Notice::Sealed {
                    offset,
                    allocation,
                    seal,
                } => {
                    answer.sealed_offsets.push(offset);
                    answer.sealed_allocations.push(allocation);
                    answer.seals.push(bytes::Bytes::copy_from_slice(&seal));
                }
                Notice::Freed { offset, allocation } => {
                    answer.freed_offsets.push(offset);
                    answer.freed_allocations.push(allocation);
                }
                Notice::DiskFreed { disk_id } => answer.disk_freed.push(disk_id),
                Notice::Load {
                    disk_id,
                    offset,
                    allocation,
                    seal,
                    tag,
                } => {
                    answer.load_disk_ids.push(disk_id);
                    answer.load_offsets.push(offset);
                    answer.load_allocations.push(allocation);
                    answer.load_seals.push(bytes::Bytes::copy_from_slice(&seal));
                    answer.load_tags.push(bytes::Bytes::copy_from_slice(&tag));
                }
            }
        }
        answer.through = *self.applied.borrow() + n as u64;
        self.sent = self.sent.max(answer.through);
    }

    /// The number of the last notice an answer carried.
    #[cfg(test)]
    pub fn sent(&self) -> u64 {
        self.sent
    }

    /// How many the member has not said it applied.
    #[cfg(test)]
    pub fn queued(&self) -> usize {
        self.queue.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notices_go_out_in_order_once_and_a_waiter_is_released_by_the_members_word() {
        let mut n = Notices::default();
        let nothing = n.applied();
        assert!(nothing.done(), "nothing queued: nothing to wait for");
        n.sealed(0, 1, [1; 32]);
        n.freed(0, 1);
        let waiter = n.applied();
        assert!(!waiter.done());
        let mut a = HeartbeatResponse::default();
        n.answer(&mut a);
        assert_eq!((a.sealed_offsets.len(), a.freed_offsets.len(), a.through), (1, 1, 2));
        assert!(!waiter.done(), "sent is not applied");
        n.acknowledge(99);
        assert!(waiter.done(), "the member applied both (never past what was sent)");
        assert!(!n.pending(), "nothing left to tell");
        assert_eq!(*n.applied.borrow(), 2);
        n.acknowledge(1);
        assert_eq!(*n.applied.borrow(), 2, "never backwards");
        let mut a = HeartbeatResponse::default();
        n.answer(&mut a);
        assert_eq!((a.sealed_offsets.len(), a.freed_offsets.len(), a.through), (0, 0, 2));
    }

    /// An answer the member never got (its call timed out while the leader was slow) is sent
    /// again: the member's next heartbeat says it applied none of it.
    #[test]
    fn an_answer_lost_on_the_way_is_sent_again() {
        let mut n = Notices::default();
        n.sealed(0, 1, [1; 32]);
        n.freed(64, 2);
        let removal = n.applied();
        let mut lost = HeartbeatResponse::default();
        n.answer(&mut lost);
        n.sealed(128, 3, [3; 32]);
        // the member's next heartbeat: it applied nothing since
        n.acknowledge(0);
        assert!(!removal.done(), "the free was never applied");
        let mut again = HeartbeatResponse::default();
        n.answer(&mut again);
        assert_eq!(again.sealed_offsets, [0, 128]);
        assert_eq!(again.freed_offsets, [64]);
        assert_eq!(again.through, 3);
        n.acknowledge(3);
        assert!(removal.done());
        // an answer of at most PER_ANSWER, then the rest from where the member got to
        for i in 0..PER_ANSWER as u64 + 10 {
            n.freed(i, i);
        }
        let mut first = HeartbeatResponse::default();
        n.answer(&mut first);
        assert_eq!(
            (first.freed_offsets.len(), first.through),
            (PER_ANSWER, 3 + PER_ANSWER as u64)
        );
        n.acknowledge(3 + 100);
        let mut rest = HeartbeatResponse::default();
        n.answer(&mut rest);
        assert_eq!(rest.freed_offsets.first(), Some(&100));
        assert_eq!(
            rest.through,
            3 + PER_ANSWER as u64 + 10,
            "the rest, from where the member got to"
        );
    }

    #[test]
    fn a_member_too_far_behind_is_marked_for_unmounting() {
        let mut n = Notices::default();
        for i in 0..QUEUED as u64 {
            n.freed(i, i);
        }
        assert!(!n.overflowed());
        n.freed(0, 0);
        assert!(n.overflowed());
        assert_eq!(n.queued(), QUEUED);
        let mut a = HeartbeatResponse::default();
        n.answer(&mut a);
        assert_eq!(a.freed_offsets.len(), PER_ANSWER, "bounded answers");
    }
}
