//! The router follows what the store holds for its tenant (`store_index.rs`), against a real
//! leader and member: puts and removals reach its index, after the leader is killed and started
//! again the index comes back from what the member handed over, and a prompt whose blocks the
//! store holds skips prefill.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use common::eventually::eventually_async;
use common::router::{Router, value};
use common::standin::StandIn;
use kvcache_store::client::Client;
use kvcache_store::proto::{HealthRequest, Scope};
use serde_json::json;

/// `kv-store`, built next to `kv-router` by the workspace's build.
fn kv_store() -> PathBuf {
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_kv-router")).with_file_name("kv-store");
    assert!(
        bin.exists(),
        "{} is not built: cargo build -p kvcache-store",
        bin.display()
    );
    bin
}

/// A `kv-store` process, killed when dropped, with the JSON line it announced itself with.
struct Store {
    child: Child,
    announce: serde_json::Value,
}

impl Store {
    fn start(args: &[&str]) -> Store {
        let mut child = Command::new(kv_store())
            .args(args)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let announce = serde_json::from_str(&line).unwrap_or_else(|e| panic!("announce {line:?}: {e}"));
        Store { child, announce }
    }

    fn field(&self, name: &str) -> String {
        self.announce[name].as_str().unwrap().to_string()
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        self.kill();
    }
}

#[path = "../../apiserver/src/runtime/local/ports.rs"]
#[allow(dead_code)]
mod ports;

const TENANT: [&str; 2] = ["--tenant", "t=64Mi:4:bfloat16"];

fn scope() -> Scope {
    Scope {
        tenant: "t".into(),
        block_size: 4,
        dtype: "bfloat16".into(),
        ..Default::default()
    }
}

/// The environment that names the store to the router.
fn store_env(addr: &str) -> [(&str, &str); 4] {
    [
        ("KVSTORE_LEADER", addr),
        ("KVSTORE_TENANT", "t"),
        ("KVSTORE_BLOCK_SIZE", "4"),
        ("KVSTORE_DTYPE", "bfloat16"),
    ]
}

/// A seal key file in `dir`, for leaders that adopt what a member hands over.
fn seal_key(dir: &std::path::Path) -> String {
    let seal = dir.join("seal.key");
    std::fs::write(&seal, "the-seal-secret-of-this-test\n").unwrap();
    seal.display().to_string()
}

fn member(leader: &str) -> Store {
    Store::start(&[
        "member",
        "--leader",
        leader,
        "--name",
        "m1",
        "--capacity",
        "32Mi",
        "--metrics-listen",
        "127.0.0.1:0",
    ])
}

/// A client of the tenant once the member is mounted (a put succeeds).
async fn mounted_client(addr: &str) -> Client {
    let c = Client::connect(addr, scope()).await.unwrap();
    eventually_async(Duration::from_secs(30), "the member mounted", || async {
        c.put("first", Bytes::from_static(b"first")).await.is_ok()
    })
    .await;
    c
}

fn leader(listen: &str, seal: &str) -> Store {
    let mut args = vec!["leader", "--listen", listen, "--seal-key-file", seal];
    // (on any fast port: a restarted leader's old one may not be free again yet)
    args.extend(["--fast-listen", "127.0.0.1:0", "--member-ttl", "2s"]);
    args.extend(TENANT);
    Store::start(&args)
}

async fn gauge(url: &str, series: &str) -> f64 {
    let addr = url.trim_start_matches("http://").parse().unwrap();
    let (_, body) = common::call(addr, "GET", "/metrics", "").await;
    value(std::str::from_utf8(&body).unwrap(), series)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_router_follows_the_store_through_a_leader_restart() {
    let dir = tempfile::tempdir().unwrap();
    let seal = seal_key(dir.path());
    let listen = format!("127.0.0.1:{}", ports::loopback_port());
    let mut l = leader(&listen, &seal);
    let addr = l.field("grpc");
    let m = member(&addr);
    let c = mounted_client(&addr).await;
    assert!(c.remove("first").await.unwrap());
    c.put("a", Bytes::from_static(b"first")).await.unwrap();
    c.put("b", Bytes::from_static(b"second")).await.unwrap();

    let router = Router::start_with_env(json!({}), &[], &store_env(&addr));
    let blocks = |n: f64| {
        let router = &router;
        move || async move { router.metric("kvrouter_store_blocks").await == n }
    };
    eventually_async(Duration::from_secs(30), "the snapshot's 2 blocks", blocks(2.0)).await;
    assert_eq!(router.metric("kvrouter_store_connected").await, 1.0);
    c.put("c", Bytes::from_static(b"third")).await.unwrap();
    eventually_async(Duration::from_secs(30), "a put's block", blocks(3.0)).await;
    assert!(c.remove("a").await.unwrap());
    eventually_async(Duration::from_secs(30), "a removal", blocks(2.0)).await;

    // every value sealed at the member, so a restarted leader adopts it
    let member_metrics = m.field("metrics");
    eventually_async(
        Duration::from_secs(30),
        "the member holds both values sealed",
        || async {
            let objects = c.control().health(HealthRequest {}).await.unwrap().into_inner().objects;
            gauge(&member_metrics, "kvstore_member_handover_values").await == objects as f64 && objects == 2
        },
    )
    .await;
    l.kill();
    eventually_async(Duration::from_secs(30), "the router sees the stream end", || async {
        router.metric("kvrouter_store_connected").await == 0.0
    })
    .await;
    // what the router knew stays while no leader serves
    assert_eq!(router.metric("kvrouter_store_blocks").await, 2.0);
    let _l2 = leader(&listen, &seal);
    eventually_async(Duration::from_secs(30), "a second stream", || async {
        router.metric("kvrouter_store_streams_total").await >= 2.0
            && router.metric("kvrouter_store_connected").await == 1.0
    })
    .await;
    eventually_async(Duration::from_secs(30), "the adopted blocks", blocks(2.0)).await;
    let c2 = Client::connect(&addr, scope()).await.unwrap();
    c2.put("d", Bytes::from_static(b"fourth")).await.unwrap();
    eventually_async(Duration::from_secs(30), "a put to the new leader", blocks(3.0)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_whose_blocks_the_store_holds_skips_prefill() {
    let dir = tempfile::tempdir().unwrap();
    let seal = seal_key(dir.path());
    let l = leader(&format!("127.0.0.1:{}", ports::loopback_port()), &seal);
    let addr = l.field("grpc");
    let _m = member(&addr);
    let c = mounted_client(&addr).await;
    // what a replica of model "m" saved of a 40-token prompt: its first 9 blocks of 4
    let prompt: Vec<i64> = (0..40).collect();
    let hashes = kvcache_router::keys::chain(&kvcache_router::keys::seed("m", "", ""), &prompt[..36], 4);
    for h in &hashes {
        let key = format!("vllm/m/0123456789abcdef/tp0of1/{h}");
        c.put(&key, Bytes::from_static(b"a block's pages")).await.unwrap();
    }
    let p = StandIn::start("p").await;
    let d = StandIn::start("d").await;
    let router = Router::start_with_env(
        json!({"prefill": [p.url()], "decode": [d.url()]}),
        &["--disaggregation-threshold-tokens", "8"],
        &store_env(&addr),
    );
    eventually_async(Duration::from_secs(30), "the router knows the 10 blocks", || async {
        router.metric("kvrouter_store_blocks").await == 10.0
    })
    .await;
    let text = |tokens: &[i64]| tokens.iter().map(i64::to_string).collect::<Vec<_>>().join(" ");
    let ask = |body: serde_json::Value| {
        let addr = router.addr;
        async move {
            let (status, _) = common::post_json(addr, "/v1/completions", body).await;
            assert_eq!(status, 200);
        }
    };
    let prefilled = || p.state.bodies("/v1/completions").len();
    let skipped = |why: &'static str| {
        let router = &router;
        async move {
            router
                .metric(&format!("kvrouter_prefill_skipped_total{{reason=\"{why}\"}}"))
                .await
        }
    };

    // 36 of 40 tokens held: 4 missing, under the threshold of 8
    ask(json!({"model": "m", "prompt": text(&prompt)})).await;
    assert_eq!((prefilled(), skipped("stored").await), (0, 1.0));
    // the same as token ids
    ask(json!({"model": "m", "prompt": prompt})).await;
    assert_eq!((prefilled(), skipped("stored").await), (0, 2.0));
    // a prompt that parts from it in the first block, another cache salt, a LoRA adapter's
    // request: nothing held, so prefill
    let mut other = prompt.clone();
    other[1] = 7;
    ask(json!({"model": "m", "prompt": text(&other)})).await;
    ask(json!({"model": "m", "prompt": text(&prompt), "cache_salt": "tenant-b"})).await;
    ask(json!({"model": "sql-lora", "prompt": text(&prompt)})).await;
    assert_eq!((prefilled(), skipped("stored").await), (3, 2.0));
    // 24 tokens more than the store holds: prefill
    let longer: Vec<i64> = (0..60).collect();
    ask(json!({"model": "m", "prompt": text(&longer)})).await;
    assert_eq!(prefilled(), 4);
    // a short prompt and a batch skip prefill as before, counted
    ask(json!({"model": "m", "prompt": "1 2 3"})).await;
    ask(json!({"model": "m", "prompt": ["1 2", "3 4"]})).await;
    assert_eq!(prefilled(), 4);
    assert_eq!((skipped("short").await, skipped("batch").await), (1.0, 1.0));
    assert_eq!(
        d.state.bodies("/v1/completions").len(),
        8,
        "decode answered every request"
    );
}

#[tokio::test]
async fn a_store_the_environment_names_badly_stops_the_router_with_why() {
    let out = Command::new(env!("CARGO_BIN_EXE_kv-router"))
        .args(["--listen", "127.0.0.1:0"])
        .env("KVSTORE_LEADER", "127.0.0.1:1")
        .env_remove("KVSTORE_BLOCK_SIZE")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("KVSTORE_BLOCK_SIZE"), "{err}");
}
