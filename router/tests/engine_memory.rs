//! The router routes by what each replica's engine holds in memory, as vLLM's own KV event
//! publisher (`vllm.distributed.kv_events.ZmqEventPublisher`, run from the vLLM environment
//! `scripts/setup` installs) tells it over ZMQ: blocks published before the router started come
//! from the replay, live ones follow, a salted tenant is never credited with another's blocks,
//! a removal shortens the prefix, and an engine that restarts is followed afresh.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::Duration;

use common::eventually::eventually_async;
use common::post_json;
use common::router::Router;
use common::standin::StandIn;
use serde_json::{Value, json};

/// The vLLM environment's Python (`KVCACHE_VLLM_VENV`, default `~/.cache/kvcache-vllm-venv`).
fn vllm_python() -> PathBuf {
    let venv = std::env::var_os("KVCACHE_VLLM_VENV").map_or_else(
        || PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/kvcache-vllm-venv"),
        PathBuf::from,
    );
    let python = venv.join("bin/python");
    assert!(python.exists(), "{} is missing: run scripts/setup", python.display());
    python
}

/// Publishes what it reads on stdin, one JSON command a line, with vLLM's publisher.
const PUBLISHER: &str = r#"
import json, sys, time
from vllm.distributed.kv_events import (AllBlocksCleared, BlockRemoved, BlockStored,
                                        KVEventBatch, ZmqEventPublisher)
pub = ZmqEventPublisher(0, endpoint=sys.argv[1], replay_endpoint=sys.argv[2])
print("ready", flush=True)
for line in sys.stdin:
    c = json.loads(line)
    if "stored" in c:
        s = c["stored"]
        extra = [(s["salt"],) if s.get("salt") and i == 0 and s.get("parent") is None else None
                 for i in range(len(s["hashes"]))]
        e = BlockStored(block_hashes=[bytes([h]) * 8 for h in s["hashes"]],
                        parent_block_hash=bytes([s["parent"]]) * 8 if s.get("parent") else None,
                        token_ids=s["tokens"], block_size=s["block_size"], lora_id=None,
                        medium="CPU", lora_name=None, extra_keys=extra)
    elif "removed" in c:
        e = BlockRemoved(block_hashes=[bytes([h]) * 8 for h in c["removed"]], medium="CPU")
    else:
        e = AllBlocksCleared()
    pub.publish(KVEventBatch(ts=time.time(), events=[e]))
    print("published", flush=True)
"#;

/// One replica's publisher, killed when dropped.
struct Publisher {
    child: Child,
    stdin: ChildStdin,
    lines: std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
}

impl Publisher {
    fn start(dir: &Path, name: &str) -> Publisher {
        use std::io::BufRead;
        let (events, replay) = endpoints(dir, name);
        let mut child = Command::new(vllm_python())
            .args(["-W", "ignore", "-c", PUBLISHER, &events, &replay])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
        assert_eq!(lines.next().unwrap().unwrap(), "ready");
        Publisher { child, stdin, lines }
    }

    fn send(&mut self, command: Value) {
        writeln!(self.stdin, "{command}").unwrap();
        assert_eq!(self.lines.next().unwrap().unwrap(), "published");
    }

    /// Stores `tokens` as blocks of 16 tokens `hashes`, after `parent`.
    fn store(&mut self, hashes: &[u8], parent: Option<u8>, tokens: std::ops::Range<i64>, salt: Option<&str>) {
        let tokens: Vec<i64> = tokens.collect();
        self.send(
            json!({"stored": {"hashes": hashes, "parent": parent, "tokens": tokens, "block_size": 16, "salt": salt}}),
        );
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn endpoints(dir: &Path, name: &str) -> (String, String) {
    let at = |what: &str| format!("ipc://{}", dir.join(format!("{name}.{what}")).display());
    (at("events"), at("replay"))
}

fn prompt(tokens: std::ops::Range<i64>, salt: Option<&str>) -> Value {
    let mut body = json!({"model": "m", "prompt": tokens.collect::<Vec<i64>>(), "max_tokens": 1});
    if let Some(s) = salt {
        body["cache_salt"] = json!(s);
    }
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_by_what_each_engine_holds() {
    let dir = tempfile::tempdir().unwrap();
    let workers = [
        StandIn::start("a").await,
        StandIn::start("b").await,
        StandIn::start("c").await,
    ];
    // both publishers start at once: each takes seconds to import vLLM
    let (pa, pb) = {
        let (d1, d2) = (dir.path().to_owned(), dir.path().to_owned());
        let a = std::thread::spawn(move || Publisher::start(&d1, "a"));
        let b = std::thread::spawn(move || Publisher::start(&d2, "b"));
        (a.join().unwrap(), b.join().unwrap())
    };
    let (mut pa, mut pb) = (pa, pb);
    // before the router starts: only the replay can tell it
    pa.store(&[1, 2, 3, 4], None, 0..64, None);

    let entry = |i: usize, name: &str| {
        let (events, replay) = endpoints(dir.path(), name);
        json!({"url": workers[i].url(), "events": events, "replay": replay})
    };
    let router = Router::start(
        json!({"server": [entry(0, "a"), entry(1, "b"), workers[2].url()]}),
        &["--model", "m"],
    );
    let blocks = |w: usize| format!("kvrouter_engine_blocks{{worker=\"{}\"}}", workers[w].url());
    eventually_async(Duration::from_secs(20), "a's replayed blocks", || async {
        router.metric(&blocks(0)).await == 4.0
    })
    .await;

    // a prompt a holds goes to a, every time
    for _ in 0..5 {
        let (status, _) = post_json(router.addr, "/v1/completions", prompt(0..65, None)).await;
        assert_eq!(status, 200);
    }
    assert_eq!(workers[0].state.requests(), 5, "every request went where its prefix is");
    assert_eq!(router.metric("kvrouter_predicted_hit_tokens_total").await, 5.0 * 64.0);
    assert_eq!(
        router
            .metric("kvrouter_decisions_total{kind=\"server\",reason=\"engine_memory\"}")
            .await,
        5.0
    );

    // another tenant's identical prompt is credited with nothing
    post_json(router.addr, "/v1/completions", prompt(0..65, Some("tenant-b"))).await;
    assert_eq!(router.metric("kvrouter_predicted_hit_tokens_total").await, 5.0 * 64.0);
    assert_eq!(
        router
            .metric("kvrouter_decisions_total{kind=\"server\",reason=\"load\"}")
            .await,
        1.0
    );

    // a live store on b, salted: only that tenant's prompt goes there
    pb.store(&[11, 12], None, 1000..1032, Some("tenant-b"));
    pb.store(&[13], Some(12), 1032..1048, None);
    eventually_async(Duration::from_secs(10), "b's live blocks", || async {
        router.metric(&blocks(1)).await == 3.0
    })
    .await;
    let before = workers[1].state.requests();
    post_json(router.addr, "/v1/completions", prompt(1000..1049, Some("tenant-b"))).await;
    assert_eq!(workers[1].state.requests(), before + 1);
    assert_eq!(
        router.metric("kvrouter_predicted_hit_tokens_total").await,
        5.0 * 64.0 + 48.0
    );

    // a removal ends the prefix there
    pb.send(json!({"removed": [12]}));
    eventually_async(Duration::from_secs(10), "b's removal", || async {
        router.metric(&blocks(1)).await == 2.0
    })
    .await;
    post_json(router.addr, "/v1/completions", prompt(1000..1049, Some("tenant-b"))).await;
    assert_eq!(
        router.metric("kvrouter_predicted_hit_tokens_total").await,
        5.0 * 64.0 + 48.0 + 16.0
    );

    // a restarts with an empty memory: followed afresh, its old blocks forgotten
    drop(pa);
    let mut pa = Publisher::start(dir.path(), "a");
    pa.store(&[21], None, 5000..5016, None);
    eventually_async(Duration::from_secs(20), "a followed again", || async {
        router.metric(&blocks(0)).await == 1.0
    })
    .await;
    assert!(router.metric("kvrouter_engine_event_streams_total").await >= 3.0);
    let predicted = router.metric("kvrouter_predicted_hit_tokens_total").await;
    post_json(router.addr, "/v1/completions", prompt(0..65, None)).await;
    assert_eq!(router.metric("kvrouter_predicted_hit_tokens_total").await, predicted);
    drop(router);
}
