//! A value read from the tier to a reader piece by piece (a direct read, op 7), each piece read
//! off the runtime (by the member's tier readers) so several are in flight while the ones before
//! are hashed and sent.
//!
//! Pieces are read with `O_DIRECT` where the file system allows it: the device writes them
//! straight into the buffer (no page-cache copy, no page allocation per read), as `dd
//! iflag=direct` reads. `O_DIRECT` needs offsets, lengths and buffers aligned to the device's
//! block, and a value starts 64 bytes into its record ([`super::format`]): each piece reads the
//! [`BLOCK`]-aligned span around its bytes into a buffer aligned within a larger `Vec` (found
//! with `align_offset`, no `unsafe`), and only its bytes are hashed and sent. Where `O_DIRECT` is
//! refused (tmpfs, some overlay file systems), pieces are read through the page cache.
//!
//! The descriptor is the stream's own: records are only ever appended and their flags rewritten,
//! so a value's bytes stay what they were even if the tier drops or kills the record meanwhile.
//! Until [`Stream::finish`] says so, the pieces are not known to be the value.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use xxhash_rust::xxh3::Xxh3;

use super::{DiskId, ReadError, io_err};

/// The alignment of `O_DIRECT` reads: a page, a multiple of every usual logical block.
pub const BLOCK: u64 = 4096;

/// The smallest piece a read is cut into ([`tapering`]): a multiple of [`BLOCK`], with room for
/// any record's header and tag.
pub const PIECE: u64 = 256 << 10;
/// The largest piece (a read's first ones, [`tapering`]).
pub const LARGEST_PIECE: u64 = 8 * PIECE;
const _: () = assert!(PIECE.is_multiple_of(BLOCK) && LARGEST_PIECE.is_multiple_of(BLOCK));

/// The pieces a read of the file's bytes `from..to` is cut into, in order, as (where in the
/// file, length): largest first. From the end, two of [`PIECE`] (the last with the bytes past
/// the last whole [`BLOCK`]), then each twice the one after it up to [`LARGEST_PIECE`], the
/// first taking what is left (with the one after it when that is less than a [`PIECE`]). Every
/// piece but the first starts on a [`BLOCK`], so with `O_DIRECT` (each piece reads the blocks
/// around its bytes) no block is read twice. None for no bytes.
///
/// Why not all of one size: a piece is a request to the device, and this VM's virtio disk serves
/// requests one after the other at a fixed cost each on top of its bytes (`dd`'s 4 MiB block is
/// one request; a 4 MiB value in sixteen 256 KiB pieces made a get about 1 ms slower than it,
/// 77% of its throughput), while what is left once the device is done (to copy and hash)
/// is the last piece (four 1 MiB pieces: 84% of `dd`). Pieces that halve towards the end are
/// five requests for 4 MiB, and only the last 256 KiB wait for the device to finish. A same-host
/// client reads so (`client/disk.rs`: it copies each piece as it lands, in any order); op 7,
/// which sends its pieces in order, does not (`dataport/disk.rs` says why).
pub fn tapering(from: u64, to: u64) -> Vec<(u64, u64)> {
    // where pieces start, from the end
    let mut starts = Vec::new();
    let (mut end, mut size) = (to, PIECE);
    loop {
        let start = end.saturating_sub(size) / BLOCK * BLOCK;
        if start <= from {
            break;
        }
        starts.push(start);
        end = start;
        if starts.len() >= 2 {
            size = (size * 2).min(LARGEST_PIECE);
        }
    }
    if end - from < PIECE {
        starts.pop();
    }
    starts.push(from);
    let mut pieces = Vec::with_capacity(starts.len());
    let mut end = to;
    for &start in &starts {
        if end > start {
            pieces.push((start, end - start));
        }
        end = start;
    }
    pieces.reverse();
    pieces
}

/// A value being read piece by piece (see the module's doc).
pub struct Stream {
    id: DiskId,
    file: Arc<File>,
    /// `file` was opened with `O_DIRECT`
    direct: bool,
    path: Arc<PathBuf>,
    /// where the value's bytes start in the file
    at: u64,
    pub len: u64,
    /// bytes hashed so far (pieces are taken in order)
    taken: u64,
    checksum: u64,
    hasher: Xxh3,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("id", &self.id)
            .field("path", &self.path)
            .field("direct", &self.direct)
            .field("at", &self.at)
            .field("len", &self.len)
            .field("taken", &self.taken)
            .finish_non_exhaustive()
    }
}

/// One piece as read: its bytes are `buf[start..start + n]`.
#[derive(Debug)]
pub struct Piece {
    buf: Vec<u8>,
    start: usize,
    n: usize,
}

impl Piece {
    pub fn bytes(&self) -> &[u8] {
        &self.buf[self.start..self.start + self.n]
    }

    /// Its buffer, for the next piece.
    pub fn into_buffer(self) -> Vec<u8> {
        self.buf
    }
}

impl Stream {
    /// The value of `len` bytes at `at` in `file` (at `path`), which must hash to `checksum`.
    pub(super) fn open(id: DiskId, file: &File, path: &Path, at: u64, len: u64, checksum: u64) -> io::Result<Stream> {
        let direct = OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(path);
        let (file, direct) = match direct {
            Ok(f) => (f, true),
            Err(_) => (file.try_clone()?, false),
        };
        Ok(Stream {
            id,
            file: Arc::new(file),
            direct,
            path: Arc::new(path.to_path_buf()),
            at,
            len,
            taken: 0,
            checksum,
            hasher: Xxh3::new(),
        })
    }

    pub fn id(&self) -> DiskId {
        self.id
    }

    /// Whether pieces are read with `O_DIRECT`.
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// The same stream read through the page cache (the path where `O_DIRECT` is refused).
    #[cfg(test)]
    pub fn through_page_cache(mut self) -> Stream {
        self.file = Arc::new(File::open(&*self.path).unwrap());
        self.direct = false;
        self
    }

    /// The pieces to read, in order, as (where in the value, length): `piece` bytes each, the last
    /// what is left. When `piece` is a multiple of [`BLOCK`] the first is cut short at the file's
    /// last block boundary within it, so every later piece starts on one and no block of the file
    /// is read by two pieces (with `O_DIRECT` each reads the blocks around its bytes).
    pub fn pieces(&self, piece: u64) -> Vec<(u64, u64)> {
        let piece = piece.max(1);
        let to_boundary = (self.at + piece) / BLOCK * BLOCK;
        let first = if piece.is_multiple_of(BLOCK) && to_boundary > self.at {
            to_boundary - self.at
        } else {
            piece
        };
        let mut pieces = Vec::with_capacity(self.len.div_ceil(piece) as usize + 1);
        let mut at = 0;
        while at < self.len {
            let n = if at == 0 { first } else { piece }.min(self.len - at);
            pieces.push((at, n));
            at += n;
        }
        pieces
    }

    /// Where the value's bytes start in the file.
    #[cfg(test)]
    pub fn at(&self) -> u64 {
        self.at
    }

    /// The read of the piece of `n` bytes `at` into the value (one of [`Stream::pieces`]), to run
    /// off the runtime, into the buffer it is given then (grown as it must be: a buffer of an
    /// earlier piece needs no new pages).
    pub fn read_piece(&self, (at, n): (u64, u64)) -> impl FnOnce(Vec<u8>) -> Result<Piece, ReadError> + Send + 'static {
        let (file, path, direct, id) = (self.file.clone(), self.path.clone(), self.direct, self.id);
        let from = self.at + at;
        let n = n.min(self.len.saturating_sub(at));
        move |buf: Vec<u8>| {
            read_span(&file, direct, from, n, buf).map_err(|e| match e.kind() {
                io::ErrorKind::UnexpectedEof => ReadError::Damaged {
                    id,
                    why: "the file ends inside the value".into(),
                },
                _ => io_err("reading", &path, e).into(),
            })
        }
    }

    /// The descriptor the pieces are read from: a same-host reader is handed it
    /// (`member/local.rs`) and finds the record by its disk id.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Hashes the next piece (they must come in order; a piece may be sent before it is hashed:
    /// the verdict after the last says whether they were the value).
    pub fn take(&mut self, p: &Piece) {
        let bytes = p.bytes();
        self.hasher.update(bytes);
        self.taken += bytes.len() as u64;
    }

    /// Whether the bytes taken were the value: all of it, matching its checksum.
    pub fn finish(&self) -> Result<(), ReadError> {
        if self.taken == self.len && self.hasher.digest() == self.checksum {
            return Ok(());
        }
        Err(ReadError::Damaged {
            id: self.id,
            why: "its bytes do not match their checksum".into(),
        })
    }
}

/// Buffers of pieces kept between reads, at most `MOST` (each about a piece and a block): a read
/// takes one an earlier read gave back, or a new one. The member's direct reads and a same-host
/// client's reads of the tier (`client/disk.rs`) keep them so.
#[derive(Debug, Default)]
pub struct PieceBuffers<const MOST: usize>(parking_lot::Mutex<Vec<Vec<u8>>>);

impl<const MOST: usize> PieceBuffers<MOST> {
    pub fn take(&self) -> Vec<u8> {
        self.0.lock().pop().unwrap_or_default()
    }

    /// Keeps `buf` for a next read, unless `MOST` are kept.
    pub fn give_back(&self, buf: Vec<u8>) {
        let mut kept = self.0.lock();
        if kept.len() < MOST {
            kept.push(buf);
        }
    }

    #[cfg(test)]
    pub fn kept(&self) -> usize {
        self.0.lock().len()
    }
}

/// Reads the `n` bytes at `from` in `file` into `buf` (grown as it must be, never shortened), with `O_DIRECT`
/// alignment when `direct` says the descriptor was opened with it: the [`BLOCK`]-aligned span
/// around the bytes, into a part of `buf` aligned within it. The file ending before the bytes do
/// is `UnexpectedEof`. Also what a same-host client reads a copy with (`client/disk.rs`).
pub fn read_span(file: &File, direct: bool, from: u64, n: u64, mut buf: Vec<u8>) -> io::Result<Piece> {
    // grown only: a kept buffer longer than this piece needs is not cut and zeroed again later
    let grow = |buf: &mut Vec<u8>, len: usize| {
        if buf.len() < len {
            buf.resize(len, 0);
        }
    };
    if !direct {
        grow(&mut buf, n as usize);
        file.read_exact_at(&mut buf[..n as usize], from)?;
        return Ok(Piece {
            buf,
            start: 0,
            n: n as usize,
        });
    }
    let lo = from - from % BLOCK;
    let hi = (from + n).next_multiple_of(BLOCK);
    let span = (hi - lo) as usize;
    grow(&mut buf, span + BLOCK as usize);
    let align = buf.as_ptr().align_offset(BLOCK as usize);
    let got = read_to_end(file, &mut buf[align..align + span], lo)?;
    let start = (from - lo) as usize;
    if got < start + n as usize {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(Piece {
        buf,
        start: align + start,
        n: n as usize,
    })
}

/// Reads into `buf` (aligned, as `at` is) until it is full or the file ends: how many bytes. A
/// read that stops short of a block's end has met the end of the file (reading on from there
/// would be unaligned).
fn read_to_end(file: &File, buf: &mut [u8], at: u64) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match file.read_at(&mut buf[got..], at + got as u64) {
            Ok(0) => break,
            Ok(n) if !(n as u64).is_multiple_of(BLOCK) => return Ok(got + n),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}
