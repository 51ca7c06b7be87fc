//! `/api`, `/apis` and the group documents, legacy or aggregated (v2, v2beta1) by `Accept`,
//! with ETags; and `/version`, which kubectl's dispatcher reads to pick a kubectl.

use std::sync::Arc;

use axum::extract::State;
use axum::response::Response;
use http::{HeaderMap, HeaderValue, header};
use serde_json::Value;

use super::Api;
use super::response::{self, not_acceptable};
use crate::discovery as docs;
use crate::negotiate::{self, Shape};
use crate::registry::kinds::KindEntry;

/// Discovery bodies, built once from the table of kinds, with their ETags.
#[derive(Debug)]
pub struct Cache {
    legacy_apis: Vec<u8>,
    group: Vec<u8>,
    resources: Vec<u8>,
    v2: (Vec<u8>, String),
    v2beta1: (Vec<u8>, String),
    core_v2: Vec<u8>,
    core_v2beta1: Vec<u8>,
    core_versions: Vec<u8>,
    core_resources: Vec<u8>,
    lease_group: Vec<u8>,
    lease_resources: Vec<u8>,
}

fn etag(bytes: &[u8]) -> String {
    format!("\"{}\"", &crate::openapi::sha512_hex(bytes)[..32])
}

impl Cache {
    pub fn new(kinds: &[KindEntry]) -> Cache {
        let enc = |v: Value| serde_json::to_vec(&v).unwrap_or_default();
        let v2 = enc(docs::aggregated(kinds, "v2"));
        let v2beta1 = enc(docs::aggregated(kinds, "v2beta1"));
        Cache {
            legacy_apis: enc(docs::api_group_list()),
            group: enc(docs::api_group()),
            resources: enc(docs::api_resource_list(kinds)),
            v2: (v2.clone(), etag(&v2)),
            v2beta1: (v2beta1.clone(), etag(&v2beta1)),
            core_v2: enc(docs::aggregated_core("v2")),
            core_v2beta1: enc(docs::aggregated_core("v2beta1")),
            core_versions: enc(docs::core_versions()),
            core_resources: enc(docs::core_resources()),
            lease_group: enc(docs::lease_group()),
            lease_resources: enc(docs::lease_resources()),
        }
    }
}

fn header_str(h: &HeaderMap, name: header::HeaderName) -> &str {
    h.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default()
}

/// `GET /apis`.
pub async fn apis(State(api): State<Arc<Api>>, headers: HeaderMap) -> Response {
    let accept = header_str(&headers, header::ACCEPT);
    match negotiate::for_discovery(accept) {
        Some(Shape::Discovery(v)) => {
            let (body, tag) = if v == "v2" {
                &api.discovery.v2
            } else {
                &api.discovery.v2beta1
            };
            let ct = negotiate::content_type(Shape::Discovery(v));
            let mut r = if header_str(&headers, header::IF_NONE_MATCH) == tag {
                response::bytes(304, &ct, Vec::new())
            } else {
                response::bytes(200, &ct, body.clone())
            };
            if let Ok(v) = HeaderValue::from_str(tag) {
                r.headers_mut().insert(header::ETAG, v);
            }
            r
        }
        Some(_) => response::json(200, api.discovery.legacy_apis.clone()),
        None => not_acceptable(accept),
    }
}

/// `GET /api`: the core group, which serves Events alone (direct mode).
pub async fn core(State(api): State<Arc<Api>>, headers: HeaderMap) -> Response {
    match negotiate::for_discovery(header_str(&headers, header::ACCEPT)) {
        Some(Shape::Discovery(v)) => {
            let body = if v == "v2" {
                api.discovery.core_v2.clone()
            } else {
                api.discovery.core_v2beta1.clone()
            };
            response::bytes(200, &negotiate::content_type(Shape::Discovery(v)), body)
        }
        _ => response::json(200, api.discovery.core_versions.clone()),
    }
}

/// `GET /api/v1`.
pub async fn core_resources(State(api): State<Arc<Api>>) -> Response {
    response::json(200, api.discovery.core_resources.clone())
}

/// `GET /apis/worker.gpustack.ai`.
pub async fn group(State(api): State<Arc<Api>>) -> Response {
    response::json(200, api.discovery.group.clone())
}

/// `GET /apis/worker.gpustack.ai/v1`.
pub async fn resources(State(api): State<Arc<Api>>) -> Response {
    response::json(200, api.discovery.resources.clone())
}

/// `GET /apis/coordination.k8s.io`.
pub async fn lease_group(State(api): State<Arc<Api>>) -> Response {
    response::json(200, api.discovery.lease_group.clone())
}

/// `GET /apis/coordination.k8s.io/v1`.
pub async fn lease_resources(State(api): State<Arc<Api>>) -> Response {
    response::json(200, api.discovery.lease_resources.clone())
}

/// `GET /version`: Kubernetes 1.33, so kubectl's dispatcher picks kubectl 1.33.
pub async fn version() -> Response {
    let v = serde_json::json!({
        "major": "1", "minor": "33",
        "gitVersion": format!("v1.33.0+kvcache.{}", env!("CARGO_PKG_VERSION")),
        "gitCommit": option_env!("KVCACHE_GIT_COMMIT").unwrap_or("unknown"),
        "gitTreeState": "clean", "buildDate": "1970-01-01T00:00:00Z",
        "goVersion": "rust", "compiler": "rustc",
        "platform": format!("{}/{}", std::env::consts::OS, if std::env::consts::ARCH == "x86_64" { "amd64" } else { std::env::consts::ARCH }),
    });
    response::json(200, serde_json::to_vec(&v).unwrap_or_default())
}
