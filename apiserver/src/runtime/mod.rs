//! Where the store's processes and the engine replicas run: the [`Runtime`] trait the controllers
//! drive, the plans they hand it (what should run) and the observations it returns (what runs).
//!
//! A plan says *what* should run in the runtime's own neutral terms: a leader with its
//! `LeaderConfig`, a member per node and group with its `MemberConfig`, replicas with the
//! environment injection computed. The runtime decides *how*: [`local`] runs child processes on
//! this machine; a Kubernetes runtime renders workloads. Controllers never see processes or Pods,
//! only [`WorkloadState`]s.

pub mod credentials;
pub mod kubernetes;
pub mod local;
pub mod store_tls;
pub mod tokens;

use std::collections::BTreeMap;
use std::time::SystemTime;

use async_trait::async_trait;
use kvcache_store::leader::LeaderConfig;
use kvcache_store::member::MemberConfig;

/// A node workloads may be placed on, with its labels (`kubernetes.io/hostname`, ...).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    pub name: String,
    pub labels: BTreeMap<String, String>,
}

impl Node {
    /// A stand-in node labelled as kubelet labels a Linux node.
    pub fn stand_in(name: &str) -> Node {
        let labels = BTreeMap::from([
            ("kubernetes.io/hostname".to_owned(), name.to_owned()),
            ("kubernetes.io/os".to_owned(), "linux".to_owned()),
        ]);
        Node {
            name: name.to_owned(),
            labels,
        }
    }

    /// Whether every label of `selector` is on this node (an empty selector matches every node).
    pub fn matches(&self, selector: &BTreeMap<String, String>) -> bool {
        selector.iter().all(|(k, v)| self.labels.get(k) == Some(v))
    }
}

/// What should run for one backend: its leader and one member per (group, node).
#[derive(Clone, Debug, PartialEq)]
pub struct StorePlan {
    /// The backend's name.
    pub backend: String,
    /// The backend's UID, for owner references.
    pub uid: String,
    /// The backend's image (`spec.image`); `None` runs the setting `kv-cache-backend-image`.
    pub image: Option<String>,
    /// `spec.imagePullPolicy`, as written.
    pub pull_policy: Option<String>,
    /// `spec.imagePullSecrets` names.
    pub pull_secrets: Vec<String>,
    /// The backend is being deleted but still in use: converge what runs, create nothing new,
    /// so a pass racing the removal cannot bring a workload back.
    pub existing_only: bool,
    /// The leader's flags; the runtime chooses the addresses it listens on.
    pub leader: LeaderConfig,
    /// Extra environment of the leader (`leader.extraEnv`).
    pub leader_env: Vec<(String, String)>,
    pub members: Vec<MemberPlan>,
    /// The member groups as declared: a runtime that places members itself (a DaemonSet per
    /// group in a cluster) renders these; one that runs each member renders `members`.
    pub groups: Vec<GroupPlan>,
    /// How many leaders run and how the serving one is chosen; `None`: one leader, no election.
    pub election: Option<ElectionPlan>,
    /// The namespaces of the Bindings on the backend's pools: only their engines may reach the
    /// store (a cluster's NetworkPolicy).
    pub tenant_namespaces: std::collections::BTreeSet<String>,
    /// a group's disk tier says `cleanAfterDelete`: the runtime empties the members' tiers when
    /// the backend goes
    pub clean_tiers_after_delete: bool,
}

/// One member group: where its members go and the flags each of them runs with (the runtime
/// fills in the leader's address, the listen addresses and the member's name).
#[derive(Clone, Debug, PartialEq)]
pub struct GroupPlan {
    pub index: usize,
    pub node_selector: BTreeMap<String, String>,
    pub config: MemberConfig,
    pub env: Vec<(String, String)>,
    /// The group's own image (`members[i].image`), else the backend's.
    pub image: Option<String>,
}

/// Leaders elected through a Lease: one serves, the others stand by (not ready).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ElectionPlan {
    /// Leader processes (Pods), 1 to 5.
    pub replicas: u32,
    /// The Lease's name (`<backend>-leader`); the runtime chooses its namespace.
    pub lease: String,
    /// Members read the holder from the Lease (`memberAddressing: Lease`) instead of reaching
    /// the leaders through one stable address (`Service`).
    pub members_follow_lease: bool,
}

/// One member: the group it belongs to, the node it runs on, its flags (the runtime fills in the
/// leader's address and the listen addresses).
#[derive(Clone, Debug, PartialEq)]
pub struct MemberPlan {
    pub group: usize,
    pub node: String,
    pub config: MemberConfig,
    /// Extra environment (the group's `extraEnv`).
    pub env: Vec<(String, String)>,
}

impl MemberPlan {
    /// The member's stable name, as the leader lists it: unique per backend, naming its node.
    pub fn name(&self, backend: &str) -> String {
        format!("{backend}-member-{}-{}", self.group, self.node)
    }
}

/// What runs for one backend.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StoreObservation {
    /// The address engines and controllers reach the leader at, HOST:PORT; stable across leader
    /// restarts.
    pub client_endpoint: Option<String>,
    /// One per leader replica, in order.
    pub leaders: Vec<WorkloadState>,
    /// Where the election's Lease is (`namespace`, `name`), when the plan elects.
    pub lease: Option<(String, String)>,
    /// One per member of the plan, in its order.
    pub members: Vec<(MemberPlan, WorkloadState)>,
    /// The leaders' rollout as their workload controller reports it (a Deployment in a cluster);
    /// `None` where the runtime rolls leaders itself.
    pub rollout: Option<Rollout>,
    /// What the members' disk tiers held before their members first opened them (`None`: the
    /// plan has no tier, or the runtime does not survey them)
    pub tier_survey: Option<TierSurvey>,
}

/// What the disk tiers of a backend's members held before their first member opened them, for
/// `TierWasEmpty`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TierSurvey {
    /// How many members with a tier the plan runs (or, in a cluster, their DaemonSets schedule).
    pub expected: usize,
    /// One reading per member surveyed: its node, the entries its tier held (-1: unreadable),
    /// and when its instance was created (only the first weeks of a backend are believed).
    pub readings: Vec<(String, i64, Option<SystemTime>)>,
}

/// A Deployment's account of its rollout.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rollout {
    /// Whether it observed its latest spec (`observedGeneration >= generation`).
    pub observed: bool,
    /// `spec.replicas`, `status.replicas` and `status.updatedReplicas`.
    pub spec_replicas: i32,
    pub replicas: i32,
    pub updated: i32,
    /// Why it could not be read.
    pub unreadable: Option<String>,
}

impl Rollout {
    /// Every replica it asks for runs its current template.
    pub fn finished(&self) -> bool {
        self.observed && self.updated == self.spec_replicas && self.replicas == self.spec_replicas
    }
}

impl StoreObservation {
    /// The leaders as one workload: the serving one when one is ready, else the first; with
    /// restarts summed and the latest exit.
    pub fn leader(&self) -> WorkloadState {
        let mut one = self
            .leaders
            .iter()
            .find(|l| l.ready)
            .or_else(|| self.leaders.first())
            .cloned()
            .unwrap_or_default();
        one.running = self.leaders.iter().any(|l| l.running);
        one.restarts = self.leaders.iter().map(|l| l.restarts).sum();
        if !one.ready {
            one.last_exit = self
                .leaders
                .iter()
                .filter_map(|l| l.last_exit.clone())
                .max_by_key(|e| e.at);
        }
        one
    }

    /// Leader replicas that are ready (serving).
    pub fn ready_leaders(&self) -> usize {
        self.leaders.iter().filter(|l| l.ready).count()
    }
}

/// What should run for one ModelDeployment: its replicas, each with exactly the environment
/// injection computed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaPlan {
    /// `<namespace>/<name>` of the deployment.
    pub owner: String,
    /// The deployment's UID, for owner references.
    pub uid: String,
    pub replicas: Vec<Replica>,
    /// Keep replicas, and the router, that run with another environment instead of rolling them
    /// (the cache connection did not resolve in this pass; new replicas are still started).
    pub hold_rollout: bool,
    /// The router in front of the replicas (`spec.router`); `None`: no router runs (one that ran
    /// is stopped).
    pub router: Option<RouterPlan>,
}

/// The router in front of a deployment's roles, `kv-router`: what the spec says of it. The
/// runtime adds where it listens (`--listen`) and where its workers come from
/// (`--workers-file` on one machine, `--workers-dns` per role in a cluster).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouterPlan {
    /// `spec.router.name` (`kvcache-router`).
    pub name: String,
    /// `spec.router.replicas`.
    pub replicas: i32,
    /// `spec.router.image`, else the store's image setting (which ships `kv-router`); or why
    /// none can be chosen.
    pub image: Result<String, String>,
    pub pull_policy: Option<String>,
    pub pull_secrets: Vec<String>,
    /// The flags from the spec: `--model`, `--request-timeout-seconds`,
    /// `--disaggregation-threshold-tokens` when set, `--engine-events-ports` for vLLM replicas,
    /// then `extraArgs`.
    pub args: Vec<String>,
    /// Each role it sends requests to, in spec order.
    pub roles: Vec<RouterRole>,
    /// The store it follows to skip prefill for what the store holds (`KVSTORE_LEADER`,
    /// `KVSTORE_TENANT`, `KVSTORE_BLOCK_SIZE`, `KVSTORE_DTYPE` and, where the store serves TLS,
    /// its CA and name), as the deployment's replicas of our store receive it; empty without a
    /// cache or with a store of the reference's protocol, which has no block events.
    pub store_env: Vec<(String, String)>,
    /// The tenant credential it shows the store, the replicas' ([`credentials::ENV`]).
    pub credential: Option<credentials::ReplicaCredential>,
}

/// One role behind the router.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouterRole {
    pub role: String,
    pub kind: kvcache_api::model_deployment::RoleKind,
    /// The engines' serving port (a cluster's headless Service publishes it).
    pub port: u16,
}

/// The worker set name of a role kind on `kv-router`'s command line and in its workers file.
pub fn worker_kind(kind: kvcache_api::model_deployment::RoleKind) -> &'static str {
    use kvcache_api::model_deployment::RoleKind;
    match kind {
        RoleKind::Server => "server",
        RoleKind::Prefill => "prefill",
        RoleKind::Decode => "decode",
    }
}

/// What runs of a deployment's router.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RouterObservation {
    /// Router replicas that run (on one machine one process, whatever the spec asks).
    pub replicas: i32,
    /// Of those, ready ones: they answer `GET /health` (which needs a healthy decode or server
    /// worker behind them).
    pub ready: i32,
    /// Where clients reach it: `http://127.0.0.1:<port>`, or the router Service's URL.
    pub url: Option<String>,
    /// The one process's state, or the first fault among the Pods (refused, waiting, last exit).
    pub state: WorkloadState,
}

/// One engine replica.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replica {
    /// `<role>-<ordinal>`.
    pub name: String,
    pub role: String,
    /// The whole environment the engine receives.
    pub env: Vec<(String, String)>,
    /// Arguments for the engine (its connector flags); the local engine simulator ignores them.
    pub args: Vec<String>,
    /// The tenant credential the engine proves its tenant with ([`credentials::ENV`]): kept
    /// apart from `env` so that a cluster references its Secret instead of copying the value.
    pub credential: Option<credentials::ReplicaCredential>,
    /// A client configuration file the engine reads (vLLM on the reference's store), whose path
    /// the environment names.
    pub client_config: Option<String>,
    /// The image carrying our `kvcache` package, copied next to the engine (a cluster's init
    /// container; the local runtime uses its own copy); `PYTHONPATH` in `env` names it.
    pub package_image: Option<String>,
    /// The engine container a cluster runs for this replica (the local runtime runs the engine
    /// simulator instead).
    pub engine: EngineContainer,
}

/// The real engine's container: its image, command line and resources.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineContainer {
    /// The image, or why none can be chosen.
    pub image: Result<String, String>,
    pub pull_policy: Option<String>,
    pub pull_secrets: Vec<String>,
    /// The engine's base command (`vllm serve`, `python3 -m sglang.launch_server`).
    pub command: Vec<String>,
    /// Everything after the command: the model, the injected connector flags, the role's
    /// `extraArgs`, `--host`/`--port` unless the role set them.
    pub args: Vec<String>,
    /// The role's own environment, after the injected one.
    pub env: Vec<(String, String)>,
    /// Variables set from the Pod's IP (SGLang's `MOONCAKE_LOCAL_HOSTNAME`).
    pub pod_ip_env: Vec<String>,
    /// The serving port; the probes ask `GET /health` there.
    pub port: u16,
    /// Device-plugin resources (`nvidia.com/gpu: 1`).
    pub limits: BTreeMap<String, String>,
    pub grace_seconds: i64,
}

/// Where a routed vLLM replica publishes its KV events in a cluster (`--kv-events-config`'s
/// `endpoint` and `replay_endpoint` on every interface of its Pod); the router follows them at
/// each Pod's address (`kv-router --engine-events-ports`).
pub const ENGINE_EVENTS_PORT: u16 = 5557;
pub const ENGINE_REPLAY_PORT: u16 = 5558;
/// vLLM's flag of its KV event publisher.
pub const KV_EVENTS_FLAG: &str = "--kv-events-config";

/// Where a replica publishes its KV events, when the runtime serves it at addresses of its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventEndpoints {
    /// the `PUB` socket (`ipc:///path` on one machine)
    pub events: String,
    /// the replay socket
    pub replay: String,
}

/// What runs of one replica, and the last account it gave of its cache.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReplicaObservation {
    pub name: String,
    pub role: String,
    pub state: WorkloadState,
    /// The engine's latest report of its cache use, once it gave one.
    pub cache: Option<CacheReport>,
    /// What runs, where the runtime chooses (the local runtime: the real engine and its address,
    /// or why the simulator runs instead).
    pub runs: Option<String>,
    /// Where the replica answers, when the runtime serves it at an address of its own (the
    /// local runtime: `http://127.0.0.1:<port>`); `None` in a cluster, where no Service fronts
    /// the replicas yet.
    pub url: Option<String>,
    /// Where the replica publishes its KV events, when the runtime chose it (the local runtime).
    pub events: Option<EventEndpoints>,
}

/// An engine's account of one round of requests.
#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
pub struct CacheReport {
    pub blocks: u64,
    pub hits: u64,
    pub stored: u64,
    pub hit_rate: f64,
}

/// The state of one supervised workload (a process here, a Pod in a cluster).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WorkloadState {
    /// Runs now.
    pub running: bool,
    /// Ready to serve (for the store: listening; for an engine: it served a round).
    pub ready: bool,
    /// Restarts since the runtime first started it.
    pub restarts: u32,
    /// When the current (or last) instance started.
    pub started: Option<SystemTime>,
    /// Since when the current instance is ready (for a leader: since it serves, with an empty
    /// cache).
    pub ready_since: Option<SystemTime>,
    /// Why the last instance ended, if one did.
    pub last_exit: Option<Exit>,
    /// Why it cannot be started at all (for example not enough memory on the machine).
    pub refused: Option<String>,
    /// Why it does not run now while it should, as the runtime names it (a kubelet's waiting
    /// reason such as `ImagePullBackOff` or `CrashLoopBackOff`, with its message).
    pub waiting: Option<(String, String)>,
}

/// How an instance ended: its exit code or signal and the last lines it logged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exit {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub log_tail: String,
    pub at: SystemTime,
}

impl Exit {
    /// `exit code 1` or `killed by signal 9`, then the log lines.
    pub fn describe(&self) -> String {
        let how = match (self.code, self.signal) {
            (Some(c), _) => format!("exit code {c}"),
            (None, Some(s)) => format!("killed by signal {s}"),
            (None, None) => "ended".to_owned(),
        };
        if self.log_tail.is_empty() {
            how
        } else {
            format!("{how}; last log lines: {}", self.log_tail)
        }
    }
}

/// Where the vLLM client configuration file of the reference's store is mounted in a Pod.
pub const VLLM_CONFIG_PATH: &str = "/etc/gpustack/kvcache/mooncake.json";
/// Where the store's image carries the `kvcache` Python package, and where an engine container
/// finds its copy (`PYTHONPATH`).
pub const PACKAGE_DIR: &str = "/opt/kvcache/python";

/// Whose workloads changed (a process started, became ready, reported or ended): the
/// controllers look again at once rather than at their next requeue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Changed {
    /// A backend's leader or members.
    Store(String),
    /// A deployment's replicas (`<namespace>/<name>`).
    Replicas(String),
}

/// What a runtime keeps outside the API for the store and its tenants: each backend's token for
/// its leaders' Control API, and each Binding's tenant credentials. Apart from [`Runtime`] (the
/// workloads), so that a controller reading a credential needs nothing that runs processes.
pub trait Secrets: Send + Sync + std::fmt::Debug {
    /// The token the controllers show `backend`'s leaders' Control API, when this runtime starts
    /// them with one (one per backend: a token read from one backend's Pods opens no other's).
    fn control_token(&self, _backend: &str) -> Option<String> {
        None
    }

    /// Where the tenant credentials of Bindings are kept (never in the API).
    fn credentials(&self) -> &dyn credentials::Keeper;

    /// What dials the leaders and members of the managed backend `backend`, when this runtime
    /// runs them with TLS (`store_tls.rs`); `Ok(None)`: plaintext; an error: not known yet.
    fn store_tls(&self, _backend: &str) -> Result<Option<kvcache_store::tls::ClientTls>, String> {
        Ok(None)
    }

    /// The store's CA (PEM), which engines trust, when this runtime runs stores with TLS;
    /// an error: not known yet.
    fn store_ca_pem(&self) -> Result<Option<String>, String> {
        Ok(None)
    }
}

/// Where the controllers' workloads run: the store's processes and the engine replicas.
#[async_trait]
pub trait Runtime: Send + Sync + std::fmt::Debug {
    /// The nodes member groups are placed on.
    fn nodes(&self) -> Vec<Node>;

    /// The namespace of the backends' election Leases.
    fn lease_namespace(&self) -> &str;

    /// The cluster where the store's Leases and the controllers' Events live, when that is not
    /// this server (a Kubernetes runtime: kube-apiserver serves them); `None` uses this server.
    fn cluster_client(&self) -> Option<kube::Client> {
        None
    }

    /// Whether a replica in `namespace` still runs with the credential of `fingerprint`.
    async fn credential_in_use(&self, namespace: &str, fingerprint: &str) -> Result<bool, String>;

    /// Changes to the workloads, as they happen.
    fn changes(&self) -> tokio::sync::broadcast::Receiver<Changed>;

    /// Converges the backend's workloads to `plan` (starts what is missing, rolls what changed,
    /// stops what is no longer planned) and reports what runs.
    async fn ensure_store(&self, plan: &StorePlan) -> StoreObservation;

    /// Stops every workload of the backend; `true` once nothing of it is left.
    async fn remove_store(&self, backend: &str) -> bool;

    /// Converges a deployment's replicas to `plan` and reports them, in the plan's order.
    async fn ensure_replicas(&self, plan: &ReplicaPlan) -> Vec<ReplicaObservation>;

    /// Converges a deployment's router to `plan.router` (stops it when `None`), handing it the
    /// workers `replicas` reports (the replicas' last observation), and reports it; `None` when
    /// no router is planned.
    async fn ensure_router(&self, plan: &ReplicaPlan, replicas: &[ReplicaObservation]) -> Option<RouterObservation>;

    /// Stops every replica of `owner`, and its router; `true` once none is left.
    async fn remove_replicas(&self, owner: &str) -> bool;

    /// Stops everything (server shutdown).
    async fn shutdown(&self);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_match_stand_in_labels() {
        let n = Node::stand_in("local-1");
        assert!(n.matches(&BTreeMap::new()));
        assert!(n.matches(&BTreeMap::from([("kubernetes.io/os".into(), "linux".into())])));
        assert!(!n.matches(&BTreeMap::from([("kubernetes.io/hostname".into(), "local-0".into())])));
    }

    #[test]
    fn an_exit_names_its_code_or_signal_and_the_log() {
        let at = SystemTime::UNIX_EPOCH;
        let e = Exit {
            code: Some(1),
            signal: None,
            log_tail: "boom".into(),
            at,
        };
        assert_eq!(e.describe(), "exit code 1; last log lines: boom");
        let k = Exit {
            code: None,
            signal: Some(9),
            log_tail: String::new(),
            at,
        };
        assert_eq!(k.describe(), "killed by signal 9");
    }
}
