//! The prefill half of a disaggregated request (issue 40's design, "The handoff through
//! kv_transfer_params"): whether the prompt is long enough to split, and the call to a prefill
//! worker that saves the prompt's KV into the store and answers with the `kv_transfer_params`
//! decode needs, retried once on each other healthy prefill worker. With none left the request
//! goes to decode without a handoff (decode prefills itself): a counted fallback.

use std::time::Duration;

use axum::http::{HeaderMap, Method};
use serde_json::Value;

use crate::metrics::FallbackReason;
use crate::request::{ClientRequest, PromptSize};
use crate::server::App;
use crate::upstream::{self, UpstreamError};
use crate::workers::{Kind, Worker};

/// The largest prefill answer read (it carries the prompt's token ids).
const PREFILL_ANSWER_LIMIT: usize = 64 << 20;
/// How long counting a prompt's tokens may take.
const TOKENIZE_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether `req` goes through prefill, given that prefill workers exist.
pub async fn wanted(app: &App, req: &ClientRequest, headers: &HeaderMap) -> bool {
    let size = req.prompt_size();
    if size == PromptSize::Batch {
        return false;
    }
    let threshold = app.config.disaggregation_threshold_tokens;
    if threshold == 0 {
        return true;
    }
    match size {
        PromptSize::Tokens(n) => n >= threshold,
        // tokens <= bytes (+ the bounded special tokens): a prompt this short is short
        PromptSize::AtMost(n) if n < threshold => false,
        // a tokenizer that does not answer leaves the prompt long: prefill judges it
        PromptSize::AtMost(_) => count_tokens(app, req, headers).await.is_none_or(|n| n >= threshold),
        PromptSize::Batch | PromptSize::Unknown => true,
    }
}

/// The prompt's token count from a decode worker's vLLM `POST /tokenize`.
async fn count_tokens(app: &App, req: &ClientRequest, headers: &HeaderMap) -> Option<u64> {
    let body = req.tokenize_body()?;
    let worker = app.pool.pick(&[Kind::Decode, Kind::Server], &[])?;
    let call = async {
        let response = app
            .upstream
            .send(Method::POST, &worker.url, "/tokenize", headers, body)
            .await
            .map_err(|e| e.to_string())?;
        let (status, bytes) = upstream::read_body(response, 16 << 20).await?;
        if !status.is_success() {
            return Err(format!("answered {status}"));
        }
        let v: Value = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
        v.get("count").and_then(Value::as_u64).ok_or("no count".to_string())
    };
    match tokio::time::timeout(TOKENIZE_TIMEOUT, call).await {
        Ok(Ok(n)) => {
            tracing::debug!(tokens = n, "counted the prompt");
            Some(n)
        }
        Ok(Err(why)) => {
            tracing::debug!(worker = %worker.url, error = %why, "counting the prompt failed");
            None
        }
        Err(_) => None,
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
