//! The member's framed data port: one small fixed header, then raw bytes, on a plain TCP
//! connection that carries one request at a time (connections are pooled and reused). The
//! member's same-host socket (`member/local.rs`) speaks the same headers with other ops.
//!
//! Request header, 88 bytes, little-endian:
//! `magic u32 | op u16 | tag_len u16 | mount_id u64 | offset u64 | len u64 | deadline_unix_ms u64 | epoch u64 |
//! allocation u64 | grant_mac [u8; 32]` (the Location's allocation and its MAC over the range,
//! `grant.rs`; ops 1, 2, 4 and 5),
//! op 1 write, 2 read and 7 read from the disk tier on the data port; on the same-host socket 3 map (the answer carries the
//! segment's descriptor, SCM_RIGHTS, and its length in `len`), 4 claim a range to write, 5 claim a
//! range to read, 6 release the claim (ops 4 and 5 carry the grant, as 1 and 2 do), 8 ask for
//! the tier file that holds a value's copy on the disk tier, to read it here (a grant as op 7's,
//! with its tag; the answer carries the file's descriptor, SCM_RIGHTS: [`TierFile`])
//! (`epoch`: the leader's, from the Location; a member refuses an epoch older than its newest),
//! followed, for ops 1, 4, 7 and 8 (and 3 when its grant is a write's), by `tag_len` bytes of the
//! value's tag (the Location's `tag`, which the MAC covers: `grant.rs`), then, for a
//! write, `len` value bytes. Op 7 reads a value only on the member's disk tier (a Location with
//! `on_disk`: its `offset` is the copy's disk id).
//! Response header, 16 bytes: `magic u32 | status u32 (0 ok, 1 refused) | len u64`, followed by
//! `len` value bytes (a read that succeeded) or a UTF-8 "CODE: message" (a refusal). An op 7
//! answer streams the bytes as they come off the disk, then an 8-byte [`Verdict`]: whether they
//! matched their checksum (if not, they are not the value: a miss).

use crate::error::{ErrorCode, StoreError};
use crate::grant::MAC_LEN;

pub const MAGIC: u32 = 0x3344_564b; // "KVD3" as little-endian bytes
/// Earlier versions' magic (no allocation; no tag): refused with a word on upgrading.
const MAGIC_V1: u32 = 0x3144_564b; // "KVD1"
const MAGIC_V2: u32 = 0x3244_564b; // "KVD2"
pub const REQUEST_LEN: usize = 88;
pub const RESPONSE_LEN: usize = 16;
/// Longest refusal message a client accepts.
pub const MAX_MESSAGE: u64 = 64 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Write = 1,
    Read = 2,
    Map = 3,
    ClaimWrite = 4,
    ClaimRead = 5,
    Release = 6,
    ReadDisk = 7,
    TierFile = 8,
}

/// What follows an op 8 answer's header (`len` says [`TierFile::LEN`]), two little-endian u64:
/// the number of the tier file whose descriptor rides on the answer, and flags (bit 0: the
/// descriptor was opened with `O_DIRECT`). The value's record lies where its disk id says
/// (`member/tier`: the file's number in its high 32 bits, the record's start in 4096-byte units
/// in the low ones), and its header says what the value must hash to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TierFile {
    pub file: u32,
    pub direct: bool,
}

impl TierFile {
    pub const LEN: usize = 16;
    const DIRECT: u64 = 1;

    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[..8].copy_from_slice(&u64::from(self.file).to_le_bytes());
        let flags = if self.direct { Self::DIRECT } else { 0 };
        b[8..].copy_from_slice(&flags.to_le_bytes());
        b
    }

    /// `None` when the file's number is not one a tier gives (over 32 bits).
    pub fn decode(b: &[u8; Self::LEN]) -> Option<TierFile> {
        Some(TierFile {
            file: u32::try_from(u64_at(b, 0)).ok()?,
            direct: u64_at(b, 8) & Self::DIRECT != 0,
        })
    }
}

/// What follows an op 7 answer's bytes, as a little-endian u64: the member hashes a disk copy as
/// it sends it, and only this says whether the bytes were the value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// the bytes matched the checksum the record carries
    Intact = 0,
    /// they did not (flipped on disk, or the file changed behind the member): not the value;
    /// the member dropped the copy and told the leader
    Damaged = 1,
}

pub const VERDICT_LEN: usize = 8;

impl Verdict {
    pub fn encode(self) -> [u8; VERDICT_LEN] {
        (self as u64).to_le_bytes()
    }

    /// Anything but [`Verdict::Intact`]'s bytes is damage.
    pub fn decode(b: &[u8; VERDICT_LEN]) -> Verdict {
        match u64::from_le_bytes(*b) {
            0 => Verdict::Intact,
            _ => Verdict::Damaged,
        }
    }
}

/// A decoded request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub op: Op,
    pub mount_id: u64,
    pub offset: u64,
    pub len: u64,
    pub deadline_unix_ms: u64,
    /// the epoch of the leader that handed the range out
    pub epoch: u64,
    /// the placement the range was granted for (`grant.rs`)
    pub allocation: u64,
    /// the leader's MAC over the range (`grant.rs`)
    pub mac: [u8; MAC_LEN],
    /// the length of the value's tag that follows the header (writes; 0 otherwise)
    pub tag_len: u16,
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

impl Request {
    /// The header that shows `loc`'s grant for `op` over `len` bytes, followed on the wire by a
    /// tag of `tag_len` bytes (a write's; 0 otherwise).
    pub fn granted(op: Op, loc: &crate::proto::Location, len: u64, deadline_unix_ms: u64, tag_len: u16) -> Request {
        Request {
            op,
            mount_id: loc.mount_id,
            offset: loc.offset,
            len,
            deadline_unix_ms,
            epoch: loc.epoch,
            allocation: loc.allocation,
            mac: crate::grant::mac_from(&loc.grant_mac),
            tag_len,
        }
    }

    pub fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&(self.op as u16).to_le_bytes());
        b[6..8].copy_from_slice(&self.tag_len.to_le_bytes());
        b[8..16].copy_from_slice(&self.mount_id.to_le_bytes());
        b[16..24].copy_from_slice(&self.offset.to_le_bytes());
        b[24..32].copy_from_slice(&self.len.to_le_bytes());
        b[32..40].copy_from_slice(&self.deadline_unix_ms.to_le_bytes());
        b[40..48].copy_from_slice(&self.epoch.to_le_bytes());
        b[48..56].copy_from_slice(&self.allocation.to_le_bytes());
        b[56..88].copy_from_slice(&self.mac);
        b
    }

    pub fn decode(b: &[u8; REQUEST_LEN]) -> Result<Self, StoreError> {
        let bad = |m: &str| StoreError::new(ErrorCode::InvalidArgument, m.to_string());
        match u32_at(b, 0) {
            MAGIC => {}
            MAGIC_V1 | MAGIC_V2 => {
                return Err(bad(
                    "this client speaks an older store protocol; this member speaks 3 (a write carries its value's \
                     tag): upgrade the kvstore client",
                ));
            }
            _ => {
                return Err(bad(
                    "not a kvstore data request (bad magic); connect with the kvstore client",
                ));
            }
        }
        let op = match u32_at(b, 4) & 0xffff {
            1 => Op::Write,
            2 => Op::Read,
            3 => Op::Map,
            4 => Op::ClaimWrite,
            5 => Op::ClaimRead,
            6 => Op::Release,
            7 => Op::ReadDisk,
            8 => Op::TierFile,
            _ => {
                return Err(bad(
                    "unknown data op; this member speaks ops 1 to 8 (store/src/wire.rs)",
                ));
            }
        };
        Ok(Self {
            op,
            mount_id: u64_at(b, 8),
            offset: u64_at(b, 16),
            len: u64_at(b, 24),
            deadline_unix_ms: u64_at(b, 32),
            epoch: u64_at(b, 40),
            allocation: u64_at(b, 48),
            mac: b[56..88].try_into().unwrap_or([0; MAC_LEN]),
            tag_len: (u32_at(b, 4) >> 16) as u16,
        })
    }
}

/// A decoded response header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Response {
    pub ok: bool,
    pub len: u64,
}

impl Response {
    pub fn encode(&self) -> [u8; RESPONSE_LEN] {
        let mut b = [0u8; RESPONSE_LEN];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&(u32::from(!self.ok)).to_le_bytes());
        b[8..16].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; RESPONSE_LEN]) -> Result<Self, StoreError> {
        if u32_at(b, 0) != MAGIC {
            return Err(StoreError::new(
                ErrorCode::Transport,
                "the data port answered something that is not kvstore",
            ));
        }
        Ok(Self {
            ok: u32_at(b, 4) == 0,
            len: u64_at(b, 8),
        })
    }
}

/// Reads a refusal message back into an error.
pub fn refusal(msg: &[u8]) -> StoreError {
    let text = String::from_utf8_lossy(msg);
    match text
        .split_once(": ")
        .and_then(|(c, rest)| ErrorCode::parse(c).map(|c| (c, rest)))
    {
        Some((code, rest)) => StoreError::new(code, rest),
        None => StoreError::new(ErrorCode::Internal, text.into_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The offsets `store/WIRE.md` section 2 gives, byte for byte.
    #[test]
    fn the_headers_lie_where_wire_md_says() {
        let r = Request {
            op: Op::Write,
            mount_id: 0x0807_0605_0403_0201,
            offset: 0x1817_1615_1413_1211,
            len: 0x2827_2625_2423_2221,
            deadline_unix_ms: 0x3837_3635_3433_3231,
            epoch: 0x4847_4645_4443_4241,
            allocation: 0x5857_5655_5453_5251,
            mac: [0xee; MAC_LEN],
            tag_len: 0x0302,
        };
        let b = r.encode();
        assert_eq!(&b[0..4], b"KVD3");
        assert_eq!(&b[4..6], &[1, 0], "op");
        assert_eq!(&b[6..8], &[2, 3], "tag_len");
        for (at, first) in [(8, 0x01), (16, 0x11), (24, 0x21), (32, 0x31), (40, 0x41), (48, 0x51)] {
            let want: Vec<u8> = (first..first + 8).collect();
            assert_eq!(&b[at..at + 8], want.as_slice(), "the u64 at {at}");
        }
        assert_eq!(&b[56..88], &[0xee; 32], "grant_mac");
        let s = Response {
            ok: false,
            len: 0x0807_0605_0403_0201,
        }
        .encode();
        assert_eq!(&s[0..4], b"KVD3");
        assert_eq!(&s[4..8], &[1, 0, 0, 0], "status: refused");
        assert_eq!(&s[8..16], &[1, 2, 3, 4, 5, 6, 7, 8], "len");
    }

    #[test]
    fn headers_round_trip() {
        let r = Request {
            op: Op::Read,
            mount_id: 7,
            offset: 1 << 40,
            len: 4 << 20,
            deadline_unix_ms: 123,
            epoch: 42,
            allocation: 77,
            mac: [9; MAC_LEN],
            tag_len: 300,
        };
        assert_eq!(Request::decode(&r.encode()), Ok(r));
        let disk = Request { op: Op::ReadDisk, ..r };
        assert_eq!(Request::decode(&disk.encode()), Ok(disk));
        assert_eq!(disk.encode()[4..6], [7, 0], "op 7, as WIRE.md section 2 says");
        let claim = Request { op: Op::TierFile, ..r };
        assert_eq!(Request::decode(&claim.encode()), Ok(claim));
        assert_eq!(claim.encode()[4..6], [8, 0], "op 8, as WIRE.md section 2 says");
        let s = Response { ok: false, len: 9 };
        assert_eq!(Response::decode(&s.encode()), Ok(s));
    }

    /// An op 8 answer's words, where WIRE.md section 2 puts them.
    #[test]
    fn a_tier_file_answer_lies_where_wire_md_says() {
        let f = TierFile {
            file: 0x0403_0201,
            direct: true,
        };
        let b = f.encode();
        assert_eq!(&b[0..8], &[1, 2, 3, 4, 0, 0, 0, 0], "the file's number");
        assert_eq!(&b[8..16], &[1, 0, 0, 0, 0, 0, 0, 0], "flags: O_DIRECT");
        assert_eq!(TierFile::decode(&b), Some(f));
        let buffered = TierFile { direct: false, ..f };
        assert_eq!(TierFile::decode(&buffered.encode()), Some(buffered));
        let mut past = b;
        past[4] = 1;
        assert_eq!(TierFile::decode(&past), None, "no tier numbers a file past 32 bits");
    }

    #[test]
    fn a_disk_read_ends_with_its_verdict_and_only_zero_is_intact() {
        assert_eq!(Verdict::Intact.encode(), [0; VERDICT_LEN]);
        assert_eq!(Verdict::Damaged.encode(), [1, 0, 0, 0, 0, 0, 0, 0]);
        for v in [Verdict::Intact, Verdict::Damaged] {
            assert_eq!(Verdict::decode(&v.encode()), v);
        }
        assert_eq!(Verdict::decode(&[0, 0, 0, 0, 0, 0, 0, 0x80]), Verdict::Damaged);
    }

    #[test]
    fn garbage_is_refused() {
        assert!(Request::decode(&[0u8; REQUEST_LEN]).is_err());
        let mut b = Request {
            op: Op::Write,
            mount_id: 1,
            offset: 0,
            len: 1,
            deadline_unix_ms: 0,
            epoch: 0,
            allocation: 1,
            mac: [0; MAC_LEN],
            tag_len: 0,
        }
        .encode();
        b[4] = 9;
        assert!(Request::decode(&b).is_err());
        // a client of the first data protocol is told to upgrade
        b[0..4].copy_from_slice(&MAGIC_V1.to_le_bytes());
        let old = Request::decode(&b).unwrap_err();
        assert!(old.message.contains("upgrade"), "{old}");
        b[0..4].copy_from_slice(&MAGIC_V2.to_le_bytes());
        assert!(Request::decode(&b).unwrap_err().message.contains("upgrade"));
        assert_eq!(refusal(b"STALE_MOUNT: remount").code, ErrorCode::StaleMount);
    }
}
