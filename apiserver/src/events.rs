//! Core `v1` Events in direct mode (without a cluster the server serves them itself, so the
//! controllers record events through the same API in both modes): created by the controllers,
//! read by `kubectl describe` (a list by `involvedObject` field selectors) and `kubectl get
//! events`, and watched. In a cluster kube-apiserver serves them instead. Only create, get, list
//! and watch are served; updates and deletes are refused (405), and events expire after [`TTL`]
//! as kube-apiserver's `--event-ttl` makes them.
//!
//! Stored under `/registry/core/events/<namespace>/<name>` as the JSON kubectl reads, with the
//! storage revision as `resourceVersion`.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Event;
use serde_json::{Value, json};

use crate::plain::Refusal;
use crate::plain::{PlainKind, refuse};
pub use crate::selectors::SelectableFields;
use crate::storage::{Compare, KeyValue, ListRequest, Op, Storage, Txn, TxnOutcome};
use crate::table::{Column, at, col, human_duration, text};

/// How long an event is kept.
pub const TTL: Duration = Duration::from_secs(3600);

/// Core Events, stored under `/registry/core/events/<namespace>/<name>`.
pub const EVENTS: PlainKind = PlainKind {
    kind: "Event",
    plural: "events",
    api_version: "v1",
    prefix: "/registry/core/events/",
    columns: COLUMNS,
};

/// The fields `kubectl describe` and `kubectl get events` select Events by, with `=`, `==` and
/// `!=` ([`crate::selectors`]); `source` reads `source.component`. A term with no operator
/// (`involvedObject.UID`, as kubectl 1.27 sends for an empty UID) matches an empty value.
pub const FIELDS: SelectableFields = SelectableFields {
    what: "events",
    fields: &[
        ("involvedObject.kind", &["involvedObject", "kind"]),
        ("involvedObject.namespace", &["involvedObject", "namespace"]),
        ("involvedObject.name", &["involvedObject", "name"]),
        ("involvedObject.uid", &["involvedObject", "uid"]),
        ("involvedObject.apiVersion", &["involvedObject", "apiVersion"]),
        ("involvedObject.resourceVersion", &["involvedObject", "resourceVersion"]),
        ("involvedObject.fieldPath", &["involvedObject", "fieldPath"]),
        ("reason", &["reason"]),
        ("type", &["type"]),
        ("source", &["source", "component"]),
        ("reportingComponent", &["reportingComponent"]),
        ("metadata.name", &["metadata", "name"]),
        ("metadata.namespace", &["metadata", "namespace"]),
    ],
    bare_term_is_empty: true,
};

/// Stores a new event in `namespace` (the request path's); returns it as stored.
pub async fn create(storage: &Arc<dyn Storage>, namespace: &str, body: &[u8]) -> Result<Value, Refusal> {
    let event: Event = serde_json::from_slice(body)
        .map_err(|e| refuse(400, "BadRequest", format!("the body is not a v1 Event: {e}")))?;
    let mut v = serde_json::to_value(&event).map_err(|e| refuse(500, "InternalError", e.to_string()))?;
    let meta = &event.metadata;
    crate::plain::same_namespace(meta.namespace.as_deref(), namespace)?;
    let name = match (meta.name.as_deref(), meta.generate_name.as_deref()) {
        (Some(n), _) if !n.is_empty() => n.to_owned(),
        (_, Some(g)) if !g.is_empty() => format!("{g}{}", &uuid::Uuid::new_v4().simple().to_string()[..8]),
        _ => {
            return Err(invalid("metadata.name", "name or generateName is required"));
        }
    };
    if name.len() > 253
        || !name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
    {
        return Err(invalid(
            "metadata.name",
            "a lowercase RFC 1123 subdomain of at most 253 characters is required",
        ));
    }
    let involved = &event.involved_object;
    if involved.kind.as_deref().unwrap_or_default().is_empty()
        || involved.name.as_deref().unwrap_or_default().is_empty()
    {
        return Err(invalid(
            "involvedObject",
            "the kind and name of the object the event is about are required",
        ));
    }
    v["apiVersion"] = json!("v1");
    v["kind"] = json!("Event");
    v["metadata"]["name"] = json!(name);
    v["metadata"]["namespace"] = json!(namespace);
    v["metadata"]["uid"] = json!(uuid::Uuid::new_v4().to_string());
    v["metadata"]["creationTimestamp"] = json!(crate::registry::meta::now());
    if let Some(m) = v["metadata"].as_object_mut() {
        m.remove("resourceVersion");
        m.remove("generateName");
    }
    let key = EVENTS.key(namespace, &name);
    let bytes = serde_json::to_vec(&v).map_err(|e| refuse(500, "InternalError", e.to_string()))?;
    let txn = Txn {
        compares: vec![Compare::ModRevision {
            key: key.clone(),
            revision: 0,
        }],
        ops: vec![Op::Put {
            key,
            value: bytes.into(),
        }],
    };
    match storage.txn(txn).await {
        Ok(TxnOutcome::Committed { revision }) => {
            v["metadata"]["resourceVersion"] = json!(revision.to_string());
            Ok(v)
        }
        Ok(TxnOutcome::CompareFailed { .. }) => Err(refuse(
            409,
            "AlreadyExists",
            format!("events \"{name}\" already exists"),
        )),
        Err(e) => Err(refuse(503, "ServiceUnavailable", e.to_string())),
    }
}

fn invalid(field: &str, message: &str) -> Refusal {
    crate::plain::invalid("Event", "", field, "FieldValueRequired", message)
}

/// Deletes the events older than `ttl`; returns how many.
pub async fn expire(storage: &Arc<dyn Storage>, ttl: Duration) -> usize {
    let Ok(r) = storage
        .list(ListRequest {
            prefix: EVENTS.prefix.to_owned(),
            ..ListRequest::default()
        })
        .await
    else {
        return 0;
    };
    let now = k8s_openapi::jiff::Timestamp::now();
    let old: Vec<&KeyValue> = r
        .items
        .iter()
        .filter(|kv| {
            serde_json::from_slice::<Event>(&kv.value)
                .ok()
                .and_then(|e| e.metadata.creation_timestamp)
                .is_some_and(|t| now.duration_since(t.0).unsigned_abs() > ttl)
        })
        .collect();
    let mut n = 0;
    for kv in old {
        let txn = Txn {
            compares: vec![Compare::ModRevision {
                key: kv.key.clone(),
                revision: kv.mod_revision,
            }],
            ops: vec![Op::Delete { key: kv.key.clone() }],
        };
        if matches!(storage.txn(txn).await, Ok(TxnOutcome::Committed { .. })) {
            n += 1;
        }
    }
    n
}

/// When the event last happened: `lastTimestamp`, else `eventTime`, else its creation.
fn last_seen(v: &Value) -> Value {
    let t = ["lastTimestamp", "eventTime"]
        .iter()
        .find_map(|f| v.get(*f).and_then(Value::as_str))
        .or_else(|| at(v, &["metadata", "creationTimestamp"]).and_then(Value::as_str));
    let Some(ts) = t.and_then(|s| s.parse::<k8s_openapi::jiff::Timestamp>().ok()) else {
        return json!("<unknown>");
    };
    let secs = k8s_openapi::jiff::Timestamp::now()
        .duration_since(ts)
        .as_secs()
        .max(0)
        .unsigned_abs();
    json!(human_duration(secs))
}

fn object(v: &Value) -> Value {
    let kind = at(v, &["involvedObject", "kind"])
        .and_then(Value::as_str)
        .unwrap_or_default();
    let name = at(v, &["involvedObject", "name"])
        .and_then(Value::as_str)
        .unwrap_or_default();
    json!(format!("{}/{name}", kind.to_ascii_lowercase()))
}

/// What `kubectl get events` prints, as kube-apiserver's columns.
pub const COLUMNS: &[Column] = &[
    col("Last Seen", "when the event last happened", last_seen),
    col("Type", "Normal or Warning", |v| text(v, &["type"])),
    col("Reason", "why the event happened", |v| text(v, &["reason"])),
    col("Object", "the object the event is about", object),
    col("Message", "what happened", |v| text(v, &["message"])),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describe_selectors_match_the_involved_object() {
        let parse = |s: &str| crate::selectors::FieldSelector::parse_for(s, &FIELDS);
        let e = json!({"involvedObject": {"kind": "KVCacheBackend", "name": "m", "namespace": "", "uid": "u1"}, "reason": "LeaderStarted", "type": "Normal", "source": {"component": "kvcache-controller"}});
        let s = parse(
            "involvedObject.name=m,involvedObject.namespace=,involvedObject.kind=KVCacheBackend,involvedObject.uid=u1",
        )
        .unwrap();
        assert!(s.matches_json(&e));
        assert!(!parse("involvedObject.name=other").unwrap().matches_json(&e));
        assert!(parse("type!=Warning").unwrap().matches_json(&e));
        assert!(parse("source=kvcache-controller").unwrap().matches_json(&e));
        // kubectl 1.27 sends `involvedObject.UID` without a value for an empty uid
        assert!(!parse("involvedObject.UID").unwrap().matches_json(&e));
        let err = parse("spec.nodeName=x").unwrap_err();
        assert!(
            err.0
                .starts_with("field label not supported: spec.nodeName; events can be selected by"),
            "{}",
            err.0
        );
    }

    #[test]
    fn the_table_names_the_object_by_kind() {
        let e = json!({"involvedObject": {"kind": "KVCacheBackend", "name": "m"}, "metadata": {"creationTimestamp": "2020-01-01T00:00:00Z"}});
        assert_eq!(object(&e), "kvcachebackend/m");
        assert_ne!(last_seen(&e), "<unknown>");
    }
}
