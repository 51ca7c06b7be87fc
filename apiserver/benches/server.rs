//! The API server end to end over HTTPS, with etcd's put rate at the same concurrency beside it.
//!
//! Run with `cargo bench -p kvcache-apiserver --bench server`. It starts the real
//! `kv-apiserver serve` (bench profile) with its data on a real disk, connects as the admin
//! with the client certificate the server wrote, and measures:
//! - **creates/s**: `WRITERS` concurrent requests on one HTTP/2 connection POST `OBJECTS` pools;
//!   beside it, a fresh etcd takes the same number of puts of the same size from the same
//!   number of concurrent writers; `ROUNDS` alternations, medians reported;
//! - **gets**: one client, back to back after a warm-up (latency p50/p99), then `WRITERS` concurrent
//!   requests (gets/s);
//! - **list**: the time to receive a list of all `OBJECTS` pools (JSON, median of 5);
//! - **watch**: `WATCHERS` watch streams, while one client patches a pool `UPDATES` times at
//!   about 200/s; latency is from the start of each write request to its event at each watcher.
//!
//! Both stores are durable (fdatasync / WAL fsync before the answer). This is a report: nothing
//! is asserted about the numbers.

#[path = "support/etcd.rs"]
mod etcd;
#[path = "support/h2.rs"]
mod h2;

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use h2::{Client, percentile};
use tokio::task::JoinSet;

const WRITERS: usize = 64;
const OBJECTS: usize = 10_000;
const GETS: usize = 5_000;
const WATCHERS: usize = 100;
const UPDATES: usize = 200;
const ROUNDS: usize = 3;
const GET_WARM_UP: usize = 500;

/// The running server; killed on drop.
struct ApiServer {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl ApiServer {
    /// The admin's TLS settings, once the server has written its certificates.
    fn connector(&self) -> anyhow::Result<tokio_rustls::TlsConnector> {
        let pki = self.dir.path().join("pki");
        let deadline = Instant::now() + Duration::from_secs(20);
        while !pki.join("admin.key").exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        tls_connector(&pki)
    }

    /// The API alone (no controllers), on the embedded storage or on `storage`.
    fn start(scratch: &Path, storage: Option<&str>) -> anyhow::Result<ApiServer> {
        let dir = tempfile::Builder::new().prefix("apiserver-").tempdir_in(scratch)?;
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let child = Command::new(env!("CARGO_BIN_EXE_kv-apiserver"))
            .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--controllers=false"])
            .args(
                storage
                    .map(|s| vec!["--storage".to_owned(), s.to_owned()])
                    .unwrap_or_default(),
            )
            .arg("--data-dir")
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting kv-apiserver")?;
        Ok(ApiServer { child, port, dir })
    }
}

fn tls_connector(pki: &Path) -> anyhow::Result<tokio_rustls::TlsConnector> {
    h2::tls_connector(pki)
}

const POOLS: &str = "/apis/worker.gpustack.ai/v1/kvcachepools";

fn pool_body(i: usize) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCachePool",
        "metadata": {"name": format!("pool-{i:05}"), "labels": {"bench": "server"}},
        "spec": {"backends": ["mooncake-dram"], "quota": {"total": "16Gi"}},
    }))
    .unwrap_or_default()
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

async fn wait_ready(tls: &tokio_rustls::TlsConnector, port: u16) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if let Ok(mut c) = Client::connect(&endpoint(tls, port)).await
            && let Ok((200, _)) = c.send("GET", "/readyz", "application/json", Vec::new()).await
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("kv-apiserver did not become ready")
}

async fn creates(tls: &tokio_rustls::TlsConnector, port: u16) -> anyhow::Result<f64> {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let mut set = JoinSet::new();
    let shared = Client::connect(&endpoint(tls, port)).await?;
    for _ in 0..WRITERS {
        let mut c = shared.clone();
        let next = next.clone();
        set.spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= OBJECTS {
                    return anyhow::Ok(());
                }
                let (code, body) = c.send("POST", POOLS, "application/json", pool_body(i)).await?;
                if code != 201 {
                    bail!("create returned {code}: {}", String::from_utf8_lossy(&body));
                }
            }
        });
    }
    while let Some(r) = set.join_next().await {
        r??;
    }
    Ok(OBJECTS as f64 / started.elapsed().as_secs_f64())
}

async fn etcd_puts(scratch: &Path, value_bytes: usize) -> anyhow::Result<f64> {
    let mut server = etcd::EtcdServer::start(scratch)?;
    let client = server.connect().await?;
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let value = vec![b'x'; value_bytes];
    let started = Instant::now();
    let mut set = JoinSet::new();
    for _ in 0..WRITERS {
        let mut c = client.clone();
        let next = next.clone();
        let value = value.clone();
        set.spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= OBJECTS {
                    return anyhow::Ok(());
                }
                c.put(format!("/registry/bench/pool-{i:05}"), value.clone(), None)
                    .await?;
            }
        });
    }
    while let Some(r) = set.join_next().await {
        r??;
    }
    let rate = OBJECTS as f64 / started.elapsed().as_secs_f64();
    drop(client);
    server.stop()?;
    Ok(rate)
}

async fn gets(tls: &tokio_rustls::TlsConnector, port: u16) -> anyhow::Result<(Duration, Duration, f64, f64)> {
    let mut c = Client::connect(&endpoint(tls, port)).await?;
    for i in 0..GET_WARM_UP {
        c.send(
            "GET",
            &format!("{POOLS}/pool-{:05}", i % OBJECTS),
            "application/json",
            Vec::new(),
        )
        .await?;
    }
    let mut lat = Vec::with_capacity(GETS);
    let started = Instant::now();
    for i in 0..GETS {
        let t = Instant::now();
        let (code, _) = c
            .send(
                "GET",
                &format!("{POOLS}/pool-{:05}", i % OBJECTS),
                "application/json",
                Vec::new(),
            )
            .await?;
        lat.push(t.elapsed());
        if code != 200 {
            bail!("get returned {code}");
        }
    }
    let serial_rate = GETS as f64 / started.elapsed().as_secs_f64();
    lat.sort();
    let started = Instant::now();
    let mut set = JoinSet::new();
    let shared = Client::connect(&endpoint(tls, port)).await?;
    for w in 0..WRITERS {
        let mut c = shared.clone();
        set.spawn(async move {
            for i in 0..GETS / WRITERS {
                c.send(
                    "GET",
                    &format!("{POOLS}/pool-{:05}", (w * 97 + i) % OBJECTS),
                    "application/json",
                    Vec::new(),
                )
                .await?;
            }
            anyhow::Ok(())
        });
    }
    while let Some(r) = set.join_next().await {
        r??;
    }
    let parallel_rate = (GETS / WRITERS * WRITERS) as f64 / started.elapsed().as_secs_f64();
    Ok((
        percentile(&lat, 0.5),
        percentile(&lat, 0.99),
        serial_rate,
        parallel_rate,
    ))
}

async fn list(tls: &tokio_rustls::TlsConnector, port: u16) -> anyhow::Result<(Duration, usize, usize)> {
    let mut c = Client::connect(&endpoint(tls, port)).await?;
    let mut times = Vec::new();
    let mut items = 0;
    let mut bytes = 0;
    for _ in 0..5 {
        let t = Instant::now();
        let (code, body) = c.send("GET", POOLS, "application/json", Vec::new()).await?;
        times.push(t.elapsed());
        if code != 200 {
            bail!("list returned {code}");
        }
        let v: serde_json::Value = serde_json::from_slice(&body)?;
        items = v["items"].as_array().map_or(0, Vec::len);
        bytes = body.len();
    }
    times.sort();
    Ok((times[times.len() / 2], items, bytes))
}

async fn watch_latency(tls: &tokio_rustls::TlsConnector, port: u16) -> anyhow::Result<(Duration, Duration, usize)> {
    let load = h2::WatchLoad {
        readers: WATCHERS,
        stalled: 0,
        updates: UPDATES,
    };
    let d = h2::watch_latency(&endpoint(tls, port), POOLS, load).await?;
    Ok((d.p50, d.p99, d.delivered))
}

/// Our server as the admin reaches it (its certificate is for localhost).
fn endpoint(tls: &tokio_rustls::TlsConnector, port: u16) -> h2::Endpoint {
    h2::Endpoint {
        port,
        server_name: "localhost".into(),
        tls: tls.clone(),
    }
}

fn main() -> anyhow::Result<()> {
    let scratch = etcd::scratch_dir()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    println!(
        "kv-apiserver over HTTPS (HTTP/2 as kubectl uses it, one connection per client process, client certificates), data on disk under {}",
        scratch.display()
    );
    println!("clients: tokio runtime with 2 worker threads in this process; server and etcd share the same 2 cores");
    println!();

    // Creates: ROUNDS alternations of a fresh server and a fresh etcd, so both see the same
    // background; the median of each side and of the per-round ratios is reported.
    let mut ours = Vec::new();
    let mut theirs = Vec::new();
    let mut ratios = Vec::new();
    let mut last = None;
    for round in 1..=ROUNDS {
        let server = ApiServer::start(&scratch, None)?;
        let tls = server.connector()?;
        runtime.block_on(wait_ready(&tls, server.port))?;
        let created = runtime.block_on(creates(&tls, server.port))?;
        let stored_bytes = {
            let mut c = runtime.block_on(Client::connect(&endpoint(&tls, server.port)))?;
            let (_, body) =
                runtime.block_on(c.send("GET", &format!("{POOLS}/pool-00000"), "application/json", Vec::new()))?;
            body.len()
        };
        let etcd_rate = runtime.block_on(etcd_puts(&scratch, stored_bytes))?;
        println!(
            "creates round {round}: kv-apiserver {created:.0}/s, etcd {etcd_rate:.0}/s ({stored_bytes}-byte values), ratio {:.2}x",
            created / etcd_rate
        );
        ours.push(created);
        theirs.push(etcd_rate);
        ratios.push(created / etcd_rate);
        last = Some((server, tls));
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!("creates ({OBJECTS} pools, {WRITERS} concurrent requests, median of {ROUNDS} rounds):");
    println!("  kv-apiserver creates/s end to end: {:>8.0}", median(&mut ours));
    println!("  etcd puts/s, same concurrency:     {:>8.0}", median(&mut theirs));
    println!("  ratio (median of rounds): {:.2}x", median(&mut ratios));
    println!();
    let Some((server, tls)) = last else { bail!("no rounds") };
    // Let the store settle (its log may compact after the burst of writes) before timing reads.
    std::thread::sleep(Duration::from_secs(1));
    reads(&runtime, &server, &tls)?;
    drop(server);

    // The same API on the etcd storage (one round), beside raw etcd puts in the same run.
    println!("== the same server on the etcd storage (--storage etcd://...)");
    let mut store = etcd::EtcdServer::start(&scratch)?;
    runtime.block_on(store.connect())?;
    let url = format!("etcd://{}", store.endpoint().trim_start_matches("http://"));
    let server = ApiServer::start(&scratch, Some(&url))?;
    let tls = server.connector()?;
    runtime.block_on(wait_ready(&tls, server.port))?;
    let created = runtime.block_on(creates(&tls, server.port))?;
    let etcd_rate = runtime.block_on(etcd_puts(&scratch, 566))?;
    println!("creates ({OBJECTS} pools, {WRITERS} concurrent requests, one round):");
    println!("  kv-apiserver on etcd creates/s end to end: {created:>8.0}");
    println!("  etcd puts/s, same concurrency:             {etcd_rate:>8.0}");
    println!("  ratio: {:.2}x", created / etcd_rate);
    println!();
    std::thread::sleep(Duration::from_secs(1));
    reads(&runtime, &server, &tls)?;
    drop(server);
    drop(store);
    println!(
        "goals: creates >= etcd puts at the same concurrency; get p99 < 1 ms; list of 10,000 < 50 ms; watch p99 < 20 ms"
    );
    Ok(())
}

/// Gets, the list of every pool and watch latency against `server`.
fn reads(
    runtime: &tokio::runtime::Runtime,
    server: &ApiServer,
    tls: &tokio_rustls::TlsConnector,
) -> anyhow::Result<()> {
    let tls = tls.clone();

    let (p50, p99, serial, parallel) = runtime.block_on(gets(&tls, server.port))?;
    println!("gets ({GETS} by name):");
    println!(
        "  one client:  p50 {:.0} us, p99 {:.0} us, {serial:.0} gets/s",
        us(p50),
        us(p99)
    );
    println!("  {WRITERS} clients: {parallel:.0} gets/s");
    println!();

    let (median, items, bytes) = runtime.block_on(list(&tls, server.port))?;
    println!(
        "list: {items} pools ({bytes} bytes of JSON) in {:.1} ms (median of 5)",
        median.as_secs_f64() * 1e3
    );
    println!();

    let (wp50, wp99, n) = runtime.block_on(watch_latency(&tls, server.port))?;
    println!("watch ({WATCHERS} watchers x {UPDATES} updates = {n} deliveries, from write start to event):");
    println!(
        "  p50 {:.2} ms, p99 {:.2} ms",
        wp50.as_secs_f64() * 1e3,
        wp99.as_secs_f64() * 1e3
    );
    println!();
    Ok(())
}
