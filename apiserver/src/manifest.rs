//! Applying YAML manifests (one or many documents) through the registry, as the command line's
//! `apply` does: each object is decoded strictly and created, or its spec replaced (labels and
//! annotations merged) when it exists. The kind comes from the table of kinds; every refusal is
//! the registry's own, with its `metav1.Status`.

use crate::decode::bounded::{self, Parsed};
use crate::registry::Registry;
pub use crate::registry::apply::Outcome;
use crate::registry::kinds;

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
    let Some(entry) = kinds::by_kind(&kind) else {
        return document_error(format!(
            "kind {kind:?} is not served here; this server serves {}",
            kinds::kind_names()
        ));
    };
    let object = format!("{}.{}/{name}", entry.singular, kvcache_api::GROUP);
    match (entry.apply)(reg, namespace, doc, dry_run).await {
        Ok((outcome, warnings)) => Applied {
            object,
            result: Ok(outcome),
            warnings,
        },
        Err(e) => {
            let crate::status::Refusal(code, status) = crate::status::for_resource(entry.plural, &name, &e);
            Applied {
                object,
                result: Err(ApplyError::Refused {
                    message: status.message.clone().unwrap_or_default(),
                    code,
                    status,
                }),
                warnings: Vec::new(),
            }
        }
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
