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
//! - Router ([`router`]): `kv-router` (next to `kv-store`) on a loopback port of its own, its
//!   workers the ready replicas, in a file the runtime rewrites atomically as they change.
//! - Logs: `<data-dir>/logs/<backend>/<process>.log`, and
//!   `<data-dir>/logs/_deployments/<namespace>/<name>/<replica>.log` (`_` is never in a name),
//!   `router.log` beside them.
//!
//! The store processes run with `--spin 0`: on a laptop they share cores with everything else.

pub mod engines;
pub mod front;
mod ports;
pub mod process;
mod replicas;
pub mod router;
mod store;
mod tls_files;

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Mutex;

pub use self::ports::loopback_port;
use self::process::{Hooks, Supervised};
use self::store::StoreProcesses;
use super::{
    Changed, Node, ReplicaObservation, ReplicaPlan, RouterObservation, Runtime, Secrets, StoreObservation, StorePlan,
};

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

#[derive(Debug, Default)]
struct State {
    stores: HashMap<String, StoreProcesses>,
    replicas: HashMap<String, HashMap<String, Supervised>>,
    /// The loopback port of each real engine replica (`<owner>/<replica>`) and of each router
    /// (`<owner>/_router`), kept while it is planned so a restart serves at the same address.
    engine_ports: HashMap<String, u16>,
    /// Each deployment's router (`<namespace>/<name>`).
    routers: HashMap<String, Supervised>,
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
        Ok(self.runs_credential(namespace, fingerprint).await)
    }

    fn changes(&self) -> tokio::sync::broadcast::Receiver<Changed> {
        self.changes.subscribe()
    }

    async fn ensure_store(&self, plan: &StorePlan) -> StoreObservation {
        self.converge_store(plan).await
    }

    async fn remove_store(&self, backend: &str) -> bool {
        self.remove_store_now(backend).await;
        true
    }

    async fn ensure_replicas(&self, plan: &ReplicaPlan) -> Vec<ReplicaObservation> {
        self.converge_replicas(plan).await
    }

    async fn ensure_router(&self, plan: &ReplicaPlan, replicas: &[ReplicaObservation]) -> Option<RouterObservation> {
        self.converge_router(plan, replicas).await
    }

    async fn remove_replicas(&self, owner: &str) -> bool {
        self.remove_router_now(owner).await;
        self.remove_replicas_now(owner).await;
        true
    }

    async fn shutdown(&self) {
        let state = std::mem::take(&mut *self.state.lock().await);
        let mut stops: Vec<_> = state.routers.into_values().map(Supervised::stop).collect();
        for (_, r) in state.replicas {
            stops.extend(r.into_values().map(Supervised::stop));
        }
        futures::future::join_all(stops).await;
        futures::future::join_all(state.stores.into_values().map(StoreProcesses::stop)).await;
    }
}

#[cfg(test)]
mod tests;
