//! Read-outs of the state for controllers and metrics: per tenant, per member, and totals.

use std::time::Instant;

use super::state::State;
use super::tenant::Counters;
use crate::proto::{MemberStatus, PoolEntry, TenantStatus};

impl State {
    pub fn tenant_statuses(&self) -> Vec<TenantStatus> {
        let mut v: Vec<TenantStatus> = self
            .tenants
            .iter()
            .map(|(name, t)| TenantStatus {
                name: name.clone(),
                ceiling: t.ceiling,
                grant: t.grant,
                used: t.used,
                objects: t.objects.len() as u64,
                block_size: t.layout.as_ref().map_or(0, |l| l.block_size),
                dtype: t.layout.as_ref().map_or_else(String::new, |l| l.dtype.clone()),
                over_grant: t.used > t.grant,
                puts: t.counters.puts,
                hits: t.counters.hits,
                misses: t.counters.misses,
                evictions: t.counters.evictions,
                credentials: t.credentials.len() as u32,
                credential_sha256: t.credentials.iter().map(|h| bytes::Bytes::copy_from_slice(h)).collect(),
                uid: t.uid.clone(),
                pool: t.pool.clone(),
                limited_by: t.limited_by.into(),
                clients: t.clients.statuses(),
                disk_used: t.disk_used,
                on_disk_only: t.objects.on_disk_only() as u64,
                demotions: t.counters.demotions,
                loads: t.counters.loads,
                load_failures: t.counters.load_failures,
            })
            .collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    /// The pools as the ledger gave them.
    pub fn pool_entries(&self) -> Vec<PoolEntry> {
        self.pools
            .iter()
            .map(|(name, total)| PoolEntry {
                name: name.clone(),
                total: *total,
            })
            .collect()
    }

    pub fn member_statuses(&self, now: Instant) -> Vec<MemberStatus> {
        self.members
            .iter()
            .map(|(id, m)| MemberStatus {
                member_id: *id,
                name: m.name.clone(),
                data_addr: m.data_addr.clone(),
                grpc_addr: m.grpc_addr.clone(),
                capacity: m.alloc.capacity(),
                used: m.alloc.used(),
                objects: m.objects,
                mount_id: m.mount_id,
                last_heartbeat_ms_ago: now.saturating_duration_since(m.last_seen).as_millis() as u64,
                same_host: !m.local_addr.is_empty(),
                tier_capacity: m.tier_capacity,
                tier_used: m.tier_used,
                disk_objects: m.disk.len() as u64,
            })
            .collect()
    }

    /// Counters summed over all tenants, present and removed.
    pub fn totals(&self) -> Counters {
        let mut c = self.retired;
        for t in self.tenants.values() {
            c.add(&t.counters);
        }
        c
    }
}

impl Counters {
    pub fn add(&mut self, o: &Counters) {
        self.puts += o.puts;
        self.put_revokes += o.put_revokes;
        self.gets += o.gets;
        self.hits += o.hits;
        self.misses += o.misses;
        self.evictions += o.evictions;
        self.quota_refusals += o.quota_refusals;
        self.demotions += o.demotions;
        self.loads += o.loads;
        self.load_failures += o.load_failures;
    }
}
