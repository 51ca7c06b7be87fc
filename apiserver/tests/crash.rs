//! Crash safety of the embedded storage under a real `SIGKILL`.
//!
//! One data directory lives through many crashes. Each iteration starts
//! `kvcache-storage-writer` on it, waits for its first acknowledgements, lets it run a random
//! further moment, kills it with `SIGKILL` and collects every `ACK <key> <revision>` line it
//! printed. The storage is then reopened in this process and must hold:
//! - every acknowledged create, at exactly its acknowledged revision, with its value;
//! - every key under `/crash/` from every iteration so far, readable, listed and with its value;
//! - per writer, a gap-free run of keys: all acknowledged ones plus at most the one in flight;
//! - revisions that only ever increase, across crashes too.
//!
//! The random delays come from a seed printed at the start; `CRASH_SEED=<seed>` replays them.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail, ensure};
use kvcache_apiserver::storage::embedded::{Embedded, Options};
use kvcache_apiserver::storage::{KeyValue, ListRequest, Storage};

const ITERATIONS: usize = 24;
const WRITERS: usize = 16;
const VALUE_BYTES: usize = 1024;
/// Acknowledgements to see before the random delay that precedes the kill starts.
const ACKS_BEFORE_KILL: usize = 8;
/// Small, so that the writer compacts its log many times per run.
const COMPACT_MIN_BYTES: u64 = 256 << 10;
const MAX_KILL_DELAY_MS: u64 = 150;
/// A bound on waiting for the first acknowledgements, so a broken writer fails the test.
const READY_TIMEOUT: Duration = Duration::from_secs(20);
const LIST_PAGE: usize = 500;
const ROOT: &str = "/crash/";

#[test]
fn acknowledged_writes_survive_sigkill() -> anyhow::Result<()> {
    let seed = seed();
    println!("crash test seed {seed} (replay with CRASH_SEED={seed})");
    let mut rng = XorShift::new(seed);
    let dir = tempfile::tempdir()?;
    let mut history = History::default();
    let started = Instant::now();
    let mut scratch = 0;
    for iteration in 0..ITERATIONS {
        let delay = Duration::from_millis(rng.next() % (MAX_KILL_DELAY_MS + 1));
        let tag = format!("it{iteration}");
        let run = run_and_kill(dir.path(), &tag, delay)
            .with_context(|| format!("iteration {iteration} (seed {seed}): running the writer"))?;
        let report = check_after_crash(dir.path(), &tag, &run, &mut history)
            .with_context(|| format!("iteration {iteration} (seed {seed}, kill delay {delay:?})"))?;
        scratch = scratch.max(report.scratch);
        println!(
            "iteration {iteration:2}: killed after {delay:>5?}: {} acknowledged, {} recovered \
             without acknowledgement, {} keys in total, revision {}{}",
            run.acks.len(),
            report.unacknowledged,
            report.keys,
            history.revision,
            if run.partial_line {
                ", a partial ACK line ignored"
            } else {
                ""
            },
        );
    }
    let generation = log_generation(dir.path())?;
    println!(
        "{ITERATIONS} crashes, {} acknowledged writes checked, none lost, log generation {generation}, {:.1?}",
        history.acked.len(),
        started.elapsed()
    );
    ensure!(
        scratch > 0,
        "no rewritten scratch key was ever read back after a crash: the rewrites went untested"
    );
    ensure!(
        generation > 1,
        "the log was never compacted, so no kill could have landed in a compaction"
    );
    Ok(())
}

/// The random seed: `CRASH_SEED` if set, else the clock.
fn seed() -> u64 {
    if let Some(seed) = std::env::var("CRASH_SEED").ok().and_then(|s| s.parse().ok()) {
        return seed;
    }
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
}

/// xorshift64: enough randomness for kill delays, and replayable from its seed.
struct XorShift(u64);

impl XorShift {
    fn new(seed: u64) -> Self {
        XorShift(seed.max(1))
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
}

/// The writer's value contract: the key's bytes repeated and cut to `VALUE_BYTES` bytes.
fn value_for(key: &str) -> Vec<u8> {
    // `repeat` copies whole keys at a time: this runs for every key after every crash.
    let mut value = key.repeat(VALUE_BYTES.div_ceil(key.len().max(1))).into_bytes();
    value.truncate(VALUE_BYTES);
    value
}

/// One `ACK <key> <revision>` line.
#[derive(Debug, Clone)]
struct Ack {
    key: String,
    revision: u64,
}

/// What one killed writer printed.
struct Killed {
    acks: Vec<Ack>,
    /// The kill cut a line short; it acknowledged nothing.
    partial_line: bool,
}

/// A child process that is killed and reaped on every path, panics included.
struct KillOnDrop(Child);

impl KillOnDrop {
    fn kill_and_wait(&mut self) -> anyhow::Result<ExitStatus> {
        self.0.kill().context("killing the writer")?;
        self.0.wait().context("waiting for the writer")
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the writer, kills it `delay` after its first acknowledgements, returns its output.
fn run_and_kill(dir: &Path, tag: &str, delay: Duration) -> anyhow::Result<Killed> {
    let mut child = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_kvcache-storage-writer"))
            .arg("--dir")
            .arg(dir)
            .args(["--writers", &WRITERS.to_string()])
            .args(["--value-bytes", &VALUE_BYTES.to_string()])
            .args(["--tag", tag])
            // Rewrites make the log outgrow the live data, so kills also land in compactions.
            .args(["--churn", "4"])
            .args(["--compact-min-bytes", &COMPACT_MIN_BYTES.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting kvcache-storage-writer")?,
    );
    let stdout = child.0.stdout.take().context("the writer's stdout is not piped")?;
    let (line_seen, lines) = mpsc::channel();
    let reader = std::thread::spawn(move || read_acks(stdout, line_seen));

    let ready = wait_for_lines(&lines, ACKS_BEFORE_KILL, READY_TIMEOUT);
    if ready.is_ok() {
        std::thread::sleep(delay);
    }
    let status = child.kill_and_wait()?;
    let output = reader
        .join()
        .map_err(|_| anyhow::anyhow!("the stdout reader panicked"))?;
    ready
        .with_context(|| format!("the writer never acknowledged {ACKS_BEFORE_KILL} writes (it ended with {status})"))?;
    ensure!(
        status.signal() == Some(9),
        "the writer ended on its own ({status}) instead of by our SIGKILL"
    );
    output
}

/// Waits until the reader has seen `count` lines.
fn wait_for_lines(lines: &mpsc::Receiver<()>, count: usize, timeout: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    for seen in 0..count {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(()) => {}
            Err(mpsc::RecvTimeoutError::Timeout) => {
                bail!("timed out after {timeout:?} with {seen} lines")
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => bail!("stdout closed after {seen} lines"),
        }
    }
    Ok(())
}

/// Reads the writer's stdout to its end, signalling each complete line.
fn read_acks(stdout: impl Read, line_seen: mpsc::Sender<()>) -> anyhow::Result<Killed> {
    let mut stdout = BufReader::new(stdout);
    let mut acks = Vec::new();
    let mut line = String::new();
    loop {
        line.clear();
        if stdout.read_line(&mut line).context("reading the writer's stdout")? == 0 {
            return Ok(Killed {
                acks,
                partial_line: false,
            });
        }
        let Some(complete) = line.strip_suffix('\n') else {
            return Ok(Killed {
                acks,
                partial_line: true,
            });
        };
        acks.push(parse_ack(complete)?);
        let _ = line_seen.send(());
    }
}

fn parse_ack(line: &str) -> anyhow::Result<Ack> {
    let mut words = line.split(' ');
    let (Some("ACK"), Some(key), Some(revision), None) = (words.next(), words.next(), words.next(), words.next())
    else {
        bail!("unexpected writer output {line:?}");
    };
    let revision = revision.parse().with_context(|| format!("bad revision in {line:?}"))?;
    Ok(Ack {
        key: key.to_owned(),
        revision,
    })
}

/// What every crash so far has left behind.
#[derive(Default)]
struct History {
    /// Every acknowledged create: key → acknowledged revision.
    acked: HashMap<String, u64>,
    /// Every key listed after the previous crash: key → mod revision.
    listed: HashMap<String, u64>,
    /// The revision recovered after the previous crash.
    revision: u64,
}

struct Report {
    keys: usize,
    unacknowledged: usize,
    /// scratch keys readable (rewrites survive a crash too)
    scratch: usize,
}

/// Reopens the storage after a crash and checks it against everything acknowledged so far.
fn check_after_crash(dir: &Path, tag: &str, run: &Killed, history: &mut History) -> anyhow::Result<Report> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async {
        let storage = Embedded::open(dir, Options::default()).context("reopening the storage after the kill")?;
        let recovered = storage.current_revision().await?;
        ensure!(
            recovered >= history.revision,
            "the revision went back from {} to {recovered}",
            history.revision
        );
        for ack in &run.acks {
            check_acknowledged(&storage, ack, history.revision, recovered).await?;
            ensure!(
                history.acked.insert(ack.key.clone(), ack.revision).is_none(),
                "{} was acknowledged twice",
                ack.key
            );
        }
        let listed = list_all(&storage, recovered).await?;
        check_nothing_disappeared(&listed, history)?;
        let scratch = check_scratch_keys(&storage).await?;
        let unacknowledged = check_writers_are_gap_free(&listed, tag, &run.acks)?;
        history.listed = listed.iter().map(|(k, kv)| (k.clone(), kv.mod_revision)).collect();
        history.revision = recovered;
        Ok(Report {
            keys: listed.len(),
            unacknowledged,
            scratch,
        })
    })
}

/// The acknowledged create is readable at exactly its revision, which is newer than the previous
/// crash and not newer than what was recovered.
async fn check_acknowledged(storage: &Embedded, ack: &Ack, previous: u64, recovered: u64) -> anyhow::Result<()> {
    ensure!(
        ack.revision > previous && ack.revision <= recovered,
        "{} was acknowledged at revision {}, outside ({previous}, {recovered}]",
        ack.key,
        ack.revision
    );
    let kv = storage.get(&ack.key).await?.with_context(|| {
        format!(
            "LOST: {} was acknowledged at revision {} but is gone",
            ack.key, ack.revision
        )
    })?;
    ensure!(
        kv.mod_revision == ack.revision && kv.create_revision == ack.revision,
        "{} was acknowledged at revision {} but reads back at mod {} / create {}",
        ack.key,
        ack.revision,
        kv.mod_revision,
        kv.create_revision
    );
    check_value(&kv)
}

/// Every scratch key the writers rewrote is readable and holds its value; returns how many there
/// are. None yet is possible: a kill right after the first creates can land before any rewrite.
async fn check_scratch_keys(storage: &Embedded) -> anyhow::Result<usize> {
    let page = storage
        .list(ListRequest {
            prefix: "/churn/".into(),
            ..Default::default()
        })
        .await?;
    page.items.iter().try_for_each(check_value)?;
    Ok(page.items.len())
}

/// The generation of the newest log file: above 1 once the storage has compacted.
fn log_generation(dir: &Path) -> anyhow::Result<u64> {
    let mut newest = 0;
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if let Some(g) = name
            .strip_prefix("wal-")
            .and_then(|n| n.strip_suffix(".log"))
            .and_then(|hex| u64::from_str_radix(hex, 16).ok())
        {
            newest = newest.max(g);
        }
    }
    Ok(newest)
}

fn check_value(kv: &KeyValue) -> anyhow::Result<()> {
    ensure!(
        *kv.value == *value_for(&kv.key),
        "{} holds a wrong value ({} bytes, expected {VALUE_BYTES})",
        kv.key,
        kv.value.len()
    );
    Ok(())
}

/// Lists everything under `/crash/` in pages, checking order, revisions and every value.
async fn list_all(storage: &Embedded, recovered: u64) -> anyhow::Result<BTreeMap<String, KeyValue>> {
    let mut all = BTreeMap::new();
    let mut start_after = None;
    loop {
        let page = storage
            .list(ListRequest {
                prefix: ROOT.into(),
                revision: Some(recovered),
                start_after: start_after.clone(),
                limit: Some(LIST_PAGE),
                filter: None,
            })
            .await?;
        for kv in page.items {
            ensure!(
                start_after.as_ref().is_none_or(|after| kv.key > *after),
                "list returned {} out of order",
                kv.key
            );
            ensure!(
                kv.create_revision == kv.mod_revision && kv.mod_revision <= recovered,
                "{} has mod {} / create {} (recovered revision {recovered}); keys are created once",
                kv.key,
                kv.mod_revision,
                kv.create_revision
            );
            check_value(&kv)?;
            start_after = Some(kv.key.clone());
            all.insert(kv.key.clone(), kv);
        }
        if !page.more {
            return Ok(all);
        }
    }
}

/// Every acknowledged key and every key listed after the previous crash is still listed, at the
/// same revision.
fn check_nothing_disappeared(listed: &BTreeMap<String, KeyValue>, history: &History) -> anyhow::Result<()> {
    let earlier = history.acked.iter().chain(&history.listed);
    for (key, revision) in earlier {
        let kv = listed
            .get(key)
            .with_context(|| format!("LOST: {key} (revision {revision}) is no longer listed"))?;
        ensure!(
            kv.mod_revision == *revision,
            "{key} moved from revision {revision} to {}",
            kv.mod_revision
        );
    }
    Ok(())
}

/// Each writer of this run left keys `0..n` with increasing revisions, where `n` is its number of
/// acknowledgements, plus at most the one create in flight at the kill. Returns how many keys were
/// recovered without an acknowledgement.
fn check_writers_are_gap_free(listed: &BTreeMap<String, KeyValue>, tag: &str, acks: &[Ack]) -> anyhow::Result<usize> {
    let prefix = format!("{ROOT}{tag}/");
    let mut recovered: HashMap<usize, BTreeMap<u64, u64>> = HashMap::new();
    for kv in listed
        .range(prefix.clone()..)
        .take_while(|(k, _)| k.starts_with(&prefix))
        .map(|(_, kv)| kv)
    {
        let (writer, seq) = writer_and_seq(&kv.key, &prefix)?;
        recovered.entry(writer).or_default().insert(seq, kv.mod_revision);
    }
    let mut acked: HashMap<usize, u64> = HashMap::new();
    for ack in acks {
        *acked.entry(writer_and_seq(&ack.key, &prefix)?.0).or_default() += 1;
    }
    let mut unacknowledged = 0;
    for writer in 0..WRITERS {
        let seqs = recovered.remove(&writer).unwrap_or_default();
        let acked = acked.get(&writer).copied().unwrap_or(0);
        let count = seqs.len() as u64;
        ensure!(
            seqs.keys().copied().eq(0..count),
            "writer {writer} left a gap: {:?}",
            seqs.keys().collect::<Vec<_>>()
        );
        ensure!(
            count == acked || count == acked + 1,
            "writer {writer} had {acked} acknowledged creates but {count} keys were recovered"
        );
        ensure!(
            seqs.values().zip(seqs.values().skip(1)).all(|(a, b)| a < b),
            "writer {writer}'s revisions do not increase with its sequence"
        );
        unacknowledged += (count - acked) as usize;
    }
    ensure!(recovered.is_empty(), "keys of unknown writers {:?}", recovered.keys());
    Ok(unacknowledged)
}

/// Splits `<prefix><writer>/<seq>`.
fn writer_and_seq(key: &str, prefix: &str) -> anyhow::Result<(usize, u64)> {
    let rest = key
        .strip_prefix(prefix)
        .with_context(|| format!("{key} is not under {prefix}"))?;
    let (writer, seq) = rest
        .split_once('/')
        .with_context(|| format!("{key} has no sequence number"))?;
    Ok((
        writer.parse().with_context(|| format!("bad writer in {key}"))?,
        seq.parse().with_context(|| format!("bad sequence in {key}"))?,
    ))
}
