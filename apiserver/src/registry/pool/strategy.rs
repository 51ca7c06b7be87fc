//! The hooks of `KVCachePool`: no defaults, the backend fixed for life, a warning when the
//! backend does not exist yet or keeps no ledger, a refusal when it is being deleted, the
//! warning of a write whose total cuts its Bindings' grants, the warning of a held DELETE, and
//! the `/status` rules.

use async_trait::async_trait;
use kvcache_api::backend::BackendSpec;
use kvcache_api::pool::{KVCachePool, PoolSpec};

use super::validation;
use crate::field::{ErrorList, Path};
use crate::registry::{Admission, Change, Context, Reads, RegistryError, StatusStrategy, Strategy, grants, holders};
use crate::storage::Storage;

#[derive(Debug, Default)]
pub struct PoolStrategy;

#[async_trait]
impl Strategy for PoolStrategy {
    type Kind = PoolSpec;
    type Status = PoolStatusStrategy;

    fn apply_defaults(&self, _obj: &mut KVCachePool, _ctx: &Context) {}

    fn validate(&self, obj: &KVCachePool, _ctx: &Context) -> ErrorList {
        validation::validate(obj)
    }

    fn validate_update(&self, new: &KVCachePool, old: &KVCachePool, _ctx: &Context) -> ErrorList {
        let mut errs = ErrorList::new();
        if new.spec.backends != old.spec.backends {
            errs.forbidden(
                &Path::new("spec").child("backends"),
                "backends is immutable: moving a pool would strand every tenant quota on the old leader's ledger; create a new pool instead",
            );
        }
        errs
    }

    async fn admit(
        &self,
        change: Change<'_, PoolSpec>,
        reads: &mut Reads<'_>,
        _ctx: &Context,
    ) -> Result<Admission, RegistryError> {
        let mut out = Admission::default();
        let pool = match change {
            Change::Create(pool) => {
                admit_backend(pool, reads, &mut out).await?;
                pool
            }
            Change::Update { new, old } if grants::total_of(new) != grants::total_of(old) => new,
            _ => return Ok(out),
        };
        if let Some(total) = grants::total_of(pool) {
            let asks = grants::asks_in(pool.name(), None, reads).await?;
            out.warnings.extend(grants::pool_warning(pool.name(), total, &asks));
        }
        Ok(out)
    }

    async fn warnings_on_delete(&self, obj: &KVCachePool, storage: &dyn Storage) -> Result<Vec<String>, RegistryError> {
        let bindings = holders::of_pool(storage, obj.name()).await?;
        Ok(Vec::from_iter((!bindings.is_empty()).then(|| {
            holders::delete_warning("KVCachePool", obj.name(), "pool", &bindings)
        })))
    }
}

/// Only a new pool looks at its backend; an update never re-reads it, so a pool keeps working
/// (and can be deleted) after its backend is gone.
async fn admit_backend(pool: &KVCachePool, reads: &mut Reads<'_>, out: &mut Admission) -> Result<(), RegistryError> {
    let Some(name) = pool.spec.backend() else {
        return Ok(());
    };
    match reads.object::<BackendSpec>("", name).await? {
        Some(backend) if holders::is_deleting(&backend) => out.errors.forbidden(
            &Path::new("spec").child("backends").index(0),
            holders::deleting_reference("KVCacheBackend", name, "pool"),
        ),
        None => out.warnings.push(format!(
            "KVCacheBackend {name:?} does not exist yet; the pool reports BackendResolved=False until it does"
        )),
        Some(backend) if backend.spec.declared_multi_tenancy() == Some(false) => out.warnings.push(format!(
            "KVCacheBackend {name:?} keeps no per-tenant ledger (multiTenancy: false): no per-domain quota is enforced, every write lands in one default tenant bounded only by the store's capacity, and the backend serves exactly one cache domain"
        )),
        Some(_) => {}
    }
    Ok(())
}

/// `/status` of a pool: written by its controller.
#[derive(Debug, Default)]
pub struct PoolStatusStrategy;

impl StatusStrategy for PoolStatusStrategy {
    type Kind = PoolSpec;

    fn validate_update(&self, new: &KVCachePool, _old: &KVCachePool) -> ErrorList {
        validation::validate_status(new.status.as_ref())
    }
}
