//! Built-in kinds served in direct mode, stored as the JSON clients read: core `v1` Events
//! ([`crate::events`]) and `coordination.k8s.io/v1` Leases ([`crate::leases`]). In a cluster
//! kube-apiserver serves both instead. This module holds what they share: where an object is
//! stored, reading one with its revision as `resourceVersion`, and pages of a prefix.
//!
//! Why not the generic registry: it serves our group's kinds, typed (`Object<K>` with
//! `kvcache_api::Kind`), with a strategy, admission, `managedFields` and server-side apply, and
//! names resources `<plural>.worker.gpustack.ai` in every refusal. Events and Leases are other
//! groups' types that we store as the JSON their clients (the controllers, the store's election,
//! kubectl) send, with Kubernetes' own narrower rules (a Lease's compare-and-swap on its
//! `resourceVersion`, an Event's TTL). What must be the same for a client is shared with the
//! typed kinds: the continue token and consistent paging ([`crate::paging`]), the field and label
//! selector parser ([`crate::selectors`]; each kind lists its selectable fields), and the
//! refusal every handler answers with ([`crate::status::Refusal`]).

use std::sync::Arc;

use serde_json::{Value, json};

use crate::paging::ContinueToken;
use crate::status::failure;
use crate::storage::{KeyValue, ListRequest, Storage, StorageError};

/// Largest page of a list.
pub const MAX_LIMIT: usize = 500;

/// The refusal every handler answers with ([`crate::status::Refusal`]).
pub use crate::status::{Refusal, refuse};

/// A 422 naming one field of a `kind`.
pub fn invalid(kind: &str, name: &str, field: &str, reason: &str, message: &str) -> Refusal {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{StatusCause, StatusDetails};
    let what = if name.is_empty() {
        kind.to_owned()
    } else {
        format!("{kind} {name:?}")
    };
    let mut s = failure(422, "Invalid", format!("{what} is invalid: {field}: {message}"));
    s.details = Some(StatusDetails {
        kind: Some(kind.into()),
        name: (!name.is_empty()).then(|| name.to_owned()),
        causes: Some(vec![StatusCause {
            field: Some(field.into()),
            message: Some(message.into()),
            reason: Some(reason.into()),
        }]),
        ..Default::default()
    });
    Refusal(422, Box::new(s))
}

/// A body's own namespace, if it names one, must be the request path's.
pub fn same_namespace(body: Option<&str>, path: &str) -> Result<(), Refusal> {
    match body {
        Some(ns) if !ns.is_empty() && ns != path => Err(refuse(
            400,
            "BadRequest",
            format!("the namespace of the object ({ns}) does not match the namespace on the request ({path})"),
        )),
        _ => Ok(()),
    }
}

pub fn unavailable(e: impl std::fmt::Display) -> Refusal {
    refuse(503, "ServiceUnavailable", e.to_string())
}

/// One built-in kind: where its objects are stored, how it is named and printed.
#[derive(Debug, Clone, Copy)]
pub struct PlainKind {
    /// `Lease`.
    pub kind: &'static str,
    /// `leases`.
    pub plural: &'static str,
    /// `coordination.k8s.io/v1`.
    pub api_version: &'static str,
    /// `/registry/coordination.k8s.io/leases/`.
    pub prefix: &'static str,
    /// What `kubectl get` prints.
    pub columns: &'static [crate::table::Column],
}

impl PlainKind {
    /// The prefix of a namespace's objects, or of all.
    pub fn prefix(&self, namespace: Option<&str>) -> String {
        match namespace {
            Some(ns) => format!("{}{ns}/", self.prefix),
            None => self.prefix.to_owned(),
        }
    }

    pub fn key(&self, namespace: &str, name: &str) -> String {
        format!("{}{namespace}/{name}", self.prefix)
    }

    /// `leases.coordination.k8s.io` (or `events` for the core group), as messages name it.
    pub fn resource(&self) -> String {
        match self.api_version.split_once('/') {
            Some((group, _)) => format!("{}.{group}", self.plural),
            None => self.plural.to_owned(),
        }
    }

    pub fn not_found(&self, name: &str) -> Refusal {
        let mut r = refuse(404, "NotFound", format!("{} \"{name}\" not found", self.resource()));
        r.1.details = Some(self.details(name));
        r
    }

    pub fn details(&self, name: &str) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::StatusDetails {
        k8s_openapi::apimachinery::pkg::apis::meta::v1::StatusDetails {
            name: Some(name.to_owned()),
            group: self.api_version.split_once('/').map(|(g, _)| g.to_owned()),
            kind: Some(self.plural.to_owned()),
            ..Default::default()
        }
    }

    /// One object.
    pub async fn get(&self, storage: &Arc<dyn Storage>, namespace: &str, name: &str) -> Result<Value, Refusal> {
        match storage.get(&self.key(namespace, name)).await {
            Ok(Some(kv)) => {
                with_revision(&kv).ok_or_else(|| refuse(500, "InternalError", "a stored object is not JSON"))
            }
            Ok(None) => Err(self.not_found(name)),
            Err(e) => Err(unavailable(e)),
        }
    }

    /// A page of the objects `keep` admits, the list's revision and the continue token of the
    /// next page; a `continue` token reads at the revision of the list's first page
    /// ([`crate::paging`]).
    pub async fn list(
        &self,
        storage: &Arc<dyn Storage>,
        namespace: Option<&str>,
        keep: Arc<dyn Fn(&Value) -> bool + Send + Sync>,
        limit: Option<usize>,
        continue_token: Option<&str>,
    ) -> Result<(Vec<Value>, u64, Option<String>), Refusal> {
        let prefix = self.prefix(namespace);
        let (revision, start_after) = match continue_token {
            Some(t) => {
                let t = ContinueToken::decode(t, &prefix).map_err(|e| refuse(400, "BadRequest", e.to_string()))?;
                (Some(t.rv), Some(t.start))
            }
            None => (None, None),
        };
        let filter = Arc::new(move |kv: &KeyValue| serde_json::from_slice::<Value>(&kv.value).is_ok_and(|v| keep(&v)));
        let limit = limit.unwrap_or(MAX_LIMIT).clamp(1, MAX_LIMIT);
        let r = storage
            .list(ListRequest {
                prefix,
                revision,
                start_after,
                limit: Some(limit),
                filter: Some(filter),
            })
            .await
            .map_err(|e| match e {
                StorageError::Expired { .. } => refuse(
                    410,
                    "Expired",
                    "the continue token's revision has been compacted; list again without it",
                ),
                e => unavailable(e),
            })?;
        let next = match (r.more, r.items.last()) {
            (true, Some(last)) => Some(
                ContinueToken {
                    rv: r.revision,
                    start: last.key.clone(),
                }
                .encode(),
            ),
            _ => None,
        };
        Ok((r.items.iter().filter_map(with_revision).collect(), r.revision, next))
    }
}

/// The stored JSON with its revision as `resourceVersion`.
pub fn with_revision(kv: &KeyValue) -> Option<Value> {
    let mut v: Value = serde_json::from_slice(&kv.value).ok()?;
    v["metadata"]["resourceVersion"] = json!(kv.mod_revision.to_string());
    Some(v)
}

/// The labels of a stored object.
pub fn labels(v: &Value) -> Option<std::collections::BTreeMap<String, String>> {
    serde_json::from_value(v["metadata"]["labels"].clone()).ok()
}
