//! Events the controllers record (core `v1` Events, through the same client as everything else):
//! one per condition whose status changed in a status write (leader serving or lost, members
//! mounted or one lost, a grant, an attachment), and the grant changes of Bindings, so `kubectl
//! describe` tells what happened. A settled object writes no status, so it records nothing.
//! Failing to record never fails a pass.

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use kube::Api;
use kube::api::PostParams;
use kvcache_api::{Kind, Object};

use super::Context;

/// The component named in every event.
pub const COMPONENT: &str = "kvcache-controller";

/// Where an object's events live: its namespace, or `default` for a cluster-scoped object (as
/// client-go's recorder does).
fn namespace_of<K: Kind>(obj: &Object<K>) -> String {
    match obj.namespace() {
        "" => "default".to_owned(),
        ns => ns.to_owned(),
    }
}

/// Records one event about `obj`.
pub async fn record<K: Kind>(ctx: &Context, obj: &Object<K>, warning: bool, reason: &str, message: &str) {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let ns = namespace_of(obj);
    let event = Event {
        metadata: ObjectMeta {
            name: Some(format!(
                "{}.{}",
                obj.name(),
                &uuid::Uuid::new_v4().simple().to_string()[..16]
            )),
            namespace: Some(ns.clone()),
            ..ObjectMeta::default()
        },
        involved_object: ObjectReference {
            api_version: Some(kvcache_api::API_VERSION.to_owned()),
            kind: Some(K::KIND.to_owned()),
            name: Some(obj.name().to_owned()),
            namespace: (!obj.namespace().is_empty()).then(|| obj.namespace().to_owned()),
            uid: obj.metadata.uid.clone(),
            resource_version: obj.metadata.resource_version.clone(),
            field_path: None,
        },
        reason: Some(reason.to_owned()),
        message: Some(message.chars().take(1024).collect()),
        type_: Some(if warning { "Warning" } else { "Normal" }.to_owned()),
        source: Some(EventSource {
            component: Some(COMPONENT.to_owned()),
            host: None,
        }),
        reporting_component: Some(COMPONENT.to_owned()),
        reporting_instance: Some(COMPONENT.to_owned()),
        first_timestamp: Some(now.clone()),
        last_timestamp: Some(now),
        count: Some(1),
        ..Event::default()
    };
    let api: Api<Event> = Api::namespaced(ctx.core_client(), &ns);
    if let Err(e) = api.create(&PostParams::default(), &event).await {
        tracing::warn!(
            kind = K::KIND,
            name = obj.name(),
            reason,
            "recording an event failed: {e}"
        );
    }
}

/// Conditions whose `False` is a state, not a fault (a deletion held by a consumer).
const NOT_FAULTS: &[&str] = &["Deletable", "Releasable"];

/// `False` reasons that are normal work, not a fault: a rollout on its way (a scale-up).
const NOT_FAULT_REASONS: &[(&str, &str)] = &[("RolloutComplete", "Progressing")];

/// Whether a condition's status is a fault, so its event is a Warning.
fn is_fault(c: &Condition) -> bool {
    c.status == "False"
        && !NOT_FAULTS.contains(&c.type_.as_str())
        && !NOT_FAULT_REASONS.contains(&(c.type_.as_str(), c.reason.as_str()))
}

/// The conditions whose status changed from `before` to `after`, or that stayed `False` for
/// another reason (a member first missing, then known to have crashed), as events (`warning`,
/// reason, message): a first observation is not a transition, so a new object records only what
/// changes after it (the leader starting to serve, members mounting, a grant, an attachment).
/// `False` is a Warning unless the condition's `False` (or this reason of it) is no fault.
pub fn transitions(before: &[Condition], after: &[Condition]) -> Vec<(bool, String, String)> {
    let changed = |b: &Condition, c: &Condition| b.status != c.status || (c.status == "False" && b.reason != c.reason);
    after
        .iter()
        .filter(|c| before.iter().any(|b| b.type_ == c.type_ && changed(b, c)))
        .map(|c| {
            (
                is_fault(c),
                c.reason.clone(),
                format!("{} is {}: {}", c.type_, c.status, c.message),
            )
        })
        .collect()
}

/// The conditions of a status, whatever its kind.
pub fn conditions_of<S: serde::Serialize>(status: Option<&S>) -> Vec<Condition> {
    status
        .and_then(|s| serde_json::to_value(s).ok())
        .and_then(|v| serde_json::from_value(v.get("conditions")?.clone()).ok())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cond(t: &str, status: &str, reason: &str) -> Condition {
        Condition {
            type_: t.into(),
            status: status.into(),
            reason: reason.into(),
            message: "m".into(),
            last_transition_time: crate::registry::meta::now(),
            observed_generation: None,
        }
    }

    #[test]
    fn only_changed_statuses_become_events() {
        let before = vec![
            cond("LeaderAvailable", "True", "Serving"),
            cond("MembersMounted", "True", "Mounted"),
        ];
        let after = vec![
            cond("LeaderAvailable", "True", "Serving"),
            cond("MembersMounted", "False", "MemberCrashLooping"),
            cond("PoolWrites", "Unknown", "NoWritesObserved"),
        ];
        let t = transitions(&before, &after);
        assert_eq!(t.len(), 1, "a first observation (PoolWrites) is no transition: {t:?}");
        assert_eq!((t[0].0, t[0].1.as_str()), (true, "MemberCrashLooping"));
        assert!(t[0].2.starts_with("MembersMounted is False"));
        assert!(
            transitions(&after, &after).is_empty(),
            "a settled object records nothing"
        );
        let rollout = transitions(
            &[cond("RolloutComplete", "True", "Complete")],
            &[cond("RolloutComplete", "False", "Progressing")],
        );
        assert!(!rollout[0].0, "a scale-up on its way is no Warning: {rollout:?}");
        let stuck = transitions(
            &[cond("RolloutComplete", "True", "Complete")],
            &[cond("RolloutComplete", "False", "ReplicasPending")],
        );
        assert!(stuck[0].0, "replicas that cannot start are: {stuck:?}");
        let held = transitions(
            &[cond("Deletable", "True", "Unused")],
            &[cond("Deletable", "False", "InUse")],
        );
        assert!(!held[0].0, "a held deletion is no fault");
    }

    #[test]
    fn a_fault_that_changes_its_reason_is_an_event_again() {
        // the first pass after a kill sees the member gone; a later one knows it crashed
        let missing = [cond("MembersMounted", "False", "SegmentsShort")];
        let crashed = [cond("MembersMounted", "False", "MemberCrashLooping")];
        let t = transitions(&missing, &crashed);
        assert_eq!(t.len(), 1, "{t:?}");
        assert_eq!((t[0].0, t[0].1.as_str()), (true, "MemberCrashLooping"));
        let settled = [cond("MembersMounted", "True", "Mounted")];
        let other = [cond("MembersMounted", "True", "MountedAgain")];
        assert!(
            transitions(&settled, &other).is_empty(),
            "a True that rewords itself is no news"
        );
        assert!(transitions(&crashed, &crashed).is_empty());
    }
}
