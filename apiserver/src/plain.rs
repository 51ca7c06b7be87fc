//! Built-in kinds served in direct mode, stored as the JSON clients read: core `v1` Events
//! ([`crate::events`]) and `coordination.k8s.io/v1` Leases ([`crate::leases`]). In a cluster
//! kube-apiserver serves both instead. This module holds what they share: where an object is
//! stored, reading one with its revision as `resourceVersion`, pages of a prefix, continue
//! tokens, and the refusal type their handlers turn into a `Status`.

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use serde_json::{Value, json};

use crate::status::failure;
use crate::storage::{KeyValue, ListRequest, Storage};

/// Largest page of a list.
pub const MAX_LIMIT: usize = 500;

/// A refusal: its HTTP code and Status.
#[derive(Debug)]
pub struct Refusal(pub u16, pub Box<Status>);

pub fn refuse(code: u16, reason: &str, message: impl Into<String>) -> Refusal {
    Refusal(code, Box::new(failure(code, reason, message)))
}

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

    /// A page of the objects `keep` admits, the list's revision and the key to continue after.
    pub async fn list(
        &self,
        storage: &Arc<dyn Storage>,
        namespace: Option<&str>,
        keep: Arc<dyn Fn(&Value) -> bool + Send + Sync>,
        limit: Option<usize>,
        continue_after: Option<String>,
    ) -> Result<(Vec<Value>, u64, Option<String>), Refusal> {
        let filter = Arc::new(move |kv: &KeyValue| serde_json::from_slice::<Value>(&kv.value).is_ok_and(|v| keep(&v)));
        let limit = limit.unwrap_or(MAX_LIMIT).clamp(1, MAX_LIMIT);
        let r = storage
            .list(ListRequest {
                prefix: self.prefix(namespace),
                revision: None,
                start_after: continue_after,
                limit: Some(limit),
                filter: Some(filter),
            })
            .await
            .map_err(unavailable)?;
        let next = if r.more {
            r.items.last().map(|kv| kv.key.clone())
        } else {
            None
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

/// The continue token of a storage key.
pub fn continue_token(key: &str) -> String {
    base64::Engine::encode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, key)
}

/// The storage key a continue token names (empty if it is not one of ours).
pub fn continue_key(token: &str) -> String {
    let bytes = base64::Engine::decode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, token).unwrap_or_default();
    String::from_utf8(bytes).unwrap_or_default()
}

/// The labels of a stored object.
pub fn labels(v: &Value) -> Option<std::collections::BTreeMap<String, String>> {
    serde_json::from_value(v["metadata"]["labels"].clone()).ok()
}
