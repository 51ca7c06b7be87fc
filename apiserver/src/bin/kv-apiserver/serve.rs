//! `kv-apiserver serve`: its flags, what they make of the application's options (the
//! controllers, their runtime and election, aggregated mode), and the server started with them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::{Args, ValueEnum};
use kvcache_apiserver::app::{App, AppOptions, ControllerSetup, RuntimeChoice, StorageChoice};
use kvcache_apiserver::auth::delegated::Delegated;
use kvcache_apiserver::auth::delegated::flags::DelegatedFlags;
use kvcache_apiserver::controller;
use kvcache_apiserver::controller::replica_election::ElectionOptions;
use kvcache_apiserver::runtime::Node;
use kvcache_apiserver::runtime::kubernetes::KubernetesOptions;
use kvcache_apiserver::runtime::local::LocalOptions;
use kvcache_apiserver::server::{self, ServeOptions};
use kvcache_units::parse_duration;

/// Serves the API over HTTPS; writes <data-dir>/kubeconfig for kubectl.
#[derive(Args)]
pub struct ServeArgs {
    #[arg(long, default_value = "127.0.0.1:6443")]
    listen: std::net::SocketAddr,
    /// Time between BOOKMARK events on watches that allow them (`60s`; a bare number is seconds).
    #[arg(long, default_value = "60s", value_parser = parse_duration, hide = true)]
    watch_bookmark_interval: Duration,
    /// Changes kept in memory for watches that resume from an older resourceVersion.
    #[arg(long, default_value_t = 10_000, hide = true)]
    watch_history: usize,
    /// Events queued for each watcher before it is closed as too slow (counted in
    /// `apiserver_terminated_watchers_total`); its client lists and watches again.
    #[arg(long, default_value_t = 1_000, hide = true)]
    watch_queue: usize,
    /// How long to keep serving (with /readyz failing) after SIGTERM (`5s`; a bare number is seconds).
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    shutdown_delay: Duration,
    /// Run the controllers (`--controllers=false` serves the API alone: objects are stored and
    /// nothing runs).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    controllers: bool,
    /// Where the controllers run the store and the replicas: `local` (child processes on this
    /// machine) or `kubernetes` (workloads of a cluster).
    #[arg(long, value_enum, default_value_t = RuntimeFlag::Local)]
    runtime: RuntimeFlag,
    /// With --runtime kubernetes: the cluster the workloads run in (default: the Pod's
    /// in-cluster configuration, else $KUBECONFIG).
    #[arg(long)]
    runtime_kubeconfig: Option<PathBuf>,
    /// With --runtime kubernetes: the namespace of the store's workloads and Leases.
    #[arg(long, default_value = "gpustack-system")]
    store_namespace: String,
    /// With --runtime kubernetes: the runtime's own ServiceAccount, `<namespace>/<name>`. The
    /// runtime then binds it, by a RoleBinding in each namespace it writes Secrets and engine
    /// Pods to, to the ClusterRole `kvcache-apiserver-tenant`, and holds no such rights
    /// elsewhere. Without it, its credentials must already reach those namespaces.
    #[arg(long, value_parser = parse_service_account)]
    runtime_service_account: Option<(String, String)>,
    /// The stand-in nodes of the local runtime, comma-separated; each is labelled
    /// kubernetes.io/hostname=<name> and kubernetes.io/os=linux.
    #[arg(long, default_value = "local-0,local-1", value_delimiter = ',')]
    nodes: Vec<String>,
    /// Time between the controllers' passes over a settled object.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    requeue_interval: Duration,
    /// The `kv-store` binary the local runtime starts (default: next to this one).
    #[arg(long)]
    store_binary: Option<PathBuf>,
    /// On etcd: how long the controllers' Lease lasts without renewal before another replica
    /// takes over.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    leader_elect_lease_duration: Duration,
    /// On etcd: how long the leading replica keeps trying to renew before it stops leading.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    leader_elect_renew_deadline: Duration,
    /// On etcd: time between campaign rounds.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    leader_elect_retry_period: Duration,
    /// Where the CA and certificates live (default `<data-dir>/pki`); replicas given the same
    /// directory share one CA and serving certificate, so one kubeconfig reaches any of them.
    #[arg(long)]
    pki_dir: Option<PathBuf>,
    #[command(flatten)]
    delegated: DelegatedFlags,
}

/// Where the controllers run the store and the replicas.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum RuntimeFlag {
    /// child processes on this machine
    Local,
    /// workloads of a cluster
    Kubernetes,
}

/// `<namespace>/<name>` of a ServiceAccount.
fn parse_service_account(s: &str) -> Result<(String, String), String> {
    match s.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((ns.to_owned(), name.to_owned()))
        }
        _ => Err(format!("{s:?} is not <namespace>/<name> of a ServiceAccount")),
    }
}

/// Serves until SIGINT or SIGTERM: `opts` (the storage and configuration) completed by `args`.
pub async fn run(mut opts: AppOptions, args: ServeArgs) -> anyhow::Result<()> {
    args.check()?;
    let delegated = args.delegated.resolve().map_err(anyhow::Error::msg)?;
    if delegated.is_some() && args.controllers && args.runtime == RuntimeFlag::Local {
        bail!(
            "--auth delegated runs the controllers with --runtime kubernetes (the local runtime's store processes reach this server with its own certificates, which aggregated mode does not make); pass --runtime kubernetes or --controllers=false"
        );
    }
    let mut serving_files = None;
    if let Some((flags, files)) = delegated {
        let started = Delegated::start(&flags)
            .await
            .context("starting aggregated mode (--auth delegated)")?;
        opts.delegated = Some(started);
        serving_files = Some(files);
    }
    opts.watch_history = args.watch_history;
    opts.watch_queue = args.watch_queue;
    opts.bookmark_interval = args.watch_bookmark_interval;
    opts.controllers = args.controllers(&opts.data_dir, &opts.storage).await?;
    let serve = ServeOptions {
        listen: args.listen,
        data_dir: opts.data_dir.clone(),
        shutdown_delay: args.shutdown_delay,
        pki_dir: args.pki_dir,
        serving_files,
    };
    let app = App::open(opts).await?;
    Ok(server::serve(app, serve, stop_signal()).await?)
}

impl ServeArgs {
    /// Flags that go together, and election timings that can work.
    fn check(&self) -> anyhow::Result<()> {
        if self.runtime != RuntimeFlag::Kubernetes && self.runtime_kubeconfig.is_some() {
            bail!("--runtime-kubeconfig goes with --runtime kubernetes");
        }
        if self.runtime != RuntimeFlag::Kubernetes && self.runtime_service_account.is_some() {
            bail!("--runtime-service-account goes with --runtime kubernetes");
        }
        let timings = kvcache_store::election::Timings {
            lease_duration: self.leader_elect_lease_duration,
            renew_deadline: self.leader_elect_renew_deadline,
            retry_period: self.leader_elect_retry_period,
        };
        if let Err(e) = timings.validate() {
            bail!("--leader-elect-lease-duration, --leader-elect-renew-deadline, --leader-elect-retry-period: {e}");
        }
        Ok(())
    }

    /// The controllers and their runtime; `None` with `--controllers=false`.
    async fn controllers(&self, data_dir: &Path, storage: &StorageChoice) -> anyhow::Result<Option<ControllerSetup>> {
        if !self.controllers {
            return Ok(None);
        }
        let runtime = match self.runtime {
            RuntimeFlag::Kubernetes => {
                let client = kvcache_store::election::kube::client(self.runtime_kubeconfig.as_deref())
                    .await
                    .map_err(|e| anyhow::anyhow!("--runtime kubernetes: {e}"))?;
                RuntimeChoice::Kubernetes(
                    client,
                    KubernetesOptions {
                        namespace: self.store_namespace.clone(),
                        service_account: self.runtime_service_account.clone(),
                    },
                )
            }
            RuntimeFlag::Local => RuntimeChoice::Local(self.local_options(data_dir)?),
        };
        Ok(Some(ControllerSetup {
            options: controller::Options {
                requeue: self.requeue_interval.max(Duration::from_millis(100)),
                ..controller::Options::default()
            },
            runtime,
            election: self.controller_election(storage),
        }))
    }

    /// The local runtime's nodes and `kv-store` binary, which must be there.
    fn local_options(&self, data_dir: &Path) -> anyhow::Result<LocalOptions> {
        let mut local = LocalOptions::new(data_dir);
        local.nodes = self
            .nodes
            .iter()
            .filter(|n| !n.is_empty())
            .map(|n| Node::stand_in(n))
            .collect();
        if let Some(bin) = &self.store_binary {
            local.store_binary = bin.clone();
        }
        if !local.store_binary.exists() {
            bail!(
                "the local runtime starts {} and it is not there; build it (cargo build --release -p kvcache-store) or pass --store-binary",
                local.store_binary.display()
            );
        }
        Ok(local)
    }

    /// On etcd several replicas may serve: the controllers run on the one that holds their
    /// Lease. The embedded storage has one server, which runs them at once.
    fn controller_election(&self, storage: &StorageChoice) -> Option<ElectionOptions> {
        matches!(storage, StorageChoice::Etcd(_)).then(|| ElectionOptions {
            identity: format!(
                "{}-{}",
                std::fs::read_to_string("/etc/hostname")
                    .map_or_else(|_| "kv-apiserver".to_owned(), |h| h.trim().to_owned()),
                &uuid::Uuid::new_v4().simple().to_string()[..8]
            ),
            lease_duration: self.leader_elect_lease_duration,
            renew_deadline: self.leader_elect_renew_deadline,
            retry_period: self.leader_elect_retry_period,
        })
    }
}

/// SIGINT or SIGTERM.
async fn stop_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
    tracing::info!("stop signal received");
}
