use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;

use super::*;
use crate::grant::{Access, MAC_LEN};
use crate::member::segment::tests::{allocated, mounted, signed_with};
use crate::member::tier::TierConfig;

const TAG: &[u8] = b"tenant-a/key";
const SEAL: [u8; MAC_LEN] = [4; MAC_LEN];

fn tier(dir: &std::path::Path, capacity: u64) -> Arc<Tiering> {
    let cfg = TierConfig {
        dir: dir.to_path_buf(),
        capacity,
        file_size: 1 << 20,
    };
    let (t, scan) = Tier::open(&cfg).unwrap();
    Tiering::new(t, scan.found, super::Policy::default()).unwrap()
}

fn value(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed))
        .collect()
}

/// Writes `v` at `offset` as `allocation` under mount 11 (epoch 3) and seals it.
fn committed(seg: &Segment, key: &crate::grant::GrantKey, offset: u64, allocation: u64, v: &[u8]) {
    let len = v.len() as u64;
    let grant = signed_with(key, Access::Write, 11, 3, offset, len, allocation, TAG);
    let mut w = seg.begin_write(grant, len, TAG).unwrap();
    w.copy_from(v).unwrap();
    w.finish();
    let seals = [bytes::Bytes::copy_from_slice(&SEAL)];
    assert_eq!(seg.seal(11, &[offset], &[allocation], &seals), 1);
}

fn load(disk_id: u64, offset: u64, allocation: u64) -> Load {
    Load {
        disk_id,
        offset,
        allocation,
        seal: SEAL,
        tag: TAG.into(),
    }
}

#[test]
fn a_sealed_value_is_copied_reported_once_and_loads_back_byte_exact() {
    let (seg, key, _seg_dir) = mounted();
    let dir = tempfile::tempdir().unwrap();
    let t = tier(dir.path(), 64 << 20);
    let v = value(1, 3000);
    committed(&seg, &key, 4096, 5, &v);
    t.copy(&seg, &[(11, 4096, 5), (11, 8192, 6)]);
    let r = t.take_report();
    assert_eq!(r.spilled.len(), 1, "the second was never written");
    let (h, allocation) = &r.spilled[0];
    assert_eq!((allocation, &h.tag[..], h.size), (&5, TAG, 3000));
    assert_eq!((h.seal_epoch, h.seal_offset, &h.seal[..]), (3, 4096, &SEAL[..]));
    assert!(t.take_report().spilled.is_empty(), "reported once");

    t.apply(&seg, 11, &[load(h.disk_id, 16384, 9)], &[]);
    let read = allocated(&key, Access::Read, 11, 3, 16384, 3000, 9);
    assert_eq!(seg.begin_read(read, 3000).unwrap().to_vec(), v);
    let c = t.counts();
    assert_eq!((c.copied, c.skipped, c.loaded, c.damaged), (1, 1, 1, 0));
    assert!(t.take_report().lost.is_empty());
}

/// `GET /flushed` (a Pod's preStop hook) answers only once a queued value is copied and the
/// leader has heard of the copy (a heartbeat took the report).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushed_waits_for_queued_copies_to_be_made_and_reported() {
    let (seg, key, _seg_dir) = mounted();
    let seg = Arc::new(seg);
    let dir = tempfile::tempdir().unwrap();
    let t = tier(dir.path(), 64 << 20);
    assert!(t.flushed(Duration::ZERO).await.is_ok(), "nothing queued");
    committed(&seg, &key, 4096, 5, &value(2, 3000));
    t.sealed(11, &[4096], &[5]);
    let left = t.flushed(Duration::from_millis(100)).await.unwrap_err();
    assert!(left.contains("1 values queued") && left.contains("0 copies"), "{left}");

    let stop = tokio_util::sync::CancellationToken::new();
    let copier = tokio::spawn(t.clone().run(seg.clone(), stop.clone()));
    crate::eventually::eventually_async(Duration::from_secs(10), "the copy made", || {
        std::future::ready(t.counts().copied == 1)
    })
    .await;
    let left = t.flushed(Duration::from_millis(100)).await.unwrap_err();
    assert!(
        left.contains("0 values queued") && left.contains("1 copies the leader has not heard of"),
        "{left}"
    );
    assert_eq!(t.take_report().spilled.len(), 1, "what the heartbeat tells the leader");
    let done = t.flushed(Duration::from_secs(5)).await.unwrap();
    assert!(done.contains("1 values copied"), "{done}");
    stop.cancel();
    copier.await.unwrap();
}

#[test]
fn a_damaged_copy_is_reported_lost_and_never_written_into_memory() {
    let (seg, key, _seg_dir) = mounted();
    let dir = tempfile::tempdir().unwrap();
    let t = tier(dir.path(), 64 << 20);
    committed(&seg, &key, 4096, 5, &value(2, 5000));
    t.copy(&seg, &[(11, 4096, 5)]);
    let id = t.take_report().spilled[0].0.disk_id;
    let file = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "kvt"))
        .unwrap();
    let f = OpenOptions::new().read(true).write(true).open(file).unwrap();
    let at = DiskId(id).offset() + 2000;
    let mut b = [0u8];
    f.read_exact_at(&mut b, at).unwrap();
    f.write_all_at(&[b[0] ^ 1], at).unwrap();

    t.apply(&seg, 11, &[load(id, 16384, 9)], &[]);
    assert_eq!(t.take_report().lost, vec![id]);
    assert_eq!(t.counts().damaged, 1);
    let read = allocated(&key, Access::Read, 11, 3, 16384, 5000, 9);
    assert!(seg.begin_read(read, 5000).is_err(), "nothing was written there");
    // dropped: a second load finds nothing
    t.apply(&seg, 11, &[load(id, 16384, 10)], &[]);
    assert_eq!(t.take_report().lost, vec![id]);
}

#[test]
fn a_freed_copy_is_gone_and_a_full_tier_drops_its_oldest_file() {
    let (seg, key, _seg_dir) = mounted();
    let dir = tempfile::tempdir().unwrap();
    // room for nine records of 60 KB (15 pages each): the tenth drops the file they are in
    let t = tier(dir.path(), 600_000);
    let mut ids = Vec::new();
    for i in 0..20u64 {
        // one range of the 64 KiB test segment, written again for each value
        let v = value(i as u8, 60_000);
        committed(&seg, &key, 0, 100 + i, &v);
        t.copy(&seg, &[(11, 0, 100 + i)]);
        let r = t.take_report();
        ids.extend(r.spilled.iter().map(|(h, _)| h.disk_id));
    }
    assert_eq!(ids.len(), 20, "every value reached the tier");
    let (used, capacity) = t.usage();
    assert!(used <= capacity);
    let dropped = t.counts().dropped_full;
    assert!(dropped > 0, "the tier made room");

    t.apply(&seg, 11, &[], &[ids[19]]);
    t.apply(&seg, 11, &[load(ids[19], 0, 200)], &[]);
    assert_eq!(t.take_report().lost, vec![ids[19]], "freed, so missing");
}

/// Copies `n` 60 KB values (one range of the test segment, written again each time, under
/// allocations from `first` on) through `t`; returns the disk ids reported.
fn copy_many(t: &Tiering, seg: &Segment, key: &crate::grant::GrantKey, first: u64, n: u64) -> Vec<u64> {
    let mut ids = Vec::new();
    for i in first..first + n {
        let v = value(i as u8, 60_000);
        committed(seg, key, 0, i, &v);
        t.copy(seg, &[(11, 0, i)]);
        ids.extend(t.take_report().spilled.iter().map(|(h, _)| h.disk_id));
    }
    ids
}

fn tier_with(dir: &std::path::Path, capacity: u64, policy: super::Policy) -> Arc<Tiering> {
    let cfg = TierConfig {
        dir: dir.to_path_buf(),
        capacity,
        file_size: 1 << 20,
    };
    let (t, scan) = Tier::open(&cfg).unwrap();
    Tiering::new(t, scan.found, policy).unwrap()
}

#[test]
fn a_key_limit_a_tier_that_keeps_what_it_has_and_a_watermark_bound_what_it_holds() {
    let (seg, key, _seg_dir) = mounted();
    // at most 4 values: the fifth drops the oldest file (all four in it)
    let dir = tempfile::tempdir().unwrap();
    let limited = super::Policy {
        key_limit: 4,
        ..Default::default()
    };
    let t = tier_with(dir.path(), 10 << 20, limited);
    assert_eq!(copy_many(&t, &seg, &key, 100, 6).len(), 6);
    assert!(t.holdings().len() <= 4, "{} held", t.holdings().len());
    assert!(t.counts().dropped_full >= 4);

    // full, and told not to drop: later values are not copied (skipped), earlier ones stay
    let dir = tempfile::tempdir().unwrap();
    let keep = super::Policy {
        evict: false,
        ..Default::default()
    };
    let t = tier_with(dir.path(), 600_000, keep);
    let ids = copy_many(&t, &seg, &key, 200, 12);
    assert_eq!(ids.len(), 9, "nine fit");
    assert_eq!((t.counts().dropped_full, t.counts().skipped), (0, 3));
    assert_eq!(t.holdings().len(), 9);

    // past 50% of 1.2 MB the oldest files go until 25%: never more than half of it held
    let dir = tempfile::tempdir().unwrap();
    let marked = super::Policy {
        watermark: Some((50, 25)),
        ..Default::default()
    };
    let t = tier_with(dir.path(), 1_200_000, marked);
    copy_many(&t, &seg, &key, 300, 30);
    let (used, capacity) = t.usage();
    assert!(used * 2 <= capacity, "{used} of {capacity}");
    assert!(t.counts().dropped_full > 0);
}

/// Reads a direct read's pieces in order (as the data port does): the bytes, and the count.
fn read_direct(t: &Tiering, s: crate::member::tier::Stream) -> Vec<u8> {
    let id = s.id();
    let mut s = s;
    let mut bytes = Vec::new();
    for piece in s.pieces(1024) {
        let _held = futures::executor::block_on(t.piece_room());
        let p = futures::executor::block_on(t.read_piece(s.read_piece(piece)))
            .unwrap()
            .unwrap();
        bytes.extend_from_slice(p.bytes());
        s.take(&p);
        t.give_back(p.into_buffer());
    }
    t.read_done(id, s.finish());
    bytes
}

#[test]
fn a_direct_read_is_of_the_copy_the_grant_names_and_damage_is_reported_and_dropped() {
    let (seg, key, _seg_dir) = mounted();
    let dir = tempfile::tempdir().unwrap();
    let t = tier(dir.path(), 64 << 20);
    let v = value(2, 5000);
    committed(&seg, &key, 4096, 5, &v);
    t.copy(&seg, &[(11, 4096, 5)]);
    let id = t.take_report().spilled[0].0.disk_id;

    // another value's tag or another length: no read, the leader is told this value's copy is
    // not there, and the record stays (it is not this one's)
    assert!(t.open_read(id, b"tenant-b/key", 5000).is_none());
    assert!(t.open_read(id, TAG, 4999).is_none());
    let r = t.take_report();
    assert_eq!((r.lost, r.failed_reads), (vec![id, id], vec![id, id]));
    assert_eq!((t.counts().failed, t.counts().damaged), (2, 0));
    assert!(read_direct(&t, t.open_read(id, TAG, 5000).unwrap()) == v);
    assert_eq!(t.counts().loaded, 1);
    assert!(t.take_report().lost.is_empty());

    // a byte flipped on disk: the bytes are read, the verdict is damage, and the copy goes
    let file = crate::member::tier::DiskId(id).file();
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(dir.path().join(format!("{file:08x}.kvt")))
        .unwrap();
    let at = crate::member::tier::DiskId(id).offset() + 4000;
    let mut b = [0u8];
    f.read_exact_at(&mut b, at).unwrap();
    f.write_all_at(&[b[0] ^ 0x20], at).unwrap();
    assert!(
        read_direct(&t, t.open_read(id, TAG, 5000).unwrap()) != v,
        "the flipped byte is sent"
    );
    let r = t.take_report();
    assert_eq!((r.lost, r.failed_reads), (vec![id], vec![id]));
    assert_eq!((t.counts().loaded, t.counts().damaged), (1, 1));
    assert!(t.open_read(id, TAG, 5000).is_none(), "killed: never read again");
}

#[tokio::test]
async fn direct_reads_hold_at_most_max_pieces_in_memory_and_wait_past_it() {
    let dir = tempfile::tempdir().unwrap();
    let t = tier(dir.path(), 64 << 20);
    let mut held = Vec::new();
    for _ in 0..direct::MAX_PIECES {
        held.push(t.piece_room().await);
    }
    let next = tokio::time::timeout(std::time::Duration::from_millis(50), t.piece_room()).await;
    assert!(next.is_err(), "one piece past the bound waits");
    drop(held.pop());
    let _room = tokio::time::timeout(std::time::Duration::from_secs(5), t.piece_room())
        .await
        .expect("a piece sent makes room");
}
