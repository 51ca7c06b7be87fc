//! Time to first token behind the router, by placement policy (issue 42): three real `vllm
//! serve` replicas of the local model (the vLLM environment and model `scripts/setup` installs:
//! `KVCACHE_VLLM_VENV`, `KVCACHE_VLLM_MODEL`), each publishing its KV events, and the real
//! `kv-router` in front of them with `--placement memory`, `least-loaded` and `round-robin` in
//! turn. No store: the comparison is what each replica's own prefix cache serves.
//!
//! Workload per policy (prefixes of its own, so no policy inherits another's cache): PREFIXES
//! prefixes of about 1,000 tokens, each sent REPEATS times with new endings, shuffled, by three
//! clients at once; streamed, 4 tokens each, TTFT the time to the first event. Prints TTFT
//! p50/p99 of every request and of the repeats alone, and the share of prompt tokens vLLM served
//! from cache (`cached_tokens`).
//!
//! First it prints the decision's own cost (`benches/decision.rs`), so one run gives both.
//!
//! `cargo bench -p kvcache-router --bench placement` (about 5 minutes on this 2-vCPU VM).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// The e2e tests' prompt words.
#[path = "../../tests/support/words.rs"]
mod words;
use words::generated_words;

#[allow(dead_code, reason = "its main is the decision bench's own")]
#[path = "decision.rs"]
mod decision;

const POLICIES: [&str; 3] = ["memory", "least-loaded", "round-robin"];
const REPLICAS: usize = 3;
const CLIENTS: usize = 3;

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn home(rel: &str) -> PathBuf {
    PathBuf::from(std::env::var_os("HOME").unwrap()).join(rel)
}

fn setting(name: &str, default: PathBuf) -> PathBuf {
    let p = std::env::var_os(name).map_or(default, PathBuf::from);
    assert!(p.exists(), "{} ({name}) is missing: run scripts/setup", p.display());
    p
}

/// A child process killed when dropped, with every process it started: it leads a process
/// group of its own (`vllm serve` starts its engine core and workers as children, which a kill
/// of the server alone leaves running).
struct Proc(Child);

impl Proc {
    fn spawn(mut command: Command) -> Proc {
        use std::os::unix::process::CommandExt;
        Proc(command.process_group(0).spawn().unwrap())
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let group = format!("-{}", self.0.id());
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn vllm(venv: &Path, model: &Path, port: u16, events: &Path) -> Proc {
    let config = json!({
        "enable_kv_cache_events": true, "publisher": "zmq",
        "endpoint": format!("ipc://{}/{port}.events", events.display()),
        "replay_endpoint": format!("ipc://{}/{port}.replay", events.display()),
    });
    let mut command = Command::new(venv.join("bin/vllm"));
    command
        .arg("serve")
        .arg(model)
        .args(["--max-model-len", "4096", "--enforce-eager", "--dtype", "bfloat16"])
        .args([
            "--block-size",
            "64",
            "--enable-prompt-tokens-details",
            "--host",
            "127.0.0.1",
        ])
        .args(["--port", &port.to_string(), "--kv-events-config", &config.to_string()])
        .envs([
            ("VLLM_CPU_KVCACHE_SPACE", "1"),
            ("HF_HUB_OFFLINE", "1"),
            ("VLLM_NO_USAGE_STATS", "1"),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    Proc::spawn(command)
}

fn get(url: &str) -> Option<String> {
    let out = Command::new("curl")
        .args(["-sf", "--max-time", "5", url])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

fn wait_for(what: &str, within: Duration, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !ok() {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// One streamed request: (time to the first event, prompt tokens, cached tokens).
fn ask(router: &str, model: &str, prompt: &str) -> (Duration, u64, u64) {
    let body = json!({
        "model": model, "prompt": prompt, "max_tokens": 4, "temperature": 0, "ignore_eos": true,
        "stream": true, "stream_options": {"include_usage": true},
    });
    let start = Instant::now();
    let mut child = Command::new("curl")
        .args([
            "-sN",
            "--max-time",
            "600",
            "-X",
            "POST",
            &format!("{router}/v1/completions"),
        ])
        .args(["-H", "content-type: application/json", "-d", &body.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::BufRead;
    let mut first = None;
    let mut usage = (0, 0);
    for line in std::io::BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        first.get_or_insert_with(|| start.elapsed());
        if let Ok(v) = serde_json::from_str::<Value>(data)
            && let Some(u) = v.get("usage").filter(|u| !u.is_null())
        {
            let cached = u
                .pointer("/prompt_tokens_details/cached_tokens")
                .and_then(Value::as_u64);
            usage = (u["prompt_tokens"].as_u64().unwrap_or(0), cached.unwrap_or(0));
        }
    }
    child.wait().unwrap();
    (first.expect("no event"), usage.0, usage.1)
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

/// One policy's run; prints its line.
fn run(policy: &str, seed: u64, urls: &[String], events: &Path, model: &str) {
    let (prefixes, repeats) = (env_or("PREFIXES", 16) as u64, env_or("REPEATS", 4) as u64);
    let dir = tempfile::tempdir().unwrap();
    let workers: Vec<Value> = urls
        .iter()
        .map(|u| {
            let port = u.rsplit(':').next().unwrap();
            let at = |w: &str| format!("ipc://{}/{port}.{w}", events.display());
            json!({"url": u, "events": at("events"), "replay": at("replay")})
        })
        .collect();
    let file = dir.path().join("workers.json");
    std::fs::write(&file, json!({ "server": workers }).to_string()).unwrap();
    let port = free_port();
    let router = format!("http://127.0.0.1:{port}");
    let mut command = Command::new(env!("CARGO_BIN_EXE_kv-router"));
    command
        .args(["--listen", &format!("127.0.0.1:{port}"), "--placement", policy])
        .args(["--model", model, "--workers-file"])
        .arg(&file)
        .stderr(Stdio::null());
    let _router = Proc::spawn(command);
    wait_for("the router", Duration::from_secs(30), || {
        get(&format!("{router}/metrics")).is_some_and(|m| {
            m.lines()
                .filter(|l| l.starts_with("kvrouter_engine_connected{"))
                .filter(|l| l.ends_with(" 1"))
                .count()
                == REPLICAS
        })
    });
    // every prefix REPEATS times, shuffled but each prefix's first send before its repeats
    let mut order: Vec<(u64, u64)> = (0..repeats).flat_map(|r| (0..prefixes).map(move |p| (p, r))).collect();
    let mut x = seed;
    for i in (prefixes as usize..order.len()).rev() {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        let j = prefixes as usize + (x >> 33) as usize % (i + 1 - prefixes as usize);
        order.swap(i, j);
    }
    let queue = Arc::new(Mutex::new(order.into_iter().collect::<VecDeque<_>>()));
    let results = Arc::new(Mutex::new(Vec::new()));
    std::thread::scope(|s| {
        for _ in 0..CLIENTS {
            let (queue, results, router) = (queue.clone(), results.clone(), router.clone());
            s.spawn(move || {
                while let Some((p, r)) = queue.lock().unwrap().pop_front() {
                    let prompt = format!(
                        "{} {} what next?",
                        generated_words(seed * 1000 + p, 300).join(" "),
                        generated_words(seed * 7 + p * 100 + r, 6).join(" ")
                    );
                    let (ttft, tokens, cached) = ask(&router, model, &prompt);
                    results.lock().unwrap().push((r > 0, ttft, tokens, cached));
                }
            });
        }
    });
    let results = results.lock().unwrap();
    let mut all: Vec<Duration> = results.iter().map(|r| r.1).collect();
    let mut again: Vec<Duration> = results.iter().filter(|r| r.0).map(|r| r.1).collect();
    all.sort();
    again.sort();
    let (tokens, cached) = results.iter().fold((0, 0), |(t, c), r| (t + r.2, c + r.3));
    println!(
        "{policy:>13}  {:>4} req  TTFT p50 {:>7.1} ms  p99 {:>7.1} ms   repeats p50 {:>7.1} ms  p99 {:>7.1} ms   cached {:>5.1}% of prompt tokens",
        all.len(),
        pct(&all, 0.5),
        pct(&all, 0.99),
        pct(&again, 0.5),
        pct(&again, 0.99),
        100.0 * cached as f64 / tokens.max(1) as f64
    );
}

fn main() {
    decision::measure();
    let venv = setting("KVCACHE_VLLM_VENV", home(".cache/kvcache-vllm-venv"));
    let model = setting("KVCACHE_VLLM_MODEL", home(".cache/kvcache-vllm-model"));
    let events = tempfile::tempdir().unwrap();
    let ports: Vec<u16> = (0..REPLICAS).map(|_| free_port()).collect();
    let _engines: Vec<Proc> = ports.iter().map(|p| vllm(&venv, &model, *p, events.path())).collect();
    let urls: Vec<String> = ports.iter().map(|p| format!("http://127.0.0.1:{p}")).collect();
    let started = Instant::now();
    wait_for("the replicas", Duration::from_secs(900), || {
        urls.iter().all(|u| get(&format!("{u}/health")).is_some())
    });
    println!(
        "{REPLICAS} vLLM replicas ready in {:.0?}; {} clients; {} prefixes x {} sends each",
        started.elapsed(),
        CLIENTS,
        env_or("PREFIXES", 16),
        env_or("REPEATS", 4)
    );
    let model = model.display().to_string();
    for (i, policy) in POLICIES.iter().enumerate() {
        run(policy, 11 + i as u64, &urls, events.path(), &model);
    }
}
