//! What the leader knows about one stored value: where the bytes are, whether the put is
//! committed, until when a read lease protects it, and what its tenant is charged.
//!
//! A tenant is charged for the leader's memory as well as the member's: each object costs its
//! allocated length plus [`OBJECT_OVERHEAD`] plus its key's length ([`charge`]). So a grant
//! bounds the objects a tenant can hold, and with them the leader's heap, however small its
//! values and long its keys: a 1 GiB grant of 64-byte values under 4 KiB keys is about 236,000
//! objects, not 16 million. A value only on a member's disk tier is charged nothing there: its
//! bytes count against the tenant's share of the disk tiers instead (`tiered.rs`), and the tiers'
//! record granularity (4 KiB) bounds how many such values the leader keeps.

use std::time::Instant;

/// The lifecycle of a value: reserved by `PutStart`, visible only once `PutCommit` made it
/// `Committed`, so a reader never sees a partial value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectState {
    /// Space is held for the writer; `reclaim_at` is when an abandoned put gives it back.
    Reserved {
        put_id: u64,
        reclaim_at: Instant,
    },
    Committed,
}

/// What the leader keeps per object besides its key's bytes, rounded up generously: a slot and
/// its key table entry (about 90 bytes: `index.rs`), with room for the table's growth (up to
/// twice the entries it needs), a lease or reservation kept beside the slot, and the allocator's
/// rounding of a key kept as its bytes.
pub const OBJECT_OVERHEAD: u64 = 384;

/// What an object of allocated length `len` under a key of `key_len` bytes costs its tenant's
/// grant.
pub fn charge(len: u64, key_len: usize) -> u64 {
    len + OBJECT_OVERHEAD + key_len as u64
}

/// Where a value's bytes are in its member's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resident {
    pub offset: u64,
    /// the leader's number for this placement (`grant.rs`), in every grant of the object
    pub allocation: u64,
    /// `false` while the member reads the value back from its disk tier into the range
    /// (`Notice::Load`): a reader waits until the member applied the load
    pub ready: bool,
}

/// One value's metadata. Its bytes are in its member's memory, on its member's disk tier, or
/// both (never neither: a value that leaves both is forgotten).
#[derive(Debug, Clone)]
pub struct Object {
    pub member: u64,
    pub mount_id: u64,
    /// its bytes in the member's segment (`None`: only its disk copy holds them)
    pub memory: Option<Resident>,
    /// its copy on the member's disk tier (the tier's number for the record)
    pub disk: Option<u64>,
    /// the value's size in bytes
    pub size: u64,
    /// the allocated length: `size` rounded up to the allocation granularity
    pub len: u64,
    /// what its tenant's grant is charged now: [`charge`] with bytes in memory, 0 only on disk
    /// (its disk bytes count against the tenant's share of the disk tiers: `tiered.rs`)
    pub charge: u64,
    pub state: ObjectState,
    /// protected from eviction and removal until then (`None`: never leased, or the lease ended
    /// and was forgotten)
    pub lease_until: Option<Instant>,
    /// a global counter value at the last put or read, for least-recently-used ordering
    pub last_used: u64,
}

impl Object {
    /// Committed and not leased at `now`: eviction may take it.
    pub fn evictable(&self, now: Instant) -> bool {
        self.state == ObjectState::Committed && !self.leased(now)
    }

    /// A read lease protects it at `now`.
    pub fn leased(&self, now: Instant) -> bool {
        self.lease_until.is_some_and(|until| until > now)
    }

    /// Leases it until `until` at least.
    pub fn lease(&mut self, until: Instant) {
        self.lease_until = Some(self.lease_until.map_or(until, |t| t.max(until)));
    }

    /// Its bytes are in memory, readable now.
    pub fn readable_in_memory(&self) -> bool {
        self.memory.is_some_and(|r| r.ready)
    }

    /// Bytes of its member's segment it takes (0 only on disk).
    pub fn memory_len(&self) -> u64 {
        if self.memory.is_some() { self.len } else { 0 }
    }
}
