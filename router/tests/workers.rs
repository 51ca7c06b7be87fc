//! Worker sets change without a restart: the workers file (within 2 s, a malformed file keeps
//! the last good set, a request in flight to a removed worker completes), `--workers-dns`; and a
//! dead worker is taken out by the health check and probed back in.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::eventually::eventually_async;
use common::router::Router;
use common::standin::StandIn;
use common::{Conn, next_chunk, post_json};
use serde_json::json;

async fn who_answers(router: &Router) -> String {
    let (status, answer) = post_json(router.addr, "/v1/completions", json!({"model": "m", "prompt": "x"})).await;
    assert_eq!(status, 200, "{answer}");
    answer["worker"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn workers_file_changes_reach_the_routing_within_2s() {
    let a = StandIn::start("a").await;
    let b = StandIn::start("b").await;
    let router = Router::start(json!({"server": [a.url()]}), &[]);
    assert_eq!(who_answers(&router).await, "a");

    // a stream in flight on a, which is then removed
    a.state.gated.store(true, Ordering::SeqCst);
    let mut c = Conn::open(router.addr).await;
    let r = c
        .request(
            "POST",
            "/v1/completions",
            Bytes::from(json!({"model": "m", "prompt": "x", "stream": true}).to_string()),
        )
        .await;
    let mut stream = r.into_body();
    assert!(next_chunk(&mut stream).await.unwrap().contains("\"worker\":\"a\""));

    let written = Instant::now();
    router.write_workers(&json!({"server": [b.url()]}).to_string());
    eventually_async(Duration::from_secs(2), "b answers within 2 s of the change", || async {
        who_answers(&router).await == "b"
    })
    .await;
    eprintln!("the change reached the routing in {:?}", written.elapsed());
    for _ in 0..3 {
        assert_eq!(who_answers(&router).await, "b");
    }

    // the removed worker's stream still completes
    for _ in 0..3 {
        a.release();
    }
    let mut rest = String::new();
    while let Some(chunk) = next_chunk(&mut stream).await {
        rest.push_str(&chunk);
    }
    assert!(rest.contains("\"i\":2") && rest.ends_with("data: [DONE]\n\n"), "{rest}");

    // a malformed file keeps the last good set
    router.write_workers("{\"server\": [\"http://");
    eventually_async(Duration::from_secs(10), "the bad file noticed", || async {
        router.logged("workers file refused")
    })
    .await;
    assert_eq!(who_answers(&router).await, "b");
    // and a good one is taken again
    router.write_workers(&json!({"server": [a.url()]}).to_string());
    eventually_async(Duration::from_secs(2), "a answers again", || async {
        who_answers(&router).await == "a"
    })
    .await;
}

#[tokio::test]
async fn workers_from_dns() {
    let a = StandIn::start("a").await;
    let target = format!("server=127.0.0.1:{}", a.addr.port());
    let router = Router::start(json!({}), &["--workers-dns", &target]);
    assert_eq!(who_answers(&router).await, "a");
    let healthy = format!("kvrouter_inflight{{kind=\"server\",worker=\"{}\"}}", a.url());
    assert!(router.metrics().await.contains(&healthy));
}

#[tokio::test]
async fn a_dead_worker_is_taken_out_and_probed_back_in() {
    let mut a = StandIn::start("a").await;
    let b = StandIn::start("b").await;
    let router = Router::start(json!({"server": [a.url(), b.url()]}), &[]);
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..4 {
        seen.insert(who_answers(&router).await);
    }
    assert_eq!(seen.len(), 2, "both answer: {seen:?}");

    a.stop().await;
    // every request still succeeds: a refused connection moves it to b
    for _ in 0..4 {
        assert_eq!(who_answers(&router).await, "b");
    }
    let unhealthy = "kvrouter_workers{kind=\"server\",state=\"unhealthy\"}";
    eventually_async(Duration::from_secs(10), "a taken out", || async {
        router.metric(unhealthy).await == 1.0
    })
    .await;
    let before = a.state.requests();
    for _ in 0..4 {
        assert_eq!(who_answers(&router).await, "b");
    }
    assert_eq!(a.state.requests(), before);

    a.restart().await;
    eventually_async(Duration::from_secs(10), "a probed back in", || async {
        router.metric(unhealthy).await == 0.0
    })
    .await;
    eventually_async(Duration::from_secs(10), "a answers again", || async {
        who_answers(&router).await == "a"
    })
    .await;

    // /health: 503 with a reason when no worker is healthy, 200 again after
    a.state.healthy.store(false, Ordering::SeqCst);
    b.state.healthy.store(false, Ordering::SeqCst);
    eventually_async(Duration::from_secs(10), "the router unhealthy", || async {
        let (status, body) = common::call(router.addr, "GET", "/health", "").await;
        status == 503 && String::from_utf8_lossy(&body).contains("none of the 2")
    })
    .await;
    b.state.healthy.store(true, Ordering::SeqCst);
    eventually_async(Duration::from_secs(10), "the router healthy", || async {
        common::call(router.addr, "GET", "/health", "").await.0 == 200
    })
    .await;
}
