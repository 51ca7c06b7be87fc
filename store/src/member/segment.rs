//! One member's segment as the data path sees it: the mapped memory, the mount it currently
//! belongs to, the newest leader epoch it has mounted under, and the checks every transfer passes
//! (right mount, no older epoch, deadline not passed, range in bounds and not in use by a
//! conflicting transfer).
//!
//! Fencing: the epoch only rises ([`Segment::see_epoch`]). A range from a leader whose epoch is
//! older than the newest this member mounted under is refused (`STALE_EPOCH`) before the mount
//! is even compared, so a paused or partitioned leader that lost its Lease can place no byte and
//! serve none.

use std::sync::atomic::{AtomicU64, Ordering};

use super::mmap::{ReadRange, SharedMap, WriteRange};
use crate::error::{ErrorCode, Result, StoreError};
use crate::time::now_unix_ms;

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
}

/// Where a transfer goes, as the leader granted it: the mount and epoch it was placed under, the
/// offset, and the deadline (the write deadline or the read lease; 0: none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    pub mount_id: u64,
    pub epoch: u64,
    pub offset: u64,
    pub deadline_unix_ms: u64,
}

/// The segment and its current mount.
#[derive(Debug)]
pub struct Segment {
    map: SharedMap,
    /// 0 while not mounted
    mount_id: AtomicU64,
    /// the newest leader epoch mounted under
    epoch: AtomicU64,
    pub counters: DataCounters,
}

impl Segment {
    pub fn new(map: SharedMap) -> Self {
        Self {
            map,
            mount_id: AtomicU64::new(0),
            epoch: AtomicU64::new(0),
            counters: DataCounters::default(),
        }
    }

    pub fn capacity(&self) -> u64 {
        self.map.len()
    }

    pub fn mount_id(&self) -> u64 {
        self.mount_id.load(Ordering::Acquire)
    }

    /// Adopts a new mount: ranges handed out under any earlier mount are refused from now on.
    pub fn set_mount(&self, mount_id: u64) {
        self.mount_id.store(mount_id, Ordering::Release);
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

    fn check(&self, mount_id: u64, epoch: u64, deadline_unix_ms: u64, what: &str) -> Result<()> {
        let newest = self.epoch();
        if epoch < newest {
            self.counters.refusals.fetch_add(1, Ordering::Relaxed);
            return Err(StoreError::new(
                ErrorCode::StaleEpoch,
                format!(
                    "this range comes from leader epoch {epoch}, and this member has mounted under epoch {newest} since:                      that leader was deposed; ask the serving leader again"
                ),
            ));
        }
        let current = self.mount_id();
        if current == 0 || mount_id != current {
            self.counters.refusals.fetch_add(1, Ordering::Relaxed);
            return Err(StoreError::new(
                ErrorCode::StaleMount,
                "this member's segment was remounted (or is not mounted) since the leader placed this value; ask the \
                 leader again",
            ));
        }
        if deadline_unix_ms != 0 && now_unix_ms() > deadline_unix_ms {
            self.counters.refusals.fetch_add(1, Ordering::Relaxed);
            return Err(StoreError::new(
                ErrorCode::LeaseExpired,
                format!("the {what} deadline the leader gave has passed; ask the leader again"),
            ));
        }
        Ok(())
    }

    /// A range to write a reserved value into (`deadline` is the reservation's write deadline).
    pub fn begin_write(&self, at: Grant, len: u64) -> Result<WriteRange<'_>> {
        self.check(at.mount_id, at.epoch, at.deadline_unix_ms, "write")?;
        let offset = at.offset;
        self.map.write_range(offset, len)
    }

    /// A range to read a committed value from (`deadline` is its read lease).
    pub fn begin_read(&self, at: Grant, len: u64) -> Result<ReadRange<'_>> {
        self.check(at.mount_id, at.epoch, at.deadline_unix_ms, "read lease")?;
        let offset = at.offset;
        self.map.read_range(offset, len)
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

    /// The segment memory's descriptor, for a same-host client (`local.rs`).
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.map.fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_of_an_older_epoch_are_refused_before_the_mount_is_compared() {
        let dir = tempfile::tempdir().unwrap();
        let seg = Segment::new(SharedMap::create(dir.path(), 1 << 16, false).unwrap());
        seg.set_mount(11);
        assert!(seg.see_epoch(3));
        let at = |mount_id, epoch| Grant {
            mount_id,
            epoch,
            offset: 0,
            deadline_unix_ms: 0,
        };
        assert!(seg.begin_write(at(11, 3), 64).is_ok());
        let stale = seg.begin_write(at(11, 2), 64).map(drop).unwrap_err();
        assert_eq!(stale.code, ErrorCode::StaleEpoch);
        assert!(
            stale.message.contains("epoch 2") && stale.message.contains("epoch 3"),
            "{stale}"
        );
        assert_eq!(
            seg.begin_read(at(12, 3), 64).map(drop).unwrap_err().code,
            ErrorCode::StaleMount
        );
        // the epoch only rises: an older leader's mount is not accepted
        assert!(!seg.see_epoch(2));
        assert_eq!(seg.epoch(), 3);
        assert!(seg.see_epoch(4));
        assert_eq!(
            seg.begin_read(at(11, 3), 64).map(drop).unwrap_err().code,
            ErrorCode::StaleEpoch
        );
    }
}
