//! `kv-router`: an OpenAI-API router in front of vLLM replicas. `Server` workers get requests by
//! load; with `Prefill` and `Decode` workers a prompt is prefilled on one (its KV saved into the
//! store) and decoded on another, which loads it from there (issue 40's design).
//!
//! Map:
//! - [`config`]: the command line;
//! - [`server`]: the routes and what handlers share; [`proxy`]: one proxied request end to end;
//! - [`request`]: reading a client's body, the prompt's size, the handoff's rewrites;
//! - [`handoff`]: the prefill call, its retries and fallbacks;
//! - [`relay`]: an engine's answer passed to the client frame by frame, timed and counted;
//! - [`upstream`]: the pooled client every engine call goes through;
//! - [`workers`]: the worker sets, their sources (`--workers-file`, `--workers-dns`) and the
//!   choice of a worker; [`health`]: the periodic check that takes workers out and back in;
//! - [`store_index`]: what the store holds for the router's tenant, followed from its leader;
//!   [`keys`]: the block keys a replica's connector saves a prompt under;
//! - [`engine_events`]: vLLM's KV events (what each replica holds in its own memory), read with
//!   [`msgpack`], received over [`zmtp`] and kept per replica by [`engine_memory`];
//! - [`placement`]: the answering worker for a prompt, by what it holds and its load;
//!   [`tokens`]: the prompt's tokens, found once; [`hits`]: what vLLM reports it reused;
//! - [`metrics`]: the `kvrouter_*` series; [`error`]: OpenAI-style errors.

#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod config;
pub mod engine_events;
pub mod engine_memory;
pub mod error;
pub mod handoff;
pub mod health;
pub mod hits;
pub mod keys;
pub mod metrics;
pub mod msgpack;
pub mod placement;
pub mod proxy;
pub mod relay;
pub mod request;
pub mod server;
pub mod store_index;
pub mod tokens;
pub mod upstream;
pub mod workers;
pub mod zmtp;

use std::sync::Arc;
use std::time::Duration;

use axum::serve::ListenerExt;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::server::App;
use crate::workers::dns::DnsWatch;
use crate::workers::file::FileWatch;

/// How long open requests may take to finish after a stop before the router exits anyway.
const DRAIN: Duration = Duration::from_secs(10);

/// Serves on `listener` until `cancel` fires: reads the worker sources once, then keeps them,
/// the workers' health and, when the environment names a store (`store_index.rs`), what it holds
/// current in the background.
pub async fn run(config: Config, listener: TcpListener, cancel: CancellationToken) -> std::io::Result<()> {
    let store = store_index::Source::from_env(|k| std::env::var(k).ok()).map_err(std::io::Error::other)?;
    let app = Arc::new(App::new(config));
    let tasks = cancel.child_token();
    if let Some(source) = store {
        let block_size = source.scope.block_size as usize;
        store_index::write(&app.store, |i| i.set_block_size(block_size));
        tracing::info!(leader = %source.leader, tenant = %source.scope.tenant, "following the store's blocks");
        let follow = store_index::follow(source, app.store.clone(), app.metrics.clone(), tasks.clone());
        tokio::spawn(follow);
    }
    if let Some(path) = &app.config.workers_file {
        let mut watch = FileWatch::new(path.clone());
        watch.poll(&app.pool).await;
        tokio::spawn(watch.run(app.pool.clone(), tasks.clone()));
    }
    for (i, source) in app.config.workers_dns.iter().enumerate() {
        let mut watch = DnsWatch::new(i, source.clone(), app.config.engine_events_ports);
        watch.poll(&app.pool).await;
        tokio::spawn(watch.run(app.pool.clone(), tasks.clone()));
    }
    tokio::spawn(health::run(app.clone(), tasks.clone()));

    let listener = listener.tap_io(|tcp| {
        // small SSE chunks leave at once
        let _ = tcp.set_nodelay(true);
    });
    let server = axum::serve(listener, server::router(app)).with_graceful_shutdown(cancel.clone().cancelled_owned());
    let result = tokio::select! {
        r = server => r,
        () = async { cancel.cancelled().await; tokio::time::sleep(DRAIN).await } => Ok(()),
    };
    tasks.cancel();
    result
}
