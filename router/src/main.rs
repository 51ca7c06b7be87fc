//! `kv-router`: parses the flags, starts logging and the runtime, serves until SIGINT or
//! SIGTERM, and turns a failure into one line on stderr and exit status 1.

use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Parser;
use kvcache_router::config::Config;
use tokio_util::sync::CancellationToken;

fn main() -> ExitCode {
    let config = match Config::try_parse() {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind;
            let _ = e.print();
            return if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(2)
            };
        }
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(&config.log_level));
    let filter = match filter {
        Ok(f) => f,
        Err(e) => {
            eprintln!("kv-router: error: --log-level {:?}: {e}", config.log_level);
            return ExitCode::from(2);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // colours only for a person at a terminal, never in a container's log or a file
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match runtime().and_then(|rt| rt.block_on(run(config))) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kv-router: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// One thread unless KVROUTER_WORKER_THREADS says otherwise: the router only moves bytes, and on
/// a small machine a request hopping between worker threads pays a cross-core wake-up per hop.
fn runtime() -> Result<tokio::runtime::Runtime> {
    let workers: usize = std::env::var("KVROUTER_WORKER_THREADS")
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

async fn run(config: Config) -> Result<()> {
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("listening on {}", config.listen))?;
    let addr = listener.local_addr().context("reading the listening address")?;
    tracing::info!(%addr, version = env!("CARGO_PKG_VERSION"), "listening");
    let cancel = stop_on_signal()?;
    kvcache_router::run(config, listener, cancel).await.context("serving")?;
    tracing::info!("stopped");
    Ok(())
}

/// A token that fires on SIGINT or SIGTERM.
fn stop_on_signal() -> Result<CancellationToken> {
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
    Ok(cancel)
}
