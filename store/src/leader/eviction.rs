//! Eviction in approximately least-recently-used order, never touching leased or uncommitted
//! objects: per tenant when a put would pass its grant, and store-wide when usage passes the high
//! watermark or an allocation finds no room (tenants over their grant are evicted from first).
//!
//! Choosing what goes copies no keys but those of the objects that go: the order is decided on
//! numbers (how deserving, last use, bytes), which gives the last use that must go; then one pass
//! takes the keys at or before it. Under the one state lock that is a sort of 24-byte entries,
//! not of every key the store holds.

use std::time::Instant;

use super::blocks::Removal;
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
    /// Evicts the tenant's own LRU evictable objects until at least `need` bytes of its charge
    /// are freed (or nothing evictable is left). Returns the charge freed.
    pub(super) fn evict_tenant(&mut self, tenant: &str, need: u64, now: Instant) -> u64 {
        let Some(t) = self.tenants.get(tenant) else { return 0 };
        let ranks = t
            .objects
            .values()
            .filter(|o| o.evictable(now))
            .map(|o| (o.last_used, o.charge))
            .collect();
        let Some(last) = cutoff(ranks, need) else { return 0 };
        let going: Vec<String> = t
            .objects
            .iter()
            .filter(|(_, o)| o.evictable(now) && o.last_used <= last)
            .map(|(k, _)| k.clone())
            .collect();
        let mut freed = 0;
        for key in going {
            if let Some(o) = self.drop_object(tenant, &key, Removal::Evicted) {
                freed += o.charge;
                if let Some(t) = self.tenants.get_mut(tenant) {
                    t.counters.evictions += 1;
                }
            }
        }
        freed
    }

    /// How deserving of eviction an object of a tenant is: first those of tenants within their
    /// grant come last (`true` sorts after `false`), then by last use.
    fn rank(over_grant: bool, last_used: u64) -> (bool, u64) {
        (!over_grant, last_used)
    }

    /// Evicts the single most deserving object; `false` if nothing is evictable.
    pub(super) fn evict_one_global(&mut self, now: Instant) -> bool {
        let mut best: Option<((bool, u64), &str, &str)> = None;
        for (name, t) in &self.tenants {
            let over = t.used > t.grant;
            for (key, o) in &t.objects {
                let rank = Self::rank(over, o.last_used);
                if o.evictable(now) && best.is_none_or(|(b, _, _)| rank < b) {
                    best = Some((rank, name, key));
                }
            }
        }
        let Some((_, tenant, key)) = best else { return false };
        let (tenant, key) = (tenant.to_owned(), key.to_owned());
        self.evict(&tenant, &key);
        true
    }

    fn evict(&mut self, tenant: &str, key: &str) -> u64 {
        let freed = self.drop_object(tenant, key, Removal::Evicted).map_or(0, |o| o.len);
        if let Some(t) = self.tenants.get_mut(tenant) {
            t.counters.evictions += 1;
        }
        freed
    }

    /// One watermark round: above `high_watermark` of capacity, frees `eviction_ratio` of it.
    /// Returns the number of objects evicted.
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
                    .filter(|o| o.evictable(now))
                    .map(|o| (Self::rank(over, o.last_used), o.len)),
            );
        }
        let Some(last) = cutoff(ranks, target) else { return 0 };
        let mut going = Vec::new();
        for (name, t) in &self.tenants {
            let over = t.used > t.grant;
            for (key, o) in &t.objects {
                if o.evictable(now) && Self::rank(over, o.last_used) <= last {
                    going.push((name.clone(), key.clone()));
                }
            }
        }
        let mut freed = 0;
        for (tenant, key) in &going {
            freed += self.evict(tenant, key);
        }
        if !going.is_empty() {
            tracing::debug!(evicted = going.len(), freed, "watermark eviction");
        }
        going.len() as u64
    }
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
