//! Prefill then decode through kv_transfer_params: what each side sees, the threshold (bytes,
//! then the decode worker's tokenizer), prefill failures retried then fallen back, and a decode
//! worker failing before its first byte replaced.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::atomic::Ordering;

use bytes::Bytes;
use common::router::Router;
use common::standin::{Mode, StandIn, handoff};
use common::{Conn, next_chunk, post_json};
use serde_json::{Value, json};

#[tokio::test]
async fn prefill_hands_its_kv_transfer_params_to_decode() {
    let p = StandIn::start("p").await;
    let d = StandIn::start("d").await;
    let router = Router::start(json!({"prefill": [p.url()], "decode": [d.url()]}), &[]);
    let client = json!({"model": "m", "prompt": "a long prompt", "max_tokens": 64, "stream": true,
                        "stream_options": {"include_usage": true}});
    let mut c = Conn::open(router.addr).await;
    let r = c
        .request("POST", "/v1/completions", Bytes::from(client.to_string()))
        .await;
    assert_eq!(r.status(), 200);
    let mut body = r.into_body();
    let mut chunks = Vec::new();
    while let Some(chunk) = next_chunk(&mut body).await {
        chunks.push(chunk);
    }
    assert!(chunks.concat().contains("\"worker\":\"d\""), "{chunks:?}");
    assert!(chunks.concat().ends_with("data: [DONE]\n\n"), "{chunks:?}");

    let prefilled = p.state.bodies("/v1/completions");
    assert_eq!(prefilled.len(), 1);
    assert_eq!(
        prefilled[0],
        json!({"model": "m", "prompt": "a long prompt", "max_tokens": 1, "stream": false,
               "kv_transfer_params": {"do_remote_decode": true}})
    );
    let decoded = d.state.bodies("/v1/completions");
    assert_eq!(decoded.len(), 1);
    let mut expected = client.clone();
    expected["kv_transfer_params"] = handoff();
    assert_eq!(decoded[0], expected);

    // chat, not streamed: max_completion_tokens capped too
    let chat = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 9});
    let (status, answer) = post_json(router.addr, "/v1/chat/completions", chat).await;
    assert_eq!(status, 200);
    assert_eq!(answer["kv_transfer_params"], handoff(), "decode got prefill's params");
    let prefilled = p.state.bodies("/v1/chat/completions");
    assert_eq!(prefilled[0]["max_completion_tokens"], 1);
    assert_eq!(prefilled[0]["max_tokens"], 1);

    let m = router.metrics().await;
    assert_eq!(common::router::value(&m, "kvrouter_handoffs_total"), 2.0, "{m}");
    assert_eq!(common::router::value(&m, "kvrouter_handoff_bytes_total"), 2000.0, "{m}");
    assert!(!m.contains("kvrouter_fallbacks_total{"), "{m}");
}

#[tokio::test]
async fn the_threshold_reads_bytes_then_asks_the_tokenizer() {
    let p = StandIn::start("p").await;
    let d = StandIn::start("d").await;
    let router = Router::start(
        json!({"prefill": [p.url()], "decode": [d.url()]}),
        &["--disaggregation-threshold-tokens", "100"],
    );
    let ask = |prompt: String| {
        let addr = router.addr;
        async move { post_json(addr, "/v1/completions", json!({"model": "m", "prompt": prompt})).await }
    };
    // short in bytes: straight to decode, no tokenizer asked
    let (status, _) = ask("hi there".into()).await;
    assert_eq!(status, 200);
    assert_eq!(p.state.bodies("/v1/completions").len(), 0);
    assert_eq!(d.state.bodies("/tokenize").len(), 0);
    // long in bytes, few tokens (the stand-in counts words): decode alone
    let (status, _) = ask("x".repeat(500)).await;
    assert_eq!(status, 200);
    assert_eq!(d.state.bodies("/tokenize").len(), 1);
    assert_eq!(
        d.state.bodies("/tokenize")[0],
        json!({"model": "m", "prompt": "x".repeat(500)})
    );
    assert_eq!(p.state.bodies("/v1/completions").len(), 0);
    // 150 tokens: split
    let (status, answer) = ask("word ".repeat(150)).await;
    assert_eq!(status, 200);
    assert_eq!(answer["kv_transfer_params"], handoff());
    assert_eq!(p.state.bodies("/v1/completions").len(), 1);
    // token ids are counted as they are
    let (status, answer) = post_json(
        router.addr,
        "/v1/completions",
        json!({"model": "m", "prompt": vec![7; 120]}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(answer["kv_transfer_params"], handoff());
    assert_eq!(d.state.bodies("/tokenize").len(), 2, "ids need no tokenizer");
}

#[tokio::test]
async fn a_failed_prefill_is_retried_then_decode_prefills_itself() {
    let failing = StandIn::start("p1").await;
    failing.set_mode(Mode::Status(500));
    let no_params = StandIn::start("p2").await;
    no_params.set_mode(Mode::NoParams);
    let d = StandIn::start("d").await;
    let router = Router::start(
        json!({"prefill": [failing.url(), no_params.url()], "decode": [d.url()]}),
        &["--unhealthy-after", "100"],
    );
    let client = json!({"model": "m", "prompt": "p", "max_tokens": 5});
    let (status, answer) = post_json(router.addr, "/v1/completions", client.clone()).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(failing.state.bodies("/v1/completions").len(), 1);
    assert_eq!(no_params.state.bodies("/v1/completions").len(), 1);
    assert_eq!(
        d.state.bodies("/v1/completions"),
        vec![client.clone()],
        "no kv_transfer_params"
    );
    let m = router.metrics().await;
    assert_eq!(
        common::router::value(&m, "kvrouter_retries_total{kind=\"prefill\"}"),
        1.0,
        "{m}"
    );
    assert_eq!(
        common::router::value(&m, "kvrouter_fallbacks_total{reason=\"prefill_failed\"}"),
        1.0,
        "{m}"
    );
    assert_eq!(common::router::value(&m, "kvrouter_handoffs_total"), 0.0);

    // one prefill worker gone (connection refused), the other good: retried onto it
    let mut gone = failing;
    gone.stop().await;
    no_params.set_mode(Mode::Normal);
    for _ in 0..2 {
        let (status, answer) = post_json(router.addr, "/v1/completions", client.clone()).await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["kv_transfer_params"], handoff());
    }
    let m = router.metrics().await;
    assert!(
        common::router::value(&m, "kvrouter_retries_total{kind=\"prefill\"}") >= 2.0,
        "{m}"
    );
    assert_eq!(common::router::value(&m, "kvrouter_handoffs_total"), 2.0, "{m}");

    // every prefill worker refuses the request (4xx): decode judges it, once
    no_params.set_mode(Mode::Status(400));
    let (status, _) = post_json(router.addr, "/v1/completions", client).await;
    assert_eq!(status, 200);
    let refused = "kvrouter_fallbacks_total{reason=\"prefill_refused\"}";
    assert_eq!(router.metric(refused).await, 1.0);
}

#[tokio::test]
async fn no_healthy_prefill_worker_falls_back_to_decode() {
    let p = StandIn::start("p").await;
    p.state.healthy.store(false, Ordering::SeqCst);
    let d = StandIn::start("d").await;
    let router = Router::start(json!({"prefill": [p.url()], "decode": [d.url()]}), &[]);
    let unhealthy = "kvrouter_workers{kind=\"prefill\",state=\"unhealthy\"}";
    common::eventually::eventually_async(std::time::Duration::from_secs(10), "prefill out", || async {
        router.metric(unhealthy).await == 1.0
    })
    .await;
    let (status, answer) = post_json(router.addr, "/v1/completions", json!({"model": "m", "prompt": "p"})).await;
    assert_eq!(status, 200);
    assert_eq!(answer["kv_transfer_params"], Value::Null);
    assert_eq!(p.state.bodies("/v1/completions").len(), 0);
    let reason = "kvrouter_fallbacks_total{reason=\"no_healthy_prefill\"}";
    assert_eq!(router.metric(reason).await, 1.0);
}

#[tokio::test]
async fn a_decode_worker_failing_before_its_first_byte_is_replaced() {
    let bad = StandIn::start("d1").await;
    bad.set_mode(Mode::Status(503));
    let good = StandIn::start("d2").await;
    let router = Router::start(
        json!({"decode": [bad.url(), good.url()]}),
        &["--unhealthy-after", "100"],
    );
    for _ in 0..4 {
        let (status, answer) = post_json(
            router.addr,
            "/v1/completions",
            json!({"model": "m", "prompt": "p", "stream": false}),
        )
        .await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["worker"], "d2");
    }
    assert!(!bad.state.bodies("/v1/completions").is_empty());
    assert!(router.metric("kvrouter_retries_total{kind=\"decode\"}").await >= 1.0);
    // with no other worker left, the engine's own error is passed through
    router.write_workers(&json!({"decode": [bad.url()]}).to_string());
    common::eventually::eventually_async(std::time::Duration::from_secs(10), "only d1 left", || async {
        post_json(router.addr, "/v1/completions", json!({"model": "m", "prompt": "p"}))
            .await
            .0
            == 503
    })
    .await;
    let (_, answer) = post_json(router.addr, "/v1/completions", json!({"model": "m", "prompt": "p"})).await;
    assert_eq!(answer["error"]["message"], "stand-in failure");
}
