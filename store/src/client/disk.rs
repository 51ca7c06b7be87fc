//! A same-host client's read of a value's copy on its member's disk tier, from the tier file
//! itself: the member checked a grant and handed over the file's descriptor (op 8,
//! `member/local.rs`), which this client keeps for later reads of that file ([`TierFiles`]); the
//! record lies where the copy's disk id says, and its bytes go from the device into this
//! process's buffers and are copied into the caller's, crossing neither the member nor a socket.
//!
//! The record is read in pieces of the file, largest first (`member/tier/stream.rs`,
//! [`tapering`], says why: a 4 MiB value is five requests to the device, and only the last 256
//! KiB wait for it to finish; the first piece holds the record's header and tag, each is on the
//! device's blocks, so a read asks the device for no block twice) on the runtime's blocking
//! threads, the next asked for as each lands and at most [`WINDOW`] at once for all this client's
//! reads together ([`DiskReads`]), each into a buffer kept between reads (with the member's
//! `O_DIRECT` alignment when the descriptor was opened with it), copied into the caller's buffer
//! as it lands and hashed in order. The bytes are the value only if the header reads (its own
//! checksum), is live, carries the Location's tag and length, and the value's bytes match its
//! checksum. Until then the caller's buffer holds nothing it may use.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::Instant;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use parking_lot::Mutex;
use xxhash_rust::xxh3::Xxh3;

use super::data::Sink;
use crate::grant::MAX_TAG_LEN;
use crate::member::local::FILE_KEEP;
use crate::member::tier::format::{self, Header};
use crate::member::tier::{DiskId, PIECE, Piece, PieceBuffers, read_span, tapering};
use crate::proto::Location;

const _: () = assert!(PIECE as usize >= format::HEADER_LEN + MAX_TAG_LEN + 64);
/// Pieces in flight at once, for all of a client's reads of tier files together.
const WINDOW: usize = 8;
/// How many piece buffers are kept between reads, for every member together (each up to
/// about `LARGEST_PIECE`).
const KEPT_BUFFERS: usize = WINDOW;
/// Most tier files kept open at once (the one handed over first is closed first).
pub const MOST_FILES: usize = 64;

/// A tier file handed over by a member: its descriptor, and whether it was opened with `O_DIRECT`.
#[derive(Debug, Clone)]
pub(super) struct TierFile {
    pub file: Arc<File>,
    pub direct: bool,
}

#[derive(Debug)]
struct Kept {
    file: TierFile,
    handed: Instant,
}

/// The tier files this client keeps open, by the member's same-host socket and the file's number.
/// A file is kept [`FILE_KEEP`] from when it was handed over, then asked for again (closed by a
/// task that runs while any is kept): a file the member deleted gives its space back soon after,
/// and the member sees each file a client reads in use (`--tier-lru`). At most [`MOST_FILES`]
/// are kept.
#[derive(Debug, Default)]
pub(super) struct TierFiles {
    kept: Arc<Mutex<Files>>,
}

#[derive(Debug, Default)]
struct Files {
    open: HashMap<(String, u32), Kept>,
    /// a task closes the expired files
    closing: bool,
}

impl TierFiles {
    /// The file `number` of the member behind `socket`, if kept and handed over less than
    /// [`FILE_KEEP`] ago.
    pub(super) fn get(&self, socket: &str, number: u32) -> Option<TierFile> {
        let kept = self.kept.lock();
        let k = kept.open.get(&(socket.to_string(), number))?;
        (k.handed.elapsed() < FILE_KEEP).then(|| k.file.clone())
    }

    /// Keeps a file handed over now, closing the one handed over first past [`MOST_FILES`], and
    /// starts the task that closes them unless it runs.
    pub(super) fn keep(&self, socket: &str, number: u32, file: TierFile) {
        let mut kept = self.kept.lock();
        if kept.open.len() >= MOST_FILES
            && let Some(oldest) = kept
                .open
                .iter()
                .min_by_key(|(_, k)| k.handed)
                .map(|(key, _)| key.clone())
        {
            kept.open.remove(&oldest);
        }
        let handed = Instant::now();
        kept.open.insert((socket.to_string(), number), Kept { file, handed });
        if !kept.closing {
            kept.closing = true;
            tokio::spawn(close_expired(Arc::downgrade(&self.kept)));
        }
    }

    /// Forgets the files of the member behind `socket` (it went away).
    pub(super) fn forget(&self, socket: &str) {
        self.kept.lock().open.retain(|(s, _), _| s != socket);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.kept.lock().open.len()
    }
}

/// Closes the files handed over [`FILE_KEEP`] ago or more, every second, until none is kept (or
/// the client is gone).
async fn close_expired(kept: Weak<Mutex<Files>>) {
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let Some(kept) = kept.upgrade() else {
            return;
        };
        let mut kept = kept.lock();
        kept.open.retain(|_, k| k.handed.elapsed() < FILE_KEEP);
        if kept.open.is_empty() {
            kept.closing = false;
            return;
        }
    }
}

/// What this client's reads of tier files share: the window of [`WINDOW`] pieces asked of the
/// device at once, for all of them together (a batch's values are read at once, and the device
/// reads fastest with a few requests in flight, not dozens), given out in the order asked for;
/// and the piece buffers kept between reads (a piece waiting for the window holds none).
#[derive(Debug)]
pub(super) struct DiskReads {
    window: Arc<Semaphore>,
    buffers: PieceBuffers<KEPT_BUFFERS>,
}

impl Default for DiskReads {
    fn default() -> Self {
        DiskReads {
            window: Arc::new(Semaphore::new(WINDOW)),
            buffers: PieceBuffers::default(),
        }
    }
}

/// Reads the value `loc` names (its `offset` the copy's disk id) from `file` into `sink` (which
/// holds exactly its length): whether the bytes are the value (see the module's doc). `Err` when
/// the file could not be read (it ends inside the record, or the device failed).
pub(super) async fn read_copy(
    file: &TierFile,
    loc: &Location,
    sink: &mut Sink<'_, '_>,
    reads: &DiskReads,
) -> io::Result<bool> {
    let record = DiskId(loc.offset).offset();
    let header_len = format::payload_at(loc.tag.len());
    let pieces = Pieces::new(header_len, header_len + loc.len);
    let count = pieces.count();
    let ask = |k: u64| {
        let (from, n) = pieces.span(k);
        let (f, direct, window) = (file.file.clone(), file.direct, reads.window.clone());
        async move {
            let turn = window.acquire_owned().await.expect("the window is never closed");
            let buf = reads.buffers.take();
            let read = tokio::task::spawn_blocking(move || {
                let read = read_span(&f, direct, record + from, n, buf);
                // the next piece is asked for while this one is copied
                drop(turn);
                read
            });
            (k, read.await)
        }
    };
    let mut reading: FuturesUnordered<_> = (0..count.min(WINDOW as u64)).map(ask).collect();
    let mut asked = reading.len() as u64;
    // after the first reads are asked for: a fresh buffer is zeroed while the device reads
    let mut fill = Fill::new(sink, loc.len)?;
    let mut hashed = 0;
    let mut landed = vec![false; count as usize];
    let mut header = None;
    let mut hasher = Xxh3::new();
    while let Some((k, p)) = reading.next().await {
        let p: Piece = p.map_err(io::Error::other)??;
        // the device reads the next piece while this one is copied
        if asked < count {
            reading.push(ask(asked));
            asked += 1;
        }
        let (at, before) = pieces.value_at(k);
        let (head, value) = p.bytes().split_at(before as usize);
        if k == 0 {
            header = Some(Header::decode(head));
        }
        fill.put(at as usize, value);
        reads.buffers.give_back(p.into_buffer());
        landed[k as usize] = true;
        while landed.get(hashed).copied().unwrap_or(false) {
            let (at, before) = pieces.value_at(hashed as u64);
            let n = pieces.span(hashed as u64).1 - before;
            fill.hash(at as usize, n as usize, &mut hasher);
            hashed += 1;
        }
    }
    // every piece came (a failed one returned above), so all were hashed
    Ok(match header {
        Some(Ok(h)) => !h.dead && h.tag == loc.tag && h.len == loc.len && h.checksum == hasher.digest(),
        _ => false,
    })
}

/// A record cut into pieces of the file from its start ([`tapering`]: largest first, the first
/// with its header and tag, `header_len` bytes, then its value).
#[derive(Debug, Clone)]
struct Pieces {
    header_len: u64,
    /// each piece, from the record's start: (where it starts, how many bytes)
    spans: Vec<(u64, u64)>,
}

impl Pieces {
    fn new(header_len: u64, end: u64) -> Pieces {
        let mut spans = tapering(0, end);
        if spans.is_empty() {
            // no bytes: one empty piece
            spans.push((0, 0));
        }
        Pieces { header_len, spans }
    }

    /// How many.
    fn count(&self) -> u64 {
        self.spans.len() as u64
    }

    /// Piece `k`'s bytes, from the record's start: (where they start, how many).
    fn span(&self, k: u64) -> (u64, u64) {
        self.spans[k as usize]
    }

    /// Where piece `k`'s value bytes go in the value, and how many header bytes come first.
    fn value_at(&self, k: u64) -> (u64, u64) {
        if k == 0 {
            (0, self.header_len)
        } else {
            (self.spans[k as usize].0 - self.header_len, 0)
        }
    }
}

/// A sink of a value's length, filled at any offset.
struct Fill<'s, 'a, 'b> {
    sink: &'s mut Sink<'a, 'b>,
}

impl<'s, 'a, 'b> Fill<'s, 'a, 'b> {
    /// `sink` made `len` bytes long (a fresh buffer grown to it, zeroed while the device reads);
    /// a slice or parts of another length are refused.
    fn new(sink: &'s mut Sink<'a, 'b>, len: u64) -> io::Result<Self> {
        let len = len as usize;
        let fits = match &mut *sink {
            Sink::Slice(out) => out.len() == len,
            Sink::Parts(parts) => parts.iter().map(|p| p.len()).sum::<usize>() == len,
            Sink::Fresh(out) => {
                out.clear();
                out.resize(len, 0);
                true
            }
        };
        if !fits {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the buffer is not the copy's length",
            ));
        }
        Ok(Fill { sink })
    }

    /// The slices of the sink that hold `n` bytes from `at` (within its length).
    fn slices(&mut self, at: usize, n: usize, mut each: impl FnMut(&mut [u8])) {
        match &mut *self.sink {
            Sink::Slice(out) => each(&mut out[at..at + n]),
            Sink::Fresh(out) => each(&mut out[at..at + n]),
            Sink::Parts(parts) => {
                let (mut skip, mut left) = (at, n);
                for part in parts.iter_mut() {
                    if left == 0 {
                        break;
                    }
                    if skip >= part.len() {
                        skip -= part.len();
                        continue;
                    }
                    let k = (part.len() - skip).min(left);
                    each(&mut part[skip..skip + k]);
                    (skip, left) = (0, left - k);
                }
            }
        }
    }

    /// Copies `bytes` in at `at` (a piece of the value: within its length).
    fn put(&mut self, at: usize, bytes: &[u8]) {
        let mut from = 0;
        self.slices(at, bytes.len(), |dst| {
            dst.copy_from_slice(&bytes[from..from + dst.len()]);
            from += dst.len();
        });
    }

    /// Hashes the `n` bytes at `at`.
    fn hash(&mut self, at: usize, n: usize, hasher: &mut Xxh3) {
        self.slices(at, n, |b| hasher.update(b));
    }
}

#[cfg(test)]
mod tests;
