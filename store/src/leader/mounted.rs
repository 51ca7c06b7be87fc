//! A mounted member as the leader keeps it: where it serves, its segment's allocator, what it
//! has not been told yet, and the grant key of its mount.

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
    pub objects: u64,
    pub last_seen: Instant,
    /// the seals of values committed and the ranges freed that the member has not been told yet
    /// (`notices.rs`)
    pub notices: super::notices::Notices,
    /// this mount's grant key, derived from the term's (`grant.rs`): every range of it is signed
    /// with it, and it signs nothing another member accepts
    pub grant_key: crate::grant::GrantKey,
}
