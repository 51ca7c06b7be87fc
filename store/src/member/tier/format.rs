//! One record of a disk tier as it lies in a tier file: a fixed header of [`HEADER_LEN`] bytes,
//! the value's tag, then its bytes. Every record starts on a [`ALIGN`] boundary, so a reader that
//! finds a damaged header can look for the next record at the next boundary, and a later
//! `O_DIRECT` writer needs no bounce for the record's start. The layout, field by field, is in
//! store/README.md ("Disk tier", "On disk"), pinned by
//! `a_record_is_laid_out_as_the_readme_says` below. Killing a record rewrites only its flags,
//! which the header checksum leaves out, so a torn flag write can at worst make a record dead,
//! never wrong.

use xxhash_rust::xxh3::{Xxh3, xxh3_64};

use crate::grant::{MAC_LEN, MAX_TAG_LEN};

pub const MAGIC: [u8; 4] = *b"KVT1";
pub const VERSION: u16 = 1;
pub const HEADER_LEN: usize = 96;
/// Where records start: a page, and a disk's usual block.
pub const ALIGN: u64 = 4096;
const PAYLOAD_ALIGN: u64 = 64;
const FLAG_DEAD: u16 = 1;
/// Offset of the flags, the only field rewritten in place.
pub const FLAGS_AT: u64 = 6;

/// What a record says about its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub dead: bool,
    pub len: u64,
    pub checksum: u64,
    pub epoch: u64,
    pub seal_offset: u64,
    pub seal: [u8; MAC_LEN],
    pub written_ms: u64,
    pub tag: Vec<u8>,
}

/// Why bytes are not a record's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Damage {
    #[error("no record starts here (magic)")]
    NoMagic,
    #[error("a record of format version {0}, not 1")]
    Version(u16),
    #[error("the tag's length {0} is over the limit")]
    TagTooLong(usize),
    #[error("the header was cut short")]
    Short,
    #[error("the header's checksum does not match")]
    Checksum,
}

impl Header {
    /// Where the value starts, from the record's start.
    pub fn payload_at(&self) -> u64 {
        payload_at(self.tag.len())
    }

    /// The whole record's length on disk, padded to [`ALIGN`].
    pub fn record_len(&self) -> u64 {
        (self.payload_at() + self.len).next_multiple_of(ALIGN)
    }

    /// The header and tag, padded with zeros up to where the value starts.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; self.payload_at() as usize];
        b[0..4].copy_from_slice(&MAGIC);
        b[4..6].copy_from_slice(&VERSION.to_le_bytes());
        b[8..16].copy_from_slice(&self.len.to_le_bytes());
        b[16..24].copy_from_slice(&self.checksum.to_le_bytes());
        b[24..32].copy_from_slice(&self.epoch.to_le_bytes());
        b[32..40].copy_from_slice(&self.seal_offset.to_le_bytes());
        b[40..72].copy_from_slice(&self.seal);
        b[72..80].copy_from_slice(&self.written_ms.to_le_bytes());
        b[80..82].copy_from_slice(&(self.tag.len() as u16).to_le_bytes());
        b[HEADER_LEN..HEADER_LEN + self.tag.len()].copy_from_slice(&self.tag);
        let sum = header_checksum(&b[..88], &self.tag);
        b[88..96].copy_from_slice(&sum.to_le_bytes());
        if self.dead {
            b[6..8].copy_from_slice(&FLAG_DEAD.to_le_bytes());
        }
        b
    }

    /// The tag's length a header announces, to read the rest: checks the magic, version and
    /// length only.
    pub fn tag_len(fixed: &[u8]) -> Result<usize, Damage> {
        let fixed = fixed.get(..HEADER_LEN).ok_or(Damage::Short)?;
        if fixed[0..4] != MAGIC {
            return Err(Damage::NoMagic);
        }
        let version = u16::from_le_bytes([fixed[4], fixed[5]]);
        if version != VERSION {
            return Err(Damage::Version(version));
        }
        let n = u16::from_le_bytes([fixed[80], fixed[81]]) as usize;
        if n > MAX_TAG_LEN {
            return Err(Damage::TagTooLong(n));
        }
        Ok(n)
    }

    /// Reads a header followed by its tag (`bytes` holds at least `HEADER_LEN + tag_len`).
    pub fn decode(bytes: &[u8]) -> Result<Header, Damage> {
        let n = Self::tag_len(bytes)?;
        let tag = bytes.get(HEADER_LEN..HEADER_LEN + n).ok_or(Damage::Short)?;
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        let mut fixed = [0u8; 88];
        fixed.copy_from_slice(&bytes[..88]);
        let flags = u16::from_le_bytes([fixed[6], fixed[7]]);
        fixed[6..8].fill(0);
        if header_checksum(&fixed, tag) != u64_at(88) {
            return Err(Damage::Checksum);
        }
        let mut seal = [0u8; MAC_LEN];
        seal.copy_from_slice(&bytes[40..72]);
        Ok(Header {
            dead: flags & FLAG_DEAD != 0,
            len: u64_at(8),
            checksum: u64_at(16),
            epoch: u64_at(24),
            seal_offset: u64_at(32),
            seal,
            written_ms: u64_at(72),
            tag: tag.to_vec(),
        })
    }
}

/// The flags field of a dead record, as written in place at [`FLAGS_AT`].
pub fn dead_flags() -> [u8; 2] {
    FLAG_DEAD.to_le_bytes()
}

/// Where a value starts after a header with a tag of `tag_len` bytes.
pub fn payload_at(tag_len: usize) -> u64 {
    (HEADER_LEN as u64 + tag_len as u64).next_multiple_of(PAYLOAD_ALIGN)
}

fn header_checksum(fixed: &[u8], tag: &[u8]) -> u64 {
    let mut h = Xxh3::new();
    h.update(fixed);
    h.update(tag);
    h.digest()
}

/// The checksum a value's bytes must have: the one `segment` records when a write finishes.
pub fn value_checksum(value: &[u8]) -> u64 {
    xxh3_64(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(tag: &[u8], len: u64) -> Header {
        Header {
            dead: false,
            len,
            checksum: 0x1234_5678_9abc_def0,
            epoch: 7,
            seal_offset: 4096,
            seal: [9; MAC_LEN],
            written_ms: 1_700_000_000_000,
            tag: tag.to_vec(),
        }
    }

    /// The layout store/README.md gives, byte for byte: a change here is a new format version.
    #[test]
    fn a_record_is_laid_out_as_the_readme_says() {
        let h = Header {
            dead: false,
            len: 5,
            checksum: value_checksum(b"hello"),
            epoch: 3,
            seal_offset: 0x1000,
            seal: [0xab; MAC_LEN],
            written_ms: 0x0102_0304_0506_0708,
            tag: b"t/k".to_vec(),
        };
        let b = h.encode();
        assert_eq!(
            b.len(),
            128,
            "96-byte header, a 3-byte tag, zeros to 128 (a multiple of 64)"
        );
        assert_eq!(&b[0..4], b"KVT1");
        assert_eq!(&b[4..8], &[1, 0, 0, 0], "version 1, no flags");
        assert_eq!(&b[8..16], &5u64.to_le_bytes());
        assert_eq!(&b[16..24], &xxh3_64(b"hello").to_le_bytes());
        assert_eq!(&b[24..32], &3u64.to_le_bytes());
        assert_eq!(&b[32..40], &0x1000u64.to_le_bytes());
        assert_eq!(&b[40..72], &[0xab; 32]);
        assert_eq!(&b[72..80], &[8, 7, 6, 5, 4, 3, 2, 1]);
        assert_eq!(&b[80..88], &[3, 0, 0, 0, 0, 0, 0, 0], "tag length, then zeros");
        let mut summed = b[..88].to_vec();
        summed.extend_from_slice(b"t/k");
        assert_eq!(&b[88..96], &xxh3_64(&summed).to_le_bytes());
        assert_eq!(&b[96..99], b"t/k");
        assert!(b[99..].iter().all(|z| *z == 0));
        assert_eq!(
            h.record_len(),
            4096,
            "the value at 128, zeros to the next 4096 boundary"
        );
        let dead = Header { dead: true, ..h }.encode();
        assert_eq!(&dead[6..8], &[1, 0]);
        assert_eq!(&dead[88..96], &b[88..96], "the flags are outside the checksum");
    }

    #[test]
    fn a_header_reads_back_as_written() {
        let h = header(b"a tag", 10_000);
        let b = h.encode();
        assert_eq!(b.len() as u64, h.payload_at());
        assert_eq!(h.payload_at() % 64, 0);
        assert_eq!(h.record_len(), 12_288);
        assert_eq!(Header::decode(&b), Ok(h.clone()));
        let dead = Header { dead: true, ..h };
        assert_eq!(Header::decode(&dead.encode()), Ok(dead));
    }

    #[test]
    fn killing_in_place_keeps_the_header_valid() {
        let h = header(b"k", 1);
        let mut b = h.encode();
        b[FLAGS_AT as usize..FLAGS_AT as usize + 2].copy_from_slice(&dead_flags());
        assert_eq!(Header::decode(&b), Ok(Header { dead: true, ..h }));
    }

    #[test]
    fn every_flipped_bit_outside_the_flags_is_damage() {
        let b = header(b"tenant/key", 64).encode();
        for byte in (0..HEADER_LEN + 10).filter(|i| !(6..8).contains(i)) {
            for bit in 0..8 {
                let mut c = b.clone();
                c[byte] ^= 1 << bit;
                assert!(Header::decode(&c).is_err(), "byte {byte} bit {bit}");
            }
        }
    }

    #[test]
    fn short_or_foreign_bytes_are_refused() {
        assert_eq!(Header::decode(&[]), Err(Damage::Short));
        assert_eq!(Header::decode(&[0; HEADER_LEN]), Err(Damage::NoMagic));
        let mut b = header(b"tag", 1).encode();
        b.truncate(HEADER_LEN + 1);
        assert_eq!(Header::decode(&b), Err(Damage::Short));
        let mut b = header(b"tag", 1).encode();
        b[4] = 2;
        assert_eq!(Header::decode(&b), Err(Damage::Version(2)));
        let mut b = header(b"tag", 1).encode();
        b[80..82].copy_from_slice(&u16::MAX.to_le_bytes());
        assert_eq!(Header::decode(&b), Err(Damage::TagTooLong(u16::MAX as usize)));
    }
}
