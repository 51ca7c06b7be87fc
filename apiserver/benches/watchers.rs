//! Watch latency when some clients stop reading: a thousand watchers on one object of the real
//! server, all reading, against 990 reading beside ten that never read (each on a connection of
//! its own, with a 64 KiB window), at the server's default queue of 1000 events per watcher.
//! The stalled ones are closed once their queues fill; the figure is how much the readers' p99
//! moves. Fresh servers alternate per round; medians are printed with the ratio.
//!
//! `cargo bench -p kvcache-apiserver --bench watchers`

#[path = "support/h2.rs"]
mod h2;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

const POOLS: &str = "/apis/worker.gpustack.ai/v1/kvcachepools";
const WATCHERS: usize = 1000;
const STALLED: usize = 10;
/// Enough to overflow a stalled watcher's window, body buffer and queue of 1000.
const UPDATES: usize = 1600;
const ROUNDS: usize = 3;

struct ApiServer {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
    endpoint: h2::Endpoint,
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl ApiServer {
    async fn start() -> anyhow::Result<ApiServer> {
        let dir = tempfile::tempdir()?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let child = Command::new(env!("CARGO_BIN_EXE_kv-apiserver"))
            .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--controllers=false"])
            .arg("--data-dir")
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting kv-apiserver")?;
        let pki = dir.path().join("pki");
        let deadline = Instant::now() + Duration::from_secs(20);
        while !pki.join("admin.key").exists() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let endpoint = h2::Endpoint {
            port,
            server_name: "localhost".into(),
            tls: h2::tls_connector(&pki)?,
        };
        let server = ApiServer {
            child,
            port,
            _dir: dir,
            endpoint,
        };
        while Instant::now() < deadline {
            if let Ok(mut c) = h2::Client::connect(&server.endpoint).await
                && let Ok((200, _)) = c.get("/readyz").await
            {
                return Ok(server);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!("kv-apiserver on port {} did not become ready", server.port)
    }

    async fn run(&self, stalled: usize) -> anyhow::Result<h2::WatchDelivery> {
        let mut c = h2::Client::connect(&self.endpoint).await?;
        let pool = serde_json::json!({
            "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCachePool",
            "metadata": {"name": "pool-00000"},
            "spec": {"backends": ["mooncake-dram"], "quota": {"total": "16Gi"}},
        });
        let (code, body) = c
            .send("POST", POOLS, "application/json", serde_json::to_vec(&pool)?)
            .await?;
        anyhow::ensure!(
            code == 201,
            "create returned {code}: {}",
            String::from_utf8_lossy(&body)
        );
        let load = h2::WatchLoad {
            readers: WATCHERS - stalled,
            stalled,
            updates: UPDATES,
        };
        let d = h2::watch_latency(&self.endpoint, POOLS, load).await?;
        anyhow::ensure!(d.in_order == load.readers, "a reader missed an event");
        let (_, metrics) = c.get("/metrics").await?;
        let closed: u64 = String::from_utf8_lossy(&metrics)
            .lines()
            .filter(|l| l.starts_with("apiserver_terminated_watchers_total"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum();
        anyhow::ensure!(closed == stalled as u64, "{closed} watchers closed, {stalled} stalled");
        Ok(d)
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    println!("{WATCHERS} watchers on one object, {UPDATES} updates about every 5 ms; server and clients share 2 cores");
    let (mut base, mut with) = (Vec::new(), Vec::new());
    for round in 1..=ROUNDS {
        for (stalled, into) in [(0, &mut base), (STALLED, &mut with)] {
            let d = runtime.block_on(async { ApiServer::start().await?.run(stalled).await })?;
            println!(
                "round {round}: {} readers, {stalled} stalled: p50 {:.2} ms, p99 {:.2} ms",
                WATCHERS - stalled,
                ms(d.p50),
                ms(d.p99)
            );
            into.push(d);
        }
    }
    let median = |v: &mut Vec<h2::WatchDelivery>, f: fn(&h2::WatchDelivery) -> Duration| {
        let mut x: Vec<Duration> = v.iter().map(f).collect();
        x.sort();
        x[x.len() / 2]
    };
    let (b50, b99) = (median(&mut base, |d| d.p50), median(&mut base, |d| d.p99));
    let (w50, w99) = (median(&mut with, |d| d.p50), median(&mut with, |d| d.p99));
    println!("median of {ROUNDS} rounds:");
    println!(
        "  all reading:           p50 {:>8.2} ms  p99 {:>8.2} ms",
        ms(b50),
        ms(b99)
    );
    println!(
        "  with {STALLED} stalled, closed: p50 {:>8.2} ms  p99 {:>8.2} ms",
        ms(w50),
        ms(w99)
    );
    println!(
        "  readers' p99 with stalled watchers / without: {:.2}x",
        w99.as_secs_f64() / b99.as_secs_f64()
    );
    Ok(())
}
