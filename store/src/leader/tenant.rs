//! One tenant as the leader keeps it: its ledger entry, grant and charge, its objects
//! (`index.rs`), its counters and its block stream.

use super::index::Objects;
use super::ledger::Layout;
use super::objects::ObjectState;

/// Counters kept per tenant (and, summed, for the whole store).
#[derive(Debug, Clone, Copy, Default)]
pub struct Counters {
    pub puts: u64,
    pub put_revokes: u64,
    pub gets: u64,
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    pub quota_refusals: u64,
    /// values whose memory was freed while their disk copy kept them
    pub demotions: u64,
    /// values read back from a disk tier for a get
    pub loads: u64,
    /// loads that found their disk copy missing or damaged (the value was dropped)
    pub load_failures: u64,
}

/// One tenant: its ledger entry, grant, charge and key space.
#[derive(Debug, Default)]
pub struct Tenant {
    /// `None` only for the default tenant with multi-tenancy off and no layout configured
    pub layout: Option<Layout>,
    /// SHA-256 of each credential a call may prove the tenant with; empty: none is needed
    pub credentials: Vec<[u8; 32]>,
    /// who holds the tenant (the Binding's UID; empty: none named): every value's tag names it
    pub uid: String,
    pub ceiling: u64,
    /// the pool whose total its grant counts against (empty: none)
    pub pool: String,
    pub grant: u64,
    /// what cut `grant` below `ceiling`
    pub limited_by: crate::proto::GrantLimit,
    /// bytes charged: every reserved and committed object's `charge`
    pub used: u64,
    /// bytes of its values' disk copies (their allocated lengths), counted apart from `used`
    /// against its share of the disk tiers
    pub disk_used: u64,
    pub objects: Objects,
    pub counters: Counters,
    /// the same counters per caller that names itself
    pub clients: super::clients::Clients,
    /// what its blocks do, for `WatchBlocks` (`blocks.rs`)
    pub log: super::blocks::BlockLog,
}

/// A page of a tenant's readable blocks (`WatchBlocks` snapshots).
#[derive(Debug)]
pub struct BlocksPage {
    /// each block's key and size
    pub blocks: Vec<(String, u64)>,
    /// the slot the next page starts at (`None`: this was the last)
    pub next: Option<usize>,
}

impl Tenant {
    /// A page of the blocks it holds readable now (each committed value's key and size): those
    /// of `slots` of its objects' slots from `from`, and where the next page starts (`None`: the
    /// last page).
    pub fn committed_blocks(&self, from: usize, slots: usize) -> BlocksPage {
        let (page, next) = self.objects.page(from, slots);
        let blocks = page
            .into_iter()
            .filter(|(_, o)| o.state == ObjectState::Committed)
            .map(|(k, o)| (k.to_string(), o.size))
            .collect();
        BlocksPage { blocks, next }
    }
}
