//! The OpenAPI documents kubectl and kube-aggregator read: v3 (`/openapi/v3` and the
//! group-version document, addressed by content hash) and v2 (JSON for the aggregator, and the
//! protobuf form kubectl 1.27 and 1.28 insist on before `apply`, `create` and `explain`).
//!
//! Schemas come from the types (schemars), rewritten into the OpenAPI 3.0 dialect Kubernetes
//! clients understand: `$ref`s under `components/schemas` (`definitions` in v2), nullable unions
//! collapsed, string enums inlined into their fields and one description per field (see
//! [`explain`]), references with siblings wrapped in `allOf`, lists marked atomic (our
//! server-side apply treats every list as one field). PATCH operations list JSON patch, merge
//! patch and apply, never strategic merge patch, so client-side `kubectl apply` sends merge
//! patches.

mod dialect;
mod explain;
mod leases;
pub mod proto;

use dialect::rewrite;

pub use leases::LEASE_V3_PATH;

use serde_json::{Map, Value, json};

use kvcache_api::{API_VERSION, GROUP, Kind, Object, VERSION};

/// The documents, built once at start.
#[derive(Debug, Clone)]
pub struct Documents {
    /// The group-version v3 document.
    pub v3: Vec<u8>,
    /// Hex SHA-512 of `v3`: its ETag and the `?hash=` of its URL.
    pub v3_hash: String,
    /// The Leases' group-version v3 document (direct mode), and its hash.
    pub lease_v3: Vec<u8>,
    pub lease_v3_hash: String,
    /// The `/openapi/v3` discovery document.
    pub v3_root: Vec<u8>,
    pub v2_json: Vec<u8>,
    pub v2_hash: String,
    pub v2_protobuf: Vec<u8>,
}

/// `/openapi/v3/apis/worker.gpustack.ai/v1`.
pub const V3_PATH: &str = "/openapi/v3/apis/worker.gpustack.ai/v1";

pub fn sha512_hex(bytes: &[u8]) -> String {
    let d = ring::digest::digest(&ring::digest::SHA512, bytes);
    d.as_ref().iter().map(|b| format!("{b:02X}")).collect()
}

/// The schema name of a kind: `ai.gpustack.worker.v1.KVCacheBackend`.
pub fn schema_name(kind: &str) -> String {
    format!("ai.gpustack.worker.{VERSION}.{kind}")
}

/// The schemas of the documents being built; each kind adds its own (see the table of kinds).
#[derive(Debug, Default)]
pub struct Collector {
    schemas: Map<String, Value>,
}

impl Collector {
    /// Adds the schemas of kind `K`: the object, its list, and every type they reference.
    pub fn add_kind<K: Kind>(&mut self) {
        let root = schemars::schema_for!(Object<K>);
        let mut root = serde_json::to_value(root).unwrap_or_default();
        if let Some(Value::Object(defs)) = root.as_object_mut().and_then(|r| r.remove("$defs")) {
            for (name, schema) in defs {
                self.schemas.entry(name).or_insert(schema);
            }
        }
        if let Value::Object(r) = &mut root {
            r.remove("$schema");
            r.remove("title");
            let spec_doc = self.spec_doc(r);
            r.insert("description".into(), Value::String(kind_description::<K>(&spec_doc)));
            if let Some(Value::Object(props)) = r.get_mut("properties") {
                describe_properties::<K>(props);
            }
        }
        self.schemas.insert(schema_name(K::KIND), root);
        self.schemas
            .insert(format!("{}List", schema_name(K::KIND)), list_schema::<K>());
    }

    /// The description of the spec type a kind's schema `root` references, and a blank line;
    /// empty when it has none.
    fn spec_doc(&self, root: &Map<String, Value>) -> String {
        root.get("properties")
            .and_then(|p| p.get("spec"))
            .and_then(|s| s.get("$ref"))
            .and_then(Value::as_str)
            .and_then(|target| target.rsplit('/').next())
            .and_then(|name| self.schemas.get(name))
            .and_then(|s| s.get("description"))
            .and_then(Value::as_str)
            .map(|d| format!("{d}\n\n"))
            .unwrap_or_default()
    }

    fn add_meta(&mut self) {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
        let mut generator = schemars::SchemaGenerator::default();
        for (name, schema) in [
            ("ListMeta", generator.subschema_for::<meta::ListMeta>()),
            ("Status", generator.subschema_for::<meta::Status>()),
            ("DeleteOptions", generator.subschema_for::<meta::DeleteOptions>()),
            ("WatchEvent", generator.subschema_for::<meta::WatchEvent<Value>>()),
        ] {
            let full = format!("io.k8s.apimachinery.pkg.apis.meta.v1.{name}");
            let v = serde_json::to_value(schema).unwrap_or_default();
            if v.get("$ref").is_none() {
                self.schemas.entry(full).or_insert(v);
            }
        }
        for (name, schema) in generator.take_definitions(true) {
            self.schemas.entry(name).or_insert(schema);
        }
        self.schemas.insert(
            "io.k8s.apimachinery.pkg.apis.meta.v1.Patch".into(),
            json!({"type": "object", "description": "Patch is provided to give a concrete name and type to the Kubernetes PATCH request body."}),
        );
    }
}

/// The description of kind `K`'s schema: its spec's (`spec_doc`), then what it is and how to
/// explain it.
fn kind_description<K: Kind>(spec_doc: &str) -> String {
    format!(
        "{spec_doc}{} is a {} of {API_VERSION}; see `kubectl explain {}.spec`.",
        K::KIND,
        if K::SCOPE == kvcache_api::Scope::Namespaced {
            "namespaced resource"
        } else {
            "cluster-scoped resource"
        },
        K::SHORT_NAMES.first().copied().unwrap_or(K::PLURAL)
    )
}

/// Describes the top-level properties of kind `K`'s schema: `apiVersion`, `kind`, `spec`,
/// `status` and `metadata`.
fn describe_properties<K: Kind>(props: &mut Map<String, Value>) {
    props.insert(
        "apiVersion".into(),
        json!({"type": "string", "description": "APIVersion defines the versioned schema of this representation of an object: worker.gpustack.ai/v1."}),
    );
    props.insert(
        "kind".into(),
        json!({"type": "string", "description": format!("Kind is the type of this object: {}.", K::KIND)}),
    );
    for (field, what) in [
        ("spec", format!("The desired state of this {}.", K::KIND)),
        (
            "status",
            format!(
                "The observed state of this {}, written by its controller through the status subresource.",
                K::KIND
            ),
        ),
    ] {
        if let Some(Value::Object(p)) = props.get_mut(field) {
            let schema = p.remove("$ref").map(|r| json!({"allOf": [{"$ref": r}]}));
            if let Some(Value::Object(wrapped)) = schema {
                p.extend(wrapped);
            }
            p.insert("description".into(), Value::String(what));
        }
    }
    props.insert(
        "metadata".into(),
        json!({"allOf": [{"$ref": "#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}], "default": {},
               "description": "Standard object's metadata."}),
    );
}

/// The schema of kind `K`'s list.
fn list_schema<K: Kind>() -> Value {
    json!({
        "description": format!("{}List is a list of {}.", K::KIND, K::KIND),
        "type": "object",
        "required": ["items"],
        "properties": {
            "apiVersion": {"type": "string", "description": "worker.gpustack.ai/v1"},
            "kind": {"type": "string", "description": format!("{}List", K::KIND)},
            "items": {"type": "array", "items": {"$ref": format!("#/$defs/{}", schema_name(K::KIND))},
                      "description": format!("List of {}.", K::PLURAL)},
            "metadata": {"allOf": [{"$ref": "#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.ListMeta"}], "default": {},
                         "description": "Standard list metadata."},
        },
        "x-kubernetes-group-version-kind": [{"group": GROUP, "version": VERSION, "kind": format!("{}List", K::KIND)}],
    })
}

fn query_param(name: &str, type_: &str, description: &str) -> Value {
    json!({"name": name, "in": "query", "description": description, "schema": {"type": type_}, "uniqueItems": true})
}

fn params(names: &[&str]) -> Vec<Value> {
    names
        .iter()
        .map(|n| match *n {
            "dryRun" => query_param(
                n,
                "string",
                "When present, indicates that modifications should not be persisted. The only valid value is All.",
            ),
            "fieldManager" => query_param(
                n,
                "string",
                "A name associated with the actor or entity that is making these changes.",
            ),
            "fieldValidation" => query_param(
                n,
                "string",
                "How to handle unknown and duplicate fields: Ignore, Warn (the default) or Strict.",
            ),
            "force" => query_param(
                n,
                "boolean",
                "Force is going to \"force\" Apply requests: re-acquire conflicting fields owned by other people.",
            ),
            "gracePeriodSeconds" => query_param(
                n,
                "integer",
                "The duration in seconds before the object should be deleted.",
            ),
            "propagationPolicy" => query_param(n, "string", "Whether and how garbage collection will be performed."),
            "orphanDependents" => query_param(n, "boolean", "Deprecated: use propagationPolicy."),
            "allowWatchBookmarks" | "watch" | "sendInitialEvents" => query_param(n, "boolean", n),
            "limit" | "timeoutSeconds" => query_param(n, "integer", n),
            _ => query_param(n, "string", n),
        })
        .collect()
}

const LIST_PARAMS: &[&str] = &[
    "allowWatchBookmarks",
    "continue",
    "fieldSelector",
    "labelSelector",
    "limit",
    "resourceVersion",
    "resourceVersionMatch",
    "sendInitialEvents",
    "timeoutSeconds",
    "watch",
];

/// The group, version and kind an operation is on.
#[derive(Debug, Clone, Copy)]
struct Gvk<'a> {
    group: &'a str,
    version: &'a str,
    kind: &'a str,
}

fn op(action: &str, gvk: Gvk<'_>, id: &str, parameters: &[&str], body: Option<&[&str]>, response: &str) -> Value {
    let mut o = json!({
        "operationId": id,
        "description": format!("{action} {}", gvk.kind),
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": {"group": gvk.group, "version": gvk.version, "kind": gvk.kind},
        "parameters": params(parameters),
        "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": {"$ref": format!("#/components/schemas/{response}")}}}},
                      "401": {"description": "Unauthorized"}},
    });
    if let Some(types) = body {
        let schema = if action == "patch" {
            "io.k8s.apimachinery.pkg.apis.meta.v1.Patch".to_owned()
        } else {
            response.to_owned()
        };
        let content: Map<String, Value> = types
            .iter()
            .map(|t| {
                (
                    (*t).to_owned(),
                    json!({"schema": {"$ref": format!("#/components/schemas/{schema}")}}),
                )
            })
            .collect();
        o["requestBody"] = json!({"content": content, "required": true});
    }
    o
}

/// Required string path parameters, as Kubernetes' documents declare them.
fn path_param(names: &[&str]) -> Value {
    Value::Array(
        names
            .iter()
            .map(|n| json!({"name": n, "in": "path", "required": true, "schema": {"type": "string"}, "uniqueItems": true}))
            .collect(),
    )
}

fn paths_for(info: &KindDoc) -> Map<String, Value> {
    let kind = info.kind;
    let gvk = Gvk {
        group: GROUP,
        version: VERSION,
        kind,
    };
    let obj = schema_name(kind);
    let list = format!("{obj}List");
    let status = "io.k8s.apimachinery.pkg.apis.meta.v1.Status";
    let base = format!("/apis/{API_VERSION}");
    let scoped = if info.namespaced {
        format!("{base}/namespaces/{{namespace}}/{}", info.plural)
    } else {
        format!("{base}/{}", info.plural)
    };
    let write = &["dryRun", "fieldManager", "fieldValidation"][..];
    let patch_params = &["dryRun", "fieldManager", "fieldValidation", "force"][..];
    let delete_params = &["dryRun", "gracePeriodSeconds", "orphanDependents", "propagationPolicy"][..];
    let patch_types = &[
        "application/json-patch+json",
        "application/merge-patch+json",
        "application/apply-patch+yaml",
    ][..];
    let json_body = &["application/json", "application/yaml"][..];
    let mut deletecollection: Vec<&str> = delete_params.to_vec();
    deletecollection.extend(LIST_PARAMS);
    let (coll_params, item_params): (Value, Value) = if info.namespaced {
        (path_param(&["namespace"]), path_param(&["name", "namespace"]))
    } else {
        (path_param(&[]), path_param(&["name"]))
    };
    let mut paths = Map::new();
    paths.insert(
        scoped.clone(),
        json!({
            "get": op("list", gvk, &format!("list{kind}"), LIST_PARAMS, None, &list),
            "post": op("post", gvk, &format!("create{kind}"), write, Some(json_body), &obj),
            "delete": op("deletecollection", gvk, &format!("deletecollection{kind}"), &deletecollection, None, status),
            "parameters": coll_params,
        }),
    );
    if info.namespaced {
        paths.insert(
            format!("{base}/{}", info.plural),
            json!({"get": op("list", gvk, &format!("list{kind}ForAllNamespaces"), LIST_PARAMS, None, &list), "parameters": []}),
        );
    }
    paths.insert(
        format!("{scoped}/{{name}}"),
        json!({
            "get": op("get", gvk, &format!("read{kind}"), &[], None, &obj),
            "put": op("put", gvk, &format!("replace{kind}"), write, Some(json_body), &obj),
            "patch": op("patch", gvk, &format!("patch{kind}"), patch_params, Some(patch_types), &obj),
            "delete": op("delete", gvk, &format!("delete{kind}"), delete_params, None, status),
            "parameters": item_params.clone(),
        }),
    );
    paths.insert(
        format!("{scoped}/{{name}}/status"),
        json!({
            "get": op("get", gvk, &format!("read{kind}Status"), &[], None, &obj),
            "put": op("put", gvk, &format!("replace{kind}Status"), write, Some(json_body), &obj),
            "patch": op("patch", gvk, &format!("patch{kind}Status"), patch_params, Some(patch_types), &obj),
            "parameters": item_params,
        }),
    );
    paths
}

/// What the documents say of one kind: its names and scope (for its paths) and how to add its
/// schemas. The table of kinds holds one per kind; the documents need nothing else of it.
#[derive(Clone, Copy, Debug)]
pub struct KindDoc {
    pub kind: &'static str,
    pub plural: &'static str,
    pub namespaced: bool,
    pub schema: fn(&mut Collector),
}

impl KindDoc {
    pub const fn of<K: Kind>() -> KindDoc {
        KindDoc {
            kind: K::KIND,
            plural: K::PLURAL,
            namespaced: matches!(K::SCOPE, kvcache_api::Scope::Namespaced),
            schema: Collector::add_kind::<K>,
        }
    }
}

/// Builds every document for `kinds`.
pub fn build(kinds: &[KindDoc]) -> Documents {
    let mut c = Collector::default();
    for k in kinds {
        (k.schema)(&mut c);
    }
    c.add_meta();
    explain::one_text_per_field(&mut c.schemas);
    let v3_schemas: Map<String, Value> = c
        .schemas
        .iter()
        .map(|(k, v)| (k.clone(), rewrite(v, "#/components/schemas/")))
        .collect();
    let mut paths = Map::new();
    for info in kinds {
        paths.extend(paths_for(info));
    }
    let v3 = json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": VERSION},
        "paths": paths,
        "components": {"schemas": v3_schemas},
    });
    let v3 = serde_json::to_vec(&v3).unwrap_or_default();
    let v3_hash = sha512_hex(&v3);
    let lease_v3 = serde_json::to_vec(&leases::document()).unwrap_or_default();
    let lease_v3_hash = sha512_hex(&lease_v3);
    let v3_root = serde_json::to_vec(&json!({
        "paths": {
            format!("apis/{API_VERSION}"): {"serverRelativeURL": format!("{V3_PATH}?hash={v3_hash}")},
            "apis/coordination.k8s.io/v1": {"serverRelativeURL": format!("{LEASE_V3_PATH}?hash={lease_v3_hash}")},
        }
    }))
    .unwrap_or_default();
    let definitions: Map<String, Value> = c
        .schemas
        .iter()
        .map(|(k, v)| (k.clone(), rewrite(v, "#/definitions/")))
        .collect();
    let v2 = json!({
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": VERSION},
        "paths": {},
        "definitions": definitions,
    });
    let v2_json = serde_json::to_vec(&v2).unwrap_or_default();
    let v2_hash = sha512_hex(&v2_json);
    Documents {
        v3,
        v3_hash,
        lease_v3,
        lease_v3_hash,
        v3_root,
        v2_json,
        v2_hash,
        v2_protobuf: proto::document(&v2),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patch_operations_carry_gvk_and_field_validation_and_no_strategic_merge() {
        use kvcache_api::{
            backend::BackendSpec, binding::BindingSpec, model_deployment::ModelDeploymentSpec, pool::PoolSpec,
        };
        let docs = build(&[
            KindDoc::of::<BackendSpec>(),
            KindDoc::of::<PoolSpec>(),
            KindDoc::of::<BindingSpec>(),
            KindDoc::of::<ModelDeploymentSpec>(),
        ]);
        let v: Value = serde_json::from_slice(&docs.v3).unwrap();
        let item = &v["paths"]["/apis/worker.gpustack.ai/v1/namespaces/{namespace}/kvcachepoolbindings/{name}"];
        let patch = &item["patch"];
        assert_eq!(patch["x-kubernetes-group-version-kind"]["kind"], "KVCachePoolBinding");
        let names: Vec<&str> = patch["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["name"].as_str().unwrap())
            .collect();
        assert!(names.contains(&"fieldValidation"));
        let content = patch["requestBody"]["content"].as_object().unwrap();
        assert!(content.contains_key("application/apply-patch+yaml"));
        assert!(!content.contains_key("application/strategic-merge-patch+json"));
        // Every reference resolves.
        let text = String::from_utf8(docs.v3.clone()).unwrap();
        for r in text.split("\"$ref\":\"#/components/schemas/").skip(1) {
            let name = r.split('"').next().unwrap();
            assert!(v["components"]["schemas"].get(name).is_some(), "dangling $ref {name}");
        }
        let leases: Value = serde_json::from_slice(&docs.lease_v3).unwrap();
        let text = String::from_utf8(docs.lease_v3.clone()).unwrap();
        for r in text.split("\"$ref\":\"#/components/schemas/").skip(1) {
            let name = r.split('"').next().unwrap();
            assert!(
                leases["components"]["schemas"].get(name).is_some(),
                "dangling $ref {name} in the Lease document"
            );
        }
        let spec = &leases["components"]["schemas"]["io.k8s.api.coordination.v1.LeaseSpec"]["properties"];
        assert!(
            spec.get("holderIdentity").is_some() && spec.get("leaseTransitions").is_some(),
            "{spec}"
        );
        let leader = &v["components"]["schemas"]["Managed"]["properties"]["leader"];
        assert!(
            leader.get("allOf").is_some() || leader.get("$ref").is_some(),
            "{leader}"
        );
    }
}
