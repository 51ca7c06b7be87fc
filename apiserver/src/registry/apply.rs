//! The command line's `apply` of one manifest document, for one kind: decoded strictly, then
//! created, or its spec replaced (labels and annotations merged) when it exists. The offline CLI
//! reaches it through the table of kinds ([`super::kinds::KindEntry::apply`]); handlers never do.

use std::future::Future;
use std::pin::Pin;

use kvcache_api::{Kind, Scope};
use serde_json::Value;

use super::generic::WriteOptions;
use super::{KindRegistry, Registry, RegistryError, Strategy};
use crate::decode::FieldValidation;
use crate::decode::bounded::Parsed;

/// What applying one document did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Created,
    Configured,
    Unchanged,
}

/// What [`apply`] returns: the outcome and the warnings admission gave.
pub type Applying<'a> = Pin<Box<dyn Future<Output = Result<(Outcome, Vec<String>), RegistryError>> + Send + 'a>>;

/// Applies `doc` as an object of `S`'s kind; `namespace` is used when a namespaced object names
/// none.
pub fn apply<'a, S: Strategy>(reg: &'a Registry, namespace: &'a str, doc: Parsed, dry_run: bool) -> Applying<'a> {
    Box::pin(async move { apply_typed(&reg.for_kind::<S>(), namespace, doc, dry_run).await })
}

async fn apply_typed<S: Strategy>(
    registry: &KindRegistry<S>,
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
    let (obj, mut warnings) = super::dynamic::typed::<S::Kind>(&name, doc, FieldValidation::Strict)?;
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
    let (outcome, written) = match registry.get(&ns, &name).await {
        Err(RegistryError::NotFound { .. }) => (Outcome::Created, registry.create(&ns, obj, opts).await?),
        Err(e) => return Err(e),
        Ok(current) => {
            let mut desired = current.clone();
            desired.spec = obj.spec;
            merge(&mut desired.metadata.labels, obj.metadata.labels);
            merge(&mut desired.metadata.annotations, obj.metadata.annotations);
            let written = registry.update(&ns, &name, desired, opts).await?;
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
