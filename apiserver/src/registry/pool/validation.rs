//! The rules of a `KVCachePool` object and of its status.

use kvcache_api::pool::{KVCachePool, PoolStatus};

use crate::field::{ErrorList, Path};
use crate::registry::validation;

/// The object rules, on create and (ratcheted) on update.
pub fn validate(obj: &KVCachePool) -> ErrorList {
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

/// The rules of a status write.
pub fn validate_status(status: Option<&PoolStatus>) -> ErrorList {
    let mut errs = ErrorList::new();
    let Some(s) = status else { return errs };
    let p = Path::new("status");
    validation::conditions(&s.conditions, &p.child("conditions"), &mut errs);
    if let Some(total) = s.usage.as_ref().and_then(|u| u.total.as_ref()) {
        validation::byte_quantity(total, &p.child("usage").child("total"), true, &mut errs);
    }
    for (i, d) in s.domains.iter().enumerate() {
        if let Some(rate) = &d.hit_rate {
            validation::hit_rate(rate, &p.child("domains").index(i).child("hitRate"), &mut errs);
        }
    }
    errs
}
