//! A deployment's router in a cluster: what it is as objects ([`objects`], pure, so
//! `kv-apiserver render` prints it too), applied in the deployment's namespace, read back, and
//! pruned when `spec.router` goes.
//!
//! - per role a headless Service `<md>-<role>-workers` (`clusterIP: None`,
//!   `publishNotReadyAddresses: false`) selecting the role's engine Pods: one DNS A record per
//!   READY engine Pod, which the router resolves every second (`--workers-dns`), so it needs no
//!   API access at all;
//! - the Service `<md>-router`, port 8000 (`http`), which `status.endpoint` names once a router
//!   replica is ready;
//! - the Deployment `<md>-router`: `kv-router` from the store's image (or `spec.router.image`),
//!   no service account token, non-root with nothing to escalate, ready while `GET /health`
//!   answers (a healthy decode or server worker behind it), alive while its port accepts. Its
//!   environment names the store the engines use, with their credential from the Binding's
//!   Secret (never its value in the spec; its fingerprint annotates the Pods, so a rotation rolls
//!   them and the old credential is retired only once no router Pod runs with it).
//!
//! Router Pods are labelled `app.kubernetes.io/name=kvcache-router`, not `model-deployment`, so
//! no engine selector (a role's Service, the engine Pods' pruning) ever picks them up; the
//! objects carry the deployment's note like its engine Pods, and only objects with it are touched.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::{Value, json};

use super::engine_pod::{DEPLOYMENT_NOTE, engine_labels};
use super::render::{TYPE_LABEL, http_probe, owner_reference, plain_env, pull_policy};
use super::{FIELD_MANAGER, KubernetesRuntime, observe, refused, tenant_namespaces};
use crate::runtime::{ReplicaPlan, RouterObservation, RouterPlan, WorkloadState, worker_kind};

/// The router's port, in its Pods and on its Service.
pub const ROUTER_PORT: u16 = 8000;
/// The `app.kubernetes.io/name` of router Pods and objects.
pub const ROUTER_APP: &str = "kvcache-router";

/// `<md>-router`: the router's Deployment and Service.
pub fn router_name(deployment: &str) -> String {
    format!("{deployment}-router")
}

/// `<md>-<role>-workers`: the headless Service of a role's engine Pods.
pub fn workers_name(deployment: &str, role: &str) -> String {
    format!("{deployment}-{role}-workers")
}

/// Where clients reach the router: its Service.
pub fn endpoint(namespace: &str, deployment: &str) -> String {
    format!("http://{}.{namespace}.svc:{ROUTER_PORT}", router_name(deployment))
}

fn pod_labels(deployment: &str) -> Value {
    json!({
        "app.kubernetes.io/name": ROUTER_APP,
        "app.kubernetes.io/instance": deployment,
        "app.kubernetes.io/component": "router",
    })
}

fn metadata(plan: &ReplicaPlan, name: &str, component: &str) -> Value {
    let (namespace, deployment) = plan.owner.split_once('/').unwrap_or(("default", plan.owner.as_str()));
    let mut meta = json!({
        "name": name,
        "namespace": namespace,
        "labels": {
            "app.kubernetes.io/name": ROUTER_APP,
            "app.kubernetes.io/instance": deployment,
            "app.kubernetes.io/component": component,
            "app.kubernetes.io/part-of": "kvcache",
            TYPE_LABEL: "modeldeployments",
        },
        "annotations": { DEPLOYMENT_NOTE: deployment },
    });
    if !plan.uid.is_empty() {
        meta["ownerReferences"] = json!([owner_reference("ModelDeployment", deployment, &plan.uid)]);
    }
    meta
}

/// The router's objects in the order they are applied: each role's headless Service, the
/// router's Service, its Deployment.
pub fn objects(plan: &ReplicaPlan, r: &RouterPlan, image: &str) -> Vec<Value> {
    let mut out: Vec<Value> = r.roles.iter().map(|role| workers_service(plan, role)).collect();
    out.push(router_service(plan));
    out.push(router_deployment(plan, r, image));
    out
}

/// The headless Service `<md>-<role>-workers`: the role's ready engine Pods, one A record each.
fn workers_service(plan: &ReplicaPlan, role: &crate::runtime::RouterRole) -> Value {
    let deployment = plan.owner.split_once('/').map_or(plan.owner.as_str(), |(_, d)| d);
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(plan, &workers_name(deployment, &role.role), "workers"),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": false,
            "selector": engine_labels(deployment, Some(&role.role)),
            "ports": [{"name": "http", "port": role.port, "targetPort": role.port, "protocol": "TCP"}],
        },
    })
}

/// The Service `<md>-router`, port 8000.
fn router_service(plan: &ReplicaPlan) -> Value {
    let deployment = plan.owner.split_once('/').map_or(plan.owner.as_str(), |(_, d)| d);
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(plan, &router_name(deployment), "router"),
        "spec": {
            "type": "ClusterIP",
            "selector": pod_labels(deployment),
            "ports": [{"name": "http", "port": ROUTER_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    })
}

/// The router's command line in a Pod: where it listens, each role's headless Service (by kind),
/// then the spec's flags.
pub fn args(plan: &ReplicaPlan, r: &RouterPlan) -> Vec<String> {
    let (namespace, deployment) = plan.owner.split_once('/').unwrap_or(("default", plan.owner.as_str()));
    let mut args = vec!["--listen".to_owned(), format!("0.0.0.0:{ROUTER_PORT}")];
    for role in &r.roles {
        args.push("--workers-dns".to_owned());
        args.push(format!(
            "{}={}.{namespace}.svc.cluster.local:{}",
            worker_kind(role.kind),
            workers_name(deployment, &role.role),
            role.port
        ));
    }
    args.extend(r.args.iter().cloned());
    args
}

/// The router's environment in a Pod: the store it follows, then the credential from the
/// Binding's Secret.
fn env(r: &RouterPlan) -> Vec<Value> {
    let mut env = plain_env(&r.store_env);
    env.extend(r.credential.as_ref().map(super::credential_secrets::credential_env));
    env
}

/// The Deployment `<md>-router`.
fn router_deployment(plan: &ReplicaPlan, r: &RouterPlan, image: &str) -> Value {
    let deployment = plan.owner.split_once('/').map_or(plan.owner.as_str(), |(_, d)| d);
    let mut template_meta = json!({"labels": pod_labels(deployment)});
    if let Some(c) = &r.credential {
        template_meta["annotations"] = json!({super::credential_secrets::FINGERPRINT_ANNOTATION: c.fingerprint});
    }
    let container = json!({
        "name": "router",
        "image": image,
        "imagePullPolicy": pull_policy(image, r.pull_policy.as_deref()),
        "command": ["kv-router"],
        "args": args(plan, r),
        "env": env(r),
        "ports": [{"name": "http", "containerPort": ROUTER_PORT, "protocol": "TCP"}],
        // ready while a decode or server worker behind it is healthy (its /health says so)
        "readinessProbe": http_probe("/health", ROUTER_PORT, 2, 2),
        // alive while it accepts: a router without healthy workers is not broken
        "livenessProbe": {"tcpSocket": {"port": ROUTER_PORT}, "periodSeconds": 10, "failureThreshold": 6},
        "resources": {
            "requests": {"cpu": "100m", "memory": "64Mi"},
            "limits": {"memory": "512Mi"},
        },
        "securityContext": {
            "allowPrivilegeEscalation": false,
            "readOnlyRootFilesystem": true,
            "capabilities": {"drop": ["ALL"]},
        },
        "terminationMessagePolicy": "FallbackToLogsOnError",
    });
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(plan, &router_name(deployment), "router"),
        "spec": {
            "replicas": r.replicas,
            "selector": {"matchLabels": pod_labels(deployment)},
            "template": {
                "metadata": template_meta,
                "spec": {
                    // its workers come from DNS: it needs no API access at all
                    "automountServiceAccountToken": false,
                    "enableServiceLinks": false,
                    "securityContext": {
                        "runAsNonRoot": true,
                        "runAsUser": 65532,
                        "runAsGroup": 65532,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "imagePullSecrets": r.pull_secrets.iter().map(|s| json!({"name": s})).collect::<Vec<_>>(),
                    "containers": [container],
                },
            },
        },
    })
}

impl KubernetesRuntime {
    /// Applies the router's objects (prunes them when `plan.router` is `None`) and reads back its
    /// Deployment's ready replicas and its Pods' faults.
    pub(super) async fn converge_router(&self, plan: &ReplicaPlan) -> Option<RouterObservation> {
        let (namespace, deployment) = plan.owner.split_once('/').unwrap_or(("default", plan.owner.as_str()));
        let Some(r) = &plan.router else {
            if self.tenants.enter(namespace).await == Ok(tenant_namespaces::Entered::Yes) {
                self.prune_router(namespace, deployment, &[]).await;
            }
            return None;
        };
        let observed = |state: WorkloadState| RouterObservation {
            replicas: r.replicas,
            ready: 0,
            url: Some(endpoint(namespace, deployment)),
            state,
        };
        match self.tenants.enter(namespace).await {
            Ok(tenant_namespaces::Entered::Yes) => {}
            Ok(tenant_namespaces::Entered::NoSuchNamespace) => {
                return Some(observed(refused(format!(
                    "the namespace {namespace} does not exist; create it"
                ))));
            }
            Err(why) => return Some(observed(refused(why))),
        }
        let image = match &r.image {
            Ok(i) => i.clone(),
            Err(why) => return Some(observed(refused(why.clone()))),
        };
        let objects = objects(plan, r, &image);
        let mut applied_deployment = None;
        for object in &objects {
            let applied = if plan.hold_rollout && object["kind"] == "Deployment" {
                self.hold_for(namespace, deployment, object).await
            } else {
                self.apply_for(namespace, deployment, object).await
            };
            match applied {
                Ok(applied) if object["kind"] == "Deployment" => applied_deployment = Some(applied),
                Ok(_) => {}
                Err(why) => return Some(observed(refused(why))),
            }
        }
        let planned: Vec<String> = objects
            .iter()
            .filter_map(|o| o["metadata"]["name"].as_str().map(str::to_owned))
            .collect();
        self.prune_router(namespace, deployment, &planned).await;
        let ready = applied_deployment
            .and_then(|d| serde_json::from_value::<Deployment>(serde_json::to_value(d).ok()?).ok())
            .and_then(|d| d.status?.ready_replicas)
            .unwrap_or(0);
        let state = self.router_pod_state(namespace, deployment).await;
        Some(RouterObservation {
            ready,
            ..observed(state)
        })
    }

    /// The first router Pod that is not ready (its fault), else the first one.
    async fn router_pod_state(&self, namespace: &str, deployment: &str) -> WorkloadState {
        let api = Api::<Pod>::namespaced(self.client.clone(), namespace);
        let selector = format!("app.kubernetes.io/name={ROUTER_APP},app.kubernetes.io/instance={deployment}");
        match api.list(&ListParams::default().labels(&selector)).await {
            Ok(l) => {
                let states: Vec<WorkloadState> = l.items.iter().map(|p| observe::workload(p, "router")).collect();
                states
                    .iter()
                    .find(|s| !s.ready)
                    .or_else(|| states.first())
                    .cloned()
                    .unwrap_or_default()
            }
            Err(e) => {
                tracing::debug!(deployment, "listing router Pods: {e}");
                WorkloadState::default()
            }
        }
    }

    /// The deployment's router Deployment as it runs, left as it is: while the cache connection
    /// does not resolve (a store failover), the router keeps the store it follows instead of
    /// rolling to a spec without one and back. Applied when none runs yet.
    async fn hold_for(&self, namespace: &str, deployment: &str, object: &Value) -> Result<DynamicObject, String> {
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        let r = super::store::resource("Deployment").ok_or("Deployment is not a kind this runtime renders")?;
        let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), namespace, &r);
        match api.get_opt(name).await {
            Ok(Some(live)) if noted(&live, deployment) => Ok(live),
            _ => self.apply_for(namespace, deployment, object).await,
        }
    }

    /// Applies one object of the deployment in `namespace`, unless a same-named object there is
    /// not the deployment's.
    async fn apply_for(&self, namespace: &str, deployment: &str, object: &Value) -> Result<DynamicObject, String> {
        let kind = object["kind"].as_str().unwrap_or_default();
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        let r = super::store::resource(kind).ok_or_else(|| format!("{kind} is not a kind this runtime renders"))?;
        let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), namespace, &r);
        match api.get_opt(name).await {
            Ok(Some(live)) if !noted(&live, deployment) => {
                return Err(format!(
                    "{kind} {namespace}/{name} exists and is not this deployment's (no annotation {DEPLOYMENT_NOTE}={deployment}); rename or remove it"
                ));
            }
            Ok(_) => {}
            Err(e) => {
                self.tenants.forget_if_forbidden(namespace, &e);
                return Err(format!("reading {kind} {namespace}/{name}: {e}"));
            }
        }
        api.patch(name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(object))
            .await
            .map_err(|e| format!("applying {kind} {namespace}/{name}: {e}"))
    }

    /// Deletes the deployment's router objects not in `keep` (all of them with none kept).
    pub(super) async fn prune_router(&self, namespace: &str, deployment: &str, keep: &[String]) -> bool {
        let selector = format!("app.kubernetes.io/name={ROUTER_APP},app.kubernetes.io/instance={deployment}");
        let mut left = false;
        for kind in ["Deployment", "Service"] {
            let Some(r) = super::store::resource(kind) else {
                continue;
            };
            let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), namespace, &r);
            let Ok(list) = api.list(&ListParams::default().labels(&selector)).await else {
                left = true;
                continue;
            };
            for o in list.items.iter().filter(|o| noted(o, deployment)) {
                let name = o.metadata.name.clone().unwrap_or_default();
                if keep.contains(&name) {
                    continue;
                }
                left = true;
                if o.metadata.deletion_timestamp.is_none()
                    && let Err(e) = api.delete(&name, &DeleteParams::background()).await
                {
                    tracing::warn!(deployment, "deleting {kind} {namespace}/{name}: {e}");
                }
            }
        }
        !left
    }
}

/// Whether `object` carries `deployment`'s note.
fn noted(object: &DynamicObject, deployment: &str) -> bool {
    object
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(DEPLOYMENT_NOTE))
        .is_some_and(|d| d == deployment)
}

#[cfg(test)]
mod tests {
    use kvcache_api::model_deployment::RoleKind;

    use super::*;
    use crate::runtime::RouterRole;

    fn plan() -> ReplicaPlan {
        ReplicaPlan {
            owner: "team-a/qwen-pd".into(),
            uid: "u-1".into(),
            replicas: vec![],
            hold_rollout: false,
            router: Some(RouterPlan {
                name: "kvcache-router".into(),
                replicas: 2,
                image: Ok("ghcr.io/gpustack/kvcache-store:v0.1.0".into()),
                pull_policy: None,
                pull_secrets: vec!["regcred".into()],
                args: vec!["--model".into(), "m".into(), "--log-level=debug".into()],
                store_env: vec![("KVSTORE_LEADER".into(), "cache-leader.kvcache-system.svc:7000".into())],
                credential: Some(crate::runtime::credentials::ReplicaCredential::new("cache", "minted")),
                roles: vec![
                    RouterRole {
                        role: "prefill".into(),
                        kind: RoleKind::Prefill,
                        port: 8000,
                    },
                    RouterRole {
                        role: "decode".into(),
                        kind: RoleKind::Decode,
                        port: 9000,
                    },
                ],
            }),
        }
    }

    #[test]
    fn the_router_is_a_deployment_a_service_and_a_headless_service_per_role() {
        let p = plan();
        let objects = objects(&p, p.router.as_ref().unwrap(), "img:1");
        let names: Vec<(&str, &str)> = objects
            .iter()
            .map(|o| (o["kind"].as_str().unwrap(), o["metadata"]["name"].as_str().unwrap()))
            .collect();
        assert_eq!(
            names,
            [
                ("Service", "qwen-pd-prefill-workers"),
                ("Service", "qwen-pd-decode-workers"),
                ("Service", "qwen-pd-router"),
                ("Deployment", "qwen-pd-router"),
            ]
        );
        let decode = &objects[1]["spec"];
        assert_eq!(decode["clusterIP"], "None");
        assert_eq!(decode["publishNotReadyAddresses"], false);
        assert_eq!(
            decode["selector"],
            json!({"app.kubernetes.io/name": "model-deployment", "app.kubernetes.io/instance": "qwen-pd", "app.kubernetes.io/component": "decode"})
        );
        assert_eq!(decode["ports"][0]["port"], 9000);
        assert_eq!(objects[2]["spec"]["ports"][0]["port"], 8000);
        let d = &objects[3];
        assert_eq!(d["spec"]["replicas"], 2);
        let pod = &d["spec"]["template"]["spec"];
        assert_eq!(pod["automountServiceAccountToken"], false);
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
        let c = &pod["containers"][0];
        assert_eq!(c["command"], json!(["kv-router"]));
        assert_eq!(
            c["args"],
            json!([
                "--listen",
                "0.0.0.0:8000",
                "--workers-dns",
                "prefill=qwen-pd-prefill-workers.team-a.svc.cluster.local:8000",
                "--workers-dns",
                "decode=qwen-pd-decode-workers.team-a.svc.cluster.local:9000",
                "--model",
                "m",
                "--log-level=debug"
            ])
        );
        assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/health");
        assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
        // the store the engines use, and their credential from the Binding's Secret, never its
        // value; its fingerprint on the Pods, so a rotation rolls them
        assert_eq!(
            c["env"],
            json!([
                {"name": "KVSTORE_LEADER", "value": "cache-leader.kvcache-system.svc:7000"},
                {"name": "KVSTORE_CREDENTIAL", "valueFrom": {"secretKeyRef": {
                    "name": "kvcache-credentials", "key": "cache.credential"}}},
            ])
        );
        assert!(!d.to_string().contains("minted"));
        let fingerprint = crate::runtime::credentials::fingerprint("minted");
        assert_eq!(
            d["spec"]["template"]["metadata"]["annotations"][super::super::credential_secrets::FINGERPRINT_ANNOTATION],
            fingerprint.as_str()
        );
        assert_eq!(pod["imagePullSecrets"], json!([{"name": "regcred"}]));
        // router Pods are not engine Pods: no engine selector picks them up
        assert_eq!(
            d["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"],
            ROUTER_APP
        );
        for o in &objects {
            assert_eq!(o["metadata"]["annotations"][DEPLOYMENT_NOTE], "qwen-pd");
            assert_eq!(o["metadata"]["ownerReferences"][0]["uid"], "u-1");
        }
        assert_eq!(endpoint("team-a", "qwen-pd"), "http://qwen-pd-router.team-a.svc:8000");
    }
}
