//! The leader's side of members' disk tiers (`member/tiering.rs` is the member's): which values
//! have a disk copy, loading a value only on disk back into memory for a get, and what a member's
//! tier held when it mounted.
//!
//! - A member copies every sealed value to its tier and says so in its heartbeats
//!   (`HeartbeatRequest.spilled`): the leader notes the copy on the value ([`State::tier_report`]),
//!   after checking that the value is still the one the member copied (same key, allocation and
//!   size); a copy of a value gone or replaced since is told to go (`Notice::DiskFreed`). From
//!   then on, eviction frees the value's memory and keeps it (`eviction.rs`), and its tenant is
//!   charged its disk bytes apart (`Tenant::disk_used`), against its share of the disk tiers
//!   (its grant's share of the members' memory, [`State::disk_share`]): past it, its least
//!   recently used values only on disk go.
//! - A get of a value only on disk allocates a range on the member that holds the copy (evicting
//!   there when it is full), queues a load (`Notice::Load`, sealed for the new range) and answers
//!   once the member applied it ([`State::load_from_disk`], `calls.rs`). A copy the member could
//!   not read back whole (missing, or its checksum or tag wrong: `member/tier`) is reported lost
//!   in the same heartbeat that acknowledges the load, so the leader drops the value before any
//!   reader is told where it is: never a wrong byte, a miss instead, counted.
//! - Copies the tier lost (dropped when full, or found damaged) are forgotten; a value left with
//!   neither memory nor disk is dropped.
//! - A member that mounts hands over its tier's records (`MountRequest.disk_holdings`); the leader
//!   adopts each whose seal verifies, by the rules of `adoption.rs` (`State::vouched`), linking it to the same
//!   value adopted in memory or holding it only on disk ([`State::adopt_disk`]).

use std::sync::Arc;
use std::time::Instant;

use super::blocks::Removal;
use super::mounted::Loading;
use super::notices::Applied;
use super::objects::{Object, ObjectState, Resident, charge};
use super::placement::aligned;
use super::state::State;
use crate::grant::{Access, Placed, Tag};
use crate::proto::{DiskHolding, HeartbeatRequest, Location};

impl State {
    /// Takes in what a member's heartbeat says of its tier: the copies it made, those it lost,
    /// and its usage. Ignored when the mount is not the one this leader knows (the member mounts
    /// again and hands over its whole tier then).
    pub fn tier_report(&mut self, hb: &HeartbeatRequest, now: Instant) {
        let Some(m) = self.members.get_mut(&hb.member_id) else {
            return;
        };
        if m.mount_id != hb.mount_id || (hb.instance_id != 0 && m.instance_id != hb.instance_id) {
            return;
        }
        m.tier_used = hb.tier_used;
        for (h, allocation) in hb.spilled.iter().zip(&hb.spilled_allocations) {
            if !self.note_copy(hb.member_id, h, *allocation)
                && let Some(m) = self.members.get_mut(&hb.member_id)
            {
                m.notices.disk_freed(h.disk_id);
            }
        }
        for &disk_id in &hb.failed_read_disk_ids {
            self.count_failed_read(hb.member_id, disk_id);
        }
        for &disk_id in &hb.lost_disk_ids {
            self.forget_copy(hb.member_id, disk_id);
        }
        if !hb.spilled.is_empty() {
            self.trim_disks(now);
        }
    }

    /// A tenant's share of the members' disk tiers: its grant's share of their memory.
    pub fn disk_share(&self, tenant: &str) -> u64 {
        let (tiers, memory) = (self.tier_usage().0, self.capacity());
        let grant = self.tenants.get(tenant).map_or(0, |t| t.grant);
        if memory == 0 {
            return 0;
        }
        u64::try_from(u128::from(grant) * u128::from(tiers) / u128::from(memory)).unwrap_or(u64::MAX)
    }

    /// Trims every tenant over its share of the disk tiers ([`State::trim_disk`]).
    fn trim_disks(&mut self, now: Instant) {
        let over: Vec<(String, u64)> = self
            .tenants
            .keys()
            .map(|name| (name.clone(), self.disk_share(name)))
            .filter(|(name, share)| self.tenants.get(name).is_some_and(|t| t.disk_used > *share))
            .collect();
        for (name, share) in over {
            self.trim_disk(&name, share, now);
        }
    }

    /// Notes a copy the member made of the value it holds in memory under `allocation`; `false`
    /// when that value is gone, replaced, or already has one.
    fn note_copy(&mut self, member_id: u64, h: &DiskHolding, allocation: u64) -> bool {
        let Some(tag) = Tag::decode(&h.tag) else { return false };
        let Some(t) = self.tenants.get_mut(&tag.tenant) else {
            return false;
        };
        let Some(mut o) = t.objects.get_mut(&tag.key) else {
            return false;
        };
        let same = o.member == member_id
            && o.state == ObjectState::Committed
            && o.size == h.size
            && o.disk.is_none()
            && o.memory.is_some_and(|r| r.allocation == allocation);
        if !same {
            return false;
        }
        o.disk = Some(h.disk_id);
        t.disk_used += o.len;
        if let Some(m) = self.members.get_mut(&member_id) {
            m.disk.insert(h.disk_id, (tag.tenant, tag.key));
        }
        true
    }

    /// Forgets a copy the member's tier lost; the value goes with it when it was only there, or
    /// when a load from it was on its way (the load failed: its range holds nothing readable).
    /// Counts against its tenant a copy a read straight from disk could not serve (its loss comes
    /// in the same heartbeat).
    fn count_failed_read(&mut self, member_id: u64, disk_id: u64) {
        let Some((tenant, _)) = self.members.get(&member_id).and_then(|m| m.disk.get(&disk_id)) else {
            return;
        };
        if let Some(t) = self.tenants.get_mut(tenant) {
            t.counters.load_failures += 1;
        }
    }

    fn forget_copy(&mut self, member_id: u64, disk_id: u64) {
        let Some(m) = self.members.get_mut(&member_id) else {
            return;
        };
        let Some((tenant, key)) = m.disk.remove(&disk_id) else {
            return;
        };
        let Some(t) = self.tenants.get_mut(&tenant) else { return };
        let Some(mut o) = t.objects.get_mut(&key).filter(|o| o.disk == Some(disk_id)) else {
            return;
        };
        o.disk = None;
        t.disk_used = t.disk_used.saturating_sub(o.len);
        let memory = o.memory;
        drop(o);
        match memory {
            Some(r) if r.ready => {}
            loading => {
                if loading.is_some() {
                    t.counters.load_failures += 1;
                }
                t.counters.evictions += 1;
                self.drop_object(&tenant, &key, Removal::Evicted);
            }
        }
    }

    /// Where a get reads a committed value only on its member's disk tier straight from disk
    /// (`--tier-reads direct`): its copy's disk id, under a grant for op 7 that covers the value's
    /// tag (`wire.rs`), until `deadline_unix_ms`. Counted among the tenant's loads.
    pub(super) fn disk_location(
        &mut self,
        tenant: &str,
        key: &str,
        o: &Object,
        deadline_unix_ms: u64,
    ) -> Option<Location> {
        let disk_id = o.disk?;
        let tag = self.tag(tenant, key);
        let location = self.granted(o, Access::ReadDisk, (disk_id, 0), deadline_unix_ms, tag)?;
        if let Some(t) = self.tenants.get_mut(tenant) {
            t.counters.loads += 1;
        }
        Some(location)
    }

    /// Starts loading a committed value that is only on its member's disk tier into a range of
    /// that member's memory, or finds the load already on its way: what to wait for before asking
    /// again. `None` when it cannot be loaded (no room on its member, nothing evictable there):
    /// the get answers a miss and the value stays on disk.
    pub(super) fn load_from_disk(&mut self, tenant: &str, key: &str, now: Instant) -> Option<Applied> {
        let o = self.tenants.get(tenant)?.objects.get(key)?.clone();
        let m = self.members.get_mut(&o.member)?;
        if o.memory.is_some() {
            // on its way already: wait with the first reader
            m.notices.hurry();
            return Some(m.notices.applied());
        }
        let disk_id = o.disk?;
        // its tenant pays for its memory again: room in the grant first (leased, it stays)
        let more = charge(o.len, key.len()).saturating_sub(o.charge);
        let (grant, used) = self.tenants.get(tenant).map_or((0, 0), |t| (t.grant, t.used));
        if used + more > grant {
            self.evict_tenant(tenant, used + more - grant, now);
            let used = self.tenants.get(tenant).map_or(0, |t| t.used);
            if used + more > grant {
                return None;
            }
        }
        let offset = self.room_on(o.member, o.len, now)?;
        let allocation = self.next_allocation;
        self.next_allocation += 1;
        let tag = self.tag(tenant, key);
        let placed = Placed {
            offset,
            size: o.size,
            epoch: self.epoch,
        };
        let seal = self.seal_key.seal(&tag, &placed);
        let t = self.tenants.get_mut(tenant)?;
        let mut obj = t.objects.get_mut(key)?;
        obj.memory = Some(Resident {
            offset,
            allocation,
            ready: false,
        });
        obj.charge += more;
        t.used += more;
        t.counters.loads += 1;
        let m = self.members.get_mut(&o.member)?;
        m.objects += 1;
        let notice = m.notices.load(disk_id, offset, allocation, seal, Arc::from(tag));
        m.loading.push_back(Loading {
            notice,
            tenant: tenant.to_owned(),
            key: key.to_owned(),
            allocation,
        });
        m.notices.hurry();
        Some(m.notices.applied())
    }

    /// A free range of `len` bytes on `member`, evicting from its memory until there is one.
    /// `None` too while the member hands over its report (`adoption.rs`).
    fn room_on(&mut self, member: u64, len: u64, now: Instant) -> Option<u64> {
        loop {
            let m = self.members.get_mut(&member).filter(|m| m.handing_over.is_none())?;
            if let Some(offset) = m.alloc.allocate(len) {
                return Some(offset);
            }
            if !self.evict_one_in_memory(now, |id| id == member) {
                return None;
            }
        }
    }

    /// Marks readable the values whose load the member applied (its heartbeat said how far);
    /// a load that failed was reported lost in the same heartbeat, and its value is gone.
    pub(super) fn loads_applied(&mut self, member_id: u64) {
        let Some(m) = self.members.get_mut(&member_id) else {
            return;
        };
        let through = m.notices.applied_through();
        let mut done = Vec::new();
        while m.loading.front().is_some_and(|l| l.notice <= through) {
            done.extend(m.loading.pop_front());
        }
        for l in done {
            let o = self
                .tenants
                .get_mut(&l.tenant)
                .and_then(|t| t.objects.get_mut(&l.key))
                .filter(|o| o.member == member_id);
            if let Some(mut o) = o
                && let Some(r) = o.memory.as_mut()
                && r.allocation == l.allocation
            {
                r.ready = true;
            }
        }
    }

    /// Adopts what a freshly mounted member's disk tier holds (after its memory holdings):
    /// answers, per record, whether it is adopted (one not adopted is removed from the tier).
    pub(super) fn adopt_disk(&mut self, member_id: u64, holdings: &[DiskHolding], now: Instant) -> Vec<bool> {
        let mut adopted = Vec::with_capacity(holdings.len());
        let mut stored: std::collections::BTreeMap<(String, u64), Vec<String>> = Default::default();
        for h in holdings {
            match self.adopt_disk_one(member_id, h) {
                Some(Adopted::OnlyOnDisk(tag)) => {
                    stored.entry((tag.tenant, h.size)).or_default().push(tag.key);
                    adopted.push(true);
                }
                Some(Adopted::WithMemory) => adopted.push(true),
                None => adopted.push(false),
            }
        }
        let epoch = self.epoch;
        for ((tenant, size), keys) in stored {
            if let Some(t) = self.tenants.get_mut(&tenant) {
                let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
                t.log.stored_keys(epoch, &keys, size);
            }
        }
        if !holdings.is_empty() {
            self.recompute_grants();
            self.trim_disks(now);
        }
        adopted
    }

    fn adopt_disk_one(&mut self, member_id: u64, h: &DiskHolding) -> Option<Adopted> {
        let placed = Placed {
            offset: h.seal_offset,
            size: h.size,
            epoch: h.seal_epoch,
        };
        let tag = self.vouched(&h.tag, &placed, &h.seal)?;
        let m = self.members.get(&member_id)?;
        if m.disk.contains_key(&h.disk_id) {
            return None;
        }
        let mount_id = m.mount_id;
        let t = self.tenants.get_mut(&tag.tenant)?;
        let len = aligned(h.size);
        let outcome = if let Some(mut o) = t.objects.get_mut(&tag.key) {
            // the same value, adopted from the member's memory a moment ago
            let same =
                o.member == member_id && o.state == ObjectState::Committed && o.size == h.size && o.disk.is_none();
            if !same {
                return None;
            }
            o.disk = Some(h.disk_id);
            Adopted::WithMemory
        } else {
            // as old as its copy: eviction orders it with what the members last used
            let last_used = super::state::tick_at(h.written_unix_ms).min(self.tick);
            let object = Object {
                member: member_id,
                mount_id,
                memory: None,
                disk: Some(h.disk_id),
                size: h.size,
                len,
                charge: 0,
                state: ObjectState::Committed,
                lease_until: None,
                last_used,
            };
            if !t.objects.has_room() {
                return None;
            }
            t.used += object.charge;
            t.objects.insert(&tag.key, object).ok()?;
            self.adopted.objects += 1;
            self.adopted.bytes += h.size;
            Adopted::OnlyOnDisk(tag.clone())
        };
        let t = self.tenants.get_mut(&tag.tenant)?;
        t.disk_used += len;
        let m = self.members.get_mut(&member_id)?;
        m.disk.insert(h.disk_id, (tag.tenant, tag.key));
        Some(outcome)
    }
}

/// How a record of a member's disk tier was adopted.
enum Adopted {
    /// as the disk copy of the value adopted from the member's memory
    WithMemory,
    /// as a value only on disk (its tag, for the block log)
    OnlyOnDisk(Tag),
}

#[cfg(test)]
mod tests;
