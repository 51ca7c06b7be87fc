//! `kvcache-storage-writer`: a write load that exists to exercise the crash safety of the embedded
//! storage. Kill it at any moment and every write it acknowledged must still be there.
//!
//! ```text
//! kvcache-storage-writer --dir <DIR> --writers <N> --value-bytes <B> [--tag <T>]
//!                        [--churn <R>] [--compact-min-bytes <BYTES>]
//! ```
//!
//! It opens the embedded storage in `DIR` and runs `N` concurrent writers until it is killed.
//! Writer `w` creates the keys `/crash/<T>/<w>/0`, `/crash/<T>/<w>/1`, ... one at a time, each as
//! a create (the transaction requires the key to be absent). It never exits on its own; it stops
//! with an error only if the storage fails, a key already exists (reuse of a tag in the same
//! directory) or stdout is closed.
//!
//! With `--churn R`, each writer also rewrites its own scratch key `/churn/<T>/<w>` R times
//! after every create. The rewrites make the log grow faster than the live data, so (with a small
//! `--compact-min-bytes`) the storage compacts often and a kill can land in the middle of a
//! compaction. Scratch keys follow the same value contract and are not acknowledged.
//!
//! # Output contract
//!
//! After each create is acknowledged as committed (and therefore durable), one line
//! `ACK <key> <revision>` is written to stdout and flushed before the writer's next create. A line
//! is written whole, under the stdout lock, so lines never interleave. Nothing else goes to
//! stdout; diagnostics go to stderr (`RUST_LOG` sets their level, `warn` by default).
//!
//! # Value contract
//!
//! The value of a key is the key's bytes repeated and cut to exactly `B` bytes, so a checker can
//! recompute it from the key alone (`B = 0` gives an empty value).

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail, ensure};
use clap::Parser;
use kvcache_apiserver::storage::embedded::{Embedded, Options};
use kvcache_apiserver::storage::{Compare, Op, Storage, Txn, TxnOutcome, Value};
use tokio::task::JoinSet;

/// Creates keys under `/crash/<tag>/` from concurrent writers until killed, printing
/// `ACK <key> <revision>` for every durable create.
#[derive(Debug, Parser)]
#[command(name = "kvcache-storage-writer", version)]
struct Args {
    /// Data directory of the embedded storage (created if missing).
    #[arg(long)]
    dir: PathBuf,
    /// Number of concurrent writers.
    #[arg(long, default_value_t = 16)]
    writers: usize,
    /// Size of every value in bytes.
    #[arg(long, default_value_t = 1024)]
    value_bytes: usize,
    /// Distinguishes the keys of this run from earlier runs in the same directory.
    #[arg(long, default_value = "run")]
    tag: String,
    /// Rewrites of a per-writer scratch key after every create, so the log needs compaction.
    #[arg(long, default_value_t = 0)]
    churn: u32,
    /// Compact the log once it exceeds this size (and twice the live data).
    #[arg(long)]
    compact_min_bytes: Option<u64>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    init_tracing();
    let args = Args::parse();
    ensure!(args.writers > 0, "--writers must be at least 1");
    ensure!(
        !args.tag.is_empty() && !args.tag.contains('/'),
        "--tag must be non-empty and must not contain '/' (it is one key segment)"
    );
    let mut options = Options::default();
    if let Some(bytes) = args.compact_min_bytes {
        options.compact_min_bytes = bytes;
    }
    let storage =
        Embedded::open(&args.dir, options).with_context(|| format!("opening the storage in {}", args.dir.display()))?;
    let storage = Arc::new(storage);

    let mut writers = JoinSet::new();
    for writer in 0..args.writers {
        let storage = storage.clone();
        let prefix = format!("/crash/{}/{writer}/", args.tag);
        let scratch = format!("/churn/{}/{writer}", args.tag);
        writers.spawn(write_forever(storage, prefix, scratch, args.churn, args.value_bytes));
    }
    // Writers only return on failure; the first one that does ends the process.
    match writers.join_next().await {
        Some(Ok(Err(e))) => Err(e),
        Some(Err(e)) => Err(e).context("a writer task panicked"),
        Some(Ok(Ok(()))) | None => bail!("a writer stopped without an error"),
    }
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

/// Creates `<prefix>0`, `<prefix>1`, ... one after another, acknowledging each on stdout, and
/// rewrites `scratch` `churn` times after each create.
async fn write_forever(
    storage: Arc<Embedded>,
    prefix: String,
    scratch: String,
    churn: u32,
    value_bytes: usize,
) -> anyhow::Result<()> {
    for seq in 0u64.. {
        let key = format!("{prefix}{seq}");
        let revision = create(&storage, &key, value_for(&key, value_bytes)).await?;
        acknowledge(&key, revision)?;
        for _ in 0..churn {
            let txn = Txn {
                compares: vec![],
                ops: vec![Op::Put {
                    key: scratch.clone(),
                    value: value_for(&scratch, value_bytes),
                }],
            };
            storage.txn(txn).await.with_context(|| format!("rewriting {scratch}"))?;
        }
    }
    Ok(())
}

/// The value contract: the key's bytes repeated and cut to `len` bytes.
fn value_for(key: &str, len: usize) -> Value {
    key.bytes().cycle().take(len).collect()
}

/// Creates `key`, failing if it exists; returns the revision once the create is durable.
async fn create(storage: &Embedded, key: &str, value: Value) -> anyhow::Result<u64> {
    let txn = Txn {
        compares: vec![Compare::ModRevision {
            key: key.to_owned(),
            revision: 0,
        }],
        ops: vec![Op::Put {
            key: key.to_owned(),
            value,
        }],
    };
    match storage.txn(txn).await.with_context(|| format!("creating {key}"))? {
        TxnOutcome::Committed { revision } => Ok(revision),
        TxnOutcome::CompareFailed { .. } => {
            bail!("{key} already exists: use a --tag that was not used before in this directory")
        }
    }
}

/// Writes one whole `ACK` line under the stdout lock and flushes it.
fn acknowledge(key: &str, revision: u64) -> anyhow::Result<()> {
    let line = format!("ACK {key} {revision}\n");
    let mut out = std::io::stdout().lock();
    out.write_all(line.as_bytes())
        .and_then(|()| out.flush())
        .context("writing an acknowledgement to stdout")
}
