//! What a registry operation can refuse with, and the seam from storage errors to API errors.
//! `crate::status` turns each variant into a `metav1.Status`.

use kvcache_api::{GROUP, Kind};

use crate::decode::DecodeError;
use crate::field::ErrorList;
use crate::storage::StorageError;

/// `kvcachebackends.worker.gpustack.ai`: how Kubernetes names a resource in messages.
pub fn qualified_resource<K: Kind>() -> String {
    format!("{}.{GROUP}", K::PLURAL)
}

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// 400: the request itself is malformed.
    #[error("{0}")]
    BadRequest(String),
    /// 422: field errors. `kind` is `KVCacheBackend`.
    #[error("{kind}.{GROUP} {name:?} is invalid: {errors}")]
    Invalid {
        kind: &'static str,
        name: String,
        errors: ErrorList,
    },
    /// 404.
    #[error("{resource} {name:?} not found")]
    NotFound { resource: String, name: String },
    /// 409: create of a name that exists.
    #[error("{resource} {name:?} already exists")]
    AlreadyExists { resource: String, name: String },
    /// 409: a precondition (resourceVersion, uid) did not hold.
    #[error("Operation cannot be fulfilled on {resource} {name:?}: {message}")]
    Conflict {
        resource: String,
        name: String,
        message: String,
    },
    /// 409: server-side apply would change fields other managers own. `conflicts` holds
    /// `(field, message)` pairs, such as `(".spec.size", "conflict with \"a\" using ...")`.
    #[error("{message}")]
    ApplyConflict {
        resource: String,
        name: String,
        message: String,
        conflicts: Vec<(String, String)>,
    },
    /// 413: the request would build more than the server bounds (a JSON patch past 10,000
    /// operations or copying too much, a YAML alias bomb).
    #[error("{0}")]
    TooLarge(String),
    /// 504: a `resourceVersion` newer than the store after waiting for it.
    #[error("Too large resource version: {0}")]
    TooLargeResourceVersion(u64),
    /// 410: a continue token or revision that was compacted.
    #[error("{0}")]
    Expired(String),
    /// 503: storage cannot serve the request now.
    #[error("{0}")]
    Unavailable(String),
    /// 500.
    #[error("Internal error occurred: {0}")]
    Internal(String),
}

impl RegistryError {
    pub fn invalid<K: Kind>(name: &str, errors: ErrorList) -> Self {
        RegistryError::Invalid {
            kind: K::KIND,
            name: name.to_owned(),
            errors,
        }
    }

    pub fn not_found<K: Kind>(name: &str) -> Self {
        RegistryError::NotFound {
            resource: qualified_resource::<K>(),
            name: name.to_owned(),
        }
    }

    pub fn already_exists<K: Kind>(name: &str) -> Self {
        RegistryError::AlreadyExists {
            resource: qualified_resource::<K>(),
            name: name.to_owned(),
        }
    }

    pub fn conflict<K: Kind>(name: &str, message: impl Into<String>) -> Self {
        RegistryError::Conflict {
            resource: qualified_resource::<K>(),
            name: name.to_owned(),
            message: message.into(),
        }
    }

    /// A precondition (`UID`, `ResourceVersion`) that names another version than the stored one.
    pub fn precondition<K: Kind>(name: &str, what: &str, wanted: &str, stored: Option<&str>) -> Self {
        Self::conflict::<K>(
            name,
            format!(
                "Precondition failed: {what} in precondition: {wanted}, {what} in object meta: {}",
                stored.unwrap_or_default()
            ),
        )
    }

    /// The standard optimistic-concurrency conflict.
    pub fn modified<K: Kind>(name: &str) -> Self {
        Self::conflict::<K>(
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// Converts a decode failure of a request body for kind `K`.
    pub fn from_decode<K: Kind>(name: &str, e: DecodeError) -> Self {
        match e {
            DecodeError::BadRequest(msg) => RegistryError::BadRequest(format!(
                "{} in version \"v1\" cannot be handled as a {}: {msg}",
                K::KIND,
                K::KIND
            )),
            DecodeError::Invalid(errors) => Self::invalid::<K>(name, errors),
            DecodeError::TooLarge(msg) => RegistryError::TooLarge(msg),
        }
    }
}

impl From<StorageError> for RegistryError {
    fn from(e: StorageError) -> Self {
        match e {
            StorageError::Expired { .. } => RegistryError::Expired(format!(
                "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter. ({e})"
            )),
            StorageError::Unavailable(_) | StorageError::NoSpace(_) => RegistryError::Unavailable(e.to_string()),
            StorageError::InvalidRequest(_) => RegistryError::BadRequest(e.to_string()),
            StorageError::Corrupt(_) | StorageError::Io { .. } => RegistryError::Internal(e.to_string()),
        }
    }
}
