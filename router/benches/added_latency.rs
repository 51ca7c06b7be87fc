//! The router's added latency on a tiny completion: a stand-in worker answering at once, called
//! directly and through the real `kv-router` over loopback, each on one keep-alive connection,
//! sequentially, in alternating rounds (so that a busy moment of the machine falls on both).
//! Prints p50 and p99 of both and the difference; the goal is at most 1 ms added at p50.
//!
//! `cargo bench -p kvcache-router --bench added_latency` (ROUNDS, PER_ROUND to change the
//! default 4 x 500 requests a side).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

const ANSWER: &str = r#"{"id":"cmpl-1","object":"text_completion","model":"m","choices":[{"index":0,"text":" world","finish_reason":"length"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}"#;
const BODY: &str = r#"{"model":"m","prompt":"hello","max_tokens":1}"#;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The stand-in worker, on a thread and runtime of its own (as if another process).
fn start_worker() -> SocketAddr {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                stream.set_nodelay(true).unwrap();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(|req: Request<hyper::body::Incoming>| async move {
                        let _ = req.into_body().collect().await;
                        Ok::<_, Infallible>(
                            Response::builder()
                                .header("content-type", "application/json")
                                .body(Full::new(Bytes::from_static(ANSWER.as_bytes())))
                                .unwrap(),
                        )
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
    });
    rx.recv().unwrap()
}

/// kv-router in front of `worker`; its address, and the child to kill.
fn start_router(worker: SocketAddr, dir: &std::path::Path) -> Result<(SocketAddr, std::process::Child)> {
    let file = dir.join("workers.json");
    std::fs::write(&file, format!(r#"{{"server":["http://{worker}"]}}"#))?;
    let mut child = Command::new(env!("CARGO_BIN_EXE_kv-router"))
        .args(["--listen", "127.0.0.1:0", "--log-level", "info", "--workers-file"])
        .arg(&file)
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting kv-router")?;
    let stderr = child.stderr.take().context("kv-router's stderr")?;
    let mut lines = BufReader::new(stderr).lines();
    let addr = loop {
        let line = lines.next().context("kv-router exited")??;
        if let Some(rest) = line.split("addr=").nth(1) {
            break rest.split_whitespace().next().unwrap_or_default().parse()?;
        }
    };
    std::thread::spawn(move || for _ in lines {});
    Ok((addr, child))
}

async fn connect(addr: SocketAddr) -> SendRequest<Full<Bytes>> {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    send
}

async fn one(send: &mut SendRequest<Full<Bytes>>) -> Duration {
    let req = Request::post("/v1/completions")
        .header("host", "bench")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(BODY.as_bytes())))
        .unwrap();
    let start = Instant::now();
    let response = send.send_request(req).await.unwrap();
    assert_eq!(response.status(), 200);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let took = start.elapsed();
    assert_eq!(body.len(), ANSWER.len());
    took
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e3
}

fn main() -> Result<()> {
    // `cargo bench` passes --bench; nothing else is read from the command line
    let rounds = env("ROUNDS", 4);
    let per_round = env("PER_ROUND", 500);
    let worker = start_worker();
    let dir = tempfile::tempdir()?;
    let (router, mut child) = start_router(worker, dir.path())?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let (direct, routed) = rt.block_on(async {
        let mut to_worker = connect(worker).await;
        let mut to_router = connect(router).await;
        // warm up both paths (the router's pool connection to the worker too)
        for _ in 0..200 {
            one(&mut to_worker).await;
            one(&mut to_router).await;
        }
        let mut direct = Vec::with_capacity(rounds * per_round);
        let mut routed = Vec::with_capacity(rounds * per_round);
        for _ in 0..rounds {
            for _ in 0..per_round {
                direct.push(one(&mut to_worker).await);
            }
            for _ in 0..per_round {
                routed.push(one(&mut to_router).await);
            }
        }
        (direct, routed)
    });
    let _ = child.kill();
    let _ = child.wait();
    let (mut direct, mut routed) = (direct, routed);
    direct.sort();
    routed.sort();
    let (d50, d99) = (percentile(&direct, 0.5), percentile(&direct, 0.99));
    let (r50, r99) = (percentile(&routed, 0.5), percentile(&routed, 0.99));
    println!(
        "tiny completion, {} sequential requests a side on one keep-alive connection, {rounds} alternated rounds",
        direct.len()
    );
    println!("  direct to the worker:  p50 {d50:.3} ms  p99 {d99:.3} ms");
    println!("  through kv-router:     p50 {r50:.3} ms  p99 {r99:.3} ms");
    println!(
        "  added by the router:   p50 {:.3} ms  p99 {:.3} ms  (goal: <= 1 ms at p50: {})",
        r50 - d50,
        r99 - d99,
        if r50 - d50 <= 1.0 { "met" } else { "missed" }
    );
    Ok(())
}
