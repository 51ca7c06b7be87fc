//! The data directory's files: its `LOCK`, the log file of each generation (named, opened and
//! wrapped by `Options::wrap_file`), directory syncs, and opening the newest log at start: replay,
//! torn-tail repair, and removal of what older generations and compactions left behind.

use std::fs::{self, File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::index::Index;
use super::log_io::{self, LogFile, OsFile};
use super::mmap::LogMap;
use super::{ActiveLog, Options, committer, format, recovery};
use crate::storage::{Result, StorageError};

pub(super) fn lock_dir(dir: &Path) -> Result<File> {
    let path = dir.join("LOCK");
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| StorageError::io(format!("opening {}", path.display()), e))?;
    rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive).map_err(|_| {
        StorageError::Unavailable(format!(
            "{} is in use by another process; stop it or choose another data directory",
            dir.display()
        ))
    })?;
    Ok(f)
}

pub(super) fn log_path(dir: &Path, generation: u64) -> PathBuf {
    dir.join(format!("wal-{generation:016x}.log"))
}

pub(super) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| StorageError::io(format!("syncing directory {}", dir.display()), e))
}

pub(super) fn open_file(path: &Path, options: &Options, create: bool) -> Result<Arc<dyn LogFile>> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(create)
        .truncate(false)
        .open(path)
        .map_err(|e| StorageError::io(format!("opening {}", path.display()), e))?;
    Ok(match &options.wrap_file {
        Some(wrap) => wrap(f),
        None => Arc::new(OsFile(f)),
    })
}

/// Finds the newest log generation (creating the first one if there is none), replays it and
/// repairs a torn tail. Older generations and leftover temporary files are removed.
pub(super) fn open_log(dir: &Path, options: &Options) -> Result<(ActiveLog, recovery::Recovered, LogMap)> {
    let mut generations = Vec::new();
    let entries = fs::read_dir(dir).map_err(|e| StorageError::io(format!("reading {}", dir.display()), e))?;
    for entry in entries {
        let entry = entry.map_err(|e| StorageError::io(format!("reading {}", dir.display()), e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(".tmp") {
            let _ = fs::remove_file(entry.path());
        } else if let Some(generation) = name
            .strip_prefix("wal-")
            .and_then(|n| n.strip_suffix(".log"))
            .and_then(|hex| u64::from_str_radix(hex, 16).ok())
        {
            generations.push(generation);
        }
    }
    generations.sort_unstable();
    let Some(&generation) = generations.last() else {
        let (log, _) = committer::create_generation(dir, options, 1, 0, &[])?;
        let map = LogMap::map(log.file.file(), log.file_len)
            .map_err(|e| StorageError::io(format!("mapping {}", log.path.display()), e))?;
        let recovered = recovery::Recovered {
            index: Index::default(),
            revision: 0,
            snapshot_revision: 0,
            write_offset: log.write_offset,
            torn: None,
            frames: 0,
        };
        return Ok((log, recovered, map));
    };
    let path = log_path(dir, generation);
    let file = open_file(&path, options, false)?;
    let file_len = file
        .file()
        .metadata()
        .map_err(|e| StorageError::io(format!("reading {}", path.display()), e))?
        .len();
    let scan_map =
        LogMap::map(file.file(), file_len).map_err(|e| StorageError::io(format!("mapping {}", path.display()), e))?;
    let header_bytes = scan_map.slice(0, format::FILE_HEADER_LEN as usize).unwrap_or_default();
    let header = format::FileHeader::decode(header_bytes)
        .map_err(|e| StorageError::Corrupt(format!("{}: {e}", path.display())))?;
    let recovered = recovery::replay(&scan_map, &header, &path.display().to_string())?;
    drop(scan_map);
    // Older generations are leftovers of a compaction that finished (the newest was synced and
    // renamed before the old one was removed); drop them only once the newest replayed.
    for old in &generations[..generations.len() - 1] {
        let _ = fs::remove_file(log_path(dir, *old));
    }
    if let Some((start, end)) = recovered.torn {
        tracing::warn!(
            file = %path.display(),
            offset = start,
            bytes = end - start,
            "discarding a torn tail left by a crash during a commit (it was never acknowledged)"
        );
        log_io::zero_fill(file.as_ref(), start, end)
            .map_err(|e| StorageError::io(format!("zeroing the torn tail of {}", path.display()), e))?;
    }
    let map =
        LogMap::map(file.file(), file_len).map_err(|e| StorageError::io(format!("mapping {}", path.display()), e))?;
    let log = ActiveLog {
        file,
        path,
        generation,
        write_offset: recovered.write_offset,
        file_len,
    };
    Ok((log, recovered, map))
}
