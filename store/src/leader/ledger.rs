//! The tenant ledger: who may write, what proves it (credentials, kept as SHA-256 hashes), each
//! tenant's fixed block layout, its requested ceiling and pool, and the grants those ceilings turn
//! into once they are compared with their pool's total and the mounted capacity ([`grants`]).

use crate::error::{ErrorCode, Result, StoreError};
use crate::proto::{GrantLimit, PoolEntry, Scope, TenantEntry};

/// The tenant every request lands in when multi-tenancy is off.
pub const DEFAULT_TENANT: &str = "default";

/// The block layout a tenant's values are written in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub block_size: u32,
    pub dtype: String,
}

/// Longest tenant name, dtype or uid a ledger may carry (every value's tag holds them).
pub const MAX_NAME_LEN: usize = 253;

/// Checks a whole ledger before it replaces the current one.
pub fn validate(entries: &[TenantEntry], pools: &[PoolEntry]) -> Result<()> {
    let pool_names = validate_pools(pools)?;
    let mut seen = std::collections::HashSet::new();
    for (i, e) in entries.iter().enumerate() {
        validate_tenant_name(i, e, &mut seen)?;
        validate_tenant_entry(i, e, &pool_names)?;
    }
    Ok(())
}

/// The refusal of an invalid ledger, saying what is wrong and what to do.
fn bad<T>(msg: String) -> Result<T> {
    Err(StoreError::new(ErrorCode::InvalidTenantLedger, msg))
}

/// Checks the pools (each named once, with a total that fits) and returns their names.
fn validate_pools(pools: &[PoolEntry]) -> Result<std::collections::HashSet<&str>> {
    let mut pool_names = std::collections::HashSet::new();
    for (i, p) in pools.iter().enumerate() {
        if p.name.is_empty() {
            return bad(format!("pools[{i}].name is empty; name every pool"));
        }
        if !pool_names.insert(p.name.as_str()) {
            return bad(format!(
                "pools[{i}].name {:?} is listed twice; list each pool once",
                p.name
            ));
        }
        if p.total == 0 || p.total > i64::MAX as u64 {
            return bad(format!(
                "pools[{i}] ({}) total must be between 1 and 2^63-1 bytes",
                p.name
            ));
        }
    }
    Ok(pool_names)
}

/// Checks tenant `i`'s name: given, not reserved, printable, and not one of the names `seen`
/// before it (to which it is added).
fn validate_tenant_name<'a>(i: usize, e: &'a TenantEntry, seen: &mut std::collections::HashSet<&'a str>) -> Result<()> {
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
    Ok(())
}

/// Checks the rest of tenant `i`'s entry: its ceiling, layout, uid, pool (one of `pool_names`)
/// and credential hashes.
fn validate_tenant_entry(i: usize, e: &TenantEntry, pool_names: &std::collections::HashSet<&str>) -> Result<()> {
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
    if e.name.len() > MAX_NAME_LEN || e.dtype.len() > MAX_NAME_LEN || e.uid.len() > MAX_NAME_LEN {
        return bad(format!(
            "tenants[{i}] ({}): a name, dtype or uid is longer than {MAX_NAME_LEN} bytes",
            e.name
        ));
    }
    if e.uid.chars().any(char::is_control) {
        return bad(format!(
            "tenants[{i}] ({}) uid contains a control character; send the Binding's UID",
            e.name
        ));
    }
    if !e.pool.is_empty() && !pool_names.contains(e.pool.as_str()) {
        return bad(format!(
            "tenants[{i}] ({}) names the pool {:?}, which the request does not list; list it in pools with its total",
            e.name, e.pool
        ));
    }
    if let Some(j) = e.credential_sha256.iter().position(|h| h.len() != 32) {
        return bad(format!(
            "tenants[{i}] ({}) credential_sha256[{j}] is {} bytes; send the 32-byte SHA-256 of the credential",
            e.name,
            e.credential_sha256[j].len()
        ));
    }
    Ok(())
}

/// One tenant's claim on the capacity: its ceiling and the pool it counts against, as an index
/// into the pools' totals (`None`: a tenant in no pool, which only the capacity can cut).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    pub ceiling: u64,
    pub pool: Option<usize>,
}

/// The grant of each claim and what cut it, in two steps:
/// 1. each pool asks for its tenants' ceilings, at most its total (a tenant in no pool asks for
///    its ceiling alone); while those asks fit in `capacity` each pool gets its ask, otherwise
///    each is cut in proportion ([`GrantLimit::Capacity`]);
/// 2. a pool's share is split among its tenants in proportion to their ceilings, which cuts them
///    only when they ask for more than the pool's total ([`GrantLimit::PoolTotal`]).
///
/// So one pool whose Bindings ask for more than its total never shrinks another pool's grants;
/// only the capacity, shared by all pools, can. Rounded down: grants never add up to more than a
/// pool's total or the capacity.
pub fn grants(claims: &[Claim], totals: &[u64], capacity: u64) -> Vec<(u64, GrantLimit)> {
    // one group per pool, then one per tenant in no pool
    let mut asked: Vec<u128> = vec![0; totals.len()];
    let mut group_of = Vec::with_capacity(claims.len());
    let mut caps: Vec<u128> = totals.iter().map(|t| *t as u128).collect();
    for c in claims {
        let g = match c.pool {
            Some(p) if p < totals.len() => p,
            _ => {
                asked.push(0);
                caps.push(u128::MAX);
                asked.len() - 1
            }
        };
        asked[g] += c.ceiling as u128;
        group_of.push(g);
    }
    let demands: Vec<u128> = asked.iter().zip(&caps).map(|(a, t)| (*a).min(*t)).collect();
    let shares = proportional(&demands, capacity as u128);
    let mut out = Vec::with_capacity(claims.len());
    for (c, &g) in claims.iter().zip(&group_of) {
        let grant = if asked[g] <= shares[g] {
            c.ceiling as u128
        } else {
            c.ceiling as u128 * shares[g] / asked[g]
        };
        let grant = u64::try_from(grant).unwrap_or(u64::MAX);
        let limit = if grant >= c.ceiling {
            GrantLimit::None
        } else if shares[g] < demands[g] {
            GrantLimit::Capacity
        } else {
            GrantLimit::PoolTotal
        };
        out.push((grant, limit));
    }
    out
}

/// Each of `asks` while their sum fits in `available`, otherwise each cut in proportion (rounded
/// down, so they never add up to more than `available`).
fn proportional(asks: &[u128], available: u128) -> Vec<u128> {
    let sum: u128 = asks.iter().sum();
    if sum <= available {
        return asks.to_vec();
    }
    // every ask is at most a pool's total or one ceiling (a u64), so `a * available` fits in u128
    asks.iter().map(|a| a * available / sum).collect()
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

/// Checks the credential a call carries against a tenant's entry, or against none when the
/// ledger has no such tenant. Every refusal is the same [`refused`]: the code, the message and
/// the work done (one hash, compared against each known hash in full) do not tell a caller
/// whether the tenant exists, whether it takes credentials, or whether the credential was
/// missing or wrong.
pub fn check_credential(tenant: &str, hashes: Option<&[[u8; 32]]>, presented: &str) -> Result<()> {
    let h = credential_hash(presented);
    let Some(hashes) = hashes else {
        return Err(refused(tenant));
    };
    if hashes.is_empty() {
        return Ok(());
    }
    // compare every hash in full, so the time taken says nothing about which bytes matched
    let matched = hashes
        .iter()
        .fold(false, |any, known| any | crate::auth::same_hash(known, &h));
    if presented.is_empty() || !matched {
        return Err(refused(tenant));
    }
    Ok(())
}

/// The one answer to a call the ledger does not admit for `tenant`.
pub fn refused(tenant: &str) -> StoreError {
    StoreError::new(
        ErrorCode::Unauthenticated,
        format!(
            "tenant {tenant:?} does not admit this call: either no KVCachePoolBinding of this domain is granted on \
             this store yet, or the call's credential is missing or not one of that domain's Bindings' (a replica \
             uses KVSTORE_CREDENTIAL from its environment, the credential of a Binding of the domain in its own \
             namespace); the store does not say which, so that it does not tell who its tenants are"
        ),
    )
}

/// The refusal of a call that shows no credential of any tenant before its request is read
/// (`State::admits`): the same code as [`refused`], and what to send.
pub fn refused_unread() -> StoreError {
    StoreError::new(
        ErrorCode::Unauthenticated,
        format!(
            "this store takes a call only from a caller that shows a tenant's credential before its request is \
             read: in the gRPC metadata {:?} (and in the request's scope), or in the fast port's ClientHello; this \
             one shows none, or one no tenant of this store takes (a replica uses KVSTORE_CREDENTIAL from its \
             environment, the credential of a Binding of its domain in its own namespace)",
            crate::protocol::CREDENTIAL_HEADER
        ),
    )
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

/// What admits a caller before its request is read (`State::admits`).
#[derive(Debug, Default)]
pub struct Callers {
    /// some tenant takes calls without a credential
    pub open: bool,
    /// every credential hash of the ledger
    pub hashes: std::collections::HashSet<[u8; 32]>,
}

impl Callers {
    /// From each tenant's credential hashes.
    pub fn of<'a>(tenants: impl Iterator<Item = &'a [[u8; 32]]>) -> Callers {
        let mut c = Callers::default();
        for hashes in tenants {
            c.open |= hashes.is_empty();
            c.hashes.extend(hashes.iter().copied());
        }
        c
    }
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

    fn claim(ceiling: u64, pool: Option<usize>) -> Claim {
        Claim { ceiling, pool }
    }

    #[test]
    fn grants_by_pool_total_and_capacity() {
        use GrantLimit::{Capacity as Cap, None as Whole, PoolTotal as Pool};
        let solo = |c| claim(c, None);
        let in_pool = |c, p| claim(c, Some(p));
        #[allow(clippy::type_complexity)]
        let table: &[(&str, Vec<Claim>, Vec<u64>, u64, Vec<(u64, GrantLimit)>)] = &[
            (
                "tenants in no pool fit",
                vec![solo(10), solo(20)],
                vec![],
                30,
                vec![(10, Whole), (20, Whole)],
            ),
            (
                "tenants in no pool share the capacity",
                vec![solo(300), solo(100)],
                vec![],
                200,
                vec![(150, Cap), (50, Cap)],
            ),
            (
                "rounded down to nothing",
                vec![solo(1), solo(1), solo(1)],
                vec![],
                2,
                vec![(0, Cap), (0, Cap), (0, Cap)],
            ),
            ("nothing mounted", vec![solo(5)], vec![], 0, vec![(0, Cap)]),
            (
                "a pool within its total",
                vec![in_pool(10, 0), in_pool(20, 0)],
                vec![30],
                100,
                vec![(10, Whole), (20, Whole)],
            ),
            (
                "a pool over its total splits it",
                vec![in_pool(300, 0), in_pool(100, 0)],
                vec![200],
                1000,
                vec![(150, Pool), (50, Pool)],
            ),
            (
                "one pool over its total leaves the other whole",
                vec![in_pool(200, 0), in_pool(200, 0), in_pool(100, 1)],
                vec![100, 200],
                300,
                vec![(50, Pool), (50, Pool), (100, Whole)],
            ),
            (
                "pools share the capacity by what they may hand out, not by what they are asked",
                vec![in_pool(1000, 0), in_pool(100, 1)],
                vec![100, 100],
                100,
                vec![(50, Cap), (50, Cap)],
            ),
            (
                "a pool's total and the capacity both cut: the capacity is named",
                vec![in_pool(400, 0), in_pool(400, 0), in_pool(100, 1)],
                vec![400, 100],
                250,
                vec![(100, Cap), (100, Cap), (50, Cap)],
            ),
            (
                "a pool nobody names takes nothing",
                vec![in_pool(100, 1)],
                vec![1000, 500],
                100,
                vec![(100, Whole)],
            ),
        ];
        for (name, claims, totals, capacity, want) in table {
            assert_eq!(&grants(claims, totals, *capacity), want, "{name}");
        }
    }

    #[test]
    fn grants_never_add_up_past_a_pool_or_the_capacity() {
        let huge = i64::MAX as u64;
        let g = grants(&[claim(huge, None), claim(huge, None)], &[], 1 << 40);
        assert!(g.iter().map(|x| x.0).sum::<u64>() <= 1 << 40);
        let g = grants(
            &[claim(huge, Some(0)), claim(huge, Some(0)), claim(7, Some(1))],
            &[1 << 30, huge],
            u64::MAX,
        );
        assert!(g[0].0 + g[1].0 <= 1 << 30);
        assert_eq!(g[2], (7, GrantLimit::None));
    }

    #[test]
    fn ledger_validation_names_the_entry() {
        assert!(validate(&[entry("a", 1), entry("b", 2)], &[]).is_ok());
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
            let e = validate(&bad, &[]).unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidTenantLedger);
            assert!(e.message.contains(needle), "{e}");
        }
    }

    #[test]
    fn a_ledger_names_only_pools_it_lists_once_with_a_total() {
        let pool = |name: &str, total| PoolEntry {
            name: name.into(),
            total,
        };
        let in_pool = |t: &str, p: &str| TenantEntry {
            pool: p.into(),
            ..entry(t, 1)
        };
        assert!(validate(&[in_pool("a", "p"), in_pool("b", "")], &[pool("p", 1), pool("q", 9)]).is_ok());
        for (tenants, pools, needle) in [
            (vec![in_pool("a", "p")], vec![], "does not list"),
            (vec![], vec![pool("", 1)], "pools[0].name is empty"),
            (vec![], vec![pool("p", 1), pool("p", 2)], "twice"),
            (vec![], vec![pool("p", 0)], "total"),
        ] {
            let e = validate(&tenants, &pools).unwrap_err();
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
