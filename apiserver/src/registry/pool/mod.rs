//! `KVCachePool`: exactly one backend, fixed for the pool's life, and a positive total quota.

#[cfg(test)]
mod tests;

use async_trait::async_trait;
use kvcache_api::backend::BackendSpec;
use kvcache_api::pool::{KVCachePool, PoolSpec};

use super::field::{ErrorList, Path};
use super::{Admission, Change, Context, Reads, RegistryError, Strategy, validation};

pub struct PoolStrategy;

fn validate(obj: &KVCachePool) -> ErrorList {
    let mut errs = ErrorList::new();
    let spec = Path::new("spec");
    let backends = &obj.spec.backends;
    if backends.len() != 1 {
        errs.invalid(
            &spec.child("backends"),
            backends,
            format!(
                "exactly one backend is supported (got {}): a pool's quota lives on one leader's per-tenant ledger",
                backends.len()
            ),
        );
    }
    for (i, b) in backends.iter().enumerate() {
        let p = spec.child("backends").index(i);
        if b.is_empty() {
            errs.required(&p, "name a KVCacheBackend");
        } else if let Err(e) = validation::dns1123_subdomain(b) {
            errs.invalid(&p, b, e);
        }
    }
    let total = spec.child("quota").child("total");
    match obj.spec.quota.as_ref().and_then(|q| q.total.as_ref()) {
        None => errs.required(&total, "give the quota this pool hands out, e.g. 16Gi"),
        Some(q) => {
            validation::byte_quantity(q, &total, false, &mut errs);
        }
    }
    errs
}

#[async_trait]
impl Strategy for PoolStrategy {
    type Kind = PoolSpec;

    fn apply_defaults(&self, _obj: &mut KVCachePool, _ctx: &Context) {}

    fn validate(&self, obj: &KVCachePool, _ctx: &Context) -> ErrorList {
        validate(obj)
    }

    fn validate_update(&self, new: &KVCachePool, old: &KVCachePool, _ctx: &Context) -> ErrorList {
        let mut errs = super::ratchet(validate(new), &validate(old), new, old);
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
        // Only a new pool looks at its backend; an update never re-reads it, so a pool keeps
        // working (and can be deleted) after its backend is gone.
        let Change::Create(pool) = change else { return Ok(out) };
        let Some(name) = pool.spec.backend() else {
            return Ok(out);
        };
        match reads.object::<BackendSpec>("", name).await? {
            None => out.warnings.push(format!(
                "KVCacheBackend {name:?} does not exist yet; the pool reports BackendResolved=False until it does"
            )),
            Some(backend) if backend.spec.declared_multi_tenancy() == Some(false) => out.warnings.push(format!(
                "KVCacheBackend {name:?} keeps no per-tenant ledger (multiTenancy: false): no per-domain quota is enforced, every write lands in one default tenant bounded only by the store's capacity, and the backend serves exactly one cache domain"
            )),
            Some(_) => {}
        }
        Ok(out)
    }
}
