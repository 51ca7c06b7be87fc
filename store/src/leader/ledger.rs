//! The tenant ledger: who may write, each tenant's fixed block layout, its requested ceiling, and
//! the grants those ceilings turn into once they are compared with the mounted capacity.

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
