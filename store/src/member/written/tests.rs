//! The range table's rules: grants of freed ranges, finished and sealed values, checks, retiring
//! and adoption.

use super::*;

#[test]
fn a_grant_for_a_freed_and_replaced_range_neither_writes_nor_reads() {
    let mut w = Written::default();
    // A's reservation at [0, 100), then B's value placed there after A's was freed
    w.write(0, 100, 5).unwrap();
    w.write(0, 100, 9).unwrap();
    assert_eq!(
        w.write(0, 100, 5),
        Err(Stale::Replaced { newer: 9 }),
        "A's replayed write"
    );
    assert_eq!(
        w.read(0, 100, 5),
        Err(Stale::Replaced { newer: 9 }),
        "A's old read grant"
    );
    assert_eq!(w.read(0, 100, 9), Ok(()), "B reads its own");
    // the same allocation writes again (a retried transfer)
    assert_eq!(w.write(0, 100, 9), Ok(()));
    assert_eq!(w.len(), 1);
}

#[test]
fn a_newer_placement_over_part_of_a_range_keeps_the_rest() {
    let mut w = Written::default();
    w.write(0, 100, 1).unwrap();
    w.write(200, 100, 2).unwrap();
    // a larger value placed over the end of one and the start of the other
    w.write(50, 200, 3).unwrap();
    assert_eq!(w.len(), 3);
    assert_eq!(w.read(0, 100, 1), Err(Stale::Replaced { newer: 3 }));
    assert_eq!(w.read(200, 100, 2), Err(Stale::Replaced { newer: 3 }));
    assert_eq!(w.read(50, 200, 3), Ok(()));
    // the parts it left are still their old allocations', which cannot write over it
    assert_eq!(w.write(0, 50, 1), Ok(()));
    assert_eq!(w.write(0, 100, 1), Err(Stale::Replaced { newer: 3 }));
    assert_eq!(w.write(250, 50, 2), Ok(()));
}

#[test]
fn nothing_written_reads_nothing_and_a_new_mount_starts_empty() {
    let mut w = Written::default();
    assert_eq!(w.read(0, 64, 1), Err(Stale::NotWritten));
    w.write(64, 64, 4).unwrap();
    assert_eq!(w.read(64, 32, 4), Err(Stale::NotWritten), "only the range as written");
    assert_eq!(w.read(0, 64, 7), Err(Stale::NotWritten));
    assert_eq!(w.retire(), Count::default(), "nothing finished, nothing to report");
    assert!(w.is_empty());
    assert_eq!(w.read(64, 64, 4), Err(Stale::NotWritten));
    // adjacent ranges do not overlap
    w.write(0, 64, 1).unwrap();
    w.write(64, 64, 2).unwrap();
    assert_eq!(w.write(0, 64, 1), Ok(()));
    assert_eq!(w.read(64, 64, 2), Ok(()));
}

#[test]
fn a_discarded_load_reads_nothing_and_a_finished_value_is_never_discarded() {
    let mut w = Written::default();
    w.write(0, 64, 4).unwrap();
    w.discard(0, 4);
    assert_eq!(w.read(0, 64, 4), Err(Stale::NotWritten));
    w.write(0, 64, 5).unwrap();
    assert!(w.finish(0, 64, 5, tag("k"), 1, 1));
    w.discard(0, 5);
    w.discard(0, 6);
    assert_eq!(w.read(0, 64, 5), Ok(()), "finished: it stays");
}

fn tag(k: &str) -> Arc<[u8]> {
    Arc::from(k.as_bytes())
}

/// The values of ended mounts waiting in `w`, in the segment's order.
fn ended(w: &Written) -> Vec<Retired> {
    w.ended_from(0)
        .map(|(offset, len, held)| Retired {
            offset,
            len,
            held: held.clone(),
        })
        .collect()
}

/// A table whose values at `starts` (100 bytes each, allocations 1, 2, ...) were finished,
/// sealed and retired: they wait for a next leader.
fn retired(starts: &[u64]) -> Written {
    let mut w = Written::default();
    for (i, &start) in starts.iter().enumerate() {
        let allocation = i as u64 + 1;
        w.write(start, 100, allocation).unwrap();
        assert!(w.finish(start, 100, allocation, tag("v"), allocation, 1));
        assert!(w.seal(start, allocation, [allocation as u8; 32]));
    }
    w.retire();
    w
}

#[test]
fn only_finished_whole_values_are_reported_in_the_segments_order_with_their_last_use() {
    static NOW: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1000);
    fn tick() -> u64 {
        NOW.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }
    let mut w = Written {
        clock: tick,
        ..Written::default()
    };
    w.write(0, 100, 1).unwrap();
    w.write(128, 100, 2).unwrap();
    w.write(256, 100, 3).unwrap();
    w.write(512, 64, 4).unwrap();
    assert!(w.finish(0, 100, 1, tag("a"), 11, 7));
    assert!(w.finish(128, 100, 2, tag("b"), 22, 7));
    assert!(w.finish(256, 100, 3, tag("c"), 33, 7));
    w.write(640, 100, 6).unwrap();
    assert!(w.finish(640, 100, 6, tag("d"), 44, 7));
    // 4 is still being written: nothing is held for it
    assert!(!w.finish(0, 100, 9, tag("x"), 0, 7), "not the allocation that wrote it");
    assert!(!w.finish(0, 64, 1, tag("x"), 0, 7), "not the range as written");
    // the leader committed a, b and c (d's writer never did), and 4 cannot be sealed
    for (start, allocation) in [(0, 1), (128, 2), (256, 3)] {
        assert!(w.seal(start, allocation, [allocation as u8; 32]));
    }
    assert!(!w.seal(512, 4, [4; 32]), "an unfinished write");
    assert!(!w.seal(0, 9, [9; 32]), "another allocation's seal");
    // a is read after b and c were written
    w.read(0, 100, 1).unwrap();
    // a newer placement over the start of c: c is no longer whole
    w.write(300, 100, 5).unwrap();
    assert_eq!(w.retire(), Count { values: 2, bytes: 200 });
    let r = ended(&w);
    let keys: Vec<&[u8]> = r.iter().map(|r| &*r.held.tag).collect();
    assert_eq!(
        keys,
        [&b"a"[..], &b"b"[..]],
        "a, then b, as they lie; c was cut, 4 unfinished, d never committed"
    );
    assert!(
        r[0].held.used > r[1].held.used,
        "a was used last: read after b was written"
    );
    assert_eq!(
        (
            r[0].offset,
            r[0].len,
            r[0].held.checksum,
            r[0].held.epoch,
            r[0].held.seal
        ),
        (0, 100, 11, 7, Some([1; 32]))
    );
    assert_eq!(
        w.len(),
        2,
        "retired: only the values wait, nothing of the mount is fenced"
    );
    assert_eq!(w.read(0, 100, 1), Err(Stale::NotWritten), "a waiting value is not read");
    // the leader adopted a under its new term's allocation 40 (it keeps its seal and epoch), not b
    assert_eq!(w.adopt(&[0, 128], &[40, 0]), 1);
    assert_eq!(
        (w.waiting(), w.held()),
        (Count::default(), Count { values: 1, bytes: 100 })
    );
    assert_eq!(w.read(0, 100, 40), Ok(()));
    assert_eq!(
        w.read(0, 100, 1),
        Err(Stale::Replaced { newer: 40 }),
        "the old term's number"
    );
    assert_eq!(w.read(128, 100, 2), Err(Stale::NotWritten), "b was not adopted");
    assert_eq!(w.write(0, 100, 39), Err(Stale::Replaced { newer: 40 }));
    assert_eq!(
        w.retire().values,
        1,
        "an adopted value is reported again at the next mount"
    );
    let again = ended(&w);
    assert_eq!(
        (again[0].held.seal, again[0].held.epoch),
        (Some([1; 32]), 7),
        "with the seal and epoch it was committed under"
    );
}

#[test]
fn a_value_the_leader_freed_or_a_newer_placement_cut_is_no_longer_held() {
    let mut w = Written::default();
    for (start, len, allocation) in [(0, 100, 1), (128, 100, 2), (256, 50, 3)] {
        w.write(start, len, allocation).unwrap();
        assert!(w.finish(start, len, allocation, tag("v"), 0, 1));
        assert_eq!(w.held().values, allocation - 1, "held once sealed, not before");
        assert!(w.seal(start, allocation, [0; 32]));
    }
    assert_eq!(w.held(), Count { values: 3, bytes: 250 });
    assert!(!w.forget(0, 9), "another allocation's free");
    assert!(w.forget(0, 1));
    assert!(!w.forget(0, 1), "forgotten once");
    assert_eq!(w.held(), Count { values: 2, bytes: 150 });
    assert_eq!(
        w.write(0, 100, 0),
        Err(Stale::Replaced { newer: 1 }),
        "its range stays fenced for its allocation"
    );
    // a newer placement over the start of the second: it is no longer whole
    w.write(100, 100, 4).unwrap();
    assert_eq!(w.held(), Count { values: 1, bytes: 50 });
    assert_eq!(w.retire().values, 1, "only what is still held is reported");
    assert_eq!(w.held(), Count::default());
    let r = ended(&w);
    w.adopt(&[r[0].offset], &[7]);
    assert_eq!(w.held(), Count { values: 1, bytes: 50 });
}

/// A check in steps looks at every unchecked value once, however many steps it takes: those
/// whose bytes match are marked checked, the others stop being held.
#[test]
fn a_check_in_steps_covers_every_value_once() {
    let mut w = Written::default();
    let n = CHECK_ENTRIES as u64 * 2 + 10;
    for i in 0..n {
        let (start, allocation) = (i * 64, i + 1);
        w.write(start, 64, allocation).unwrap();
        assert!(w.finish(start, 64, allocation, tag("k"), i, 1));
        assert!(w.seal(start, allocation, [1; 32]));
    }
    // every seventh value's bytes changed
    let looked = std::cell::Cell::new(0u64);
    let now = |start: u64, _len: u64| {
        looked.set(looked.get() + 1);
        let i = start / 64;
        Some(if i.is_multiple_of(7) { u64::MAX } else { i })
    };
    let (mut from, mut steps) = (Some(0), 0);
    while let Some(at) = from {
        from = w.check_from(at, now);
        steps += 1;
    }
    assert_eq!((steps, looked.get()), (3, n));
    let changed = n.div_ceil(7);
    assert_eq!(w.held().values, n - changed);
    w.retire();
    let retired = ended(&w);
    assert_eq!(retired.len() as u64, n - changed);
    assert!(
        retired
            .iter()
            .all(|r| r.held.checked && !(r.offset / 64).is_multiple_of(7))
    );
    // checked values are not hashed again
    let mut again = Written::default();
    again.write(0, 64, 1).unwrap();
    assert!(again.finish(0, 64, 1, tag("k"), 5, 1));
    assert_eq!(again.check_from(0, |_, _| Some(5)), None);
    assert_eq!(again.check_from(0, |_, _| panic!("hashed again")), None);
}

/// The values of a mount that ended wait with those of earlier mounts no leader adopted yet, in
/// the segment's order; a mount refused and made again changes nothing of them.
#[test]
fn values_of_every_ended_mount_wait_together_in_the_segments_order() {
    let mut w = retired(&[0, 512]);
    // the next leader adopts the first value, and its mount ends before the second's answer
    assert_eq!(w.adopt(&[0], &[9]), 1);
    w.write(256, 100, 10).unwrap();
    assert!(w.finish(256, 100, 10, tag("new"), 7, 2));
    assert!(w.seal(256, 10, [10; 32]));
    assert_eq!(w.retire(), Count { values: 3, bytes: 300 });
    let offsets: Vec<u64> = ended(&w).iter().map(|r| r.offset).collect();
    assert_eq!(offsets, [0, 256, 512]);
    assert_eq!(w.retire(), Count { values: 3, bytes: 300 }, "nothing was mounted since");
    assert_eq!(w.drop_all_ended(), 3);
    assert!(w.is_empty());
    assert_eq!(w.waiting(), Count::default());
}

/// An answer is applied by offset: a value that stopped waiting after its page was made (its
/// bytes changed) is passed over, and the others get their own allocations.
#[test]
fn an_answer_adopts_each_value_under_its_own_allocation_whatever_left_the_page() {
    let mut w = retired(&[0, 128, 256, 384]);
    assert!(!w.drop_ended(128, 99), "not the value that waits there");
    assert!(w.drop_ended(128, 2), "its bytes changed");
    assert_eq!(w.adopt(&[0, 128, 256, 384], &[20, 21, 22, 0]), 2);
    assert_eq!(w.read(0, 100, 20), Ok(()));
    assert_eq!(w.read(128, 100, 21), Err(Stale::NotWritten));
    assert_eq!(w.read(256, 100, 22), Ok(()));
    assert_eq!(
        w.read(384, 100, 4),
        Err(Stale::NotWritten),
        "not adopted: its range is free"
    );
    assert_eq!((w.len(), w.waiting(), w.held().values), (2, Count::default(), 2));
    // an answer that is not the page's adopts nothing of it, and frees it
    let mut w = retired(&[0, 128]);
    assert_eq!(w.adopt(&[0, 128], &[]), 0);
    assert!(w.is_empty());
}

/// A waiting value fences nothing: a write of the new mount over it (the leader places there
/// only once it did not adopt it) takes its range, and it no longer waits.
#[test]
fn a_write_over_a_waiting_value_takes_its_range() {
    let mut w = retired(&[0, 128]);
    w.write(50, 100, 1).unwrap();
    assert_eq!(w.waiting(), Count::default());
    assert_eq!(w.len(), 1, "no part of either is kept");
    assert_eq!(w.read(50, 100, 1), Ok(()));
}
