//! A ModelDeployment's replicas as engine Pods in its namespace: each created from
//! [`engine_pod`], replaced when its spec changed (one per role per pass, and not while the
//! rollout is held), and deleted when no longer planned; only Pods carrying the deployment's note
//! are touched.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};

use super::{FIELD_MANAGER, KubernetesRuntime, engine_pod, observe, refused, render, tenant_namespaces};
use crate::runtime::{Replica, ReplicaObservation, ReplicaPlan, WorkloadState};

impl KubernetesRuntime {
    /// Converges the owner's engine Pods to `plan`, in its namespace once the runtime may enter
    /// it, and reports each planned replica.
    pub(super) async fn converge_replicas(&self, plan: &ReplicaPlan) -> Vec<ReplicaObservation> {
        let (namespace, deployment) = plan.owner.split_once('/').unwrap_or(("default", plan.owner.as_str()));
        let entered = match self.tenants.enter(namespace).await {
            Ok(tenant_namespaces::Entered::Yes) => Ok(()),
            Ok(tenant_namespaces::Entered::NoSuchNamespace) => {
                Err(format!("the namespace {namespace} does not exist; create it"))
            }
            Err(why) => Err(why),
        };
        if let Err(why) = entered {
            return plan
                .replicas
                .iter()
                .map(|r| observation(r, refused(why.clone())))
                .collect();
        }
        let api = Api::<Pod>::namespaced(self.client.clone(), namespace);
        let mut out = Vec::new();
        let mut replaced_roles: Vec<String> = Vec::new();
        for r in &plan.replicas {
            let state = self.converge_replica(&api, plan, r, &mut replaced_roles).await;
            out.push(observation(r, state));
        }
        prune_unplanned(&api, plan, deployment).await;
        out
    }

    /// One replica's Pod: created when missing, replaced when outdated (unless another of its
    /// role was this pass, or the rollout is held), refused when a Pod of its name is not ours.
    async fn converge_replica(
        &self,
        api: &Api<Pod>,
        plan: &ReplicaPlan,
        r: &Replica,
        replaced_roles: &mut Vec<String>,
    ) -> WorkloadState {
        let (namespace, deployment) = plan.owner.split_once('/').unwrap_or(("default", plan.owner.as_str()));
        let image = match &r.engine.image {
            Ok(i) => i.clone(),
            Err(why) => return refused(why.clone()),
        };
        let desired = engine_pod::engine_pod(plan, r, &image);
        let name = desired["metadata"]["name"].as_str().unwrap_or_default().to_owned();
        let live = match api.get_opt(&name).await {
            Ok(l) => l,
            Err(e) => {
                self.tenants.forget_if_forbidden(namespace, &e);
                return refused(format!("reading Pod {namespace}/{name}: {e}"));
            }
        };
        match live {
            Some(p) if !runs_for(&p, deployment) => refused(format!(
                "Pod {namespace}/{name} exists and is not this deployment's (no annotation {}={deployment}); rename or remove it",
                engine_pod::DEPLOYMENT_NOTE
            )),
            Some(p) => {
                let hash = p
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(engine_pod::SPEC_HASH))
                    .cloned();
                let outdated = hash.as_deref() != desired["metadata"]["annotations"][engine_pod::SPEC_HASH].as_str();
                // Pods cannot be updated: an outdated one is replaced, one per role per pass,
                // and not while the rollout is held (the cache did not resolve this pass).
                if outdated
                    && !plan.hold_rollout
                    && p.metadata.deletion_timestamp.is_none()
                    && !replaced_roles.contains(&r.role)
                {
                    replaced_roles.push(r.role.clone());
                    if let Err(e) = api.delete(&name, &DeleteParams::default()).await {
                        tracing::warn!(pod = %name, "replacing an outdated engine Pod: {e}");
                    }
                }
                observe::workload(&p, "engine")
            }
            None => {
                let params = PatchParams::apply(FIELD_MANAGER).force();
                match api.patch(&name, &params, &Patch::Apply(&desired)).await {
                    Ok(p) => observe::workload(&p, "engine"),
                    Err(e) => refused(format!("creating Pod {namespace}/{name}: {e}")),
                }
            }
        }
    }

    /// Deletes the owner's engine Pods; `true` once none is left.
    pub(super) async fn remove_replicas_now(&self, owner: &str) -> bool {
        let (namespace, deployment) = owner.split_once('/').unwrap_or(("default", owner));
        let api = Api::<Pod>::namespaced(self.client.clone(), namespace);
        let selector = engine_selector(deployment);
        match self.tenants.enter(namespace).await {
            Ok(tenant_namespaces::Entered::Yes) => {}
            // Nothing can run in a namespace that does not exist.
            Ok(tenant_namespaces::Entered::NoSuchNamespace) => return true,
            Err(why) => {
                tracing::warn!(deployment = owner, "{why}");
                return false;
            }
        }
        let list = match api.list(&ListParams::default().labels(&selector)).await {
            Ok(l) => l,
            Err(e) => {
                self.tenants.forget_if_forbidden(namespace, &e);
                return false;
            }
        };
        let mut left = false;
        for p in list.items {
            let ours = runs_for(&p, deployment);
            if !ours {
                continue;
            }
            left = true;
            if p.metadata.deletion_timestamp.is_none() {
                let _ = api
                    .delete(&p.metadata.name.unwrap_or_default(), &DeleteParams::default())
                    .await;
            }
        }
        !left
    }
}

/// What the controller reads of one replica: its state (no cache report from a Pod).
fn observation(r: &Replica, state: WorkloadState) -> ReplicaObservation {
    ReplicaObservation {
        name: r.name.clone(),
        role: r.role.clone(),
        state,
        cache: None,
        runs: None,
        url: None,
        events: None,
    }
}

/// Replicas no longer planned (a scale-down, a removed role) go, if they are ours.
async fn prune_unplanned(api: &Api<Pod>, plan: &ReplicaPlan, deployment: &str) {
    let planned: Vec<String> = plan
        .replicas
        .iter()
        .map(|r| format!("{deployment}-{}", r.name))
        .collect();
    let selector = engine_selector(deployment);
    if let Ok(list) = api.list(&ListParams::default().labels(&selector)).await {
        for p in list.items {
            let name = p.metadata.name.clone().unwrap_or_default();
            let ours = runs_for(&p, deployment);
            if ours && !planned.contains(&name) && p.metadata.deletion_timestamp.is_none() {
                let _ = api.delete(&name, &DeleteParams::default()).await;
            }
        }
    }
}

/// The label selector of a deployment's engine Pods.
fn engine_selector(deployment: &str) -> String {
    format!(
        "app.kubernetes.io/name=model-deployment,app.kubernetes.io/instance={deployment},{}=modeldeployments",
        render::TYPE_LABEL
    )
}

/// Whether an engine Pod carries `deployment`'s note.
fn runs_for(pod: &Pod, deployment: &str) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(engine_pod::DEPLOYMENT_NOTE))
        .is_some_and(|d| d == deployment)
}
