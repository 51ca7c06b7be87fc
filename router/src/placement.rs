//! Choosing the answering worker for a prompt (issue 42): the healthy worker with the least to
//! do, counted in eighths of a prompt token computed,
//!
//! ```text
//! cost(w) = 8 × (prompt tokens − hit(w))              the tokens it computes
//!         + (hit(w) − memory(w))                      the tokens it loads from the store
//!         + 8 × --load-weight-tokens × outstanding(w)
//! memory(w) = leading prompt tokens w's engine holds in memory
//! hit(w)    = max(memory(w), leading prompt tokens the store holds)
//! ```
//!
//! ties going round robin. A token already in an engine's memory costs nothing; one loaded from
//! the store costs an eighth of computing it (our vLLM replicas load a shared prefix at 3% of
//! recomputing it on this machine's CPUs; a GPU computes faster next to the same transfer, so
//! the weight is kept conservative). A worker's memory is what its KV events told
//! (`engine_memory`). Without the prompt's tokens, or when no candidate's engine holds anything,
//! the choice is by load alone (`kvrouter_decisions_total{reason="load"}`).
//!
//! Hits are counted as vLLM counts them: whole blocks, and never the prompt's last token (the
//! engine computes at least that one). `--placement least-loaded` and `round-robin` choose
//! without memory (to compare with); what they choose is still predicted and checked.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::config::Placement as Policy;
use crate::engine_memory::{self, follow};
use crate::metrics::DecisionLabels;
use crate::request::ClientRequest;
use crate::server::App;
use crate::store_index;
use crate::workers::{Kind, Worker};

/// Why a worker was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// Its engine holds part of the prompt in memory.
    EngineMemory,
    /// No memory advantage: the least loaded.
    Load,
    /// `--placement round-robin`: in turn.
    RoundRobin,
}

impl Reason {
    pub fn label(self) -> &'static str {
        match self {
            Self::EngineMemory => "engine_memory",
            Self::Load => "load",
            Self::RoundRobin => "round_robin",
        }
    }
}

/// A worker chosen, and what the router expects of it.
#[derive(Debug)]
pub struct Placement {
    pub worker: Arc<Worker>,
    /// prompt tokens the worker will not compute, when the prompt's tokens are known
    pub predicted_hit_tokens: Option<u64>,
    pub reason: Reason,
}

/// One candidate as [`decide`] sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    /// leading prompt tokens its engine holds
    pub memory: u64,
    pub outstanding: u64,
}

/// What a loaded token costs against a computed one, as its denominator.
const COMPUTED_OVER_LOADED: u64 = 8;

/// The index of the candidate to choose among `candidates` (non-empty), looking from `start`
/// round the list for ties, and why.
pub fn decide(candidates: &[Candidate], prompt: u64, stored: u64, weight: u64, start: usize) -> (usize, Reason) {
    let n = candidates.len();
    let cost = |c: &Candidate| {
        let hit = c.memory.max(stored).min(prompt);
        let computed = prompt - hit;
        let loaded = hit - c.memory.min(hit);
        computed
            .saturating_mul(COMPUTED_OVER_LOADED)
            .saturating_add(loaded)
            .saturating_add(
                weight
                    .saturating_mul(c.outstanding)
                    .saturating_mul(COMPUTED_OVER_LOADED),
            )
    };
    let chosen = (0..n)
        .map(|i| (start + i) % n.max(1))
        .min_by_key(|i| cost(&candidates[*i]))
        .unwrap_or(0);
    let reason = if candidates.get(chosen).is_some_and(|c| c.memory > 0) {
        Reason::EngineMemory
    } else {
        Reason::Load
    };
    (chosen, reason)
}

/// The LoRA adapter a request names: its model when that is not the served one.
fn lora<'a>(app: &App, req: &'a ClientRequest) -> &'a str {
    match &app.config.model {
        Some(served) if *served != req.model => &req.model,
        _ => "",
    }
}

/// Leading prompt tokens `worker`'s engine holds in memory.
pub fn engine_hit_tokens(app: &App, req: &ClientRequest, worker: &Worker, tokens: &[i64]) -> u64 {
    let seed = engine_memory::chain_seed(req.cache_salt(), lora(app, req));
    follow::read(&worker.memory, |m| {
        let bs = m.block_size();
        if bs == 0 || m.is_empty() {
            return 0;
        }
        let chain = engine_memory::chain_from(seed, tokens, bs);
        hit_tokens(m.held_prefix(&chain), bs, tokens.len())
    })
}

/// Leading prompt tokens the store holds (every worker's connector can load them).
pub fn store_hit_tokens(app: &App, req: &ClientRequest, tokens: &[i64]) -> u64 {
    store_index::read(&app.store, |i| {
        let bs = i.block_size();
        if bs == 0 || !i.has_namespaces() {
            return 0;
        }
        hit_tokens(i.stored_blocks(&req.model, req.cache_salt(), tokens), bs, tokens.len())
    })
}

/// `blocks` leading blocks of `bs` tokens as vLLM counts their hit: never the last token.
fn hit_tokens(blocks: usize, bs: usize, prompt: usize) -> u64 {
    let usable = prompt.saturating_sub(1) / bs;
    (blocks.min(usable) * bs) as u64
}

/// Whether any worker of `kinds` holds anything in its engine's memory.
pub fn any_memory(app: &App, kinds: &[Kind]) -> bool {
    kinds
        .iter()
        .flat_map(|k| app.pool.workers(*k))
        .any(|w| w.is_healthy() && !follow::read(&w.memory, |m| m.is_empty()))
}

/// Chooses among the healthy workers of `kinds` not in `tried`; `tokens`, when known, let
/// memory count. Counted in `kvrouter_decisions_total` and `kvrouter_predicted_hit_tokens`.
pub fn choose(
    app: &App,
    req: &ClientRequest,
    kinds: &[Kind],
    tried: &[Arc<str>],
    tokens: Option<&[i64]>,
) -> Option<Placement> {
    let workers: Vec<Arc<Worker>> = kinds
        .iter()
        .flat_map(|k| app.pool.workers(*k))
        .filter(|w| w.is_healthy() && !tried.contains(&w.url))
        .collect();
    let first = kinds.first()?;
    if workers.is_empty() {
        return None;
    }
    let start = app.pool.next(*first).fetch_add(1, Ordering::Relaxed);
    let (stored, memory): (u64, Vec<u64>) = match tokens {
        Some(t) => (
            store_hit_tokens(app, req, t),
            workers.iter().map(|w| engine_hit_tokens(app, req, w, t)).collect(),
        ),
        None => (0, vec![0; workers.len()]),
    };
    let candidates: Vec<Candidate> = workers
        .iter()
        .zip(&memory)
        .map(|(w, m)| Candidate {
            memory: *m,
            outstanding: w.inflight() as u64,
        })
        .collect();
    let prompt = tokens.map_or(0, |t| t.len() as u64);
    let (i, reason) = match app.config.placement {
        Policy::Memory => decide(&candidates, prompt, stored, app.config.load_weight_tokens, start),
        Policy::LeastLoaded => {
            let blind: Vec<Candidate> = candidates.iter().map(|c| Candidate { memory: 0, ..*c }).collect();
            decide(&blind, 0, 0, 1, start)
        }
        Policy::RoundRobin => (start % candidates.len(), Reason::RoundRobin),
    };
    let worker = workers[i].clone();
    let predicted = tokens.map(|_| memory[i].max(stored));
    app.metrics
        .decisions
        .get_or_create(&DecisionLabels {
            kind: worker.kind.label(),
            reason: reason.label(),
        })
        .inc();
    if let Some(p) = predicted {
        app.metrics.predicted_hit_tokens.inc_by(p);
    }
    Some(Placement {
        worker,
        predicted_hit_tokens: predicted,
        reason,
    })
}

#[cfg(test)]
mod tests;
