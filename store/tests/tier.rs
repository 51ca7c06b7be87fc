//! The disk tier against the real binary: a member with a small segment and a disk tier several
//! times larger holds a working set four times its memory, every byte read back exact (values
//! evicted from memory come back from disk), the leader reporting the split between the tiers;
//! a member `kill -9` and restart, then a leader `kill -9` and restart, after which what was on
//! disk is read back again; and bytes flipped in the tier's files behind the member's back are
//! detected on read (a miss, counted), never returned, by the member and by a same-host client
//! that reads the tier's files itself.

// Helpers outside #[test] fns state expectations with unwrap too (see clippy.toml).
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use kvcache_store::client::Client;
use kvcache_store::error::ErrorCode;
use kvcache_store::proto::GetMembersRequest;

const MIB: u64 = 1 << 20;
/// Each value's size: 256 KiB, as a small model's KV block.
const LEN: usize = 256 << 10;
/// The member's memory, and the working set: four times it.
const MEMORY: &str = "32Mi";
const VALUES: usize = 4 * 32 * (MIB as usize) / LEN;

fn value_of(key: &str) -> Vec<u8> {
    random_bytes(xxhash_rust::xxh3::xxh3_64(key.as_bytes()), LEN)
}

fn key(i: usize) -> String {
    format!("block/{i:05}")
}

/// Read leases of 200 ms: a read holds its value in memory only while it reads it, so reading a
/// working set four times memory in a row finds room to load each value.
const LEADER_FLAGS: [&str; 8] = [
    "--tenant",
    "t=1Gi:64:bfloat16",
    "--lease-ttl",
    "200ms",
    "--member-ttl",
    "2s",
    "--fast-listen",
    "127.0.0.1:0",
];

fn tiered_member(leader: &str, dir: &Path) -> Proc {
    tiered_member_with(leader, dir, &[])
}

fn tiered_member_with(leader: &str, dir: &Path, extra: &[&str]) -> Proc {
    let mut flags = vec![
        "--metrics-listen",
        "127.0.0.1:0",
        "--tier-dir",
        dir.to_str().unwrap(),
        "--tier-capacity",
        "512Mi",
        "--tier-file-size",
        "8Mi",
    ];
    flags.extend_from_slice(extra);
    member_with(leader, "m1", MEMORY, &flags)
}

/// Writes the working set in batches of 16 (4 MiB), each let settle until the leader knows of
/// its copies on disk (so eviction keeps what it takes from memory).
async fn write_all(c: &Client) -> Duration {
    write_first(c, VALUES).await
}

/// Writes the first `n` values of the working set (a multiple of 16) as [`write_all`] does.
async fn write_first(c: &Client, n: usize) -> Duration {
    let started = Instant::now();
    for batch in 0..n / 16 {
        for i in batch * 16..(batch + 1) * 16 {
            let k = key(i);
            c.put(&k, Bytes::from(value_of(&k))).await.unwrap();
        }
        let on_disk = ((batch + 1) * 16 * LEN) as u64;
        eventually("the batch's copies reach the disk tier", || async {
            tenant(c, "t").await.disk_used >= on_disk
        })
        .await;
    }
    started.elapsed()
}

/// Reads every value: returns (exact, misses); a wrong byte fails the test, and so does any
/// other error unless `restarting` (a get the leader answered with a member that is not back
/// yet cannot reach it: not back yet, counted as a miss).
async fn read_all(c: &Client, restarting: bool) -> (usize, usize) {
    let (mut exact, mut misses) = (0, 0);
    for i in 0..VALUES {
        let k = key(i);
        match c.get(&k).await {
            Ok(Some(got)) => {
                assert!(got[..] == value_of(&k)[..], "{k}: other bytes");
                exact += 1;
            }
            Ok(None) => misses += 1,
            Err(e) if restarting && e.code == ErrorCode::Transport => misses += 1,
            Err(e) => panic!("{k}: {e}"),
        }
    }
    (exact, misses)
}

/// A leader with `flags`, a member with its tier in `dir`, and a client of the tenant `t` once
/// the member is mounted.
async fn tiered_store(dir: &Path, flags: &[&str]) -> (Proc, Proc, Client) {
    let l = leader(flags);
    let addr = l.field("grpc");
    let m = tiered_member(&addr, dir);
    let c = client(&addr, "t").await;
    wait_members(&c, 1).await;
    (l, m, c)
}

async fn tier_used(c: &Client) -> u64 {
    let members = c
        .control()
        .get_members(GetMembersRequest {})
        .await
        .unwrap()
        .into_inner();
    members.members.iter().map(|m| m.tier_used).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_working_set_four_times_memory_survives_on_disk_a_member_restart_and_a_failover() {
    let dir = tempfile::tempdir().unwrap();
    let mut l = leader(&LEADER_FLAGS);
    let addr = l.field("grpc");
    let mut m = tiered_member(&addr, dir.path());
    let c = client(&addr, "t").await;
    wait_members(&c, 1).await;

    let wrote = write_all(&c).await;
    let t = tenant(&c, "t").await;
    assert_eq!(t.objects as usize, VALUES, "every value kept: {t:?}");
    assert!(
        t.on_disk_only as usize >= VALUES / 2,
        "most of the working set only on disk: {} of {VALUES}",
        t.on_disk_only
    );
    assert!(t.used < 40 * MIB, "memory charged for what memory holds: {}", t.used);
    assert_eq!(t.disk_used, (VALUES * LEN) as u64);
    assert!(tier_used(&c).await >= (VALUES * LEN) as u64);
    let started = Instant::now();
    let (exact, misses) = read_all(&c, false).await;
    let read = started.elapsed();
    assert_eq!(
        (exact, misses),
        (VALUES, 0),
        "every value back, byte-exact: {:?}",
        tenant(&c, "t").await
    );
    let t = tenant(&c, "t").await;
    assert!(t.loads as usize >= VALUES / 2, "read back from disk: {} loads", t.loads);
    assert_eq!(t.load_failures, 0);
    eprintln!(
        "{VALUES} values of {} KiB ({} MiB, 4x memory): written (each batch until on disk) in {wrote:.1?}, read back in {read:.1?} with {} loads from disk",
        LEN >> 10,
        (VALUES * LEN) >> 20,
        t.loads
    );

    // the member is killed and comes back: its tier is found, verified and handed over
    m.kill();
    let back = Instant::now();
    m = tiered_member(&addr, dir.path());
    let (exact, misses) = eventually_back(&c, back).await;
    eprintln!(
        "member killed and back: {exact} of {VALUES} read back exact within {:.1?}",
        back.elapsed()
    );
    assert!(exact * 100 >= VALUES * 99, "{exact} of {VALUES} ({misses} misses)");

    // the leader is killed: the next term adopts the member's memory and its tier
    l.kill();
    let back = Instant::now();
    l = leader_at(&addr, &LEADER_FLAGS);
    let c = client(&addr, "t").await;
    wait_members(&c, 1).await;
    let (exact, misses) = eventually_back(&c, back).await;
    eprintln!(
        "leader killed and back: {exact} of {VALUES} read back exact within {:.1?}",
        back.elapsed()
    );
    assert!(exact * 100 >= VALUES * 99, "{exact} of {VALUES} ({misses} misses)");
    drop((m, l));
}

/// Reads everything until at least 99% is back (a member's tier is adopted once it mounted);
/// at most 10 s from `since`.
async fn eventually_back(c: &Client, since: Instant) -> (usize, usize) {
    loop {
        let (exact, misses) = read_all(c, true).await;
        if exact * 100 >= VALUES * 99 || since.elapsed() > Duration::from_secs(10) {
            return (exact, misses);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_flipped_in_the_tier_files_are_a_miss_never_returned() {
    let dir = tempfile::tempdir().unwrap();
    let l = leader(&LEADER_FLAGS);
    let addr = l.field("grpc");
    let m = tiered_member(&addr, dir.path());
    let c = client(&addr, "t").await;
    wait_members(&c, 1).await;
    write_all(&c).await;

    let flipped = flip_bytes(dir.path());
    assert!(flipped > 16, "{flipped} bytes flipped");
    let (exact, misses) = read_all(&c, false).await;
    assert_eq!(exact + misses, VALUES);
    let damaged = gauge(&m.field("metrics"), "kvstore_member_tier_damaged_total").await;
    assert!(misses > 0 && damaged > 0, "{misses} misses, {damaged} damaged");
    // the member tells the leader in its next heartbeat
    eventually("the leader counts each damaged copy as the member does", || async {
        tenant(&c, "t").await.load_failures == damaged
    })
    .await;
    eprintln!(
        "{flipped} bytes flipped in the tier: {exact} values read back exact, {misses} misses, {damaged} load failures counted"
    );
    drop((m, l));
}

/// Flips a byte every 1 MiB of every tier file in `dir`, past its first record's header: how many.
fn flip_bytes(dir: &Path) -> usize {
    let mut flipped = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("kvt") {
            continue;
        }
        let mut bytes = std::fs::read(&path).unwrap();
        let mut at = 8192;
        while at < bytes.len() {
            bytes[at] ^= 0x5a;
            flipped += 1;
            at += MIB as usize;
        }
        std::fs::write(&path, &bytes).unwrap();
    }
    flipped
}

/// A member with `--same-host`: this client, on its host, reads the copies on disk from the
/// tier's files itself (op 8), every byte exact, and bytes flipped there are still a miss, never
/// returned (a copy the client finds wrong is read again through the member, which drops it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_same_host_reader_reads_the_tier_files_itself_and_never_a_flipped_byte() {
    let dir = tempfile::tempdir().unwrap();
    let l = leader(&LEADER_FLAGS);
    let addr = l.field("grpc");
    let m = tiered_member_with(&addr, dir.path(), &["--same-host"]);
    let metrics = m.field("metrics");
    let c = client(&addr, "t").await;
    wait_members(&c, 1).await;
    write_all(&c).await;

    assert_eq!(read_all(&c, false).await, (VALUES, 0), "(exact, misses)");
    let files = gauge(&metrics, "kvstore_member_local_tier_files_total").await;
    let by_member = gauge(&metrics, "kvstore_member_tier_loads_total").await;
    let from_disk = tenant(&c, "t").await.loads;
    // the member's memory holds a quarter of the working set: the rest came off the disk, read
    // here from the files the member handed over (each once), none by the member
    assert!(
        from_disk >= (VALUES / 2) as u64 && by_member == 0 && files > 0,
        "{from_disk} values read from disk, {by_member} of them by the member, {files} tier files handed over"
    );

    let flipped = flip_bytes(dir.path());
    assert!(flipped > 16, "{flipped} bytes flipped");
    let (exact, misses) = read_all(&c, false).await;
    assert_eq!(exact + misses, VALUES);
    let damaged = gauge(&metrics, "kvstore_member_tier_damaged_total").await;
    assert!(misses > 0 && damaged > 0, "{misses} misses, {damaged} damaged");
    eventually("the leader counts each damaged copy as the member does", || async {
        tenant(&c, "t").await.load_failures == damaged
    })
    .await;
    eprintln!(
        "same host: {from_disk} values read from {files} tier files here; after {flipped} bytes flipped, {exact} \
         exact, {misses} misses, {damaged} damaged"
    );
    drop((m, l));
}

/// A get of a value only on disk that waits for its load longer than a read lease still reads
/// it (`--tier-reads load`): the lease it is told counts from when the leader took the get up,
/// not from when it was granted, so the client's own count (from before it sent the get) does
/// not take the wait for an expired lease. The member is stopped (SIGSTOP) for longer than the
/// lease while the get waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_that_waits_longer_than_a_lease_for_its_load_still_reads() {
    let dir = tempfile::tempdir().unwrap();
    let (_l, m, c) = tiered_store(
        dir.path(),
        &[
            "--tenant",
            "t=1Gi:64:bfloat16",
            "--lease-ttl",
            "1s",
            "--member-ttl",
            "4s",
            "--tier-reads",
            "load",
            "--fast-listen",
            "127.0.0.1:0",
        ],
    )
    .await;
    // 40 MiB into 32: the first values written are only on disk
    write_first(&c, 160).await;
    assert!(tenant(&c, "t").await.on_disk_only > 0);
    let loads = tenant(&c, "t").await.loads;
    let signal = |sig: &str| {
        let pid = m.child.id().to_string();
        assert!(
            std::process::Command::new("kill")
                .args([sig, &pid])
                .status()
                .unwrap()
                .success()
        );
    };
    signal("-STOP");
    let started = Instant::now();
    let get = tokio::spawn({
        let c = c.clone();
        async move { c.get(&key(0)).await }
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    signal("-CONT");
    let got = get.await.unwrap();
    let waited = started.elapsed();
    let got = got.unwrap_or_else(|e| panic!("a get that waited {waited:?} for its load: {e}"));
    assert!(
        got.is_some_and(|v| v[..] == value_of(&key(0))[..]),
        "block 0 read back exact"
    );
    assert!(waited >= Duration::from_millis(1500));
    assert_eq!(tenant(&c, "t").await.loads, loads + 1, "the get waited for a load");
}

/// A batch of values several pieces long each, only on disk, is read whole: the member's room for
/// pieces in memory (`tiering::direct::MAX_PIECES`, on all connections together) is smaller than
/// what the batch's reads ask for together, and a read waits for room only holding none. Before,
/// each read waited for room for its next piece while holding its first ones, every piece held by
/// reads waiting likewise: a vLLM request's 54 blocks of 768 KiB read 16 and stalled until the
/// leases ran out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_values_of_several_pieces_from_disk_reads_whole() {
    /// three of the member's 256 KiB pieces
    const BIG: usize = 768 << 10;
    /// as many as a batch reads at once (`client::batch::MAX_TRANSFERS`)
    const BATCH: usize = 64;
    let dir = tempfile::tempdir().unwrap();
    // leases far longer than the batch takes: a stalled read is what fails, not a slow one
    let (l, m, c) = tiered_store(
        dir.path(),
        &[
            "--tenant",
            "t=1Gi:64:bfloat16",
            "--lease-ttl",
            "30s",
            "--fast-listen",
            "127.0.0.1:0",
        ],
    )
    .await;
    let big = |i: usize| random_bytes(i as u64, BIG);
    // 96 MiB into 32: the first 64 are only on disk once written
    let n = 2 * BATCH;
    for i in 0..n {
        c.put(&key(i), Bytes::from(big(i))).await.unwrap();
        let on_disk = ((i + 1) * BIG) as u64;
        eventually("the value's copy reaches the disk tier", || async {
            tenant(&c, "t").await.disk_used >= on_disk
        })
        .await;
    }
    let t = tenant(&c, "t").await;
    assert!(
        t.on_disk_only as usize >= BATCH,
        "{} of {n} only on disk",
        t.on_disk_only
    );

    let keys: Vec<String> = (0..BATCH).map(key).collect();
    let mut bufs = vec![vec![0u8; BIG]; BATCH];
    let mut items: Vec<(&str, &mut [u8])> = keys
        .iter()
        .zip(bufs.iter_mut())
        .map(|(k, b)| (k.as_str(), b.as_mut_slice()))
        .collect();
    let started = Instant::now();
    let got = c.batch_get_into(&mut items).await.unwrap();
    let took = started.elapsed();
    let read = got.iter().filter(|r| matches!(r, Ok(Some(len)) if *len == BIG)).count();
    let failed: Vec<_> = got.iter().filter_map(|r| r.as_ref().err()).map(|e| e.code).collect();
    assert_eq!(read, BATCH, "read whole in {took:.1?}; failed: {failed:?}");
    for (i, b) in bufs.iter().enumerate() {
        assert!(b[..] == big(i)[..], "{}: other bytes", key(i));
    }
    let loads = tenant(&c, "t").await.loads;
    assert!(loads as usize >= BATCH, "{loads} values read from disk");
    eprintln!("{BATCH} values of {} KiB from disk in one batch: {took:.1?}", BIG >> 10);
    drop((m, l));
}
