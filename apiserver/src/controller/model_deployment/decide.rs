//! The ModelDeployment controller's decisions, with no I/O: what the deployment's `kvCache`
//! attaches to ([`attach`]: DomainRegistered, `status.kvCache` and the connection replicas
//! receive), the replicas the runtime runs ([`replicas`]), and the status their observation makes
//! ([`report`]: roles, CacheAttached, RouterReady, phase), and the router in front of them
//! ([`router`]). Table-tested below.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kvcache_api::conditions::binding::quota_granted;
use kvcache_api::conditions::model_deployment::{cache_attached, domain_registered};
use kvcache_api::conditions::{self, BindingPhase, ConditionStatus, ModelDeploymentPhase, Observation};
use kvcache_api::model_deployment::{
    EngineName, KvCacheDomainStatus, KvCacheStatus, ModelDeploymentStatus, RoleKind, RoleStatus, RouterStatus,
};
use kvcache_api::{KVCacheBackend, KVCachePool, KVCachePoolBinding, ModelDeployment};

use crate::controller::injection::{self, Connection};
use crate::runtime::credentials::{ReplicaCredential, TenantCredentials};
use crate::runtime::{CacheReport, Replica, ReplicaObservation, RouterObservation};

mod router;
use kvcache_store::proto::ClientStatus;
pub use router::router;
use router::{role_summary, router_ready_of};

/// What the deployment's `kvCache` leads to, each if it exists: the Binding it names, the
/// Binding's pool, the pool's backend, and the credential kept for the Binding.
#[derive(Clone, Debug, Default)]
pub struct Resolved {
    pub binding: Option<KVCachePoolBinding>,
    pub pool: Option<KVCachePool>,
    pub backend: Option<KVCacheBackend>,
    pub credential: Option<TenantCredentials>,
    /// The store's CA (PEM) when the runtime runs the backend's store with TLS
    /// (`runtime/store_tls.rs`).
    pub store_ca: Option<String>,
}

/// What the deployment attaches to.
#[derive(Clone, Debug, PartialEq)]
pub struct Attach {
    /// DomainRegistered
    pub registered: Observation,
    /// `status.kvCache`
    pub kv_cache: Option<KvCacheStatus>,
    /// what replicas connect with, once the domain is ready
    pub connection: Option<Connection>,
}

/// DomainRegistered, `status.kvCache` and, when the domain is ready, the connection replicas
/// receive (`backend_image`: the setting that tells our store's image from the reference's).
pub fn attach(obj: &ModelDeployment, r: &Resolved, backend_image: &str) -> Attach {
    let mut kv_cache = obj.status.as_ref().and_then(|s| s.kv_cache.clone());
    let (registered, connection) = connect(obj, r, backend_image, &mut kv_cache);
    Attach {
        registered,
        kv_cache,
        connection,
    }
}

/// DomainRegistered and the connection, first unmet step wins; sets `status.kvCache` once the
/// Binding is found (clears it when the deployment has no `kvCache`).
fn connect(
    obj: &ModelDeployment,
    r: &Resolved,
    backend_image: &str,
    kv_cache: &mut Option<KvCacheStatus>,
) -> (Observation, Option<Connection>) {
    let Some(binding_name) = obj.spec.binding_name() else {
        *kv_cache = None;
        return (
            registered(
                ConditionStatus::True,
                domain_registered::NOT_APPLICABLE,
                "the deployment has no kvCache: it runs without a shared cache".into(),
            ),
            None,
        );
    };
    let Some(b) = &r.binding else {
        return (
            registered(
                ConditionStatus::False,
                domain_registered::BINDING_NOT_FOUND,
                format!(
                    "no KVCachePoolBinding {binding_name:?} in the namespace {:?}; an administrator creates it",
                    obj.namespace()
                ),
            ),
            None,
        );
    };
    *kv_cache = Some(kv_cache_status(b));
    match ready_connection(b, binding_name, r, backend_image) {
        Ok((registered, connection)) => (registered, Some(connection)),
        Err(not_ready) => (not_ready, None),
    }
}

/// A DomainRegistered observation.
fn registered(status: ConditionStatus, reason: conditions::Reason, msg: String) -> Observation {
    Observation::new(domain_registered::TYPE, status, reason, msg)
}

/// `status.kvCache`: the Binding, its pool and its domain.
fn kv_cache_status(b: &KVCachePoolBinding) -> KvCacheStatus {
    let domain = b.spec.domain.clone().unwrap_or_default();
    KvCacheStatus {
        binding: b.name().to_owned(),
        pool: b.spec.pool_name().to_owned(),
        domain: KvCacheDomainStatus {
            name: b.spec.domain_name().to_owned(),
            block_size: domain.block_size.unwrap_or(0),
            dtype: domain.dtype.clone().unwrap_or_default(),
        },
    }
}

/// DomainRegistered True and the connection through the found Binding `b`, or why not yet
/// (DomainRegistered False).
fn ready_connection(
    b: &KVCachePoolBinding,
    binding_name: &str,
    r: &Resolved,
    backend_image: &str,
) -> Result<(Observation, Connection), Observation> {
    if b.metadata.deletion_timestamp.is_some() {
        return Err(registered(
            ConditionStatus::False,
            domain_registered::BINDING_DELETING,
            format!("the KVCachePoolBinding {binding_name:?} is being deleted"),
        ));
    }
    let unenforced = granted(b, binding_name)?;
    let endpoint = r.pool.as_ref().and_then(|p| p.status.as_ref()?.client_endpoint.clone());
    let (Some(endpoint), Some(backend)) = (endpoint, &r.backend) else {
        return Err(registered(
            ConditionStatus::False,
            domain_registered::BINDING_NOT_READY,
            format!(
                "the pool {:?} of the KVCachePoolBinding {binding_name:?} has no client endpoint yet",
                b.spec.pool_name()
            ),
        ));
    };
    // Where the ledger checks credentials, replicas carry the Binding's current one.
    let credential = if unenforced {
        None
    } else {
        Some(replica_credential(b, binding_name, r)?)
    };
    let domain = b.spec.domain.clone().unwrap_or_default();
    Ok((
        registered(
            ConditionStatus::True,
            domain_registered::REGISTERED,
            format!(
                "attached through the KVCachePoolBinding {binding_name:?}, domain {:?}, store at {endpoint}",
                b.spec.domain_name()
            ),
        ),
        Connection {
            endpoint,
            store: injection::StoreKind::of(&backend.spec, backend_image),
            tenant: (!unenforced).then(|| b.spec.domain_name().to_owned()),
            block_size: domain.block_size.unwrap_or(0),
            dtype: domain.dtype.unwrap_or_default(),
            protocol: "tcp".into(),
            credential,
            tls: r.store_ca.as_ref().map(|ca| injection::StoreTrust {
                ca_pem: ca.clone(),
                server_name: crate::runtime::store_tls::server_name(&kube::ResourceExt::name_any(backend)),
            }),
        },
    ))
}

/// Whether the Binding is Ready with its quota granted: `Ok(unenforced)`, else why not.
fn granted(b: &KVCachePoolBinding, binding_name: &str) -> Result<bool, Observation> {
    let bst = b.status.clone().unwrap_or_default();
    let granted = conditions::find(&bst.conditions, quota_granted::TYPE);
    if bst.phase != Some(BindingPhase::Ready) || granted.is_none_or(|c| c.status != "True") {
        let phase = bst.phase.map_or("not observed yet".to_owned(), |p| p.to_string());
        return Err(registered(
            ConditionStatus::False,
            domain_registered::BINDING_NOT_READY,
            format!("the KVCachePoolBinding {binding_name:?} is not ready (phase {phase})"),
        ));
    }
    Ok(granted.is_some_and(|c| c.reason == quota_granted::UNENFORCED.as_str()))
}

/// The Binding's current tenant credential for replicas, once its controller has minted one.
fn replica_credential(
    b: &KVCachePoolBinding,
    binding_name: &str,
    r: &Resolved,
) -> Result<ReplicaCredential, Observation> {
    match &r.credential {
        Some(c) if Some(c.uid.as_str()) == b.metadata.uid.as_deref() => {
            Ok(ReplicaCredential::new(binding_name, &c.current))
        }
        _ => Err(registered(
            ConditionStatus::False,
            domain_registered::BINDING_NOT_READY,
            format!("the KVCachePoolBinding {binding_name:?} has no tenant credential yet; its controller mints one"),
        )),
    }
}

/// The status the replicas' and the router's observation makes: roles and ROLES, DomainRegistered
/// and CacheAttached, RouterReady, phase and endpoint.
pub fn report(
    obj: &ModelDeployment,
    attach: &Attach,
    observed: &[ReplicaObservation],
    router: Option<&RouterObservation>,
    now: &Time,
) -> ModelDeploymentStatus {
    let mut st = ModelDeploymentStatus {
        conditions: obj.status.clone().unwrap_or_default().conditions,
        kv_cache: attach.kv_cache.clone(),
        ..ModelDeploymentStatus::default()
    };
    let generation = obj.metadata.generation;
    let (mut desired, mut ready) = (0, 0);
    for role in &obj.spec.roles {
        let kind = role.kind.unwrap_or(RoleKind::Server);
        let mine: Vec<&ReplicaObservation> = observed.iter().filter(|r| r.role == role.name).collect();
        let d = role.replicas.unwrap_or(1).max(0);
        let r = i32::try_from(mine.iter().filter(|o| o.state.running && o.state.ready).count()).unwrap_or(i32::MAX);
        desired += d;
        ready += r;
        st.roles.push(RoleStatus {
            name: role.name.clone(),
            kind: kind.as_str().to_owned(),
            desired: d,
            ready: r,
            quota_reserved: 0,
            unmanaged: !role.command.is_empty(),
        });
    }
    let declared = obj.spec.router.is_some();
    let router = router.filter(|_| declared);
    st.role_summary = Some(role_summary(&st.roles, declared.then(|| router.map_or(0, |r| r.ready))));
    st.router = obj.spec.router.as_ref().map(|r| RouterStatus {
        name: r.name.clone().unwrap_or_default(),
        endpoint: router.filter(|o| o.ready > 0).and_then(|o| o.url.clone()),
        replicas: router.map_or(0, |o| o.replicas),
        ready: router.map_or(0, |o| o.ready),
    });
    let cache = attached(obj, observed, attach.connection.is_some(), &attach.registered);
    let uncached = (cache.reason == cache_attached::BINDING_NOT_FOUND.as_str()).then(|| cache.message.clone());
    let routed = router_ready_of(obj, router);
    let router_down = (routed.status != ConditionStatus::True).then(|| routed.message.clone());
    let router_down = router_down.filter(|_| declared);
    for o in [attach.registered.clone(), cache, routed] {
        conditions::set(&mut st.conditions, o.generation(generation), now);
    }
    let (phase, message) = phase((ready, desired), uncached, router_down, observed);
    st.phase = Some(phase);
    st.phase_message = with_what_runs(message, observed);
    st.endpoint = match &st.router {
        Some(r) => r.endpoint.clone(),
        None => endpoint(obj, observed),
    };
    st
}

/// The phase and its message: Ready when every replica is ready with the cache it asks for and
/// the router it declares; Degraded when some are, or all are without that cache or router;
/// else Starting, with why nothing is ready.
fn phase(
    (ready, desired): (i32, i32),
    uncached: Option<String>,
    router_down: Option<String>,
    observed: &[ReplicaObservation],
) -> (ModelDeploymentPhase, Option<String>) {
    if let (true, Some(why)) = (ready == desired, uncached) {
        // Every replica runs, but not with the cache it asks for: not Ready.
        (
            ModelDeploymentPhase::Degraded,
            Some(format!("{ready} of {desired} replicas are ready, {why}")),
        )
    } else if let (true, Some(why)) = (ready == desired, router_down) {
        // Every replica runs, and clients cannot reach them through the router they asked for.
        (
            ModelDeploymentPhase::Degraded,
            Some(format!(
                "{ready} of {desired} replicas are ready, the router is not: {why}"
            )),
        )
    } else if ready == desired {
        (ModelDeploymentPhase::Ready, None)
    } else if ready > 0 {
        (
            ModelDeploymentPhase::Degraded,
            Some(format!("{ready} of {desired} replicas are ready")),
        )
    } else {
        (
            ModelDeploymentPhase::Starting,
            Some(format!("0 of {desired} replicas are ready{}", first_fault(observed))),
        )
    }
}

/// The deployment's endpoint (the ENDPOINT column) without a router: where the first replica of
/// the first role answers, while the runtime serves it at an address (locally; a cluster has no
/// Service in front of the replicas, so there it stays unset).
fn endpoint(obj: &ModelDeployment, observed: &[ReplicaObservation]) -> Option<String> {
    let first = obj.spec.roles.first()?;
    observed.iter().find(|r| r.role == first.name)?.url.clone()
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
        let routed = obj.spec.router.is_some();
        let container =
            crate::controller::engine::container(obj, role, engine, &injected, &config.instance_types, routed);
        for i in 0..role.replicas.unwrap_or(1).max(0) {
            let name = format!("{}-{i}", role.name);
            let (mut env, mut engine) = (injected.env.clone(), container.clone());
            // Our store counts each replica's cache use under its name; the role's own
            // environment still comes last (and wins).
            if injected.package_image.is_some() {
                let named = (
                    injection::CLIENT_ENV.to_owned(),
                    injection::client_name(obj.name(), &name),
                );
                env.push(named.clone());
                engine.env.insert(injected.env.len().min(engine.env.len()), named);
            }
            replicas.push(Replica {
                name,
                role: role.name.clone(),
                env,
                args: injected.args.clone(),
                credential: injected.credential.clone(),
                client_config: injected.client_config.clone(),
                package_image: injected.package_image.clone(),
                engine,
            });
        }
    }
    replicas
}

/// Fills in the cache use of replicas that gave no report of their own (a cluster's engines do
/// not report to the controllers) from what the leader counted under each replica's name
/// ([`injection::CLIENT_ENV`]): its gets, hits and committed puts in the tenant. A replica the
/// leader has not seen keeps no report.
pub fn with_leader_counts(deployment: &str, observed: &mut [ReplicaObservation], clients: &[ClientStatus]) {
    for r in observed.iter_mut().filter(|r| r.cache.is_none()) {
        let name = injection::client_name(deployment, &r.name);
        if let Some(c) = clients.iter().find(|c| c.name == name) {
            r.cache = Some(CacheReport {
                blocks: c.gets,
                hits: c.hits,
                stored: c.puts,
                hit_rate: if c.gets == 0 {
                    0.0
                } else {
                    c.hits as f64 / c.gets as f64
                },
            });
        }
    }
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

/// CacheAttached from the replicas' own reports, first match wins: True (NotApplicable) without
/// `kvCache`; Unknown when a role replaces the engine command or while no replica is ready;
/// False (BindingNotFound) while ready replicas run without it because their Binding does not
/// exist; Unknown while they run without a connection for another reason; True when a ready replica reports a store
/// operation that succeeded; False when they report operations and none succeeded; else Unknown.
fn attached(
    obj: &ModelDeployment,
    observed: &[ReplicaObservation],
    connected: bool,
    registered: &Observation,
) -> Observation {
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
    if registered.reason == domain_registered::BINDING_NOT_FOUND.as_str() {
        return o(
            ConditionStatus::False,
            cache_attached::BINDING_NOT_FOUND,
            format!(
                "the ready replicas run without the shared cache: {}",
                registered.message
            ),
        );
    }
    if !connected {
        return o(
            ConditionStatus::Unknown,
            cache_attached::NO_OBSERVATION_AVAILABLE,
            format!("the replicas run without a cache connection: {}", registered.message),
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

#[cfg(test)]
mod tests;
