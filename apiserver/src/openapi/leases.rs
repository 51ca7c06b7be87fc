//! The OpenAPI v3 group-version document of the Leases served in direct mode
//! (`crate::leases`): the Lease schema from k8s-openapi's types, rewritten like ours, and the
//! operations served.

use serde_json::{Map, Value, json};

use super::{Gvk, LIST_PARAMS, op, path_param, rewrite};

/// `/openapi/v3/apis/coordination.k8s.io/v1`: the Leases of direct mode (`crate::leases`).
pub const LEASE_V3_PATH: &str = "/openapi/v3/apis/coordination.k8s.io/v1";

/// The group-version document of the Leases served in direct mode: the Lease schema (from
/// k8s-openapi's types) and the operations `crate::leases` serves.
pub fn document() -> Value {
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
    let mut generator = schemars::SchemaGenerator::default();
    let _ = generator.subschema_for::<Lease>();
    let _ = generator.subschema_for::<meta::ListMeta>();
    let _ = generator.subschema_for::<meta::Status>();
    let _ = generator.subschema_for::<meta::DeleteOptions>();
    let mut schemas: Map<String, Value> = generator
        .take_definitions(true)
        .into_iter()
        .map(|(k, v)| (k, rewrite(&v, "#/components/schemas/")))
        .collect();
    let lease = "io.k8s.api.coordination.v1.Lease";
    if let Some(Value::Object(l)) = schemas.get_mut(lease) {
        l.insert(
            "x-kubernetes-group-version-kind".into(),
            json!([{"group": "coordination.k8s.io", "version": "v1", "kind": "Lease"}]),
        );
    }
    schemas.insert(
        format!("{lease}List"),
        json!({
            "description": "LeaseList is a list of Lease objects.", "type": "object", "required": ["items"],
            "properties": {
                "apiVersion": {"type": "string"}, "kind": {"type": "string"},
                "items": {"type": "array", "items": {"$ref": format!("#/components/schemas/{lease}")}, "x-kubernetes-list-type": "atomic"},
                "metadata": {"allOf": [{"$ref": "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ListMeta"}], "default": {}},
            },
            "x-kubernetes-group-version-kind": [{"group": "coordination.k8s.io", "version": "v1", "kind": "LeaseList"}],
        }),
    );
    schemas.insert(
        "io.k8s.apimachinery.pkg.apis.meta.v1.Patch".into(),
        json!({"type": "object", "description": "Patch is provided to give a concrete name and type to the Kubernetes PATCH request body."}),
    );
    let gvk = Gvk {
        group: "coordination.k8s.io",
        version: "v1",
        kind: "Lease",
    };
    let list = format!("{lease}List");
    let status = "io.k8s.apimachinery.pkg.apis.meta.v1.Status";
    let base = "/apis/coordination.k8s.io/v1";
    let json_body = &["application/json", "application/yaml"][..];
    let patch_types = &[
        "application/json-patch+json",
        "application/merge-patch+json",
        "application/strategic-merge-patch+json",
    ][..];
    let paths = json!({
        format!("{base}/leases"): {
            "get": op("list", gvk, "listLeaseForAllNamespaces", LIST_PARAMS, None, &list), "parameters": [],
        },
        format!("{base}/namespaces/{{namespace}}/leases"): {
            "get": op("list", gvk, "listNamespacedLease", LIST_PARAMS, None, &list),
            "post": op("post", gvk, "createNamespacedLease", &[], Some(json_body), lease),
            "parameters": path_param(&["namespace"]),
        },
        format!("{base}/namespaces/{{namespace}}/leases/{{name}}"): {
            "get": op("get", gvk, "readNamespacedLease", &[], None, lease),
            "put": op("put", gvk, "replaceNamespacedLease", &[], Some(json_body), lease),
            "patch": op("patch", gvk, "patchNamespacedLease", &[], Some(patch_types), lease),
            "delete": op("delete", gvk, "deleteNamespacedLease", &[], None, status),
            "parameters": path_param(&["name", "namespace"]),
        },
    });
    json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1"},
        "paths": paths,
        "components": {"schemas": schemas},
    })
}
