//! Eviction in approximately least-recently-used order, never touching leased or uncommitted
//! objects: per tenant when a put would pass its grant, and store-wide when usage passes the high
//! watermark or an allocation finds no room (tenants over their grant are evicted from first).

use std::time::Instant;

use super::blocks::Removal;
use super::state::State;

impl State {
    /// Evicts the tenant's own LRU evictable objects until at least `need` bytes are freed (or
    /// nothing evictable is left). Returns the bytes freed.
    pub(super) fn evict_tenant(&mut self, tenant: &str, need: u64, now: Instant) -> u64 {
        let Some(t) = self.tenants.get(tenant) else { return 0 };
        let mut candidates: Vec<(u64, String)> = t
            .objects
            .iter()
            .filter(|(_, o)| o.evictable(now))
            .map(|(k, o)| (o.last_used, k.clone()))
            .collect();
        candidates.sort_unstable();
        let mut freed = 0;
        for (_, key) in candidates {
            if freed >= need {
                break;
            }
            if let Some(o) = self.drop_object(tenant, &key, Removal::Evicted) {
                freed += o.len;
                if let Some(t) = self.tenants.get_mut(tenant) {
                    t.counters.evictions += 1;
                }
            }
        }
        freed
    }

    /// Store-wide candidates, most deserving first: objects of tenants over their grant, then LRU.
    fn global_candidates(&self, now: Instant) -> Vec<(bool, u64, String, String)> {
        let mut v = Vec::new();
        for (name, t) in &self.tenants {
            let over = t.used > t.grant;
            for (key, o) in &t.objects {
                if o.evictable(now) {
                    v.push((!over, o.last_used, name.clone(), key.clone()));
                }
            }
        }
        v.sort_unstable();
        v
    }

    /// Evicts the single most deserving object; `false` if nothing is evictable.
    pub(super) fn evict_one_global(&mut self, now: Instant) -> bool {
        let Some((_, _, tenant, key)) = self.global_candidates(now).into_iter().next() else {
            return false;
        };
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
        let mut freed = 0;
        let mut n = 0;
        for (_, _, tenant, key) in self.global_candidates(now) {
            if freed >= target {
                break;
            }
            freed += self.evict(&tenant, &key);
            n += 1;
        }
        if n > 0 {
            tracing::debug!(evicted = n, freed, "watermark eviction");
        }
        n
    }
}
