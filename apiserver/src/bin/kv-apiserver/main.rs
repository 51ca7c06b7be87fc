//! `kv-apiserver`: the API server (`serve`), and offline commands over a stopped server's data
//! directory (`apply`, `get`, `delete`) that run the same admission rules. Both build the
//! application through `app::App::build`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};
use kvcache_apiserver::app::{App, AppOptions, ControllerSetup, RuntimeChoice, StorageChoice};
use kvcache_apiserver::auth::delegated::Delegated;
use kvcache_apiserver::auth::delegated::flags::DelegatedFlags;
use kvcache_apiserver::config::Config;
use kvcache_apiserver::controller;
use kvcache_apiserver::controller::replica_election::ElectionOptions;
use kvcache_apiserver::manifest::{self, ApplyError};
use kvcache_apiserver::registry::RegistryError;
use kvcache_apiserver::registry::dynamic::ListParams;
use kvcache_apiserver::registry::generic::DeleteOptions;
use kvcache_apiserver::registry::kinds::{self, KindEntry};
use kvcache_apiserver::runtime::Node;
use kvcache_apiserver::runtime::local::LocalOptions;
use kvcache_apiserver::server::{self, ServeOptions};
use kvcache_units::parse_duration;

#[derive(Parser)]
#[command(
    name = "kv-apiserver",
    version,
    about = "The worker.gpustack.ai/v1 API server, with embedded crash-safe storage"
)]
struct Cli {
    /// Where the storage log (`storage/`), certificates (`pki/`) and kubeconfig files live.
    #[arg(long, default_value = "./data", global = true)]
    data_dir: PathBuf,
    /// Server configuration (settings, instance types); defaults when absent.
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    /// Where the objects are stored: `embedded` (a crash-safe log under <data-dir>/storage), or
    /// `etcd://host:port[,host:port...]`.
    #[arg(long, default_value = "embedded", global = true)]
    storage: StorageChoice,
    /// With etcd: the prefix of every key this server writes.
    #[arg(long, default_value = "/kvcache", global = true)]
    storage_prefix: String,
    /// With etcd: time between compactions (to the revision of the previous one); 0 never compacts.
    #[arg(long, default_value = "5m", value_parser = parse_duration, global = true)]
    etcd_compaction_interval: Duration,
    /// With etcd: the CA that signed etcd's serving certificate (PEM); turns TLS on.
    #[arg(long, global = true)]
    etcd_cafile: Option<PathBuf>,
    /// With etcd: a client certificate (PEM), with --etcd-keyfile.
    #[arg(long, global = true, requires = "etcd_keyfile")]
    etcd_certfile: Option<PathBuf>,
    /// With etcd: the client certificate's key (PEM), with --etcd-certfile.
    #[arg(long, global = true, requires = "etcd_certfile")]
    etcd_keyfile: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once per process
enum Command {
    /// Serves the API over HTTPS; writes <data-dir>/kubeconfig for kubectl.
    Serve {
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
        #[arg(long, default_value = "local", value_parser = parse_runtime)]
        runtime: String,
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
    },
    /// Writes the certificates of an aggregated install into --out: the serving certificate
    /// (tls.crt, tls.key) for <service>.<namespace>.svc, its CA (ca.crt, ca.key; kept, so running
    /// this again rotates the serving certificate under the same CA), and apiservice-cabundle.yaml,
    /// the APIService's caBundle as a patch that deploy/ applies.
    Certs {
        #[arg(long)]
        out: PathBuf,
        #[arg(long, default_value = "kvcache-apiserver")]
        service: String,
        #[arg(long, default_value = "gpustack-system")]
        namespace: String,
        /// More DNS names or IP addresses for the serving certificate, comma-separated.
        #[arg(long, value_delimiter = ',')]
        extra_names: Vec<String>,
    },
    /// Prints the Kubernetes objects the controllers render for the backends in manifest files
    /// (a file or a directory of .yaml files), as YAML, for review before applying them.
    Render {
        #[arg(short = 'f', long = "filename", required = true)]
        files: Vec<PathBuf>,
        /// The namespace of the store's objects.
        #[arg(long, default_value = "gpustack-system")]
        store_namespace: String,
    },
    /// Creates or updates the objects in manifest files (a file or a directory of .yaml files).
    Apply {
        #[arg(short = 'f', long = "filename", required = true)]
        files: Vec<PathBuf>,
        /// Namespace for namespaced objects that name none.
        #[arg(short, long, default_value = "default")]
        namespace: String,
        /// Run every check, store nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Prints objects as YAML.
    Get {
        /// A kind: its short name, plural, singular or kind name (`kubectl api-resources` lists them).
        kind: String,
        name: Option<String>,
        #[arg(short, long, default_value = "default")]
        namespace: String,
        /// List namespaced objects in every namespace.
        #[arg(short = 'A', long)]
        all_namespaces: bool,
    },
    /// Deletes an object (it stays, marked for deletion, while finalizers hold it).
    Delete {
        kind: String,
        name: String,
        #[arg(short, long, default_value = "default")]
        namespace: String,
    },
}

/// `local` or `kubernetes`.
fn parse_runtime(s: &str) -> Result<String, String> {
    match s {
        "local" | "kubernetes" => Ok(s.to_owned()),
        other => Err(format!("{other:?} is not a runtime; use local or kubernetes")),
    }
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

/// The server allocates and frees many small buffers per request (JSON values, headers,
/// field sets); mimalloc's thread-local free lists make that markedly cheaper than glibc's.
/// `cap` counts the bytes handed out and not yet freed, and the most that has been (a few atomic
/// operations per call, no limit), for `process_heap_allocated_bytes` and its peak.
#[global_allocator]
static GLOBAL: cap::Cap<mimalloc::MiMalloc> = cap::Cap::new(mimalloc::MiMalloc, usize::MAX);

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        // colours only for a person at a terminal, never in a container's log or a file
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = Cli::parse();
    let config = Config::load(cli.config.as_deref())?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(run(cli, config))
}

/// The storage flags as one choice: the prefix and TLS files go with `--storage etcd://...`.
fn storage_choice(cli: &Cli) -> anyhow::Result<StorageChoice> {
    let mut choice = cli.storage.clone();
    match &mut choice {
        StorageChoice::Etcd(etcd) => {
            if !cli.storage_prefix.starts_with('/') || cli.storage_prefix.len() < 2 {
                bail!(
                    "--storage-prefix {:?}: give an absolute key prefix such as /kvcache",
                    cli.storage_prefix
                );
            }
            etcd.prefix = cli.storage_prefix.clone();
            etcd.compaction_interval = cli.etcd_compaction_interval;
            let read = |p: &PathBuf| std::fs::read(p).with_context(|| format!("reading {}", p.display()));
            if let Some(ca) = &cli.etcd_cafile {
                let identity = match (&cli.etcd_certfile, &cli.etcd_keyfile) {
                    (Some(c), Some(k)) => Some((read(c)?, read(k)?)),
                    _ => None,
                };
                etcd.tls = Some(kvcache_apiserver::storage::etcd::EtcdTls {
                    ca: read(ca)?,
                    identity,
                });
            } else if cli.etcd_certfile.is_some() {
                bail!("--etcd-certfile needs --etcd-cafile (the CA of etcd's serving certificate)");
            }
        }
        StorageChoice::Embedded => {
            if cli.etcd_cafile.is_some() || cli.etcd_certfile.is_some() {
                bail!("--etcd-cafile, --etcd-certfile and --etcd-keyfile go with --storage etcd://host:port");
            }
        }
    }
    Ok(choice)
}

async fn run(cli: Cli, config: Config) -> anyhow::Result<()> {
    let mut opts = AppOptions::new(&cli.data_dir);
    opts.heap = Some(kvcache_apiserver::metrics::HeapReadings {
        allocated: || GLOBAL.allocated(),
        peak: || GLOBAL.max_allocated(),
    });
    opts.storage = storage_choice(&cli)?;
    opts.config = config;
    opts.config_path = cli.config.clone();
    if let Command::Serve {
        listen,
        watch_bookmark_interval,
        watch_history,
        watch_queue,
        shutdown_delay,
        controllers,
        runtime,
        runtime_kubeconfig,
        store_namespace,
        runtime_service_account,
        nodes,
        requeue_interval,
        store_binary,
        pki_dir,
        leader_elect_lease_duration,
        leader_elect_renew_deadline,
        leader_elect_retry_period,
        delegated,
    } = cli.command
    {
        let delegated = delegated.resolve().map_err(anyhow::Error::msg)?;
        if delegated.is_some() && controllers && runtime == "local" {
            bail!(
                "--auth delegated runs the controllers with --runtime kubernetes (the local runtime's store processes reach this server with its own certificates, which aggregated mode does not make); pass --runtime kubernetes or --controllers=false"
            );
        }
        let mut serving_files = None;
        if let Some((opts_d, files)) = delegated {
            let started = Delegated::start(&opts_d)
                .await
                .context("starting aggregated mode (--auth delegated)")?;
            opts.delegated = Some(started);
            serving_files = Some(files);
        }
        let timings = kvcache_store::election::Timings {
            lease_duration: leader_elect_lease_duration,
            renew_deadline: leader_elect_renew_deadline,
            retry_period: leader_elect_retry_period,
        };
        if let Err(e) = timings.validate() {
            bail!("--leader-elect-lease-duration, --leader-elect-renew-deadline, --leader-elect-retry-period: {e}");
        }
        opts.watch_history = watch_history;
        opts.watch_queue = watch_queue;
        opts.bookmark_interval = watch_bookmark_interval;
        // On etcd several replicas may serve: the controllers run on the one that holds their
        // Lease.
        let controller_election = matches!(opts.storage, StorageChoice::Etcd(_)).then(|| ElectionOptions {
            identity: format!(
                "{}-{}",
                std::fs::read_to_string("/etc/hostname")
                    .map_or_else(|_| "kv-apiserver".to_owned(), |h| h.trim().to_owned()),
                &uuid::Uuid::new_v4().simple().to_string()[..8]
            ),
            lease_duration: leader_elect_lease_duration,
            renew_deadline: leader_elect_renew_deadline,
            retry_period: leader_elect_retry_period,
        });
        if runtime != "kubernetes" && runtime_kubeconfig.is_some() {
            bail!("--runtime-kubeconfig goes with --runtime kubernetes");
        }
        if runtime != "kubernetes" && runtime_service_account.is_some() {
            bail!("--runtime-service-account goes with --runtime kubernetes");
        }
        let runtime_choice = if runtime == "kubernetes" && controllers {
            let client = kvcache_store::election::kube::client(runtime_kubeconfig.as_deref())
                .await
                .map_err(|e| anyhow::anyhow!("--runtime kubernetes: {e}"))?;
            Some(RuntimeChoice::Kubernetes(
                client,
                kvcache_apiserver::runtime::kubernetes::KubernetesOptions {
                    namespace: store_namespace,
                    service_account: runtime_service_account,
                },
            ))
        } else {
            None
        };
        if let Some(runtime) = runtime_choice {
            opts.controllers = Some(ControllerSetup {
                options: controller::Options {
                    requeue: requeue_interval.max(Duration::from_millis(100)),
                    ..controller::Options::default()
                },
                runtime,
                election: controller_election.clone(),
            });
        } else if controllers {
            let mut local = LocalOptions::new(&cli.data_dir);
            local.nodes = nodes
                .iter()
                .filter(|n| !n.is_empty())
                .map(|n| Node::stand_in(n))
                .collect();
            if let Some(bin) = store_binary {
                local.store_binary = bin;
            }
            if !local.store_binary.exists() {
                bail!(
                    "the local runtime starts {} and it is not there; build it (cargo build --release -p kvcache-store) or pass --store-binary",
                    local.store_binary.display()
                );
            }
            opts.controllers = Some(ControllerSetup {
                options: controller::Options {
                    requeue: requeue_interval.max(Duration::from_millis(100)),
                    ..controller::Options::default()
                },
                runtime: RuntimeChoice::Local(local),
                election: controller_election,
            });
        }
        let app = App::open(opts).await?;
        let serve = ServeOptions {
            listen,
            data_dir: cli.data_dir,
            shutdown_delay,
            pki_dir,
            serving_files,
        };
        return Ok(server::serve(app, serve, stop_signal()).await?);
    }
    if let Command::Render { files, store_namespace } = &cli.command {
        return render(files, store_namespace, &opts.config);
    }
    if let Command::Certs {
        out,
        service,
        namespace,
        extra_names,
    } = &cli.command
    {
        return certs(out, service, namespace, extra_names);
    }
    let app = App::open(opts).await.with_context(|| {
        format!(
            "opening the data in {} (is kv-apiserver serve running on it?)",
            cli.data_dir.display()
        )
    })?;
    match cli.command {
        Command::Apply {
            files,
            namespace,
            dry_run,
        } => apply(&app, &files, &namespace, dry_run).await,
        Command::Get {
            kind,
            name,
            namespace,
            all_namespaces,
        } => {
            let ns = (!all_namespaces).then_some(namespace.as_str());
            get(&app, resolve(&kind)?, ns, name.as_deref()).await
        }
        Command::Delete { kind, name, namespace } => delete(&app, resolve(&kind)?, &namespace, &name).await,
        Command::Serve { .. } | Command::Certs { .. } | Command::Render { .. } => Ok(()),
    }
}

/// `kv-apiserver render`: the manifests in `files`, as the controllers would render them.
fn render(files: &[PathBuf], namespace: &str, config: &Config) -> anyhow::Result<()> {
    let mut docs = Vec::new();
    for file in manifest_files(files)? {
        let text = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
        for doc in manifest::documents(&text).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))? {
            docs.push((file.display().to_string(), doc.value));
        }
    }
    let out = kvcache_apiserver::render::render(&docs, namespace, config).map_err(anyhow::Error::msg)?;
    print!("{out}");
    Ok(())
}

/// `kv-apiserver certs`.
fn certs(out: &std::path::Path, service: &str, namespace: &str, extra: &[String]) -> anyhow::Result<()> {
    let mut names = kvcache_certs::service_names(service, namespace);
    // The names kube-apiserver's aggregator verifies come first; the CN is the first.
    names.rotate_left(2);
    names.extend(extra.iter().filter(|n| !n.is_empty()).cloned());
    let install = kvcache_certs::install(out, &names).context("writing the certificates")?;
    use base64::Engine as _;
    let bundle = base64::engine::general_purpose::STANDARD.encode(install.ca_pem.as_bytes());
    let patch = format!(
        "# Written by kv-apiserver certs: the CA of the serving certificate, which kube-apiserver\n\
         # uses to verify this server. Run it again to rotate the serving certificate.\n\
         apiVersion: apiregistration.k8s.io/v1\n\
         kind: APIService\n\
         metadata:\n  name: v1.{group}\n\
         spec:\n  caBundle: {bundle}\n",
        group = kvcache_api::GROUP
    );
    kvcache_certs::write_file(&out.join("apiservice-cabundle.yaml"), patch.as_bytes(), 0o644)?;
    // deploy/etcd.yaml's member, reached through its headless Service, takes only this server.
    let etcd = format!("kvcache-etcd.{namespace}.svc");
    let etcd_names = vec![
        format!("kvcache-etcd-0.{etcd}"),
        format!("*.{etcd}"),
        etcd.clone(),
        "localhost".to_owned(),
        "127.0.0.1".to_owned(),
    ];
    kvcache_certs::install_etcd(out, &etcd_names).context("writing the storage's certificates")?;
    println!(
        "wrote {dir}/tls.crt and tls.key (for {}), ca.crt and apiservice-cabundle.yaml; \
         etcd-ca.crt, etcd-server.crt and .key (for {}), etcd-client.crt and .key",
        names.join(", "),
        etcd_names.join(", "),
        dir = out.display()
    );
    Ok(())
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

fn resolve(word: &str) -> anyhow::Result<&'static KindEntry> {
    kinds::resolve(word).with_context(|| {
        let names: Vec<&str> = kinds::KINDS
            .iter()
            .filter_map(|k| k.short_names.first().copied())
            .collect();
        format!(
            "the server doesn't have a resource type {word:?} (try {})",
            names.join(", ")
        )
    })
}

fn manifest_files(paths: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for p in paths {
        if p.is_dir() {
            let mut entries: Vec<PathBuf> = std::fs::read_dir(p)
                .with_context(|| format!("reading {}", p.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| f.extension().is_some_and(|x| x == "yaml" || x == "yml" || x == "json"))
                .collect();
            entries.sort();
            out.extend(entries);
        } else {
            out.push(p.clone());
        }
    }
    Ok(out)
}

async fn apply(app: &App, files: &[PathBuf], namespace: &str, dry_run: bool) -> anyhow::Result<()> {
    let mut failed = 0;
    for file in manifest_files(files)? {
        let text = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
        let docs = manifest::documents(&text).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
        for doc in docs {
            let applied = manifest::apply(&app.registry, doc, namespace, dry_run).await;
            for w in &applied.warnings {
                eprintln!("Warning: {w}");
            }
            let suffix = if dry_run { " (dry run)" } else { "" };
            match applied.result {
                Ok(manifest::Outcome::Created) => println!("{} created{suffix}", applied.object),
                Ok(manifest::Outcome::Configured) => println!("{} configured{suffix}", applied.object),
                Ok(manifest::Outcome::Unchanged) => println!("{} unchanged{suffix}", applied.object),
                Err(ApplyError::Refused { status, .. }) => {
                    failed += 1;
                    eprintln!(
                        "Error from server ({}): error when applying {}: {}",
                        status.reason.as_deref().unwrap_or_default(),
                        file.display(),
                        status.message.as_deref().unwrap_or_default()
                    );
                }
                Err(e) => {
                    failed += 1;
                    eprintln!("error: {}: {e}", file.display());
                }
            }
        }
    }
    if failed > 0 {
        bail!("{failed} object(s) were not applied");
    }
    Ok(())
}

fn resource(app: &App, kind: &KindEntry) -> anyhow::Result<std::sync::Arc<dyn kvcache_apiserver::registry::Resource>> {
    app.registry
        .resource(kind.plural)
        .map(|(_, r)| r.clone())
        .with_context(|| format!("{} is not served", kind.plural))
}

async fn get(app: &App, kind: &KindEntry, namespace: Option<&str>, name: Option<&str>) -> anyhow::Result<()> {
    let res = resource(app, kind)?;
    let ns = if kind.namespaced() { namespace } else { None };
    let items = match name {
        Some(n) => vec![
            res.get(ns.unwrap_or_default(), n)
                .await
                .map_err(|e| report(kind, n, &e))?,
        ],
        None => {
            res.list(ns, ListParams::default())
                .await
                .map_err(|e| report(kind, "", &e))?
                .items
        }
    };
    for item in items {
        print!("---\n{}", yaml_serde::to_string(&item)?);
    }
    Ok(())
}

async fn delete(app: &App, kind: &KindEntry, namespace: &str, name: &str) -> anyhow::Result<()> {
    let res = resource(app, kind)?;
    let ns = if kind.namespaced() { namespace } else { "" };
    let (_, gone) = res
        .delete(ns, name, DeleteOptions::default())
        .await
        .map_err(|e| report(kind, name, &e))?;
    let what = format!("{}.{}/{name}", kind.singular, kvcache_api::GROUP);
    if gone {
        println!("{what} deleted");
    } else {
        println!("{what} marked for deletion (finalizers hold it)");
    }
    Ok(())
}

fn report(kind: &KindEntry, name: &str, e: &RegistryError) -> anyhow::Error {
    let kvcache_apiserver::status::Refusal(_, status) = kvcache_apiserver::status::for_resource(kind.plural, name, e);
    anyhow::anyhow!(
        "Error from server ({}): {}",
        status.reason.unwrap_or_default(),
        status.message.unwrap_or_default()
    )
}
