//! The API server's metrics, on a `prometheus-client` registry passed in by the composition root,
//! with kube-apiserver's names so operators' dashboards work unchanged:
//! `apiserver_request_total`, `apiserver_request_duration_seconds`,
//! `apiserver_longrunning_requests`, `apiserver_watch_events_total`,
//! `apiserver_terminated_watchers_total` and `apiserver_tls_handshake_errors_total`.
//!
//! Labels are bounded: verb, group, resource and subresource come from the table of kinds and a
//! closed set of verbs, never from raw path segments. Requests for anything else (unknown paths,
//! unknown resources, and every 401, whose path says nothing trustworthy) share one fixed label
//! set, so a burst of random paths adds no series.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::request_info::RequestInfo;

const BUCKETS: &[f64] = &[
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 15.0, 20.0, 30.0,
    45.0, 60.0,
];

/// The labels of one request (`code` is added for the counter).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub verb: &'static str,
    pub dry_run: &'static str,
    pub group: &'static str,
    pub version: &'static str,
    pub resource: &'static str,
    pub subresource: &'static str,
    /// `resource`, `namespace` or `cluster`; empty for non-resource requests.
    pub scope: &'static str,
    pub component: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CodeLabels {
    #[prometheus(flatten)]
    request: RequestLabels,
    code: u16,
}

/// The labels of a watch-level figure.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabels {
    pub group: &'static str,
    pub version: &'static str,
    pub resource: &'static str,
}

impl RequestLabels {
    /// The labels every request that is not about a served kind shares (unknown paths, 401s),
    /// apart from the method.
    fn unknown(verb: &'static str) -> RequestLabels {
        RequestLabels {
            verb,
            dry_run: "",
            group: "",
            version: "",
            resource: "",
            subresource: "",
            scope: "",
            component: "apiserver",
        }
    }

    /// The labels of a request, from what it was judged to be about.
    pub fn of(info: &RequestInfo, code: u16) -> RequestLabels {
        let core_events = code != 401 && info.is_core_events();
        let leases = code != 401 && info.is_leases();
        let (group, version, resource) = match info.kind().filter(|_| code != 401) {
            Some(kind) => (kvcache_api::GROUP, kvcache_api::VERSION, kind.plural),
            None if core_events => ("", "v1", "events"),
            None if leases => (crate::request_info::LEASE_GROUP, "v1", "leases"),
            None => return RequestLabels::unknown(info.method_verb()),
        };
        let Some(r) = info.resource.as_ref() else {
            return RequestLabels::unknown(info.method_verb());
        };
        RequestLabels {
            verb: info.metric_verb(),
            dry_run: if info.dry_run { "All" } else { "" },
            group,
            version,
            resource,
            subresource: if r.subresource == "status" { "status" } else { "" },
            scope: if !r.name.is_empty() {
                "resource"
            } else if r.namespace.is_empty() {
                "cluster"
            } else {
                "namespace"
            },
            component: "apiserver",
        }
    }
}

/// The counter and histogram of one label set, looked up once.
#[derive(Debug, Clone)]
struct Handles {
    requests: Counter,
    duration: Option<Histogram>,
}

/// Identifies a label set by where its (static) strings live and the code: cheap to hash. Two
/// keys for equal strings at different addresses map to the same metrics.
type HandleKey = [usize; 9];

fn handle_key(l: &RequestLabels, code: u16) -> HandleKey {
    let p = |s: &'static str| s.as_ptr() as usize;
    [
        p(l.verb),
        p(l.dry_run),
        p(l.group),
        p(l.version),
        p(l.resource),
        p(l.subresource),
        p(l.scope),
        p(l.component),
        usize::from(code),
    ]
}

/// Every API metric.
#[derive(Debug, Clone)]
pub struct ApiMetrics {
    /// Handles by label set, so that a request pays for one small hash, not two families'.
    handles:
        std::sync::Arc<parking_lot::RwLock<std::collections::HashMap<HandleKey, Handles, foldhash::fast::RandomState>>>,
    requests: Family<CodeLabels, Counter>,
    durations: Family<RequestLabels, Histogram, fn() -> Histogram>,
    longrunning: Family<RequestLabels, Gauge>,
    watch_events: Family<ResourceLabels, Counter>,
    terminated_watchers: Family<ResourceLabels, Counter>,
    tls_handshake_errors: Counter,
}

fn histogram() -> Histogram {
    Histogram::new(BUCKETS.iter().copied())
}

impl ApiMetrics {
    /// Registers the metrics on `registry`.
    pub fn register(registry: &mut Registry) -> ApiMetrics {
        let m = ApiMetrics {
            handles: Default::default(),
            requests: Family::default(),
            durations: Family::new_with_constructor(histogram as fn() -> Histogram),
            longrunning: Family::default(),
            watch_events: Family::default(),
            terminated_watchers: Family::default(),
            tls_handshake_errors: Counter::default(),
        };
        registry.register(
            "apiserver_request",
            "Counter of apiserver requests broken out for each verb, dry run value, group, version, resource, scope, component, and HTTP response code",
            m.requests.clone(),
        );
        registry.register(
            "apiserver_request_duration_seconds",
            "Response latency distribution in seconds for each verb, dry run value, group, version, resource, subresource, scope and component",
            m.durations.clone(),
        );
        registry.register(
            "apiserver_longrunning_requests",
            "Gauge of all active long-running apiserver requests broken out by verb, group, version, resource, scope and component",
            m.longrunning.clone(),
        );
        registry.register(
            "apiserver_watch_events",
            "Number of events sent in watch clients",
            m.watch_events.clone(),
        );
        registry.register(
            "apiserver_terminated_watchers",
            "Counter of watchers closed due to unresponsiveness broken by resource type",
            m.terminated_watchers.clone(),
        );
        registry.register(
            "apiserver_tls_handshake_errors",
            "Number of requests dropped with 'TLS handshake error from' error",
            m.tls_handshake_errors.clone(),
        );
        m
    }

    /// Counts a finished request (watches when they start streaming); long-running requests are
    /// not timed, as in kube-apiserver.
    pub fn observe(&self, info: &RequestInfo, code: u16, seconds: f64) {
        let labels = RequestLabels::of(info, code);
        let key = handle_key(&labels, code);
        let found = self.handles.read().get(&key).cloned();
        let handles = match found {
            Some(h) => h,
            None => {
                let h = Handles {
                    duration: (labels.verb != "WATCH").then(|| self.durations.get_or_create(&labels).clone()),
                    requests: self
                        .requests
                        .get_or_create(&CodeLabels { request: labels, code })
                        .clone(),
                };
                self.handles.write().insert(key, h.clone());
                h
            }
        };
        if let Some(d) = &handles.duration {
            d.observe(seconds);
        }
        handles.requests.inc();
    }

    /// The gauge of running watches like `info`'s; dropping the guard decrements it.
    pub fn longrunning(&self, info: &RequestInfo) -> LongRunning {
        let gauge = self.longrunning.get_or_create(&RequestLabels::of(info, 200)).clone();
        gauge.inc();
        LongRunning(gauge)
    }

    pub fn watch_event(&self, resource: &'static str) {
        self.watch_events.get_or_create(&Self::resource(resource)).inc();
    }

    pub fn watcher_terminated(&self, resource: &'static str) {
        self.terminated_watchers.get_or_create(&Self::resource(resource)).inc();
    }

    pub fn tls_handshake_error(&self) {
        self.tls_handshake_errors.inc();
    }

    fn resource(resource: &'static str) -> ResourceLabels {
        ResourceLabels {
            group: kvcache_api::GROUP,
            version: kvcache_api::VERSION,
            resource,
        }
    }
}

/// One running long-running request.
#[derive(Debug)]
pub struct LongRunning(Gauge);

impl Drop for LongRunning {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// The process's heap as its allocator counts it, read at each scrape:
/// `process_heap_allocated_bytes` (RSS alone cannot tell a leak from free memory the allocator
/// keeps for reuse) and `process_heap_peak_allocated_bytes` (the most it has been, which catches
/// a request that builds much and frees it before any scrape).
#[derive(Debug, Clone, Copy)]
pub struct HeapReadings {
    /// Bytes handed out and not had back.
    pub allocated: fn() -> usize,
    /// The most `allocated` has been since the process started.
    pub peak: fn() -> usize,
}

impl prometheus_client::collector::Collector for HeapReadings {
    fn encode(&self, mut encoder: prometheus_client::encoding::DescriptorEncoder) -> std::fmt::Result {
        use prometheus_client::encoding::EncodeMetric as _;
        let figures = [
            (
                "process_heap_allocated_bytes",
                "Bytes the allocator has handed out and not had back (the heap in use; RSS adds the free memory it keeps)",
                (self.allocated)(),
            ),
            (
                "process_heap_peak_allocated_bytes",
                "The most process_heap_allocated_bytes has been since the process started",
                (self.peak)(),
            ),
        ];
        for (name, help, bytes) in figures {
            let gauge = prometheus_client::metrics::gauge::ConstGauge::new(i64::try_from(bytes).unwrap_or(i64::MAX));
            let metric = encoder.encode_descriptor(name, help, None, gauge.metric_type())?;
            gauge.encode(metric)?;
        }
        Ok(())
    }
}

/// The Prometheus text exposition (format 0.0.4, as kube-apiserver serves it) of `registry`.
pub fn render(registry: &Registry) -> String {
    let mut out = String::new();
    if let Err(e) = prometheus_client::encoding::prometheus_text::encode(&mut out, registry) {
        tracing::warn!(error = %e, "encoding metrics failed");
    }
    out
}

/// The `Content-Type` of [`render`]'s output.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

#[cfg(test)]
mod tests {
    use super::*;

    fn info(method: &str, path: &str) -> RequestInfo {
        let uri: http::Uri = path.parse().unwrap();
        RequestInfo::parse(&method.parse().unwrap(), uri.path(), uri.query())
    }

    #[test]
    fn renders_counters_and_histograms_with_kubernetes_labels() {
        let mut reg = Registry::default();
        let m = ApiMetrics::register(&mut reg);
        let list = info("GET", "/apis/worker.gpustack.ai/v1/kvcachebackends");
        m.observe(&list, 200, 0.003);
        m.observe(&list, 200, 0.3);
        let text = render(&reg);
        assert!(text.contains(r#"apiserver_request_total{verb="LIST",dry_run="",group="worker.gpustack.ai",version="v1",resource="kvcachebackends",subresource="",scope="cluster",component="apiserver",code="200"} 2"#), "{text}");
        assert!(text.contains(r#"le="0.005"} 1"#), "{text}");
        assert!(text.contains(r#"le="0.4"} 2"#), "{text}");
    }

    #[test]
    fn labels_never_come_from_unknown_path_segments() {
        let a = RequestLabels::of(&info("GET", "/apis/worker.gpustack.ai/v1/nonsense123"), 404);
        let b = RequestLabels::of(&info("GET", "/whatever/else"), 404);
        let c = RequestLabels::of(&info("GET", "/apis/worker.gpustack.ai/v1/kvcachepools/x/weird"), 404);
        let d = RequestLabels::of(&info("GET", "/apis/worker.gpustack.ai/v1/kvcachepools"), 401);
        let e = RequestLabels::of(&info("BREW", "/apis/worker.gpustack.ai/v1/kvcachepools"), 405);
        assert_eq!(a, b);
        assert_eq!(c.subresource, "");
        assert_eq!(d.resource, "");
        assert_eq!(e.verb, "other");
    }
}
