//! Reading values back from the tier, each checked against its record (live, the tag asked for,
//! its length, its checksum): straight into a segment's range ([`Located::read_into`], a load: no
//! copy in between), piece by piece to a reader ([`Located::stream`], a direct read: the
//! checksum is known only after the last piece), or into memory this process owns in tests; and
//! telling the kernel which records a batch of loads is about to read ([`Tier::will_read`]), so
//! the device reads the next while the first is checked and sent.

use std::fs::File;
use std::io;
use std::num::NonZeroU64;
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;

use super::format::payload_at;
use super::stream::Stream;
use super::{DiskId, HeaderError, ReadError, Tier, io_err, read_header};
use crate::member::mmap::WriteRange;

/// A live value's bytes on disk, their header checked: where they are and what they must hash to.
#[derive(Debug)]
pub struct Located<'a> {
    id: DiskId,
    file: &'a File,
    path: PathBuf,
    /// where the value's bytes start in `file`
    at: u64,
    pub len: u64,
    pub checksum: u64,
}

impl Tier {
    /// Finds the value at `id`, if its record is live, readable and carries `tag` and the
    /// length the tier recorded. [`ReadError::Damaged`] means the bytes on disk are not the
    /// value's: drop it ([`Tier::kill`]) and count it.
    pub fn locate(&self, id: DiskId, tag: &[u8]) -> Result<Located<'_>, ReadError> {
        let live = self.live.get(&id).ok_or(ReadError::Missing(id))?;
        let f = self.files.get(&id.file()).ok_or(ReadError::Missing(id))?;
        let path = self.path_of(id.file());
        let damaged = |why: String| ReadError::Damaged { id, why };
        let h = match read_header(&f.file, id.offset(), f.len) {
            Ok(h) => h,
            Err(HeaderError::Damage(d)) => return Err(damaged(format!("header: {d}"))),
            Err(HeaderError::Io(e)) => return Err(io_err("reading", &path, e).into()),
        };
        if h.dead {
            return Err(damaged("the record is marked dead".into()));
        }
        if h.tag != tag {
            return Err(damaged("the record holds another value (its tag differs)".into()));
        }
        if h.len != live.len {
            return Err(damaged(format!("the record's length {} is not {}", h.len, live.len)));
        }
        f.touched.store(self.clock.fetch_add(1, Relaxed), Relaxed);
        Ok(Located {
            id,
            file: &f.file,
            path,
            at: id.offset() + h.payload_at(),
            len: h.len,
            checksum: h.checksum,
        })
    }

    /// The value at `id` ([`Tier::locate`]), read into memory and checked against its checksum
    /// (what the tests read back; a load reads straight into the segment, [`Located::read_into`]).
    #[cfg(test)]
    pub fn read(&self, id: DiskId, tag: &[u8]) -> Result<Vec<u8>, ReadError> {
        use std::os::unix::fs::FileExt;

        use super::format;

        let at = self.locate(id, tag)?;
        let len = usize::try_from(at.len).map_err(|_| at.damaged("the record's length is too large"))?;
        let mut value = vec![0u8; len];
        at.file.read_exact_at(&mut value, at.at).map_err(|e| at.failed(e))?;
        if format::value_checksum(&value) != at.checksum {
            return Err(at.damaged("its bytes do not match their checksum"));
        }
        Ok(value)
    }

    /// The live value at `id` opened to be read piece by piece ([`Located::stream`]) as the
    /// tier knows it (its length and checksum as written or found at open), without reading its
    /// header: for a caller that checked the value's tag against what the tier holds. Bytes
    /// changed on disk since are still caught, by the checksum at the end.
    pub fn stream_known(&self, id: DiskId) -> Result<Stream, ReadError> {
        let live = self.live.get(&id).ok_or(ReadError::Missing(id))?;
        let f = self.files.get(&id.file()).ok_or(ReadError::Missing(id))?;
        f.touched.store(self.clock.fetch_add(1, Relaxed), Relaxed);
        Located {
            id,
            file: &f.file,
            path: self.path_of(id.file()),
            at: id.offset() + live.payload_at,
            len: live.len,
            checksum: live.checksum,
        }
        .stream()
    }

    /// Asks the kernel to start reading the records of `ids` (each with a tag of its length),
    /// which a batch of loads reads next; advice only: what it cannot do changes nothing.
    pub fn will_read(&self, ids: impl IntoIterator<Item = (DiskId, usize)>) {
        for (id, tag_len) in ids {
            let (Some(f), Some(live)) = (self.files.get(&id.file()), self.live.get(&id)) else {
                continue;
            };
            let len = NonZeroU64::new(payload_at(tag_len) + live.len);
            let _ = rustix::fs::fadvise(&f.file, id.offset(), len, rustix::fs::Advice::WillNeed);
        }
    }
}

impl Located<'_> {
    /// Reads the value into `range` (of its length) and returns its checksum, checked: a
    /// file that ends inside the value, or bytes that do not match, are [`ReadError::Damaged`].
    pub fn read_into(&self, range: &mut WriteRange<'_>) -> Result<u64, ReadError> {
        let got = range.read_from_file(self.file, self.at).map_err(|e| self.failed(e))?;
        if got != self.checksum {
            return Err(self.damaged("its bytes do not match their checksum"));
        }
        Ok(got)
    }

    /// The value opened to be read piece by piece outside the tier's lock ([`Stream`]).
    pub fn stream(&self) -> Result<Stream, ReadError> {
        Stream::open(self.id, self.file, &self.path, self.at, self.len, self.checksum)
            .map_err(|e| io_err("opening", &self.path, e).into())
    }

    fn damaged(&self, why: &str) -> ReadError {
        ReadError::Damaged {
            id: self.id,
            why: why.to_owned(),
        }
    }

    fn failed(&self, e: io::Error) -> ReadError {
        match e.kind() {
            io::ErrorKind::UnexpectedEof => self.damaged("the file ends inside the value"),
            _ => io_err("reading", &self.path, e).into(),
        }
    }
}
