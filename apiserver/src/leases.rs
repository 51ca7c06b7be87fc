//! `coordination.k8s.io/v1` Leases in direct mode: what the store's leaders campaign for
//! (`kv-store leader --election kubernetes`) and Lease-addressed members read, served so that the
//! store's election talks to a real Kubernetes Lease API in both modes. In a cluster
//! kube-apiserver serves them, and our APIService never names this group.
//!
//! Served: create, get, list, watch, update (`PUT`, a compare-and-swap when the body carries a
//! `resourceVersion`, and a create when the Lease does not exist and it carries none, as
//! kube-apiserver's Lease strategy allows), patch (JSON patch, merge patch, and strategic merge
//! patch, which for a Lease — no lists — is the same merge) and delete (with `resourceVersion`
//! and `uid` preconditions). Server-side apply and deletecollection are refused with a Status
//! that says what to use instead.
//!
//! Stored under `/registry/coordination.k8s.io/leases/<namespace>/<name>` as the JSON clients
//! read, with the storage revision as `resourceVersion`.

use std::sync::Arc;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use serde_json::{Value, json};

use crate::plain::{PlainKind, Refusal, invalid, refuse, unavailable};
use crate::registry::validation;
use crate::storage::{Compare, KeyValue, Op, Storage, Txn, TxnOutcome};
use crate::table::{Column, age, col, text};

pub const LEASES: PlainKind = PlainKind {
    kind: "Lease",
    plural: "leases",
    api_version: "coordination.k8s.io/v1",
    prefix: "/registry/coordination.k8s.io/leases/",
    columns: COLUMNS,
};

/// What `kubectl get leases` prints, as kube-apiserver's columns.
pub const COLUMNS: &[Column] = &[
    crate::table::NAME,
    col("Holder", "spec.holderIdentity", |v| {
        text(v, &["spec", "holderIdentity"])
    }),
    age(0),
];

/// Most operations of a JSON patch on a Lease (a Lease has a handful of fields).
const MAX_PATCH_OPERATIONS: usize = 100;

/// How often a patch or an unconditional update is tried again after another write came first.
const RETRIES: usize = 8;

fn conflict(name: &str, message: &str) -> Refusal {
    let mut r = refuse(
        409,
        "Conflict",
        format!("Operation cannot be fulfilled on leases.coordination.k8s.io \"{name}\": {message}"),
    );
    r.1.details = Some(LEASES.details(name));
    r
}

fn modified(name: &str) -> Refusal {
    conflict(
        name,
        "the object has been modified; please apply your changes to the latest version and try again",
    )
}

/// The first field of `input` that decoding into a Lease dropped (an unknown field), as a path.
fn unknown_field(input: &Value, decoded: &Value, path: &str) -> Option<String> {
    let (Value::Object(i), Value::Object(d)) = (input, decoded) else {
        return None;
    };
    for (k, v) in i {
        let here = if path.is_empty() {
            k.clone()
        } else {
            format!("{path}.{k}")
        };
        match d.get(k) {
            None if !v.is_null() => return Some(here),
            Some(dv) => {
                if let Some(f) = unknown_field(v, dv, &here) {
                    return Some(f);
                }
            }
            None => {}
        }
    }
    None
}

/// `body` as a valid Lease named `name` in `namespace` (the path's; `name` empty on create),
/// in its stored form without system fields.
fn decode(namespace: &str, name: &str, body: &Value) -> Result<Value, Refusal> {
    let (lease, v) = parse_lease(body)?;
    check_type_meta(body)?;
    let meta = &lease.metadata;
    crate::plain::same_namespace(meta.namespace.as_deref(), namespace)?;
    let name = lease_name(name, meta.name.as_deref().unwrap_or_default())?;
    validate_spec(&name, lease.spec.unwrap_or_default())?;
    Ok(stored_form(v, &name, namespace))
}

/// `body` as a Lease, and that Lease as JSON; refused when `body` has a field a Lease has not.
fn parse_lease(body: &Value) -> Result<(Lease, Value), Refusal> {
    let lease: Lease = serde_json::from_value(body.clone()).map_err(|e| {
        refuse(
            400,
            "BadRequest",
            format!("the body is not a coordination.k8s.io/v1 Lease: {e}"),
        )
    })?;
    let v = serde_json::to_value(&lease).map_err(|e| refuse(500, "InternalError", e.to_string()))?;
    let mut stripped = body.clone();
    if let Some(m) = stripped.as_object_mut() {
        m.remove("apiVersion");
        m.remove("kind");
    }
    if let Some(f) = unknown_field(&stripped, &v, "") {
        return Err(refuse(
            400,
            "BadRequest",
            format!("strict decoding error: unknown field \"{f}\""),
        ));
    }
    Ok((lease, v))
}

/// Refuses a body whose `apiVersion` or `kind` is not a Lease's.
fn check_type_meta(body: &Value) -> Result<(), Refusal> {
    for (field, want) in [("apiVersion", LEASES.api_version), ("kind", LEASES.kind)] {
        if let Some(have) = body.get(field).and_then(Value::as_str)
            && have != want
        {
            return Err(refuse(
                400,
                "BadRequest",
                format!("the body's {field} is {have:?}; this endpoint takes {want:?}"),
            ));
        }
    }
    Ok(())
}

/// The Lease's name from the path's `name` and the body's `own`: one of them, the same if both,
/// and a valid name.
fn lease_name(name: &str, own: &str) -> Result<String, Refusal> {
    let name = match (name, own) {
        ("", "") => {
            return Err(invalid(
                "Lease",
                "",
                "metadata.name",
                "FieldValueRequired",
                "name is required",
            ));
        }
        ("", n) => n.to_owned(),
        (path, "") => path.to_owned(),
        (path, n) if path == n => n.to_owned(),
        (path, n) => {
            return Err(refuse(
                400,
                "BadRequest",
                format!("the name of the object ({n}) does not match the name on the URL ({path})"),
            ));
        }
    };
    if let Err(e) = validation::dns1123_subdomain(&name) {
        return Err(invalid("Lease", &name, "metadata.name", "FieldValueInvalid", &e));
    }
    Ok(name)
}

/// Refuses a spec whose duration is not positive or whose transitions are negative.
fn validate_spec(name: &str, spec: LeaseSpec) -> Result<(), Refusal> {
    if spec.lease_duration_seconds.is_some_and(|d| d <= 0) {
        return Err(invalid(
            "Lease",
            name,
            "spec.leaseDurationSeconds",
            "FieldValueInvalid",
            "must be greater than 0",
        ));
    }
    if spec.lease_transitions.is_some_and(|t| t < 0) {
        return Err(invalid(
            "Lease",
            name,
            "spec.leaseTransitions",
            "FieldValueInvalid",
            "must be greater than or equal to 0",
        ));
    }
    Ok(())
}

/// The decoded Lease `v` named `name` in `namespace`, without system fields.
fn stored_form(mut v: Value, name: &str, namespace: &str) -> Value {
    v["apiVersion"] = json!(LEASES.api_version);
    v["kind"] = json!(LEASES.kind);
    v["metadata"]["name"] = json!(name);
    v["metadata"]["namespace"] = json!(namespace);
    if let Some(m) = v["metadata"].as_object_mut() {
        for system in [
            "resourceVersion",
            "uid",
            "creationTimestamp",
            "generateName",
            "generation",
        ] {
            m.remove(system);
        }
    }
    v
}

/// `v` with the system fields of `stored` (or new ones for a create).
fn with_system_fields(mut v: Value, stored: Option<&Value>) -> Value {
    let (uid, created) = match stored {
        Some(s) => (s["metadata"]["uid"].clone(), s["metadata"]["creationTimestamp"].clone()),
        None => (
            json!(uuid::Uuid::new_v4().to_string()),
            json!(crate::registry::meta::now()),
        ),
    };
    v["metadata"]["uid"] = uid;
    v["metadata"]["creationTimestamp"] = created;
    v
}

/// Writes `v` at its key if the key is still at `revision` (0: absent); `None` when another
/// write came first.
async fn put_if(storage: &Arc<dyn Storage>, key: &str, revision: u64, mut v: Value) -> Result<Option<Value>, Refusal> {
    let bytes = serde_json::to_vec(&v).map_err(|e| refuse(500, "InternalError", e.to_string()))?;
    let txn = Txn {
        compares: vec![Compare::ModRevision {
            key: key.to_owned(),
            revision,
        }],
        ops: vec![Op::Put {
            key: key.to_owned(),
            value: bytes.into(),
        }],
    };
    match storage.txn(txn).await.map_err(unavailable)? {
        TxnOutcome::Committed { revision } => {
            v["metadata"]["resourceVersion"] = json!(revision.to_string());
            Ok(Some(v))
        }
        TxnOutcome::CompareFailed { .. } => Ok(None),
    }
}

async fn current(storage: &Arc<dyn Storage>, key: &str) -> Result<Option<(KeyValue, Value)>, Refusal> {
    let Some(kv) = storage.get(key).await.map_err(unavailable)? else {
        return Ok(None);
    };
    let v =
        serde_json::from_slice(&kv.value).map_err(|_| refuse(500, "InternalError", "a stored Lease is not JSON"))?;
    Ok(Some((kv, v)))
}

/// The `resourceVersion` a body asks to replace, if any.
fn asked_version(body: &Value) -> Result<Option<u64>, Refusal> {
    match body["metadata"]["resourceVersion"].as_str() {
        None | Some("") => Ok(None),
        Some(rv) => rv.parse().map(Some).map_err(|_| {
            refuse(
                400,
                "BadRequest",
                format!("metadata.resourceVersion {rv:?} is not one this server issued"),
            )
        }),
    }
}

/// `POST`: a new Lease in `namespace`.
pub async fn create(storage: &Arc<dyn Storage>, namespace: &str, body: &Value) -> Result<Value, Refusal> {
    let v = decode(namespace, "", body)?;
    let name = v["metadata"]["name"].as_str().unwrap_or_default().to_owned();
    let key = LEASES.key(namespace, &name);
    match put_if(storage, &key, 0, with_system_fields(v, None)).await? {
        Some(v) => Ok(v),
        None => {
            let mut r = refuse(
                409,
                "AlreadyExists",
                format!("leases.coordination.k8s.io \"{name}\" already exists"),
            );
            r.1.details = Some(LEASES.details(&name));
            Err(r)
        }
    }
}

/// `PUT`: replaces the Lease; returns it and whether it was created.
pub async fn update(
    storage: &Arc<dyn Storage>,
    namespace: &str,
    name: &str,
    body: &Value,
) -> Result<(Value, bool), Refusal> {
    let v = decode(namespace, name, body)?;
    let asked = asked_version(body)?;
    let key = LEASES.key(namespace, name);
    for _ in 0..RETRIES {
        let stored = current(storage, &key).await?;
        let (revision, old) = match (&stored, asked) {
            (None, Some(_)) => return Err(LEASES.not_found(name)),
            (None, None) => (0, None),
            (Some((kv, _)), Some(rv)) if kv.mod_revision != rv => return Err(modified(name)),
            (Some((kv, old)), _) => (kv.mod_revision, Some(old)),
        };
        let next = with_system_fields(v.clone(), old);
        if let Some(written) = put_if(storage, &key, revision, next).await? {
            return Ok((written, revision == 0));
        }
        if asked.is_some() {
            return Err(modified(name));
        }
    }
    Err(modified(name))
}

/// How a patch body is read.
#[derive(Debug, Clone, PartialEq)]
pub enum LeasePatch {
    Json(json_patch::Patch),
    /// Merge patch, and strategic merge patch (the same for a kind without lists).
    Merge(Value),
}

/// `body` as the patch `media_type` names.
pub fn parse_patch(media_type: &str, body: Value) -> Result<LeasePatch, Refusal> {
    match media_type {
        "application/json-patch+json" => {
            let ops: json_patch::Patch = serde_json::from_value(body)
                .map_err(|e| refuse(400, "BadRequest", format!("the JSON patch is not valid: {e}")))?;
            if ops.0.len() > MAX_PATCH_OPERATIONS {
                return Err(refuse(
                    413,
                    "RequestEntityTooLarge",
                    format!("a JSON patch of a Lease may have at most {MAX_PATCH_OPERATIONS} operations"),
                ));
            }
            if let Some(op) = ops.0.iter().find(|op| {
                matches!(
                    op,
                    json_patch::PatchOperation::Copy(_) | json_patch::PatchOperation::Move(_)
                )
            }) {
                return Err(refuse(
                    422,
                    "Invalid",
                    format!("{op:?}: a JSON patch of a Lease may use add, remove, replace and test"),
                ));
            }
            Ok(LeasePatch::Json(ops))
        }
        "application/merge-patch+json" | "application/strategic-merge-patch+json" => {
            let mut stack = vec![&body];
            while let Some(v) = stack.pop() {
                if let Value::Object(m) = v {
                    if let Some(k) = m.keys().find(|k| k.starts_with('$')) {
                        return Err(refuse(
                            400,
                            "BadRequest",
                            format!(
                                "strategic merge patch directive {k:?} is not supported on a Lease, which has no lists; leave it out"
                            ),
                        ));
                    }
                    stack.extend(m.values());
                }
            }
            Ok(LeasePatch::Merge(body))
        }
        "application/apply-patch+yaml" => Err(refuse(
            415,
            "UnsupportedMediaType",
            "server-side apply is not served for Leases in direct mode; use kubectl apply without --server-side, or a merge or JSON patch",
        )),
        other => Err(refuse(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format ({other}) - accepted media types include: application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json"
            ),
        )),
    }
}

/// `PATCH`: the Lease with `patch` applied.
pub async fn patch(
    storage: &Arc<dyn Storage>,
    namespace: &str,
    name: &str,
    patch: &LeasePatch,
) -> Result<Value, Refusal> {
    let key = LEASES.key(namespace, name);
    for _ in 0..RETRIES {
        let Some((kv, old)) = current(storage, &key).await? else {
            return Err(LEASES.not_found(name));
        };
        let mut doc = old.clone();
        doc["metadata"]["resourceVersion"] = json!(kv.mod_revision.to_string());
        match patch {
            LeasePatch::Json(ops) => json_patch::patch(&mut doc, &ops.0)
                .map_err(|e| refuse(422, "Invalid", format!("the JSON patch could not be applied: {e}")))?,
            LeasePatch::Merge(m) => json_patch::merge(&mut doc, m),
        }
        let asked = asked_version(&doc)?;
        if asked.is_some_and(|rv| rv != kv.mod_revision) {
            return Err(modified(name));
        }
        let next = with_system_fields(decode(namespace, name, &doc)?, Some(&old));
        if let Some(written) = put_if(storage, &key, kv.mod_revision, next).await? {
            return Ok(written);
        }
    }
    Err(modified(name))
}

/// `DELETE`: removes the Lease if the preconditions hold; returns the Status kube-apiserver
/// answers with.
pub async fn delete(
    storage: &Arc<dyn Storage>,
    namespace: &str,
    name: &str,
    options: &Value,
) -> Result<Value, Refusal> {
    let key = LEASES.key(namespace, name);
    let Some((kv, old)) = current(storage, &key).await? else {
        return Err(LEASES.not_found(name));
    };
    let pre = &options["preconditions"];
    if let Some(rv) = pre["resourceVersion"].as_str()
        && rv != kv.mod_revision.to_string()
    {
        return Err(conflict(
            name,
            &format!(
                "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                kv.mod_revision
            ),
        ));
    }
    if let Some(uid) = pre["uid"].as_str()
        && Some(uid) != old["metadata"]["uid"].as_str()
    {
        return Err(conflict(
            name,
            &format!(
                "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                old["metadata"]["uid"].as_str().unwrap_or_default()
            ),
        ));
    }
    let txn = Txn {
        compares: vec![Compare::ModRevision {
            key: key.clone(),
            revision: kv.mod_revision,
        }],
        ops: vec![Op::Delete { key }],
    };
    match storage.txn(txn).await.map_err(unavailable)? {
        TxnOutcome::Committed { .. } => Ok(json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
            "details": {"name": name, "group": "coordination.k8s.io", "kind": "leases",
                        "uid": old["metadata"]["uid"]},
        })),
        TxnOutcome::CompareFailed { .. } => Err(modified(name)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::embedded::Embedded;

    fn lease(name: &str, holder: &str) -> Value {
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": name},
               "spec": {"holderIdentity": holder, "leaseDurationSeconds": 2, "leaseTransitions": 0}})
    }

    #[tokio::test]
    async fn updates_are_compare_and_swap_on_the_resource_version() {
        let dir = tempfile::tempdir().unwrap();
        let storage: Arc<dyn Storage> = Arc::new(Embedded::open(dir.path(), Default::default()).unwrap());
        let made = create(&storage, "ns", &lease("l", "a")).await.unwrap();
        let rv = made["metadata"]["resourceVersion"].as_str().unwrap().to_owned();
        assert!(made["metadata"]["uid"].is_string());
        assert_eq!(create(&storage, "ns", &lease("l", "a")).await.unwrap_err().0, 409);

        let mut b = lease("l", "b");
        b["metadata"]["resourceVersion"] = json!(rv);
        let (after, created) = update(&storage, "ns", "l", &b).await.unwrap();
        assert!(!created);
        assert_eq!(after["spec"]["holderIdentity"], "b");
        assert_eq!(
            after["metadata"]["uid"], made["metadata"]["uid"],
            "system fields are kept"
        );
        // the same stale version again: a conflict, nothing written
        let stale = update(&storage, "ns", "l", &b).await.unwrap_err();
        assert_eq!((stale.0, stale.1.reason.as_deref()), (409, Some("Conflict")));
        let got = LEASES.get(&storage, "ns", "l").await.unwrap();
        assert_eq!(got["spec"]["holderIdentity"], "b");

        // without a version: unconditional, and a create when absent
        let (_, created) = update(&storage, "ns", "m", &lease("m", "c")).await.unwrap();
        assert!(created);
        let p = parse_patch(
            "application/strategic-merge-patch+json",
            json!({"spec": {"holderIdentity": ""}}),
        )
        .unwrap();
        let patched = patch(&storage, "ns", "m", &p).await.unwrap();
        assert_eq!(patched["spec"]["holderIdentity"], "");
        assert_eq!(patched["spec"]["leaseDurationSeconds"], 2);
        let e = delete(&storage, "ns", "m", &json!({"preconditions": {"resourceVersion": "1"}}))
            .await
            .unwrap_err();
        assert_eq!(e.0, 409);
        delete(&storage, "ns", "m", &json!({})).await.unwrap();
        assert_eq!(LEASES.get(&storage, "ns", "m").await.unwrap_err().0, 404);
    }

    #[tokio::test]
    async fn bad_leases_are_refused_with_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let storage: Arc<dyn Storage> = Arc::new(Embedded::open(dir.path(), Default::default()).unwrap());
        let mut l = lease("l", "a");
        l["spec"]["leaseDurationSeconds"] = json!(0);
        let e = create(&storage, "ns", &l).await.unwrap_err();
        assert_eq!(e.0, 422);
        let cause = &e.1.details.as_ref().unwrap().causes.as_ref().unwrap()[0];
        assert_eq!(cause.field.as_deref(), Some("spec.leaseDurationSeconds"));
        let mut l = lease("l", "a");
        l["spec"]["holder"] = json!("a");
        let e = create(&storage, "ns", &l).await.unwrap_err();
        assert!(
            e.1.message
                .as_deref()
                .unwrap()
                .contains("unknown field \"spec.holder\""),
            "{e:?}"
        );
        assert_eq!(
            create(&storage, "ns", &lease("Bad_Name", "a")).await.unwrap_err().0,
            422
        );
        let e = parse_patch(
            "application/json-patch+json",
            json!([{"op": "copy", "from": "/spec", "path": "/x"}]),
        )
        .unwrap_err();
        assert_eq!(e.0, 422);
        assert_eq!(
            parse_patch("application/apply-patch+yaml", json!({})).unwrap_err().0,
            415
        );
        let mut other = lease("l", "a");
        other["metadata"]["namespace"] = json!("elsewhere");
        assert_eq!(create(&storage, "ns", &other).await.unwrap_err().0, 400);
    }
}
