//! Answers pass through as the engine sends them: server-sent events chunk by chunk (the client
//! has chunk 1 before the worker sends chunk 2), JSON untouched; a client that goes away
//! cancels the engine's request; the request timeout answers 504.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use common::eventually::eventually_async;
use common::router::Router;
use common::standin::{Mode, StandIn};
use common::{Conn, assert_openai_error, next_chunk, post_json};
use serde_json::json;

#[tokio::test]
async fn streamed_chunks_pass_through_one_by_one() {
    let worker = StandIn::start("s1").await;
    worker.state.gated.store(true, Ordering::SeqCst);
    worker.state.chunks.store(3, Ordering::SeqCst);
    let router = Router::start(json!({"server": [worker.url()]}), &[]);
    for path in ["/v1/completions", "/v1/chat/completions"] {
        worker.state.sent.store(0, Ordering::SeqCst);
        let mut c = Conn::open(router.addr).await;
        let body = json!({"model": "m", "prompt": "hi", "messages": [], "stream": true});
        let r = c.request("POST", path, Bytes::from(body.to_string())).await;
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["content-type"], "text/event-stream");
        let mut body = r.into_body();
        for i in 0..3 {
            let chunk = next_chunk(&mut body).await.unwrap();
            assert!(chunk.contains(&format!("\"i\":{i}")), "chunk {i}: {chunk}");
            // the worker has not sent the next chunk: the router passed this one on alone
            assert_eq!(worker.state.sent.load(Ordering::SeqCst), i + 1);
            worker.release();
        }
        assert_eq!(next_chunk(&mut body).await.unwrap(), "data: [DONE]\n\n");
        assert!(next_chunk(&mut body).await.is_none());
        assert_eq!(worker.state.bodies(path).len(), 1, "{path}");
    }
    let completed = "kvrouter_requests_total{endpoint=\"completions\",outcome=\"ok\"}";
    let metrics = router.metrics().await;
    assert_eq!(common::router::value(&metrics, completed), 1.0, "{metrics}");
    assert!(common::router::value(&metrics, "kvrouter_time_to_first_token_seconds_count") >= 2.0);
    assert!(common::router::value(&metrics, "kvrouter_time_per_output_token_seconds_count") >= 2.0);
}

#[tokio::test]
async fn json_answers_and_models_pass_through() {
    let worker = StandIn::start("s1").await;
    let router = Router::start(json!({"server": [worker.url()]}), &["--model", "fallback-name"]);
    let (status, answer) = post_json(router.addr, "/v1/completions", json!({"model": "m", "prompt": "x"})).await;
    assert_eq!(status, 200);
    assert_eq!(answer["worker"], "s1");
    assert_eq!(
        answer["kv_transfer_params"],
        json!(null),
        "no prefill workers: no handoff"
    );
    // an answer of known length, read whole: counted as completed, not as cancelled
    let ok = "kvrouter_requests_total{endpoint=\"completions\",outcome=\"ok\"}";
    eventually_async(Duration::from_secs(5), "the JSON answer counted ok", || async {
        router.metric(ok).await == 1.0
    })
    .await;
    assert_eq!(
        router
            .metric("kvrouter_requests_total{endpoint=\"completions\",outcome=\"cancelled\"}")
            .await,
        0.0
    );
    let (status, body) = common::call(router.addr, "GET", "/v1/models", "").await;
    assert_eq!(status, 200);
    let models: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(models["data"][0]["id"], "s1", "from the worker");
    let (status, _) = common::call(router.addr, "GET", "/health", "").await;
    assert_eq!(status, 200);

    // without workers, /v1/models answers with --model and /health says why it is 503
    router.write_workers("{}");
    eventually_async(Duration::from_secs(10), "the worker removed", || async {
        common::call(router.addr, "GET", "/health", "").await.0 == 503
    })
    .await;
    let (status, body) = common::call(router.addr, "GET", "/v1/models", "").await;
    assert_eq!(status, 200);
    let models: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(models["data"][0]["id"], "fallback-name");
    let (status, answer) = post_json(router.addr, "/v1/completions", json!({"model": "m", "prompt": "x"})).await;
    assert_eq!(status, 503);
    assert_openai_error(&answer, "no_healthy_worker");
}

#[tokio::test]
async fn a_client_that_goes_away_cancels_the_stream_upstream() {
    let worker = StandIn::start("s1").await;
    worker.state.chunks.store(100_000, Ordering::SeqCst);
    *worker.state.interval.lock().unwrap() = Duration::from_millis(10);
    let router = Router::start(json!({"server": [worker.url()]}), &[]);
    let mut c = Conn::open(router.addr).await;
    let body = json!({"model": "m", "prompt": "hi", "stream": true});
    let r = c
        .request("POST", "/v1/completions", Bytes::from(body.to_string()))
        .await;
    let mut body = r.into_body();
    next_chunk(&mut body).await.unwrap();
    next_chunk(&mut body).await.unwrap();
    drop(body);
    c.close();
    eventually_async(Duration::from_secs(10), "the worker sees the client leave", || async {
        worker.state.disconnects.load(Ordering::SeqCst) == 1
    })
    .await;
    let sent = worker.state.sent.load(Ordering::SeqCst);
    assert!(sent < 1000, "the worker stopped early ({sent} chunks)");
    let cancelled = "kvrouter_requests_total{endpoint=\"completions\",outcome=\"cancelled\"}";
    let inflight = format!("kvrouter_inflight{{kind=\"server\",worker=\"{}\"}}", worker.url());
    eventually_async(Duration::from_secs(10), "the request counted as cancelled", || async {
        let m = router.metrics().await;
        common::router::value(&m, cancelled) == 1.0 && common::router::value(&m, &inflight) == 0.0
    })
    .await;
}

#[tokio::test]
async fn a_client_that_goes_away_before_the_answer_cancels_upstream() {
    let worker = StandIn::start("s1").await;
    worker.set_mode(Mode::Hang);
    let router = Router::start(json!({"server": [worker.url()]}), &[]);
    let mut c = Conn::open(router.addr).await;
    let body = Bytes::from(json!({"model": "m", "prompt": "hi"}).to_string());
    let pending = tokio::spawn(async move {
        let _ = c.request("POST", "/v1/completions", body).await;
    });
    eventually_async(Duration::from_secs(10), "the worker has the request", || async {
        worker.state.bodies("/v1/completions").len() == 1
    })
    .await;
    pending.abort();
    eventually_async(Duration::from_secs(10), "the worker sees the client leave", || async {
        worker.state.disconnects.load(Ordering::SeqCst) == 1
    })
    .await;
}

#[tokio::test]
async fn the_request_timeout_answers_504_and_cancels_upstream() {
    let worker = StandIn::start("s1").await;
    worker.set_mode(Mode::Hang);
    let router = Router::start(json!({"server": [worker.url()]}), &["--request-timeout-seconds", "1"]);
    let (status, answer) = post_json(router.addr, "/v1/completions", json!({"model": "m", "prompt": "x"})).await;
    assert_eq!(status, 504);
    assert_openai_error(&answer, "timeout");
    eventually_async(
        Duration::from_secs(10),
        "the worker sees the request dropped",
        || async { worker.state.disconnects.load(Ordering::SeqCst) == 1 },
    )
    .await;
    let timeouts = "kvrouter_requests_total{endpoint=\"completions\",outcome=\"timeout\"}";
    assert_eq!(router.metric(timeouts).await, 1.0);
}
