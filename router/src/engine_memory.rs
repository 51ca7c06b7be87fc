//! What one replica's engine holds in its own memory (its prefix cache), block by block, as its
//! vLLM KV events ([`crate::engine_events`]) tell: [`Memory`] applies them (a pure state
//! machine, table-tested) and answers how many leading blocks of a prompt the engine holds;
//! [`follow`] keeps it current from the replica's publisher ([`crate::zmtp`]).
//!
//! Names: vLLM's own block hashes depend on a seed of its process, so the router names engine
//! blocks by a chain of its own, computed from the tokens the events carry:
//! `e(-1) = XXH3(seed(lora, salt))`, `e(i) = XXH3(tokens of block i as little-endian i64, seeded
//! with e(i-1))`. A stored block extends its parent's chain (looked up by vLLM's hash); a block
//! whose parent the router never saw (history the publisher no longer replays) cannot be named
//! and is left out, so a prediction may fall short, never credit a block the engine lacks.
//!
//! Tenancy: the seed carries the request's cache salt and LoRA adapter, so one tenant's or one
//! adapter's blocks never count for another's request (vLLM itself never shares them).

pub mod follow;

use std::collections::HashMap;

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

use crate::engine_events::{BlockHash, EngineEvent};
use crate::keys;

/// The engine-memory chain's start for a request's salt and LoRA adapter ("" for none).
pub fn chain_seed(salt: &str, lora: &str) -> u64 {
    xxh3_64(&keys::seed("", salt, lora))
}

/// The chain of `tokens`' full blocks of `block_size` tokens after `previous`.
pub fn chain_from(previous: u64, tokens: &[i64], block_size: usize) -> Vec<u64> {
    if block_size == 0 {
        return Vec::new();
    }
    let mut h = previous;
    let mut bytes = Vec::with_capacity(block_size * 8);
    tokens
        .chunks_exact(block_size)
        .map(|block| {
            bytes.clear();
            for t in block {
                bytes.extend_from_slice(&t.to_le_bytes());
            }
            h = xxh3_64_with_seed(&bytes, h);
            h
        })
        .collect()
}

/// One replica's engine memory.
#[derive(Debug, Default)]
pub struct Memory {
    /// tokens per block, from the events (0 before the first store)
    block_size: usize,
    /// vLLM's hash (digested) → our name of the block
    by_engine: HashMap<u64, u64>,
    /// our names held, each with how many engine blocks bear it
    held: HashMap<u64, u32>,
    /// blocks stored whose parent was unknown (not named)
    unnamed: u64,
}

fn engine_digest(h: &BlockHash) -> u64 {
    match h {
        BlockHash::Bytes(b) => xxh3_64(b),
        BlockHash::Int(i) => xxh3_64(&i.to_le_bytes()),
    }
}

impl Memory {
    /// Applies one event.
    pub fn apply(&mut self, e: &EngineEvent) {
        match e {
            EngineEvent::Stored {
                hashes,
                parent,
                tokens,
                block_size,
                lora_name,
                salt,
            } => {
                let start = match parent {
                    None => Some(chain_seed(
                        salt.as_deref().unwrap_or(""),
                        lora_name.as_deref().unwrap_or(""),
                    )),
                    Some(p) => self.by_engine.get(&engine_digest(p)).copied(),
                };
                let Some(start) = start else {
                    self.unnamed += hashes.len() as u64;
                    return;
                };
                self.block_size = *block_size;
                for (h, ours) in hashes.iter().zip(chain_from(start, tokens, *block_size)) {
                    if let Some(old) = self.by_engine.insert(engine_digest(h), ours) {
                        self.release(old);
                    }
                    *self.held.entry(ours).or_default() += 1;
                }
            }
            EngineEvent::Removed { hashes } => {
                for h in hashes {
                    if let Some(ours) = self.by_engine.remove(&engine_digest(h)) {
                        self.release(ours);
                    }
                }
            }
            EngineEvent::Cleared => self.clear(),
        }
    }

    fn release(&mut self, ours: u64) {
        if let Some(n) = self.held.get_mut(&ours) {
            *n -= 1;
            if *n == 0 {
                self.held.remove(&ours);
            }
        }
    }

    /// Forgets everything (a new history follows).
    pub fn clear(&mut self) {
        self.by_engine.clear();
        self.held.clear();
        self.unnamed = 0;
    }

    /// Tokens per block (0 before the engine stored anything).
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks held.
    pub fn len(&self) -> usize {
        self.by_engine.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_engine.is_empty()
    }

    /// How many of `chain`'s leading blocks the engine holds.
    pub fn held_prefix(&self, chain: &[u64]) -> usize {
        chain.iter().take_while(|h| self.held.contains_key(h)).count()
    }
}

#[cfg(test)]
mod tests;
