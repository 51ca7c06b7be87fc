//! A page of a member's report packed into one byte string (`HandoverRequest.packed`,
//! `store/WIRE.md` section 7): the member writes its values' records one after the other, and
//! the leader reads them back on a blocking thread. A page of thousands of `Holding` messages
//! would be decoded on the leader's runtime thread, which also adopts every page under the state
//! lock; read from one `bytes` field, the page costs that thread one copy-free slice.
//!
//! A record: `offset`, `size`, `epoch`, `last_used_unix_ms` (u64 each), `tag_len`, `seal_len`
//! (u32 each), then the tag and the seal. A record's tag and seal are slices of the page, not
//! copies.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::error::{ErrorCode, Result, StoreError};
use crate::proto::Holding;

/// Bytes of a record before its tag.
pub const RECORD_HEAD: usize = 40;

/// One value of a page, as it is packed: what a `Holding` says of it, its tag and seal borrowed.
#[derive(Debug, Clone, Copy)]
pub struct Record<'a> {
    pub offset: u64,
    pub size: u64,
    pub epoch: u64,
    pub last_used_unix_ms: u64,
    pub tag: &'a [u8],
    pub seal: &'a [u8],
}

impl<'a> From<&'a Holding> for Record<'a> {
    fn from(h: &'a Holding) -> Self {
        Record {
            offset: h.offset,
            size: h.size,
            epoch: h.epoch,
            last_used_unix_ms: h.last_used_unix_ms,
            tag: &h.tag,
            seal: &h.seal,
        }
    }
}

/// `records` packed, in order, into one buffer of their size.
pub fn pack<'a>(records: impl Iterator<Item = Record<'a>> + Clone) -> Bytes {
    let len = records.clone().map(|r| RECORD_HEAD + r.tag.len() + r.seal.len()).sum();
    let mut out = BytesMut::with_capacity(len);
    for r in records {
        out.put_u64_le(r.offset);
        out.put_u64_le(r.size);
        out.put_u64_le(r.epoch);
        out.put_u64_le(r.last_used_unix_ms);
        out.put_u32_le(r.tag.len() as u32);
        out.put_u32_le(r.seal.len() as u32);
        out.put_slice(r.tag);
        out.put_slice(r.seal);
    }
    out.freeze()
}

/// The holdings a packed page carries, in order; a page that does not read whole (a record
/// that ends past it) is refused, naming the record.
pub fn unpack(page: &Bytes) -> Result<Vec<Holding>> {
    let mut rest = page.clone();
    let mut out = Vec::new();
    while rest.has_remaining() {
        let bad = |what: &str| {
            StoreError::new(
                ErrorCode::InvalidArgument,
                format!(
                    "HandoverRequest.packed: record {} {what} (store/WIRE.md section 7); send the page again as \
                     this leader's release packs it",
                    out.len()
                ),
            )
        };
        if rest.remaining() < RECORD_HEAD {
            return Err(bad("is cut short before its tag"));
        }
        let (offset, size, epoch, last_used_unix_ms) = (
            rest.get_u64_le(),
            rest.get_u64_le(),
            rest.get_u64_le(),
            rest.get_u64_le(),
        );
        let (tag_len, seal_len) = (rest.get_u32_le() as usize, rest.get_u32_le() as usize);
        if tag_len > crate::grant::MAX_TAG_LEN || seal_len > crate::grant::MAC_LEN {
            return Err(bad("has a tag or seal longer than any a leader makes"));
        }
        if rest.remaining() < tag_len + seal_len {
            return Err(bad("ends past the page"));
        }
        let tag = rest.split_to(tag_len);
        let seal = rest.split_to(seal_len);
        out.push(Holding {
            tag,
            offset,
            size,
            epoch,
            last_used_unix_ms,
            seal,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holding(i: u64, tag: &str, seal: usize) -> Holding {
        Holding {
            tag: Bytes::copy_from_slice(tag.as_bytes()),
            offset: 4096 * i,
            size: 100 + i,
            epoch: 3,
            last_used_unix_ms: 1_700_000_000_000 + i,
            seal: Bytes::from(vec![i as u8; seal]),
        }
    }

    fn pack_all(page: &[Holding]) -> Bytes {
        pack(page.iter().map(Record::from))
    }

    #[test]
    fn a_packed_page_reads_back_as_it_was_packed() {
        let page = vec![holding(1, "k1", 32), holding(2, "", 32), holding(3, "a longer tag", 0)];
        let packed = pack_all(&page);
        assert_eq!(packed.len(), 3 * RECORD_HEAD + 2 + 12 + 2 * 32);
        assert_eq!(unpack(&packed).unwrap(), page);
        assert_eq!(unpack(&Bytes::new()).unwrap(), vec![], "an empty page");
    }

    /// Offsets as store/WIRE.md section 7 gives them.
    #[test]
    fn a_record_lies_where_wire_md_says() {
        let packed = pack_all(&[holding(1, "kt", 32)]);
        assert_eq!(&packed[0..8], 4096u64.to_le_bytes());
        assert_eq!(&packed[8..16], 101u64.to_le_bytes());
        assert_eq!(&packed[16..24], 3u64.to_le_bytes());
        assert_eq!(&packed[24..32], 1_700_000_000_001u64.to_le_bytes());
        assert_eq!(&packed[32..36], 2u32.to_le_bytes());
        assert_eq!(&packed[36..40], 32u32.to_le_bytes());
        assert_eq!(&packed[40..42], b"kt");
        assert_eq!(&packed[42..], [1u8; 32]);
    }

    /// A page cut anywhere inside a record, or claiming a tag longer than any, is refused and
    /// names the record; nothing panics.
    #[test]
    fn a_page_that_does_not_read_whole_is_refused_naming_the_record() {
        let packed = pack_all(&[holding(1, "k1", 32), holding(2, "k2", 32)]);
        let first = RECORD_HEAD + 2 + 32;
        for cut in 1..packed.len() {
            if cut == first {
                continue;
            }
            let e = unpack(&packed.slice(..cut)).unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidArgument);
            let record = if cut < first { 0 } else { 1 };
            assert!(e.message.contains(&format!("record {record} ")), "{cut}: {}", e.message);
        }
        let mut long = BytesMut::from(&pack_all(&[holding(1, "k1", 32)])[..]);
        long[32..36].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(unpack(&long.freeze()).unwrap_err().message.contains("longer than any"));
    }
}
