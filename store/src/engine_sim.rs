//! `kv-store engine-sim`: a stand-in for an inference engine. Sessions send prompts that share
//! prefixes (a few "system prompts" plus per-request suffixes); each prompt is cut into blocks of
//! `block_size` tokens, and each block is keyed by a hash of the whole prefix up to it, as engines
//! key their KV blocks. A block found in the store is a hit (and its bytes are checked); the first
//! miss ends reuse for that prompt, and every block from there is "computed" and stored.
//!
//! Environment (what injection gives an engine Pod, with our own names first):
//! - `KVSTORE_LEADER` or `MOONCAKE_MASTER`: the leader, HOST:PORT; without one the engine runs
//!   with no cache at all (every block is computed, nothing is stored);
//! - `KVSTORE_TENANT` or `MOONCAKE_TENANT_ID`: the tenant (reuse domain), default `default`;
//! - `KVSTORE_BLOCK_SIZE`: tokens per block (required with a leader; 16 without);
//! - `KVSTORE_DTYPE`: the KV dtype (required with a leader; `auto` without);
//! - `KVSTORE_CREDENTIAL`: the tenant's credential, when the ledger binds the tenant to one;
//! - `KVSTORE_CLIENT`: the replica's name (`<deployment>/<replica>`), which the leader counts
//!   the replica's gets, hits and puts under;
//! - `KVSTORE_SESSIONS` (8), `KVSTORE_REQUESTS` per session (16), `KVSTORE_PREFIXES` (4 shared
//!   system prompts), `KVSTORE_PREFIX_BLOCKS` (8), `KVSTORE_SUFFIX_BLOCKS` (4),
//!   `KVSTORE_BLOCK_BYTES` (bytes stored per block, default 64Ki), `KVSTORE_ROUNDS` (1; 0 = run
//!   until stopped, printing a line per round), `KVSTORE_ROUND_PAUSE` (time between rounds,
//!   default `0s`), `KVSTORE_AFTER_ROUNDS` (`exit`, the default, or `idle`: stay up, serving no
//!   more requests, until stopped, as an engine without traffic);
//! - `KVSTORE_LISTEN` (HOST:PORT, optional): answer an engine's health check there, `GET /health`
//!   200 once the first round has run (503 before), as an engine does once its model is loaded,
//!   so a kubelet's probes can watch the simulator like a real engine; with
//!   `KVSTORE_SERVED_MODEL` it also lists that model at `GET /v1/models`, as an engine's
//!   OpenAI API does, so a router in front of simulated engines can be reached through.
//!
//! A store call that fails (during a failover, say) is counted in the report's `errors` and the
//! block is computed instead, as an engine does; a refusal no failover explains (a layout the
//! ledger does not have, a malformed request) and a hit whose bytes differ from what that key's
//! block holds end the simulator with an error.

use std::collections::HashMap;

use bytes::Bytes;
use serde::Serialize;

use crate::client::Client;
use crate::error::{ErrorCode, Result, StoreError};
use crate::proto::Scope;
use kvcache_units::parse_bytes as parse_size;

/// The simulator's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimConfig {
    /// The leader, or none for an engine without a cache.
    pub leader: Option<String>,
    pub scope: Scope,
    pub sessions: usize,
    pub requests: usize,
    pub prefixes: usize,
    pub prefix_blocks: usize,
    pub suffix_blocks: usize,
    pub block_bytes: u64,
    pub rounds: u64,
    /// Time between rounds.
    pub pause: std::time::Duration,
    /// Stay up after the last round instead of exiting.
    pub idle_after: bool,
    /// Where to answer `GET /health`, if anywhere.
    pub listen: Option<String>,
    /// The model listed at `GET /v1/models` (on `listen`), if any.
    pub served_model: Option<String>,
}

impl SimConfig {
    /// Reads the settings from an environment lookup (`std::env::var` in the binary).
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let bad = |m: String| StoreError::new(ErrorCode::InvalidArgument, m);
        let first = |names: &[&str]| names.iter().find_map(|n| get(n).filter(|v| !v.is_empty()));
        let leader = first(&["KVSTORE_LEADER", "MOONCAKE_MASTER"]);
        let tenant = first(&["KVSTORE_TENANT", "MOONCAKE_TENANT_ID"]).unwrap_or_else(|| "default".into());
        // Without a cache the layout only shapes the simulated prompts.
        let block_size = first(&["KVSTORE_BLOCK_SIZE"])
            .or_else(|| leader.is_none().then(|| "16".to_owned()))
            .ok_or_else(|| bad("set KVSTORE_BLOCK_SIZE to the domain's tokens per block".into()))?
            .parse::<u32>()
            .ok()
            .filter(|b| *b > 0)
            .ok_or_else(|| bad("KVSTORE_BLOCK_SIZE must be a whole number greater than 0".into()))?;
        let dtype = first(&["KVSTORE_DTYPE"])
            .or_else(|| leader.is_none().then(|| "auto".to_owned()))
            .ok_or_else(|| bad("set KVSTORE_DTYPE to the domain's dtype".into()))?;
        let num = |name: &str, default: u64| -> Result<u64> {
            match first(&[name]) {
                None => Ok(default),
                Some(v) => v
                    .parse()
                    .map_err(|_| bad(format!("{name} must be a whole number, not {v:?}"))),
            }
        };
        let block_bytes = match first(&["KVSTORE_BLOCK_BYTES"]) {
            None => 64 * 1024,
            Some(v) => parse_size(&v).map_err(|e| bad(format!("KVSTORE_BLOCK_BYTES: {e}")))?,
        };
        let pause = match first(&["KVSTORE_ROUND_PAUSE"]) {
            None => std::time::Duration::ZERO,
            Some(v) => kvcache_units::parse_duration(&v).map_err(|e| bad(format!("KVSTORE_ROUND_PAUSE: {e}")))?,
        };
        let idle_after = match first(&["KVSTORE_AFTER_ROUNDS"]).as_deref() {
            None | Some("exit") => false,
            Some("idle") => true,
            Some(other) => return Err(bad(format!("KVSTORE_AFTER_ROUNDS must be exit or idle, not {other:?}"))),
        };
        if block_bytes == 0 {
            return Err(bad("KVSTORE_BLOCK_BYTES must be greater than 0".into()));
        }
        Ok(Self {
            leader,
            scope: Scope {
                tenant,
                block_size,
                dtype,
                credential: first(&["KVSTORE_CREDENTIAL"]).unwrap_or_default(),
                client: first(&["KVSTORE_CLIENT"]).unwrap_or_default(),
            },
            sessions: num("KVSTORE_SESSIONS", 8)?.max(1) as usize,
            requests: num("KVSTORE_REQUESTS", 16)? as usize,
            prefixes: num("KVSTORE_PREFIXES", 4)?.max(1) as usize,
            prefix_blocks: num("KVSTORE_PREFIX_BLOCKS", 8)? as usize,
            suffix_blocks: num("KVSTORE_SUFFIX_BLOCKS", 4)? as usize,
            block_bytes,
            rounds: num("KVSTORE_ROUNDS", 1)?,
            pause,
            idle_after,
            listen: first(&["KVSTORE_LISTEN"]),
            served_model: first(&["KVSTORE_SERVED_MODEL"]),
        })
    }
}

/// Answers `GET /health` on `listener` until `cancel`: 200 once `ready` is set, 503 before; with
/// a `model`, `GET /v1/models` lists it as an OpenAI API does; any other path is 404.
pub async fn serve_health(
    listener: tokio::net::TcpListener,
    ready: std::sync::Arc<std::sync::atomic::AtomicBool>,
    model: Option<String>,
    cancel: tokio_util::sync::CancellationToken,
) -> std::io::Result<()> {
    use axum::http::StatusCode;
    let health = move || {
        let ready = ready.clone();
        async move {
            if ready.load(std::sync::atomic::Ordering::Relaxed) {
                (StatusCode::OK, "ok\n")
            } else {
                (StatusCode::SERVICE_UNAVAILABLE, "the first round has not run yet\n")
            }
        }
    };
    let mut app = axum::Router::new().route("/health", axum::routing::get(health));
    if let Some(model) = model {
        let list = serde_json::json!({
            "object": "list",
            "data": [{"id": model, "object": "model", "owned_by": "kv-store engine-sim"}],
        })
        .to_string();
        let json = [(axum::http::header::CONTENT_TYPE, "application/json")];
        app = app.route(
            "/v1/models",
            axum::routing::get(move || std::future::ready((json, list.clone()))),
        );
    }
    axum::serve(listener, app)
        .with_graceful_shutdown(cancel.cancelled_owned())
        .await
}

/// A round's result.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Report {
    pub tenant: String,
    pub sessions: usize,
    pub requests: u64,
    pub blocks: u64,
    pub hits: u64,
    pub stored: u64,
    /// Store calls that failed (the store unreachable or refusing, as during a failover): the
    /// block was computed instead, as an engine does. A block that comes back with other bytes
    /// is never counted here: it ends the simulator with an error.
    pub errors: u64,
    pub hit_rate: f64,
}

/// FNV-1a, 64 bits: stable across builds, so every engine derives the same keys.
fn fnv(seed: u64, data: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325 ^ seed;
    for b in data {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Block keys of one prompt: each covers every token up to and including its block.
pub fn block_keys(tokens: &[u32], block_size: usize, scope: &Scope) -> Vec<String> {
    let mut keys = Vec::new();
    let (mut a, mut b) = (fnv(1, scope.dtype.as_bytes()), fnv(2, scope.dtype.as_bytes()));
    for block in tokens.chunks_exact(block_size.max(1)) {
        for t in block {
            a = fnv(a, &t.to_le_bytes());
            b = fnv(b ^ a, &t.to_le_bytes());
        }
        keys.push(format!("kv/{:016x}{:016x}", a, b));
    }
    keys
}

/// The bytes a block's KV would hold: derived from its key, so a hit can be checked.
pub fn block_value(key: &str, len: u64) -> Bytes {
    let mut x = fnv(7, key.as_bytes()) | 1;
    let mut v = vec![0u8; len as usize];
    for chunk in v.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    Bytes::from(v)
}

fn prompt(cfg: &SimConfig, session: usize, request: usize, round: u64) -> Vec<u32> {
    let bs = cfg.scope.block_size as usize;
    let system = (session + request) % cfg.prefixes;
    let mut tokens: Vec<u32> = (0..cfg.prefix_blocks * bs)
        .map(|i| (system * 1_000_003 + i) as u32)
        .collect();
    let unique = fnv(round, format!("{session}/{request}").as_bytes());
    tokens.extend((0..cfg.suffix_blocks * bs).map(|i| (unique as u32).wrapping_add(i as u32 * 7919)));
    tokens
}

/// A failed store call: counted, and logged at its first occurrence in a session. A refusal that
/// no failover explains (the engine's layout or its requests are wrong) ends the simulator.
fn note(r: &mut Report, e: StoreError) -> Result<()> {
    if matches!(
        e.code,
        ErrorCode::TenantLayoutMismatch | ErrorCode::InvalidArgument | ErrorCode::ValueTooLarge
    ) {
        return Err(e);
    }
    if r.errors == 0 {
        tracing::warn!(error = %e, "a store call failed; computing the block instead");
    }
    r.errors += 1;
    Ok(())
}

async fn session(client: Option<Client>, cfg: SimConfig, id: usize, round: u64) -> Result<Report> {
    let mut r = Report::default();
    for req in 0..cfg.requests {
        let keys = block_keys(&prompt(&cfg, id, req, round), cfg.scope.block_size as usize, &cfg.scope);
        r.requests += 1;
        let mut reusing = true;
        for key in keys {
            r.blocks += 1;
            let Some(client) = client.as_ref() else {
                // no cache: every block is computed
                continue;
            };
            if reusing {
                match client.get(&key).await {
                    Ok(Some(v)) => {
                        if v != block_value(&key, cfg.block_bytes) {
                            return Err(StoreError::new(
                                ErrorCode::Internal,
                                format!("block {key} came back with other bytes"),
                            ));
                        }
                        r.hits += 1;
                        continue;
                    }
                    Ok(None) => {}
                    Err(e) => note(&mut r, e)?,
                }
            }
            reusing = false;
            match client.put(&key, block_value(&key, cfg.block_bytes)).await {
                Ok(_) => r.stored += 1,
                Err(e) => note(&mut r, e)?,
            }
        }
    }
    Ok(r)
}

/// Runs one round of every session concurrently and sums their reports (`client` is `None` for
/// an engine without a cache).
pub async fn round(client: Option<&Client>, cfg: &SimConfig, round: u64) -> Result<Report> {
    let tasks: Vec<_> = (0..cfg.sessions)
        .map(|i| tokio::spawn(session(client.cloned(), cfg.clone(), i, round)))
        .collect();
    let mut total = Report {
        tenant: cfg.scope.tenant.clone(),
        sessions: cfg.sessions,
        ..Report::default()
    };
    for t in tasks {
        let r = t
            .await
            .map_err(|e| StoreError::new(ErrorCode::Internal, format!("session panicked: {e}")))??;
        total.requests += r.requests;
        total.blocks += r.blocks;
        total.hits += r.hits;
        total.stored += r.stored;
        total.errors += r.errors;
    }
    total.hit_rate = if total.blocks == 0 {
        0.0
    } else {
        total.hits as f64 / total.blocks as f64
    };
    Ok(total)
}

/// Keys seen per block position, for tests.
pub fn distinct_keys(cfg: &SimConfig) -> HashMap<String, usize> {
    let mut m = HashMap::new();
    for s in 0..cfg.sessions {
        for r in 0..cfg.requests {
            for k in block_keys(&prompt(cfg, s, r, 0), cfg.scope.block_size as usize, &cfg.scope) {
                *m.entry(k).or_default() += 1;
            }
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The status line of `GET path` on `addr`.
    async fn status_line(addr: std::net::SocketAddr, path: &str) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: sim\r\nConnection: close\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out.lines().next().unwrap_or_default().to_owned()
    }

    #[tokio::test]
    async fn health_answers_once_a_round_ran() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let ready = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let cancel = tokio_util::sync::CancellationToken::new();
        let server = tokio::spawn(serve_health(listener, ready.clone(), None, cancel.clone()));
        assert_eq!(status_line(addr, "/health").await, "HTTP/1.1 503 Service Unavailable");
        ready.store(true, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(status_line(addr, "/health").await, "HTTP/1.1 200 OK");
        assert_eq!(status_line(addr, "/v1/models").await, "HTTP/1.1 404 Not Found");
        cancel.cancel();
        server.await.unwrap().unwrap();

        // with a served model, its OpenAI API lists it
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let cancel = tokio_util::sync::CancellationToken::new();
        let server = tokio::spawn(serve_health(listener, ready, Some("m/one".into()), cancel.clone()));
        assert_eq!(status_line(addr, "/v1/models").await, "HTTP/1.1 200 OK");
        cancel.cancel();
        server.await.unwrap().unwrap();
    }

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn reads_settings_from_the_environment() {
        let cfg = SimConfig::from_env(env(&[
            ("MOONCAKE_MASTER", "127.0.0.1:1"),
            ("MOONCAKE_TENANT_ID", "qwen"),
            ("KVSTORE_BLOCK_SIZE", "16"),
            ("KVSTORE_DTYPE", "bfloat16"),
            ("KVSTORE_BLOCK_BYTES", "4Ki"),
        ]))
        .unwrap();
        assert_eq!(cfg.leader.as_deref(), Some("127.0.0.1:1"));
        assert_eq!(cfg.scope.tenant, "qwen");
        assert_eq!(cfg.block_bytes, 4096);
        let err = SimConfig::from_env(env(&[("KVSTORE_LEADER", "x:1")])).unwrap_err();
        assert!(err.message.contains("KVSTORE_BLOCK_SIZE"), "{err}");
        let alone = SimConfig::from_env(env(&[])).unwrap();
        assert_eq!(
            alone.leader, None,
            "no leader: an engine without a cache, which needs no layout"
        );
        let err = SimConfig::from_env(env(&[
            ("KVSTORE_BLOCK_SIZE", "16"),
            ("KVSTORE_DTYPE", "fp8"),
            ("KVSTORE_ROUND_PAUSE", "soon"),
        ]))
        .unwrap_err();
        assert!(err.message.contains("KVSTORE_ROUND_PAUSE"), "{err}");
        let err = SimConfig::from_env(env(&[
            ("KVSTORE_BLOCK_SIZE", "16"),
            ("KVSTORE_DTYPE", "fp8"),
            ("KVSTORE_AFTER_ROUNDS", "linger"),
        ]))
        .unwrap_err();
        assert!(err.message.contains("exit or idle"), "{err}");
    }

    #[test]
    fn shared_prefixes_share_block_keys() {
        let scope = Scope {
            tenant: "t".into(),
            block_size: 4,
            dtype: "bf16".into(),
            ..Default::default()
        };
        let a = block_keys(&[1, 2, 3, 4, 5, 6, 7, 8, 9], 4, &scope);
        let b = block_keys(&[1, 2, 3, 4, 5, 6, 7, 0], 4, &scope);
        assert_eq!(a.len(), 2);
        assert_eq!(a[0], b[0]);
        assert_ne!(a[1], b[1]);
        let other = Scope {
            dtype: "fp8".into(),
            ..scope.clone()
        };
        assert_ne!(block_keys(&[1, 2, 3, 4], 4, &other)[0], a[0]);
        let cfg = SimConfig {
            leader: None,
            scope,
            sessions: 4,
            requests: 4,
            prefixes: 2,
            prefix_blocks: 3,
            suffix_blocks: 1,
            block_bytes: 8,
            rounds: 1,
            pause: std::time::Duration::ZERO,
            idle_after: false,
            listen: None,
            served_model: None,
        };
        let keys = distinct_keys(&cfg);
        assert_eq!(
            keys.values().filter(|n| **n > 1).count(),
            2 * 3,
            "each system prompt's blocks are shared"
        );
    }
}
