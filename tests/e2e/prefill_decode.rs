//! Prefill and decode hand a prompt over through the store, behind our router: `kv-apiserver
//! serve` with `localRuntime.engines: real` runs a ModelDeployment of one `Prefill` and one
//! `Decode` real `vllm serve` replica (the local model, `clients/python/tests/tiny_llama.py`)
//! with `router: {name: kvcache-router}`, and a monolithic deployment with no cache to compare
//! with, on the walkthrough's backend with three leader replicas.
//!
//! Through the router's address (the deployment's `status.endpoint`), ten prompts of about 1,000
//! tokens, streamed and not: decode's vLLM counts every full prompt block as an external prefix
//! hit (it did not prefill them) and answers the monolithic replica's greedy tokens. Then requests
//! are in flight while the prefill replica is killed (`kill -9`): each still completes with the
//! same tokens (the router retries, then falls back to decode prefilling itself, and counts it);
//! then while the serving store leader is killed: the same, and the router rides the failover
//! (not restarted) and follows the new term's blocks.
//!
//! A prompt the store already holds skips prefill: three prompts are first answered by the
//! prefill replica alone (its connector saves their blocks), then sent through the router, which
//! follows the store's blocks and sends each straight to decode (`--disaggregation-threshold-tokens
//! 128`: fewer tokens than that are missing), counted; decode loads every full block from the
//! store and answers as the monolithic replica does.
//!
//! Which tokens must be equal: the local model has random weights, so its greedy choice is
//! often an exact tie in bf16 (the top two log-probabilities equal), which vLLM on this CPU may
//! break either way depending on the batch a request shares (and with a KV connector configured
//! or not, whatever the connector does). So an answer is checked token by token against the
//! monolithic replica reading the prompt and the answer's tokens before it (its
//! `prompt_logprobs`): each token must be the monolithic replica's own choice there, or within
//! [`DRIFT`] of it. Measured over eleven runs with prompts of about 3,000 tokens (10 prompts
//! handed over and 8 in flight while a process dies, 12 tokens each), every token fell exactly 0
//! below it (at about 1,000 tokens, since 2026-12-07, three runs in a row passed); an answer
//! computed over another prompt's KV falls 1.4 to 8.6 below it within its first ten tokens. While prefill
//! serves, every answer also equals the prefill replica's own answer to the prompt (the same
//! engine configuration, the same blocks).
//!
//! That check found a real fault: a prefill worker stopped mid-step (SIGTERM reaches the
//! engine's processes when the replica's `vllm serve` is killed) still ran the connector's
//! `wait_for_save`, which vLLM calls from a `finally`, and saved pages its forward never wrote
//! (an earlier prompt's KV) under the new prompt's keys; a decode or another replica loading
//! them answered another prompt's tokens. The worker now saves nothing of a step whose forward
//! raised (`clients/python/python/kvcache/vllm/worker.py`).
//!
//! Needs what `real_engines.rs` needs (`KVCACHE_PACKAGE_DIR`, the vLLM environment, the model).

mod support;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::engines::*;
use support::eventually_within;
use support::walkthrough::*;

const KUBECTL: &str = "1.33";
/// Three vLLM processes start at once on two cores: allow minutes, not seconds.
const STARTUP: Duration = Duration::from_secs(900);
const PD: &[&str] = &["-n", "team-a", "md", "pd"];
/// Tokens each answer is compared on.
const ANSWER: usize = 12;
/// A token the monolithic replica chose by less than this (the gap between its top two
/// log-probabilities) is a near tie: compared up to there (see the module's doc).
const DECIDED_BY: f64 = 1.0;
/// How far below the monolithic replica's own choice (log-probability) a token of an answer may
/// be (see the module's doc).
const DRIFT: f64 = 1.0;
/// Words in the prompts handed over (about 1,000 tokens, 15 full blocks: each is read, read back,
/// prefilled and decoded, and on a slow CPU a 3,000-token prompt made this test 15 minutes), and
/// in the ones in flight while a process dies (about 1,450: long enough to be in flight).
const LONG: usize = 320;
const SHORT: usize = 450;
/// The router's `disaggregationThresholdTokens`: above a block (64 tokens), so a prompt the store
/// holds whole (all but its last partial block) skips prefill; below every prompt here.
const THRESHOLD: u64 = 128;

const ENGINE_ARGS: &str = "      extraArgs: [\"--max-model-len\", \"4096\", \"--enforce-eager\", \"--dtype\", \"bfloat16\"]\n      env:\n        - name: VLLM_CPU_KVCACHE_SPACE\n          value: \"1\"\n        - name: HF_HUB_OFFLINE\n          value: \"1\"\n        - name: VLLM_NO_USAGE_STATS\n          value: \"1\"\n";

fn head(name: &str, model: &str) -> String {
    format!(
        "apiVersion: worker.gpustack.ai/v1\nkind: ModelDeployment\nmetadata:\n  name: {name}\n  namespace: team-a\nspec:\n  model:\n    name: {model}\n  engine:\n    name: vLLM\n    version: \"0.32.0\"\n"
    )
}

/// One Prefill and one Decode replica on the team's Binding, behind our router.
fn disaggregated(model: &str) -> String {
    format!(
        "{}  kvCache:\n    poolRef:\n      name: team-a\n  router:\n    name: kvcache-router\n    requestTimeoutSeconds: 600\n    disaggregationThresholdTokens: {THRESHOLD}\n  roles:\n    - name: prefill\n      kind: Prefill\n      instanceType: local-cpu\n{ENGINE_ARGS}    - name: decode\n      kind: Decode\n      instanceType: local-cpu\n{ENGINE_ARGS}",
        head("pd", model)
    )
}

/// One replica with no cache at all: the tokens to compare with. Its blocks are the domain's
/// size, as the attached replicas' are (injected for them), so that the cache is the only
/// difference.
fn monolithic(model: &str) -> String {
    let args = ENGINE_ARGS.replace("\"bfloat16\"]", "\"bfloat16\", \"--block-size\", \"64\"]");
    assert_ne!(args, ENGINE_ARGS);
    format!(
        "{}  roles:\n    - name: server\n      instanceType: local-cpu\n{args}",
        head("plain", model)
    )
}

fn body(model: &str, prompt: &str, stream: bool) -> String {
    json!({
        "model": model, "prompt": prompt, "max_tokens": ANSWER, "temperature": 0,
        "ignore_eos": true, "stream": stream, "return_token_ids": true,
    })
    .to_string()
}

/// The greedy tokens `url` answers `prompt` with, streamed or not; the error when the request
/// fails.
fn complete(url: &str, model: &str, prompt: &str, stream: bool) -> Result<Vec<u64>, String> {
    let b = body(model, prompt, stream);
    let out = try_post_json(&format!("{url}/v1/completions"), &b)?;
    let ids = |v: &Value| -> Vec<u64> {
        v["choices"][0]["token_ids"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_u64)
            .collect()
    };
    if !stream {
        let v: Value = serde_json::from_str(&out).map_err(|e| format!("{e}: {out}"))?;
        let got = ids(&v);
        return if got.len() == ANSWER {
            Ok(got)
        } else {
            Err(format!("not {ANSWER} tokens: {out}"))
        };
    }
    // server-sent events: `data: {chunk}` lines, then `data: [DONE]`
    let mut tokens = Vec::new();
    let mut done = false;
    for line in out.lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data.trim() == "[DONE]" {
            done = true;
            break;
        }
        let v: Value = serde_json::from_str(data).map_err(|e| format!("{e}: {data}"))?;
        if v.get("error").is_some() {
            return Err(format!("an error event: {data}"));
        }
        tokens.extend(ids(&v));
    }
    if done && tokens.len() == ANSWER {
        Ok(tokens)
    } else {
        Err(format!("the stream ended without [DONE]: {out}"))
    }
}

/// A prompt of its own of about 3.2 tokens per word (words of the model's generated vocabulary).
fn prompt(seed: u64, words: usize) -> String {
    format!("{} what comes next?", generated_words(seed, words).join(" "))
}

/// The prompt's tokens, as the monolithic replica counts them.
fn prompt_tokens(url: &str, model: &str, prompt: &str) -> u64 {
    let out = try_post_json(
        &format!("{url}/tokenize"),
        &json!({"model": model, "prompt": prompt}).to_string(),
    )
    .expect("tokenize");
    let v: Value = serde_json::from_str(&out).expect("tokenize answers JSON");
    v["count"].as_u64().expect("a count")
}

/// The `vllm serve` process listening on `url`'s port (the API server process, whose engine core
/// dies with it).
fn engine_pid(url: &str) -> u32 {
    let port = format!("--port {}", url.rsplit(':').next().unwrap_or_default());
    vllm_serve()
        .into_iter()
        .filter(|(_, cmd)| cmd.contains(&port) && !cmd.contains("kv-store"))
        .map(|(pid, _)| pid)
        .min()
        .unwrap_or_else(|| panic!("no vllm serve listens on {url}"))
}

/// A prompt and the monolithic replica's answer to it, up to its first near tie.
struct Asked {
    text: String,
    /// the prompt's tokens, as the monolithic replica read them
    tokens: Vec<u64>,
    /// the answer's tokens up to its first one decided by less than [`DECIDED_BY`]
    decided: Vec<u64>,
}

impl Asked {
    fn check(&self, what: &str, got: &[u64]) {
        assert!(
            got.starts_with(&self.decided),
            "{what}: {got:?} is not the monolithic replica's answer up to its first near tie ({:?})",
            self.decided
        );
    }

    /// How far each token of `got` falls below the monolithic replica's own choice at its place,
    /// the monolithic replica reading the prompt and `got` (its log-probabilities: 0 where it
    /// would choose the same token).
    fn shortfalls(&self, plain: &str, model: &str, got: &[u64]) -> Vec<f64> {
        let read: Vec<u64> = self.tokens.iter().chain(got).copied().collect();
        let b = json!({
            "model": model, "prompt": read, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 1,
        });
        let out = try_post_json(&format!("{plain}/v1/completions"), &b.to_string())
            .expect("the monolithic replica reads an answer");
        let v: Value = serde_json::from_str(&out).expect("JSON");
        let places = v["choices"][0]["prompt_logprobs"]
            .as_array()
            .or_else(|| v["prompt_logprobs"].as_array())
            .unwrap_or_else(|| panic!("no prompt_logprobs: {out}"));
        got.iter()
            .enumerate()
            .map(|(j, token)| {
                let place = places[self.tokens.len() + j]
                    .as_object()
                    .expect("a place's log-probabilities");
                let best = place
                    .values()
                    .filter_map(|p| p["logprob"].as_f64())
                    .fold(f64::NEG_INFINITY, f64::max);
                best - place[&token.to_string()]["logprob"]
                    .as_f64()
                    .expect("the token's log-probability")
            })
            .collect()
    }

    /// Every token of `got` is one the monolithic replica, reading the same tokens before it,
    /// ranks within [`DRIFT`] of its own choice.
    fn check_read(&self, what: &str, plain: &str, model: &str, got: &[u64]) {
        let short = self.shortfalls(plain, model, got);
        let worst = short.iter().copied().fold(0.0, f64::max);
        eprintln!(
            "{what}: {got:?}, shortfalls {short:?}, first near tie at {}",
            self.decided.len()
        );
        assert!(
            worst <= DRIFT,
            "{what}: {got:?} has a token {worst} below the monolithic replica's choice there ({short:?})"
        );
    }
}

/// The monolithic replica's answer to `prompt(seed, words)`, up to its first near tie.
fn ask(plain: &str, model: &str, seed: u64, words: usize) -> Asked {
    let text = prompt(seed, words);
    let mut b: Value = serde_json::from_str(&body(model, &text, false)).expect("a body");
    b["logprobs"] = json!(2);
    let answer =
        try_post_json(&format!("{plain}/v1/completions"), &b.to_string()).expect("the monolithic replica answers");
    let v: Value = serde_json::from_str(&answer).expect("JSON");
    let logprobs = &v["choices"][0]["logprobs"];
    let tops = logprobs["top_logprobs"].as_array().expect("top logprobs");
    let ids: Vec<u64> = v["choices"][0]["token_ids"]
        .as_array()
        .expect("token ids")
        .iter()
        .filter_map(Value::as_u64)
        .collect();
    let decided_by = |top: &Value| {
        let mut p: Vec<f64> = top
            .as_object()
            .into_iter()
            .flatten()
            .filter_map(|(_, v)| v.as_f64())
            .collect();
        p.sort_by(|a, b| b.total_cmp(a));
        p.first().zip(p.get(1)).map_or(f64::INFINITY, |(a, b)| a - b)
    };
    let n = tops.iter().take_while(|top| decided_by(top) >= DECIDED_BY).count();
    assert_eq!(ids.len(), ANSWER, "{answer}");
    let tokens: Vec<u64> = v["choices"][0]["prompt_token_ids"]
        .as_array()
        .expect("the prompt's token ids")
        .iter()
        .filter_map(Value::as_u64)
        .collect();
    Asked {
        text,
        tokens,
        decided: ids[..n].to_vec(),
    }
}

/// What the router and decode counted so far: how the requests in flight were served.
fn tally(router: &str, decode: &str) {
    let of = |url: &str, names: &[&str]| -> String {
        names
            .iter()
            .map(|n| format!("{n} {}", counter(url, n)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    eprintln!(
        "router: {}",
        of(
            router,
            &[
                "kvrouter_handoffs_total",
                "kvrouter_retries_total",
                "kvrouter_fallbacks_total"
            ]
        )
    );
    let store = |n: &str| format!("vllm:kvcache_store_{n}_total");
    let names: Vec<String> = [
        "handoffs_in",
        "handoff_blocks",
        "handoff_missing_blocks",
        "handoff_mismatches",
        "hit_blocks",
        "loaded_blocks",
        "load_failures",
        "lookup_failures",
        "saved_blocks",
    ]
    .iter()
    .map(|n| store(n))
    .collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    eprintln!("decode: {}", of(decode, &names));
}

/// `prompts` sent through the router at once (streamed and not, alternately), each expected to
/// answer as the monolithic replica does; `during` runs once they are in flight.
fn in_flight(router: &str, decode: &str, plain: &str, model: &str, prompts: &[Asked], during: impl FnOnce()) {
    let compared: usize = prompts.iter().map(|a| a.decided.len()).sum();
    eprintln!(
        "{} requests in flight, {compared} of {} tokens compared",
        prompts.len(),
        ANSWER * prompts.len()
    );
    std::thread::scope(|scope| {
        let running: Vec<_> = prompts
            .iter()
            .enumerate()
            .map(|(i, a)| {
                scope.spawn(move || {
                    let got = complete(router, model, &a.text, i % 2 == 1);
                    (i, got, a)
                })
            })
            .collect();
        during();
        let results: Vec<_> = running
            .into_iter()
            .map(|r| r.join().expect("a request thread"))
            .collect();
        tally(router, decode);
        for (i, got, a) in results {
            match got {
                Ok(text) => a.check_read(&format!("request {i}"), plain, model, &text),
                Err(e) => panic!("request {i} failed: {e}"),
            }
        }
    });
}

/// Prompts the prefill replica alone answered (so the store holds their blocks) go through the
/// router straight to decode, which loads them and answers as the monolithic replica does.
fn stored_prompts_skip_prefill(router: &str, prefill: &str, decode: &str, plain: &str, model: &str) {
    for seed in 150..153 {
        let a = ask(plain, model, seed, LONG);
        let tokens = prompt_tokens(plain, model, &a.text);
        let full = ((tokens - 1) / 64 * 64) as f64;
        let known = counter(router, "kvrouter_store_blocks");
        complete(prefill, model, &a.text, false).expect("the prefill replica answers");
        eventually_within(
            Duration::from_secs(60),
            &format!("prompt {seed}: the router knows its {} stored blocks", full / 64.0),
            || (counter(router, "kvrouter_store_blocks") - known >= full / 64.0).then_some(()),
        );
        let (skipped, handoffs) = (
            counter(router, "kvrouter_prefill_skipped_total{reason=\"stored\"}"),
            counter(router, "kvrouter_handoffs_total"),
        );
        let hits = counter(decode, "vllm:external_prefix_cache_hits_total");
        let got = complete(router, model, &a.text, seed % 2 == 1).unwrap_or_else(|e| panic!("prompt {seed}: {e}"));
        a.check_read(&format!("prompt {seed} from the store"), plain, model, &got);
        assert_eq!(
            counter(router, "kvrouter_prefill_skipped_total{reason=\"stored\"}"),
            skipped + 1.0,
            "prompt {seed} ({tokens} tokens) skipped prefill"
        );
        assert_eq!(counter(router, "kvrouter_handoffs_total"), handoffs, "no handoff");
        eventually_within(
            Duration::from_secs(30),
            &format!("prompt {seed}: decode's vLLM counts {full} tokens from the store"),
            || (counter(decode, "vllm:external_prefix_cache_hits_total") - hits >= full).then_some(()),
        );
    }
}

#[test]
fn prefill_and_decode_hand_prompts_over_through_the_store_and_survive_either_failing() {
    let e = engines();
    let model = e.model();
    let dir = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let (mut s, k) = serve_on_ha_backend(&e, dir.path(), KUBECTL);
    k.must_apply(&disaggregated(&model));
    k.must_apply(&monolithic(&model));

    // kubectl shows the router and both halves ready, and the router's address
    let summary = eventually_started(STARTUP, "pd: the router, prefill and decode ready", || {
        let row = k.ok(&["get", "-n", "team-a", "md", "pd", "--no-headers"]);
        row.contains("1R1P1D").then_some(row)
    });
    assert!(summary.contains("Ready"), "{summary}");
    assert!(
        condition(&k, PD, "RouterReady").starts_with("True|"),
        "{}",
        condition(&k, PD, "RouterReady")
    );
    let router = jp(&k, PD, "{.status.endpoint}");
    assert!(
        router.starts_with("http://127.0.0.1:"),
        "the endpoint is the router's: {router}"
    );
    let urls = replica_urls(&k, "team-a", "pd");
    let url_of = |role: &str| {
        urls.iter()
            .find(|(r, _)| r.starts_with(role))
            .map(|(_, u)| u.clone())
            .unwrap_or_else(|| panic!("no {role} replica in {urls:?}"))
    };
    let (prefill, decode) = (url_of("prefill"), url_of("decode"));
    let plain = eventually_started(STARTUP, "plain: the monolithic replica ready", || {
        (jp(&k, &["-n", "team-a", "md", "plain"], "{.status.phase}") == "Ready")
            .then(|| replica_urls(&k, "team-a", "plain").pop().map(|(_, u)| u))
            .flatten()
    });

    eprintln!("replicas ready after {:.0?}", started.elapsed());
    let phase = Instant::now();
    // Ten prompts of about 1,000 tokens through the router, streamed and not: decode loads every full block prefill
    // handed over, and answers as the monolithic replica does.
    let prompts: Vec<Asked> = (100..110).map(|seed| ask(&plain, &model, seed, LONG)).collect();
    let compared: usize = prompts.iter().map(|a| a.decided.len()).sum();
    eprintln!(
        "{compared} of {} tokens decided by at least {DECIDED_BY}",
        ANSWER * prompts.len()
    );
    let mut blocks = 0.0;
    for (i, a) in prompts.iter().enumerate() {
        let hits_before = counter(&decode, "vllm:external_prefix_cache_hits_total");
        let got = complete(&router, &model, &a.text, i % 2 == 1).unwrap_or_else(|e| panic!("prompt {i}: {e}"));
        a.check(&format!("prompt {i}"), &got);
        a.check_read(&format!("prompt {i}"), &plain, &model, &got);
        let whole = complete(&prefill, &model, &a.text, false).expect("the prefill replica answers");
        assert_eq!(got, whole, "prompt {i}: decode's answer is the prefill replica's own");
        let full = ((prompt_tokens(&plain, &model, &a.text) - 1) / 64 * 64) as f64;
        blocks += full / 64.0;
        eventually_within(
            Duration::from_secs(30),
            &format!("prompt {i}: decode's vLLM counts {full} tokens from the store"),
            || (counter(&decode, "vllm:external_prefix_cache_hits_total") - hits_before >= full).then_some(()),
        );
    }
    assert!(counter(&router, "kvrouter_handoffs_total") >= prompts.len() as f64);
    assert!(counter(&prefill, "vllm:kvcache_store_handoffs_out_total") >= prompts.len() as f64);
    assert_eq!(counter(&decode, "vllm:kvcache_store_handoff_missing_blocks_total"), 0.0);
    assert!(counter(&decode, "vllm:kvcache_store_handoff_blocks_total") >= blocks);

    eprintln!(
        "{} prompts of {} full blocks in all through the router: {:.0?}",
        prompts.len(),
        blocks,
        phase.elapsed()
    );
    let phase = Instant::now();
    stored_prompts_skip_prefill(&router, &prefill, &decode, &plain, &model);
    eprintln!("prompts the store holds, straight to decode: {:.0?}", phase.elapsed());
    let phase = Instant::now();

    // The prefill replica dies with requests in flight: each completes with the same tokens.
    let batch: Vec<Asked> = (200..204).map(|seed| ask(&plain, &model, seed, SHORT)).collect();
    let fallbacks = counter(&router, "kvrouter_fallbacks_total") + counter(&router, "kvrouter_retries_total");
    in_flight(&router, &decode, &plain, &model, &batch, || {
        eventually_within(Duration::from_secs(60), "a request reaches prefill", || {
            (counter(&router, "kvrouter_inflight{kind=\"prefill\"") > 0.0).then_some(())
        });
        kill9(engine_pid(&prefill));
    });
    let after = counter(&router, "kvrouter_fallbacks_total") + counter(&router, "kvrouter_retries_total");
    assert!(
        after > fallbacks,
        "the router counts the retries and fallbacks ({fallbacks} -> {after})"
    );

    eprintln!("the prefill replica killed: {:.0?}", phase.elapsed());
    let phase = Instant::now();

    // The serving store leader dies with requests in flight, prompts decode has not seen (so it
    // needs the store's blocks): the same.
    eventually_started(STARTUP, "the prefill replica is back", || {
        k.ok(&["get", "-n", "team-a", "md", "pd", "--no-headers"])
            .contains("1R1P1D")
            .then_some(())
    });
    let (h, term) = eventually_within(Duration::from_secs(60), "a Lease holder", || lease_holder(&k));
    let port = leader_port(&k);
    let leader = store_processes(&s, &port)
        .into_iter()
        .find(|(_, c)| c.contains(" leader ") && c.contains(&format!("--listen {h} ")))
        .unwrap_or_else(|| panic!("no leader process listens on {h}"))
        .0;
    let batch: Vec<Asked> = (300..304).map(|seed| ask(&plain, &model, seed, SHORT)).collect();
    let (handoffs, streams) = (
        counter(&router, "kvrouter_handoffs_total"),
        counter(&router, "kvrouter_store_streams_total"),
    );
    in_flight(&router, &decode, &plain, &model, &batch, || kill9(leader));
    eventually_within(Duration::from_secs(60), "another term serves", || {
        lease_holder(&k).filter(|(_, t)| *t > term)
    });
    // the router rode the failover (the same process: its counts go on) and follows the new
    // term's blocks
    eventually_within(Duration::from_secs(60), "the router follows the new term", || {
        (counter(&router, "kvrouter_store_streams_total") > streams
            && counter(&router, "kvrouter_store_connected") == 1.0)
            .then_some(())
    });
    assert!(
        counter(&router, "kvrouter_handoffs_total") >= handoffs,
        "the router was not restarted by the failover"
    );

    eprintln!("the serving leader killed: {:.0?}", phase.elapsed());

    // The deployments' engines stop with them (an engine still starting takes its time), then
    // the server stops with what is left.
    k.ok(&["delete", "-n", "team-a", "md", "pd", "plain", "--wait=false"]);
    eventually_within(Duration::from_secs(180), "no vLLM process is left", || {
        vllm_processes(&model).is_empty().then_some(())
    });
    assert!(s.terminate().success());
}
