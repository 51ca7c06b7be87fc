//! The request pipeline: authentication → routing → authorization → the handler, with metrics
//! and one structured log line per request. System endpoints (health, version, discovery,
//! OpenAPI, metrics) live here; resource verbs are in [`super::rest`].

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use serde_json::Value;

use super::auth::{Attributes, Authenticator, Authorizer, Decision, User, forbidden_message};
use super::metrics::{Metrics, RequestLabels};
use super::negotiate::{self, Shape};
use super::openapi::{self, Documents};
use super::request::{Query, ResourcePath, parse_resource_path};
use super::resource::{Info, Resource, Typed};
use super::{discovery, rest, table};
use crate::registry::Registries;
use crate::status::failure;
use crate::storage::Storage;

pub type Body = BoxBody<Bytes, Infallible>;

/// Largest request body accepted (413 beyond), as kube-apiserver.
pub const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;

/// A body from bytes.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).boxed()
}

/// Most requests served at once, as kube-apiserver's defaults (watches excluded); beyond it 429.
const MAX_READS_IN_FLIGHT: usize = 400;
const MAX_WRITES_IN_FLIGHT: usize = 200;

/// Counts one request in flight while it lives.
struct InFlight<'a>(&'a AtomicUsize);

impl<'a> InFlight<'a> {
    fn enter(counter: &'a AtomicUsize, limit: usize) -> Option<InFlight<'a>> {
        if counter.fetch_add(1, Ordering::AcqRel) >= limit {
            counter.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(InFlight(counter))
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Cached discovery bodies with their ETags.
struct Discovery {
    legacy_apis: Vec<u8>,
    group: Vec<u8>,
    resources: Vec<u8>,
    v2: (Vec<u8>, String),
    v2beta1: (Vec<u8>, String),
    empty_v2: Vec<u8>,
    empty_v2beta1: Vec<u8>,
}

/// Everything a request may need.
pub struct Api {
    pub resources: Vec<Arc<dyn Resource>>,
    pub storage: Arc<dyn Storage>,
    pub metrics: Metrics,
    pub authn: Box<dyn Authenticator>,
    pub authz: Box<dyn Authorizer>,
    /// False once shutdown has begun (`/readyz` fails from then on).
    pub ready: AtomicBool,
    reads_in_flight: AtomicUsize,
    writes_in_flight: AtomicUsize,
    /// Flips to `true` when the server shuts down: watches end.
    pub shutdown: tokio::sync::watch::Receiver<bool>,
    pub bookmark_interval: Duration,
    openapi: Documents,
    discovery: Discovery,
}

/// The four resources, in discovery order.
pub fn infos() -> Vec<Info> {
    let (a, b, c, d) = (
        table::BACKEND_COLUMNS,
        table::POOL_COLUMNS,
        table::BINDING_COLUMNS,
        table::MODEL_DEPLOYMENT_COLUMNS,
    );
    use kvcache_api::Kind;
    fn info<K: Kind>(columns: &'static [table::Column]) -> Info {
        Info {
            kind: K::KIND,
            plural: K::PLURAL,
            singular: K::SINGULAR,
            short_name: K::SHORT_NAME,
            namespaced: K::SCOPE == kvcache_api::Scope::Namespaced,
            columns,
        }
    }
    vec![
        info::<kvcache_api::backend::BackendSpec>(a),
        info::<kvcache_api::pool::PoolSpec>(b),
        info::<kvcache_api::binding::BindingSpec>(c),
        info::<kvcache_api::model_deployment::ModelDeploymentSpec>(d),
    ]
}

fn etag(bytes: &[u8]) -> String {
    format!("\"{}\"", &openapi::sha512_hex(bytes)[..32])
}

impl Api {
    pub fn new(
        registries: Registries,
        storage: Arc<dyn Storage>,
        authn: Box<dyn Authenticator>,
        authz: Box<dyn Authorizer>,
        shutdown: tokio::sync::watch::Receiver<bool>,
        bookmark_interval: Duration,
    ) -> Api {
        let resources: Vec<Arc<dyn Resource>> = vec![
            Arc::new(Typed::new(registries.backends, table::BACKEND_COLUMNS)),
            Arc::new(Typed::new(registries.pools, table::POOL_COLUMNS)),
            Arc::new(Typed::new(registries.bindings, table::BINDING_COLUMNS)),
            Arc::new(Typed::new(
                registries.model_deployments,
                table::MODEL_DEPLOYMENT_COLUMNS,
            )),
        ];
        let infos: Vec<Info> = resources.iter().map(|r| r.info()).collect();
        let enc = |v: Value| serde_json::to_vec(&v).unwrap_or_default();
        let v2 = enc(discovery::aggregated(&infos, "v2"));
        let v2beta1 = enc(discovery::aggregated(&infos, "v2beta1"));
        let discovery = Discovery {
            legacy_apis: enc(discovery::api_group_list()),
            group: enc(discovery::api_group()),
            resources: enc(discovery::api_resource_list(&infos)),
            v2: (v2.clone(), etag(&v2)),
            v2beta1: (v2beta1.clone(), etag(&v2beta1)),
            empty_v2: enc(discovery::aggregated_empty("v2")),
            empty_v2beta1: enc(discovery::aggregated_empty("v2beta1")),
        };
        Api {
            openapi: openapi::build(&infos),
            resources,
            storage,
            metrics: Metrics::default(),
            authn,
            authz,
            ready: AtomicBool::new(true),
            reads_in_flight: AtomicUsize::new(0),
            writes_in_flight: AtomicUsize::new(0),
            shutdown,
            bookmark_interval,
            discovery,
        }
    }

    pub fn resource(&self, plural: &str) -> Option<&Arc<dyn Resource>> {
        self.resources.iter().find(|r| r.info().plural == plural)
    }
}

/// A response with a JSON body.
pub fn json_response(code: u16, content_type: &str, body: Vec<u8>) -> Response<Body> {
    let mut r = Response::new(full(body));
    *r.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if let Ok(v) = HeaderValue::from_str(content_type) {
        r.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    r
}

/// A `metav1.Status` response.
pub fn status_response(code: u16, status: &Status) -> Response<Body> {
    json_response(code, "application/json", serde_json::to_vec(status).unwrap_or_default())
}

pub fn error(code: u16, reason: &str, message: impl Into<String>) -> Response<Body> {
    status_response(code, &failure(code, reason, message))
}

fn text(code: u16, body: String) -> Response<Body> {
    let mut r = Response::new(full(body));
    *r.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::OK);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// One request through the pipeline.
pub async fn handle(
    api: Arc<Api>,
    req: Request<Incoming>,
    user: Arc<Result<User, String>>,
) -> Result<Response<Body>, Infallible> {
    let started = Instant::now();
    let audit_id = req
        .headers()
        .get("audit-id")
        .and_then(|v| v.to_str().ok())
        .map_or_else(next_audit_id, str::to_owned);
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let mut labels = RequestLabels::default();
    let mut response = match user.as_ref() {
        Err(msg) => error(401, "Unauthorized", msg.clone()),
        Ok(user) => dispatch(&api, req, user, &mut labels).await,
    };
    let code = response.status().as_u16();
    if !labels.verb.is_empty() && labels.verb != "WATCH" {
        api.metrics.observe(&labels, code, started.elapsed().as_secs_f64());
    } else if labels.verb == "WATCH" {
        api.metrics.observe(&labels, code, 0.0);
    }
    let h = response.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&audit_id) {
        h.insert("audit-id", v);
    }
    h.entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-cache, private"));
    tracing::debug!(
        audit_id,
        %method,
        path,
        code,
        latency_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
        "request"
    );
    Ok(response)
}

async fn dispatch(api: &Arc<Api>, req: Request<Incoming>, user: &User, labels: &mut RequestLabels) -> Response<Body> {
    let path = req.uri().path().to_owned();
    let query = Query::parse(req.uri().query());
    // Always allowed, even anonymously.
    if let Some(r) = health(api, &path, &query) {
        return r;
    }
    if path == "/version" {
        return version();
    }
    if req.headers().contains_key(header::AUTHORIZATION) {
        return error(
            401,
            "Unauthorized",
            "bearer tokens and basic credentials are not accepted by this server in direct mode; use the client certificate of the kubeconfig it wrote",
        );
    }
    if req.headers().keys().any(|k| k.as_str().starts_with("impersonate-")) {
        return error(
            403,
            "Forbidden",
            format!(
                "impersonation is not supported yet: User {:?} cannot impersonate; run the command without --as",
                user.name
            ),
        );
    }
    let method = req.method().clone();
    let prefix = format!("/apis/{}/", kvcache_api::API_VERSION);
    if let Some(rest_path) = path.strip_prefix(&prefix) {
        let Some(rp) = parse_resource_path(rest_path) else {
            return not_found(&path);
        };
        let Some(res) = api.resource(&rp.plural).cloned() else {
            return not_found(&path);
        };
        let verb = verb_of(&method, &rp, &query);
        *labels = RequestLabels {
            verb: metric_verb(&method, &verb),
            dry_run: query.has("dryRun"),
            resource: rp.plural.clone(),
            subresource: rp.subresource.clone(),
            scope: if !rp.name.is_empty() {
                "resource".into()
            } else if rp.namespace.is_empty() {
                "cluster".into()
            } else {
                "namespace".into()
            },
        };
        let attrs = Attributes::Resource {
            verb: verb.clone(),
            namespace: rp.namespace.clone(),
            resource: rp.plural.clone(),
            subresource: rp.subresource.clone(),
            name: rp.name.clone(),
        };
        if let Decision::Deny(_) = api.authz.authorize(user, &attrs) {
            return error(403, "Forbidden", forbidden_message(user, &attrs));
        }
        // Server-side apply that creates also needs `create`.
        if verb == "patch" && is_apply(req.headers()) {
            let create = Attributes::Resource {
                verb: "create".into(),
                namespace: rp.namespace.clone(),
                resource: rp.plural.clone(),
                subresource: rp.subresource.clone(),
                name: rp.name.clone(),
            };
            if let Decision::Deny(_) = api.authz.authorize(user, &create) {
                return error(403, "Forbidden", forbidden_message(user, &create));
            }
        }
        let (counter, limit) = match verb.as_str() {
            "get" | "list" => (&api.reads_in_flight, MAX_READS_IN_FLIGHT),
            _ => (&api.writes_in_flight, MAX_WRITES_IN_FLIGHT),
        };
        let _slot = if verb == "watch" {
            None
        } else {
            match InFlight::enter(counter, limit) {
                Some(slot) => Some(slot),
                None => {
                    let mut r = error(429, "TooManyRequests", "too many requests, please try again later");
                    r.headers_mut()
                        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                    return r;
                }
            }
        };
        return rest::handle(api, res, rp, verb, query, req, user).await;
    }
    *labels = RequestLabels {
        verb: method.as_str().to_owned(),
        ..RequestLabels::default()
    };
    let attrs = Attributes::NonResource {
        verb: method.as_str().to_ascii_lowercase(),
        path: path.clone(),
    };
    if let Decision::Deny(_) = api.authz.authorize(user, &attrs) {
        return error(403, "Forbidden", forbidden_message(user, &attrs));
    }
    if method != Method::GET && method != Method::HEAD {
        return error(405, "MethodNotAllowed", format!("{method} is not supported on {path}"));
    }
    let accept = header_str(req.headers(), header::ACCEPT);
    let if_none_match = header_str(req.headers(), header::IF_NONE_MATCH);
    match path.as_str() {
        "/metrics" => text(200, api.metrics.render()),
        "/apis" | "/apis/" => match negotiate::for_discovery(&accept) {
            Some(Shape::Discovery(v)) => {
                let (body, tag) = if v == "v2" {
                    &api.discovery.v2
                } else {
                    &api.discovery.v2beta1
                };
                if if_none_match == *tag {
                    let mut r = json_response(304, &negotiate::content_type(Shape::Discovery(v)), Vec::new());
                    r.headers_mut().insert(header::ETAG, hv(tag));
                    return r;
                }
                let mut r = json_response(200, &negotiate::content_type(Shape::Discovery(v)), body.clone());
                r.headers_mut().insert(header::ETAG, hv(tag));
                r
            }
            Some(_) => json_response(200, "application/json", api.discovery.legacy_apis.clone()),
            None => not_acceptable(&accept),
        },
        "/api" | "/api/" => match negotiate::for_discovery(&accept) {
            Some(Shape::Discovery(v)) => {
                let body = if v == "v2" {
                    api.discovery.empty_v2.clone()
                } else {
                    api.discovery.empty_v2beta1.clone()
                };
                json_response(200, &negotiate::content_type(Shape::Discovery(v)), body)
            }
            _ => json_response(
                200,
                "application/json",
                br#"{"kind":"APIVersions","versions":[],"serverAddressByClientCIDRs":[]}"#.to_vec(),
            ),
        },
        p if p == format!("/apis/{}", kvcache_api::GROUP) => {
            json_response(200, "application/json", api.discovery.group.clone())
        }
        p if p == format!("/apis/{}", kvcache_api::API_VERSION) => {
            json_response(200, "application/json", api.discovery.resources.clone())
        }
        "/openapi/v3" | "/openapi/v3/" => json_response(200, "application/json", api.openapi.v3_root.clone()),
        openapi::V3_PATH => openapi_v3(api, &query, &accept, &if_none_match),
        "/openapi/v2" => openapi_v2(api, &accept, &if_none_match),
        _ => not_found(&path),
    }
}

/// A unique request id in UUID form: a random prefix per process and a counter (no system call
/// per request).
fn next_audit_id() -> String {
    static PREFIX: std::sync::OnceLock<[u8; 10]> = std::sync::OnceLock::new();
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let p = PREFIX.get_or_init(|| {
        let mut b = [0u8; 10];
        b.copy_from_slice(&uuid::Uuid::new_v4().as_bytes()[..10]);
        b
    });
    let n = COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes();
    let mut bytes = [0u8; 16];
    bytes[..10].copy_from_slice(p);
    bytes[10..].copy_from_slice(&n[..6]);
    uuid::Uuid::from_bytes(bytes).to_string()
}

fn hv(s: &str) -> HeaderValue {
    HeaderValue::from_str(s).unwrap_or(HeaderValue::from_static(""))
}

pub fn header_str(h: &HeaderMap, name: header::HeaderName) -> String {
    h.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned()
}

pub fn is_apply(h: &HeaderMap) -> bool {
    header_str(h, header::CONTENT_TYPE).starts_with("application/apply-patch")
}

fn not_found(path: &str) -> Response<Body> {
    error(
        404,
        "NotFound",
        format!("the server could not find the requested resource ({path})"),
    )
}

pub fn not_acceptable(accept: &str) -> Response<Body> {
    error(
        406,
        "NotAcceptable",
        format!(
            "only the following media types are accepted: application/json, application/json;as=Table;v=v1;g=meta.k8s.io (asked for {accept:?})"
        ),
    )
}

/// The Kubernetes verb of a resource request.
fn verb_of(method: &Method, rp: &ResourcePath, q: &Query) -> String {
    let collection = rp.name.is_empty();
    match *method {
        Method::GET | Method::HEAD if q.flag("watch") => "watch",
        Method::GET | Method::HEAD if collection => "list",
        Method::GET | Method::HEAD => "get",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if collection => "deletecollection",
        Method::DELETE => "delete",
        _ => "unknown",
    }
    .to_owned()
}

fn metric_verb(method: &Method, verb: &str) -> String {
    match verb {
        "watch" => "WATCH".into(),
        "list" => "LIST".into(),
        "get" => "GET".into(),
        "patch" => "PATCH".into(),
        "update" => "PUT".into(),
        "create" => "POST".into(),
        "deletecollection" | "delete" => "DELETE".into(),
        _ => method.as_str().to_owned(),
    }
}

fn health(api: &Api, path: &str, q: &Query) -> Option<Response<Body>> {
    let mut it = path.trim_start_matches('/').splitn(2, '/');
    let (base, check) = (it.next().unwrap_or_default(), it.next().filter(|c| !c.is_empty()));
    if !matches!(base, "healthz" | "livez" | "readyz") {
        return None;
    }
    let mut checks: Vec<(&str, bool)> = vec![("ping", true)];
    if base == "readyz" {
        checks.push(("storage", api.storage.health().is_ok()));
        checks.push(("shutdown", api.ready.load(Ordering::Relaxed)));
    }
    if let Some(excluded) = q.get("exclude") {
        checks.retain(|(n, _)| *n != excluded);
    }
    if let Some(one) = check {
        return Some(match checks.iter().find(|(n, _)| *n == one) {
            Some((_, true)) => text(200, "ok".into()),
            Some((n, false)) => text(503, format!("[-]{n} failed: reason withheld\n")),
            None => error(404, "NotFound", format!("no health check named {one:?}")),
        });
    }
    let ok = checks.iter().all(|(_, ok)| *ok);
    if q.has("verbose") || !ok {
        let mut body: String = checks
            .iter()
            .map(|(n, ok)| {
                if *ok {
                    format!("[+]{n} ok\n")
                } else {
                    format!("[-]{n} failed: reason withheld\n")
                }
            })
            .collect();
        body.push_str(&format!("{base} check {}\n", if ok { "passed" } else { "failed" }));
        return Some(text(if ok { 200 } else { 503 }, body));
    }
    Some(text(200, "ok".into()))
}

fn version() -> Response<Body> {
    let v = serde_json::json!({
        "major": "1", "minor": "33",
        "gitVersion": format!("v1.33.0+kvcache.{}", env!("CARGO_PKG_VERSION")),
        "gitCommit": option_env!("KVCACHE_GIT_COMMIT").unwrap_or("unknown"),
        "gitTreeState": "clean", "buildDate": "1970-01-01T00:00:00Z",
        "goVersion": "rust", "compiler": "rustc",
        "platform": format!("{}/{}", std::env::consts::OS, if std::env::consts::ARCH == "x86_64" { "amd64" } else { std::env::consts::ARCH }),
    });
    json_response(200, "application/json", serde_json::to_vec(&v).unwrap_or_default())
}

fn openapi_v3(api: &Api, q: &Query, accept: &str, if_none_match: &str) -> Response<Body> {
    if !(accept.is_empty() || accept.contains("application/json") || accept.contains("*/*")) {
        return not_acceptable(accept);
    }
    let hash = &api.openapi.v3_hash;
    if let Some(asked) = q.get("hash")
        && asked != hash
    {
        let mut r = json_response(301, "application/json", Vec::new());
        r.headers_mut()
            .insert(header::LOCATION, hv(&format!("{}?hash={hash}", openapi::V3_PATH)));
        return r;
    }
    let tag = format!("\"{hash}\"");
    let mut r = if if_none_match == tag {
        json_response(304, "application/json", Vec::new())
    } else {
        json_response(200, "application/json", api.openapi.v3.clone())
    };
    let h = r.headers_mut();
    h.insert(header::ETAG, hv(&tag));
    h.insert(header::VARY, HeaderValue::from_static("Accept"));
    if q.has("hash") {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("public, immutable"));
    }
    r
}

fn openapi_v2(api: &Api, accept: &str, if_none_match: &str) -> Response<Body> {
    let tag = format!("\"{}\"", api.openapi.v2_hash);
    let proto = accept.contains("com.github.proto-openapi.spec.v2");
    let mut r = if proto {
        json_response(
            200,
            "application/com.github.proto-openapi.spec.v2.v1.0+protobuf",
            api.openapi.v2_protobuf.clone(),
        )
    } else if accept.is_empty() || accept.contains("application/json") || accept.contains("*/*") {
        if if_none_match == tag {
            json_response(304, "application/json", Vec::new())
        } else {
            json_response(200, "application/json", api.openapi.v2_json.clone())
        }
    } else {
        return not_acceptable(accept);
    };
    r.headers_mut().insert(header::ETAG, hv(&tag));
    r.headers_mut().insert(header::VARY, HeaderValue::from_static("Accept"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_flight_slots_are_bounded_and_released() {
        let counter = AtomicUsize::new(0);
        let a = InFlight::enter(&counter, 2).unwrap();
        let _b = InFlight::enter(&counter, 2).unwrap();
        assert!(InFlight::enter(&counter, 2).is_none());
        drop(a);
        assert!(InFlight::enter(&counter, 2).is_some());
        assert_eq!(counter.load(Ordering::Relaxed), 1);
    }
}
