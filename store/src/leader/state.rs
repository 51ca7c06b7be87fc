//! The leader's whole metadata under one lock: members and their free space, tenants and their
//! objects. Engine operations (get with lease, exists, remove) live here, the two-phase put in
//! `put.rs`; the ledger in `tenants.rs`, mounting in `members.rs` (a mounted member is `mounted.rs`), eviction in `eviction.rs`, read-outs in
//! `status.rs`.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use super::blocks::Removal;
use super::clients::Use;
use super::config::{LeaderConfig, TierReads};
use super::ledger::DEFAULT_TENANT;
pub use super::mounted::Mounted;
use super::notices::Applied;
use super::objects::{Object, ObjectState};
use super::tenant::{Counters, Tenant};
use crate::error::{ErrorCode, Result, StoreError};
use crate::proto::{GetResponse, Location, Scope};
use crate::time::now_unix_ms;

/// A tenant at its grant is evicted ahead of need by this fraction of its grant (`1/256`), so
/// the cost of choosing what goes is paid once per many puts.
pub const EVICTION_BATCH: u64 = 256;

/// Longest key accepted.
pub const MAX_KEY_LEN: usize = 4096;

/// Everything the leader knows.
#[derive(Debug)]
pub struct State {
    pub(super) cfg: LeaderConfig,
    pub(super) members: BTreeMap<u64, Mounted>,
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

    /// The most bytes the members' disk tiers may hold, and what they hold.
    pub fn tier_usage(&self) -> (u64, u64) {
        self.members
            .values()
            .fold((0, 0), |(c, u), m| (c + m.tier_capacity, u + m.tier_used))
    }

    pub fn object_count(&self) -> u64 {
        self.tenants.values().map(|t| t.objects.len() as u64).sum()
    }

    /// About the bytes the tenants' object indexes take (`index.rs`).
    pub fn index_bytes(&self) -> u64 {
        self.tenants.values().map(|t| t.objects.bytes() as u64).sum()
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

    /// Where `o`'s bytes are in memory, granted for `access` until `deadline_unix_ms` (signed:
    /// `grant.rs`); a write names its value's `tag` (empty for a read). `None` when they are not in
    /// memory or its member is gone.
    pub(super) fn location(
        &self,
        o: &Object,
        access: crate::grant::Access,
        deadline_unix_ms: u64,
        tag: Vec<u8>,
    ) -> Option<Location> {
        let r = o.memory?;
        self.granted(o, access, (r.offset, r.allocation), deadline_unix_ms, tag)
    }

    /// `o` at `(offset, allocation)` (in memory; for [`Access::ReadDisk`](crate::grant::Access),
    /// its copy's disk id and 0) on its member, granted for `access` until `deadline_unix_ms`
    /// over `tag`. `None` when its member is gone.
    pub(super) fn granted(
        &self,
        o: &Object,
        access: crate::grant::Access,
        (offset, allocation): (u64, u64),
        deadline_unix_ms: u64,
        tag: Vec<u8>,
    ) -> Option<Location> {
        let m = self.members.get(&o.member)?;
        let range = crate::grant::Range {
            access,
            mount_id: o.mount_id,
            epoch: self.epoch,
            allocation,
            offset,
            len: o.size,
            deadline_unix_ms,
        };
        let on_disk = access == crate::grant::Access::ReadDisk;
        Some(Location {
            member_id: o.member,
            data_addr: m.data_addr.clone(),
            grpc_addr: m.grpc_addr.clone(),
            mount_id: o.mount_id,
            offset,
            len: o.size,
            epoch: self.epoch,
            // a disk read on the member's host is of the tier's file (op 8), elsewhere op 7
            local_addr: m.local_addr.clone(),
            grant_mac: m.grant_key.sign(&range, &tag).into(),
            allocation,
            tag: tag.into(),
            on_disk,
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

    /// Where a committed value is in memory, granting (or extending) its read lease; a value only
    /// on its member's disk tier is a miss here ([`State::start_loads`] brings it back first).
    pub fn get(&mut self, scope: Option<&Scope>, key: &str, now: Instant) -> Result<GetResponse> {
        let tenant = self.tenant_name(scope)?;
        let tick = self.next_tick();
        let ttl = self.cfg.read_lease_ttl;
        let t = self
            .tenants
            .get_mut(&tenant)
            .ok_or_else(|| internal("tenant vanished"))?;
        t.counters.gets += 1;
        let direct = self.cfg.tier_reads == TierReads::Direct;
        let Some(mut held) = t
            .objects
            .get_mut(key)
            .filter(|o| o.state == ObjectState::Committed && (o.readable_in_memory() || (direct && o.disk.is_some())))
        else {
            t.counters.misses += 1;
            t.clients.count(client(scope), tick, Use::Get { hit: false });
            return Ok(GetResponse::default());
        };
        t.counters.hits += 1;
        t.clients.count(client(scope), tick, Use::Get { hit: true });
        held.lease(now + ttl);
        held.last_used = tick;
        let o = held.clone();
        drop(held);
        let lease_deadline_unix_ms = now_unix_ms().saturating_add(ttl.as_millis() as u64);
        let location = if o.readable_in_memory() {
            self.location(&o, crate::grant::Access::Read, lease_deadline_unix_ms, Vec::new())
        } else {
            self.disk_location(&tenant, key, &o, lease_deadline_unix_ms)
        };
        Ok(GetResponse {
            found: location.is_some(),
            location,
            lease_deadline_unix_ms,
            lease_ttl_ms: ttl.as_millis() as u64,
        })
    }

    /// With `--tier-reads load`: starts loading into memory those of `keys` that are committed but
    /// only on their member's disk tier (or finds their loads on the way), each leased meanwhile:
    /// what a get waits for before it looks (`calls.rs`). Empty when every one is in memory or
    /// absent, and always with `--tier-reads direct` (the get reads them from disk).
    pub fn start_loads(&mut self, scope: Option<&Scope>, keys: &[String], now: Instant) -> Result<Vec<Applied>> {
        let tenant = self.tenant_name(scope)?;
        let ttl = self.cfg.read_lease_ttl;
        let mut waits = Vec::new();
        if self.cfg.tier_reads == TierReads::Direct {
            // read from disk where they are (`get`)
            return Ok(waits);
        }
        for key in keys {
            let Some(mut o) = self
                .tenants
                .get_mut(&tenant)
                .and_then(|t| t.objects.get_mut(key))
                .filter(|o| o.state == ObjectState::Committed && !o.readable_in_memory())
            else {
                continue;
            };
            o.lease(now + ttl);
            drop(o);
            waits.extend(self.load_from_disk(&tenant, key, now));
        }
        Ok(waits)
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
                Some(mut o) => {
                    o.lease(now + ttl);
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
        if let Some(until) = o.lease_until.filter(|until| *until > now) {
            let left = until - now;
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

    /// Forgets an object and returns its space and charge (in memory and on disk); a readable
    /// one is reported as removed for `why`.
    pub(super) fn drop_object(&mut self, tenant: &str, key: &str, why: Removal) -> Option<Object> {
        let epoch = self.epoch;
        let t = self.tenants.get_mut(tenant)?;
        let o = t.objects.remove(key)?;
        t.used = t.used.saturating_sub(o.charge);
        if o.disk.is_some() {
            t.disk_used = t.disk_used.saturating_sub(o.len);
        }
        if o.state == ObjectState::Committed {
            t.log.removed_with(epoch, why, || vec![key.to_owned()]);
        }
        if let Some(m) = self.members.get_mut(&o.member)
            && m.mount_id == o.mount_id
        {
            if let Some(r) = o.memory {
                m.alloc.release(r.offset, o.len);
                m.objects = m.objects.saturating_sub(1);
                m.notices.freed(r.offset, r.allocation);
            }
            if let Some(d) = o.disk {
                m.disk.remove(&d);
                m.notices.disk_freed(d);
            }
        }
        Some(o)
    }

    /// Forgets the read leases that ended by `now` (`Objects::end_leases`).
    pub fn end_leases(&mut self, now: Instant) {
        for t in self.tenants.values_mut() {
            t.objects.end_leases(now);
        }
    }

    /// Gives back reservations whose writer never committed or revoked.
    pub fn reap_reservations(&mut self, now: Instant) -> u64 {
        let mut stale = Vec::new();
        for (name, t) in &self.tenants {
            stale.extend(t.objects.reclaimable(now).map(|key| (name.clone(), key.to_string())));
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

pub(super) fn internal(msg: &str) -> StoreError {
    StoreError::new(ErrorCode::Internal, format!("{msg}; this is a bug, please report it"))
}

/// The caller's name within its tenant (`Scope.client`), empty when it gave none.
pub(super) fn client(scope: Option<&Scope>) -> &str {
    scope.map_or("", |s| s.client.as_str())
}
