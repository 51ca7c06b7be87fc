//! The controllers: one `reconcile` plus `error_policy` per kind, on kube-rs's runtime, reaching
//! our API through a `kube::Client` (in direct mode, the request pipeline in this process, under
//! the identity `system:kvcache-controller`) and running the store's processes through a
//! [`Runtime`].
//!
//! | module | owns |
//! |---|---|
//! | [`backend`] | a backend's leader and members, and its status read from the leader |
//! | [`pool`] | a pool's status and the whole tenant ledger of its backend (`SetTenants`), rendered in [`pool::ledger_render`] |
//! | [`binding`] | a Binding's grant read back from the leader, and its deletion hold |
//! | [`credential`] | a Binding's tenant credential: minted, rotated, retired |
//! | [`model_deployment`] | a deployment's replicas with the injected environment, and `CacheAttached` |
//! | [`injection`] | what a replica receives: the one function both runtimes use |
//! | [`store_client`] | reading and writing a store leader's Control API (health, members, tenants) with timeouts |
//! | [`shared`] | what several controllers say alike (held-by messages, endpoints, hit rates), so none imports another |
//! | [`status`] | writing `/status` only when it changed; the finalizer |
//! | [`events`] | the Events recorded when a condition changes |
//! | [`replica_election`] | which API server replica runs the controllers (a Lease in the storage), on etcd |
//!
//! The pool and Binding controllers pass in three steps: observe (the I/O: lists, the
//! credentials, the leader's ledger), a pure `decide` (table-tested in each `decide.rs`), and
//! write (the ledger, the status, events and the finalizer).
//!
//! Passes are triggered by watches (an object and the objects that name it) and by a fixed
//! requeue ([`Options::requeue`], 15 s by default). A failed pass is logged, counted
//! (`kvcache_controller_reconcile_errors_total`) and retried with back-off; nothing a user writes
//! can make a controller stop.

pub mod backend;
pub mod binding;
pub mod credential;
pub mod engine;
pub mod events;
pub mod injection;
pub mod model_deployment;
pub mod pool;
pub mod replica_election;
pub mod shared;
pub mod status;
pub mod store_client;
#[cfg(test)]
mod testing;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::runtime::controller::Action;
use kube::runtime::{Controller, watcher};
use kube::{Api, Client};
use kvcache_api::{KVCacheBackend, KVCachePool};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use kube::runtime::reflector::ObjectRef;

use crate::runtime::{Changed, Runtime};

/// The user the controllers act as (the authorizer knows it: [`crate::auth`]).
pub use crate::auth::CONTROLLER_USER;
/// The finalizer that holds a deletion until the controller has released what it owns.
pub const FINALIZER: &str = "gpustack.ai/controlled";

/// How the controllers run.
#[derive(Clone, Debug)]
pub struct Options {
    /// Time between passes of a settled object.
    pub requeue: Duration,
    /// Time allowed for each call to a leader.
    pub leader_timeout: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            requeue: Duration::from_secs(15),
            leader_timeout: Duration::from_secs(5),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReplicaLabel {
    pub namespace: String,
    pub deployment: String,
    pub replica: String,
}

/// The controllers' metrics, on the server's registry.
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    pub reconciles: Family<KindLabel, Counter>,
    pub errors: Family<KindLabel, Counter>,
    pub status_writes: Family<KindLabel, Counter>,
    /// Each engine replica's latest hit rate, as it reported it.
    pub replica_hit_ratio: Family<ReplicaLabel, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// 1 while this replica runs the controllers.
    pub leader: Gauge,
}

impl Metrics {
    pub fn register(registry: &mut prometheus_client::registry::Registry) -> Metrics {
        let m = Metrics::default();
        registry.register(
            "kvcache_controller_reconcile",
            "Reconcile passes, by kind",
            m.reconciles.clone(),
        );
        registry.register(
            "kvcache_controller_reconcile_errors",
            "Reconcile passes that failed and were retried, by kind",
            m.errors.clone(),
        );
        registry.register(
            "kvcache_controller_status_writes",
            "Status writes, by kind (a settled system makes none)",
            m.status_writes.clone(),
        );
        registry.register(
            "kvcache_controller_leader",
            "1 while this replica runs the controllers (it holds their Lease), else 0",
            m.leader.clone(),
        );
        registry.register(
            "kvcache_replica_cache_hit_ratio",
            "Share of the blocks of an engine replica's latest round found in the store",
            m.replica_hit_ratio.clone(),
        );
        m
    }
}

/// What every reconcile gets.
pub struct Context {
    pub client: Client,
    /// The workloads: the store's processes and the replicas.
    pub runtime: Arc<dyn Runtime>,
    /// The controllers' token and the Bindings' credentials.
    pub secrets: Arc<dyn crate::runtime::Secrets>,
    pub opts: Options,
    /// The server's configuration as it is now (settings, instance types).
    pub config: crate::config::Live,
    pub metrics: Metrics,
    /// One lock per backend around reading the Bindings and setting the ledger: passes of two
    /// pools on one backend run concurrently, and the later `SetTenants` must not be rendered
    /// from a read older than the earlier one's (it would drop the other pool's tenants).
    pub ledger_locks: parking_lot::Mutex<std::collections::HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// The last non-empty holder of each backend's election Lease and its term, and a handover
    /// not yet reported, for the handover event.
    pub lease_holders: parking_lot::Mutex<std::collections::HashMap<String, backend::LeaseSeen>>,
    /// A Binding's credentials changed (minted, rotated, retired, forgotten): its pool puts the
    /// new hashes in the ledger and its deployments inject the current one, at once.
    pub credentials_changed: tokio::sync::broadcast::Sender<crate::runtime::credentials::BindingKey>,
}

impl Context {
    /// The client for Leases and Events: the cluster's in cluster mode (kube-apiserver serves
    /// them there), this server's otherwise.
    pub fn core_client(&self) -> Client {
        self.runtime.cluster_client().unwrap_or_else(|| self.client.clone())
    }

    /// A channel to `backend`'s store leader at `endpoint`, with this server's call timeout and,
    /// for a backend this server runs, its Control token and the store's TLS (the one way every
    /// controller reaches a leader).
    pub async fn leader(
        &self,
        backend: Option<&KVCacheBackend>,
        endpoint: &str,
    ) -> Result<store_client::LeaderClient, store_client::LeaderError> {
        let managed = backend.filter(|b| b.spec.managed().is_some());
        let (tls, token) = match managed {
            Some(b) => {
                let name = kube::ResourceExt::name_any(b);
                let tls = self.secrets.store_tls(&name).map_err(store_client::LeaderError)?;
                (tls, self.secrets.control_token(&name))
            }
            None => (None, None),
        };
        store_client::LeaderClient::connect(endpoint, self.opts.leader_timeout, token, tls).await
    }

    /// The tenant ledger of `backend`'s leader at `admin` (its Admin endpoint), in one
    /// connection; the error says what failed in the store's words.
    pub async fn ledger(
        &self,
        backend: Option<&KVCacheBackend>,
        admin: &str,
    ) -> Result<kvcache_store::proto::GetTenantsResponse, String> {
        match self.leader(backend, admin).await {
            Ok(l) => l.tenants().await.map_err(|e| e.0),
            Err(e) => Err(e.0),
        }
    }

    /// The lock of `backend`'s ledger.
    pub fn ledger_lock(&self, backend: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.ledger_locks.lock().entry(backend.to_owned()).or_default().clone()
    }
}

/// Why a pass failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the API refused a request: {0}")]
    Kube(#[from] kube::Error),
    #[error("{0}")]
    Serialize(#[from] serde_json::Error),
    #[error("{0}")]
    Credentials(#[from] crate::runtime::credentials::KeeperError),
    #[error("the runtime could not tell: {0}")]
    Runtime(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A byte count the store reported, as a binary-SI quantity (`16Gi`).
pub fn quantity(bytes: u64) -> kvcache_api::Quantity {
    kvcache_api::Quantity::from_bytes(i64::try_from(bytes).unwrap_or(i64::MAX))
}

/// The same, as text for a message.
pub fn human(bytes: u64) -> String {
    quantity(bytes).0
}

/// A byte count rounded for reading (`1.2 GiB`, `530.0 MiB`, `900 B`), for counts that are not
/// sizes anyone asked for (what a leader adopted), where an exact quantity would read `1242432Ki`.
pub fn approx_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// Shared by every kind's `error_policy`: counts the failure and retries soon.
fn retry(kind: &'static str, error: &Error, ctx: &Context) -> Action {
    ctx.metrics.errors.get_or_create(&KindLabel { kind }).inc();
    if let Error::Kube(kube::Error::Api(s)) = error
        && s.code == 409
    {
        // The pass read an object older than the one stored (its own last write, or a user's):
        // look again at once, from the newer one.
        tracing::debug!(kind, "reconcile met a newer object, retrying: {error}");
        return Action::requeue(Duration::from_millis(200));
    }
    tracing::warn!(kind, "reconcile failed, retrying: {error}");
    Action::requeue(Duration::from_secs(2))
}

/// The runtime's changes, as the objects to look at again.
fn changes<K>(
    ctx: &Context,
    to: fn(Changed) -> Option<ObjectRef<K>>,
) -> impl futures::Stream<Item = ObjectRef<K>> + Send + 'static
where
    K: kube::Resource<DynamicType = ()> + 'static,
{
    all_changes(ctx).filter_map(move |c| futures::future::ready(to(c)))
}

/// Every change the runtime reports.
fn all_changes(ctx: &Context) -> impl futures::Stream<Item = Changed> + Send + 'static {
    let rx = ctx.runtime.changes();
    futures::stream::unfold(rx, |mut rx| async move {
        loop {
            match rx.recv().await {
                Ok(c) => return Some((c, rx)),
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
            }
        }
    })
}

/// Every Binding whose credentials changed.
fn credential_changes(
    ctx: &Context,
) -> impl futures::Stream<Item = crate::runtime::credentials::BindingKey> + Send + 'static {
    let rx = ctx.credentials_changed.subscribe();
    futures::stream::unfold(rx, |mut rx| async move {
        loop {
            match rx.recv().await {
                Ok(c) => return Some((c, rx)),
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
            }
        }
    })
}

/// What ends the controllers: the server's shutdown, as a future each controller can wait on.
#[derive(Clone)]
pub(crate) struct Shutdown(tokio::sync::watch::Receiver<bool>);

impl Shutdown {
    /// Resolves once shutdown began.
    fn signal(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.0.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    }
}

/// Runs the four controllers until `shutdown` turns true. Each kind's module wires its own
/// watches and wakes (`controller`); the pool controller's cache is shared with the Binding
/// controller, which wakes the Bindings on a backend's pools.
pub async fn run(ctx: Arc<Context>, shutdown: tokio::sync::watch::Receiver<bool>) {
    let stop = Shutdown(shutdown);
    let pools = Controller::new(Api::<KVCachePool>::all(ctx.client.clone()), watcher::Config::default());
    let pools_seen = pools.store();
    futures::join!(
        backend::controller(ctx.clone(), stop.clone()),
        pool::controller(pools, ctx.clone(), stop.clone()),
        binding::controller(ctx.clone(), pools_seen, stop.clone()),
        model_deployment::controller(ctx, stop),
    );
}
