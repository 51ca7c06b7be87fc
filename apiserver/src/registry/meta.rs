//! `metadata` rules shared by every kind: system fields set on create and kept on update, and
//! the syntax of names, labels, annotations, finalizers and owner references.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kvcache_api::{Kind, Object, Scope};

use super::errors::RegistryError;
use super::validation;
use crate::field::{ErrorList, Path};

/// Largest total size of all annotations, as in Kubernetes.
const MAX_ANNOTATIONS_BYTES: usize = 256 * 1024;
const GENERATE_NAME_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// Now, at the seconds precision Kubernetes stores.
pub fn now() -> Time {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    Time(Timestamp::from_second(i64::try_from(secs).unwrap_or(0)).unwrap_or(Timestamp::UNIX_EPOCH))
}

/// Sets the system fields of an object being created, after checking what the client may not
/// set. `namespace` is the request's namespace (ignored for cluster-scoped kinds).
pub fn prepare_create<K: Kind>(obj: &mut Object<K>, namespace: &str) -> Result<(), RegistryError> {
    check_type_meta(obj)?;
    obj.api_version = kvcache_api::API_VERSION.to_owned();
    obj.kind = K::KIND.to_owned();
    let m = &mut obj.metadata;
    if m.resource_version.as_deref().is_some_and(|rv| !rv.is_empty()) {
        return Err(RegistryError::BadRequest(
            "resourceVersion should not be set on objects to be created".into(),
        ));
    }
    match K::SCOPE {
        Scope::Namespaced => match m.namespace.as_deref() {
            None | Some("") => m.namespace = Some(namespace.to_owned()),
            Some(ns) if ns != namespace => {
                return Err(RegistryError::BadRequest(
                    "the namespace of the provided object does not match the namespace sent on the request".into(),
                ));
            }
            Some(_) => {}
        },
        Scope::Cluster => m.namespace = None,
    }
    if m.name.as_deref().unwrap_or_default().is_empty()
        && let Some(prefix) = m.generate_name.as_deref().filter(|p| !p.is_empty())
    {
        m.name = Some(format!("{prefix}{}", random_suffix()));
    }
    m.uid = Some(uuid::Uuid::new_v4().to_string());
    m.creation_timestamp = Some(now());
    m.generation = Some(1);
    m.deletion_timestamp = None;
    m.deletion_grace_period_seconds = None;
    m.self_link = None;
    Ok(())
}

/// An object sent to this kind's endpoint names this kind, or nothing (then it is filled in):
/// `apiVersion: v1` or `kind: Pod` is refused, never rewritten.
fn check_type_meta<K: Kind>(obj: &Object<K>) -> Result<(), RegistryError> {
    if !obj.api_version.is_empty() && obj.api_version != kvcache_api::API_VERSION {
        return Err(RegistryError::BadRequest(format!(
            "the API version in the data ({}) does not match the expected API version ({})",
            obj.api_version,
            kvcache_api::API_VERSION
        )));
    }
    if !obj.kind.is_empty() && obj.kind != K::KIND {
        return Err(RegistryError::BadRequest(format!(
            "the kind in the data ({}) does not match the expected kind ({}) of this endpoint",
            obj.kind,
            K::KIND
        )));
    }
    Ok(())
}

fn random_suffix() -> String {
    uuid::Uuid::new_v4()
        .as_bytes()
        .iter()
        .take(5)
        .map(|b| GENERATE_NAME_ALPHABET[*b as usize % GENERATE_NAME_ALPHABET.len()] as char)
        .collect()
}

/// Keeps the fields only the server sets from the stored object. A different `uid` means the
/// client edited another incarnation of the object: a conflict.
pub fn prepare_update<K: Kind>(new: &mut Object<K>, old: &Object<K>) -> Result<(), RegistryError> {
    check_type_meta(new)?;
    new.api_version = kvcache_api::API_VERSION.to_owned();
    new.kind = K::KIND.to_owned();
    let (n, o) = (&mut new.metadata, &old.metadata);
    if let Some(uid) = n.uid.as_deref().filter(|u| !u.is_empty())
        && Some(uid) != o.uid.as_deref()
    {
        return Err(RegistryError::precondition::<K>(
            old.name(),
            "UID",
            uid,
            o.uid.as_deref(),
        ));
    }
    n.uid = o.uid.clone();
    n.name = o.name.clone();
    n.namespace = o.namespace.clone();
    n.creation_timestamp = o.creation_timestamp.clone();
    n.deletion_timestamp = o.deletion_timestamp.clone();
    n.deletion_grace_period_seconds = o.deletion_grace_period_seconds;
    n.generation = o.generation;
    n.generate_name = o.generate_name.clone();
    n.self_link = None;
    Ok(())
}

/// Syntax of `metadata` on create and update.
pub fn validate<K: Kind>(m: &ObjectMeta) -> ErrorList {
    let mut errs = ErrorList::new();
    let path = Path::new("metadata");
    match m.name.as_deref() {
        None | Some("") => errs.required(&path.child("name"), "name or generateName is required"),
        Some(name) => {
            if let Err(e) = validation::dns1123_subdomain(name) {
                errs.invalid(&path.child("name"), name, e);
            }
        }
    }
    if K::SCOPE == Scope::Namespaced {
        match m.namespace.as_deref() {
            None | Some("") => errs.required(&path.child("namespace"), "a namespaced object needs a namespace"),
            Some(ns) => {
                if let Err(e) = validation::dns1123_label(ns) {
                    errs.invalid(&path.child("namespace"), ns, e);
                }
            }
        }
    }
    if let Some(labels) = &m.labels {
        validation::labels(labels, &path.child("labels"), &mut errs);
    }
    if let Some(annotations) = &m.annotations {
        let p = path.child("annotations");
        let mut total = 0;
        for (k, v) in annotations {
            total += k.len() + v.len();
            if let Err(e) = validation::qualified_name(&k.to_lowercase()) {
                errs.invalid(&p, k, e);
            }
        }
        if total > MAX_ANNOTATIONS_BYTES {
            errs.too_long(&p, MAX_ANNOTATIONS_BYTES);
        }
    }
    if let Some(finalizers) = &m.finalizers {
        let p = path.child("finalizers");
        for (i, f) in finalizers.iter().enumerate() {
            if let Err(e) = validation::qualified_name(f) {
                errs.invalid(&p.index(i), f, e);
            }
        }
    }
    if let Some(owners) = &m.owner_references {
        let p = path.child("ownerReferences");
        let mut controllers = 0;
        for (i, o) in owners.iter().enumerate() {
            let pi = p.index(i);
            for (field, value) in [
                ("apiVersion", &o.api_version),
                ("kind", &o.kind),
                ("name", &o.name),
                ("uid", &o.uid),
            ] {
                if value.is_empty() {
                    errs.required(&pi.child(field), "owner references name their owner completely");
                }
            }
            controllers += usize::from(o.controller == Some(true));
        }
        if controllers > 1 {
            errs.invalid(&p, controllers, "only one reference can have Controller set to true");
        }
    }
    errs
}

/// Finalizers cannot be added once deletion has started.
pub fn validate_update<K: Kind>(new: &ObjectMeta, old: &ObjectMeta) -> ErrorList {
    let mut errs = validate::<K>(new);
    if old.deletion_timestamp.is_some() {
        let old_f = old.finalizers.as_deref().unwrap_or_default();
        for f in new.finalizers.as_deref().unwrap_or_default() {
            if !old_f.contains(f) {
                errs.forbidden(
                    &Path::new("metadata").child("finalizers"),
                    format!("no new finalizers can be added if the object is being deleted, found new finalizer {f:?}"),
                );
            }
        }
    }
    errs
}

pub fn finalizers(m: &ObjectMeta) -> &[String] {
    m.finalizers.as_deref().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvcache_api::backend::BackendSpec;
    use kvcache_api::binding::BindingSpec;

    #[test]
    fn create_sets_system_fields_and_checks_namespace() {
        let mut b = Object::<BindingSpec>::new("x", BindingSpec::default());
        prepare_create(&mut b, "team-a").unwrap();
        assert_eq!(b.metadata.namespace.as_deref(), Some("team-a"));
        assert!(b.metadata.uid.is_some() && b.metadata.creation_timestamp.is_some());
        assert_eq!(b.metadata.generation, Some(1));
        b.metadata.namespace = Some("other".into());
        b.metadata.uid = None;
        assert!(matches!(
            prepare_create(&mut b, "team-a"),
            Err(RegistryError::BadRequest(_))
        ));

        let mut c = Object::<BackendSpec>::new("", BackendSpec::default());
        c.metadata.generate_name = Some("gen-".into());
        c.metadata.namespace = Some("ignored".into());
        prepare_create(&mut c, "").unwrap();
        assert!(c.name().starts_with("gen-") && c.name().len() == 9);
        assert_eq!(c.metadata.namespace, None);

        let mut d = Object::<BackendSpec>::new("d", BackendSpec::default());
        d.metadata.resource_version = Some("5".into());
        assert!(matches!(prepare_create(&mut d, ""), Err(RegistryError::BadRequest(_))));
    }

    #[test]
    fn metadata_syntax() {
        let mut m = ObjectMeta {
            name: Some("Bad_Name".into()),
            labels: Some([("ok/key".to_string(), "-bad".to_string())].into()),
            finalizers: Some(vec!["not a finalizer".into()]),
            ..Default::default()
        };
        let errs = validate::<BindingSpec>(&m);
        let fields: Vec<_> = errs.iter().map(|e| e.field.as_str().to_owned()).collect();
        assert_eq!(
            fields,
            [
                "metadata.name",
                "metadata.namespace",
                "metadata.labels[ok/key]",
                "metadata.finalizers[0]"
            ]
        );
        m.name = Some("ok".into());
        m.namespace = Some("ns".into());
        m.labels = None;
        m.finalizers = Some(vec!["gpustack.ai/controlled".into()]);
        assert!(validate::<BindingSpec>(&m).is_empty());
    }

    #[test]
    fn no_new_finalizers_while_deleting() {
        let old = ObjectMeta {
            name: Some("a".into()),
            deletion_timestamp: Some(now()),
            finalizers: Some(vec!["a.io/x".into()]),
            ..Default::default()
        };
        let mut new = old.clone();
        new.finalizers = Some(vec![]);
        assert!(
            validate_update::<BackendSpec>(&new, &old).is_empty(),
            "removing is fine"
        );
        new.finalizers = Some(vec!["a.io/x".into(), "a.io/y".into()]);
        assert_eq!(validate_update::<BackendSpec>(&new, &old).len(), 1);
    }
}
