//! The real engine's container for a role's replicas:
//! its image (the role's, else the runner image of the engine, version and instance type), the
//! engine's base command, and the command line in this order: the model, the injected
//! connector flags and `--kv-cache-dtype`, for vLLM behind a router its KV events and its
//! report of cached tokens ([`routed_args`]), the role's `extraArgs`, then `--host 0.0.0.0` and
//! `--port` unless the role passed them. A Kubernetes runtime renders it; the local runtime runs
//! the engine simulator instead.

use std::collections::BTreeMap;

use kvcache_api::model_deployment::{EngineName, ModelDeployment, PortProtocol, Role};

use super::injection::Injected;
use crate::config::InstanceType;
use crate::runtime::{ENGINE_EVENTS_PORT, ENGINE_REPLAY_PORT, EngineContainer, KV_EVENTS_FLAG};

/// The port each engine serves on when the role declares none.
pub fn default_port(engine: EngineName) -> u16 {
    match engine {
        EngineName::Vllm => 8000,
        EngineName::Sglang => 30000,
    }
}

/// The runner image's backend for a manufacturer, the `<backend>` of
/// `gpustack/runner:<backend><runtime version>-<engine><version>`; `None` for one without runner
/// images.
fn runner_backend(manufacturer: &str) -> Option<&'static str> {
    Some(match manufacturer {
        "nvidia" => "cuda",
        "ascend" => "cann",
        "amd" => "rocm",
        "metax" => "maca",
        "mthreads" => "musa",
        "iluvatar" => "corex",
        "hygon" => "dtk",
        "thead" => "hggc",
        _ => return None,
    })
}

/// The device-plugin resource of a manufacturer's accelerators.
fn device_resource(manufacturer: &str) -> Option<&'static str> {
    Some(match manufacturer {
        "nvidia" => "nvidia.com/gpu",
        "amd" => "amd.com/gpu",
        _ => return None,
    })
}

fn image(obj: &ModelDeployment, role: &Role, engine: EngineName, it: Option<&InstanceType>) -> Result<String, String> {
    if let Some(i) = role.image.as_deref().map(str::trim).filter(|i| !i.is_empty()) {
        return Ok(i.to_owned());
    }
    let version = obj
        .spec
        .engine
        .as_ref()
        .and_then(|e| e.version.as_deref())
        .unwrap_or_default();
    let backend = it.and_then(|t| t.manufacturer.as_deref()).and_then(runner_backend);
    let runtime = it.and_then(|t| t.runtime_version.as_deref());
    match (backend, runtime) {
        (Some(b), Some(r)) if !version.is_empty() => Ok(format!(
            "gpustack/runner:{b}{r}-{}{version}",
            engine.as_str().to_ascii_lowercase()
        )),
        _ => Err(format!(
            "role {:?} names no image, and its instance type {:?} names no manufacturer and runtime version to choose a runner image from; set roles[].image",
            role.name,
            role.instance_type.as_deref().unwrap_or_default()
        )),
    }
}

/// What a vLLM replica behind the router runs with, so that the router can place requests by
/// what its engine holds: its KV events published on [`ENGINE_EVENTS_PORT`] with a replay on
/// [`ENGINE_REPLAY_PORT`] (the local runtime moves both to Unix sockets of its own), and
/// `usage.prompt_tokens_details.cached_tokens` in its answers, which the router checks its
/// predictions against.
pub fn routed_args(engine: EngineName) -> Vec<String> {
    match engine {
        EngineName::Vllm => vec![
            KV_EVENTS_FLAG.to_owned(),
            serde_json::json!({
                "enable_kv_cache_events": true,
                "publisher": "zmq",
                "endpoint": format!("tcp://*:{ENGINE_EVENTS_PORT}"),
                "replay_endpoint": format!("tcp://*:{ENGINE_REPLAY_PORT}"),
            })
            .to_string(),
            "--enable-prompt-tokens-details".to_owned(),
        ],
        EngineName::Sglang => Vec::new(),
    }
}

/// The engine's command and its arguments, in the order the module's doc gives.
fn command_line(
    obj: &ModelDeployment,
    role: &Role,
    engine: EngineName,
    injected: &Injected,
    port: u16,
    routed: bool,
) -> (Vec<String>, Vec<String>) {
    let model = obj.spec.model.as_ref().map(|m| m.name.clone()).unwrap_or_default();
    let (command, mut args): (Vec<String>, Vec<String>) = match engine {
        EngineName::Vllm => (vec!["vllm".into(), "serve".into()], vec![model]),
        EngineName::Sglang => (
            vec!["python3".into(), "-m".into(), "sglang.launch_server".into()],
            vec!["--model-path".into(), model],
        ),
    };
    args.extend(injected.args.iter().cloned());
    if routed {
        args.extend(routed_args(engine));
    }
    args.extend(role.extra_args.iter().cloned());
    let passed = |flag: &str| {
        role.extra_args
            .iter()
            .any(|a| a == flag || a.starts_with(&format!("{flag}=")))
    };
    if !passed("--host") {
        args.extend(["--host".into(), "0.0.0.0".into()]);
    }
    if !passed("--port") {
        args.extend(["--port".into(), port.to_string()]);
    }
    (command, args)
}

/// The container of `role`'s replicas with `injected`; `routed`: behind the deployment's router.
pub fn container(
    obj: &ModelDeployment,
    role: &Role,
    engine: EngineName,
    injected: &Injected,
    instance_types: &[InstanceType],
    routed: bool,
) -> EngineContainer {
    let it = role
        .instance_type
        .as_deref()
        .and_then(|n| instance_types.iter().find(|t| t.name == n));
    let port = role
        .ports
        .iter()
        .find(|p| p.protocol.unwrap_or(PortProtocol::Tcp) == PortProtocol::Tcp)
        .and_then(|p| u16::try_from(p.port).ok())
        .unwrap_or_else(|| default_port(engine));
    let (command, args) = command_line(obj, role, engine, injected, port, routed);
    let mut env = injected.env.clone();
    env.extend(
        role.env
            .iter()
            .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default())),
    );
    let mut limits = BTreeMap::new();
    let accelerators = role
        .resources
        .as_ref()
        .and_then(|r| r.accelerator.as_ref())
        .map_or_else(
            || it.map_or(0, |t| t.accelerators),
            |a| a.as_str().parse::<u32>().unwrap_or(0),
        );
    if accelerators > 0
        && let Some(r) = it.and_then(|t| t.manufacturer.as_deref()).and_then(device_resource)
    {
        limits.insert(r.to_owned(), accelerators.to_string());
    }
    let pod_ip_env = match engine {
        EngineName::Sglang if !injected.env.is_empty() => vec!["MOONCAKE_LOCAL_HOSTNAME".to_owned()],
        _ => Vec::new(),
    };
    EngineContainer {
        image: image(obj, role, engine, it),
        pull_policy: role
            .image_pull_policy
            .and_then(|p| serde_json::to_value(p).ok().and_then(|v| v.as_str().map(str::to_owned))),
        pull_secrets: role.image_pull_secrets.iter().map(|r| r.name.clone()).collect(),
        command,
        args,
        env,
        pod_ip_env,
        port,
        limits,
        grace_seconds: role.termination_grace_period_seconds.unwrap_or(30),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn md(yaml: &str) -> ModelDeployment {
        yaml_serde::from_str(yaml).unwrap()
    }

    const MD: &str = "apiVersion: worker.gpustack.ai/v1\nkind: ModelDeployment\nmetadata: {name: m, namespace: n}\nspec:\n  model: {name: Qwen/Qwen2.5-7B-Instruct}\n  engine: {name: vLLM, version: \"0.29.0\"}\n  roles:\n  - name: server\n    instanceType: gpu\n    resources: {accelerator: 2}\n    extraArgs: [\"--max-model-len\", \"4096\"]\n";

    fn types(manufacturer: Option<&str>) -> Vec<InstanceType> {
        vec![InstanceType {
            name: "gpu".into(),
            accelerators: 1,
            manufacturer: manufacturer.map(Into::into),
            runtime_version: Some("12.9".into()),
        }]
    }

    #[test]
    fn the_command_line_is_in_the_documented_order() {
        let obj = md(MD);
        let injected = Injected {
            args: vec!["--kv-cache-dtype".into(), "bfloat16".into()],
            ..Injected::default()
        };
        let c = container(
            &obj,
            &obj.spec.roles[0],
            EngineName::Vllm,
            &injected,
            &types(Some("nvidia")),
            false,
        );
        assert_eq!(c.image.as_deref(), Ok("gpustack/runner:cuda12.9-vllm0.29.0"));
        assert_eq!(c.command, ["vllm", "serve"]);
        assert_eq!(
            c.args,
            [
                "Qwen/Qwen2.5-7B-Instruct",
                "--kv-cache-dtype",
                "bfloat16",
                "--max-model-len",
                "4096",
                "--host",
                "0.0.0.0",
                "--port",
                "8000"
            ]
        );
        assert_eq!(
            c.limits,
            BTreeMap::from([("nvidia.com/gpu".to_owned(), "2".to_owned())])
        );
        assert_eq!(c.grace_seconds, 30);

        // behind a router: the KV events and the cached-token report, before extraArgs
        let routed = container(
            &obj,
            &obj.spec.roles[0],
            EngineName::Vllm,
            &injected,
            &types(Some("nvidia")),
            true,
        );
        assert_eq!(routed.args[3], KV_EVENTS_FLAG);
        let events: serde_json::Value = serde_json::from_str(&routed.args[4]).unwrap();
        assert_eq!(
            events,
            serde_json::json!({"enable_kv_cache_events": true, "publisher": "zmq",
                "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"})
        );
        assert_eq!(
            &routed.args[5..7],
            ["--enable-prompt-tokens-details", "--max-model-len"]
        );
        assert!(routed_args(EngineName::Sglang).is_empty());
    }

    #[test]
    fn a_role_port_and_host_are_its_own_and_sglang_learns_its_pod_ip() {
        let obj = md(&MD
            .replace("[\"--max-model-len\", \"4096\"]", "[\"--port=9000\"]")
            .replace("vLLM", "SGLang"));
        let injected = Injected {
            env: vec![("MOONCAKE_MASTER".into(), "x:1".into())],
            ..Injected::default()
        };
        let c = container(
            &obj,
            &obj.spec.roles[0],
            EngineName::Sglang,
            &injected,
            &types(Some("nvidia")),
            false,
        );
        assert_eq!(c.command, ["python3", "-m", "sglang.launch_server"]);
        assert_eq!(&c.args[..2], ["--model-path", "Qwen/Qwen2.5-7B-Instruct"]);
        assert!(c.args.contains(&"--port=9000".to_owned()));
        assert!(!c.args.contains(&"--port".to_owned()), "{:?}", c.args);
        assert_eq!(c.pod_ip_env, ["MOONCAKE_LOCAL_HOSTNAME"]);
    }

    #[test]
    fn without_an_image_or_a_runner_the_container_says_why() {
        let obj = md(MD);
        let c = container(
            &obj,
            &obj.spec.roles[0],
            EngineName::Vllm,
            &Injected::default(),
            &types(None),
            false,
        );
        let why = c.image.unwrap_err();
        assert!(why.contains("set roles[].image"), "{why}");
        assert!(
            c.limits.is_empty(),
            "no device resource is known without a manufacturer"
        );
        let named = md(&MD.replace(
            "    instanceType: gpu\n",
            "    instanceType: gpu\n    image: my/vllm:1\n",
        ));
        let c = container(
            &named,
            &named.spec.roles[0],
            EngineName::Vllm,
            &Injected::default(),
            &types(None),
            false,
        );
        assert_eq!(c.image.as_deref(), Ok("my/vllm:1"));
    }
}
