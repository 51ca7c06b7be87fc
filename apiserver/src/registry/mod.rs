//! What may be stored: per-kind strategies in the shape of the Kubernetes apiserver's registry,
//! and the generic store that runs them in a fixed order around a storage transaction.
//!
//! Create: prepare (system fields, clear status) → defaults → validate → inside the storage
//! transaction: cross-object admission (claims, references) → commit.
//! Update: the same, with `prepare_for_update` (keep status and system fields), `validate_update`
//! judging the exact stored version being replaced, inside a read-modify-write retry loop.
//!
//! | module | owns |
//! |---|---|
//! | [`generic`] | the create/update/delete/get/list flow shared by every kind |
//! | [`field`] | field paths and Kubernetes-style field errors |
//! | [`errors`] | registry errors and the storage → API error seam |
//! | [`meta`] | `metadata` system fields and syntax |
//! | [`validation`] | syntax checks shared by the kinds |
//! | [`backend`], [`pool`], [`binding`], [`model_deployment`] | each kind's strategy |
//!
//! Where is the immutable cache domain enforced? `binding::strategy`, in `validate_update`; the
//! once-per-backend domain claim is `binding::claims`, checked in the same storage transaction
//! as the write.

pub mod backend;
pub mod binding;
pub mod errors;
pub mod field;
pub mod generic;
pub mod meta;
pub mod model_deployment;
pub mod pool;
pub mod validation;

#[cfg(test)]
mod testing;

use std::sync::Arc;

use async_trait::async_trait;
use kvcache_api::{Kind, Object};

pub use self::errors::RegistryError;
pub use self::field::{ErrorList, Path};
pub use self::generic::Store;
use crate::config::Config;
use crate::storage::{Compare, KeyValue, ListRequest, Op, Storage};

/// What admission may consult besides the objects: the server's configuration.
#[derive(Clone, Debug, Default)]
pub struct Context {
    pub config: Arc<Config>,
}

/// The change being admitted.
#[derive(Clone, Copy, Debug)]
pub enum Change<'a, K: Kind> {
    Create(&'a Object<K>),
    Update {
        new: &'a Object<K>,
        old: &'a Object<K>,
    },
    /// The object is about to be removed from storage (its last finalizer is gone).
    Delete(&'a Object<K>),
}

/// The outcome of cross-object admission: refusals, extra writes to commit atomically with the
/// object (claims), and warnings for the client.
#[derive(Clone, Debug, Default)]
pub struct Admission {
    pub errors: ErrorList,
    pub ops: Vec<Op>,
    pub warnings: Vec<String>,
}

/// A kind's rules. The hooks keep the names of the Kubernetes apiserver's strategies.
#[async_trait]
pub trait Strategy: Send + Sync + 'static {
    type Kind: Kind;

    /// Clears what a client may not set on create. Status is the controller's.
    fn prepare_for_create(&self, obj: &mut Object<Self::Kind>) {
        obj.status = None;
    }

    /// Fills defaults, on create and on update.
    fn apply_defaults(&self, obj: &mut Object<Self::Kind>, ctx: &Context);

    /// Object-only rules for a new object.
    fn validate(&self, obj: &Object<Self::Kind>, ctx: &Context) -> ErrorList;

    fn warnings_on_create(&self, _obj: &Object<Self::Kind>, _ctx: &Context) -> Vec<String> {
        Vec::new()
    }

    /// Keeps the stored status on a write to the main resource.
    fn prepare_for_update(&self, new: &mut Object<Self::Kind>, old: &Object<Self::Kind>) {
        new.status = old.status.clone();
    }

    /// Object-only rules for an update, judged against the exact stored version. Only called
    /// when the spec changed: a metadata-only update (such as removing a finalizer) is never
    /// re-judged.
    fn validate_update(&self, new: &Object<Self::Kind>, old: &Object<Self::Kind>, ctx: &Context) -> ErrorList;

    fn warnings_on_update(&self, _new: &Object<Self::Kind>, _old: &Object<Self::Kind>, _ctx: &Context) -> Vec<String> {
        Vec::new()
    }

    /// Rules of a status write (the `/status` subresource).
    fn validate_status_update(&self, _new: &Object<Self::Kind>, _old: &Object<Self::Kind>) -> ErrorList {
        ErrorList::new()
    }

    /// Cross-object rules, run inside the storage transaction: every read goes through `reads`
    /// so that the commit fails (and admission re-runs) if any of it changed.
    async fn admit(
        &self,
        _change: Change<'_, Self::Kind>,
        _reads: &mut Reads<'_>,
        _ctx: &Context,
    ) -> Result<Admission, RegistryError> {
        Ok(Admission::default())
    }
}

/// Reads made by admission, remembered as compares of the transaction that follows.
pub struct Reads<'a> {
    storage: &'a dyn Storage,
    compares: Vec<Compare>,
}

impl<'a> Reads<'a> {
    pub fn new(storage: &'a dyn Storage) -> Self {
        Reads {
            storage,
            compares: Vec::new(),
        }
    }

    /// Reads a key; the transaction will require it to be unchanged.
    pub async fn get(&mut self, key: &str) -> Result<Option<KeyValue>, RegistryError> {
        let kv = self.storage.get(key).await?;
        let revision = kv.as_ref().map_or(0, |kv| kv.mod_revision);
        if !self
            .compares
            .iter()
            .any(|c| matches!(c, Compare::ModRevision { key: k, .. } if k == key))
        {
            self.compares.push(Compare::ModRevision {
                key: key.to_owned(),
                revision,
            });
        }
        Ok(kv)
    }

    /// Reads an object of kind `K`.
    pub async fn object<K: Kind>(&mut self, namespace: &str, name: &str) -> Result<Option<Object<K>>, RegistryError> {
        let key = crate::storage::keys::object_key::<K>(namespace, name);
        self.get(&key).await?.map(|kv| decode::<K>(&kv)).transpose()
    }

    /// Reads every key under `prefix`; the transaction will require that none changed or
    /// appeared since.
    pub async fn list(&mut self, prefix: &str) -> Result<Vec<KeyValue>, RegistryError> {
        let page = self
            .storage
            .list(ListRequest {
                prefix: prefix.to_owned(),
                ..Default::default()
            })
            .await?;
        self.compares.push(Compare::NoneNewer {
            prefix: prefix.to_owned(),
            revision: page.revision,
        });
        Ok(page.items)
    }

    pub fn into_compares(self) -> Vec<Compare> {
        self.compares
    }
}

/// [`ErrorList::ratchet`] over two objects: errors the stored object already had on fields the
/// update did not change are dropped.
pub fn ratchet<K: Kind>(new_errors: ErrorList, old_errors: &ErrorList, new: &Object<K>, old: &Object<K>) -> ErrorList {
    let (n, o) = (
        serde_json::to_value(new).unwrap_or_default(),
        serde_json::to_value(old).unwrap_or_default(),
    );
    new_errors.ratchet(old_errors, &n, &o)
}

/// The stored bytes of an object (its `resourceVersion` is the key's revision, not stored).
pub fn encode<K: Kind>(obj: &Object<K>) -> Result<Vec<u8>, RegistryError> {
    let mut copy = obj.clone();
    copy.metadata.resource_version = None;
    serde_json::to_vec(&copy)
        .map_err(|e| RegistryError::Internal(format!("encoding {} {:?}: {e}", K::KIND, obj.name())))
}

/// An object from its stored bytes, with `resourceVersion` set from the key's revision.
pub fn decode<K: Kind>(kv: &KeyValue) -> Result<Object<K>, RegistryError> {
    let mut obj: Object<K> = serde_json::from_slice(&kv.value)
        .map_err(|e| RegistryError::Internal(format!("the stored object at {} cannot be decoded: {e}", kv.key)))?;
    obj.metadata.resource_version = Some(kv.mod_revision.to_string());
    Ok(obj)
}

/// The stored JSON of `kv` with `metadata.resourceVersion` set from the key's revision, without
/// decoding it. [`encode`] writes `metadata` as an object right after `apiVersion` and `kind`.
pub fn encoded_with_revision(kv: &KeyValue) -> Result<Vec<u8>, RegistryError> {
    const META: &[u8] = b"\"metadata\":{";
    let at = kv
        .value
        .windows(META.len())
        .position(|w| w == META)
        .ok_or_else(|| RegistryError::Internal(format!("the stored object at {} has no metadata", kv.key)))?
        + META.len();
    let rv = format!("\"resourceVersion\":\"{}\"", kv.mod_revision);
    let mut out = Vec::with_capacity(kv.value.len() + rv.len() + 1);
    out.extend_from_slice(&kv.value[..at]);
    out.extend_from_slice(rv.as_bytes());
    if kv.value.get(at) != Some(&b'}') {
        out.push(b',');
    }
    out.extend_from_slice(&kv.value[at..]);
    Ok(out)
}

/// The four stores over one storage.
pub struct Registries {
    pub backends: Store<backend::BackendStrategy>,
    pub pools: Store<pool::PoolStrategy>,
    pub bindings: Store<binding::BindingStrategy>,
    pub model_deployments: Store<model_deployment::ModelDeploymentStrategy>,
}

impl Registries {
    pub fn new(storage: Arc<dyn Storage>, ctx: Context) -> Self {
        Registries {
            backends: Store::new(storage.clone(), backend::BackendStrategy, ctx.clone()),
            pools: Store::new(storage.clone(), pool::PoolStrategy, ctx.clone()),
            bindings: Store::new(storage.clone(), binding::BindingStrategy, ctx.clone()),
            model_deployments: Store::new(storage, model_deployment::ModelDeploymentStrategy, ctx),
        }
    }
}

#[cfg(test)]
mod encoding_tests {
    use super::*;
    use kvcache_api::pool::PoolSpec;

    #[test]
    fn spliced_json_equals_the_decoded_object() {
        for labels in [None, Some([("a".to_owned(), "b".to_owned())].into_iter().collect())] {
            let mut obj = Object::<PoolSpec>::new("p", PoolSpec::default());
            obj.metadata.labels = labels;
            let kv = KeyValue {
                key: "/k".into(),
                value: encode(&obj).unwrap().into(),
                create_revision: 3,
                mod_revision: 7,
            };
            let spliced: serde_json::Value = serde_json::from_slice(&encoded_with_revision(&kv).unwrap()).unwrap();
            assert_eq!(spliced, serde_json::to_value(decode::<PoolSpec>(&kv).unwrap()).unwrap());
            assert_eq!(spliced["metadata"]["resourceVersion"], "7");
        }
        let empty_meta = KeyValue {
            key: "/k".into(),
            value: br#"{"apiVersion":"v","kind":"K","metadata":{},"spec":{}}"#.to_vec().into(),
            create_revision: 1,
            mod_revision: 2,
        };
        let v: serde_json::Value = serde_json::from_slice(&encoded_with_revision(&empty_meta).unwrap()).unwrap();
        assert_eq!(v["metadata"]["resourceVersion"], "2");
    }
}
