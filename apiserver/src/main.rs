//! `kv-apiserver`: the API server (`serve`), and offline commands over a stopped server's data
//! directory (`apply`, `get`, `delete`) that run the same admission rules.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};
use kvcache_api::{Kind, Object};
use kvcache_apiserver::config::Config;
use kvcache_apiserver::manifest::{self, ApplyError, Outcome};
use kvcache_apiserver::registry::generic::{DeleteOptions, Deleted, ListOptions};
use kvcache_apiserver::registry::{Context, Registries, RegistryError, Store, Strategy};
use kvcache_apiserver::server::{self, ServeOptions};
use kvcache_apiserver::storage::embedded::{Embedded, Options};
use std::time::Duration;

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
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serves the API over HTTPS; writes <data-dir>/kubeconfig for kubectl.
    Serve {
        #[arg(long, default_value = "127.0.0.1:6443")]
        listen: std::net::SocketAddr,
        /// Seconds between BOOKMARK events on watches that allow them.
        #[arg(long, default_value_t = 60, hide = true)]
        watch_bookmark_interval: u64,
        /// Changes kept in memory for watches that resume from an older resourceVersion.
        #[arg(long, default_value_t = 10_000, hide = true)]
        watch_history: usize,
        /// Seconds to keep serving (with /readyz failing) after SIGTERM.
        #[arg(long, default_value_t = 0)]
        shutdown_delay: u64,
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
        /// kvcb, kvcp, kvcpb, md (or any plural, singular or kind name).
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

/// The server allocates and frees many small buffers per request (JSON values, headers,
/// field sets); mimalloc's thread-local free lists make that markedly cheaper than glibc's.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let config = Config::load(cli.config.as_deref())?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(run(cli, config))
}

async fn run(cli: Cli, config: Config) -> anyhow::Result<()> {
    if let Command::Serve {
        listen,
        watch_bookmark_interval,
        watch_history,
        shutdown_delay,
    } = cli.command
    {
        let opts = ServeOptions {
            listen,
            data_dir: cli.data_dir.clone(),
            config,
            bookmark_interval: Duration::from_secs(watch_bookmark_interval.max(1)),
            shutdown_delay: Duration::from_secs(shutdown_delay),
            watch_history,
        };
        return Ok(server::serve(opts, stop_signal()).await?);
    }
    let storage_dir = cli.data_dir.join("storage");
    let storage = Embedded::open(&storage_dir, Options::default()).with_context(|| {
        format!(
            "opening the storage in {} (is kv-apiserver serve running on it?)",
            storage_dir.display()
        )
    })?;
    let reg = Registries::new(
        Arc::new(storage),
        Context {
            config: Arc::new(config),
        },
    );
    match cli.command {
        Command::Apply {
            files,
            namespace,
            dry_run,
        } => apply(&reg, &files, &namespace, dry_run).await,
        Command::Get {
            kind,
            name,
            namespace,
            all_namespaces,
        } => {
            let ns = (!all_namespaces).then_some(namespace.as_str());
            match resolve(&kind)? {
                "KVCacheBackend" => get(&reg.backends, ns, name.as_deref()).await,
                "KVCachePool" => get(&reg.pools, ns, name.as_deref()).await,
                "KVCachePoolBinding" => get(&reg.bindings, ns, name.as_deref()).await,
                _ => get(&reg.model_deployments, ns, name.as_deref()).await,
            }
        }
        Command::Delete { kind, name, namespace } => match resolve(&kind)? {
            "KVCacheBackend" => delete(&reg.backends, &namespace, &name).await,
            "KVCachePool" => delete(&reg.pools, &namespace, &name).await,
            "KVCachePoolBinding" => delete(&reg.bindings, &namespace, &name).await,
            _ => delete(&reg.model_deployments, &namespace, &name).await,
        },
        Command::Serve { .. } => Ok(()),
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

fn resolve(kind: &str) -> anyhow::Result<&'static str> {
    manifest::resolve_kind(kind)
        .with_context(|| format!("the server doesn't have a resource type {kind:?} (try kvcb, kvcp, kvcpb or md)"))
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

async fn apply(reg: &Registries, files: &[PathBuf], namespace: &str, dry_run: bool) -> anyhow::Result<()> {
    let mut failed = 0;
    for file in manifest_files(files)? {
        let text = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
        let docs = manifest::documents(&text).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
        for doc in docs {
            let applied = manifest::apply(reg, doc, namespace, dry_run).await;
            for w in &applied.warnings {
                eprintln!("Warning: {w}");
            }
            let suffix = if dry_run { " (dry run)" } else { "" };
            match applied.result {
                Ok(Outcome::Created) => println!("{} created{suffix}", applied.object),
                Ok(Outcome::Configured) => println!("{} configured{suffix}", applied.object),
                Ok(Outcome::Unchanged) => println!("{} unchanged{suffix}", applied.object),
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

async fn get<S: Strategy>(store: &Store<S>, namespace: Option<&str>, name: Option<&str>) -> anyhow::Result<()> {
    let items: Vec<Object<S::Kind>> = match name {
        Some(n) => vec![
            store
                .get(namespace.unwrap_or_default(), n)
                .await
                .map_err(report::<S::Kind>(n))?,
        ],
        None => {
            store
                .list(namespace, ListOptions::default())
                .await
                .map_err(report::<S::Kind>(""))?
                .items
        }
    };
    for item in items {
        print!("---\n{}", yaml_serde::to_string(&item)?);
    }
    Ok(())
}

async fn delete<S: Strategy>(store: &Store<S>, namespace: &str, name: &str) -> anyhow::Result<()> {
    match store
        .delete(namespace, name, DeleteOptions::default())
        .await
        .map_err(report::<S::Kind>(name))?
    {
        Deleted::Gone(_) => println!("{}.{}/{name} deleted", S::Kind::SINGULAR, kvcache_api::GROUP),
        Deleted::Pending(_) => println!(
            "{}.{}/{name} marked for deletion (finalizers hold it)",
            S::Kind::SINGULAR,
            kvcache_api::GROUP
        ),
    }
    Ok(())
}

fn report<K: Kind>(name: &str) -> impl FnOnce(RegistryError) -> anyhow::Error + '_ {
    move |e| {
        let (_, status) = kvcache_apiserver::status::from_error::<K>(name, &e);
        anyhow::anyhow!(
            "Error from server ({}): {}",
            status.reason.unwrap_or_default(),
            status.message.unwrap_or_default()
        )
    }
}
