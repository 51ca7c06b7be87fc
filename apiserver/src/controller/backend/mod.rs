//! The backend controller: runs a managed backend's leader and one member per matching node per
//! group through the runtime, and reports what the leader says over our store's Control API:
//! endpoints, capacity, members, the conditions LeaderAvailable, CapacityObserved,
//! MembersMounted, PoolWrites and Deletable, and the phase (Deleting first, then the leader's
//! state, then the members'; the order is in [`decide`]). Deletion waits while a pool names the
//! backend.
//!
//! A pass runs the store (the runtime's answer is its observation), reads the leader, and writes
//! the status [`decide::status`] makes of both, with the election's conditions beside it.

use std::collections::BTreeSet;
use std::sync::Arc;

use futures::StreamExt as _;

use kube::Api;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kvcache_api::backend::BackendStatus;
use kvcache_api::common::UsedBy;
use kvcache_api::conditions::{self, Observation};
use kvcache_api::{KVCacheBackend, KVCachePool, KVCachePoolBinding};

use super::status::{self, add_finalizer, has_finalizer, remove_finalizer};
use super::{Context, KindLabel, Result};
use decide::Observed;

mod decide;
mod leader_replicas;
mod members;
mod plan;
mod tier_survey;
pub use leader_replicas::{HANDOVER, LeaseSeen};
pub use plan::{plan, tenant_namespaces};

const KIND: &str = "KVCacheBackend";

/// A pool event wakes the backend it names.
pub fn for_pool(pool: KVCachePool) -> Option<ObjectRef<KVCacheBackend>> {
    pool.spec.backend().map(ObjectRef::new)
}

pub fn error_policy(_: Arc<KVCacheBackend>, error: &super::Error, ctx: Arc<Context>) -> Action {
    super::retry(KIND, error, &ctx)
}

pub async fn reconcile(obj: Arc<KVCacheBackend>, ctx: Arc<Context>) -> Result<Action> {
    ctx.metrics.reconciles.get_or_create(&KindLabel { kind: KIND }).inc();
    let api: Api<KVCacheBackend> = Api::all(ctx.client.clone());
    let pools: Api<KVCachePool> = Api::all(ctx.client.clone());
    let name = obj.name().to_owned();
    let pools = pools.list(&Default::default()).await?.items;
    let consumers: Vec<UsedBy> = pools
        .iter()
        .filter(|p| p.spec.backend() == Some(name.as_str()))
        .map(|p| UsedBy {
            kind: "KVCachePool".into(),
            namespace: String::new(),
            name: p.name().to_owned(),
        })
        .collect();
    let deleting = obj.metadata.deletion_timestamp.is_some();
    if deleting && !has_finalizer(&obj) {
        return Ok(Action::await_change());
    }
    if deleting && consumers.is_empty() {
        // Nothing holds it: stop its processes, delete its election Lease, then let it go.
        if ctx.runtime.remove_store(&name).await {
            leader_replicas::delete_lease(&ctx, &name).await?;
            remove_finalizer(&api, &obj).await?;
            return Ok(Action::await_change());
        }
        return Ok(Action::requeue(std::time::Duration::from_secs(2)));
    }
    if !deleting && add_finalizer(&api, &obj).await? {
        return Ok(Action::await_change());
    }
    let bindings = Api::<KVCachePoolBinding>::all(ctx.client.clone())
        .list(&Default::default())
        .await?
        .items;
    let tenants = tenant_namespaces(&name, &pools, &bindings);
    let st = observe(&obj, &ctx, consumers, tenants).await;
    status::write(&api, &obj, st, &ctx).await?;
    Ok(Action::requeue(ctx.opts.requeue))
}

/// What the runtime runs for a managed backend, once it converged it to the plan.
async fn run_store(obj: &KVCacheBackend, ctx: &Context, tenants: BTreeSet<String>) -> Option<Observed> {
    let (mut plan, unmatched) = plan(obj.name(), &obj.spec, &ctx.runtime.nodes())?;
    plan.tenant_namespaces = tenants;
    plan.uid = obj.metadata.uid.clone().unwrap_or_default();
    plan.existing_only = obj.metadata.deletion_timestamp.is_some();
    let obs = ctx.runtime.ensure_store(&plan).await;
    Some((plan, unmatched, obs))
}

/// One observation pass: run the workloads (managed), read the leader, decide the status, then
/// observe the leader replicas and the election.
async fn observe(
    obj: &KVCacheBackend,
    ctx: &Context,
    used_by: Vec<UsedBy>,
    tenants: BTreeSet<String>,
) -> BackendStatus {
    let observed = run_store(obj, ctx, tenants).await;
    let read = match decide::admin(&decide::endpoints(obj, observed.as_ref())) {
        None => None,
        Some(admin) => Some(
            async { ctx.leader(Some(obj), &admin).await?.observe().await }
                .await
                .map_err(|e| e.0),
        ),
    };
    let now = crate::registry::meta::now();
    let health = read.as_ref().and_then(|r| r.as_ref().ok()).map(|v| v.health.clone());
    let mut st = decide::status(obj, observed.as_ref(), read, used_by, &now);
    if let Some((plan, _, obs)) = &observed {
        let generation = obj.metadata.generation;
        let mut set = |st: &mut BackendStatus, o: Observation| {
            conditions::set(&mut st.conditions, o.generation(generation), &now);
        };
        leader_replicas::observe(&mut st, obj, plan, obs, health.as_ref(), ctx, &mut set).await;
    }
    st
}

/// The backend controller: a backend's pass runs when it changes, when a pool naming it changes,
/// and when its store's processes change (a leader serves, a member remounts).
pub(super) async fn controller(ctx: Arc<Context>, stop: super::Shutdown) {
    let client = ctx.client.clone();
    let cfg = kube::runtime::watcher::Config::default;
    let wakes = super::changes(&ctx, |c| match c {
        crate::runtime::Changed::Store(name) => Some(ObjectRef::new(&name)),
        crate::runtime::Changed::Replicas(_) => None,
    });
    kube::runtime::Controller::new(Api::<KVCacheBackend>::all(client.clone()), cfg())
        .watches(Api::<KVCachePool>::all(client), cfg(), for_pool)
        .reconcile_on(wakes)
        .graceful_shutdown_on(stop.signal())
        .run(reconcile, error_policy, ctx)
        .for_each(|_| async {})
        .await;
}
