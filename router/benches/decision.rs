//! What the router's placement decision costs (issue 42): the index of a store holding 10,000
//! distinct prompts of 3,000 tokens (blocks of 64: 46 blocks each, 460,000 keys, as the leader's
//! snapshot delivers them) and three replicas' engine memories holding a third of them each (as
//! their KV events tell), then requests at 1,000 a second, each a prompt the store holds whole
//! or one that parts from a held prompt at a random block, while the store's events keep arriving
//! (a put of a new prompt's blocks between requests). Each decision is the work the router does
//! for a prompt whose tokens it has: the connector's chain over the prompt's blocks and the
//! lookups of every key (`Index::stored_blocks`), under the index's lock, then each replica's
//! engine chain and lookups, and the choice (`placement::decide`). Prints p50 and p99; the goal
//! is a p99 of at most 2 ms. `benches/placement.rs` prints it too, before its TTFT runs.
//!
//! `cargo bench -p kvcache-router --bench decision` (REQUESTS to change the default 10,000).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use kvcache_router::engine_events::{BlockHash, EngineEvent};
use kvcache_router::engine_memory::{self, Memory};
use kvcache_router::keys;
use kvcache_router::placement::{self, Candidate};
use kvcache_router::store_index::{self, Index};
use kvcache_store::proto::block_event::Event;
use kvcache_store::proto::{AllBlocksCleared, BlockEvent, BlockStored};

const PROMPTS: usize = 10_000;
const TOKENS: usize = 3_000;
const BLOCK: usize = 64;
const NAMESPACE: &str = "vllm/Qwen/Qwen2.5-0.5B-Instruct/0123456789abcdef/tp0of1";
const MODEL: &str = "Qwen/Qwen2.5-0.5B-Instruct";

/// A deterministic prompt: token ids drawn from `seed`.
fn prompt(seed: u64) -> Vec<i64> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..TOKENS)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 150_000) as i64
        })
        .collect()
}

fn keys_of(tokens: &[i64]) -> Vec<String> {
    keys::chain(&keys::seed(MODEL, "", ""), tokens, BLOCK)
        .iter()
        .map(|h| format!("{NAMESPACE}/{h}"))
        .collect()
}

fn stored(id: u64, keys: Vec<String>, snapshot: bool) -> BlockEvent {
    BlockEvent {
        epoch: 1,
        id,
        snapshot,
        event: Some(Event::Stored(BlockStored { keys, size: 3 << 20 })),
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    measure();
}

/// Three replicas' engine memories, prompt `p` held by replica `p % 3`.
fn memories() -> Vec<RwLock<Memory>> {
    let memories: Vec<RwLock<Memory>> = (0..3).map(|_| RwLock::default()).collect();
    for p in 0..PROMPTS as u64 {
        let tokens = prompt(p);
        let blocks = tokens.len() / BLOCK;
        let stored = EngineEvent::Stored {
            hashes: (0..blocks as i128)
                .map(|b| BlockHash::Int(i128::from(p) * 100 + b))
                .collect(),
            parent: None,
            tokens: tokens[..blocks * BLOCK].to_vec(),
            block_size: BLOCK,
            lora_name: None,
            salt: None,
        };
        memories[p as usize % 3].write().unwrap().apply(&stored);
    }
    memories
}

/// The store's index holding prompts `0..PROMPTS`, as the leader's snapshot delivers them.
fn store() -> store_index::Shared {
    let index: store_index::Shared = Arc::new(RwLock::new(Index::default()));
    store_index::write(&index, |i| {
        i.set_block_size(BLOCK);
        let cleared = BlockEvent {
            epoch: 1,
            id: 0,
            snapshot: true,
            event: Some(Event::Cleared(AllBlocksCleared {})),
        };
        i.apply(&cleared).unwrap();
        for p in 0..PROMPTS as u64 {
            i.apply(&stored(0, keys_of(&prompt(p)), true)).unwrap();
        }
    });
    index
}

/// One decision for `tokens`, as the router makes it: the store's part, each engine's, the
/// choice; the blocks the store holds and the chosen engine's tokens.
fn decide(index: &store_index::Shared, memories: &[RwLock<Memory>], tokens: &[i64], n: usize) -> (usize, u64) {
    let blocks = store_index::read(index, |i| i.stored_blocks(MODEL, "", tokens));
    let seed = engine_memory::chain_seed("", "");
    let candidates: Vec<Candidate> = memories
        .iter()
        .map(|m| {
            let m = m.read().unwrap();
            let chain = engine_memory::chain_from(seed, tokens, m.block_size());
            Candidate {
                memory: (m.held_prefix(&chain) * BLOCK) as u64,
                outstanding: 0,
            }
        })
        .collect();
    let stored_tokens = (blocks * BLOCK) as u64;
    let (chosen, _) = placement::decide(&candidates, tokens.len() as u64, stored_tokens, 512, n);
    (blocks, candidates[chosen].memory)
}

/// Fills the indexes, then times the decisions; prints both.
pub fn measure() {
    let requests: usize = std::env::var("REQUESTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let filling = Instant::now();
    let index = store();
    let memories = memories();
    let held = store_index::read(&index, Index::len);
    let remembered: usize = memories.iter().map(|m| m.read().unwrap().len()).sum();
    println!(
        "index of {PROMPTS} prompts of {TOKENS} tokens: {held} keys, and {remembered} blocks in 3 engines' memories, filled in {:.1?}",
        filling.elapsed()
    );

    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut took = Vec::with_capacity(requests);
    let started = Instant::now();
    for n in 0..requests {
        // paced at 1,000 a second
        let due = started + Duration::from_millis(n as u64);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        // the store's events go on between requests: a new prompt's blocks
        let new = keys_of(&prompt((PROMPTS + n) as u64));
        store_index::write(&index, |i| i.apply(&stored(n as u64 + 1, new, false)).unwrap());
        let mut tokens = prompt(next() % PROMPTS as u64);
        let whole = n % 2 == 0;
        if !whole {
            let at = (next() as usize) % TOKENS;
            tokens[at] = -1;
        }
        let t = Instant::now();
        let (blocks, chosen_memory) = decide(&index, &memories, &tokens, n);
        took.push(t.elapsed());
        if whole {
            assert_eq!(blocks, TOKENS / BLOCK, "a prompt the store holds whole");
            assert_eq!(chosen_memory, (TOKENS / BLOCK * BLOCK) as u64, "its holder");
        }
    }
    report(requests, took);
}

/// Prints the decisions' percentiles.
fn report(requests: usize, mut took: Vec<Duration>) {
    took.sort_unstable();
    println!(
        "{requests} decisions at 1,000/s over {PROMPTS} distinct prefixes: p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms (goal: p99 <= 2 ms)",
        percentile(&took, 0.5).as_secs_f64() * 1e3,
        percentile(&took, 0.99).as_secs_f64() * 1e3,
        took.last().unwrap().as_secs_f64() * 1e3,
    );
}
