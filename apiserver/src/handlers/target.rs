//! Which object a resource request is about, and the checks every verb shares before its handler
//! runs: the kind is served (404), the scope fits (a namespace on a cluster-scoped kind is a
//! 404), the subresource exists and takes the verb (404, 405), and the client accepts a shape we
//! produce (406).

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::response::Response;
use http::HeaderMap;
use http::request::Parts;

use super::Api;
use super::response::{error, not_acceptable, not_found};
use crate::negotiate::{self, Shape};
use crate::registry::Resource;
use crate::registry::fieldmanager::Part;
use crate::registry::kinds::KindEntry;
use crate::request_info::{Query, RequestInfo};

/// Handlers answer with a response either way; `Err` is a refusal.
pub type Reply = Result<Response, Response>;

/// A resource request, resolved.
pub struct Target {
    pub kind: &'static KindEntry,
    pub resource: Arc<dyn Resource>,
    /// Empty for cluster-scoped kinds and for lists and watches across namespaces.
    pub namespace: String,
    /// Empty for collection requests.
    pub name: String,
    pub part: Part,
    /// What the request is about, as the filters judged it (its query included).
    pub info: Arc<RequestInfo>,
    pub headers: HeaderMap,
    /// What the client accepts for objects and lists.
    pub shape: Shape,
    /// `?pretty=true`.
    pub pretty: bool,
}

impl FromRequestParts<Arc<Api>> for Target {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, api: &Arc<Api>) -> Result<Target, Response> {
        let info = match parts.extensions.get::<Arc<RequestInfo>>() {
            Some(i) => i.clone(),
            None => Arc::new(RequestInfo::parse(&parts.method, parts.uri.path(), parts.uri.query())),
        };
        let path = parts.uri.path();
        let (Some(kind), Some(r)) = (info.kind(), info.resource.as_ref()) else {
            return Err(not_found(path));
        };
        let Some((_, resource)) = api.registry.resource(kind.plural) else {
            return Err(not_found(path));
        };
        let api_path = || format!("/apis/{}", kvcache_api::API_VERSION);
        if !kind.namespaced() && !r.namespace.is_empty() {
            return Err(error(
                404,
                "NotFound",
                format!("{} is cluster-scoped: use {}/{}", kind.plural, api_path(), kind.plural),
            ));
        }
        if kind.namespaced() && r.namespace.is_empty() && !matches!(info.verb, "list" | "watch") {
            return Err(error(
                404,
                "NotFound",
                format!(
                    "{} is namespaced: use {}/namespaces/<namespace>/{}",
                    kind.plural,
                    api_path(),
                    kind.plural
                ),
            ));
        }
        let part = match r.subresource.as_str() {
            "" => Part::Main,
            "status" if !r.name.is_empty() => Part::Status,
            other => {
                return Err(error(
                    404,
                    "NotFound",
                    format!(
                        "the server could not find the requested resource: subresource {other:?} of {}",
                        kind.plural
                    ),
                ));
            }
        };
        if part == Part::Status && !matches!(info.verb, "get" | "update" | "patch") {
            return Err(super::response::method_not_allowed(
                &parts.method,
                &format!("{}/status", kind.plural),
            ));
        }
        let accept = parts
            .headers
            .get(http::header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        let Some(shape) = negotiate::for_objects(accept) else {
            return Err(not_acceptable(accept));
        };
        let (namespace, name) = (r.namespace.clone(), r.name.clone());
        Ok(Target {
            kind,
            resource: resource.clone(),
            namespace,
            name,
            part,
            pretty: info.query.flag("pretty"),
            info,
            // The handler's body extractor needs no headers: they move to the target.
            headers: std::mem::take(&mut parts.headers),
            shape,
        })
    }
}

impl Target {
    /// The query parameters.
    pub fn query(&self) -> &Query {
        &self.info.query
    }

    /// The namespace to list or watch in: `None` across namespaces (and for cluster-scoped
    /// kinds).
    pub fn list_namespace(&self) -> Option<&str> {
        Some(self.namespace.as_str()).filter(|n| !n.is_empty())
    }
}
