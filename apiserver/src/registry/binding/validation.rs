//! The rules of a `KVCachePoolBinding` object and of its status.

use kvcache_api::binding::{BindingStatus, DEFAULT_DOMAIN, KVCachePoolBinding};

use crate::field::{ErrorList, Path};
use crate::registry::Context;
use crate::registry::validation;

const MAX_DTYPE: usize = 32;

/// The object rules, on create and (ratcheted) on update.
pub fn validate(obj: &KVCachePoolBinding, ctx: &Context) -> ErrorList {
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
    } else if dtype == "auto" && ctx.config.get().settings.model_deployment_kv_cache_dtype_owned {
        errs.invalid(
            p,
            dtype,
            "name a concrete type such as bfloat16: engines read this domain's blocks with this dtype, and \"auto\" lets each engine pick its own",
        );
    }
}

/// The rules of a status write.
pub fn validate_status(status: Option<&BindingStatus>) -> ErrorList {
    let mut errs = ErrorList::new();
    let Some(s) = status else { return errs };
    let p = Path::new("status");
    validation::conditions(&s.conditions, &p.child("conditions"), &mut errs);
    for (name, q) in [
        ("requestedQuota", &s.requested_quota),
        ("effectiveQuota", &s.effective_quota),
        ("usage", &s.usage),
    ] {
        if let Some(q) = q {
            validation::byte_quantity(q, &p.child(name), true, &mut errs);
        }
    }
    if let Some(rate) = &s.hit_rate {
        validation::hit_rate(rate, &p.child("hitRate"), &mut errs);
    }
    if s.blocks.is_some_and(|b| b < 0) {
        errs.invalid(&p.child("blocks"), s.blocks, "must be greater than or equal to 0");
    }
    errs
}
