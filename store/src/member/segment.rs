//! One member's segment as the data path sees it: the mapped memory, the mount it currently
//! belongs to, the newest leader epoch it has mounted under, and the checks every transfer passes
//! (right mount, no older epoch, deadline not passed, the leader's MAC over the range verifies,
//! the range last written by the grant's allocation and no newer one ([`super::written`]), range
//! in bounds and not in use by a conflicting transfer).
//!
//! What it holds survives a new mount: a write that finished records its value's tag and checksum
//! ([`super::written`]); a new mount retires the table, the member reports the finished values
//! whose bytes still match their checksum ([`Segment::report`]), and the leader's answer says
//! which it adopted and under which allocations ([`Segment::adopt`]). The rest is free space.
//! That handover is [`handover`]'s.
//!
//! Fencing: the epoch only rises ([`Segment::see_epoch`]). A range from a leader whose epoch is
//! older than the newest this member mounted under is refused (`STALE_EPOCH`) before the mount
//! is even compared, so a paused or partitioned leader that lost its Lease can place no byte and
//! serve none.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use std::sync::Arc;

mod handover;
mod tier;

use super::mmap::{ReadRange, SharedMap, WriteRange};
use super::written::{Stale, Written};
use crate::error::{ErrorCode, Result, StoreError};
use crate::grant::{Access, GrantKey, MAC_LEN, Range};
use crate::time::now_unix_ms;
use handover::Report;
pub use handover::ReportCounts;
pub use tier::{LoadAt, Mismatch};

/// Transfer counters for metrics.
#[derive(Debug, Default)]
pub struct DataCounters {
    pub writes: AtomicU64,
    pub reads: AtomicU64,
    pub bytes_written: AtomicU64,
    pub bytes_read: AtomicU64,
    pub refusals: AtomicU64,
    /// of `writes` and `reads`: those a same-host client made through the mapped segment
    pub local_writes: AtomicU64,
    pub local_reads: AtomicU64,
    /// tier files handed to same-host clients (op 8), which read copies from them themselves
    pub tier_files: AtomicU64,
}

/// Where a transfer goes, as the leader granted it: the mount and epoch it was placed under, the
/// offset, and the deadline (the write deadline or the read lease; 0: none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    pub mount_id: u64,
    pub epoch: u64,
    pub offset: u64,
    /// the placement the range was granted for (`grant.rs`)
    pub allocation: u64,
    pub deadline_unix_ms: u64,
    /// the Location's `grant_mac` (`grant.rs`)
    pub mac: [u8; MAC_LEN],
}

impl Grant {
    /// The leader's grant a data-port or same-host request header shows.
    pub fn of(req: &crate::wire::Request) -> Grant {
        Grant {
            mount_id: req.mount_id,
            epoch: req.epoch,
            offset: req.offset,
            allocation: req.allocation,
            deadline_unix_ms: req.deadline_unix_ms,
            mac: req.mac,
        }
    }
}

/// The segment and its current mount.
#[derive(Debug)]
pub struct Segment {
    map: SharedMap,
    /// 0 while not mounted
    mount_id: AtomicU64,
    /// the newest leader epoch mounted under
    epoch: AtomicU64,
    /// the serving leader's grant key, from its MountResponse: ranges must carry its MAC
    grant_key: parking_lot::RwLock<Option<GrantKey>>,
    /// set while a Mount call is in flight: the leader may hand out ranges of the new mount
    /// before this member has the answer (and the key that signs them)
    mounting: AtomicBool,
    /// fires whenever the mount, the key or `mounting` changes, and when an answer to a page
    /// of a report is applied
    mount_changed: tokio::sync::Notify,
    /// set while pages of a report are sent and not answered: the leader may hand out reads of
    /// the values it adopted from them before this member has applied its answer
    answers_due: AtomicBool,
    /// which allocation last wrote each range of the current mount
    written: parking_lot::Mutex<Written>,
    /// the report of the values of ended mounts to a leader: where its next page starts, and
    /// its pages sent and not answered (taken before `written` when both are)
    report: parking_lot::Mutex<Report>,
    /// held while the current mount's values are checked ([`Segment::precheck`]): one check at
    /// a time
    checking: parking_lot::Mutex<()>,
    /// the memory's descriptor was handed to a same-host client, which may write any byte at any
    /// time: a report hashes every value again, whatever an earlier check found
    handed_out: AtomicBool,
    pub counters: DataCounters,
}

/// How long a `Map` waits for a mount in flight to settle before it is refused.
pub const MOUNT_WAIT: Duration = Duration::from_secs(2);

impl Segment {
    pub fn new(map: SharedMap) -> Self {
        Self {
            map,
            mount_id: AtomicU64::new(0),
            epoch: AtomicU64::new(0),
            grant_key: parking_lot::RwLock::new(None),
            mounting: AtomicBool::new(false),
            mount_changed: tokio::sync::Notify::new(),
            answers_due: AtomicBool::new(false),
            written: parking_lot::Mutex::new(Written::default()),
            report: parking_lot::Mutex::default(),
            checking: parking_lot::Mutex::new(()),
            handed_out: AtomicBool::new(false),
            counters: DataCounters::default(),
        }
    }

    pub fn capacity(&self) -> u64 {
        self.map.len()
    }

    pub fn mount_id(&self) -> u64 {
        self.mount_id.load(Ordering::Acquire)
    }

    /// Adopts a new mount: ranges handed out under any earlier mount are refused from now on,
    /// and the new mount's allocations start a new count. The values the ended mount finished
    /// writing wait for the next leader's answer ([`Segment::report`], [`Segment::adopt`]).
    pub fn set_mount(&self, mount_id: u64) {
        let mut written = self.written.lock();
        if self.mount_id.swap(mount_id, Ordering::AcqRel) != mount_id {
            written.retire();
        }
        drop(written);
        self.mount_changed.notify_waiters();
    }

    /// Adopts the key the mounting leader signs its grants with.
    pub fn set_grant_key(&self, key: GrantKey) {
        *self.grant_key.write() = Some(key);
        self.mount_changed.notify_waiters();
    }

    /// Marks a Mount call in flight until the returned guard drops (answered, refused or timed
    /// out): a `Map` that arrives meanwhile waits for it instead of being refused.
    pub fn mounting(&self) -> MountInFlight<'_> {
        self.mounting.store(true, Ordering::Release);
        MountInFlight(self)
    }

    /// The newest leader epoch this segment was mounted under.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Records a leader's epoch (it only rises); returns `false`, changing nothing, when `epoch`
    /// is older than one already seen (that leader was deposed).
    pub fn see_epoch(&self, epoch: u64) -> bool {
        self.epoch.fetch_max(epoch, Ordering::AcqRel) <= epoch
    }

    fn check(&self, at: &Grant, access: Access, len: u64, tag: &[u8]) -> Result<()> {
        self.verify(at, access, len, tag).inspect_err(|_| {
            self.counters.refusals.fetch_add(1, Ordering::Relaxed);
        })
    }

    /// Whether `at` is a grant the serving leader gave for this mount, for writing or for reading
    /// `len` bytes: what a same-host client shows to map the segment at all. While a mount is in
    /// flight the check waits for it ([`Segment::settle`]) rather than sending the client to TCP.
    pub async fn check_map(&self, at: &Grant, len: u64, tag: &[u8]) -> Result<()> {
        self.until_settled(|| {
            self.verify(at, Access::Write, len, tag)
                .or_else(|_| self.verify(at, Access::Read, len, &[]))
        })
        .await
        .inspect_err(|_| {
            self.counters.refusals.fetch_add(1, Ordering::Relaxed);
        })
    }

    /// Waits, while a Mount call is in flight, until `at` passes or the mount settles (at most
    /// [`MOUNT_WAIT`]); returns at once when none is. A client learns of a new mount from the
    /// leader, whose answer may reach this member after the client's first transfer: that transfer
    /// waits for the leader's key instead of being refused. Call it before `begin_write` or
    /// `begin_read`, which decide.
    /// A read of a range this member does not hold yet waits likewise while pages of its report
    /// are unanswered: the leader answers a page once it adopted it, and may hand out reads of
    /// its values before the answer is applied here.
    pub async fn settle(&self, at: &Grant, access: Access, len: u64, tag: &[u8]) {
        if self.mounting.load(Ordering::Acquire) {
            let _ = self.until_settled(|| self.verify(at, access, len, tag)).await;
        }
        if access == Access::Read && self.answers_due.load(Ordering::Acquire) {
            self.until_answered(at, len).await;
        }
    }

    /// Returns once the range `at` names is held under its allocation, no answer is due, or
    /// [`MOUNT_WAIT`] passed.
    async fn until_answered(&self, at: &Grant, len: u64) {
        let until = tokio::time::Instant::now() + MOUNT_WAIT;
        loop {
            let changed = self.mount_changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let held = self.written.lock().holds(at.offset, len, at.allocation);
            if held
                || !self.answers_due.load(Ordering::Acquire)
                || tokio::time::timeout_at(until, changed).await.is_err()
            {
                return;
            }
        }
    }

    /// Whether `at` would be served for `len` bytes now (after [`Segment::settle`]): the checks
    /// of `begin_write` and `begin_read` before the range table, for a caller that wants to
    /// refuse before it reads a value's bytes.
    pub async fn admit(&self, at: &Grant, access: Access, len: u64, tag: &[u8]) -> Result<()> {
        self.settle(at, access, len, tag).await;
        self.check(at, access, len, tag)
    }

    /// `verify`'s verdict once it passes or no mount is in flight, or after [`MOUNT_WAIT`].
    async fn until_settled(&self, verify: impl Fn() -> Result<()>) -> Result<()> {
        let until = tokio::time::Instant::now() + MOUNT_WAIT;
        loop {
            let changed = self.mount_changed.notified();
            tokio::pin!(changed);
            // registered before the check, so a change between the two is not missed
            changed.as_mut().enable();
            let verdict = verify();
            let settled = verdict.is_ok() || !self.mounting.load(Ordering::Acquire);
            if settled || tokio::time::timeout_at(until, changed).await.is_err() {
                return verdict;
            }
        }
    }

    /// The checks of a grant (epoch, mount, deadline, signature over the range and, for a write,
    /// the value's tag), counting nothing.
    fn verify(&self, at: &Grant, access: Access, len: u64, tag: &[u8]) -> Result<()> {
        let what = match access {
            Access::Write => "write",
            Access::Read => "read lease",
            Access::ReadDisk => "disk read",
        };
        let Grant {
            mount_id,
            epoch,
            deadline_unix_ms,
            ..
        } = *at;
        let newest = self.epoch();
        if epoch < newest {
            return Err(StoreError::new(
                ErrorCode::StaleEpoch,
                format!(
                    "this range comes from leader epoch {epoch}, and this member has mounted under epoch {newest} since: that leader was deposed; ask the serving leader again"
                ),
            ));
        }
        let current = self.mount_id();
        if current == 0 || mount_id != current {
            return Err(StoreError::new(
                ErrorCode::StaleMount,
                "this member's segment was remounted (or is not mounted) since the leader placed this value; ask the \
                 leader again",
            ));
        }
        if deadline_unix_ms != 0 && now_unix_ms() > deadline_unix_ms {
            return Err(StoreError::new(
                ErrorCode::LeaseExpired,
                format!("the {what} deadline the leader gave has passed; ask the leader again"),
            ));
        }
        let range = Range {
            access,
            mount_id,
            epoch,
            allocation: at.allocation,
            offset: at.offset,
            len,
            deadline_unix_ms,
        };
        match &*self.grant_key.read() {
            Some(key) => key.verify(&range, tag, &at.mac),
            None => Err(StoreError::new(
                ErrorCode::StaleMount,
                "this member has no grant key from its leader yet (it is mounting); ask the leader again",
            )),
        }
    }

    /// A range to write a reserved value into (`deadline` is the reservation's write deadline),
    /// the value named by `tag` (which the grant's MAC covers). The write counts as finished, and
    /// is recorded for the next leader, only once [`Writing::finish`] is called.
    pub fn begin_write(&self, at: Grant, len: u64, tag: &[u8]) -> Result<Writing<'_>> {
        self.check(&at, Access::Write, len, tag)?;
        let placed = self.written.lock().write(at.offset, len, at.allocation);
        if let Err(stale) = placed {
            self.counters.refusals.fetch_add(1, Ordering::Relaxed);
            return Err(stale_write(stale, at.allocation));
        }
        Ok(Writing {
            range: self.map.write_range(at.offset, len)?,
            segment: self,
            grant: at,
            tag: Arc::from(tag),
        })
    }

    /// A range to read a committed value from (`deadline` is its read lease).
    pub fn begin_read(&self, at: Grant, len: u64) -> Result<ReadRange<'_>> {
        self.check(&at, Access::Read, len, &[])?;
        if let Err(stale) = self.written.lock().read(at.offset, len, at.allocation) {
            self.counters.refusals.fetch_add(1, Ordering::Relaxed);
            return Err(stale_read(stale, at.allocation));
        }
        self.map.read_range(at.offset, len)
    }

    /// Whether ranges of `mount_id` are still valid (checked again after a transfer, so a remount
    /// during a long read is reported rather than served).
    pub fn still_mounted(&self, mount_id: u64) -> bool {
        self.mount_id() == mount_id
    }

    pub fn wrote(&self, n: u64) {
        self.counters.writes.fetch_add(1, Ordering::Relaxed);
        self.counters.bytes_written.fetch_add(n, Ordering::Relaxed);
    }

    pub fn read(&self, n: u64) {
        self.counters.reads.fetch_add(1, Ordering::Relaxed);
        self.counters.bytes_read.fetch_add(n, Ordering::Relaxed);
    }

    pub fn prefault(&self) {
        self.map.prefault();
    }

    /// The segment memory's descriptor, to hand to a same-host client (`local.rs`); from then on
    /// a report to the next leader hashes every value again (`handover.rs`). `None` unless the
    /// memory is sealed at its size (`mmap.rs`): a process that could truncate it would end the
    /// member and every engine mapping it.
    pub fn hand_out(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        if !self.map.is_sealed() {
            return None;
        }
        self.handed_out.store(true, Ordering::Release);
        Some(self.map.fd())
    }

    /// Whether the memory's size is sealed, so [`Segment::hand_out`] may hand it out.
    pub fn is_sealed(&self) -> bool {
        self.map.is_sealed()
    }
}

/// A write in progress: its claimed range (which it dereferences to), and what to record once
/// all of its bytes are in.
#[derive(Debug)]
pub struct Writing<'a> {
    range: WriteRange<'a>,
    segment: &'a Segment,
    grant: Grant,
    tag: Arc<[u8]>,
}

impl<'a> std::ops::Deref for Writing<'a> {
    type Target = WriteRange<'a>;
    fn deref(&self) -> &WriteRange<'a> {
        &self.range
    }
}

impl std::ops::DerefMut for Writing<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.range
    }
}

impl Writing<'_> {
    /// Every byte is in: checksums the range as it is in the segment and records the value for
    /// the next leader (unless a newer placement or a new mount overtook it), then gives up the
    /// claim.
    pub fn finish(self) {
        match self.segment.map.checksum(self.grant.offset, self.range.len()) {
            Ok(sum) => self.finish_with(sum),
            Err(_) => drop(self),
        }
    }

    /// [`Writing::finish`] for a caller that hashed the bytes (XXH3-64) as it copied them in.
    pub fn finish_with(self, checksum: u64) {
        let Writing {
            range,
            segment,
            grant,
            tag,
        } = self;
        let len = range.len();
        let epoch = segment.epoch();
        let mut written = segment.written.lock();
        if segment.mount_id() == grant.mount_id {
            written.finish(grant.offset, len, grant.allocation, tag, checksum, epoch);
        }
        drop(written);
        drop(range);
    }
}

/// A write grant whose range was placed again since: its reservation is gone.
fn stale_write(stale: Stale, allocation: u64) -> StoreError {
    let newer = match stale {
        Stale::Replaced { newer } => format!(" (allocation {newer} wrote it after this grant's {allocation})"),
        Stale::NotWritten => String::new(),
    };
    StoreError::new(
        ErrorCode::PutExpired,
        format!(
            "this range was freed and placed again for another value{newer}: the reservation this grant was for is \
             gone; start the put over"
        ),
    )
}

/// A read grant whose value is no longer in its range.
fn stale_read(stale: Stale, allocation: u64) -> StoreError {
    let why = match stale {
        Stale::Replaced { newer } => {
            format!(
                "the range was freed and placed again (allocation {newer} wrote it after this grant's {allocation})"
            )
        }
        Stale::NotWritten => format!("this member holds nothing written under allocation {allocation} there"),
    };
    StoreError::new(
        ErrorCode::LeaseExpired,
        format!("the value this read grant was for is gone: {why}; ask the leader again"),
    )
}

/// A Mount call in flight ([`Segment::mounting`]).
#[must_use = "the mount counts as in flight only while the guard lives"]
pub struct MountInFlight<'a>(&'a Segment);

impl Drop for MountInFlight<'_> {
    fn drop(&mut self) {
        self.0.mounting.store(false, Ordering::Release);
        self.0.mount_changed.notify_waiters();
    }
}

#[cfg(test)]
pub(crate) mod tests;
