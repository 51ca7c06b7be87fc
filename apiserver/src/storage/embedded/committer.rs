//! The committer thread: group commit, file growth and compaction.
//!
//! It is the only writer of the log. Each round it takes every queued transaction (up to
//! `max_batch_bytes`), writes them as one frame, syncs once, then publishes: durable locations in
//! the index, the durable revision, acknowledgements, watch events. Between rounds it may grow
//! the file or compact the log into a new generation. A full disk sends it into [`wait_for_space`]
//! until a probe finds room again; any other failure stops writing for good ([`fail`]).

use std::fs;
use std::path::Path;
use std::sync::Arc;

use super::format::{self, BatchEncoder, FileHeader, SnapshotEntry};
use super::index::Loc;
use super::log_io;
use super::mmap::LogMap;
use super::{ActiveLog, Options, Queued, Shared, log_path, open_file, sync_dir};
use crate::storage::watch::{EventKind, WatchEvent};
use crate::storage::{Result, StorageError};

/// The longest a round waits for more transactions when the previous round was larger (see
/// [`run`]).
const LINGER: std::time::Duration = std::time::Duration::from_micros(250);
/// How often a full disk is probed for space.
const SPACE_PROBE: std::time::Duration = std::time::Duration::from_secs(1);
/// How long after a compaction ran out of space the next one is tried.
const COMPACT_RETRY: std::time::Duration = std::time::Duration::from_secs(30);

/// Why a round did not become durable.
enum CommitError {
    /// The disk is full; `needed` more bytes past the write offset would have been written.
    NoSpace { message: String, needed: u64 },
    /// Anything else: writing stops for good.
    Fatal(StorageError),
}

/// Whether `e` says the file system (or the user's quota) is full.
fn is_no_space(e: &std::io::Error) -> bool {
    // ENOSPC and EDQUOT
    matches!(
        e.kind(),
        std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
    )
}

fn storage_is_full(e: &StorageError) -> bool {
    matches!(e, StorageError::Io { source, .. } if is_no_space(source))
}

pub(super) fn run(shared: Arc<Shared>, mut log: ActiveLog) {
    let mut previous = 0usize;
    let mut compact_after = std::time::Instant::now();
    loop {
        let batch = {
            let mut q = shared.queue.lock();
            while q.txns.is_empty() && !q.closing {
                shared.queue_ready.wait(&mut q);
            }
            if q.txns.is_empty() {
                return;
            }
            // Group commit convoy: after a large round, its writers come back a few at a time
            // (each finishes its request first). Syncing for the first few would split the next
            // round in two; waiting briefly for the others keeps rounds large. A lone writer
            // (previous round of one) never waits.
            if q.txns.len() * 2 < previous {
                let deadline = std::time::Instant::now() + LINGER;
                while q.txns.len() * 2 < previous && !q.closing {
                    if shared.queue_ready.wait_until(&mut q, deadline).timed_out() {
                        break;
                    }
                }
            }
            let batch = take_batch(&mut q.txns, shared.options.max_batch_bytes);
            previous = batch.len();
            batch
        };
        match commit(&shared, &mut log, batch) {
            Ok(()) => {}
            Err(CommitError::NoSpace { message, needed }) => {
                if !wait_for_space(&shared, &mut log, &message, needed) {
                    return;
                }
                continue;
            }
            Err(CommitError::Fatal(e)) => {
                fail(&shared, e);
                continue;
            }
        }
        if std::time::Instant::now() >= compact_after && should_compact(&shared, &log) {
            match compact(&shared, &mut log) {
                Ok(()) => {}
                Err(e) if storage_is_full(&e) => {
                    tracing::warn!(error = %e, retry_in = ?COMPACT_RETRY, "compaction ran out of space; the log is unchanged");
                    compact_after = std::time::Instant::now() + COMPACT_RETRY;
                }
                Err(e) => fail(&shared, e),
            }
        }
    }
}

/// The disk is full: refuses and forgets every transaction not yet durable, refuses new ones
/// with `NoSpace`, and probes every [`SPACE_PROBE`] until `needed` bytes past the write offset
/// can be written and synced. Returns `false` if the storage closed meanwhile.
fn wait_for_space(shared: &Shared, log: &mut ActiveLog, message: &str, needed: u64) -> bool {
    tracing::error!(
        error = message,
        "storage is out of space; refusing writes until space returns"
    );
    {
        let mut st = shared.state.write();
        // under the state lock no transaction can be admitted (and queued) meanwhile
        let mut q = shared.queue.lock();
        for txn in q.txns.drain(..) {
            let _ = txn.done.send(Err(StorageError::NoSpace(message.to_owned())));
        }
        drop(q);
        let durable = st.durable;
        st.index.discard_after(durable);
        st.latest = durable;
        st.no_space = Some(message.to_owned());
    }
    shared.options.metrics.out_of_space.set(1);
    loop {
        {
            let mut q = shared.queue.lock();
            if q.closing {
                return false;
            }
            shared.queue_ready.wait_for(&mut q, SPACE_PROBE);
            if q.closing {
                return false;
            }
        }
        match probe_space(shared, log, needed) {
            Ok(()) => {
                shared.state.write().no_space = None;
                shared.options.metrics.out_of_space.set(0);
                tracing::info!("storage has space again; accepting writes");
                return true;
            }
            Err(e) if storage_is_full(&e) => {
                let msg = space_message(&e);
                shared.state.write().no_space = Some(msg);
            }
            Err(e) => {
                fail(shared, e);
                return true;
            }
        }
    }
}

/// Writes zeros over the next `needed` bytes of the log (growing it if they are past its end)
/// and syncs them: what the failed round needed.
fn probe_space(shared: &Shared, log: &mut ActiveLog, needed: u64) -> Result<()> {
    let to = log.write_offset + needed;
    if to > log.file_len {
        if let Some(map) = ensure_capacity(shared, log, to)? {
            shared.state.write().map = Arc::new(map);
        }
        return Ok(());
    }
    log_io::zero_fill(log.file.as_ref(), log.write_offset, to)
        .map_err(|e| StorageError::io(format!("writing {}", log.path.display()), e))
}

fn space_message(e: &StorageError) -> String {
    format!(
        "{e}; writes are refused until space is freed on its file system, then resume by themselves; reads still work"
    )
}

/// Takes transactions from the front of the queue until the batch is `max_bytes` large (always
/// at least one).
fn take_batch(queue: &mut std::collections::VecDeque<Queued>, max_bytes: usize) -> Vec<Queued> {
    let mut batch = Vec::new();
    let mut bytes = 0usize;
    while let Some(front) = queue.front() {
        let size: usize = front
            .ops
            .iter()
            .map(|o| 9 + o.key.len() + o.value.as_ref().map_or(0, |v| v.len() + 4))
            .sum::<usize>()
            + 12;
        if !batch.is_empty() && bytes + size > max_bytes {
            break;
        }
        bytes += size;
        batch.extend(queue.pop_front());
    }
    batch
}

/// One round: the batch written as one frame and synced once, then published (index, durable
/// revision, acknowledgements, watch events). Nothing is published unless the sync succeeded.
fn commit(shared: &Shared, log: &mut ActiveLog, batch: Vec<Queued>) -> Result<(), CommitError> {
    let mut enc = BatchEncoder::new();
    for txn in &batch {
        enc.push_txn(txn.revision, txn.ops.iter().map(|o| (&*o.key, o.value.as_deref())));
    }
    let frame_offset = log.write_offset;
    let (frame, spans) = enc.finish();
    let frame_len = frame.len() as u64;
    let written = write_frame(shared, log, &frame, frame_offset);
    if let Err(e) = &written
        && storage_is_full(e)
    {
        return Err(refuse_no_space(shared, log, batch, e, &frame, frame_offset));
    }
    let synced = written.and_then(|()| sync_log(shared, log));
    if let Err(e) = synced {
        // The queued transactions are not durable and never will be: refuse them all.
        let msg = format!("{e}; the server stops accepting writes for good (restart it once the disk is healthy)");
        refuse(
            &shared.state,
            batch,
            || StorageError::Unavailable(msg.clone()),
            |st| {
                st.failure.get_or_insert_with(|| msg.clone());
            },
        );
        return Err(CommitError::Fatal(StorageError::Unavailable(msg)));
    }
    log.write_offset += frame_len;
    shared
        .options
        .metrics
        .log_bytes
        .set(i64::try_from(log.write_offset).unwrap_or(i64::MAX));
    publish_durable(shared, &batch, &spans, frame_offset);
    acknowledge(shared, batch);
    Ok(())
}

/// Writes the frame at `frame_offset`, growing the file (and its mapping) first if it does not fit.
fn write_frame(shared: &Shared, log: &mut ActiveLog, frame: &[u8], frame_offset: u64) -> Result<()> {
    ensure_capacity(shared, log, frame_offset + frame.len() as u64).and_then(|grown| {
        if let Some(map) = grown {
            // it maps only zeros past the write offset, which no reader reaches yet
            shared.state.write().map = Arc::new(map);
        }
        log.file
            .write_at(frame, frame_offset)
            .map_err(|e| StorageError::io(format!("writing {}", log.path.display()), e))
    })
}

/// A round that ran out of space: refuses its transactions, zeroes what it wrote if it can, and
/// says how many bytes it needed.
fn refuse_no_space(
    shared: &Shared,
    log: &ActiveLog,
    batch: Vec<Queued>,
    e: &StorageError,
    frame: &[u8],
    frame_offset: u64,
) -> CommitError {
    let frame_len = frame.len() as u64;
    // Nothing of this round was synced: it, and everything queued behind it, is refused
    // (by `wait_for_space`) and forgotten. Whatever part of the frame reached the page cache
    // lies past the write offset and is overwritten by the next round; zero it if we can.
    let message = space_message(e);
    refuse(
        &shared.state,
        batch,
        || StorageError::NoSpace(message.clone()),
        |st| st.no_space = Some(message.clone()),
    );
    if frame_offset + frame_len <= log.file_len {
        let _ = log.file.write_at(&vec![0u8; frame.len()], frame_offset);
    }
    CommitError::NoSpace {
        message,
        needed: frame_len,
    }
}

/// Syncs the log's data (timed into the fsync metric).
fn sync_log(shared: &Shared, log: &ActiveLog) -> Result<()> {
    let started = std::time::Instant::now();
    let synced = log.file.sync_data();
    shared
        .options
        .metrics
        .fsync_duration
        .observe(started.elapsed().as_secs_f64());
    synced.map_err(|e| StorageError::io(format!("syncing {}", log.path.display()), e))
}

/// Publishes a synced round: the values' durable locations in the index, then the durable
/// revision.
fn publish_durable(shared: &Shared, batch: &[Queued], spans: &[(u32, u32)], frame_offset: u64) {
    let value_base = frame_offset + format::FRAME_HEADER_LEN as u64;
    let last_revision = batch.last().map_or(0, |t| t.revision);
    {
        let mut st = shared.state.write();
        let mut spans = spans.iter();
        for txn in batch {
            for op in &txn.ops {
                if op.value.is_some()
                    && let Some(&(at, len)) = spans.next()
                {
                    st.index
                        .set_durable(&op.key, txn.revision, value_base + u64::from(at), len);
                }
            }
        }
        st.durable = last_revision;
    }
    shared.durable_tx.send_replace(last_revision);
}

/// Acknowledges a durable round's transactions and publishes their watch events.
fn acknowledge(shared: &Shared, batch: Vec<Queued>) {
    let mut events = Vec::new();
    for txn in batch {
        for op in &txn.ops {
            let prev_value = op.prev.as_ref().and_then(|p| p.resolve());
            let (kind, value) = match &op.value {
                Some(v) => (EventKind::Put, v.clone()),
                None => (
                    EventKind::Delete,
                    prev_value.clone().unwrap_or_else(|| Arc::from(&[][..])),
                ),
            };
            events.push(WatchEvent {
                kind,
                key: op.key.to_string(),
                revision: txn.revision,
                value,
                prev_value,
                create_revision: op.create_revision,
            });
        }
        shared
            .options
            .metrics
            .commit_duration
            .observe(txn.queued_at.elapsed().as_secs_f64());
        let _ = txn.done.send(Ok(txn.revision));
    }
    shared.hub.publish(events);
}

/// Grows the file (zero-filled and synced) so that `needed` bytes fit; returns the new mapping
/// when it grew.
fn ensure_capacity(shared: &Shared, log: &mut ActiveLog, needed: u64) -> Result<Option<LogMap>> {
    if needed <= log.file_len {
        return Ok(None);
    }
    let step = log.file_len.clamp(shared.options.initial_file_bytes, 256 << 20);
    let new_len = needed.div_ceil(step) * step;
    log_io::zero_fill(log.file.as_ref(), log.file_len, new_len)
        .map_err(|e| StorageError::io(format!("growing {}", log.path.display()), e))?;
    log.file_len = new_len;
    let map = LogMap::map(log.file.file(), new_len)
        .map_err(|e| StorageError::io(format!("mapping {}", log.path.display()), e))?;
    Ok(Some(map))
}

/// Records the refusal (`mark`) before any writer of `batch` hears of it, so that whoever learns
/// of the failure also finds the store refusing (and /readyz failing); then refuses them.
fn refuse(
    state: &parking_lot::RwLock<super::State>,
    batch: Vec<Queued>,
    error: impl Fn() -> StorageError,
    mark: impl FnOnce(&mut super::State),
) {
    mark(&mut state.write());
    for txn in batch {
        let _ = txn.done.send(Err(error()));
    }
}

fn fail(shared: &Shared, e: StorageError) {
    tracing::error!(error = %e, "storage write failed; refusing further writes");
    let mut st = shared.state.write();
    st.failure.get_or_insert_with(|| e.to_string());
    drop(st);
    // Refuse whatever is still queued: it can no longer become durable.
    let mut q = shared.queue.lock();
    for txn in q.txns.drain(..) {
        let _ = txn.done.send(Err(StorageError::Unavailable(e.to_string())));
    }
}

fn should_compact(shared: &Shared, log: &ActiveLog) -> bool {
    let used = log.write_offset;
    if used < shared.options.compact_min_bytes {
        return false;
    }
    let live = shared.state.read().index.live_bytes;
    used > 2 * live + format::FILE_HEADER_LEN
}

/// Writes a new generation holding a snapshot of the durable state, switches to it, and removes
/// the old file.
fn compact(shared: &Shared, log: &mut ActiveLog) -> Result<()> {
    // The committer is the only writer and is busy here, so the durable state cannot move.
    let (revision, entries, map) = {
        let st = shared.state.read();
        let entries: Vec<(Arc<str>, u64, u64, Loc)> = st
            .index
            .live_at(st.durable)
            .map(|(k, v)| (k.clone(), v.create_revision, v.mod_revision, v.loc.clone()))
            .collect();
        (st.durable, entries, st.map.clone())
    };
    let mut snapshot = Vec::with_capacity(entries.len());
    for (key, create_revision, mod_revision, loc) in &entries {
        let Loc::Disk { offset, len } = loc else {
            return Err(StorageError::Corrupt(format!(
                "durable version of {key} is not on disk"
            )));
        };
        let value = map.slice(*offset, *len as usize).ok_or_else(|| {
            StorageError::Corrupt(format!("the value of {key} points outside the log (offset {offset})"))
        })?;
        snapshot.push(SnapshotEntry {
            key,
            create_revision: *create_revision,
            mod_revision: *mod_revision,
            value,
        });
    }
    let generation = log.generation + 1;
    let (mut new_log, locations) = create_generation(&shared.dir, &shared.options, generation, revision, &snapshot)?;
    let relocations: Vec<(Arc<str>, (u64, u32))> = entries.iter().map(|e| e.0.clone()).zip(locations).collect();
    let new_map = LogMap::map(new_log.file.file(), new_log.file_len)
        .map_err(|e| StorageError::io(format!("mapping {}", new_log.path.display()), e))?;
    let old_len = log.write_offset;
    {
        let mut st = shared.state.write();
        let mut relocations = relocations.into_iter();
        // `live_at` and `compact` both walk keys in order, so relocations line up by key.
        let mut next = relocations.next();
        st.index.compact(revision, |key| {
            while let Some((k, at)) = &next {
                match (**k).cmp(key) {
                    std::cmp::Ordering::Less => next = relocations.next(),
                    std::cmp::Ordering::Equal => {
                        let r = *at;
                        next = relocations.next();
                        return Some(r);
                    }
                    std::cmp::Ordering::Greater => return None,
                }
            }
            None
        });
        st.map = Arc::new(new_map);
        st.compacted = revision;
    }
    let old_path = log.path.clone();
    std::mem::swap(log, &mut new_log);
    shared.options.metrics.compactions.inc();
    shared
        .options
        .metrics
        .log_bytes
        .set(i64::try_from(log.write_offset).unwrap_or(i64::MAX));
    let _ = fs::remove_file(&old_path);
    tracing::info!(
        generation,
        revision,
        keys = snapshot.len(),
        old_bytes = old_len,
        new_bytes = log.write_offset,
        "compacted the storage log"
    );
    Ok(())
}

/// Splits a snapshot into frames of at most ~4 MiB of payload.
fn snapshot_chunks<'a, 'b>(snapshot: &'a [SnapshotEntry<'b>]) -> Vec<&'a [SnapshotEntry<'b>]> {
    const CHUNK_BYTES: usize = 4 << 20;
    let mut chunks = Vec::new();
    let mut start = 0;
    let mut bytes = 0;
    for (i, e) in snapshot.iter().enumerate() {
        let size = e.key.len() + e.value.len() + 24;
        if i > start && bytes + size > CHUNK_BYTES {
            chunks.push(&snapshot[start..i]);
            start = i;
            bytes = 0;
        }
        bytes += size;
    }
    if start < snapshot.len() {
        chunks.push(&snapshot[start..]);
    }
    chunks
}

/// Creates generation `generation` holding `snapshot` at `revision`: written as `.tmp`, synced,
/// renamed into place, directory synced. Returns the log and where each snapshot value landed.
pub(super) fn create_generation(
    dir: &Path,
    options: &Options,
    generation: u64,
    revision: u64,
    snapshot: &[SnapshotEntry<'_>],
) -> Result<(ActiveLog, Vec<(u64, u32)>)> {
    let path = log_path(dir, generation);
    let tmp = path.with_extension("log.tmp");
    let created = write_generation(dir, options, generation, revision, snapshot, &path, &tmp);
    if created.is_err() {
        // a compaction that failed (a full disk) leaves the current log as it was, and no litter
        let _ = fs::remove_file(&tmp);
    }
    created
}

fn write_generation(
    dir: &Path,
    options: &Options,
    generation: u64,
    revision: u64,
    snapshot: &[SnapshotEntry<'_>],
    path: &Path,
    tmp: &Path,
) -> Result<(ActiveLog, Vec<(u64, u32)>)> {
    let file = open_file(tmp, options, true)?;
    let io = |e| StorageError::io(format!("writing {}", tmp.display()), e);
    let mut offset = format::FILE_HEADER_LEN;
    let mut frames = Vec::new();
    let mut locations = Vec::with_capacity(snapshot.len());
    for chunk in snapshot_chunks(snapshot) {
        let (frame, offsets) = format::encode_snapshot(revision, chunk);
        let base = offset + format::FRAME_HEADER_LEN as u64;
        for (e, at) in chunk.iter().zip(offsets) {
            locations.push((base + u64::from(at), e.value.len() as u32));
        }
        offset += frame.len() as u64;
        frames.push(frame);
    }
    let snapshot_end = offset;
    let header = FileHeader {
        generation,
        snapshot_revision: revision,
        snapshot_end,
    };
    let file_len = (snapshot_end + options.initial_file_bytes).div_ceil(1 << 16) * (1 << 16);
    log_io::zero_fill(file.as_ref(), 0, file_len).map_err(io)?;
    file.write_at(&header.encode(), 0).map_err(io)?;
    let mut at = format::FILE_HEADER_LEN;
    for frame in &frames {
        file.write_at(frame, at).map_err(io)?;
        at += frame.len() as u64;
    }
    file.sync_data().map_err(io)?;
    fs::rename(tmp, path).map_err(|e| StorageError::io(format!("renaming {}", tmp.display()), e))?;
    sync_dir(dir)?;
    let log = ActiveLog {
        file,
        path: path.to_path_buf(),
        generation,
        write_offset: snapshot_end,
        file_len,
    };
    Ok((log, locations))
}
