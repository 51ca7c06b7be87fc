use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;

use super::format::{ALIGN, Header};
use super::*;
use crate::grant::MAC_LEN;

const MIB: u64 = 1 << 20;

fn config(dir: &Path) -> TierConfig {
    TierConfig {
        dir: dir.to_path_buf(),
        capacity: 64 * MIB,
        file_size: MIB,
    }
}

fn header(key: &str) -> Header {
    Header {
        dead: false,
        len: 0,
        checksum: 0,
        epoch: 3,
        seal_offset: 8192,
        seal: [7; MAC_LEN],
        written_ms: 1_700_000_000_000,
        tag: tag(key),
    }
}

fn tag(key: &str) -> Vec<u8> {
    format!("tenant-a/{key}").into_bytes()
}

fn value(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(SUFFIX))
        .collect();
    names.sort();
    names
}

fn flip(dir: &Path, id: DiskId, at: u64) {
    let path = dir.join(format!("{:08x}{SUFFIX}", id.file()));
    let f = OpenOptions::new().read(true).write(true).open(path).unwrap();
    let mut b = [0u8];
    f.read_exact_at(&mut b, id.offset() + at).unwrap();
    b[0] ^= 0x10;
    f.write_all_at(&b, id.offset() + at).unwrap();
}

#[test]
fn values_come_back_byte_exact_after_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let mut ids = Vec::new();
    {
        let (mut tier, scan) = Tier::open(&config(dir.path())).unwrap();
        assert!(scan.found.is_empty());
        for i in 0..20u8 {
            let v = value(i, 1000 + 3000 * i as usize);
            let id = tier.append(&header(&format!("k{i}")), &v).unwrap();
            assert_eq!(tier.read(id, &tag(&format!("k{i}"))).unwrap(), v);
            ids.push(id);
        }
        tier.sync().unwrap();
        assert_eq!(tier.values(), 20);
    }
    let (tier, scan) = Tier::open(&config(dir.path())).unwrap();
    assert_eq!((scan.dead, scan.damaged, scan.torn, scan.emptied), (0, 0, 0, 0));
    assert_eq!(scan.found.iter().map(|f| f.id).collect::<Vec<_>>(), ids);
    for (i, found) in scan.found.iter().enumerate() {
        let v = value(i as u8, 1000 + 3000 * i);
        assert_eq!(found.header.len, v.len() as u64);
        assert_eq!(found.header.checksum, format::value_checksum(&v));
        assert_eq!((found.header.epoch, found.header.seal_offset), (3, 8192));
        assert_eq!(found.header.seal, [7; MAC_LEN]);
        assert_eq!(tier.read(found.id, &found.header.tag).unwrap(), v);
    }
    assert!(tier.used() > 0);
    assert_eq!(tier.used() % ALIGN, 0);
}

#[test]
fn one_member_at_a_time_opens_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    let (first, _) = Tier::open(&config(dir.path())).unwrap();
    let err = Tier::open(&config(dir.path())).unwrap_err();
    assert!(matches!(err, TierError::Locked(_)), "{err}");
    assert!(err.to_string().contains("a directory of its own"), "{err}");
    drop(first);
    Tier::open(&config(dir.path())).unwrap();
}

#[test]
fn a_missing_directory_or_a_bad_file_size_is_a_clear_error() {
    let err = Tier::open(&config(Path::new("/nonexistent/tier"))).unwrap_err();
    assert!(err.to_string().contains("/nonexistent/tier"), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let cfg = TierConfig {
        file_size: 10,
        ..config(dir.path())
    };
    assert!(matches!(Tier::open(&cfg).unwrap_err(), TierError::Config(_)));
}

#[test]
fn a_flipped_byte_in_a_value_is_damage_on_read_never_the_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let (mut tier, _) = Tier::open(&config(dir.path())).unwrap();
    let a = tier.append(&header("a"), &value(1, 5000)).unwrap();
    let b = tier.append(&header("b"), &value(2, 5000)).unwrap();
    let at = format::payload_at(tag("a").len()) + 4321;
    flip(dir.path(), a, at);
    assert!(matches!(tier.read(a, &tag("a")), Err(ReadError::Damaged { .. })));
    assert_eq!(tier.read(b, &tag("b")).unwrap(), value(2, 5000));
    // The caller drops what was damaged.
    assert!(tier.kill(a).unwrap());
    assert!(matches!(tier.read(a, &tag("a")), Err(ReadError::Missing(_))));
}

#[test]
fn a_read_for_another_tag_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (mut tier, _) = Tier::open(&config(dir.path())).unwrap();
    let a = tier.append(&header("a"), &value(1, 100)).unwrap();
    let err = tier.read(a, &tag("b")).unwrap_err();
    assert!(err.to_string().contains("tag differs"), "{err}");
}

#[test]
fn a_damaged_header_costs_its_record_only() {
    let dir = tempfile::tempdir().unwrap();
    let ids: Vec<DiskId> = {
        let (mut tier, _) = Tier::open(&config(dir.path())).unwrap();
        (0..5u8)
            .map(|i| tier.append(&header(&format!("k{i}")), &value(i, 9000)).unwrap())
            .collect()
    };
    flip(dir.path(), ids[2], 20); // inside the value's checksum field
    let (tier, scan) = Tier::open(&config(dir.path())).unwrap();
    let found: Vec<DiskId> = scan.found.iter().map(|f| f.id).collect();
    assert_eq!(found, vec![ids[0], ids[1], ids[3], ids[4]]);
    // Its three pages were looked at for a header and did not hold one.
    assert_eq!(scan.damaged, 3);
    assert!(matches!(tier.read(ids[2], &tag("k2")), Err(ReadError::Missing(_))));
    assert_eq!(tier.read(ids[3], &tag("k3")).unwrap(), value(3, 9000));
}

#[test]
fn a_record_cut_short_by_a_crash_is_left_out_and_appends_go_to_a_new_file() {
    let dir = tempfile::tempdir().unwrap();
    let ids: Vec<DiskId> = {
        let (mut tier, _) = Tier::open(&config(dir.path())).unwrap();
        (0..3u8)
            .map(|i| tier.append(&header(&format!("k{i}")), &value(i, 10_000)).unwrap())
            .collect()
    };
    let path = dir.path().join(&files(dir.path())[0]);
    let f = OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(ids[2].offset() + 5000).unwrap();
    let (mut tier, scan) = Tier::open(&config(dir.path())).unwrap();
    assert_eq!(scan.torn, 1);
    assert_eq!(scan.found.iter().map(|f| f.id).collect::<Vec<_>>(), ids[..2]);
    let d = tier.append(&header("d"), &value(9, 100)).unwrap();
    assert_ne!(d.file(), ids[0].file());
    assert_eq!(files(dir.path()).len(), 2);
    assert_eq!(tier.read(d, &tag("d")).unwrap(), value(9, 100));
}

#[test]
fn zeros_past_the_last_record_are_not_damage() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (mut tier, _) = Tier::open(&config(dir.path())).unwrap();
        tier.append(&header("a"), &value(1, 100)).unwrap();
    }
    let path = dir.path().join(&files(dir.path())[0]);
    let f = OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(5 * ALIGN).unwrap();
    let (_, scan) = Tier::open(&config(dir.path())).unwrap();
    assert_eq!((scan.found.len(), scan.damaged, scan.torn), (1, 0, 0));
}

#[test]
fn removed_values_stay_removed_and_empty_files_go() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let (a, b, c) = {
        let (mut tier, _) = Tier::open(&cfg).unwrap();
        let a = tier.append(&header("a"), &value(1, 600_000)).unwrap();
        let b = tier.append(&header("b"), &value(2, 600_000)).unwrap();
        let c = tier.append(&header("c"), &value(3, 600_000)).unwrap();
        assert_eq!(
            (a.file(), b.file(), c.file()),
            (0, 1, 2),
            "one file per record of this size"
        );
        let used = tier.used();
        assert!(tier.kill(a).unwrap());
        assert!(!tier.kill(a).unwrap());
        assert_eq!(files(dir.path()).len(), 2, "a's file held nothing else");
        assert!(tier.used() < used);
        assert!(
            tier.kill(c).unwrap(),
            "c's file is the one appended to: kept, c marked dead"
        );
        (a, b, c)
    };
    let (tier, scan) = Tier::open(&cfg).unwrap();
    assert_eq!(scan.found.iter().map(|f| f.id).collect::<Vec<_>>(), vec![b]);
    assert_eq!((scan.dead, scan.emptied), (1, 1));
    assert_eq!(files(dir.path()).len(), 1);
    assert!(matches!(tier.read(a, &tag("a")), Err(ReadError::Missing(_))));
    assert!(matches!(tier.read(c, &tag("c")), Err(ReadError::Missing(_))));
}

#[test]
fn a_full_tier_refuses_until_its_oldest_file_is_removed() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = TierConfig {
        capacity: 3 * MIB,
        ..config(dir.path())
    };
    let (mut tier, _) = Tier::open(&cfg).unwrap();
    let mut ids = Vec::new();
    let err = loop {
        match tier.append(&header(&format!("k{}", ids.len())), &value(0, 200_000)) {
            Ok(id) => ids.push(id),
            Err(e) => break e,
        }
    };
    assert!(matches!(err, TierError::Full { .. }), "{err}");
    assert!(tier.used() <= cfg.capacity);
    let (n, oldest) = tier.oldest().unwrap();
    assert_eq!(n, ids[0].file());
    assert_eq!(
        oldest,
        ids.iter().copied().filter(|id| id.file() == n).collect::<Vec<_>>()
    );
    assert_eq!(tier.remove_file(n).unwrap(), oldest);
    let id = tier.append(&header("after"), &value(0, 200_000)).unwrap();
    assert_eq!(tier.read(id, &tag("after")).unwrap(), value(0, 200_000));
    assert!(matches!(tier.read(ids[0], &tag("k0")), Err(ReadError::Missing(_))));
    assert_eq!(tier.values(), ids.len() - oldest.len() + 1);
}

#[test]
fn only_tier_files_are_read() {
    assert_eq!(file_number("0000002a.kvt"), Some(42));
    for name in [
        "0000002A.kvt",
        "2a.kvt",
        "0000002a.kvt.tmp",
        ".lock",
        "0000002g.kvt",
        "+000002a.kvt",
    ] {
        assert_eq!(file_number(name), None, "{name}");
    }
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("notes.txt"), "an operator's file").unwrap();
    let (_, scan) = Tier::open(&config(dir.path())).unwrap();
    assert!(scan.found.is_empty());
    assert!(dir.path().join("notes.txt").exists());
}

#[test]
fn the_least_recently_used_file_is_the_one_neither_appended_to_nor_read_from_last() {
    let dir = tempfile::tempdir().unwrap();
    let (mut t, _) = Tier::open(&config(dir.path())).unwrap();
    // 300 KB values: three to a 1 MiB file, so four files
    let ids: Vec<DiskId> = (0..10u8)
        .map(|i| t.append(&header(&format!("k{i}")), &value(i, 300_000)).unwrap())
        .collect();
    let first = ids[0].file();
    assert_eq!(t.oldest().unwrap().0, first);
    assert_eq!(t.least_recent().unwrap().0, first, "nothing read yet: the oldest");
    // a read makes the first file the most recent: the second is now the least
    t.read(ids[0], &tag("k0")).unwrap();
    assert_eq!(t.oldest().unwrap().0, first, "FIFO does not care");
    assert_eq!(t.least_recent().unwrap().0, ids[3].file());
    assert_ne!(ids[3].file(), first);
}

/// Reads `id` as a direct read does, in pieces of `piece` bytes taken in order (`O_DIRECT` when
/// `direct` and the file system allows it): the bytes, and whether they were the value.
fn streamed(tier: &Tier, id: DiskId, piece: u64, direct: bool) -> (Vec<u8>, Result<(), ReadError>) {
    let mut s = tier.stream_known(id).unwrap();
    if !direct {
        s = s.through_page_cache();
    }
    let mut bytes = Vec::new();
    for piece in s.pieces(piece) {
        let p = s.read_piece(piece)(Vec::new()).unwrap();
        bytes.extend_from_slice(p.bytes());
        s.take(&p);
    }
    (bytes, s.finish())
}

/// A tier in `dir` whose files hold values of several MiB.
fn tier_of_large_files(dir: &Path) -> Tier {
    let cfg = TierConfig {
        file_size: 8 * MIB,
        ..config(dir)
    };
    Tier::open(&cfg).unwrap().0
}

/// Whether `dir`'s file system takes `O_DIRECT` (tmpfs does not).
fn takes_o_direct(dir: &Path) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    let probe = dir.join("probe");
    fs::write(&probe, b"x").unwrap();
    let ok = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(&probe)
        .is_ok();
    fs::remove_file(probe).unwrap();
    ok
}

#[test]
fn a_direct_read_streams_a_value_in_pieces_whatever_its_length_and_alignment() {
    let dir = tempfile::tempdir().unwrap();
    let mut tier = tier_of_large_files(dir.path());
    // values that end inside a block, on one, and at the file's end (the last record)
    let lens = [1usize, 4095, 4096, 100_000, MIB as usize + 3, 2 * MIB as usize];
    let ids: Vec<DiskId> = lens
        .iter()
        .enumerate()
        .map(|(i, len)| tier.append(&header(&format!("k{i}")), &value(i as u8, *len)).unwrap())
        .collect();
    assert_eq!(
        tier.stream_known(ids[0]).unwrap().is_direct(),
        takes_o_direct(dir.path())
    );
    for (i, (id, len)) in ids.iter().zip(lens).enumerate() {
        for piece in [4096 * 3 + 512, 1 << 20, 4 << 20] {
            for direct in [true, false] {
                let (bytes, verdict) = streamed(&tier, *id, piece, direct);
                assert!(
                    bytes == value(i as u8, len),
                    "value {i}, pieces of {piece}, direct {direct}"
                );
                assert!(verdict.is_ok(), "value {i}: {verdict:?}");
            }
        }
    }
}

#[test]
fn a_flipped_byte_is_sent_but_the_verdict_after_the_last_piece_says_damaged() {
    let dir = tempfile::tempdir().unwrap();
    let (mut tier, _) = Tier::open(&config(dir.path())).unwrap();
    let a = tier.append(&header("a"), &value(1, 300_000)).unwrap();
    tier.sync().unwrap();
    flip(dir.path(), a, format::payload_at(tag("a").len()) + 250_000);
    for direct in [true, false] {
        let (bytes, verdict) = streamed(&tier, a, 64 * 1024, direct);
        assert_eq!(bytes.len(), 300_000);
        assert!(bytes != value(1, 300_000));
        assert!(
            matches!(&verdict, Err(ReadError::Damaged { why, .. }) if why.contains("checksum")),
            "{verdict:?}"
        );
    }
}

#[test]
fn a_stream_reads_on_what_its_record_held_after_the_record_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let (mut tier, _) = Tier::open(&config(dir.path())).unwrap();
    let a = tier.append(&header("a"), &value(3, 50_000)).unwrap();
    let s = tier.stream_known(a).unwrap();
    assert!(tier.kill(a).unwrap());
    assert!(
        matches!(tier.stream_known(a), Err(ReadError::Missing(_))),
        "no new read of it"
    );
    let p = s.read_piece((0, 50_000))(Vec::new()).unwrap();
    assert!(p.bytes() == value(3, 50_000));
}

#[test]
fn a_value_is_read_in_pieces_of_the_size_asked_each_after_the_first_on_a_block() {
    let dir = tempfile::tempdir().unwrap();
    let mut tier = tier_of_large_files(dir.path());
    let four = tier.append(&header("four"), &value(1, 4 * MIB as usize)).unwrap();
    let odd = tier.append(&header("odd"), &value(2, MIB as usize + 3)).unwrap();
    let small = tier.append(&header("small"), &value(2, 100)).unwrap();
    let empty = tier.append(&header("empty"), &[]).unwrap();
    for (id, len) in [(four, 4 * MIB), (odd, MIB + 3), (small, 100)] {
        let s = tier.stream_known(id).unwrap();
        let pieces = s.pieces(MIB);
        // the value's bytes start after its header and tag, within the record's first block
        let head = s.at() % BLOCK;
        assert!(head > 0);
        let first = (MIB - head).min(len);
        assert_eq!(pieces[0], (0, first), "{len}: the first ends on a block");
        let mut at = first;
        for &(from, n) in &pieces[1..] {
            assert_eq!(from, at, "{len}: in order, each where the one before ended");
            assert_eq!((s.at() + from) % BLOCK, 0, "{len}: on a block");
            assert!(n == MIB || from + n == len, "{len}: whole pieces but the last");
            at += n;
        }
        assert_eq!(at, len, "{len}: the pieces hold the value");
    }
    assert_eq!(tier.stream_known(four).unwrap().pieces(MIB).len(), 5);
    // pieces smaller than a block are not cut on blocks
    let s = tier.stream_known(odd).unwrap();
    assert_eq!(s.pieces(1000).len() as u64, (MIB + 3).div_ceil(1000));
    assert!(tier.stream_known(empty).unwrap().pieces(MIB).is_empty());
    let s = tier.stream_known(empty).unwrap();
    assert!(s.finish().is_ok(), "an empty value is whole with no piece");
}

/// The sizes of the pieces of a read of `end` bytes from the start of a file.
fn sizes(end: u64) -> Vec<u64> {
    tapering(0, end).into_iter().map(|(_, n)| n).collect()
}

#[test]
fn pieces_halve_towards_the_end_and_each_but_the_first_starts_on_a_block() {
    const K: u64 = 1024;
    let m = 1024 * K;
    // a 4 MiB value: five requests, the last with the bytes past the last whole block
    assert_eq!(sizes(192 + 4 * m), [2 * m, m, 512 * K, 256 * K, 256 * K + 192]);
    // larger ones go on in pieces of the largest size
    assert_eq!(
        sizes(192 + 9 * m),
        [m, 2 * m, 2 * m, 2 * m, m, 512 * K, 256 * K, 256 * K + 192]
    );
    // less than a piece left at the front goes with the piece after it
    assert_eq!(
        sizes(4 * m + 64 * K + 100),
        [2 * m + 64 * K, m, 512 * K, 256 * K, 256 * K + 100]
    );
    // small records are one piece, however long past a piece
    assert_eq!(sizes(100), [100]);
    assert_eq!(sizes(256 * K + 4 * K + 1), [256 * K + 4 * K + 1]);
    assert!(sizes(0).is_empty());
    // a value within its record: the first piece ends on a block, the rest as above
    assert_eq!(
        tapering(8192 + 192, 8192 + 192 + 4 * m),
        [
            (8192 + 192, 2 * m - 192),
            (8192 + 2 * m, m),
            (8192 + 3 * m, 512 * K),
            (8192 + 3 * m + 512 * K, 256 * K),
            (8192 + 3 * m + 768 * K, 256 * K + 192)
        ]
    );
    for from in [0, 192, 4096 + 64, 7 * m + 4000] {
        for len in (0..40 * m).step_by(4099 * 13) {
            let pieces = tapering(from, from + len);
            assert_eq!(pieces.iter().map(|p| p.1).sum::<u64>(), len, "{from}+{len}: every byte");
            let Some(first) = pieces.first() else {
                assert_eq!(len, 0);
                continue;
            };
            assert_eq!(first.0, from);
            // a record's header and tag are in its first piece
            assert!(first.1 >= len.min(PIECE - BLOCK));
            for w in pieces.windows(2) {
                assert_eq!(w[0].0 + w[0].1, w[1].0, "{from}+{len}: one after the other");
                assert!(w[1].0.is_multiple_of(BLOCK), "{from}+{len}: {pieces:?}");
                assert!(
                    w[0].1 + BLOCK > w[1].1 || w[0].0 == from,
                    "{from}+{len}: larger first {pieces:?}"
                );
            }
            assert!(
                pieces.iter().all(|p| p.1 < LARGEST_PIECE + PIECE + BLOCK),
                "{from}+{len}: {pieces:?}"
            );
        }
    }
}
