//! The local runtime (`--runtime local`, the default): every store process and engine replica
//! is a child process of the server on this machine, and the "nodes" are stand-ins from the
//! server's configuration.
//!
//! - Front ([`front`]): two loopback ports (gRPC, fast port) per backend that forward to the
//!   serving leader, as the leader Service does in a cluster; kept for the backend's life in
//!   this server (and in `<data-dir>/runtime/<backend>.ports` across server restarts), so the
//!   published Client endpoint survives leader restarts and failovers.
//! - Leaders: `kv-store leader` per replica, each on its own free loopback ports, told to
//!   advertise the front's fast port. With the election on (`electionBackend: Kubernetes`, even
//!   at one replica) each campaigns for the Lease `kvcache-system/<backend>-leader` through this
//!   server's own Lease API, with `<data-dir>/store.kubeconfig`; one serves, the others stand by.
//!   Scaling adds or removes replicas from the end and never restarts the ones that stay.
//! - Members: `kv-store member --name <backend>-member-<group>-<node>` per matching node, given
//!   the front's address (`memberAddressing: Service`) or `k8s://kvcache-system/<backend>-leader`
//!   (`Lease`), with
//!   `--no-prefault` (memory is claimed as it is written). A backend whose members would need more
//!   memory than the machine (or its shared-memory filesystem) has is refused, not started.
//! - Replicas ([`engines`]): `kv-store engine-sim` with exactly the injected environment, or
//!   with `localRuntime.engines: real` the engine's own command (`vllm serve <model>`) on a
//!   loopback port of its own, ready once `GET /health` answers.
//! - Logs: `<data-dir>/logs/<backend>/<process>.log`, and
//!   `<data-dir>/logs/_deployments/<namespace>/<name>/<replica>.log` (`_` is never in a name).
//!
//! The store processes run with `--spin 0`: on a laptop they share cores with everything else.

pub mod engines;
pub mod front;
mod ports;
pub mod process;
mod tls_files;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use kvcache_store::flags::{FastListen, format_size};
use kvcache_store::leader::{Election, LeaderConfig};
use tokio::sync::Mutex;

use self::front::{Endpoint, Front};
use self::ports::free_port;
pub use self::ports::loopback_port;
use self::process::{Hooks, ProcessSpec, Supervised};
use super::{Changed, Node, ReplicaObservation, ReplicaPlan, Runtime, Secrets, StoreObservation, StorePlan};

/// How the local runtime runs.
#[derive(Clone, Debug)]
pub struct LocalOptions {
    pub data_dir: PathBuf,
    /// The `kv-store` binary.
    pub store_binary: PathBuf,
    pub nodes: Vec<Node>,
    /// Time between SIGTERM and SIGKILL.
    pub grace: Duration,
    /// Bytes of memory members may claim in total; `None` reads the machine's (once).
    pub memory_limit: Option<u64>,
    /// Where members map their segments.
    pub shm_dir: PathBuf,
    /// The server's configuration, read at every pass (`localRuntime`: which engines run).
    pub config: crate::config::Live,
    /// The kubeconfig the store's processes reach the Lease API with (`serve` writes it there).
    pub store_kubeconfig: PathBuf,
}

/// Where [`LocalOptions::new`] puts the store's kubeconfig, under the data directory.
pub const STORE_KUBECONFIG: &str = "store.kubeconfig";

impl LocalOptions {
    /// Two stand-in nodes, `local-0` and `local-1`, and the `kv-store` next to this executable.
    pub fn new(data_dir: impl Into<PathBuf>) -> LocalOptions {
        let data_dir: PathBuf = data_dir.into();
        LocalOptions {
            store_kubeconfig: data_dir.join(STORE_KUBECONFIG),
            data_dir,
            store_binary: sibling_binary("kv-store"),
            nodes: vec![Node::stand_in("local-0"), Node::stand_in("local-1")],
            grace: Duration::from_secs(10),
            memory_limit: None,
            shm_dir: PathBuf::from("/dev/shm"),
            config: crate::config::Live::default(),
        }
    }
}

/// `name` in the directory of the running executable (`target/<profile>/` in a build).
pub fn sibling_binary(name: &str) -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join(name)))
        .unwrap_or_else(|| PathBuf::from(name))
}

/// The folder of the store's CA and certificates, under the data directory.
pub const STORE_TLS_DIR: &str = "store-tls";

/// The namespace of the store's election Leases in direct mode.
pub const LEASE_NAMESPACE: &str = "kvcache-system";

#[derive(Debug)]
struct Store {
    front: Front,
    /// Each leader replica's own (gRPC, fast) ports, by index; kept while the store lives so a
    /// replica that stays is never restarted.
    leader_ports: Vec<(SocketAddr, SocketAddr)>,
    leaders: Vec<Supervised>,
    /// Keyed by member name.
    members: HashMap<String, Supervised>,
}

#[derive(Debug, Default)]
struct State {
    stores: HashMap<String, Store>,
    replicas: HashMap<String, HashMap<String, Supervised>>,
    /// The loopback port of each real engine replica (`<owner>/<replica>`), kept while it is
    /// planned so a restart serves at the same address.
    engine_ports: HashMap<String, u16>,
}

/// Child processes on this machine.
#[derive(Debug)]
pub struct LocalRuntime {
    opts: LocalOptions,
    state: Mutex<State>,
    changes: tokio::sync::broadcast::Sender<Changed>,
    /// tenant credentials, in files under the data directory
    credentials: super::credentials::FileKeeper,
    /// the store's CA and each backend's certificate, in files (`tls_files.rs`)
    tls: tls_files::TlsFiles,
}

impl LocalRuntime {
    pub fn new(mut opts: LocalOptions) -> LocalRuntime {
        if opts.memory_limit.is_none() {
            let ram = mem_total().unwrap_or(u64::MAX);
            let shm = rustix::fs::statvfs(&opts.shm_dir)
                .map(|s| s.f_blocks.saturating_mul(s.f_frsize))
                .unwrap_or(u64::MAX);
            opts.memory_limit = Some(ram.min(shm));
        }
        LocalRuntime {
            credentials: super::credentials::FileKeeper::new(&opts.data_dir),
            tls: tls_files::TlsFiles::new(&opts.data_dir.join(STORE_TLS_DIR)),
            opts,
            state: Mutex::new(State::default()),
            changes: tokio::sync::broadcast::channel(256).0,
        }
    }

    fn notify(&self, what: Changed) -> Hooks {
        let tx = self.changes.clone();
        Hooks {
            on_exit: None,
            on_change: Some(std::sync::Arc::new(move || {
                let _ = tx.send(what.clone());
            })),
        }
    }

    /// A member's hooks: when its process ends, the leader drops its mount at once (it would
    /// otherwise keep the capacity until the member TTL ran out, and refuse the restarted member
    /// its name until then).
    fn member_hooks(&self, backend: &str, leader: SocketAddr, name: String) -> Hooks {
        let mut hooks = self.notify(Changed::Store(backend.to_owned()));
        let token = self.control_token(backend);
        let tls = self.store_tls(backend).ok().flatten();
        hooks.on_exit = Some(std::sync::Arc::new(move || {
            let name = name.clone();
            let token = token.clone();
            let tls = tls.clone();
            Box::pin(async move {
                let removed = tokio::time::timeout(Duration::from_secs(2), async {
                    let client = kvcache_store::client::Client::connect_tls(
                        &leader.to_string(),
                        kvcache_store::proto::Scope::default(),
                        tls,
                    )
                    .await
                    .ok()?;
                    let mut ask = tonic::Request::new(kvcache_store::proto::RemoveMemberRequest { name: name.clone() });
                    if let Some(t) = &token {
                        kvcache_store::auth::attach(&mut ask, t).ok()?;
                    }
                    client.control().remove_member(ask).await.ok()
                })
                .await;
                tracing::info!(member = %name, removed = ?removed.ok().flatten().map(|r| r.into_inner().removed), "member process ended; told the leader");
            })
        }));
        hooks
    }

    fn log(&self, parts: &[&str]) -> PathBuf {
        let mut p = self.opts.data_dir.join("logs");
        for part in parts {
            p.push(part);
        }
        p
    }

    fn store_env() -> Vec<(String, String)> {
        std::env::var("RUST_LOG")
            .map(|v| vec![("RUST_LOG".to_owned(), v)])
            .unwrap_or_default()
    }

    /// A replica's environment: what injection gave it, then the role's own `env` (as a Pod's
    /// container gets them, so a role may shape the simulated workload with the `KVSTORE_*`
    /// knobs of `kv-store engine-sim`), the credential last, with the client configuration file
    /// written under the data directory (its path replacing the Pod's mount path).
    fn replica_env(&self, owner: &str, r: &super::Replica) -> Vec<(String, String)> {
        // `engine.env` is the injected environment followed by the role's
        let mut env = r.engine.env.clone();
        if let Some(c) = &r.credential {
            env.push((super::credentials::ENV.to_owned(), c.value.clone()));
        }
        if let Some(cfg) = &r.client_config {
            let path = self
                .opts
                .data_dir
                .join("runtime")
                .join("_deployments")
                .join(owner)
                .join(format!("{}.json", r.name));
            if let Some(dir) = path.parent() {
                let _ = std::fs::create_dir_all(dir);
            }
            let _ = std::fs::write(&path, cfg);
            for (k, v) in env.iter_mut() {
                if k == "MOONCAKE_CONFIG_PATH" {
                    *v = path.display().to_string();
                }
            }
        }
        env
    }

    /// The backend's front: on the remembered ports when they are still free, else on new ones
    /// (remembered from then on).
    fn front(&self, backend: &str) -> std::io::Result<Front> {
        let file = self.opts.data_dir.join("runtime").join(format!("{backend}.ports"));
        if let Ok(text) = std::fs::read_to_string(&file) {
            let addrs: Vec<SocketAddr> = text.split_whitespace().filter_map(|a| a.parse().ok()).collect();
            if let [grpc, fast] = addrs[..]
                && let Ok(f) = Front::bind(grpc, fast)
            {
                return Ok(f);
            }
        }
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        let f = Front::bind(any, any)?;
        if let Some(dir) = file.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        let _ = std::fs::write(&file, format!("{} {}\n", f.grpc, f.fast));
        Ok(f)
    }

    /// The file of `backend`'s member token, made when missing (`None`, logged, if it cannot be).
    fn member_token_file(&self, backend: &str) -> Option<PathBuf> {
        super::tokens::ensure(&self.opts.data_dir, &format!("member-{backend}"))
            .inspect_err(|e| {
                tracing::error!(%backend, error = %e, "cannot write the member token; the leader will mount any member")
            })
            .ok()
            .map(|(p, _)| p)
    }

    /// `backend`'s Control token and its file (`runtime/tokens.rs`), made when missing; `None` if
    /// it could not be written (logged: its leaders then take unauthenticated Control calls).
    fn control_token_of(&self, backend: &str) -> Option<(PathBuf, String)> {
        super::tokens::ensure(&self.opts.data_dir, &format!("control-{backend}"))
            .inspect_err(|e| {
                tracing::error!(%backend, error = %e, "cannot write the Control token; its leaders will take unauthenticated Control calls")
            })
            .ok()
    }

    /// The file of `backend`'s scrape token (what `/metrics` shows the per-tenant series to),
    /// made when missing (`None`, logged, if it cannot be: the Control token shows them then).
    fn metrics_token_file(&self, backend: &str) -> Option<PathBuf> {
        super::tokens::ensure(&self.opts.data_dir, &format!("metrics-{backend}"))
            .inspect_err(|e| tracing::error!(%backend, error = %e, "cannot write the scrape token"))
            .ok()
            .map(|(p, _)| p)
    }

    /// The file of `backend`'s seal key (its leaders' alone), made when missing (`None`, logged, if
    /// it cannot be: each leader process then seals with a key of its own, and a restarted or new
    /// leader adopts nothing its members hold).
    fn seal_key_file(&self, backend: &str) -> Option<PathBuf> {
        super::tokens::ensure(&self.opts.data_dir, &format!("seal-{backend}"))
            .inspect_err(|e| {
                tracing::error!(%backend, error = %e, "cannot write the seal key; a failover will not keep the cache")
            })
            .ok()
            .map(|(p, _)| p)
    }

    /// The kubeconfig the store's processes reach the Lease API with.
    fn store_kubeconfig(&self) -> PathBuf {
        self.opts.store_kubeconfig.clone()
    }

    /// A leader replica's flags: its own ports, the front's fast port advertised, and the
    /// election's Lease.
    fn leader_config(
        &self,
        plan: &StorePlan,
        ports: (SocketAddr, SocketAddr),
        front: &Front,
        member_token: Option<&PathBuf>,
        tls: Option<&tls_files::BackendFiles>,
    ) -> LeaderConfig {
        let mut cfg = plan.leader.clone();
        cfg.tls = kvcache_store::tls::ServeFlags {
            tls_cert: tls.map(|t| t.cert.clone()),
            tls_key: tls.map(|t| t.key.clone()),
        };
        cfg.listen = ports.0;
        cfg.fast_listen = Some(FastListen::At(ports.1));
        cfg.advertise_fast_port = Some(front.fast.port());
        cfg.metrics_listen = None;
        cfg.spin = Duration::ZERO;
        cfg.control_token_file = self.control_token_of(&plan.backend).map(|(p, _)| p);
        cfg.member_token_file = member_token.cloned();
        cfg.metrics_token_file = self.metrics_token_file(&plan.backend);
        cfg.seal_key_file = self.seal_key_file(&plan.backend);
        if let Some(e) = &plan.election {
            cfg.election = Election::Kubernetes;
            cfg.lease = Some(format!("{LEASE_NAMESPACE}/{}", e.lease));
            cfg.kubeconfig = Some(self.store_kubeconfig());
        }
        cfg
    }

    /// Bytes members may claim: the machine's memory, and no more than the shared-memory
    /// filesystem holds (read once, when the runtime is made).
    fn memory_limit(&self) -> u64 {
        self.opts.memory_limit.unwrap_or(u64::MAX)
    }
}

/// `MemTotal` of `/proc/meminfo`, in bytes.
fn mem_total() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn store_args(sub: &str, flags: Vec<String>) -> Vec<String> {
    let mut a = vec!["--exit-with-stdin".to_owned(), sub.to_owned()];
    a.extend(flags);
    a
}

/// `old` when it runs `spec` already (and was not refused); otherwise `old` is stopped and
/// `spec` started.
async fn converge(old: Option<Supervised>, spec: ProcessSpec, grace: Duration, hooks: Hooks) -> Supervised {
    match old {
        Some(s) if s.spec == spec && s.state().refused.is_none() => s,
        Some(s) => {
            s.stop().await;
            Supervised::start(spec, grace, hooks)
        }
        None => Supervised::start(spec, grace, hooks),
    }
}

impl Secrets for LocalRuntime {
    fn control_token(&self, backend: &str) -> Option<String> {
        self.control_token_of(backend).map(|(_, t)| t)
    }

    fn credentials(&self) -> &dyn super::credentials::Keeper {
        &self.credentials
    }

    fn store_tls(&self, backend: &str) -> Result<Option<kvcache_store::tls::ClientTls>, String> {
        Ok(self.tls.client(backend))
    }

    fn store_ca_pem(&self) -> Result<Option<String>, String> {
        Ok(self.tls.ca_pem())
    }
}

#[async_trait]
impl Runtime for LocalRuntime {
    fn nodes(&self) -> Vec<Node> {
        self.opts.nodes.clone()
    }

    fn lease_namespace(&self) -> &str {
        LEASE_NAMESPACE
    }

    async fn credential_in_use(&self, namespace: &str, fingerprint: &str) -> Result<bool, String> {
        let state = self.state.lock().await;
        let prefix = format!("{namespace}/");
        let in_use = state
            .replicas
            .iter()
            .filter(|(owner, _)| owner.starts_with(&prefix))
            .flat_map(|(_, r)| r.values())
            .any(|s| {
                s.spec
                    .env
                    .iter()
                    .any(|(k, v)| k == super::credentials::ENV && super::credentials::fingerprint(v) == fingerprint)
            });
        Ok(in_use)
    }

    fn changes(&self) -> tokio::sync::broadcast::Receiver<Changed> {
        self.changes.subscribe()
    }

    async fn ensure_store(&self, plan: &StorePlan) -> StoreObservation {
        let mut state = self.state.lock().await;
        let existing = state.stores.remove(&plan.backend);
        let (front, mut leader_ports, old_leaders, mut members) = match existing {
            Some(s) => (s.front, s.leader_ports, s.leaders, s.members),
            None => match self.front(&plan.backend) {
                Ok(f) => (f, Vec::new(), Vec::new(), HashMap::new()),
                Err(e) => {
                    let why = format!("cannot listen on a loopback port for the backend's front address: {e}");
                    return StoreObservation {
                        leaders: vec![crate::runtime::WorkloadState {
                            refused: Some(why),
                            ..Default::default()
                        }],
                        ..Default::default()
                    };
                }
            },
        };
        let replicas = plan.election.as_ref().map_or(1, |e| e.replicas.max(1)) as usize;
        while leader_ports.len() < replicas {
            leader_ports.push((free_port(), free_port()));
        }
        // one read of the backend's member token for its leaders and members alike
        let member_token = self.member_token_file(&plan.backend);
        let tls = self.tls.backend(&plan.backend);
        // Leaders: replica i keeps its ports and flags, so scaling never restarts one that stays.
        let mut old_leaders = old_leaders.into_iter();
        let mut leaders = Vec::new();
        for (i, ports) in leader_ports.iter().take(replicas).enumerate() {
            let cfg = self.leader_config(plan, *ports, &front, member_token.as_ref(), tls.as_ref());
            let spec = ProcessSpec {
                program: self.opts.store_binary.clone(),
                args: store_args("leader", cfg.to_args()),
                env: [Self::store_env(), plan.leader_env.clone()].concat(),
                log: self.log(&[&plan.backend, &format!("leader-{i}.log")]),
                health: None,
            };
            let mut hooks = self.notify(Changed::Store(plan.backend.clone()));
            let (reselect, notify) = (front.reselector(), hooks.on_change.take());
            hooks.on_change = Some(std::sync::Arc::new(move || {
                reselect();
                if let Some(n) = &notify {
                    n();
                }
            }));
            leaders.push(converge(old_leaders.next(), spec, self.opts.grace, hooks).await);
        }
        // replicas scaled away, from the end
        futures::future::join_all(old_leaders.map(Supervised::stop)).await;
        front.set_endpoints(
            leaders
                .iter()
                .zip(&leader_ports)
                .map(|(l, (grpc, fast))| Endpoint {
                    grpc: *grpc,
                    fast: *fast,
                    probe: l.probe(),
                })
                .collect(),
        );
        // Memory: what the other backends' members claim plus this plan's.
        let others: u64 = state
            .stores
            .iter()
            .filter(|(name, _)| **name != plan.backend)
            .flat_map(|(_, s)| s.members.values())
            .filter_map(|m| member_capacity(&m.spec))
            .sum();
        let wanted: u64 = plan.members.iter().map(|m| m.config.capacity).sum();
        let limit = self.memory_limit();
        let refusal = (others.saturating_add(wanted) > limit).then(|| {
            format!(
                "the members need {} of memory ({} more for other backends) and this machine has {}; lower capacityPerMember or select fewer nodes",
                format_size(wanted),
                format_size(others),
                format_size(limit)
            )
        });
        let endpoint = front.grpc.to_string();
        let follow = plan.election.as_ref().filter(|e| e.members_follow_lease);
        let mut wanted_names = Vec::new();
        for m in &plan.members {
            let name = m.name(&plan.backend);
            wanted_names.push(name.clone());
            let mut cfg = m.config.clone();
            match follow {
                Some(e) => {
                    cfg.leader = format!("{}{LEASE_NAMESPACE}/{}", kvcache_store::member::LEASE_SCHEME, e.lease);
                    cfg.kubeconfig = Some(self.store_kubeconfig());
                }
                None => {
                    cfg.leader = endpoint.clone();
                    cfg.kubeconfig = None;
                }
            }
            cfg.name = Some(name.clone());
            cfg.listen = SocketAddr::from(([127, 0, 0, 1], 0));
            cfg.data_listen = SocketAddr::from(([127, 0, 0, 1], 0));
            cfg.shm_dir = self.opts.shm_dir.clone();
            cfg.metrics_listen = None;
            cfg.no_prefault = true;
            cfg.spin = Duration::ZERO;
            cfg.member_token_file = member_token.clone();
            cfg.tls = kvcache_store::tls::ServeFlags {
                tls_cert: tls.as_ref().map(|t| t.cert.clone()),
                tls_key: tls.as_ref().map(|t| t.key.clone()),
            };
            cfg.dial = kvcache_store::tls::DialFlags {
                tls_ca: tls.as_ref().map(|t| t.ca.clone()),
                tls_server_name: tls.as_ref().map(|_| super::store_tls::server_name(&plan.backend)),
                tls_ca_pem: None,
            };
            let spec = ProcessSpec {
                program: self.opts.store_binary.clone(),
                args: store_args("member", cfg.to_args()),
                env: [Self::store_env(), m.env.clone()].concat(),
                log: self.log(&[&plan.backend, &format!("member-{}-{}.log", m.group, m.node)]),
                health: None,
            };
            let old = members.remove(&name);
            let member = match &refusal {
                Some(why) => {
                    if let Some(old) = old {
                        old.stop().await;
                    }
                    Supervised::refused(spec, why.clone())
                }
                None => {
                    let hooks = self.member_hooks(&plan.backend, front.grpc, name.clone());
                    converge(old, spec, self.opts.grace, hooks).await
                }
            };
            members.insert(name, member);
        }
        // members no longer planned
        let gone: Vec<String> = members.keys().filter(|n| !wanted_names.contains(n)).cloned().collect();
        for n in gone {
            if let Some(s) = members.remove(&n) {
                s.stop().await;
            }
        }
        let store = Store {
            front,
            leader_ports,
            leaders,
            members,
        };
        let observation = StoreObservation {
            client_endpoint: Some(endpoint),
            rollout: None,
            leaders: store.leaders.iter().map(Supervised::state).collect(),
            lease: plan
                .election
                .as_ref()
                .map(|e| (self.lease_namespace().to_owned(), e.lease.clone())),
            members: plan
                .members
                .iter()
                .map(|m| {
                    let st = store
                        .members
                        .get(&m.name(&plan.backend))
                        .map(Supervised::state)
                        .unwrap_or_default();
                    (m.clone(), st)
                })
                .collect(),
        };
        state.stores.insert(plan.backend.clone(), store);
        observation
    }

    async fn remove_store(&self, backend: &str) -> bool {
        let store = self.state.lock().await.stores.remove(backend);
        if let Some(store) = store {
            let stops = store.members.into_values().map(Supervised::stop);
            futures::future::join_all(stops).await;
            futures::future::join_all(store.leaders.into_iter().map(Supervised::stop)).await;
        }
        let _ = std::fs::remove_file(self.opts.data_dir.join("runtime").join(format!("{backend}.ports")));
        true
    }

    async fn ensure_replicas(&self, plan: &ReplicaPlan) -> Vec<ReplicaObservation> {
        let mut state = self.state.lock().await;
        let mut running = state.replicas.remove(&plan.owner).unwrap_or_default();
        let mut out = Vec::new();
        let dir: Vec<&str> = plan.owner.split('/').collect();
        let config = self.opts.config.get();
        let host = engines::Host::current();
        for r in &plan.replicas {
            let mut parts = vec!["_deployments"];
            parts.extend(dir.iter().copied());
            let file = format!("{}.log", r.name);
            parts.push(&file);
            let port = *state
                .engine_ports
                .entry(format!("{}/{}", plan.owner, r.name))
                .or_insert_with(|| free_port().port());
            let launch = engines::launch(
                &self.opts.store_binary,
                &config.local_runtime,
                &host,
                r,
                self.replica_env(&plan.owner, r),
                port,
            );
            let spec = ProcessSpec {
                program: launch.program,
                args: launch.args,
                env: launch.env,
                log: self.log(&parts),
                health: launch.health,
            };
            let hooks = self.notify(Changed::Replicas(plan.owner.clone()));
            let old = running.remove(&r.name);
            let s = match old {
                Some(old) if plan.hold_rollout && old.state().refused.is_none() => old,
                old => converge(old, spec, self.opts.grace, hooks).await,
            };
            out.push(ReplicaObservation {
                name: r.name.clone(),
                role: r.role.clone(),
                state: s.state(),
                cache: s.report(),
                runs: launch.note,
            });
            state
                .replicas
                .entry(plan.owner.clone())
                .or_default()
                .insert(r.name.clone(), s);
        }
        futures::future::join_all(running.into_values().map(Supervised::stop)).await;
        let planned: Vec<String> = plan
            .replicas
            .iter()
            .map(|r| format!("{}/{}", plan.owner, r.name))
            .collect();
        let prefix = format!("{}/", plan.owner);
        state
            .engine_ports
            .retain(|k, _| !k.starts_with(&prefix) || planned.contains(k));
        out
    }

    async fn remove_replicas(&self, owner: &str) -> bool {
        let replicas = {
            let mut state = self.state.lock().await;
            let prefix = format!("{owner}/");
            state.engine_ports.retain(|k, _| !k.starts_with(&prefix));
            state.replicas.remove(owner)
        };
        if let Some(r) = replicas {
            futures::future::join_all(r.into_values().map(Supervised::stop)).await;
        }
        true
    }

    async fn shutdown(&self) {
        let state = std::mem::take(&mut *self.state.lock().await);
        let mut stops = Vec::new();
        for (_, r) in state.replicas {
            stops.extend(r.into_values().map(Supervised::stop));
        }
        for (_, s) in state.stores {
            stops.extend(s.members.into_values().map(Supervised::stop));
            stops.extend(s.leaders.into_iter().map(Supervised::stop));
        }
        futures::future::join_all(stops).await;
    }
}

/// The `--capacity` of a member's command line.
fn member_capacity(spec: &ProcessSpec) -> Option<u64> {
    let i = spec.args.iter().position(|a| a == "--capacity")?;
    kvcache_units::parse_bytes(spec.args.get(i + 1)?).ok()
}

#[cfg(test)]
mod tests;
