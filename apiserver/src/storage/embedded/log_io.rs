//! The log file's I/O surface: positioned writes, data sync and growth.
//!
//! It sits behind a trait so tests can replace durability itself: [`tests::FrozenAfter`] stops
//! syncing after the N-th call and can then throw away every write that was not synced, which is
//! what a power cut does to the page cache; [`tests::Faulty`] fails writes or syncs with the
//! errno a test sets (`ENOSPC`, `EIO`) until it clears it.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

/// What the embedded storage needs from its log file.
pub trait LogFile: Send + Sync {
    /// Writes all of `buf` at `offset`.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Makes every completed write durable (`fdatasync`).
    fn sync_data(&self) -> io::Result<()>;
    /// The underlying file, for mapping and metadata.
    fn file(&self) -> &File;
}

/// The real thing.
pub struct OsFile(pub File);

impl LogFile for OsFile {
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.0.write_all_at(buf, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }
    fn file(&self) -> &File {
        &self.0
    }
}

/// Wraps each opened log file; tests use it to inject faults.
pub type FileWrapper = Arc<dyn Fn(File) -> Arc<dyn LogFile> + Send + Sync>;

/// Zero-fills `file` from `from` to `to` and syncs, so later writes into that range overwrite
/// allocated blocks (a sync then flushes data only, not block allocation).
pub fn zero_fill(file: &dyn LogFile, from: u64, to: u64) -> io::Result<()> {
    const CHUNK: usize = 1 << 20;
    let zeros = vec![0u8; CHUNK];
    let mut at = from;
    while at < to {
        let n = ((to - at) as usize).min(CHUNK);
        file.write_at(&zeros[..n], at)?;
        at += n as u64;
    }
    file.sync_data()
}

#[cfg(test)]
pub mod tests {
    use super::*;
    use parking_lot::Mutex;

    /// Syncs normally for the first `allowed` calls, then fails every sync. Remembers the old
    /// bytes under every write made since the last successful sync, so that
    /// [`FrozenAfter::lose_unsynced`] can restore the file to what a disk would hold after a
    /// power cut.
    pub struct FrozenAfter {
        file: File,
        allowed: Mutex<usize>,
        unsynced: Mutex<Vec<(u64, Vec<u8>)>>,
    }

    impl FrozenAfter {
        pub fn new(file: File, allowed: usize) -> Self {
            FrozenAfter {
                file,
                allowed: Mutex::new(allowed),
                unsynced: Mutex::new(Vec::new()),
            }
        }

        /// Undoes every write that was never synced, newest first.
        pub fn lose_unsynced(&self) -> io::Result<usize> {
            let mut undo = self.unsynced.lock();
            let n = undo.len();
            while let Some((offset, old)) = undo.pop() {
                self.file.write_all_at(&old, offset)?;
            }
            self.file.sync_data()?;
            Ok(n)
        }
    }

    /// The errno writes and syncs fail with, while set (shared by every file the storage opens).
    #[derive(Default)]
    pub struct Faults {
        pub write: Mutex<Option<i32>>,
        pub sync: Mutex<Option<i32>>,
    }

    impl Faults {
        pub fn wrapper(self: &Arc<Self>) -> FileWrapper {
            let faults = self.clone();
            Arc::new(move |file| {
                Arc::new(Faulty {
                    file,
                    faults: faults.clone(),
                }) as Arc<dyn LogFile>
            })
        }
    }

    /// A file whose writes and syncs fail while [`Faults`] says so.
    pub struct Faulty {
        file: File,
        faults: Arc<Faults>,
    }

    impl LogFile for Faulty {
        fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
            if let Some(errno) = *self.faults.write.lock() {
                // half of it reaches the page cache, as a write that runs out of space midway
                let _ = self.file.write_all_at(&buf[..buf.len() / 2], offset);
                return Err(io::Error::from_raw_os_error(errno));
            }
            self.file.write_all_at(buf, offset)
        }

        fn sync_data(&self) -> io::Result<()> {
            match *self.faults.sync.lock() {
                Some(errno) => Err(io::Error::from_raw_os_error(errno)),
                None => self.file.sync_data(),
            }
        }

        fn file(&self) -> &File {
            &self.file
        }
    }

    impl LogFile for FrozenAfter {
        fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
            let len = self.file.metadata()?.len();
            let mut old = vec![0u8; buf.len()];
            if offset < len {
                let n = ((len - offset) as usize).min(buf.len());
                self.file.read_exact_at(&mut old[..n], offset)?;
            }
            self.unsynced.lock().push((offset, old));
            self.file.write_all_at(buf, offset)
        }

        fn sync_data(&self) -> io::Result<()> {
            let mut allowed = self.allowed.lock();
            if *allowed == 0 {
                return Err(io::Error::other("injected: the disk stopped syncing"));
            }
            *allowed -= 1;
            self.file.sync_data()?;
            self.unsynced.lock().clear();
            Ok(())
        }

        fn file(&self) -> &File {
            &self.file
        }
    }
}
