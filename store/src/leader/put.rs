//! The two-phase put on the leader's state: reserving a range for the writer (charging the
//! tenant, evicting within its grant or globally to make room), committing and sealing the value,
//! or revoking the reservation.

use std::time::Instant;

use super::blocks::Removal;
use super::clients::Use;
use super::objects::{Object, ObjectState, Resident};
use super::placement::{self, aligned};
use super::state::{EVICTION_BATCH, State, client, internal};
use crate::error::{ErrorCode, Result, StoreError};
use crate::grant::Access;
use crate::proto::{PutStartResponse, Scope};
use crate::time::unix_ms_after;

impl State {
    /// Phase one of a put: charge the tenant, find space, hold it for the writer.
    pub fn put_start(&mut self, scope: Option<&Scope>, key: &str, size: u64, now: Instant) -> Result<PutStartResponse> {
        let tenant = self.tenant_name(scope)?;
        Self::check_key(key)?;
        self.check_value_size(size)?;
        let tick = self.next_tick();
        if let Some(t) = self.tenants.get_mut(&tenant)
            && let Some(mut o) = t.objects.get_mut(key)
        {
            // values are immutable and keys content-derived: an existing key means the same bytes
            o.last_used = tick;
            return Ok(PutStartResponse {
                already_exists: true,
                ..Default::default()
            });
        }
        if self.tenants.get(&tenant).is_some_and(|t| !t.objects.has_room()) {
            return Err(StoreError::new(ErrorCode::NoSpace, super::index::IndexFull.to_string()));
        }
        let len = aligned(size);
        let charge = super::objects::charge(len, key.len());
        self.make_room_in_grant(&tenant, charge, now)?;
        let placed = self.allocate(len, now).ok_or_else(|| self.no_space(len))?;
        let (put_id, object) = self.reserve(placed, size, charge, tick, now);
        let write_deadline_unix_ms = unix_ms_after(self.cfg.put_ttl);
        let tag = self.tag(&tenant, key);
        let location = self.location(&object, Access::Write, write_deadline_unix_ms, tag);
        self.hold(&tenant, key, object)?;
        Ok(PutStartResponse {
            already_exists: false,
            put_id,
            location,
            write_deadline_unix_ms,
        })
    }

    /// Refuses a value of 0 bytes or over `--max-value-size`.
    fn check_value_size(&self, size: u64) -> Result<()> {
        if size == 0 || size > self.cfg.max_value_size {
            return Err(StoreError::new(
                ErrorCode::ValueTooLarge,
                format!(
                    "values must be 1 to {} bytes (--max-value-size); this one is {size} bytes: split it",
                    self.cfg.max_value_size
                ),
            ));
        }
        Ok(())
    }

    /// The refusal of a put that no mounted segment has `len` free bytes for, eviction included.
    fn no_space(&self, len: u64) -> StoreError {
        let handing_over = self.members.values().filter(|m| m.handing_over.is_some()).count();
        let waiting = if handing_over > 0 {
            format!(
                "; {handing_over} of them still hand over what they held to this term, and take no new values \
                 until they are done: retry in a moment"
            )
        } else {
            String::new()
        };
        StoreError::new(
            ErrorCode::NoSpace,
            format!(
                "no mounted segment has {len} free bytes and nothing evictable is left ({} members, {} of {} \
                 bytes used); add members, raise their capacity, or retry after leases expire{waiting}",
                self.members.len(),
                self.used(),
                self.capacity()
            ),
        )
    }

    /// Reserves the range `(member, offset)` for a writer of `size` bytes charged `charge`: a new
    /// put id and allocation, and the reserved object, reclaimed once the put's TTL and grace pass.
    fn reserve(
        &mut self,
        (member_id, offset): (u64, u64),
        size: u64,
        charge: u64,
        tick: u64,
        now: Instant,
    ) -> (u64, Object) {
        let put_id = self.next_put_id;
        self.next_put_id += 1;
        let allocation = self.next_allocation;
        self.next_allocation += 1;
        let reclaim_after = self.cfg.put_ttl + self.cfg.put_grace;
        let mount_id = self.members.get(&member_id).map_or(0, |m| m.mount_id);
        let object = Object {
            member: member_id,
            mount_id,
            memory: Some(Resident {
                offset,
                allocation,
                ready: true,
            }),
            disk: None,
            size,
            len: aligned(size),
            charge,
            state: ObjectState::Reserved {
                put_id,
                reclaim_at: now + reclaim_after,
            },
            lease_until: None,
            last_used: tick,
        };
        (put_id, object)
    }

    /// Holds a reserved `object` under `key`: counted on its member, charged to `tenant`.
    fn hold(&mut self, tenant: &str, key: &str, object: Object) -> Result<()> {
        if let Some(m) = self.members.get_mut(&object.member) {
            m.objects += 1;
        }
        let t = self
            .tenants
            .get_mut(tenant)
            .ok_or_else(|| internal("tenant vanished during put"))?;
        t.used += object.charge;
        t.objects.insert(key, object).map_err(|e| internal(&e.to_string()))?;
        Ok(())
    }

    /// Evicts the tenant's own least-recently-used unleased objects until a `len`-byte charge
    /// more fits its grant.
    fn make_room_in_grant(&mut self, tenant: &str, len: u64, now: Instant) -> Result<()> {
        let (grant, used) = self.tenants.get(tenant).map_or((0, 0), |t| (t.grant, t.used));
        if len > grant {
            self.count_quota_refusal(tenant);
            return Err(StoreError::new(
                ErrorCode::TenantQuotaExceeded,
                format!(
                    "tenant {tenant:?} has a grant of {grant} bytes ({} bytes mounted), smaller than this value's \
                     {len}-byte charge (its length rounded up, plus its key and the leader's per-object overhead); \
                     raise the tenant's ceiling or mount more capacity",
                    self.capacity()
                ),
            ));
        }
        if used + len <= grant {
            return Ok(());
        }
        // a little ahead of need (1/256 of the grant): choosing what goes looks at every object
        // of the tenant, so a full tenant of many small values would otherwise pay that on every
        // put (a new term adopting a full cache starts exactly there)
        let need = (used + len - grant).max(grant / EVICTION_BATCH);
        self.evict_tenant(tenant, need, now);
        let used = self.tenants.get(tenant).map_or(0, |t| t.used);
        if used + len <= grant {
            return Ok(());
        }
        self.count_quota_refusal(tenant);
        Err(StoreError::new(
            ErrorCode::TenantQuotaExceeded,
            format!(
                "tenant {tenant:?} uses {used} of its {grant}-byte grant and every object it could evict is leased \
                 or still being written; retry after read leases expire, or raise the tenant's ceiling"
            ),
        ))
    }

    fn count_quota_refusal(&mut self, tenant: &str) {
        if let Some(t) = self.tenants.get_mut(tenant) {
            t.counters.quota_refusals += 1;
        }
    }

    /// Finds a segment range of `len`, evicting globally when no segment has room.
    fn allocate(&mut self, len: u64, now: Instant) -> Option<(u64, u64)> {
        loop {
            let candidates: Vec<(u64, u64, u64)> = self
                .members
                .iter()
                .filter(|(_, m)| m.handing_over.is_none() && m.alloc.fits(len))
                .map(|(id, m)| (*id, m.alloc.free(), m.alloc.capacity()))
                .collect();
            if let Some(id) = placement::choose(self.cfg.allocation_strategy, &candidates, &mut self.seed) {
                let m = self.members.get_mut(&id)?;
                return m.alloc.allocate(len).map(|off| (id, off));
            }
            // evicting helps only a segment that takes new values
            if self.members.values().all(|m| m.handing_over.is_some()) {
                return None;
            }
            if !self.evict_one_global(now) {
                return None;
            }
        }
    }

    /// Phase two: the bytes are written; make the value visible, and seal it for the member that
    /// holds it (its next heartbeat answer hands the seal over: `notices.rs`).
    pub fn put_commit(&mut self, scope: Option<&Scope>, key: &str, put_id: u64) -> Result<()> {
        let tenant = self.tenant_name(scope)?;
        let tick = self.next_tick();
        let epoch = self.epoch;
        let t = self
            .tenants
            .get_mut(&tenant)
            .ok_or_else(|| internal("tenant vanished"))?;
        let placed = match t.objects.get_mut(key) {
            Some(o) if o.state == ObjectState::Committed => return Ok(()),
            Some(mut o) if matches!(o.state, ObjectState::Reserved { put_id: p, .. } if p == put_id) => {
                let Some(r) = o.memory else {
                    return Err(internal("a reserved value without memory"));
                };
                o.state = ObjectState::Committed;
                o.last_used = tick;
                t.counters.puts += 1;
                t.clients.count(client(scope), tick, Use::Put);
                t.log.stored(epoch, key, o.size);
                (o.member, o.mount_id, r.offset, r.allocation, o.size)
            }
            _ => {
                return Err(StoreError::new(
                    ErrorCode::PutExpired,
                    format!(
                        "put {put_id} of key {key:?} is no longer reserved (it expired, its member left, or the leader \
                         restarted); write the value again from PutStart"
                    ),
                ));
            }
        };
        self.seal(&tenant, key, placed);
        Ok(())
    }

    /// Seals a committed value placed at `(member, mount, offset, allocation, size)` for its
    /// member's next heartbeat answer.
    pub(super) fn seal(
        &mut self,
        tenant: &str,
        key: &str,
        (member, mount_id, offset, allocation, size): (u64, u64, u64, u64, u64),
    ) {
        let placed = crate::grant::Placed {
            offset,
            size,
            epoch: self.epoch,
        };
        let seal = self.seal_key.seal(&self.tag(tenant, key), &placed);
        if let Some(m) = self.members.get_mut(&member)
            && m.mount_id == mount_id
        {
            m.notices.sealed(offset, allocation, seal);
        }
    }

    /// The writer gives up: space and charge are returned.
    pub fn put_revoke(&mut self, scope: Option<&Scope>, key: &str, put_id: u64) -> Result<()> {
        let tenant = self.tenant_name(scope)?;
        let reserved = self
            .tenants
            .get(&tenant)
            .and_then(|t| t.objects.get(key))
            .is_some_and(|o| matches!(o.state, ObjectState::Reserved { put_id: p, .. } if p == put_id));
        if reserved {
            self.drop_object(&tenant, key, Removal::Unpublished);
            if let Some(t) = self.tenants.get_mut(&tenant) {
                t.counters.put_revokes += 1;
            }
        }
        Ok(())
    }
}
