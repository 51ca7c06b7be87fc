//! The prefill half of a disaggregated request (issue 40's design, "The handoff through
//! kv_transfer_params"): whether the prompt is long enough to split, and the call to a prefill
//! worker that saves the prompt's KV into the store and answers with the `kv_transfer_params`
//! decode needs, retried once on each other healthy prefill worker. With none left the request
//! goes to decode without a handoff (decode prefills itself): a counted fallback.

use axum::http::{HeaderMap, Method};
use serde_json::Value;

use crate::metrics::FallbackReason;
use crate::placement;
use crate::request::{ClientRequest, PromptSize};
use crate::server::App;
use crate::store_index;
use crate::tokens::PromptTokens;
use crate::upstream::{self, UpstreamError};
use crate::workers::{Kind, Worker};

/// The largest prefill answer read (it carries the prompt's token ids).
const PREFILL_ANSWER_LIMIT: usize = 64 << 20;

/// Where a request goes first, given that prefill workers exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    Prefill,
    /// Straight to decode, which computes what the store does not hold.
    Decode(Skip),
}

/// Why a request skips prefill (`kvrouter_prefill_skipped_total{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// Several prompts in one request: one handoff cannot describe them.
    Batch,
    /// The prompt has fewer tokens than `--disaggregation-threshold-tokens`.
    Short,
    /// The store (or a decode worker's memory) holds the prompt's blocks but for fewer tokens
    /// than the threshold: decode loads them (its connector looks every prompt up) and
    /// computes the rest.
    Stored,
}

impl Skip {
    pub fn label(self) -> &'static str {
        match self {
            Self::Batch => "batch",
            Self::Short => "short",
            Self::Stored => "stored",
        }
    }
}

/// Where `req` goes first, given that prefill workers exist: prefill, unless it is a batch, its
/// prompt is shorter than the threshold, or the tokens the store does not hold for it (as the
/// router's index of the store says, `store_index.rs`) are fewer than the threshold. A
/// threshold of 0 sends every single prompt through prefill; a prompt the router cannot read or
/// count goes through prefill, which judges it.
pub async fn route(app: &App, req: &ClientRequest, headers: &HeaderMap, prompt: &PromptTokens) -> Route {
    let size = req.prompt_size();
    let threshold = app.config.disaggregation_threshold_tokens;
    match size {
        PromptSize::Batch => return Route::Decode(Skip::Batch),
        _ if threshold == 0 => return Route::Prefill,
        PromptSize::Unknown => return Route::Prefill,
        // tokens <= bytes (+ the bounded special tokens): a prompt this short is short
        PromptSize::AtMost(n) | PromptSize::Tokens(n) if n < threshold => return Route::Decode(Skip::Short),
        _ => {}
    }
    let predicts = store_index::read(&app.store, |i| i.block_size() > 0 && i.has_namespaces())
        || placement::any_memory(app, &[Kind::Decode]);
    if matches!(size, PromptSize::Tokens(_)) && !predicts {
        return Route::Prefill;
    }
    let tokens = match prompt.get(app, req, headers).await {
        // a tokenizer that does not answer leaves the prompt long: prefill judges it
        None => return Route::Prefill,
        Some(t) if t.count < threshold => return Route::Decode(Skip::Short),
        Some(t) => t.tokens.as_deref(),
    };
    match tokens {
        Some(tokens) if predicts => held_route(app, req, tokens, threshold),
        _ => Route::Prefill,
    }
}

/// [`route`] for a long prompt of `tokens`, by what the store and the decode workers' memory
/// hold of it.
fn held_route(app: &App, req: &ClientRequest, tokens: &[i64], threshold: u64) -> Route {
    let stored = placement::store_hit_tokens(app, req, tokens);
    let remembered = app
        .pool
        .workers(Kind::Decode)
        .iter()
        .filter(|w| w.is_healthy())
        .map(|w| placement::engine_hit_tokens(app, req, w, tokens))
        .max()
        .unwrap_or(0);
    let missing = tokens.len() as u64 - stored.max(remembered);
    tracing::debug!(
        tokens = tokens.len(),
        stored,
        remembered,
        missing,
        "what is held of the prompt"
    );
    if missing < threshold {
        Route::Decode(Skip::Stored)
    } else {
        Route::Prefill
    }
}

/// Why one prefill attempt gave no handoff.
#[derive(Debug)]
enum Failure {
    /// Connection, 5xx, timeout, or an answer without `kv_transfer_params`: another prefill
    /// worker may do better.
    Failed(String),
    /// The engine refused the request (4xx): any other would too.
    Refused(String),
}

/// Prefill's `kv_transfer_params` for `req`, or `None` (counted as a fallback) when no prefill
/// worker gave one.
pub async fn prefill(app: &App, req: &ClientRequest, headers: &HeaderMap) -> Option<Value> {
    let body = req.prefill_body();
    let mut tried = Vec::new();
    loop {
        let Some(worker) = app.pool.pick(&[Kind::Prefill], &tried) else {
            let reason = if tried.is_empty() {
                FallbackReason::NoHealthyPrefill
            } else {
                FallbackReason::PrefillFailed
            };
            tracing::warn!(
                reason = reason.label(),
                "sending the request to decode without a handoff"
            );
            app.metrics.fallback(reason);
            return None;
        };
        if !tried.is_empty() {
            app.metrics.retry(Kind::Prefill.label());
        }
        tried.push(worker.url.clone());
        let attempt = tokio::time::timeout(app.config.prefill_timeout(), attempt(app, &worker, req, headers, &body));
        let failure = match attempt.await {
            Ok(Ok(params)) => {
                count_handoff(app, &params);
                return Some(params);
            }
            Ok(Err(f)) => f,
            Err(_) => Failure::Failed(format!(
                "no answer within --prefill-timeout-seconds {}",
                app.config.prefill_timeout_seconds
            )),
        };
        match failure {
            Failure::Failed(why) => {
                tracing::warn!(worker = %worker.url, error = %why, "prefill failed");
            }
            Failure::Refused(why) => {
                tracing::info!(worker = %worker.url, error = %why, "prefill refused the request; decode judges it");
                app.metrics.fallback(FallbackReason::PrefillRefused);
                return None;
            }
        }
    }
}

async fn attempt(
    app: &App,
    worker: &std::sync::Arc<Worker>,
    req: &ClientRequest,
    headers: &HeaderMap,
    body: &bytes::Bytes,
) -> Result<Value, Failure> {
    let _inflight = worker.begin();
    let response = app
        .upstream
        .send(Method::POST, &worker.url, req.endpoint.path(), headers, body.clone())
        .await
        .map_err(|e: UpstreamError| {
            if e.is_connect() {
                app.pool.failed(worker, "connection failed");
            }
            Failure::Failed(e.to_string())
        })?;
    let (status, bytes) = upstream::read_body(response, PREFILL_ANSWER_LIMIT)
        .await
        .map_err(Failure::Failed)?;
    if status.is_client_error() {
        return Err(Failure::Refused(format!(
            "answered {status}: {}",
            String::from_utf8_lossy(&bytes[..bytes.len().min(200)])
        )));
    }
    if !status.is_success() {
        return Err(Failure::Failed(format!("answered {status}")));
    }
    let answer: Value = serde_json::from_slice(&bytes).map_err(|e| Failure::Failed(format!("not JSON: {e}")))?;
    match answer.get("kv_transfer_params") {
        Some(params @ Value::Object(_)) => Ok(params.clone()),
        _ => Err(Failure::Failed("the answer has no kv_transfer_params".into())),
    }
}

/// Counts a handoff and the bytes prefill says it saved.
fn count_handoff(app: &App, params: &Value) {
    app.metrics.handoffs.inc();
    let bytes = params
        .pointer("/kvcache_handoff/bytes")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    app.metrics.handoff_bytes.inc_by(bytes);
    tracing::debug!(bytes, "handoff");
}
