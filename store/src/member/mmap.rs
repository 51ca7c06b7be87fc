//! The member's segment memory: a shared-memory file mapped with memmap2, and the only code in
//! the store that turns it into Rust slices.
//!
//! Invariant: a byte of the mapping is reachable through a `&mut [u8]` only inside a live
//! [`WriteRange`], and through a `&[u8]` only inside a live [`ReadRange`]. The range table (one
//! mutex) grants a write range only if it overlaps no live range, and a read range only if it
//! overlaps no live write range. So no byte is ever aliased mutably, whatever clients send.
#![allow(unsafe_code)]

use std::fs::OpenOptions;
use std::path::Path;

use memmap2::{MmapMut, MmapOptions};
use parking_lot::Mutex;

use crate::error::{ErrorCode, StoreError};

/// The mapped segment plus its table of ranges in use.
#[derive(Debug)]
pub struct SharedMap {
    _map: MmapMut,
    ptr: *mut u8,
    len: u64,
    live: Mutex<Vec<(u64, u64, bool)>>,
}

// SAFETY: the raw pointer is into a mapping owned by this struct for its whole life; all access
// through it is serialised per byte by the range table (see the module invariant).
unsafe impl Send for SharedMap {}
// SAFETY: as above; shared references only hand out guards that respect the range table.
unsafe impl Sync for SharedMap {}

impl SharedMap {
    /// Creates a file of `len` bytes in `dir` (normally `/dev/shm`), maps it, and unlinks it so the
    /// memory goes back to the system when the process ends, however it ends. With `populate`
    /// every page is faulted in now; without, memory is claimed as it is written.
    pub fn create(dir: &Path, len: u64, populate: bool) -> std::io::Result<Self> {
        let path = dir.join(format!(
            "kvstore-segment-{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        ));
        let file = OpenOptions::new().read(true).write(true).create_new(true).open(&path)?;
        // Unlinked at once, before the (slow) sizing and faulting-in: a member stopped at any
        // point from here on leaves nothing in the directory; the descriptor keeps the memory.
        std::fs::remove_file(&path)?;
        file.set_len(len)?;
        // With `populate` the whole segment is faulted in now (MAP_POPULATE): capacity is memory
        // the member commits up front, and no write then pays a page fault (plus zeroing) per
        // 4 KiB. Without it (`--no-prefault`) pages are claimed as they are first written.
        let mut options = MmapOptions::new();
        if populate {
            options.populate();
        }
        // SAFETY: the file was created by us under a unique name and unlinked before this line,
        // so no other process can open it to truncate or write it behind the mapping.
        let mut map = unsafe { options.map_mut(&file) }?;
        let ptr = map.as_mut_ptr();
        Ok(Self {
            _map: map,
            ptr,
            len,
            live: Mutex::new(Vec::new()),
        })
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn claim(&self, offset: u64, len: u64, write: bool) -> Result<(), StoreError> {
        let end = offset
            .checked_add(len)
            .filter(|e| *e <= self.len && len > 0)
            .ok_or_else(|| {
                StoreError::new(
                    ErrorCode::OutOfRange,
                    format!(
                        "range {offset}+{len} is outside this {}-byte segment; ask the leader again",
                        self.len
                    ),
                )
            })?;
        let mut live = self.live.lock();
        let clash = live.iter().any(|&(o, l, w)| (write || w) && offset < o + l && o < end);
        if clash {
            return Err(StoreError::new(
                ErrorCode::RangeBusy,
                "another transfer is writing this range (or reading it while you write); retry",
            ));
        }
        live.push((offset, len, write));
        Ok(())
    }

    fn release(&self, offset: u64, len: u64, write: bool) {
        let mut live = self.live.lock();
        if let Some(i) = live.iter().position(|&r| r == (offset, len, write)) {
            live.swap_remove(i);
        }
    }

    /// Exclusive access to `offset..offset+len`.
    pub fn write_range(&self, offset: u64, len: u64) -> Result<WriteRange<'_>, StoreError> {
        self.claim(offset, len, true)?;
        Ok(WriteRange { map: self, offset, len })
    }

    /// Shared access to `offset..offset+len`.
    pub fn read_range(&self, offset: u64, len: u64) -> Result<ReadRange<'_>, StoreError> {
        self.claim(offset, len, false)?;
        Ok(ReadRange { map: self, offset, len })
    }

    /// Keeps the mapping's pages resident (touches one byte per page), so the first writes of a
    /// fresh segment do not pay page faults on the data path.
    pub fn prefault(&self) {
        let Ok(mut w) = self.write_range(0, self.len) else {
            return;
        };
        for b in w.bytes_mut().iter_mut().step_by(4096) {
            *b = 0;
        }
    }
}

/// A claimed range that may be written.
#[derive(Debug)]
pub struct WriteRange<'a> {
    map: &'a SharedMap,
    offset: u64,
    len: u64,
}

impl WriteRange<'_> {
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: `claim` checked offset+len <= map length, and this guard is the only live range
        // overlapping these bytes (module invariant) until it is dropped; the mapping outlives 'a.
        unsafe { std::slice::from_raw_parts_mut(self.map.ptr.add(self.offset as usize), self.len as usize) }
    }
}

impl Drop for WriteRange<'_> {
    fn drop(&mut self) {
        self.map.release(self.offset, self.len, true);
    }
}

/// A claimed range that may be read.
#[derive(Debug)]
pub struct ReadRange<'a> {
    map: &'a SharedMap,
    offset: u64,
    len: u64,
}

impl ReadRange<'_> {
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `claim` checked the bounds, and no write range overlapping these bytes is live
        // while this guard is (module invariant); the mapping outlives 'a.
        unsafe { std::slice::from_raw_parts(self.map.ptr.add(self.offset as usize), self.len as usize) }
    }
}

impl Drop for ReadRange<'_> {
    fn drop(&mut self) {
        self.map.release(self.offset, self.len, false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_exclude_writers() {
        let dir = tempfile::tempdir().unwrap();
        let m = SharedMap::create(dir.path(), 1 << 16, true).unwrap();
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "the file is unlinked"
        );
        // a segment that cannot be sized leaves nothing behind either
        assert!(SharedMap::create(dir.path(), u64::MAX, false).is_err());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        let mut w = m.write_range(0, 100).unwrap();
        w.bytes_mut().fill(7);
        assert_eq!(m.write_range(50, 100).unwrap_err().code, ErrorCode::RangeBusy);
        assert_eq!(m.read_range(99, 1).unwrap_err().code, ErrorCode::RangeBusy);
        let r2 = m.read_range(100, 10).unwrap();
        drop(w);
        let r = m.read_range(0, 100).unwrap();
        let r3 = m.read_range(0, 100).unwrap();
        assert!(r.bytes().iter().all(|b| *b == 7));
        assert_eq!(m.write_range(0, 1).unwrap_err().code, ErrorCode::RangeBusy);
        drop((r, r2, r3));
        assert!(m.write_range(0, 1 << 16).is_ok());
        assert_eq!(m.write_range(1, 1 << 16).unwrap_err().code, ErrorCode::OutOfRange);
        assert_eq!(m.write_range(u64::MAX, 2).unwrap_err().code, ErrorCode::OutOfRange);
        assert_eq!(m.read_range(0, 0).unwrap_err().code, ErrorCode::OutOfRange);
    }
}
