//! The member's side of its disk tier (`tier`): it copies every value the leader sealed to the
//! tier in the background, applies the leader's loads (a value only on disk read back into
//! memory) and disk frees, and gathers what the next heartbeat tells the leader: the copies made
//! (so eviction from memory keeps the value) and the copies lost (the tier's own eviction when
//! full, or a record found damaged on a read).
//!
//! Every value goes to disk once, after its seal (the leader committed it), whether or not memory
//! will ever need the room: the copy is what a member restart and a leader failover keep, and
//! eviction from memory costs no write at the moment memory is short. A value freed before its
//! copy was made is skipped; one freed after is removed from disk when the leader says so.
//!
//! When the tier is full, its oldest file goes (FIFO at file granularity; or the least recently
//! appended to or read from, [`Policy::lru`]): the values in it are reported lost, and the
//! leader forgets those copies.
//!
//! Every mount hands the leader what the tier holds ([`Tiering::holdings`], kept in memory from
//! the scan at open and every change since); a record the leader does not adopt is removed
//! ([`Tiering::adopted`]).
//!
//! A member Pod's preStop hook waits on [`flushed`] (`GET /flushed`): until nothing is queued,
//! being copied, or copied and not yet reported, so the leader knows every copy before the
//! member is told to stop.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::mmap::WriteRange;
use super::segment::{LoadAt, Mismatch, Segment};
use super::tier::format::Header;
use super::tier::{DiskId, Found, ReadError, Tier, TierError};
use crate::proto::DiskHolding;

/// Most sealed values waiting for their copy; past it, the oldest are not copied (their values
/// stay in memory only, as without a tier) and counted.
pub const MAX_QUEUED: usize = 1 << 20;

/// How long `GET /flushed` waits (within a member Pod's 60 s grace, leaving the rest to the
/// stop itself).
pub const FLUSH_WAIT: Duration = Duration::from_secs(25);

/// How the tier makes room (`kv-store member --tier-*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// most values it holds (0: no limit but its capacity)
    pub key_limit: u64,
    /// when full, drop the oldest file (`true`) or take no more copies until values are freed
    pub evict: bool,
    /// `(high, low)` percent of capacity: past `high` after a batch, the oldest files go until
    /// `low` is reached
    pub watermark: Option<(u8, u8)>,
    /// what goes first: the least recently appended to or read from file (`true`), or the
    /// oldest (FIFO)
    pub lru: bool,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            key_limit: 0,
            evict: true,
            watermark: None,
            lru: false,
        }
    }
}

/// What the next heartbeat reports.
#[derive(Debug, Default)]
pub struct Report {
    /// copies made, with the allocation each was copied from
    pub spilled: Vec<(DiskHolding, u64)>,
    /// copies gone
    pub lost: Vec<u64>,
    /// of those, the ones a direct read could not serve
    pub failed_reads: Vec<u64>,
}

/// Counters for `/metrics`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TierCounts {
    pub copied: u64,
    pub skipped: u64,
    pub dropped_full: u64,
    pub loaded: u64,
    pub damaged: u64,
    pub failed: u64,
}

/// A member's disk tier and the work around it (see the module's doc).
#[derive(Debug)]
pub struct Tiering {
    tier: parking_lot::Mutex<Tier>,
    /// sealed values to copy: (mount, offset, allocation)
    queue: parking_lot::Mutex<VecDeque<(u64, u64, u64)>>,
    /// a batch taken from the queue is being copied (set under the queue's lock)
    copying: AtomicBool,
    wake: tokio::sync::Notify,
    report: parking_lot::Mutex<Report>,
    counts: parking_lot::Mutex<TierCounts>,
    /// every live record, as a mount hands it over (oldest first: by file, then position)
    records: parking_lot::Mutex<BTreeMap<u64, DiskHolding>>,
    policy: Policy,
    /// buffers of direct reads' pieces, kept for the next, and the pieces held (`direct.rs`)
    buffers: Arc<super::tier::PieceBuffers<{ direct::KEPT_BUFFERS }>>,
    pieces: Arc<tokio::sync::Semaphore>,
    /// the threads that read those pieces (`readers.rs`)
    readers: readers::Readers,
}

/// One load the leader asked for.
#[derive(Debug, Clone)]
pub struct Load {
    pub disk_id: u64,
    pub offset: u64,
    pub allocation: u64,
    pub seal: [u8; crate::grant::MAC_LEN],
    pub tag: Arc<[u8]>,
}

impl Tiering {
    /// The work around an open `tier`, whose scan `found` these live records (the error: its
    /// reader threads could not be started).
    pub fn new(tier: Tier, found: Vec<Found>, policy: Policy) -> std::io::Result<Arc<Self>> {
        let records = found
            .into_iter()
            .map(|f| (f.id.0, holding(f.id, &f.header, f.header.len)))
            .collect();
        Ok(Arc::new(Tiering {
            tier: parking_lot::Mutex::new(tier),
            queue: parking_lot::Mutex::default(),
            copying: AtomicBool::new(false),
            wake: tokio::sync::Notify::new(),
            report: parking_lot::Mutex::default(),
            counts: parking_lot::Mutex::default(),
            records: parking_lot::Mutex::new(records),
            policy,
            buffers: Arc::default(),
            pieces: Arc::new(tokio::sync::Semaphore::new(direct::MAX_PIECES)),
            readers: readers::Readers::start(readers::READERS)?,
        }))
    }

    /// What the tier holds, oldest first, as a mount hands it to the leader. What was to be
    /// reported since is in it: the report waiting is dropped.
    pub fn holdings(&self) -> Vec<DiskHolding> {
        *self.report.lock() = Report::default();
        self.records.lock().values().cloned().collect()
    }

    /// Removes the records a mount's answer did not adopt (`adopted`, one per `holdings`).
    pub fn adopted(&self, holdings: &[DiskHolding], adopted: &[bool]) -> usize {
        let mut tier = self.tier.lock();
        let mut records = self.records.lock();
        let mut removed = 0;
        for (i, h) in holdings.iter().enumerate() {
            if adopted.get(i).copied().unwrap_or(false) {
                continue;
            }
            records.remove(&h.disk_id);
            match tier.kill(DiskId(h.disk_id)) {
                Ok(_) => removed += 1,
                Err(e) => tracing::warn!(error = %e, "a record the leader did not adopt could not be marked dead"),
            }
        }
        removed
    }

    /// Puts back a report a heartbeat did not deliver, ahead of what came since.
    pub fn put_back(&self, mut report: Report) {
        let mut r = self.report.lock();
        report.spilled.append(&mut r.spilled);
        report.lost.append(&mut r.lost);
        report.failed_reads.append(&mut r.failed_reads);
        *r = report;
    }

    /// Queues the values a heartbeat answer sealed for their copy.
    pub fn sealed(&self, mount_id: u64, offsets: &[u64], allocations: &[u64]) {
        let mut q = self.queue.lock();
        for (o, a) in offsets.iter().zip(allocations) {
            if q.len() >= MAX_QUEUED {
                q.pop_front();
                self.counts.lock().skipped += 1;
            }
            q.push_back((mount_id, *o, *a));
        }
        drop(q);
        self.wake.notify_one();
    }

    /// Copies what is queued, until `stop` fires: blocking work on the blocking pool, a batch at
    /// a time, each batch synced before it is reported.
    pub async fn run(self: Arc<Self>, segment: Arc<Segment>, stop: tokio_util::sync::CancellationToken) {
        loop {
            let batch: Vec<(u64, u64, u64)> = {
                let mut q = self.queue.lock();
                let n = q.len().min(256);
                self.copying.store(n > 0, Ordering::SeqCst);
                q.drain(..n).collect()
            };
            if batch.is_empty() {
                tokio::select! {
                    () = self.wake.notified() => continue,
                    () = stop.cancelled() => return,
                }
            }
            let (me, seg) = (self.clone(), segment.clone());
            let copied = tokio::task::spawn_blocking(move || me.copy(&seg, &batch)).await;
            self.copying.store(false, Ordering::SeqCst);
            if copied.is_err() {
                return;
            }
        }
    }

    /// Copies a batch to the tier and reports what reached it (blocking).
    pub fn copy(&self, segment: &Segment, batch: &[(u64, u64, u64)]) {
        let mut made = Vec::new();
        let mut lost = Vec::new();
        let mut counts = TierCounts::default();
        let mut tier = self.tier.lock();
        for &(mount_id, offset, allocation) in batch {
            let Some(c) = segment.tier_copy(mount_id, offset, allocation) else {
                counts.skipped += 1;
                continue;
            };
            let header = Header {
                dead: false,
                len: 0,
                checksum: 0,
                epoch: c.epoch,
                seal_offset: offset,
                seal: c.seal,
                written_ms: crate::time::now_unix_ms(),
                tag: c.tag.to_vec(),
            };
            let appended = match self.append(&mut tier, &header, &c.bytes) {
                Err(TierError::Full { .. }) if self.policy.evict => {
                    make_room(&mut tier, self.policy.lru, &mut lost, &mut counts)
                        .and_then(|()| self.append(&mut tier, &header, &c.bytes))
                }
                other => other,
            };
            match appended {
                Ok(id) => made.push((holding(id, &header, c.bytes.len() as u64), allocation)),
                Err(TierError::Full { .. }) => counts.skipped += 1,
                Err(e) => {
                    counts.failed += 1;
                    tracing::warn!(error = %e, "a value was not copied to the disk tier");
                }
            }
        }
        if let Some((high, low)) = self.policy.watermark {
            let (cap, pct) = (tier.capacity() as u128, |p: u8| u128::from(p));
            if tier.used() as u128 * 100 > cap * pct(high) {
                while tier.used() as u128 * 100 > cap * pct(low) {
                    if make_room(&mut tier, self.policy.lru, &mut lost, &mut counts).is_err() {
                        break;
                    }
                }
            }
        }
        if let Err(e) = tier.sync() {
            // Not durable: not reported, so the leader never counts on these copies.
            tracing::warn!(error = %e, "the disk tier could not be synced; the batch is not reported");
            counts.failed += made.len() as u64;
            made.clear();
        }
        drop(tier);
        counts.copied += made.len() as u64;
        self.add(counts);
        {
            let mut records = self.records.lock();
            for (h, _) in &made {
                records.insert(h.disk_id, h.clone());
            }
            // (a copy made in this batch may have gone with a file dropped for room)
            for id in &lost {
                records.remove(id);
            }
        }
        let mut r = self.report.lock();
        r.spilled.extend(made);
        r.lost.extend(lost);
    }

    /// Appends a record, as full when the tier holds its key limit of values.
    fn append(&self, tier: &mut Tier, header: &Header, value: &[u8]) -> Result<DiskId, TierError> {
        let limit = self.policy.key_limit;
        if limit > 0 && tier.values() as u64 >= limit {
            return Err(TierError::Full {
                need: value.len() as u64,
                free: tier.capacity().saturating_sub(tier.used()),
                capacity: tier.capacity(),
            });
        }
        tier.append(header, value)
    }

    /// Applies the leader's loads (each read back and checked, then written into the segment)
    /// and disk frees (blocking): run before the heartbeat that says they were applied.
    pub fn apply(&self, segment: &Segment, mount_id: u64, loads: &[Load], freed: &[u64]) {
        let mut counts = TierCounts::default();
        let mut lost = Vec::new();
        let mut tier = self.tier.lock();
        tier.will_read(loads.iter().map(|l| (DiskId(l.disk_id), l.tag.len())));
        for l in loads {
            let id = DiskId(l.disk_id);
            let loaded = tier.locate(id, &l.tag).and_then(|value| {
                let at = LoadAt {
                    mount_id,
                    offset: l.offset,
                    allocation: l.allocation,
                    len: value.len,
                };
                let fill = |range: &mut WriteRange<'_>| value.read_into(range);
                match segment.load_with(at, l.tag.clone(), value.checksum, l.seal, fill) {
                    Ok(done) => Ok(Some(done)),
                    Err(Mismatch::Fill(e)) => Err(e),
                    Err(Mismatch::Checksum) => Err(ReadError::Damaged {
                        id,
                        why: "its bytes do not match their checksum".into(),
                    }),
                    Err(Mismatch::Busy) => Ok(None),
                }
            });
            match loaded {
                Ok(Some(true)) => counts.loaded += 1,
                Ok(Some(false)) => counts.failed += 1,
                Ok(None) => {
                    // reported lost: the leader drops the value (a miss) rather than tell readers
                    // of a range that holds nothing
                    tracing::warn!(disk_id = l.disk_id, "a load's range stayed busy: the value is dropped");
                    counts.failed += 1;
                    lost.push(l.disk_id);
                }
                Err(ReadError::Missing(_)) => {
                    counts.failed += 1;
                    lost.push(l.disk_id);
                }
                Err(ReadError::Damaged { why, .. }) => {
                    tracing::warn!(disk_id = l.disk_id, %why, "a value on the disk tier is damaged: dropped");
                    counts.damaged += 1;
                    let _ = tier.kill(id);
                    lost.push(l.disk_id);
                }
                Err(ReadError::Tier(e)) => {
                    tracing::warn!(error = %e, "a value could not be read from the disk tier");
                    counts.failed += 1;
                    lost.push(l.disk_id);
                }
            }
        }
        for &d in freed {
            if let Err(e) = tier.kill(DiskId(d)) {
                tracing::warn!(error = %e, "a removed value's disk copy could not be marked dead");
            }
        }
        drop(tier);
        self.add(counts);
        {
            let mut records = self.records.lock();
            for id in lost.iter().chain(freed) {
                records.remove(id);
            }
        }
        self.report.lock().lost.extend(lost);
    }

    /// Whether copies are queued or made and not yet reported: the leader should hear soon (a
    /// value it evicts from memory before it knows of its copy is dropped, not kept).
    pub fn busy(&self) -> bool {
        !self.queue.lock().is_empty() || self.copying.load(Ordering::SeqCst) || {
            let r = self.report.lock();
            !r.spilled.is_empty() || !r.lost.is_empty()
        }
    }

    /// Waits until the tier is not [`busy`](Self::busy), up to `wait`: what it copied, or what is
    /// left when it gives up.
    pub async fn flushed(&self, wait: Duration) -> Result<String, String> {
        let deadline = Instant::now() + wait;
        loop {
            if !self.busy() {
                let c = self.counts();
                return Ok(format!(
                    "flushed: nothing is queued for the disk tier, and the leader has heard of every copy \
                     ({} values copied since the member started)\n",
                    c.copied
                ));
            }
            if Instant::now() >= deadline {
                let queued = self.queue.lock().len();
                let unreported = self.report.lock().spilled.len();
                return Err(format!(
                    "not flushed after {wait:?}: {queued} values queued for the disk tier, {unreported} copies the \
                     leader has not heard of (is the member mounted?); the member copies what is queued when it \
                     stops\n"
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// What the next heartbeat reports (taken: reported once).
    pub fn take_report(&self) -> Report {
        std::mem::take(&mut *self.report.lock())
    }

    /// Bytes of records on disk, and the most the tier may hold.
    pub fn usage(&self) -> (u64, u64) {
        let t = self.tier.lock();
        (t.used(), t.capacity())
    }

    pub fn counts(&self) -> TierCounts {
        *self.counts.lock()
    }

    fn add(&self, c: TierCounts) {
        let mut t = self.counts.lock();
        t.copied += c.copied;
        t.skipped += c.skipped;
        t.dropped_full += c.dropped_full;
        t.loaded += c.loaded;
        t.damaged += c.damaged;
        t.failed += c.failed;
    }
}

/// Drops the tier's oldest file (or, `lru`, its least recently used one), its values reported
/// lost.
fn make_room(tier: &mut Tier, lru: bool, lost: &mut Vec<u64>, counts: &mut TierCounts) -> Result<(), TierError> {
    let next = if lru { tier.least_recent() } else { tier.oldest() };
    let Some((n, _)) = next else {
        return Err(TierError::Config(
            "the disk tier is full and holds nothing to drop".into(),
        ));
    };
    let gone = tier.remove_file(n)?;
    counts.dropped_full += gone.len() as u64;
    lost.extend(gone.iter().map(|id| id.0));
    Ok(())
}

/// `GET /flushed` of a member with this tier: [`Tiering::flushed`] within [`FLUSH_WAIT`].
pub fn flushed(tiering: Arc<Tiering>) -> crate::metrics::Flushed {
    Arc::new(move || {
        let t = tiering.clone();
        Box::pin(async move { t.flushed(FLUSH_WAIT).await })
    })
}

fn holding(id: DiskId, h: &Header, size: u64) -> DiskHolding {
    DiskHolding {
        tag: h.tag.clone().into(),
        disk_id: id.0,
        size,
        seal_epoch: h.epoch,
        seal_offset: h.seal_offset,
        seal: bytes::Bytes::copy_from_slice(&h.seal),
        written_unix_ms: h.written_ms,
    }
}

mod direct;
mod readers;
#[cfg(test)]
mod tests;
