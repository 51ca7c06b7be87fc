//! Eviction in approximately least-recently-used order, never touching leased or uncommitted
//! objects: per tenant when a put would pass its grant, and store-wide when usage passes the high
//! watermark or an allocation finds no room (tenants over their grant are evicted from first).
//! A value whose member copied it to its disk tier only leaves memory (it is "demoted": a get
//! loads it back); values only on disk go when their tenant passes its share of the disk tiers
//! ([`State::trim_disk`]), or when a tier drops them (`tiered.rs`).
//!
//! Choosing what goes copies no keys but those of the objects that go: the order is decided on
//! numbers (how deserving, last use, bytes), which gives the last use that must go; then one pass
//! takes the keys at or before it. Under the one state lock that is a sort of 24-byte entries,
//! not of every key the store holds.

use std::time::Instant;

use super::blocks::Removal;
use super::objects::Object;
use super::state::State;

/// The newest rank that must go for `need` bytes to be freed, from `(rank, bytes)` entries;
/// `None` when nothing need go or nothing can.
fn cutoff<R: Ord + Copy>(mut entries: Vec<(R, u64)>, need: u64) -> Option<R> {
    entries.sort_unstable_by_key(|e| e.0);
    let mut freed = 0;
    let mut last = None;
    for (rank, bytes) in entries {
        if freed >= need {
            break;
        }
        freed += bytes;
        last = Some(rank);
    }
    last
}

impl State {
    /// Makes room in the tenant's grant: evicts its least recently used evictable values in
    /// memory (a value with a disk copy keeps it and frees its memory, others go) until at least
    /// `need` bytes of its charge are freed (or nothing evictable is left). Returns the charge
    /// freed.
    pub(super) fn evict_tenant(&mut self, tenant: &str, need: u64, now: Instant) -> u64 {
        let going = self.least_recent(tenant, need, now, |o| o.memory.is_some().then_some(o.charge));
        going.iter().map(|key| self.evict(tenant, key).charge).sum()
    }

    /// Drops the tenant's least recently used values only on disk until its disk copies fit
    /// `share` bytes (or none of those is left unleased). Returns how many went.
    pub(super) fn trim_disk(&mut self, tenant: &str, share: u64, now: Instant) -> usize {
        let Some(t) = self.tenants.get(tenant) else { return 0 };
        let Some(need) = t.disk_used.checked_sub(share).filter(|n| *n > 0) else {
            return 0;
        };
        let going = self.least_recent(tenant, need, now, |o| o.memory.is_none().then_some(o.len));
        for key in &going {
            self.evict(tenant, key);
        }
        going.len()
    }

    /// The keys of the tenant's least recently used evictable values that `frees` counts (with
    /// the bytes evicting each frees), enough of them for `need` bytes.
    fn least_recent(
        &self,
        tenant: &str,
        need: u64,
        now: Instant,
        frees: impl Fn(&Object) -> Option<u64>,
    ) -> Vec<String> {
        let Some(t) = self.tenants.get(tenant) else {
            return Vec::new();
        };
        let counted = |o: &Object| frees(o).filter(|_| o.evictable(now));
        let ranks = t
            .objects
            .values()
            .filter_map(|o| counted(o).map(|bytes| (o.last_used, bytes)))
            .collect();
        let Some(last) = cutoff(ranks, need) else {
            return Vec::new();
        };
        t.objects
            .iter()
            .filter(|(_, o)| counted(o).is_some() && o.last_used <= last)
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// How deserving of eviction an object of a tenant is: first those of tenants within their
    /// grant come last (`true` sorts after `false`), then by last use.
    fn rank(over_grant: bool, last_used: u64) -> (bool, u64) {
        (!over_grant, last_used)
    }

    /// Evicts from memory the single most deserving value there; `false` if nothing in memory is
    /// evictable.
    pub(super) fn evict_one_global(&mut self, now: Instant) -> bool {
        self.evict_one_in_memory(now, |_| true)
    }

    /// Evicts from memory the most deserving evictable value whose member `on` picks.
    pub(super) fn evict_one_in_memory(&mut self, now: Instant, on: impl Fn(u64) -> bool) -> bool {
        let mut best: Option<((bool, u64), &str, &str)> = None;
        for (name, t) in &self.tenants {
            let over = t.used > t.grant;
            for (key, o) in &t.objects {
                let rank = Self::rank(over, o.last_used);
                if o.memory.is_some() && o.evictable(now) && on(o.member) && best.is_none_or(|(b, _, _)| rank < b) {
                    best = Some((rank, name, key));
                }
            }
        }
        let Some((_, tenant, key)) = best else { return false };
        let (tenant, key) = (tenant.to_owned(), key.to_owned());
        self.evict(&tenant, &key);
        true
    }

    /// Evicts one value: a value in memory with a disk copy only leaves memory (it stays
    /// readable: a get loads it back), any other is dropped.
    fn evict(&mut self, tenant: &str, key: &str) -> Freed {
        let keeps = self
            .tenants
            .get(tenant)
            .and_then(|t| t.objects.get(key))
            .is_some_and(|o| o.memory.is_some() && o.disk.is_some());
        if keeps {
            return self.demote(tenant, key);
        }
        let freed = self
            .drop_object(tenant, key, Removal::Evicted)
            .map_or(Freed::default(), |o| Freed {
                memory: o.memory_len(),
                charge: o.charge,
            });
        if let Some(t) = self.tenants.get_mut(tenant) {
            t.counters.evictions += 1;
        }
        freed
    }

    /// Frees a value's memory, its disk copy keeping it.
    fn demote(&mut self, tenant: &str, key: &str) -> Freed {
        let Some(t) = self.tenants.get_mut(tenant) else {
            return Freed::default();
        };
        let Some(o) = t.objects.get_mut(key) else {
            return Freed::default();
        };
        let Some(r) = o.memory.take() else {
            return Freed::default();
        };
        let freed = Freed {
            memory: o.len,
            charge: o.charge,
        };
        o.charge = 0;
        let (member, mount_id, len) = (o.member, o.mount_id, o.len);
        t.used = t.used.saturating_sub(freed.charge);
        t.counters.demotions += 1;
        if let Some(m) = self.members.get_mut(&member)
            && m.mount_id == mount_id
        {
            m.alloc.release(r.offset, len);
            m.objects = m.objects.saturating_sub(1);
            m.notices.freed(r.offset, r.allocation);
        }
        freed
    }

    /// One watermark round: above `high_watermark` of capacity, frees `eviction_ratio` of it.
    /// Returns the number of values evicted from memory.
    pub fn watermark_round(&mut self, now: Instant) -> u64 {
        let capacity = self.capacity();
        let used = self.used();
        if capacity == 0 || (used as f64) < self.cfg.high_watermark * capacity as f64 {
            return 0;
        }
        let target = (self.cfg.eviction_ratio * capacity as f64) as u64;
        let mut ranks = Vec::new();
        for t in self.tenants.values() {
            let over = t.used > t.grant;
            ranks.extend(
                t.objects
                    .values()
                    .filter(|o| o.memory.is_some() && o.evictable(now))
                    .map(|o| (Self::rank(over, o.last_used), o.len)),
            );
        }
        let Some(last) = cutoff(ranks, target) else { return 0 };
        let mut going = Vec::new();
        for (name, t) in &self.tenants {
            let over = t.used > t.grant;
            for (key, o) in &t.objects {
                if o.memory.is_some() && o.evictable(now) && Self::rank(over, o.last_used) <= last {
                    going.push((name.clone(), key.clone()));
                }
            }
        }
        let freed: u64 = going.iter().map(|(tenant, key)| self.evict(tenant, key).memory).sum();
        if !going.is_empty() {
            tracing::debug!(evicted = going.len(), freed, "watermark eviction");
        }
        going.len() as u64
    }
}

/// What evicting one value freed: bytes of its member's memory, and of its tenant's charge.
#[derive(Debug, Default, Clone, Copy)]
struct Freed {
    memory: u64,
    charge: u64,
}

#[cfg(test)]
mod tests {
    use super::cutoff;

    #[test]
    fn the_cutoff_is_the_newest_rank_needed() {
        let entries = vec![(5, 100), (1, 100), (3, 100), (9, 100)];
        assert_eq!(cutoff(entries.clone(), 0), None, "nothing needed");
        assert_eq!(cutoff(entries.clone(), 1), Some(1));
        assert_eq!(cutoff(entries.clone(), 200), Some(3));
        assert_eq!(cutoff(entries.clone(), 250), Some(5));
        assert_eq!(cutoff(entries, 10_000), Some(9), "all of it, and still short");
        assert_eq!(cutoff(Vec::<(u64, u64)>::new(), 10), None, "nothing evictable");
    }
}
