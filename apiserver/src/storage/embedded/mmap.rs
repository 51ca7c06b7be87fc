//! The one place the embedded storage maps its log file into memory.
//!
//! Invariant that makes the mapping sound: a byte range is borrowed (as `&[u8]`) only after it
//! was completely written, and a written range never changes again while any mapping exists.
//! No reference to the whole mapping is ever created, so writes to the unwritten tail (where new
//! frames go) never overlap a live borrow.
//! - The data directory is locked (`flock`) by one process, so no other process writes the file.
//! - The committer publishes a frame's offsets to readers only after writing (and syncing) it;
//!   recovery drops its mapping before it zeroes a torn tail.
//! - The file is grown (zero-filled) before it is remapped and is never truncated while mapped;
//!   compaction writes a new file and the old mapping stays valid until its last reader drops it.

#![allow(unsafe_code)]

use std::fs::File;
use std::io;

use memmap2::{Mmap, MmapOptions};

/// A read-only mapping of the first `len` bytes of a log file.
pub struct LogMap {
    map: Option<Mmap>,
}

impl LogMap {
    /// Maps `len` bytes of `file`. `len` must not exceed the file's current length.
    pub fn map(file: &File, len: u64) -> io::Result<LogMap> {
        if len == 0 {
            return Ok(LogMap { map: None });
        }
        let file_len = file.metadata()?.len();
        if len > file_len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("cannot map {len} bytes of a {file_len}-byte file"),
            ));
        }
        let len = usize::try_from(len).map_err(|_| io::Error::other("log larger than the address space"))?;
        // SAFETY: the module invariant above holds: the directory lock excludes other writers,
        // this process never modifies bytes a reader can reach, and the file is at least `len`
        // bytes long (checked just above) and never shrinks while mapped.
        let map = unsafe { MmapOptions::new().len(len).map(file)? };
        Ok(LogMap { map: Some(map) })
    }
}

impl LogMap {
    /// Length of the mapping.
    pub fn len(&self) -> u64 {
        self.map.as_ref().map_or(0, |m| m.len() as u64)
    }

    /// Borrows `len` bytes at `offset`, or `None` if the range is outside the mapping.
    /// Callers borrow only ranges that are completely written (module invariant).
    pub fn slice(&self, offset: u64, len: usize) -> Option<&[u8]> {
        let map = self.map.as_ref()?;
        let start = usize::try_from(offset).ok()?;
        let end = start.checked_add(len)?;
        if end > map.len() {
            return None;
        }
        // SAFETY: `start..end` lies inside the mapping (checked above), the mapping lives as long
        // as `self`, and by the module invariant these bytes are written and never change while
        // mapped, so a shared borrow of them is never aliased by a write.
        Some(unsafe { std::slice::from_raw_parts(map.as_ptr().add(start), len) })
    }
}
