//! Choosing a worker: the healthy one with the fewest outstanding requests; ties go round robin,
//! so that idle replicas share a trickle of requests instead of the first taking them all.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::{Kind, Pool, Worker};

impl Pool {
    /// The healthy worker of `kinds` (in that order) with the fewest outstanding requests,
    /// skipping `tried`; `None` when there is none.
    pub fn pick(&self, kinds: &[Kind], tried: &[Arc<str>]) -> Option<Arc<Worker>> {
        let candidates: Vec<Arc<Worker>> = {
            let state = self.read();
            kinds
                .iter()
                .flat_map(|k| state.workers[k.index()].iter())
                .filter(|w| w.is_healthy() && !tried.contains(&w.url))
                .cloned()
                .collect()
        };
        let first = kinds.first()?;
        let start = self.next[first.index()].fetch_add(1, Ordering::Relaxed);
        least_loaded(&candidates, start).cloned()
    }
}

impl Pool {
    /// Where the round robin among `kind`'s workers stands.
    pub fn next(&self, kind: Kind) -> &std::sync::atomic::AtomicUsize {
        &self.next[kind.index()]
    }
}

/// The first worker with the fewest outstanding requests, looking from `start` (mod the length)
/// round the list.
fn least_loaded(candidates: &[Arc<Worker>], start: usize) -> Option<&Arc<Worker>> {
    let n = candidates.len();
    (0..n)
        .map(|i| &candidates[(start + i) % n.max(1)])
        .min_by_key(|w| w.inflight())
}
