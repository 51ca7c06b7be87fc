//! What runs as one engine replica on this machine. By default (`localRuntime.engines:
//! simulated`) the engine simulator, `kv-store engine-sim`, with exactly the injected environment.
//! With `engines: real`, the engine's own command line, as a Pod would run it (`vllm serve
//! <model>` with the injected connector flags, or SGLang's launcher), when that command is
//! installed (found in `localRuntime.path`, then the server's `PATH`) and the model is a local
//! directory; otherwise the simulator again, with a note saying why, which the deployment's
//! phase message shows.
//!
//! A real engine listens on a loopback port of its own (its `--host`/`--port` are replaced), is
//! ready when `GET /health` answers 200 there, loads our connectors from
//! `localRuntime.packageDir` (its `PYTHONPATH`, as a Pod's copy from the store's image), prints
//! its connector's cache reports on stdout (`KVSTORE_REPORT=stdout`), and runs under
//! `kv-store --exit-with-stdin exec`, so it stops with the server like every other child.

use std::path::{Path, PathBuf};

use kvcache_api::model_deployment::EngineName;

use crate::config::{EngineMode, LocalRuntimeConfig};
use crate::runtime::{EngineContainer, Replica};
use crate::runtime::{EventEndpoints, KV_EVENTS_FLAG, PACKAGE_DIR};

/// The simulated engine's workload: a few rounds of prompts, then idle (an engine with no
/// traffic), so that a settled walkthrough settles.
pub const SIMULATED_WORKLOAD: &[(&str, &str)] = &[
    ("KVSTORE_ROUNDS", "3"),
    ("KVSTORE_ROUND_PAUSE", "2s"),
    ("KVSTORE_AFTER_ROUNDS", "idle"),
    ("KVSTORE_BLOCK_BYTES", "16Ki"),
];

/// Variables of the server's own environment a real engine also gets (the rest of its
/// environment is the injection and the role's `env`).
const PASSED_THROUGH: &[&str] = &["HOME", "USER", "LANG", "TMPDIR", "LD_LIBRARY_PATH"];

/// How one replica is started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Where it answers `GET /health` once ready (a real engine); `None`: ready once it reports.
    pub health: Option<String>,
    /// What runs, for the deployment's phase message: `vLLM (vllm serve) at http://…`, or why
    /// the simulator runs although real engines were asked for. `None` for the simulator by
    /// default.
    pub note: Option<String>,
    /// Where the replica answers on this machine, `http://127.0.0.1:<port>`: the real engine's
    /// API, or the simulator's `GET /health` (`KVSTORE_LISTEN`). The deployment's endpoint.
    pub url: String,
    /// Where a real vLLM behind a router publishes its KV events ([`on_unix_sockets`]).
    pub events: Option<EventEndpoints>,
}

/// What the server's environment offers a launch (read once per pass; a table test gives its own).
#[derive(Clone, Debug, Default)]
pub struct Host {
    /// The server's `PATH`, split.
    pub path: Vec<PathBuf>,
    /// The variables of [`PASSED_THROUGH`] the server has.
    pub passed: Vec<(String, String)>,
}

impl Host {
    pub fn current() -> Host {
        Host {
            path: std::env::var_os("PATH")
                .map(|p| std::env::split_paths(&p).collect())
                .unwrap_or_default(),
            passed: PASSED_THROUGH
                .iter()
                .filter_map(|k| std::env::var(k).ok().map(|v| ((*k).to_owned(), v)))
                .collect(),
        }
    }
}

/// The launch of replica `r`, whose environment so far (injection, role, credential) is `env`;
/// a real engine listens on `port`, and publishes its KV events (behind a router) in
/// `events_dir`.
pub fn launch(
    store_binary: &Path,
    cfg: &LocalRuntimeConfig,
    host: &Host,
    r: &Replica,
    env: Vec<(String, String)>,
    port: u16,
    events_dir: &Path,
) -> Launch {
    if cfg.engines == EngineMode::Simulated {
        return simulated(store_binary, env, None, port);
    }
    let e = &r.engine;
    let engine = match e.command.first().map(String::as_str) {
        Some("vllm") => EngineName::Vllm,
        _ => EngineName::Sglang,
    };
    let search: Vec<PathBuf> = cfg.path.iter().chain(&host.path).cloned().collect();
    let program = match runnable(e, engine, &search) {
        Ok(program) => program,
        Err(why) => return simulated(store_binary, env, Some(why), port),
    };
    let env = real_env(env, cfg, host, &search);
    let mut args = vec!["--exit-with-stdin".into(), "exec".into(), "--".into()];
    args.push(program.display().to_string());
    args.extend(e.command.iter().skip(1).cloned());
    let (engine_args, events) = on_unix_sockets(on_loopback(&e.args, port), events_dir, port);
    args.extend(engine_args);
    let name = match engine {
        EngineName::Vllm => "vLLM",
        EngineName::Sglang => "SGLang",
    };
    let url = format!("http://127.0.0.1:{port}");
    Launch {
        program: store_binary.to_owned(),
        args,
        env,
        health: Some(format!("{url}/health")),
        note: Some(format!("{name} ({}) at {url}", e.command.join(" "))),
        url,
        events,
    }
}

/// The simulator's launch: `env` with the [`SIMULATED_WORKLOAD`] it does not set itself, answering
/// `GET /health` on `port` (as an engine answers on its own) unless the role listens elsewhere.
fn simulated(store_binary: &Path, env: Vec<(String, String)>, note: Option<String>, port: u16) -> Launch {
    let mut env = env;
    let listen = format!("127.0.0.1:{port}");
    let ours = [("KVSTORE_LISTEN", listen.as_str())];
    for (k, v) in SIMULATED_WORKLOAD.iter().chain(&ours) {
        if !env.iter().any(|(n, _)| n == k) {
            env.push(((*k).to_owned(), (*v).to_owned()));
        }
    }
    let listen = env
        .iter()
        .find(|(k, _)| k == "KVSTORE_LISTEN")
        .map_or(listen, |(_, v)| v.clone());
    Launch {
        program: store_binary.to_owned(),
        args: vec!["--exit-with-stdin".into(), "engine-sim".into()],
        env,
        health: None,
        note,
        url: format!("http://{listen}"),
        events: None,
    }
}

/// The real engine's program, found in `search`, when its model is a local directory; else why
/// the simulator runs instead.
fn runnable(e: &EngineContainer, engine: EngineName, search: &[PathBuf]) -> Result<PathBuf, String> {
    let Some(command) = e.command.first() else {
        return Err("simulated: the engine has no command".into());
    };
    let Some(program) = find(command, search) else {
        return Err(format!(
            "simulated: {command:?} is not installed (not in localRuntime.path or the server's PATH)"
        ));
    };
    let model = match engine {
        EngineName::Vllm => e.args.first(),
        EngineName::Sglang => e.args.iter().skip_while(|a| *a != "--model-path").nth(1),
    };
    if !model.is_some_and(|m| Path::new(m).is_absolute() && Path::new(m).is_dir()) {
        return Err(format!(
            "simulated: the model {:?} is not a local directory (a real engine here serves a model from a local path)",
            model.map(String::as_str).unwrap_or_default()
        ));
    }
    Ok(program)
}

/// A real engine's environment: `env` with the package directory, the search `PATH`, the
/// server's passed-through variables and stdout reports.
fn real_env(
    env: Vec<(String, String)>,
    cfg: &LocalRuntimeConfig,
    host: &Host,
    search: &[PathBuf],
) -> Vec<(String, String)> {
    let mut env = env;
    // our connectors from this build's package, where a Pod has its copy from the store's image
    if let Some(dir) = &cfg.package_dir {
        for (k, v) in env.iter_mut() {
            if k == "PYTHONPATH" && v == PACKAGE_DIR {
                *v = dir.display().to_string();
            }
        }
    }
    let path = std::env::join_paths(search)
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    env.push(("PATH".into(), path));
    for (k, v) in &host.passed {
        if !env.iter().any(|(n, _)| n == k) {
            env.push((k.clone(), v.clone()));
        }
    }
    env.push(("KVSTORE_REPORT".into(), "stdout".into()));
    env
}

/// `args` with `--host` and `--port` (either spelling) replaced: the engine listens on
/// `127.0.0.1:port`, as every replica of this machine needs a port of its own.
fn on_loopback(args: &[String], port: u16) -> Vec<String> {
    let mut out = Vec::with_capacity(args.len() + 4);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--host" | "--port" => {
                it.next();
            }
            _ if a.starts_with("--host=") || a.starts_with("--port=") => {}
            _ => out.push(a.clone()),
        }
    }
    out.extend(["--host".into(), "127.0.0.1".into(), "--port".into(), port.to_string()]);
    out
}

/// `args` with vLLM's KV event publisher (`--kv-events-config`, [`KV_EVENTS_FLAG`]) moved to
/// Unix sockets in `dir` named by the replica's `port` (one machine's replicas cannot all bind
/// the same TCP ports, and vLLM binds its events on every interface, where a Unix socket is
/// reachable by this machine's processes alone), and where they are. A path too long for a
/// Unix socket drops the publisher: the router then places that replica by load.
fn on_unix_sockets(args: Vec<String>, dir: &Path, port: u16) -> (Vec<String>, Option<EventEndpoints>) {
    let Some(at) = args.iter().position(|a| a == KV_EVENTS_FLAG) else {
        return (args, None);
    };
    let Some(mut config) = args
        .get(at + 1)
        .and_then(|v| serde_json::from_str::<serde_json::Value>(v).ok())
    else {
        return (args, None);
    };
    let socket = |what: &str| format!("ipc://{}", dir.join(format!("{port}.{what}")).display());
    let events = EventEndpoints {
        events: socket("events"),
        replay: socket("replay"),
    };
    let mut args = args;
    // sun_path holds 108 bytes with its terminating zero
    if events.replay.len() - "ipc://".len() >= 108 {
        args.drain(at..at + 2);
        return (args, None);
    }
    config["endpoint"] = serde_json::json!(events.events);
    config["replay_endpoint"] = serde_json::json!(events.replay);
    args[at + 1] = config.to_string();
    (args, Some(events))
}

/// `command` itself when it names a file, else the first executable of that name in `dirs`.
fn find(command: &str, dirs: &[PathBuf]) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &Path| {
        std::fs::metadata(p)
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    };
    if command.contains('/') {
        let p = PathBuf::from(command);
        return executable(&p).then_some(p);
    }
    dirs.iter().map(|d| d.join(command)).find(|p| executable(p))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::EngineContainer;

    fn replica(command: &[&str], args: &[&str]) -> Replica {
        Replica {
            name: "server-0".into(),
            role: "server".into(),
            env: vec![("PYTHONPATH".into(), PACKAGE_DIR.into())],
            args: vec![],
            credential: None,
            client_config: None,
            package_image: Some("store:1".into()),
            engine: EngineContainer {
                image: Ok("x".into()),
                pull_policy: None,
                pull_secrets: vec![],
                command: command.iter().map(|s| (*s).to_owned()).collect(),
                args: args.iter().map(|s| (*s).to_owned()).collect(),
                env: vec![],
                pod_ip_env: vec![],
                port: 8000,
                limits: Default::default(),
                grace_seconds: 30,
            },
        }
    }

    fn env_of(l: &Launch, k: &str) -> Option<String> {
        l.env.iter().rev().find(|(n, _)| n == k).map(|(_, v)| v.clone())
    }

    struct World {
        _dir: tempfile::TempDir,
        bin: PathBuf,
        model: PathBuf,
    }

    fn world() -> World {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        let vllm = bin.join("vllm");
        std::fs::write(&vllm, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&vllm, std::fs::Permissions::from_mode(0o755)).unwrap();
        let model = dir.path().join("model");
        std::fs::create_dir(&model).unwrap();
        World { bin, model, _dir: dir }
    }

    fn real(w: &World) -> LocalRuntimeConfig {
        LocalRuntimeConfig {
            engines: EngineMode::Real,
            path: vec![w.bin.clone()],
            package_dir: Some("/build/python".into()),
        }
    }

    #[test]
    fn by_default_every_replica_is_the_simulator_with_its_workload() {
        let w = world();
        let r = replica(&["vllm", "serve"], &[w.model.to_str().unwrap()]);
        let l = launch(
            Path::new("/kv-store"),
            &LocalRuntimeConfig::default(),
            &Host::default(),
            &r,
            r.env.clone(),
            9,
            Path::new("/run/ev"),
        );
        assert_eq!(l.args, ["--exit-with-stdin", "engine-sim"]);
        assert_eq!(env_of(&l, "KVSTORE_ROUNDS").as_deref(), Some("3"));
        assert_eq!(env_of(&l, "KVSTORE_LISTEN").as_deref(), Some("127.0.0.1:9"));
        assert_eq!(l.url, "http://127.0.0.1:9");
        assert_eq!((l.health, l.note), (None, None));
    }

    #[test]
    fn a_real_vllm_runs_its_command_on_a_port_of_its_own_with_this_builds_package() {
        let w = world();
        let model = w.model.to_str().unwrap();
        let r = replica(
            &["vllm", "serve"],
            &[model, "--block-size", "64", "--host", "0.0.0.0", "--port=8000"],
        );
        let host = Host {
            path: vec!["/usr/bin".into()],
            passed: vec![("HOME".into(), "/root".into())],
        };
        let l = launch(
            Path::new("/kv-store"),
            &real(&w),
            &host,
            &r,
            r.env.clone(),
            41234,
            Path::new("/run/ev"),
        );
        let vllm = w.bin.join("vllm").display().to_string();
        assert_eq!(
            l.args,
            [
                "--exit-with-stdin",
                "exec",
                "--",
                &vllm,
                "serve",
                model,
                "--block-size",
                "64",
                "--host",
                "127.0.0.1",
                "--port",
                "41234"
            ]
        );
        assert_eq!(env_of(&l, "PYTHONPATH").as_deref(), Some("/build/python"));
        assert_eq!(env_of(&l, "KVSTORE_REPORT").as_deref(), Some("stdout"));
        assert_eq!(env_of(&l, "HOME").as_deref(), Some("/root"));
        assert_eq!(env_of(&l, "PATH").unwrap(), format!("{}:/usr/bin", w.bin.display()));
        assert!(env_of(&l, "KVSTORE_ROUNDS").is_none(), "no simulated workload");
        assert_eq!(l.health.as_deref(), Some("http://127.0.0.1:41234/health"));
        assert_eq!(l.note.as_deref(), Some("vLLM (vllm serve) at http://127.0.0.1:41234"));
        assert_eq!(l.events, None);
    }

    #[test]
    fn a_routed_vllm_publishes_its_kv_events_on_unix_sockets_of_its_own() {
        let w = world();
        let model = w.model.to_str().unwrap();
        // as the controllers render a routed replica (`controller::engine::routed_args`)
        let events = r#"{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5558"}"#;
        let r = replica(
            &["vllm", "serve"],
            &[model, KV_EVENTS_FLAG, events, "--enable-prompt-tokens-details"],
        );
        let l = launch(
            Path::new("/kv-store"),
            &real(&w),
            &Host::default(),
            &r,
            r.env.clone(),
            41234,
            Path::new("/run/ev"),
        );
        let want = EventEndpoints {
            events: "ipc:///run/ev/41234.events".into(),
            replay: "ipc:///run/ev/41234.replay".into(),
        };
        assert_eq!(l.events.as_ref(), Some(&want));
        let at = l.args.iter().position(|a| a == KV_EVENTS_FLAG).unwrap();
        let config: serde_json::Value = serde_json::from_str(&l.args[at + 1]).unwrap();
        assert_eq!(config["endpoint"], want.events.as_str());
        assert_eq!(config["replay_endpoint"], want.replay.as_str());
        assert_eq!(config["enable_kv_cache_events"], true);
        assert!(l.args.contains(&"--enable-prompt-tokens-details".to_owned()));

        // a directory too deep for a Unix socket: no publisher, and nothing else lost
        let deep = format!("/{}", "d".repeat(120));
        let l = launch(
            Path::new("/kv-store"),
            &real(&w),
            &Host::default(),
            &r,
            r.env.clone(),
            41234,
            Path::new(&deep),
        );
        assert_eq!(l.events, None);
        assert!(!l.args.iter().any(|a| a == KV_EVENTS_FLAG), "{:?}", l.args);
        assert!(l.args.contains(&"--enable-prompt-tokens-details".to_owned()));
    }

    #[test]
    fn a_real_engine_that_cannot_run_here_falls_back_to_the_simulator_and_says_why() {
        let w = world();
        let named = replica(&["vllm", "serve"], &["Qwen/Qwen2.5-7B-Instruct"]);
        let l = launch(
            Path::new("/kv-store"),
            &real(&w),
            &Host::default(),
            &named,
            named.env.clone(),
            9,
            Path::new("/run/ev"),
        );
        assert_eq!(l.args, ["--exit-with-stdin", "engine-sim"]);
        assert!(l.note.unwrap().contains("is not a local directory"));
        let sglang = replica(
            &["python3", "-m", "sglang.launch_server"],
            &["--model-path", w.model.to_str().unwrap()],
        );
        let l = launch(
            Path::new("/kv-store"),
            &real(&w),
            &Host::default(),
            &sglang,
            sglang.env.clone(),
            9,
            Path::new("/run/ev"),
        );
        assert!(l.note.unwrap().contains("\"python3\" is not installed"));
    }
}
