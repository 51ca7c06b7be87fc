//! `kv-store`: the leader, a member, the benchmark, the engine simulator, and a small ledger tool.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use kvcache_store::bench::{self, BenchConfig};
use kvcache_store::client::Client;
use kvcache_store::engine_sim::{self, SimConfig};
use kvcache_store::leader::{Leader, LeaderConfig, Strategy, ledger::Layout};
use kvcache_store::member::{Member, MemberConfig, MemberMetrics};
use kvcache_store::metrics;
use kvcache_store::proto::{GetTenantsRequest, Scope, SetTenantsRequest, TenantEntry};
use kvcache_units::{parse_bytes as parse_size, parse_duration};
use tokio::net::TcpListener;

#[derive(Debug, Parser)]
#[command(
    name = "kv-store",
    about = "The KV-cache store: leader, member, bench, engine simulator"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

fn size(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| e.to_string())
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the metadata leader.
    Leader {
        #[arg(long, default_value = "127.0.0.1:50051")]
        listen: SocketAddr,
        /// The framed metadata port (default: the --listen port + 1, or any port when that is 0);
        /// `off` serves gRPC only.
        #[arg(long)]
        fast_listen: Option<String>,
        /// Serve /metrics, /healthz and /readyz here.
        #[arg(long)]
        metrics_listen: Option<SocketAddr>,
        /// Only registered tenants may write; `--multi-tenancy=false` puts everything in one tenant.
        #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
        multi_tenancy: bool,
        /// With multi-tenancy off: the block size every client must declare (unset: not checked).
        #[arg(long, requires = "default_dtype")]
        default_block_size: Option<u32>,
        #[arg(long, requires = "default_block_size")]
        default_dtype: Option<String>,
        #[arg(long, value_enum, default_value = "free-ratio-first")]
        allocation_strategy: Strategy,
        /// How long a get or exists protects a value from eviction and removal.
        #[arg(long, default_value = "10s", value_parser = parse_duration)]
        lease_ttl: Duration,
        /// A member silent for longer loses its objects.
        #[arg(long, default_value = "10s", value_parser = parse_duration)]
        member_ttl: Duration,
        /// How long a writer has to send a reserved value.
        #[arg(long, default_value = "30s", value_parser = parse_duration)]
        put_ttl: Duration,
        /// Extra wait before an abandoned reservation is reused (longer than a member's 10 s write grace).
        #[arg(long, default_value = "30s", value_parser = parse_duration)]
        put_grace: Duration,
        #[arg(long, default_value = "64Mi", value_parser = size)]
        max_value_size: u64,
        /// Evict when usage passes this share of capacity.
        #[arg(long, default_value_t = 0.90)]
        high_watermark: f64,
        /// Share of capacity freed per eviction round.
        #[arg(long, default_value_t = 0.05)]
        eviction_ratio: f64,
        /// Initial ledger entries, NAME=CEILING:BLOCK_SIZE:DTYPE (e.g. team-a=8Gi:64:bfloat16).
        #[arg(long = "tenant")]
        tenants: Vec<String>,
        /// Keep polling this long after a request instead of sleeping (store/README.md,
        /// "Performance"); 0 never polls.
        #[arg(long, default_value = "200us", value_parser = parse_duration)]
        spin: Duration,
    },
    /// Run a member holding a segment of memory.
    Member {
        #[arg(long)]
        leader: String,
        #[arg(long, value_parser = size)]
        capacity: u64,
        /// gRPC (SegmentData) listen address.
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: SocketAddr,
        /// Framed data port listen address.
        #[arg(long, default_value = "127.0.0.1:0")]
        data_listen: SocketAddr,
        /// Stable member name (the node); defaults to the host name.
        #[arg(long)]
        name: Option<String>,
        #[arg(long, default_value = "/dev/shm")]
        shm_dir: PathBuf,
        #[arg(long)]
        advertise_host: Option<String>,
        #[arg(long)]
        metrics_listen: Option<SocketAddr>,
        #[arg(long, default_value = "64Mi", value_parser = size)]
        max_value_size: u64,
        /// Skip touching every page of the segment at start.
        #[arg(long)]
        no_prefault: bool,
        /// Keep polling this long after a request instead of sleeping (store/README.md,
        /// "Performance"); 0 never polls.
        #[arg(long, default_value = "200us", value_parser = parse_duration)]
        spin: Duration,
    },
    /// Measure put, get and exists; prints JSON lines.
    Bench {
        #[arg(long)]
        leader: String,
        #[arg(long, default_value = "bench")]
        tenant: String,
        #[arg(long, default_value_t = 64)]
        block_size: u32,
        #[arg(long, default_value = "bfloat16")]
        dtype: String,
        /// Add the tenant to the leader's ledger with this ceiling before running.
        #[arg(long, value_parser = size)]
        register_tenant: Option<u64>,
        #[arg(long, default_value_t = 2000)]
        ops: usize,
        #[arg(long, default_value = "20s", value_parser = parse_duration)]
        max_time: Duration,
        #[arg(long, default_value = "256Mi", value_parser = size)]
        ring: u64,
        #[arg(long, value_delimiter = ',', default_value = "64Ki,1Mi,4Mi", value_parser = size)]
        sizes: Vec<u64>,
        /// Poll this long for each reply before sleeping; 0 never polls.
        #[arg(long, default_value = "200us", value_parser = parse_duration)]
        spin: Duration,
    },
    /// Simulate an engine (settings from the environment; see store/README.md).
    EngineSim,
    /// Read or replace the tenant ledger.
    Tenants {
        #[arg(long)]
        leader: String,
        /// Replace the ledger with these entries (NAME=CEILING:BLOCK_SIZE:DTYPE); none: print it.
        #[arg(long = "set")]
        set: Vec<String>,
    },
}

fn parse_tenant(s: &str) -> Result<TenantEntry> {
    let (name, rest) = s
        .split_once('=')
        .context("write tenants as NAME=CEILING:BLOCK_SIZE:DTYPE")?;
    let mut parts = rest.splitn(3, ':');
    let (Some(c), Some(b), Some(d)) = (parts.next(), parts.next(), parts.next()) else {
        bail!("tenant {s:?}: write NAME=CEILING:BLOCK_SIZE:DTYPE, e.g. team-a=8Gi:64:bfloat16");
    };
    Ok(TenantEntry {
        name: name.to_string(),
        ceiling: parse_size(c)?,
        block_size: b
            .parse()
            .with_context(|| format!("tenant {s:?}: block size {b:?} is not a number"))?,
        dtype: d.to_string(),
    })
}

fn announce(fields: serde_json::Value) {
    println!("{fields}");
}

async fn serve_metrics(addr: Option<SocketAddr>, source: Arc<dyn metrics::Source>) -> Result<Option<SocketAddr>> {
    let Some(addr) = addr else { return Ok(None) };
    let l = TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding metrics address {addr}"))?;
    let bound = l.local_addr()?;
    tokio::spawn(metrics::serve(l, source));
    Ok(Some(bound))
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    // One thread per process unless KVSTORE_WORKER_THREADS says otherwise: on a small machine a
    // request that hops between worker threads pays a cross-core wake-up on every hop, which
    // costs more than the work itself (see store/README.md).
    let workers: usize = std::env::var("KVSTORE_WORKER_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let rt = if workers <= 1 {
        tokio::runtime::Builder::new_current_thread().enable_all().build()?
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .enable_all()
            .build()?
    };
    rt.block_on(run(cli.command))
}

async fn run(command: Command) -> Result<()> {
    match command {
        Command::Leader {
            listen,
            fast_listen,
            metrics_listen,
            multi_tenancy,
            default_block_size,
            default_dtype,
            allocation_strategy,
            lease_ttl,
            member_ttl,
            put_ttl,
            put_grace,
            max_value_size,
            high_watermark,
            eviction_ratio,
            tenants,
            spin,
        } => {
            if !(0.0..=1.0).contains(&high_watermark) || !(0.0..=1.0).contains(&eviction_ratio) {
                bail!("--high-watermark and --eviction-ratio are shares of capacity, between 0 and 1");
            }
            let default_layout = default_block_size
                .zip(default_dtype)
                .map(|(block_size, dtype)| Layout { block_size, dtype });
            let cfg = LeaderConfig {
                multi_tenancy,
                default_layout,
                strategy: allocation_strategy,
                lease_ttl,
                member_ttl,
                put_ttl,
                put_grace,
                max_value_size,
                high_watermark,
                eviction_ratio,
                spin,
                ..LeaderConfig::default()
            };
            let leader = Leader::new(cfg);
            if !tenants.is_empty() {
                let entries = tenants.iter().map(|t| parse_tenant(t)).collect::<Result<Vec<_>>>()?;
                leader.with(|s| s.set_tenants(&entries))?;
            }
            let listener = TcpListener::bind(listen)
                .await
                .with_context(|| format!("binding {listen}"))?;
            let grpc = listener.local_addr()?;
            let fast_addr = match fast_listen.as_deref() {
                Some("off") => None,
                Some(a) => Some(
                    a.parse::<SocketAddr>()
                        .with_context(|| format!("--fast-listen {a:?}"))?,
                ),
                None if listen.port() == 0 => Some(SocketAddr::new(listen.ip(), 0)),
                None => Some(SocketAddr::new(listen.ip(), listen.port().wrapping_add(1))),
            };
            let fast = match fast_addr {
                Some(a) => Some(
                    TcpListener::bind(a)
                        .await
                        .with_context(|| format!("binding the fast port {a}"))?,
                ),
                None => None,
            };
            let fast_bound = fast.as_ref().map(|l| l.local_addr()).transpose()?;
            let metrics = serve_metrics(metrics_listen, Arc::new(leader.clone())).await?;
            announce(
                serde_json::json!({"event": "listening", "role": "leader", "grpc": grpc.to_string(),
                "fast": fast_bound.map(|m| m.to_string()), "metrics": metrics.map(|m| m.to_string())}),
            );
            leader.serve(listener, fast).await.context("leader server stopped")?;
            Ok(())
        }
        Command::Member {
            leader,
            capacity,
            listen,
            data_listen,
            name,
            shm_dir,
            advertise_host,
            metrics_listen,
            max_value_size,
            no_prefault,
            spin,
        } => {
            let name = name
                .or_else(|| std::env::var("HOSTNAME").ok())
                .or_else(|| {
                    std::fs::read_to_string("/etc/hostname")
                        .ok()
                        .map(|s| s.trim().to_string())
                })
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| format!("member-{}", std::process::id()));
            if capacity == 0 {
                bail!("--capacity must be greater than 0 (e.g. 8Gi)");
            }
            let cfg = MemberConfig {
                leader,
                name,
                capacity,
                shm_dir,
                advertise_host,
                max_value_size,
                prefault: !no_prefault,
                spin,
            };
            let member = Member::bind(cfg, listen, data_listen).await?;
            let metrics = serve_metrics(metrics_listen, Arc::new(MemberMetrics(member.segment()))).await?;
            let (grpc, data) = member.local_addrs()?;
            announce(
                serde_json::json!({"event": "listening", "role": "member", "grpc": grpc.to_string(),
                "data": data.to_string(), "metrics": metrics.map(|m| m.to_string())}),
            );
            member.run().await?;
            Ok(())
        }
        Command::Bench {
            leader,
            tenant,
            block_size,
            dtype,
            register_tenant,
            ops,
            max_time,
            ring,
            sizes,
            spin,
        } => {
            let scope = Scope {
                tenant: tenant.clone(),
                block_size,
                dtype: dtype.clone(),
            };
            let client = Client::connect(&leader, scope).await?.with_spin(spin);
            if let Some(ceiling) = register_tenant {
                let mut control = client.control();
                let current = control.get_tenants(GetTenantsRequest {}).await?.into_inner();
                let mut entries: Vec<TenantEntry> = current
                    .tenants
                    .into_iter()
                    .filter(|t| t.name != tenant)
                    .map(|t| TenantEntry {
                        name: t.name,
                        ceiling: t.ceiling,
                        block_size: t.block_size,
                        dtype: t.dtype,
                    })
                    .collect();
                entries.push(TenantEntry {
                    name: tenant,
                    ceiling,
                    block_size,
                    dtype,
                });
                control.set_tenants(SetTenantsRequest { tenants: entries }).await?;
            }
            let cfg = BenchConfig {
                sizes,
                ops,
                max_time,
                ring_bytes: ring,
            };
            bench::run(&client, &cfg, |line| {
                if let Ok(s) = serde_json::to_string(line) {
                    println!("{s}");
                }
            })
            .await?;
            Ok(())
        }
        Command::EngineSim => {
            let cfg = SimConfig::from_env(|k| std::env::var(k).ok())?;
            let client = Client::connect(&cfg.leader, cfg.scope.clone()).await?;
            let mut round = 0;
            loop {
                let report = engine_sim::round(&client, &cfg, round).await?;
                println!("{}", serde_json::to_string(&report)?);
                round += 1;
                if cfg.rounds != 0 && round >= cfg.rounds {
                    return Ok(());
                }
            }
        }
        Command::Tenants { leader, set } => {
            let client = Client::connect(&leader, Scope::default()).await?;
            let mut control = client.control();
            if !set.is_empty() {
                let entries = set.iter().map(|t| parse_tenant(t)).collect::<Result<Vec<_>>>()?;
                control.set_tenants(SetTenantsRequest { tenants: entries }).await?;
            }
            let t = control.get_tenants(GetTenantsRequest {}).await?.into_inner();
            for t in t.tenants {
                println!(
                    "{}",
                    serde_json::json!({"name": t.name, "ceiling": t.ceiling, "grant": t.grant, "used": t.used,
                        "objects": t.objects, "block_size": t.block_size, "dtype": t.dtype})
                );
            }
            Ok(())
        }
    }
}
