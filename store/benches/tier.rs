//! The disk tier, measured against what it is for and against the disk it sits on, in one run:
//!
//! 1. Hit ratio for a working set four times memory, read back in a shuffled order, on the same
//!    member memory without a tier and with one (goal: at least 90% with, at most 30% without).
//! 2. The tier's write and read throughput for 4 MiB values through a 256 MiB member (writes:
//!    from the first put until the leader knows every copy; reads: gets of values only on disk,
//!    each loaded back into memory and then read by the client into buffers it reuses: one at
//!    a time and eight to a batch, timing the gets only, and by four readers at once, timing
//!    the whole), against the
//!    disk's own sequential limit measured with `dd` in the same directory (4 MiB blocks; written
//!    with `fdatasync`, read with `O_DIRECT`; the page cache is dropped before each read). Goal:
//!    at least 80%.
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

/// A leader and one member of `memory`, with a tier in `tier` when given: (leader, member, a
/// client of the tenant `t` once the member is mounted).
async fn store(memory: &str, tier: Option<&Path>) -> (Proc, Proc, Client) {
    let l = leader(&[
        "--fast-listen",
        "127.0.0.1:0",
        "--tenant",
        "t=64Gi:64:bfloat16",
        // a read holds its value in memory only while it reads it
        "--lease-ttl",
        "200ms",
    ]);
    let addr = l.field("grpc");
    let dir = tier.map(|d| d.display().to_string());
    let mut extra = Vec::new();
    if let Some(d) = &dir {
        extra.extend(["--tier-dir", d, "--tier-capacity", "8Gi", "--tier-file-size", "64Mi"]);
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
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Part 1: the share of a shuffled read of the working set that hits.
async fn hit_ratio(dir: Option<&Path>) -> (f64, usize) {
    const LEN: usize = 256 << 10;
    let values = 4 * 64 * MIB as usize / LEN;
    let (_l, _m, c) = store("64Mi", dir).await;
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

/// `dd`'s sequential write (`fdatasync`) and `O_DIRECT` read of `bytes` in 4 MiB blocks, MB/s.
fn dd(dir: &Path, bytes: u64) -> (f64, f64) {
    let file = dir.join("dd.bin");
    let count = (bytes / (4 * MIB)).to_string();
    let run = |args: &[String]| {
        let started = Instant::now();
        let out = Command::new("dd").args(args).output().expect("dd runs");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        bytes as f64 / started.elapsed().as_secs_f64() / 1e6
    };
    let write = run(&[
        "if=/dev/zero".into(),
        format!("of={}", file.display()),
        "bs=4M".into(),
        format!("count={count}"),
        "conv=fdatasync".into(),
    ]);
    drop_caches();
    let read = run(&[
        format!("if={}", file.display()),
        "of=/dev/null".into(),
        "bs=4M".into(),
        "iflag=direct".into(),
    ]);
    let _ = std::fs::remove_file(file);
    (write, read)
}

/// Part 2: the tier's write and read throughput for 4 MiB values, MB/s: written, read one get
/// at a time, eight to a batch (a batch's loads go to the member together), and by four readers
/// at once.
async fn throughput(dir: &Path, bytes: u64) -> (f64, f64, f64, f64) {
    const LEN: usize = 4 << 20;
    let values = (bytes / LEN as u64) as usize;
    // 64 values of memory: reads lease what they read for 200 ms, and loading the next value
    // needs an unleased one to make room
    let (_l, _m, c) = store("256Mi", Some(dir)).await;
    let payloads: Vec<Bytes> = (0..values).map(|i| value(i, LEN)).collect();
    let started = Instant::now();
    for (i, v) in payloads.iter().enumerate() {
        c.put(&format!("v{i}"), v.clone()).await.unwrap();
        // at most half of memory ahead of the disk: what memory evicts has its copy
        let ahead = 32 * LEN as u64;
        let written = ((i + 1) * LEN) as u64;
        if written > ahead {
            on_disk(&c, written - ahead).await;
        }
    }
    on_disk(&c, bytes).await;
    let write = bytes as f64 / started.elapsed().as_secs_f64() / 1e6;
    drop_caches();
    // the first values are only on disk now (memory holds the last 64 at most)
    let on_disk_only = values - 64;
    // the time in gets only: each value is checked outside it, from a buffer the reader reuses
    let mut reading = Duration::ZERO;
    let mut buf = Vec::with_capacity(LEN);
    for (i, v) in payloads.iter().enumerate().take(on_disk_only) {
        let started = Instant::now();
        let found = c.get_into(&format!("v{i}"), &mut buf).await.unwrap();
        reading += started.elapsed();
        assert!(found, "v{i} missed: {:?}", tenant(&c, "t").await);
        assert!(buf[..] == v[..], "v{i}: other bytes");
    }
    let read = (on_disk_only * LEN) as f64 / reading.as_secs_f64() / 1e6;
    // memory now holds the last 64 read: the ones before are only on disk again
    drop_caches();
    let batched = on_disk_only - 64;
    let mut reading = Duration::ZERO;
    let mut bufs = vec![vec![0u8; LEN]; 8];
    for chunk in (0..batched).collect::<Vec<_>>().chunks(8) {
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
    let read_batched = (batched * LEN) as f64 / reading.as_secs_f64() / 1e6;
    // memory holds the last 64 of those: the ones before are only on disk again, read by four
    // readers at once, each one get at a time (the wall time, checks included)
    drop_caches();
    const READERS: usize = 4;
    let spread = batched - 64;
    let payloads = std::sync::Arc::new(payloads);
    let started = Instant::now();
    let readers: Vec<_> = (0..READERS)
        .map(|r| {
            let (c, payloads) = (c.clone(), payloads.clone());
            tokio::spawn(async move {
                let mut buf = Vec::with_capacity(LEN);
                for i in (r..spread).step_by(READERS) {
                    assert!(c.get_into(&format!("v{i}"), &mut buf).await.unwrap(), "v{i} missed");
                    assert!(buf[..] == payloads[i][..], "v{i}: other bytes");
                }
            })
        })
        .collect();
    for r in readers {
        r.await.unwrap();
    }
    let read_concurrent = (spread * LEN) as f64 / started.elapsed().as_secs_f64() / 1e6;
    (write, read, read_batched, read_concurrent)
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
        let bytes = 1 << 30;
        let (dd_write, dd_read) = dd(dir.path(), bytes);
        let tier_dir = dir.path().join("throughput");
        std::fs::create_dir(&tier_dir).unwrap();
        let (write, read, read_batched, read_concurrent) = throughput(&tier_dir, bytes).await;
        println!("4 MiB values, 1 GiB, in {}:", dir.path().display());
        println!("| | tier | dd (sequential, 4 MiB blocks) | ratio |");
        println!("|---|---|---|---|");
        println!(
            "| write | {write:.0} MB/s | {dd_write:.0} MB/s (fdatasync) | {:.0}% |",
            write / dd_write * 100.0
        );
        println!(
            "| read, one get at a time | {read:.0} MB/s | {dd_read:.0} MB/s (O_DIRECT) | {:.0}% |",
            read / dd_read * 100.0
        );
        println!(
            "| read, 8 to a batch | {read_batched:.0} MB/s | {dd_read:.0} MB/s (O_DIRECT) | {:.0}% |",
            read_batched / dd_read * 100.0
        );
        println!(
            "| read, 4 readers one get at a time each | {read_concurrent:.0} MB/s | {dd_read:.0} MB/s (O_DIRECT) | {:.0}% |",
            read_concurrent / dd_read * 100.0
        );
    });
}
