//! The backend controller's decision, with no I/O: the status a pass makes of what the runtime
//! runs (the plan and its observation), the endpoints, and what the leader answered: endpoints,
//! capacity, members, LeaderAvailable, CapacityObserved, MembersMounted, PoolWrites, Deletable and
//! the phase, first match wins: Deleting once the deletion is requested; Error with no Admin
//! endpoint yet; Provisioning while the leader does not serve or is still starting; Error when it
//! cannot be read for any other reason; Degraded while MembersMounted is False; else Ready.
//! Table-tested below.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kvcache_api::KVCacheBackend;
use kvcache_api::backend::{BackendStatus, Capacity, Endpoint, EndpointName};
use kvcache_api::common::UsedBy;
use kvcache_api::conditions::backend::{capacity_observed, deletable, leader_available, members_mounted, pool_writes};
use kvcache_api::conditions::{self, BackendPhase, ConditionStatus, Observation};

use super::members::{member_rows, members_verdict};
use crate::controller::store_client::LeaderView;
use crate::controller::{human, quantity, shared};
use crate::runtime::{StoreObservation, StorePlan};

/// What the runtime runs for a managed backend: the plan, the nodes no group matched, and what it
/// observed of them.
pub type Observed = (StorePlan, Vec<String>, StoreObservation);

/// The endpoints a backend publishes: its runtime's address (managed), or those it declares
/// (external).
pub fn endpoints(obj: &KVCacheBackend, observed: Option<&Observed>) -> Vec<Endpoint> {
    match observed {
        Some((_, _, obs)) => match &obs.client_endpoint {
            Some(addr) => [EndpointName::Client, EndpointName::Admin]
                .into_iter()
                .map(|name| Endpoint {
                    name: Some(name),
                    address: addr.clone(),
                })
                .collect(),
            None => Vec::new(),
        },
        None => obj.spec.external().map(|e| e.endpoints.clone()).unwrap_or_default(),
    }
}

/// The address the leader is read at, once published.
pub fn admin(endpoints: &[Endpoint]) -> Option<String> {
    endpoints
        .iter()
        .find(|e| e.name == Some(EndpointName::Admin))
        .map(|e| e.address.clone())
}

/// The status of a pass: `read` is the leader's answer at the Admin endpoint (`None`: none is
/// published yet), `used_by` the pools that name the backend.
pub fn status(
    obj: &KVCacheBackend,
    observed: Option<&Observed>,
    read: Option<Result<LeaderView, String>>,
    used_by: Vec<UsedBy>,
    now: &Time,
) -> BackendStatus {
    let prev = obj.status.clone().unwrap_or_default();
    let generation = obj.metadata.generation;
    let mut st = BackendStatus {
        conditions: prev.conditions.clone(),
        endpoints: endpoints(obj, observed),
        ..BackendStatus::default()
    };
    let mut set = |st: &mut BackendStatus, o: Observation| {
        conditions::set(&mut st.conditions, o.generation(generation), now);
    };
    leader(obj, observed, read, &prev, &mut st, &mut set);
    let held = deletable_observation(&used_by);
    let held_message = held.message.clone();
    set(&mut st, held);
    st.used_by = used_by;
    if obj.metadata.deletion_timestamp.is_some() {
        st.phase = Some(BackendPhase::Deleting);
        st.phase_message = Some(held_message);
    }
    st
}

/// What the leader said: its conditions, capacity, members and the phase.
fn leader(
    obj: &KVCacheBackend,
    observed: Option<&Observed>,
    read: Option<Result<LeaderView, String>>,
    prev: &BackendStatus,
    st: &mut BackendStatus,
    set: &mut impl FnMut(&mut BackendStatus, Observation),
) {
    let admin = admin(&st.endpoints).unwrap_or_default();
    let view = match read {
        None => {
            let msg = "no Admin endpoint is published yet";
            fail_leader(st, set, leader_available::NO_ADMIN_ENDPOINT.as_str(), msg, prev);
            st.phase = Some(BackendPhase::Error);
            st.phase_message = Some(msg.into());
            return;
        }
        Some(Ok(v)) if v.health.serving => v,
        Some(Ok(v)) => {
            let msg = format!(
                "the leader at {admin} answers but does not serve (role {:?}); it is starting or a standby",
                v.health.role
            );
            fail_leader(st, set, leader_available::SERVICE_PLANE_NOT_ACTIVE.as_str(), &msg, prev);
            st.phase = Some(BackendPhase::Provisioning);
            st.phase_message = Some(msg);
            return;
        }
        Some(Err(e)) => {
            let (reason, msg) = match observed {
                Some((_, _, obs)) => leader_fault(obs, &e),
                None => (leader_available::LEADER_UNREACHABLE.as_str().to_owned(), e),
            };
            fail_leader(st, set, &reason, &msg, prev);
            let starting = reason == leader_available::LEADER_STARTING.as_str();
            st.phase = Some(if starting {
                BackendPhase::Provisioning
            } else {
                BackendPhase::Error
            });
            st.phase_message = Some(msg);
            return;
        }
    };
    // Say since when this leader serves and what its term took over from the members (a new term
    // adopts the values they still hold; `store/README.md`, "Failover"), so a warm or cold cache
    // after a failover is explained.
    let since = observed
        .and_then(|(_, _, obs)| obs.leader().ready_since)
        .and_then(|t| k8s_openapi::jiff::Timestamp::try_from(t).ok())
        .map(|t| format!(" since {}", t.strftime("%Y-%m-%dT%H:%M:%SZ")))
        .unwrap_or_default();
    let h = &view.health;
    let took_over = if h.adopted_objects > 0 {
        format!(
            "; its term took over {} objects ({}) its members held",
            h.adopted_objects,
            crate::controller::approx_bytes(h.adopted_bytes)
        )
    } else {
        "; its members handed over nothing (a first start, or members that started empty)".to_owned()
    };
    set(
        st,
        Observation::new(
            leader_available::TYPE,
            ConditionStatus::True,
            leader_available::SERVING,
            format!(
                "the leader at {admin} serves (role {}, term {}){since}{took_over}",
                h.role, h.epoch
            ),
        ),
    );
    st.capacity = Some(Capacity {
        total: Some(quantity(view.health.capacity)),
        used: Some(quantity(view.health.used)),
    });
    set(
        st,
        Observation::new(
            capacity_observed::TYPE,
            ConditionStatus::True,
            capacity_observed::OBSERVED,
            format!(
                "the leader reports {} of capacity, {} used",
                human(view.health.capacity),
                human(view.health.used)
            ),
        ),
    );
    st.members = member_rows(obj, &view, observed.map(|(p, _, _)| p));
    set(st, members_verdict(&view, observed));
    set(st, writes_verdict(&view));
    let mounted = conditions::find(&st.conditions, members_mounted::TYPE)
        .filter(|c| c.status == ConditionStatus::False.as_str())
        .map(|c| c.message.clone());
    st.phase = Some(if mounted.is_some() {
        BackendPhase::Degraded
    } else {
        BackendPhase::Ready
    });
    st.phase_message = mounted;
}

fn deletable_observation(used_by: &[UsedBy]) -> Observation {
    if used_by.is_empty() {
        return Observation::new(
            deletable::TYPE,
            ConditionStatus::True,
            deletable::UNUSED,
            "no pool names this backend",
        );
    }
    Observation::new(
        deletable::TYPE,
        ConditionStatus::False,
        deletable::IN_USE,
        shared::held_by(used_by, "backend"),
    )
}

/// The leader cannot be read: LeaderAvailable, CapacityObserved and MembersMounted are False for
/// the same reason, PoolWrites is Unknown, and the member list is kept.
fn fail_leader(
    st: &mut BackendStatus,
    set: &mut impl FnMut(&mut BackendStatus, Observation),
    reason: &str,
    message: &str,
    prev: &BackendStatus,
) {
    for t in [leader_available::TYPE, capacity_observed::TYPE, members_mounted::TYPE] {
        set(st, Observation::new(t, ConditionStatus::False, reason, message));
    }
    set(
        st,
        Observation::new(
            pool_writes::TYPE,
            ConditionStatus::Unknown,
            pool_writes::READ_FAILED,
            "the leader could not be read",
        ),
    );
    st.members = prev.members.clone();
}

/// Why a managed leader that could not be read is not serving, from what the runtime saw.
fn leader_fault(obs: &StoreObservation, error: &str) -> (String, String) {
    let l = &obs.leader();
    if let Some(why) = &l.refused {
        return (leader_available::LEADER_UNSCHEDULABLE.as_str().into(), why.clone());
    }
    if let Some((reason, message)) = l.waiting.as_ref().filter(|(r, _)| r != "CrashLoopBackOff") {
        // The kubelet's own word for why the container does not run (ImagePullBackOff, ...).
        return (reason.clone(), message.clone());
    }
    if !l.ready
        && let Some(exit) = &l.last_exit
    {
        return (
            leader_available::LEADER_CRASH_LOOPING.as_str().into(),
            format!(
                "the leader process ended ({}) and was restarted {} times",
                exit.describe(),
                l.restarts
            ),
        );
    }
    if l.running && l.ready {
        return (leader_available::LEADER_UNREACHABLE.as_str().into(), error.to_owned());
    }
    (
        leader_available::LEADER_STARTING.as_str().into(),
        "the leader process is starting".into(),
    )
}

fn writes_verdict(view: &LeaderView) -> Observation {
    let h = &view.health;
    if h.objects > 0 {
        return Observation::new(
            pool_writes::TYPE,
            ConditionStatus::True,
            pool_writes::WRITE_OBSERVED,
            format!("the store holds {} objects", h.objects),
        );
    }
    if h.used > 0 {
        return Observation::new(
            pool_writes::TYPE,
            ConditionStatus::True,
            pool_writes::ALLOCATION_OBSERVED,
            "space is allocated in the store",
        );
    }
    Observation::new(
        pool_writes::TYPE,
        ConditionStatus::Unknown,
        pool_writes::NO_WRITES_OBSERVED,
        "no write has been observed since the leader started",
    )
}

#[cfg(test)]
mod tests {
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
                "serving, its member missing",
                managed(),
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
}
