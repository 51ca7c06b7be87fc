//! The composition root: configuration in, the application out. It opens the storage chosen by
//! `--storage`, builds the watch hub, the auth chain, the one metrics registry, the registry of
//! every kind and the handlers behind their filters, and it is where background work (and, next, the
//! controllers) starts. `serve`, the offline commands and the tests build the application here,
//! the same way; nothing deeper builds its own.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::auth::anonymous::Anonymous;
use crate::auth::policy::StaticPolicy;
use crate::auth::x509::X509;
use crate::auth::{Authorizer, Chain, ConnectionInfo, InProcess, NoTokens, User};
use crate::config::Config;
use crate::controller;
use crate::filters::{self, Filters, Pipeline};
use crate::handlers::{self, Api};
use crate::metrics::ApiMetrics;
use crate::registry::kinds::KINDS;
use crate::registry::{Context, Registry};
use crate::runtime::local::{LocalOptions, LocalRuntime};
use crate::runtime::{Runtime, Secrets};
use crate::storage::embedded::{Embedded, Options as EmbeddedOptions};
use crate::storage::etcd::{Etcd, EtcdOptions};
use crate::storage::metrics::{ResourceLabel, StorageMetrics};
use crate::storage::watch::Hub;
use crate::storage::{Storage, StorageError, keys};

/// How often Events past their TTL are looked for.
const EVENT_EXPIRY_INTERVAL: Duration = Duration::from_secs(60);

/// Which storage holds the objects.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum StorageChoice {
    /// The embedded, crash-safe log under `<data-dir>/storage` (the default).
    #[default]
    Embedded,
    /// An etcd cluster (`etcd://host:port[,host:port...]`).
    Etcd(EtcdOptions),
}

impl FromStr for StorageChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "" | "embedded" => Ok(StorageChoice::Embedded),
            other if other.starts_with("etcd://") => EtcdOptions::parse(other).map(StorageChoice::Etcd),
            other => Err(format!(
                "{other:?} is not a storage this server knows; use embedded or etcd://host:port[,host:port...]"
            )),
        }
    }
}

/// Everything the application is built from.
#[derive(Debug, Clone)]
pub struct AppOptions {
    pub data_dir: PathBuf,
    pub storage: StorageChoice,
    pub config: Config,
    /// Changes kept for watches resuming from an older revision (older ones get 410).
    pub watch_history: usize,
    /// Events queued per watcher before it is closed as too slow.
    pub watch_queue: usize,
    /// How often watches with `allowWatchBookmarks` get a BOOKMARK.
    pub bookmark_interval: Duration,
    /// How often the objects-per-kind metric is refreshed.
    pub object_count_interval: Duration,
    /// Reads (get, list) and writes served at once before 429, watches apart.
    pub max_reads_in_flight: usize,
    pub max_writes_in_flight: usize,
    /// The controllers and where their workloads run; `None` serves the API alone.
    pub controllers: Option<ControllerSetup>,
    /// The file `config` came from: watched, and read again when it changes.
    pub config_path: Option<PathBuf>,
    /// Aggregated mode: users and decisions come from the cluster. `None` is direct mode (our own
    /// client certificates and the static policy).
    pub delegated: Option<crate::auth::delegated::Delegated>,
    /// The heap as the process's allocator counts it, when the binary counts it (served on
    /// `/metrics`).
    pub heap: Option<crate::metrics::HeapReadings>,
}

/// The controllers' settings and their runtime.
#[derive(Debug, Clone)]
pub struct ControllerSetup {
    pub options: controller::Options,
    pub runtime: RuntimeChoice,
    /// Campaign for the controllers' Lease first (several replicas on one etcd); `None` runs
    /// them at once (the embedded storage has one server).
    pub election: Option<controller::replica_election::ElectionOptions>,
}

/// Where the controllers run the store and the replicas.
#[derive(Clone)]
pub enum RuntimeChoice {
    /// Child processes on this machine.
    Local(LocalOptions),
    /// Workloads of a Kubernetes cluster, through this client.
    Kubernetes(kube::Client, crate::runtime::kubernetes::KubernetesOptions),
}

impl std::fmt::Debug for RuntimeChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RuntimeChoice::Local(l) => f.debug_tuple("Local").field(l).finish(),
            RuntimeChoice::Kubernetes(_, o) => f.debug_tuple("Kubernetes").field(o).finish(),
        }
    }
}

impl AppOptions {
    pub fn new(data_dir: impl Into<PathBuf>) -> AppOptions {
        AppOptions {
            data_dir: data_dir.into(),
            storage: StorageChoice::Embedded,
            config: Config::default(),
            watch_history: 10_000,
            watch_queue: 1_000,
            bookmark_interval: Duration::from_secs(60),
            object_count_interval: Duration::from_secs(10),
            max_reads_in_flight: filters::MAX_READS_IN_FLIGHT,
            max_writes_in_flight: filters::MAX_WRITES_IN_FLIGHT,
            controllers: None,
            config_path: None,
            delegated: None,
            heap: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("opening the storage in {path}: {source}")]
    Storage {
        path: PathBuf,
        #[source]
        source: StorageError,
    },
    #[error("connecting to etcd: {0}")]
    Etcd(#[source] StorageError),
    #[error("the etcd storage is opened with App::open (it connects over the network)")]
    NeedsOpen,
}

/// How the controllers run, where their workloads run, and where that keeps its secrets.
type Controllers = (controller::Options, Arc<dyn Runtime>, Arc<dyn Secrets>);

/// Opens the embedded storage under `<data_dir>/storage`, with a watch hub of its own.
fn open_embedded(
    data_dir: &Path,
    watch_history: usize,
    watch_queue: usize,
    storage_metrics: &StorageMetrics,
) -> Result<(Arc<dyn Storage>, Arc<Hub>), AppError> {
    let hub = Arc::new(Hub::new(watch_history.max(1), watch_queue.max(1)));
    let dir = data_dir.join("storage");
    let options = EmbeddedOptions {
        metrics: storage_metrics.clone(),
        ..EmbeddedOptions::default()
    };
    let storage = Embedded::open_with_hub(&dir, options, hub.clone())
        .map_err(|source| AppError::Storage { path: dir, source })?;
    Ok((Arc::new(storage), hub))
}

/// The controllers' options and the runtime chosen for them, reading `config`.
fn controllers_of(c: ControllerSetup, config: &crate::config::Live) -> Controllers {
    let (runtime, secrets): (Arc<dyn Runtime>, Arc<dyn Secrets>) = match c.runtime {
        RuntimeChoice::Local(mut local) => {
            local.config = config.clone();
            let r = Arc::new(LocalRuntime::new(local));
            (r.clone(), r)
        }
        RuntimeChoice::Kubernetes(client, k) => {
            let r = Arc::new(crate::runtime::kubernetes::KubernetesRuntime::new(
                client,
                k,
                config.clone(),
            ));
            (r.clone(), r)
        }
    };
    (c.options, runtime, secrets)
}

/// Who a request is and what it may do: the cluster's answers in aggregated mode, else our own
/// client certificates and the static policy.
fn auth_of(delegated: Option<crate::auth::delegated::Delegated>) -> (Chain, Arc<dyn Authorizer>) {
    match delegated {
        Some(delegated) => (delegated.authn, delegated.authz),
        None => {
            let authn = Chain::new(vec![
                Arc::new(X509),
                Arc::new(InProcess),
                Arc::new(NoTokens),
                Arc::new(Anonymous),
            ]);
            // The direct-mode policy decides in nanoseconds from the attributes alone; the
            // decision cache goes in front of authorizers that ask someone else (the
            // SubjectAccessReviews of aggregated mode).
            let authz: Arc<dyn Authorizer> = Arc::new(StaticPolicy);
            (authn, authz)
        }
    }
}

/// The application: storage, registry, the API behind its filters.
pub struct App {
    pub storage: Arc<dyn Storage>,
    pub registry: Arc<Registry>,
    pub api: Arc<Api>,
    pub metrics: ApiMetrics,
    storage_metrics: StorageMetrics,
    /// the storage's watch fan-out, for its figures on `/metrics`
    hub: Arc<Hub>,
    object_count_interval: Duration,
    pipeline: Pipeline,
    shutdown: tokio::sync::watch::Sender<bool>,
    controller_metrics: controller::Metrics,
    controllers: Option<Controllers>,
    election: Option<controller::replica_election::ElectionOptions>,
    /// The configuration admission, the controllers and the runtime read, and its file.
    config: crate::config::Live,
    config_path: Option<PathBuf>,
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App").finish_non_exhaustive()
    }
}

/// How long [`App::open`] waits for etcd to answer before it gives up.
const ETCD_START_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

impl App {
    /// Opens the storage chosen (connecting to etcd when that is the one) and builds the
    /// application on it.
    pub async fn open(opts: AppOptions) -> Result<App, AppError> {
        let StorageChoice::Etcd(etcd) = &opts.storage else {
            return App::build(opts);
        };
        let hub = Arc::new(Hub::new(opts.watch_history.max(1), opts.watch_queue.max(1)));
        // etcd may start after us (in a cluster, its Pod and DNS name appear with ours): wait
        // for it a while, saying why, before giving up.
        let began = std::time::Instant::now();
        let storage = loop {
            match Etcd::connect(etcd, hub.clone()).await {
                Ok(s) => break s,
                Err(e) if began.elapsed() < ETCD_START_WAIT => {
                    tracing::warn!("waiting for etcd at {}: {e}", etcd.endpoints.join(","));
                    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
                }
                Err(e) => return Err(AppError::Etcd(e)),
            }
        };
        App::build_on(opts, Some((Arc::new(storage), hub)))
    }

    /// Builds the application: opens the embedded storage and wires everything to it.
    pub fn build(opts: AppOptions) -> Result<App, AppError> {
        App::build_on(opts, None)
    }

    fn build_on(opts: AppOptions, opened: Option<(Arc<dyn Storage>, Arc<Hub>)>) -> Result<App, AppError> {
        let mut metrics_registry = prometheus_client::registry::Registry::default();
        let metrics = ApiMetrics::register(&mut metrics_registry);
        let storage_metrics = StorageMetrics::register(&mut metrics_registry);
        let controller_metrics = controller::Metrics::register(&mut metrics_registry);
        if let Some(heap) = opts.heap {
            metrics_registry.register_collector(Box::new(heap));
        }
        let (storage, hub): (Arc<dyn Storage>, Arc<Hub>) = match (opts.storage, opened) {
            (_, Some(opened)) => opened,
            (StorageChoice::Etcd(_), None) => return Err(AppError::NeedsOpen),
            (StorageChoice::Embedded, None) => {
                open_embedded(&opts.data_dir, opts.watch_history, opts.watch_queue, &storage_metrics)?
            }
        };
        let election = opts.controllers.as_ref().and_then(|c| c.election.clone());
        let config = crate::config::Live::new(opts.config);
        let controllers = opts.controllers.map(|c| controllers_of(c, &config));
        let registry = Arc::new(Registry::new(storage.clone(), Context { config: config.clone() }));
        let (shutdown, shutdown_rx) = tokio::sync::watch::channel(false);
        let api = Arc::new(Api {
            registry: registry.clone(),
            metrics: metrics.clone(),
            metrics_registry: Arc::new(metrics_registry),
            storage: storage.clone(),
            ready: AtomicBool::new(true),
            shutdown: shutdown_rx,
            bookmark_interval: opts.bookmark_interval.max(Duration::from_millis(1)),
            discovery: handlers::discovery::Cache::new(&KINDS),
            openapi: crate::openapi::build(&KINDS.each_ref().map(|k| k.doc)),
        });
        let (authn, authz) = auth_of(opts.delegated);
        let mut filters = Filters::new(authn, authz, metrics.clone());
        filters.max_reads = opts.max_reads_in_flight.max(1);
        filters.max_writes = opts.max_writes_in_flight.max(1);
        let filters = Arc::new(filters);
        let pipeline = Pipeline::new(handlers::Routes::new(api.clone()), filters);
        Ok(App {
            storage,
            registry,
            api,
            metrics,
            storage_metrics,
            hub,
            object_count_interval: opts.object_count_interval,
            pipeline,
            shutdown,
            controller_metrics,
            controllers,
            election,
            config,
            config_path: opts.config_path,
        })
    }

    /// The filters and the handlers as one tower `Service`; requests need a [`ConnectionInfo`]
    /// extension to be authenticated.
    pub fn service(&self) -> Pipeline {
        self.pipeline.clone()
    }

    /// The pipeline for a client inside this process, authenticated as `user`: pass it to
    /// `kube::Client::new(service, namespace)`, and requests go through every filter without a
    /// socket.
    pub fn in_process(&self, user: User) -> InProcessClient {
        InProcessClient {
            pipeline: self.pipeline.clone(),
            conn: ConnectionInfo::InProcess { user },
        }
    }

    /// What the controllers' passes get: a client of this API in the process, acting as
    /// `system:kvcache-controller`, and `runtime`.
    pub fn controller_context(
        &self,
        runtime: Arc<dyn Runtime>,
        secrets: Arc<dyn Secrets>,
        opts: controller::Options,
    ) -> controller::Context {
        let user = User::new(
            controller::CONTROLLER_USER,
            &["system:authenticated", crate::auth::delegated::IN_PROCESS_GROUP],
        );
        controller::Context {
            client: kube::Client::new(self.in_process(user), "default"),
            runtime,
            secrets,
            opts,
            config: self.config.clone(),
            metrics: self.controller_metrics.clone(),
            ledger_locks: Default::default(),
            lease_holders: Default::default(),
            credentials_changed: tokio::sync::broadcast::channel(256).0,
        }
    }

    /// Starts the background work: the system namespaces' records, the objects-per-kind metric, the expiry of old Events, and the controllers (acting as
    /// `system:kvcache-controller` through the request pipeline in this process).
    pub fn start(&self) {
        if let Some(path) = &self.config_path {
            // Ends with the runtime (the server's lifetime).
            drop(self.config.watch(path.clone()));
        }
        if let Some((options, runtime, secrets)) = &self.controllers {
            let ctx = Arc::new(self.controller_context(runtime.clone(), secrets.clone(), options.clone()));
            match &self.election {
                None => {
                    ctx.metrics.leader.set(1);
                    tokio::spawn(controller::run(ctx, self.shutdown.subscribe()));
                }
                Some(election) => {
                    let (leading, rx) = tokio::sync::watch::channel(false);
                    tokio::spawn(controller::replica_election::campaign(
                        self.storage.clone(),
                        election.clone(),
                        leading,
                        self.shutdown.subscribe(),
                    ));
                    tokio::spawn(lead(ctx, rx, self.shutdown.subscribe()));
                }
            }
        }
        let storage = self.storage.clone();
        let bootstrap = storage.clone();
        tokio::spawn(async move { crate::namespaces::bootstrap(&bootstrap).await });
        let metrics = self.storage_metrics.clone();
        let hub = self.hub.clone();
        let interval = self.object_count_interval.max(Duration::from_millis(100));
        let mut shutdown = self.shutdown.subscribe();
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(interval);
            let mut last_expiry = std::time::Instant::now();
            loop {
                tokio::select! {
                    _ = ticker.tick() => {}
                    _ = shutdown.changed() => return,
                }
                // Events live an hour: a scan a minute is plenty.
                if last_expiry.elapsed() >= EVENT_EXPIRY_INTERVAL {
                    last_expiry = std::time::Instant::now();
                    let expired = crate::events::expire(&storage, crate::events::TTL).await;
                    if expired > 0 {
                        tracing::debug!(expired, "events past their TTL deleted");
                    }
                }
                for k in &KINDS {
                    match storage.count(&keys::kind_prefix_of(k.plural)).await {
                        Ok(n) => {
                            metrics
                                .objects
                                .get_or_create(&ResourceLabel { resource: k.plural })
                                .set(i64::try_from(n).unwrap_or(i64::MAX));
                        }
                        Err(e) => tracing::debug!(resource = k.plural, error = %e, "counting objects failed"),
                    }
                }
                let watch = hub.figures();
                metrics
                    .watch_history_bytes
                    .set(i64::try_from(watch.history_bytes).unwrap_or(i64::MAX));
                metrics.watchers.set(i64::try_from(watch.watchers).unwrap_or(i64::MAX));
            }
        });
    }

    /// From now on `/readyz` fails (a load balancer takes this server out).
    pub fn set_unready(&self) {
        self.api.ready.store(false, Ordering::Relaxed);
    }

    /// Ends every watch and background task.
    pub fn shut_down(&self) {
        self.set_unready();
        let _ = self.shutdown.send(true);
    }

    /// Stops every process the runtime runs (after [`App::shut_down`], at server exit).
    pub async fn stop_workloads(&self) {
        if let Some((_, runtime, _)) = &self.controllers {
            runtime.shutdown().await;
        }
    }
}

/// Runs the controllers for each term this replica holds their Lease: started when it leads,
/// stopped (and the runtime's workloads with them) when it stops leading or the server stops.
async fn lead(
    ctx: Arc<controller::Context>,
    mut leading: tokio::sync::watch::Receiver<bool>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        let closed = tokio::select! {
            r = async { leading.wait_for(|l| *l).await.is_err() } => r,
            () = async { let _ = shutdown.wait_for(|s| *s).await; } => true,
        };
        if closed {
            return;
        }
        ctx.metrics.leader.set(1);
        let (end, term) = tokio::sync::watch::channel(false);
        let running = tokio::spawn(controller::run(ctx.clone(), term));
        let stopping = tokio::select! {
            () = async { let _ = leading.wait_for(|l| !*l).await; } => false,
            () = async { let _ = shutdown.wait_for(|s| *s).await; } => true,
        };
        end.send_replace(true);
        let _ = running.await;
        ctx.metrics.leader.set(0);
        if !stopping {
            // a deposed leader's workloads belong to the next leader now
            ctx.runtime.shutdown().await;
        }
        if stopping {
            return;
        }
    }
}

/// The pipeline as a tower `Service` for a client in this process, under its own identity.
#[derive(Clone)]
pub struct InProcessClient {
    pipeline: Pipeline,
    conn: ConnectionInfo,
}

impl std::fmt::Debug for InProcessClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InProcessClient").field("conn", &self.conn).finish()
    }
}

impl<B> tower::Service<http::Request<B>> for InProcessClient
where
    B: axum::body::HttpBody<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Response = axum::response::Response;
    type Error = std::convert::Infallible;
    type Future = <Pipeline as tower::Service<http::Request<B>>>::Future;

    fn poll_ready(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        <Pipeline as tower::Service<http::Request<B>>>::poll_ready(&mut self.pipeline, cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        req.extensions_mut().insert(self.conn.clone());
        self.pipeline.call(req)
    }
}
