//! The Kubernetes runtime: the store's leader and members, and the engine replicas, as workloads
//! of a cluster. Objects are server-side applied under one field manager and are this runtime's
//! only when they carry the owner's note; what runs is read from the Pods the cluster reports.
//!
//! | module | owns |
//! |---|---|
//! | [`render`] | a backend's plan as Kubernetes objects (Deployment, Service, DaemonSets, RBAC) |
//! | [`store`] | a backend's objects applied, its Pods read back, its removal |
//! | [`engine_pod`] | a ModelDeployment's replicas as engine Pods |
//! | [`replicas`] | those Pods created, replaced and deleted |
//! | [`router`] | a deployment's router: its Deployment, Service and per-role headless Services |
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
mod replicas;
mod rollout;
pub mod router;
mod store;
pub mod store_target;
pub mod tenant_namespaces;
pub mod tls_secrets;
pub mod token_secrets;

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Node as KubeNode, Pod};
use kube::api::Api;
use kube::runtime::watcher;
use parking_lot::RwLock;

use super::{
    Changed, Node, ReplicaObservation, ReplicaPlan, RouterObservation, Runtime, StoreObservation, StorePlan,
    WorkloadState,
};

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
        self.converge_store(plan).await
    }

    async fn remove_store(&self, backend: &str) -> bool {
        self.remove_store_now(backend).await
    }

    async fn ensure_replicas(&self, plan: &ReplicaPlan) -> Vec<ReplicaObservation> {
        self.converge_replicas(plan).await
    }

    async fn ensure_router(&self, plan: &ReplicaPlan, _replicas: &[ReplicaObservation]) -> Option<RouterObservation> {
        // the router finds its workers through the roles' headless Services itself
        self.converge_router(plan).await
    }

    async fn remove_replicas(&self, owner: &str) -> bool {
        let pods_gone = self.remove_replicas_now(owner).await;
        let (namespace, deployment) = owner.split_once('/').unwrap_or(("default", owner));
        let router_gone = match self.tenants.enter(namespace).await {
            Ok(tenant_namespaces::Entered::Yes) => self.prune_router(namespace, deployment, &[]).await,
            Ok(tenant_namespaces::Entered::NoSuchNamespace) => true,
            Err(_) => false,
        };
        pods_gone && router_gone
    }

    async fn shutdown(&self) {
        // The cluster's workloads outlive this server: nothing is stopped.
    }
}
