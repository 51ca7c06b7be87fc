//! `KVCachePoolBinding`: a namespace's grant on a pool under a cache domain.
//!
//! The domain (name, block size, dtype) and the pool are fixed for the Binding's life
//! ([`BindingStrategy::validate_update`]); a domain name is held by at most one Binding per
//! backend ([`claims`]), decided in the same storage transaction as the write.

mod claims;

#[cfg(test)]
mod tests;

use async_trait::async_trait;
use kvcache_api::binding::{BindingSpec, DEFAULT_DOMAIN, KVCachePoolBinding};

use super::field::{ErrorList, Path};
use super::{Admission, Change, Context, Reads, RegistryError, Strategy, validation};

pub struct BindingStrategy;

const MAX_DTYPE: usize = 32;

fn validate(obj: &KVCachePoolBinding, ctx: &Context) -> ErrorList {
    let mut errs = ErrorList::new();
    let spec = Path::new("spec");
    let pool = spec.child("poolRef").child("name");
    match obj.spec.pool_ref.as_ref().map(|r| r.name.as_str()) {
        None | Some("") => errs.required(&pool, "name the KVCachePool this namespace draws on"),
        Some(name) => {
            if let Err(e) = validation::dns1123_subdomain(name) {
                errs.invalid(&pool, name, e);
            }
        }
    }
    let dp = spec.child("domain");
    match &obj.spec.domain {
        None => errs.required(
            &dp,
            "declare the cache domain: blockSize and dtype (name defaults to \"default\")",
        ),
        Some(d) => {
            let name = d.name.as_deref().unwrap_or(DEFAULT_DOMAIN);
            if name.starts_with('_') {
                errs.invalid(
                    &dp.child("name"),
                    name,
                    "names starting with '_' are reserved by the store",
                );
            } else if let Err(e) = validation::dns1123_label(name) {
                errs.invalid(&dp.child("name"), name, e);
            }
            match d.block_size {
                None => errs.required(
                    &dp.child("blockSize"),
                    "give the number of tokens per cache block, e.g. 64",
                ),
                Some(b) if b <= 0 => errs.invalid(&dp.child("blockSize"), b, "must be greater than 0"),
                Some(_) => {}
            }
            validate_dtype(d.dtype.as_deref(), &dp.child("dtype"), ctx, &mut errs);
        }
    }
    let ceiling = spec.child("quota").child("ceiling");
    match obj.spec.quota.as_ref().and_then(|q| q.ceiling.as_ref()) {
        None => errs.required(
            &ceiling,
            "give the quota this namespace asks for, e.g. 8Gi (there is no default: a domain without a quota would refuse every write)",
        ),
        Some(q) => {
            validation::byte_quantity(q, &ceiling, false, &mut errs);
        }
    }
    errs
}

fn validate_dtype(dtype: Option<&str>, p: &Path, ctx: &Context, errs: &mut ErrorList) {
    let Some(dtype) = dtype.filter(|d| !d.is_empty()) else {
        errs.required(p, "name the KV cache data type, e.g. bfloat16");
        return;
    };
    if !validation::max_len(dtype, MAX_DTYPE, p, errs) {
        return;
    }
    if dtype.chars().any(|c| c.is_whitespace() || c.is_control()) {
        errs.invalid(p, dtype, "must not contain whitespace or control characters");
    } else if dtype != dtype.to_lowercase() {
        errs.invalid(
            p,
            dtype,
            "must be lowercase, as engines spell it (e.g. bfloat16, fp8_e4m3)",
        );
    } else if dtype == "auto" && ctx.config.settings.model_deployment_kv_cache_dtype_owned {
        errs.invalid(
            p,
            dtype,
            "name a concrete type such as bfloat16: engines read this domain's blocks with this dtype, and \"auto\" lets each engine pick its own",
        );
    }
}

#[async_trait]
impl Strategy for BindingStrategy {
    type Kind = BindingSpec;

    fn apply_defaults(&self, obj: &mut KVCachePoolBinding, _ctx: &Context) {
        if let Some(d) = obj.spec.domain.as_mut() {
            d.name.get_or_insert_with(|| DEFAULT_DOMAIN.to_owned());
        }
    }

    fn validate(&self, obj: &KVCachePoolBinding, ctx: &Context) -> ErrorList {
        validate(obj, ctx)
    }

    /// The pool and every field of the domain are fixed: the domain is the store's tenant and
    /// the blocks' format. Enforced even while the Binding is being deleted.
    fn validate_update(&self, new: &KVCachePoolBinding, old: &KVCachePoolBinding, ctx: &Context) -> ErrorList {
        let mut errs = super::ratchet(validate(new, ctx), &validate(old, ctx), new, old);
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
}
