//! The Binding's decisions, case by case: its grant, phase and conditions from the ledger and the
//! leader's word.

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
