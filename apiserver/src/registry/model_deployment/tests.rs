//! Admission table of `ModelDeployment`. On create: the model, the engine and its version, roles
//! (count, names, replicas, size), `kvCache.poolRef` in the deployment's own namespace, the flags
//! and env the server injects (refused in `extraArgs` and `env`), instance types and accelerators,
//! volumes and ports, old shapes, and what is not supported yet; prefill/decode roles and the
//! router (their own table, with what the refusals say). On update: what may change
//! (engine version, replicas, `extraArgs`) and what may not (the cache, the engine, the model, the
//! roles' names and resources).

use kvcache_api::model_deployment::{ModelDeployment, ModelDeploymentSpec};
use serde_json::{Value, json};

use crate::field::ErrorType::*;
use crate::registry::RegistryError;
use crate::registry::generic::WriteOptions;
use crate::registry::testing::{Expect, Harness, check, decode, remove, render_refuses_alike, set};

type Edit = fn(&mut Value);

fn md() -> Value {
    json!({"apiVersion": "worker.gpustack.ai/v1", "kind": "ModelDeployment",
           "metadata": {"name": "qwen-chat", "namespace": "team-a"},
           "spec": {"model": {"name": "Qwen/Qwen2.5-7B-Instruct"},
                    "engine": {"name": "vLLM", "version": "0.29.0"},
                    "kvCache": {"poolRef": {"name": "team-a"}},
                    "roles": [{"name": "server", "replicas": 2, "instanceType": "local-small",
                               "resources": {"accelerator": 1}}]}})
}

fn sglang(v: &mut Value) {
    set(v, "/spec/engine/name", json!("SGLang"));
}

async fn create(h: &Harness, v: &Value) -> Result<(ModelDeployment, Vec<String>), RegistryError> {
    let obj = decode::<ModelDeploymentSpec>(v)?;
    h.reg
        .model_deployments
        .create("team-a", obj, WriteOptions::default())
        .await
        .map(|w| (w.object, w.warnings))
}

fn create_cases() -> Vec<(&'static str, Edit, Expect)> {
    use Expect::*;
    vec![
        (
            "walkthrough deployment (Binding not there yet)",
            |_| {},
            Warned("does not exist in namespace"),
        ),
        (
            "empty poolRef",
            |v| set(v, "/spec/kvCache/poolRef/name", json!("")),
            Refused(Required, "spec.kvCache.poolRef.name"),
        ),
        (
            "kvCache without poolRef",
            |v| set(v, "/spec/kvCache", json!({})),
            Refused(Required, "spec.kvCache.poolRef.name"),
        ),
        ("no kvCache", |v| remove(v, "/spec/kvCache"), Admitted),
        (
            "connector nixl",
            |v| set(v, "/spec/kvCache/connector", json!("nixl")),
            Refused(NotSupported, "spec.kvCache.connector"),
        ),
        (
            "poolRef naming another namespace",
            |v| set(v, "/spec/kvCache/poolRef/namespace", json!("team-b")),
            Refused(Forbidden, "spec.kvCache.poolRef.namespace"),
        ),
        (
            "engine vllm lowercase",
            |v| set(v, "/spec/engine/name", json!("vllm")),
            Refused(NotSupported, "spec.engine.name"),
        ),
        (
            "engine as a string (old shape)",
            |v| set(v, "/spec/engine", json!("vllm")),
            Refused(TypeInvalid, "spec.engine"),
        ),
        (
            "engine missing",
            |v| remove(v, "/spec/engine"),
            Refused(Required, "spec.engine"),
        ),
        (
            "no version and no image",
            |v| remove(v, "/spec/engine/version"),
            Refused(Required, "spec.engine.version"),
        ),
        (
            "no version, role names an image",
            |v| {
                remove(v, "/spec/engine/version");
                set(v, "/spec/roles/0/image", json!("vllm/vllm-openai:v0.29.0"));
            },
            Warned("does not exist"),
        ),
        (
            "empty version",
            |v| set(v, "/spec/engine/version", json!("")),
            Refused(Invalid, "spec.engine.version"),
        ),
        (
            "version longer than 64",
            |v| set(v, "/spec/engine/version", json!("1".repeat(65))),
            Refused(TooLong, "spec.engine.version"),
        ),
        (
            "model missing",
            |v| remove(v, "/spec/model"),
            Refused(Required, "spec.model"),
        ),
        (
            "model name empty",
            |v| set(v, "/spec/model/name", json!("")),
            Refused(Required, "spec.model.name"),
        ),
        (
            "model artifact (not supported yet)",
            |v| set(v, "/spec/model/artifactRef", json!({"name": "w"})),
            Refused(Forbidden, "spec.model.artifactRef"),
        ),
        (
            "no roles",
            |v| set(v, "/spec/roles", json!([])),
            Refused(Required, "spec.roles"),
        ),
        (
            "eleven roles",
            |v| {
                set(v, "/metadata/name", json!("m"));
                set(
                    v,
                    "/spec/roles",
                    Value::Array(
                        (0..11)
                            .map(|i| json!({"name": format!("r{i}"), "instanceType": "local-small"}))
                            .collect(),
                    ),
                );
            },
            Refused(TooMany, "spec.roles"),
        ),
        (
            "two roles named server",
            |v| {
                set(
                    v,
                    "/spec/roles/1",
                    json!({"name": "server", "instanceType": "local-small"}),
                );
            },
            Refused(Duplicate, "spec.roles[1].name"),
        ),
        (
            "two Server roles a and b",
            |v| {
                set(
                    v,
                    "/spec/roles",
                    json!([{"name": "a", "instanceType": "local-small"}, {"name": "b", "instanceType": "local-small"}]),
                );
            },
            Warned("does not exist"),
        ),
        (
            "role kind lowercase",
            |v| set(v, "/spec/roles/0/kind", json!("server")),
            Refused(NotSupported, "spec.roles[0].kind"),
        ),
        (
            "replicas 0",
            |v| set(v, "/spec/roles/0/replicas", json!(0)),
            Refused(Invalid, "spec.roles[0].replicas"),
        ),
        (
            "replicas 1025",
            |v| set(v, "/spec/roles/0/replicas", json!(1025)),
            Refused(Invalid, "spec.roles[0].replicas"),
        ),
        (
            "size 65",
            |v| set(v, "/spec/roles/0/size", json!(65)),
            Refused(Invalid, "spec.roles[0].size"),
        ),
        (
            "size 2 (not supported yet)",
            |v| set(v, "/spec/roles/0/size", json!(2)),
            Refused(Forbidden, "spec.roles[0].size"),
        ),
        (
            "grace period 10",
            |v| set(v, "/spec/roles/0/terminationGracePeriodSeconds", json!(10)),
            Refused(Invalid, "spec.roles[0].terminationGracePeriodSeconds"),
        ),
        (
            "Service name of 64 characters",
            |v| {
                set(v, "/metadata/name", json!("a".repeat(40)));
                set(v, "/spec/roles/0/name", json!("r".repeat(23)));
            },
            Refused(Invalid, "spec.roles[0].name"),
        ),
        (
            "role name with capitals",
            |v| set(v, "/spec/roles/0/name", json!("Server")),
            Refused(Invalid, "spec.roles[0].name"),
        ),
        (
            "deployment name with a dot",
            |v| set(v, "/metadata/name", json!("qwen.chat")),
            Refused(Invalid, "metadata.name"),
        ),
        (
            "--kv-transfer-config on vLLM",
            |v| set(v, "/spec/roles/0/extraArgs", json!(["--kv-transfer-config={}"])),
            Refused(Forbidden, "spec.roles[0].extraArgs[0]"),
        ),
        (
            "--kv_transfer_config on vLLM",
            |v| set(v, "/spec/roles/0/extraArgs", json!(["--kv_transfer_config", "{}"])),
            Refused(Forbidden, "spec.roles[0].extraArgs[0]"),
        ),
        (
            "--kv-transfer-conf prefix on vLLM",
            |v| set(v, "/spec/roles/0/extraArgs", json!(["--kv-transfer-conf={}"])),
            Refused(Forbidden, "spec.roles[0].extraArgs[0]"),
        ),
        (
            "--kv-transfer-config.kv_role on vLLM",
            |v| {
                set(
                    v,
                    "/spec/roles/0/extraArgs",
                    json!(["--kv-transfer-config.kv_role=kv_both"]),
                )
            },
            Refused(Forbidden, "spec.roles[0].extraArgs[0]"),
        ),
        (
            "--kv-events-config on vLLM",
            |v| set(v, "/spec/roles/0/extraArgs", json!(["--kv-events-config", "{}"])),
            Refused(Forbidden, "spec.roles[0].extraArgs[0]"),
        ),
        (
            "--kv-transfer-config on SGLang",
            |v| {
                sglang(v);
                set(v, "/spec/roles/0/extraArgs", json!(["--kv-transfer-config={}"]));
            },
            Warned("does not exist"),
        ),
        (
            "--hicache-storage-backend on SGLang",
            |v| {
                sglang(v);
                set(
                    v,
                    "/spec/roles/0/extraArgs",
                    json!(["--hicache-storage-backend", "file"]),
                );
            },
            Refused(Forbidden, "spec.roles[0].extraArgs[0]"),
        ),
        (
            "--disaggregation-mode on SGLang",
            |v| {
                sglang(v);
                set(v, "/spec/roles/0/extraArgs", json!(["--disaggregation_mode=prefill"]));
            },
            Refused(Forbidden, "spec.roles[0].extraArgs[0]"),
        ),
        (
            "MOONCAKE_MASTER on SGLang",
            |v| {
                sglang(v);
                set(
                    v,
                    "/spec/roles/0/env",
                    json!([{"name": "MOONCAKE_MASTER", "value": "x"}]),
                );
            },
            Refused(Forbidden, "spec.roles[0].env[0].name"),
        ),
        (
            "MOONCAKE_MASTER on vLLM",
            |v| {
                set(
                    v,
                    "/spec/roles/0/env",
                    json!([{"name": "MOONCAKE_MASTER", "value": "x"}]),
                )
            },
            Warned("does not exist"),
        ),
        (
            "MOONCAKE_CONFIG_PATH on vLLM",
            |v| {
                set(
                    v,
                    "/spec/roles/0/env",
                    json!([{"name": "MOONCAKE_CONFIG_PATH", "value": "x"}]),
                )
            },
            Refused(Forbidden, "spec.roles[0].env[0].name"),
        ),
        (
            "GPUSTACK_REPLICA_SIZE at size 1",
            |v| {
                set(
                    v,
                    "/spec/roles/0/env",
                    json!([{"name": "GPUSTACK_REPLICA_SIZE", "value": "1"}]),
                )
            },
            Refused(Forbidden, "spec.roles[0].env[0].name"),
        ),
        (
            "MOONCAKE_TENANT_ID on vLLM",
            |v| {
                set(
                    v,
                    "/spec/roles/0/env",
                    json!([{"name": "MOONCAKE_TENANT_ID", "value": "evil"}]),
                )
            },
            Refused(Forbidden, "spec.roles[0].env[0].name"),
        ),
        (
            "duplicate env names",
            |v| set(v, "/spec/roles/0/env", json!([{"name": "A"}, {"name": "A"}])),
            Refused(Duplicate, "spec.roles[0].env[1].name"),
        ),
        (
            "--kv-cache-dtype with a cache attached",
            |v| set(v, "/spec/roles/0/extraArgs", json!(["--kv-cache-dtype", "fp8"])),
            Refused(Forbidden, "spec.roles[0].extraArgs[0]"),
        ),
        (
            "--block-size with a cache attached",
            |v| set(v, "/spec/roles/0/extraArgs", json!(["--block-size=16"])),
            Refused(Forbidden, "spec.roles[0].extraArgs[0]"),
        ),
        (
            "--page-size on SGLang with a cache attached",
            |v| {
                sglang(v);
                set(v, "/spec/roles/0/extraArgs", json!(["--page-size", "16"]));
            },
            Refused(Forbidden, "spec.roles[0].extraArgs[0]"),
        ),
        (
            "--block-size without a cache",
            |v| {
                remove(v, "/spec/kvCache");
                set(v, "/spec/roles/0/extraArgs", json!(["--block-size", "16"]));
            },
            Admitted,
        ),
        (
            "--kv-cache-dtype without a cache",
            |v| {
                remove(v, "/spec/kvCache");
                set(v, "/spec/roles/0/extraArgs", json!(["--kv-cache-dtype", "fp8"]));
            },
            Admitted,
        ),
        (
            "kvTransfer (the handoff goes through the store)",
            |v| set(v, "/spec/kvTransfer", json!({"protocol": "TCP"})),
            Refused(Forbidden, "spec.kvTransfer"),
        ),
        (
            "kvTransfer lowercase protocol",
            |v| set(v, "/spec/kvTransfer", json!({"protocol": "musa"})),
            Refused(NotSupported, "spec.kvTransfer.protocol"),
        ),
        (
            "unknown instance type",
            |v| set(v, "/spec/roles/0/instanceType", json!("a100-80g")),
            Refused(NotFound, "spec.roles[0].instanceType"),
        ),
        (
            "instance type missing",
            |v| remove(v, "/spec/roles/0/instanceType"),
            Refused(Required, "spec.roles[0].instanceType"),
        ),
        (
            "two accelerators on a one-accelerator type",
            |v| set(v, "/spec/roles/0/resources/accelerator", json!(2)),
            Refused(Invalid, "spec.roles[0].resources.accelerator"),
        ),
        (
            "half an accelerator",
            |v| set(v, "/spec/roles/0/resources/accelerator", json!("500m")),
            Refused(Invalid, "spec.roles[0].resources.accelerator"),
        ),
        (
            "accelerator slicing (not supported yet)",
            |v| {
                set(
                    v,
                    "/spec/roles/0/resources/acceleratorSlicedMemoryPercentage",
                    json!(50),
                )
            },
            Refused(Forbidden, "spec.roles[0].resources"),
        ),
        (
            "fabric interfaces (not supported yet)",
            |v| set(v, "/spec/roles/0/resources/interface", json!(1)),
            Refused(Forbidden, "spec.roles[0].resources.interface"),
        ),
        (
            "take-over command (not supported yet)",
            |v| set(v, "/spec/roles/0/command", json!(["sh", "-c", "vllm serve m"])),
            Refused(Forbidden, "spec.roles[0].command"),
        ),
        (
            "privileged (not supported yet)",
            |v| set(v, "/spec/roles/0/privileged", json!(true)),
            Refused(Forbidden, "spec.roles[0].privileged"),
        ),
        (
            "shmSize (not supported yet)",
            |v| set(v, "/spec/roles/0/shmSize", json!("32Gi")),
            Refused(Forbidden, "spec.roles[0].shmSize"),
        ),
        (
            "topology (not supported yet)",
            |v| set(v, "/spec/roles/0/topology", json!({"requiredLevel": "zone"})),
            Refused(Forbidden, "spec.roles[0].topology"),
        ),
        (
            "elastic EP (not supported yet)",
            |v| set(v, "/spec/roles/0/elasticEp", json!({"width": 4})),
            Refused(Forbidden, "spec.roles[0].elasticEp"),
        ),
        (
            "host path volume (not supported yet)",
            |v| {
                set(
                    v,
                    "/spec/roles/0/additionalVolumes",
                    json!([{"mountPath": "/models", "hostPath": {"path": "/data"}}]),
                )
            },
            Refused(Forbidden, "spec.roles[0].additionalVolumes[0].hostPath"),
        ),
        (
            "volume without a source",
            |v| set(v, "/spec/roles/0/additionalVolumes", json!([{"mountPath": "/x"}])),
            Refused(Required, "spec.roles[0].additionalVolumes[0]"),
        ),
        (
            "volume subPath with ..",
            |v| {
                set(
                    v,
                    "/spec/roles/0/additionalVolumes",
                    json!([{"mountPath": "/x", "subPath": "../etc", "configMap": {"name": "c"}}]),
                )
            },
            Refused(Invalid, "spec.roles[0].additionalVolumes[0].subPath"),
        ),
        (
            "port 0",
            |v| set(v, "/spec/roles/0/ports", json!([{"port": 0}])),
            Refused(Invalid, "spec.roles[0].ports[0].port"),
        ),
        (
            "duplicate ports",
            |v| {
                set(
                    v,
                    "/spec/roles/0/ports",
                    json!([{"port": 8000}, {"port": 8000, "protocol": "TCP"}]),
                )
            },
            Refused(Duplicate, "spec.roles[0].ports[1]"),
        ),
        (
            "Kueue queue label (not supported yet)",
            |v| set(v, "/metadata/labels", json!({"kueue.x-k8s.io/queue-name": "q"})),
            Refused(Forbidden, "metadata.labels"),
        ),
        (
            "roles[].template (old shape)",
            |v| set(v, "/spec/roles/0/template", json!({})),
            BadRequest(r#"unknown field "spec.roles[0].template""#),
        ),
        (
            "engineVersion (old shape)",
            |v| set(v, "/spec/engineVersion", json!("0.29.0")),
            BadRequest(r#"unknown field "spec.engineVersion""#),
        ),
    ]
}

/// A deployment of one Prefill and one Decode role behind our router.
fn pd(v: &mut Value) {
    set(
        v,
        "/spec/roles",
        json!([{"name": "prefill", "kind": "Prefill", "instanceType": "local-small"},
               {"name": "decode", "kind": "Decode", "instanceType": "local-small"}]),
    );
    set(v, "/spec/router", json!({"name": "kvcache-router"}));
}

/// Prefill/decode roles and the router: every acceptance and refusal, with its field.
fn prefill_decode_cases() -> Vec<(&'static str, Edit, Expect)> {
    use Expect::*;
    vec![
        (
            "one Prefill and one Decode role behind our router",
            pd,
            Warned("does not exist"),
        ),
        (
            "Prefill and Decode without a router (admitted; RouterReady says nothing pairs them)",
            |v| {
                pd(v);
                remove(v, "/spec/router");
            },
            Warned("does not exist"),
        ),
        (
            "our router before two Server roles",
            |v| {
                set(
                    v,
                    "/spec/roles",
                    json!([{"name": "a", "instanceType": "local-small"}, {"name": "b", "instanceType": "local-small"}]),
                );
                set(v, "/spec/router", json!({"name": "kvcache-router"}));
            },
            Warned("does not exist"),
        ),
        (
            "every router field",
            |v| {
                pd(v);
                set(
                    v,
                    "/spec/router",
                    json!({"name": "kvcache-router", "replicas": 2, "requestTimeoutSeconds": 30,
                           "disaggregationThresholdTokens": 0, "image": "ghcr.io/gpustack/kvcache-store:v0.1.0",
                           "imagePullPolicy": "IfNotPresent", "imagePullSecrets": [{"name": "regcred"}],
                           "extraArgs": ["--health-interval-ms=500", "--unhealthy-after=3",
                                         "--prefill-timeout-seconds=60", "--max-body-bytes=1048576",
                                         "--log-level=kvcache_router=debug"]}),
                );
            },
            Warned("does not exist"),
        ),
        (
            "a Server and a Prefill role",
            |v| {
                set(
                    v,
                    "/spec/roles/1",
                    json!({"name": "p", "kind": "Prefill", "instanceType": "local-small"}),
                )
            },
            Refused(Forbidden, "spec.roles[1].kind"),
        ),
        (
            "a Decode role before a Server role",
            |v| {
                set(v, "/spec/roles/0/kind", json!("Decode"));
                set(v, "/spec/roles/1", json!({"name": "s", "instanceType": "local-small"}));
            },
            Refused(Forbidden, "spec.roles[0].kind"),
        ),
        (
            "a Prefill role alone",
            |v| set(v, "/spec/roles/0/kind", json!("Prefill")),
            Refused(Invalid, "spec.roles[0].kind"),
        ),
        (
            "a Decode role alone",
            |v| set(v, "/spec/roles/0/kind", json!("Decode")),
            Refused(Invalid, "spec.roles[0].kind"),
        ),
        (
            "two Prefill roles",
            |v| {
                pd(v);
                set(
                    v,
                    "/spec/roles/2",
                    json!({"name": "prefill2", "kind": "Prefill", "instanceType": "local-small"}),
                );
            },
            Refused(Duplicate, "spec.roles[2].kind"),
        ),
        (
            "two Decode roles",
            |v| {
                pd(v);
                set(
                    v,
                    "/spec/roles/2",
                    json!({"name": "decode2", "kind": "Decode", "instanceType": "local-small"}),
                );
            },
            Refused(Duplicate, "spec.roles[2].kind"),
        ),
        (
            "Prefill and Decode without a cache",
            |v| {
                pd(v);
                remove(v, "/spec/kvCache");
            },
            Refused(Required, "spec.kvCache"),
        ),
        (
            "Prefill and Decode on SGLang",
            |v| {
                pd(v);
                sglang(v);
            },
            Refused(Forbidden, "spec.roles[0].kind"),
        ),
        (
            "llm-d-router",
            |v| {
                pd(v);
                set(v, "/spec/router/name", json!("llm-d-router"));
            },
            Refused(NotSupported, "spec.router.name"),
        ),
        (
            "vllm-router",
            |v| set(v, "/spec/router", json!({"name": "vllm-router"})),
            Refused(NotSupported, "spec.router.name"),
        ),
        (
            "sglang-gateway",
            |v| set(v, "/spec/router", json!({"name": "sglang-gateway"})),
            Refused(NotSupported, "spec.router.name"),
        ),
        (
            "a router of another name",
            |v| set(v, "/spec/router", json!({"name": "nginx"})),
            Refused(NotSupported, "spec.router.name"),
        ),
        (
            "a router without a name",
            |v| set(v, "/spec/router", json!({"replicas": 1})),
            Refused(Required, "spec.router.name"),
        ),
        (
            "router replicas 0",
            |v| {
                pd(v);
                set(v, "/spec/router/replicas", json!(0));
            },
            Refused(Invalid, "spec.router.replicas"),
        ),
        (
            "router requestTimeoutSeconds 0",
            |v| {
                pd(v);
                set(v, "/spec/router/requestTimeoutSeconds", json!(0));
            },
            Refused(Invalid, "spec.router.requestTimeoutSeconds"),
        ),
        (
            "router disaggregationThresholdTokens -1",
            |v| {
                pd(v);
                set(v, "/spec/router/disaggregationThresholdTokens", json!(-1));
            },
            Refused(Invalid, "spec.router.disaggregationThresholdTokens"),
        ),
        (
            "router image with spaces",
            |v| {
                pd(v);
                set(v, "/spec/router/image", json!("not an image"));
            },
            Refused(Invalid, "spec.router.image"),
        ),
        (
            "router pull secret without a name",
            |v| {
                pd(v);
                set(v, "/spec/router/imagePullSecrets", json!([{"name": ""}]));
            },
            Refused(Required, "spec.router.imagePullSecrets[0].name"),
        ),
        (
            "router --listen (owned)",
            |v| {
                pd(v);
                set(v, "/spec/router/extraArgs", json!(["--listen=0.0.0.0:9000"]));
            },
            Refused(Forbidden, "spec.router.extraArgs[0]"),
        ),
        (
            "router --workers-dns as two entries (owned; the value is no flag)",
            |v| {
                pd(v);
                set(v, "/spec/router/extraArgs", json!(["--workers-dns", "decode=x:8000"]));
            },
            Refused(Forbidden, "spec.router.extraArgs[0]"),
        ),
        (
            "router --model (owned)",
            |v| {
                pd(v);
                set(
                    v,
                    "/spec/router/extraArgs",
                    json!(["--log-level=info", "--model=other"]),
                );
            },
            Refused(Forbidden, "spec.router.extraArgs[1]"),
        ),
        (
            "router --workers-file (owned)",
            |v| {
                pd(v);
                set(v, "/spec/router/extraArgs", json!(["--workers-file=/tmp/w.json"]));
            },
            Refused(Forbidden, "spec.router.extraArgs[0]"),
        ),
        (
            "router --request-timeout-seconds (owned: requestTimeoutSeconds)",
            |v| {
                pd(v);
                set(v, "/spec/router/extraArgs", json!(["--request-timeout-seconds=5"]));
            },
            Refused(Forbidden, "spec.router.extraArgs[0]"),
        ),
        (
            "router --disaggregation-threshold-tokens (owned)",
            |v| {
                pd(v);
                set(
                    v,
                    "/spec/router/extraArgs",
                    json!(["--disaggregation-threshold-tokens=100"]),
                );
            },
            Refused(Forbidden, "spec.router.extraArgs[0]"),
        ),
        (
            "router flag it does not have",
            |v| {
                pd(v);
                set(v, "/spec/router/extraArgs", json!(["--turbo=1"]));
            },
            Refused(Invalid, "spec.router.extraArgs[0]"),
        ),
        (
            "router value as its own entry",
            |v| {
                pd(v);
                set(v, "/spec/router/extraArgs", json!(["--log-level", "debug"]));
            },
            Refused(Invalid, "spec.router.extraArgs[1]"),
        ),
        (
            "router flag without its value",
            |v| {
                pd(v);
                set(v, "/spec/router/extraArgs", json!(["--unhealthy-after"]));
            },
            Refused(Invalid, "spec.router.extraArgs[0]"),
        ),
        (
            "router flag with a bad value",
            |v| {
                pd(v);
                set(v, "/spec/router/extraArgs", json!(["--health-interval-ms=5"]));
            },
            Refused(Invalid, "spec.router.extraArgs[0]"),
        ),
        (
            "router flag with a value that is no number",
            |v| {
                pd(v);
                set(v, "/spec/router/extraArgs", json!(["--max-body-bytes=8MiB"]));
            },
            Refused(Invalid, "spec.router.extraArgs[0]"),
        ),
        (
            "router flag given twice",
            |v| {
                pd(v);
                set(
                    v,
                    "/spec/router/extraArgs",
                    json!(["--log-level=info", "--log-level=debug"]),
                );
            },
            Refused(Duplicate, "spec.router.extraArgs[1]"),
        ),
        (
            "router's rendered names longer than 63",
            |v| {
                pd(v);
                set(v, "/metadata/name", json!(format!("m{}", "x".repeat(56))));
            },
            Refused(Invalid, "metadata.name"),
        ),
        (
            "a role's workers Service longer than 63",
            |v| {
                pd(v);
                set(v, "/metadata/name", json!("m".repeat(30)));
                set(v, "/spec/roles/0/name", json!("p".repeat(26)));
            },
            Refused(Invalid, "spec.roles[0].name"),
        ),
        (
            "router kind lowercase",
            |v| {
                pd(v);
                set(v, "/spec/roles/0/kind", json!("prefill"));
            },
            Refused(NotSupported, "spec.roles[0].kind"),
        ),
    ]
}

#[tokio::test]
async fn prefill_decode_admission_table() {
    for (name, edit, expect) in prefill_decode_cases() {
        let h = Harness::new();
        let mut v = md();
        edit(&mut v);
        let result = create(&h, &v).await;
        if let Err(e) = &result {
            render_refuses_alike(name, &[], &v, e).await;
        }
        check(name, result, expect);
    }
}

/// What the refusals say: the external routers name ours, `kvTransfer` names the store, and a
/// Prefill role without Decode says what to add.
#[tokio::test]
async fn prefill_decode_refusals_say_what_to_do() {
    let said = |edit: Edit, expect: Expect| async move {
        let h = Harness::new();
        let mut v = md();
        edit(&mut v);
        check("message", create(&h, &v).await, expect)
    };
    let m = said(
        |v| set(v, "/spec/router", json!({"name": "vllm-router"})),
        Expect::Refused(NotSupported, "spec.router.name"),
    )
    .await;
    assert!(
        m.contains(r#"Unsupported value: "vllm-router""#) && m.contains(r#"use "kvcache-router", our router"#),
        "{m}"
    );
    let m = said(
        |v| set(v, "/spec/kvTransfer", json!({"protocol": "TCP"})),
        Expect::Refused(Forbidden, "spec.kvTransfer"),
    )
    .await;
    assert!(m.contains("through the shared store"), "{m}");
    let m = said(
        |v| set(v, "/spec/roles/0/kind", json!("Prefill")),
        Expect::Refused(Invalid, "spec.roles[0].kind"),
    )
    .await;
    assert!(m.contains("a Prefill role needs a Decode role"), "{m}");
    let m = said(
        |v| {
            set(
                v,
                "/spec/roles/1",
                json!({"name": "p", "kind": "Prefill", "instanceType": "local-small"}),
            )
        },
        Expect::Refused(Forbidden, "spec.roles[1].kind"),
    )
    .await;
    assert!(m.contains("cannot share a deployment with Server roles"), "{m}");
    let m = said(
        |v| {
            pd(v);
            set(
                v,
                "/spec/roles/2",
                json!({"name": "p2", "kind": "Prefill", "instanceType": "local-small"}),
            );
        },
        Expect::Refused(Duplicate, "spec.roles[2].kind"),
    )
    .await;
    assert!(m.contains("only Server may appear in more than one role"), "{m}");
    let m = said(
        |v| {
            pd(v);
            set(v, "/spec/router/extraArgs", json!(["--listen=0.0.0.0:1"]));
        },
        Expect::Refused(Forbidden, "spec.router.extraArgs[0]"),
    )
    .await;
    assert!(m.contains("--listen is set by the server"), "{m}");
    let m = said(
        |v| {
            pd(v);
            set(v, "/spec/router/extraArgs", json!(["--turbo"]));
        },
        Expect::Refused(Invalid, "spec.router.extraArgs[0]"),
    )
    .await;
    assert!(m.contains("--health-interval-ms, --unhealthy-after"), "{m}");
    let m = said(
        |v| {
            pd(v);
            set(v, "/spec/router/extraArgs", json!(["--health-interval-ms=5"]));
        },
        Expect::Refused(Invalid, "spec.router.extraArgs[0]"),
    )
    .await;
    assert!(m.contains("5 is not in 10.."), "the router's own words: {m}");
}

#[tokio::test]
async fn router_replicas_default_to_one() {
    let h = Harness::new();
    let mut v = md();
    pd(&mut v);
    let (m, _) = create(&h, &v).await.unwrap();
    let r = m.spec.router.unwrap();
    assert_eq!((r.name.as_deref(), r.replicas), (Some("kvcache-router"), Some(1)));
    assert_eq!(
        m.spec.roles[0].kind,
        Some(kvcache_api::model_deployment::RoleKind::Prefill)
    );
}

#[tokio::test]
async fn create_admission_table() {
    let cases = create_cases();
    for (name, edit, expect) in cases {
        let h = Harness::new();
        let mut v = md();
        edit(&mut v);
        let result = create(&h, &v).await;
        if let Err(e) = &result {
            let mut doc = v.clone();
            if doc["metadata"].is_object() && doc["metadata"]["namespace"].is_null() {
                doc["metadata"]["namespace"] = json!("team-a");
            }
            render_refuses_alike(name, &[], &doc, e).await;
        }
        check(name, result, expect);
    }
}

#[tokio::test]
async fn defaults_are_stored() {
    let h = Harness::new();
    let mut v = md();
    remove(&mut v, "/spec/roles/0/resources");
    remove(&mut v, "/spec/roles/0/replicas");
    set(&mut v, "/spec/roles/0/ports", json!([{"port": 9000}]));
    let (m, _) = create(&h, &v).await.unwrap();
    let stored = serde_json::to_value(&m.spec).unwrap();
    assert_eq!(stored["kvCache"]["connector"], "Mooncake");
    let role = &stored["roles"][0];
    assert_eq!(
        (role["kind"].as_str(), role["replicas"].as_i64(), role["size"].as_i64()),
        (Some("Server"), Some(1), Some(1))
    );
    assert_eq!(role["ports"][0]["protocol"], "TCP");
    assert_eq!(
        role["resources"]["accelerator"], "1",
        "one accelerator on an acceleratable type"
    );
    // An explicit 0 is kept; a type without accelerators gets none.
    let mut v = md();
    set(&mut v, "/metadata/name", json!("zero"));
    set(&mut v, "/spec/roles/0/resources/accelerator", json!(0));
    let (m, _) = create(&h, &v).await.unwrap();
    assert_eq!(
        m.spec.roles[0]
            .resources
            .as_ref()
            .unwrap()
            .accelerator
            .as_ref()
            .unwrap()
            .as_str(),
        "0"
    );
    let mut v = md();
    set(&mut v, "/metadata/name", json!("cpu"));
    set(&mut v, "/spec/roles/0/instanceType", json!("local-cpu"));
    remove(&mut v, "/spec/roles/0/resources");
    let (m, _) = create(&h, &v).await.unwrap();
    assert!(m.spec.roles[0].resources.is_none());
}

fn update_cases() -> Vec<(&'static str, Edit, Expect)> {
    use Expect::*;
    vec![
        (
            "change poolRef",
            |v| set(v, "/spec/kvCache/poolRef/name", json!("other")),
            Refused(Forbidden, "spec.kvCache"),
        ),
        (
            "remove kvCache",
            |v| remove(v, "/spec/kvCache"),
            Refused(Forbidden, "spec.kvCache"),
        ),
        (
            "change engine name",
            |v| set(v, "/spec/engine/name", json!("SGLang")),
            Refused(Forbidden, "spec.engine.name"),
        ),
        (
            "change model name",
            |v| set(v, "/spec/model/name", json!("other/model")),
            Refused(Forbidden, "spec.model"),
        ),
        (
            "change engine version",
            |v| set(v, "/spec/engine/version", json!("0.30.0")),
            Admitted,
        ),
        (
            "change replicas",
            |v| set(v, "/spec/roles/0/replicas", json!(3)),
            Admitted,
        ),
        (
            "rename a role",
            |v| set(v, "/spec/roles/0/name", json!("main")),
            Refused(Forbidden, "spec.roles"),
        ),
        (
            "add a role",
            |v| {
                set(
                    v,
                    "/spec/roles/1",
                    json!({"name": "extra", "instanceType": "local-small"}),
                )
            },
            Refused(Forbidden, "spec.roles"),
        ),
        (
            "change instance type",
            |v| {
                set(v, "/spec/roles/0/instanceType", json!("local-cpu"));
                set(v, "/spec/roles/0/resources/accelerator", json!(0));
            },
            Refused(Forbidden, "spec.roles[0].instanceType"),
        ),
        (
            "change resources",
            |v| set(v, "/spec/roles/0/resources/accelerator", json!(0)),
            Refused(Forbidden, "spec.roles[0].resources"),
        ),
        (
            "accelerator 1 to \"1\" is no change",
            |v| set(v, "/spec/roles/0/resources/accelerator", json!("1")),
            Admitted,
        ),
        (
            "edit extraArgs",
            |v| set(v, "/spec/roles/0/extraArgs", json!(["--max-model-len=8192"])),
            Admitted,
        ),
        (
            "add a router",
            |v| set(v, "/spec/router", json!({"name": "kvcache-router"})),
            Admitted,
        ),
        (
            "change a role's kind",
            |v| set(v, "/spec/roles/0/kind", json!("Decode")),
            Refused(Forbidden, "spec.roles[0].kind"),
        ),
    ]
}

#[tokio::test]
async fn update_admission_table() {
    for (name, edit, expect) in update_cases() {
        let h = Harness::new();
        let (created, _) = create(&h, &md()).await.unwrap();
        let mut v = serde_json::to_value(&created).unwrap();
        edit(&mut v);
        let result = match decode::<ModelDeploymentSpec>(&v) {
            Ok(obj) => h
                .reg
                .model_deployments
                .update("team-a", "qwen-chat", obj, WriteOptions::default())
                .await
                .map(|w| (w.object, w.warnings)),
            Err(e) => Err(e),
        };
        check(name, result, expect);
    }
}

#[tokio::test]
async fn adding_a_cache_later_and_reordering_roles() {
    let h = Harness::new();
    let mut v = md();
    remove(&mut v, "/spec/kvCache");
    set(
        &mut v,
        "/spec/roles",
        json!([{"name": "a", "instanceType": "local-small"}, {"name": "b", "instanceType": "local-small"}]),
    );
    let (m, _) = create(&h, &v).await.unwrap();
    let mut reordered = m.clone();
    reordered.spec.roles.swap(0, 1);
    let m = h
        .reg
        .model_deployments
        .update("team-a", "qwen-chat", reordered, WriteOptions::default())
        .await
        .expect("reordering roles is no change of identity")
        .object;
    let mut attached = m.clone();
    attached.spec.kv_cache = Some(kvcache_api::model_deployment::KvCache {
        pool_ref: Some(kvcache_api::model_deployment::BindingRef {
            name: "team-a".into(),
            namespace: None,
        }),
        connector: None,
    });
    check(
        "add kvCache",
        h.reg
            .model_deployments
            .update("team-a", "qwen-chat", attached, WriteOptions::default())
            .await
            .map(|w| (w.object, w.warnings)),
        Expect::Refused(Forbidden, "spec.kvCache"),
    );
}
