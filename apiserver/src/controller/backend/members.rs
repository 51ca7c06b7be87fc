//! MembersMounted and the member rows of a managed backend: the segments the leader lists,
//! matched against the members the plan placed, and why a member that should be mounted is not
//! (a fault the runtime saw: unschedulable, the kubelet's waiting reason, a crash).

use kvcache_api::KVCacheBackend;
use kvcache_api::backend::MemberStatus;
use kvcache_api::conditions::backend::members_mounted;
use kvcache_api::conditions::{ConditionStatus, Observation};

use crate::controller::shared::names;
use crate::controller::store_client::LeaderView;
use crate::runtime::{MemberPlan, StoreObservation, StorePlan};

pub(super) fn member_rows(obj: &KVCacheBackend, view: &LeaderView, plan: Option<&StorePlan>) -> Vec<MemberStatus> {
    let groups = obj.spec.managed().map(|m| m.members.clone()).unwrap_or_default();
    let mut rows: Vec<MemberStatus> = view
        .members
        .iter()
        .map(|m| {
            let planned = plan.and_then(|p| p.members.iter().find(|pm| pm.name(&p.backend) == m.name));
            MemberStatus {
                segment_id: m.member_id.to_string(),
                client_id: m.mount_id.to_string(),
                segment_name: m.name.clone(),
                node_name: planned.map(|pm| pm.node.clone()),
                medium: planned
                    .and_then(|pm| groups.get(pm.group))
                    .and_then(|g| g.medium)
                    .map(|md| md.as_str().to_owned()),
                protocol: Some("tcp".into()),
                state: Some("OK".into()),
                same_host: Some(m.same_host),
            }
        })
        .collect();
    rows.sort_by_key(|r| r.segment_id.parse::<u64>().unwrap_or(u64::MAX));
    rows
}

/// MembersMounted: the leader's segments against the planned members, first fault found wins.
pub(super) fn members_verdict(
    view: &LeaderView,
    observed: Option<&(StorePlan, Vec<String>, StoreObservation)>,
) -> Observation {
    let mounted: Vec<&str> = view.members.iter().map(|m| m.name.as_str()).collect();
    let Some((plan, unmatched, obs)) = observed else {
        // external: the leader's list is all there is
        return external_verdict(&mounted);
    };
    if let Some(fault) = member_fault(obs) {
        return fault;
    }
    if plan.members.is_empty() {
        return no_member_verdict(unmatched);
    }
    let missing: Vec<&(MemberPlan, crate::runtime::WorkloadState)> = obs
        .members
        .iter()
        .filter(|(m, _)| !mounted.contains(&m.name(&plan.backend).as_str()))
        .collect();
    if missing.is_empty() {
        return all_mounted_verdict(&mounted, unmatched);
    }
    if let Some(crashed) = crashed_verdict(&missing) {
        return crashed;
    }
    unregistered_verdict(&mounted, plan, &missing)
}

/// MembersMounted of an external backend, from the leader's list alone.
fn external_verdict(mounted: &[&str]) -> Observation {
    if mounted.is_empty() {
        Observation::new(
            members_mounted::TYPE,
            ConditionStatus::False,
            members_mounted::NO_SEGMENTS,
            "the leader has no segment mounted",
        )
    } else {
        Observation::new(
            members_mounted::TYPE,
            ConditionStatus::True,
            members_mounted::MOUNTED,
            format!("{} segments mounted", mounted.len()),
        )
    }
}

/// A fault the runtime saw on a member Pod (unschedulable, refused, the kubelet's waiting reason).
fn member_fault(obs: &StoreObservation) -> Option<Observation> {
    // A member Pod the cluster cannot place: Unschedulable, naming it.
    if let Some((m, why)) = obs.members.iter().find_map(|(m, s)| {
        s.refused
            .as_deref()
            .filter(|r| r.starts_with("Unschedulable"))
            .map(|r| (m, r.to_owned()))
    }) {
        return Some(Observation::new(
            members_mounted::TYPE,
            ConditionStatus::False,
            members_mounted::UNSCHEDULABLE,
            format!("the member on node {} (group {}): {why}", m.node, m.group),
        ));
    }
    if let Some(why) = obs.members.iter().find_map(|(_, s)| s.refused.clone()) {
        return Some(Observation::new(
            members_mounted::TYPE,
            ConditionStatus::False,
            members_mounted::INSUFFICIENT_MEMORY,
            why,
        ));
    }
    // The kubelet's own word for a member that does not run (ImagePullBackOff, ...).
    let (m, (reason, message)) = obs.members.iter().find_map(|(m, s)| {
        s.waiting
            .clone()
            .filter(|(r, _)| r != "CrashLoopBackOff")
            .filter(|_| !s.ready)
            .map(|w| (m, w))
    })?;
    Some(Observation::new(
        members_mounted::TYPE,
        ConditionStatus::False,
        reason.as_str(),
        format!("the member on node {} (group {}): {message}", m.node, m.group),
    ))
}

/// MembersMounted when the plan places no member: no group declared, or no node matched.
fn no_member_verdict(unmatched: &[String]) -> Observation {
    let msg = if unmatched.is_empty() {
        "the backend declares no member group".to_owned()
    } else {
        format!("{} matches no node", unmatched.join("; "))
    };
    Observation::new(
        members_mounted::TYPE,
        ConditionStatus::False,
        members_mounted::NO_SEGMENTS,
        msg,
    )
}

/// MembersMounted when every planned member is mounted (naming selectors that matched no node).
fn all_mounted_verdict(mounted: &[&str], unmatched: &[String]) -> Observation {
    let mut msg = format!("{} segments mounted", mounted.len());
    if !unmatched.is_empty() {
        msg.push_str(&format!("; {} matches no node", unmatched.join("; ")));
    }
    Observation::new(
        members_mounted::TYPE,
        ConditionStatus::True,
        members_mounted::MOUNTED,
        msg,
    )
}

/// MemberCrashLooping when a missing member has ended at least once, naming each.
fn crashed_verdict(missing: &[&(MemberPlan, crate::runtime::WorkloadState)]) -> Option<Observation> {
    let crashed: Vec<String> = missing
        .iter()
        .filter_map(|(m, s)| {
            let exit = s.last_exit.as_ref()?;
            Some(format!(
                "the member on node {} (group {}) ended ({}); it is restarted with back-off ({} restarts so far)",
                m.node,
                m.group,
                exit.describe(),
                s.restarts
            ))
        })
        .collect();
    if crashed.is_empty() {
        return None;
    }
    Some(Observation::new(
        members_mounted::TYPE,
        ConditionStatus::False,
        members_mounted::MEMBER_CRASH_LOOPING,
        crashed.join("; "),
    ))
}

/// MembersMounted when members run but have not registered with the leader, naming their nodes.
fn unregistered_verdict(
    mounted: &[&str],
    plan: &StorePlan,
    missing: &[&(MemberPlan, crate::runtime::WorkloadState)],
) -> Observation {
    let nodes: Vec<String> = missing
        .iter()
        .map(|(m, _)| format!("{} (group {})", m.node, m.group))
        .collect();
    let reason = if mounted.is_empty() {
        members_mounted::NO_SEGMENTS
    } else {
        members_mounted::SEGMENTS_SHORT
    };
    Observation::new(
        members_mounted::TYPE,
        ConditionStatus::False,
        reason,
        format!(
            "{} of {} members mounted; the member on node {} has not registered with the leader",
            mounted.len(),
            plan.members.len(),
            names(&nodes)
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::backend::plan;
    use crate::runtime::Node;

    fn spec(yaml: &str) -> kvcache_api::backend::BackendSpec {
        yaml_serde::from_str(yaml).unwrap()
    }

    fn view(names: &[&str]) -> LeaderView {
        LeaderView {
            health: kvcache_store::proto::HealthResponse::default(),
            members: names
                .iter()
                .map(|n| kvcache_store::proto::MemberStatus {
                    name: (*n).to_owned(),
                    ..Default::default()
                })
                .collect(),
        }
    }

    #[test]
    fn a_member_row_says_whether_the_member_serves_same_host_clients() {
        let obj = KVCacheBackend::new(
            "b",
            spec(
                "type: Mooncake\nconnection:\n  managed:\n    leader: {}\n    members:\n    - capacityPerMember: 1Gi\n",
            ),
        );
        let mut v = view(&["m0", "m1"]);
        v.members[1].same_host = true;
        v.members[1].member_id = 1;
        let rows = member_rows(&obj, &v, None);
        let same_host: Vec<_> = rows.iter().map(|r| (r.segment_name.as_str(), r.same_host)).collect();
        assert_eq!(same_host, [("m0", Some(false)), ("m1", Some(true))]);
    }

    #[test]
    fn members_mounted_names_the_missing_node_or_the_selector() {
        let nodes = [Node::stand_in("local-0"), Node::stand_in("local-1")];
        let s = spec(
            "type: Mooncake\nconnection:\n  managed:\n    leader: {}\n    members:\n    - nodeSelector: {kubernetes.io/os: linux}\n      capacityPerMember: 1Gi\n",
        );
        let (p, unmatched) = plan("b", &s, &nodes).unwrap();
        let obs = StoreObservation {
            members: p.members.iter().map(|m| (m.clone(), Default::default())).collect(),
            ..Default::default()
        };
        let both = (p.clone(), unmatched.clone(), obs.clone());
        let v = members_verdict(&view(&["b-member-0-local-0", "b-member-0-local-1"]), Some(&both));
        assert_eq!((v.status, v.reason.as_str()), (ConditionStatus::True, "Mounted"));
        let v = members_verdict(&view(&["b-member-0-local-0"]), Some(&both));
        assert_eq!((v.status, v.reason.as_str()), (ConditionStatus::False, "SegmentsShort"));
        assert!(v.message.contains("local-1"), "{}", v.message);
        let none = spec(
            "type: Mooncake\nconnection:\n  managed:\n    leader: {}\n    members:\n    - nodeSelector: {zone: a}\n      capacityPerMember: 1Gi\n",
        );
        let (p, unmatched) = plan("b", &none, &nodes).unwrap();
        let v = members_verdict(&view(&[]), Some(&(p, unmatched, StoreObservation::default())));
        assert_eq!(v.reason, "NoSegments");
        assert!(v.message.contains("{zone=a}"), "{}", v.message);
    }

    #[test]
    fn member_pod_faults_name_the_member() {
        let nodes = [Node::stand_in("local-0")];
        let s = spec(
            "type: Mooncake\nconnection:\n  managed:\n    leader: {}\n    members:\n    - nodeSelector: {kubernetes.io/os: linux}\n      capacityPerMember: 1Gi\n",
        );
        let (p, unmatched) = plan("b", &s, &nodes).unwrap();
        let with = |state: crate::runtime::WorkloadState| {
            let obs = StoreObservation {
                members: p.members.iter().map(|m| (m.clone(), state.clone())).collect(),
                ..Default::default()
            };
            members_verdict(&view(&[]), Some(&(p.clone(), unmatched.clone(), obs)))
        };
        let v = with(crate::runtime::WorkloadState {
            refused: Some("Unschedulable: 0/1 nodes have 1Gi of memory free".into()),
            ..Default::default()
        });
        assert_eq!((v.status, v.reason.as_str()), (ConditionStatus::False, "Unschedulable"));
        assert!(
            v.message.contains("local-0") && v.message.contains("memory free"),
            "{}",
            v.message
        );
        let v = with(crate::runtime::WorkloadState {
            waiting: Some(("ImagePullBackOff".into(), "no such image".into())),
            ..Default::default()
        });
        assert_eq!(v.reason.as_str(), "ImagePullBackOff");
        assert!(v.message.contains("no such image"), "{}", v.message);
    }
}
