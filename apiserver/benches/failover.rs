//! How long the store is unusable when its serving leader goes away, with walkthrough steps 1,
//! 2 and 4 applied (three leader processes, two 8Gi members) on a fresh `kv-apiserver serve`
//! with the local runtime and the election's default timings:
//!
//! - crash failover: SIGKILL of the serving leader → the first put that succeeds through the
//!   backend's Client endpoint;
//! - graceful handover: SIGTERM of the serving leader (it stops serving and releases the
//!   Lease) → the first successful put.
//!
//! A put needs a leader that serves, members mounted at it, and the tenant's ledger entry
//! written by the pool controller, so this is the whole outage an engine sees. 20 of each;
//! p50 and p99 (nearest rank) are printed beside the reference store's ~16 s (its failover as
//! measured on a single-node test cluster). A report: nothing is asserted about the numbers.
//!
//! Run with `cargo build --release -p kvcache-store && cargo bench -p kvcache-apiserver --bench
//! failover`.

mod live;

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use kvcache_store::client::Client;
use kvcache_store::proto::HealthRequest;
use live::{client_endpoint, kubectl, leaders, manifest, scope, start, until};

const ROUNDS: usize = 20;
/// The reference store's failover on one node.
const REFERENCE: Duration = Duration::from_secs(16);

/// What dials the store: the local runtime serves it with TLS under the CA it keeps in `dir`.
fn tls(dir: &std::path::Path) -> Option<kvcache_store::tls::ClientTls> {
    kvcache_store::tls::ClientTls::load(
        &dir.join("store-tls/ca.crt"),
        Some("mooncake-dram.kvstore.internal".into()),
    )
    .ok()
}

/// The serving leader's address, from the Lease.
fn holder(dir: &std::path::Path) -> anyhow::Result<String> {
    let h = kubectl(
        dir,
        &[
            "-n",
            "kvcache-system",
            "get",
            "lease",
            "mooncake-dram-leader",
            "-o",
            "jsonpath={.spec.holderIdentity}",
        ],
    )?;
    if h.is_empty() {
        bail!("the Lease names no holder");
    }
    Ok(h)
}

/// The leader process listening on `addr`.
fn pid_of(dir: &std::path::Path, addr: &str) -> anyhow::Result<u32> {
    leaders(dir)
        .into_iter()
        .find(|(_, a)| a == addr)
        .map(|(p, _)| p)
        .with_context(|| format!("no leader process listens on {addr}"))
}

/// Whether all three replicas run, one serving and two standing by (after a kill, the
/// supervisor restarts a replica with back-off; a failover is measured with its standbys up).
async fn standbys_up(dir: &std::path::Path) -> bool {
    let mut roles = Vec::new();
    for (_, addr) in leaders(dir) {
        let Ok(endpoint) = kvcache_store::tls::grpc_endpoint(&addr, tls(dir).as_ref()) else {
            return false;
        };
        let Ok(channel) = endpoint.connect().await else {
            return false;
        };
        let mut c = kvcache_store::proto::control_client::ControlClient::new(channel);
        match c.health(HealthRequest {}).await {
            Ok(h) => roles.push(h.into_inner().role),
            Err(_) => return false,
        }
    }
    roles.sort();
    roles == ["leader", "standby", "standby"]
}

/// Waits until a leader serves through `front` with both members and a put succeeds, and its
/// two standbys stand by.
async fn whole(dir: &std::path::Path, front: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(90);
    while Instant::now() < deadline {
        if standbys_up(dir).await
            && let Ok(c) = Client::connect_tls(front, scope(dir), tls(dir)).await
            && let Ok(h) = c.control().health(HealthRequest {}).await
            && h.get_ref().serving
            && h.get_ref().members == 2
            && c.put("bench/warm", Bytes::from_static(b"warm")).await.is_ok()
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("the store did not become whole (a leader, two standbys, two members) within 90 s")
}

/// Sends `signal` to the serving leader; returns the time until a put through `front` succeeds
/// on a leader of a newer term (a put the stopping leader still answered does not count).
async fn outage(dir: &std::path::Path, front: &str, signal: &str, key: &str) -> anyhow::Result<Duration> {
    let before = holder(dir)?;
    let pid = pid_of(dir, &before)?;
    let client = Client::connect_tls(front, scope(dir), tls(dir)).await?;
    let epoch = client.control().health(HealthRequest {}).await?.into_inner().epoch;
    let value = Bytes::from(vec![7u8; 16 << 10]);
    let t0 = Instant::now();
    let killed = std::process::Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .context("running kill")?;
    if !killed.success() {
        bail!("kill {signal} {pid} failed");
    }
    let mut n = 0u64;
    while t0.elapsed() < Duration::from_secs(120) {
        n += 1;
        if client.put(&format!("{key}/{n}"), value.clone()).await.is_ok() {
            let t = t0.elapsed();
            let now = client
                .control()
                .health(HealthRequest {})
                .await
                .map(|h| h.into_inner().epoch);
            if now.is_ok_and(|e| e > epoch) {
                if holder(dir)? == before {
                    bail!(
                        "the leader {before} that got {signal} holds the Lease again; a standby was expected to take over"
                    );
                }
                return Ok(t);
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    bail!("no put succeeded on a new leader within 120 s of {signal}")
}

fn percentile(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    let rank = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

fn main() -> anyhow::Result<()> {
    if std::env::args().any(|a| a == "--list") {
        return Ok(());
    }
    let s = start()?;
    let d = s.dir.path();
    for file in ["01-backend.yaml", "02-pool-binding.yaml", "04-high-availability.yaml"] {
        kubectl(d, &["apply", "-f", &manifest(file).display().to_string()])?;
    }
    until(
        d,
        &["kvcb", "mooncake-dram"],
        "{.status.phase} {.status.capacity.total} {.status.leader.replicas}/{.status.leader.readyReplicas}",
        "Ready 16Gi 3/1",
    )?;
    let front = client_endpoint(d)?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    println!(
        "leader failover on the local runtime: 3 leader replicas, 2 members of 8Gi, default election timings (lease 2s, renew deadline 1.5s, retry 250ms); {ROUNDS} of each"
    );
    let mut report = Vec::new();
    for (name, signal) in [
        ("crash failover (SIGKILL)", "-KILL"),
        ("graceful handover (SIGTERM)", "-TERM"),
    ] {
        let mut times = Vec::new();
        for i in 0..ROUNDS {
            rt.block_on(whole(d, &front))?;
            let t = rt.block_on(outage(d, &front, signal, &format!("bench/{signal}/{i}")))?;
            println!("{name} {}: first successful put after {:.3} s", i + 1, t.as_secs_f64());
            times.push(t);
        }
        let (p50, p99) = (percentile(&mut times, 0.50), percentile(&mut times, 0.99));
        report.push(format!(
            "{name}: p50 {:.2} s, p99 {:.2} s (reference ~{} s: {:.1}x shorter at p50)",
            p50.as_secs_f64(),
            p99.as_secs_f64(),
            REFERENCE.as_secs(),
            REFERENCE.as_secs_f64() / p50.as_secs_f64().max(1e-3)
        ));
    }
    for line in report {
        println!("{line}");
    }
    Ok(())
}
