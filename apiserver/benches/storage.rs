//! Durable write throughput of the embedded storage against etcd, on the same disk.
//!
//! Run with `cargo bench -p kvcache-apiserver --bench storage`. For each number of concurrent
//! writers it measures, after a short warm-up and for a fixed time:
//! - **ours**: `Embedded` in a fresh directory, each writer creating fresh keys (a transaction
//!   that requires the key to be absent) with ~1 KiB values;
//! - **etcd**: a fresh single-member `/usr/bin/etcd` on 127.0.0.1, each writer putting fresh keys
//!   with values of the same size through a clone of one `etcd_client::Client`.
//!
//! Both are durable: etcd fsyncs its WAL before it answers a put, ours fdatasyncs its log before
//! it acknowledges a create. Both run their clients on a tokio runtime with 2 worker threads, and
//! both keep their data under Cargo's target tmp directory (refused if that is tmpfs). This is a
//! report, not a test: nothing is asserted about the numbers.

#[path = "support/etcd.rs"]
mod etcd;

use std::future::Future;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use etcd::{ETCD, EtcdServer, filesystem_of, scratch_dir};
use kvcache_apiserver::storage::embedded::{Embedded, Options};
use kvcache_apiserver::storage::{Compare, Op, Storage, Txn, TxnOutcome, Value};
use tokio::runtime::Runtime;
use tokio::task::JoinSet;

const LEVELS: [usize; 3] = [1, 8, 64];
const VALUE_BYTES: usize = 1024;
const WARM_UP: Duration = Duration::from_millis(500);
const MEASURE: Duration = Duration::from_secs(3);

fn main() -> anyhow::Result<()> {
    ensure!(
        Path::new(ETCD).exists(),
        "{ETCD} is missing: install it with `apt-get install etcd-server` to run this benchmark"
    );
    let scratch = scratch_dir()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    print_header(&scratch)?;

    let mut rows = Vec::new();
    for writers in LEVELS {
        let ours = bench_ours(&runtime, &scratch, writers).context("benchmarking the embedded storage")?;
        let etcd = bench_etcd(&runtime, &scratch, writers).context("benchmarking etcd")?;
        eprintln!("  {writers} writers: ours {ours:.0} creates/s, etcd {etcd:.0} puts/s");
        rows.push((writers, ours, etcd));
    }
    print_table(&rows);
    Ok(())
}

fn print_header(scratch: &Path) -> anyhow::Result<()> {
    let (mount, fs_type) = filesystem_of(scratch)?;
    let version = Command::new(ETCD)
        .arg("--version")
        .output()
        .context("running etcd --version")?;
    let version = String::from_utf8_lossy(&version.stdout);
    println!("durable create throughput: embedded storage vs etcd");
    println!(
        "  etcd:    {ETCD}, {}",
        version.lines().next().unwrap_or("unknown version")
    );
    println!(
        "  data:    {} ({fs_type} mounted at {mount}), a fresh directory per run",
        scratch.display()
    );
    println!("  load:    {VALUE_BYTES}-byte values on distinct keys, {WARM_UP:?} warm-up then {MEASURE:?} measured");
    println!("  clients: tokio multi-thread runtime with 2 worker threads for both sides");
    Ok(())
}

fn print_table(rows: &[(usize, f64, f64)]) {
    println!();
    println!("writers | ours creates/s | etcd puts/s | ours/etcd");
    println!("------- | -------------- | ----------- | ---------");
    for (writers, ours, etcd) in rows {
        println!("{writers:>7} | {ours:>14.0} | {etcd:>11.0} | {:>8.2}x", ours / etcd);
    }
    println!();
    println!(
        "Both sides are durable: etcd fsyncs its WAL before it answers a put; ours fdatasyncs its \
         log before it acknowledges a create (and a create also checks that the key is absent)."
    );
}

/// One writer's handle on a store under test.
trait Creator: Send + 'static {
    /// Durably writes `key`, which has not been written before.
    fn create(&mut self, key: String, value: Value) -> impl Future<Output = anyhow::Result<()>> + Send;
}

/// Runs one task per creator, each writing fresh keys back to back until the measured window
/// ends; returns the writes per second completed inside the window.
async fn drive<C: Creator>(creators: Vec<C>) -> anyhow::Result<f64> {
    let measure_from = Instant::now() + WARM_UP;
    let end = measure_from + MEASURE;
    let value: Value = vec![b'v'; VALUE_BYTES].into();
    let mut tasks = JoinSet::new();
    for (writer, mut creator) in creators.into_iter().enumerate() {
        let value = value.clone();
        tasks.spawn(async move {
            let mut counted = 0u64;
            let mut seq = 0u64;
            while Instant::now() < end {
                creator.create(format!("/bench/{writer}/{seq}"), value.clone()).await?;
                seq += 1;
                let done = Instant::now();
                if done >= measure_from && done < end {
                    counted += 1;
                }
            }
            anyhow::Ok(counted)
        });
    }
    let mut total = 0u64;
    while let Some(result) = tasks.join_next().await {
        total += result.context("a writer task panicked")??;
    }
    Ok(total as f64 / MEASURE.as_secs_f64())
}

struct Ours(Arc<Embedded>);

impl Creator for Ours {
    fn create(&mut self, key: String, value: Value) -> impl Future<Output = anyhow::Result<()>> + Send {
        let storage = self.0.clone();
        async move {
            let txn = Txn {
                compares: vec![Compare::ModRevision {
                    key: key.clone(),
                    revision: 0,
                }],
                ops: vec![Op::Put {
                    key: key.clone(),
                    value,
                }],
            };
            match storage.txn(txn).await? {
                TxnOutcome::Committed { .. } => Ok(()),
                TxnOutcome::CompareFailed { .. } => bail!("{key} already exists"),
            }
        }
    }
}

fn bench_ours(runtime: &Runtime, scratch: &Path, writers: usize) -> anyhow::Result<f64> {
    let dir = tempfile::Builder::new().prefix("ours-").tempdir_in(scratch)?;
    let storage = Arc::new(Embedded::open(dir.path(), Options::default())?);
    let creators = (0..writers).map(|_| Ours(storage.clone())).collect();
    let rate = runtime.block_on(drive(creators));
    // Dropping the last handle stops the committer before the directory is removed.
    drop(storage);
    rate
}

struct Etcd(etcd_client::Client);

impl Creator for Etcd {
    async fn create(&mut self, key: String, value: Value) -> anyhow::Result<()> {
        self.0.put(key, value.to_vec(), None).await?;
        Ok(())
    }
}

fn bench_etcd(runtime: &Runtime, scratch: &Path, writers: usize) -> anyhow::Result<f64> {
    let mut server = EtcdServer::start(scratch)?;
    let client = runtime.block_on(server.connect())?;
    let creators = (0..writers).map(|_| Etcd(client.clone())).collect();
    let rate = runtime.block_on(drive(creators));
    drop(client);
    server.stop()?;
    rate
}
