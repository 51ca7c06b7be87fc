//! What the disk tier (`member/tiering.rs`) takes from a segment and gives back: a copy of a
//! sealed value whose bytes still match their checksum ([`Segment::tier_copy`]), and a value read
//! back from the tier written into a range as its allocation, sealed ([`Segment::load`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Segment;
use crate::error::ErrorCode;
use crate::member::mmap::WriteRange;

/// A sealed value of the current mount as the disk tier copies it.
#[derive(Debug)]
pub struct TierCopy {
    pub tag: Arc<[u8]>,
    pub bytes: Vec<u8>,
    pub checksum: u64,
    /// the epoch it was written under and the leader's seal (over its tag, offset, size, epoch)
    pub epoch: u64,
    pub seal: [u8; crate::grant::MAC_LEN],
}

impl Segment {
    /// The value `allocation` wrote at `offset` under mount `mount_id`, for the disk tier: only
    /// if it is still there, sealed, and its bytes still match the checksum its write recorded
    /// (a same-host client may have scribbled over them since: that never reaches the disk).
    pub fn tier_copy(&self, mount_id: u64, offset: u64, allocation: u64) -> Option<TierCopy> {
        let (len, held) = {
            let written = self.written.lock();
            if self.mount_id() != mount_id {
                return None;
            }
            written.sealed_value(offset, allocation)?
        };
        let mut bytes = vec![0u8; usize::try_from(len).ok()?];
        self.map.copy_out(offset, &mut bytes).ok()?;
        // The range may have been freed and written again while it was copied: look again.
        let still = {
            let written = self.written.lock();
            self.mount_id() == mount_id && written.sealed_value(offset, allocation).is_some()
        };
        if !still || crate::member::tier::format::value_checksum(&bytes) != held.checksum {
            return None;
        }
        Some(TierCopy {
            tag: held.tag,
            bytes,
            checksum: held.checksum,
            epoch: held.epoch,
            seal: held.seal?,
        })
    }

    /// Writes a value the disk tier held into `offset` as `allocation` (a leader's load notice),
    /// recorded as finished and sealed, as a write through a grant and its commit would have left
    /// it. `false` if the mount changed or a newer allocation took the range meanwhile.
    /// (The tests load from a slice; the disk tier loads with [`Segment::load_with`].)
    #[cfg(test)]
    #[allow(clippy::too_many_arguments)] // each is a different fact of the load notice
    pub fn load(
        &self,
        mount_id: u64,
        offset: u64,
        allocation: u64,
        tag: Arc<[u8]>,
        value: &[u8],
        checksum: u64,
        seal: [u8; crate::grant::MAC_LEN],
    ) -> bool {
        let fill = |range: &mut WriteRange<'_>| range.copy_from(value).map(|()| checksum);
        let placed = LoadAt {
            mount_id,
            offset,
            allocation,
            len: value.len() as u64,
        };
        self.load_with(placed, tag, checksum, seal, fill).unwrap_or(false)
    }

    /// [`Segment::load`] with the bytes written by `fill` (the disk tier reads them straight
    /// into the range), which returns their checksum: kept only when it is `checksum`. `fill`'s
    /// error, or a checksum that differs, leaves nothing readable there under `allocation` (nor
    /// held, so never handed over) and is returned as `Err`.
    pub fn load_with<E>(
        &self,
        at: LoadAt,
        tag: Arc<[u8]>,
        checksum: u64,
        seal: [u8; crate::grant::MAC_LEN],
        fill: impl FnOnce(&mut WriteRange<'_>) -> Result<u64, E>,
    ) -> Result<bool, Mismatch<E>> {
        let LoadAt {
            mount_id,
            offset,
            allocation,
            len,
        } = at;
        {
            let mut written = self.written.lock();
            if self.mount_id() != mount_id || written.write(offset, len, allocation).is_err() {
                return Ok(false);
            }
        }
        let Some(mut range) = self.claim_for_load(offset, len) else {
            self.written.lock().discard(offset, allocation);
            return Err(Mismatch::Busy);
        };
        let filled = fill(&mut range);
        drop(range);
        let outcome = match filled {
            Ok(got) if got == checksum => Ok(()),
            Ok(_) => Err(Mismatch::Checksum),
            Err(e) => Err(Mismatch::Fill(e)),
        };
        if let Err(e) = outcome {
            // the range holds bytes that are not the value: never readable as it
            self.written.lock().discard(offset, allocation);
            return Err(e);
        }
        let epoch = self.epoch();
        let mut written = self.written.lock();
        Ok(self.mount_id() == mount_id
            && written.finish(offset, len, allocation, tag, checksum, epoch)
            && written.seal(offset, allocation, seal))
    }
}

impl Segment {
    /// The write claim on a load's range, waiting up to [`BUSY_WAIT`] for a transfer that still
    /// holds part of it: only a reader of the value the range held before can (the leader placed
    /// the load there), and its lease bounds it. `None` if it is still held then.
    fn claim_for_load(&self, offset: u64, len: u64) -> Option<WriteRange<'_>> {
        let until = Instant::now() + BUSY_WAIT;
        loop {
            match self.map.write_range(offset, len) {
                Ok(range) => return Some(range),
                Err(e) if e.code == ErrorCode::RangeBusy && Instant::now() < until => {
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(_) => return None,
            }
        }
    }
}

/// How long a load waits for a transfer still holding part of its range.
const BUSY_WAIT: Duration = Duration::from_millis(200);

/// Where a load goes: the mount, range and allocation of its notice.
#[derive(Debug, Clone, Copy)]
pub struct LoadAt {
    pub mount_id: u64,
    pub offset: u64,
    pub allocation: u64,
    pub len: u64,
}

/// Why [`Segment::load_with`] kept nothing of what it was given.
#[derive(Debug)]
pub enum Mismatch<E> {
    /// the fill failed
    Fill(E),
    /// the bytes written are not the value's
    Checksum,
    /// a transfer held part of the range for longer than a load waits
    Busy,
}

#[cfg(test)]
mod tests {
    use crate::grant::{Access, MAC_LEN};
    use crate::member::segment::tests::{allocated, mounted, signed_with};

    #[test]
    fn the_tier_copies_only_sealed_intact_values_and_a_load_is_read_as_written() {
        let (seg, key, _dir) = mounted();
        let tag: &[u8] = b"tenant/key";
        let value: Vec<u8> = (0..300u32).map(|i| (i * 7) as u8).collect();
        let write = signed_with(&key, Access::Write, 11, 3, 4096, 300, 5, tag);
        // finished, not sealed: not copied (it may never be committed)
        let mut w = seg.begin_write(write, 300, tag).unwrap();
        w.copy_from(&value).unwrap();
        w.finish();
        assert!(seg.tier_copy(11, 4096, 5).is_none());
        let seal = [4; MAC_LEN];
        let seals = [bytes::Bytes::copy_from_slice(&seal)];
        assert_eq!(seg.seal(11, &[4096], &[5], &seals), 1);
        let copy = seg.tier_copy(11, 4096, 5).expect("sealed and intact");
        assert_eq!(
            (copy.bytes.as_slice(), &copy.tag[..], copy.epoch, copy.seal),
            (&value[..], tag, 3, seal)
        );
        assert!(seg.tier_copy(12, 4096, 5).is_none(), "another mount");
        assert!(seg.tier_copy(11, 4096, 6).is_none(), "another allocation");
        // a byte changed behind the checksum's back never reaches the disk
        seg.map.copy_in(4100, &[0xff]).unwrap();
        assert!(seg.tier_copy(11, 4096, 5).is_none());

        // loaded as allocation 9 at another offset: readable under it, and held sealed
        assert!(seg.load(11, 8192, 9, tag.into(), &value, copy.checksum, seal));
        let read = allocated(&key, Access::Read, 11, 3, 8192, 300, 9);
        assert_eq!(seg.begin_read(read, 300).unwrap().to_vec(), value);
        assert!(seg.tier_copy(11, 8192, 9).is_some());
        assert!(
            !seg.load(12, 16384, 10, tag.into(), &value, copy.checksum, seal),
            "another mount"
        );
        assert!(
            !seg.load(11, 8192, 8, tag.into(), &value, copy.checksum, seal),
            "an older allocation"
        );
        assert!(
            !seg.load(11, (1 << 16) - 100, 11, tag.into(), &value, copy.checksum, seal),
            "out of bounds"
        );
    }

    #[test]
    fn a_load_whose_range_stays_busy_fails_and_leaves_nothing_readable() {
        use super::{LoadAt, Mismatch};
        use crate::member::mmap::WriteRange;
        use std::sync::Arc;

        let (seg, key, _dir) = mounted();
        let value = vec![7u8; 300];
        let tag: Arc<[u8]> = Arc::from(&b"tenant/key"[..]);
        // a reader of what the range held before, still reading
        let reader = seg.map.read_range(8192, 300).unwrap();
        let at = LoadAt {
            mount_id: 11,
            offset: 8192,
            allocation: 9,
            len: 300,
        };
        let fill = |r: &mut WriteRange<'_>| r.copy_from(&value).map(|()| 1u64);
        let loaded = seg.load_with(at, tag.clone(), 1, [4; MAC_LEN], fill);
        assert!(matches!(loaded, Err(Mismatch::Busy)), "{loaded:?}");
        drop(reader);
        let read = allocated(&key, Access::Read, 11, 3, 8192, 300, 9);
        assert!(
            seg.begin_read(read, 300).is_err(),
            "nothing readable under the load's allocation"
        );
        // once the reader is gone the same load goes through
        assert!(seg.load(11, 8192, 9, tag, &value, 1, [4; MAC_LEN]));
        let read = allocated(&key, Access::Read, 11, 3, 8192, 300, 9);
        assert_eq!(seg.begin_read(read, 300).unwrap().to_vec(), value);
    }
}
