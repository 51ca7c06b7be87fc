//! `kv-store`: the leader, a member, the benchmark, the engine simulator, and a small ledger tool.
//! The flags and everything they drive live in the library; this file parses, checks, starts,
//! stops on SIGINT/SIGTERM, and turns a failure into one line on stderr and exit status 1.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use kvcache_store::bench::{self, BenchArgs};
use kvcache_store::client::Client;
use kvcache_store::engine_sim::{self, SimConfig};
use kvcache_store::error::StoreError;
use kvcache_store::flags::{self, format_size};
use kvcache_store::leader::{Leader, LeaderConfig, LeaderListeners};
use kvcache_store::member::{Member, MemberConfig};
use kvcache_store::proto::{GetTenantsRequest, Scope, SetTenantsRequest, TenantEntry};
use kvcache_store::tls::DialFlags;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Parser)]
#[command(
    name = "kv-store",
    version,
    about = "The KV-cache store: leader, member, bench, engine simulator"
)]
struct Cli {
    /// Stop (gracefully, then at once after 10 s) when standard input closes: a supervisor holds
    /// the other end of a pipe, so the process never outlives it, even after `kill -9`.
    #[arg(long, global = true)]
    exit_with_stdin: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the metadata leader.
    Leader(LeaderConfig),
    /// Run a member holding a segment of memory.
    Member(MemberConfig),
    /// Measure put, get and exists; prints JSON lines.
    Bench(BenchArgs),
    /// Measure what TLS transfers reach here with nothing of the store around them (the bound
    /// `bench`'s TLS figures are compared with); prints JSON lines.
    TlsBound(kvcache_store::tls::bound::BoundArgs),
    /// Simulate an engine (settings from the environment; see store/README.md).
    EngineSim,
    /// Count what a disk tier's directory holds before its member first opens it (a member Pod's
    /// init container): prints `{"entries":N}` (-1: it cannot be listed) and, with --write,
    /// writes the same line there (the container's termination message). Always exits 0.
    TierSurvey {
        #[arg(long)]
        dir: std::path::PathBuf,
        #[arg(long)]
        write: Option<std::path::PathBuf>,
    },
    /// Run a command as a child and stop it with this process: SIGTERM to it and what it started
    /// (its process group) on SIGTERM or SIGINT (or, with --exit-with-stdin, when standard input
    /// closes), SIGKILL 10 s later; when it ends on its own, what it left running is stopped too.
    /// The local runtime runs real engines this way, so that none outlives the server.
    Exec {
        /// The command and its arguments.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<String>,
    },
    /// Read or replace the tenant ledger.
    Tenants {
        #[arg(long)]
        leader: String,
        /// Replace the ledger with these entries (NAME=CEILING:BLOCK_SIZE:DTYPE[,sha256=HEX…]);
        /// none: print it.
        #[arg(long = "set", value_parser = flags::parse_tenant)]
        set: Vec<TenantEntry>,
        /// The controllers' token, for a leader started with `--control-token-file`.
        #[arg(long)]
        control_token_file: Option<std::path::PathBuf>,
        #[command(flatten)]
        tls: DialFlags,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        // colours only for a person at a terminal, never in a container's log or a file
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage(&e),
    };
    match runtime().and_then(|rt| rt.block_on(run(cli.command, cli.exit_with_stdin))) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // one line: the message and its causes, joined by ": "
            eprintln!("kv-store: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `--help` and `--version` print as clap writes them; a bad command line is one line too.
fn usage(e: &clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        print!("{}", e.render());
        return ExitCode::SUCCESS;
    }
    // clap's message, without its usage and tips, on one line
    let text = e.render().to_string();
    let message: Vec<&str> = text
        .lines()
        .map(str::trim)
        .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
        .filter(|l| !l.is_empty() && !l.starts_with("tip:"))
        .collect();
    let message = message.join(" ");
    let message = message.strip_prefix("error: ").unwrap_or(&message);
    eprintln!("kv-store: error: {message}; see kv-store --help");
    ExitCode::FAILURE
}

/// One thread per process unless KVSTORE_WORKER_THREADS says otherwise: on a small machine a
/// request that hops between worker threads pays a cross-core wake-up on every hop, which costs
/// more than the work itself (see store/README.md).
fn runtime() -> Result<tokio::runtime::Runtime> {
    let workers: usize = std::env::var("KVSTORE_WORKER_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let rt = if workers <= 1 {
        tokio::runtime::Builder::new_current_thread().enable_all().build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .enable_all()
            .build()
    };
    rt.context("starting the async runtime")
}

/// A token that fires on SIGINT or SIGTERM, and, with `--exit-with-stdin`, when standard input
/// closes. A process that has not stopped 10 s after its stdin closed exits at once.
fn stop_on_signal(exit_with_stdin: bool) -> Result<CancellationToken> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("listening for SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("listening for SIGINT")?;
    let cancel = CancellationToken::new();
    let fire = cancel.clone();
    tokio::spawn(async move {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        tracing::info!(signal = name, "stopping");
        fire.cancel();
    });
    if exit_with_stdin {
        watch_stdin(cancel.clone());
    }
    Ok(cancel)
}

/// Fires `cancel` when standard input reaches its end (the supervisor is gone), on a plain thread
/// so that it never holds the runtime open.
fn watch_stdin(cancel: CancellationToken) {
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
        tracing::info!("standard input closed: the supervisor is gone; stopping");
        cancel.cancel();
        std::thread::sleep(std::time::Duration::from_secs(10));
        // The graceful stop had 10 s; a store process keeps nothing on disk, so nothing is cut
        // short by leaving now, and an orphan that hangs must not outlive its supervisor.
        #[allow(clippy::disallowed_methods)]
        std::process::exit(1);
    });
}

/// `kv-store exec`: runs `command`, stops it when this process is told to stop, and fails when it
/// fails (its exit in the message).
async fn exec(command: Vec<String>, exit_with_stdin: bool) -> Result<()> {
    let (program, args) = command.split_first().context("exec: no command given")?;
    let cancel = stop_on_signal(exit_with_stdin)?;
    // A process group of its own: what the command starts (vLLM's engine core and workers) is
    // stopped with it, even when the command itself dies first and leaves them behind.
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {program}"))?;
    let group = child.id().and_then(|p| rustix::process::Pid::from_raw(p as i32));
    let status = tokio::select! {
        status = child.wait() => status,
        () = cancel.cancelled() => {
            signal_group(group, rustix::process::Signal::TERM);
            match tokio::time::timeout(std::time::Duration::from_secs(10), child.wait()).await {
                Ok(status) => status,
                Err(_) => {
                    let _ = child.kill().await;
                    child.wait().await
                }
            }
        }
    }
    .with_context(|| format!("waiting for {program}"))?;
    // whatever the command left running goes with it: asked first, killed if still there
    // after half a second
    signal_group(group, rustix::process::Signal::TERM);
    let asked = std::time::Instant::now();
    while group_alive(group) && asked.elapsed() < std::time::Duration::from_millis(500) {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    signal_group(group, rustix::process::Signal::KILL);
    if status.success() || cancel.is_cancelled() {
        return Ok(());
    }
    anyhow::bail!("{program} ended: {status}")
}

/// Whether a process of the group `group` leads is left.
fn group_alive(group: Option<rustix::process::Pid>) -> bool {
    group.is_some_and(|g| rustix::process::test_kill_process_group(g).is_ok())
}

/// Sends `signal` to every process of the group `group` leads (none left: nothing happens).
fn signal_group(group: Option<rustix::process::Pid>, signal: rustix::process::Signal) {
    if let Some(g) = group {
        let _ = rustix::process::kill_process_group(g, signal);
    }
}

/// One line for the supervisor; a supervisor that stopped reading (its end of the pipe closed)
/// is not a reason to stop serving, so a failed write is dropped, never a panic.
fn announce(fields: serde_json::Value) {
    use std::io::Write;
    let _ = writeln!(std::io::stdout().lock(), "{fields}");
}

/// One JSON line on stdout at every readiness change (`{"event":"readiness","state":"serving"}`),
/// so a supervisor learns at once that a member mounted or a leader serves; a leader's line also
/// carries the epoch it serves under.
fn announce_readiness(
    role: &'static str,
    mut rx: tokio::sync::watch::Receiver<kvcache_store::readiness::Readiness>,
    epoch: impl Fn() -> Option<u64> + Send + 'static,
) {
    tokio::spawn(async move {
        loop {
            let state = *rx.borrow_and_update();
            let mut line = serde_json::json!({"event": "readiness", "role": role, "state": state.as_str()});
            if let Some(e) = epoch() {
                line["epoch"] = e.into();
            }
            announce(line);
            if rx.changed().await.is_err() {
                return;
            }
        }
    });
}

fn status(s: tonic::Status) -> StoreError {
    StoreError::from_status(&s)
}

async fn run(command: Command, exit_with_stdin: bool) -> Result<()> {
    match command {
        Command::Leader(cfg) => leader(cfg, exit_with_stdin).await,
        Command::Member(cfg) => member(cfg, exit_with_stdin).await,
        Command::Bench(args) => bench(args).await,
        Command::TlsBound(args) => tls_bound(args).await,
        Command::Exec { command } => exec(command, exit_with_stdin).await,
        Command::EngineSim => engine_sim(exit_with_stdin).await,
        Command::TierSurvey { dir, write } => {
            let line = serde_json::json!({"entries": kvcache_store::member::tier::survey(&dir)}).to_string();
            println!("{line}");
            if let Some(w) = write
                && let Err(e) = std::fs::write(&w, &line)
            {
                eprintln!("kv-store tier-survey: writing {}: {e}", w.display());
            }
            Ok(())
        }
        Command::Tenants {
            leader,
            set,
            control_token_file,
            tls,
        } => tenants(&leader, set, control_token_file.as_deref(), &tls).await,
    }
}

/// `kv-store leader`: serves until a stop signal, announcing its ports and readiness.
async fn leader(cfg: LeaderConfig, exit_with_stdin: bool) -> Result<()> {
    let leader = Leader::new(cfg.clone())?;
    let listeners = LeaderListeners::bind(&cfg).await?;
    let a = listeners.addrs();
    let cancel = stop_on_signal(exit_with_stdin)?;
    announce(
        serde_json::json!({"event": "listening", "role": "leader", "grpc": a.grpc.to_string(),
        "fast": a.fast.map(|m| m.to_string()), "metrics": a.metrics.map(|m| m.to_string())}),
    );
    let l = leader.clone();
    announce_readiness("leader", leader.readiness().subscribe(), move || Some(l.epoch()));
    leader.serve(listeners, Registry::default(), cancel).await?;
    Ok(())
}

/// `kv-store member`: serves its segment until a stop signal, announcing its ports and readiness.
async fn member(cfg: MemberConfig, exit_with_stdin: bool) -> Result<()> {
    let member = Member::bind(cfg).await?;
    let a = member.addrs();
    let cancel = stop_on_signal(exit_with_stdin)?;
    announce(
        serde_json::json!({"event": "listening", "role": "member", "grpc": a.grpc.to_string(),
        "data": a.data.to_string(), "metrics": a.metrics.map(|m| m.to_string()),
        "local": member.local_socket()}),
    );
    announce_readiness("member", member.readiness().subscribe(), || None);
    member.serve(Registry::default(), cancel).await?;
    Ok(())
}

/// `kv-store bench`: one JSON line per measurement.
async fn bench(args: BenchArgs) -> Result<()> {
    let mut client = Client::connect_tls(&args.leader, args.scope(), args.tls.client()?)
        .await?
        .with_spin(args.spin);
    if !args.same_host {
        client = client.without_local();
    }
    if let Some(t) = bench::ensure_tenant(&client, &args).await?
        && args.register_tenant.is_none()
    {
        eprintln!(
            "kv-store bench: tenant {:?} was not in the leader's ledger; registered it with a ceiling of {} \
             (block size {}, dtype {})",
            t.name,
            format_size(t.ceiling),
            t.block_size,
            t.dtype
        );
    }
    bench::run(&client, &args.config(), |line| {
        if let Ok(s) = serde_json::to_string(line) {
            println!("{s}");
        }
    })
    .await?;
    Ok(())
}

/// `kv-store tls-bound`: one JSON line per measurement.
async fn tls_bound(args: kvcache_store::tls::bound::BoundArgs) -> Result<()> {
    let rows = tokio::task::spawn_blocking(move || kvcache_store::tls::bound::run(&args))
        .await
        .map_err(|e| anyhow::anyhow!("the measurement stopped: {e}"))??;
    for r in rows {
        if let Ok(s) = serde_json::to_string(&r) {
            println!("{s}");
        }
    }
    Ok(())
}

/// `kv-store engine-sim`: rounds of a simulated engine, one report line each, until its rounds
/// are done or a stop signal.
async fn engine_sim(exit_with_stdin: bool) -> Result<()> {
    let cfg = SimConfig::from_env(|k| std::env::var(k).ok())?;
    let cancel = stop_on_signal(exit_with_stdin)?;
    let client = match &cfg.leader {
        Some(leader) => {
            let tls = DialFlags::from_env(|k| std::env::var(k).ok())
                .client_from_env()
                .map_err(anyhow::Error::msg)?;
            Some(Client::connect_tls(leader, cfg.scope.clone(), tls).await?)
        }
        None => None,
    };
    let ready = Arc::new(AtomicBool::new(false));
    if let Some(addr) = &cfg.listen {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| anyhow::anyhow!("KVSTORE_LISTEN {addr}: {e}"))?;
        let (ready, cancel, model) = (ready.clone(), cancel.clone(), cfg.served_model.clone());
        tokio::spawn(async move {
            if let Err(e) = engine_sim::serve_health(listener, ready, model, cancel).await {
                tracing::error!("the health endpoint stopped: {e}");
            }
        });
    }
    let mut round = 0;
    loop {
        let report = engine_sim::round(client.as_ref(), &cfg, round).await?;
        println!("{}", serde_json::to_string(&report)?);
        ready.store(true, Ordering::Relaxed);
        round += 1;
        if cfg.rounds != 0 && round >= cfg.rounds {
            if cfg.idle_after {
                cancel.cancelled().await;
            }
            return Ok(());
        }
        tokio::select! {
            () = tokio::time::sleep(cfg.pause) => {}
            () = cancel.cancelled() => return Ok(()),
        }
    }
}

/// `kv-store tenants`: replaces the ledger when given entries, then prints it, one JSON line per
/// tenant.
async fn tenants(
    leader: &str,
    set: Vec<TenantEntry>,
    control_token_file: Option<&std::path::Path>,
    tls: &DialFlags,
) -> Result<()> {
    let token = match control_token_file {
        Some(p) => Some(kvcache_store::auth::read_token(p).map_err(|e| anyhow::anyhow!("--control-token-file: {e}"))?),
        None => None,
    };
    let client = Client::connect_tls(leader, Scope::default(), tls.client()?).await?;
    let mut control = client.control();
    if !set.is_empty() {
        control
            .set_tenants(kvcache_store::auth::request(
                SetTenantsRequest {
                    tenants: set,
                    ..Default::default()
                },
                token.as_deref(),
            )?)
            .await
            .map_err(status)?;
    }
    let read = kvcache_store::auth::request(GetTenantsRequest {}, token.as_deref())?;
    let t = control.get_tenants(read).await.map_err(status)?.into_inner();
    for t in t.tenants {
        println!(
            "{}",
            serde_json::json!({"name": t.name, "ceiling": t.ceiling, "grant": t.grant, "used": t.used,
                "objects": t.objects, "block_size": t.block_size, "dtype": t.dtype,
                "credentials": t.credentials, "puts": t.puts, "hits": t.hits, "misses": t.misses})
        );
    }
    Ok(())
}
