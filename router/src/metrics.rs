//! The router's metrics (issue 40's design, "Router HTTP surface"), registered on the registry
//! `/metrics` serves. Every label is bounded: endpoints, outcomes, kinds, states and reasons are
//! fixed sets, and `worker` is a worker's URL, bounded by the replica count (a removed worker's
//! series are removed with it).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// How a client request ended, the `outcome` of `kvrouter_requests_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// An engine answered 2xx and the answer reached the client whole.
    Ok,
    /// An engine answered with an error of its own, passed through.
    EngineError,
    /// The router refused the request (4xx): it reached no engine.
    Refused,
    /// `--request-timeout-seconds` ran out.
    Timeout,
    /// No engine could answer (503 no healthy worker, 502 every attempt failed, or the stream
    /// broke).
    Unavailable,
    /// The client went away first.
    Cancelled,
}

impl Outcome {
    pub fn label(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::EngineError => "engine_error",
            Self::Refused => "refused",
            Self::Timeout => "timeout",
            Self::Unavailable => "unavailable",
            Self::Cancelled => "cancelled",
        }
    }
}

/// Why a prefill-eligible request went to decode without a handoff.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FallbackReason {
    /// Prefill workers exist but none is healthy.
    NoHealthyPrefill,
    /// Every healthy prefill worker failed (connection, 5xx, timeout, no kv_transfer_params).
    PrefillFailed,
    /// A prefill worker refused the request (4xx): another would too; decode judges it.
    PrefillRefused,
}

impl FallbackReason {
    pub fn label(self) -> &'static str {
        match self {
            Self::NoHealthyPrefill => "no_healthy_prefill",
            Self::PrefillFailed => "prefill_failed",
            Self::PrefillRefused => "prefill_refused",
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub endpoint: &'static str,
    pub outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WorkerLabels {
    pub kind: &'static str,
    pub worker: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EngineLabels {
    pub worker: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabels {
    pub kind: &'static str,
    pub reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    pub kind: &'static str,
    pub state: &'static str,
}

/// Handles on every series the router writes.
#[derive(Debug, Clone)]
pub struct Metrics {
    pub requests: Family<RequestLabels, Counter>,
    pub time_to_first_token: Histogram,
    pub time_per_output_token: Histogram,
    pub inflight: Family<WorkerLabels, Gauge>,
    pub handoffs: Counter,
    pub handoff_bytes: Counter,
    pub retries: Family<KindLabels, Counter>,
    pub fallbacks: Family<ReasonLabels, Counter>,
    pub prefill_skipped: Family<ReasonLabels, Counter>,
    pub workers: Family<StateLabels, Gauge>,
    /// blocks the store holds for the router's tenant, as its events told (`store_index.rs`)
    pub store_blocks: Gauge,
    /// 1 while an event stream from the store's leader is open
    pub store_connected: Gauge,
    /// event streams opened (the first, then one per failover, restart of the leader or gap)
    pub store_streams: Counter,
    /// blocks each replica's engine holds in its memory, as its KV events told (`engine_memory`)
    pub engine_blocks: Family<EngineLabels, Gauge>,
    /// 1 while the router follows a replica's KV events
    pub engine_connected: Family<EngineLabels, Gauge>,
    /// sessions opened to replicas' KV event publishers
    pub engine_streams: Counter,
    /// the choice of an answering worker, by kind and why (`placement.rs`)
    pub decisions: Family<DecisionLabels, Counter>,
    /// prompt tokens the router predicted the chosen worker would not compute
    pub predicted_hit_tokens: Counter,
    /// prompt tokens vLLM reported it did not compute (`cached_tokens`), for answers that said
    pub reported_hit_tokens: Counter,
    /// of the predicted tokens, those the report confirmed (the smaller of the two, per answer)
    pub confirmed_hit_tokens: Counter,
    /// answers that carried vLLM's `cached_tokens`
    pub hit_reports: Counter,
}

impl Metrics {
    /// Creates the metrics and registers them on `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self {
            requests: Family::default(),
            // 5 ms .. 41 s
            time_to_first_token: Histogram::new(exponential_buckets(0.005, 2.0, 14)),
            // 1 ms .. 2 s
            time_per_output_token: Histogram::new(exponential_buckets(0.001, 2.0, 12)),
            inflight: Family::default(),
            handoffs: Counter::default(),
            handoff_bytes: Counter::default(),
            retries: Family::default(),
            fallbacks: Family::default(),
            prefill_skipped: Family::default(),
            workers: Family::default(),
            store_blocks: Gauge::default(),
            store_connected: Gauge::default(),
            store_streams: Counter::default(),
            engine_blocks: Family::default(),
            engine_connected: Family::default(),
            engine_streams: Counter::default(),
            decisions: Family::default(),
            predicted_hit_tokens: Counter::default(),
            reported_hit_tokens: Counter::default(),
            confirmed_hit_tokens: Counter::default(),
            hit_reports: Counter::default(),
        };
        m.register_routing(registry);
        m.register_store(registry);
        m.register_placement(registry);
        m
    }

    /// The series of requests, handoffs and workers.
    fn register_routing(&self, registry: &mut Registry) {
        registry.register(
            "kvrouter_requests",
            "Client requests by endpoint and how they ended",
            self.requests.clone(),
        );
        registry.register(
            "kvrouter_time_to_first_token_seconds",
            "From a streamed request's arrival to its first chunk leaving for the client",
            self.time_to_first_token.clone(),
        );
        registry.register(
            "kvrouter_time_per_output_token_seconds",
            "Mean time between a streamed answer's chunks after the first, one sample per request",
            self.time_per_output_token.clone(),
        );
        registry.register(
            "kvrouter_inflight",
            "Requests sent to a worker and not yet finished",
            self.inflight.clone(),
        );
        registry.register(
            "kvrouter_handoffs",
            "Prefill answers whose kv_transfer_params were handed to decode",
            self.handoffs.clone(),
        );
        registry.register(
            "kvrouter_handoff_bytes",
            "Bytes of KV prefill reported saved for decode (kvcache_handoff.bytes)",
            self.handoff_bytes.clone(),
        );
        registry.register(
            "kvrouter_retries",
            "Attempts on another worker after one failed, by the failed worker's kind",
            self.retries.clone(),
        );
        registry.register(
            "kvrouter_fallbacks",
            "Requests sent to decode without a handoff although prefill workers exist",
            self.fallbacks.clone(),
        );
        registry.register(
            "kvrouter_prefill_skipped",
            "Requests sent straight to decode although prefill workers exist, by why: batch, short, stored",
            self.prefill_skipped.clone(),
        );
        registry.register("kvrouter_workers", "Workers by kind and state", self.workers.clone());
    }

    /// The series of the store the router follows (`store_index.rs`).
    fn register_store(&self, registry: &mut Registry) {
        registry.register(
            "kvrouter_store_blocks",
            "Blocks the store holds for the router's tenant, as its leader's events told",
            self.store_blocks.clone(),
        );
        registry.register(
            "kvrouter_store_connected",
            "1 while an event stream from the store's leader is open",
            self.store_connected.clone(),
        );
        registry.register(
            "kvrouter_store_streams",
            "Event streams opened to the store's leader (one more per failover, leader restart or gap)",
            self.store_streams.clone(),
        );
    }

    /// The series of engine memory and placement (`engine_memory`, `placement.rs`).
    fn register_placement(&self, registry: &mut Registry) {
        registry.register(
            "kvrouter_engine_blocks",
            "Blocks a replica's engine holds in its own memory, as its KV events told",
            self.engine_blocks.clone(),
        );
        registry.register(
            "kvrouter_engine_connected",
            "1 while the router follows a replica's KV events",
            self.engine_connected.clone(),
        );
        registry.register(
            "kvrouter_engine_event_streams",
            "Sessions opened to replicas' KV event publishers (one more per reconnection or gap)",
            self.engine_streams.clone(),
        );
        registry.register(
            "kvrouter_decisions",
            "Answering workers chosen, by kind and why: engine_memory (its engine holds part of the prompt), load (no memory advantage), round_robin (--placement round-robin)",
            self.decisions.clone(),
        );
        registry.register(
            "kvrouter_predicted_hit_tokens",
            "Prompt tokens the router predicted the chosen worker would not compute (its memory, or the store)",
            self.predicted_hit_tokens.clone(),
        );
        registry.register(
            "kvrouter_reported_hit_tokens",
            "Prompt tokens vLLM reported cached (usage.prompt_tokens_details.cached_tokens)",
            self.reported_hit_tokens.clone(),
        );
        registry.register(
            "kvrouter_confirmed_hit_tokens",
            "Predicted hit tokens vLLM's report confirmed; over kvrouter_predicted_hit_tokens, the routing precision",
            self.confirmed_hit_tokens.clone(),
        );
        registry.register(
            "kvrouter_hit_reports",
            "Answers that reported their cached tokens",
            self.hit_reports.clone(),
        );
    }

    pub fn engine_connected(&self, worker: &str, connected: bool) {
        let labels = EngineLabels {
            worker: worker.to_owned(),
        };
        self.engine_connected.get_or_create(&labels).set(i64::from(connected));
    }

    pub fn engine_blocks(&self, worker: &str, blocks: usize) {
        let labels = EngineLabels {
            worker: worker.to_owned(),
        };
        self.engine_blocks.get_or_create(&labels).set(blocks as i64);
    }

    /// Removes a worker's engine series (it left the sets).
    pub fn engine_gone(&self, worker: &str) {
        let labels = EngineLabels {
            worker: worker.to_owned(),
        };
        self.engine_blocks.remove(&labels);
        self.engine_connected.remove(&labels);
    }

    /// Counts what vLLM reported cached for an answer whose worker was predicted to hold
    /// `predicted` tokens.
    pub fn hits_reported(&self, predicted: u64, reported: u64) {
        self.hit_reports.inc();
        self.reported_hit_tokens.inc_by(reported);
        self.confirmed_hit_tokens.inc_by(predicted.min(reported));
    }

    pub fn request(&self, endpoint: &'static str, outcome: Outcome) {
        self.requests
            .get_or_create(&RequestLabels {
                endpoint,
                outcome: outcome.label(),
            })
            .inc();
    }

    pub fn retry(&self, kind: &'static str) {
        self.retries.get_or_create(&KindLabels { kind }).inc();
    }

    pub fn prefill_skipped(&self, skip: crate::handoff::Skip) {
        self.prefill_skipped
            .get_or_create(&ReasonLabels { reason: skip.label() })
            .inc();
    }

    pub fn fallback(&self, reason: FallbackReason) {
        self.fallbacks
            .get_or_create(&ReasonLabels { reason: reason.label() })
            .inc();
    }
}

/// The registry in the text format `/metrics` serves.
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, registry);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_designs() {
        let mut registry = Registry::default();
        let m = Metrics::register(&mut registry);
        m.request("completions", Outcome::Ok);
        m.retry("prefill");
        m.fallback(FallbackReason::PrefillFailed);
        m.prefill_skipped(crate::handoff::Skip::Stored);
        m.handoffs.inc();
        m.handoff_bytes.inc_by(10);
        m.time_to_first_token.observe(0.1);
        m.time_per_output_token.observe(0.01);
        m.inflight
            .get_or_create(&WorkerLabels {
                kind: "decode",
                worker: "http://10.0.0.1:8000".into(),
            })
            .set(1);
        m.workers
            .get_or_create(&StateLabels {
                kind: "decode",
                state: "healthy",
            })
            .set(1);
        m.store_blocks.set(3);
        m.store_connected.set(1);
        m.store_streams.inc();
        m.engine_blocks("http://10.0.0.1:8000", 5);
        m.engine_connected("http://10.0.0.1:8000", true);
        m.engine_streams.inc();
        m.decisions
            .get_or_create(&DecisionLabels {
                kind: "server",
                reason: "engine_memory",
            })
            .inc();
        m.predicted_hit_tokens.inc_by(64);
        m.hits_reported(64, 48);
        let text = encode(&registry);
        for line in [
            "kvrouter_requests_total{endpoint=\"completions\",outcome=\"ok\"} 1",
            "kvrouter_retries_total{kind=\"prefill\"} 1",
            "kvrouter_fallbacks_total{reason=\"prefill_failed\"} 1",
            "kvrouter_prefill_skipped_total{reason=\"stored\"} 1",
            "kvrouter_handoffs_total 1",
            "kvrouter_handoff_bytes_total 10",
            "kvrouter_time_to_first_token_seconds_count 1",
            "kvrouter_time_per_output_token_seconds_count 1",
            "kvrouter_inflight{kind=\"decode\",worker=\"http://10.0.0.1:8000\"} 1",
            "kvrouter_workers{kind=\"decode\",state=\"healthy\"} 1",
            "kvrouter_store_blocks 3",
            "kvrouter_store_connected 1",
            "kvrouter_store_streams_total 1",
            "kvrouter_engine_blocks{worker=\"http://10.0.0.1:8000\"} 5",
            "kvrouter_engine_connected{worker=\"http://10.0.0.1:8000\"} 1",
            "kvrouter_engine_event_streams_total 1",
            "kvrouter_decisions_total{kind=\"server\",reason=\"engine_memory\"} 1",
            "kvrouter_predicted_hit_tokens_total 64",
            "kvrouter_reported_hit_tokens_total 48",
            "kvrouter_confirmed_hit_tokens_total 48",
            "kvrouter_hit_reports_total 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} not in\n{text}");
        }
    }
}
