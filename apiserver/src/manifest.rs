//! Applying YAML manifests (one or many documents) through the registry, as the command line's
//! `apply` does: each object is created, or its spec replaced (labels and annotations merged)
//! when it exists. Every refusal is the registry's own, with its `metav1.Status`.

use kvcache_api::backend::BackendSpec;
use kvcache_api::binding::BindingSpec;
use kvcache_api::model_deployment::ModelDeploymentSpec;
use kvcache_api::pool::PoolSpec;
use kvcache_api::{Kind, Object, Scope};
use serde::Deserialize;

use crate::decode::{self, FieldValidation};
use crate::registry::generic::{WriteOptions, Written};
use crate::registry::{Registries, RegistryError, Store, Strategy};

/// What applying one document did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Created,
    Configured,
    Unchanged,
}

/// The result of one document.
#[derive(Debug)]
pub struct Applied {
    /// `kvcachebackend.worker.gpustack.ai/mooncake-dram`, as kubectl prints it.
    pub object: String,
    pub result: Result<Outcome, ApplyError>,
    pub warnings: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("{0}")]
    Document(String),
    /// Refused by the registry; `status` is the `metav1.Status` a server would answer.
    #[error("{message}")]
    Refused {
        message: String,
        code: u16,
        status: Box<k8s_openapi::apimachinery::pkg::apis::meta::v1::Status>,
    },
}

/// Splits a YAML stream into documents.
pub fn documents(text: &str) -> Result<Vec<serde_json::Value>, String> {
    let mut out = Vec::new();
    for doc in yaml_serde::Deserializer::from_str(text) {
        let value = serde_json::Value::deserialize(doc).map_err(|e| format!("not valid YAML: {e}"))?;
        if !value.is_null() {
            out.push(value);
        }
    }
    Ok(out)
}

/// Applies one decoded document. `namespace` is used when a namespaced object names none.
pub async fn apply(reg: &Registries, doc: serde_json::Value, namespace: &str, dry_run: bool) -> Applied {
    let kind = doc.get("kind").and_then(|k| k.as_str()).unwrap_or_default().to_owned();
    let api_version = doc
        .get("apiVersion")
        .and_then(|k| k.as_str())
        .unwrap_or_default()
        .to_owned();
    let name = doc
        .pointer("/metadata/name")
        .and_then(|n| n.as_str())
        .unwrap_or_default()
        .to_owned();
    if api_version != kvcache_api::API_VERSION {
        return Applied {
            object: format!("{kind}/{name}"),
            result: Err(ApplyError::Document(format!(
                "apiVersion {api_version:?} is not served here; this server serves {}",
                kvcache_api::API_VERSION
            ))),
            warnings: Vec::new(),
        };
    }
    let opts = WriteOptions { dry_run };
    match kind.as_str() {
        "KVCacheBackend" => apply_to::<_>(&reg.backends, doc, namespace, opts).await,
        "KVCachePool" => apply_to::<_>(&reg.pools, doc, namespace, opts).await,
        "KVCachePoolBinding" => apply_to::<_>(&reg.bindings, doc, namespace, opts).await,
        "ModelDeployment" => apply_to::<_>(&reg.model_deployments, doc, namespace, opts).await,
        other => Applied {
            object: format!("{other}/{name}"),
            result: Err(ApplyError::Document(format!(
                "kind {other:?} is not served here; this server serves KVCacheBackend, KVCachePool, KVCachePoolBinding and ModelDeployment"
            ))),
            warnings: Vec::new(),
        },
    }
}

async fn apply_to<S: Strategy>(
    store: &Store<S>,
    doc: serde_json::Value,
    namespace: &str,
    opts: WriteOptions,
) -> Applied {
    let name = doc
        .pointer("/metadata/name")
        .and_then(|n| n.as_str())
        .unwrap_or_default()
        .to_owned();
    let label = format!("{}.{}/{name}", S::Kind::SINGULAR, kvcache_api::GROUP);
    let mut warnings = Vec::new();
    let obj: Object<S::Kind> = match decode::from_value(doc, FieldValidation::Strict) {
        Ok(d) => {
            warnings.extend(d.warnings);
            d.value
        }
        Err(e) => return refused::<S::Kind>(label, &name, RegistryError::from_decode::<S::Kind>(&name, e), warnings),
    };
    let ns = match S::Kind::SCOPE {
        Scope::Namespaced => obj
            .metadata
            .namespace
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| namespace.to_owned()),
        Scope::Cluster => String::new(),
    };
    let result = match store.get(&ns, &name).await {
        Err(RegistryError::NotFound { .. }) => store.create(&ns, obj, opts).await.map(|w| (Outcome::Created, w)),
        Err(e) => Err(e),
        Ok(current) => {
            let rv = current.metadata.resource_version.clone();
            let mut desired = current.clone();
            desired.spec = obj.spec;
            merge(&mut desired.metadata.labels, obj.metadata.labels);
            merge(&mut desired.metadata.annotations, obj.metadata.annotations);
            desired.metadata.resource_version = rv;
            store
                .update(&ns, &name, desired, opts)
                .await
                .map(|w: Written<S::Kind>| {
                    let outcome = if w.object.metadata.resource_version == current.metadata.resource_version {
                        Outcome::Unchanged
                    } else {
                        Outcome::Configured
                    };
                    (outcome, w)
                })
        }
    };
    match result {
        Ok((outcome, written)) => {
            warnings.extend(written.warnings);
            Applied {
                object: label,
                result: Ok(outcome),
                warnings,
            }
        }
        Err(e) => refused::<S::Kind>(label, &name, e, warnings),
    }
}

fn merge(
    into: &mut Option<std::collections::BTreeMap<String, String>>,
    from: Option<std::collections::BTreeMap<String, String>>,
) {
    if let Some(from) = from {
        into.get_or_insert_with(Default::default).extend(from);
    }
}

fn refused<K: Kind>(label: String, name: &str, e: RegistryError, warnings: Vec<String>) -> Applied {
    let (code, status) = crate::status::from_error::<K>(name, &e);
    Applied {
        object: label,
        result: Err(ApplyError::Refused {
            message: status.message.clone().unwrap_or_default(),
            code,
            status: Box::new(status),
        }),
        warnings,
    }
}

/// Names a user may give for a kind on the command line: `kvcb`, `kvcachebackends`, ...
pub fn resolve_kind(name: &str) -> Option<&'static str> {
    fn names<K: Kind>() -> [&'static str; 4] {
        [K::KIND, K::PLURAL, K::SINGULAR, K::SHORT_NAME]
    }
    let n = name.split('.').next().unwrap_or(name).to_lowercase();
    let kinds: [[&'static str; 4]; 4] = [
        names::<BackendSpec>(),
        names::<PoolSpec>(),
        names::<BindingSpec>(),
        names::<ModelDeploymentSpec>(),
    ];
    kinds
        .into_iter()
        .find(|k| k.iter().any(|alias| alias.to_lowercase() == n))
        .map(|k| k[0])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_aliases() {
        assert_eq!(resolve_kind("kvcb"), Some("KVCacheBackend"));
        assert_eq!(resolve_kind("kvcachepoolbindings"), Some("KVCachePoolBinding"));
        assert_eq!(resolve_kind("md"), Some("ModelDeployment"));
        assert_eq!(resolve_kind("KVCachePool"), Some("KVCachePool"));
        assert_eq!(resolve_kind("pods"), None);
    }

    #[test]
    fn splits_documents() {
        let docs = documents("a: 1\n---\nb: 2\n---\n").unwrap();
        assert_eq!(docs.len(), 2);
    }
}
