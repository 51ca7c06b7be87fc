//! The backend's decisions, case by case: its phase and conditions from what the leader and the
//! runtime report.

use kvcache_store::proto::{HealthResponse, MemberStatus};
use serde_json::json;

use super::*;
use crate::runtime::{Exit, Node, WorkloadState};

fn managed() -> KVCacheBackend {
    serde_json::from_value(json!({
        "metadata": {"name": "b", "generation": 5},
        "spec": {"type": "Mooncake", "connection": {"managed": {"leader": {},
                 "members": [{"medium": "DRAM", "capacityPerMember": "1Gi"}]}}}
    }))
    .unwrap()
}

fn external() -> KVCacheBackend {
    serde_json::from_value(json!({
        "metadata": {"name": "b", "generation": 5},
        "spec": {"type": "Mooncake", "connection": {"external": {"endpoints": [
            {"name": "Client", "address": "10.0.0.1:50051"}, {"name": "Admin", "address": "10.0.0.1:50051"}]}}}
    }))
    .unwrap()
}

/// The plan for one stand-in node, with the leader in `leader` state.
fn observed(endpoint: bool, leader: WorkloadState) -> Observed {
    let b = managed();
    let (plan, unmatched) = super::super::plan(b.name(), &b.spec, &[Node::stand_in("node-0")]).unwrap();
    let obs = StoreObservation {
        client_endpoint: endpoint.then(|| "127.0.0.1:7".to_owned()),
        leaders: vec![leader],
        lease: None,
        members: plan
            .members
            .iter()
            .map(|m| (m.clone(), WorkloadState::default()))
            .collect(),
        rollout: None,
        tier_survey: None,
    };
    (plan, unmatched, obs)
}

fn up() -> WorkloadState {
    WorkloadState {
        running: true,
        ready: true,
        ..WorkloadState::default()
    }
}

fn view(serving: bool, members: &[&str]) -> LeaderView {
    LeaderView {
        health: HealthResponse {
            serving,
            role: "leader".into(),
            capacity: 1 << 30,
            used: 1 << 20,
            objects: 3,
            ..Default::default()
        },
        members: members
            .iter()
            .map(|n| MemberStatus {
                name: (*n).into(),
                capacity: 1 << 30,
                ..Default::default()
            })
            .collect(),
    }
}

fn pool(name: &str) -> UsedBy {
    UsedBy {
        kind: "KVCachePool".into(),
        namespace: String::new(),
        name: name.into(),
    }
}

fn condition(st: &BackendStatus, t: conditions::ConditionType) -> String {
    conditions::find(&st.conditions, t)
        .map(|c| format!("{}|{}", c.status, c.reason))
        .unwrap_or_default()
}

#[test]
fn a_backends_status_from_its_store_and_its_leader() {
    let crashed = WorkloadState {
        restarts: 3,
        last_exit: Some(Exit {
            code: Some(1),
            signal: None,
            log_tail: String::new(),
            at: std::time::SystemTime::UNIX_EPOCH,
        }),
        ..WorkloadState::default()
    };
    let unschedulable = WorkloadState {
        refused: Some("not enough memory".into()),
        ..WorkloadState::default()
    };
    let member = "b-member-0-node-0";
    #[allow(clippy::type_complexity)]
    let table: Vec<(
        &str,
        KVCacheBackend,
        Option<Observed>,
        Option<Result<LeaderView, String>>,
        &str,
        &str,
    )> = vec![
        (
            "no endpoint yet",
            managed(),
            Some(observed(false, WorkloadState::default())),
            None,
            "False|NoAdminEndpoint",
            "Error",
        ),
        (
            "an external store out of reach",
            external(),
            None,
            Some(Err("refused".into())),
            "False|LeaderUnreachable",
            "Error",
        ),
        (
            "a leader starting",
            managed(),
            Some(observed(
                true,
                WorkloadState {
                    running: true,
                    ..WorkloadState::default()
                },
            )),
            Some(Err("refused".into())),
            "False|LeaderStarting",
            "Provisioning",
        ),
        (
            "a leader that cannot be placed",
            managed(),
            Some(observed(true, unschedulable)),
            Some(Err("refused".into())),
            "False|LeaderUnschedulable",
            "Error",
        ),
        (
            "a leader crashing",
            managed(),
            Some(observed(true, crashed)),
            Some(Err("refused".into())),
            "False|LeaderCrashLooping",
            "Error",
        ),
        (
            "a standby answers",
            managed(),
            Some(observed(true, up())),
            Some(Ok(view(false, &[]))),
            "False|ServicePlaneNotActive",
            "Provisioning",
        ),
        (
            "serving, its member mounted",
            managed(),
            Some(observed(true, up())),
            Some(Ok(view(true, &[member]))),
            "True|Serving",
            "Ready",
        ),
        (
            "serving, its member not registered yet: starting",
            managed(),
            Some(observed(true, up())),
            Some(Ok(view(true, &[]))),
            "True|Serving",
            "Provisioning",
        ),
        (
            "serving, its member lost after it was Ready",
            {
                let mut b = managed();
                b.status = Some(kvcache_api::backend::BackendStatus {
                    phase: Some(kvcache_api::conditions::BackendPhase::Ready),
                    ..Default::default()
                });
                b
            },
            Some(observed(true, up())),
            Some(Ok(view(true, &[]))),
            "True|Serving",
            "Degraded",
        ),
    ];
    let now = crate::registry::meta::now();
    for (name, b, obs, read, leader, phase) in table {
        let serving = leader.starts_with("True");
        let st = status(&b, obs.as_ref(), read, vec![], &now);
        assert_eq!(condition(&st, leader_available::TYPE), leader, "{name}");
        assert_eq!(
            st.phase.map(|p| p.as_str()),
            Some(phase),
            "{name}: {:?}",
            st.phase_message
        );
        assert_eq!(condition(&st, deletable::TYPE), "True|Unused", "{name}");
        assert_eq!(
            st.capacity.is_some(),
            serving,
            "{name}: capacity only from a serving leader"
        );
        if serving {
            assert_eq!(condition(&st, pool_writes::TYPE), "True|WriteObserved", "{name}");
            let listed = usize::from(phase == "Ready");
            assert_eq!(st.members.len(), listed, "{name}: the members the leader lists");
        } else {
            assert_eq!(
                condition(&st, capacity_observed::TYPE),
                leader,
                "{name}: the same reason"
            );
            assert_eq!(condition(&st, pool_writes::TYPE), "Unknown|ReadFailed", "{name}");
        }
        assert!(st.conditions.iter().all(|c| c.observed_generation == Some(5)), "{name}");
    }
}

/// The Serving message says the term and what the term took over from the members, so a warm
/// or a cold cache after a failover is explained where the user looks.
#[test]
fn the_serving_message_says_the_term_and_what_it_took_over() {
    let obs = observed(true, up());
    let now = crate::registry::meta::now();
    let message = |adopted_objects, adopted_bytes| {
        let mut v = view(true, &["b-member-0-node-0"]);
        v.health.epoch = 7;
        v.health.adopted_objects = adopted_objects;
        v.health.adopted_bytes = adopted_bytes;
        let st = status(&managed(), Some(&obs), Some(Ok(v)), vec![], &now);
        let c = conditions::find(&st.conditions, leader_available::TYPE).expect("LeaderAvailable");
        assert_eq!(c.reason, leader_available::SERVING.as_str());
        c.message.clone()
    };
    let warm = message(1200, 3 << 30);
    assert!(warm.contains("serves (role leader, term 7)"), "{warm}");
    assert!(
        warm.ends_with("; its term took over 1200 objects (3.0 GiB) its members held"),
        "{warm}"
    );
    let cold = message(0, 0);
    assert!(cold.contains("serves (role leader, term 7)"), "{cold}");
    assert!(
        cold.ends_with("; its members handed over nothing (a first start, or members that started empty)"),
        "{cold}"
    );
}

#[test]
fn endpoints_come_from_the_runtime_or_the_spec() {
    let obs = observed(true, up());
    let e = endpoints(&managed(), Some(&obs));
    assert_eq!(admin(&e).as_deref(), Some("127.0.0.1:7"));
    assert_eq!(e.len(), 2);
    assert_eq!(admin(&endpoints(&external(), None)).as_deref(), Some("10.0.0.1:50051"));
    assert!(endpoints(&managed(), Some(&observed(false, up()))).is_empty());
}

#[test]
fn a_deletion_waits_for_the_pools_that_name_the_backend() {
    let mut b = managed();
    b.metadata.deletion_timestamp = Some(crate::registry::meta::now());
    let obs = observed(true, up());
    let st = status(
        &b,
        Some(&obs),
        Some(Ok(view(true, &[]))),
        vec![pool("p")],
        &crate::registry::meta::now(),
    );
    assert_eq!(condition(&st, deletable::TYPE), "False|InUse");
    assert_eq!(st.phase, Some(BackendPhase::Deleting));
    assert_eq!(
        st.phase_message.as_deref(),
        Some("held by KVCachePool/p; delete them first, then this backend's deletion completes")
    );
    assert_eq!(st.used_by, [pool("p")]);
}
