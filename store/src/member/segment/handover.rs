//! A segment's handover to the next leader: the finished values of ended mounts wait where they
//! lie in the range table (`written.rs`) until a leader mounts the segment again; the member
//! reports them in the segment's order ([`Segment::report`]: the leader files each by its last
//! use, whatever the order, and takes the ranges one after the other), in pages
//! ([`Segment::page`]) however many there are, each value only if its bytes still match their
//! checksum (checked as its page is made, unless [`Segment::precheck`] did when the leader
//! stopped answering), and each page's answer says which the leader adopted and under which
//! allocations of its term ([`Segment::adopt`]). What is not adopted is free space.

use std::collections::VecDeque;

use super::Segment;
use crate::member::written::{Count, Retired};

/// The most bytes of values a page hashes to check them (at least one value): a page of large
/// values is made in tens of milliseconds, and holds fewer values.
const PAGE_CHECK_BYTES: u64 = 256 << 20;

/// A report of the values of ended mounts (which wait in the range table, `written.rs`): where
/// its next page starts, and the values of each page sent and not answered, by offset.
#[derive(Debug, Default)]
pub(super) struct Report {
    /// where the next page starts (`None`: every value was sent)
    next: Option<u64>,
    /// values not sent yet (an upper bound: a value found changed elsewhere leaves it high until
    /// the last page finds the table's end)
    unsent: u64,
    /// each page sent and not answered: its values' offsets, in order
    sent: VecDeque<Vec<u64>>,
}

/// What a report starts with: the values it will hand over whose bytes still match.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReportCounts {
    pub values: u64,
    pub bytes: u64,
}

impl Segment {
    /// Starts a report for the next leader: the finished values of ended mounts, in the
    /// segment's order (pages sent to an earlier leader and not answered are sent again: their
    /// values still wait). Their checksums are checked as the pages are made, so the first page
    /// goes out at once.
    pub fn report(&self) -> ReportCounts {
        let mut report = self.report.lock();
        let waiting = self.written.lock().waiting();
        *report = Report {
            next: (waiting.values > 0).then_some(0),
            unsent: waiting.values,
            sent: VecDeque::new(),
        };
        self.note_answers_due(&report);
        ReportCounts {
            values: waiting.values,
            bytes: waiting.bytes,
        }
    }

    /// The report's next page: the values not sent yet, in order, whose bytes still match their
    /// checksum, at most `max_bytes` of tags and seals (at least one value, if any is left).
    /// Values whose bytes changed since their write finished are freed. Once the memory was
    /// handed to a same-host client, every value is hashed here again: the client may have
    /// changed it after any earlier check.
    pub fn page(&self, max_bytes: usize) -> Vec<crate::proto::Holding> {
        self.next_page(max_bytes, holdings)
    }

    /// The report's next page as [`page`](Self::page) takes it, packed (`crate::holdings`): how
    /// many values it holds, and their records.
    pub fn packed_page(&self, max_bytes: usize) -> (usize, bytes::Bytes) {
        self.next_page(max_bytes, |values| {
            (values.len(), crate::holdings::pack(values.iter().map(record)))
        })
    }

    /// Takes the report's next page (see [`page`](Self::page)) and makes it with `make`, given its
    /// values. The values are taken from the range table
    /// under its lock and hashed outside it, so transfers of the current mount go on meanwhile.
    fn next_page<R>(&self, max_bytes: usize, make: impl FnOnce(&[Retired]) -> R) -> R {
        let trust_checks = !self.handed_out.load(std::sync::atomic::Ordering::Acquire);
        let mut report = self.report.lock();
        let mut values: Vec<Retired> = Vec::new();
        if let Some(from) = report.next {
            let written = self.written.lock();
            let (mut room, mut hashing) = (max_bytes, 0u64);
            let mut next = None;
            for (offset, len, held) in written.ended_from(from) {
                let cost = held.tag.len() + 32;
                if (cost > room || hashing >= PAGE_CHECK_BYTES) && !values.is_empty() {
                    next = Some(offset);
                    break;
                }
                room = room.saturating_sub(cost);
                if !(held.checked && trust_checks) {
                    hashing += len;
                }
                values.push(Retired {
                    offset,
                    len,
                    held: held.clone(),
                });
            }
            report.next = next;
            report.unsent = match next {
                Some(_) => report.unsent.saturating_sub(values.len() as u64),
                None => 0,
            };
        }
        let mut damaged = Vec::new();
        values.retain(|r| {
            let whole = (r.held.checked && trust_checks)
                || self
                    .map
                    .checksum(r.offset, r.len)
                    .is_ok_and(|sum| sum == r.held.checksum);
            if !whole {
                damaged.push((r.offset, r.held.checksum));
            }
            whole
        });
        if !damaged.is_empty() {
            let mut written = self.written.lock();
            for (offset, checksum) in &damaged {
                written.drop_ended(*offset, *checksum);
            }
            tracing::warn!(
                damaged = damaged.len(),
                "some held values are not reported: their bytes changed since their write finished"
            );
        }
        if !values.is_empty() {
            report.sent.push_back(values.iter().map(|r| r.offset).collect());
        }
        self.note_answers_due(&report);
        make(&values)
    }

    /// Ends the report: the values not answered yet are no longer held (the leader may place
    /// new values over them). Returns how many.
    pub fn end_report(&self) -> usize {
        let mut report = self.report.lock();
        let dropped = self.written.lock().drop_all_ended();
        *report = Report::default();
        self.note_answers_due(&report);
        self.mount_changed.notify_waiters();
        dropped as usize
    }

    /// Values of the report not sent in a page yet.
    pub fn unsent(&self) -> usize {
        self.report.lock().unsent as usize
    }

    /// Checks the checksums of the values the current mount finished, ahead of the report that
    /// will hand them over: called when the leader stops answering, so the check is done by the
    /// time a new leader serves instead of delaying the remount. Values whose bytes changed are no
    /// longer held. The table is locked a few thousand values at a time; transfers go on between.
    pub fn precheck(&self) {
        let _checking = self.checking.lock();
        let mut from = Some(0);
        while let Some(at) = from {
            from = self
                .written
                .lock()
                .check_from(at, |offset, len| self.map.checksum(offset, len).ok());
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

    /// Applies a leader's answer to the report's oldest unanswered page, of `page` values:
    /// `allocations[i]` is the allocation its i-th value is adopted under in the new mount, 0
    /// where it was not adopted (its range is free). An adopted value keeps its seal. An answer
    /// of another length (a leader that adopts nothing) adopts none of the page. Returns how many
    /// values were adopted.
    pub fn adopt(&self, page: usize, allocations: &[u64]) -> u64 {
        let mut report = self.report.lock();
        if page == 0 {
            return 0;
        }
        let Some(offsets) = report.sent.pop_front() else {
            return 0;
        };
        let allocations = if allocations.len() == offsets.len() {
            allocations
        } else {
            &[]
        };
        let adopted = self.written.lock().adopt(&offsets, allocations);
        // the reads of what this answer adopted, waiting since the leader adopted it, go on
        self.note_answers_due(&report);
        drop(report);
        self.mount_changed.notify_waiters();
        adopted
    }

    /// Records whether pages of the report are sent and not answered, for the reads that wait
    /// on it ([`Segment::settle`]); called under the report's lock, so that two callers cannot
    /// record their findings in the other order.
    fn note_answers_due(&self, report: &Report) {
        self.answers_due
            .store(!report.sent.is_empty(), std::sync::atomic::Ordering::Release);
    }
}

/// A page's value as it is packed.
fn record(r: &Retired) -> crate::holdings::Record<'_> {
    crate::holdings::Record {
        offset: r.offset,
        size: r.len,
        epoch: r.held.epoch,
        last_used_unix_ms: r.held.used,
        tag: &r.held.tag,
        seal: r.held.seal.as_ref().map_or(&[][..], |s| &s[..]),
    }
}

/// The holdings of a page's values: their tags and seals copied into one buffer, which each
/// holding shares (one allocation a page, not two a value).
fn holdings(values: &[Retired]) -> Vec<crate::proto::Holding> {
    let bytes = values
        .iter()
        .map(|r| r.held.tag.len() + r.held.seal.map_or(0, |s| s.len()))
        .sum();
    let mut buf = bytes::BytesMut::with_capacity(bytes);
    for r in values {
        buf.extend_from_slice(&r.held.tag);
        if let Some(seal) = &r.held.seal {
            buf.extend_from_slice(seal);
        }
    }
    let mut buf = buf.freeze();
    values
        .iter()
        .map(|r| crate::proto::Holding {
            tag: buf.split_to(r.held.tag.len()),
            offset: r.offset,
            size: r.len,
            epoch: r.held.epoch,
            last_used_unix_ms: r.held.used,
            seal: r.held.seal.map_or_else(bytes::Bytes::new, |s| buf.split_to(s.len())),
        })
        .collect()
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

    /// A segment holding values 1..=`n` (each at `(a - 1) * 128`), finished and sealed under
    /// mount 11, then mounted anew as 12: they wait for the next leader.
    fn remounted_holding(n: u64) -> (Segment, GrantKey, tempfile::TempDir) {
        let (seg, key, dir) = mounted();
        for a in 1..=n {
            write(&seg, &key, (a - 1) * 128, a, true);
        }
        seg.set_mount(12);
        (seg, key, dir)
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
        let counts = seg.report();
        let report = seg.page(1 << 20);
        let tags: Vec<&[u8]> = report.iter().map(|h| &h.tag[..]).collect();
        assert_eq!(tags, [&b"k1"[..], &b"k4"[..]]);
        // k2 is counted until its page finds its bytes changed
        assert_eq!(counts, ReportCounts { values: 3, bytes: 300 });
        assert_eq!(seg.unsent(), 0, "k2 is freed");
        assert_eq!((report[1].offset, report[1].size, report[1].epoch), (384, 100, 3));
        assert_eq!(report[1].seal, seal(4), "with the leader's seal");
        // nothing of the old mount is served while the leader has not answered
        let read = |mount_id, allocation, offset| allocated(&key, Access::Read, mount_id, 3, offset, 100, allocation);
        assert!(seg.begin_read(read(12, 1, 0), 100).is_err());
        // the leader adopts k4 as allocation 7, not k1
        assert_eq!(seg.adopt(2, &[0, 7]), 1);
        assert_eq!(seg.begin_read(read(12, 7, 384), 100).unwrap().to_vec(), vec![4; 100]);
        assert!(seg.begin_read(read(12, 1, 0), 100).is_err(), "k1 was not adopted");
        // k4, held under the new mount, is reported to the next with the seal and epoch it was
        // committed under; an answer that does not match its page adopts none of it
        seg.set_mount(13);
        assert_eq!(seg.report().values, 1);
        let again = seg.page(1 << 20);
        assert_eq!((again.len(), again[0].epoch), (1, 3));
        assert_eq!(again[0].seal, seal(4), "the seal it was reported with");
        assert_eq!(
            seg.adopt(1, &[]),
            0,
            "an answer that does not match the page adopts nothing"
        );
        assert_eq!(seg.unsent(), 0);
        seg.set_mount(14);
        assert_eq!(seg.report().values, 0, "what was not adopted is free");
    }

    /// However many values a segment holds, its report hands over every one, in pages no larger
    /// than asked; a remount in the middle reports again the pages not answered, and what the
    /// answered pages adopted is held by the new mount and reported too.
    #[test]
    fn a_report_comes_in_pages_and_a_remount_in_the_middle_leaves_nothing_out() {
        let (seg, _key, _dir) = remounted_holding(500);
        assert_eq!(seg.report().values, 500);
        let limit = 36 * 40;
        let mut next = 1000;
        for _ in 0..3 {
            let page = seg.page(limit);
            assert!(page.iter().map(|h| h.tag.len() + 32).sum::<usize>() <= limit);
            let allocations: Vec<u64> = page.iter().map(|_| (next, next += 1).0).collect();
            assert_eq!(seg.adopt(page.len(), &allocations), page.len() as u64);
        }
        let adopted = next - 1000;
        assert_eq!(
            seg.held().values,
            adopted,
            "the answered pages are held by the new mount"
        );
        // one more page is sent, and the leader stops answering
        let unanswered = seg.page(limit).len();
        assert!(unanswered > 0 && seg.unsent() > 0);
        seg.set_mount(13);
        assert_eq!(seg.report().values, 500, "adopted and unanswered alike");
        let mut tags = std::collections::BTreeSet::new();
        let mut pages = 0;
        while seg.unsent() > 0 {
            let page = seg.page(limit);
            assert!(!page.is_empty());
            tags.extend(page.iter().map(|h| h.tag.clone()));
            pages += 1;
            assert_eq!(seg.adopt(page.len(), &vec![0; page.len()]), 0);
        }
        assert_eq!((tags.len(), pages), (500, 500usize.div_ceil(40)));
        seg.set_mount(14);
        assert_eq!(seg.report().values, 0, "what no page adopted is free");
    }

    /// A packed page holds the values a page of messages would, in the same order, and counts
    /// them.
    #[test]
    fn a_packed_page_is_the_page_its_messages_would_be() {
        let (seg, _key, _dir) = remounted_holding(10);
        seg.report();
        let (n, packed) = seg.packed_page(36 * 4);
        assert_eq!(n, 4);
        // the leader stopped answering: the page is reported again, first
        seg.set_mount(13);
        seg.report();
        assert_eq!(crate::holdings::unpack(&packed).unwrap(), seg.page(36 * 4));
    }

    /// A report the leader refuses to go on with ends: what it did not answer is no longer held.
    #[test]
    fn an_ended_report_holds_nothing_it_did_not_answer() {
        let (seg, _key, _dir) = remounted_holding(10);
        seg.report();
        let page = seg.page(36 * 4);
        assert_eq!(page.len(), 4);
        assert_eq!(seg.adopt(4, &[21, 22, 23, 24]), 4);
        seg.page(36 * 4);
        assert_eq!(seg.end_report(), 6, "the page sent and the values not sent");
        assert_eq!(seg.unsent(), 0);
        seg.set_mount(13);
        assert_eq!(seg.report().values, 4, "only what was adopted");
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
        let counts = seg.report();
        let report = seg.page(1 << 20);
        let tags: Vec<&[u8]> = report.iter().map(|h| &h.tag[..]).collect();
        assert_eq!(tags, [&b"k1"[..]]);
        assert_eq!(counts.values, 2, "value 2 is found changed as its page is made");
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
        let counts = seg.report();
        let report = seg.page(1 << 20);
        assert_eq!(report.len(), 1);
        assert_eq!(&report[0].tag[..], b"k1");
        assert_eq!(
            counts.values, 1,
            "value 2 was dropped by the precheck, before the report"
        );
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
        seg.report();
        let report = seg.page(1 << 20);
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
        seg.report();
        let report = seg.page(1 << 20);
        let tags: Vec<&[u8]> = report.iter().map(|h| &h.tag[..]).collect();
        assert_eq!(tags, [&b"k2"[..]]);
    }

    /// A read the leader granted for a value of a page it adopted, arriving before this member
    /// applied the page's answer, waits for the answer instead of missing.
    #[tokio::test]
    async fn a_read_of_a_value_whose_page_is_not_answered_yet_waits_for_the_answer() {
        let (seg, key, _dir) = remounted_holding(2);
        seg.report();
        assert_eq!(seg.page(1 << 20).len(), 2);
        let read = allocated(&key, Access::Read, 12, 3, 128, 100, 8);
        let (served, ()) = tokio::join!(
            async {
                seg.settle(&read, Access::Read, 100, &[]).await;
                seg.begin_read(read, 100).map(|r| r.to_vec())
            },
            async {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                assert_eq!(seg.adopt(2, &[7, 8]), 2);
            }
        );
        assert_eq!(served.unwrap(), vec![2; 100]);
        // with no answer due, a read of what is not held is refused at once
        let gone = allocated(&key, Access::Read, 12, 3, 512, 100, 9);
        seg.settle(&gone, Access::Read, 100, &[]).await;
        assert!(seg.begin_read(gone, 100).is_err());
    }
}
