//! The Kubernetes runtime: the store's leader and members, and the engine replicas, as workloads
//! of a cluster. Objects are server-side applied under one field manager and are this runtime's
//! only when they carry the owner's note; what runs is read from the Pods the cluster reports.
//!
//! | module | owns |
//! |---|---|
//! | [`render`] | a backend's plan as Kubernetes objects (Deployment, Service, DaemonSets, RBAC) |
//! | [`engine_pod`] | a ModelDeployment's replicas as engine Pods |
//! | [`store_target`] | the namespace, image and pull policy of a backend's objects |
//! | [`observe`] | a Pod's status as a workload's state |
//! | [`rollout`] | the leader Deployment's rollout, and rising past one replica in two steps |
//! | [`credential_secrets`] | tenant credentials in Secrets of the Bindings' namespaces |
//! | [`token_secrets`] | the controllers' and each backend's member token, in Secrets |
//! | [`tenant_namespaces`] | the runtime's access to the namespaces of Bindings and engines |

pub mod credential_secrets;
pub mod engine_pod;
pub mod observe;
pub mod render;
mod rollout;
pub mod store_target;
pub mod tenant_namespaces;
pub mod tls_secrets;
pub mod token_secrets;

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use futures::StreamExt as _;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node as KubeNode, Pod};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::watcher;
use parking_lot::RwLock;
use serde_json::Value;

use super::{Changed, Node, ReplicaObservation, ReplicaPlan, Runtime, StoreObservation, StorePlan, WorkloadState};

/// The field manager of every object the controllers apply.
pub const FIELD_MANAGER: &str = "kvcache-controllers";

/// Why a store's TLS is not known yet (the CA's Secret is still being read).
const NO_CA_YET: &str = "the store's CA (the Secret kvcache-store-ca) is not read yet; retrying";

/// Where the runtime renders and what with.
#[derive(Clone, Debug)]
pub struct KubernetesOptions {
    /// The namespace of the store's objects and Leases (`gpustack-system`).
    pub namespace: String,
    /// `(namespace, name)` of the runtime's own ServiceAccount, which it binds in each tenant
    /// namespace it enters ([`tenant_namespaces`]); `None`: its credentials reach them already.
    pub service_account: Option<(String, String)>,
}

/// The kinds this runtime renders, each with its API path.
fn resource(kind: &str) -> Option<ApiResource> {
    let (group, version, plural) = match kind {
        "ServiceAccount" => ("", "v1", "serviceaccounts"),
        "Service" => ("", "v1", "services"),
        "Role" => ("rbac.authorization.k8s.io", "v1", "roles"),
        "RoleBinding" => ("rbac.authorization.k8s.io", "v1", "rolebindings"),
        "Deployment" => ("apps", "v1", "deployments"),
        "DaemonSet" => ("apps", "v1", "daemonsets"),
        "NetworkPolicy" => ("networking.k8s.io", "v1", "networkpolicies"),
        _ => return None,
    };
    Some(ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(group, version, kind),
        plural,
    ))
}

/// Every kind the runtime may have rendered for a backend, in the order they are removed
/// (workloads first, their RBAC last).
const REMOVAL_ORDER: &[&str] = &[
    "DaemonSet",
    "Deployment",
    "Service",
    "NetworkPolicy",
    "RoleBinding",
    "Role",
    "ServiceAccount",
];

/// The store as workloads of a cluster, through kube-rs: server-side apply under one field
/// manager, objects found by label and owned only when they carry the backend's note.
pub struct KubernetesRuntime {
    client: kube::Client,
    opts: KubernetesOptions,
    /// The settings: `kv-cache-backend-image` runs backends that name no image.
    config: crate::config::Live,
    nodes: Arc<RwLock<BTreeMap<String, Node>>>,
    changes: tokio::sync::broadcast::Sender<Changed>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    credentials: credential_secrets::SecretKeeper,
    tenants: Arc<tenant_namespaces::TenantNamespaces>,
    /// Each backend's Control token, once read from (or made into) its Secret.
    control_tokens: RwLock<BTreeMap<String, String>>,
    /// the store's CA, read from its Secret at every store pass (`tls_secrets.rs`)
    store_ca: Arc<RwLock<Option<crate::runtime::store_tls::StoreCa>>>,
}

impl std::fmt::Debug for KubernetesRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubernetesRuntime")
            .field("opts", &self.opts)
            .finish_non_exhaustive()
    }
}

impl Drop for KubernetesRuntime {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl KubernetesRuntime {
    /// Watches the cluster's Nodes (where member groups go) and the store's Pods (whose changes
    /// wake the backend controller).
    pub fn new(client: kube::Client, opts: KubernetesOptions, config: crate::config::Live) -> KubernetesRuntime {
        let nodes: Arc<RwLock<BTreeMap<String, Node>>> = Arc::default();
        let (changes, _) = tokio::sync::broadcast::channel(256);
        let node_task = {
            let (api, nodes) = (Api::<KubeNode>::all(client.clone()), nodes.clone());
            tokio::spawn(async move {
                let mut events = std::pin::pin!(watcher(api, watcher::Config::default()));
                while let Some(e) = events.next().await {
                    let apply = |n: KubeNode, nodes: &mut BTreeMap<String, Node>| {
                        let name = n.metadata.name.clone().unwrap_or_default();
                        let labels = n.metadata.labels.clone().unwrap_or_default();
                        nodes.insert(name.clone(), Node { name, labels });
                    };
                    match e {
                        Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n)) => apply(n, &mut nodes.write()),
                        Ok(watcher::Event::Delete(n)) => {
                            nodes.write().remove(&n.metadata.name.unwrap_or_default());
                        }
                        Ok(watcher::Event::Init) => nodes.write().clear(),
                        Ok(watcher::Event::InitDone) => {}
                        Err(e) => tracing::warn!("watching Nodes: {e}; retrying"),
                    }
                }
            })
        };
        // The store's CA, read (or made) at once: replicas and controllers need it before any
        // backend's pass (`Secrets::store_ca_pem` answers "not yet" until then).
        let store_ca: Arc<RwLock<Option<crate::runtime::store_tls::StoreCa>>> = Arc::default();
        let ca_task = tokio::spawn(tls_secrets::keep_reading(
            Api::namespaced(client.clone(), &opts.namespace),
            opts.namespace.clone(),
            store_ca.clone(),
        ));
        // The store's Pods wake their backend; engine Pods, watched in each namespace the runtime
        // enters, wake their deployment.
        let pod_task = watch_pods(
            Api::namespaced(client.clone(), &opts.namespace),
            "app.kubernetes.io/name=kv-cache-backend",
            changes.clone(),
            |_, instance| Changed::Store(instance.to_owned()),
        );
        let tenants = Arc::new(tenant_namespaces::TenantNamespaces::new(
            client.clone(),
            opts.service_account.clone(),
            changes.clone(),
        ));
        KubernetesRuntime {
            credentials: credential_secrets::SecretKeeper {
                client: client.clone(),
                tenants: tenants.clone(),
            },
            tenants,
            control_tokens: RwLock::new(BTreeMap::new()),
            store_ca,
            client,
            opts,
            config,
            nodes,
            changes,
            tasks: vec![node_task, pod_task, ca_task],
        }
    }

    /// The backend's Control token (kept for [`Secrets::control_token`]), scrape token, member
    /// token and seal key, the store's CA (kept for
    /// [`Secrets::store_tls`](crate::runtime::Secrets::store_tls)) and the backend's certificate,
    /// each in the store's Secrets (`token_secrets.rs`), made when missing (the backend's not while
    /// it is being deleted).
    async fn ensure_tokens(&self, plan: &StorePlan) -> Result<(), String> {
        let api = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(self.client.clone(), &self.opts.namespace);
        let control = token_secrets::ensure(&api, &self.opts.namespace, &plan.backend, !plan.existing_only).await?;
        match control {
            Some(t) => self.control_tokens.write().insert(plan.backend.clone(), t),
            None => self.control_tokens.write().remove(&plan.backend),
        };
        let ca = tls_secrets::ca(&api, &self.opts.namespace).await?;
        tls_secrets::ensure_backend(&api, &self.opts.namespace, &plan.backend, &ca, !plan.existing_only).await?;
        *self.store_ca.write() = Some(ca);
        Ok(())
    }

    /// Removes `backend`'s keys from the store's Secrets (its tokens and certificate).
    async fn remove_secrets(&self, backend: &str) -> Result<(), String> {
        let api = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(self.client.clone(), &self.opts.namespace);
        token_secrets::remove_keys(&api, render::TOKENS_SECRET, &token_secrets::keys(backend)).await?;
        tls_secrets::remove_keys(&api, backend).await?;
        self.control_tokens.write().remove(backend);
        Ok(())
    }

    fn api(&self, r: &ApiResource) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), &self.opts.namespace, r)
    }

    /// Applies `object` unless a same-named object exists that is not this backend's; with
    /// `existing_only`, only an object that exists. Returns the object as applied (`None` when
    /// skipped). The leader Deployment rises past one replica in two steps.
    async fn apply(
        &self,
        backend: &str,
        object: &mut Value,
        existing_only: bool,
    ) -> Result<Option<DynamicObject>, String> {
        let kind = object["kind"].as_str().unwrap_or_default().to_owned();
        let name = object["metadata"]["name"].as_str().unwrap_or_default().to_owned();
        let r = resource(&kind).ok_or_else(|| format!("{kind} is not a kind this runtime renders"))?;
        let api = self.api(&r);
        let what = || format!("{kind} {}/{name}", self.opts.namespace);
        match api.get_opt(&name).await {
            Ok(Some(live)) if !owned_by(&live, backend) => {
                return Err(format!(
                    "{} exists and is not this backend's (it has no annotation {}={backend}); rename or remove it",
                    what(),
                    render::BACKEND_NOTE
                ));
            }
            Ok(Some(live)) if kind == "Deployment" => {
                if let Some(live) = as_deployment(&live) {
                    rollout::rise_in_two_steps(object, &live);
                }
            }
            Ok(None) if existing_only => return Ok(None),
            Ok(_) => {}
            Err(e) => return Err(format!("reading {}: {e}", what())),
        }
        let params = PatchParams::apply(FIELD_MANAGER).force();
        api.patch(&name, &params, &Patch::Apply(&*object))
            .await
            .map(Some)
            .map_err(|e| format!("applying {}: {e}", what()))
    }

    /// The backend's Pods of `component`, by name.
    async fn pods(&self, backend: &str, component: &str) -> Result<Vec<Pod>, kube::Error> {
        let api = Api::<Pod>::namespaced(self.client.clone(), &self.opts.namespace);
        let selector = format!(
            "app.kubernetes.io/name=kv-cache-backend,app.kubernetes.io/instance={backend},app.kubernetes.io/component={component}"
        );
        let mut pods = api.list(&ListParams::default().labels(&selector)).await?.items;
        pods.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        Ok(pods)
    }
}

/// Sends `change(namespace, instance label)` for every change to a Pod `labels` selects.
fn watch_pods(
    api: Api<Pod>,
    labels: &'static str,
    tx: tokio::sync::broadcast::Sender<Changed>,
    change: fn(&str, &str) -> Changed,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut events = std::pin::pin!(watcher(api, watcher::Config::default().labels(labels)));
        while let Some(e) = events.next().await {
            let pod = match e {
                Ok(watcher::Event::Apply(p) | watcher::Event::Delete(p)) => p,
                Ok(_) => continue,
                Err(e) => {
                    tracing::warn!("watching Pods ({labels}): {e}; retrying");
                    continue;
                }
            };
            let namespace = pod.metadata.namespace.clone().unwrap_or_default();
            if let Some(instance) = pod
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("app.kubernetes.io/instance"))
            {
                let _ = tx.send(change(&namespace, instance));
            }
        }
    })
}

/// The label selector of a deployment's engine Pods.
fn engine_selector(deployment: &str) -> String {
    format!(
        "app.kubernetes.io/name=model-deployment,app.kubernetes.io/instance={deployment},{}=modeldeployments",
        render::TYPE_LABEL
    )
}

/// Whether an engine Pod carries `deployment`'s note.
fn runs_for(pod: &Pod, deployment: &str) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(engine_pod::DEPLOYMENT_NOTE))
        .is_some_and(|d| d == deployment)
}

/// A Deployment read through the dynamic API, typed.
fn as_deployment(o: &DynamicObject) -> Option<Deployment> {
    serde_json::to_value(o)
        .ok()
        .and_then(|v| serde_json::from_value(v).ok())
}

/// Whether `object` carries `backend`'s ownership note.
fn owned_by(object: &DynamicObject, backend: &str) -> bool {
    object
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(render::BACKEND_NOTE))
        .is_some_and(|b| b == backend)
}

/// A state for what could not be rendered or read: the reason, as a refusal.
fn refused(why: String) -> WorkloadState {
    WorkloadState {
        refused: Some(why),
        ..WorkloadState::default()
    }
}

impl crate::runtime::Secrets for KubernetesRuntime {
    fn control_token(&self, backend: &str) -> Option<String> {
        self.control_tokens.read().get(backend).cloned()
    }

    fn credentials(&self) -> &dyn crate::runtime::credentials::Keeper {
        &self.credentials
    }

    fn store_tls(&self, backend: &str) -> Result<Option<kvcache_store::tls::ClientTls>, String> {
        match self.store_ca.read().as_ref() {
            Some(ca) => Ok(ca.client(backend)),
            None => Err(NO_CA_YET.to_owned()),
        }
    }

    fn store_ca_pem(&self) -> Result<Option<String>, String> {
        match self.store_ca.read().as_ref() {
            Some(ca) => Ok(Some(ca.ca_pem().to_owned())),
            None => Err(NO_CA_YET.to_owned()),
        }
    }
}

#[async_trait]
impl Runtime for KubernetesRuntime {
    fn nodes(&self) -> Vec<Node> {
        self.nodes.read().values().cloned().collect()
    }

    fn lease_namespace(&self) -> &str {
        &self.opts.namespace
    }

    fn cluster_client(&self) -> Option<kube::Client> {
        Some(self.client.clone())
    }

    async fn credential_in_use(&self, namespace: &str, fingerprint: &str) -> Result<bool, String> {
        if self.tenants.enter(namespace).await? == tenant_namespaces::Entered::NoSuchNamespace {
            return Ok(false);
        }
        credential_secrets::in_use(&self.client, namespace, fingerprint).await
    }

    fn changes(&self) -> tokio::sync::broadcast::Receiver<Changed> {
        self.changes.subscribe()
    }

    async fn ensure_store(&self, plan: &StorePlan) -> StoreObservation {
        let lease = plan
            .election
            .as_ref()
            .map(|e| (self.opts.namespace.clone(), e.lease.clone()));
        let members_unknown = |why: &str| {
            plan.members
                .iter()
                .map(|m| (m.clone(), refused(why.to_owned())))
                .collect::<Vec<_>>()
        };
        let default_image = self.config.get().settings.kv_cache_backend_image.clone();
        let target = match render::Target::for_plan(plan, &self.opts.namespace, &default_image) {
            Ok(mut t) => {
                if let Some((server_namespace, _)) = &self.opts.service_account {
                    t.server_namespace = server_namespace.clone();
                }
                t
            }
            Err(why) => {
                return StoreObservation {
                    leaders: vec![refused(why.clone())],
                    members: members_unknown(&why),
                    lease,
                    ..StoreObservation::default()
                };
            }
        };
        if let Err(why) = self.ensure_tokens(plan).await {
            tracing::warn!(backend = %plan.backend, "{why}");
            return StoreObservation {
                leaders: vec![refused(why.clone())],
                members: members_unknown(&why),
                lease,
                ..StoreObservation::default()
            };
        }
        let mut leader_deployment = None;
        for mut object in render::store(plan, &target) {
            match self.apply(&plan.backend, &mut object, plan.existing_only).await {
                Ok(applied) if object["kind"] == "Deployment" => leader_deployment = applied,
                Ok(_) => {}
                Err(why) => {
                    tracing::warn!(backend = %plan.backend, "{why}");
                    return StoreObservation {
                        leaders: vec![refused(why.clone())],
                        members: members_unknown(&why),
                        lease,
                        ..StoreObservation::default()
                    };
                }
            }
        }
        let leaders = match self.pods(&plan.backend, "leader").await {
            Ok(pods) if pods.is_empty() => vec![WorkloadState::default()],
            Ok(pods) => pods.iter().map(|p| observe::workload(p, "leader")).collect(),
            Err(e) => vec![refused(format!("listing the leader's Pods: {e}"))],
        };
        let mut members = Vec::new();
        let mut by_group: BTreeMap<usize, Vec<Pod>> = BTreeMap::new();
        for m in &plan.members {
            if let std::collections::btree_map::Entry::Vacant(slot) = by_group.entry(m.group) {
                slot.insert(
                    self.pods(&plan.backend, &format!("member-{}", m.group))
                        .await
                        .unwrap_or_default(),
                );
            }
            let pod = by_group[&m.group]
                .iter()
                .find(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(m.node.as_str()));
            members.push((
                m.clone(),
                pod.map(|p| observe::workload(p, "member")).unwrap_or_default(),
            ));
        }
        // The Deployment as applied carries its status: no second read.
        let rollout = Some(match leader_deployment.as_ref().and_then(as_deployment) {
            Some(d) => rollout::rollout_of(&d),
            None => super::Rollout {
                unreadable: Some("the leader Deployment does not exist".into()),
                ..super::Rollout::default()
            },
        });
        StoreObservation {
            client_endpoint: Some(render::leader_address(plan, &self.opts.namespace)),
            leaders,
            lease,
            members,
            rollout,
        }
    }

    async fn remove_store(&self, backend: &str) -> bool {
        let selector = format!(
            "app.kubernetes.io/instance={backend},{}=kvcachebackends",
            render::TYPE_LABEL
        );
        let mut left = false;
        for kind in REMOVAL_ORDER {
            let Some(r) = resource(kind) else { continue };
            let api = self.api(&r);
            let listed = match api.list(&ListParams::default().labels(&selector)).await {
                Ok(l) => l.items,
                Err(e) => {
                    tracing::warn!(backend, "listing {kind}s to remove: {e}");
                    left = true;
                    continue;
                }
            };
            // Only what carries this backend's note is ours, whatever its labels say.
            for object in listed.iter().filter(|o| owned_by(o, backend)) {
                left = true;
                let name = object.metadata.name.clone().unwrap_or_default();
                if object.metadata.deletion_timestamp.is_none()
                    && let Err(e) = api.delete(&name, &DeleteParams::background()).await
                {
                    tracing::warn!(backend, "deleting {kind} {name}: {e}");
                }
            }
        }
        // its keys in the store's Secrets go once its workloads are gone
        if !left && let Err(e) = self.remove_secrets(backend).await {
            tracing::warn!(backend, "{e}");
            left = true;
        }
        !left
    }

    async fn ensure_replicas(&self, plan: &ReplicaPlan) -> Vec<ReplicaObservation> {
        let (namespace, deployment) = plan.owner.split_once('/').unwrap_or(("default", plan.owner.as_str()));
        let api = Api::<Pod>::namespaced(self.client.clone(), namespace);
        let entered = match self.tenants.enter(namespace).await {
            Ok(tenant_namespaces::Entered::Yes) => Ok(()),
            Ok(tenant_namespaces::Entered::NoSuchNamespace) => {
                Err(format!("the namespace {namespace} does not exist; create it"))
            }
            Err(why) => Err(why),
        };
        if let Err(why) = entered {
            return plan
                .replicas
                .iter()
                .map(|r| ReplicaObservation {
                    name: r.name.clone(),
                    role: r.role.clone(),
                    state: refused(why.clone()),
                    cache: None,
                    runs: None,
                })
                .collect();
        }
        let mut out = Vec::new();
        let mut replaced_roles: Vec<String> = Vec::new();
        for r in &plan.replicas {
            let observation = |state: WorkloadState| ReplicaObservation {
                name: r.name.clone(),
                role: r.role.clone(),
                state,
                cache: None,
                runs: None,
            };
            let image = match &r.engine.image {
                Ok(i) => i.clone(),
                Err(why) => {
                    out.push(observation(refused(why.clone())));
                    continue;
                }
            };
            let desired = engine_pod::engine_pod(plan, r, &image);
            let name = desired["metadata"]["name"].as_str().unwrap_or_default().to_owned();
            let live = match api.get_opt(&name).await {
                Ok(l) => l,
                Err(e) => {
                    self.tenants.forget_if_forbidden(namespace, &e);
                    out.push(observation(refused(format!("reading Pod {namespace}/{name}: {e}"))));
                    continue;
                }
            };
            let state = match live {
                Some(p) if !runs_for(&p, deployment) => refused(format!(
                    "Pod {namespace}/{name} exists and is not this deployment's (no annotation {}={deployment}); rename or remove it",
                    engine_pod::DEPLOYMENT_NOTE
                )),
                Some(p) => {
                    let hash = p
                        .metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(engine_pod::SPEC_HASH))
                        .cloned();
                    let outdated =
                        hash.as_deref() != desired["metadata"]["annotations"][engine_pod::SPEC_HASH].as_str();
                    // Pods cannot be updated: an outdated one is replaced, one per role per pass,
                    // and not while the rollout is held (the cache did not resolve this pass).
                    if outdated
                        && !plan.hold_rollout
                        && p.metadata.deletion_timestamp.is_none()
                        && !replaced_roles.contains(&r.role)
                    {
                        replaced_roles.push(r.role.clone());
                        if let Err(e) = api.delete(&name, &DeleteParams::default()).await {
                            tracing::warn!(pod = %name, "replacing an outdated engine Pod: {e}");
                        }
                    }
                    observe::workload(&p, "engine")
                }
                None => {
                    let params = PatchParams::apply(FIELD_MANAGER).force();
                    match api.patch(&name, &params, &Patch::Apply(&desired)).await {
                        Ok(p) => observe::workload(&p, "engine"),
                        Err(e) => refused(format!("creating Pod {namespace}/{name}: {e}")),
                    }
                }
            };
            out.push(observation(state));
        }
        // Replicas no longer planned (a scale-down, a removed role) go, if they are ours.
        let planned: Vec<String> = plan
            .replicas
            .iter()
            .map(|r| format!("{deployment}-{}", r.name))
            .collect();
        let selector = engine_selector(deployment);
        if let Ok(list) = api.list(&ListParams::default().labels(&selector)).await {
            for p in list.items {
                let name = p.metadata.name.clone().unwrap_or_default();
                let ours = runs_for(&p, deployment);
                if ours && !planned.contains(&name) && p.metadata.deletion_timestamp.is_none() {
                    let _ = api.delete(&name, &DeleteParams::default()).await;
                }
            }
        }
        out
    }

    async fn remove_replicas(&self, owner: &str) -> bool {
        let (namespace, deployment) = owner.split_once('/').unwrap_or(("default", owner));
        let api = Api::<Pod>::namespaced(self.client.clone(), namespace);
        let selector = engine_selector(deployment);
        match self.tenants.enter(namespace).await {
            Ok(tenant_namespaces::Entered::Yes) => {}
            // Nothing can run in a namespace that does not exist.
            Ok(tenant_namespaces::Entered::NoSuchNamespace) => return true,
            Err(why) => {
                tracing::warn!(deployment = owner, "{why}");
                return false;
            }
        }
        let list = match api.list(&ListParams::default().labels(&selector)).await {
            Ok(l) => l,
            Err(e) => {
                self.tenants.forget_if_forbidden(namespace, &e);
                return false;
            }
        };
        let mut left = false;
        for p in list.items {
            let ours = runs_for(&p, deployment);
            if !ours {
                continue;
            }
            left = true;
            if p.metadata.deletion_timestamp.is_none() {
                let _ = api
                    .delete(&p.metadata.name.unwrap_or_default(), &DeleteParams::default())
                    .await;
            }
        }
        !left
    }

    async fn shutdown(&self) {
        // The cluster's workloads outlive this server: nothing is stopped.
    }
}
