//! Segment memory shared between processes: a member's segment (a memfd it maps and may hand to
//! clients on its host), a same-host client's mapping of it, and the member's table of ranges in
//! use. This is the only module of the store with `unsafe` code.
//!
//! # Why this is sound
//!
//! 1. **No Rust reference into shared memory, ever.** Another process (a same-host client, or
//!    the member) may write any byte of the mapping at any moment, which no `&[u8]` or
//!    `&mut [u8]` may allow. Every access is a raw copy (`ptr::copy_nonoverlapping`) between
//!    the mapping and memory this process owns, or a `recv`/`send`/`sendmsg` system call given
//!    a raw pointer; bytes copied out are plain data, never trusted for anything but their value.
//! 2. **Bounds.** Every pointer handed to a copy or a system call lies inside the mapping:
//!    ranges are checked against its length (with overflow checks) before any access, and the
//!    mapping lives as long as the value that owns it (guards borrow it).
//! 3. **Who may touch a range, when** (what keeps bytes of one key from mixing with another's;
//!    memory safety does not depend on it, correctness does):
//!    - the member's range table grants a write claim only if it overlaps no live claim, and a
//!      read claim only if it overlaps no live write claim, whatever clients send. The data
//!      port and gRPC copy only inside a claim they hold; a same-host client copies only inside
//!      a claim the member granted it over the local socket, and holds it until it releases it
//!      or its connection closes (`member/local.rs`);
//!    - the leader hands a range to one writer at a time: a reservation owns its range until it
//!      is committed or reclaimed (`--put-ttl` + `--put-grace`, longer than any write may run),
//!      and a read lease keeps an object, so its range, from being evicted or removed;
//!    - a read that finished after its lease ran out is reported (`LEASE_EXPIRED`) by the
//!      client and its bytes are dropped, never returned.
#![allow(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::Path;

use memmap2::{MmapMut, MmapOptions};
use parking_lot::Mutex;
use tokio::io::Interest;
use tokio::net::TcpStream;

use crate::error::{ErrorCode, StoreError};

/// A mapped segment: the member's own, or a client's view of a member's.
#[derive(Debug)]
pub struct SharedMap {
    mapping: MmapMut,
    /// the memory's descriptor (a memfd, or an unlinked file), kept to hand to same-host clients
    file: File,
    /// its size can never change again (a memfd sealed against shrinking and growing, and
    /// against new seals): whoever holds the descriptor cannot truncate the memory from under
    /// the mappings, which would end every process that maps it with SIGBUS
    sealed: bool,
    ptr: *mut u8,
    len: u64,
    /// live claims: (offset, len, write)
    live: Mutex<Vec<(u64, u64, bool)>>,
}

// SAFETY: the pointer is into a mapping owned by this value for its whole life, and it is only
// used for raw copies and system calls within bounds (module rules 1 and 2), which any thread may
// make.
unsafe impl Send for SharedMap {}
// SAFETY: as above; shared access only takes claims (a mutex) and makes raw copies.
unsafe impl Sync for SharedMap {}

fn out_of_range(offset: u64, len: u64, size: u64) -> StoreError {
    StoreError::new(
        ErrorCode::OutOfRange,
        format!("range {offset}+{len} is outside this {size}-byte segment; ask the leader again"),
    )
}

impl SharedMap {
    /// A fresh segment of `len` bytes: a memfd (so nothing appears in any directory, and the
    /// memory goes back to the system when the last process mapping it ends), or, where the
    /// kernel refuses memfds, a file in `dir` (normally `/dev/shm`) unlinked at once. With
    /// `populate` every page is faulted in now; without, memory is claimed as it is written.
    /// A memfd is sealed at its size before it is mapped ([`SharedMap::is_sealed`]).
    pub fn create(dir: &Path, len: u64, populate: bool) -> io::Result<Self> {
        use rustix::fs::{MemfdFlags, SealFlags};
        let memfd = rustix::fs::memfd_create("kvstore-segment", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING);
        let (file, sealed) = match memfd {
            Ok(fd) => {
                let file = File::from(fd);
                file.set_len(len)?;
                rustix::fs::fcntl_add_seals(&file, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
                (file, true)
            }
            Err(e) => {
                tracing::info!(error = %e, dir = %dir.display(), "no memfd; the segment is a file in the directory instead");
                let file = Self::unlinked_file(dir)?;
                file.set_len(len)?;
                (file, false)
            }
        };
        let mut map = Self::map(file, len, populate)?;
        map.sealed = sealed;
        Ok(map)
    }

    /// Whether the memory's size is sealed (a memfd), so its descriptor may be handed to another
    /// process: one that truncated it would end every process mapping it (SIGBUS). The file
    /// fallback cannot be sealed.
    pub fn is_sealed(&self) -> bool {
        self.sealed
    }

    fn unlinked_file(dir: &Path) -> io::Result<File> {
        let path = dir.join(format!(
            "kvstore-segment-{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        ));
        let file = OpenOptions::new().read(true).write(true).create_new(true).open(&path)?;
        // unlinked before the (slow) sizing and faulting-in: a member stopped at any point from
        // here on leaves nothing in the directory; the descriptor keeps the memory
        std::fs::remove_file(&path)?;
        Ok(file)
    }

    /// Maps a segment another process created and handed over (`fd`, `len` bytes), for a
    /// same-host client. Its size is checked against `len`, so no access can pass its end.
    /// With `populate` (the member's pages are all resident) the page tables are filled in now,
    /// writable: a read fault would map a shared page read-only, and the first write to each
    /// page would then pay a second fault on the data path.
    pub fn attach(fd: OwnedFd, len: u64, populate: bool) -> io::Result<Self> {
        let file = File::from(fd);
        let size = file.metadata()?.len();
        if size < len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the segment handed over is {size} bytes, not {len}"),
            ));
        }
        let map = Self::map(file, len, false)?;
        if populate && let Err(e) = map.mapping.advise(memmap2::Advice::PopulateWrite) {
            // older kernels (before 5.14): pages fault in as they are first used
            tracing::debug!(error = %e, "MADV_POPULATE_WRITE refused");
        }
        Ok(map)
    }

    fn map(file: File, len: u64, populate: bool) -> io::Result<Self> {
        let mut options = MmapOptions::new();
        options.len(usize::try_from(len).map_err(|_| io::Error::other("segment larger than the address space"))?);
        if populate {
            options.populate();
        }
        // SAFETY: memmap2's contract is that nobody truncates or writes the file behind the
        // mapping while Rust references to it exist. None ever exist (module rule 1), and the
        // file is only ever sized before this line (a memfd, sealed at that size before a
        // same-host client can get it, or a file we created and unlinked: no other process can
        // open it by name, and it is never handed out).
        let mut map = unsafe { options.map_mut(&file) }?;
        let ptr = map.as_mut_ptr();
        Ok(Self {
            mapping: map,
            file,
            sealed: false,
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

    /// The memory's descriptor, to hand to a same-host client (SCM_RIGHTS).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    fn check(&self, offset: u64, len: u64) -> Result<(), StoreError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len && len > 0 => Ok(()),
            _ => Err(out_of_range(offset, len, self.len)),
        }
    }

    fn claim(&self, offset: u64, len: u64, write: bool) -> Result<(), StoreError> {
        self.check(offset, len)?;
        let end = offset + len;
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

    /// Claims `offset..offset+len` for writing: no other claim overlaps it until the guard drops.
    pub fn write_range(&self, offset: u64, len: u64) -> Result<WriteRange<'_>, StoreError> {
        self.claim(offset, len, true)?;
        Ok(WriteRange { map: self, offset, len })
    }

    /// Claims `offset..offset+len` for reading: no write claim overlaps it until the guard drops.
    pub fn read_range(&self, offset: u64, len: u64) -> Result<ReadRange<'_>, StoreError> {
        self.claim(offset, len, false)?;
        Ok(ReadRange { map: self, offset, len })
    }

    /// Copies `src` into the mapping at `offset`, for a same-host client holding a write claim
    /// the member granted on these bytes (module rule 3).
    pub fn copy_in(&self, offset: u64, src: &[u8]) -> Result<(), StoreError> {
        self.check(offset, src.len() as u64)?;
        // SAFETY: in bounds (checked); `src` is this process's memory, which cannot overlap a
        // mapping of shared memory made by `map`; no reference to the mapping is made (rule 1).
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.add(offset as usize), src.len()) };
        Ok(())
    }

    /// Copies the mapping at `offset` into `dst`, for a same-host client holding a read claim
    /// the member granted on these bytes (module rule 3).
    pub fn copy_out(&self, offset: u64, dst: &mut [u8]) -> Result<(), StoreError> {
        self.check(offset, dst.len() as u64)?;
        // SAFETY: in bounds (checked); `dst` is this process's memory and cannot overlap the
        // mapping; no reference to the mapping is made (rule 1).
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(offset as usize), dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    /// Appends `len` bytes of the mapping at `offset` to `out`, with no zeroing pass first, for
    /// a same-host client holding a read claim the member granted on them (module rule 3).
    pub fn copy_out_into(&self, offset: u64, len: u64, out: &mut bytes::BytesMut) -> Result<(), StoreError> {
        self.check(offset, len)?;
        let len = len as usize;
        out.reserve(len);
        let spare = out.spare_capacity_mut();
        // SAFETY: in bounds (checked); `spare` is at least `len` bytes this process owns (just
        // reserved) and cannot overlap the mapping; once they are written, `set_len` exposes
        // exactly those bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr.add(offset as usize), spare.as_mut_ptr().cast::<u8>(), len);
            out.set_len(out.len() + len);
        }
        Ok(())
    }

    /// A checksum (XXH3-64) of `offset..offset+len` as it is now, copied out in pieces (rule 1:
    /// the hash reads this process's copy, never the mapping).
    pub fn checksum(&self, offset: u64, len: u64) -> Result<u64, StoreError> {
        self.check(offset, len)?;
        const PIECE: u64 = 64 * 1024;
        let mut buf = vec![0u8; PIECE.min(len) as usize];
        let mut hasher = xxhash_rust::xxh3::Xxh3::new();
        let mut at = 0;
        while at < len {
            let n = PIECE.min(len - at) as usize;
            self.copy_out(offset + at, &mut buf[..n])?;
            hasher.update(&buf[..n]);
            at += n as u64;
        }
        Ok(hasher.digest())
    }

    /// Keeps the mapping's pages resident (writes one zero per page), so the first writes of a
    /// fresh segment do not pay page faults on the data path.
    pub fn prefault(&self) {
        let Ok(_claim) = self.write_range(0, self.len) else {
            return;
        };
        for at in (0..self.len).step_by(4096) {
            // SAFETY: `at` < len (in bounds); a single-byte raw write, under a claim of the
            // whole segment, before any client can have been handed the segment.
            unsafe { self.ptr.add(at as usize).write_volatile(0) };
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
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Fills the range with `src` (exactly its length).
    pub fn copy_from(&mut self, src: &[u8]) -> Result<(), StoreError> {
        if src.len() as u64 != self.len {
            return Err(StoreError::new(
                ErrorCode::InvalidArgument,
                format!("{} bytes sent for a {}-byte range", src.len(), self.len),
            ));
        }
        self.map.copy_in(self.offset, src)
    }

    /// Fills the range's bytes from `at` with `src` (for bytes that arrive in pieces, decrypted
    /// in this process's memory first: `dataport.rs` over TLS).
    pub fn copy_part(&mut self, at: u64, src: &[u8]) -> Result<(), StoreError> {
        if at.checked_add(src.len() as u64).is_none_or(|end| end > self.len) {
            return Err(out_of_range(at, src.len() as u64, self.len));
        }
        self.map.copy_in(self.offset + at, src)
    }

    /// Fills the range with the next bytes of `s`, received straight into the mapping, and
    /// returns their XXH3-64. Each piece is hashed as soon as it lands, while it is still in the
    /// cache and the next piece is on its way (copied out first, rule 1), instead of in a second
    /// pass over the whole range.
    pub async fn recv_from(&mut self, s: &TcpStream) -> io::Result<u64> {
        let len = self.len as usize;
        let mut hashing = Hashing::new(64 * 1024, len);
        let mut done = 0;
        while done < len {
            s.readable().await?;
            let got = s.try_io(Interest::READABLE, || {
                // SAFETY: `offset + done .. offset + len` is inside the claimed range, which is
                // inside the mapping (rules 2 and 3); the kernel writes through a raw pointer.
                let n = unsafe {
                    libc::recv(
                        s.as_raw_fd(),
                        self.map.ptr.add(self.offset as usize + done).cast(),
                        len - done,
                        0,
                    )
                };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(n as usize)
                }
            });
            match got {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
            hashing.up_to(self, done)?;
        }
        Ok(hashing.digest())
    }

    /// Fills the range with `file`'s bytes from `at`, read straight into the mapping (`pread`
    /// given its pointer: no copy through this process's memory), and returns their XXH3-64,
    /// each piece hashed as soon as it lands (copied out first, rule 1). A file that ends first
    /// is `UnexpectedEof`.
    pub fn read_from_file(&mut self, file: &File, at: u64) -> io::Result<u64> {
        const PIECE: usize = 256 * 1024;
        let len = self.len as usize;
        let mut hashing = Hashing::new(PIECE, len);
        let mut done = 0;
        while done < len {
            let n = PIECE.min(len - done);
            let from = libc::off_t::try_from(at + done as u64).map_err(io::Error::other)?;
            // SAFETY: `offset + done .. offset + done + n` is inside the claimed range, which is
            // inside the mapping (rules 2 and 3); the kernel writes through a raw pointer.
            let got = unsafe {
                libc::pread(
                    file.as_raw_fd(),
                    self.map.ptr.add(self.offset as usize + done).cast(),
                    n,
                    from,
                )
            };
            match got {
                0 => return Err(io::ErrorKind::UnexpectedEof.into()),
                n if n < 0 => {
                    let e = io::Error::last_os_error();
                    if e.kind() != io::ErrorKind::Interrupted {
                        return Err(e);
                    }
                }
                n => {
                    done += n as usize;
                    hashing.up_to(self, done)?;
                }
            }
        }
        Ok(hashing.digest())
    }
}

/// XXH3-64 of a range's bytes as they land in it, piece by piece (each copied out first, rule 1),
/// while they are still in the cache.
struct Hashing {
    hasher: xxhash_rust::xxh3::Xxh3,
    copy: Vec<u8>,
    /// bytes from the range's start hashed so far
    hashed: usize,
}

impl Hashing {
    fn new(piece: usize, len: usize) -> Self {
        Hashing {
            hasher: xxhash_rust::xxh3::Xxh3::new(),
            copy: vec![0u8; piece.min(len)],
            hashed: 0,
        }
    }

    /// Hashes `range`'s bytes from where it stopped up to `done`.
    fn up_to(&mut self, range: &WriteRange<'_>, done: usize) -> io::Result<()> {
        while self.hashed < done {
            let n = self.copy.len().min(done - self.hashed);
            range
                .map
                .copy_out(range.offset + self.hashed as u64, &mut self.copy[..n])
                .map_err(|e| io::Error::other(e.to_string()))?;
            self.hasher.update(&self.copy[..n]);
            self.hashed += n;
        }
        Ok(())
    }

    fn digest(&self) -> u64 {
        self.hasher.digest()
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
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A copy of the range's bytes.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = vec![0u8; self.len as usize];
        // cannot fail: the claim was checked against the mapping's bounds
        let _ = self.map.copy_out(self.offset, &mut out);
        out
    }

    /// Copies the range's bytes from `at` into `dst` (for bytes sent in pieces, encrypted in this
    /// process's memory: `dataport.rs` over TLS).
    pub fn copy_part(&self, at: u64, dst: &mut [u8]) -> Result<(), StoreError> {
        if at.checked_add(dst.len() as u64).is_none_or(|end| end > self.len) {
            return Err(out_of_range(at, dst.len() as u64, self.len));
        }
        self.map.copy_out(self.offset + at, dst)
    }

    /// Sends `head` and then the range's bytes on `s`, straight from the mapping (one vectored
    /// send per turn).
    pub async fn send_to(&self, s: &TcpStream, head: &[u8]) -> io::Result<()> {
        let total = head.len() + self.len as usize;
        let mut sent = 0;
        while sent < total {
            s.writable().await?;
            let put = s.try_io(Interest::WRITABLE, || {
                let (h, body_from) = if sent < head.len() {
                    (&head[sent..], 0)
                } else {
                    (&head[..0], sent - head.len())
                };
                let iov = [
                    libc::iovec {
                        iov_base: h.as_ptr() as *mut libc::c_void,
                        iov_len: h.len(),
                    },
                    libc::iovec {
                        // SAFETY: `offset + body_from .. offset + len` is inside the claimed
                        // range, inside the mapping (rules 2 and 3); the kernel only reads it.
                        iov_base: unsafe { self.map.ptr.add(self.offset as usize + body_from) }.cast(),
                        iov_len: self.len as usize - body_from,
                    },
                ];
                // SAFETY: a zeroed msghdr is valid; it names the two iovecs above, which
                // outlive the call.
                let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
                msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
                msg.msg_iovlen = 2;
                // SAFETY: a plain sendmsg on our socket with valid iovecs (above).
                let n = unsafe { libc::sendmsg(s.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(n as usize)
                }
            });
            match put {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => sent += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

impl Drop for ReadRange<'_> {
    fn drop(&mut self) {
        self.map.release(self.offset, self.len, false);
    }
}

#[cfg(test)]
mod tests;
