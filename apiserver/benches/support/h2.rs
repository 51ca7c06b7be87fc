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
        Client::connect_with_window(ep, None).await
    }

    /// A connection whose stream and connection windows are `window` bytes (hyper's defaults
    /// without one): a client that stops reading lets the server send no more than that.
    pub async fn connect_with_window(ep: &Endpoint, window: Option<u32>) -> anyhow::Result<Client> {
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", ep.port)).await?;
        tcp.set_nodelay(true)?;
        let stream = ep
            .tls
            .connect(ServerName::try_from(ep.server_name.clone())?, tcp)
            .await?;
        let mut builder = hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new());
        if let Some(w) = window {
            builder.initial_stream_window_size(w).initial_connection_window_size(w);
        }
        let (sender, conn) = builder.handshake(TokioIo::new(stream)).await?;
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

/// The watchers of a [`watch_latency`] run.
#[derive(Clone, Copy, Debug)]
pub struct WatchLoad {
    /// Watchers that read every event (one connection each).
    pub readers: usize,
    /// Watchers that never read a byte (one connection each, with a 64 KiB window), opened
    /// first and kept open until the readers have every event.
    pub stalled: usize,
    pub updates: usize,
}

/// What the readers of a [`watch_latency`] run saw.
#[derive(Clone, Copy, Debug)]
pub struct WatchDelivery {
    pub p50: Duration,
    pub p99: Duration,
    /// Events delivered to readers, in all.
    pub delivered: usize,
    /// Readers whose events came in order with no gap and no repeat.
    pub in_order: usize,
}

/// Opens a watch on `pools`/pool-00000 from `rv` on a connection of its own.
async fn open_watch(
    ep: &Endpoint,
    pools: &str,
    rv: &str,
    window: Option<u32>,
) -> anyhow::Result<(Client, hyper::body::Incoming)> {
    let mut w = Client::connect_with_window(ep, window).await?;
    let path = format!("{pools}?watch=true&resourceVersion={rv}&fieldSelector=metadata.name%3Dpool-00000");
    let req = w.request("GET", &path, "application/json", Vec::new())?;
    w.sender.ready().await?;
    let resp = w.sender.send_request(req).await?;
    anyhow::ensure!(resp.status() == 200, "watch returned {}", resp.status());
    Ok((w, resp.into_body()))
}

/// Watch delivery latency: `load.readers` watch streams (one connection each) on the object
/// `pools`/pool-00000 while one client patches a label on it `load.updates` times about every
/// 5 ms, beside `load.stalled` watchers that never read; each latency is from the start of a
/// write to its event at one reader.
pub async fn watch_latency(ep: &Endpoint, pools: &str, load: WatchLoad) -> anyhow::Result<WatchDelivery> {
    let WatchLoad {
        readers: watchers,
        stalled,
        updates,
    } = load;
    let mut c = Client::connect(ep).await?;
    let (_, body) = c.get(&format!("{pools}?limit=1")).await?;
    let rv = serde_json::from_slice::<Value>(&body)?["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or("0")
        .to_owned();
    let sent: Arc<Mutex<HashMap<usize, Instant>>> = Arc::default();
    let latencies: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let in_order = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut held = Vec::new();
    for _ in 0..stalled {
        held.push(open_watch(ep, pools, &rv, Some(65_535)).await?);
    }
    let mut tasks = JoinSet::new();
    for _ in 0..watchers {
        let (w, mut body) = open_watch(ep, pools, &rv, None).await?;
        let (sent, latencies, in_order) = (sent.clone(), latencies.clone(), in_order.clone());
        tasks.spawn(async move {
            let _connection = w;
            let mut buf = Vec::new();
            let mut seen = 0;
            let mut ordered = true;
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
                        ordered &= seq == seen;
                        seen += 1;
                    }
                }
            }
            if ordered && seen == updates {
                in_order.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
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
    drop(held);
    let mut lat = latencies.lock().clone();
    lat.sort();
    Ok(WatchDelivery {
        p50: percentile(&lat, 0.5),
        p99: percentile(&lat, 0.99),
        delivered: lat.len(),
        in_order: in_order.load(std::sync::atomic::Ordering::Relaxed),
    })
}

/// TLS settings of the admin user, from the files a server wrote under `pki`.
pub fn tls_connector(pki: &std::path::Path) -> anyhow::Result<tokio_rustls::TlsConnector> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_file_iter(pki.join("ca.crt"))? {
        roots.add(ca?)?;
    }
    let chain = CertificateDer::pem_file_iter(pki.join("admin.crt"))?.collect::<Result<Vec<_>, _>>()?;
    let key = PrivateKeyDer::from_pem_file(pki.join("admin.key"))?;
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)?;
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}
