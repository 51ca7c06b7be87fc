//! What the store holds for the router's tenant, followed from its leader's KV events
//! (`Store.WatchBlocks`, store/README.md "KV events for routers"), so a routing decision asks
//! memory, not the leader: [`Index`] applies the events (a pure state machine, table-tested);
//! [`follow`] keeps a stream open through leader failovers and restarts and feeds it.
//!
//! The store is configured as an engine's connector is, from the environment the controllers
//! inject ([`Source::from_env`]): `KVSTORE_LEADER`, `KVSTORE_TENANT`, `KVSTORE_BLOCK_SIZE`,
//! `KVSTORE_DTYPE`, `KVSTORE_CREDENTIAL`, `KVSTORE_TLS_CA`. Without `KVSTORE_LEADER` the router
//! follows no store.
//!
//! Size: each key is kept as a 64-bit digest (XXH3), about 16 bytes a block however long the
//! key, so a store of millions of blocks costs the router tens of megabytes. Two keys with one
//! digest (about one chance in 10^5 at 20 million blocks) make a prediction wrong, never an
//! answer: a block predicted and not held is computed by the engine.
//!
//! Warmth: a router that starts (or restarts) gets every block the store holds in the stream's
//! snapshot; after a leader failover the new leader's stream starts with what it adopted, and
//! each member that remounts adds its blocks as live events. While no stream is open the index
//! keeps what it last knew (`kvrouter_store_connected` reads 0).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use kvcache_store::client::Client;
use kvcache_store::engine_sim::SimConfig;
use kvcache_store::proto::block_event::Event;
use kvcache_store::proto::{BlockEvent, Scope};
use kvcache_store::tls::{ClientTls, DialFlags};
use tokio_util::sync::CancellationToken;

use crate::keys::{self, Namespace};
use crate::metrics::Metrics;

/// One tenant's blocks as its leader last told them.
#[derive(Debug, Default)]
pub struct Index {
    /// the leader's epoch the keys came from (0: no stream yet)
    epoch: u64,
    /// the id of the last live event applied (snapshot events carry the last one they include)
    last: u64,
    /// each key's digest ([`digest`])
    keys: HashSet<u64>,
    /// the namespaces a vLLM connector made among `keys` (`keys.rs`), each with its keys held
    namespaces: BTreeMap<String, (Namespace, usize)>,
    /// tokens per block (the domain's `KVSTORE_BLOCK_SIZE`, which the connector makes its
    /// engine's); 0 before it is known
    block_size: usize,
}

/// A live event that does not follow the last one applied: the index may have missed a change,
/// so the stream must start over (its snapshot makes the index whole again).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the store's events jumped from {epoch}/{last} to {got_epoch}/{got}: following them again")]
pub struct Gap {
    pub epoch: u64,
    pub last: u64,
    pub got_epoch: u64,
    pub got: u64,
}

impl Index {
    /// Applies one event of a stream, in the order the stream sent it.
    pub fn apply(&mut self, e: &BlockEvent) -> Result<(), Gap> {
        if !e.snapshot && (e.epoch != self.epoch || e.id != self.last + 1) {
            return Err(Gap {
                epoch: self.epoch,
                last: self.last,
                got_epoch: e.epoch,
                got: e.id,
            });
        }
        match &e.event {
            Some(Event::Cleared(_)) => {
                self.keys.clear();
                self.namespaces.clear();
                self.epoch = e.epoch;
            }
            Some(Event::Stored(s)) => {
                for k in &s.keys {
                    self.insert(k);
                }
            }
            Some(Event::Removed(r)) => {
                for k in &r.keys {
                    self.remove(k);
                }
            }
            // an event this build does not know: nothing to change
            None => {}
        }
        self.last = e.id;
        Ok(())
    }

    fn insert(&mut self, key: &str) {
        if !self.keys.insert(digest(key)) {
            return;
        }
        if let Some(ns) = Namespace::of_key(key) {
            self.namespaces.entry(ns.name.clone()).or_insert((ns, 0)).1 += 1;
        }
    }

    fn remove(&mut self, key: &str) {
        if !self.keys.remove(&digest(key)) {
            return;
        }
        let Some(ns) = Namespace::of_key(key) else {
            return;
        };
        if let Some((_, n)) = self.namespaces.get_mut(&ns.name) {
            *n -= 1;
            if *n == 0 {
                self.namespaces.remove(&ns.name);
            }
        }
    }

    /// How many of `chain`'s keys, from the first, the store holds: each key of a chain names
    /// its whole prefix, so the first one missing ends what an engine can load.
    pub fn present_prefix<K: AsRef<str>>(&self, chain: &[K]) -> usize {
        chain.iter().take_while(|k| self.contains(k.as_ref())).count()
    }

    /// How many full blocks of `tokens`, from the first, the store holds for a request naming
    /// `model` with cache salt `salt`, as a vLLM connector would look them up: for each layout
    /// the store holds blocks of, with every one of its shards (a block counts only when each
    /// shard holds it), the connector's chain in those namespaces; the most any layout holds.
    /// A request naming another model than a namespace's is taken for a LoRA adapter of it
    /// (vLLM names the adapter in `model`). 0 while the block size is not known.
    pub fn stored_blocks(&self, model: &str, salt: &str, tokens: &[i64]) -> usize {
        if self.block_size == 0 {
            return 0;
        }
        let mut layouts: BTreeMap<(&str, &str), Vec<&Namespace>> = BTreeMap::new();
        for (ns, _) in self.namespaces.values() {
            layouts.entry((&ns.model, &ns.layout)).or_default().push(ns);
        }
        let mut chains: HashMap<(&str, &str), Vec<String>> = HashMap::new();
        let mut best = 0;
        for ((ns_model, _), shards) in layouts {
            if shards.iter().any(|ns| ns.shards as usize != shards.len()) {
                // a shard holds nothing: no block of this layout is whole
                continue;
            }
            let lora = if model == ns_model { "" } else { model };
            let chain = chains
                .entry((ns_model, lora))
                .or_insert_with(|| keys::chain(&keys::seed(ns_model, salt, lora), tokens, self.block_size));
            let held = chain
                .iter()
                .take_while(|h| shards.iter().all(|ns| self.contains(&ns.key(h))))
                .count();
            best = best.max(held);
        }
        best
    }

    /// Whether the store holds blocks a vLLM connector saved (else [`Index::stored_blocks`] is
    /// 0 for any prompt).
    pub fn has_namespaces(&self) -> bool {
        !self.namespaces.is_empty()
    }

    /// Tokens per block, as the store's domain says (`KVSTORE_BLOCK_SIZE`).
    pub fn set_block_size(&mut self, block_size: usize) {
        self.block_size = block_size;
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn contains(&self, key: &str) -> bool {
        self.keys.contains(&digest(key))
    }

    /// Blocks known.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

/// What the index keeps of a key (see the module's doc, "Size").
fn digest(key: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(key.as_bytes())
}

/// An [`Index`] shared between its follower and the routing.
pub type Shared = Arc<RwLock<Index>>;

/// Reads `index` (a poisoned lock still holds a consistent index: every change is one call).
pub fn read<T>(index: &Shared, f: impl FnOnce(&Index) -> T) -> T {
    f(&index.read().unwrap_or_else(PoisonError::into_inner))
}

pub fn write<T>(index: &Shared, f: impl FnOnce(&mut Index) -> T) -> T {
    f(&mut index.write().unwrap_or_else(PoisonError::into_inner))
}

/// Which store to follow, as a replica's connector finds it.
#[derive(Debug, Clone)]
pub struct Source {
    pub leader: String,
    pub scope: Scope,
    pub tls: Option<ClientTls>,
}

impl Source {
    /// The store the environment names (see the module's doc), `None` without `KVSTORE_LEADER`.
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Result<Option<Source>, String> {
        let cfg = SimConfig::from_env(&get).map_err(|e| e.message)?;
        let Some(leader) = cfg.leader else {
            return Ok(None);
        };
        let tls = DialFlags::from_env(&get).client_from_env()?;
        Ok(Some(Source {
            leader,
            scope: cfg.scope,
            tls,
        }))
    }
}

/// Waits between attempts to open a stream: from the first, doubling to the last.
const RETRY: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(2));

/// Keeps `index` following `source`'s tenant until `cancel` fires: opens a stream, applies its
/// events, and opens another when it ends (a leader failover ends it with `NOT_SERVING`), fails
/// or skips an event.
pub async fn follow(source: Source, index: Shared, metrics: Metrics, cancel: CancellationToken) {
    let mut wait = RETRY.0;
    let mut last_error = String::new();
    loop {
        let ended = tokio::select! {
            () = cancel.cancelled() => return,
            r = stream(&source, &index, &metrics) => r,
        };
        metrics.store_connected.set(0);
        match ended {
            Ok(applied) => {
                tracing::info!(applied, "the store's event stream ended; following again");
                if applied > 0 {
                    wait = RETRY.0;
                }
            }
            Err(e) if e != last_error => {
                tracing::warn!(leader = %source.leader, error = %e, "cannot follow the store's blocks; retrying");
                last_error = e;
            }
            Err(_) => {}
        }
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
        wait = (wait * 2).min(RETRY.1);
    }
}

/// One stream, applied until it ends (`Ok` with the events applied) or fails.
async fn stream(source: &Source, index: &Shared, metrics: &Metrics) -> Result<u64, String> {
    let client = Client::connect_tls(&source.leader, source.scope.clone(), source.tls.clone())
        .await
        .map_err(|e| e.to_string())?;
    let mut events = client.watch_blocks().await.map_err(|e| e.to_string())?;
    metrics.store_connected.set(1);
    metrics.store_streams.inc();
    let mut applied = 0u64;
    loop {
        let e = match events.message().await {
            Ok(Some(e)) => e,
            Ok(None) => return Ok(applied),
            Err(status) if applied > 0 => {
                tracing::info!(code = ?status.code(), message = status.message(), "the store's event stream ended");
                return Ok(applied);
            }
            Err(status) => return Err(format!("{:?}: {}", status.code(), status.message())),
        };
        let blocks = write(index, |i| i.apply(&e).map(|()| i.len())).map_err(|gap| gap.to_string())?;
        metrics.store_blocks.set(blocks as i64);
        applied += 1;
    }
}

#[cfg(test)]
mod tests;
