//! The leader Deployment's rollout: how far it is (`rollout_of`), and how a Deployment still at
//! one replica rises past it in two steps (`rise_in_two_steps`).

use k8s_openapi::api::apps::v1::Deployment;
use serde_json::Value;

/// A Deployment's account of its rollout.
pub(super) fn rollout_of(d: &Deployment) -> crate::runtime::Rollout {
    let status = d.status.clone().unwrap_or_default();
    crate::runtime::Rollout {
        observed: status.observed_generation.unwrap_or(0) >= d.metadata.generation.unwrap_or(0),
        spec_replicas: d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1),
        replicas: status.replicas.unwrap_or(0),
        updated: status.updated_replicas.unwrap_or(0),
        unreadable: None,
    }
}

/// Rising past one replica in one edit: while the live Deployment still
/// runs one replica and its template does not elect yet, or that one replica's rollout has not
/// finished, it is written with one replica, `Recreate` and no deadline first; the real count
/// follows once that rolled out. (A replica change reaches the old ReplicaSet before the
/// strategy, which would start extra leaders that do not elect.) A Deployment already above one
/// replica has risen: it is never taken back to one because a Pod of it is being replaced (that
/// would stop the standby that just took over).
pub(super) fn rise_in_two_steps(desired: &mut Value, live: &Deployment) {
    if desired["spec"]["replicas"].as_i64().unwrap_or(1) <= 1 {
        return;
    }
    if live.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1) > 1 {
        return;
    }
    let args: Vec<String> = live
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.containers.first())
        .and_then(|c| c.args.clone())
        .unwrap_or_default();
    let elects = args.windows(2).any(|w| w[0] == "--election" && w[1] == "kubernetes");
    if !elects || !rollout_of(live).finished() {
        desired["spec"]["replicas"] = serde_json::json!(1);
        desired["spec"]["strategy"] = serde_json::json!({"type": "Recreate"});
        if let Some(spec) = desired["spec"].as_object_mut() {
            spec.remove("progressDeadlineSeconds");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A live leader Deployment: its replicas, whether its template elects, and its status.
    fn live(replicas: i32, elects: bool, status_replicas: i32, updated: i32) -> Deployment {
        let args: Vec<&str> = if elects {
            vec!["leader", "--election", "kubernetes"]
        } else {
            vec!["leader"]
        };
        serde_json::from_value(serde_json::json!({
            "metadata": {"generation": 2},
            "spec": {"replicas": replicas, "selector": {}, "template": {"spec": {"containers": [{"name": "leader", "args": args}]}}},
            "status": {"observedGeneration": 2, "replicas": status_replicas, "updatedReplicas": updated},
        }))
        .unwrap()
    }

    #[test]
    fn only_a_deployment_still_at_one_replica_rises_in_two_steps() {
        let table = [
            // (what, live, replicas written)
            ("one replica that does not elect yet", live(1, false, 1, 1), 1),
            ("one electing replica still rolling out", live(1, true, 2, 1), 1),
            ("one electing replica, rolled out", live(1, true, 1, 1), 3),
            ("risen, a Pod being replaced after a deletion", live(3, true, 2, 2), 3),
            ("risen, all three running", live(3, true, 3, 3), 3),
        ];
        for (what, deployment, want) in table {
            let mut desired = serde_json::json!({"spec": {"replicas": 3, "strategy": {"type": "RollingUpdate"}}});
            rise_in_two_steps(&mut desired, &deployment);
            assert_eq!(desired["spec"]["replicas"], want, "{what}");
        }
    }
}
