//! The leader's whole metadata under one lock: members and their free space, tenants and their
//! objects. Engine operations (two-phase put, get with lease, exists, remove) live here; the
//! ledger in `tenants.rs`, mounting in `members.rs` (a mounted member is `mounted.rs`), eviction in `eviction.rs`, read-outs in
//! `status.rs`.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use super::LeaderConfig;
use super::blocks::Removal;
use super::clients::Use;
use super::ledger::DEFAULT_TENANT;
pub use super::mounted::Member;
use super::objects::{Counters, Object, ObjectState, Tenant};
use super::placement::{self, aligned};
use crate::error::{ErrorCode, Result, StoreError};
use crate::proto::{GetResponse, Location, PutStartResponse, Scope};
use crate::time::{now_unix_ms, unix_ms_after};

/// A tenant at its grant is evicted ahead of need by this fraction of its grant (`1/256`), so
/// the cost of choosing what goes is paid once per many puts.
pub const EVICTION_BATCH: u64 = 256;

/// Longest key accepted.
pub const MAX_KEY_LEN: usize = 4096;

/// Everything the leader knows.
#[derive(Debug)]
pub struct State {
    pub(super) cfg: LeaderConfig,
    pub(super) members: BTreeMap<u64, Member>,
    pub(super) tenants: HashMap<String, Tenant>,
    /// each pool's total, as the ledger gave it: what its tenants' grants add up to at most
    pub(super) pools: BTreeMap<String, u64>,
    pub(super) next_member_id: u64,
    pub(super) next_put_id: u64,
    /// numbers each placement of a value (`grant.rs`); rises for the whole term
    pub(super) next_allocation: u64,
    pub(super) tick: u64,
    pub(super) seed: u64,
    /// counters of tenants that were removed from the ledger, so global totals never go down
    pub(super) retired: Counters,
    /// the term this state belongs to (the Lease's `leaseTransitions`; 0 without an election):
    /// every range handed out carries it, and members refuse older ones
    pub(super) epoch: u64,
    /// the term's grant key (`grant.rs`); each member gets the key derived from it for its mount
    pub(super) grant_key: crate::grant::GrantKey,
    /// seals committed values (`grant.rs`): the backend's leaders' key, never a member's
    pub(super) seal_key: std::sync::Arc<crate::grant::SealKey>,
    /// counts ledger replacements: a `WatchBlocks` stream checks its credential again at each
    /// (`blocks.rs`), so access ends with the credential, not only at the stream's start
    pub(super) ledger_generation: tokio::sync::watch::Sender<u64>,
    /// member processes unmounted for falling behind on their notices: their next mount hands over
    /// nothing (`members.rs`)
    pub(super) distrusted: std::collections::HashSet<u64>,
    /// who may send a request at all, from the ledger's credentials (`ledger.rs`)
    pub(super) callers: super::ledger::Callers,
    /// whether this term has the ledger to adopt members' holdings against: multi-tenancy off,
    /// `--tenant`, or a `SetTenants` (`members.rs` holds reports back until then, a while)
    pub(super) ledger_known: bool,
    /// when this state's term began
    pub(super) started: Instant,
    /// what this term adopted from its members' holdings
    pub(super) adopted: Adopted,
}

/// Values (and their bytes) a term adopted from what its members held.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Adopted {
    pub objects: u64,
    pub bytes: u64,
}

impl State {
    /// A term's empty state, sealing with `seal_key`.
    pub fn new(cfg: LeaderConfig, seal_key: std::sync::Arc<crate::grant::SealKey>) -> Self {
        let seed = uuid::Uuid::new_v4().as_u64_pair().0 | 1;
        let mut s = Self {
            cfg,
            members: BTreeMap::new(),
            tenants: HashMap::new(),
            pools: BTreeMap::new(),
            next_member_id: 1,
            next_put_id: 1,
            next_allocation: 1,
            tick: tick_at(now_unix_ms()),
            seed,
            retired: Counters::default(),
            epoch: 0,
            grant_key: crate::grant::GrantKey::generate(),
            seal_key,
            ledger_generation: tokio::sync::watch::Sender::new(0),
            callers: Default::default(),
            distrusted: Default::default(),
            ledger_known: false,
            started: Instant::now(),
            adopted: Adopted::default(),
        };
        s.ledger_known = !s.cfg.multi_tenancy;
        if !s.cfg.multi_tenancy {
            let layout = s.cfg.default_layout();
            s.tenants.insert(
                DEFAULT_TENANT.to_string(),
                Tenant {
                    layout,
                    ..Tenant::default()
                },
            );
            s.recompute_grants();
        }
        s.callers.open = !s.cfg.multi_tenancy;
        s
    }

    pub fn capacity(&self) -> u64 {
        self.members.values().map(|m| m.alloc.capacity()).sum()
    }

    pub fn used(&self) -> u64 {
        self.members.values().map(|m| m.alloc.used()).sum()
    }

    pub fn object_count(&self) -> u64 {
        self.tenants.values().map(|t| t.objects.len() as u64).sum()
    }

    pub(super) fn check_key(key: &str) -> Result<()> {
        if key.is_empty() || key.len() > MAX_KEY_LEN {
            return Err(StoreError::new(
                ErrorCode::InvalidArgument,
                format!(
                    "keys must be 1 to {MAX_KEY_LEN} bytes long; this one is {} bytes",
                    key.len()
                ),
            ));
        }
        Ok(())
    }

    pub(super) fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    /// Where `o` is, granted for `access` until `deadline_unix_ms` (signed: `grant.rs`); a write
    /// names its value's `tag` (empty for a read).
    pub(super) fn location(
        &self,
        o: &Object,
        member_id: u64,
        access: crate::grant::Access,
        deadline_unix_ms: u64,
        tag: Vec<u8>,
    ) -> Option<Location> {
        let m = self.members.get(&member_id)?;
        let grant_mac = m.grant_key.sign(
            &crate::grant::Range {
                access,
                mount_id: o.mount_id,
                epoch: self.epoch,
                allocation: o.allocation,
                offset: o.offset,
                len: o.size,
                deadline_unix_ms,
            },
            &tag,
        );
        Some(Location {
            member_id,
            data_addr: m.data_addr.clone(),
            grpc_addr: m.grpc_addr.clone(),
            mount_id: o.mount_id,
            offset: o.offset,
            len: o.size,
            epoch: self.epoch,
            local_addr: m.local_addr.clone(),
            grant_mac: grant_mac.into(),
            allocation: o.allocation,
            tag: tag.into(),
        })
    }

    /// The tag a write of `key` for `tenant` carries: the tenant and its holder, its layout now,
    /// the key.
    pub(super) fn tag(&self, tenant: &str, key: &str) -> Vec<u8> {
        let t = self.tenants.get(tenant);
        let layout = t.and_then(|t| t.layout.as_ref());
        crate::grant::Tag {
            tenant: tenant.to_owned(),
            uid: t.map_or_else(String::new, |t| t.uid.clone()),
            block_size: layout.map_or(0, |l| l.block_size),
            dtype: layout.map_or_else(String::new, |l| l.dtype.clone()),
            key: key.to_owned(),
        }
        .encode()
    }

    /// The term this state serves.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// What this term adopted from its members so far.
    pub fn adopted(&self) -> Adopted {
        self.adopted
    }

    /// Phase one of a put: charge the tenant, find space, hold it for the writer.
    pub fn put_start(&mut self, scope: Option<&Scope>, key: &str, size: u64, now: Instant) -> Result<PutStartResponse> {
        let tenant = self.tenant_name(scope)?;
        Self::check_key(key)?;
        if size == 0 || size > self.cfg.max_value_size {
            return Err(StoreError::new(
                ErrorCode::ValueTooLarge,
                format!(
                    "values must be 1 to {} bytes (--max-value-size); this one is {size} bytes: split it",
                    self.cfg.max_value_size
                ),
            ));
        }
        let tick = self.next_tick();
        if let Some(t) = self.tenants.get_mut(&tenant)
            && let Some(o) = t.objects.get_mut(key)
        {
            // values are immutable and keys content-derived: an existing key means the same bytes
            o.last_used = tick;
            return Ok(PutStartResponse {
                already_exists: true,
                ..Default::default()
            });
        }
        let len = aligned(size);
        let charge = super::objects::charge(len, key);
        self.make_room_in_grant(&tenant, charge, now)?;
        let member = self.allocate(len, now).ok_or_else(|| {
            StoreError::new(
                ErrorCode::NoSpace,
                format!(
                    "no mounted segment has {len} free bytes and nothing evictable is left ({} members, {} of {} \
                     bytes used); add members, raise their capacity, or retry after leases expire",
                    self.members.len(),
                    self.used(),
                    self.capacity()
                ),
            )
        })?;
        let put_id = self.next_put_id;
        self.next_put_id += 1;
        let allocation = self.next_allocation;
        self.next_allocation += 1;
        let reclaim_after = self.cfg.put_ttl + self.cfg.put_grace;
        let (member_id, offset) = member;
        let mount_id = self.members.get(&member_id).map_or(0, |m| m.mount_id);
        let object = Object {
            member: member_id,
            mount_id,
            offset,
            allocation,
            size,
            len,
            charge,
            state: ObjectState::Reserved {
                put_id,
                reclaim_at: now + reclaim_after,
            },
            lease_until: now,
            last_used: tick,
        };
        let write_deadline_unix_ms = unix_ms_after(self.cfg.put_ttl);
        let tag = self.tag(&tenant, key);
        let location = self.location(
            &object,
            member_id,
            crate::grant::Access::Write,
            write_deadline_unix_ms,
            tag,
        );
        if let Some(m) = self.members.get_mut(&member_id) {
            m.objects += 1;
        }
        let t = self
            .tenants
            .get_mut(&tenant)
            .ok_or_else(|| internal("tenant vanished during put"))?;
        t.used += charge;
        t.objects.insert(key.to_string(), object);
        Ok(PutStartResponse {
            already_exists: false,
            put_id,
            location,
            write_deadline_unix_ms,
        })
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
                .filter(|(_, m)| m.alloc.fits(len))
                .map(|(id, m)| (*id, m.alloc.free(), m.alloc.capacity()))
                .collect();
            if let Some(id) = placement::choose(self.cfg.allocation_strategy, &candidates, &mut self.seed) {
                let m = self.members.get_mut(&id)?;
                return m.alloc.allocate(len).map(|off| (id, off));
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
            Some(o) if matches!(o.state, ObjectState::Reserved { put_id: p, .. } if p == put_id) => {
                o.state = ObjectState::Committed;
                o.last_used = tick;
                t.counters.puts += 1;
                t.clients.count(client(scope), tick, Use::Put);
                t.log.stored(epoch, key, o.size);
                (o.member, o.mount_id, o.offset, o.allocation, o.size)
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

    /// Where a committed value is, granting (or extending) its read lease.
    pub fn get(&mut self, scope: Option<&Scope>, key: &str, now: Instant) -> Result<GetResponse> {
        let tenant = self.tenant_name(scope)?;
        let tick = self.next_tick();
        let ttl = self.cfg.read_lease_ttl;
        let t = self
            .tenants
            .get_mut(&tenant)
            .ok_or_else(|| internal("tenant vanished"))?;
        t.counters.gets += 1;
        let Some(o) = t.objects.get_mut(key).filter(|o| o.state == ObjectState::Committed) else {
            t.counters.misses += 1;
            t.clients.count(client(scope), tick, Use::Get { hit: false });
            return Ok(GetResponse::default());
        };
        t.counters.hits += 1;
        t.clients.count(client(scope), tick, Use::Get { hit: true });
        o.lease_until = o.lease_until.max(now + ttl);
        o.last_used = tick;
        let o = o.clone();
        let lease_deadline_unix_ms = now_unix_ms().saturating_add(ttl.as_millis() as u64);
        let location = self.location(
            &o,
            o.member,
            crate::grant::Access::Read,
            lease_deadline_unix_ms,
            Vec::new(),
        );
        Ok(GetResponse {
            found: location.is_some(),
            location,
            lease_deadline_unix_ms,
            lease_ttl_ms: ttl.as_millis() as u64,
        })
    }

    /// Whether a committed value exists; like the reference, a hit also grants a read lease.
    pub fn exists(&mut self, scope: Option<&Scope>, key: &str, now: Instant) -> Result<bool> {
        let tenant = self.tenant_name(scope)?;
        let ttl = self.cfg.read_lease_ttl;
        let t = self
            .tenants
            .get_mut(&tenant)
            .ok_or_else(|| internal("tenant vanished"))?;
        Ok(
            match t.objects.get_mut(key).filter(|o| o.state == ObjectState::Committed) {
                Some(o) => {
                    o.lease_until = o.lease_until.max(now + ttl);
                    true
                }
                None => false,
            },
        )
    }

    /// Removes a committed, unleased value.
    pub fn remove(&mut self, scope: Option<&Scope>, key: &str, now: Instant) -> Result<bool> {
        let tenant = self.tenant_name(scope)?;
        let Some(o) = self.tenants.get(&tenant).and_then(|t| t.objects.get(key)) else {
            return Ok(false);
        };
        if o.state != ObjectState::Committed {
            return Err(StoreError::new(
                ErrorCode::PutInProgress,
                format!("key {key:?} is still being written; remove it after its put commits or expires"),
            ));
        }
        if o.lease_until > now {
            let left = o.lease_until - now;
            return Err(StoreError::new(
                ErrorCode::ObjectHasLease,
                format!("key {key:?} is leased to a reader for another {left:?}; retry after the lease expires"),
            ));
        }
        self.drop_object(&tenant, key, Removal::Removed);
        Ok(true)
    }

    /// What waits until every member applied the notices queued for it so far (a `Remove`'s free
    /// among them: `calls.rs`); those members are told at once, without gathering more.
    pub fn applied(&mut self) -> Vec<super::notices::Applied> {
        self.members
            .values_mut()
            .filter_map(|m| {
                let a = m.notices.applied();
                (!a.done()).then(|| {
                    m.notices.hurry();
                    a
                })
            })
            .collect()
    }

    /// Whether a caller waits on `member`'s notices (its held heartbeat answers at once).
    pub fn urgent(&self, member: u64) -> bool {
        self.members.get(&member).is_some_and(|m| m.notices.urgent())
    }

    /// Forgets an object and returns its space and charge; a readable one is reported as
    /// removed for `why`.
    pub(super) fn drop_object(&mut self, tenant: &str, key: &str, why: Removal) -> Option<Object> {
        let epoch = self.epoch;
        let t = self.tenants.get_mut(tenant)?;
        let o = t.objects.remove(key)?;
        t.used = t.used.saturating_sub(o.charge);
        if o.state == ObjectState::Committed {
            t.log.removed(epoch, vec![key.to_owned()], why);
        }
        if let Some(m) = self.members.get_mut(&o.member)
            && m.mount_id == o.mount_id
        {
            m.alloc.release(o.offset, o.len);
            m.objects = m.objects.saturating_sub(1);
            m.notices.freed(o.offset, o.allocation);
        }
        Some(o)
    }

    /// Gives back reservations whose writer never committed or revoked.
    pub fn reap_reservations(&mut self, now: Instant) -> u64 {
        let mut stale = Vec::new();
        for (name, t) in &self.tenants {
            for (key, o) in &t.objects {
                if let ObjectState::Reserved { reclaim_at, .. } = o.state
                    && reclaim_at <= now
                {
                    stale.push((name.clone(), key.clone()));
                }
            }
        }
        for (name, key) in &stale {
            self.drop_object(name, key, Removal::Unpublished);
        }
        stale.len() as u64
    }

    pub fn read_lease_ttl(&self) -> Duration {
        self.cfg.read_lease_ttl
    }
}

/// The least-recently-used clock a term starts at: the wall clock's milliseconds, scaled so that a
/// term's operations (one tick each) sort after every value adopted from a member, which carries
/// the time of its last use (`adoption.rs`), and so that adopted values sort among themselves by
/// that time, whichever member held them.
pub(super) fn tick_at(unix_ms: u64) -> u64 {
    unix_ms.saturating_mul(TICKS_PER_MS)
}

/// Ticks per millisecond of [`tick_at`]: room to order the values a member last used within one
/// millisecond.
pub(super) const TICKS_PER_MS: u64 = 1 << 20;

fn internal(msg: &str) -> StoreError {
    StoreError::new(ErrorCode::Internal, format!("{msg}; this is a bug, please report it"))
}

/// The caller's name within its tenant (`Scope.client`), empty when it gave none.
fn client(scope: Option<&Scope>) -> &str {
    scope.map_or("", |s| s.client.as_str())
}
