//! Watch streams: initial events (for `resourceVersion` unset or `0`, and `sendInitialEvents`),
//! then storage changes as ADDED/MODIFIED/DELETED, selector transitions as ADDED/DELETED,
//! BOOKMARKs, and a 410 ERROR event when the start revision is older than the history kept.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::api::Api;
use super::resource::{MetaFilter, Resource};
use super::table::{self, IncludeObject};
use crate::storage::{EventKind, KeyValue, StorageError};

/// Where a watch starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// Send the current state as ADDED events first (`resourceVersion` unset or `0`).
    Initial,
    /// Only changes after this revision.
    After(u64),
}

pub struct Options {
    pub namespace: Option<String>,
    pub start: Start,
    pub filter: Option<MetaFilter>,
    pub bookmarks: bool,
    /// `sendInitialEvents=true`: end the initial events with the `k8s.io/initial-events-end` bookmark.
    pub initial_events_end: bool,
    pub timeout: Duration,
    pub table: Option<IncludeObject>,
}

struct Encoder {
    table: Option<IncludeObject>,
    columns: &'static [table::Column],
    headers_sent: bool,
}

impl Encoder {
    /// An event for a stored object: its stored JSON (with `resourceVersion` spliced in) is
    /// sent as it is, unless a Table was asked for.
    fn stored(&mut self, type_: &str, kv: &KeyValue) -> Option<Bytes> {
        let json = crate::registry::encoded_with_revision(kv).ok()?;
        if self.table.is_some() {
            let v: Value = serde_json::from_slice(&json).ok()?;
            return Some(self.event(type_, &v));
        }
        let mut line = Vec::with_capacity(json.len() + 32);
        line.extend_from_slice(br#"{"type":""#);
        line.extend_from_slice(type_.as_bytes());
        line.extend_from_slice(br#"","object":"#);
        line.extend_from_slice(&json);
        line.extend_from_slice(b"}\n");
        Some(Bytes::from(line))
    }

    fn event(&mut self, type_: &str, object: &Value) -> Bytes {
        let object = match self.table {
            Some(include) if type_ != "BOOKMARK" && type_ != "ERROR" => {
                let rv = object
                    .pointer("/metadata/resourceVersion")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let t = table::table(
                    self.columns,
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
        let mut line = serde_json::to_vec(&json!({"type": type_, "object": object})).unwrap_or_default();
        line.push(b'\n');
        Bytes::from(line)
    }
}

fn bookmark(kind: &str, rv: u64, initial_end: bool) -> Value {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if initial_end {
        meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    json!({"kind": kind, "apiVersion": kvcache_api::API_VERSION, "metadata": meta})
}

fn expired(message: String) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": "Expired", "code": 410})
}

/// Runs one watch, sending encoded events to `tx` until the client leaves, the timeout passes,
/// the server shuts down or the stream cannot continue.
pub async fn run(api: Arc<Api>, res: Arc<dyn Resource>, opts: Options, tx: mpsc::Sender<Bytes>) {
    let info = res.info();
    let mut enc = Encoder {
        table: opts.table,
        columns: info.columns,
        headers_sent: false,
    };
    let mut shutdown = api.shutdown.clone();
    let deadline = tokio::time::sleep(opts.timeout);
    tokio::pin!(deadline);
    let ns = opts.namespace.as_deref();
    let mut last_rv = match opts.start {
        Start::After(rv) => rv,
        Start::Initial => {
            let page = match res.list(ns, None, None, None, opts.filter.clone()).await {
                Ok(p) => p,
                Err(e) => {
                    let _ = tx.send(enc.event("ERROR", &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": e.to_string(), "code": 500}))).await;
                    return;
                }
            };
            for item in &page.items {
                api.metrics.watch_event(info.plural);
                if tx.send(enc.event("ADDED", item)).await.is_err() {
                    return;
                }
            }
            if opts.initial_events_end
                && tx
                    .send(enc.event("BOOKMARK", &bookmark(info.kind, page.resource_version, true)))
                    .await
                    .is_err()
            {
                return;
            }
            page.resource_version
        }
    };
    let mut stream = match res.storage().watch(&res.prefix(ns), last_rv).await {
        Ok(s) => s,
        Err(StorageError::Expired { requested, oldest }) => {
            let msg = format!("too old resource version: {requested} ({oldest})");
            let _ = tx.send(enc.event("ERROR", &expired(msg))).await;
            return;
        }
        Err(e) => {
            let _ = tx.send(enc.event("ERROR", &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": e.to_string(), "reason": "ServiceUnavailable", "code": 503}))).await;
            return;
        }
    };
    let mut ticker = tokio::time::interval(api.bookmark_interval);
    ticker.tick().await;
    let filter = opts.filter.as_ref();
    loop {
        let ev = tokio::select! {
            ev = stream.next() => ev,
            _ = ticker.tick() => {
                if opts.bookmarks && tx.send(enc.event("BOOKMARK", &bookmark(info.kind, last_rv, false))).await.is_err() {
                    return;
                }
                continue;
            }
            _ = &mut deadline => {
                if opts.bookmarks {
                    let _ = tx.send(enc.event("BOOKMARK", &bookmark(info.kind, last_rv, false))).await;
                }
                return;
            }
            _ = shutdown.changed() => return,
            () = tx.closed() => return,
        };
        let ev = match ev {
            Ok(ev) => ev,
            Err(closed) => {
                tracing::info!(resource = info.plural, "watch closed: {closed}");
                return;
            }
        };
        last_rv = ev.revision;
        let kv = |value: &crate::storage::Value| KeyValue {
            key: ev.key.clone(),
            value: value.clone(),
            create_revision: ev.create_revision,
            mod_revision: ev.revision,
        };
        let matches = |value: &crate::storage::Value| super::resource::metadata_matches(&kv(value), filter);
        let was = ev.prev_value.as_ref().is_some_and(matches);
        let (type_, at) = match ev.kind {
            EventKind::Put => match (matches(&ev.value), was) {
                (true, true) => ("MODIFIED", kv(&ev.value)),
                (true, false) => ("ADDED", kv(&ev.value)),
                // It stopped matching the selectors: gone from this watcher's view.
                (false, true) => ("DELETED", kv(&ev.value)),
                (false, false) => continue,
            },
            EventKind::Delete if matches(&ev.value) => ("DELETED", kv(&ev.value)),
            EventKind::Delete => continue,
        };
        let Some(line) = enc.stored(type_, &at) else {
            tracing::warn!(
                key = ev.key,
                "a stored object could not be encoded for a watch; skipped"
            );
            continue;
        };
        api.metrics.watch_event(info.plural);
        if tx.send(line).await.is_err() {
            return;
        }
    }
}
