//! What the real-engine tests (`real_engines.rs`, `prefill_decode.rs`, `placement.rs`) share: where the vLLM
//! environment, the local model and this build's `kvcache` package are, the server
//! configuration that runs real `vllm serve` replicas, and how a test reaches and watches them
//! (their URLs from a deployment's status, curl, counters from `/metrics`, their processes), and
//! the words their prompts are made of.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::walkthrough::{alive, jp, manifest, wait_granted, wait_ready_backend};
#[allow(
    unused_imports,
    reason = "the real-engine tests use it; other tests include this file too"
)]
pub use super::words::generated_words;
use super::{Kubectl, Server};

/// What `./scripts/setup` makes and `./scripts/test` names for the real engines.
pub struct Engines {
    pub venv: PathBuf,
    pub model: PathBuf,
    pub package: PathBuf,
}

fn home(rel: &str) -> PathBuf {
    PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into())).join(rel)
}

fn setting(var: &str, default: PathBuf, what: &str) -> PathBuf {
    let p = std::env::var_os(var).map_or(default, PathBuf::from);
    assert!(
        p.exists(),
        "{} is missing: {what} ({var}; ./scripts/setup makes it, ./scripts/test sets it)",
        p.display()
    );
    p
}

/// The vLLM environment, the local model and the package (`KVCACHE_VLLM_VENV`,
/// `KVCACHE_VLLM_MODEL`, `KVCACHE_PACKAGE_DIR`), each checked to be there.
pub fn engines() -> Engines {
    let venv = setting(
        "KVCACHE_VLLM_VENV",
        home(".cache/kvcache-vllm-venv"),
        "the vLLM environment",
    );
    let model = setting(
        "KVCACHE_VLLM_MODEL",
        home(".cache/kvcache-vllm-model"),
        "the local model",
    );
    let package = setting(
        "KVCACHE_PACKAGE_DIR",
        PathBuf::from("/nonexistent"),
        "this build's kvcache package",
    );
    assert!(
        package.join("kvcache").join("vllm").join("__init__.py").exists(),
        "no kvcache package in {}",
        package.display()
    );
    Engines { venv, model, package }
}

impl Engines {
    /// The model's path, as deployments name it.
    pub fn model(&self) -> String {
        self.model.display().to_string()
    }

    /// Writes the server configuration that runs real engines from this environment and
    /// package into `dir`; returns its path.
    pub fn config(&self, dir: &Path) -> PathBuf {
        let config = dir.join("config.yaml");
        std::fs::write(
            &config,
            format!(
                "localRuntime:\n  engines: real\n  path: [{}]\n  packageDir: {}\n",
                self.venv.join("bin").display(),
                self.package.display()
            ),
        )
        .expect("the server configuration is written");
        config
    }
}

/// How often a wait for engines to start polls. Each poll runs kubectl (tens of milliseconds of
/// CPU), and at the tests' usual 50 ms the polls took much of a core from the vLLM processes
/// starting beside them.
pub const STARTING_POLL: Duration = Duration::from_secs(1);

/// Polls `f` every [`STARTING_POLL`] until it gives a value; fails the test after `within`: for
/// the waits on engines starting (a minute or more on two cores).
pub fn eventually_started<T>(within: Duration, what: &str, f: impl FnMut() -> Option<T>) -> T {
    super::poll_within(within, STARTING_POLL, f).unwrap_or_else(|| panic!("{what}: not within {within:?}"))
}

/// `replica -> http://127.0.0.1:PORT` from a deployment's phase message.
pub fn replica_urls(k: &Kubectl, ns: &str, name: &str) -> Vec<(String, String)> {
    let msg = jp(k, &["-n", ns, "md", name], "{.status.phaseMessage}");
    msg.split("; ")
        .filter_map(|part| {
            let (replica, rest) = part.split_once(": ")?;
            let url = rest.split(" at ").nth(1)?;
            rest.starts_with("vLLM")
                .then(|| (replica.to_owned(), url.trim().to_owned()))
        })
        .collect()
}

/// curl's output, or its error.
pub fn try_curl(args: &[&str]) -> Result<String, String> {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "600"])
        .args(args)
        .output()
        .expect("curl runs");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// curl's answer to the JSON `body` POSTed to `url` (`-N`: server-sent events as they come),
/// or its error.
pub fn try_post_json(url: &str, body: &str) -> Result<String, String> {
    try_curl(&[
        "-N",
        "-X",
        "POST",
        url,
        "-H",
        "content-type: application/json",
        "-d",
        body,
    ])
}

/// curl's output; a failed request fails the test.
pub fn curl(args: &[&str]) -> String {
    try_curl(args).unwrap_or_else(|e| panic!("curl {args:?}: {e}"))
}

/// The sum of a counter (every label set) on a process's `/metrics`; 0 when it does not answer.
pub fn counter(url: &str, name: &str) -> f64 {
    try_curl(&[&format!("{url}/metrics")])
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#') && !l.contains("_created"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Every live process whose command line (arguments joined by spaces) `matches`, with it.
pub fn processes(matches: impl Fn(&str) -> bool) -> Vec<(u32, String)> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_string_lossy().parse::<u32>().ok()?;
            let cmd = String::from_utf8_lossy(&std::fs::read(e.path().join("cmdline")).ok()?).replace('\0', " ");
            (matches(&cmd) && alive(pid)).then_some((pid, cmd))
        })
        .collect()
}

/// Every live process running `vllm serve` (the engines and their `kv-store exec` wrappers),
/// with its command line.
pub fn vllm_serve() -> Vec<(u32, String)> {
    processes(|cmd| cmd.contains(" serve "))
}

pub fn kill9(pid: u32) {
    assert!(
        Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()
            .expect("kill runs")
            .success()
    );
}

/// The walkthrough's store Lease.
const LEASE: &[&str] = &["-n", "kvcache-system", "lease", "mooncake-dram-leader"];

/// The Lease's holder (the serving leader's listen address) and term.
pub fn lease_holder(k: &Kubectl) -> Option<(String, u64)> {
    let out = jp(k, LEASE, "{.spec.holderIdentity} {.spec.leaseTransitions}");
    let (h, t) = out.split_once(' ')?;
    Some((h.to_owned(), t.parse().unwrap_or(0))).filter(|(h, _)| !h.is_empty())
}

/// `kv-apiserver serve` running real engines from `e` (its data and configuration in `dir`),
/// with the walkthrough's backend of three leader replicas and team-a's Binding granted: where
/// the real-engine deployments go.
pub fn serve_on_ha_backend(e: &Engines, dir: &Path, kubectl: &str) -> (Server, Kubectl) {
    let config = e.config(dir);
    let s = Server::start_with(&[
        "--requeue-interval",
        "2s",
        "--config",
        config.to_str().expect("a UTF-8 path"),
    ]);
    let k = s.kubectl(kubectl);
    k.must_apply(&manifest("01-backend.yaml"));
    k.must_apply(&manifest("02-pool-binding.yaml"));
    k.must_apply(&manifest("04-high-availability.yaml"));
    wait_ready_backend(&k, "2Gi");
    wait_granted(&k, "1Gi");
    (s, k)
}

/// The `vllm serve` processes of `model` that still run.
pub fn vllm_processes(model: &str) -> Vec<u32> {
    vllm_serve()
        .into_iter()
        .filter(|(_, cmd)| cmd.contains(model))
        .map(|(pid, _)| pid)
        .collect()
}
