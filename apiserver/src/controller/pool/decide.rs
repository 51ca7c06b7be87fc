//! The pool controller's decision, with no I/O: from what a pass observed (the pool, every pool and
//! Binding, the Bindings' credentials, the backend and the leader's ledger) to the status to
//! write, the ledger to set and whether the deletion may complete. The table tests below hold its
//! rules, case by case (`decide/tests.rs`); the store, not this code, enforces each pool's total.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kvcache_api::backend::EndpointName;
use kvcache_api::common::UsedBy;
use kvcache_api::conditions::pool::{
    backend_resolved, capacity_allocatable, quota_ledger_available, quota_policy_writable, quota_within_total,
    releasable,
};
use kvcache_api::conditions::{self, ConditionStatus, Observation, PoolPhase};
use kvcache_api::pool::{NamespacedName, PoolDomain, PoolStatus, PoolUsage};
use kvcache_api::{KVCacheBackend, KVCachePool, KVCachePoolBinding, Quantity};
use kvcache_store::proto::{GetTenantsResponse, GrantLimit};

use super::ledger_render::{Credentials, Ledger, in_ledger, quantity_bytes, render_ledger, same_ledger, tenant_entry};
use crate::controller::shared::{self, Next};
use crate::controller::status::{Axes, axes, has_finalizer};
use crate::controller::{human, quantity};

/// What a pass observed.
#[derive(Clone, Debug, Default)]
pub struct Observed {
    pub pools: Vec<KVCachePool>,
    pub bindings: Vec<KVCachePoolBinding>,
    pub credentials: Credentials,
    /// the backend the pool names, if it exists
    pub backend: Option<KVCacheBackend>,
    pub leader: LeaderRead,
}

/// What the pass learned from the backend's leader.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum LeaderRead {
    /// Nothing to ask ([`leader_to_read`] said so).
    #[default]
    NotAsked,
    /// The leader could not be read (or written), in the store's words.
    Unreachable(String),
    /// Its ledger; `refused` says why it refused the ledger this pass sent (nothing was applied).
    Ledger {
        current: GetTenantsResponse,
        refused: Option<String>,
    },
}

/// What the pass does.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// the status to write (`None`: leave it)
    pub status: Option<PoolStatus>,
    /// the ledger to set on the leader; the pass then reads it back and decides again
    pub set_ledger: Option<Ledger>,
    /// the release is complete: remove the finalizer
    pub release: bool,
    pub next: Next,
}

/// How long a deletion waits before trying to release the ledger again.
pub const RELEASE_RETRY: Duration = Duration::from_secs(30);

/// The leader's Control endpoint when the pass must read it: the backend keeps a ledger (it is not
/// declared single-tenant) and publishes an endpoint, and the pool is live or releases its
/// domains (nothing holds it and the backend is not itself going away with its whole ledger).
pub fn leader_to_read(
    pool: &KVCachePool,
    backend: Option<&KVCacheBackend>,
    bindings: &[KVCachePoolBinding],
) -> Option<String> {
    let b = backend?;
    if b.spec.declared_multi_tenancy() == Some(false) {
        return None;
    }
    if pool.metadata.deletion_timestamp.is_some()
        && (b.metadata.deletion_timestamp.is_some() || !mine(pool, bindings).is_empty())
    {
        return None;
    }
    shared::endpoint(b, EndpointName::Admin)
}

/// Every Binding that names `pool`, deleting ones included.
fn mine<'a>(pool: &KVCachePool, bindings: &'a [KVCachePoolBinding]) -> Vec<&'a KVCachePoolBinding> {
    bindings.iter().filter(|b| b.spec.pool_name() == pool.name()).collect()
}

fn used_by(bindings: &[&KVCachePoolBinding]) -> Vec<UsedBy> {
    let mut v: Vec<UsedBy> = bindings
        .iter()
        .map(|b| UsedBy {
            kind: "KVCachePoolBinding".into(),
            namespace: b.namespace().to_owned(),
            name: b.name().to_owned(),
        })
        .collect();
    v.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    v
}

/// The pass's decision.
pub fn decide(pool: &KVCachePool, seen: &Observed, now: &Time, requeue: Duration) -> Decision {
    let mut d = Decision {
        status: None,
        set_ledger: None,
        release: false,
        next: Next::Requeue(requeue),
    };
    if pool.metadata.deletion_timestamp.is_some() {
        if !has_finalizer(pool) {
            d.next = Next::AwaitChange;
        } else {
            deleting(pool, seen, now, &mut d);
        }
        return d;
    }
    let mut st = PoolStatus {
        conditions: pool.status.clone().unwrap_or_default().conditions,
        ..PoolStatus::default()
    };
    d.set_ledger = live(pool, seen, &Conditions::new(pool, now), &mut st);
    let (phase, message) = phase(&st);
    st.phase = Some(phase);
    st.phase_message = message;
    d.status = Some(st);
    d
}

/// Why a pool has no ledger to show: both ledger conditions say so with one reason.
#[derive(Clone, Copy, Debug)]
enum NoLedger {
    /// The backend keeps none (multi-tenancy is off); not a fault for the phase.
    MultiTenancyOff,
    /// The leader could not be read.
    Unreachable,
}

/// Sets conditions at the pool's generation and this pass's time.
struct Conditions<'a> {
    generation: Option<i64>,
    now: &'a Time,
}

impl<'a> Conditions<'a> {
    fn new(pool: &KVCachePool, now: &'a Time) -> Self {
        Conditions {
            generation: pool.metadata.generation,
            now,
        }
    }

    fn set(&self, st: &mut PoolStatus, o: Observation) {
        conditions::set(&mut st.conditions, o.generation(self.generation), self.now);
    }

    /// QuotaLedgerAvailable False and QuotaPolicyWritable Unknown, for one reason.
    fn no_ledger(&self, st: &mut PoolStatus, why: NoLedger, msg: &str) {
        let (available, writable) = match why {
            NoLedger::MultiTenancyOff => (
                quota_ledger_available::MULTI_TENANCY_DISABLED,
                quota_policy_writable::MULTI_TENANCY_DISABLED,
            ),
            NoLedger::Unreachable => (
                quota_ledger_available::LEDGER_UNREACHABLE,
                quota_policy_writable::LEDGER_UNREACHABLE,
            ),
        };
        self.set(
            st,
            Observation::new(quota_ledger_available::TYPE, ConditionStatus::False, available, msg),
        );
        self.set(
            st,
            Observation::new(quota_policy_writable::TYPE, ConditionStatus::Unknown, writable, msg),
        );
    }
}

/// A deletion: held while Bindings name the pool, then the ledger without its domains, then done.
fn deleting(pool: &KVCachePool, seen: &Observed, now: &Time, d: &mut Decision) {
    let c = Conditions::new(pool, now);
    let mut st = pool.status.clone().unwrap_or_default();
    st.phase = Some(PoolPhase::Deleting);
    let held = mine(pool, &seen.bindings);
    if !held.is_empty() {
        let msg = shared::held_by(&used_by(&held), "pool");
        c.set(
            &mut st,
            Observation::new(
                releasable::TYPE,
                ConditionStatus::False,
                releasable::HELD_BY_BINDINGS,
                &msg,
            ),
        );
        st.phase_message = Some(msg);
        d.status = Some(st);
        return;
    }
    // Release: the ledger without this pool's tenants. A backend that is itself being deleted
    // takes its whole ledger with it, so the leader was not asked (it may be gone).
    let failed = match &seen.leader {
        LeaderRead::NotAsked => None,
        LeaderRead::Unreachable(e) | LeaderRead::Ledger { refused: Some(e), .. } => Some(e),
        LeaderRead::Ledger { current, .. } if !current.multi_tenancy => None,
        LeaderRead::Ledger { current, .. } => {
            let backend = seen.backend.as_ref().map_or("", |b| b.name());
            let desired = render_ledger(
                backend,
                &seen.pools,
                &seen.bindings,
                Some(pool.name()),
                &seen.credentials,
            );
            if !same_ledger(current, &desired) {
                d.set_ledger = Some(desired);
                return;
            }
            None
        }
    };
    match failed {
        None => {
            d.release = true;
            d.next = Next::AwaitChange;
        }
        Some(e) => {
            let msg = format!("the leader's ledger could not be updated without this pool's domains: {e}");
            c.set(
                &mut st,
                Observation::new(
                    releasable::TYPE,
                    ConditionStatus::False,
                    releasable::LEDGER_NOT_RELEASED,
                    &msg,
                ),
            );
            st.phase_message = Some(msg);
            d.status = Some(st);
            d.next = Next::Requeue(RELEASE_RETRY);
        }
    }
}

/// A live pool's status; returns the ledger to set when the leader's differs from the declared one.
fn live(pool: &KVCachePool, seen: &Observed, c: &Conditions, st: &mut PoolStatus) -> Option<Ledger> {
    let mine: Vec<&KVCachePoolBinding> = mine(pool, &seen.bindings);
    let live: Vec<&KVCachePoolBinding> = mine
        .iter()
        .copied()
        .filter(|b| b.metadata.deletion_timestamp.is_none())
        .collect();
    st.used_by = used_by(&live);
    let total = quantity_bytes(pool.spec.quota.as_ref().and_then(|q| q.total.as_ref()));
    let asked: u64 = mine
        .iter()
        .filter(|b| in_ledger(b))
        .map(|b| tenant_entry(b, &seen.credentials).ceiling)
        .sum();
    c.set(st, within_total(asked, total));

    let Some(backend) = &seen.backend else {
        let (reason, msg) = match pool.spec.backend() {
            Some(b) => (
                backend_resolved::BACKEND_NOT_FOUND,
                format!("the KVCacheBackend {b:?} does not exist"),
            ),
            None => (
                backend_resolved::BACKEND_NOT_SINGULAR,
                "the pool must name exactly one backend".into(),
            ),
        };
        c.set(
            st,
            Observation::new(backend_resolved::TYPE, ConditionStatus::False, reason, msg),
        );
        return None;
    };
    st.client_endpoint = shared::endpoint(backend, EndpointName::Client);
    st.domains = domains(&mine, &seen.credentials);
    if shared::endpoint(backend, EndpointName::Admin).is_none() {
        let msg = format!("the KVCacheBackend {:?} has published no endpoints yet", backend.name());
        c.set(
            st,
            Observation::new(
                backend_resolved::TYPE,
                ConditionStatus::False,
                backend_resolved::ENDPOINTS_NOT_PUBLISHED,
                msg,
            ),
        );
        return None;
    }
    let resolved = format!(
        "the KVCacheBackend {:?} serves at {}",
        backend.name(),
        st.client_endpoint.clone().unwrap_or_default()
    );
    c.set(
        st,
        Observation::new(
            backend_resolved::TYPE,
            ConditionStatus::True,
            backend_resolved::RESOLVED,
            resolved,
        ),
    );
    let (ledger, set_ledger) = ledger(backend, seen, c, st);
    if let Some(t) = &ledger {
        usage(t, st);
    }
    c.set(st, capacity(pool, backend, ledger.as_ref()));
    set_ledger
}

/// QuotaWithinTotal: what the Bindings ask for against the pool's total, which the store enforces.
fn within_total(asked: u64, total: u64) -> Observation {
    if asked <= total {
        Observation::new(
            quota_within_total::TYPE,
            ConditionStatus::True,
            quota_within_total::WITHIN_TOTAL,
            format!("the Bindings ask for {} of the pool's {}", human(asked), human(total)),
        )
    } else {
        Observation::new(
            quota_within_total::TYPE,
            ConditionStatus::False,
            quota_within_total::OVERSUBSCRIBED,
            format!(
                "the Bindings ask for {} in all, more than the pool's {}; the store cuts each one's grant in \
                 proportion so that together they get at most {}, and no other pool's grants shrink",
                human(asked),
                human(total),
                human(total)
            ),
        )
    }
}

fn domains(mine: &[&KVCachePoolBinding], credentials: &Credentials) -> Vec<PoolDomain> {
    let mut v: Vec<PoolDomain> = mine
        .iter()
        .filter(|b| in_ledger(b))
        .map(|b| {
            let e = tenant_entry(b, credentials);
            PoolDomain {
                name: e.name,
                binding: NamespacedName {
                    namespace: b.namespace().to_owned(),
                    name: b.name().to_owned(),
                },
                block_size: i32::try_from(e.block_size).unwrap_or(i32::MAX),
                dtype: e.dtype,
                blocks: None,
                hit_rate: None,
            }
        })
        .collect();
    v.sort_by(|a, b| a.name.cmp(&b.name));
    v
}

/// The two ledger conditions; returns the leader's ledger when it keeps one, and the ledger to set
/// when it differs from the declared one.
fn ledger(
    backend: &KVCacheBackend,
    seen: &Observed,
    c: &Conditions,
    st: &mut PoolStatus,
) -> (Option<GetTenantsResponse>, Option<Ledger>) {
    if backend.spec.declared_multi_tenancy() == Some(false) {
        let msg = format!(
            "the KVCacheBackend {:?} runs without multi-tenancy: no per-domain quota, one default tenant",
            backend.name()
        );
        c.no_ledger(st, NoLedger::MultiTenancyOff, &msg);
        return (None, None);
    }
    let (current, refused) = match &seen.leader {
        LeaderRead::NotAsked => {
            c.no_ledger(st, NoLedger::Unreachable, "the leader has not been read yet");
            return (None, None);
        }
        LeaderRead::Unreachable(e) => {
            c.no_ledger(st, NoLedger::Unreachable, e);
            return (None, None);
        }
        LeaderRead::Ledger { current, .. } if !current.multi_tenancy => {
            c.no_ledger(
                st,
                NoLedger::MultiTenancyOff,
                "the leader keeps no tenant ledger (multi-tenancy is off)",
            );
            return (None, None);
        }
        LeaderRead::Ledger { current, refused } => (current, refused),
    };
    c.set(
        st,
        Observation::new(
            quota_ledger_available::TYPE,
            ConditionStatus::True,
            quota_ledger_available::AVAILABLE,
            "the leader keeps a tenant ledger",
        ),
    );
    let desired = render_ledger(backend.name(), &seen.pools, &seen.bindings, None, &seen.credentials);
    let writable = match refused {
        Some(e) => Observation::new(
            quota_policy_writable::TYPE,
            ConditionStatus::False,
            quota_policy_writable::QUOTA_POLICY_NOT_WRITABLE,
            format!("the leader refused the ledger, nothing was applied: {e}"),
        ),
        None if same_ledger(current, &desired) => Observation::new(
            quota_policy_writable::TYPE,
            ConditionStatus::True,
            quota_policy_writable::WRITABLE,
            format!(
                "the ledger holds {} domains across {} pools on the backend",
                desired.tenants.len(),
                desired.pools.len()
            ),
        ),
        None => return (Some(current.clone()), Some(desired)),
    };
    c.set(st, writable);
    (Some(current.clone()), None)
}

/// `usage` and each domain's blocks and hit rate, from the leader's ledger.
fn usage(t: &GetTenantsResponse, st: &mut PoolStatus) {
    let names: Vec<&str> = st.domains.iter().map(|d| d.name.as_str()).collect();
    let held: Vec<_> = t.tenants.iter().filter(|x| names.contains(&x.name.as_str())).collect();
    if names.is_empty() {
        st.usage = Some(PoolUsage {
            total: Some(Quantity::from_bytes(0)),
        });
    } else if !held.is_empty() {
        st.usage = Some(PoolUsage {
            total: Some(quantity(held.iter().map(|x| x.used).sum())),
        });
    }
    for d in &mut st.domains {
        if let Some(x) = t.tenants.iter().find(|x| x.name == d.name) {
            d.blocks = Some(i64::try_from(x.objects).unwrap_or(i64::MAX));
            d.hit_rate = shared::hit_rate(x.hits, x.misses);
        }
    }
}

/// CapacityAllocatable, saying when the capacity (shared by every pool on the backend) cut this
/// pool's grants.
fn capacity(pool: &KVCachePool, backend: &KVCacheBackend, ledger: Option<&GetTenantsResponse>) -> Observation {
    let capacity = backend
        .status
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.total.as_ref())
        .map(|q| quantity_bytes(Some(q)));
    let cut = ledger.is_some_and(|t| {
        t.tenants
            .iter()
            .any(|x| x.pool == pool.name() && x.limited_by() == GrantLimit::Capacity)
    });
    match capacity {
        None => Observation::new(
            capacity_allocatable::TYPE,
            ConditionStatus::False,
            capacity_allocatable::CAPACITY_NOT_OBSERVED,
            "the backend's capacity has not been observed yet",
        ),
        Some(0) => Observation::new(
            capacity_allocatable::TYPE,
            ConditionStatus::False,
            capacity_allocatable::NOTHING_TO_ALLOCATE,
            "the backend has no member mounted, so nothing can be granted",
        ),
        Some(n) if cut => Observation::new(
            capacity_allocatable::TYPE,
            ConditionStatus::True,
            capacity_allocatable::ALLOCATABLE,
            format!(
                "the backend has {} to grant, less than its pools may hand out together: the store cuts each \
                 pool's share in proportion, and this pool's Bindings with it",
                human(n)
            ),
        ),
        Some(n) => Observation::new(
            capacity_allocatable::TYPE,
            ConditionStatus::True,
            capacity_allocatable::ALLOCATABLE,
            format!("the backend has {} to grant", human(n)),
        ),
    }
}

/// The pool's phase over BackendResolved, QuotaLedgerAvailable, QuotaPolicyWritable and
/// CapacityAllocatable, in that order: the first axis that is not True (ignoring
/// MultiTenancyDisabled) is an Error; a missing one is Provisioning; otherwise Ready.
fn phase(st: &PoolStatus) -> (PoolPhase, Option<String>) {
    let order = [
        backend_resolved::TYPE,
        quota_ledger_available::TYPE,
        quota_policy_writable::TYPE,
        capacity_allocatable::TYPE,
    ];
    let multi_off = |reason: &str| reason == quota_ledger_available::MULTI_TENANCY_DISABLED.as_str();
    match axes(&st.conditions, &order, multi_off) {
        Axes::Fault(message) => (PoolPhase::Error, Some(message)),
        Axes::Missing(t) => (PoolPhase::Provisioning, Some(format!("{t} has not been observed yet"))),
        Axes::Clear => {
            let single =
                conditions::find(&st.conditions, quota_ledger_available::TYPE).is_some_and(|c| multi_off(&c.reason));
            (
                PoolPhase::Ready,
                single.then(|| {
                    "a single-tenant pool: the backend serves one domain, without per-domain quota".to_owned()
                }),
            )
        }
    }
}

#[cfg(test)]
mod tests;
