//! One client request to `/v1/completions` or `/v1/chat/completions`, end to end: the body read
//! under `--max-body-bytes` and checked ([`crate::request`]), prefill when the request splits
//! ([`crate::handoff`]), then decode (or a `Server` worker) chosen by load, retried on another
//! worker when one fails before the first byte of its answer, whose answer is relayed frame by
//! frame ([`crate::relay`]). `--request-timeout-seconds` bounds all of it.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, Method, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use serde_json::Value;
use tracing::Instrument;

use crate::config::Placement;
use crate::error::ApiError;
use crate::handoff;
use crate::metrics::Outcome;
use crate::placement;
use crate::relay::{Relay, RelayParts, Tally};
use crate::request::{ClientRequest, Endpoint};
use crate::server::App;
use crate::tokens::PromptTokens;
use crate::upstream;
use crate::workers::{InFlight, Kind};

/// The kinds that answer clients, in order of preference.
pub const ANSWERING: [Kind; 2] = [Kind::Decode, Kind::Server];

/// Serves one request.
pub async fn handle(app: Arc<App>, endpoint: Endpoint, request: Request) -> Response {
    let start = Instant::now();
    let deadline = tokio::time::Instant::now() + app.config.request_timeout();
    let span = tracing::debug_span!("request", endpoint = endpoint.label());
    let mut tally = Tally::new(app.metrics.clone(), endpoint.label());
    let mut streamed = false;
    let flow = async {
        let (parts, body) = request.into_parts();
        let raw = read_body(&parts.headers, body, app.config.max_body_bytes).await?;
        let req = ClientRequest::parse(endpoint, raw)?;
        tracing::debug!(model = %req.model, stream = req.stream, "request");
        streamed = req.stream;
        route(&app, req, parts.headers).await
    };
    let result = tokio::time::timeout_at(deadline, flow).instrument(span).await;
    match result {
        Ok(Ok(answer)) => {
            let success = answer.head.status.is_success();
            let parts = RelayParts {
                tally,
                inflight: answer.inflight,
                metrics: app.metrics.clone(),
                deadline,
                streamed,
                start,
                success,
                predicted_hit_tokens: answer.predicted_hit_tokens,
            };
            let relay = Relay::new(answer.first, answer.rest, parts);
            Response::from_parts(answer.head, Body::new(relay))
        }
        Ok(Err(e)) => {
            tally.finish(if e.status().is_client_error() {
                Outcome::Refused
            } else {
                Outcome::Unavailable
            });
            e.into_response()
        }
        Err(_) => {
            tally.finish(Outcome::Timeout);
            tracing::warn!(endpoint = endpoint.label(), "request timed out before its answer");
            ApiError::Timeout(app.config.request_timeout_seconds).into_response()
        }
    }
}

/// An engine's answer on its way: its head, its first frame (already read), the rest of its
/// body, and the worker's outstanding count.
struct Answer {
    head: axum::http::response::Parts,
    first: Option<http_body::Frame<Bytes>>,
    rest: hyper::body::Incoming,
    inflight: InFlight,
    /// prompt tokens the worker was expected not to compute
    predicted_hit_tokens: Option<u64>,
}

/// Reads the client's body: 413 past `limit` (at once when Content-Length says so).
async fn read_body(headers: &HeaderMap, body: Body, limit: u64) -> Result<Bytes, ApiError> {
    let too_large = ApiError::BodyTooLarge { limit };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(too_large);
    }
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(too_large),
        Err(e) => Err(ApiError::BodyUnreadable(e.to_string())),
    }
}

/// Prefill if the request splits, then decode.
async fn route(app: &Arc<App>, req: ClientRequest, headers: HeaderMap) -> Result<Answer, ApiError> {
    if !ANSWERING.iter().any(|k| app.pool.has(*k)) {
        return Err(ApiError::NoWorker("decode or server"));
    }
    let prompt = PromptTokens::default();
    let params = if app.pool.has(Kind::Prefill) {
        match handoff::route(app, &req, &headers, &prompt).await {
            handoff::Route::Prefill => handoff::prefill(app, &req, &headers).await,
            handoff::Route::Decode(skip) => {
                app.metrics.prefill_skipped(skip);
                None
            }
        }
    } else {
        None
    };
    // the prompt's tokens let the choice count what each worker's engine holds
    let tokens = match prompt.known() {
        Some(t) => Some(t),
        None if app.config.placement == Placement::Memory && placement::any_memory(app, &ANSWERING) => {
            prompt.get(app, &req, &headers).await.and_then(|t| t.tokens.as_deref())
        }
        None => None,
    };
    decode(app, &req, params.as_ref(), &headers, tokens).await
}

/// Sends the request to the answering worker [`placement::choose`] picks; one that fails before the first byte
/// of its answer (no connection, a 5xx while another worker is left, a body that breaks at once)
/// is replaced by the next.
async fn decode(
    app: &Arc<App>,
    req: &ClientRequest,
    params: Option<&Value>,
    headers: &HeaderMap,
    tokens: Option<&[i64]>,
) -> Result<Answer, ApiError> {
    let body = req.decode_body(params);
    let mut tried: Vec<Arc<str>> = Vec::new();
    let mut last_failure = String::new();
    // the kind of the worker that failed last: the retry's label
    let mut failed_kind: Option<Kind> = None;
    loop {
        let Some(placement) = placement::choose(app, req, &ANSWERING, &tried, tokens) else {
            return Err(if tried.is_empty() {
                ApiError::NoWorker("decode or server")
            } else {
                ApiError::Upstream(last_failure)
            });
        };
        let worker = placement.worker;
        if let Some((previous, kind)) = tried.last().zip(failed_kind) {
            tracing::info!(failed = %previous, next = %worker.url, "retrying on another worker");
            app.metrics.retry(kind.label());
        }
        tried.push(worker.url.clone());
        failed_kind = Some(worker.kind);
        let inflight = worker.begin();
        let response = match app
            .upstream
            .send(Method::POST, &worker.url, req.endpoint.path(), headers, body.clone())
            .await
        {
            Ok(r) => r,
            Err(e) => {
                if e.is_connect() {
                    app.pool.failed(&worker, "connection failed");
                }
                tracing::warn!(worker = %worker.url, error = %e, "request to a worker failed");
                last_failure = e.to_string();
                continue;
            }
        };
        let another_left = || app.pool.pick(&ANSWERING, &tried).is_some();
        if response.status().is_server_error() && another_left() {
            tracing::warn!(worker = %worker.url, status = %response.status(), "worker answered with a server error");
            last_failure = format!("answered {}", response.status());
            continue;
        }
        let (mut parts, mut rest) = response.into_parts();
        let first = match rest.frame().await {
            Some(Ok(frame)) => Some(frame),
            None => None,
            Some(Err(e)) => {
                tracing::warn!(worker = %worker.url, error = %e, "worker's answer broke before its first byte");
                last_failure = e.to_string();
                continue;
            }
        };
        parts.headers = upstream::answer_headers(&parts.headers);
        return Ok(Answer {
            head: parts,
            first,
            rest,
            inflight,
            predicted_hit_tokens: placement.predicted_hit_tokens,
        });
    }
}
