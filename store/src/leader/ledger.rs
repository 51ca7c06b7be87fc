//! The tenant ledger: who may write, what proves it (credentials, kept as SHA-256 hashes), each
//! tenant's fixed block layout, its requested ceiling, and the grants those ceilings turn into
//! once they are compared with the mounted capacity.

use crate::error::{ErrorCode, Result, StoreError};
use crate::proto::{Scope, TenantEntry};

/// The tenant every request lands in when multi-tenancy is off.
pub const DEFAULT_TENANT: &str = "default";

/// The block layout a tenant's values are written in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub block_size: u32,
    pub dtype: String,
}

/// Checks a whole ledger before it replaces the current one.
pub fn validate(entries: &[TenantEntry]) -> Result<()> {
    let bad = |msg: String| Err(StoreError::new(ErrorCode::InvalidTenantLedger, msg));
    let mut seen = std::collections::HashSet::new();
    for (i, e) in entries.iter().enumerate() {
        if e.name.is_empty() {
            return bad(format!("tenants[{i}].name is empty; name every tenant"));
        }
        if e.name.starts_with('_') {
            return bad(format!(
                "tenants[{i}].name {:?} starts with '_', which is reserved; rename it",
                e.name
            ));
        }
        if e.name.chars().any(char::is_control) {
            return bad(format!(
                "tenants[{i}].name {:?} contains a control character; remove it",
                e.name
            ));
        }
        if !seen.insert(e.name.as_str()) {
            return bad(format!(
                "tenants[{i}].name {:?} is listed twice; list each tenant once",
                e.name
            ));
        }
        if e.ceiling == 0 || e.ceiling > i64::MAX as u64 {
            return bad(format!(
                "tenants[{i}] ({}) ceiling must be between 1 and 2^63-1 bytes",
                e.name
            ));
        }
        if e.block_size == 0 {
            return bad(format!("tenants[{i}] ({}) block_size must be greater than 0", e.name));
        }
        if e.dtype.is_empty() {
            return bad(format!(
                "tenants[{i}] ({}) dtype is empty; give the dtype its blocks are written in",
                e.name
            ));
        }
        if let Some(j) = e.credential_sha256.iter().position(|h| h.len() != 32) {
            return bad(format!(
                "tenants[{i}] ({}) credential_sha256[{j}] is {} bytes; send the 32-byte SHA-256 of the credential",
                e.name,
                e.credential_sha256[j].len()
            ));
        }
    }
    Ok(())
}

/// Grants for `ceilings` over `capacity` bytes: each ceiling while their sum fits, otherwise each
/// cut in proportion (rounded down, so the grants never add up to more than the capacity).
pub fn grants(ceilings: &[u64], capacity: u64) -> Vec<u64> {
    let sum: u128 = ceilings.iter().map(|c| *c as u128).sum();
    if sum <= capacity as u128 {
        return ceilings.to_vec();
    }
    ceilings
        .iter()
        .map(|c| (*c as u128 * capacity as u128 / sum) as u64)
        .collect()
}

/// The credential hashes of a validated entry.
pub fn credentials(e: &TenantEntry) -> Vec<[u8; 32]> {
    e.credential_sha256
        .iter()
        .filter_map(|h| <[u8; 32]>::try_from(h.as_ref()).ok())
        .collect()
}

/// The SHA-256 of a credential, as the ledger keeps it.
pub fn credential_hash(credential: &str) -> [u8; 32] {
    crate::auth::sha256(credential.as_bytes())
}

/// Refuses a call for a tenant bound to credentials unless it carries one of them.
pub fn check_credential(tenant: &str, hashes: &[[u8; 32]], presented: &str) -> Result<()> {
    if hashes.is_empty() {
        return Ok(());
    }
    if presented.is_empty() {
        return Err(StoreError::new(
            ErrorCode::Unauthenticated,
            format!(
                "tenant {tenant:?} takes only calls that carry its credential, and this one carries none; pass the \
                 credential its KVCachePoolBinding was given (KVSTORE_CREDENTIAL in the replica's environment)"
            ),
        ));
    }
    let h = credential_hash(presented);
    // compare every hash in full, so the time taken says nothing about which bytes matched
    let matched = hashes
        .iter()
        .fold(false, |any, known| any | crate::auth::same_hash(known, &h));
    if !matched {
        return Err(StoreError::new(
            ErrorCode::Unauthenticated,
            format!(
                "the credential this call carries is not tenant {tenant:?}'s; a replica may use a cache domain only \
                 with the credential of a KVCachePoolBinding of that domain in its own namespace"
            ),
        ));
    }
    Ok(())
}

/// Refuses a scope whose declared layout differs from the registered one.
pub fn check_layout(tenant: &str, registered: &Layout, scope: &Scope) -> Result<()> {
    if scope.block_size == registered.block_size && scope.dtype == registered.dtype {
        return Ok(());
    }
    Err(StoreError::new(
        ErrorCode::TenantLayoutMismatch,
        format!(
            "tenant {tenant:?} is registered with block size {} and dtype {:?}, but this client declared block \
             size {} and dtype {:?}; configure the engine with the domain's block size and dtype (reading blocks \
             written in another layout would corrupt them)",
            registered.block_size, registered.dtype, scope.block_size, scope.dtype
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, ceiling: u64) -> TenantEntry {
        TenantEntry {
            name: name.into(),
            ceiling,
            block_size: 64,
            dtype: "bfloat16".into(),
            ..Default::default()
        }
    }

    #[test]
    fn grants_equal_ceilings_when_they_fit() {
        assert_eq!(grants(&[10, 20], 30), vec![10, 20]);
        assert_eq!(grants(&[10, 20], 100), vec![10, 20]);
    }

    #[test]
    fn grants_are_cut_proportionally_when_oversubscribed() {
        assert_eq!(grants(&[300, 100], 200), vec![150, 50]);
        assert_eq!(grants(&[1, 1, 1], 2), vec![0, 0, 0]);
        assert_eq!(grants(&[5], 0), vec![0]);
        let g = grants(&[u64::MAX / 2, u64::MAX / 2], 1 << 40);
        assert!(g.iter().sum::<u64>() <= 1 << 40);
    }

    #[test]
    fn ledger_validation_names_the_entry() {
        assert!(validate(&[entry("a", 1), entry("b", 2)]).is_ok());
        for (bad, needle) in [
            (vec![entry("", 1)], "empty"),
            (vec![entry("_x", 1)], "reserved"),
            (vec![entry("a\n", 1)], "control"),
            (vec![entry("a", 1), entry("a", 1)], "twice"),
            (vec![entry("a", 0)], "ceiling"),
            (
                vec![TenantEntry {
                    block_size: 0,
                    ..entry("a", 1)
                }],
                "block_size",
            ),
            (
                vec![TenantEntry {
                    dtype: String::new(),
                    ..entry("a", 1)
                }],
                "dtype",
            ),
        ] {
            let e = validate(&bad).unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidTenantLedger);
            assert!(e.message.contains(needle), "{e}");
        }
    }

    #[test]
    fn layout_mismatch_is_refused() {
        let l = Layout {
            block_size: 64,
            dtype: "bfloat16".into(),
        };
        let ok = Scope {
            tenant: "t".into(),
            block_size: 64,
            dtype: "bfloat16".into(),
            ..Default::default()
        };
        assert!(check_layout("t", &l, &ok).is_ok());
        let bad = Scope {
            dtype: "fp8_e4m3".into(),
            ..ok
        };
        assert_eq!(
            check_layout("t", &l, &bad).unwrap_err().code,
            ErrorCode::TenantLayoutMismatch
        );
    }
}
