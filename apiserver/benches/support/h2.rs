//! An HTTP/2 client over TLS (ALPN h2), as kubectl and client-go reach an API server, and the
//! measurements the API benchmarks share: percentiles and watch delivery latency.

#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use rustls_pki_types::ServerName;
use serde_json::Value;
use tokio::task::JoinSet;

/// Where a server is: its loopback port, the name its certificate is for, the client's TLS.
#[derive(Clone)]
pub struct Endpoint {
    pub port: u16,
    pub server_name: String,
    pub tls: tokio_rustls::TlsConnector,
}

/// A stream on an HTTP/2 connection; clones share the connection.
#[derive(Clone)]
pub struct Client {
    pub sender: SendRequest<Full<Bytes>>,
    authority: String,
}

impl Client {
    pub async fn connect(ep: &Endpoint) -> anyhow::Result<Client> {
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", ep.port)).await?;
        tcp.set_nodelay(true)?;
        let stream = ep
            .tls
            .connect(ServerName::try_from(ep.server_name.clone())?, tcp)
            .await?;
        let (sender, conn) =
            hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), TokioIo::new(stream)).await?;
        tokio::spawn(conn);
        Ok(Client {
            sender,
            authority: format!("{}:{}", ep.server_name, ep.port),
        })
    }

    pub fn request(
        &self,
        method: &str,
        path: &str,
        ct: &str,
        body: Vec<u8>,
    ) -> anyhow::Result<http::Request<Full<Bytes>>> {
        Ok(http::Request::builder()
            .method(method)
            .uri(format!("https://{}{path}", self.authority))
            .header("content-type", ct)
            .header("accept", "application/json")
            .body(Full::new(Bytes::from(body)))?)
    }

    pub async fn send(&mut self, method: &str, path: &str, ct: &str, body: Vec<u8>) -> anyhow::Result<(u16, Bytes)> {
        let req = self.request(method, path, ct, body)?;
        self.sender.ready().await?;
        let resp = self.sender.send_request(req).await?;
        let status = resp.status().as_u16();
        Ok((status, resp.into_body().collect().await?.to_bytes()))
    }

    pub async fn get(&mut self, path: &str) -> anyhow::Result<(u16, Bytes)> {
        self.send("GET", path, "application/json", Vec::new()).await
    }
}

/// The nearest-rank percentile `p` (0..1) of sorted durations.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

/// Watch delivery latency: `watchers` watch streams (one connection each) on the object
/// `pools`/pool-00000 while one client patches a label on it `updates` times about every 5 ms;
/// each latency is from the start of a write to its event at one watcher. (p50, p99, deliveries).
pub async fn watch_latency(
    ep: &Endpoint,
    pools: &str,
    watchers: usize,
    updates: usize,
) -> anyhow::Result<(Duration, Duration, usize)> {
    let mut c = Client::connect(ep).await?;
    let (_, body) = c.get(&format!("{pools}?limit=1")).await?;
    let rv = serde_json::from_slice::<Value>(&body)?["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or("0")
        .to_owned();
    let sent: Arc<Mutex<HashMap<usize, Instant>>> = Arc::default();
    let latencies: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let mut tasks = JoinSet::new();
    for _ in 0..watchers {
        let mut w = Client::connect(ep).await?;
        let path = format!("{pools}?watch=true&resourceVersion={rv}&fieldSelector=metadata.name%3Dpool-00000");
        let req = w.request("GET", &path, "application/json", Vec::new())?;
        w.sender.ready().await?;
        let resp = w.sender.send_request(req).await?;
        anyhow::ensure!(resp.status() == 200, "watch returned {}", resp.status());
        let mut body = resp.into_body();
        let (sent, latencies) = (sent.clone(), latencies.clone());
        tasks.spawn(async move {
            let _connection = w;
            let mut buf = Vec::new();
            let mut seen = 0;
            while seen < updates {
                let Some(frame) = body.frame().await else { break };
                let Ok(data) = frame?.into_data() else { continue };
                let now = Instant::now();
                buf.extend_from_slice(&data);
                while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = buf.drain(..=pos).collect();
                    let ev: Value = serde_json::from_slice(&line)?;
                    let seq = ev["object"]["metadata"]["labels"]["seq"]
                        .as_str()
                        .and_then(|s| s.parse::<usize>().ok());
                    if let Some(seq) = seq
                        && let Some(at) = sent.lock().get(&seq).copied()
                    {
                        latencies.lock().push(now - at);
                        seen += 1;
                    }
                }
            }
            anyhow::Ok(())
        });
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    for seq in 0..updates {
        let patch = format!(r#"{{"metadata":{{"labels":{{"seq":"{seq}"}}}}}}"#);
        sent.lock().insert(seq, Instant::now());
        let (code, body) = c
            .send(
                "PATCH",
                &format!("{pools}/pool-00000"),
                "application/merge-patch+json",
                patch.into_bytes(),
            )
            .await?;
        anyhow::ensure!(code == 200, "patch returned {code}: {}", String::from_utf8_lossy(&body));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let deadline = tokio::time::sleep(Duration::from_secs(60));
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            r = tasks.join_next() => match r {
                Some(r) => r??,
                None => break,
            },
            () = &mut deadline => anyhow::bail!("watchers did not receive every event within 60s"),
        }
    }
    let mut lat = latencies.lock().clone();
    lat.sort();
    Ok((percentile(&lat, 0.5), percentile(&lat, 0.99), lat.len()))
}
