//! Eviction in approximately least-recently-used order, never touching leased or uncommitted
//! objects: per tenant when a put would pass its grant, and store-wide when usage passes the high
//! watermark or an allocation finds no room (tenants over their grant are evicted from first).
//! A value whose member copied it to its disk tier only leaves memory (it is "demoted": a get
//! loads it back); values only on disk go when their tenant passes its share of the disk tiers
//! ([`State::trim_disk`]), or when a tier drops them (`tiered.rs`).
//!
//! Choosing what goes walks each tenant's objects in the order of their last use (`index.rs`),
//! from the least recently used, and stops once enough is found: it looks at what goes and at
//! the leased or unfinished values it passes, never at every object the store holds.

use std::time::Instant;

use super::blocks::Removal;
use super::index::Name;
use super::objects::Object;
use super::state::State;

/// The keys of the evictable values of `order` (least recently used first) that free at least
/// `need` bytes as `frees` counts them, or all the evictable values when they do not.
fn least_recent<'a>(
    order: impl Iterator<Item = (Name<'a>, Object)>,
    need: u64,
    now: Instant,
    frees: impl Fn(&Object) -> u64,
) -> Vec<String> {
    let mut freed = 0;
    let mut going = Vec::new();
    for (key, o) in order.filter(|(_, o)| o.evictable(now)) {
        if freed >= need {
            break;
        }
        freed += frees(&o);
        going.push(key.to_string());
    }
    going
}

impl State {
    /// Makes room in the tenant's grant: evicts its least recently used evictable values in
    /// memory (a value with a disk copy keeps it and frees its memory, others go) until at least
    /// `need` bytes of its charge are freed (or nothing evictable is left). Returns the charge
    /// freed.
    pub(super) fn evict_tenant(&mut self, tenant: &str, need: u64, now: Instant) -> u64 {
        let Some(t) = self.tenants.get(tenant) else { return 0 };
        let going = least_recent(t.objects.in_memory_by_last_use(), need, now, |o| o.charge);
        going.iter().map(|key| self.evict(tenant, key).charge).sum()
    }

    /// Drops the tenant's least recently used values only on disk until its disk copies fit
    /// `share` bytes (or none of those is left unleased). Returns how many went.
    pub(super) fn trim_disk(&mut self, tenant: &str, share: u64, now: Instant) -> usize {
        let Some(t) = self.tenants.get(tenant) else { return 0 };
        let Some(need) = t.disk_used.checked_sub(share).filter(|n| *n > 0) else {
            return 0;
        };
        let going = least_recent(t.objects.on_disk_by_last_use(), need, now, |o| o.len);
        for key in &going {
            self.evict(tenant, key);
        }
        going.len()
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

    /// Evicts from memory the most deserving evictable value whose member `on` picks: of each
    /// tenant, its least recently used such value; of those, the most deserving.
    pub(super) fn evict_one_in_memory(&mut self, now: Instant, on: impl Fn(u64) -> bool) -> bool {
        let mut best: Option<((bool, u64), &str, Name<'_>)> = None;
        for (name, t) in &self.tenants {
            let over = t.used > t.grant;
            let first = t
                .objects
                .in_memory_by_last_use()
                .find(|(_, o)| o.evictable(now) && on(o.member));
            if let Some((key, o)) = first {
                let rank = Self::rank(over, o.last_used);
                if best.is_none_or(|(b, _, _)| rank < b) {
                    best = Some((rank, name, key));
                }
            }
        }
        let Some((_, tenant, key)) = best else { return false };
        let (tenant, key) = (tenant.to_owned(), key.to_string());
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
        let Some(mut o) = t.objects.get_mut(key) else {
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
        // each tenant's evictable values in memory, least recently used first, merged by rank
        let mut heads: Vec<_> = self
            .tenants
            .iter()
            .map(|(name, t)| {
                let over = t.used > t.grant;
                let order = t.objects.in_memory_by_last_use().filter(move |(_, o)| o.evictable(now));
                (name, over, order.peekable())
            })
            .collect();
        let mut going = Vec::new();
        let mut found = 0;
        while found < target {
            let next = heads
                .iter_mut()
                .enumerate()
                .filter_map(|(i, (_, over, order))| order.peek().map(|(_, o)| (Self::rank(*over, o.last_used), i)))
                .min();
            let Some((_, i)) = next else { break };
            let Some((name, _, order)) = heads.get_mut(i) else {
                break;
            };
            let Some((key, o)) = order.next() else { break };
            found += o.len;
            going.push((name.to_string(), key.to_string()));
        }
        drop(heads);
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
    use std::time::Duration;

    use super::super::LeaderConfig;
    use super::super::tests::{MIB, entry, mount, put, scope, state};
    use super::*;

    fn held(s: &State, t: &str) -> Vec<String> {
        let mut keys: Vec<String> = s.tenants[t].objects.keys().map(|k| k.to_string()).collect();
        keys.sort();
        keys
    }

    #[test]
    fn a_tenant_gives_up_its_least_recently_used_values_first_and_keeps_leased_ones() {
        let (mut s, now) = state(LeaderConfig::default());
        s.set_tenants(&[entry("a", 64 * MIB)], &[]).unwrap();
        mount(&mut s, "m", 64 * MIB, now);
        for i in 0..6 {
            put(&mut s, "a", &format!("k{i}"), 1000, now).unwrap();
        }
        // k0 is read: the most recently used now, and leased
        s.get(Some(&scope("a")), "k0", now).unwrap();
        let one = s.tenants["a"].objects.of("k1").charge;
        assert_eq!(s.evict_tenant("a", 2 * one, now), 2 * one);
        assert_eq!(held(&s, "a"), ["k0", "k3", "k4", "k5"]);
        assert_eq!(s.evict_tenant("a", 100 * one, now), 3 * one, "all but the leased one");
        assert_eq!(held(&s, "a"), ["k0"]);
        let later = now + Duration::from_secs(11);
        assert_eq!(s.evict_tenant("a", 1, later), one, "its lease ran out");
    }

    #[test]
    fn the_store_evicts_tenants_over_their_grant_first_then_by_last_use_across_tenants() {
        let cfg = LeaderConfig {
            high_watermark: 0.0,
            // two 1,000-byte values (1 KiB allocated) a round
            eviction_ratio: 2048.0 / (64 * MIB) as f64,
            ..Default::default()
        };
        let (mut s, now) = state(cfg);
        s.set_tenants(&[entry("a", 8 * MIB), entry("b", 8 * MIB)], &[]).unwrap();
        mount(&mut s, "m", 64 * MIB, now);
        for i in 0..4 {
            put(&mut s, "a", &format!("a{i}"), 1000, now).unwrap();
            put(&mut s, "b", &format!("b{i}"), 1000, now).unwrap();
        }
        assert!(s.evict_one_global(now));
        assert_eq!(held(&s, "a"), ["a1", "a2", "a3"], "the least recently used of all");
        assert_eq!(s.watermark_round(now), 2);
        assert_eq!(
            (held(&s, "a"), held(&s, "b")),
            (
                vec!["a2".into(), "a3".into()],
                vec!["b1".into(), "b2".into(), "b3".into()]
            )
        );
        // a's grant falls below what it holds: its values go before b's older ones
        s.set_tenants(&[entry("a", 1024), entry("b", 8 * MIB)], &[]).unwrap();
        assert!(s.evict_one_global(now));
        assert_eq!((held(&s, "a"), held(&s, "b").len()), (vec!["a3".to_owned()], 3));
        assert_eq!(s.watermark_round(now), 2);
        assert_eq!(
            (held(&s, "a").len(), held(&s, "b")),
            (0, vec!["b2".to_owned(), "b3".to_owned()])
        );
    }

    #[test]
    fn room_on_one_member_is_made_from_that_members_values_only() {
        let (mut s, now) = state(LeaderConfig::default());
        s.set_tenants(&[entry("a", 64 * MIB)], &[]).unwrap();
        mount(&mut s, "m", 64 * MIB, now);
        let n = mount(&mut s, "n", 64 * MIB, now);
        for i in 0..8 {
            put(&mut s, "a", &format!("k{i}"), 1000, now).unwrap();
        }
        let on_n: Vec<String> = s.tenants["a"]
            .objects
            .in_memory_by_last_use()
            .filter(|(_, o)| o.member == n)
            .map(|(k, _)| k.to_string())
            .collect();
        assert!(on_n.len() > 1 && on_n.len() < 8, "placed on both members: {on_n:?}");
        assert!(s.evict_one_in_memory(now, |id| id == n));
        assert!(
            !s.tenants["a"].objects.contains_key(&on_n[0]),
            "n's least recently used went"
        );
        assert_eq!(s.tenants["a"].objects.len(), 7);
    }
}
