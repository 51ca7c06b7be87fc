//! Core `v1` Namespaces in direct mode: create, get, list, watch and delete, so that `kubectl
//! create namespace`, `kubectl get ns` and `kubectl delete ns` work without a cluster. In a
//! cluster kube-apiserver serves them instead.
//!
//! Namespaces here are **implicit and listed**: an object may be created in any namespace (as
//! before, and as the walkthrough's manifests assume), and a namespace exists while it has a
//! record (`kubectl create namespace`, and `default`, `kube-system`, `kube-public` and
//! `kube-node-lease`, written when the server starts) or holds a Binding, a ModelDeployment or a
//! Lease. A namespace that only holds objects reads as `Active` with the annotation
//! [`IMPLICIT`], created when its oldest object was. Creating such a namespace gives it a record
//! of its own. Deleting one is refused (409) while it holds any of those objects, naming them:
//! unlike kube-apiserver, the deletion does not cascade, so it never removes a cache a workload
//! still uses (the same rule as every held deletion here); otherwise its record and its Events
//! go in one transaction. The system namespaces may not be deleted (403, as kube-apiserver).
//!
//! Records are stored under `/registry/core/namespaces/<name>` as the JSON kubectl reads.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{StatusCause, StatusDetails};
use serde_json::{Value, json};

use crate::events::EVENTS;
use crate::leases::LEASES;
use crate::plain::{PlainKind, Refusal, refuse, unavailable};
use crate::storage::{Compare, ListRequest, Op, Storage, Txn, TxnOutcome, keys};
use crate::table::{Column, col, text};

/// The annotation of a namespace that exists because objects are in it (it has no record).
pub const IMPLICIT: &str = "worker.gpustack.ai/implicit";

/// Namespaces every server has, which may not be deleted.
pub const SYSTEM: &[&str] = &["default", "kube-node-lease", "kube-public", "kube-system"];

/// Namespace records, under `/registry/core/namespaces/<name>` (cluster-scoped: the list and
/// watch prefix is the whole kind).
pub const NAMESPACES: PlainKind = PlainKind {
    kind: "Namespace",
    plural: "namespaces",
    api_version: "v1",
    prefix: "/registry/core/namespaces/",
    columns: COLUMNS,
};

const COLUMNS: &[Column] = &[
    crate::table::NAME,
    col("Status", "The phase of the namespace.", |v| {
        text(v, &["status", "phase"])
    }),
    crate::table::age(0),
];

fn key(name: &str) -> String {
    format!("{}{name}", NAMESPACES.prefix)
}

/// The prefixes whose objects make their namespace exist, with the kind a refusal names them by.
fn holding_prefixes() -> [(String, &'static str); 3] {
    [
        (keys::kind_prefix_of("kvcachepoolbindings"), "KVCachePoolBinding"),
        (keys::kind_prefix_of("modeldeployments"), "ModelDeployment"),
        (LEASES.prefix.to_owned(), "Lease"),
    ]
}

/// What a list of every namespace read: the records and the namespaces objects are in.
struct Seen {
    records: BTreeMap<String, Value>,
    /// Namespace → the creation time of its oldest object, for those without a record.
    implicit: BTreeMap<String, String>,
    revision: u64,
}

async fn list_prefix(storage: &Arc<dyn Storage>, prefix: &str) -> Result<crate::storage::ListResponse, Refusal> {
    storage
        .list(ListRequest {
            prefix: prefix.to_owned(),
            ..Default::default()
        })
        .await
        .map_err(unavailable)
}

async fn seen(storage: &Arc<dyn Storage>) -> Result<Seen, Refusal> {
    let page = list_prefix(storage, NAMESPACES.prefix).await?;
    let mut revision = page.revision;
    let records: BTreeMap<String, Value> = page
        .items
        .iter()
        .filter_map(crate::plain::with_revision)
        .filter_map(|v| Some((v["metadata"]["name"].as_str()?.to_owned(), v)))
        .collect();
    let mut implicit: BTreeMap<String, String> = BTreeMap::new();
    for (prefix, _) in holding_prefixes() {
        let page = list_prefix(storage, &prefix).await?;
        revision = revision.max(page.revision);
        for kv in &page.items {
            let Some((ns, _)) = kv.key.strip_prefix(prefix.as_str()).and_then(|k| k.split_once('/')) else {
                continue;
            };
            if records.contains_key(ns) {
                continue;
            }
            let created = serde_json::from_slice::<Value>(&kv.value)
                .ok()
                .and_then(|v| v["metadata"]["creationTimestamp"].as_str().map(str::to_owned))
                .unwrap_or_default();
            let oldest = implicit.entry(ns.to_owned()).or_insert_with(|| created.clone());
            if created < *oldest {
                *oldest = created;
            }
        }
    }
    Ok(Seen {
        records,
        implicit,
        revision,
    })
}

/// The Namespace of a name that holds objects but has no record.
fn implicit(name: &str, created: &str, revision: u64) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {
            "name": name, "creationTimestamp": created, "resourceVersion": revision.to_string(),
            "labels": {"kubernetes.io/metadata.name": name},
            "annotations": {IMPLICIT: "true"},
        },
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"},
    })
}

/// Every namespace, by name, and the revision they were read at.
pub async fn list(storage: &Arc<dyn Storage>) -> Result<(Vec<Value>, u64), Refusal> {
    let s = seen(storage).await?;
    let mut all: BTreeMap<String, Value> = s.records;
    for (name, created) in &s.implicit {
        all.insert(name.clone(), implicit(name, created, s.revision));
    }
    Ok((all.into_values().collect(), s.revision))
}

fn not_found(name: &str) -> Refusal {
    NAMESPACES.not_found(name)
}

/// One namespace: its record, or the implicit namespace its objects make.
pub async fn get(storage: &Arc<dyn Storage>, name: &str) -> Result<Value, Refusal> {
    let (all, _) = list(storage).await?;
    all.into_iter()
        .find(|v| v["metadata"]["name"] == name)
        .ok_or_else(|| not_found(name))
}

fn invalid(name: &str, field: &str, message: &str) -> Refusal {
    crate::plain::invalid("Namespace", name, field, "FieldValueInvalid", message)
}

/// The record a create stores: the body's labels and annotations, our system fields.
fn record(body: &Value) -> Result<(String, Value), Refusal> {
    let ns: Namespace = serde_json::from_value(body.clone())
        .map_err(|e| refuse(400, "BadRequest", format!("the body is not a v1 Namespace: {e}")))?;
    let name = match (ns.metadata.name.as_deref(), ns.metadata.generate_name.as_deref()) {
        (Some(n), _) if !n.is_empty() => n.to_owned(),
        (_, Some(g)) if !g.is_empty() => format!("{g}{}", &uuid::Uuid::new_v4().simple().to_string()[..5]),
        _ => return Err(invalid("", "metadata.name", "name or generateName is required")),
    };
    if let Err(e) = crate::registry::validation::dns1123_label(&name) {
        return Err(invalid(&name, "metadata.name", &e));
    }
    let mut labels = ns.metadata.labels.clone().unwrap_or_default();
    labels.insert("kubernetes.io/metadata.name".into(), name.clone());
    let v = json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {
            "name": name, "uid": uuid::Uuid::new_v4().to_string(),
            "creationTimestamp": crate::registry::meta::now(),
            "labels": labels, "annotations": ns.metadata.annotations.unwrap_or_default(),
        },
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"},
    });
    Ok((name, v))
}

/// Stores a new namespace record (a namespace that held objects gets one of its own); a name
/// with a record already is 409 `AlreadyExists`. With `dry_run`, judges and stores nothing.
pub async fn create(storage: &Arc<dyn Storage>, body: &Value, dry_run: bool) -> Result<Value, Refusal> {
    let (name, mut v) = record(body)?;
    if dry_run {
        return Ok(v);
    }
    put_new(storage, &name, &v).await.map(|revision| {
        v["metadata"]["resourceVersion"] = json!(revision.to_string());
        v
    })
}

async fn put_new(storage: &Arc<dyn Storage>, name: &str, v: &Value) -> Result<u64, Refusal> {
    let bytes = serde_json::to_vec(v).map_err(|e| refuse(500, "InternalError", e.to_string()))?;
    let txn = Txn {
        compares: vec![Compare::ModRevision {
            key: key(name),
            revision: 0,
        }],
        ops: vec![Op::Put {
            key: key(name),
            value: bytes.into(),
        }],
    };
    match storage.txn(txn).await.map_err(unavailable)? {
        TxnOutcome::Committed { revision } => Ok(revision),
        TxnOutcome::CompareFailed { .. } => {
            let mut r = refuse(409, "AlreadyExists", format!("namespaces {name:?} already exists"));
            r.1.details = Some(NAMESPACES.details(name));
            Err(r)
        }
    }
}

/// Writes the records of the [`SYSTEM`] namespaces that have none (at start).
pub async fn bootstrap(storage: &Arc<dyn Storage>) {
    for name in SYSTEM {
        if let Ok((_, v)) = record(&json!({"metadata": {"name": name}})) {
            match put_new(storage, name, &v).await {
                Ok(_) | Err(Refusal(409, _)) => {}
                Err(Refusal(_, s)) => {
                    tracing::warn!(namespace = name, error = ?s.message, "writing a system namespace failed")
                }
            }
        }
    }
}

/// What `namespace` holds that keeps it (the objects of [`holding_prefixes`]), as `Kind/name`,
/// and the revision they were read at.
async fn contents(storage: &Arc<dyn Storage>, namespace: &str) -> Result<(Vec<String>, Vec<Compare>), Refusal> {
    let mut held = Vec::new();
    let mut compares = Vec::new();
    for (prefix, kind) in holding_prefixes() {
        let prefix = format!("{prefix}{namespace}/");
        let page = list_prefix(storage, &prefix).await?;
        for kv in &page.items {
            held.push(format!("{kind}/{}", kv.key.rsplit('/').next().unwrap_or_default()));
        }
        compares.push(Compare::NoneNewer {
            prefix,
            revision: page.revision,
        });
    }
    Ok((held, compares))
}

/// Why a namespace that holds objects stays: each of them, as a cause.
fn not_empty(name: &str, held: &[String]) -> Refusal {
    let mut r = refuse(
        409,
        "Conflict",
        format!(
            "namespace {name:?} holds {}; delete them first (kubectl delete md,kvcpb,leases --all -n {name}): in direct mode deleting a namespace does not delete what it holds",
            crate::registry::holders::names(held)
        ),
    );
    let mut details = NAMESPACES.details(name);
    details.causes = Some(
        held.iter()
            .map(|h| StatusCause {
                field: Some("metadata.name".into()),
                message: Some(format!("{h} is in this namespace")),
                reason: Some("NamespaceContentRemaining".into()),
            })
            .collect(),
    );
    r.1.details = Some(details);
    r
}

fn forbidden(name: &str) -> Refusal {
    let mut r = refuse(
        403,
        "Forbidden",
        format!("namespaces {name:?} is forbidden: this namespace may not be deleted"),
    );
    r.1.details = Some(StatusDetails {
        causes: Some(vec![StatusCause {
            field: Some("metadata.name".into()),
            message: Some("a system namespace".into()),
            reason: Some("FieldValueForbidden".into()),
        }]),
        ..NAMESPACES.details(name)
    });
    r
}

/// Deletes an empty namespace: its record and its Events, in one transaction that fails if
/// anything was created in it meanwhile. Returns its last state.
pub async fn delete(storage: &Arc<dyn Storage>, name: &str, dry_run: bool) -> Result<Value, Refusal> {
    if SYSTEM.contains(&name) {
        return Err(forbidden(name));
    }
    for _ in 0..8 {
        let last = get(storage, name).await?;
        let (held, mut compares) = contents(storage, name).await?;
        if !held.is_empty() {
            return Err(not_empty(name, &held));
        }
        if dry_run {
            return Ok(last);
        }
        let events = list_prefix(storage, &EVENTS.prefix(Some(name))).await?;
        let rev = last["metadata"]["resourceVersion"]
            .as_str()
            .and_then(|r| r.parse().ok())
            .unwrap_or(0);
        let mut ops: Vec<Op> = events
            .items
            .iter()
            .map(|kv| Op::Delete { key: kv.key.clone() })
            .collect();
        if last["metadata"]["annotations"].get(IMPLICIT).is_none() {
            compares.push(Compare::ModRevision {
                key: key(name),
                revision: rev,
            });
            ops.push(Op::Delete { key: key(name) });
        }
        match storage.txn(Txn { compares, ops }).await.map_err(unavailable)? {
            TxnOutcome::Committed { .. } => return Ok(terminated(last)),
            TxnOutcome::CompareFailed { revision } => {
                storage.wait_for_revision(revision).await.map_err(unavailable)?;
            }
        }
    }
    Err(refuse(
        409,
        "Conflict",
        format!("namespace {name:?} kept changing; try again"),
    ))
}

/// The last state of a deleted namespace, as kube-apiserver answers it.
fn terminated(mut v: Value) -> Value {
    v["metadata"]["deletionTimestamp"] = json!(crate::registry::meta::now());
    v["status"]["phase"] = json!("Terminating");
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::embedded::{Embedded, Options};

    fn storage() -> (tempfile::TempDir, Arc<dyn Storage>) {
        let dir = tempfile::tempdir().unwrap();
        let s: Arc<dyn Storage> = Arc::new(Embedded::open(dir.path(), Options::default()).unwrap());
        (dir, s)
    }

    async fn put(s: &Arc<dyn Storage>, key: &str, created: &str) {
        let v = json!({"metadata": {"creationTimestamp": created}});
        s.txn(Txn {
            compares: vec![],
            ops: vec![Op::Put {
                key: key.into(),
                value: serde_json::to_vec(&v).unwrap().into(),
            }],
        })
        .await
        .unwrap();
    }

    fn names(all: &[Value]) -> Vec<&str> {
        all.iter().filter_map(|v| v["metadata"]["name"].as_str()).collect()
    }

    #[tokio::test]
    async fn namespaces_are_records_and_the_namespaces_objects_are_in() {
        let (_d, s) = storage();
        bootstrap(&s).await;
        bootstrap(&s).await;
        let b = keys::kind_prefix_of("kvcachepoolbindings");
        put(&s, &format!("{b}team-a/x"), "2026-01-02T00:00:00Z").await;
        put(
            &s,
            &format!("{}team-a/m", keys::kind_prefix_of("modeldeployments")),
            "2026-01-01T00:00:00Z",
        )
        .await;
        let (all, _) = list(&s).await.unwrap();
        assert_eq!(
            names(&all),
            ["default", "kube-node-lease", "kube-public", "kube-system", "team-a"]
        );
        let a = get(&s, "team-a").await.unwrap();
        assert_eq!(a["metadata"]["annotations"][IMPLICIT], "true");
        assert_eq!(
            a["metadata"]["creationTimestamp"], "2026-01-01T00:00:00Z",
            "its oldest object's"
        );
        // Held: refused with every object named; a system namespace: forbidden.
        let Err(Refusal(409, st)) = delete(&s, "team-a", false).await else {
            panic!("held")
        };
        assert!(
            st.message.as_deref().unwrap().contains("KVCachePoolBinding/x"),
            "{st:?}"
        );
        assert_eq!(st.details.unwrap().causes.unwrap().len(), 2);
        assert!(matches!(delete(&s, "default", false).await, Err(Refusal(403, _))));
        // Created explicitly: a record, AlreadyExists the second time; then deleted when empty.
        let body = &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-b"}});
        let v = create(&s, body, false).await.unwrap();
        assert_eq!(v["metadata"]["labels"]["kubernetes.io/metadata.name"], "team-b");
        assert!(matches!(create(&s, body, false).await, Err(Refusal(409, _))));
        let gone = delete(&s, "team-b", false).await.unwrap();
        assert_eq!(gone["status"]["phase"], "Terminating");
        assert!(matches!(get(&s, "team-b").await, Err(Refusal(404, _))));
        assert!(matches!(delete(&s, "team-b", false).await, Err(Refusal(404, _))));
        let bad = json!({"metadata": {"name": "Team_B"}});
        assert!(matches!(create(&s, &bad, false).await, Err(Refusal(422, _))));
    }
}
