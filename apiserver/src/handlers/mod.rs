//! The HTTP handlers, one file per verb, and `Routes` over the Kubernetes URL space. A handler
//! parses its request (options, body) and calls the registry; every rule lives in the registry.
//!
//! | module | owns |
//! |---|---|
//! | [`get`], [`list`], [`create`], [`update`], [`patch`], [`delete`], [`deletecollection`], [`watch`] | the verbs on our resources |
//! | [`discovery`], [`openapi`], [`health`] | what clients learn about the API, and whether it is up |
//! | [`events`], [`leases`], [`namespaces`] | the core and coordination kinds of direct mode |
//! | [`self_reviews`] | `kubectl auth can-i`: the self-reviews, answered from the server's authorizer |
//! | [`target`] | which object a resource request is about, and the checks every verb shares |
//! | [`params`] | Kubernetes' query options and `DeleteOptions` |
//! | [`body`] | request bodies within the limit, by content type |
//! | [`response`] | responses, `metav1.Status` refusals, capped `Warning` headers |

// A refusal is a whole response, built once per request: its size does not matter, and `?`
// carries it straight to the client.
#![allow(clippy::result_large_err)]

pub mod body;
pub mod create;
pub mod delete;
pub mod deletecollection;
pub mod discovery;
pub mod events;
pub mod get;
pub mod health;
pub mod leases;
pub mod list;
pub mod namespaces;
pub mod openapi;
pub mod params;
pub mod patch;
pub mod plain;
pub mod response;
pub mod self_reviews;
pub mod target;
pub mod update;
pub mod watch;

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::handler::Handler;
use axum::response::Response;
use axum::routing::{MethodRouter, get as on_get};
use http::Method;
use tower::ServiceExt;

use crate::metrics::ApiMetrics;
use crate::registry::Registry;
use crate::request_info::RequestInfo;
use crate::storage::Storage;

/// What handlers share.
pub struct Api {
    pub registry: Arc<Registry>,
    pub metrics: ApiMetrics,
    /// Rendered by `/metrics`; every subsystem registered on it before serving began.
    pub metrics_registry: Arc<prometheus_client::registry::Registry>,
    pub storage: Arc<dyn Storage>,
    /// False once shutdown has begun (`/readyz` fails from then on).
    pub ready: AtomicBool,
    /// Flips to `true` when the server shuts down: watches end.
    pub shutdown: tokio::sync::watch::Receiver<bool>,
    /// How often watches with `allowWatchBookmarks` get a BOOKMARK.
    pub bookmark_interval: Duration,
    pub discovery: discovery::Cache,
    pub openapi: crate::openapi::Documents,
}

/// Every path this server answers: a resource request (as the request info judged it) goes
/// straight to the handler of its verb ([`resource`]); the system paths go through a router.
/// (Resource paths are not routes: the filters already parsed them, and a router would match
/// and parse them again for every request.)
#[derive(Clone)]
pub struct Routes {
    system: Router,
    api: Arc<Api>,
}

impl Routes {
    pub fn new(api: Arc<Api>) -> Routes {
        Routes {
            system: system_router(api.clone()),
            api,
        }
    }

    /// The answer to `req`, whose request info is `info`.
    pub async fn serve(self, info: &RequestInfo, req: Request) -> Response {
        if info.resource.is_some() {
            return resource(self.api, info, req).await;
        }
        match self.system.oneshot(req).await {
            Ok(r) => r,
            Err(never) => match never {},
        }
    }
}

/// A request on a resource path: the handler of its verb if the resource is ours, else a 404.
async fn resource(api: Arc<Api>, info: &RequestInfo, req: Request) -> Response {
    if info.is_core_events() {
        return events::handle(api, info, req).await;
    }
    if info.is_leases() {
        return leases::handle(api, info, req).await;
    }
    if info.is_core_namespaces() {
        return namespaces::handle(api, info, req).await;
    }
    if info.is_self_review() {
        return self_reviews::handle(info, req).await;
    }
    let Some(r) = info.resource.as_ref().filter(|_| info.kind().is_some()) else {
        return response::not_found(req.uri().path());
    };
    let item = !r.name.is_empty();
    match (info.verb, item) {
        ("get", true) => get::handle.call(req, api).await,
        ("list", false) => list::handle.call(req, api).await,
        ("watch", _) => watch::handle.call(req, api).await,
        ("create", false) => create::handle.call(req, api).await,
        ("update", true) => update::handle.call(req, api).await,
        ("patch", true) => patch::handle.call(req, api).await,
        ("delete", true) => delete::handle.call(req, api).await,
        ("deletecollection", false) => deletecollection::handle.call(req, api).await,
        _ => {
            let what = if item {
                format!("an item of {}", r.resource)
            } else {
                r.resource.clone()
            };
            response::method_not_allowed(req.method(), &what)
        }
    }
}

/// The request's `Accept`, JSON when it names none.
pub fn accept(req: &Request) -> String {
    req.headers()
        .get(http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .to_owned()
}

async fn not_found(uri: http::Uri) -> Response {
    response::not_found(uri.path())
}

async fn method_not_allowed(method: Method, uri: http::Uri) -> Response {
    response::method_not_allowed(&method, uri.path())
}

fn read_only(r: MethodRouter<Arc<Api>>) -> MethodRouter<Arc<Api>> {
    r.fallback(method_not_allowed)
}

/// The router over the system paths (health, metrics, discovery, OpenAPI); anything else is a
/// 404 Status.
fn system_router(api: Arc<Api>) -> Router {
    let group = format!("/apis/{}", kvcache_api::GROUP);
    let version = format!("/apis/{}", kvcache_api::API_VERSION);
    Router::new()
        .route("/healthz", read_only(on_get(health::healthz)))
        .route("/healthz/{check}", read_only(on_get(health::healthz)))
        .route("/livez", read_only(on_get(health::livez)))
        .route("/livez/{check}", read_only(on_get(health::livez)))
        .route("/readyz", read_only(on_get(health::readyz)))
        .route("/readyz/{check}", read_only(on_get(health::readyz)))
        .route("/metrics", read_only(on_get(health::metrics)))
        .route("/version", read_only(on_get(discovery::version)))
        .route("/api", read_only(on_get(discovery::core)))
        .route("/api/", read_only(on_get(discovery::core)))
        .route("/api/v1", read_only(on_get(discovery::core_resources)))
        .route("/apis", read_only(on_get(discovery::apis)))
        .route("/apis/", read_only(on_get(discovery::apis)))
        .route(&group, read_only(on_get(discovery::group)))
        .route(&version, read_only(on_get(discovery::resources)))
        .route("/apis/coordination.k8s.io", read_only(on_get(discovery::lease_group)))
        .route(
            "/apis/coordination.k8s.io/v1",
            read_only(on_get(discovery::lease_resources)),
        )
        .route("/openapi/v2", read_only(on_get(openapi::v2)))
        .route("/openapi/v3", read_only(on_get(openapi::v3_root)))
        .route("/openapi/v3/", read_only(on_get(openapi::v3_root)))
        .route(crate::openapi::V3_PATH, read_only(on_get(openapi::v3)))
        .route(crate::openapi::LEASE_V3_PATH, read_only(on_get(openapi::lease_v3)))
        .fallback(not_found)
        .with_state(api)
}
