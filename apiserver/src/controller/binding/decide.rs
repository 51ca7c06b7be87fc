//! The Binding controller's decision, with no I/O: from what a pass observed (the workloads that
//! use the Binding, its credential, the leader's ledger) to the status to write, the event for a
//! grant that moved, and whether the deletion may complete. The table tests below hold its rules,
//! case by case: a live Binding, a credential rotation and a deleting Binding.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kvcache_api::binding::BindingStatus;
use kvcache_api::common::UsedBy;
use kvcache_api::conditions::binding::{domain_exclusive, quota_granted, quota_observed, releasable};
use kvcache_api::conditions::{self, BindingPhase, ConditionStatus, Observation};
use kvcache_api::{KVCachePoolBinding, Quantity};
use kvcache_store::proto::{GetTenantsResponse, GrantLimit, TenantStatus};

use crate::controller::shared::{self, Next};
use crate::controller::status::{Axes, axes, has_finalizer};
use crate::controller::{human, quantity};

/// What a pass observed.
#[derive(Clone, Debug)]
pub struct Observed {
    /// the ModelDeployments of the namespace that attach through the Binding, by name
    pub used_by: Vec<UsedBy>,
    /// the SHA-256 of the credential replicas are given now
    pub credential_hash: [u8; 32],
    /// a rotation of the credential is under way
    pub rotating: bool,
    /// the leader's ledger, or why it could not be read
    pub leader: Result<GetTenantsResponse, String>,
}

/// What the pass does.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// the status to write (`None`: leave it)
    pub status: Option<BindingStatus>,
    /// nothing holds the deleting Binding: forget its credentials and remove the finalizer
    pub release: bool,
    /// the message of a `GrantChanged` event, when the leader's grant moved
    pub grant_changed: Option<String>,
    pub next: Next,
}

/// How soon a Binding whose credential is rotating is looked at again (the rotation waits on the
/// ledger and on the replicas' rollout).
pub const ROTATION_POLL: Duration = Duration::from_secs(1);

/// The pass's decision.
pub fn decide(b: &KVCachePoolBinding, seen: &Observed, now: &Time, requeue: Duration) -> Decision {
    let mut d = Decision {
        status: None,
        release: false,
        grant_changed: None,
        next: Next::Requeue(requeue),
    };
    let generation = b.metadata.generation;
    let set = |st: &mut BindingStatus, o: Observation| {
        conditions::set(&mut st.conditions, o.generation(generation), now);
    };
    let prev = b.status.clone().unwrap_or_default();
    if b.metadata.deletion_timestamp.is_some() {
        if !has_finalizer(b) {
            d.next = Next::AwaitChange;
        } else if seen.used_by.is_empty() {
            d.release = true;
            d.next = Next::AwaitChange;
        } else {
            let mut st = prev;
            let msg = shared::held_by(&seen.used_by, "Binding");
            set(
                &mut st,
                Observation::new(
                    releasable::TYPE,
                    ConditionStatus::False,
                    releasable::HELD_BY_WORKLOADS,
                    &msg,
                ),
            );
            st.used_by = seen.used_by.clone();
            st.phase = Some(BindingPhase::Deleting);
            st.phase_message = Some(msg);
            d.status = Some(st);
        }
        return d;
    }
    let mut st = BindingStatus {
        conditions: prev.conditions.clone(),
        used_by: seen.used_by.clone(),
        ..BindingStatus::default()
    };
    // Storage admits a domain once per backend, atomically with the write.
    set(
        &mut st,
        Observation::new(
            domain_exclusive::TYPE,
            ConditionStatus::True,
            domain_exclusive::EXCLUSIVE,
            format!(
                "this Binding alone holds the domain {:?} on its backend",
                b.spec.domain_name()
            ),
        ),
    );
    for o in quota(b, seen, &prev, &mut st) {
        set(&mut st, o);
    }
    let (phase, message) = phase(&st);
    st.phase = Some(phase);
    st.phase_message = message;
    if prev.effective_quota.is_some() && st.effective_quota.is_some() && prev.effective_quota != st.effective_quota {
        d.grant_changed = Some(format!(
            "the leader now grants {} (was {})",
            st.effective_quota.as_ref().map(Quantity::as_str).unwrap_or_default(),
            prev.effective_quota.as_ref().map(Quantity::as_str).unwrap_or_default()
        ));
    }
    d.status = Some(st);
    if seen.rotating {
        d.next = Next::Requeue(requeue.min(ROTATION_POLL));
    }
    d
}

/// The figures read from the leader's ledger, and QuotaObserved and QuotaGranted.
fn quota(b: &KVCachePoolBinding, seen: &Observed, prev: &BindingStatus, st: &mut BindingStatus) -> Vec<Observation> {
    let tenant = b.spec.domain_name();
    let observed = |reason, msg: String| Observation::new(quota_observed::TYPE, ConditionStatus::True, reason, msg);
    let t = match &seen.leader {
        Err(e) => {
            // figures kept from the last pass
            st.requested_quota = prev.requested_quota.clone();
            st.effective_quota = prev.effective_quota.clone();
            st.usage = prev.usage.clone();
            st.over_quota = prev.over_quota;
            return vec![Observation::new(
                quota_observed::TYPE,
                ConditionStatus::False,
                quota_observed::MASTER_NOT_SCRAPED,
                e,
            )];
        }
        Ok(t) => t,
    };
    if !t.multi_tenancy {
        if let Some(d) = t.tenants.iter().find(|x| x.name == "default") {
            st.usage = Some(quantity(d.used));
            st.blocks = Some(i64::try_from(d.objects).unwrap_or(i64::MAX));
            st.hit_rate = shared::hit_rate(d.hits, d.misses);
        }
        return vec![
            observed(
                quota_observed::NO_TENANT_LEDGER,
                "the leader keeps no tenant ledger (multi-tenancy is off)".into(),
            ),
            Observation::new(
                quota_granted::TYPE,
                ConditionStatus::True,
                quota_granted::UNENFORCED,
                "no per-domain quota is in force: writes land in the store's default tenant, bounded only by its capacity",
            ),
        ];
    }
    let Some(x) = t.tenants.iter().find(|x| x.name == tenant) else {
        return vec![
            observed(
                quota_observed::TENANT_NOT_IN_LEDGER,
                format!("the leader's ledger has no tenant {tenant:?} yet; the pool writes it"),
            ),
            Observation::new(
                quota_granted::TYPE,
                ConditionStatus::False,
                quota_granted::NO_LEDGER_ENTRY,
                format!("the leader would refuse writes of tenant {tenant:?} until the pool registers it"),
            ),
        ];
    };
    if !x.credential_sha256.iter().any(|h| h.as_ref() == seen.credential_hash) {
        return vec![
            observed(
                quota_observed::OBSERVED,
                format!("read from the leader's ledger: the tenant {tenant:?}"),
            ),
            Observation::new(
                quota_granted::TYPE,
                ConditionStatus::False,
                quota_granted::NO_LEDGER_ENTRY,
                format!(
                    "the leader's ledger does not bind the tenant {tenant:?} to this Binding's credential yet; the pool writes it"
                ),
            ),
        ];
    }
    st.requested_quota = Some(quantity(x.ceiling));
    st.effective_quota = Some(quantity(x.grant));
    st.usage = Some(quantity(x.used));
    st.over_quota = Some(x.over_grant);
    st.blocks = Some(i64::try_from(x.objects).unwrap_or(i64::MAX));
    st.hit_rate = shared::hit_rate(x.hits, x.misses);
    vec![
        observed(
            quota_observed::OBSERVED,
            format!(
                "read from the leader's ledger: the tenant {tenant:?}, its grant and its usage (reserved writes included)"
            ),
        ),
        granted(x, t),
    ]
}

/// QuotaGranted for a tenant the ledger binds to this Binding, saying which limit cut its grant.
fn granted(x: &TenantStatus, t: &GetTenantsResponse) -> Observation {
    let why = match x.limited_by() {
        GrantLimit::None => String::new(),
        GrantLimit::PoolTotal => {
            let total = t.pools.iter().find(|p| p.name == x.pool).map(|p| p.total).unwrap_or(0);
            format!(
                ": the Bindings of the pool {:?} ask for more than its total of {}, which they share in proportion",
                x.pool,
                human(total)
            )
        }
        GrantLimit::Capacity => ": the pools on the backend may hand out more than its mounted capacity, which they \
                                  share in proportion (see the pool's CapacityAllocatable)"
            .to_owned(),
    };
    if x.grant > 0 {
        Observation::new(
            quota_granted::TYPE,
            ConditionStatus::True,
            quota_granted::GRANTED,
            format!("granted {} of the {} asked for{why}", human(x.grant), human(x.ceiling)),
        )
    } else {
        let msg = if why.is_empty() {
            "the leader grants nothing: see the pool's CapacityAllocatable (nothing mounted) or its QuotaWithinTotal"
                .to_owned()
        } else {
            format!("the leader grants nothing{why}")
        };
        Observation::new(
            quota_granted::TYPE,
            ConditionStatus::False,
            quota_granted::ZERO_GRANTED,
            msg,
        )
    }
}

/// The Binding's phase over DomainExclusive, QuotaObserved and QuotaGranted, in that order: the
/// first axis that is not True is an Error, a missing one Provisioning, else Ready.
fn phase(st: &BindingStatus) -> (BindingPhase, Option<String>) {
    let order = [domain_exclusive::TYPE, quota_observed::TYPE, quota_granted::TYPE];
    match axes(&st.conditions, &order, |_| false) {
        Axes::Fault(message) => (BindingPhase::Error, Some(message)),
        Axes::Missing(t) => (
            BindingPhase::Provisioning,
            Some(format!("{t} has not been observed yet")),
        ),
        Axes::Clear => (
            BindingPhase::Ready,
            conditions::find(&st.conditions, quota_observed::TYPE).map(|c| c.message.clone()),
        ),
    }
}

#[cfg(test)]
mod tests {
    use kvcache_store::proto::PoolEntry;
    use serde_json::json;

    use super::*;
    use crate::controller::{FINALIZER, testing};

    const REQUEUE: Duration = Duration::from_secs(15);
    const CREDENTIAL: [u8; 32] = [7; 32];

    fn binding(status: serde_json::Value) -> KVCachePoolBinding {
        serde_json::from_value(json!({
            "metadata": {"name": "team-a", "namespace": "team-a", "generation": 3, "finalizers": [FINALIZER]},
            "spec": {"poolRef": {"name": "p"}, "quota": {"ceiling": "1Gi"},
                     "domain": {"name": "qwen", "blockSize": 64, "dtype": "bfloat16"}},
            "status": status
        }))
        .unwrap()
    }

    fn tenant(grant: u64, limit: GrantLimit, credential: [u8; 32]) -> TenantStatus {
        TenantStatus {
            name: "qwen".into(),
            ceiling: 1 << 30,
            grant,
            used: 3 << 20,
            objects: 5,
            hits: 3,
            misses: 1,
            over_grant: false,
            pool: "p".into(),
            limited_by: limit.into(),
            credential_sha256: vec![bytes::Bytes::copy_from_slice(&credential)],
            ..Default::default()
        }
    }

    fn ledger(tenants: Vec<TenantStatus>) -> Result<GetTenantsResponse, String> {
        Ok(GetTenantsResponse {
            multi_tenancy: true,
            tenants,
            pools: vec![PoolEntry {
                name: "p".into(),
                total: 1 << 30,
            }],
        })
    }

    fn seen(leader: Result<GetTenantsResponse, String>) -> Observed {
        Observed {
            used_by: vec![],
            credential_hash: CREDENTIAL,
            rotating: false,
            leader,
        }
    }

    fn condition(d: &Decision, type_: conditions::ConditionType) -> String {
        testing::condition(&d.status.as_ref().expect("a status").conditions, type_)
    }

    fn phase_of(d: &Decision) -> String {
        let st = d.status.as_ref().expect("a status");
        testing::phase(st.phase.map(|p| p.as_str()), st.phase_message.as_deref())
    }

    #[test]
    fn a_live_binding() {
        type Check = fn(&Decision);
        let figures = json!({"requestedQuota": "1Gi", "effectiveQuota": "512Mi", "usage": "1Mi", "overQuota": false});
        #[allow(clippy::type_complexity)]
        let table: Vec<(&str, serde_json::Value, Observed, Check)> = vec![
            (
                "the leader unreachable: figures kept from the last pass",
                figures.clone(),
                seen(Err("cannot reach the leader".into())),
                |d| {
                    assert_eq!(
                        condition(d, quota_observed::TYPE),
                        "False|MasterNotScraped|cannot reach the leader"
                    );
                    let st = d.status.as_ref().unwrap();
                    assert_eq!(st.effective_quota.as_ref().map(Quantity::as_str), Some("512Mi"));
                    assert_eq!(phase_of(d), "Error|cannot reach the leader");
                    assert_eq!(d.grant_changed, None);
                },
            ),
            (
                "no ledger on the leader: unenforced, the default tenant's figures",
                json!({}),
                seen(Ok(GetTenantsResponse {
                    multi_tenancy: false,
                    tenants: vec![TenantStatus {
                        name: "default".into(),
                        used: 1 << 20,
                        ..Default::default()
                    }],
                    pools: vec![],
                })),
                |d| {
                    assert!(condition(d, quota_granted::TYPE).starts_with("True|Unenforced|"));
                    assert!(condition(d, quota_observed::TYPE).starts_with("True|NoTenantLedger|"));
                    assert_eq!(
                        d.status.as_ref().unwrap().usage.as_ref().map(Quantity::as_str),
                        Some("1Mi")
                    );
                    assert!(phase_of(d).starts_with("Ready|"));
                },
            ),
            ("not in the ledger yet", json!({}), seen(ledger(vec![])), |d| {
                assert!(condition(d, quota_observed::TYPE).starts_with("True|TenantNotInLedger|"));
                assert!(condition(d, quota_granted::TYPE).starts_with("False|NoLedgerEntry|"));
                assert!(phase_of(d).starts_with("Error|the leader would refuse writes of tenant \"qwen\""));
            }),
            (
                "the ledger binds another credential",
                json!({}),
                seen(ledger(vec![tenant(1 << 30, GrantLimit::None, [9; 32])])),
                |d| {
                    let c = condition(d, quota_granted::TYPE);
                    assert!(c.starts_with("False|NoLedgerEntry|") && c.contains("credential"), "{c}");
                    assert_eq!(d.status.as_ref().unwrap().effective_quota, None, "nothing read as ours");
                },
            ),
            (
                "granted whole",
                json!({}),
                seen(ledger(vec![tenant(1 << 30, GrantLimit::None, CREDENTIAL)])),
                |d| {
                    assert_eq!(
                        condition(d, quota_granted::TYPE),
                        "True|Granted|granted 1Gi of the 1Gi asked for"
                    );
                    let st = d.status.as_ref().unwrap();
                    assert_eq!(
                        (
                            st.requested_quota.as_ref().map(Quantity::as_str),
                            st.effective_quota.as_ref().map(Quantity::as_str)
                        ),
                        (Some("1Gi"), Some("1Gi"))
                    );
                    assert_eq!(
                        (st.blocks, st.hit_rate.as_deref(), st.over_quota),
                        (Some(5), Some("0.75"), Some(false))
                    );
                    assert!(phase_of(d).starts_with("Ready|read from the leader's ledger"));
                    assert_eq!(d.grant_changed, None, "no earlier grant to change from");
                },
            ),
            (
                "cut by the pool's total, and the grant moved: an event",
                figures.clone(),
                seen(ledger(vec![tenant(256 << 20, GrantLimit::PoolTotal, CREDENTIAL)])),
                |d| {
                    assert_eq!(
                        condition(d, quota_granted::TYPE),
                        "True|Granted|granted 256Mi of the 1Gi asked for: the Bindings of the pool \"p\" ask for more \
                         than its total of 1Gi, which they share in proportion"
                    );
                    assert_eq!(
                        d.grant_changed.as_deref(),
                        Some("the leader now grants 256Mi (was 512Mi)")
                    );
                },
            ),
            (
                "cut by the capacity",
                json!({}),
                seen(ledger(vec![tenant(256 << 20, GrantLimit::Capacity, CREDENTIAL)])),
                |d| {
                    let c = condition(d, quota_granted::TYPE);
                    assert!(
                        c.starts_with("True|Granted|granted 256Mi") && c.contains("mounted capacity"),
                        "{c}"
                    );
                },
            ),
            (
                "nothing granted: an error that says which limit",
                json!({}),
                seen(ledger(vec![tenant(0, GrantLimit::Capacity, CREDENTIAL)])),
                |d| {
                    let c = condition(d, quota_granted::TYPE);
                    assert!(
                        c.starts_with("False|ZeroGranted|the leader grants nothing: the pools"),
                        "{c}"
                    );
                    assert!(phase_of(d).starts_with("Error|the leader grants nothing"));
                },
            ),
        ];
        let now = crate::registry::meta::now();
        for (name, status, observed, check) in table {
            let b = binding(status);
            let d = decide(&b, &observed, &now, REQUEUE);
            assert_eq!(d.next, Next::Requeue(REQUEUE), "{name}");
            assert!(!d.release, "{name}");
            assert!(
                condition(&d, domain_exclusive::TYPE).starts_with("True|Exclusive|"),
                "{name}"
            );
            check(&d);
        }
    }

    #[test]
    fn a_rotation_looks_again_soon() {
        let now = crate::registry::meta::now();
        let mut s = seen(ledger(vec![]));
        s.rotating = true;
        assert_eq!(
            decide(&binding(json!({})), &s, &now, REQUEUE).next,
            Next::Requeue(ROTATION_POLL)
        );
    }

    #[test]
    fn a_deleting_binding() {
        let now = crate::registry::meta::now();
        let mut b = binding(json!({"effectiveQuota": "1Gi"}));
        b.metadata.deletion_timestamp = Some(now.clone());
        let mut s = seen(Err(String::new()));
        s.used_by = vec![UsedBy {
            kind: "ModelDeployment".into(),
            namespace: String::new(),
            name: "qwen-chat".into(),
        }];
        let d = decide(&b, &s, &now, REQUEUE);
        assert_eq!(
            condition(&d, releasable::TYPE),
            "False|HeldByWorkloads|held by ModelDeployment/qwen-chat; delete them first, then this Binding's deletion \
             completes"
        );
        let st = d.status.as_ref().unwrap();
        assert_eq!(st.phase, Some(BindingPhase::Deleting));
        assert_eq!(
            st.effective_quota.as_ref().map(Quantity::as_str),
            Some("1Gi"),
            "the rest kept"
        );
        assert!(!d.release);
        s.used_by.clear();
        let d = decide(&b, &s, &now, REQUEUE);
        assert!(d.release && d.status.is_none() && d.next == Next::AwaitChange);
        b.metadata.finalizers = None;
        let d = decide(&b, &s, &now, REQUEUE);
        assert!(!d.release && d.status.is_none() && d.next == Next::AwaitChange);
    }
}
