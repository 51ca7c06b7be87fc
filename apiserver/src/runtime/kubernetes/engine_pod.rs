//! A ModelDeployment's replicas as Kubernetes objects: one engine Pod `<name>-<role>-<ordinal>`
//! per replica in the deployment's namespace, with its container as the controller computed it
//! (`controller::engine`), the injected environment, our `kvcache` package copied from the
//! store's image by an init container (our store) or the reference's vLLM client file (an
//! external Mooncake store), and a spec hash.

use serde_json::{Value, json};

use super::render::{TYPE_LABEL, field_env, http_probe, owner_reference, plain_env, pull_policy};

/// The note on an engine Pod: the ModelDeployment (`<name>`, in the Pod's namespace) it runs for.
pub const DEPLOYMENT_NOTE: &str = "note.gpustack.ai/model-deployment";
/// A hash of the rendered Pod spec: a Pod whose hash differs is replaced (Pods cannot be updated).
pub const SPEC_HASH: &str = "kvcache.gpustack.ai/pod-spec-hash";
/// The vLLM client configuration, which a downward-API volume turns into the file
/// `MOONCAKE_CONFIG_PATH` names.
pub const CLIENT_CONFIG: &str = "kvcache.gpustack.ai/client-config";

/// The volume holding the engine's copy of our `kvcache` package, and where the init container
/// writes it.
const PACKAGE_VOLUME: &str = "kvcache-package";
const PACKAGE_COPY: &str = "/kvcache-package";

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
    let mut container = engine_container(r, image);
    let mut spec = json!({
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": e.grace_seconds,
        "imagePullSecrets": e.pull_secrets.iter().map(|s| json!({"name": s})).collect::<Vec<_>>(),
    });
    let mut annotations = json!({ DEPLOYMENT_NOTE: deployment });
    // Which credential the Pod runs with: a rotation changes it, so the spec hash, so the Pod is
    // replaced; and the Binding controller retires the previous credential once no Pod names it.
    if let Some(c) = &r.credential {
        annotations[super::credential_secrets::FINGERPRINT_ANNOTATION] = json!(c.fingerprint);
    }
    let (mounts, volumes) = package_and_config(r, &mut spec, &mut annotations);
    if !mounts.is_empty() {
        container["volumeMounts"] = json!(mounts);
        spec["volumes"] = json!(volumes);
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

/// The engine container: the controller's command and environment (the credential from the
/// Binding's Secret), its port and probes on `GET /health`.
fn engine_container(r: &crate::runtime::Replica, image: &str) -> Value {
    let e = &r.engine;
    let mut env: Vec<Value> = plain_env(&e.env)
        .into_iter()
        .filter(|v| !e.pod_ip_env.iter().any(|n| v["name"] == n.as_str()))
        .collect();
    env.extend(e.pod_ip_env.iter().map(|n| field_env(n, "status.podIP")));
    // The credential comes from the Binding's Secret: its value never enters the Pod spec.
    if let Some(c) = &r.credential {
        env.push(super::credential_secrets::credential_env(c));
    }
    let health = |period: u32, failures: u32| http_probe("/health", e.port, period, failures);
    json!({
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
    })
}

/// The package copy's init container (into `spec`) and the client configuration's annotation
/// (into `annotations`), with the engine's mounts and the Pod's volumes for them.
fn package_and_config(
    r: &crate::runtime::Replica,
    spec: &mut Value,
    annotations: &mut Value,
) -> (Vec<Value>, Vec<Value>) {
    let mut mounts = Vec::new();
    let mut volumes = Vec::new();
    // Our connectors come from the store's own build: an init container copies the package the
    // store's image carries into a volume the engine reads (`PYTHONPATH` names it).
    if let Some(image) = &r.package_image {
        let dir = crate::runtime::PACKAGE_DIR;
        spec["initContainers"] = json!([{
            "name": "kvcache-package",
            "image": image,
            "imagePullPolicy": pull_policy(image, None),
            "command": ["cp", "-R", format!("{dir}/."), PACKAGE_COPY],
            "volumeMounts": [{"name": PACKAGE_VOLUME, "mountPath": PACKAGE_COPY}],
            "terminationMessagePolicy": "FallbackToLogsOnError",
        }]);
        mounts.push(json!({"name": PACKAGE_VOLUME, "mountPath": dir, "readOnly": true}));
        volumes.push(json!({"name": PACKAGE_VOLUME, "emptyDir": {}}));
    }
    if let Some(cfg) = &r.client_config {
        annotations[CLIENT_CONFIG] = json!(cfg);
        let dir = crate::runtime::VLLM_CONFIG_PATH
            .rsplit_once('/')
            .map_or("/etc/gpustack/kvcache", |(d, _)| d);
        mounts.push(json!({"name": "gpustack-kvcache-config", "mountPath": dir, "readOnly": true}));
        volumes.push(json!({"name": "gpustack-kvcache-config", "downwardAPI": {"items": [
            {"path": "mooncake.json", "fieldRef": {"fieldPath": format!("metadata.annotations['{CLIENT_CONFIG}']")}},
        ]}}));
    }
    (mounts, volumes)
}

#[cfg(test)]
mod tests {
    use kvcache_api::ModelDeployment;

    use super::*;
    use crate::controller::injection::{Connection, PACKAGE_DIR, StoreKind, VLLM_CONFIG_PATH};
    use crate::runtime::ReplicaPlan;

    const IMAGE: &str = "ghcr.io/gpustack/kvcache-store:v0.1.0";

    fn pod(store: StoreKind) -> Value {
        let md: ModelDeployment = yaml_serde::from_str(
            "apiVersion: worker.gpustack.ai/v1\nkind: ModelDeployment\nmetadata: {name: m, namespace: n}\nspec:\n  model: {name: /models/tiny}\n  engine: {name: vLLM}\n  kvCache: {poolRef: {name: b}}\n  roles:\n  - name: server\n    image: vllm/vllm-openai:v0.32.0\n",
        )
        .unwrap();
        let conn = Connection {
            endpoint: "store-leader.gpustack-system.svc:50051".into(),
            store,
            tenant: Some("default".into()),
            block_size: 64,
            dtype: "bfloat16".into(),
            protocol: "tcp".into(),
            credential: Some(crate::runtime::credentials::ReplicaCredential::new("b", "secret-value")),
            tls: Some(crate::controller::injection::StoreTrust {
                ca_pem: "-----BEGIN CERTIFICATE-----".into(),
                server_name: "store.kvstore.internal".into(),
            }),
        };
        let config = crate::config::Config::default();
        let replicas = crate::controller::model_deployment::replicas(&md, Some(&conn), &config);
        let plan = ReplicaPlan {
            owner: "n/m".into(),
            uid: String::new(),
            replicas: replicas.clone(),
            hold_rollout: false,
            router: None,
        };
        engine_pod(&plan, &replicas[0], "vllm/vllm-openai:v0.32.0")
    }

    fn env<'a>(pod: &'a Value, name: &str) -> Option<&'a Value> {
        pod["spec"]["containers"][0]["env"]
            .as_array()?
            .iter()
            .find(|e| e["name"] == name)
    }

    #[test]
    fn our_store_gives_our_connector_the_package_and_its_path_and_no_mooncake_file() {
        let pod = pod(StoreKind::Ours {
            package_image: IMAGE.into(),
        });
        let engine = &pod["spec"]["containers"][0];
        let args: Vec<&str> = engine["args"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        let at = args.iter().position(|a| *a == "--kv-transfer-config").unwrap();
        let cfg: Value = serde_json::from_str(args[at + 1]).unwrap();
        assert_eq!(cfg["kv_connector"], "KVCacheStoreConnector");
        assert_eq!(cfg["kv_connector_module_path"], "kvcache.vllm");
        // the init container copies the package of the store's image into the shared volume
        let init = &pod["spec"]["initContainers"][0];
        assert_eq!(init["image"], IMAGE);
        assert_eq!(
            init["command"],
            json!(["cp", "-R", format!("{PACKAGE_DIR}/."), PACKAGE_COPY])
        );
        assert_eq!(init["volumeMounts"][0]["name"], PACKAGE_VOLUME);
        assert_eq!(
            engine["volumeMounts"],
            json!([{"name": PACKAGE_VOLUME, "mountPath": PACKAGE_DIR, "readOnly": true}])
        );
        assert_eq!(
            pod["spec"]["volumes"],
            json!([{"name": PACKAGE_VOLUME, "emptyDir": {}}])
        );
        assert_eq!(env(&pod, "PYTHONPATH").unwrap()["value"], PACKAGE_DIR);
        // the store's CA is public: plain environment, no volume
        assert_eq!(
            env(&pod, "KVSTORE_TLS_CA_PEM").unwrap()["value"],
            "-----BEGIN CERTIFICATE-----"
        );
        assert_eq!(
            env(&pod, "KVSTORE_TLS_SERVER_NAME").unwrap()["value"],
            "store.kvstore.internal"
        );
        assert!(env(&pod, "MOONCAKE_CONFIG_PATH").is_none());
        assert!(pod["metadata"]["annotations"].get(CLIENT_CONFIG).is_none());
        // the credential is a Secret reference, never a value in the spec
        assert!(env(&pod, "KVSTORE_CREDENTIAL").unwrap()["valueFrom"]["secretKeyRef"].is_object());
        assert!(!pod.to_string().contains("secret-value"));
    }

    #[test]
    fn an_external_mooncake_store_gets_the_client_file_and_no_package() {
        let pod = pod(StoreKind::Mooncake);
        assert!(pod["spec"].get("initContainers").is_none());
        assert!(env(&pod, "PYTHONPATH").is_none());
        assert_eq!(env(&pod, "MOONCAKE_CONFIG_PATH").unwrap()["value"], VLLM_CONFIG_PATH);
        assert!(pod["metadata"]["annotations"][CLIENT_CONFIG].is_string());
        assert_eq!(pod["spec"]["volumes"][0]["name"], "gpustack-kvcache-config");
    }
}
