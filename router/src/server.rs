//! The router's HTTP surface (issue 40's design, "Router HTTP surface"): the two proxied OpenAI
//! endpoints ([`crate::proxy`]), `/v1/models` (from a healthy worker, else `--model`),
//! `/health` (200 while a decode or server worker is healthy), `/metrics`, and OpenAI-style 404
//! and 405 for the rest; and [`App`], what every handler shares.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use prometheus_client::registry::Registry;
use serde_json::json;

use crate::config::Config;
use crate::error::ApiError;
use crate::metrics::{self, Metrics, Outcome};
use crate::proxy::{self, ANSWERING};
use crate::request::Endpoint;
use crate::upstream::{self, Upstream};
use crate::workers::{Kind, Pool};

/// How long a worker may take to list its models.
const MODELS_TIMEOUT: Duration = Duration::from_secs(5);

/// What the handlers share.
#[derive(Debug)]
pub struct App {
    pub config: Config,
    pub pool: Arc<Pool>,
    pub upstream: Upstream,
    pub metrics: Metrics,
    pub registry: Registry,
    /// what the store holds for the router's tenant (empty when no store is configured)
    pub store: crate::store_index::Shared,
}

impl App {
    pub fn new(config: Config) -> Self {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        let pool = Arc::new(Pool::new(config.unhealthy_after, metrics.clone()));
        Self {
            config,
            pool,
            upstream: Upstream::new(),
            metrics,
            registry,
            store: Default::default(),
        }
    }
}

/// The routes.
pub fn router(app: Arc<App>) -> axum::Router {
    axum::Router::new()
        .route(
            "/v1/completions",
            post(|State(app): State<Arc<App>>, req: Request| proxy::handle(app, Endpoint::Completions, req)),
        )
        .route(
            "/v1/chat/completions",
            post(|State(app): State<Arc<App>>, req: Request| proxy::handle(app, Endpoint::ChatCompletions, req)),
        )
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics_text))
        .fallback(not_found)
        .method_not_allowed_fallback(|req: Request| async move {
            ApiError::MethodNotAllowed {
                method: req.method().to_string(),
            }
        })
        .with_state(app)
}

async fn not_found(req: Request) -> ApiError {
    ApiError::NotFound {
        method: req.method().to_string(),
        path: req.uri().path().chars().take(200).collect(),
    }
}

/// A healthy worker's own list; `--model` when none answers.
async fn models(State(app): State<Arc<App>>) -> Response {
    let mut tried = Vec::new();
    let kinds = [Kind::Decode, Kind::Server, Kind::Prefill];
    while let Some(worker) = app.pool.pick(&kinds, &tried) {
        tried.push(worker.url.clone());
        let call = async {
            let response = app
                .upstream
                .get(&worker.url, "/v1/models")
                .await
                .map_err(|e| e.to_string())?;
            upstream::read_body(response, 4 << 20).await
        };
        match tokio::time::timeout(MODELS_TIMEOUT, call).await {
            Ok(Ok((status, body))) if status.is_success() => {
                app.metrics.request("models", Outcome::Ok);
                return json_response(StatusCode::OK, body);
            }
            Ok(Ok((status, _))) => tracing::debug!(worker = %worker.url, %status, "listing models failed"),
            Ok(Err(e)) => tracing::debug!(worker = %worker.url, error = %e, "listing models failed"),
            Err(_) => tracing::debug!(worker = %worker.url, "listing models timed out"),
        }
    }
    match &app.config.model {
        Some(model) => {
            app.metrics.request("models", Outcome::Ok);
            let list = json!({"object": "list", "data": [
                {"id": model, "object": "model", "created": 0, "owned_by": "kvcache"}
            ]});
            json_response(StatusCode::OK, list.to_string().into())
        }
        None => {
            app.metrics.request("models", Outcome::Unavailable);
            ApiError::NoWorker("decode or server").into_response()
        }
    }
}

fn json_response(status: StatusCode, body: bytes::Bytes) -> Response {
    let mut r = (status, body).into_response();
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// 200 while at least one decode or server worker is healthy; 503 saying why otherwise.
async fn health(State(app): State<Arc<App>>) -> Response {
    let mut total = 0;
    let mut healthy = 0;
    for kind in ANSWERING {
        let ws = app.pool.workers(kind);
        total += ws.len();
        healthy += ws.iter().filter(|w| w.is_healthy()).count();
    }
    if healthy > 0 {
        (StatusCode::OK, "ok\n").into_response()
    } else if total == 0 {
        (StatusCode::SERVICE_UNAVAILABLE, "no decode or server worker is known\n").into_response()
    } else {
        let why = format!("none of the {total} decode or server workers is healthy\n");
        (StatusCode::SERVICE_UNAVAILABLE, why).into_response()
    }
}

async fn metrics_text(State(app): State<Arc<App>>) -> Response {
    let mut r = metrics::encode(&app.registry).into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    r
}
