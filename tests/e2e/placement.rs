//! Our router places requests where their prefix already is (issue 42): `kv-apiserver serve`
//! with `localRuntime.engines: real` runs a ModelDeployment of three `Server` real `vllm serve`
//! replicas (the local model) on the team's Binding, behind `router: {name: kvcache-router}`,
//! which follows each replica's KV events (the controllers inject `--kv-events-config`, on Unix
//! sockets here) and the store's blocks.
//!
//! Two tenants (`cache_salt`) send the same prompts: prefixes of about 1,000 tokens, each sent
//! again with new endings. Every repeat is checked against the replicas' own counters (vLLM's
//! `vllm:prefix_cache_hits_total`, its engine-memory hits): at least 90% land on the replica
//! holding their prefix (round robin would manage about one in three). A tenant's first request
//! of a prefix the other tenant sent is predicted nothing and vLLM reports nothing cached. The
//! router's precision (predicted hit tokens vLLM then reported as cached, its
//! `kvrouter_confirmed_hit_tokens_total` over `kvrouter_predicted_hit_tokens_total`) is at least
//! 0.95 throughout, for the first 100 requests after a `kill -9` of the router (restarted by the
//! runtime, warm again from the engines' replays) and for the requests within 10 s after the
//! store's serving leader is killed.
//!
//! Needs what `real_engines.rs` needs (`KVCACHE_PACKAGE_DIR`, the vLLM environment, the model).

mod support;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::engines::*;
use support::eventually_within;
use support::walkthrough::*;

const KUBECTL: &str = "1.33";
const STARTUP: Duration = Duration::from_secs(900);
const TRIO: &[&str] = &["-n", "team-a", "md", "trio"];
const TENANTS: [&str; 2] = ["tenant-a", "tenant-b"];
/// Distinct prefixes, and the words of each (about 3.2 tokens a word).
const PREFIXES: u64 = 4;
const WORDS: usize = 300;
/// The domain's tokens per block.
const BLOCK: u64 = 64;

const ENGINE_ARGS: &str = "      extraArgs: [\"--max-model-len\", \"4096\", \"--enforce-eager\", \"--dtype\", \"bfloat16\"]\n      env:\n        - name: VLLM_CPU_KVCACHE_SPACE\n          value: \"1\"\n        - name: HF_HUB_OFFLINE\n          value: \"1\"\n        - name: VLLM_NO_USAGE_STATS\n          value: \"1\"\n";

fn trio(model: &str) -> String {
    format!(
        "apiVersion: worker.gpustack.ai/v1\nkind: ModelDeployment\nmetadata:\n  name: trio\n  namespace: team-a\nspec:\n  model:\n    name: {model}\n  engine:\n    name: vLLM\n    version: \"0.32.0\"\n  kvCache:\n    poolRef:\n      name: team-a\n  router:\n    name: kvcache-router\n    requestTimeoutSeconds: 600\n  roles:\n    - name: server\n      replicas: 3\n      instanceType: local-cpu\n{ENGINE_ARGS}"
    )
}

/// Prefix `p`'s text, and a request of it with ending `n`.
fn prefix(p: u64) -> String {
    generated_words(500 + p, WORDS).join(" ")
}

fn request(model: &str, p: u64, tenant: &str, n: u64) -> String {
    let ending = generated_words(9_000 + n, 6).join(" ");
    json!({
        "model": model, "prompt": format!("{} {ending} what comes next?", prefix(p)),
        "max_tokens": 1, "temperature": 0, "cache_salt": tenant,
    })
    .to_string()
}

/// vLLM's `cached_tokens` for one request through `router`.
fn send(router: &str, body: &str) -> u64 {
    let out = try_post_json(&format!("{router}/v1/completions"), body).unwrap_or_else(|e| panic!("{e}"));
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    v.pointer("/usage/prompt_tokens_details/cached_tokens")
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("no cached_tokens: {out}"))
}

/// Each replica's engine-memory hit tokens so far.
fn memory_hits(replicas: &[String]) -> Vec<f64> {
    replicas
        .iter()
        .map(|u| counter(u, "vllm:prefix_cache_hits_total"))
        .collect()
}

/// The router's predicted and confirmed hit tokens so far.
fn precision_counts(router: &str) -> (f64, f64) {
    (
        counter(router, "kvrouter_predicted_hit_tokens_total"),
        counter(router, "kvrouter_confirmed_hit_tokens_total"),
    )
}

fn precision(router: &str, since: (f64, f64), what: &str) -> f64 {
    let (p, c) = precision_counts(router);
    let (predicted, confirmed) = (p - since.0, c - since.1);
    assert!(predicted > 0.0, "{what}: the router predicted no hits at all");
    let precision = confirmed / predicted;
    eprintln!("{what}: precision {precision:.3} ({confirmed} of {predicted} predicted hit tokens confirmed)");
    precision
}

/// The repeats of every tenant's prefixes: how many landed where their prefix was in memory.
fn repeats(router: &str, replicas: &[String], model: &str, round: u64) -> (usize, usize) {
    let mut landed = 0;
    let mut sent = 0;
    for p in 0..PREFIXES {
        for tenant in TENANTS {
            let before = memory_hits(replicas);
            let cached = send(router, &request(model, p, tenant, round * 100 + p));
            let after = memory_hits(replicas);
            let best = before.iter().zip(&after).map(|(b, a)| a - b).fold(0.0, f64::max);
            // the prefix's full blocks but the last (the ending may re-split the last word)
            let held = (WORDS as f64 * 3.0 / BLOCK as f64).floor() * BLOCK as f64 - BLOCK as f64;
            sent += 1;
            if best >= held {
                landed += 1;
            } else {
                eprintln!("prefix {p} of {tenant}: memory hits {best} (vLLM cached {cached})");
            }
        }
    }
    (landed, sent)
}

/// The `kv-router` process listening on `router`'s port.
fn router_pid(router: &str) -> u32 {
    let listen = format!("--listen 127.0.0.1:{}", router.rsplit(':').next().unwrap_or_default());
    processes(|cmd| cmd.contains("kv-router") && cmd.contains(&listen) && !cmd.contains("exec"))
        .into_iter()
        .map(|(pid, _)| pid)
        .min()
        .unwrap_or_else(|| panic!("no kv-router listens at {router}"))
}

/// The router follows every replica's KV events.
fn wait_following(router: &str, replicas: usize) {
    eventually_within(Duration::from_secs(120), "the router follows every engine", || {
        (counter(router, "kvrouter_engine_connected") == replicas as f64).then_some(())
    });
}

#[test]
fn requests_land_where_their_prefix_is_and_the_router_is_warm_after_restarts_and_failovers() {
    let e = engines();
    let model = e.model();
    let dir = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let (mut s, k) = serve_on_ha_backend(&e, dir.path(), KUBECTL);
    k.must_apply(&trio(&model));
    eventually_started(STARTUP, "trio: the router and three servers ready", || {
        let row = k.ok(&["get", "-n", "team-a", "md", "trio", "--no-headers"]);
        row.contains("1R3S").then_some(())
    });
    let router = jp(&k, TRIO, "{.status.endpoint}");
    let replicas: Vec<String> = replica_urls(&k, "team-a", "trio").into_iter().map(|(_, u)| u).collect();
    assert_eq!(replicas.len(), 3, "{replicas:?}");
    wait_following(&router, 3);
    eprintln!("replicas ready after {:.0?}", started.elapsed());

    // Each tenant's first request of each prefix; the second tenant's is credited nothing.
    for p in 0..PREFIXES {
        for (i, tenant) in TENANTS.iter().enumerate() {
            let predicted = precision_counts(&router).0;
            let cached = send(&router, &request(&model, p, tenant, p));
            if i == 1 {
                assert_eq!(
                    precision_counts(&router).0,
                    predicted,
                    "prefix {p}: {tenant} is credited nothing"
                );
                assert_eq!(
                    cached, 0,
                    "prefix {p}: vLLM reused nothing of the other tenant's for {tenant}"
                );
            }
        }
    }
    // Their repeats land where the prefix is.
    let since = precision_counts(&router);
    let (mut landed, mut sent) = (0, 0);
    for round in 1..=3 {
        let (l, n) = repeats(&router, &replicas, &model, round);
        (landed, sent) = (landed + l, sent + n);
    }
    eprintln!("{landed} of {sent} repeats landed where their prefix was in memory");
    assert!(
        landed * 10 >= sent * 9,
        "{landed} of {sent} landed where their prefix was"
    );
    assert!(precision(&router, since, "repeats") >= 0.95);

    // kill -9 the router: the runtime starts it again, warm from the engines' replays.
    kill9(router_pid(&router));
    eventually_within(Duration::from_secs(60), "the router is back", || {
        (counter(&router, "kvrouter_engine_event_streams_total") >= 3.0
            && counter(&router, "kvrouter_requests_total") == 0.0)
            .then_some(())
    });
    wait_following(&router, 3);
    let since = precision_counts(&router);
    let (mut landed, mut sent) = (0, 0);
    for round in 10..23 {
        let (l, n) = repeats(&router, &replicas, &model, round);
        (landed, sent) = (landed + l, sent + n);
        if sent >= 100 {
            break;
        }
    }
    eprintln!("after the router's restart: {landed} of {sent} landed where their prefix was");
    assert!(precision(&router, since, "the first 100 after the router's restart") >= 0.95);

    // kill -9 the serving leader: within 10 s the router's predictions still hold.
    let (h, term) = eventually_within(Duration::from_secs(60), "a Lease holder", || lease_holder(&k));
    let port = leader_port(&k);
    let leader = store_processes(&s, &port)
        .into_iter()
        .find(|(_, c)| c.contains(" leader ") && c.contains(&format!("--listen {h} ")))
        .unwrap_or_else(|| panic!("no leader process listens on {h}"))
        .0;
    let since = precision_counts(&router);
    kill9(leader);
    let killed = Instant::now();
    let mut round = 40;
    while killed.elapsed() < Duration::from_secs(10) {
        repeats(&router, &replicas, &model, round);
        round += 1;
    }
    assert!(precision(&router, since, "within 10 s of the leader's kill") >= 0.95);
    eventually_within(Duration::from_secs(60), "another term serves", || {
        lease_holder(&k).filter(|(_, t)| *t > term)
    });

    k.ok(&["delete", "-n", "team-a", "md", "trio", "--wait=false"]);
    eventually_within(Duration::from_secs(180), "no vLLM process is left", || {
        vllm_processes(&model).is_empty().then_some(())
    });
    assert!(s.terminate().success());
}
