//! The hooks of `KVCachePoolBinding`: the default domain name, the pool and domain fixed for
//! the Binding's life, the domain claim inside the storage transaction, the warning of a held
//! DELETE, and `/status`.

use async_trait::async_trait;
use kvcache_api::binding::{BindingSpec, DEFAULT_DOMAIN, KVCachePoolBinding};

use super::{claims, validation};
use crate::field::{ErrorList, Path};
use crate::registry::{Admission, Change, Context, Reads, RegistryError, StatusStrategy, Strategy, holders};
use crate::storage::Storage;

#[derive(Debug, Default)]
pub struct BindingStrategy;

#[async_trait]
impl Strategy for BindingStrategy {
    type Kind = BindingSpec;
    type Status = BindingStatusStrategy;

    fn apply_defaults(&self, obj: &mut KVCachePoolBinding, _ctx: &Context) {
        if let Some(d) = obj.spec.domain.as_mut() {
            d.name.get_or_insert_with(|| DEFAULT_DOMAIN.to_owned());
        }
    }

    fn validate(&self, obj: &KVCachePoolBinding, ctx: &Context) -> ErrorList {
        validation::validate(obj, ctx)
    }

    /// The pool and every field of the domain are fixed: the domain is the store's tenant and
    /// the blocks' format. Enforced even while the Binding is being deleted.
    fn validate_update(&self, new: &KVCachePoolBinding, old: &KVCachePoolBinding, _ctx: &Context) -> ErrorList {
        let mut errs = ErrorList::new();
        let spec = Path::new("spec");
        if new.spec.pool_name() != old.spec.pool_name() {
            errs.forbidden(
                &spec.child("poolRef").child("name"),
                "the pool cannot change: the cached bytes and the quota stay on the old pool's store; create a new Binding instead",
            );
        }
        let (n, o) = (
            new.spec.domain.clone().unwrap_or_default(),
            old.spec.domain.clone().unwrap_or_default(),
        );
        let dp = spec.child("domain");
        if n.name != o.name {
            errs.forbidden(
                &dp.child("name"),
                "the domain name is the store tenant that holds this cache and its quota; renaming would abandon both. Create a new Binding instead",
            );
        }
        if n.block_size != o.block_size {
            errs.forbidden(
                &dp.child("blockSize"),
                "cached blocks were written at the old block size and would be read wrongly; create a new Binding (with a new domain) instead",
            );
        }
        if n.dtype != o.dtype {
            errs.forbidden(
                &dp.child("dtype"),
                "cached blocks were written in the old dtype and would be read as wrong tensors without any error; create a new Binding (with a new domain) instead",
            );
        }
        errs
    }

    async fn admit(
        &self,
        change: Change<'_, BindingSpec>,
        reads: &mut Reads<'_>,
        _ctx: &Context,
    ) -> Result<Admission, RegistryError> {
        claims::admit(change, reads).await
    }

    async fn warnings_on_delete(
        &self,
        obj: &KVCachePoolBinding,
        storage: &dyn Storage,
    ) -> Result<Vec<String>, RegistryError> {
        let deployments = holders::of_binding(storage, obj.namespace(), obj.name()).await?;
        Ok(Vec::from_iter((!deployments.is_empty()).then(|| {
            holders::delete_warning("KVCachePoolBinding", obj.name(), "Binding", &deployments)
        })))
    }
}

/// `/status` of a Binding: written by its controller.
#[derive(Debug, Default)]
pub struct BindingStatusStrategy;

impl StatusStrategy for BindingStatusStrategy {
    type Kind = BindingSpec;

    fn validate_update(&self, new: &KVCachePoolBinding, _old: &KVCachePoolBinding) -> ErrorList {
        validation::validate_status(new.status.as_ref())
    }
}
