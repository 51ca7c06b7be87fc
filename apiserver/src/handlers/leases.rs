//! `/apis/coordination.k8s.io/v1/[namespaces/<ns>/]leases[/<name>]`: the Leases of direct mode
//! ([`crate::leases`]) — create, get, list (JSON or a Table), watch, update, patch and delete;
//! deletecollection is refused with 405.

use std::sync::Arc;

use axum::body::Body;
use serde_json::Value;

use super::Api;
use super::body;
use super::plain::{self, refused};
use super::response;
use crate::decode::bounded;
use crate::leases::{self, LEASES};
use crate::request_info::RequestInfo;

type Request = http::Request<Body>;
type Response = axum::response::Response;

pub async fn handle(api: Arc<Api>, info: &RequestInfo, req: Request) -> Response {
    let Some(r) = info.resource.as_ref() else {
        return response::not_found(req.uri().path());
    };
    if !r.subresource.is_empty() {
        return response::not_found(req.uri().path());
    }
    let ns = (!r.namespace.is_empty()).then_some(r.namespace.as_str());
    let accept = super::accept(&req);
    let pretty = info.query.flag("pretty");
    let item = !r.name.is_empty();
    let needs_ns = matches!(info.verb, "create" | "get" | "update" | "patch" | "delete");
    if needs_ns && ns.is_none() {
        return response::method_not_allowed(req.method(), "leases of every namespace (name one)");
    }
    let ns_name = ns.unwrap_or_default();
    match (info.verb, item) {
        ("get", true) => match LEASES.get(&api.storage, ns_name, &r.name).await {
            Ok(v) => ok(200, &v, pretty),
            Err(e) => refused(e),
        },
        ("list", false) => match plain::by_name(info) {
            Ok(keep) => plain::list(&api, info, &LEASES, ns, keep, &accept, pretty).await,
            Err(r) => r,
        },
        ("watch", _) => match plain::by_name(info) {
            Ok(keep) => plain::watch(&api, info, &LEASES, ns, keep).await,
            Err(r) => r,
        },
        ("create" | "update", _) if info.dry_run => response::error(
            400,
            "BadRequest",
            "dry-run is not served for Leases in direct mode; leave out --dry-run=server",
        ),
        ("create", false) => create(&api, ns_name, req, pretty).await,
        ("update", true) => update(&api, ns_name, &r.name, req, pretty).await,
        ("patch", true) => patch(&api, ns_name, &r.name, req, pretty).await,
        ("delete", true) => delete(&api, ns_name, &r.name, req, pretty).await,
        (_, item) => response::method_not_allowed(
            req.method(),
            if item {
                "a lease"
            } else {
                "leases (delete them one at a time)"
            },
        ),
    }
}

/// A JSON response of `v` with `code`, indented when `pretty`.
fn ok(code: u16, v: &Value, pretty: bool) -> Response {
    response::json(code, response::encode(v, pretty))
}

/// `POST`: the body as a new Lease in `ns`.
async fn create(api: &Api, ns: &str, req: Request, pretty: bool) -> Response {
    let headers = req.headers().clone();
    let parsed = match read(req).await.and_then(|b| body::object(&headers, &b)) {
        Ok(p) => p,
        Err(r) => return r,
    };
    match leases::create(&api.storage, ns, &parsed.value).await {
        Ok(v) => ok(201, &v, pretty),
        Err(e) => refused(e),
    }
}

/// `PUT`: the body replaces (or creates) the Lease `name`.
async fn update(api: &Api, ns: &str, name: &str, req: Request, pretty: bool) -> Response {
    let headers = req.headers().clone();
    let parsed = match read(req).await.and_then(|b| body::object(&headers, &b)) {
        Ok(p) => p,
        Err(r) => return r,
    };
    match leases::update(&api.storage, ns, name, &parsed.value).await {
        Ok((v, created)) => ok(if created { 201 } else { 200 }, &v, pretty),
        Err(e) => refused(e),
    }
}

/// `PATCH`: the body, in the patch type its content type names, applied to the Lease `name`.
async fn patch(api: &Api, ns: &str, name: &str, req: Request, pretty: bool) -> Response {
    let media = body::media_type(req.headers());
    let bytes = match read(req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let value = if media == "application/apply-patch+yaml" {
        Value::Null
    } else {
        match bounded::json(&bytes) {
            Ok(p) => p.value,
            Err(e) => return body::parse_error(e),
        }
    };
    let patch = match leases::parse_patch(&media, value) {
        Ok(p) => p,
        Err(e) => return refused(e),
    };
    match leases::patch(&api.storage, ns, name, &patch).await {
        Ok(v) => ok(200, &v, pretty),
        Err(e) => refused(e),
    }
}

/// `DELETE`: the Lease `name`, under the body's delete options (if any).
async fn delete(api: &Api, ns: &str, name: &str, req: Request, pretty: bool) -> Response {
    let bytes = match read(req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let options = if bytes.is_empty() {
        Value::Null
    } else {
        match bounded::json(&bytes) {
            Ok(p) => p.value,
            Err(e) => return body::parse_error(e),
        }
    };
    match leases::delete(&api.storage, ns, name, &options).await {
        Ok(v) => ok(200, &v, pretty),
        Err(e) => refused(e),
    }
}

async fn read(req: Request) -> Result<bytes::Bytes, Response> {
    body::read(req.into_body()).await
}
