//! What a pool's grants become after a write, said at write time: when a pool's total is below
//! what its Bindings ask together, or a Binding asks more than its pool has left, the store cuts
//! every grant in the pool in proportion to its ceiling. The figures are the store's own rule
//! (`kvcache_store::leader::ledger::grants`) applied to the pool's total and the Bindings'
//! ceilings, so the warning and the grants the store then reads back cannot disagree (the
//! backend's mounted capacity, unknown here, may cut them further).

use kvcache_api::binding::{BindingSpec, KVCachePoolBinding};
use kvcache_api::pool::KVCachePool;
use kvcache_store::leader::ledger::{Claim, grants};
use kvcache_units::approx_bytes;

use super::{Reads, RegistryError, decode};
use crate::storage::keys;

/// Claims named in a warning before "and N more".
const MAX_NAMED: usize = 10;

/// One Binding's ask: `namespace/name` and its ceiling in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ask {
    pub binding: String,
    pub ceiling: u64,
}

fn bytes(q: Option<&kvcache_api::Quantity>) -> Option<u64> {
    kvcache_units::parse_bytes(q?.as_str()).ok()
}

/// A pool's total in bytes, when it has one.
pub fn total_of(pool: &KVCachePool) -> Option<u64> {
    bytes(pool.spec.quota.as_ref().and_then(|q| q.total.as_ref()))
}

/// A Binding's ask, when it has a ceiling.
pub fn ask_of(b: &KVCachePoolBinding) -> Option<Ask> {
    Some(Ask {
        binding: format!("{}/{}", b.namespace(), b.name()),
        ceiling: bytes(b.spec.quota.as_ref().and_then(|q| q.ceiling.as_ref()))?,
    })
}

/// The asks of the live Bindings that name `pool` (read through `reads`), but `except`.
pub async fn asks_in(pool: &str, except: Option<&str>, reads: &mut Reads<'_>) -> Result<Vec<Ask>, RegistryError> {
    let mut out = Vec::new();
    for kv in reads.list(&keys::kind_prefix::<BindingSpec>()).await? {
        let b = decode::<BindingSpec>(&kv)?;
        if b.spec.pool_name() != pool || b.metadata.deletion_timestamp.is_some() {
            continue;
        }
        if let Some(a) = ask_of(&b).filter(|a| Some(a.binding.as_str()) != except) {
            out.push(a);
        }
    }
    Ok(out)
}

/// `team-a/x 8Gi → 910Mi, …` for every ask the total cuts; empty when none is cut.
fn cuts(total: u64, asks: &[Ask], this: Option<&str>) -> Vec<String> {
    let claims: Vec<Claim> = asks
        .iter()
        .map(|a| Claim {
            ceiling: a.ceiling,
            pool: Some(0),
        })
        .collect();
    grants(&claims, &[total], u64::MAX)
        .iter()
        .zip(asks)
        .filter(|((grant, _), a)| *grant < a.ceiling)
        .map(|((grant, _), a)| {
            let mark = if Some(a.binding.as_str()) == this {
                " (this Binding)"
            } else {
                ""
            };
            format!(
                "{}{mark} {} → {}",
                a.binding,
                approx_bytes(a.ceiling),
                approx_bytes(*grant)
            )
        })
        .collect()
}

fn listed(cut: &[String]) -> String {
    let shown = cut.iter().take(MAX_NAMED).cloned().collect::<Vec<_>>().join(", ");
    match cut.len().saturating_sub(MAX_NAMED) {
        0 => shown,
        more => format!("{shown} and {more} more"),
    }
}

const HOW: &str = "the store cuts every grant in the pool in proportion to its ceiling";
const FURTHER: &str = "(the backend's capacity may cut them further)";

/// The warning of a pool write whose `total` is below what `asks` ask together.
pub fn pool_warning(pool: &str, total: u64, asks: &[Ask]) -> Option<String> {
    let cut = cuts(total, asks, None);
    let asked: u64 = asks.iter().map(|a| a.ceiling).fold(0, u64::saturating_add);
    (!cut.is_empty()).then(|| {
        format!(
            "KVCachePool {pool:?}: its total {} is less than its Bindings ask together ({}), so {HOW}: {} {FURTHER}",
            approx_bytes(total),
            approx_bytes(asked),
            listed(&cut)
        )
    })
}

/// The warning of a Binding write (`this`, among `asks`) that asks more than its pool has left.
pub fn binding_warning(pool: &str, total: u64, asks: &[Ask], this: &str) -> Option<String> {
    let cut = cuts(total, asks, Some(this));
    let asked: u64 = asks.iter().map(|a| a.ceiling).fold(0, u64::saturating_add);
    (!cut.is_empty()).then(|| {
        format!(
            "KVCachePool {pool:?} has {} for its Bindings, which ask {} with this one, so {HOW}: {} {FURTHER}",
            approx_bytes(total),
            approx_bytes(asked),
            listed(&cut)
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(binding: &str, ceiling: u64) -> Ask {
        Ask {
            binding: binding.into(),
            ceiling,
        }
    }

    #[test]
    fn a_cut_says_what_each_grant_becomes() {
        const GI: u64 = 1 << 30;
        assert_eq!(
            pool_warning("p", 16 * GI, &[ask("a/x", 8 * GI)]),
            None,
            "within the total"
        );
        assert_eq!(
            pool_warning("p", GI, &[ask("a/x", 8 * GI), ask("b/y", GI)]).as_deref(),
            Some(
                "KVCachePool \"p\": its total 1Gi is less than its Bindings ask together (9Gi), so the store cuts \
                 every grant in the pool in proportion to its ceiling: a/x 8Gi → 910Mi, b/y 1Gi → 114Mi (the \
                 backend's capacity may cut them further)"
            )
        );
        let w = binding_warning("p", 16 * GI, &[ask("a/x", 8 * GI), ask("b/y", 12 * GI)], "b/y").unwrap();
        assert!(
            w.contains("which ask 20Gi with this one")
                && w.contains("a/x 8Gi → 6.4Gi, b/y (this Binding) 12Gi → 9.6Gi"),
            "{w}"
        );
    }
}
