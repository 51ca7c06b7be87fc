//! The disk tier, measured against what it is for and against the disk it sits on, in one run:
//!
//! 1. Hit ratio for a working set four times memory, read back in a shuffled order, on the same
//!    member memory without a tier and with one (goal: at least 90% with, at most 30% without).
//! 2. For each way a leader reads values on disk (`--tier-reads direct`: the member streams them
//!    from disk to the reader over TCP, or, with `--same-host`, a reader on its host reads them
//!    from the tier's files itself; `load`: it loads them into memory first), the tier's write and
//!    read throughput for 4 MiB values through a 256 MiB member, each against `dd` in 4 MiB
//!    blocks beside the tier, the two taking turns (this VM's disk changes speed from one 32 MiB
//!    to the next, and slows after a burst of writes; `dd` is timed by its own clock). Writes: 16
//!    puts a turn, timed until the leader knows every copy, against `dd` writing as much with
//!    `fdatasync`. Reads, of values only on disk, 8 values a turn, timing the gets only (values
//!    are checked after each turn): one get at a time, back to back, eight to a batch, and four
//!    readers at once (the wall time of their gets), against `dd` reading with `O_DIRECT` what it
//!    wrote in the same turns as the tier wrote those values (the page cache is dropped before
//!    each part). Goal: at least 80%.
//!
//! `cargo bench -p kvcache-store --bench tier` (`TIER_DIR`: where the tiers and `dd` write; by
//! default a directory under `$TMPDIR`). Real processes on loopback, the release build.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kvcache_store::client::Client;

#[path = "../tests/common/mod.rs"]
mod common;
use common::{Proc, leader, member_with, random_bytes, tenant};

const MIB: u64 = 1 << 20;

/// A leader (reading values on disk as `reads` says: `--tier-reads`) and one member of `memory`,
/// with a tier in `tier` when given, serving its same-host socket when `same_host` (this client
/// then reads copies on disk from the tier's files itself): (leader, member, a client of the
/// tenant `t` once the member is mounted).
async fn store(memory: &str, tier: Option<&Path>, reads: &str, same_host: bool) -> (Proc, Proc, Client) {
    let l = leader(&[
        "--fast-listen",
        "127.0.0.1:0",
        "--tenant",
        "t=64Gi:64:bfloat16",
        // a read holds its value in memory only while it reads it
        "--lease-ttl",
        "200ms",
        "--tier-reads",
        reads,
    ]);
    let addr = l.field("grpc");
    let dir = tier.map(|d| d.display().to_string());
    let mut extra = Vec::new();
    if let Some(d) = &dir {
        extra.extend(["--tier-dir", d, "--tier-capacity", "8Gi", "--tier-file-size", "64Mi"]);
    }
    if same_host {
        extra.push("--same-host");
    }
    let m = member_with(&addr, "m", memory, &extra);
    let c = common::client(&addr, "t").await;
    common::wait_members(&c, 1).await;
    (l, m, c)
}

fn value(i: usize, len: usize) -> Bytes {
    Bytes::from(random_bytes(i as u64, len))
}

/// Waits until the leader knows of `bytes` of copies on disk.
async fn on_disk(c: &Client, bytes: u64) {
    let deadline = Instant::now() + Duration::from_secs(600);
    while tenant(c, "t").await.disk_used < bytes {
        assert!(Instant::now() < deadline, "the tier never caught up");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Part 1: the share of a shuffled read of the working set that hits.
async fn hit_ratio(dir: Option<&Path>) -> (f64, usize) {
    const LEN: usize = 256 << 10;
    let values = 4 * 64 * MIB as usize / LEN;
    let (_l, _m, c) = store("64Mi", dir, "direct", false).await;
    for batch in 0..values / 16 {
        for i in batch * 16..(batch + 1) * 16 {
            c.put(&format!("k{i}"), value(i, LEN)).await.unwrap();
        }
        if dir.is_some() {
            // the writer does not outrun the disk: each batch on disk before the next
            on_disk(&c, ((batch + 1) * 16 * LEN) as u64).await;
        }
    }
    let mut order: Vec<usize> = (0..values).collect();
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    for i in (1..order.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        order.swap(i, (x % (i as u64 + 1)) as usize);
    }
    let mut hits = 0;
    for i in order {
        if let Some(got) = c.get(&format!("k{i}")).await.unwrap() {
            assert!(got == value(i, LEN), "k{i}: other bytes");
            hits += 1;
        }
    }
    (hits as f64 / values as f64, values)
}

fn drop_caches() {
    let _ = Command::new("sync").status();
    if std::fs::write("/proc/sys/vm/drop_caches", "1").is_err() {
        eprintln!("(cannot drop the page cache: reads below may come from memory)");
    }
}

/// `dd`'s sequential write of `bytes` to `file` from `at` in 4 MiB blocks (`fdatasync` at the
/// end): its seconds.
fn dd_write(file: &Path, bytes: u64, at: u64) -> f64 {
    dd(&[
        "if=/dev/zero".into(),
        format!("of={}", file.display()),
        "bs=4M".into(),
        format!("seek={}", at / (4 * MIB)),
        format!("count={}", bytes / (4 * MIB)),
        "conv=notrunc,fdatasync".into(),
    ])
}

/// `dd`'s sequential `O_DIRECT` read of `bytes` of `file` from `at` in 4 MiB blocks: its seconds.
fn dd_read(file: &Path, bytes: u64, at: u64) -> f64 {
    dd(&[
        format!("if={}", file.display()),
        "of=/dev/null".into(),
        "bs=4M".into(),
        format!("skip={}", at / (4 * MIB)),
        format!("count={}", bytes / (4 * MIB)),
        "iflag=direct".into(),
    ])
}

/// Runs `dd` and returns the seconds it took by its own clock (`… copied, 0.0126 s, …`): the time
/// it spent copying, not its process's start, which would cost it 3 ms a turn.
fn dd(args: &[String]) -> f64 {
    let out = Command::new("dd")
        .args(args)
        .env("LC_ALL", "C")
        .output()
        .expect("dd runs");
    let report = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{report}");
    report
        .lines()
        .last()
        .and_then(|l| l.split(", ").find(|f| f.ends_with(" s")))
        .and_then(|f| f.trim_end_matches(" s").parse().ok())
        .unwrap_or_else(|| panic!("dd reported no time: {report}"))
}

const LEN: usize = 4 << 20;

/// A read figure of the tier's and `dd`'s, MB/s, measured taking turns (`beside_dd`).
struct Measured {
    tier: f64,
    dd: f64,
    /// each turn's ratio of the tier's throughput to `dd`'s, in turn order (reads only)
    turns: Vec<f64>,
}

impl Measured {
    /// The turns' ratios, lowest, median and highest, in percent (empty for writes).
    fn spread(&self) -> String {
        let mut t = self.turns.clone();
        t.sort_by(f64::total_cmp);
        match (t.first(), t.get(t.len() / 2), t.last()) {
            (Some(lo), Some(mid), Some(hi)) => format!("{:.0}% / {:.0}% / {:.0}%", lo * 100.0, mid * 100.0, hi * 100.0),
            _ => "-".into(),
        }
    }
}

/// Values each write turn puts: 64 MiB.
const WRITE_TURN: usize = 16;

/// Values each read turn gets: 32 MiB, about 15 ms of this disk.
const READ_TURN: usize = 8;

/// Reads `values` with `read` (given a range of them, it returns the seconds it counts) in turns
/// with `dd` reading as many bytes of `dd_file` (`O_DIRECT`, 4 MiB blocks, one `dd` per turn,
/// timed by its own clock), at the offset where `dd` wrote them while the tier wrote these values:
/// data of the same age and place in the run. This VM's disk changes speed from one 32 MiB to the
/// next (1.8 to 2.9 GB/s), and short turns let both see the same disk.
async fn beside_dd<F, R>(dd_file: &Path, values: std::ops::Range<usize>, read: R) -> Measured
where
    R: Fn(std::ops::Range<usize>) -> F,
    F: std::future::Future<Output = f64>,
{
    drop_caches();
    let (mut tier, mut dd) = (0.0, 0.0);
    let (mut bytes, mut turns) = (0, Vec::new());
    for from in values.clone().step_by(READ_TURN) {
        let to = (from + READ_TURN).min(values.end);
        let n = ((to - from) * LEN) as u64;
        let dd_turn = dd_read(dd_file, n, (from * LEN) as u64);
        let tier_turn = read(from..to).await;
        turns.push(dd_turn / tier_turn);
        (dd, tier, bytes) = (dd + dd_turn, tier + tier_turn, bytes + n);
    }
    Measured {
        tier: bytes as f64 / tier / 1e6,
        dd: bytes as f64 / dd / 1e6,
        turns,
    }
}

/// Part 2, for one `--tier-reads`: the tier's writes of 4 MiB values, and its reads: one get at a
/// time, eight to a batch, and four readers at once, each of 128 values only on disk, all in
/// turns with `dd`.
async fn throughput(dir: &Path, bytes: u64, reads: &str, same_host: bool) -> (Measured, [Measured; 3]) {
    let values = (bytes / LEN as u64) as usize;
    // 64 values of memory: with `load`, reads lease what they read for 200 ms, and loading the
    // next value needs an unleased one to make room
    let (_l, _m, c) = store("256Mi", Some(dir), reads, same_host).await;
    let payloads: Vec<Bytes> = (0..values).map(|i| value(i, LEN)).collect();
    // in turns with dd writing as much to a file of its own, which its reads read later; each
    // turn's values are all on disk before the next (a quarter of memory: what memory evicts has
    // its copy)
    let dd_file = dir.with_extension("dd");
    let (mut tier, mut dd) = (0.0, 0.0);
    for (turn, from) in (0..values).step_by(WRITE_TURN).enumerate() {
        let n = (WRITE_TURN * LEN) as u64;
        dd += dd_write(&dd_file, n, turn as u64 * n);
        let started = Instant::now();
        for (i, v) in payloads.iter().enumerate().skip(from).take(WRITE_TURN) {
            c.put(&format!("v{i}"), v.clone()).await.unwrap();
        }
        on_disk(&c, ((from + WRITE_TURN) * LEN) as u64).await;
        tier += started.elapsed().as_secs_f64();
    }
    let write = Measured {
        tier: bytes as f64 / tier / 1e6,
        dd: bytes as f64 / dd / 1e6,
        turns: Vec::new(),
    };
    // the first values are only on disk (memory holds the last 64 at most); with `load`, memory
    // holds the last 64 read after each part, so each part reads values none before it read
    let part = 128;
    assert!(3 * part + 64 <= values, "room for three parts");
    let payloads = std::sync::Arc::new(payloads);
    let one = beside_dd(&dd_file, 0..part, |r| one_at_a_time(&c, &payloads, r)).await;
    let batched = beside_dd(&dd_file, part..2 * part, |r| eight_to_a_batch(&c, &payloads, r)).await;
    let readers = beside_dd(&dd_file, 2 * part..3 * part, |r| four_readers(&c, &payloads, r)).await;
    let _ = std::fs::remove_file(dd_file);
    (write, [one, batched, readers])
}

/// Gets of `range` one at a time, back to back, each into a buffer of its own made (and written)
/// beforehand: the seconds of the gets. Each value is checked once all are read: a check between
/// two gets (hashing 4 MiB here takes milliseconds) leaves the device and this VM's CPUs idle, and
/// the next read then starts slower (about 10% measured), which `dd`, reading back to back, never
/// meets.
async fn one_at_a_time(c: &Client, payloads: &[Bytes], range: std::ops::Range<usize>) -> f64 {
    let mut bufs: Vec<(usize, Vec<u8>)> = range.clone().map(|i| (i, vec![1u8; LEN])).collect();
    let started = Instant::now();
    for (i, buf) in &mut bufs {
        let found = c.get_into(&format!("v{i}"), buf).await.unwrap();
        assert!(found, "v{i} missed: {:?}", tenant(c, "t").await);
    }
    let reading = started.elapsed().as_secs_f64();
    for (i, buf) in bufs {
        assert!(buf[..] == payloads[i][..], "v{i}: other bytes");
    }
    reading
}

/// Batch gets of eight values of `range` each: the seconds in the batch gets only.
async fn eight_to_a_batch(c: &Client, payloads: &[Bytes], range: std::ops::Range<usize>) -> f64 {
    let mut reading = Duration::ZERO;
    let mut bufs = vec![vec![1u8; LEN]; 8];
    for chunk in range.collect::<Vec<_>>().chunks(8) {
        let keys: Vec<String> = chunk.iter().map(|i| format!("v{i}")).collect();
        let mut items: Vec<(&str, &mut [u8])> = keys
            .iter()
            .zip(bufs.iter_mut())
            .map(|(k, b)| (k.as_str(), &mut b[..]))
            .collect();
        let started = Instant::now();
        let got = c.batch_get_into(&mut items).await.unwrap();
        reading += started.elapsed();
        for ((i, r), b) in chunk.iter().zip(got).zip(&bufs) {
            assert!(matches!(r, Ok(Some(LEN))), "v{i}: {r:?}");
            assert!(b[..] == payloads[*i][..], "v{i}: other bytes");
        }
    }
    reading.as_secs_f64()
}

/// Four readers at once over `range`, each one get at a time into buffers of its own, made (and
/// written, so no page of them faults in a get) beforehand: the wall time of the gets (each value is checked once all are read).
async fn four_readers(c: &Client, payloads: &std::sync::Arc<Vec<Bytes>>, range: std::ops::Range<usize>) -> f64 {
    const READERS: usize = 4;
    let bufs: Vec<Vec<(usize, Vec<u8>)>> = (0..READERS)
        .map(|r| {
            range
                .clone()
                .skip(r)
                .step_by(READERS)
                .map(|i| (i, vec![1u8; LEN]))
                .collect()
        })
        .collect();
    let started = Instant::now();
    let readers: Vec<_> = bufs
        .into_iter()
        .map(|mut mine| {
            let c = c.clone();
            tokio::spawn(async move {
                for (i, buf) in &mut mine {
                    assert!(c.get_into(&format!("v{i}"), buf).await.unwrap(), "v{i} missed");
                }
                mine
            })
        })
        .collect();
    let mut read = Vec::new();
    for r in readers {
        read.extend(r.await.unwrap());
    }
    let reading = started.elapsed().as_secs_f64();
    assert_eq!(read.len(), range.len());
    for (i, buf) in read {
        assert!(buf[..] == payloads[i][..], "v{i}: other bytes");
    }
    reading
}

fn main() {
    let base = std::env::var_os("TIER_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let dir = tempfile::tempdir_in(&base).expect("a directory for the tiers");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let (without, n) = hit_ratio(None).await;
        let hit_dir = dir.path().join("hits");
        std::fs::create_dir(&hit_dir).unwrap();
        let (with, _) = hit_ratio(Some(&hit_dir)).await;
        println!(
            "hit ratio, {n} values of 256 KiB (4x a 64 MiB member), shuffled reads: without a tier {:.1}%, with one {:.1}%",
            without * 100.0,
            with * 100.0
        );
        let bytes = 2 << 30;
        println!(
            "4 MiB values, 2 GiB written and 512 MiB read each way, taking turns with dd (64 MiB a write turn, 32 MiB a read turn), in {}:",
            dir.path().display()
        );
        println!("| --tier-reads | | tier | dd (4 MiB blocks) | ratio | turns: lowest / median / highest |");
        println!("|---|---|---|---|---|---|");
        for (reads, same_host) in [("direct", false), ("direct", true), ("load", false)] {
            let tier_dir = dir.path().join(format!("{reads}-{same_host}"));
            std::fs::create_dir(&tier_dir).unwrap();
            let (write, [one, batched, readers]) = throughput(&tier_dir, bytes, reads, same_host).await;
            let reads = if same_host { "direct, same host" } else { reads };
            println!(
                "| {reads} | write | {:.0} MB/s | {:.0} MB/s (fdatasync, taking turns) | {:.0}% | - |",
                write.tier,
                write.dd,
                write.tier / write.dd * 100.0
            );
            for (what, m) in [
                ("read, one get at a time", one),
                ("read, 8 to a batch", batched),
                ("read, 4 readers one get at a time each", readers),
            ] {
                println!(
                    "| {reads} | {what} | {:.0} MB/s | {:.0} MB/s (O_DIRECT, taking turns) | {:.0}% | {} |",
                    m.tier,
                    m.dd,
                    m.tier / m.dd * 100.0,
                    m.spread()
                );
            }
            let _ = std::fs::remove_dir_all(&tier_dir);
        }
    });
}
