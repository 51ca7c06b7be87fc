//! The tenant ledger of a backend, as the pools render it: one entry per Binding of every pool on
//! the backend (its domain, ceiling, layout and the hashes of its credentials), set on the leader
//! whole with `SetTenants` when it differs from what the leader holds, never partially.

use std::collections::HashMap;

use kvcache_api::conditions::pool::{quota_ledger_available, quota_policy_writable};
use kvcache_api::conditions::{ConditionStatus, Observation};
use kvcache_api::pool::PoolStatus;
use kvcache_api::{KVCacheBackend, KVCachePool, KVCachePoolBinding, Quantity};
use kvcache_store::proto::{GetTenantsResponse, TenantEntry};

use super::Context;
use super::leader::{self, Leader};
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
    }
}

/// Whether a Binding's tenant stays in the ledger: live, or deleting while workloads still hold it.
pub fn in_ledger(b: &KVCachePoolBinding) -> bool {
    b.metadata.deletion_timestamp.is_none() || b.status.as_ref().is_some_and(|s| !s.used_by.is_empty())
}

/// The whole ledger of `backend`: the tenants of every Binding of every pool on it, except `without`.
pub fn render_ledger(
    backend: &str,
    pools: &[KVCachePool],
    bindings: &[KVCachePoolBinding],
    without: Option<&str>,
    credentials: &Credentials,
) -> Vec<TenantEntry> {
    let names: Vec<&str> = pools
        .iter()
        .filter(|p| p.spec.backend() == Some(backend) && Some(p.name()) != without)
        .map(|p| p.name())
        .collect();
    let mut out: Vec<TenantEntry> = bindings
        .iter()
        .filter(|b| names.contains(&b.spec.pool_name()) && in_ledger(b))
        .map(|b| tenant_entry(b, credentials))
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// Whether the leader's ledger already is `desired` (names, ceilings, layouts and credentials).
pub fn same_ledger(current: &GetTenantsResponse, desired: &[TenantEntry]) -> bool {
    type Row = (String, u64, u32, String, Vec<bytes::Bytes>);
    let sorted = |mut h: Vec<bytes::Bytes>| {
        h.sort();
        h
    };
    let mut have: Vec<Row> = current
        .tenants
        .iter()
        .map(|t| {
            let h = sorted(t.credential_sha256.clone());
            (t.name.clone(), t.ceiling, t.block_size, t.dtype.clone(), h)
        })
        .collect();
    have.sort();
    let mut want: Vec<Row> = desired
        .iter()
        .map(|t| {
            let h = sorted(t.credential_sha256.clone());
            (t.name.clone(), t.ceiling, t.block_size, t.dtype.clone(), h)
        })
        .collect();
    want.sort();
    have == want
}

/// Why a pool has no ledger to write: both ledger conditions say so with one reason.
#[derive(Clone, Copy, Debug)]
pub enum NoLedger {
    /// The backend keeps none (multi-tenancy is off); not a fault for the phase.
    MultiTenancyDisabled,
    /// The leader could not be read.
    Unreachable,
}

/// QuotaLedgerAvailable False and QuotaPolicyWritable Unknown, for `why`.
pub fn no_ledger(st: &mut PoolStatus, set: &impl Fn(&mut PoolStatus, Observation), why: NoLedger, msg: &str) {
    let (available, writable) = match why {
        NoLedger::MultiTenancyDisabled => (
            quota_ledger_available::MULTI_TENANCY_DISABLED,
            quota_policy_writable::MULTI_TENANCY_DISABLED,
        ),
        NoLedger::Unreachable => (
            quota_ledger_available::LEDGER_UNREACHABLE,
            quota_policy_writable::LEDGER_UNREACHABLE,
        ),
    };
    set(
        st,
        Observation::new(quota_ledger_available::TYPE, ConditionStatus::False, available, msg),
    );
    set(
        st,
        Observation::new(quota_policy_writable::TYPE, ConditionStatus::Unknown, writable, msg),
    );
}

/// What the ledger is rendered from: every pool, every Binding and every Binding's credentials.
#[derive(Clone, Copy, Debug)]
pub struct Declared<'a> {
    pub pools: &'a [KVCachePool],
    pub bindings: &'a [KVCachePoolBinding],
    pub credentials: &'a Credentials,
}

/// Reads the leader's ledger and sets it whole when it differs from what the Bindings declare;
/// returns the ledger as the leader then holds it.
pub async fn converge_ledger(
    admin: &str,
    backend: &KVCacheBackend,
    declared: &Declared<'_>,
    ctx: &Context,
    st: &mut PoolStatus,
    set: &impl Fn(&mut PoolStatus, Observation),
) -> Option<GetTenantsResponse> {
    let read = async {
        let leader = Leader::connect(admin, ctx.opts.leader_timeout, ctx.runtime.control_token()).await?;
        let current = leader.tenants().await?;
        Ok::<_, leader::LeaderError>((leader, current))
    };
    let (leader, current) = match read.await {
        Ok(r) => r,
        Err(e) => {
            no_ledger(st, set, NoLedger::Unreachable, &e.0);
            return None;
        }
    };
    if !current.multi_tenancy {
        let msg = "the leader keeps no tenant ledger (multi-tenancy is off)";
        no_ledger(st, set, NoLedger::MultiTenancyDisabled, msg);
        return None;
    }
    set(
        st,
        Observation::new(
            quota_ledger_available::TYPE,
            ConditionStatus::True,
            quota_ledger_available::AVAILABLE,
            "the leader keeps a tenant ledger",
        ),
    );
    let Declared {
        pools,
        bindings,
        credentials,
    } = *declared;
    let desired = render_ledger(backend.name(), pools, bindings, None, credentials);
    let written = desired.len();
    let on_backend = pools
        .iter()
        .filter(|p| p.spec.backend() == Some(backend.name()))
        .count();
    let current = if same_ledger(&current, &desired) {
        current
    } else {
        let set_and_read = async {
            let dropped = leader.set_tenants(desired).await?;
            tracing::info!(
                backend = backend.name(),
                tenants = written,
                dropped,
                "tenant ledger set"
            );
            leader.tenants().await
        };
        match set_and_read.await {
            Ok(t) => t,
            Err(e) if e.is_refusal() => {
                set(
                    st,
                    Observation::new(
                        quota_policy_writable::TYPE,
                        ConditionStatus::False,
                        quota_policy_writable::QUOTA_POLICY_NOT_WRITABLE,
                        format!("the leader refused the ledger, nothing was applied: {e}"),
                    ),
                );
                return Some(current);
            }
            Err(e) => {
                no_ledger(st, set, NoLedger::Unreachable, &e.0);
                return None;
            }
        }
    };
    set(
        st,
        Observation::new(
            quota_policy_writable::TYPE,
            ConditionStatus::True,
            quota_policy_writable::WRITABLE,
            format!("the ledger holds {written} domains across {on_backend} pools on the backend"),
        ),
    );
    Some(current)
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
        let names: Vec<&str> = l.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["default", "qwen"]);
        assert_eq!(l[0].ceiling, 8 << 30);
        assert_eq!((l[0].block_size, l[0].dtype.as_str()), (64, "bfloat16"));
        let without = render_ledger("b", &pools, &bindings, Some("p2"), &Credentials::new());
        assert_eq!(without.len(), 1, "a released pool's tenants leave the ledger");
    }

    #[test]
    fn a_deleting_binding_leaves_the_ledger_unless_workloads_hold_it() {
        let pools = [pool("p1", "b")];
        let mut b = binding("team-a", "a", "p1", None, "1Gi");
        b.metadata.deletion_timestamp = Some(crate::registry::meta::now());
        assert!(render_ledger("b", &pools, std::slice::from_ref(&b), None, &Credentials::new()).is_empty());
        b.status = Some(kvcache_api::binding::BindingStatus {
            used_by: vec![UsedBy {
                kind: "ModelDeployment".into(),
                namespace: String::new(),
                name: "m".into(),
            }],
            ..Default::default()
        });
        assert_eq!(render_ledger("b", &pools, &[b], None, &Credentials::new()).len(), 1);
    }

    #[test]
    fn an_entry_carries_its_own_bindings_credentials_and_refuses_everyone_before() {
        let pools = [pool("p1", "b")];
        let mut b = binding("team-a", "a", "p1", None, "1Gi");
        b.metadata.uid = Some("uid-2".into());
        let unminted = render_ledger("b", &pools, std::slice::from_ref(&b), None, &Credentials::new());
        assert_eq!(unminted[0].credential_sha256, [NOT_YET_MINTED.to_vec()]);
        let key = BindingKey::new("team-a", "a");
        let mut c = TenantCredentials::mint("uid-1", "");
        let earlier = Credentials::from([(key.clone(), c.clone())]);
        let l = render_ledger("b", &pools, std::slice::from_ref(&b), None, &earlier);
        assert_eq!(
            l[0].credential_sha256,
            [NOT_YET_MINTED.to_vec()],
            "a credential minted for an earlier Binding of that name is not this one's"
        );
        c.uid = "uid-2".into();
        c.rotation = crate::runtime::credentials::Rotation::Staged { next: "n".into() };
        let l = render_ledger("b", &pools, &[b], None, &Credentials::from([(key, c.clone())]));
        let want: Vec<bytes::Bytes> = c.hashes().iter().map(|h| bytes::Bytes::copy_from_slice(h)).collect();
        assert_eq!(l[0].credential_sha256, want);
        let mut leader = GetTenantsResponse {
            multi_tenancy: true,
            tenants: vec![TenantStatus {
                name: "default".into(),
                ceiling: 1 << 30,
                block_size: 64,
                dtype: "bfloat16".into(),
                credential_sha256: want.iter().rev().cloned().collect(),
                ..Default::default()
            }],
        };
        assert!(same_ledger(&leader, &l), "hashes compare in any order");
        leader.tenants[0].credential_sha256.pop();
        assert!(
            !same_ledger(&leader, &l),
            "a ledger missing a credential is not the same"
        );
    }
}
