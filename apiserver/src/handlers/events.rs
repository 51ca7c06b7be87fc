//! `/api/v1/[namespaces/<ns>/]events[/<name>]`: the core Events of direct mode
//! ([`crate::events`]), with the verbs Events need — create, get, list (JSON or a Table) and
//! watch; other verbs are refused with 405.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::{HeaderValue, header};
use serde_json::{Value, json};

use super::Api;
use super::body;
use super::response;
use crate::events::{self, FieldSelector, Refusal};
use crate::negotiate::{self, Shape};
use crate::request_info::RequestInfo;
use crate::selectors::LabelSelector;
use crate::storage::EventKind;
use crate::table;

type Request = http::Request<Body>;
type Response = axum::response::Response;

fn refused(Refusal(code, status): Refusal) -> Response {
    response::status(code, &status)
}

pub async fn handle(api: Arc<Api>, info: &RequestInfo, req: Request) -> Response {
    let Some(r) = info.resource.as_ref() else {
        return response::not_found(req.uri().path());
    };
    if !r.subresource.is_empty() {
        return response::not_found(req.uri().path());
    }
    let ns = (!r.namespace.is_empty()).then_some(r.namespace.as_str());
    let accept = req
        .headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .to_owned();
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
        ("get", false) => match events::get(&api.storage, ns.unwrap_or_default(), &r.name).await {
            Ok(v) => response::json(200, response::encode(&v, pretty)),
            Err(e) => refused(e),
        },
        ("list", true) => list(&api, info, ns, &accept, pretty).await,
        ("watch", _) => watch(&api, info, ns).await,
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

fn selectors(info: &RequestInfo) -> Result<(FieldSelector, LabelSelector), Response> {
    let fields = FieldSelector::parse(info.query.get("fieldSelector").unwrap_or_default()).map_err(refused)?;
    let labels = LabelSelector::parse(info.query.get("labelSelector").unwrap_or_default())
        .map_err(|e| response::bad_request(format!("labelSelector: {e}")))?;
    Ok((fields, labels))
}

async fn list(api: &Api, info: &RequestInfo, ns: Option<&str>, accept: &str, pretty: bool) -> Response {
    let (fields, labels) = match selectors(info) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let limit = info
        .query
        .get("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .filter(|l| *l > 0);
    let after = info.query.get("continue").filter(|c| !c.is_empty()).map(|c| {
        String::from_utf8(
            base64::Engine::decode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, c).unwrap_or_default(),
        )
        .unwrap_or_default()
    });
    if after.as_deref().is_some_and(|a| !a.starts_with(&events::prefix(ns))) {
        return response::error(
            410,
            "Expired",
            "the continue token is not valid for this list; list again",
        );
    }
    let (items, revision, next) = match events::list(&api.storage, ns, fields, labels, limit, after).await {
        Ok(page) => page,
        Err(e) => return refused(e),
    };
    let rv = revision.to_string();
    let cont = next
        .map(|k| base64::Engine::encode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, k))
        .unwrap_or_default();
    match negotiate::for_objects(accept) {
        Some(Shape::Table) => {
            let include = match super::params::include_object(&info.query) {
                Ok(i) => i,
                Err(r) => return r,
            };
            let t = table::table(events::COLUMNS, &items, include, &rv, &cont, true);
            response::bytes(
                200,
                &negotiate::content_type(Shape::Table),
                response::encode(&t, pretty),
            )
        }
        Some(_) => {
            let mut meta = json!({"resourceVersion": rv});
            if !cont.is_empty() {
                meta["continue"] = json!(cont);
            }
            let body = json!({"kind": "EventList", "apiVersion": "v1", "metadata": meta, "items": items});
            response::json(200, response::encode(&body, pretty))
        }
        None => response::not_acceptable(accept),
    }
}

/// `ADDED`, `MODIFIED` and `DELETED` lines from the given `resourceVersion` (or from the current
/// state, sent first as `ADDED`), until the timeout or shutdown; a start older than the history
/// is an in-stream 410 `ERROR`.
async fn watch(api: &Arc<Api>, info: &RequestInfo, ns: Option<&str>) -> Response {
    let (fields, labels) = match selectors(info) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let name = info.resource.as_ref().map(|r| r.name.clone()).unwrap_or_default();
    let keep = move |v: &Value| {
        let l: Option<std::collections::BTreeMap<String, String>> =
            serde_json::from_value(v["metadata"]["labels"].clone()).ok();
        fields.matches(v) && labels.matches(l.as_ref()) && (name.is_empty() || v["metadata"]["name"] == name.as_str())
    };
    let from = info
        .query
        .get("resourceVersion")
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    let timeout = info
        .query
        .get("timeoutSeconds")
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(Duration::from_secs(1800), Duration::from_secs);
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Bytes>(256);
    let line = |kind: &str, object: &Value| {
        let mut b = serde_json::to_vec(&json!({"type": kind, "object": object})).unwrap_or_default();
        b.push(b'\n');
        Bytes::from(b)
    };
    let mut initial = Vec::new();
    let start = if from == 0 {
        match events::list(
            &api.storage,
            ns,
            FieldSelector::default(),
            LabelSelector::default(),
            None,
            None,
        )
        .await
        {
            Ok((items, rev, _)) => {
                initial = items;
                rev
            }
            Err(e) => return refused(e),
        }
    } else {
        from
    };
    let prefix = events::prefix(ns);
    match api.storage.watch(&prefix, start).await {
        Ok(mut stream) => {
            let mut shutdown = api.shutdown.clone();
            let guard = api.metrics.longrunning(info);
            tokio::spawn(async move {
                let _guard = guard;
                for v in initial.iter().filter(|v| keep(v)) {
                    if tx.send(line("ADDED", v)).await.is_err() {
                        return;
                    }
                }
                let deadline = tokio::time::sleep(timeout);
                tokio::pin!(deadline);
                loop {
                    let ev = tokio::select! {
                        ev = stream.next() => ev,
                        () = &mut deadline => return,
                        _ = shutdown.changed() => return,
                    };
                    let Ok(ev) = ev else { return };
                    let kv = crate::storage::KeyValue {
                        key: ev.key.clone(),
                        value: ev.value.clone(),
                        create_revision: 0,
                        mod_revision: ev.revision,
                    };
                    let Some(v) = events::with_revision(&kv) else { continue };
                    if !keep(&v) {
                        continue;
                    }
                    let kind = match (ev.kind, ev.prev_value.is_some()) {
                        (EventKind::Delete, _) => "DELETED",
                        (EventKind::Put, true) => "MODIFIED",
                        (EventKind::Put, false) => "ADDED",
                    };
                    if tx.send(line(kind, &v)).await.is_err() {
                        return;
                    }
                }
            });
        }
        Err(crate::storage::StorageError::Expired { requested, oldest }) => {
            let status = crate::status::failure(
                410,
                "Expired",
                format!("too old resource version: {requested} ({oldest})"),
            );
            let _ = tx.try_send(line("ERROR", &serde_json::to_value(status).unwrap_or_default()));
        }
        Err(e) => return response::error(503, "ServiceUnavailable", e.to_string()),
    }
    let stream = futures::stream::poll_fn(move |cx| {
        rx.poll_recv(cx)
            .map(|chunk| chunk.map(Ok::<Bytes, std::convert::Infallible>))
    });
    let mut r = Response::new(Body::from_stream(stream));
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}
