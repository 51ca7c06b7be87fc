//! The table of kinds: each kind served, once, with its names, scope, categories, printed
//! columns, schema and strategy. Discovery, OpenAPI, tables, metrics labels, the offline CLI and
//! manifests all read it; adding a kind is one entry here plus its modules (`kvcache_api::<kind>`
//! for the type, `registry::<kind>` for its rules).

use std::sync::Arc;

use kvcache_api::{Kind, Scope};
use serde_json::Value;

use crate::decode::bounded::Parsed;
use crate::openapi::KindDoc;
use crate::registry::apply::{self, Applying};
use crate::registry::backend::BackendStrategy;
use crate::registry::binding::BindingStrategy;
use crate::registry::model_deployment::ModelDeploymentStrategy;
use crate::registry::pool::PoolStrategy;
use crate::registry::{Context, Registry, Resource, Strategy, dynamic};
use crate::storage::Storage;
use crate::table::{Column, NAME, age, at, col, text};

/// One kind served.
pub struct KindEntry {
    /// `KVCacheBackend`.
    pub kind: &'static str,
    /// `kvcachebackends`: the URL segment and the resource of discovery, RBAC and metrics.
    pub plural: &'static str,
    pub singular: &'static str,
    pub short_names: &'static [&'static str],
    pub scope: Scope,
    /// `kubectl get <category>` lists the kind (`all` only for namespaced kinds, as for built-in
    /// kinds).
    pub categories: &'static [&'static str],
    /// What `kubectl get` prints.
    pub columns: &'static [Column],
    /// What the OpenAPI documents say of it.
    pub doc: KindDoc,
    /// The kind's registry over a storage.
    pub resource: fn(Arc<dyn Storage>, Context) -> Arc<dyn Resource>,
    /// The offline command line's `apply` of one document of the kind.
    pub apply: for<'a> fn(&'a Registry, &'a str, Parsed, bool) -> Applying<'a>,
}

impl std::fmt::Debug for KindEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KindEntry").field("kind", &self.kind).finish()
    }
}

impl KindEntry {
    const fn of<S: Strategy>(categories: &'static [&'static str], columns: &'static [Column]) -> KindEntry {
        KindEntry {
            kind: S::Kind::KIND,
            plural: S::Kind::PLURAL,
            singular: S::Kind::SINGULAR,
            short_names: S::Kind::SHORT_NAMES,
            scope: S::Kind::SCOPE,
            categories,
            columns,
            doc: KindDoc::of::<S::Kind>(),
            resource: dynamic::resource::<S>,
            apply: apply::apply::<S>,
        }
    }

    pub fn namespaced(&self) -> bool {
        self.scope == Scope::Namespaced
    }

    /// Whether a user's word names this kind: its kind, plural, singular or a short name, any
    /// case, optionally qualified by the group (`kvcb.worker.gpustack.ai`).
    pub fn is_named(&self, word: &str) -> bool {
        let w = word.split('.').next().unwrap_or(word);
        [self.kind, self.plural, self.singular]
            .iter()
            .chain(self.short_names)
            .any(|n| n.eq_ignore_ascii_case(w))
    }
}

/// Every kind, in discovery order.
pub static KINDS: [KindEntry; 4] = [
    KindEntry::of::<BackendStrategy>(CLUSTER, BACKEND_COLUMNS),
    KindEntry::of::<PoolStrategy>(CLUSTER, POOL_COLUMNS),
    KindEntry::of::<BindingStrategy>(NAMESPACED, BINDING_COLUMNS),
    KindEntry::of::<ModelDeploymentStrategy>(NAMESPACED, MODEL_DEPLOYMENT_COLUMNS),
];

const CLUSTER: &[&str] = &["gpustack"];
const NAMESPACED: &[&str] = &["all", "gpustack"];

/// The kind served under `plural`.
pub fn by_plural(plural: &str) -> Option<&'static KindEntry> {
    KINDS.iter().find(|k| k.plural == plural)
}

/// The kind named `kind` (`KVCachePool`).
pub fn by_kind(kind: &str) -> Option<&'static KindEntry> {
    KINDS.iter().find(|k| k.kind == kind)
}

/// The kind a user's word names (`kvcb`, `kvcachepools`, `ModelDeployment`).
pub fn resolve(word: &str) -> Option<&'static KindEntry> {
    KINDS.iter().find(|k| k.is_named(word))
}

/// `KVCacheBackend, KVCachePool, ...`, for messages.
pub fn kind_names() -> String {
    KINDS.iter().map(|k| k.kind).collect::<Vec<_>>().join(", ")
}

/// The backend's `Client` endpoint (or its first one).
fn backend_endpoint(v: &Value) -> Value {
    let endpoints = at(v, &["status", "endpoints"]).and_then(Value::as_array);
    let pick = endpoints.and_then(|eps| {
        eps.iter()
            .find(|e| e.get("name").and_then(Value::as_str) == Some("Client"))
            .or_else(|| eps.first())
    });
    pick.map_or_else(|| Value::String(String::new()), |e| text(e, &["address"]))
}

const BACKEND_COLUMNS: &[Column] = &[
    NAME,
    col("Type", "spec.type", |v| text(v, &["spec", "type"])),
    col("Phase", "status.phase", |v| text(v, &["status", "phase"])),
    col("Endpoint", "status.endpoints (the Client endpoint)", backend_endpoint),
    col("Capacity", "status.capacity.total", |v| {
        text(v, &["status", "capacity", "total"])
    }),
    wide(col(
        "Leaders",
        "status.leader: ready/desired leader replicas (one serves, the others stand by)",
        leaders,
    )),
    age(1),
];

/// A byte quantity as a person reads it beside the others (`25Mi`, not `26347104`); a value
/// that is no byte count is shown as stored.
fn quantity_cell(v: &Value, path: &[&str]) -> Value {
    match text(v, path) {
        Value::String(s) => match kvcache_units::parse_bytes(&s) {
            Ok(bytes) => Value::String(kvcache_units::approx_bytes(bytes)),
            Err(_) => Value::String(s),
        },
        other => other,
    }
}

/// `1/3`: ready of desired leader replicas.
fn leaders(v: &Value) -> Value {
    match (
        at(v, &["status", "leader", "readyReplicas"]).and_then(Value::as_i64),
        at(v, &["status", "leader", "replicas"]).and_then(Value::as_i64),
    ) {
        (Some(ready), Some(desired)) => Value::String(format!("{ready}/{desired}")),
        _ => Value::String(String::new()),
    }
}

/// `c` shown only with `-o wide`.
const fn wide(mut c: Column) -> Column {
    c.priority = 1;
    c
}

const POOL_COLUMNS: &[Column] = &[
    NAME,
    col("Quota", "spec.quota.total", |v| text(v, &["spec", "quota", "total"])),
    col("Usage", "status.usage.total, as a quantity", |v| {
        quantity_cell(v, &["status", "usage", "total"])
    }),
    col("Phase", "status.phase", |v| text(v, &["status", "phase"])),
    col("Endpoint", "status.clientEndpoint", |v| {
        text(v, &["status", "clientEndpoint"])
    }),
    age(0),
];

const BINDING_COLUMNS: &[Column] = &[
    NAME,
    col("Pool", "spec.poolRef.name", |v| text(v, &["spec", "poolRef", "name"])),
    col("Domain", "spec.domain.name", |v| text(v, &["spec", "domain", "name"])),
    col("Effective", "status.effectiveQuota", |v| {
        text(v, &["status", "effectiveQuota"])
    }),
    col("Usage", "status.usage, as a quantity", |v| {
        quantity_cell(v, &["status", "usage"])
    }),
    col("Phase", "status.phase", |v| text(v, &["status", "phase"])),
    age(0),
];

const MODEL_DEPLOYMENT_COLUMNS: &[Column] = &[
    NAME,
    col("Engine", "spec.engine.name", |v| text(v, &["spec", "engine", "name"])),
    col("Roles", "status.roleSummary", |v| text(v, &["status", "roleSummary"])),
    col("Phase", "status.phase", |v| text(v, &["status", "phase"])),
    col("Endpoint", "status.endpoint", |v| text(v, &["status", "endpoint"])),
    age(0),
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::{IncludeObject, row};
    use serde_json::json;

    #[test]
    fn words_resolve_to_kinds() {
        assert_eq!(resolve("kvcb").map(|k| k.kind), Some("KVCacheBackend"));
        assert_eq!(
            resolve("kvcachepoolbindings").map(|k| k.kind),
            Some("KVCachePoolBinding")
        );
        assert_eq!(resolve("md").map(|k| k.kind), Some("ModelDeployment"));
        assert_eq!(resolve("KVCachePool").map(|k| k.kind), Some("KVCachePool"));
        assert_eq!(resolve("kvcp.worker.gpustack.ai").map(|k| k.kind), Some("KVCachePool"));
        assert!(resolve("pods").is_none());
        assert_eq!(by_plural("kvcachepools").map(|k| k.namespaced()), Some(false));
    }

    #[test]
    fn backend_row_has_empty_cells_for_missing_status() {
        let obj = json!({"metadata": {"name": "m", "creationTimestamp": "2020-01-01T00:00:00Z"}, "spec": {"type": "Mooncake"}});
        let r = row(BACKEND_COLUMNS, &obj, IncludeObject::Metadata);
        assert_eq!(r["cells"][0], "m");
        assert_eq!(r["cells"][1], "Mooncake");
        assert_eq!(r["cells"][2], "");
        assert_eq!(r["cells"][3], "");
        assert_eq!(r["object"]["kind"], "PartialObjectMetadata");
        let obj = json!({"metadata": {"name": "m"}, "status": {"endpoints": [
            {"name": "Admin", "address": "a:1"}, {"name": "Client", "address": "c:2"}]}});
        assert_eq!(backend_endpoint(&obj), "c:2");
    }

    #[test]
    fn usage_reads_as_a_quantity() {
        let b = json!({"metadata": {"name": "b"}, "status": {"usage": "26347104"}});
        assert_eq!(quantity_cell(&b, &["status", "usage"]), "25Mi");
        let p = json!({"metadata": {"name": "p"}, "status": {"usage": {"total": "8Gi"}}});
        assert_eq!(quantity_cell(&p, &["status", "usage", "total"]), "8Gi");
        assert_eq!(quantity_cell(&p, &["status", "missing"]), "");
    }
}
