//! What a Pod's status says about the workload it runs, in the runtime's neutral
//! [`WorkloadState`]: running and ready from its phase and Ready condition, restarts and the last
//! termination from its main container, a scheduling refusal from `PodScheduled=False`, and the
//! kubelet's waiting reason (`ImagePullBackOff`, `CrashLoopBackOff`, ...) as the fault unless it
//! means progress (none, `ContainerCreating`, `PodInitializing`). The kubelet (or anything
//! writing `/status`) is the source; nothing here asks the workload itself.

use std::time::SystemTime;

use k8s_openapi::api::core::v1::Pod;

use crate::runtime::{Exit, WorkloadState};

/// Waiting reasons that are progress, not faults.
const PROGRESS: &[&str] = &["", "ContainerCreating", "PodInitializing"];

fn time(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> SystemTime {
    SystemTime::from(t.0)
}

/// What the Pod's `tier-survey` init container found in its member's disk tier (`kv-store
/// tier-survey`'s termination message, `{"entries":N}`), and when the Pod was created; `None`
/// while it has not finished, or without one.
pub fn tier_survey(pod: &Pod) -> Option<(i64, Option<SystemTime>)> {
    let statuses = pod.status.as_ref()?.init_container_statuses.as_ref()?;
    let survey = statuses.iter().find(|c| c.name == "tier-survey")?;
    let message = survey.state.as_ref()?.terminated.as_ref()?.message.as_deref()?;
    let v: serde_json::Value = serde_json::from_str(message.trim()).ok()?;
    let created = pod.metadata.creation_timestamp.as_ref().map(time);
    Some((v["entries"].as_i64()?, created))
}

/// The state of the Pod's container named `container` (the first one when absent).
pub fn workload(pod: &Pod, container: &str) -> WorkloadState {
    let status = pod.status.clone().unwrap_or_default();
    let conditions = status.conditions.unwrap_or_default();
    let condition = |t: &str| conditions.iter().find(|c| c.type_ == t);
    let mut state = WorkloadState {
        running: status.phase.as_deref() == Some("Running"),
        ready: condition("Ready").is_some_and(|c| c.status == "True"),
        started: status.start_time.as_ref().map(time),
        ..WorkloadState::default()
    };
    if state.ready {
        state.ready_since = condition("Ready")
            .and_then(|c| c.last_transition_time.as_ref())
            .map(time);
    }
    if let Some(c) = condition("PodScheduled").filter(|c| c.status == "False") {
        state.refused = Some(format!(
            "{}: {}",
            c.reason.as_deref().unwrap_or("Unschedulable"),
            c.message.as_deref().unwrap_or("the Pod cannot be scheduled")
        ));
    }
    let statuses = status.container_statuses.unwrap_or_default();
    let Some(c) = statuses
        .iter()
        .find(|c| c.name == container)
        .or_else(|| statuses.first())
    else {
        return state;
    };
    state.restarts = u32::try_from(c.restart_count).unwrap_or(0);
    if let Some(t) = c.last_state.as_ref().and_then(|s| s.terminated.as_ref()) {
        state.last_exit = Some(Exit {
            code: Some(t.exit_code),
            signal: t.signal,
            log_tail: t.message.clone().unwrap_or_default().trim().to_owned(),
            at: t.finished_at.as_ref().map_or(SystemTime::UNIX_EPOCH, time),
        });
    }
    if let Some(w) = c.state.as_ref().and_then(|s| s.waiting.as_ref()) {
        let reason = w.reason.clone().unwrap_or_default();
        if !PROGRESS.contains(&reason.as_str()) {
            state.waiting = Some((reason, w.message.clone().unwrap_or_default()));
        }
    }
    state
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(status: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}, "status": status})).unwrap()
    }

    #[test]
    fn each_kubelet_fault_is_read() {
        let ready = workload(
            &pod(serde_json::json!({
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-01T00:00:00Z"}],
                "containerStatuses": [{"name": "leader", "ready": true, "restartCount": 0, "image": "i", "imageID": "", "state": {"running": {}}}],
            })),
            "leader",
        );
        assert!(ready.running && ready.ready && ready.ready_since.is_some());
        assert_eq!((ready.refused.clone(), ready.waiting.clone()), (None, None));

        let crash = workload(
            &pod(serde_json::json!({
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "False"}],
                "containerStatuses": [{"name": "leader", "ready": false, "restartCount": 4, "image": "i", "imageID": "",
                    "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}},
                    "lastState": {"terminated": {"exitCode": 2, "message": "bad flag\n", "finishedAt": "2026-12-01T00:00:05Z"}}}],
            })),
            "leader",
        );
        assert_eq!(crash.restarts, 4);
        assert_eq!(
            crash.last_exit.as_ref().map(|e| (e.code, e.log_tail.as_str())),
            Some((Some(2), "bad flag"))
        );
        assert_eq!(crash.waiting, Some(("CrashLoopBackOff".into(), "back-off 40s".into())));

        let pull = workload(
            &pod(serde_json::json!({
                "phase": "Pending",
                "containerStatuses": [{"name": "leader", "ready": false, "restartCount": 0, "image": "i", "imageID": "",
                    "state": {"waiting": {"reason": "ImagePullBackOff", "message": "no such image"}}}],
            })),
            "leader",
        );
        assert_eq!(pull.waiting, Some(("ImagePullBackOff".into(), "no such image".into())));
        assert!(!pull.running);

        let unscheduled = workload(
            &pod(serde_json::json!({
                "phase": "Pending",
                "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes are available"}],
            })),
            "leader",
        );
        assert_eq!(
            unscheduled.refused.as_deref(),
            Some("Unschedulable: 0/3 nodes are available")
        );

        let creating = workload(
            &pod(serde_json::json!({
                "phase": "Pending",
                "containerStatuses": [{"name": "leader", "ready": false, "restartCount": 0, "image": "i", "imageID": "",
                    "state": {"waiting": {"reason": "ContainerCreating"}}}],
            })),
            "leader",
        );
        assert_eq!(creating.waiting, None, "creating a container is progress, not a fault");
    }

    #[test]
    fn the_tier_survey_is_the_init_containers_termination_message() {
        let finished = |message: &str| {
            let mut p = pod(serde_json::json!({"initContainerStatuses": [{
                "name": "tier-survey", "ready": false, "restartCount": 0, "image": "i", "imageID": "",
                "state": {"terminated": {"exitCode": 0, "message": message}}
            }]}));
            p.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::from_second(1_000).unwrap(),
            ));
            p
        };
        let created = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000);
        assert_eq!(tier_survey(&finished("{\"entries\":3}\n")), Some((3, Some(created))));
        assert_eq!(tier_survey(&finished("{\"entries\":-1}")), Some((-1, Some(created))));
        assert_eq!(tier_survey(&finished("garbage")), None);
        assert_eq!(tier_survey(&pod(serde_json::json!({}))), None, "not finished, or none");
    }
}
