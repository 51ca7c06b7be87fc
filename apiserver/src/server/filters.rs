//! The filters every request passes before its handler, as tower layers in kube-apiserver's
//! order: request info and metrics → authentication → authorization → in-flight limits → body
//! limit → a `tracing` span. In-process clients go through exactly the same pipeline.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::Response;
use http::{HeaderValue, header};
use http_body_util::Limited;
use tracing::Instrument;

use crate::auth::{
    Attributes, Authorizer, Chain, ConnectionInfo, Decision, ResourceAttributes, Target, User, forbidden_message,
};
use crate::handlers::body::{MAX_BODY_BYTES, drain, too_large};
use crate::handlers::response::error;
use crate::metrics::ApiMetrics;
use crate::request_info::{Query, RequestInfo};

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

/// `router` behind every filter.
pub fn wrap(router: Router, filters: Arc<Filters>) -> Router {
    // The last layer added runs first.
    router
        .layer(middleware::from_fn(trace))
        .layer(middleware::from_fn(limit_body))
        .layer(middleware::from_fn_with_state(filters.clone(), limit_in_flight))
        .layer(middleware::from_fn_with_state(filters.clone(), authorize))
        .layer(middleware::from_fn_with_state(filters.clone(), authenticate))
        .layer(middleware::from_fn_with_state(filters, observe))
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
    uuid::Uuid::from_bytes(bytes).to_string()
}

/// The request id of a request, for the span.
#[derive(Debug, Clone)]
struct AuditId(String);

/// Judges what the request is about, counts it when answered, and stamps the response.
async fn observe(State(f): State<Arc<Filters>>, mut req: Request, next: Next) -> Response {
    let started = Instant::now();
    let id = audit_id(&req);
    let info = RequestInfo::parse(req.method(), req.uri().path(), &Query::parse(req.uri().query()));
    req.extensions_mut().insert(info.clone());
    req.extensions_mut().insert(AuditId(id.clone()));
    let mut response = next.run(req).await;
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

/// Names the user, or answers 401.
async fn authenticate(State(f): State<Arc<Filters>>, req: Request, next: Next) -> Response {
    let conn = req
        .extensions()
        .get::<ConnectionInfo>()
        .cloned()
        .unwrap_or(ConnectionInfo::Unknown);
    let (parts, body) = req.into_parts();
    let result = f.authn.authenticate(&parts, &conn).await;
    match result {
        Ok(Some(user)) => {
            let mut req = Request::from_parts(parts, body);
            req.extensions_mut().insert(user);
            next.run(req).await
        }
        Ok(None) => error(
            401,
            "Unauthorized",
            "no credentials: anonymous access is limited to /healthz, /livez, /readyz and /version; use the client certificate of the kubeconfig the server wrote",
        ),
        Err(e) => error(401, "Unauthorized", e.0),
    }
}

/// The attributes of a request for user `user`.
fn attributes(info: &RequestInfo, user: &User, verb: &str) -> Attributes {
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

/// Refuses with 403 what the user may not do (and impersonation, which is not supported yet).
async fn authorize(State(f): State<Arc<Filters>>, req: Request, next: Next) -> Response {
    let (Some(info), Some(user)) = (req.extensions().get::<RequestInfo>(), req.extensions().get::<User>()) else {
        return error(
            500,
            "InternalError",
            "the request reached authorization unauthenticated",
        );
    };
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
    let attrs = attributes(info, user, info.verb);
    if let Decision::Deny(reason) = f.authz.authorize(&attrs).await {
        return forbidden(&attrs, &reason);
    }
    // Server-side apply may create the object: it needs `create` too.
    let apply = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("application/apply-patch"));
    if info.verb == "patch" && apply {
        let create = attributes(info, user, "create");
        if let Decision::Deny(reason) = f.authz.authorize(&create).await {
            return forbidden(&create, &reason);
        }
    }
    next.run(req).await
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

/// 429 with `Retry-After` past the reads or writes in flight; watches are counted apart (by
/// `apiserver_longrunning_requests`), never limited here.
async fn limit_in_flight(State(f): State<Arc<Filters>>, req: Request, next: Next) -> Response {
    let Some(info) = req.extensions().get::<RequestInfo>() else {
        return next.run(req).await;
    };
    if info.is_long_running() {
        return next.run(req).await;
    }
    let (counter, limit) = match info.verb {
        "get" | "list" | "head" => (&f.reads, f.max_reads),
        _ => (&f.writes, f.max_writes),
    };
    let Some(_slot) = Slot::enter(counter, limit) else {
        let mut r = error(429, "TooManyRequests", "too many requests, please try again later");
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        return r;
    };
    next.run(req).await
}

/// 413 for a body past [`MAX_BODY_BYTES`]: at once when `Content-Length` says so (the body is
/// read and dropped so the client can read the answer), else when a handler reads past it.
async fn limit_body(req: Request, next: Next) -> Response {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    let (parts, body) = req.into_parts();
    if let Some(len) = declared.filter(|l| *l > MAX_BODY_BYTES) {
        drain(body).await;
        return too_large(len);
    }
    let body = Body::new(Limited::new(body, MAX_BODY_BYTES));
    next.run(Request::from_parts(parts, body)).await
}

/// A span per request with the request id, verb, group, resource, namespace, name and user; the
/// code and duration are recorded when the handler answers.
async fn trace(req: Request, next: Next) -> Response {
    let started = Instant::now();
    let info = req.extensions().get::<RequestInfo>();
    let r = info.and_then(|i| i.resource.as_ref());
    let span = tracing::debug_span!(
        "request",
        request_id = req.extensions().get::<AuditId>().map_or("", |a| a.0.as_str()),
        verb = info.map_or("", |i| i.verb),
        group = r.map_or("", |r| r.group.as_str()),
        resource = r.map_or("", |r| r.resource.as_str()),
        namespace = r.map_or("", |r| r.namespace.as_str()),
        name = r.map_or("", |r| r.name.as_str()),
        path = info.map_or("", |i| i.path.as_str()),
        user = req.extensions().get::<User>().map_or("", |u| u.name.as_str()),
        code = tracing::field::Empty,
        duration_us = tracing::field::Empty,
    );
    let response = next.run(req).instrument(span.clone()).await;
    span.record("code", response.status().as_u16());
    span.record(
        "duration_us",
        u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
    );
    span.in_scope(|| tracing::debug!("request"));
    response
}
