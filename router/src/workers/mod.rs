//! The workers the router sends requests to: their kinds, health and outstanding requests, the
//! sets each source ([`file`], [`dns`]) contributes, and the choice of a worker for a request
//! ([`select`]). A worker removed from every source leaves the sets at once; a request in flight
//! to it holds its own handle and completes.

pub mod dns;
pub mod file;
mod select;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::Notify;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::engine_memory::{self, follow::Publisher};
use crate::metrics::{Metrics, StateLabels, WorkerLabels};

/// A worker's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Server,
    Prefill,
    Decode,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::Server, Kind::Prefill, Kind::Decode];

    pub fn label(self) -> &'static str {
        match self {
            Self::Server => "server",
            Self::Prefill => "prefill",
            Self::Decode => "decode",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.label() == s)
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Worker URLs per kind, as one source gives them, with where each publishes its KV events.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkerSets {
    urls: [Vec<String>; 3],
    publishers: BTreeMap<String, Publisher>,
}

impl WorkerSets {
    pub fn get(&self, kind: Kind) -> &[String] {
        &self.urls[kind.index()]
    }

    pub fn set(&mut self, kind: Kind, urls: Vec<String>) {
        self.urls[kind.index()] = urls;
    }

    /// Where the worker at `url` publishes its KV events.
    pub fn publisher(&self, url: &str) -> Option<&Publisher> {
        self.publishers.get(url)
    }

    pub fn set_publisher(&mut self, url: String, publisher: Publisher) {
        self.publishers.insert(url, publisher);
    }
}

/// Where a set of workers came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Source {
    File,
    /// The n-th `--workers-dns`.
    Dns(usize),
}

/// One worker: an engine's base URL (`http://host:port`), its health, its load and, when it
/// publishes KV events, what its engine holds in memory (followed while the worker lives).
#[derive(Debug)]
pub struct Worker {
    pub kind: Kind,
    pub url: Arc<str>,
    pub publisher: Option<Publisher>,
    pub memory: engine_memory::follow::Shared,
    healthy: AtomicBool,
    failures: AtomicU32,
    inflight: AtomicUsize,
    gauge: Gauge,
    /// stops following the publisher when the worker is dropped
    _follow: Option<DropGuard>,
}

impl Worker {
    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    pub fn inflight(&self) -> usize {
        self.inflight.load(Ordering::Relaxed)
    }

    /// Counts a request as outstanding on this worker until the guard drops.
    pub fn begin(self: &Arc<Self>) -> InFlight {
        self.inflight.fetch_add(1, Ordering::Relaxed);
        self.gauge.inc();
        InFlight(self.clone())
    }
}

/// A request outstanding on a worker.
#[derive(Debug)]
pub struct InFlight(Arc<Worker>);

impl InFlight {
    pub fn worker(&self) -> &Arc<Worker> {
        &self.0
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.inflight.fetch_sub(1, Ordering::Relaxed);
        self.0.gauge.dec();
    }
}

#[derive(Debug, Default)]
struct State {
    sources: BTreeMap<Source, WorkerSets>,
    workers: [Vec<Arc<Worker>>; 3],
}

/// Every source's workers, merged per kind.
#[derive(Debug)]
pub struct Pool {
    state: RwLock<State>,
    next: [AtomicUsize; 3],
    unhealthy_after: u32,
    metrics: Metrics,
    /// Woken when workers are added, so that the health check looks at them at once.
    pub added: Notify,
}

impl Pool {
    pub fn new(unhealthy_after: u32, metrics: Metrics) -> Self {
        let pool = Self {
            state: RwLock::default(),
            next: Default::default(),
            unhealthy_after,
            metrics,
            added: Notify::new(),
        };
        pool.refresh_gauges();
        pool
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        // A panic while holding the lock cannot leave the sets half-written (each write swaps
        // whole vectors), so a poisoned lock is still good to read.
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The workers of `kind`, healthy or not.
    pub fn workers(&self, kind: Kind) -> Vec<Arc<Worker>> {
        self.read().workers[kind.index()].clone()
    }

    /// Every worker of every kind.
    pub fn all(&self) -> Vec<Arc<Worker>> {
        let state = self.read();
        state.workers.iter().flatten().cloned().collect()
    }

    pub fn has(&self, kind: Kind) -> bool {
        !self.read().workers[kind.index()].is_empty()
    }

    /// Replaces what `source` contributes. Workers still named somewhere keep their state;
    /// new ones start healthy (a source names ready replicas) and are checked at once.
    pub fn set_source(&self, source: Source, sets: WorkerSets) {
        let mut added_any = false;
        {
            let mut state = self.state.write().unwrap_or_else(|e| e.into_inner());
            if state.sources.get(&source) == Some(&sets) {
                return;
            }
            state.sources.insert(source, sets);
            for kind in Kind::ALL {
                let mut urls: Vec<(&String, Option<&Publisher>)> = Vec::new();
                for s in state.sources.values() {
                    for u in s.get(kind) {
                        if !urls.iter().any(|(v, _)| *v == u) {
                            let publisher = state.sources.values().find_map(|s| s.publisher(u));
                            urls.push((u, publisher));
                        }
                    }
                }
                let old = &state.workers[kind.index()];
                let mut next = Vec::with_capacity(urls.len());
                let mut added = Vec::new();
                for (url, publisher) in urls {
                    match old
                        .iter()
                        .find(|w| &*w.url == url.as_str() && w.publisher.as_ref() == publisher)
                    {
                        Some(w) => next.push(w.clone()),
                        None => {
                            added.push(url.clone());
                            next.push(Arc::new(self.new_worker(kind, url, publisher.cloned())));
                        }
                    }
                }
                let removed: Vec<Arc<Worker>> = old
                    .iter()
                    .filter(|w| !next.iter().any(|n| Arc::ptr_eq(n, w)))
                    .cloned()
                    .collect();
                // a worker replaced under its URL (its publisher changed) keeps its series
                for w in removed.iter().filter(|w| !next.iter().any(|n| n.url == w.url)) {
                    self.metrics.inflight.remove(&WorkerLabels {
                        kind: kind.label(),
                        worker: w.url.to_string(),
                    });
                }
                if !added.is_empty() || !removed.is_empty() {
                    let removed: Vec<&str> = removed.iter().map(|w| &*w.url).collect();
                    tracing::info!(
                        kind = kind.label(),
                        ?added,
                        ?removed,
                        total = next.len(),
                        "workers changed"
                    );
                }
                added_any |= !added.is_empty();
                state.workers[kind.index()] = next;
            }
        }
        self.refresh_gauges();
        if added_any {
            self.added.notify_one();
        }
    }

    fn new_worker(&self, kind: Kind, url: &str, publisher: Option<Publisher>) -> Worker {
        let gauge = self
            .metrics
            .inflight
            .get_or_create(&WorkerLabels {
                kind: kind.label(),
                worker: url.to_string(),
            })
            .clone();
        let url: Arc<str> = Arc::from(url);
        let memory = engine_memory::follow::Shared::default();
        let follow = match (&publisher, tokio::runtime::Handle::try_current()) {
            (Some(p), Ok(runtime)) => {
                let cancel = CancellationToken::new();
                let task = engine_memory::follow::follow(
                    p.clone(),
                    url.clone(),
                    memory.clone(),
                    self.metrics.clone(),
                    cancel.clone(),
                );
                runtime.spawn(task);
                Some(cancel.drop_guard())
            }
            _ => None,
        };
        Worker {
            kind,
            url,
            publisher,
            memory,
            healthy: AtomicBool::new(true),
            failures: AtomicU32::new(0),
            inflight: AtomicUsize::new(0),
            gauge,
            _follow: follow,
        }
    }

    /// A health check or a request reached `worker`: it is in (again).
    pub fn succeeded(&self, worker: &Worker) {
        worker.failures.store(0, Ordering::Relaxed);
        if !worker.healthy.swap(true, Ordering::Relaxed) {
            tracing::info!(kind = worker.kind.label(), worker = %worker.url, "worker healthy again");
            self.refresh_gauges();
        }
    }

    /// A health check failed or a connection to `worker` did: after `--unhealthy-after` in a row
    /// it is out until a health check passes.
    pub fn failed(&self, worker: &Worker, why: &str) {
        let failures = worker.failures.fetch_add(1, Ordering::Relaxed).saturating_add(1);
        if failures >= self.unhealthy_after && worker.healthy.swap(false, Ordering::Relaxed) {
            tracing::warn!(kind = worker.kind.label(), worker = %worker.url, failures, why, "worker taken out");
            self.refresh_gauges();
        }
    }

    /// Sets `kvrouter_workers{kind,state}` from the sets.
    fn refresh_gauges(&self) {
        let state = self.read();
        for kind in Kind::ALL {
            let ws = &state.workers[kind.index()];
            let healthy = ws.iter().filter(|w| w.is_healthy()).count();
            for (label, n) in [("healthy", healthy), ("unhealthy", ws.len() - healthy)] {
                self.metrics
                    .workers
                    .get_or_create(&StateLabels {
                        kind: kind.label(),
                        state: label,
                    })
                    .set(n as i64);
            }
        }
    }
}

#[cfg(test)]
mod tests;
