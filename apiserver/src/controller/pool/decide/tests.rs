//! The pool's decisions, case by case: a live pool (its conditions, phase and the ledger it sets)
//! and a deleting one (what holds its release, and the ledger without its domains).

use kvcache_store::proto::{PoolEntry, TenantStatus};
use serde_json::json;

use super::*;
use crate::controller::{FINALIZER, testing};

const REQUEUE: Duration = Duration::from_secs(15);

fn pool(total: &str) -> KVCachePool {
    serde_json::from_value(json!({
        "metadata": {"name": "p", "generation": 2, "finalizers": [FINALIZER]},
        "spec": {"backends": ["b"], "quota": {"total": total}}
    }))
    .unwrap()
}

fn deleting(mut p: KVCachePool) -> KVCachePool {
    p.metadata.deletion_timestamp = Some(crate::registry::meta::now());
    p
}

fn backend(multi_tenancy: bool, endpoints: bool, capacity: Option<&str>) -> KVCacheBackend {
    let mut b = json!({
        "metadata": {"name": "b"},
        "spec": {"type": "Mooncake", "connection": {"managed": {
            "leader": {"multiTenancy": multi_tenancy},
            "members": [{"medium": "DRAM", "capacityPerMember": "1Gi"}]}}},
        "status": {}
    });
    if endpoints {
        b["status"]["endpoints"] = json!([
            {"name": "Client", "address": "127.0.0.1:1"}, {"name": "Admin", "address": "127.0.0.1:2"}
        ]);
    }
    if let Some(c) = capacity {
        b["status"]["capacity"] = json!({"total": c});
    }
    serde_json::from_value(b).unwrap()
}

fn binding(ns: &str, pool: &str, ceiling: &str) -> KVCachePoolBinding {
    serde_json::from_value(json!({
        "metadata": {"name": ns, "namespace": ns},
        "spec": {"poolRef": {"name": pool}, "quota": {"ceiling": ceiling},
                 "domain": {"name": ns, "blockSize": 64, "dtype": "bfloat16"}}
    }))
    .unwrap()
}

/// What the leader holds when it holds exactly what `seen` declares, each tenant granted `grant`
/// bytes cut by `limit`.
fn holding(seen: &Observed, grant: u64, limit: GrantLimit) -> LeaderRead {
    let l = render_ledger("b", &seen.pools, &seen.bindings, None, &seen.credentials);
    LeaderRead::Ledger {
        current: leader_ledger(&l, grant, limit),
        refused: None,
    }
}

fn leader_ledger(l: &Ledger, grant: u64, limit: GrantLimit) -> GetTenantsResponse {
    GetTenantsResponse {
        multi_tenancy: true,
        tenants: l
            .tenants
            .iter()
            .map(|t| TenantStatus {
                name: t.name.clone(),
                ceiling: t.ceiling,
                grant,
                used: 1 << 20,
                objects: 3,
                hits: 1,
                misses: 3,
                block_size: t.block_size,
                dtype: t.dtype.clone(),
                credential_sha256: t.credential_sha256.clone(),
                pool: t.pool.clone(),
                uid: t.uid.clone(),
                limited_by: limit.into(),
                ..Default::default()
            })
            .collect(),
        pools: l.pools.clone(),
    }
}

fn seen(pool: &KVCachePool, bindings: Vec<KVCachePoolBinding>, backend: Option<KVCacheBackend>) -> Observed {
    Observed {
        pools: vec![pool.clone()],
        bindings,
        backend,
        ..Observed::default()
    }
}

fn reason(d: &Decision, type_: conditions::ConditionType) -> String {
    testing::condition(&d.status.as_ref().expect("a status").conditions, type_)
}

fn phase_of(d: &Decision) -> String {
    let st = d.status.as_ref().expect("a status");
    testing::phase(st.phase.map(|p| p.as_str()), st.phase_message.as_deref())
}

#[test]
fn a_live_pool() {
    type Check = fn(&Decision);
    let two = || vec![binding("team-a", "p", "1Gi"), binding("team-b", "p", "1Gi")];
    #[allow(clippy::type_complexity)]
    let table: Vec<(&str, KVCachePool, Box<dyn Fn(&KVCachePool) -> Observed>, Check)> = vec![
        (
            "no backend: an error naming it",
            pool("2Gi"),
            Box::new(|p| seen(p, vec![], None)),
            |d| {
                assert!(reason(d, backend_resolved::TYPE).starts_with("False|BackendNotFound|"));
                assert!(phase_of(d).starts_with("Error|the KVCacheBackend \"b\" does not exist"));
                assert_eq!(d.set_ledger, None);
            },
        ),
        (
            "no endpoints yet",
            pool("2Gi"),
            Box::new(|p| seen(p, vec![], Some(backend(true, false, None)))),
            |d| assert!(reason(d, backend_resolved::TYPE).starts_with("False|EndpointsNotPublished|")),
        ),
        (
            "the leader unreachable: both ledger conditions say so",
            pool("2Gi"),
            Box::new(|p| Observed {
                leader: LeaderRead::Unreachable("cannot reach the leader".into()),
                ..seen(p, vec![], Some(backend(true, true, Some("2Gi"))))
            }),
            |d| {
                assert_eq!(
                    reason(d, quota_ledger_available::TYPE),
                    "False|LedgerUnreachable|cannot reach the leader"
                );
                assert!(reason(d, quota_policy_writable::TYPE).starts_with("Unknown|LedgerUnreachable|"));
                assert!(phase_of(d).starts_with("Error|cannot reach the leader"));
            },
        ),
        (
            "a ledger that differs is set whole, with every pool's total",
            pool("2Gi"),
            Box::new(move |p| Observed {
                leader: LeaderRead::Ledger {
                    current: GetTenantsResponse {
                        multi_tenancy: true,
                        ..Default::default()
                    },
                    refused: None,
                },
                ..seen(p, two(), Some(backend(true, true, Some("2Gi"))))
            }),
            |d| {
                let l = d.set_ledger.as_ref().expect("a ledger to set");
                assert_eq!(l.tenants.len(), 2);
                assert!(l.tenants.iter().all(|t| t.pool == "p"));
                assert_eq!(
                    l.pools,
                    [PoolEntry {
                        name: "p".into(),
                        total: 2 << 30
                    }]
                );
            },
        ),
        (
            "the ledger as declared: Ready, with usage and each domain's figures",
            pool("2Gi"),
            Box::new(move |p| {
                let s = seen(p, two(), Some(backend(true, true, Some("2Gi"))));
                Observed {
                    leader: holding(&s, 1 << 30, GrantLimit::None),
                    ..s
                }
            }),
            |d| {
                assert_eq!(d.set_ledger, None);
                assert_eq!(phase_of(d), "Ready|");
                assert!(reason(d, quota_policy_writable::TYPE).contains("2 domains across 1 pools"));
                let st = d.status.as_ref().unwrap();
                assert_eq!(
                    st.usage.as_ref().and_then(|u| u.total.clone()),
                    Some(Quantity::from_bytes(2 << 20))
                );
                assert_eq!(st.domains.len(), 2);
                assert_eq!(
                    (st.domains[0].blocks, st.domains[0].hit_rate.as_deref()),
                    (Some(3), Some("0.25"))
                );
                assert_eq!(st.used_by.len(), 2);
                assert_eq!(st.client_endpoint.as_deref(), Some("127.0.0.1:1"));
            },
        ),
        (
            "Bindings over the total: Oversubscribed, and the store cuts within the pool",
            pool("1Gi"),
            Box::new(move |p| {
                let s = seen(p, two(), Some(backend(true, true, Some("8Gi"))));
                Observed {
                    leader: holding(&s, 512 << 20, GrantLimit::PoolTotal),
                    ..s
                }
            }),
            |d| {
                let r = reason(d, quota_within_total::TYPE);
                assert!(
                    r.starts_with("False|Oversubscribed|the Bindings ask for 2Gi in all, more than the pool's 1Gi"),
                    "{r}"
                );
                assert!(r.contains("no other pool's grants shrink"), "{r}");
                assert_eq!(phase_of(d), "Ready|", "an oversubscribed pool still serves");
                assert_eq!(
                    reason(d, capacity_allocatable::TYPE),
                    "True|Allocatable|the backend has 8Gi to grant"
                );
            },
        ),
        (
            "the capacity cut the pool's grants: CapacityAllocatable says so",
            pool("2Gi"),
            Box::new(move |p| {
                let s = seen(p, two(), Some(backend(true, true, Some("1Gi"))));
                Observed {
                    leader: holding(&s, 512 << 20, GrantLimit::Capacity),
                    ..s
                }
            }),
            |d| {
                assert!(reason(d, quota_within_total::TYPE).starts_with("True|WithinTotal|"));
                assert!(reason(d, capacity_allocatable::TYPE).contains("less than its pools may hand out together"));
            },
        ),
        (
            "nothing mounted",
            pool("2Gi"),
            Box::new(move |p| {
                let s = seen(p, two(), Some(backend(true, true, Some("0"))));
                Observed {
                    leader: holding(&s, 0, GrantLimit::Capacity),
                    ..s
                }
            }),
            |d| assert!(reason(d, capacity_allocatable::TYPE).starts_with("False|NothingToAllocate|")),
        ),
        (
            "a refused ledger: not writable, nothing retried in this pass",
            pool("2Gi"),
            Box::new(move |p| Observed {
                leader: LeaderRead::Ledger {
                    current: GetTenantsResponse {
                        multi_tenancy: true,
                        ..Default::default()
                    },
                    refused: Some("INVALID_TENANT_LEDGER: no".into()),
                },
                ..seen(p, two(), Some(backend(true, true, Some("2Gi"))))
            }),
            |d| {
                assert_eq!(d.set_ledger, None);
                assert!(reason(d, quota_policy_writable::TYPE).starts_with("False|QuotaPolicyNotWritable|"));
            },
        ),
        (
            "a single-tenant backend: Ready, no ledger asked for",
            pool("2Gi"),
            Box::new(move |p| seen(p, two(), Some(backend(false, true, Some("2Gi"))))),
            |d| {
                assert!(reason(d, quota_ledger_available::TYPE).starts_with("False|MultiTenancyDisabled|"));
                assert!(phase_of(d).starts_with("Ready|a single-tenant pool"));
                assert_eq!(d.set_ledger, None);
            },
        ),
    ];
    let now = crate::registry::meta::now();
    for (name, p, observed, check) in table {
        let d = decide(&p, &observed(&p), &now, REQUEUE);
        assert_eq!(d.next, Next::Requeue(REQUEUE), "{name}");
        assert!(!d.release, "{name}");
        let st = d.status.as_ref().unwrap();
        assert!(
            st.conditions.iter().all(|c| c.observed_generation == Some(2)),
            "{name}: conditions carry the generation"
        );
        check(&d);
    }
}

#[test]
fn a_deleting_pool() {
    let now = crate::registry::meta::now();
    let b = Some(backend(true, true, Some("2Gi")));
    let p = deleting(pool("2Gi"));
    let other = binding("team-a", "p", "1Gi");

    // held while a Binding names it
    let held = seen(&p, vec![other.clone()], b.clone());
    assert_eq!(leader_to_read(&p, held.backend.as_ref(), &held.bindings), None);
    let d = decide(&p, &held, &now, REQUEUE);
    assert_eq!(
        reason(&d, releasable::TYPE),
        "False|HeldByBindings|held by KVCachePoolBinding/team-a/team-a; delete them first, then this pool's deletion completes"
    );
    assert!(phase_of(&d).starts_with("Deleting|held by"));
    assert!(!d.release);

    // nothing holds it: the ledger without its domains, then the release
    let mut s = seen(&p, vec![], b.clone());
    s.pools.push(
        serde_json::from_value(
            json!({"metadata": {"name": "q"}, "spec": {"backends": ["b"], "quota": {"total": "1Gi"}}}),
        )
        .unwrap(),
    );
    let with_p = Ledger {
        tenants: vec![],
        pools: vec![
            PoolEntry {
                name: "p".into(),
                total: 2 << 30,
            },
            PoolEntry {
                name: "q".into(),
                total: 1 << 30,
            },
        ],
    };
    assert_eq!(
        leader_to_read(&p, s.backend.as_ref(), &s.bindings).as_deref(),
        Some("127.0.0.1:2")
    );
    s.leader = LeaderRead::Ledger {
        current: leader_ledger(&with_p, 0, GrantLimit::None),
        refused: None,
    };
    let d = decide(&p, &s, &now, REQUEUE);
    let released = d.set_ledger.clone().expect("the ledger without the pool");
    assert_eq!(
        released.pools,
        [PoolEntry {
            name: "q".into(),
            total: 1 << 30
        }]
    );
    assert!(!d.release, "released only once the leader holds it");
    s.leader = LeaderRead::Ledger {
        current: leader_ledger(&released, 0, GrantLimit::None),
        refused: None,
    };
    let d = decide(&p, &s, &now, REQUEUE);
    assert!(d.release && d.status.is_none() && d.next == Next::AwaitChange);

    // the leader cannot be reached: the deletion waits and says why
    s.leader = LeaderRead::Unreachable("cannot reach the leader".into());
    let d = decide(&p, &s, &now, REQUEUE);
    assert!(reason(&d, releasable::TYPE).starts_with("False|LedgerNotReleased|"));
    assert_eq!(d.next, Next::Requeue(RELEASE_RETRY));

    // a backend going away takes its ledger with it: nothing to ask, released at once
    let mut gone = backend(true, true, Some("2Gi"));
    gone.metadata.deletion_timestamp = Some(now.clone());
    assert_eq!(leader_to_read(&p, Some(&gone), &[]), None);
    let d = decide(&p, &seen(&p, vec![], Some(gone)), &now, REQUEUE);
    assert!(d.release);

    // our finalizer already gone: nothing to do
    let mut bare = p.clone();
    bare.metadata.finalizers = None;
    let d = decide(&bare, &seen(&bare, vec![], b), &now, REQUEUE);
    assert_eq!((d.status, d.release, d.next), (None, false, Next::AwaitChange));
}
