//! The tenant ledger of a backend, as the pools render it from the API: one entry per Binding of
//! every pool on the backend (its domain, ceiling, pool, layout, the hashes of its credentials and
//! its UID, which every value's tag names so a domain given to a new Binding starts empty) and
//! each pool's total. The pools set it on the leader whole with `SetTenants`
//! when it differs from what the leader holds, never partially; the leader turns it into grants
//! (`store/src/leader/ledger.rs`, which also validates it).

use std::collections::HashMap;

use kvcache_api::{KVCachePool, KVCachePoolBinding, Quantity};
use kvcache_store::proto::{GetTenantsResponse, PoolEntry, TenantEntry};

use crate::runtime::credentials::{BindingKey, TenantCredentials};

/// Every Binding's credentials, as the runtime keeps them.
pub type Credentials = HashMap<BindingKey, TenantCredentials>;

/// The hash a Binding's entry carries until its credential is minted: the SHA-256 of no known
/// input, so every call for the tenant is refused, while its blocks and quota stay (an entry left
/// out would drop them; one without hashes would take anyone's calls).
pub const NOT_YET_MINTED: [u8; 32] = [0; 32];

/// Bytes of a quantity; 0 when it does not parse (admission refuses those).
pub fn quantity_bytes(q: Option<&Quantity>) -> u64 {
    q.and_then(|q| kvcache_units::parse_bytes(q.as_str()).ok()).unwrap_or(0)
}

/// The tenant a Binding declares in the ledger, bound to the credentials kept for it (those
/// minted for this very Binding, by UID).
pub fn tenant_entry(b: &KVCachePoolBinding, credentials: &Credentials) -> TenantEntry {
    let d = b.spec.domain.clone().unwrap_or_default();
    let key = BindingKey::new(b.namespace(), b.name());
    let hashes = match credentials.get(&key) {
        Some(c) if Some(c.uid.as_str()) == b.metadata.uid.as_deref() => c.hashes(),
        _ => vec![NOT_YET_MINTED],
    };
    TenantEntry {
        name: b.spec.domain_name().to_owned(),
        ceiling: quantity_bytes(b.spec.quota.as_ref().and_then(|q| q.ceiling.as_ref())),
        block_size: d.block_size.and_then(|v| u32::try_from(v).ok()).unwrap_or(0),
        dtype: d.dtype.unwrap_or_default(),
        credential_sha256: hashes.iter().map(|h| bytes::Bytes::copy_from_slice(h)).collect(),
        pool: b.spec.pool_name().to_owned(),
        uid: b.metadata.uid.clone().unwrap_or_default(),
    }
}

/// Whether a Binding's tenant stays in the ledger: live, or deleting while workloads still hold it.
pub fn in_ledger(b: &KVCachePoolBinding) -> bool {
    b.metadata.deletion_timestamp.is_none() || b.status.as_ref().is_some_and(|s| !s.used_by.is_empty())
}

/// A whole ledger, as `SetTenants` takes it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Ledger {
    pub tenants: Vec<TenantEntry>,
    pub pools: Vec<PoolEntry>,
}

/// The whole ledger of `backend`: every pool on it with its total, and the tenants of their
/// Bindings; except the pool `without` (a pool being released).
pub fn render_ledger(
    backend: &str,
    pools: &[KVCachePool],
    bindings: &[KVCachePoolBinding],
    without: Option<&str>,
    credentials: &Credentials,
) -> Ledger {
    let mut on_backend: Vec<PoolEntry> = pools
        .iter()
        .filter(|p| p.spec.backend() == Some(backend) && Some(p.name()) != without)
        .map(|p| PoolEntry {
            name: p.name().to_owned(),
            total: quantity_bytes(p.spec.quota.as_ref().and_then(|q| q.total.as_ref())),
        })
        .collect();
    on_backend.sort_by(|a, b| a.name.cmp(&b.name));
    let mut tenants: Vec<TenantEntry> = bindings
        .iter()
        .filter(|b| on_backend.iter().any(|p| p.name == b.spec.pool_name()) && in_ledger(b))
        .map(|b| tenant_entry(b, credentials))
        .collect();
    tenants.sort_by(|a, b| a.name.cmp(&b.name));
    Ledger {
        tenants,
        pools: on_backend,
    }
}

/// Whether the leader's ledger already is `desired` (its pools, and its tenants' names, ceilings,
/// pools, layouts, credentials and holders, in any order).
pub fn same_ledger(current: &GetTenantsResponse, desired: &Ledger) -> bool {
    let have = rows(current.tenants.iter().map(|t| {
        (
            (&t.name, &t.uid),
            t.ceiling,
            &t.pool,
            t.block_size,
            &t.dtype,
            &t.credential_sha256,
        )
    }));
    let want = rows(desired.tenants.iter().map(|t| {
        (
            (&t.name, &t.uid),
            t.ceiling,
            &t.pool,
            t.block_size,
            &t.dtype,
            &t.credential_sha256,
        )
    }));
    let mut pools = current.pools.clone();
    pools.sort_by(|a, b| a.name.cmp(&b.name));
    have == want && pools == desired.pools
}

/// A tenant as the ledger comparison sees it: its name and holder, its fields, with its
/// credential hashes sorted.
type Row<'a> = (
    (&'a String, &'a String),
    u64,
    &'a String,
    u32,
    &'a String,
    Vec<&'a bytes::Bytes>,
);

/// Every tenant's row, sorted.
#[allow(clippy::type_complexity)]
fn rows<'a>(
    tenants: impl Iterator<
        Item = (
            (&'a String, &'a String),
            u64,
            &'a String,
            u32,
            &'a String,
            &'a Vec<bytes::Bytes>,
        ),
    >,
) -> Vec<Row<'a>> {
    let mut out: Vec<Row<'a>> = tenants
        .map(|(name, ceiling, pool, block_size, dtype, hashes)| {
            let mut h: Vec<&bytes::Bytes> = hashes.iter().collect();
            h.sort();
            (name, ceiling, pool, block_size, dtype, h)
        })
        .collect();
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use kvcache_api::common::UsedBy;
    use kvcache_store::proto::TenantStatus;

    use super::*;

    fn binding(ns: &str, name: &str, pool: &str, domain: Option<&str>, ceiling: &str) -> KVCachePoolBinding {
        let mut d = serde_json::json!({"blockSize": 64, "dtype": "bfloat16"});
        if let Some(n) = domain {
            d["name"] = n.into();
        }
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": ns},
            "spec": {"poolRef": {"name": pool}, "quota": {"ceiling": ceiling}, "domain": d}
        }))
        .unwrap()
    }

    fn pool(name: &str, backend: &str) -> KVCachePool {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name}, "spec": {"backends": [backend], "quota": {"total": "16Gi"}}
        }))
        .unwrap()
    }

    #[test]
    fn the_ledger_holds_every_binding_of_every_pool_on_the_backend() {
        let pools = [pool("p1", "b"), pool("p2", "b"), pool("other", "c")];
        let bindings = [
            binding("team-a", "a", "p1", None, "8Gi"),
            binding("team-b", "x", "p2", Some("qwen"), "1Gi"),
            binding("team-c", "y", "other", Some("llama"), "1Gi"),
        ];
        let l = render_ledger("b", &pools, &bindings, None, &Credentials::new());
        let names: Vec<(&str, &str)> = l.tenants.iter().map(|t| (t.name.as_str(), t.pool.as_str())).collect();
        assert_eq!(names, [("default", "p1"), ("qwen", "p2")]);
        assert_eq!(l.tenants[0].ceiling, 8 << 30);
        assert_eq!((l.tenants[0].block_size, l.tenants[0].dtype.as_str()), (64, "bfloat16"));
        let totals: Vec<(&str, u64)> = l.pools.iter().map(|p| (p.name.as_str(), p.total)).collect();
        assert_eq!(
            totals,
            [("p1", 16 << 30), ("p2", 16 << 30)],
            "the pools on the backend, with their totals"
        );
        let without = render_ledger("b", &pools, &bindings, Some("p2"), &Credentials::new());
        assert_eq!(without.tenants.len(), 1, "a released pool's tenants leave the ledger");
        assert_eq!(without.pools.len(), 1, "and so does the pool");
    }

    #[test]
    fn a_deleting_binding_leaves_the_ledger_unless_workloads_hold_it() {
        let pools = [pool("p1", "b")];
        let mut b = binding("team-a", "a", "p1", None, "1Gi");
        b.metadata.deletion_timestamp = Some(crate::registry::meta::now());
        assert!(
            render_ledger("b", &pools, std::slice::from_ref(&b), None, &Credentials::new())
                .tenants
                .is_empty()
        );
        b.status = Some(kvcache_api::binding::BindingStatus {
            used_by: vec![UsedBy {
                kind: "ModelDeployment".into(),
                namespace: String::new(),
                name: "m".into(),
            }],
            ..Default::default()
        });
        assert_eq!(
            render_ledger("b", &pools, &[b], None, &Credentials::new())
                .tenants
                .len(),
            1
        );
    }

    #[test]
    fn an_entry_carries_its_own_bindings_credentials_and_refuses_everyone_before() {
        let pools = [pool("p1", "b")];
        let mut b = binding("team-a", "a", "p1", None, "1Gi");
        b.metadata.uid = Some("uid-2".into());
        let unminted = render_ledger("b", &pools, std::slice::from_ref(&b), None, &Credentials::new());
        assert_eq!(unminted.tenants[0].credential_sha256, [NOT_YET_MINTED.to_vec()]);
        let key = BindingKey::new("team-a", "a");
        let mut c = TenantCredentials::mint("uid-1", "");
        let earlier = Credentials::from([(key.clone(), c.clone())]);
        let l = render_ledger("b", &pools, std::slice::from_ref(&b), None, &earlier);
        assert_eq!(
            l.tenants[0].credential_sha256,
            [NOT_YET_MINTED.to_vec()],
            "a credential minted for an earlier Binding of that name is not this one's"
        );
        c.uid = "uid-2".into();
        c.rotation = crate::runtime::credentials::Rotation::Staged { next: "n".into() };
        let l = render_ledger("b", &pools, &[b], None, &Credentials::from([(key, c.clone())]));
        let want: Vec<bytes::Bytes> = c.hashes().iter().map(|h| bytes::Bytes::copy_from_slice(h)).collect();
        assert_eq!(l.tenants[0].credential_sha256, want);
        let mut leader = GetTenantsResponse {
            multi_tenancy: true,
            tenants: vec![TenantStatus {
                name: "default".into(),
                ceiling: 1 << 30,
                block_size: 64,
                dtype: "bfloat16".into(),
                credential_sha256: want.iter().rev().cloned().collect(),
                pool: "p1".into(),
                uid: l.tenants[0].uid.clone(),
                ..Default::default()
            }],
            pools: l.pools.clone(),
        };
        assert!(same_ledger(&leader, &l), "hashes compare in any order");
        leader.pools[0].total += 1;
        assert!(!same_ledger(&leader, &l), "a pool's total is part of the ledger");
        leader.pools = l.pools.clone();
        leader.tenants[0].pool = "p2".into();
        assert!(!same_ledger(&leader, &l), "and so is each tenant's pool");
        leader.tenants[0].pool = "p1".into();
        leader.tenants[0].uid = "another-binding".into();
        assert!(!same_ledger(&leader, &l), "and its holder");
        leader.tenants[0].uid = l.tenants[0].uid.clone();
        leader.tenants[0].credential_sha256.pop();
        assert!(
            !same_ledger(&leader, &l),
            "a ledger missing a credential is not the same"
        );
    }
}
