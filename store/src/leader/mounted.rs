//! A mounted member as the leader keeps it: where it serves, its segment's allocator, its disk
//! tier's copies and the loads on their way, what it has not been told yet, and the grant key of
//! its mount.

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use super::placement::SegmentAllocator;

/// A mounted member: one segment, as the leader knows it while the member stays mounted.
#[derive(Debug)]
pub struct Mounted {
    pub name: String,
    pub data_addr: String,
    pub grpc_addr: String,
    /// the member's same-host socket ("" when it serves none)
    pub local_addr: String,
    pub mount_id: u64,
    /// the member process's random id: a mount under this name from another live process is
    /// refused (0: a member that sent none)
    pub instance_id: u64,
    pub alloc: SegmentAllocator,
    /// values with bytes in its segment (reserved, committed, or being loaded)
    pub objects: u64,
    /// the most bytes of records its disk tier may hold (0: it has none)
    pub tier_capacity: u64,
    /// bytes of records its tier holds, as its last heartbeat said
    pub tier_used: u64,
    /// each disk copy the tier holds for a value this leader knows: (tenant, key) by disk id
    pub disk: HashMap<u64, (String, String)>,
    /// loads queued for it, in notice order: each value is readable once the member applied its
    /// notice (`State::heartbeat`)
    pub loading: VecDeque<Loading>,
    pub last_seen: Instant,
    /// the seals of values committed and the ranges freed that the member has not been told yet
    /// (`notices.rs`)
    pub notices: super::notices::Notices,
    /// this mount's grant key, derived from the term's (`grant.rs`): every range of it is signed
    /// with it, and it signs nothing another member accepts
    pub grant_key: crate::grant::GrantKey,
    /// while further pages of its mount's report are to come (`adoption.rs`): nothing new is
    /// placed in its segment meanwhile, whose free ranges may be what a later page holds
    pub handing_over: Option<Handover>,
}

/// A mount's report still coming in pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handover {
    /// holdings in the pages so far
    pub reported: u64,
    /// `false`: the member was unmounted for falling behind on what it was told, so its report may
    /// hold values this leader freed, and nothing of it is adopted
    pub trusted: bool,
}

/// A value on its way from a member's disk tier into its memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loading {
    /// the number of its `Notice::Load`
    pub notice: u64,
    pub tenant: String,
    pub key: String,
    /// the allocation it is loaded under
    pub allocation: u64,
}
