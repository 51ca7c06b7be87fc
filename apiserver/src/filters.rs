//! The filters every request passes before its handler, in kube-apiserver's order: request info
//! and metrics → authentication → authorization → in-flight limits → body limit → a `tracing`
//! span, as the stages of one tower service in front of the handlers ([`Pipeline`]). Connections
//! and in-process clients go through exactly the same pipeline.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use http::{HeaderValue, header};
use tower::Service;
use tracing::Instrument;

use crate::auth::{
    Attributes, Authorizer, Chain, ConnectionInfo, Decision, ResourceAttributes, Target, User, forbidden_message,
};
use crate::handlers::Routes;
use crate::handlers::body::{MAX_BODY_BYTES, drain, too_large};
use crate::handlers::response::error;
use crate::metrics::ApiMetrics;
use crate::request_info::RequestInfo;

/// Most requests served at once, as kube-apiserver's defaults (watches excluded); beyond, 429.
pub const MAX_READS_IN_FLIGHT: usize = 400;
pub const MAX_WRITES_IN_FLIGHT: usize = 200;

/// What the filters need.
pub struct Filters {
    pub authn: Chain,
    pub authz: Arc<dyn Authorizer>,
    pub metrics: ApiMetrics,
    pub max_reads: usize,
    pub max_writes: usize,
    reads: AtomicUsize,
    writes: AtomicUsize,
}

impl Filters {
    pub fn new(authn: Chain, authz: Arc<dyn Authorizer>, metrics: ApiMetrics) -> Filters {
        Filters {
            authn,
            authz,
            metrics,
            max_reads: MAX_READS_IN_FLIGHT,
            max_writes: MAX_WRITES_IN_FLIGHT,
            reads: AtomicUsize::new(0),
            writes: AtomicUsize::new(0),
        }
    }
}

/// The filters as one tower service in front of the handlers: each request runs the stages below
/// in kube-apiserver's order, each of which may answer instead of the handler. (Six nested
/// middlewares, and a router in front of them, cost each request some 20,000 instructions in
/// boxed futures and moves of the request, measured with callgrind; as stages of one service
/// they cost almost nothing.) Requests need a [`ConnectionInfo`] extension to be authenticated.
#[derive(Clone)]
pub struct Pipeline {
    filters: Arc<Filters>,
    routes: Routes,
}

impl Pipeline {
    /// `routes` behind every filter.
    pub fn new(routes: Routes, filters: Arc<Filters>) -> Pipeline {
        Pipeline { filters, routes }
    }

    /// The answer to `req` (what [`Service::call`] returns, without needing `&mut`).
    pub fn handle<B>(&self, req: http::Request<B>) -> Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>
    where
        B: axum::body::HttpBody<Data = bytes::Bytes> + Send + 'static,
        B::Error: Into<axum::BoxError>,
    {
        let (filters, routes) = (self.filters.clone(), self.routes.clone());
        Box::pin(async move { Ok(observe(&filters, routes, req.map(Body::new)).await) })
    }
}

impl<B> Service<http::Request<B>> for Pipeline
where
    B: axum::body::HttpBody<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // Every stage and handler is always ready.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        self.handle(req)
    }
}

/// The request id of `audit-id`, or a new one: a random prefix per process and a counter (no
/// system call per request), in UUID form.
fn audit_id(req: &Request) -> String {
    if let Some(id) = req.headers().get("audit-id").and_then(|v| v.to_str().ok()) {
        return id.to_owned();
    }
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
    let mut text = [0u8; uuid::fmt::Hyphenated::LENGTH];
    uuid::Uuid::from_bytes(bytes)
        .hyphenated()
        .encode_lower(&mut text)
        .to_owned()
}

/// Stage 1 (around the others): judges what the request is about, counts it when answered, and
/// stamps the response with its request id.
async fn observe(f: &Filters, routes: Routes, mut req: Request) -> Response {
    let started = Instant::now();
    let id = audit_id(&req);
    let info = Arc::new(RequestInfo::parse(req.method(), req.uri().path(), req.uri().query()));
    req.extensions_mut().insert(info.clone());
    let mut response = filtered(f, routes, &info, &id, req).await;
    f.metrics
        .observe(&info, response.status().as_u16(), started.elapsed().as_secs_f64());
    let h = response.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&id) {
        h.insert("audit-id", v);
    }
    h.entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-cache, private"));
    response
}

/// The stages after request info, in order; the first that answers ends the request.
async fn filtered(f: &Filters, routes: Routes, info: &Arc<RequestInfo>, id: &str, req: Request) -> Response {
    let (mut parts, body) = req.into_parts();
    let user = match authenticate(f, &parts).await {
        Ok(user) => Arc::new(user),
        Err(refused) => return refused,
    };
    if let Err(refused) = authorize(f, info, &user, &parts).await {
        return refused;
    }
    let Ok(_slot) = limit_in_flight(f, info) else {
        let mut r = error(429, "TooManyRequests", "too many requests, please try again later");
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        return r;
    };
    let body = match limit_body(&parts, body).await {
        Ok(body) => body,
        Err(refused) => return refused,
    };
    let span = span(info, id, &user);
    parts.extensions.insert(user);
    if info.is_self_review() {
        parts
            .extensions
            .insert(crate::handlers::self_reviews::AuthorizerHandle(f.authz.clone()));
    }
    let started = Instant::now();
    let response = routes
        .serve(info, Request::from_parts(parts, body))
        .instrument(span.clone())
        .await;
    span.record("code", response.status().as_u16());
    span.record(
        "duration_us",
        u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
    );
    span.in_scope(|| tracing::debug!("request"));
    response
}

/// Stage 2: names the user, or answers 401.
async fn authenticate(f: &Filters, parts: &http::request::Parts) -> Result<User, Response> {
    let conn = parts
        .extensions
        .get::<ConnectionInfo>()
        .cloned()
        .unwrap_or(ConnectionInfo::Unknown);
    match f.authn.authenticate(parts, &conn).await {
        Ok(Some(user)) => Ok(user),
        Ok(None) => Err(error(
            401,
            "Unauthorized",
            "no credentials: anonymous access is limited to /healthz, /livez, /readyz and /version; use the client certificate of the kubeconfig the server wrote",
        )),
        Err(e) => Err(error(401, "Unauthorized", e.0)),
    }
}

/// The attributes of a request for user `user`.
fn attributes(info: &RequestInfo, user: &Arc<User>, verb: &str) -> Attributes {
    let target = match &info.resource {
        Some(r) => Target::Resource(ResourceAttributes {
            group: r.group.clone(),
            version: r.version.clone(),
            resource: r.resource.clone(),
            subresource: r.subresource.clone(),
            namespace: r.namespace.clone(),
            name: r.name.clone(),
        }),
        None => Target::NonResource {
            path: info.path.clone(),
        },
    };
    Attributes {
        user: user.clone(),
        verb: verb.to_owned(),
        target,
    }
}

/// Stage 3: refuses with 403 what the user may not do (and impersonation, which is not
/// supported yet).
async fn authorize(
    f: &Filters,
    info: &RequestInfo,
    user: &Arc<User>,
    parts: &http::request::Parts,
) -> Result<(), Response> {
    if parts.headers.keys().any(|k| k.as_str().starts_with("impersonate-")) {
        return Err(error(
            403,
            "Forbidden",
            format!(
                "impersonation is not supported yet: User {:?} cannot impersonate; run the command without --as",
                user.name
            ),
        ));
    }
    let attrs = attributes(info, user, info.verb);
    judge(&attrs, f.authz.authorize(&attrs).await)?;
    // Server-side apply may create the object: it needs `create` too.
    let apply = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("application/apply-patch"));
    if info.verb == "patch" && apply {
        let create = attributes(info, user, "create");
        judge(&create, f.authz.authorize(&create).await)?;
    }
    Ok(())
}

/// A decision as the request's fate: 403 for a denial, 500 when none could be made.
#[allow(clippy::result_large_err)] // the error is the response itself, built once per refusal
fn judge(attrs: &Attributes, decision: Decision) -> Result<(), Response> {
    match decision {
        Decision::Allow => Ok(()),
        Decision::Deny(reason) => Err(forbidden(attrs, &reason)),
        Decision::Error(e) => Err(error(
            500,
            "InternalError",
            format!("Internal error occurred: the request could not be authorized: {e}"),
        )),
    }
}

fn forbidden(attrs: &Attributes, reason: &str) -> Response {
    let mut message = forbidden_message(attrs);
    if !reason.is_empty() {
        message = format!("{message}: {reason}");
    }
    error(403, "Forbidden", message)
}

/// One request in flight while it lives.
struct Slot<'a>(&'a AtomicUsize);

impl<'a> Slot<'a> {
    fn enter(counter: &'a AtomicUsize, limit: usize) -> Option<Slot<'a>> {
        if counter.fetch_add(1, Ordering::AcqRel) >= limit {
            counter.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(Slot(counter))
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Stage 4: a slot among the reads or writes in flight, held until the answer; `Err` (429) past
/// the limit. Watches are counted apart (by `apiserver_longrunning_requests`), never limited here.
fn limit_in_flight<'a>(f: &'a Filters, info: &RequestInfo) -> Result<Option<Slot<'a>>, ()> {
    if info.is_long_running() {
        return Ok(None);
    }
    let (counter, limit) = match info.verb {
        "get" | "list" | "head" => (&f.reads, f.max_reads),
        _ => (&f.writes, f.max_writes),
    };
    Slot::enter(counter, limit).map(Some).ok_or(())
}

/// Stage 5: 413 for a body past [`MAX_BODY_BYTES`] at once when `Content-Length` says so (the
/// body is read and dropped so the client can read the answer). A body without a length is held
/// to the same limit as the handler reads it (`handlers::body::read`).
async fn limit_body(parts: &http::request::Parts, body: Body) -> Result<Body, Response> {
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if let Some(len) = declared.filter(|l| *l > MAX_BODY_BYTES) {
        drain(body).await;
        return Err(too_large(len));
    }
    Ok(body)
}

/// Stage 6: a span per request with the request id, verb, group, resource, namespace, name and
/// user; the code and duration are recorded when the handler answers.
fn span(info: &RequestInfo, id: &str, user: &User) -> tracing::Span {
    let r = info.resource.as_ref();
    tracing::debug_span!(
        "request",
        request_id = id,
        verb = info.verb,
        group = r.map_or("", |r| r.group.as_str()),
        resource = r.map_or("", |r| r.resource.as_str()),
        namespace = r.map_or("", |r| r.namespace.as_str()),
        name = r.map_or("", |r| r.name.as_str()),
        path = info.path.as_str(),
        user = user.name.as_str(),
        code = tracing::field::Empty,
        duration_us = tracing::field::Empty,
    )
}
