//! Field ownership (`metadata.managedFields`) and server-side apply.
//!
//! A field set is the set of leaf paths a manager owns. Objects are granular (each key is its
//! own field); lists are atomic (the whole list is one leaf), as our OpenAPI schema declares with
//! `x-kubernetes-list-type: atomic`; an empty object is a leaf. Paths are kept in the FieldsV1
//! spelling (`f:spec`, `f:size`), so entries written by clients round-trip unchanged.
//!
//! - [`update`]: an Update operation (create, PUT, patch) takes the fields whose value it changed
//!   away from every other manager.
//! - [`apply`]: an Apply operation merges the applied configuration into the live object, removes
//!   the fields the manager applied before and dropped (unless someone else owns them), and
//!   refuses with conflicts when another manager owns a field it would change (unless forced).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry, Time};
use serde_json::{Map, Value};

/// A path of FieldsV1 keys: `["f:spec", "f:size"]`.
pub type FieldPath = Vec<String>;
pub type FieldSet = BTreeSet<FieldPath>;

pub use super::generic::Subresource as Part;

/// The `subresource` a managed fields entry records.
fn subresource_name(part: Part) -> Option<String> {
    match part {
        Part::Main => None,
        Part::Status => Some("status".to_owned()),
    }
}

/// One manager's ownership.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub manager: String,
    pub apply: bool,
    pub api_version: String,
    pub time: Option<Time>,
    pub subresource: Option<String>,
    pub fields: FieldSet,
}

/// A field another manager owns with a different value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    pub manager: String,
    /// `.spec.size`.
    pub field: String,
}

pub fn from_entries(entries: &[ManagedFieldsEntry]) -> Vec<Entry> {
    entries
        .iter()
        .filter(|e| e.manager.is_some() || e.fields_v1.is_some())
        .map(|e| Entry {
            manager: e.manager.clone().unwrap_or_default(),
            apply: e.operation.as_deref() == Some("Apply"),
            api_version: e.api_version.clone().unwrap_or_default(),
            time: e.time.clone(),
            subresource: e.subresource.clone().filter(|s| !s.is_empty()),
            fields: e.fields_v1.as_ref().map(|f| from_fields_v1(&f.0)).unwrap_or_default(),
        })
        .collect()
}

pub fn to_entries(entries: &[Entry]) -> Vec<ManagedFieldsEntry> {
    entries
        .iter()
        .filter(|e| !e.fields.is_empty())
        .map(|e| ManagedFieldsEntry {
            api_version: Some(e.api_version.clone()),
            fields_type: Some("FieldsV1".to_owned()),
            fields_v1: Some(FieldsV1(to_fields_v1(&e.fields))),
            manager: Some(e.manager.clone()),
            operation: Some(if e.apply { "Apply" } else { "Update" }.to_owned()),
            subresource: e.subresource.clone(),
            time: e.time.clone(),
        })
        .collect()
}

/// The FieldsV1 tree of a set: `{"f:spec":{"f:size":{}}}`.
pub fn to_fields_v1(set: &FieldSet) -> Value {
    let mut root = Map::new();
    for path in set {
        let mut node = &mut root;
        for (i, key) in path.iter().enumerate() {
            let child = node.entry(key.clone()).or_insert_with(|| Value::Object(Map::new()));
            let Value::Object(child) = child else { break };
            if i + 1 == path.len() && !child.is_empty() {
                child.insert(".".to_owned(), Value::Object(Map::new()));
            }
            node = child;
        }
    }
    // A leaf that later gained children is marked with ".".
    fn mark(set: &FieldSet, prefix: &mut FieldPath, node: &mut Map<String, Value>) {
        for (k, v) in node.iter_mut() {
            if k == "." {
                continue;
            }
            prefix.push(k.clone());
            if let Value::Object(child) = v {
                if !child.is_empty() && set.contains(prefix) {
                    child.insert(".".to_owned(), Value::Object(Map::new()));
                }
                mark(set, prefix, child);
            }
            prefix.pop();
        }
    }
    mark(set, &mut Vec::new(), &mut root);
    Value::Object(root)
}

/// The set of a FieldsV1 tree. `"."` marks ownership of the node itself.
pub fn from_fields_v1(v: &Value) -> FieldSet {
    fn walk(v: &Value, prefix: &mut FieldPath, out: &mut FieldSet) {
        let Value::Object(m) = v else { return };
        if m.is_empty() {
            if !prefix.is_empty() {
                out.insert(prefix.clone());
            }
            return;
        }
        for (k, child) in m {
            if k == "." {
                out.insert(prefix.clone());
                continue;
            }
            prefix.push(k.clone());
            walk(child, prefix, out);
            prefix.pop();
        }
    }
    let mut out = FieldSet::new();
    walk(v, &mut Vec::new(), &mut out);
    out.retain(|p| !p.is_empty());
    out
}

/// The leaves of `obj` that field management tracks for `part`, with their values.
pub fn leaves(obj: &Value, part: Part) -> BTreeMap<FieldPath, Value> {
    let mut out = BTreeMap::new();
    let Value::Object(top) = obj else { return out };
    for (k, v) in top {
        let tracked = match (k.as_str(), part) {
            ("apiVersion" | "kind", _) => false,
            ("status", p) => p == Part::Status,
            ("metadata", _) => true,
            (_, p) => p == Part::Main,
        };
        if !tracked {
            continue;
        }
        let mut path = vec![format!("f:{k}")];
        if k == "metadata" {
            if part == Part::Status {
                continue;
            }
            let Value::Object(meta) = v else { continue };
            for (mk, mv) in meta {
                if matches!(mk.as_str(), "labels" | "annotations" | "finalizers" | "ownerReferences") {
                    path.push(format!("f:{mk}"));
                    collect(mv, &mut path, &mut out);
                    path.pop();
                }
            }
        } else {
            collect(v, &mut path, &mut out);
        }
    }
    out
}

fn collect(v: &Value, path: &mut FieldPath, out: &mut BTreeMap<FieldPath, Value>) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, child) in m {
                path.push(format!("f:{k}"));
                collect(child, path, out);
                path.pop();
            }
        }
        _ => {
            out.insert(path.clone(), v.clone());
        }
    }
}

/// Whether applying `applied` over `live` leaves `live` as it is: equal scalars, objects whose
/// applied keys all agree, lists of the same length whose items agree. Fields the server
/// defaulted inside an atomic list item are not a conflict.
fn subset(applied: &Value, live: &Value) -> bool {
    match (applied, live) {
        (Value::Object(a), Value::Object(l)) => a.iter().all(|(k, v)| l.get(k).is_some_and(|lv| subset(v, lv))),
        (Value::Array(a), Value::Array(l)) => a.len() == l.len() && a.iter().zip(l).all(|(x, y)| subset(x, y)),
        _ => applied == live,
    }
}

fn overlaps(a: &[String], b: &[String]) -> bool {
    let n = a.len().min(b.len());
    a[..n] == b[..n]
}

/// The value at a FieldsV1 path.
pub fn value_at<'a>(obj: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter()
        .try_fold(obj, |v, k| v.get(k.strip_prefix("f:").unwrap_or(k)))
}

fn set_at(obj: &mut Value, path: &[String], value: Value) {
    let mut node = obj;
    for (i, k) in path.iter().enumerate() {
        let key = k.strip_prefix("f:").unwrap_or(k).to_owned();
        if !node.is_object() {
            *node = Value::Object(Map::new());
        }
        let Value::Object(m) = node else { return };
        if i + 1 == path.len() {
            m.insert(key, value);
            return;
        }
        node = m.entry(key).or_insert_with(|| Value::Object(Map::new()));
    }
}

fn remove_at(obj: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut node = obj;
    for k in parents {
        match node.get_mut(k.strip_prefix("f:").unwrap_or(k)) {
            Some(child) => node = child,
            None => return,
        }
    }
    if let Value::Object(m) = node {
        m.remove(last.strip_prefix("f:").unwrap_or(last));
    }
}

/// `.spec.size` from `["f:spec","f:size"]`.
pub fn display(path: &[String]) -> String {
    path.iter()
        .map(|k| format!(".{}", k.strip_prefix("f:").unwrap_or(k)))
        .collect()
}

fn touch(entries: &mut Vec<Entry>, manager: &str, apply: bool, part: Part, api_version: &str) -> usize {
    let sub = subresource_name(part);
    if let Some(i) = entries
        .iter()
        .position(|e| e.manager == manager && e.apply == apply && e.subresource == sub)
    {
        return i;
    }
    entries.push(Entry {
        manager: manager.to_owned(),
        apply,
        api_version: api_version.to_owned(),
        time: None,
        subresource: sub,
        fields: FieldSet::new(),
    });
    entries.len() - 1
}

/// Ownership after an Update by `manager` from `old` to `new` (`old` is `{}` on create).
pub fn update(old: &Value, new: &Value, entries: &[Entry], manager: &str, part: Part, now: &Time) -> Vec<Entry> {
    let (ol, nl) = (leaves(old, part), leaves(new, part));
    let changed: FieldSet = nl
        .iter()
        .filter(|(p, v)| ol.get(*p) != Some(*v))
        .map(|(p, _)| p.clone())
        .collect();
    let removed: FieldSet = ol.keys().filter(|p| !nl.contains_key(*p)).cloned().collect();
    let mut out = entries.to_vec();
    let mine = touch(&mut out, manager, false, part, kvcache_api::API_VERSION);
    for (i, e) in out.iter_mut().enumerate() {
        if i != mine {
            e.fields
                .retain(|q| !changed.iter().chain(removed.iter()).any(|p| overlaps(p, q)));
            continue;
        }
        let before = e.fields.clone();
        e.fields.retain(|q| !removed.iter().any(|p| overlaps(p, q)));
        e.fields.extend(changed.iter().cloned());
        if e.fields != before || e.time.is_none() {
            e.time = Some(now.clone());
        }
    }
    out.retain(|e| !e.fields.is_empty());
    out
}

/// The result of an apply: the merged object and the new ownership.
#[derive(Debug, Clone, PartialEq)]
pub struct Applied {
    pub object: Value,
    pub entries: Vec<Entry>,
}

/// Server-side apply of `config` by `manager` onto `live` (`{}` when the object does not exist).
pub fn apply(
    live: &Value,
    config: &Value,
    entries: &[Entry],
    manager: &str,
    part: Part,
    force: bool,
    now: &Time,
) -> Result<Applied, Vec<Conflict>> {
    let applied = leaves(config, part);
    let fields: FieldSet = applied.keys().cloned().collect();
    let sub = subresource_name(part);
    let mut out = entries.to_vec();
    let mut conflicts = Vec::new();
    for e in &mut out {
        if e.subresource != sub || (e.manager == manager && e.apply) {
            continue;
        }
        let mut lost = FieldSet::new();
        for q in &e.fields {
            for (p, v) in &applied {
                if overlaps(p, q) && !value_at(live, p).is_some_and(|l| subset(v, l)) {
                    if force {
                        lost.insert(q.clone());
                    } else {
                        conflicts.push(Conflict {
                            manager: e.manager.clone(),
                            field: display(p),
                        });
                    }
                }
            }
        }
        e.fields.retain(|q| !lost.contains(q));
    }
    if !conflicts.is_empty() {
        conflicts.sort_by(|a, b| (&a.manager, &a.field).cmp(&(&b.manager, &b.field)));
        conflicts.dedup();
        return Err(conflicts);
    }
    let mine = touch(&mut out, manager, true, part, kvcache_api::API_VERSION);
    let previous = std::mem::take(&mut out[mine].fields);
    let mut object = live.clone();
    for p in previous.difference(&fields) {
        let owned_elsewhere = out
            .iter()
            .enumerate()
            .any(|(i, e)| i != mine && e.subresource == sub && e.fields.iter().any(|q| overlaps(p, q)));
        if !owned_elsewhere {
            remove_at(&mut object, p);
        }
    }
    for (p, v) in &applied {
        set_at(&mut object, p, v.clone());
    }
    for key in ["apiVersion", "kind"] {
        if let Some(v) = config.get(key) {
            object[key] = v.clone();
        }
    }
    if previous != fields || out[mine].time.is_none() {
        out[mine].time = Some(now.clone());
    }
    out[mine].fields = fields;
    out.retain(|e| !e.fields.is_empty());
    Ok(Applied { object, entries: out })
}

/// The ownership recorded on `obj`.
pub fn entries_of<K: kvcache_api::Kind>(obj: &kvcache_api::Object<K>) -> Vec<Entry> {
    from_entries(obj.metadata.managed_fields.as_deref().unwrap_or_default())
}

/// Drops owned paths that do not exist in the stored object (unknown fields a `Warn` request
/// sent, which were pruned).
pub fn prune(entries: Vec<Entry>, obj: &Value) -> Vec<ManagedFieldsEntry> {
    let kept: Vec<Entry> = entries
        .into_iter()
        .map(|mut e| {
            e.fields.retain(|p| value_at(obj, p).is_some());
            e
        })
        .collect();
    to_entries(&kept)
}

/// Whether the request set `managedFields` itself (a client resetting or migrating ownership).
pub fn explicit_managed_fields(requested: &Value, current: &Value) -> Option<Vec<ManagedFieldsEntry>> {
    let req = requested.pointer("/metadata/managedFields")?;
    if Some(req) == current.pointer("/metadata/managedFields") {
        return None;
    }
    let entries: Vec<ManagedFieldsEntry> = serde_json::from_value(req.clone()).unwrap_or_default();
    // `[{}]` clears them.
    Some(entries.into_iter().filter(|e| e.manager.is_some()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn t() -> Time {
        crate::registry::meta::now()
    }

    fn paths(e: &Entry) -> Vec<String> {
        e.fields.iter().map(|p| display(p)).collect()
    }

    #[test]
    fn fields_v1_round_trips() {
        let v = json!({"f:metadata":{"f:labels":{".":{},"f:app":{}}},"f:spec":{"f:size":{}}});
        let set = from_fields_v1(&v);
        assert_eq!(set.len(), 3);
        assert_eq!(to_fields_v1(&set), v);
    }

    #[test]
    fn update_takes_changed_fields_from_others() {
        let old = json!({});
        let a = json!({"metadata":{"name":"x","labels":{"app":"a"}},"spec":{"size":1,"args":["x"]}});
        let e = update(&old, &a, &[], "alice", Part::Main, &t());
        assert_eq!(paths(&e[0]), vec![".metadata.labels.app", ".spec.args", ".spec.size"]);
        let b = json!({"metadata":{"name":"x","labels":{"app":"a"}},"spec":{"size":2,"args":["x"]}});
        let e = update(&a, &b, &e, "bob", Part::Main, &t());
        assert_eq!(paths(&e[0]), vec![".metadata.labels.app", ".spec.args"]);
        assert_eq!(e[1].manager, "bob");
        assert_eq!(paths(&e[1]), vec![".spec.size"]);
        // An update that changes nothing keeps the entries, time included.
        assert_eq!(update(&b, &b, &e, "bob", Part::Main, &t()), e);
        // Status writes are tracked apart and never take spec fields.
        let s = json!({"spec":{"size":2},"status":{"phase":"Ready"}});
        let e2 = update(&b, &s, &e, "ctl", Part::Status, &t());
        assert_eq!(e2.last().unwrap().subresource.as_deref(), Some("status"));
        assert_eq!(paths(e2.last().unwrap()), vec![".status.phase"]);
    }

    #[test]
    fn apply_conflicts_unless_forced_and_removes_dropped_fields() {
        let live = json!({"spec":{"size":1}});
        let e = update(&json!({}), &live, &[], "a", Part::Main, &t());
        let conflict = apply(&live, &json!({"spec":{"size":2}}), &e, "b", Part::Main, false, &t()).unwrap_err();
        assert_eq!(
            conflict,
            vec![Conflict {
                manager: "a".into(),
                field: ".spec.size".into()
            }]
        );
        // Same value: shared ownership, no conflict.
        let shared = apply(&live, &json!({"spec":{"size":1}}), &e, "b", Part::Main, false, &t()).unwrap();
        assert_eq!(shared.entries.len(), 2);
        let forced = apply(&live, &json!({"spec":{"size":2}}), &e, "b", Part::Main, true, &t()).unwrap();
        assert_eq!(forced.object, json!({"spec":{"size":2}}));
        assert_eq!(forced.entries.len(), 1);
        assert_eq!(forced.entries[0].manager, "b");
        // Dropping a field removes it when nobody else owns it.
        let two = apply(
            &json!({}),
            &json!({"spec":{"size":2,"x":"y"}}),
            &[],
            "b",
            Part::Main,
            false,
            &t(),
        )
        .unwrap();
        let one = apply(
            &two.object,
            &json!({"spec":{"size":2}}),
            &two.entries,
            "b",
            Part::Main,
            false,
            &t(),
        )
        .unwrap();
        assert_eq!(one.object, json!({"spec":{"size":2}}));
        // Applying the same configuration again changes nothing.
        let again = apply(
            &one.object,
            &json!({"spec":{"size":2}}),
            &one.entries,
            "b",
            Part::Main,
            false,
            &t(),
        )
        .unwrap();
        assert_eq!(again, one);
    }
}
