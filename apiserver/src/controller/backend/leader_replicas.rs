//! A managed backend's leader replicas: how many run and are ready
//! (`status.leader`), whether the Lease names a holder (ElectionObserved), whether every
//! replica runs the current configuration (RolloutComplete), and the
//! `KVCacheLeaderHandover` event when the holder changes (another replica, or the same address
//! restarted: the Lease's term tells them apart). The event waits until the new term's leader has
//! its members back (or [`HANDOVER_REPORT_WAIT`] passed), so it can say what the members handed
//! over: the objects and bytes the new term adopted. None of these moves the phase.

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kvcache_api::KVCacheBackend;
use kvcache_api::backend::{BackendStatus, LeaderReplicas};
use kvcache_api::conditions::backend::{election_observed, rollout_complete};
use kvcache_api::conditions::{self, ConditionStatus, Observation};

use crate::controller::Context;
use crate::runtime::{StoreObservation, StorePlan};

/// The event recorded when another leader replica takes over.
pub const HANDOVER: &str = "KVCacheLeaderHandover";
/// How long a handover's event waits for the members to remount at the new leader before it is
/// recorded with what was adopted so far.
pub const HANDOVER_REPORT_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// What the controller last saw of a backend's Lease: its holder and term, and a handover not yet
/// reported.
#[derive(Debug, Clone, Default)]
pub struct LeaseSeen {
    /// `"<holder> (term <leaseTransitions>)"`
    holder: String,
    pending: Option<Pending>,
}

/// A handover seen but not yet reported: the new term, and when it was seen.
#[derive(Debug, Clone)]
struct Pending {
    term: u64,
    lease: String,
    seen: std::time::Instant,
}

/// The handover event's message, once the new term's leader is read (`None`: wait).
fn handover_message(
    p: &Pending,
    health: Option<&kvcache_store::proto::HealthResponse>,
    members: usize,
) -> Option<String> {
    let waited = p.seen.elapsed() >= HANDOVER_REPORT_WAIT;
    let h = health.filter(|h| h.serving && h.epoch == p.term);
    let back = h.map_or(0, |h| h.members as usize);
    if back < members && !waited {
        return None;
    }
    let (objects, bytes) = h.map_or((0, 0), |h| (h.adopted_objects, h.adopted_bytes));
    let remounted = if back < members {
        format!("; {back} of {members} members have remounted so far, and each hands over its own as it does")
    } else {
        String::new()
    };
    Some(format!(
        "another leader replica took over the Lease {} (leaseTransitions {}); its members handed over what they \
         held: it adopted {objects} objects ({}) and serves them{remounted}",
        p.lease,
        p.term,
        crate::controller::approx_bytes(bytes)
    ))
}

/// Leader replicas, the rollout, the election and the handover event, from what the runtime
/// runs and what the Lease says.
pub async fn observe(
    st: &mut BackendStatus,
    obj: &KVCacheBackend,
    plan: &StorePlan,
    obs: &StoreObservation,
    health: Option<&kvcache_store::proto::HealthResponse>,
    ctx: &Context,
    set: &mut impl FnMut(&mut BackendStatus, Observation),
) {
    let desired = plan.election.as_ref().map_or(1, |e| e.replicas);
    let ready = obs.ready_leaders();
    st.leader = Some(LeaderReplicas {
        replicas: i32::try_from(desired).unwrap_or(i32::MAX),
        ready_replicas: i32::try_from(ready).unwrap_or(i32::MAX),
    });
    set(st, rollout(desired as usize, obs));
    let Some((ns, name)) = &obs.lease else {
        conditions::remove(&mut st.conditions, election_observed::TYPE);
        ctx.lease_holders.lock().remove(obj.name());
        return;
    };
    let lease = LeaseRead::get(ctx, ns, name).await;
    set(st, election_observation(&lease, desired, ready));
    let report = handover_report(ctx, obj.name(), &lease, health, obs.members.len());
    if let Some(message) = report {
        crate::controller::events::record(ctx, obj, false, HANDOVER, &message).await;
    }
}

/// The backend's Lease as read this pass: where it is, the answer, its holder and its term.
struct LeaseRead {
    /// `<namespace>/<name>`
    at: String,
    read: kube::Result<Option<Lease>>,
    holder: Option<String>,
    transitions: i32,
}

impl LeaseRead {
    /// Reads the Lease `ns/name`, with its holder and `leaseTransitions` (0 when unread).
    async fn get(ctx: &Context, ns: &str, name: &str) -> Self {
        let leases: Api<Lease> = Api::namespaced(ctx.core_client(), ns);
        let read = leases.get_opt(name).await;
        let at = format!("{ns}/{name}");
        let holder = match &read {
            Ok(Some(l)) => kvcache_store::election::holder(l),
            _ => None,
        };
        let transitions = match &read {
            Ok(Some(l)) => l.spec.as_ref().and_then(|s| s.lease_transitions).unwrap_or(0),
            _ => 0,
        };
        LeaseRead {
            at,
            read,
            holder,
            transitions,
        }
    }
}

/// ElectionObserved from the Lease read, the desired leader replicas and how many are ready.
fn election_observation(lease: &LeaseRead, desired: u32, ready: usize) -> Observation {
    let (at, transitions) = (&lease.at, lease.transitions);
    match (&lease.read, &lease.holder) {
        (Err(e), _) => Observation::new(
            election_observed::TYPE,
            ConditionStatus::Unknown,
            election_observed::LEASE_UNREADABLE,
            format!("the Lease {at} could not be read: {e}"),
        ),
        (Ok(_), Some(_)) => Observation::new(
            election_observed::TYPE,
            ConditionStatus::True,
            election_observed::ELECTING,
            format!(
                "the Lease {at} names a holder (leaseTransitions {transitions}); one leader replica serves, {} stand by",
                desired.saturating_sub(1)
            ),
        ),
        (Ok(_), None) if ready == 0 => Observation::new(
            election_observed::TYPE,
            ConditionStatus::Unknown,
            election_observed::LEADER_STARTING,
            format!("no leader replica is ready yet; the Lease {at} names no holder"),
        ),
        (Ok(_), None) => Observation::new(
            election_observed::TYPE,
            ConditionStatus::False,
            election_observed::NO_HOLDER,
            format!(
                "a leader replica is ready but the Lease {at} is missing or names no holder: the leader may run without \
                 an election backend, lack access to the Lease, or still be in its first campaign"
            ),
        ),
    }
}

/// The handover event's message when one is due, after noting the Lease's holder and term.
fn handover_report(
    ctx: &Context,
    backend: &str,
    lease: &LeaseRead,
    health: Option<&kvcache_store::proto::HealthResponse>,
    members: usize,
) -> Option<String> {
    let mut holders = ctx.lease_holders.lock();
    note_holder(&mut holders, backend, lease);
    let seen = holders.get_mut(backend);
    let message = seen
        .as_ref()
        .and_then(|s| s.pending.as_ref())
        .and_then(|p| handover_message(p, health, members));
    if message.is_some()
        && let Some(s) = seen
    {
        s.pending = None;
    }
    message
}

/// Records the Lease's holder and term for `backend`; a change leaves a handover pending.
fn note_holder(holders: &mut std::collections::HashMap<String, LeaseSeen>, backend: &str, lease: &LeaseRead) {
    match (&lease.read, &lease.holder) {
        (Ok(None), _) => {
            holders.remove(backend);
        }
        // a holder at the same address after a restart is another process: the term tells
        (Ok(Some(_)), Some(h)) => {
            let now = format!("{h} (term {})", lease.transitions);
            match holders.get_mut(backend) {
                None => {
                    holders.insert(
                        backend.to_owned(),
                        LeaseSeen {
                            holder: now,
                            pending: None,
                        },
                    );
                }
                Some(seen) if seen.holder != now => {
                    seen.holder = now;
                    seen.pending = Some(Pending {
                        term: u64::try_from(lease.transitions).unwrap_or(0),
                        lease: lease.at.clone(),
                        seen: std::time::Instant::now(),
                    });
                }
                Some(_) => {}
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod handover_tests {
    use super::*;
    use kvcache_store::proto::HealthResponse;

    fn health(epoch: u64, members: u64) -> HealthResponse {
        HealthResponse {
            serving: true,
            epoch,
            members,
            adopted_objects: 1200,
            adopted_bytes: 3 << 30,
            ..Default::default()
        }
    }

    #[test]
    fn a_handover_is_reported_once_the_new_term_has_its_members_back() {
        let p = Pending {
            term: 4,
            lease: "kvcache-system/b-leader".into(),
            seen: std::time::Instant::now(),
        };
        let cases: [(&str, Option<HealthResponse>, bool); 4] = [
            ("the leader was not read", None, false),
            ("the old term still answers", Some(health(3, 2)), false),
            ("one member of two is back", Some(health(4, 1)), false),
            ("both are back", Some(health(4, 2)), true),
        ];
        for (what, h, reported) in cases {
            assert_eq!(handover_message(&p, h.as_ref(), 2).is_some(), reported, "{what}");
        }
        let m = handover_message(&p, Some(&health(4, 2)), 2).unwrap();
        assert!(m.contains("adopted 1200 objects (3.0 GiB)"), "{m}");
        // past the wait it is reported with what there is
        let late = Pending {
            seen: std::time::Instant::now() - HANDOVER_REPORT_WAIT,
            ..p
        };
        let m = handover_message(&late, Some(&health(4, 1)), 2).unwrap();
        assert!(m.contains("1 of 2 members have remounted"), "{m}");
    }
}

/// Deletes the backend's election Lease once its leaders stopped (the store creates it; nothing
/// of a deleted backend is left behind).
pub async fn delete_lease(ctx: &Context, backend: &str) -> crate::controller::Result<()> {
    let leases: Api<Lease> = Api::namespaced(ctx.core_client(), ctx.runtime.lease_namespace());
    match leases
        .delete(&super::plan::lease_name(backend), &Default::default())
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
    .inspect(|()| {
        ctx.lease_holders.lock().remove(backend);
    })
}

/// RolloutComplete: every desired replica runs the current configuration.
fn rollout(desired: usize, obs: &StoreObservation) -> Observation {
    if let Some(r) = &obs.rollout {
        return deployment_rollout(desired, r);
    }
    let running = obs.leaders.iter().filter(|l| l.running && l.refused.is_none()).count();
    if obs.leaders.len() != desired {
        return Observation::new(
            rollout_complete::TYPE,
            ConditionStatus::False,
            rollout_complete::REPLICAS_PENDING,
            format!("{} leader replicas exist and {desired} are wanted", obs.leaders.len()),
        );
    }
    if running == desired {
        return Observation::new(
            rollout_complete::TYPE,
            ConditionStatus::True,
            rollout_complete::COMPLETE,
            format!("every one of the {desired} leader replicas runs the current configuration"),
        );
    }
    Observation::new(
        rollout_complete::TYPE,
        ConditionStatus::False,
        rollout_complete::PROGRESSING,
        format!(
            "{running} of {desired} leader replicas run the current configuration; the others are starting or restarting"
        ),
    )
}

/// RolloutComplete from a Deployment's status, first match wins: Unknown while it cannot be read
/// or has not observed its latest spec; False (ReplicasPending) while it asks for another count
/// than the backend's; True once every replica runs the current template; else False
/// (Progressing).
fn deployment_rollout(desired: usize, r: &crate::runtime::Rollout) -> Observation {
    let o = |status, reason: kvcache_api::conditions::Reason, msg: String| {
        Observation::new(rollout_complete::TYPE, status, reason, msg)
    };
    if let Some(why) = &r.unreadable {
        return o(
            ConditionStatus::Unknown,
            rollout_complete::WORKLOAD_UNREADABLE,
            why.clone(),
        );
    }
    if !r.observed {
        return o(
            ConditionStatus::Unknown,
            rollout_complete::UPDATE_NOT_OBSERVED,
            "the leader Deployment has not observed its latest spec yet".into(),
        );
    }
    if usize::try_from(r.spec_replicas).ok() != Some(desired) {
        return o(
            ConditionStatus::False,
            rollout_complete::REPLICAS_PENDING,
            format!(
                "the leader Deployment asks for {} replicas and {desired} are wanted",
                r.spec_replicas
            ),
        );
    }
    if r.finished() {
        return o(
            ConditionStatus::True,
            rollout_complete::COMPLETE,
            format!("every one of the {desired} leader replicas runs the current template"),
        );
    }
    o(
        ConditionStatus::False,
        rollout_complete::PROGRESSING,
        format!(
            "{} of {} leader replicas run the current template (the progress deadline is disabled with standbys, so a stuck rollout stays here)",
            r.updated, r.spec_replicas
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::WorkloadState;

    #[test]
    fn a_deployments_rollout_reads_as_the_spec_says() {
        let r = |observed, spec_replicas, replicas, updated| crate::runtime::Rollout {
            observed,
            spec_replicas,
            replicas,
            updated,
            unreadable: None,
        };
        let reason = |o: Observation| o.reason.as_str().to_owned();
        assert_eq!(reason(deployment_rollout(3, &r(false, 3, 3, 3))), "UpdateNotObserved");
        assert_eq!(reason(deployment_rollout(3, &r(true, 1, 1, 1))), "ReplicasPending");
        assert_eq!(reason(deployment_rollout(3, &r(true, 3, 3, 1))), "Progressing");
        assert_eq!(reason(deployment_rollout(3, &r(true, 3, 3, 3))), "Complete");
    }

    #[test]
    fn the_election_reads_as_the_lease_says() {
        let lease = |read: kube::Result<Option<Lease>>, holder: Option<&str>| LeaseRead {
            at: "kvcache-system/b-leader".into(),
            read,
            holder: holder.map(str::to_owned),
            transitions: 2,
        };
        let unreadable = kube::Error::TlsRequired;
        let cases = [
            (
                "unreadable",
                lease(Err(unreadable), None),
                1,
                election_observed::LEASE_UNREADABLE,
            ),
            (
                "held",
                lease(Ok(Some(Lease::default())), Some("10.0.0.1:50051")),
                1,
                election_observed::ELECTING,
            ),
            (
                "none ready, no holder",
                lease(Ok(None), None),
                0,
                election_observed::LEADER_STARTING,
            ),
            (
                "one ready, no holder",
                lease(Ok(None), None),
                1,
                election_observed::NO_HOLDER,
            ),
        ];
        for (what, l, ready, reason) in cases {
            assert_eq!(election_observation(&l, 3, ready).reason, reason.as_str(), "{what}");
        }
        let held = lease(Ok(Some(Lease::default())), Some("10.0.0.1:50051"));
        let m = election_observation(&held, 3, 1).message;
        assert!(m.contains("leaseTransitions 2") && m.contains("2 stand by"), "{m}");
    }

    #[test]
    fn rollout_counts_running_replicas() {
        let up = WorkloadState {
            running: true,
            ..Default::default()
        };
        let obs = |leaders: Vec<WorkloadState>| StoreObservation {
            leaders,
            ..Default::default()
        };
        assert_eq!(
            rollout(3, &obs(vec![up.clone(); 3])).reason,
            rollout_complete::COMPLETE.as_str()
        );
        assert_eq!(
            rollout(3, &obs(vec![up.clone(), up.clone(), WorkloadState::default()])).reason,
            rollout_complete::PROGRESSING.as_str()
        );
        assert_eq!(
            rollout(3, &obs(vec![up])).reason,
            rollout_complete::REPLICAS_PENDING.as_str()
        );
    }
}
