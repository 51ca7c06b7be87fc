//! The ModelDeployment controller: resolves the Binding (`DomainRegistered`, `status.kvCache`),
//! the connection behind it (pool endpoint, tenant, layout), runs each role's replicas through the
//! runtime with exactly what [`injection`](super::injection) computes, runs the router in front
//! of them when `spec.router` asks for one, and reports roles, phase, `CacheAttached` and
//! `RouterReady` from what the replicas and the router themselves report. A deployment without
//! `kvCache` runs with no cache at all.
//!
//! A pass observes what the `kvCache` leads to ([`resolve`]), decides what the replicas attach to
//! ([`decide::attach`]), has the runtime run them and then the router, handed the replicas as
//! they were observed (the writes whose answers are their observations), and writes the status
//! [`decide::report`] makes of it.

mod decide;

use std::sync::Arc;

use futures::StreamExt as _;

use kube::Api;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{self, ObjectRef};
use kvcache_api::{KVCachePoolBinding, ModelDeployment};

use super::injection::{Connection, StoreKind};
use super::shared;
use super::status::{self, add_finalizer, has_finalizer, remove_finalizer};
use super::{Context, KindLabel, ReplicaLabel, Result};
use crate::runtime::{ReplicaObservation, ReplicaPlan};
use decide::{Resolved, attach, report, with_leader_counts};
pub use decide::{replicas, router};
use kvcache_api::backend::EndpointName;
use kvcache_store::proto::ClientStatus;

const KIND: &str = "ModelDeployment";

/// A Binding event wakes the deployments of its namespace that attach through it.
pub fn for_binding(
    deployments: &reflector::Store<ModelDeployment>,
    b: &KVCachePoolBinding,
) -> Vec<ObjectRef<ModelDeployment>> {
    deployments
        .state()
        .iter()
        .filter(|m| m.namespace() == b.namespace() && m.spec.binding_name() == Some(b.name()))
        .map(|m| ObjectRef::new(m.name()).within(m.namespace()))
        .collect()
}

pub fn error_policy(_: Arc<ModelDeployment>, error: &super::Error, ctx: Arc<Context>) -> Action {
    super::retry(KIND, error, &ctx)
}

fn owner(md: &ModelDeployment) -> String {
    format!("{}/{}", md.namespace(), md.name())
}

pub async fn reconcile(obj: Arc<ModelDeployment>, ctx: Arc<Context>) -> Result<Action> {
    ctx.metrics.reconciles.get_or_create(&KindLabel { kind: KIND }).inc();
    let api: Api<ModelDeployment> = Api::namespaced(ctx.client.clone(), obj.namespace());
    if obj.metadata.deletion_timestamp.is_some() {
        if has_finalizer(&obj) && ctx.runtime.remove_replicas(&owner(&obj)).await {
            remove_finalizer(&api, &obj).await?;
        }
        return Ok(Action::await_change());
    }
    if add_finalizer(&api, &obj).await? {
        return Ok(Action::await_change());
    }
    let config = ctx.config.get();
    let resolved = resolve(&obj, &ctx).await?;
    let attached = attach(&obj, &resolved, &config.settings.kv_cache_backend_image);
    // Hold rule: replicas attached before keep running as they are while the
    // connection does not resolve, rather than being rolled to run without a cache.
    let had_cache = obj.status.as_ref().is_some_and(|s| s.kv_cache.is_some());
    let replicas = replicas(&obj, attached.connection.as_ref(), &config);
    let plan = ReplicaPlan {
        owner: owner(&obj),
        uid: obj.metadata.uid.clone().unwrap_or_default(),
        router: router(&obj, &replicas, &config),
        replicas,
        hold_rollout: attached.connection.is_none() && obj.spec.binding_name().is_some() && had_cache,
    };
    let mut observed = ctx.runtime.ensure_replicas(&plan).await;
    let routed = ctx.runtime.ensure_router(&plan, &observed).await;
    if let Some(c) = &attached.connection
        && observed.iter().any(|r| r.cache.is_none() && r.state.ready)
    {
        let clients = leader_counts(&resolved, c, &ctx).await;
        with_leader_counts(obj.name(), &mut observed, &clients);
    }
    record_hit_rates(&obj, &observed, &ctx);
    let st = report(
        &obj,
        &attached,
        &observed,
        routed.as_ref(),
        &crate::registry::meta::now(),
    );
    status::write(&api, &obj, st, &ctx).await?;
    Ok(Action::requeue(ctx.opts.requeue))
}

/// Each replica's latest hit rate, as it reported it, on the controllers' metrics.
fn record_hit_rates(obj: &ModelDeployment, observed: &[ReplicaObservation], ctx: &Context) {
    for r in observed {
        if let Some(report) = &r.cache {
            ctx.metrics
                .replica_hit_ratio
                .get_or_create(&ReplicaLabel {
                    namespace: obj.namespace().to_owned(),
                    deployment: obj.name().to_owned(),
                    replica: r.name.clone(),
                })
                .set(report.hit_rate);
        }
    }
}

/// What our store's leader counted for each of the tenant's callers; nothing when the store is
/// not ours, publishes no Admin endpoint yet, or cannot be reached (the replicas then read as
/// not having reported, and the next pass asks again).
async fn leader_counts(resolved: &Resolved, c: &Connection, ctx: &Context) -> Vec<ClientStatus> {
    let StoreKind::Ours { .. } = c.store else {
        return Vec::new();
    };
    let Some(admin) = resolved
        .backend
        .as_ref()
        .and_then(|b| shared::endpoint(b, EndpointName::Admin))
    else {
        return Vec::new();
    };
    let tenant = c
        .tenant
        .as_deref()
        .unwrap_or(kvcache_store::leader::ledger::DEFAULT_TENANT);
    match ctx.ledger(resolved.backend.as_ref(), &admin).await {
        Ok(t) => t
            .tenants
            .into_iter()
            .find(|x| x.name == tenant)
            .map(|x| x.clients)
            .unwrap_or_default(),
        Err(e) => {
            tracing::debug!(tenant, "reading the replicas' cache use from the leader: {e}");
            Vec::new()
        }
    }
}

/// What the deployment's `kvCache` leads to: its Binding, the Binding's pool and backend, and the
/// credential kept for the Binding.
async fn resolve(obj: &ModelDeployment, ctx: &Context) -> Result<Resolved> {
    let Some(name) = obj.spec.binding_name() else {
        return Ok(Resolved::default());
    };
    let binding = Api::<KVCachePoolBinding>::namespaced(ctx.client.clone(), obj.namespace())
        .get_opt(name)
        .await?;
    let Some(b) = binding else {
        return Ok(Resolved::default());
    };
    let (pool, backend) = shared::pool_and_backend(&ctx.client, b.spec.pool_name()).await?;
    let credential = ctx.secrets.credentials().get(&super::credential::key(&b)).await?;
    // a store whose TLS is not known yet is not attached to: its replicas would start without it
    let store_ca = match backend.as_ref().filter(|k| k.spec.managed().is_some()) {
        Some(_) => ctx.secrets.store_ca_pem().map_err(super::Error::Runtime)?,
        None => None,
    };
    Ok(Resolved {
        binding: Some(b),
        pool,
        backend,
        credential,
        store_ca,
    })
}

/// The deployment controller: a deployment's pass runs when it or its Binding changes, when
/// its Binding's credentials change, and when its replicas' processes change.
pub(super) async fn controller(ctx: Arc<Context>, stop: super::Shutdown) {
    let client = ctx.client.clone();
    let cfg = kube::runtime::watcher::Config::default;
    let deployments = kube::runtime::Controller::new(Api::<ModelDeployment>::all(client.clone()), cfg());
    let on_credentials = {
        let deployments = deployments.store();
        super::credential_changes(&ctx).flat_map(move |b| {
            let refs: Vec<ObjectRef<ModelDeployment>> = deployments
                .state()
                .iter()
                .filter(|m| m.namespace() == b.namespace && m.spec.binding_name() == Some(b.name.as_str()))
                .map(|m| ObjectRef::new(m.name()).within(m.namespace()))
                .collect();
            futures::stream::iter(refs)
        })
    };
    let on_replicas = super::changes(&ctx, |c| match c {
        crate::runtime::Changed::Replicas(owner) => {
            let (ns, name) = owner.split_once('/')?;
            Some(ObjectRef::new(name).within(ns))
        }
        crate::runtime::Changed::Store(_) => None,
    });
    let seen = deployments.store();
    deployments
        .reconcile_on(on_credentials)
        .watches(Api::<KVCachePoolBinding>::all(client), cfg(), move |b| {
            for_binding(&seen, &b)
        })
        .reconcile_on(on_replicas)
        .graceful_shutdown_on(stop.signal())
        .run(reconcile, error_policy, ctx)
        .for_each(|_| async {})
        .await;
}
