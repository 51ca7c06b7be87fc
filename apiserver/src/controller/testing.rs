//! What a test needs to run a controller's reconcile with no process: the API in this process on
//! a temporary embedded storage (`App::in_process`), a store leader served in this process on
//! loopback, and [`FakeRuntime`], which starts nothing, keeps what it was asked to run, and
//! reports every workload running and ready (a deployment's router too, at
//! `http://<namespace>.<name>-router.fake:8000`).

use std::sync::Arc;

use async_trait::async_trait;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use kvcache_api::{KVCacheBackend, KVCachePool, KVCachePoolBinding, ModelDeployment};
use kvcache_store::leader::{Leader, LeaderConfig, LeaderListeners};
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use super::{Context, Options};
use crate::app::{App, AppOptions};
use crate::auth::User;
use crate::runtime::credentials::{FileKeeper, Keeper};
use crate::runtime::{
    Changed, Node, ReplicaObservation, ReplicaPlan, RouterObservation, Runtime, Secrets, StoreObservation, StorePlan,
    WorkloadState,
};

/// A runtime that runs nothing: every plan is kept, and every workload it names is reported
/// running and ready; the store's address is the harness's leader.
#[derive(Debug)]
pub struct FakeRuntime {
    keeper: FileKeeper,
    changes: tokio::sync::broadcast::Sender<Changed>,
    leader: String,
    pub store_plans: Mutex<Vec<StorePlan>>,
    pub replica_plans: Mutex<Vec<ReplicaPlan>>,
    pub removed: Mutex<Vec<String>>,
}

fn ready() -> WorkloadState {
    WorkloadState {
        running: true,
        ready: true,
        started: Some(std::time::SystemTime::now()),
        ready_since: Some(std::time::SystemTime::now()),
        ..WorkloadState::default()
    }
}

impl Secrets for FakeRuntime {
    fn credentials(&self) -> &dyn Keeper {
        &self.keeper
    }
}

#[async_trait]
impl Runtime for FakeRuntime {
    fn nodes(&self) -> Vec<Node> {
        vec![Node::stand_in("node-0")]
    }

    fn lease_namespace(&self) -> &str {
        "kvcache-system"
    }

    async fn credential_in_use(&self, _namespace: &str, _fingerprint: &str) -> Result<bool, String> {
        Ok(false)
    }

    fn changes(&self) -> tokio::sync::broadcast::Receiver<Changed> {
        self.changes.subscribe()
    }

    async fn ensure_store(&self, plan: &StorePlan) -> StoreObservation {
        self.store_plans.lock().push(plan.clone());
        StoreObservation {
            client_endpoint: Some(self.leader.clone()),
            leaders: vec![ready()],
            lease: None,
            members: plan.members.iter().map(|m| (m.clone(), ready())).collect(),
            rollout: None,
            tier_survey: None,
        }
    }

    async fn remove_store(&self, backend: &str) -> bool {
        self.removed.lock().push(backend.to_owned());
        true
    }

    async fn ensure_replicas(&self, plan: &ReplicaPlan) -> Vec<ReplicaObservation> {
        self.replica_plans.lock().push(plan.clone());
        plan.replicas
            .iter()
            .map(|r| ReplicaObservation {
                name: r.name.clone(),
                role: r.role.clone(),
                state: ready(),
                cache: None,
                runs: None,
                url: None,
                events: None,
            })
            .collect()
    }

    async fn ensure_router(&self, plan: &ReplicaPlan, _replicas: &[ReplicaObservation]) -> Option<RouterObservation> {
        let r = plan.router.as_ref()?;
        Some(RouterObservation {
            replicas: r.replicas,
            ready: r.replicas,
            url: Some(format!("http://{}-router.fake:8000", plan.owner.replace('/', "."))),
            state: ready(),
        })
    }

    async fn remove_replicas(&self, owner: &str) -> bool {
        self.removed.lock().push(owner.to_owned());
        true
    }

    async fn shutdown(&self) {}
}

/// The API, a leader and the fake runtime, with a client for each side.
pub struct Harness {
    /// what every reconcile gets (its client acts as the controllers)
    pub ctx: Arc<Context>,
    pub runtime: Arc<FakeRuntime>,
    /// the store's leader, to read its ledger
    pub leader: Leader,
    /// a cluster administrator, for what users write
    pub admin: Client,
    _app: App,
    stop: CancellationToken,
    _dir: tempfile::TempDir,
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Harness {
    pub async fn start() -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let app = App::build(AppOptions::new(dir.path())).unwrap();
        let cfg = LeaderConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            ..LeaderConfig::default()
        };
        let leader = Leader::new(cfg.clone()).unwrap();
        let listeners = LeaderListeners::bind(&cfg).await.unwrap();
        let address = listeners.addrs().grpc.to_string();
        let stop = CancellationToken::new();
        tokio::spawn(leader.clone().serve(
            listeners,
            prometheus_client::registry::Registry::default(),
            stop.clone(),
        ));
        let runtime = Arc::new(FakeRuntime {
            keeper: FileKeeper::new(dir.path()),
            changes: tokio::sync::broadcast::channel(16).0,
            leader: address,
            store_plans: Mutex::default(),
            replica_plans: Mutex::default(),
            removed: Mutex::default(),
        });
        let ctx = Arc::new(app.controller_context(runtime.clone(), runtime.clone(), Options::default()));
        let admin = User::new("kvcache-admin", &["system:masters", "system:authenticated"]);
        Harness {
            ctx,
            runtime,
            leader,
            admin: Client::new(app.in_process(admin), "default"),
            _app: app,
            stop,
            _dir: dir,
        }
    }

    /// Mounts a member of `capacity` bytes at the leader (its registration alone: nothing holds
    /// bytes, and it stays mounted for the member TTL, longer than a test).
    pub fn mount_member(&self, capacity: u64) {
        let req = kvcache_store::proto::MountRequest {
            name: "node-0".into(),
            data_addr: "127.0.0.1:9".into(),
            grpc_addr: "127.0.0.1:9".into(),
            capacity,
            ..Default::default()
        };
        self.leader.with(|s| s.mount(&req, std::time::Instant::now())).unwrap();
    }

    /// Where the leader serves gRPC.
    pub fn leader_address(&self) -> String {
        self.runtime.leader.clone()
    }

    fn api<K: Stored>(&self, namespace: Option<&str>) -> Api<K> {
        K::api(self.admin.clone(), namespace)
    }

    /// Creates each object of a manifest (documents separated by `---`), as the administrator.
    pub async fn create(&self, manifest: &str) {
        for doc in manifest.split("\n---\n") {
            let v: serde_json::Value = yaml_serde::from_str(doc).unwrap();
            let ns = v["metadata"]["namespace"].as_str().map(str::to_owned);
            let ns = ns.as_deref();
            let pp = PostParams::default();
            match v["kind"].as_str().unwrap_or_default() {
                "KVCacheBackend" => drop(self.api::<KVCacheBackend>(ns).create(&pp, &from(v)).await.unwrap()),
                "KVCachePool" => drop(self.api::<KVCachePool>(ns).create(&pp, &from(v)).await.unwrap()),
                "KVCachePoolBinding" => drop(self.api::<KVCachePoolBinding>(ns).create(&pp, &from(v)).await.unwrap()),
                "ModelDeployment" => drop(self.api::<ModelDeployment>(ns).create(&pp, &from(v)).await.unwrap()),
                other => panic!("no kind {other:?} here"),
            }
        }
    }

    /// The object as stored now, for a pass.
    pub async fn get<K: Stored>(&self, namespace: Option<&str>, name: &str) -> Option<Arc<K>> {
        self.api::<K>(namespace).get_opt(name).await.unwrap().map(Arc::new)
    }

    /// Deletes an object, as the administrator (a finalizer holds it until its release).
    pub async fn delete<K: Stored>(&self, namespace: Option<&str>, name: &str) {
        self.api::<K>(namespace)
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }
}

/// One of our kinds, with the API of its scope.
pub trait Stored: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug {
    fn api(client: Client, namespace: Option<&str>) -> Api<Self>;
}

impl Stored for KVCacheBackend {
    fn api(client: Client, _: Option<&str>) -> Api<Self> {
        Api::all(client)
    }
}

impl Stored for KVCachePool {
    fn api(client: Client, _: Option<&str>) -> Api<Self> {
        Api::all(client)
    }
}

impl Stored for KVCachePoolBinding {
    fn api(client: Client, namespace: Option<&str>) -> Api<Self> {
        Api::namespaced(client, namespace.unwrap_or("default"))
    }
}

impl Stored for ModelDeployment {
    fn api(client: Client, namespace: Option<&str>) -> Api<Self> {
        Api::namespaced(client, namespace.unwrap_or("default"))
    }
}

/// `status|reason|message` of the condition `t`, empty when absent: what the controller tests
/// compare.
pub fn condition(
    conds: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    t: kvcache_api::conditions::ConditionType,
) -> String {
    kvcache_api::conditions::find(conds, t)
        .map(|c| format!("{}|{}|{}", c.status, c.reason, c.message))
        .unwrap_or_default()
}

/// `phase|message` of a status.
pub fn phase(phase: Option<&str>, message: Option<&str>) -> String {
    format!("{}|{}", phase.unwrap_or_default(), message.unwrap_or_default())
}

fn from<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).unwrap()
}
