//! The embedded storage: one append-only log file, read through a memory map.
//!
//! # Format contract
//!
//! The data directory holds `LOCK` (held with `flock` while open, so one process owns the data)
//! and one log file `wal-<generation>.log` (16 hex digits). A log file is:
//!
//! ```text
//! file header (64 bytes)   magic "KVCSWAL\0", format version, header length, generation,
//!                          snapshot revision, snapshot end offset, crc32c of the above
//! snapshot frames          the live keys at the snapshot revision (after a compaction)
//! batch frames             one per group commit, each holding one or more transactions
//! zeros                    preallocated space
//! ```
//!
//! Every frame starts at a multiple of 8 with a 32-byte header: magic, kind, payload length,
//! crc32c of the payload, a revision, and a crc32c of the header itself. A transaction inside a
//! batch is its revision and its operations (put key value / delete key). The layout is pinned
//! by the tests in [`format`].
//!
//! # Commit
//!
//! A transaction is checked and assigned the next revision under the state lock, applied to the
//! in-memory index as *pending* (invisible to reads), and queued. One committer thread takes
//! everything queued, writes it as one frame, calls `fdatasync` once (group commit: many
//! concurrent writers share one sync), and only then marks the versions durable, acknowledges
//! the writers and publishes watch events. A write is never acknowledged before its sync.
//!
//! # Recovery
//!
//! On open the newest generation is replayed ([`recovery`]). A damaged last frame with nothing
//! valid after it is a torn tail from a crash mid-commit: it was never acknowledged, so its bytes
//! are zeroed and the log continues from there. Damage followed by valid frames, or inside the
//! snapshot, is a corrupt middle: opening fails with an error naming the file and offset.
//!
//! # Compaction
//!
//! When the log outgrows both `compact_min_bytes` and twice the live data, the committer writes
//! a new generation (`.tmp`, synced, renamed, directory synced) holding a snapshot of the live
//! keys, switches to it, and deletes the old file. Old versions kept for paged lists end there:
//! a list at an older revision answers `Expired`.
//!
//! # Invariants
//!
//! - Revisions in the log strictly increase; the newest durable revision is what reads see.
//! - Bytes a reader can reach are never rewritten (see [`mmap`] for why that matters).
//! - A failed sync, or a write that failed for any reason but a full disk, stops all further
//!   writes for good (after a failed `fdatasync` the kernel may have dropped dirty pages, so the
//!   page cache can no longer be trusted to match the disk); reads keep working from what is
//!   durable.
//! - A full disk (`ENOSPC`, `EDQUOT`) while writing or growing the log is not fatal: nothing of
//!   the failed round was synced, so its transactions and everything queued behind them are
//!   refused and forgotten (their pending versions leave the index, the revision counter goes
//!   back to the durable revision), writes are refused with [`StorageError::NoSpace`] and
//!   `health` fails, and the committer probes for space every second; when a probe can write
//!   and sync the room the failed round needed, writing resumes by itself. A compaction that
//!   runs out of space removes its temporary file and is retried later; the current log is
//!   untouched.
//!
//! # Disk assumptions
//!
//! `fdatasync` returns only when the data is on stable storage, and the directory entry of a
//! renamed file is durable after an `fsync` of the directory (Linux ext4/xfs semantics).

mod committer;
mod data_dir;
mod format;
mod index;
mod log_io;
mod mmap;
mod recovery;

#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use async_trait::async_trait;
use parking_lot::{Condvar, Mutex, RwLock};
use tokio::sync::{oneshot, watch};

use self::data_dir::{lock_dir, log_path, open_file, open_log, sync_dir};
use self::index::{Index, Loc, ValueRef};
use self::log_io::{FileWrapper, LogFile};
use self::mmap::LogMap;
use super::metrics::StorageMetrics;
use super::watch::Hub;
use super::{
    Compare, KeyValue, ListRequest, ListResponse, Op, Result, Storage, StorageError, Txn, TxnOutcome, Value,
    WatchStream,
};

/// Tuning of the embedded storage.
#[derive(Clone)]
pub struct Options {
    /// Events kept for watchers that start in the past.
    pub watch_history: usize,
    /// Events queued per watcher before it is closed as too slow.
    pub watch_queue: usize,
    /// Never compact a log smaller than this.
    pub compact_min_bytes: u64,
    /// Size of a new log file and the minimum growth step.
    pub initial_file_bytes: u64,
    /// Largest group commit, in payload bytes.
    pub max_batch_bytes: usize,
    /// Replaces the file I/O (tests inject faults with it).
    pub wrap_file: Option<FileWrapper>,
    /// Where commit, sync and compaction figures go.
    pub metrics: StorageMetrics,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            watch_history: 10_000,
            watch_queue: 1_000,
            compact_min_bytes: 64 << 20,
            initial_file_bytes: 4 << 20,
            max_batch_bytes: 8 << 20,
            wrap_file: None,
            metrics: StorageMetrics::default(),
        }
    }
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("watch_history", &self.watch_history)
            .field("watch_queue", &self.watch_queue)
            .field("compact_min_bytes", &self.compact_min_bytes)
            .field("initial_file_bytes", &self.initial_file_bytes)
            .field("max_batch_bytes", &self.max_batch_bytes)
            .finish()
    }
}

/// The embedded storage. Cheap to share behind an `Arc`; dropping it stops the committer after
/// it has written everything already queued.
pub struct Embedded {
    shared: Arc<Shared>,
    committer: Option<JoinHandle<()>>,
}

/// What readers, writers and the committer share.
struct Shared {
    dir: PathBuf,
    options: Options,
    state: RwLock<State>,
    queue: Mutex<Queue>,
    queue_ready: Condvar,
    durable_tx: watch::Sender<u64>,
    hub: Arc<Hub>,
    _lock: File,
}

struct State {
    index: Index,
    /// Last revision assigned (durable or not).
    latest: u64,
    /// Last revision on stable storage: what reads see.
    durable: u64,
    /// Lists at a revision below this answer `Expired`.
    compacted: u64,
    map: Arc<LogMap>,
    /// Set when a write or sync failed: no further writes are accepted.
    failure: Option<String>,
    /// Set while the disk is full: writes are refused until the committer finds space again.
    no_space: Option<String>,
}

#[derive(Default)]
struct Queue {
    txns: VecDeque<Queued>,
    closing: bool,
}

/// A transaction that has a revision and waits for the committer.
struct Queued {
    revision: u64,
    /// When it was queued, for the commit latency.
    queued_at: std::time::Instant,
    ops: Vec<QueuedOp>,
    done: oneshot::Sender<Result<u64>>,
}

struct QueuedOp {
    key: Arc<str>,
    /// `None` for a delete.
    value: Option<Value>,
    prev: Option<ValueRef>,
    create_revision: u64,
}

/// The log file the committer appends to.
struct ActiveLog {
    file: Arc<dyn LogFile>,
    path: PathBuf,
    generation: u64,
    write_offset: u64,
    file_len: u64,
}

impl Embedded {
    /// Opens (or creates) the storage in `dir`, replaying its log, with a watch hub of its own
    /// (sized by `options`).
    pub fn open(dir: impl AsRef<Path>, options: Options) -> Result<Embedded> {
        let hub = Arc::new(Hub::new(options.watch_history, options.watch_queue));
        Self::open_with_hub(dir, options, hub)
    }

    /// Opens (or creates) the storage in `dir`, publishing durable changes to `hub`.
    pub fn open_with_hub(dir: impl AsRef<Path>, options: Options, hub: Arc<Hub>) -> Result<Embedded> {
        let dir = dir.as_ref().to_path_buf();
        fs::create_dir_all(&dir).map_err(|e| StorageError::io(format!("creating {}", dir.display()), e))?;
        let lock = lock_dir(&dir)?;
        let (log, recovered, map) = open_log(&dir, &options)?;
        tracing::info!(
            dir = %dir.display(),
            generation = log.generation,
            revision = recovered.revision,
            keys = recovered.index.key_count(),
            frames = recovered.frames,
            "storage opened"
        );
        let (durable_tx, _) = watch::channel(recovered.revision);
        hub.start_after(recovered.revision);
        let shared = Arc::new(Shared {
            dir,
            hub,
            options,
            state: RwLock::new(State {
                index: recovered.index,
                latest: recovered.revision,
                durable: recovered.revision,
                compacted: recovered.snapshot_revision,
                map: Arc::new(map),
                failure: None,
                no_space: None,
            }),
            queue: Mutex::new(Queue::default()),
            queue_ready: Condvar::new(),
            durable_tx,
            _lock: lock,
        });
        let worker = shared.clone();
        let committer = std::thread::Builder::new()
            .name("storage-committer".into())
            .spawn(move || committer::run(worker, log))
            .map_err(|e| StorageError::io("starting the committer thread", e))?;
        Ok(Embedded {
            shared,
            committer: Some(committer),
        })
    }

    /// Watchers closed because they fell behind.
    pub fn closed_slow_watchers(&self) -> u64 {
        self.shared.hub.closed_slow_watchers()
    }

    fn check_compares(st: &State, compares: &[Compare]) -> bool {
        compares.iter().all(|c| match c {
            Compare::ModRevision { key, revision } => {
                let current = st
                    .index
                    .latest(key)
                    .filter(|v| v.is_live())
                    .map_or(0, |v| v.mod_revision);
                current == *revision
            }
            Compare::NoneNewer { prefix, revision } => !st.index.any_newer(prefix, *revision),
        })
    }

    fn read_value(map: &LogMap, loc: &Loc, key: &str) -> Result<Value> {
        match loc {
            Loc::Disk { offset, len } => map.slice(*offset, *len as usize).map(Value::from).ok_or_else(|| {
                StorageError::Corrupt(format!("the value of {key} points outside the log (offset {offset})"))
            }),
            Loc::Pending(v) => Ok(v.clone()),
            Loc::Tombstone => Err(StorageError::InvalidRequest(format!("{key} is deleted"))),
        }
    }
}

impl Drop for Embedded {
    fn drop(&mut self) {
        self.shared.queue.lock().closing = true;
        self.shared.queue_ready.notify_all();
        if let Some(handle) = self.committer.take() {
            let _ = handle.join();
        }
        self.shared.hub.close_all();
    }
}

#[async_trait]
impl Storage for Embedded {
    fn health(&self) -> Result<()> {
        let st = self.shared.state.read();
        if let Some(f) = &st.failure {
            return Err(StorageError::Unavailable(f.clone()));
        }
        match &st.no_space {
            Some(m) => Err(StorageError::NoSpace(m.clone())),
            None => Ok(()),
        }
    }

    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        let (version, map) = {
            let st = self.shared.state.read();
            match st.index.at(key, st.durable) {
                Some(v) if v.is_live() => (v.clone(), st.map.clone()),
                _ => return Ok(None),
            }
        };
        Ok(Some(KeyValue {
            key: key.to_owned(),
            value: Self::read_value(&map, &version.loc, key)?,
            create_revision: version.create_revision,
            mod_revision: version.mod_revision,
        }))
    }

    async fn list(&self, req: ListRequest) -> Result<ListResponse> {
        const CHUNK: usize = 256;
        let revision = {
            let st = self.shared.state.read();
            let rev = req.revision.unwrap_or(st.durable);
            if rev < st.compacted {
                return Err(StorageError::Expired {
                    requested: rev,
                    oldest: st.compacted,
                });
            }
            rev
        };
        if revision > self.current_revision().await? {
            self.wait_for_revision(revision).await?;
        }
        let limit = req.limit.filter(|l| *l > 0).unwrap_or(usize::MAX);
        let mut items = Vec::new();
        let mut after = req.start_after.clone();
        let mut more = false;
        'pages: loop {
            // Collect a chunk of candidate versions under the lock, read values outside it.
            let (chunk, map, exhausted) = {
                let st = self.shared.state.read();
                if revision < st.compacted {
                    return Err(StorageError::Expired {
                        requested: revision,
                        oldest: st.compacted,
                    });
                }
                let mut chunk = Vec::with_capacity(CHUNK);
                let mut exhausted = true;
                for (key, _) in st.index.range_from(&req.prefix, after.as_deref()) {
                    if chunk.len() == CHUNK {
                        exhausted = false;
                        break;
                    }
                    let v = st.index.at(key, revision).filter(|v| v.is_live()).cloned();
                    chunk.push((key.clone(), v));
                }
                (chunk, st.map.clone(), exhausted)
            };
            for (key, version) in chunk {
                after = Some(key.to_string());
                let Some(v) = version else { continue };
                let kv = KeyValue {
                    key: key.to_string(),
                    value: Self::read_value(&map, &v.loc, &key)?,
                    create_revision: v.create_revision,
                    mod_revision: v.mod_revision,
                };
                if req.filter.as_ref().is_some_and(|f| !f(&kv)) {
                    continue;
                }
                if items.len() == limit {
                    more = true;
                    break 'pages;
                }
                items.push(kv);
            }
            if exhausted {
                break;
            }
        }
        Ok(ListResponse { items, revision, more })
    }

    async fn txn(&self, txn: Txn) -> Result<TxnOutcome> {
        let shared = &self.shared;
        let rx = {
            let mut st = shared.state.write();
            if let Some(f) = &st.failure {
                return Err(StorageError::Unavailable(f.clone()));
            }
            if let Some(m) = &st.no_space {
                return Err(StorageError::NoSpace(m.clone()));
            }
            if let Some(key) = duplicate_key(&txn.ops) {
                return Err(StorageError::InvalidRequest(format!(
                    "the key {key} appears twice in one transaction"
                )));
            }
            if !Self::check_compares(&st, &txn.compares) {
                return Ok(TxnOutcome::CompareFailed { revision: st.latest });
            }
            let revision = st.latest + 1;
            let mut ops = Vec::with_capacity(txn.ops.len());
            for op in txn.ops {
                let (key, value) = match op {
                    Op::Put { key, value } => (key, Some(value)),
                    Op::Delete { key } => (key, None),
                };
                let prev = st.index.apply(&key, revision, value.clone());
                if prev.is_none() && value.is_none() {
                    continue; // deleting a key that does not exist
                }
                let prev_ref = prev.as_ref().map(|p| match &p.loc {
                    Loc::Pending(v) => ValueRef::Memory(v.clone()),
                    Loc::Disk { offset, len } => ValueRef::Mapped {
                        map: st.map.clone(),
                        offset: *offset,
                        len: *len,
                    },
                    Loc::Tombstone => unreachable!("apply returns live versions only"),
                });
                ops.push(QueuedOp {
                    key: Arc::from(key.as_str()),
                    value,
                    prev: prev_ref,
                    create_revision: prev.map_or(revision, |p| p.create_revision),
                });
            }
            if ops.is_empty() {
                return Ok(TxnOutcome::Committed { revision: st.latest });
            }
            st.latest = revision;
            let (tx, rx) = oneshot::channel();
            shared.queue.lock().txns.push_back(Queued {
                revision,
                queued_at: std::time::Instant::now(),
                ops,
                done: tx,
            });
            rx
        };
        shared.queue_ready.notify_one();
        match rx.await {
            Ok(Ok(revision)) => Ok(TxnOutcome::Committed { revision }),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(StorageError::Unavailable(
                "the storage was closed before the write completed".into(),
            )),
        }
    }

    async fn wait_for_revision(&self, revision: u64) -> Result<()> {
        let mut rx = self.shared.durable_tx.subscribe();
        {
            let st = self.shared.state.read();
            if revision > st.latest {
                return Err(StorageError::InvalidRequest(format!(
                    "revision {revision} is newer than the latest revision {}",
                    st.latest
                )));
            }
        }
        rx.wait_for(|d| *d >= revision)
            .await
            .map(|_| ())
            .map_err(|_| StorageError::Unavailable("the storage was closed".into()))
    }

    async fn current_revision(&self) -> Result<u64> {
        Ok(self.shared.state.read().durable)
    }

    async fn watch(&self, prefix: &str, after_revision: u64) -> Result<WatchStream> {
        self.shared.hub.subscribe(prefix, after_revision)
    }
}

fn duplicate_key(ops: &[Op]) -> Option<&str> {
    let mut keys: Vec<&str> = ops
        .iter()
        .map(|op| match op {
            Op::Put { key, .. } | Op::Delete { key } => key.as_str(),
        })
        .collect();
    keys.sort_unstable();
    keys.windows(2).find(|w| w[0] == w[1]).map(|w| w[0])
}
