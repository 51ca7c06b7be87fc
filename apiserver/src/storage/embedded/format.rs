//! Byte layout of the log file: file header, frame header, and the records inside frames.
//! All integers are little-endian. The layout is pinned by the tests at the bottom.

/// First bytes of every log file.
pub const FILE_MAGIC: [u8; 8] = *b"KVCSWAL\0";
pub const FORMAT_VERSION: u32 = 1;
/// Bytes reserved for the file header; the first frame starts here.
pub const FILE_HEADER_LEN: u64 = 64;

/// Marks the start of a frame.
pub const FRAME_MAGIC: u32 = 0x4B56_4C47; // "GLVK" in memory order
pub const FRAME_HEADER_LEN: usize = 32;
/// Frames start at multiples of this.
pub const FRAME_ALIGN: u64 = 8;
/// Upper bound on one frame's payload; larger lengths are treated as corruption.
pub const MAX_FRAME_PAYLOAD: u32 = 1 << 30;

pub const FRAME_BATCH: u8 = 1;
pub const FRAME_SNAPSHOT: u8 = 2;

const OP_PUT: u8 = 1;
const OP_DELETE: u8 = 2;

/// The file header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileHeader {
    pub generation: u64,
    /// Revision the snapshot frames describe (0 for a log that starts empty).
    pub snapshot_revision: u64,
    /// Offset where the snapshot frames end and batch frames begin.
    pub snapshot_end: u64,
}

impl FileHeader {
    pub fn encode(&self) -> [u8; FILE_HEADER_LEN as usize] {
        let mut b = [0u8; FILE_HEADER_LEN as usize];
        b[0..8].copy_from_slice(&FILE_MAGIC);
        b[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&(FILE_HEADER_LEN as u32).to_le_bytes());
        b[16..24].copy_from_slice(&self.generation.to_le_bytes());
        b[24..32].copy_from_slice(&self.snapshot_revision.to_le_bytes());
        b[32..40].copy_from_slice(&self.snapshot_end.to_le_bytes());
        let crc = crc32c::crc32c(&b[0..40]);
        b[40..44].copy_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<FileHeader, String> {
        if b.len() < FILE_HEADER_LEN as usize {
            return Err(format!("the file is {} bytes, shorter than its header", b.len()));
        }
        if b[0..8] != FILE_MAGIC {
            return Err("the file does not start with the log magic".into());
        }
        let crc = u32::from_le_bytes(b[40..44].try_into().expect("4 bytes"));
        if crc != crc32c::crc32c(&b[0..40]) {
            return Err("the file header checksum does not match".into());
        }
        let version = u32::from_le_bytes(b[8..12].try_into().expect("4 bytes"));
        if version != FORMAT_VERSION {
            return Err(format!(
                "format version {version} is not supported by this build (it reads version {FORMAT_VERSION})"
            ));
        }
        Ok(FileHeader {
            generation: u64::from_le_bytes(b[16..24].try_into().expect("8 bytes")),
            snapshot_revision: u64::from_le_bytes(b[24..32].try_into().expect("8 bytes")),
            snapshot_end: u64::from_le_bytes(b[32..40].try_into().expect("8 bytes")),
        })
    }
}

/// The header in front of every frame's payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    pub kind: u8,
    pub payload_len: u32,
    pub payload_crc: u32,
    /// Batch: revision of its first transaction. Snapshot: the snapshot revision.
    pub revision: u64,
}

impl FrameHeader {
    pub fn encode(&self) -> [u8; FRAME_HEADER_LEN] {
        let mut b = [0u8; FRAME_HEADER_LEN];
        b[0..4].copy_from_slice(&FRAME_MAGIC.to_le_bytes());
        b[4] = self.kind;
        b[8..12].copy_from_slice(&self.payload_len.to_le_bytes());
        b[12..16].copy_from_slice(&self.payload_crc.to_le_bytes());
        b[16..24].copy_from_slice(&self.revision.to_le_bytes());
        let crc = crc32c::crc32c(&b[0..24]);
        b[24..28].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes a header, checking its own checksum. `None` if these bytes are not a header.
    pub fn decode(b: &[u8]) -> Option<FrameHeader> {
        if b.len() < FRAME_HEADER_LEN {
            return None;
        }
        let magic = u32::from_le_bytes(b[0..4].try_into().ok()?);
        if magic != FRAME_MAGIC {
            return None;
        }
        let crc = u32::from_le_bytes(b[24..28].try_into().ok()?);
        if crc != crc32c::crc32c(&b[0..24]) {
            return None;
        }
        let h = FrameHeader {
            kind: b[4],
            payload_len: u32::from_le_bytes(b[8..12].try_into().ok()?),
            payload_crc: u32::from_le_bytes(b[12..16].try_into().ok()?),
            revision: u64::from_le_bytes(b[16..24].try_into().ok()?),
        };
        let known = h.kind == FRAME_BATCH || h.kind == FRAME_SNAPSHOT;
        (known && h.payload_len <= MAX_FRAME_PAYLOAD).then_some(h)
    }

    /// Bytes the whole frame occupies, padding included.
    pub fn frame_len(&self) -> u64 {
        align(FRAME_HEADER_LEN as u64 + u64::from(self.payload_len))
    }
}

pub fn align(n: u64) -> u64 {
    n.div_ceil(FRAME_ALIGN) * FRAME_ALIGN
}

/// Builds one batch frame from transactions, remembering where each put value lands.
#[derive(Default)]
pub struct BatchEncoder {
    buf: Vec<u8>,
    first_revision: u64,
    /// (payload offset, length) of each put value, in the order they were added.
    pub value_spans: Vec<(u32, u32)>,
}

impl BatchEncoder {
    pub fn new() -> Self {
        BatchEncoder {
            buf: vec![0u8; FRAME_HEADER_LEN],
            first_revision: 0,
            value_spans: Vec::new(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.buf.len() == FRAME_HEADER_LEN
    }

    /// Appends one transaction: `revision u64, op_count u32`, then each op as
    /// `kind u8, key_len u32, key, [value_len u32, value]`.
    pub fn push_txn<'a>(&mut self, revision: u64, ops: impl ExactSizeIterator<Item = (&'a str, Option<&'a [u8]>)>) {
        if self.is_empty() {
            self.first_revision = revision;
        }
        self.buf.extend_from_slice(&revision.to_le_bytes());
        self.buf.extend_from_slice(&(ops.len() as u32).to_le_bytes());
        for (key, value) in ops {
            self.buf.push(if value.is_some() { OP_PUT } else { OP_DELETE });
            self.buf.extend_from_slice(&(key.len() as u32).to_le_bytes());
            self.buf.extend_from_slice(key.as_bytes());
            if let Some(v) = value {
                self.buf.extend_from_slice(&(v.len() as u32).to_le_bytes());
                let at = (self.buf.len() - FRAME_HEADER_LEN) as u32;
                self.value_spans.push((at, v.len() as u32));
                self.buf.extend_from_slice(v);
            }
        }
    }

    /// The finished frame (header, payload, zero padding).
    pub fn finish(mut self) -> (Vec<u8>, Vec<(u32, u32)>) {
        let payload_len = (self.buf.len() - FRAME_HEADER_LEN) as u32;
        let header = FrameHeader {
            kind: FRAME_BATCH,
            payload_len,
            payload_crc: crc32c::crc32c(&self.buf[FRAME_HEADER_LEN..]),
            revision: self.first_revision,
        };
        self.buf[..FRAME_HEADER_LEN].copy_from_slice(&header.encode());
        let padded = align(self.buf.len() as u64) as usize;
        self.buf.resize(padded, 0);
        (self.buf, self.value_spans)
    }
}

/// One snapshot entry: a live key with its revisions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotEntry<'a> {
    pub key: &'a str,
    pub create_revision: u64,
    pub mod_revision: u64,
    pub value: &'a [u8],
}

/// Encodes a snapshot frame: entries as `key_len u32, key, create u64, mod u64, value_len u32,
/// value`. Returns the frame and the payload offset of each value.
pub fn encode_snapshot(revision: u64, entries: &[SnapshotEntry<'_>]) -> (Vec<u8>, Vec<u32>) {
    let mut buf = vec![0u8; FRAME_HEADER_LEN];
    let mut offsets = Vec::with_capacity(entries.len());
    for e in entries {
        buf.extend_from_slice(&(e.key.len() as u32).to_le_bytes());
        buf.extend_from_slice(e.key.as_bytes());
        buf.extend_from_slice(&e.create_revision.to_le_bytes());
        buf.extend_from_slice(&e.mod_revision.to_le_bytes());
        buf.extend_from_slice(&(e.value.len() as u32).to_le_bytes());
        offsets.push((buf.len() - FRAME_HEADER_LEN) as u32);
        buf.extend_from_slice(e.value);
    }
    let header = FrameHeader {
        kind: FRAME_SNAPSHOT,
        payload_len: (buf.len() - FRAME_HEADER_LEN) as u32,
        payload_crc: crc32c::crc32c(&buf[FRAME_HEADER_LEN..]),
        revision,
    };
    buf[..FRAME_HEADER_LEN].copy_from_slice(&header.encode());
    let padded = align(buf.len() as u64) as usize;
    buf.resize(padded, 0);
    (buf, offsets)
}

/// A cursor over a checksummed payload. Any overrun is corruption: the payload passed its
/// checksum, so a malformed record means a bug or a forged file, never a torn write.
struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self
            .at
            .checked_add(n)
            .filter(|e| *e <= self.b.len())
            .ok_or_else(|| format!("record overruns its frame at payload offset {}", self.at))?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    fn key(&mut self) -> Result<&'a str, String> {
        let n = self.u32()? as usize;
        std::str::from_utf8(self.take(n)?).map_err(|_| "a key is not UTF-8".to_string())
    }
    fn done(&self) -> bool {
        self.at == self.b.len()
    }
}

/// One decoded batch operation with the payload offset of its value.
#[derive(Debug)]
pub struct DecodedOp<'a> {
    pub key: &'a str,
    /// (payload offset, length) for a put; `None` for a delete.
    pub value: Option<(u32, u32)>,
}

/// Walks the transactions of a batch payload.
pub fn decode_batch(payload: &[u8], mut f: impl FnMut(u64, Vec<DecodedOp<'_>>)) -> Result<(), String> {
    let mut c = Cursor { b: payload, at: 0 };
    while !c.done() {
        let revision = c.u64()?;
        let n = c.u32()? as usize;
        let mut ops = Vec::with_capacity(n.min(1024));
        for _ in 0..n {
            let kind = c.u8()?;
            let key = c.key()?;
            let value = match kind {
                OP_PUT => {
                    let len = c.u32()?;
                    let at = c.at as u32;
                    c.take(len as usize)?;
                    Some((at, len))
                }
                OP_DELETE => None,
                other => return Err(format!("unknown operation kind {other}")),
            };
            ops.push(DecodedOp { key, value });
        }
        f(revision, ops);
    }
    Ok(())
}

/// One decoded snapshot entry with the payload offset of its value.
#[derive(Debug)]
pub struct DecodedEntry<'a> {
    pub key: &'a str,
    pub create_revision: u64,
    pub mod_revision: u64,
    pub value: (u32, u32),
}

pub fn decode_snapshot(payload: &[u8], mut f: impl FnMut(DecodedEntry<'_>)) -> Result<(), String> {
    let mut c = Cursor { b: payload, at: 0 };
    while !c.done() {
        let key = c.key()?;
        let create_revision = c.u64()?;
        let mod_revision = c.u64()?;
        let len = c.u32()?;
        let at = c.at as u32;
        c.take(len as usize)?;
        f(DecodedEntry {
            key,
            create_revision,
            mod_revision,
            value: (at, len),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_header_layout_is_pinned() {
        let h = FileHeader {
            generation: 3,
            snapshot_revision: 7,
            snapshot_end: 4096,
        };
        let b = h.encode();
        assert_eq!(&b[0..8], b"KVCSWAL\0");
        assert_eq!(&b[8..12], &1u32.to_le_bytes());
        assert_eq!(&b[12..16], &64u32.to_le_bytes());
        assert_eq!(&b[16..24], &3u64.to_le_bytes());
        assert_eq!(&b[24..32], &7u64.to_le_bytes());
        assert_eq!(&b[32..40], &4096u64.to_le_bytes());
        assert_eq!(&b[40..44], &crc32c::crc32c(&b[0..40]).to_le_bytes());
        assert!(b[44..].iter().all(|x| *x == 0));
        assert_eq!(FileHeader::decode(&b).unwrap(), h);
        let mut bad = b;
        bad[20] ^= 1;
        assert!(FileHeader::decode(&bad).is_err());
    }

    #[test]
    fn batch_frame_layout_is_pinned() {
        let mut enc = BatchEncoder::new();
        enc.push_txn(5, [("k", Some(&b"vv"[..])), ("d", None)].into_iter());
        let (frame, spans) = enc.finish();
        // header 32 + payload (8 rev + 4 count + [1+4+1+4+2] + [1+4+1]) = 32 + 30, padded to 64.
        assert_eq!(frame.len(), 64);
        let h = FrameHeader::decode(&frame).unwrap();
        assert_eq!(h.kind, FRAME_BATCH);
        assert_eq!(h.payload_len, 30);
        assert_eq!(h.revision, 5);
        assert_eq!(&frame[0..4], &FRAME_MAGIC.to_le_bytes());
        assert_eq!(&frame[32..40], &5u64.to_le_bytes());
        assert_eq!(&frame[40..44], &2u32.to_le_bytes());
        assert_eq!(frame[44], 1);
        assert_eq!(spans, vec![(22, 2)]);
        let payload = &frame[32..32 + 30];
        assert_eq!(&payload[22..24], b"vv");
        let mut seen = vec![];
        decode_batch(payload, |rev, ops| {
            seen.push((
                rev,
                ops.iter().map(|o| (o.key.to_string(), o.value)).collect::<Vec<_>>(),
            ))
        })
        .unwrap();
        assert_eq!(seen, vec![(5, vec![("k".into(), Some((22, 2))), ("d".into(), None)])]);
    }

    #[test]
    fn snapshot_roundtrip() {
        let entries = [SnapshotEntry {
            key: "a",
            create_revision: 2,
            mod_revision: 9,
            value: b"xyz",
        }];
        let (frame, offs) = encode_snapshot(9, &entries);
        let h = FrameHeader::decode(&frame).unwrap();
        assert_eq!((h.kind, h.revision), (FRAME_SNAPSHOT, 9));
        let payload = &frame[32..32 + h.payload_len as usize];
        let mut got = vec![];
        decode_snapshot(payload, |e| {
            got.push((e.key.to_string(), e.create_revision, e.mod_revision, e.value))
        })
        .unwrap();
        assert_eq!(got, vec![("a".to_string(), 2, 9, (offs[0], 3))]);
    }

    #[test]
    fn truncated_payload_is_reported() {
        let mut enc = BatchEncoder::new();
        enc.push_txn(1, [("key", Some(&b"value"[..]))].into_iter());
        let (frame, _) = enc.finish();
        let h = FrameHeader::decode(&frame).unwrap();
        let payload = &frame[32..32 + h.payload_len as usize - 2];
        assert!(decode_batch(payload, |_, _| {}).is_err());
    }
}
