//! Following one replica's KV event publisher (vLLM's `ZmqEventPublisher`): a `SUB` connection
//! for the live batches, `[topic, seq (8 bytes, big-endian), batch]`, and a `DEALER` to its
//! replay socket, which answers a start sequence with every batch it still keeps from there, then
//! `[b"", -1, b""]`.
//!
//! Each session starts from nothing: subscribe, ask the replay for everything from 0, apply it,
//! then apply live batches after the last replayed one. A batch that skips a number (the
//! publisher dropped some under load, or the subscription raced the replay) ends the session and
//! the next one rebuilds from the replay; so does a lost connection (an engine that restarts
//! starts its numbers over). A replay that no longer reaches 0 leaves the index short of what
//! the engine held before, which makes predictions fall short, never wrong.

use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::Memory;
use crate::engine_events::decode_batch;
use crate::metrics::Metrics;
use crate::zmtp::{Connection, Limits, SocketType};

/// Where a replica publishes its KV events.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Publisher {
    /// the `PUB` socket, `tcp://host:port`
    pub events: String,
    /// the replay `ROUTER` socket, `tcp://host:port`
    pub replay: Option<String>,
}

/// What the router keeps of a replica's engine memory.
pub type Shared = Arc<RwLock<Memory>>;

pub fn read<T>(memory: &Shared, f: impl FnOnce(&Memory) -> T) -> T {
    f(&memory.read().unwrap_or_else(PoisonError::into_inner))
}

fn write<T>(memory: &Shared, f: impl FnOnce(&mut Memory) -> T) -> T {
    f(&mut memory.write().unwrap_or_else(PoisonError::into_inner))
}

/// Waits between sessions: from the first, doubling to the last.
const RETRY: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(2));
/// Bounds connecting and the handshake.
const CONNECT: Duration = Duration::from_secs(5);
/// Bounds a replay's whole answer.
const REPLAY: Duration = Duration::from_secs(30);
/// vLLM's sequence after a replay's last batch.
const END_SEQ: u64 = u64::MAX;

/// Keeps `memory` following `publisher` until `cancel` fires (the worker is gone), then removes
/// the worker's series.
pub async fn follow(
    publisher: Publisher,
    worker: Arc<str>,
    memory: Shared,
    metrics: Metrics,
    cancel: CancellationToken,
) {
    tokio::select! {
        () = cancel.cancelled() => {}
        () = follow_until(&publisher, &worker, &memory, &metrics) => {}
    }
    metrics.engine_gone(&worker);
}

async fn follow_until(publisher: &Publisher, worker: &str, memory: &Shared, metrics: &Metrics) {
    let mut wait = RETRY.0;
    let mut last_error = String::new();
    loop {
        let ended = session(publisher, worker, memory, metrics).await;
        metrics.engine_connected(worker, false);
        match ended {
            Ok(()) => wait = RETRY.0,
            Err((applied, e)) => {
                if applied > 0 {
                    wait = RETRY.0;
                }
                if e != last_error {
                    tracing::info!(%worker, events = %publisher.events, error = %e, "following the engine's KV events again");
                    last_error = e;
                }
            }
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(RETRY.1);
    }
}

/// One session; ends with the batches it applied and why.
async fn session(publisher: &Publisher, worker: &str, memory: &Shared, metrics: &Metrics) -> Result<(), (u64, String)> {
    let mut sub = Connection::connect(&publisher.events, SocketType::Sub, Limits::default(), CONNECT)
        .await
        .map_err(|e| (0, format!("events {}: {e}", publisher.events)))?;
    sub.subscribe(b"").await.map_err(|e| (0, e.to_string()))?;
    write(memory, Memory::clear);
    let mut last = match &publisher.replay {
        Some(replay) => replay_all(replay, memory).await.map_err(|e| (0, e))?,
        None => None,
    };
    metrics.engine_connected(worker, true);
    metrics.engine_streams.inc();
    metrics.engine_blocks(worker, read(memory, Memory::len));
    let mut applied = 0u64;
    loop {
        let parts = sub.recv().await.map_err(|e| (applied, e.to_string()))?;
        let (seq, batch) = sequenced(&parts).map_err(|e| (applied, e.to_owned()))?;
        match last {
            Some(l) if seq <= l => continue,
            Some(l) if seq != l + 1 => return Err((applied, format!("batch {seq} after {l}: a gap"))),
            _ => {}
        }
        let events = decode_batch(batch).map_err(|e| (applied, format!("batch {seq}: {e}")))?;
        let blocks = write(memory, |m| {
            events.iter().for_each(|e| m.apply(e));
            m.len()
        });
        metrics.engine_blocks(worker, blocks);
        last = Some(seq);
        applied += 1;
    }
}

/// Asks `replay` for every batch it keeps and applies them; the last one's sequence.
async fn replay_all(replay: &str, memory: &Shared) -> Result<Option<u64>, String> {
    let mut dealer = Connection::connect(replay, SocketType::Dealer, Limits::default(), CONNECT)
        .await
        .map_err(|e| format!("replay {replay}: {e}"))?;
    dealer.send(&[b"", &seq_bytes(0)]).await.map_err(|e| e.to_string())?;
    let read_all = async {
        let mut last = None;
        loop {
            let parts = dealer.recv().await.map_err(|e| e.to_string())?;
            // [b"", topic, seq, batch]: the empty frame a DEALER gets from a ROUTER first
            let rest = match parts.split_first() {
                Some((empty, rest)) if empty.is_empty() => rest,
                _ => return Err("a replay answer without its empty first frame".to_owned()),
            };
            let (seq, batch) = sequenced(rest)?;
            if seq == END_SEQ {
                return Ok(last);
            }
            if last.is_none() && seq > 0 {
                tracing::info!(
                    first = seq,
                    "the engine's replay starts after its first batch: blocks stored before are not known"
                );
            }
            let events = decode_batch(batch).map_err(|e| format!("replayed batch {seq}: {e}"))?;
            write(memory, |m| events.iter().for_each(|e| m.apply(e)));
            last = Some(seq);
        }
    };
    tokio::time::timeout(REPLAY, read_all)
        .await
        .map_err(|_| format!("no whole replay within {REPLAY:?}"))?
}

/// `[topic, seq, batch]` → `(seq, batch)`.
fn sequenced(parts: &[Vec<u8>]) -> Result<(u64, &[u8]), &'static str> {
    match parts {
        [_topic, seq, batch] => {
            let seq: [u8; 8] = seq
                .as_slice()
                .try_into()
                .map_err(|_| "a sequence number that is not 8 bytes")?;
            Ok((seq_of(seq), batch))
        }
        _ => Err("a message that is not [topic, seq, batch]"),
    }
}

/// vLLM's sequence numbers: 8 bytes, big-endian.
#[allow(clippy::big_endian_bytes, reason = "vLLM's sequence numbers are big-endian")]
fn seq_bytes(seq: u64) -> [u8; 8] {
    seq.to_be_bytes()
}

#[allow(clippy::big_endian_bytes, reason = "vLLM's sequence numbers are big-endian")]
fn seq_of(b: [u8; 8]) -> u64 {
    u64::from_be_bytes(b)
}
