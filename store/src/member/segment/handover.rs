//! A segment's handover to the next leader: the finished values of ended mounts wait
//! ([`Waiting`]) until a leader mounts the segment again; the member reports those whose bytes
//! still match their checksum ([`Segment::report`], checked ahead of time by
//! [`Segment::precheck`] when the leader stops answering), and the leader's answer says which it
//! adopted and under which allocations of its term ([`Segment::adopt`]). What is not adopted is
//! free space.

use super::Segment;
use crate::member::written::{Count, Retired};

/// Values of ended mounts, waiting for a leader: after a report, exactly those it sent, in its
/// order.
#[derive(Debug, Default)]
pub(super) struct Waiting {
    values: Vec<Retired>,
}

impl Waiting {
    /// Adds the finished values of a mount that just ended.
    pub(super) fn extend(&mut self, ended: Vec<Retired>) {
        self.values.extend(ended);
    }
}

/// What one report found: values whose bytes no longer match their checksum are not reported.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReportCounts {
    pub reported: u64,
    pub bytes: u64,
    /// values whose bytes changed since their write finished
    pub damaged: u64,
    /// values left out because the report was full
    pub left_out: u64,
}

impl Segment {
    /// What this member holds for the next leader: the finished values of ended mounts whose
    /// bytes still match their checksum, least recently used first, at most `max_bytes` of tags
    /// (the most recently used kept). Values that fail the check are freed; the list reported is
    /// the one [`Segment::adopt`] reads the leader's answer against. Once the memory was handed
    /// to a same-host client, every value is hashed here again: the client may have changed it
    /// after any earlier check.
    pub fn report(&self, max_bytes: usize) -> (Vec<crate::proto::Holding>, ReportCounts) {
        let _checking = self.checking.lock();
        let mut retired = self.retired.lock();
        let mut counts = ReportCounts::default();
        let values = std::mem::take(&mut retired.values);
        let trust_checks = !self.handed_out.load(std::sync::atomic::Ordering::Acquire);
        for mut r in values {
            if !(r.held.checked && trust_checks) {
                match self.map.checksum(r.offset, r.len) {
                    Ok(sum) if sum == r.held.checksum => r.held.checked = true,
                    _ => {
                        counts.damaged += 1;
                        continue;
                    }
                }
            }
            retired.values.push(r);
        }
        retired.values.sort_by_key(|r| r.held.used);
        let mut room = max_bytes;
        let mut keep = retired.values.len();
        for (i, r) in retired.values.iter().enumerate().rev() {
            let cost = r.held.tag.len() + 32;
            if cost > room {
                break;
            }
            room -= cost;
            keep = i;
        }
        counts.left_out = keep as u64;
        retired.values.drain(..keep);
        let report: Vec<crate::proto::Holding> = retired
            .values
            .iter()
            .map(|r| crate::proto::Holding {
                tag: bytes::Bytes::copy_from_slice(&r.held.tag),
                offset: r.offset,
                size: r.len,
                epoch: r.held.epoch,
                last_used_unix_ms: r.held.used,
                seal: r
                    .held
                    .seal
                    .map_or_else(bytes::Bytes::new, |s| bytes::Bytes::copy_from_slice(&s)),
            })
            .collect();
        counts.reported = report.len() as u64;
        counts.bytes = retired.values.iter().map(|r| r.len).sum();
        (report, counts)
    }

    /// Checks the checksums of the values the current mount finished, ahead of the report that
    /// will hand them over: called when the leader stops answering, so the check is done by the
    /// time a new leader serves instead of delaying the remount. Values whose bytes changed are no
    /// longer held. The table is locked per value only; transfers go on meanwhile.
    pub fn precheck(&self) {
        let _checking = self.checking.lock();
        let todo = self.written.lock().unchecked();
        for (offset, len, allocation, checksum) in todo {
            let ok = self.map.checksum(offset, len).is_ok_and(|sum| sum == checksum);
            self.written.lock().checked(offset, allocation, checksum, ok);
        }
    }

    /// Holds for a next leader the values the leader sealed once it committed them, `(offset,
    /// allocation, seal)` of mount `mount_id` from a heartbeat answer; nothing changes if the
    /// segment was mounted anew since. Returns how many it sealed.
    pub fn seal(&self, mount_id: u64, offsets: &[u64], allocations: &[u64], seals: &[bytes::Bytes]) -> usize {
        let mut written = self.written.lock();
        if self.mount_id() != mount_id {
            return 0;
        }
        offsets
            .iter()
            .zip(allocations)
            .zip(seals)
            .filter(|((o, a), s)| {
                let Ok(seal) = <[u8; crate::grant::MAC_LEN]>::try_from(&s[..]) else {
                    return false;
                };
                written.seal(**o, **a, seal)
            })
            .count()
    }

    /// Stops holding the values the leader freed, `(offset, allocation)` pairs of mount
    /// `mount_id` from a heartbeat answer, so a next leader is not handed them; nothing changes
    /// if the segment was mounted anew since. Returns how many it held.
    pub fn forget(&self, mount_id: u64, offsets: &[u64], allocations: &[u64]) -> usize {
        let mut written = self.written.lock();
        if self.mount_id() != mount_id {
            return 0;
        }
        offsets
            .iter()
            .zip(allocations)
            .filter(|(o, a)| written.forget(**o, **a))
            .count()
    }

    /// The values the current mount holds for a next leader (finished, whole, not freed), and
    /// their bytes.
    pub fn held(&self) -> Count {
        self.written.lock().held()
    }

    /// Applies a leader's answer to the last [`Segment::report`]: `allocations[i]` is the
    /// allocation the i-th reported value is adopted under in the new mount, 0 where it was not
    /// adopted (its range is free), and `seals[i]` its new seal under the leader's `epoch`. An
    /// answer of another length (a leader that adopts nothing) adopts nothing. Returns how many
    /// values were adopted.
    pub fn adopt(&self, allocations: &[u64], seals: &[bytes::Bytes], epoch: u64) -> u64 {
        let values = std::mem::take(&mut *self.retired.lock());
        if allocations.len() != values.values.len() || seals.len() != allocations.len() {
            return 0;
        }
        let mut written = self.written.lock();
        let mut adopted = 0;
        for ((r, &a), s) in values.values.into_iter().zip(allocations).zip(seals) {
            if a != 0
                && let Ok(seal) = <[u8; crate::grant::MAC_LEN]>::try_from(&s[..])
            {
                written.adopt(r, a, seal, epoch);
                adopted += 1;
            }
        }
        adopted
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{allocated, mounted, signed_with};
    use super::*;
    use crate::grant::{Access, GrantKey};

    /// Writes value `k{allocation}` (100 bytes of `allocation`) at `offset` under mount 11 and
    /// epoch 3, finishing the write or leaving it cut off before its last byte.
    fn write(seg: &Segment, key: &GrantKey, offset: u64, allocation: u64, finish: bool) {
        let tag = format!("k{allocation}").into_bytes();
        let g = signed_with(key, Access::Write, 11, 3, offset, 100, allocation, &tag);
        let mut w = seg.begin_write(g, 100, &tag).unwrap();
        w.copy_from(&[allocation as u8; 100]).unwrap();
        if finish {
            w.finish();
            // the leader committed it: its seal comes with the next heartbeat answer
            assert_eq!(seg.seal(11, &[offset], &[allocation], &[seal(allocation)]), 1);
        }
    }

    fn seal(allocation: u64) -> bytes::Bytes {
        bytes::Bytes::from(vec![allocation as u8; 32])
    }

    /// What a member hands over: values whose writes finished, with their tags, whose bytes
    /// still match; the leader's answer decides what the new mount serves.
    #[test]
    fn a_new_mount_hands_over_finished_whole_values_and_serves_what_was_adopted() {
        let (seg, key, _dir) = mounted();
        write(&seg, &key, 0, 1, true);
        write(&seg, &key, 128, 2, true);
        write(&seg, &key, 256, 3, false); // cut off before its last byte: never finished
        write(&seg, &key, 384, 4, true);
        // a same-host client scribbles over value 2 after its write finished
        seg.map.copy_in(130, &[9]).unwrap();
        seg.set_mount(12);
        let (report, counts) = seg.report(1 << 20);
        let tags: Vec<&[u8]> = report.iter().map(|h| &h.tag[..]).collect();
        assert_eq!(tags, [&b"k1"[..], &b"k4"[..]]);
        assert_eq!(
            counts,
            ReportCounts {
                reported: 2,
                bytes: 200,
                damaged: 1,
                left_out: 0
            }
        );
        assert_eq!((report[1].offset, report[1].size, report[1].epoch), (384, 100, 3));
        assert_eq!(report[1].seal, seal(4), "with the leader's seal");
        // nothing of the old mount is served while the leader has not answered
        let read = |mount_id, allocation, offset| allocated(&key, Access::Read, mount_id, 3, offset, 100, allocation);
        assert!(seg.begin_read(read(12, 1, 0), 100).is_err());
        // the leader adopts k4 as allocation 7, not k1
        assert_eq!(seg.adopt(&[0, 7], &[bytes::Bytes::new(), seal(7)], 4), 1);
        assert_eq!(seg.begin_read(read(12, 7, 384), 100).unwrap().to_vec(), vec![4; 100]);
        assert!(seg.begin_read(read(12, 1, 0), 100).is_err(), "k1 was not adopted");
        // a report too small for everything keeps the most recently used
        seg.set_mount(13);
        let (report, counts) = seg.report(2 + 32);
        assert_eq!((report.len(), counts.left_out), (1, 0));
        assert_eq!(
            seg.adopt(&[], &[], 4),
            0,
            "an answer that does not match the report adopts nothing"
        );
    }

    /// Once the memory was handed to a same-host client, a value changed after the precheck is
    /// still caught by the report.
    #[test]
    fn a_value_changed_after_the_precheck_is_not_reported_once_the_memory_was_handed_out() {
        let (seg, key, _dir) = mounted();
        assert!(seg.hand_out().is_some());
        write(&seg, &key, 0, 1, true);
        write(&seg, &key, 128, 2, true);
        seg.precheck();
        // a client writes into value 2 through its mapping after the check
        seg.map.copy_in(150, &[9]).unwrap();
        seg.set_mount(12);
        let (report, counts) = seg.report(1 << 20);
        let tags: Vec<&[u8]> = report.iter().map(|h| &h.tag[..]).collect();
        assert_eq!(tags, [&b"k1"[..]]);
        assert_eq!(counts.damaged, 1);
    }

    /// The check run when the leader stops answering finds a changed value before the report,
    /// and spares the report hashing the rest again.
    #[test]
    fn a_precheck_drops_changed_values_and_the_report_keeps_the_rest() {
        let (seg, key, _dir) = mounted();
        write(&seg, &key, 0, 1, true);
        write(&seg, &key, 128, 2, true);
        seg.map.copy_in(150, &[9]).unwrap();
        seg.precheck();
        // still served under the current mount: only the record of what it holds changed
        let read = allocated(&key, Access::Read, 11, 3, 0, 100, 1);
        assert_eq!(seg.begin_read(read, 100).unwrap().to_vec(), vec![1; 100]);
        seg.set_mount(12);
        let (report, counts) = seg.report(1 << 20);
        assert_eq!(report.len(), 1);
        assert_eq!(&report[0].tag[..], b"k1");
        assert_eq!(counts.damaged, 0, "found by the precheck, not the report");
    }

    /// A value the leader never sealed (its put was never committed) is not handed over.
    #[test]
    fn a_value_never_committed_is_not_handed_over() {
        let (seg, key, _dir) = mounted();
        write(&seg, &key, 0, 1, true);
        // written whole, never committed: no seal came
        let tag = b"k2".to_vec();
        let g = signed_with(&key, Access::Write, 11, 3, 128, 100, 2, &tag);
        let mut w = seg.begin_write(g, 100, &tag).unwrap();
        w.copy_from(&[2; 100]).unwrap();
        w.finish();
        assert_eq!(seg.held(), Count { values: 1, bytes: 100 });
        assert_eq!(seg.seal(10, &[128], &[2], &[seal(2)]), 0, "an earlier mount's answer");
        seg.set_mount(12);
        let (report, _) = seg.report(1 << 20);
        let tags: Vec<&[u8]> = report.iter().map(|h| &h.tag[..]).collect();
        assert_eq!(tags, [&b"k1"[..]]);
    }

    /// A value the leader freed (a heartbeat answer names it) is not handed to the next one; an
    /// answer about an earlier mount changes nothing.
    #[test]
    fn what_the_leader_freed_is_not_handed_over() {
        let (seg, key, _dir) = mounted();
        write(&seg, &key, 0, 1, true);
        write(&seg, &key, 128, 2, true);
        assert_eq!(seg.held(), Count { values: 2, bytes: 200 });
        assert_eq!(seg.forget(10, &[0], &[1]), 0, "an earlier mount's answer");
        assert_eq!(
            seg.forget(11, &[0, 128], &[1, 9]),
            1,
            "only the allocation that wrote it"
        );
        assert_eq!(seg.held(), Count { values: 1, bytes: 100 });
        seg.set_mount(12);
        let (report, _) = seg.report(1 << 20);
        let tags: Vec<&[u8]> = report.iter().map(|h| &h.tag[..]).collect();
        assert_eq!(tags, [&b"k2"[..]]);
    }
}
