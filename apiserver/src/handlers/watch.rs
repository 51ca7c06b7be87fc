//! `watch`: a stream of one JSON event per line, as Kubernetes clients (kubectl, informers,
//! kube-runtime's watcher) read it. The registry's watch gives the initial state and filtered
//! typed events; this handler writes them as `ADDED`/`MODIFIED`/`DELETED` lines (or Table rows),
//! adds `BOOKMARK`s, ends at the timeout or at shutdown, and reports a start older than the
//! history as an in-stream `ERROR` event with a 410 `Expired` Status, which makes clients list
//! again.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use bytes::Bytes;
use http::{HeaderValue, header};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::Api;
use super::params::{self, WatchParams};
use super::response::{self, registry_error};
use super::target::{Reply, Target};
use crate::negotiate::{self, Shape};
use crate::registry::RegistryError;
use crate::registry::kinds::KindEntry;
use crate::registry::watch::{Closed, Event, Watch, WatchOptions};
use crate::storage::watch::WatchClosed;
use crate::table::{self, IncludeObject};

pub async fn handle(State(api): State<Arc<Api>>, t: Target) -> Reply {
    let include = params::include_object(t.query())?;
    let p = params::watch(t.query(), t.kind, &t.name)?;
    let table = (t.shape == Shape::Table).then_some(include);
    let opened = t
        .resource
        .watch(
            t.list_namespace(),
            WatchOptions {
                start: p.start,
                filter: p.filter.clone(),
                initial_events_end: p.initial_events_end,
            },
        )
        .await;
    let mut enc = Encoder {
        kind: t.kind,
        table,
        headers_sent: false,
    };
    let (tx, rx) = mpsc::channel::<Bytes>(256);
    match opened {
        Ok(watch) => {
            let guard = api.metrics.longrunning(&t.info);
            let api = api.clone();
            tokio::spawn(async move {
                run(&api, watch, p, enc, tx).await;
                drop(guard);
            });
        }
        // A start older than the history is part of the stream: kube-runtime's watcher (and
        // client-go) list again when they read it.
        Err(RegistryError::Expired(message)) => {
            let _ = tx.try_send(enc.event("ERROR", &status_event(410, "Expired", &message)));
        }
        Err(e) => return Err(registry_error(t.kind, "", &e)),
    }
    let mut rx = rx;
    let stream = futures::stream::poll_fn(move |cx| {
        rx.poll_recv(cx)
            .map(|chunk| chunk.map(Ok::<Bytes, std::convert::Infallible>))
    });
    let mut r = axum::response::Response::new(Body::from_stream(stream));
    let ct = match t.shape {
        Shape::Table => negotiate::content_type(Shape::Table),
        _ => "application/json".to_owned(),
    };
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_str(&ct).unwrap_or(HeaderValue::from_static("application/json")),
    );
    Ok(r)
}

/// Sends events to `tx` until the client leaves, the timeout passes, the server shuts down or the
/// stream cannot continue.
async fn run(api: &Api, mut watch: Watch, p: WatchParams, mut enc: Encoder, tx: mpsc::Sender<Bytes>) {
    let plural = enc.kind.plural;
    let mut shutdown = api.shutdown.clone();
    let deadline = tokio::time::sleep(p.timeout);
    tokio::pin!(deadline);
    let mut ticker = tokio::time::interval(api.bookmark_interval);
    ticker.tick().await;
    loop {
        let ev = tokio::select! {
            ev = watch.next() => ev,
            _ = ticker.tick() => {
                if p.bookmarks {
                    let line = enc.bookmark(watch.revision(), false);
                    if !send(api, plural, &tx, line, &watch, deadline.as_mut(), &mut shutdown).await {
                        return;
                    }
                }
                continue;
            }
            _ = &mut deadline => {
                if p.bookmarks {
                    let _ = tx.send(enc.bookmark(watch.revision(), false)).await;
                }
                return;
            }
            _ = shutdown.changed() => return,
            () = tx.closed() => return,
        };
        let line = match ev {
            Ok(Event::Added(b)) => enc.stored("ADDED", &b),
            Ok(Event::Modified(b)) => enc.stored("MODIFIED", &b),
            Ok(Event::Deleted(b)) => enc.stored("DELETED", &b),
            Ok(Event::InitialEventsEnd(rv)) => Some(enc.bookmark(rv, true)),
            Err(Closed::Storage(closed)) => {
                if matches!(closed, WatchClosed::TooSlow(_)) {
                    api.metrics.watcher_terminated(plural);
                }
                tracing::info!(resource = plural, "watch closed: {closed}");
                return;
            }
        };
        let Some(line) = line else { continue };
        api.metrics.watch_event(plural);
        if !send(api, plural, &tx, line, &watch, deadline.as_mut(), &mut shutdown).await {
            return;
        }
    }
}

/// Writes one line to the client; `false` when the watch ends first. A client that stops reading
/// blocks the write, while its queue in the storage's hub fills: once full, the hub closes the
/// watch, which ends it here too and counts it (`apiserver_terminated_watchers_total`), so such
/// a client holds no queue and no task; the timeout and shutdown end a blocked write as well.
async fn send(
    api: &Api,
    plural: &'static str,
    tx: &mpsc::Sender<Bytes>,
    line: Bytes,
    watch: &Watch,
    deadline: std::pin::Pin<&mut tokio::time::Sleep>,
    shutdown: &mut tokio::sync::watch::Receiver<bool>,
) -> bool {
    tokio::select! {
        sent = tx.send(line) => sent.is_ok(),
        () = watch.lagged() => {
            api.metrics.watcher_terminated(plural);
            tracing::info!(resource = plural, "watch closed: the client stopped reading and its queue filled");
            false
        }
        _ = deadline => false,
        _ = shutdown.changed() => false,
    }
}

fn status_event(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code})
}

/// Writes events as lines.
struct Encoder {
    kind: &'static KindEntry,
    table: Option<IncludeObject>,
    headers_sent: bool,
}

impl Encoder {
    /// An event of a stored object, sent as its bytes unless a Table was asked for.
    fn stored(&mut self, type_: &str, json: &[u8]) -> Option<Bytes> {
        if self.table.is_some() {
            let v: Value = serde_json::from_slice(json).ok()?;
            return Some(self.event(type_, &v));
        }
        let mut line = Vec::with_capacity(json.len() + 32);
        line.extend_from_slice(br#"{"type":""#);
        line.extend_from_slice(type_.as_bytes());
        line.extend_from_slice(br#"","object":"#);
        line.extend_from_slice(json);
        line.extend_from_slice(b"}\n");
        Some(Bytes::from(line))
    }

    fn bookmark(&mut self, rv: u64, initial_end: bool) -> Bytes {
        let mut meta = json!({"resourceVersion": rv.to_string()});
        if initial_end {
            meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        let obj = json!({"kind": self.kind.kind, "apiVersion": kvcache_api::API_VERSION, "metadata": meta});
        self.event("BOOKMARK", &obj)
    }

    fn event(&mut self, type_: &str, object: &Value) -> Bytes {
        let object = match self.table {
            Some(include) if type_ != "BOOKMARK" && type_ != "ERROR" => {
                let rv = object
                    .pointer("/metadata/resourceVersion")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let t = table::table(
                    self.kind.columns,
                    std::slice::from_ref(object),
                    include,
                    rv,
                    "",
                    !self.headers_sent,
                );
                self.headers_sent = true;
                t
            }
            _ => object.clone(),
        };
        let mut line = response::encode(&json!({"type": type_, "object": object}), false);
        line.push(b'\n');
        Bytes::from(line)
    }
}
