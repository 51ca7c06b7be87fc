//! What may be stored: per-kind strategies in the shape of the Kubernetes apiserver's registry,
//! the generic store that runs them in a fixed order around a storage transaction, and the
//! registry of every kind (built from [`crate::registry::kinds`]) that handlers call.
//!
//! Create: prepare (system fields, clear status) → defaults → validate → inside the storage
//! transaction: cross-object admission (claims, references) → commit.
//! Update: the same, with `prepare_for_update` (keep status and system fields) and the object
//! rules judged against the exact stored version being replaced, inside a read-modify-write retry
//! loop; errors the stored object already had on fields the update left alone are dropped
//! (ratcheting, once, in [`generic`]). `/status` writes run the kind's [`StatusStrategy`].
//!
//! | module | owns |
//! |---|---|
//! | [`generic`] | the create/update/delete/get/list flow shared by every kind |
//! | [`dynamic`] | every kind behind one object-safe JSON trait, for handlers |
//! | [`patch`] | JSON patch, merge patch and apply configurations, within bounds |
//! | [`fieldmanager`] | `managedFields` and server-side apply |
//! | [`watch`] | watches of one kind: initial state, filtered typed events |
//! | [`field`] | field paths and Kubernetes-style field errors |
//! | [`errors`] | registry errors and the storage → API error seam |
//! | [`meta`] | `metadata` system fields and syntax |
//! | [`holders`] | what holds an object's deletion, and how a held deletion is told |
//! | [`grants`] | what a pool's grants become after a write that cuts them, for its warning |
//! | [`validation`] | syntax checks shared by the kinds |
//! | [`backend`], [`pool`], [`binding`], [`model_deployment`] | each kind's strategy and rules |
//!
//! Where is the immutable cache domain enforced? `binding::strategy`, in `validate_update`; the
//! once-per-backend domain claim is `binding::claims`, checked in the same storage transaction
//! as the write.

pub mod apply;
pub mod backend;
pub mod binding;
pub mod dynamic;
pub mod errors;
pub mod extra_args;
pub mod fieldmanager;
pub mod generic;
pub mod grants;
pub mod holders;
pub mod kinds;
pub mod meta;
pub mod model_deployment;
pub mod patch;
pub mod pool;
pub mod validation;
pub mod watch;

#[cfg(test)]
pub(crate) mod testing;

use std::sync::Arc;

use async_trait::async_trait;
use kvcache_api::{Kind, Object};

pub use self::dynamic::Resource;
pub use self::errors::RegistryError;
pub use self::generic::KindRegistry;
use self::kinds::{KINDS, KindEntry};
pub use crate::field::{ErrorList, Path};
use crate::storage::{Compare, KeyValue, ListRequest, Op, Storage};

/// What admission may consult besides the objects: the server's configuration.
#[derive(Clone, Debug, Default)]
pub struct Context {
    pub config: crate::config::Live,
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

/// A kind's rules. The hooks keep the names of the Kubernetes apiserver's strategies, and the
/// generic kind registry calls them in a fixed order.
#[async_trait]
pub trait Strategy: Default + Send + Sync + 'static {
    type Kind: Kind;
    /// The rules of the `/status` subresource.
    type Status: StatusStrategy<Kind = Self::Kind>;

    /// Clears what a client may not set on create. Status is the controller's.
    fn prepare_for_create(&self, obj: &mut Object<Self::Kind>) {
        obj.status = None;
    }

    /// Fills defaults, on create and on update.
    fn apply_defaults(&self, obj: &mut Object<Self::Kind>, ctx: &Context);

    /// Object-only rules. On update they judge the new object, and errors the stored object
    /// already had on fields the update did not change are dropped.
    fn validate(&self, obj: &Object<Self::Kind>, ctx: &Context) -> ErrorList;

    fn warnings_on_create(&self, _obj: &Object<Self::Kind>, _ctx: &Context) -> Vec<String> {
        Vec::new()
    }

    /// Keeps the stored status on a write to the main resource.
    fn prepare_for_update(&self, new: &mut Object<Self::Kind>, old: &Object<Self::Kind>) {
        new.status = old.status.clone();
    }

    /// The rules of an update only (what may not change), judged against the exact stored
    /// version. Only called when the spec changed: a metadata-only update (such as removing a
    /// finalizer) is never re-judged. These errors are never ratcheted.
    fn validate_update(&self, new: &Object<Self::Kind>, old: &Object<Self::Kind>, ctx: &Context) -> ErrorList;

    fn warnings_on_update(&self, _new: &Object<Self::Kind>, _old: &Object<Self::Kind>, _ctx: &Context) -> Vec<String> {
        Vec::new()
    }

    /// Warnings for a DELETE that left the object marked for deletion: what holds it (read
    /// from `storage`, outside any transaction: the warning informs, it decides nothing).
    async fn warnings_on_delete(
        &self,
        _obj: &Object<Self::Kind>,
        _storage: &dyn Storage,
    ) -> Result<Vec<String>, RegistryError> {
        Ok(Vec::new())
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

/// The rules of a kind's `/status` subresource: a status write keeps the stored spec and
/// metadata (only `managedFields` follow the request) and is judged by `validate_update`.
pub trait StatusStrategy: Default + Send + Sync + 'static {
    type Kind: Kind;

    /// Keeps everything but the status from the stored object.
    fn prepare_for_update(&self, new: &mut Object<Self::Kind>, old: &Object<Self::Kind>) {
        new.spec = old.spec.clone();
        let managed_fields = new.metadata.managed_fields.take();
        new.metadata = old.metadata.clone();
        new.metadata.managed_fields = managed_fields;
    }

    /// Rules of a status write.
    fn validate_update(&self, new: &Object<Self::Kind>, old: &Object<Self::Kind>) -> ErrorList;
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

/// Every kind's registry over one storage, in the order of [`KINDS`].
pub struct Registry {
    storage: Arc<dyn Storage>,
    ctx: Context,
    resources: Vec<(&'static KindEntry, Arc<dyn Resource>)>,
}

impl Registry {
    pub fn new(storage: Arc<dyn Storage>, ctx: Context) -> Self {
        let resources = KINDS
            .iter()
            .map(|k| (k, (k.resource)(storage.clone(), ctx.clone())))
            .collect();
        Registry {
            storage,
            ctx,
            resources,
        }
    }

    /// The resource served under `plural`.
    pub fn resource(&self, plural: &str) -> Option<(&'static KindEntry, &Arc<dyn Resource>)> {
        self.resources
            .iter()
            .find(|(k, _)| k.plural == plural)
            .map(|(k, r)| (*k, r))
    }

    /// The typed registry of one kind.
    pub fn for_kind<S: Strategy>(&self) -> KindRegistry<S> {
        KindRegistry::new(self.storage.clone(), S::default(), self.ctx.clone())
    }

    pub fn storage(&self) -> &Arc<dyn Storage> {
        &self.storage
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
