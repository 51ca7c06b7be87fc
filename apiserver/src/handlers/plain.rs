//! The list and watch responses of the built-in kinds served in direct mode
//! ([`crate::plain`]): Events and Leases share them.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::{HeaderValue, header};
use serde_json::{Value, json};

use super::Api;
use super::response;
use crate::negotiate::{self, Shape};
use crate::plain::{PlainKind, Refusal};
use crate::request_info::RequestInfo;
use crate::selectors::{FieldSelector, LabelSelector};
use crate::storage::{EventKind, WatchEvent, WatchStream};
use crate::table;

type Response = axum::response::Response;

/// Which objects a list or watch wants.
pub type Keep = Arc<dyn Fn(&Value) -> bool + Send + Sync>;

pub fn refused(Refusal(code, status): Refusal) -> Response {
    response::status(code, &status)
}

/// The field (`metadata.name`, `metadata.namespace`) and label selectors of a list or watch.
pub fn by_name(info: &RequestInfo) -> Result<Keep, Response> {
    let fields = FieldSelector::parse(info.query.get("fieldSelector").unwrap_or_default())
        .map_err(|e| response::bad_request(format!("fieldSelector: {e}")))?;
    let labels = LabelSelector::parse(info.query.get("labelSelector").unwrap_or_default())
        .map_err(|e| response::bad_request(format!("labelSelector: {e}")))?;
    Ok(Arc::new(move |v: &Value| {
        let name = v["metadata"]["name"].as_str().unwrap_or_default();
        let namespace = v["metadata"]["namespace"].as_str().unwrap_or_default();
        fields.matches(name, namespace) && labels.matches(crate::plain::labels(v).as_ref())
    }))
}

/// A page of `kind` in `ns` (JSON, or a Table for kubectl), with `limit` and `continue`.
pub async fn list(
    api: &Api,
    info: &RequestInfo,
    kind: &PlainKind,
    ns: Option<&str>,
    keep: Keep,
    accept: &str,
    pretty: bool,
) -> Response {
    let limit = info
        .query
        .get("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .filter(|l| *l > 0);
    let token = info.query.get("continue").filter(|c| !c.is_empty());
    let (items, revision, next) = match kind.list(&api.storage, ns, keep, limit, token).await {
        Ok(page) => page,
        Err(e) => return refused(e),
    };
    respond_list(info, kind, &items, revision, next.unwrap_or_default(), accept, pretty)
}

/// The answer to a list of `kind`: `items` read at `revision` as JSON, or a Table for kubectl.
pub fn respond_list(
    info: &RequestInfo,
    kind: &PlainKind,
    items: &[Value],
    revision: u64,
    cont: String,
    accept: &str,
    pretty: bool,
) -> Response {
    let rv = revision.to_string();
    match negotiate::for_objects(accept) {
        Some(Shape::Table) => {
            let include = match super::params::include_object(&info.query) {
                Ok(i) => i,
                Err(r) => return r,
            };
            let t = table::table(kind.columns, items, include, &rv, &cont, true);
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
            let body = json!({"kind": format!("{}List", kind.kind), "apiVersion": kind.api_version, "metadata": meta, "items": items});
            response::json(200, response::encode(&body, pretty))
        }
        None => response::not_acceptable(accept),
    }
}

/// `ADDED`, `MODIFIED` and `DELETED` lines of `kind` in `ns` from the given `resourceVersion`
/// (or from the current state, sent first as `ADDED`), until the timeout or shutdown; a start
/// older than the history is an in-stream 410 `ERROR`.
pub async fn watch(api: &Arc<Api>, info: &RequestInfo, kind: &PlainKind, ns: Option<&str>, keep: Keep) -> Response {
    let name = info.resource.as_ref().map(|r| r.name.clone()).unwrap_or_default();
    let keep: Keep = Arc::new(move |v: &Value| keep(v) && (name.is_empty() || v["metadata"]["name"] == name.as_str()));
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
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(256);
    let (initial, start) = if from == 0 {
        match current_state(api, kind, ns).await {
            Ok(state) => state,
            Err(r) => return r,
        }
    } else {
        (Vec::new(), from)
    };
    match api.storage.watch(&kind.prefix(ns), start).await {
        Ok(stream) => {
            let lines = Lines {
                tx,
                keep,
                timeout,
                shutdown: api.shutdown.clone(),
            };
            let guard = api.metrics.longrunning(info);
            tokio::spawn(async move {
                let _guard = guard;
                lines.send(initial, stream).await;
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
    streamed(rx)
}

/// One line of a watch: `{"type": kind, "object": object}` and a newline.
fn line(kind: &str, object: &Value) -> Bytes {
    let mut b = serde_json::to_vec(&json!({"type": kind, "object": object})).unwrap_or_default();
    b.push(b'\n');
    Bytes::from(b)
}

/// Every object of `kind` in `ns` and the revision they were read at, for a watch from now.
async fn current_state(api: &Api, kind: &PlainKind, ns: Option<&str>) -> Result<(Vec<Value>, u64), Response> {
    let mut initial = Vec::new();
    let all: Keep = Arc::new(|_| true);
    // the pages of one list, read at one revision, from which the watch then goes on
    let mut after: Option<String> = None;
    loop {
        match kind.list(&api.storage, ns, all.clone(), None, after.as_deref()).await {
            Ok((items, rev, next)) => {
                initial.extend(items);
                if next.is_none() {
                    return Ok((initial, rev));
                }
                after = next;
            }
            Err(e) => return Err(refused(e)),
        }
    }
}

/// Where a watch's lines go, which objects they carry, and until when.
struct Lines {
    tx: tokio::sync::mpsc::Sender<Bytes>,
    keep: Keep,
    timeout: Duration,
    shutdown: tokio::sync::watch::Receiver<bool>,
}

impl Lines {
    /// Sends `initial` as `ADDED`, then the events of `stream`, until the timeout, shutdown or
    /// the client going away.
    async fn send(mut self, initial: Vec<Value>, mut stream: WatchStream) {
        let keep = &self.keep;
        for v in initial.iter().filter(|v| keep(v)) {
            if self.tx.send(line("ADDED", v)).await.is_err() {
                return;
            }
        }
        let deadline = tokio::time::sleep(self.timeout);
        tokio::pin!(deadline);
        loop {
            let ev = tokio::select! {
                ev = stream.next() => ev,
                () = &mut deadline => return,
                _ = self.shutdown.changed() => return,
            };
            let Ok(ev) = ev else { return };
            let Some((kind, v)) = event_line(&ev) else {
                continue;
            };
            if !keep(&v) {
                continue;
            }
            if self.tx.send(line(kind, &v)).await.is_err() {
                return;
            }
        }
    }
}

/// The watch type and object of a storage event (`None` when it holds no object).
fn event_line(ev: &WatchEvent) -> Option<(&'static str, Value)> {
    let kv = crate::storage::KeyValue {
        key: ev.key.clone(),
        value: ev.value.clone(),
        create_revision: 0,
        mod_revision: ev.revision,
    };
    let v = crate::plain::with_revision(&kv)?;
    let kind = match (ev.kind, ev.prev_value.is_some()) {
        (EventKind::Delete, _) => "DELETED",
        (EventKind::Put, true) => "MODIFIED",
        (EventKind::Put, false) => "ADDED",
    };
    Some((kind, v))
}

/// The response that streams what `rx` receives, as JSON lines.
fn streamed(mut rx: tokio::sync::mpsc::Receiver<Bytes>) -> Response {
    let stream = futures::stream::poll_fn(move |cx| {
        rx.poll_recv(cx)
            .map(|chunk| chunk.map(Ok::<Bytes, std::convert::Infallible>))
    });
    let mut r = Response::new(Body::from_stream(stream));
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}
