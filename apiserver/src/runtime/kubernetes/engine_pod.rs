//! A ModelDeployment's replicas as Kubernetes objects: one engine Pod `<name>-<role>-<ordinal>`
//! per replica in the deployment's namespace, with its container as the controller computed it
//! (`controller::engine`), the injected environment, the vLLM client file and a spec hash.

use serde_json::{Value, json};

use super::render::{TYPE_LABEL, field_env, http_probe, owner_reference, plain_env, pull_policy};

/// The note on an engine Pod: the ModelDeployment (`<name>`, in the Pod's namespace) it runs for.
pub const DEPLOYMENT_NOTE: &str = "note.gpustack.ai/model-deployment";
/// A hash of the rendered Pod spec: a Pod whose hash differs is replaced (Pods cannot be updated).
pub const SPEC_HASH: &str = "kvcache.gpustack.ai/pod-spec-hash";
/// The vLLM client configuration, which a downward-API volume turns into the file
/// `MOONCAKE_CONFIG_PATH` names.
pub const CLIENT_CONFIG: &str = "kvcache.gpustack.ai/client-config";

/// The identity labels of a deployment's engine Pods (of one role with `role`).
pub fn engine_labels(deployment: &str, role: Option<&str>) -> Value {
    let mut l = json!({
        "app.kubernetes.io/name": "model-deployment",
        "app.kubernetes.io/instance": deployment,
    });
    if let Some(r) = role {
        l["app.kubernetes.io/component"] = json!(r);
    }
    l
}

/// The engine Pod `<deployment>-<replica>` of one replica: its container as the controller
/// computed it, probes on `GET /health`, the vLLM client configuration as a file, and the hash
/// of all that.
pub fn engine_pod(plan: &crate::runtime::ReplicaPlan, r: &crate::runtime::Replica, image: &str) -> Value {
    let (namespace, deployment) = plan.owner.split_once('/').unwrap_or(("default", plan.owner.as_str()));
    let e = &r.engine;
    let ordinal = r.name.rsplit_once('-').map_or("0", |(_, o)| o);
    let mut env: Vec<Value> = plain_env(&e.env)
        .into_iter()
        .filter(|v| !e.pod_ip_env.iter().any(|n| v["name"] == n.as_str()))
        .collect();
    env.extend(e.pod_ip_env.iter().map(|n| field_env(n, "status.podIP")));
    // The credential comes from the Binding's Secret: its value never enters the Pod spec.
    if let Some(c) = &r.credential {
        env.push(
            json!({"name": crate::runtime::credentials::ENV, "valueFrom": {"secretKeyRef": {
                "name": super::credentials::secret_name(&c.binding),
                "key": super::credentials::KEY,
            }}}),
        );
    }
    let health = |period: u32, failures: u32| http_probe("/health", e.port, period, failures);
    let mut container = json!({
        "name": "engine",
        "image": image,
        "imagePullPolicy": pull_policy(image, e.pull_policy.as_deref()),
        "command": e.command,
        "args": e.args,
        "env": env,
        "ports": [{"name": "http", "containerPort": e.port, "protocol": "TCP"}],
        // Up to 30 minutes to load the model, then readiness and a wider liveness.
        "startupProbe": health(5, 360),
        "readinessProbe": health(5, 3),
        "livenessProbe": health(10, 6),
        "resources": {"limits": e.limits},
        "terminationMessagePolicy": "FallbackToLogsOnError",
    });
    let mut spec = json!({
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": e.grace_seconds,
        "imagePullSecrets": e.pull_secrets.iter().map(|s| json!({"name": s})).collect::<Vec<_>>(),
    });
    let mut annotations = json!({ DEPLOYMENT_NOTE: deployment });
    // Which credential the Pod runs with: a rotation changes it, so the spec hash, so the Pod is
    // replaced; and the Binding controller retires the previous credential once no Pod names it.
    if let Some(c) = &r.credential {
        annotations[super::credentials::FINGERPRINT_ANNOTATION] = json!(c.fingerprint);
    }
    if let Some(cfg) = &r.client_config {
        annotations[CLIENT_CONFIG] = json!(cfg);
        let dir = crate::controller::injection::VLLM_CONFIG_PATH
            .rsplit_once('/')
            .map_or("/etc/gpustack/kvcache", |(d, _)| d);
        container["volumeMounts"] = json!([{"name": "gpustack-kvcache-config", "mountPath": dir, "readOnly": true}]);
        spec["volumes"] = json!([{"name": "gpustack-kvcache-config", "downwardAPI": {"items": [
            {"path": "mooncake.json", "fieldRef": {"fieldPath": format!("metadata.annotations['{CLIENT_CONFIG}']")}},
        ]}}]);
    }
    spec["containers"] = json!([container]);
    let hash = ring::digest::digest(
        &ring::digest::SHA256,
        serde_json::to_string(&(&spec, &annotations))
            .unwrap_or_default()
            .as_bytes(),
    );
    annotations[SPEC_HASH] = json!(hash.as_ref().iter().map(|b| format!("{b:02x}")).collect::<String>());
    let mut labels = engine_labels(deployment, Some(&r.role));
    labels["modeldeployment.gpustack.ai/pod-ordinal"] = json!(ordinal);
    labels[TYPE_LABEL] = json!("modeldeployments");
    let mut meta = json!({
        "name": format!("{deployment}-{}", r.name),
        "namespace": namespace,
        "labels": labels,
        "annotations": annotations,
    });
    if !plan.uid.is_empty() {
        meta["ownerReferences"] = json!([owner_reference("ModelDeployment", deployment, &plan.uid)]);
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec})
}
