//! One member's segment as the data path sees it: the mapped memory, the mount it currently
//! belongs to, and the checks every transfer passes (right mount, deadline not passed, range in
//! bounds and not in use by a conflicting transfer).

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
}

/// The segment and its current mount.
#[derive(Debug)]
pub struct Segment {
    map: SharedMap,
    /// 0 while not mounted
    mount_id: AtomicU64,
    pub counters: DataCounters,
}

impl Segment {
    pub fn new(map: SharedMap) -> Self {
        Self {
            map,
            mount_id: AtomicU64::new(0),
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

    fn check(&self, mount_id: u64, deadline_unix_ms: u64, what: &str) -> Result<()> {
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
    pub fn begin_write(&self, mount_id: u64, offset: u64, len: u64, deadline: u64) -> Result<WriteRange<'_>> {
        self.check(mount_id, deadline, "write")?;
        self.map.write_range(offset, len)
    }

    /// A range to read a committed value from (`deadline` is its read lease).
    pub fn begin_read(&self, mount_id: u64, offset: u64, len: u64, deadline: u64) -> Result<ReadRange<'_>> {
        self.check(mount_id, deadline, "read lease")?;
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
}
