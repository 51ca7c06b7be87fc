//! The HTTP handlers, one file per verb, and the router over the Kubernetes URL space. A handler
//! parses its request (options, body) and calls the registry; every rule lives in the registry.
//!
//! | module | owns |
//! |---|---|
//! | [`get`], [`list`], [`create`], [`update`], [`patch`], [`delete`], [`deletecollection`], [`watch`] | the verbs on our resources |
//! | [`discovery`], [`openapi`], [`health`] | what clients learn about the API, and whether it is up |
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
pub mod get;
pub mod health;
pub mod list;
pub mod openapi;
pub mod params;
pub mod patch;
pub mod response;
pub mod target;
pub mod update;
pub mod watch;

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::response::Response;
use axum::routing::{MethodRouter, get as on_get};
use http::Method;

use self::target::{Reply, Target};
use crate::metrics::ApiMetrics;
use crate::registry::Registry;
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

/// GET on a collection: a list, or a watch with `?watch=true`.
async fn collection_get(State(api): State<Arc<Api>>, target: Target) -> Reply {
    if target.info.verb == "watch" {
        watch::handle(State(api), target).await
    } else {
        list::handle(State(api), target).await
    }
}

/// GET on an object: the object, or a watch of it with `?watch=true`.
async fn item_get(State(api): State<Arc<Api>>, target: Target) -> Reply {
    if target.info.verb == "watch" {
        watch::handle(State(api), target).await
    } else {
        get::handle(State(api), target).await
    }
}

async fn method_not_allowed(method: Method, uri: http::Uri) -> Response {
    response::method_not_allowed(&method, uri.path())
}

async fn not_found(uri: http::Uri) -> Response {
    response::not_found(uri.path())
}

fn collection() -> MethodRouter<Arc<Api>> {
    on_get(collection_get)
        .post(create::handle)
        .delete(deletecollection::handle)
        .fallback(method_not_allowed)
}

fn item() -> MethodRouter<Arc<Api>> {
    on_get(item_get)
        .put(update::handle)
        .patch(patch::handle)
        .delete(delete::handle)
        .fallback(method_not_allowed)
}

fn read_only(r: MethodRouter<Arc<Api>>) -> MethodRouter<Arc<Api>> {
    r.fallback(method_not_allowed)
}

/// The router over every path this server answers; anything else is a 404 Status.
pub fn router(api: Arc<Api>) -> Router {
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
        .route("/apis", read_only(on_get(discovery::apis)))
        .route("/apis/", read_only(on_get(discovery::apis)))
        .route(&group, read_only(on_get(discovery::group)))
        .route(&version, read_only(on_get(discovery::resources)))
        .route("/openapi/v2", read_only(on_get(openapi::v2)))
        .route("/openapi/v3", read_only(on_get(openapi::v3_root)))
        .route("/openapi/v3/", read_only(on_get(openapi::v3_root)))
        .route(crate::openapi::V3_PATH, read_only(on_get(openapi::v3)))
        .route(&format!("{version}/{{resource}}"), collection())
        .route(&format!("{version}/{{resource}}/{{name}}"), item())
        .route(&format!("{version}/{{resource}}/{{name}}/{{subresource}}"), item())
        .route(
            &format!("{version}/namespaces/{{namespace}}/{{resource}}"),
            collection(),
        )
        .route(
            &format!("{version}/namespaces/{{namespace}}/{{resource}}/{{name}}"),
            item(),
        )
        .route(
            &format!("{version}/namespaces/{{namespace}}/{{resource}}/{{name}}/{{subresource}}"),
            item(),
        )
        .fallback(not_found)
        .with_state(api)
}
