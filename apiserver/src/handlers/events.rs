//! `/api/v1/[namespaces/<ns>/]events[/<name>]`: the core Events of direct mode
//! ([`crate::events`]), with the verbs Events need — create, get, list (JSON or a Table) and
//! watch; other verbs are refused with 405.

use std::sync::Arc;

use axum::body::Body;
use serde_json::Value;

use super::Api;
use super::body;
use super::plain::{self, Keep, refused};
use super::response;
use crate::events::{self, EVENTS};
use crate::request_info::RequestInfo;
use crate::selectors::FieldSelector;
use crate::selectors::LabelSelector;

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
    match (info.verb, r.name.is_empty()) {
        ("create", true) => {
            let Some(ns) = ns else {
                return response::method_not_allowed(req.method(), "events of every namespace (create in one)");
            };
            let bytes = match body::read(req.into_body()).await {
                Ok(b) => b,
                Err(r) => return r,
            };
            match events::create(&api.storage, ns, &bytes).await {
                Ok(v) => response::json(201, response::encode(&v, pretty)),
                Err(e) => refused(e),
            }
        }
        ("get", false) => match EVENTS.get(&api.storage, ns.unwrap_or_default(), &r.name).await {
            Ok(v) => response::json(200, response::encode(&v, pretty)),
            Err(e) => refused(e),
        },
        ("list", true) => match keep(info) {
            Ok(keep) => plain::list(&api, info, &EVENTS, ns, keep, &accept, pretty).await,
            Err(r) => r,
        },
        ("watch", _) => match keep(info) {
            Ok(keep) => plain::watch(&api, info, &EVENTS, ns, keep).await,
            Err(r) => r,
        },
        (_, item) => response::method_not_allowed(
            req.method(),
            if item {
                "an event (events are created, read and watched)"
            } else {
                "events"
            },
        ),
    }
}

/// The field and label selectors of a list or watch.
fn keep(info: &RequestInfo) -> Result<Keep, Response> {
    let fields = FieldSelector::parse_for(info.query.get("fieldSelector").unwrap_or_default(), &events::FIELDS)
        .map_err(|e| refused(crate::plain::refuse(400, "BadRequest", e.0)))?;
    let labels = LabelSelector::parse(info.query.get("labelSelector").unwrap_or_default())
        .map_err(|e| response::bad_request(format!("labelSelector: {e}")))?;
    Ok(Arc::new(move |v: &Value| {
        fields.matches_json(v) && labels.matches(crate::plain::labels(v).as_ref())
    }))
}
