//! A backend's store as workloads of the cluster: its objects rendered ([`render`]) and applied
//! under the runtime's field manager, and what runs read back from its Pods and its leader
//! Deployment ([`KubernetesRuntime::converge_store`], in named steps); and its removal.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::Value;

use super::{FIELD_MANAGER, KubernetesRuntime, observe, refused, render, rollout, tls_secrets, token_secrets};
use crate::runtime::{MemberPlan, Rollout, StoreObservation, StorePlan, TierSurvey, WorkloadState};

/// The kinds this runtime renders, each with its API path.
pub(super) fn resource(kind: &str) -> Option<ApiResource> {
    let (group, version, plural) = match kind {
        "ServiceAccount" => ("", "v1", "serviceaccounts"),
        "Service" => ("", "v1", "services"),
        "Role" => ("rbac.authorization.k8s.io", "v1", "roles"),
        "RoleBinding" => ("rbac.authorization.k8s.io", "v1", "rolebindings"),
        "Deployment" => ("apps", "v1", "deployments"),
        "DaemonSet" => ("apps", "v1", "daemonsets"),
        "NetworkPolicy" => ("networking.k8s.io", "v1", "networkpolicies"),
        _ => return None,
    };
    Some(ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(group, version, kind),
        plural,
    ))
}

/// Every kind the runtime may have rendered for a backend, in the order they are removed
/// (workloads first, their RBAC last).
const REMOVAL_ORDER: &[&str] = &[
    "DaemonSet",
    "Deployment",
    "Service",
    "NetworkPolicy",
    "RoleBinding",
    "Role",
    "ServiceAccount",
];

impl KubernetesRuntime {
    /// Renders `plan` for the cluster, makes its Secrets' keys, applies its objects, and reads
    /// back what runs; a step that fails refuses the leader and every member with its reason.
    pub(super) async fn converge_store(&self, plan: &StorePlan) -> StoreObservation {
        let lease = plan
            .election
            .as_ref()
            .map(|e| (self.opts.namespace.clone(), e.lease.clone()));
        let leader_deployment = match self.apply_store(plan).await {
            Ok(d) => d,
            Err(why) => {
                return StoreObservation {
                    leaders: vec![refused(why.clone())],
                    members: plan.members.iter().map(|m| (m.clone(), refused(why.clone()))).collect(),
                    lease,
                    ..StoreObservation::default()
                };
            }
        };
        // The Deployment as applied carries its status: no second read.
        let rollout = Some(match leader_deployment.as_ref().and_then(as_deployment) {
            Some(d) => rollout::rollout_of(&d),
            None => Rollout {
                unreadable: Some("the leader Deployment does not exist".into()),
                ..Rollout::default()
            },
        });
        let (members, tier_survey) = self.observe_members(plan).await;
        StoreObservation {
            client_endpoint: Some(render::leader_address(plan, &self.opts.namespace)),
            leaders: self.observe_leaders(plan).await,
            lease,
            members,
            rollout,
            tier_survey,
        }
    }

    /// Where the backend's objects go, its tokens and certificate, then each object applied;
    /// returns the leader Deployment as applied (`None` when it was not: a backend being
    /// deleted creates nothing).
    async fn apply_store(&self, plan: &StorePlan) -> Result<Option<DynamicObject>, String> {
        let default_image = self.config.get().settings.kv_cache_backend_image.clone();
        let mut target = render::Target::for_plan(plan, &self.opts.namespace, &default_image)?;
        if let Some((server_namespace, _)) = &self.opts.service_account {
            target.server_namespace = server_namespace.clone();
        }
        self.ensure_tokens(plan)
            .await
            .inspect_err(|why| tracing::warn!(backend = %plan.backend, "{why}"))?;
        let mut leader_deployment = None;
        for mut object in render::store(plan, &target) {
            let applied = self
                .apply(&plan.backend, &mut object, plan.existing_only)
                .await
                .inspect_err(|why| tracing::warn!(backend = %plan.backend, "{why}"))?;
            if object["kind"] == "Deployment" {
                leader_deployment = applied;
            }
        }
        Ok(leader_deployment)
    }

    /// The leader Pods' states (one unknown state while there is none).
    async fn observe_leaders(&self, plan: &StorePlan) -> Vec<WorkloadState> {
        match self.pods(&plan.backend, "leader").await {
            Ok(pods) if pods.is_empty() => vec![WorkloadState::default()],
            Ok(pods) => pods.iter().map(|p| observe::workload(p, "leader")).collect(),
            Err(e) => vec![refused(format!("listing the leader's Pods: {e}"))],
        }
    }

    /// Each planned member's state: its group's Pod on its node (the groups' Pods read once each).
    async fn observe_members(&self, plan: &StorePlan) -> (Vec<(MemberPlan, WorkloadState)>, Option<TierSurvey>) {
        let mut members = Vec::new();
        let mut survey = TierSurvey::default();
        let mut by_group: BTreeMap<usize, Vec<Pod>> = BTreeMap::new();
        for m in &plan.members {
            if let std::collections::btree_map::Entry::Vacant(slot) = by_group.entry(m.group) {
                slot.insert(
                    self.pods(&plan.backend, &format!("member-{}", m.group))
                        .await
                        .unwrap_or_default(),
                );
            }
            let pod = by_group[&m.group]
                .iter()
                .find(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(m.node.as_str()));
            if m.config.tier_dir.is_some() {
                survey.expected += 1;
                if let Some((entries, created)) = pod.and_then(observe::tier_survey) {
                    survey.readings.push((m.node.clone(), entries, created));
                }
            }
            members.push((
                m.clone(),
                pod.map(|p| observe::workload(p, "member")).unwrap_or_default(),
            ));
        }
        (members, (survey.expected > 0).then_some(survey))
    }

    /// Deletes what this runtime rendered for `backend` (workloads first), then its keys in the
    /// store's Secrets once nothing of it is left; `true` once nothing is.
    pub(super) async fn remove_store_now(&self, backend: &str) -> bool {
        let selector = format!(
            "app.kubernetes.io/instance={backend},{}=kvcachebackends",
            render::TYPE_LABEL
        );
        let mut left = false;
        for kind in REMOVAL_ORDER {
            let Some(r) = resource(kind) else { continue };
            let api = self.api(&r);
            let listed = match api.list(&ListParams::default().labels(&selector)).await {
                Ok(l) => l.items,
                Err(e) => {
                    tracing::warn!(backend, "listing {kind}s to remove: {e}");
                    left = true;
                    continue;
                }
            };
            // Only what carries this backend's note is ours, whatever its labels say.
            for object in listed.iter().filter(|o| owned_by(o, backend)) {
                left = true;
                let name = object.metadata.name.clone().unwrap_or_default();
                if object.metadata.deletion_timestamp.is_none()
                    && let Err(e) = api.delete(&name, &DeleteParams::background()).await
                {
                    tracing::warn!(backend, "deleting {kind} {name}: {e}");
                }
            }
        }
        // its keys in the store's Secrets go once its workloads are gone
        if !left && let Err(e) = self.remove_secrets(backend).await {
            tracing::warn!(backend, "{e}");
            left = true;
        }
        !left
    }

    /// The backend's Control token (kept for [`Secrets::control_token`]), scrape token, member
    /// token and seal key, the store's CA (kept for
    /// [`Secrets::store_tls`](crate::runtime::Secrets::store_tls)) and the backend's certificate,
    /// each in the store's Secrets (`token_secrets.rs`), made when missing (the backend's not while
    /// it is being deleted).
    async fn ensure_tokens(&self, plan: &StorePlan) -> Result<(), String> {
        let api = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(self.client.clone(), &self.opts.namespace);
        let control = token_secrets::ensure(&api, &self.opts.namespace, &plan.backend, !plan.existing_only).await?;
        match control {
            Some(t) => self.control_tokens.write().insert(plan.backend.clone(), t),
            None => self.control_tokens.write().remove(&plan.backend),
        };
        let ca = tls_secrets::ca(&api, &self.opts.namespace).await?;
        tls_secrets::ensure_backend(&api, &self.opts.namespace, &plan.backend, &ca, !plan.existing_only).await?;
        *self.store_ca.write() = Some(ca);
        Ok(())
    }

    /// Removes `backend`'s keys from the store's Secrets (its tokens and certificate).
    async fn remove_secrets(&self, backend: &str) -> Result<(), String> {
        let api = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(self.client.clone(), &self.opts.namespace);
        token_secrets::remove_keys(&api, render::TOKENS_SECRET, &token_secrets::keys(backend)).await?;
        tls_secrets::remove_keys(&api, backend).await?;
        self.control_tokens.write().remove(backend);
        Ok(())
    }

    fn api(&self, r: &ApiResource) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), &self.opts.namespace, r)
    }

    /// Applies `object` unless a same-named object exists that is not this backend's; with
    /// `existing_only`, only an object that exists. Returns the object as applied (`None` when
    /// skipped). The leader Deployment rises past one replica in two steps.
    async fn apply(
        &self,
        backend: &str,
        object: &mut Value,
        existing_only: bool,
    ) -> Result<Option<DynamicObject>, String> {
        let kind = object["kind"].as_str().unwrap_or_default().to_owned();
        let name = object["metadata"]["name"].as_str().unwrap_or_default().to_owned();
        let r = resource(&kind).ok_or_else(|| format!("{kind} is not a kind this runtime renders"))?;
        let api = self.api(&r);
        let what = || format!("{kind} {}/{name}", self.opts.namespace);
        match api.get_opt(&name).await {
            Ok(Some(live)) if !owned_by(&live, backend) => {
                return Err(format!(
                    "{} exists and is not this backend's (it has no annotation {}={backend}); rename or remove it",
                    what(),
                    render::BACKEND_NOTE
                ));
            }
            Ok(Some(live)) if kind == "Deployment" => {
                if let Some(live) = as_deployment(&live) {
                    rollout::rise_in_two_steps(object, &live);
                }
            }
            Ok(None) if existing_only => return Ok(None),
            Ok(_) => {}
            Err(e) => return Err(format!("reading {}: {e}", what())),
        }
        let params = PatchParams::apply(FIELD_MANAGER).force();
        api.patch(&name, &params, &Patch::Apply(&*object))
            .await
            .map(Some)
            .map_err(|e| format!("applying {}: {e}", what()))
    }

    /// The backend's Pods of `component`, by name.
    async fn pods(&self, backend: &str, component: &str) -> Result<Vec<Pod>, kube::Error> {
        let api = Api::<Pod>::namespaced(self.client.clone(), &self.opts.namespace);
        let selector = format!(
            "app.kubernetes.io/name=kv-cache-backend,app.kubernetes.io/instance={backend},app.kubernetes.io/component={component}"
        );
        let mut pods = api.list(&ListParams::default().labels(&selector)).await?.items;
        pods.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        Ok(pods)
    }
}

/// A Deployment read through the dynamic API, typed.
fn as_deployment(o: &DynamicObject) -> Option<Deployment> {
    serde_json::to_value(o)
        .ok()
        .and_then(|v| serde_json::from_value(v).ok())
}

/// Whether `object` carries `backend`'s ownership note.
fn owned_by(object: &DynamicObject, backend: &str) -> bool {
    object
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(render::BACKEND_NOTE))
        .is_some_and(|b| b == backend)
}
