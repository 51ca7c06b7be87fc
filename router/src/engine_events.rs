//! vLLM's KV events (`--kv-events-config`, published over ZMQ): what one replica's engine holds
//! in its own memory, block by block, as it stores and evicts. This module reads one published
//! batch into [`EngineEvent`]s; `engine_memory` follows a replica's publisher and keeps the
//! index the router places requests by.
//!
//! The wire form, as vLLM 0.32's encoder writes it (pinned by its own bytes in the tests): a
//! message `[ts, events, data_parallel_rank]`; each event a map tagged `"type"`, with the fields
//! that hold their default left out:
//! - `BlockStored`: `block_hashes` (binary or integers, vLLM's own), `parent_block_hash`,
//!   `token_ids` (every block's tokens, in order), `block_size`, `lora_name`, `extra_keys` (per
//!   block: the LoRA name when set, multimodal `[id, offset]` pairs, the request's cache salt,
//!   prompt-embedding digests);
//! - `BlockRemoved`: `block_hashes`;
//! - `AllBlocksCleared`.
//!
//! Those are enough to name each block by our keys (`keys.rs`): a chain starts at a block with
//! no parent, seeded with its LoRA and salt, and goes on from the parent's. Events of types this
//! build does not know are skipped; a malformed batch is an [`EventError`].

use crate::msgpack::{self, Value};

/// vLLM's hash of a block (its own scheme, not ours): only compared, never computed here.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum BlockHash {
    Bytes(Vec<u8>),
    Int(i128),
}

/// One thing a replica's engine did with its memory.
#[derive(Debug, Clone, PartialEq)]
pub enum EngineEvent {
    /// Full blocks now held, in order: each after `parent` (the first) or the one before it.
    Stored {
        hashes: Vec<BlockHash>,
        parent: Option<BlockHash>,
        /// every block's tokens, `block_size` each
        tokens: Vec<i64>,
        block_size: usize,
        lora_name: Option<String>,
        /// the cache salt of the first block's request, when it had one
        salt: Option<String>,
    },
    Removed {
        hashes: Vec<BlockHash>,
    },
    /// The engine dropped everything it held.
    Cleared,
}

/// Why a published message is not a batch of events.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EventError {
    #[error("not MessagePack: {0}")]
    Msgpack(#[from] msgpack::Error),
    #[error("not vLLM's KV event batch: {0}")]
    Shape(&'static str),
}

/// The events of one published batch, in order.
pub fn decode_batch(bytes: &[u8]) -> Result<Vec<EngineEvent>, EventError> {
    let batch = msgpack::decode(bytes)?;
    let events = batch
        .as_array()
        .and_then(|b| b.get(1))
        .and_then(Value::as_array)
        .ok_or(EventError::Shape("a batch is [ts, events, rank]"))?;
    let mut out = Vec::with_capacity(events.len());
    for e in events {
        match e.get("type").and_then(Value::as_str) {
            Some("BlockStored") => out.push(stored(e)?),
            Some("BlockRemoved") => out.push(EngineEvent::Removed {
                hashes: hashes(e.get("block_hashes"))?,
            }),
            Some("AllBlocksCleared") => out.push(EngineEvent::Cleared),
            Some(_) => {}
            None => return Err(EventError::Shape("an event without its type")),
        }
    }
    Ok(out)
}

fn stored(e: &Value) -> Result<EngineEvent, EventError> {
    let hashes = hashes(e.get("block_hashes"))?;
    let parent = match e.get("parent_block_hash") {
        None | Some(Value::Nil) => None,
        Some(h) => Some(hash(h)?),
    };
    let tokens: Option<Vec<i64>> = e
        .get("token_ids")
        .and_then(Value::as_array)
        .map(|t| t.iter().map(Value::as_i64).collect())
        .ok_or(EventError::Shape("BlockStored without its token_ids"))?;
    let tokens = tokens.ok_or(EventError::Shape("a token id that is not an integer"))?;
    let block_size = e
        .get("block_size")
        .and_then(Value::as_i64)
        .and_then(|b| usize::try_from(b).ok())
        .filter(|b| *b > 0)
        .ok_or(EventError::Shape("BlockStored without a block size"))?;
    if tokens.len() != hashes.len() * block_size {
        return Err(EventError::Shape("BlockStored's tokens are not its blocks'"));
    }
    let lora_name = e.get("lora_name").and_then(Value::as_str).map(str::to_owned);
    Ok(EngineEvent::Stored {
        salt: salt(e, lora_name.is_some()),
        hashes,
        parent,
        tokens,
        block_size,
        lora_name,
    })
}

/// The first block's cache salt: the first string of its extra keys after the LoRA name (which
/// comes first when the block has a LoRA); multimodal pairs are arrays. A request with prompt
/// embeddings may carry a digest here instead: such requests are never cached in the store
/// (the connector's `request_seed`), so the chain this names matches no request's.
fn salt(e: &Value, lora: bool) -> Option<String> {
    let first = e.get("extra_keys")?.as_array()?.first()?.as_array()?;
    first
        .iter()
        .filter_map(Value::as_str)
        .nth(usize::from(lora))
        .map(str::to_owned)
}

fn hashes(v: Option<&Value>) -> Result<Vec<BlockHash>, EventError> {
    v.and_then(Value::as_array)
        .ok_or(EventError::Shape("an event without its block_hashes"))?
        .iter()
        .map(hash)
        .collect()
}

fn hash(v: &Value) -> Result<BlockHash, EventError> {
    match v {
        Value::Bin(b) => Ok(BlockHash::Bytes(b.clone())),
        Value::Int(i) => Ok(BlockHash::Int(i128::from(*i))),
        Value::UInt(u) => Ok(BlockHash::Int(i128::from(*u))),
        _ => Err(EventError::Shape("a block hash that is neither bytes nor an integer")),
    }
}

#[cfg(test)]
mod tests;
