//! A member's disk tier: values kept in files of a directory of the node, under the member's
//! memory segment. It owns the files, their format (`format`), what a restart finds in them and
//! the checks that keep a wrong byte from ever leaving them. What goes to disk, and when a value
//! leaves it, the leader decides (as it decides eviction from memory); this module only obeys.
//!
//! Layout (store/README.md, "On disk"): append-only files `<n>.kvt` (`n` eight hex digits,
//! rising, never reused while the directory lives), each up to the configured file size (a bigger
//! value gets a file of its own), plus `.lock`, which one member at a time holds (`flock`), so two members never share a
//! directory. A value's [`DiskId`] is its file and where its record starts. Removing a value
//! marks its record dead in place; a file whose records are all dead is deleted, so bytes on disk
//! are the live records plus the dead ones in files that still hold a live one.
//!
//! What can go wrong, and what a reader gets instead of a wrong byte:
//! - a crash in the middle of an append: the record is cut short, or its value's bytes are not
//!   all there. The first is seen when the files are read at start ([`Tier::open`]: the record
//!   and the rest of its file are left out); the second on read, as below.
//! - bytes changed behind the member's back (a bad disk, an operator's edit): a header whose
//!   checksum does not match is skipped at start (the scan goes on at the next record boundary);
//!   a value whose bytes do not match its checksum, or whose tag is not the one asked for, is
//!   [`ReadError::Damaged`] on read. The caller drops it and counts it: a miss, never the bytes.
//! - a record forged inside a value's bytes (a tenant can write anything) is only ever found
//!   when the header before it is damaged, and it carries no valid leader seal, which the leader
//!   checks before adopting anything a member reports.
//!
//! Every call here is blocking file I/O: run it off the async workers (`spawn_blocking`).

pub mod format;
mod read;
mod stream;

pub use read::Located;
pub use stream::{BLOCK, LARGEST_PIECE, PIECE, Piece, PieceBuffers, Stream, read_span, tapering};

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;

use format::{ALIGN, Damage, HEADER_LEN, Header};

/// The smallest tier file: a few records of the smallest values.
pub const MIN_FILE_SIZE: u64 = 1 << 20;
/// The largest: a record's start within its file is counted in [`ALIGN`] units in 32 bits.
pub const MAX_FILE_SIZE: u64 = (u32::MAX as u64) * ALIGN;
const LOCK: &str = ".lock";
const SUFFIX: &str = ".kvt";

/// Where a tier lives and how much it may hold.
#[derive(Debug, Clone)]
pub struct TierConfig {
    pub dir: PathBuf,
    /// Most bytes of records on disk.
    pub capacity: u64,
    /// When the file being appended to is this long, the next record starts a new one.
    pub file_size: u64,
}

/// What a tier directory holds before its member first opens it: how many entries (any name), or
/// -1 when it cannot be listed. The runtimes report it (`TierWasEmpty`): a tier that was not
/// empty when its backend was new holds someone else's files, or an earlier backend's.
pub fn survey(dir: &Path) -> i64 {
    match fs::read_dir(dir) {
        Ok(entries) => entries.filter(Result::is_ok).count() as i64,
        Err(_) => -1,
    }
}

/// The capacity a tier in `dir` gets when none is given: the free space of its file system less
/// a sixteenth (room for everything else on it), plus the bytes of tier files already there.
pub fn default_capacity(dir: &Path) -> Result<u64, TierError> {
    let st = rustix::fs::statvfs(dir).map_err(|e| io_err("the tier directory", dir, e.into()))?;
    let free = st.f_bavail.saturating_mul(st.f_frsize);
    let mut held = 0u64;
    for entry in fs::read_dir(dir).map_err(|e| io_err("listing", dir, e))? {
        let entry = entry.map_err(|e| io_err("listing", dir, e))?;
        if entry.file_name().to_str().and_then(file_number).is_some() {
            held += entry.metadata().map_or(0, |m| m.len());
        }
    }
    let capacity = (free - free / 16).saturating_add(held);
    if capacity < MIN_FILE_SIZE {
        return Err(TierError::Config(format!(
            "the file system of {} has {free} bytes free: not room for one file of the tier; free some, or give \
             another directory",
            dir.display()
        )));
    }
    Ok(capacity)
}

/// Where a record lies: its file's number (high 32 bits) and its start in [`ALIGN`] units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DiskId(pub u64);

impl DiskId {
    fn new(file: u32, offset: u64) -> DiskId {
        debug_assert_eq!(offset % ALIGN, 0);
        DiskId(((file as u64) << 32) | (offset / ALIGN))
    }

    pub fn file(self) -> u32 {
        (self.0 >> 32) as u32
    }

    pub fn offset(self) -> u64 {
        (self.0 & u32::MAX as u64) * ALIGN
    }
}

/// A live value found in the files when the tier was opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub id: DiskId,
    pub header: Header,
}

/// What opening a tier found.
#[derive(Debug, Default)]
pub struct Scan {
    /// live values, oldest first (by file, then position)
    pub found: Vec<Found>,
    /// records marked dead
    pub dead: u64,
    /// [`ALIGN`]-sized spans skipped because no valid header started there
    pub damaged: u64,
    /// records cut short at the end of a file (a crash during an append)
    pub torn: u64,
    /// files left with no live record, deleted
    pub emptied: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum TierError {
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("{0} is used by another member (its {LOCK} is locked): give each member a directory of its own")]
    Locked(PathBuf),
    #[error("the tier is full: a record of {need} bytes does not fit in {free} of {capacity} bytes free")]
    Full { need: u64, free: u64, capacity: u64 },
    #[error("{0}")]
    Config(String),
}

/// Why a read returned no bytes.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("the tier holds no value at {0:?}")]
    Missing(DiskId),
    #[error("the value at {id:?} is damaged ({why}): dropped, never served")]
    Damaged { id: DiskId, why: String },
    #[error(transparent)]
    Tier(#[from] TierError),
}

#[derive(Debug)]
struct TierFile {
    file: File,
    len: u64,
    live: u64,
    /// the tier's clock at the last append to it or read from it (least recently used first:
    /// [`Tier::least_recent`])
    touched: AtomicU64,
}

/// A live record: its value's length and checksum and where the value starts in it, as its
/// header said when it was written or found (a direct read needs no header read: `read.rs`).
#[derive(Debug, Clone, Copy)]
struct Live {
    len: u64,
    checksum: u64,
    payload_at: u64,
}

impl Live {
    fn of(h: &format::Header) -> Live {
        Live {
            len: h.len,
            checksum: h.checksum,
            payload_at: h.payload_at(),
        }
    }
}

/// An open tier directory (see the module's doc).
#[derive(Debug)]
pub struct Tier {
    dir: PathBuf,
    capacity: u64,
    file_size: u64,
    /// held for the tier's life: the `flock` goes with the descriptor
    _lock: File,
    files: BTreeMap<u32, TierFile>,
    /// the file appends go to: a new one per open, so nothing is appended after a torn record
    active: u32,
    /// the active file has appends not yet synced
    unsynced: bool,
    live: HashMap<DiskId, Live>,
    used: u64,
    /// counts appends and reads, for [`TierFile::touched`] (starts past every file number, so a
    /// file used since the tier opened is more recent than any it found)
    clock: AtomicU64,
}

impl Tier {
    /// Opens the tier in `cfg.dir` (which must exist: a node's directory is the operator's to
    /// make), takes its lock, and reads every file's records: the live values are returned, the
    /// rest counted. Appends go to a new file.
    pub fn open(cfg: &TierConfig) -> Result<(Tier, Scan), TierError> {
        if !(MIN_FILE_SIZE..=MAX_FILE_SIZE).contains(&cfg.file_size) {
            return Err(TierError::Config(format!(
                "the tier's file size {} is outside {MIN_FILE_SIZE}..={MAX_FILE_SIZE}",
                cfg.file_size
            )));
        }
        let dir = cfg.dir.clone();
        let meta = fs::metadata(&dir).map_err(|e| io_err("the tier directory", &dir, e))?;
        if !meta.is_dir() {
            return Err(TierError::Config(format!("{} is not a directory", dir.display())));
        }
        let lock = lock(&dir)?;
        let mut numbers = Vec::new();
        for entry in fs::read_dir(&dir).map_err(|e| io_err("listing", &dir, e))? {
            let entry = entry.map_err(|e| io_err("listing", &dir, e))?;
            let name = entry.file_name();
            let Some(n) = name.to_str().and_then(file_number) else {
                continue;
            };
            numbers.push(n);
        }
        numbers.sort_unstable();
        let mut tier = Tier {
            dir,
            capacity: cfg.capacity,
            file_size: cfg.file_size,
            _lock: lock,
            files: BTreeMap::new(),
            active: 0,
            unsynced: false,
            live: HashMap::new(),
            used: 0,
            clock: AtomicU64::new(u64::from(u32::MAX) + 1),
        };
        let mut scan = Scan::default();
        for n in &numbers {
            tier.scan_file(*n, &mut scan)?;
        }
        let next = numbers.last().map_or(Some(0), |n| n.checked_add(1));
        tier.active = next.ok_or_else(|| TierError::Config("the tier's file numbers are used up".into()))?;
        Ok((tier, scan))
    }

    fn scan_file(&mut self, n: u32, scan: &mut Scan) -> Result<(), TierError> {
        let path = self.path_of(n);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| io_err("opening", &path, e))?;
        let len = file.metadata().map_err(|e| io_err("reading", &path, e))?.len();
        let mut live = 0;
        let mut off = 0;
        while off + HEADER_LEN as u64 <= len {
            match read_header(&file, off, len) {
                Ok(h) if off + h.payload_at() + h.len > len => {
                    scan.torn += 1;
                    break;
                }
                Ok(h) => {
                    let record_len = h.record_len();
                    if h.dead {
                        scan.dead += 1;
                    } else {
                        let id = DiskId::new(n, off);
                        self.live.insert(id, Live::of(&h));
                        scan.found.push(Found { id, header: h });
                        live += 1;
                    }
                    off += record_len;
                }
                Err(HeaderError::Io(e)) => return Err(io_err("reading", &path, e)),
                Err(HeaderError::Damage(_)) => {
                    // Zeros past the last record are what a crash between extending the file
                    // and writing leaves: not damage.
                    if !is_zero(&file, off) {
                        scan.damaged += 1;
                    }
                    off += ALIGN;
                }
            }
        }
        if live == 0 {
            fs::remove_file(&path).map_err(|e| io_err("deleting", &path, e))?;
            scan.emptied += 1;
            return Ok(());
        }
        self.used += len;
        self.files.insert(
            n,
            TierFile {
                file,
                len,
                live,
                touched: AtomicU64::new(u64::from(n)),
            },
        );
        Ok(())
    }

    /// Appends a value with what its record says of it (`header.len` and `header.checksum` are
    /// set from `value`; `dead` is ignored). Not durable until [`Tier::sync`].
    pub fn append(&mut self, header: &Header, value: &[u8]) -> Result<DiskId, TierError> {
        let header = Header {
            dead: false,
            len: value.len() as u64,
            checksum: format::value_checksum(value),
            ..header.clone()
        };
        let record_len = header.record_len();
        if self.used + record_len > self.capacity {
            return Err(TierError::Full {
                need: record_len,
                free: self.capacity.saturating_sub(self.used),
                capacity: self.capacity,
            });
        }
        if self
            .files
            .get(&self.active)
            .is_some_and(|f| f.len > 0 && f.len + record_len > self.file_size)
        {
            self.roll()?;
        }
        let n = self.active;
        if !self.files.contains_key(&n) {
            let path = self.path_of(n);
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&path)
                .map_err(|e| io_err("creating", &path, e))?;
            self.files.insert(
                n,
                TierFile {
                    file,
                    len: 0,
                    live: 0,
                    touched: AtomicU64::new(0),
                },
            );
        }
        let path = self.path_of(n);
        let f = self.files.get_mut(&n).expect("the active file was just opened");
        let off = f.len;
        let head = header.encode();
        // The value first, then the header that makes the record count, then the length.
        let written = f
            .file
            .write_all_at(value, off + head.len() as u64)
            .and_then(|()| f.file.write_all_at(&head, off))
            .and_then(|()| f.file.set_len(off + record_len));
        if let Err(e) = written {
            // Whatever was written stays behind the file's counted length and is overwritten by
            // the next append, or cut at the next open.
            let _ = f.file.set_len(off);
            return Err(io_err("writing", &path, e));
        }
        f.len += record_len;
        f.live += 1;
        f.touched.store(self.clock.fetch_add(1, Relaxed), Relaxed);
        self.used += record_len;
        self.unsynced = true;
        let id = DiskId::new(n, off);
        self.live.insert(id, Live::of(&header));
        Ok(id)
    }

    /// Makes every append so far durable (`fdatasync` of the file appended to).
    pub fn sync(&mut self) -> Result<(), TierError> {
        if !self.unsynced {
            return Ok(());
        }
        if let Some(f) = self.files.get(&self.active) {
            f.file
                .sync_data()
                .map_err(|e| io_err("syncing", &self.path_of(self.active), e))?;
        }
        self.unsynced = false;
        Ok(())
    }

    fn roll(&mut self) -> Result<(), TierError> {
        self.sync()?;
        self.active = self
            .active
            .checked_add(1)
            .ok_or_else(|| TierError::Config("the tier's file numbers are used up".into()))?;
        Ok(())
    }

    /// Removes the value at `id`: its record is marked dead, and its file deleted once no record
    /// in it is live (unless appends still go there). `false` if it held nothing there.
    pub fn kill(&mut self, id: DiskId) -> Result<bool, TierError> {
        if self.live.remove(&id).is_none() {
            return Ok(false);
        }
        let n = id.file();
        let path = self.path_of(n);
        let f = self.files.get_mut(&n).expect("a live record's file is open");
        f.live -= 1;
        if f.live == 0 && n != self.active {
            return self.delete_file(n).map(|_| true);
        }
        f.file
            .write_all_at(&format::dead_flags(), id.offset() + format::FLAGS_AT)
            .map_err(|e| io_err("writing", &path, e))?;
        Ok(true)
    }

    /// The oldest file that still holds records, and the values in it: what FIFO eviction of
    /// the tier removes next.
    pub fn oldest(&self) -> Option<(u32, Vec<DiskId>)> {
        let (&n, _) = self.files.iter().find(|(_, f)| f.live > 0)?;
        let mut ids: Vec<DiskId> = self.live.keys().copied().filter(|id| id.file() == n).collect();
        ids.sort_unstable();
        Some((n, ids))
    }

    /// The file that still holds records and was least recently appended to or read from, and
    /// the values in it: what LRU eviction of the tier removes next (a file at a time).
    pub fn least_recent(&self) -> Option<(u32, Vec<DiskId>)> {
        let (&n, _) = self
            .files
            .iter()
            .filter(|(_, f)| f.live > 0)
            .min_by_key(|(_, f)| f.touched.load(Relaxed))?;
        let mut ids: Vec<DiskId> = self.live.keys().copied().filter(|id| id.file() == n).collect();
        ids.sort_unstable();
        Some((n, ids))
    }

    /// Deletes file `n` with every value in it; returns those values.
    pub fn remove_file(&mut self, n: u32) -> Result<Vec<DiskId>, TierError> {
        if !self.files.contains_key(&n) {
            return Ok(Vec::new());
        }
        let mut ids: Vec<DiskId> = self.live.keys().copied().filter(|id| id.file() == n).collect();
        ids.sort_unstable();
        for id in &ids {
            self.live.remove(id);
        }
        self.delete_file(n)?;
        Ok(ids)
    }

    fn delete_file(&mut self, n: u32) -> Result<(), TierError> {
        let f = self.files.remove(&n).expect("an open file");
        self.used -= f.len;
        if n == self.active {
            // The next append starts a new file: never one whose number was handed out before.
            self.unsynced = false;
            self.roll()?;
        }
        let path = self.path_of(n);
        fs::remove_file(&path).map_err(|e| io_err("deleting", &path, e))
    }

    /// Bytes of records on disk (live ones, and dead ones in files that still hold a live one).
    pub fn used(&self) -> u64 {
        self.used
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// How many live values the tier holds.
    pub fn values(&self) -> usize {
        self.live.len()
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path_of(&self, n: u32) -> PathBuf {
        self.dir.join(format!("{n:08x}{SUFFIX}"))
    }
}

/// `0000002a.kvt` → 42; anything else is not a tier file.
fn file_number(name: &str) -> Option<u32> {
    let hex = name.strip_suffix(SUFFIX)?;
    (hex.len() == 8 && hex.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()))
        .then(|| u32::from_str_radix(hex, 16).ok())
        .flatten()
}

enum HeaderError {
    Damage(Damage),
    Io(io::Error),
}

fn read_header(file: &File, off: u64, len: u64) -> Result<Header, HeaderError> {
    let mut fixed = [0u8; HEADER_LEN];
    file.read_exact_at(&mut fixed, off).map_err(HeaderError::Io)?;
    let tag_len = Header::tag_len(&fixed).map_err(HeaderError::Damage)?;
    if off + (HEADER_LEN + tag_len) as u64 > len {
        return Err(HeaderError::Damage(Damage::Short));
    }
    let mut all = vec![0u8; HEADER_LEN + tag_len];
    all[..HEADER_LEN].copy_from_slice(&fixed);
    file.read_exact_at(&mut all[HEADER_LEN..], off + HEADER_LEN as u64)
        .map_err(HeaderError::Io)?;
    Header::decode(&all).map_err(HeaderError::Damage)
}

/// Whether the [`ALIGN`] bytes at `off` (or up to the file's end) are all zero.
fn is_zero(file: &File, off: u64) -> bool {
    let mut b = vec![0u8; ALIGN as usize];
    let mut got = 0;
    while got < b.len() {
        match file.read_at(&mut b[got..], off + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(_) => return false,
        }
    }
    b[..got].iter().all(|&x| x == 0)
}

fn lock(dir: &Path) -> Result<File, TierError> {
    let path = dir.join(LOCK);
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| io_err("opening", &path, e))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(fs::TryLockError::WouldBlock) => Err(TierError::Locked(dir.to_path_buf())),
        Err(fs::TryLockError::Error(e)) => Err(io_err("locking", &path, e)),
    }
}

fn io_err(what: &'static str, path: &Path, source: io::Error) -> TierError {
    TierError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

#[cfg(test)]
mod tests;
