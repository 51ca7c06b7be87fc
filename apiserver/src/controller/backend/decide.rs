//! The backend controller's decision, with no I/O: the status a pass makes of what the runtime
//! runs (the plan and its observation), the endpoints, and what the leader answered: endpoints,
//! capacity, members, LeaderAvailable, CapacityObserved, MembersMounted, PoolWrites, Deletable,
//! TierWasEmpty (`tier_survey.rs`) and the phase, first match wins: Deleting once the deletion is requested; Error with no Admin
//! endpoint yet; Provisioning while the leader does not serve or is still starting; Error when it
//! cannot be read for any other reason; Provisioning while the members of a backend that was
//! never Ready register (MembersMounted Unknown); Degraded while MembersMounted is False; else
//! Ready.
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
    if let Some(o) = super::tier_survey::decide(obj, observed.and_then(|(_, _, obs)| obs.tier_survey.as_ref()), &prev) {
        set(&mut st, o);
    }
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
    let Some(view) = serving_view(observed, read, &admin, prev, st, set) else {
        return;
    };
    set(st, serving_observation(observed, &view, &admin));
    // memory and the disk tiers' ceiling together (the condition's message tells them apart)
    st.capacity = Some(Capacity {
        total: Some(quantity(view.health.capacity.saturating_add(view.health.tier_capacity))),
        used: Some(quantity(view.health.used.saturating_add(view.health.tier_used))),
    });
    set(st, capacity_observation(&view));
    st.members = member_rows(obj, &view, observed.map(|(p, _, _)| p));
    let (members, starting) = first_mount(members_verdict(&view, observed), prev);
    set(st, members);
    set(st, writes_verdict(&view));
    let mounted = conditions::find(&st.conditions, members_mounted::TYPE)
        .filter(|c| c.status != ConditionStatus::True.as_str())
        .map(|c| c.message.clone());
    st.phase = Some(match (&mounted, starting) {
        (Some(_), true) => BackendPhase::Provisioning,
        (Some(_), false) => BackendPhase::Degraded,
        (None, _) => BackendPhase::Ready,
    });
    st.phase_message = mounted;
}

/// A backend that has never been Ready whose members have not registered yet is starting, not
/// degraded: MembersMounted reads Unknown (no Warning event) and the phase stays Provisioning.
/// A member that crashes, or one lost after the backend was Ready, is a fault as before.
fn first_mount(mut members: Observation, prev: &BackendStatus) -> (Observation, bool) {
    let never_ready = !matches!(prev.phase, Some(BackendPhase::Ready | BackendPhase::Degraded));
    let registering = [members_mounted::NO_SEGMENTS, members_mounted::SEGMENTS_SHORT]
        .iter()
        .any(|r| members.reason == r.as_str());
    let starting = never_ready && members.status == ConditionStatus::False && registering;
    if starting {
        members.status = ConditionStatus::Unknown;
        members.message = format!("the members are starting: {}", members.message);
    }
    (members, starting)
}

/// The leader's answer if it serves; else its conditions and the phase say why, and `None`.
fn serving_view(
    observed: Option<&Observed>,
    read: Option<Result<LeaderView, String>>,
    admin: &str,
    prev: &BackendStatus,
    st: &mut BackendStatus,
    set: &mut impl FnMut(&mut BackendStatus, Observation),
) -> Option<LeaderView> {
    match read {
        None => {
            let msg = "no Admin endpoint is published yet";
            fail_leader(st, set, leader_available::NO_ADMIN_ENDPOINT.as_str(), msg, prev);
            st.phase = Some(BackendPhase::Error);
            st.phase_message = Some(msg.into());
            None
        }
        Some(Ok(v)) if v.health.serving => Some(v),
        Some(Ok(v)) => {
            let msg = format!(
                "the leader at {admin} answers but does not serve (role {:?}); it is starting or a standby",
                v.health.role
            );
            fail_leader(st, set, leader_available::SERVICE_PLANE_NOT_ACTIVE.as_str(), &msg, prev);
            st.phase = Some(BackendPhase::Provisioning);
            st.phase_message = Some(msg);
            None
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
            None
        }
    }
}

/// LeaderAvailable True: the serving leader's role and term, since when, and what it took over.
fn serving_observation(observed: Option<&Observed>, view: &LeaderView, admin: &str) -> Observation {
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
    Observation::new(
        leader_available::TYPE,
        ConditionStatus::True,
        leader_available::SERVING,
        format!(
            "the leader at {admin} serves (role {}, term {}){since}{took_over}",
            h.role, h.epoch
        ),
    )
}

/// CapacityObserved True: the capacity the leader reports and how much of it is used (memory,
/// and the members' disk tiers apart when they have them).
fn capacity_observation(view: &LeaderView) -> Observation {
    let h = &view.health;
    let disk = if h.tier_capacity > 0 {
        format!(
            "; disk tiers: {} of capacity, {} used",
            human(h.tier_capacity),
            human(h.tier_used)
        )
    } else {
        String::new()
    };
    Observation::new(
        capacity_observed::TYPE,
        ConditionStatus::True,
        capacity_observed::OBSERVED,
        format!(
            "the leader reports {} of capacity, {} used{disk}",
            human(h.capacity),
            human(h.used)
        ),
    )
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
mod tests;
