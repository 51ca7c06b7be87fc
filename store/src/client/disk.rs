//! A same-host client's read of a value's copy on its member's disk tier, from the tier file
//! itself: the member checked the grant and handed over a descriptor of the copy's file and where
//! the value lies in it (op 8, `member/local.rs`); the bytes go from the device into this
//! process's buffers and are copied into the caller's, without crossing the member or a socket.
//!
//! Pieces of [`PIECE`] bytes are read on the runtime's blocking threads, [`IN_FLIGHT`] at once
//! (as the member reads them for op 7: the device works on several while the ones before are
//! copied), each into a buffer kept between reads, with the member's `O_DIRECT` alignment when the
//! descriptor was opened with it (`member/tier/stream.rs`). They are copied into the caller's
//! buffer and hashed in order; the bytes are the value only if they hash to the checksum the
//! member gave. Until then the caller's buffer holds nothing it may use.

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::sync::Arc;

use parking_lot::Mutex;
use xxhash_rust::xxh3::Xxh3;

use super::data::Sink;
use crate::member::dataport::disk::{IN_FLIGHT, PIECE};
use crate::member::tier::{Piece, read_span};
use crate::wire::DiskCopy;

/// Piece buffers kept between reads, for every member together.
const KEPT_BUFFERS: usize = 2 * IN_FLIGHT;

/// Buffers for pieces, kept between reads (each about [`PIECE`] and a block).
#[derive(Debug, Default)]
pub(super) struct Buffers(Arc<Mutex<Vec<Vec<u8>>>>);

impl Buffers {
    fn take(&self) -> Vec<u8> {
        self.0.lock().pop().unwrap_or_default()
    }

    fn give_back(&self, buf: Vec<u8>) {
        let mut kept = self.0.lock();
        if kept.len() < KEPT_BUFFERS {
            kept.push(buf);
        }
    }
}

/// Reads `copy` from `file` into `sink` (which holds exactly its length): whether the bytes hash
/// to its checksum. `Err` when the file could not be read (it ends inside the value, or the
/// device failed).
pub(super) async fn read_copy(
    file: File,
    copy: &DiskCopy,
    sink: &mut Sink<'_, '_>,
    buffers: &Buffers,
) -> io::Result<bool> {
    let file = Arc::new(file);
    let piece = PIECE as u64;
    let mut pieces = (0..copy.len.div_ceil(piece)).map(|i| (copy.at + i * piece, piece.min(copy.len - i * piece)));
    let mut reading = VecDeque::new();
    let mut fill = Fill { sink, at: 0 };
    let mut hasher = Xxh3::new();
    loop {
        while reading.len() < IN_FLIGHT
            && let Some((from, n)) = pieces.next()
        {
            let (file, direct, buf) = (file.clone(), copy.direct, buffers.take());
            reading.push_back(tokio::task::spawn_blocking(move || {
                read_span(&file, direct, from, n, buf)
            }));
        }
        let Some(first) = reading.pop_front() else {
            break;
        };
        let p: Piece = first.await.map_err(io::Error::other)??;
        hasher.update(p.bytes());
        fill.put(p.bytes())?;
        buffers.give_back(p.into_buffer());
    }
    Ok(fill.at as u64 == copy.len && hasher.digest() == copy.checksum)
}

/// Where the next bytes of a value go in a sink.
struct Fill<'s, 'a, 'b> {
    sink: &'s mut Sink<'a, 'b>,
    /// bytes put so far
    at: usize,
}

impl Fill<'_, '_, '_> {
    fn put(&mut self, bytes: &[u8]) -> io::Result<()> {
        let too_long = || io::Error::new(io::ErrorKind::InvalidData, "the copy is longer than its buffer");
        match &mut *self.sink {
            Sink::Slice(out) => out
                .get_mut(self.at..self.at + bytes.len())
                .ok_or_else(too_long)?
                .copy_from_slice(bytes),
            Sink::Parts(parts) => {
                // the parts, one after the other, from where the last bytes ended
                let (mut skip, mut rest) = (self.at, bytes);
                for part in parts.iter_mut() {
                    if rest.is_empty() {
                        break;
                    }
                    if skip >= part.len() {
                        skip -= part.len();
                        continue;
                    }
                    let n = (part.len() - skip).min(rest.len());
                    part[skip..skip + n].copy_from_slice(&rest[..n]);
                    (skip, rest) = (0, &rest[n..]);
                }
                if !rest.is_empty() {
                    return Err(too_long());
                }
            }
            Sink::Fresh(out) => out.extend_from_slice(bytes),
        }
        self.at += bytes.len();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn copy_in_a_file(value: &[u8], at: usize) -> (tempfile::NamedTempFile, DiskCopy) {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&vec![7u8; at]).unwrap();
        f.write_all(value).unwrap();
        f.write_all(&[9u8; 100]).unwrap();
        let copy = DiskCopy {
            at: at as u64,
            len: value.len() as u64,
            checksum: xxhash_rust::xxh3::xxh3_64(value),
            direct: false,
            disk_id: 1,
        };
        (f, copy)
    }

    fn value(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 31 % 251) as u8).collect()
    }

    #[tokio::test]
    async fn a_copy_of_several_pieces_lands_whole_in_each_kind_of_sink() {
        let v = value(3 * PIECE + 4321);
        let (f, copy) = copy_in_a_file(&v, 192);
        let buffers = Buffers::default();
        let mut slice = vec![0u8; v.len()];
        let matched = read_copy(f.reopen().unwrap(), &copy, &mut Sink::Slice(&mut slice), &buffers).await;
        assert!(matched.unwrap());
        assert!(slice == v);
        let (mut a, mut b, mut c) = (vec![0u8; 10], vec![0u8; PIECE + 5], vec![0u8; v.len() - PIECE - 15]);
        let mut parts: Vec<&mut [u8]> = vec![&mut a, &mut b, &mut c];
        let matched = read_copy(f.reopen().unwrap(), &copy, &mut Sink::Parts(&mut parts), &buffers).await;
        assert!(matched.unwrap());
        assert!([a, b, c].concat() == v);
        let mut fresh = bytes::BytesMut::new();
        let matched = read_copy(f.reopen().unwrap(), &copy, &mut Sink::Fresh(&mut fresh), &buffers).await;
        assert!(matched.unwrap());
        assert!(fresh[..] == v[..]);
        assert!(buffers.0.lock().len() <= KEPT_BUFFERS);
    }

    #[tokio::test]
    async fn bytes_that_do_not_hash_to_the_checksum_are_not_the_value() {
        let v = value(PIECE + 100);
        let (f, copy) = copy_in_a_file(&v, 4096);
        let mut out = vec![0u8; v.len()];
        let wrong = DiskCopy {
            checksum: copy.checksum ^ 1,
            ..copy
        };
        let matched = read_copy(
            f.reopen().unwrap(),
            &wrong,
            &mut Sink::Slice(&mut out),
            &Buffers::default(),
        )
        .await;
        assert!(!matched.unwrap());
    }

    #[tokio::test]
    async fn a_file_that_ends_inside_the_value_is_an_error_and_a_short_buffer_too() {
        let v = value(5000);
        let (f, copy) = copy_in_a_file(&v, 0);
        let past_the_end = DiskCopy { len: 6000, ..copy };
        let mut out = vec![0u8; 6000];
        let read = read_copy(
            f.reopen().unwrap(),
            &past_the_end,
            &mut Sink::Slice(&mut out),
            &Buffers::default(),
        )
        .await;
        assert_eq!(read.unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
        let mut short = vec![0u8; 4000];
        let read = read_copy(
            f.reopen().unwrap(),
            &copy,
            &mut Sink::Slice(&mut short),
            &Buffers::default(),
        )
        .await;
        assert_eq!(read.unwrap_err().kind(), io::ErrorKind::InvalidData);
    }
}
