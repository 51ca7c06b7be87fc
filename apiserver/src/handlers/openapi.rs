//! `/openapi/v2` (JSON, or protobuf for kubectl 1.27 and 1.28) and `/openapi/v3` (the root and the
//! group-version document addressed by its content hash), with ETags.

use std::sync::Arc;

use axum::extract::State;
use axum::response::Response;
use http::{HeaderMap, HeaderValue, header};

use super::Api;
use super::response::{self, not_acceptable};
use crate::openapi::{LEASE_V3_PATH, V3_PATH};
use crate::request_info::Query;

fn header_str(h: &HeaderMap, name: header::HeaderName) -> &str {
    h.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default()
}

fn hv(s: &str) -> HeaderValue {
    HeaderValue::from_str(s).unwrap_or(HeaderValue::from_static(""))
}

fn accepts_json(accept: &str) -> bool {
    accept.is_empty() || accept.contains("application/json") || accept.contains("*/*")
}

/// `GET /openapi/v3`.
pub async fn v3_root(State(api): State<Arc<Api>>) -> Response {
    response::json(200, api.openapi.v3_root.clone())
}

/// `GET /openapi/v3/apis/worker.gpustack.ai/v1`.
pub async fn v3(State(api): State<Arc<Api>>, uri: http::Uri, headers: HeaderMap) -> Response {
    group_version(&api.openapi.v3, &api.openapi.v3_hash, V3_PATH, &uri, &headers)
}

/// `GET /openapi/v3/apis/coordination.k8s.io/v1`: the Leases of direct mode.
pub async fn lease_v3(State(api): State<Arc<Api>>, uri: http::Uri, headers: HeaderMap) -> Response {
    group_version(
        &api.openapi.lease_v3,
        &api.openapi.lease_v3_hash,
        LEASE_V3_PATH,
        &uri,
        &headers,
    )
}

/// A group-version document, redirected to its current hash, with its ETag.
fn group_version(doc: &[u8], hash: &str, path: &str, uri: &http::Uri, headers: &HeaderMap) -> Response {
    let accept = header_str(headers, header::ACCEPT);
    if !accepts_json(accept) {
        return not_acceptable(accept);
    }
    let q = Query::parse(uri.query());
    if let Some(asked) = q.get("hash")
        && asked != hash
    {
        let mut r = response::json(301, Vec::new());
        r.headers_mut()
            .insert(header::LOCATION, hv(&format!("{path}?hash={hash}")));
        return r;
    }
    let tag = format!("\"{hash}\"");
    let mut r = if header_str(headers, header::IF_NONE_MATCH) == tag {
        response::json(304, Vec::new())
    } else {
        response::json(200, doc.to_vec())
    };
    let h = r.headers_mut();
    h.insert(header::ETAG, hv(&tag));
    h.insert(header::VARY, HeaderValue::from_static("Accept"));
    if q.has("hash") {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("public, immutable"));
    }
    r
}

/// `GET /openapi/v2`.
pub async fn v2(State(api): State<Arc<Api>>, headers: HeaderMap) -> Response {
    let accept = header_str(&headers, header::ACCEPT);
    let tag = format!("\"{}\"", api.openapi.v2_hash);
    let mut r = if accept.contains("com.github.proto-openapi.spec.v2") {
        response::bytes(
            200,
            "application/com.github.proto-openapi.spec.v2.v1.0+protobuf",
            api.openapi.v2_protobuf.clone(),
        )
    } else if accepts_json(accept) {
        if header_str(&headers, header::IF_NONE_MATCH) == tag {
            response::json(304, Vec::new())
        } else {
            response::json(200, api.openapi.v2_json.clone())
        }
    } else {
        return not_acceptable(accept);
    };
    r.headers_mut().insert(header::ETAG, hv(&tag));
    r.headers_mut().insert(header::VARY, HeaderValue::from_static("Accept"));
    r
}
