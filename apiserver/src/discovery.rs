//! Discovery documents, built from the table of kinds: the legacy `APIGroupList` / `APIGroup` /
//! `APIResourceList`, and the aggregated `APIGroupDiscoveryList` (apidiscovery.k8s.io v2 and
//! v2beta1) chosen by `Accept`; the core group's, which holds Events and Namespaces, and
//! `coordination.k8s.io`'s, which holds Leases alone (both only in direct mode).

use serde_json::{Value, json};

use crate::registry::kinds::KindEntry;
use kvcache_api::{API_VERSION, GROUP, VERSION};

const VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];
const STATUS_VERBS: &[&str] = &["get", "patch", "update"];

fn group_version() -> Value {
    json!({"groupVersion": API_VERSION, "version": VERSION})
}

/// `GET /apis/worker.gpustack.ai`.
pub fn api_group() -> Value {
    json!({"kind": "APIGroup", "apiVersion": "v1", "name": GROUP,
           "versions": [group_version()], "preferredVersion": group_version()})
}

/// `GET /apis` (legacy): our group, then the Leases of direct mode.
pub fn api_group_list() -> Value {
    let groups: Vec<Value> = [api_group(), lease_group()]
        .into_iter()
        .map(|mut g| {
            if let Value::Object(m) = &mut g {
                m.remove("kind");
                m.remove("apiVersion");
            }
            g
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// The group of the Leases served in direct mode (`crate::leases`); never part of an
/// APIService.
const LEASE_GROUP: &str = crate::request_info::LEASE_GROUP;
const LEASE_VERBS: &[&str] = &["create", "delete", "get", "list", "patch", "update", "watch"];

/// `GET /apis/coordination.k8s.io`.
pub fn lease_group() -> Value {
    let v = json!({"groupVersion": format!("{LEASE_GROUP}/v1"), "version": "v1"});
    json!({"kind": "APIGroup", "apiVersion": "v1", "name": LEASE_GROUP, "versions": [v.clone()], "preferredVersion": v})
}

/// `GET /apis/coordination.k8s.io/v1`.
pub fn lease_resources() -> Value {
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": format!("{LEASE_GROUP}/v1"), "resources": [
        {"name": "leases", "singularName": "lease", "namespaced": true, "kind": "Lease", "verbs": LEASE_VERBS}
    ]})
}

fn aggregated_leases() -> Value {
    json!({"metadata": {"name": LEASE_GROUP}, "versions": [{"version": "v1", "freshness": "Current", "resources": [{
        "resource": "leases", "singularResource": "lease", "scope": "Namespaced",
        "responseKind": {"group": LEASE_GROUP, "version": "v1", "kind": "Lease"}, "verbs": LEASE_VERBS,
    }]}]})
}

/// `GET /apis/worker.gpustack.ai/v1`.
pub fn api_resource_list(resources: &[KindEntry]) -> Value {
    let mut out = Vec::new();
    for r in resources {
        out.push(json!({
            "name": r.plural, "singularName": r.singular, "namespaced": r.namespaced(), "kind": r.kind,
            "verbs": VERBS, "shortNames": r.short_names, "categories": r.categories,
        }));
        out.push(json!({
            "name": format!("{}/status", r.plural), "singularName": "", "namespaced": r.namespaced(),
            "kind": r.kind, "verbs": STATUS_VERBS,
        }));
    }
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": API_VERSION, "resources": out})
}

/// The aggregated discovery list in `version` (`v2` or `v2beta1`).
pub fn aggregated(resources: &[KindEntry], version: &str) -> Value {
    let kind_of = |kind: &str| json!({"group": GROUP, "version": VERSION, "kind": kind});
    let items: Vec<Value> = resources
        .iter()
        .map(|r| {
            json!({
                "resource": r.plural, "singularResource": r.singular,
                "scope": if r.namespaced() { "Namespaced" } else { "Cluster" },
                "responseKind": kind_of(r.kind), "verbs": VERBS, "shortNames": r.short_names,
                "categories": r.categories,
                "subresources": [{"subresource": "status", "responseKind": kind_of(r.kind), "verbs": STATUS_VERBS}],
            })
        })
        .collect();
    json!({
        "kind": "APIGroupDiscoveryList", "apiVersion": format!("apidiscovery.k8s.io/{version}"), "metadata": {},
        "items": [
            {"metadata": {"name": GROUP}, "versions": [{"version": VERSION, "freshness": "Current", "resources": items}]},
            aggregated_leases(),
        ],
    })
}

/// The verbs of the core Events served in direct mode (`crate::events`).
const EVENT_VERBS: &[&str] = &["create", "get", "list", "watch"];

/// The verbs of the core Namespaces served in direct mode (`crate::namespaces`).
const NAMESPACE_VERBS: &[&str] = &["create", "delete", "get", "list", "watch"];

/// The aggregated list for `/api`: the core group, with Events and Namespaces.
pub fn aggregated_core(version: &str) -> Value {
    let event = json!({
        "resource": "events", "singularResource": "event", "scope": "Namespaced",
        "responseKind": {"group": "", "version": "v1", "kind": "Event"}, "verbs": EVENT_VERBS,
        "shortNames": ["ev"],
    });
    let namespace = json!({
        "resource": "namespaces", "singularResource": "namespace", "scope": "Cluster",
        "responseKind": {"group": "", "version": "v1", "kind": "Namespace"}, "verbs": NAMESPACE_VERBS,
        "shortNames": ["ns"],
    });
    json!({
        "kind": "APIGroupDiscoveryList", "apiVersion": format!("apidiscovery.k8s.io/{version}"), "metadata": {},
        "items": [{"metadata": {"name": ""}, "versions": [{"version": "v1", "freshness": "Current", "resources": [event, namespace]}]}],
    })
}

/// `GET /api` (legacy).
pub fn core_versions() -> Value {
    json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []})
}

/// `GET /api/v1`: Events and Namespaces.
pub fn core_resources() -> Value {
    json!({"kind": "APIResourceList", "groupVersion": "v1", "resources": [
        {"name": "events", "singularName": "event", "namespaced": true, "kind": "Event", "verbs": EVENT_VERBS, "shortNames": ["ev"]},
        {"name": "namespaces", "singularName": "namespace", "namespaced": false, "kind": "Namespace", "verbs": NAMESPACE_VERBS, "shortNames": ["ns"]}
    ]})
}
