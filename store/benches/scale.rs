//! The store at scale (issue 43), first part: a leader filled with N small objects through a real
//! member and client (73-byte keys as the vLLM connector makes them; 16-byte values), then, at
//! that size, the leader's and the member's resident memory per object and put, get and `exists` latency (p50,
//! p99, one call at a time). Each size in `SIZES` (default `1000000`) gets a store of its own,
//! so the figures at two sizes come from one run; e.g. `SIZES=1000000,20000000`. Every store is
//! kept until all are filled, and their latencies are then taken in turns ([`ROUNDS`] rounds, each
//! store a share of the samples in each), so that a moment when the machine is slower weighs on
//! every size alike; each size's p99 is printed against the first size's.
//!
//! Then the serving leader is killed (`kill -9`) with every value sealed at the member, and a
//! new leader started on its address: the time until it serves, until it adopted 95% of the
//! objects and until it adopted all it will, and a sample read back (exact, missing or wrong).
//! The new leader is started at once, as a standby that already holds the Lease would take over:
//! a real takeover adds the Lease's expiry.
//!
//! `cargo bench -p kvcache-store --bench scale`. Real processes on loopback, the release build.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use kvcache_store::client::Client;

#[path = "../tests/common/mod.rs"]
mod common;
use common::{Proc, member_with};

/// Items per batch put while filling, and batches in flight.
const BATCH: usize = 1_000;
const IN_FLIGHT: usize = 4;
/// Calls timed per operation at a size.
const SAMPLES: usize = 2_000;
/// Turns the stores take at being timed, [`SAMPLES`]` / ROUNDS` calls of each operation a turn.
const ROUNDS: usize = 10;

/// Object `i`'s key, as the vLLM connector makes it for Qwen2.5-7B: its namespace, then 32
/// hex digits of the block's hash (73 bytes).
fn key(i: u64) -> String {
    format!(
        "vllm/Qwen2.5-7B/0123456789abcdef/tp0of1/{:032x}",
        u128::from(i).wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835)
    )
}

/// Object `i`'s value: 16 bytes of its own.
fn value(i: u64) -> bytes::Bytes {
    bytes::Bytes::from(format!("{i:016x}"))
}

/// The leader's resident set, in bytes.
fn rss(p: &Proc) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", p.child.id())).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kib * 1024
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize].as_secs_f64() * 1e3
}

/// Fills `c` with objects `0..n`; returns the longest a batch put took.
async fn fill(c: &Client, n: u64) -> Duration {
    let batches: Vec<u64> = (0..n.div_ceil(BATCH as u64)).collect();
    let mut longest = Duration::ZERO;
    for group in batches.chunks(IN_FLIGHT) {
        let puts = group.iter().map(|b| async move {
            let began = Instant::now();
            let range = b * BATCH as u64..((b + 1) * BATCH as u64).min(n);
            let keys: Vec<String> = range.clone().map(key).collect();
            let values: Vec<bytes::Bytes> = range.map(value).collect();
            let items: Vec<(&str, &[u8])> = keys
                .iter()
                .map(|k| k.as_str())
                .zip(values.iter().map(|v| &v[..]))
                .collect();
            for r in c.batch_put(&items).await.expect("a batch put") {
                r.expect("a put");
            }
            began.elapsed()
        });
        for took in futures::future::join_all(puts).await {
            longest = longest.max(took);
        }
    }
    longest
}

/// Put, get and `exists` latencies of one store.
#[derive(Debug, Default)]
struct Latencies {
    put: Vec<Duration>,
    get: Vec<Duration>,
    exists: Vec<Duration>,
}

impl Latencies {
    /// p50 and p99 of each, in ms.
    fn percentiles(&mut self) -> [(f64, f64); 3] {
        [&mut self.put, &mut self.get, &mut self.exists].map(|took| {
            took.sort_unstable();
            (pct(took, 0.5), pct(took, 0.99))
        })
    }
}

/// A store filled with `n` objects, kept until its failover is measured.
struct Filled {
    n: u64,
    leader: Proc,
    member: Proc,
    client: Client,
    addr: String,
    quota: String,
    /// the objects read back (and checked with `exists`)
    picks: Vec<u64>,
    timed: Latencies,
}

/// The leader's flags for a store whose tenant has `quota` (`NAME=CEILING:…`).
fn leader_flags(quota: &str) -> [&str; 4] {
    ["--tenant", quota, "--metrics-listen", "127.0.0.1:0"]
}

/// Starts a store for `n` objects, fills it, and prints how long that took and the memory it
/// holds.
async fn fill_store(n: u64) -> Filled {
    // quota and memory to spare: the leader's own index is what is measured
    let quota = format!("t={}Gi:64:bfloat16", n * 640 / (1 << 30) + 2);
    let leader = common::leader(&leader_flags(&quota));
    let addr = leader.field("grpc");
    // a grant counts the leader's memory for each object too (`objects::charge`: 512 bytes for
    // these), and no grant is larger than the members' capacity: room for all of them, so nothing
    // is evicted (the segment's pages are touched only where values are written)
    let memory = format!("{}Mi", n * 640 / (1 << 20) + 512);
    let member = member_with(&addr, "m", &memory, &["--metrics-listen", "127.0.0.1:0"]);
    let client = common::client(&addr, "t").await;
    common::wait_members(&client, 1).await;
    let (before, member_before) = (rss(&leader), rss(&member));
    let started = Instant::now();
    let longest = fill(&client, n).await;
    let filled = started.elapsed();
    let (after, member_after) = (rss(&leader), rss(&member));
    let index = common::gauge(&leader.field("metrics"), "kvstore_leader_index_bytes").await;
    println!(
        "{n:>10} objects (filled in {filled:.1?}, {:.0}/s, longest batch {longest:.2?}): leader RSS {:.0} MiB, {:.0} bytes/object (index {:.0} by its own count); member {:.0} bytes/object",
        n as f64 / filled.as_secs_f64(),
        after as f64 / (1 << 20) as f64,
        (after.saturating_sub(before)) as f64 / n as f64,
        index as f64 / n as f64,
        (member_after.saturating_sub(member_before)) as f64 / n as f64,
    );
    Filled {
        n,
        leader,
        member,
        client,
        addr,
        quota,
        picks: picks(n),
        timed: Latencies::default(),
    }
}

/// `SAMPLES` objects of `0..n`, spread by a xorshift.
fn picks(n: u64) -> Vec<u64> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    (0..SAMPLES).map(|_| next()).collect()
}

/// Times `round`'s share of the puts (new objects after `n`), gets and `exists` (of `picks`),
/// one call at a time.
async fn time_round(s: &mut Filled, round: usize) {
    let (c, n) = (&s.client, s.n);
    let share = round * SAMPLES / ROUNDS..(round + 1) * SAMPLES / ROUNDS;
    for i in share.clone() {
        let k = n + i as u64;
        let t = Instant::now();
        c.put(&key(k), value(k)).await.unwrap();
        s.timed.put.push(t.elapsed());
    }
    for i in share.clone() {
        let k = key(s.picks[i]);
        let t = Instant::now();
        assert!(c.get(&k).await.unwrap().is_some(), "{k} is held");
        s.timed.get.push(t.elapsed());
    }
    for i in share {
        let k = key(s.picks[i]);
        let t = Instant::now();
        assert!(c.exists(&k).await.unwrap(), "{k} exists");
        s.timed.exists.push(t.elapsed());
    }
}

/// Prints each store's latencies, and each p99 against the first store's.
fn print_latencies(stores: &mut [Filled]) {
    let mut first: Option<(u64, [(f64, f64); 3])> = None;
    for s in stores.iter_mut() {
        let [put, get, exists] = s.timed.percentiles();
        println!(
            "{:>10} objects: put p50 {:.3} ms p99 {:.3} ms; get p50 {:.3} ms p99 {:.3} ms; exists p50 {:.3} ms p99 {:.3} ms",
            s.n, put.0, put.1, get.0, get.1, exists.0, exists.1
        );
        match first {
            None => first = Some((s.n, [put, get, exists])),
            Some((n0, [p0, g0, e0])) => println!(
                "{:>10} objects: p99 against {n0} objects: put {:.2}x, get {:.2}x, exists {:.2}x",
                s.n,
                put.1 / p0.1,
                get.1 / g0.1,
                exists.1 / e0.1
            ),
        }
    }
}

/// Kills `s`'s leader once its member holds every value sealed, starts a new one on its address
/// at once, times its adoption of every object, reads the picks back, and prints what it found.
async fn failover(mut s: Filled) {
    common::wait_sealed(&s.client, &[&s.member]).await;
    s.leader.kill();
    let (addr, flags, picks) = (s.addr.as_str(), leader_flags(&s.quota), &s.picks);
    let held = s.n + SAMPLES as u64;
    let killed = Instant::now();
    let _l = common::leader_at(addr, &flags);
    let took = adoption(addr, held, killed).await;
    let c = common::client(addr, "t").await;
    let (exact, missing, wrong) = read_back(&c, picks).await;
    let secs = |d: Option<Duration>| d.map_or("never".into(), |d| format!("{:.2} s", d.as_secs_f64()));
    println!(
        "{:>10} objects, leader killed: serving after {:.2} s, first adopted after {}, 95% after {}, {} of {held} after {:.2} s; \
         {SAMPLES} read back: {exact} exact, {missing} missing, {wrong} wrong",
        "",
        took.serving.as_secs_f64(),
        secs(took.first),
        secs(took.most),
        took.adopted,
        took.last.as_secs_f64(),
    );
}

/// What a new term's adoption took, from the old leader's kill.
struct Adoption {
    serving: Duration,
    /// until the first object was adopted
    first: Option<Duration>,
    /// until 95% of the objects were adopted
    most: Option<Duration>,
    adopted: u64,
    /// until the last adoption seen
    last: Duration,
}

/// How long the bench waits for a new leader's first adoption.
const FIRST_PAGE_PATIENCE: Duration = Duration::from_secs(120);

/// Polls the new leader's health every 10 ms until it adopted `held` objects, or adopted none
/// for [`FIRST_PAGE_PATIENCE`], or no more for 10 s.
async fn adoption(addr: &str, held: u64, killed: Instant) -> Adoption {
    let mut control = loop {
        if let Ok(c) = kvcache_store::proto::control_client::ControlClient::connect(format!("http://{addr}")).await {
            break c;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let mut took = Adoption {
        serving: Duration::ZERO,
        first: None,
        most: None,
        adopted: 0,
        last: Duration::ZERO,
    };
    let mut changed = Instant::now();
    loop {
        if let Ok(h) = control.health(kvcache_store::proto::HealthRequest {}).await {
            let h = h.into_inner();
            if h.serving && took.serving.is_zero() {
                took.serving = killed.elapsed();
            }
            if h.adopted_objects > 0 && took.first.is_none() {
                took.first = Some(killed.elapsed());
            }
            if h.adopted_objects > took.adopted {
                took.adopted = h.adopted_objects;
                took.last = killed.elapsed();
                changed = Instant::now();
            }
            if took.most.is_none() && took.adopted * 100 >= held * 95 {
                took.most = Some(killed.elapsed());
            }
        }
        // the member prepares its report before the first page (seconds at tens of millions)
        let patience = if took.adopted == 0 {
            FIRST_PAGE_PATIENCE
        } else {
            Duration::from_secs(10)
        };
        if took.adopted >= held || changed.elapsed() > patience {
            return took;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Reads objects `picks` back: how many came back exact, missing (or refused), or with other
/// bytes.
async fn read_back(c: &Client, picks: &[u64]) -> (u64, u64, u64) {
    let (mut exact, mut missing, mut wrong) = (0, 0, 0);
    for &i in picks {
        match c.get(&key(i)).await {
            Ok(Some(v)) if v == value(i) => exact += 1,
            Ok(Some(_)) => wrong += 1,
            Ok(None) => missing += 1,
            Err(e) => {
                eprintln!("reading {} back: {e}", key(i));
                missing += 1;
            }
        }
    }
    (exact, missing, wrong)
}

fn main() {
    let sizes: Vec<u64> = std::env::var("SIZES")
        .unwrap_or_else(|_| "1000000".into())
        .split(',')
        .map(|s| s.trim().parse().expect("SIZES: numbers"))
        .collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut stores = Vec::new();
        for n in sizes {
            stores.push(fill_store(n).await);
        }
        for round in 0..ROUNDS {
            for s in &mut stores {
                time_round(s, round).await;
            }
        }
        print_latencies(&mut stores);
        for s in stores {
            failover(s).await;
        }
    });
}
