//! Applying YAML manifests (one or many documents) through the registry, as the command line's
//! `apply` does: each object is decoded strictly and created, or its spec replaced (labels and
//! annotations merged) when it exists. The kind comes from the table of kinds; every refusal is
//! the registry's own, with its `metav1.Status`.

use kvcache_api::{Kind, Scope};
use serde_json::Value;

use crate::decode::FieldValidation;
use crate::decode::bounded::{self, Parsed};
use crate::kinds;
use crate::registry::generic::WriteOptions;
use crate::registry::{Registry, RegistryError, Store, Strategy};

/// What applying one document did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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

/// Splits a YAML stream into documents, within the bounds of every request body.
pub fn documents(text: &str) -> Result<Vec<Parsed>, String> {
    bounded::yaml_documents(text).map_err(|e| e.to_string())
}

/// Applies one document. `namespace` is used when a namespaced object names none.
pub async fn apply(reg: &Registry, doc: Parsed, namespace: &str, dry_run: bool) -> Applied {
    let field = |f: &str| {
        doc.value
            .pointer(f)
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_owned()
    };
    let (kind, api_version, name) = (field("/kind"), field("/apiVersion"), field("/metadata/name"));
    let document_error = |message: String| Applied {
        object: format!("{kind}/{name}"),
        result: Err(ApplyError::Document(message)),
        warnings: Vec::new(),
    };
    if api_version != kvcache_api::API_VERSION {
        return document_error(format!(
            "apiVersion {api_version:?} is not served here; this server serves {}",
            kvcache_api::API_VERSION
        ));
    }
    let Some((entry, resource)) = kinds::by_kind(&kind).and_then(|k| reg.resource(k.plural)) else {
        return document_error(format!(
            "kind {kind:?} is not served here; this server serves {}",
            kinds::kind_names()
        ));
    };
    let object = format!("{}.{}/{name}", entry.singular, kvcache_api::GROUP);
    match resource.apply_manifest(namespace, doc, dry_run).await {
        Ok((outcome, warnings)) => Applied {
            object,
            result: Ok(outcome),
            warnings,
        },
        Err(e) => {
            let (code, status) = crate::status::for_resource(entry.plural, &name, &e);
            Applied {
                object,
                result: Err(ApplyError::Refused {
                    message: status.message.clone().unwrap_or_default(),
                    code,
                    status: Box::new(status),
                }),
                warnings: Vec::new(),
            }
        }
    }
}

/// The typed half of [`apply`], for one kind: decoded strictly, created, or its spec replaced
/// with labels and annotations merged.
pub(crate) async fn apply_typed<S: Strategy>(
    store: &Store<S>,
    namespace: &str,
    doc: Parsed,
    dry_run: bool,
) -> Result<(Outcome, Vec<String>), RegistryError> {
    let name = doc
        .value
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let (obj, mut warnings) = crate::registry::dynamic::typed::<S::Kind>(&name, doc, FieldValidation::Strict)?;
    let ns = match <S::Kind as Kind>::SCOPE {
        Scope::Namespaced => obj
            .metadata
            .namespace
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| namespace.to_owned()),
        Scope::Cluster => String::new(),
    };
    let opts = WriteOptions { dry_run };
    let (outcome, written) = match store.get(&ns, &name).await {
        Err(RegistryError::NotFound { .. }) => (Outcome::Created, store.create(&ns, obj, opts).await?),
        Err(e) => return Err(e),
        Ok(current) => {
            let mut desired = current.clone();
            desired.spec = obj.spec;
            merge(&mut desired.metadata.labels, obj.metadata.labels);
            merge(&mut desired.metadata.annotations, obj.metadata.annotations);
            let written = store.update(&ns, &name, desired, opts).await?;
            let outcome = if written.object.metadata.resource_version == current.metadata.resource_version {
                Outcome::Unchanged
            } else {
                Outcome::Configured
            };
            (outcome, written)
        }
    };
    warnings.extend(written.warnings);
    Ok((outcome, warnings))
}

fn merge(
    into: &mut Option<std::collections::BTreeMap<String, String>>,
    from: Option<std::collections::BTreeMap<String, String>>,
) {
    if let Some(from) = from {
        into.get_or_insert_with(Default::default).extend(from);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_documents() {
        let docs = documents("a: 1\n---\nb: 2\n---\n").unwrap();
        assert_eq!(docs.len(), 2);
    }
}
