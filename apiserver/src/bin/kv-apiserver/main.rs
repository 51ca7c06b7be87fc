//! `kv-apiserver`: the API server (`serve`), and offline commands over a stopped server's data
//! directory (`apply`, `get`, `delete`) that run the same admission rules, `render` and `certs`.
//! This file parses the flags shared by every command into the application's options, in one
//! place ([`Global::app_options`]), and hands them to the command's own module.

mod certs;
mod offline;
mod render;
mod serve;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::{Args, Parser, Subcommand};
use kvcache_apiserver::app::{AppOptions, StorageChoice};
use kvcache_apiserver::config::Config;
use kvcache_units::parse_duration;

#[derive(Parser)]
#[command(
    name = "kv-apiserver",
    version,
    about = "The worker.gpustack.ai/v1 API server, with embedded crash-safe storage"
)]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: Command,
}

/// The flags every command takes: where the data and configuration are, and the storage.
#[derive(Args)]
struct Global {
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
}

#[derive(Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once per process
enum Command {
    Serve(serve::ServeArgs),
    Certs(certs::CertsArgs),
    Render(render::RenderArgs),
    #[command(flatten)]
    Offline(offline::Offline),
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
    let config = Config::load(cli.global.config.as_deref())?;
    match cli.command {
        Command::Certs(args) => certs::run(&args),
        Command::Render(args) => async_main(render::run(&args, &config)),
        Command::Serve(args) => {
            let opts = cli.global.app_options(config)?;
            async_main(serve::run(opts, args))
        }
        Command::Offline(command) => {
            let opts = cli.global.app_options(config)?;
            async_main(offline::run(opts, command))
        }
    }
}

/// Runs `f` on a multi-threaded Tokio runtime.
fn async_main(f: impl std::future::Future<Output = anyhow::Result<()>>) -> anyhow::Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(f)
}

impl Global {
    /// The application's options these flags and `config` give; a command adds its own.
    fn app_options(&self, config: Config) -> anyhow::Result<AppOptions> {
        let mut opts = AppOptions::new(&self.data_dir);
        opts.heap = Some(kvcache_apiserver::metrics::HeapReadings {
            allocated: || GLOBAL.allocated(),
            peak: || GLOBAL.max_allocated(),
        });
        opts.storage = self.storage_choice()?;
        opts.config = config;
        opts.config_path = self.config.clone();
        Ok(opts)
    }

    /// The storage flags as one choice: the prefix and TLS files go with `--storage etcd://...`.
    fn storage_choice(&self) -> anyhow::Result<StorageChoice> {
        let mut choice = self.storage.clone();
        match &mut choice {
            StorageChoice::Etcd(etcd) => {
                if !self.storage_prefix.starts_with('/') || self.storage_prefix.len() < 2 {
                    bail!(
                        "--storage-prefix {:?}: give an absolute key prefix such as /kvcache",
                        self.storage_prefix
                    );
                }
                etcd.prefix = self.storage_prefix.clone();
                etcd.compaction_interval = self.etcd_compaction_interval;
                let read = |p: &PathBuf| std::fs::read(p).with_context(|| format!("reading {}", p.display()));
                if let Some(ca) = &self.etcd_cafile {
                    let identity = match (&self.etcd_certfile, &self.etcd_keyfile) {
                        (Some(c), Some(k)) => Some((read(c)?, read(k)?)),
                        _ => None,
                    };
                    etcd.tls = Some(kvcache_apiserver::storage::etcd::EtcdTls {
                        ca: read(ca)?,
                        identity,
                    });
                } else if self.etcd_certfile.is_some() {
                    bail!("--etcd-certfile needs --etcd-cafile (the CA of etcd's serving certificate)");
                }
            }
            StorageChoice::Embedded => {
                if self.etcd_cafile.is_some() || self.etcd_certfile.is_some() {
                    bail!("--etcd-cafile, --etcd-certfile and --etcd-keyfile go with --storage etcd://host:port");
                }
            }
        }
        Ok(choice)
    }
}
