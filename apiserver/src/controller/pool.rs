//! The pool controller (`pool-binding-injection.md` §1.4–1.6): renders the **whole** tenant ledger
//! of the pool's backend, from every Binding of every pool on it, and sets it on the leader with
//! `SetTenants` when it differs from what the leader holds (never a partial ledger). It reports
//! `clientEndpoint`, `usage`, `domains[]`, `usedBy` and the conditions BackendResolved,
//! QuotaLedgerAvailable, QuotaPolicyWritable, QuotaWithinTotal and CapacityAllocatable, and holds
//! its deletion while Bindings reference it (Releasable False, HeldByBindings). The ledger itself
//! is rendered and converged in [`super::ledger`].

use std::sync::Arc;
use std::time::Duration;

use kube::Api;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kvcache_api::backend::EndpointName;
use kvcache_api::common::UsedBy;
use kvcache_api::conditions::pool::{
    backend_resolved, capacity_allocatable, quota_ledger_available, quota_policy_writable, quota_within_total,
    releasable,
};
use kvcache_api::conditions::{self, ConditionStatus, Observation, PoolPhase};
use kvcache_api::pool::{NamespacedName, PoolDomain, PoolStatus, PoolUsage};
use kvcache_api::{KVCacheBackend, KVCachePool, KVCachePoolBinding, Quantity};

use super::backend::list;
use super::leader::{self, Leader};
use super::ledger::{
    Declared, NoLedger, converge_ledger, in_ledger, no_ledger, quantity_bytes, render_ledger, same_ledger, tenant_entry,
};
use super::status::{self, Axes, add_finalizer, has_finalizer, remove_finalizer};
use super::{Context, KindLabel, Result};

const KIND: &str = "KVCachePool";

/// A Binding event wakes the pool it names.
pub fn for_binding(b: KVCachePoolBinding) -> Option<ObjectRef<KVCachePool>> {
    let name = b.spec.pool_name();
    (!name.is_empty()).then(|| ObjectRef::new(name))
}

/// A backend event wakes every pool on it.
pub fn for_backend(pools: &Store<KVCachePool>, b: &KVCacheBackend) -> Vec<ObjectRef<KVCachePool>> {
    pools
        .state()
        .iter()
        .filter(|p| p.spec.backend() == Some(b.name()))
        .map(|p| ObjectRef::new(p.name()))
        .collect()
}

pub fn error_policy(_: Arc<KVCachePool>, error: &super::Error, ctx: Arc<Context>) -> Action {
    super::retry(KIND, error, &ctx)
}

fn admin_of(b: &KVCacheBackend) -> Option<String> {
    endpoint_of(b, EndpointName::Admin)
}

pub fn endpoint_of(b: &KVCacheBackend, which: EndpointName) -> Option<String> {
    b.status
        .as_ref()?
        .endpoints
        .iter()
        .find(|e| e.name == Some(which))
        .map(|e| e.address.clone())
}

pub async fn reconcile(obj: Arc<KVCachePool>, ctx: Arc<Context>) -> Result<Action> {
    ctx.metrics.reconciles.get_or_create(&KindLabel { kind: KIND }).inc();
    let api: Api<KVCachePool> = Api::all(ctx.client.clone());
    let backends: Api<KVCacheBackend> = Api::all(ctx.client.clone());
    // Read the Bindings and set the ledger under the backend's lock (see `Context::ledger_locks`).
    let lock = obj.spec.backend().map(|b| ctx.ledger_lock(b));
    let _guard = match &lock {
        Some(l) => Some(l.lock().await),
        None => None,
    };
    let bindings: Vec<KVCachePoolBinding> = Api::<KVCachePoolBinding>::all(ctx.client.clone())
        .list(&Default::default())
        .await?
        .items;
    let pools: Vec<KVCachePool> = api.list(&Default::default()).await?.items;
    let credentials = ctx.runtime.credentials().all().await?;
    let name = obj.name().to_owned();
    let mine: Vec<&KVCachePoolBinding> = bindings.iter().filter(|b| b.spec.pool_name() == name).collect();
    let backend = match obj.spec.backend() {
        Some(b) => backends.get_opt(b).await?,
        None => None,
    };
    let generation = obj.metadata.generation;
    let now = crate::registry::meta::now();
    let mut st = PoolStatus {
        conditions: obj.status.clone().unwrap_or_default().conditions,
        ..PoolStatus::default()
    };
    let set = |st: &mut PoolStatus, o: Observation| {
        conditions::set(&mut st.conditions, o.generation(generation), &now);
    };

    if obj.metadata.deletion_timestamp.is_some() {
        if !has_finalizer(&obj) {
            return Ok(Action::await_change());
        }
        st = obj.status.clone().unwrap_or_default();
        st.phase = Some(PoolPhase::Deleting);
        if !mine.is_empty() {
            let names: Vec<String> = mine.iter().map(|b| format!("{}/{}", b.namespace(), b.name())).collect();
            let msg = format!(
                "held by the KVCachePoolBindings {}; delete them first, then this pool's deletion completes",
                list(&names)
            );
            set(
                &mut st,
                Observation::new(
                    releasable::TYPE,
                    ConditionStatus::False,
                    releasable::HELD_BY_BINDINGS,
                    &msg,
                ),
            );
            st.phase_message = Some(msg);
            status::write(&api, &obj, st, &ctx).await?;
            return Ok(Action::requeue(ctx.opts.requeue));
        }
        // Release: the ledger without this pool's tenants. A backend that is itself being
        // deleted takes its whole ledger with it: nothing to release (its leader may be gone).
        if let Some(b) = &backend
            && b.metadata.deletion_timestamp.is_none()
            && b.spec.declared_multi_tenancy() != Some(false)
            && let Some(admin) = admin_of(b)
        {
            let desired = render_ledger(b.name(), &pools, &bindings, Some(&name), &credentials);
            let release = async {
                let leader = Leader::connect(&admin, ctx.opts.leader_timeout, ctx.runtime.control_token()).await?;
                let t = leader.tenants().await?;
                if t.multi_tenancy && !same_ledger(&t, &desired) {
                    leader.set_tenants(desired).await?;
                }
                Ok::<_, leader::LeaderError>(())
            };
            let released = release.await;
            if let Err(e) = released {
                let msg = format!("the leader's ledger could not be updated without this pool's domains: {e}");
                set(
                    &mut st,
                    Observation::new(
                        releasable::TYPE,
                        ConditionStatus::False,
                        releasable::LEDGER_NOT_RELEASED,
                        &msg,
                    ),
                );
                st.phase_message = Some(msg);
                status::write(&api, &obj, st, &ctx).await?;
                return Ok(Action::requeue(Duration::from_secs(30)));
            }
        }
        remove_finalizer(&api, &obj).await?;
        return Ok(Action::await_change());
    }
    if add_finalizer(&api, &obj).await? {
        return Ok(Action::await_change());
    }

    st.used_by = mine
        .iter()
        .filter(|b| b.metadata.deletion_timestamp.is_none())
        .map(|b| UsedBy {
            kind: "KVCachePoolBinding".into(),
            namespace: b.namespace().to_owned(),
            name: b.name().to_owned(),
        })
        .collect();
    st.used_by
        .sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));

    // Declarations alone: do the ceilings fit in the pool's total?
    let total = quantity_bytes(obj.spec.quota.as_ref().and_then(|q| q.total.as_ref()));
    let asked: u64 = mine
        .iter()
        .filter(|b| in_ledger(b))
        .map(|b| tenant_entry(b, &credentials).ceiling)
        .sum();
    set(
        &mut st,
        if asked <= total {
            Observation::new(
                quota_within_total::TYPE,
                ConditionStatus::True,
                quota_within_total::WITHIN_TOTAL,
                format!(
                    "the Bindings ask for {} of the pool's {}",
                    super::human(asked),
                    super::human(total)
                ),
            )
        } else {
            Observation::new(
                quota_within_total::TYPE,
                ConditionStatus::False,
                quota_within_total::OVERSUBSCRIBED,
                format!(
                    "the Bindings ask for {} in all, more than the pool's {}; the store grants in proportion",
                    super::human(asked),
                    super::human(total)
                ),
            )
        },
    );

    let Some(backend) = backend else {
        let msg = match obj.spec.backend() {
            Some(b) => format!("the KVCacheBackend {b:?} does not exist"),
            None => "the pool must name exactly one backend".into(),
        };
        let reason = if obj.spec.backend().is_some() {
            backend_resolved::BACKEND_NOT_FOUND
        } else {
            backend_resolved::BACKEND_NOT_SINGULAR
        };
        set(
            &mut st,
            Observation::new(backend_resolved::TYPE, ConditionStatus::False, reason, &msg),
        );
        st.phase = Some(PoolPhase::Error);
        st.phase_message = Some(msg);
        status::write(&api, &obj, st, &ctx).await?;
        return Ok(Action::requeue(ctx.opts.requeue));
    };
    st.client_endpoint = endpoint_of(&backend, EndpointName::Client);
    st.domains = mine
        .iter()
        .filter(|b| in_ledger(b))
        .map(|b| {
            let e = tenant_entry(b, &credentials);
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
    st.domains.sort_by(|a, b| a.name.cmp(&b.name));
    let Some(admin) = admin_of(&backend) else {
        let msg = format!("the KVCacheBackend {:?} has published no endpoints yet", backend.name());
        set(
            &mut st,
            Observation::new(
                backend_resolved::TYPE,
                ConditionStatus::False,
                backend_resolved::ENDPOINTS_NOT_PUBLISHED,
                &msg,
            ),
        );
        st.phase = Some(PoolPhase::Error);
        st.phase_message = Some(msg);
        status::write(&api, &obj, st, &ctx).await?;
        return Ok(Action::requeue(ctx.opts.requeue));
    };
    let resolved = format!(
        "the KVCacheBackend {:?} serves at {}",
        backend.name(),
        st.client_endpoint.clone().unwrap_or_default()
    );
    set(
        &mut st,
        Observation::new(
            backend_resolved::TYPE,
            ConditionStatus::True,
            backend_resolved::RESOLVED,
            resolved,
        ),
    );

    let ledger = if backend.spec.declared_multi_tenancy() == Some(false) {
        None
    } else {
        converge_ledger(
            &admin,
            &backend,
            &Declared {
                pools: &pools,
                bindings: &bindings,
                credentials: &credentials,
            },
            &ctx,
            &mut st,
            &set,
        )
        .await
    };
    if ledger.is_none() && backend.spec.declared_multi_tenancy() == Some(false) {
        let msg = format!(
            "the KVCacheBackend {:?} runs without multi-tenancy: no per-domain quota, one default tenant",
            backend.name()
        );
        no_ledger(&mut st, &set, NoLedger::MultiTenancyDisabled, &msg);
    }
    if let Some(t) = &ledger {
        let names: Vec<&str> = st.domains.iter().map(|d| d.name.as_str()).collect();
        let held: Vec<_> = t.tenants.iter().filter(|x| names.contains(&x.name.as_str())).collect();
        if names.is_empty() {
            st.usage = Some(PoolUsage {
                total: Some(Quantity::from_bytes(0)),
            });
        } else if !held.is_empty() {
            let used: u64 = held.iter().map(|x| x.used).sum();
            st.usage = Some(PoolUsage {
                total: Some(super::quantity(used)),
            });
        }
        for d in &mut st.domains {
            if let Some(x) = t.tenants.iter().find(|x| x.name == d.name) {
                d.blocks = Some(i64::try_from(x.objects).unwrap_or(i64::MAX));
                d.hit_rate = hit_rate(x.hits, x.misses);
            }
        }
    }

    let capacity = backend
        .status
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.total.as_ref())
        .map(|q| quantity_bytes(Some(q)));
    set(
        &mut st,
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
            Some(n) => Observation::new(
                capacity_allocatable::TYPE,
                ConditionStatus::True,
                capacity_allocatable::ALLOCATABLE,
                format!("the backend has {} to grant", super::human(n)),
            ),
        },
    );
    let (phase, message) = phase(&st);
    st.phase = Some(phase);
    st.phase_message = message;
    status::write(&api, &obj, st, &ctx).await?;
    Ok(Action::requeue(ctx.opts.requeue))
}

/// `hits / (hits + misses)` with at most 4 decimals, when there were lookups.
pub fn hit_rate(hits: u64, misses: u64) -> Option<String> {
    let n = hits + misses;
    (n > 0)
        .then(|| {
            let r = hits as f64 / n as f64;
            let s = format!("{:.4}", r.clamp(0.0, 1.0));
            s.trim_end_matches('0').trim_end_matches('.').to_owned()
        })
        .map(|s| if s.is_empty() { "0".into() } else { s })
}

/// §1.5: the first axis that is not True (ignoring MultiTenancyDisabled) is an Error; a missing
/// one is Provisioning; otherwise Ready.
fn phase(st: &PoolStatus) -> (PoolPhase, Option<String>) {
    let axes = [
        backend_resolved::TYPE,
        quota_ledger_available::TYPE,
        quota_policy_writable::TYPE,
        capacity_allocatable::TYPE,
    ];
    let multi_off = |reason: &str| reason == quota_ledger_available::MULTI_TENANCY_DISABLED.as_str();
    match status::axes(&st.conditions, &axes, multi_off) {
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
mod tests {
    use super::*;

    #[test]
    fn hit_rates_have_at_most_four_decimals() {
        assert_eq!(hit_rate(0, 0), None);
        assert_eq!(hit_rate(1, 2).as_deref(), Some("0.3333"));
        assert_eq!(hit_rate(5, 0).as_deref(), Some("1"));
        assert_eq!(hit_rate(0, 5).as_deref(), Some("0"));
    }
}
