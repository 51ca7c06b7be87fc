//! The ModelDeployment controller: resolves the Binding (`DomainRegistered`, `status.kvCache`),
//! the connection behind it (pool endpoint, tenant, layout), runs each role's replicas through the
//! runtime with exactly what [`injection`](super::injection) computes, and reports roles,
//! phase and `CacheAttached` from what the replicas themselves report (`model-deployment.md`
//! §2.3, §3.3). A deployment without `kvCache` runs with no cache at all.

use std::sync::Arc;

use kube::Api;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kvcache_api::conditions::binding::quota_granted;
use kvcache_api::conditions::model_deployment::{cache_attached, domain_registered};
use kvcache_api::conditions::{self, BindingPhase, ConditionStatus, ModelDeploymentPhase, Observation};
use kvcache_api::model_deployment::{
    EngineName, KvCacheDomainStatus, KvCacheStatus, ModelDeploymentStatus, RoleKind, RoleStatus,
};
use kvcache_api::{KVCacheBackend, KVCachePool, KVCachePoolBinding, ModelDeployment};

use super::injection::{self, Connection};
use super::status::{self, add_finalizer, has_finalizer, remove_finalizer};
use super::{Context, KindLabel, ReplicaLabel, Result};
use crate::runtime::{Replica, ReplicaObservation, ReplicaPlan};

const KIND: &str = "ModelDeployment";

/// A Binding event wakes the deployments of its namespace that attach through it.
pub fn for_binding(deployments: &Store<ModelDeployment>, b: &KVCachePoolBinding) -> Vec<ObjectRef<ModelDeployment>> {
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
    let ns = obj.namespace().to_owned();
    let api: Api<ModelDeployment> = Api::namespaced(ctx.client.clone(), &ns);
    if obj.metadata.deletion_timestamp.is_some() {
        if has_finalizer(&obj) && ctx.runtime.remove_replicas(&owner(&obj)).await {
            remove_finalizer(&api, &obj).await?;
        }
        return Ok(Action::await_change());
    }
    if add_finalizer(&api, &obj).await? {
        return Ok(Action::await_change());
    }
    let generation = obj.metadata.generation;
    let now = crate::registry::meta::now();
    let prev = obj.status.clone().unwrap_or_default();
    let mut st = ModelDeploymentStatus {
        conditions: prev.conditions.clone(),
        kv_cache: prev.kv_cache.clone(),
        ..ModelDeploymentStatus::default()
    };
    let set = |st: &mut ModelDeploymentStatus, o: Observation| {
        conditions::set(&mut st.conditions, o.generation(generation), &now);
    };

    let (registered, connection) = resolve(&obj, &ctx, &mut st).await?;
    let registered_message = registered.message.clone();
    set(&mut st, registered);

    // Replicas, each with exactly what injection computed.
    let replicas = replicas(&obj, connection.as_ref(), &ctx.config.get());
    // Hold rule (§3.3 step 5): replicas attached before keep running as they are while the
    // connection does not resolve, rather than being rolled to run without a cache.
    let hold_rollout = connection.is_none() && obj.spec.binding_name().is_some() && prev.kv_cache.is_some();
    let observed = ctx
        .runtime
        .ensure_replicas(&ReplicaPlan {
            owner: owner(&obj),
            uid: obj.metadata.uid.clone().unwrap_or_default(),
            replicas,
            hold_rollout,
        })
        .await;
    for r in &observed {
        if let Some(report) = &r.cache {
            ctx.metrics
                .replica_hit_ratio
                .get_or_create(&ReplicaLabel {
                    namespace: ns.clone(),
                    deployment: obj.name().to_owned(),
                    replica: r.name.clone(),
                })
                .set(report.hit_rate);
        }
    }
    let (mut desired, mut ready) = (0, 0);
    let mut summary = Vec::new();
    for role in &obj.spec.roles {
        let kind = role.kind.unwrap_or(RoleKind::Server);
        let mine: Vec<&ReplicaObservation> = observed.iter().filter(|r| r.role == role.name).collect();
        let d = role.replicas.unwrap_or(1).max(0);
        let r = i32::try_from(mine.iter().filter(|o| o.state.running && o.state.ready).count()).unwrap_or(i32::MAX);
        desired += d;
        ready += r;
        summary.push(format!("{r}{}", &kind.as_str()[..1]));
        st.roles.push(RoleStatus {
            name: role.name.clone(),
            kind: kind.as_str().to_owned(),
            desired: d,
            ready: r,
            quota_reserved: 0,
            unmanaged: !role.command.is_empty(),
        });
    }
    st.role_summary = Some(summary.concat());
    set(
        &mut st,
        attached(&obj, &observed, connection.is_some(), &registered_message),
    );
    let (phase, message) = if ready == desired {
        (ModelDeploymentPhase::Ready, None)
    } else if ready > 0 {
        (
            ModelDeploymentPhase::Degraded,
            Some(format!("{ready} of {desired} replicas are ready")),
        )
    } else {
        (
            ModelDeploymentPhase::Starting,
            Some(format!("0 of {desired} replicas are ready{}", first_fault(&observed))),
        )
    };
    st.phase = Some(phase);
    st.phase_message = with_what_runs(message, &observed);
    status::write(&api, &obj, st, &ctx).await?;
    Ok(Action::requeue(ctx.opts.requeue))
}

/// The replicas of `obj`, each with exactly what injection computed for `connection`, and the
/// engine container a cluster runs.
pub fn replicas(
    obj: &ModelDeployment,
    connection: Option<&Connection>,
    config: &crate::config::Config,
) -> Vec<Replica> {
    let dtype_owned = config.settings.model_deployment_kv_cache_dtype_owned;
    let engine = obj
        .spec
        .engine
        .as_ref()
        .and_then(|e| e.name)
        .unwrap_or(EngineName::Vllm);
    let mut replicas = Vec::new();
    for role in &obj.spec.roles {
        let kind = role.kind.unwrap_or(RoleKind::Server);
        let injected = injection::inject(engine, kind, connection, dtype_owned);
        let container = super::engine::container(obj, role, engine, &injected, &config.instance_types);
        for i in 0..role.replicas.unwrap_or(1).max(0) {
            replicas.push(Replica {
                name: format!("{}-{i}", role.name),
                role: role.name.clone(),
                env: injected.env.clone(),
                args: injected.args.clone(),
                credential: injected.credential.clone(),
                client_config: injected.client_config.clone(),
                package_image: injected.package_image.clone(),
                engine: container.clone(),
            });
        }
    }
    replicas
}

/// The phase message followed by what the runtime says runs (`server-0: vLLM (vllm serve) at
/// http://127.0.0.1:41234`, or why the simulator runs), when it says anything.
fn with_what_runs(message: Option<String>, observed: &[ReplicaObservation]) -> Option<String> {
    let runs: Vec<String> = observed
        .iter()
        .filter_map(|r| Some(format!("{}: {}", r.name, r.runs.as_deref()?)))
        .collect();
    if runs.is_empty() {
        return message;
    }
    let runs = runs.join("; ");
    Some(match message {
        Some(m) => format!("{m}; {runs}"),
        None => runs,
    })
}

/// `; <replica>: <why>` for the first replica that cannot run (refused, waiting on the kubelet,
/// or crashed), so the phase says why nothing is ready; empty when every one is just starting.
fn first_fault(observed: &[ReplicaObservation]) -> String {
    observed
        .iter()
        .find_map(|r| {
            let s = &r.state;
            let why = s
                .refused
                .clone()
                .or_else(|| s.waiting.as_ref().map(|(reason, msg)| format!("{reason}: {msg}")))
                .or_else(|| s.last_exit.as_ref().map(|e| format!("ended ({})", e.describe())))?;
            Some(format!("; {}: {why}", r.name))
        })
        .unwrap_or_default()
}

/// DomainRegistered and, when the domain is ready, the connection replicas receive.
async fn resolve(
    obj: &ModelDeployment,
    ctx: &Context,
    st: &mut ModelDeploymentStatus,
) -> Result<(Observation, Option<Connection>)> {
    let obs = |status, reason: conditions::Reason, msg: String| {
        Observation::new(domain_registered::TYPE, status, reason, msg)
    };
    let Some(binding_name) = obj.spec.binding_name() else {
        st.kv_cache = None;
        return Ok((
            obs(
                ConditionStatus::True,
                domain_registered::NOT_APPLICABLE,
                "the deployment has no kvCache: it runs without a shared cache".into(),
            ),
            None,
        ));
    };
    let bindings: Api<KVCachePoolBinding> = Api::namespaced(ctx.client.clone(), obj.namespace());
    let Some(b) = bindings.get_opt(binding_name).await? else {
        return Ok((
            obs(
                ConditionStatus::False,
                domain_registered::BINDING_NOT_FOUND,
                format!(
                    "no KVCachePoolBinding {binding_name:?} in the namespace {:?}; an administrator creates it",
                    obj.namespace()
                ),
            ),
            None,
        ));
    };
    let domain = b.spec.domain.clone().unwrap_or_default();
    st.kv_cache = Some(KvCacheStatus {
        binding: b.name().to_owned(),
        pool: b.spec.pool_name().to_owned(),
        domain: KvCacheDomainStatus {
            name: b.spec.domain_name().to_owned(),
            block_size: domain.block_size.unwrap_or(0),
            dtype: domain.dtype.clone().unwrap_or_default(),
        },
    });
    if b.metadata.deletion_timestamp.is_some() {
        return Ok((
            obs(
                ConditionStatus::False,
                domain_registered::BINDING_DELETING,
                format!("the KVCachePoolBinding {binding_name:?} is being deleted"),
            ),
            None,
        ));
    }
    let bst = b.status.clone().unwrap_or_default();
    let granted = conditions::find(&bst.conditions, quota_granted::TYPE);
    if bst.phase != Some(BindingPhase::Ready) || granted.is_none_or(|c| c.status != "True") {
        let phase = bst.phase.map_or("not observed yet".to_owned(), |p| p.to_string());
        return Ok((
            obs(
                ConditionStatus::False,
                domain_registered::BINDING_NOT_READY,
                format!("the KVCachePoolBinding {binding_name:?} is not ready (phase {phase})"),
            ),
            None,
        ));
    }
    let unenforced = granted.is_some_and(|c| c.reason == quota_granted::UNENFORCED.as_str());
    let pool = Api::<KVCachePool>::all(ctx.client.clone())
        .get_opt(b.spec.pool_name())
        .await?;
    let endpoint = pool.as_ref().and_then(|p| p.status.as_ref()?.client_endpoint.clone());
    let backend = match pool.as_ref().and_then(|p| p.spec.backend()) {
        Some(name) => Api::<KVCacheBackend>::all(ctx.client.clone()).get_opt(name).await?,
        None => None,
    };
    let (Some(endpoint), Some(backend)) = (endpoint, backend) else {
        return Ok((
            obs(
                ConditionStatus::False,
                domain_registered::BINDING_NOT_READY,
                format!(
                    "the pool {:?} of the KVCachePoolBinding {binding_name:?} has no client endpoint yet",
                    b.spec.pool_name()
                ),
            ),
            None,
        ));
    };
    // Where the ledger checks credentials, replicas carry the Binding's current one.
    let credential = if unenforced {
        None
    } else {
        let kept = ctx.runtime.credentials().get(&super::credential::key(&b)).await?;
        match kept {
            Some(c) if Some(c.uid.as_str()) == b.metadata.uid.as_deref() => Some(
                crate::runtime::credentials::ReplicaCredential::new(binding_name, &c.current),
            ),
            _ => {
                return Ok((
                    obs(
                        ConditionStatus::False,
                        domain_registered::BINDING_NOT_READY,
                        format!(
                            "the KVCachePoolBinding {binding_name:?} has no tenant credential yet; its controller mints one"
                        ),
                    ),
                    None,
                ));
            }
        }
    };
    Ok((
        obs(
            ConditionStatus::True,
            domain_registered::REGISTERED,
            format!(
                "attached through the KVCachePoolBinding {binding_name:?}, domain {:?}, store at {endpoint}",
                b.spec.domain_name()
            ),
        ),
        Some(Connection {
            endpoint,
            store: injection::StoreKind::of(&backend.spec, &ctx.config.get().settings.kv_cache_backend_image),
            tenant: (!unenforced).then(|| b.spec.domain_name().to_owned()),
            block_size: domain.block_size.unwrap_or(0),
            dtype: domain.dtype.unwrap_or_default(),
            protocol: "tcp".into(),
            credential,
        }),
    ))
}

/// CacheAttached, in the order of §2.3, from the replicas' own reports.
fn attached(obj: &ModelDeployment, observed: &[ReplicaObservation], connected: bool, registered: &str) -> Observation {
    let o =
        |status, reason: conditions::Reason, msg: String| Observation::new(cache_attached::TYPE, status, reason, msg);
    if obj.spec.binding_name().is_none() {
        return o(
            ConditionStatus::True,
            cache_attached::NOT_APPLICABLE,
            "no kvCache: the replicas run without a shared cache".into(),
        );
    }
    if let Some(role) = obj.spec.roles.iter().find(|r| !r.command.is_empty()) {
        return o(
            ConditionStatus::Unknown,
            cache_attached::UNMANAGED,
            format!(
                "the role {:?} replaces the engine command, so its cache use is not observed",
                role.name
            ),
        );
    }
    let ready: Vec<&ReplicaObservation> = observed.iter().filter(|r| r.state.running && r.state.ready).collect();
    if ready.is_empty() {
        return o(
            ConditionStatus::Unknown,
            cache_attached::NO_REPLICA_READY,
            "no replica is ready yet".into(),
        );
    }
    if !connected {
        return o(
            ConditionStatus::Unknown,
            cache_attached::NO_OBSERVATION_AVAILABLE,
            format!("the replicas run without a cache connection: {registered}"),
        );
    }
    let reporting: Vec<_> = ready.iter().filter_map(|r| r.cache.as_ref().map(|c| (r, c))).collect();
    let active: Vec<String> = reporting
        .iter()
        .filter(|(_, c)| c.hits + c.stored > 0)
        .map(|(r, c)| format!("{} (hit rate {:.2})", r.name, c.hit_rate))
        .collect();
    if !active.is_empty() {
        return o(
            ConditionStatus::True,
            cache_attached::CACHE_ACTIVE,
            format!("replicas report store operations succeeding: {}", active.join(", ")),
        );
    }
    if !reporting.is_empty() {
        return o(
            ConditionStatus::False,
            cache_attached::CACHE_OPERATIONS_FAILING,
            "the ready replicas report store operations and none succeeded".into(),
        );
    }
    o(
        ConditionStatus::Unknown,
        cache_attached::NO_OBSERVATION_AVAILABLE,
        "the ready replicas have not reported their cache use yet".into(),
    )
}
