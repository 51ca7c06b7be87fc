//! What the router refuses itself, OpenAI-style, before any engine sees it: bodies that are not
//! JSON, not an object, without a string model, or too large; unknown paths and methods.

#![allow(clippy::unwrap_used)]

mod common;

use common::router::Router;
use common::standin::StandIn;
use common::{assert_openai_error, call};
use serde_json::{Value, json};

#[tokio::test]
async fn bad_bodies_never_reach_an_engine() {
    let worker = StandIn::start("s1").await;
    let router = Router::start(json!({"server": [worker.url()]}), &["--max-body-bytes", "1000"]);
    let big = json!({"model": "m", "prompt": "x".repeat(2000)}).to_string();
    let cases: Vec<(&str, String, u16, &str)> = vec![
        ("/v1/completions", "{\"model\": \"m\",".into(), 400, "invalid_json"),
        ("/v1/completions", "".into(), 400, "invalid_json"),
        (
            "/v1/chat/completions",
            "[{\"model\": \"m\"}]".into(),
            400,
            "invalid_body",
        ),
        ("/v1/completions", "{\"prompt\": \"x\"}".into(), 400, "missing_model"),
        ("/v1/chat/completions", "{\"model\": 7}".into(), 400, "invalid_model"),
        ("/v1/completions", big.clone(), 413, "body_too_large"),
    ];
    for (path, body, status, code) in cases {
        let (got, answer) = call(router.addr, "POST", path, body.clone()).await;
        let answer: Value = serde_json::from_slice(&answer).unwrap();
        assert_eq!(got, status, "{body:.60}: {answer}");
        assert_openai_error(&answer, code);
    }
    // a body without Content-Length, larger than the limit, is cut off as it is read
    let chunked = chunked_post(router.addr, &big).await;
    assert!(chunked.starts_with("HTTP/1.1 413"), "{chunked}");
    assert!(chunked.contains("body_too_large"), "{chunked}");

    let (status, answer) = call(router.addr, "GET", "/v2/nothing", "").await;
    assert_eq!(status, 404);
    assert_openai_error(&serde_json::from_slice(&answer).unwrap(), "not_found");
    let (status, answer) = call(router.addr, "GET", "/v1/completions", "").await;
    assert_eq!(status, 405);
    assert_openai_error(&serde_json::from_slice(&answer).unwrap(), "method_not_allowed");

    assert_eq!(worker.state.requests(), 0, "the worker saw only health checks");
    let refused = "kvrouter_requests_total{endpoint=\"completions\",outcome=\"refused\"}";
    assert_eq!(router.metric(refused).await, 5.0);
}

/// A POST with a chunked body, answered over a raw socket (the router may answer before
/// reading the whole body).
async fn chunked_post(addr: std::net::SocketAddr, body: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = "POST /v1/completions HTTP/1.1\r\nhost: r\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n";
    let mut req = head.to_string();
    req.push_str(&format!("{:x}\r\n{body}\r\n0\r\n\r\n", body.len()));
    let _ = s.write_all(req.as_bytes()).await;
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out).await;
    String::from_utf8_lossy(&out).into_owned()
}
