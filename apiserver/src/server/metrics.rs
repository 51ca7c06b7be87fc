//! Prometheus metrics with the names Kubernetes operators' dashboards expect:
//! `apiserver_request_total`, `apiserver_request_duration_seconds`,
//! `apiserver_longrunning_requests`, `apiserver_watch_events_total`,
//! `apiserver_tls_handshake_errors_total`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use parking_lot::Mutex;

const BUCKETS: &[f64] = &[
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 15.0, 20.0, 30.0,
    45.0, 60.0,
];

/// The labels of one request.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct RequestLabels {
    pub verb: String,
    pub dry_run: bool,
    pub resource: String,
    pub subresource: String,
    /// `resource`, `namespace` or `cluster`; empty for non-resource requests.
    pub scope: String,
}

#[derive(Debug, Default)]
struct Histogram {
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

#[derive(Debug, Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(RequestLabels, u16), u64>>,
    durations: Mutex<BTreeMap<RequestLabels, Histogram>>,
    watch_events: Mutex<BTreeMap<String, u64>>,
    pub longrunning: AtomicI64,
    pub tls_handshake_errors: AtomicU64,
}

impl Metrics {
    pub fn observe(&self, labels: &RequestLabels, code: u16, seconds: f64) {
        {
            let mut requests = self.requests.lock();
            let key = (labels.clone(), code);
            *requests.entry(key).or_default() += 1;
        }
        let mut d = self.durations.lock();
        if !d.contains_key(labels) {
            d.insert(
                labels.clone(),
                Histogram {
                    counts: vec![0; BUCKETS.len()],
                    ..Histogram::default()
                },
            );
        }
        let Some(h) = d.get_mut(labels) else { return };
        for (i, b) in BUCKETS.iter().enumerate() {
            if seconds <= *b {
                h.counts[i] += 1;
            }
        }
        h.sum += seconds;
        h.count += 1;
    }

    pub fn watch_event(&self, resource: &str) {
        *self.watch_events.lock().entry(resource.to_owned()).or_default() += 1;
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let group = kvcache_api::GROUP;
        let base = |l: &RequestLabels| {
            let (g, v) = if l.resource.is_empty() { ("", "") } else { (group, "v1") };
            format!(
                "verb=\"{}\",dry_run=\"{}\",group=\"{g}\",version=\"{v}\",resource=\"{}\",subresource=\"{}\",scope=\"{}\",component=\"apiserver\"",
                l.verb,
                if l.dry_run { "All" } else { "" },
                l.resource,
                l.subresource,
                l.scope
            )
        };
        out.push_str("# HELP apiserver_request_total Counter of apiserver requests broken out for each verb, dry run value, group, version, resource, scope, component, and HTTP response code.\n");
        out.push_str("# TYPE apiserver_request_total counter\n");
        for ((l, code), n) in self.requests.lock().iter() {
            let _ = writeln!(out, "apiserver_request_total{{{},code=\"{code}\"}} {n}", base(l));
        }
        out.push_str("# HELP apiserver_request_duration_seconds Response latency distribution in seconds for each verb, dry run value, group, version, resource, subresource, scope and component.\n");
        out.push_str("# TYPE apiserver_request_duration_seconds histogram\n");
        for (l, h) in self.durations.lock().iter() {
            let b = base(l);
            for (i, le) in BUCKETS.iter().enumerate() {
                let _ = writeln!(
                    out,
                    "apiserver_request_duration_seconds_bucket{{{b},le=\"{le}\"}} {}",
                    h.counts[i]
                );
            }
            let _ = writeln!(
                out,
                "apiserver_request_duration_seconds_bucket{{{b},le=\"+Inf\"}} {}",
                h.count
            );
            let _ = writeln!(out, "apiserver_request_duration_seconds_sum{{{b}}} {}", h.sum);
            let _ = writeln!(out, "apiserver_request_duration_seconds_count{{{b}}} {}", h.count);
        }
        out.push_str(
            "# HELP apiserver_longrunning_requests Gauge of all active long-running apiserver requests (watches).\n",
        );
        out.push_str("# TYPE apiserver_longrunning_requests gauge\n");
        let _ = writeln!(
            out,
            "apiserver_longrunning_requests{{verb=\"WATCH\",component=\"apiserver\"}} {}",
            self.longrunning.load(Ordering::Relaxed)
        );
        out.push_str("# HELP apiserver_watch_events_total Number of events sent in watch clients\n");
        out.push_str("# TYPE apiserver_watch_events_total counter\n");
        for (resource, n) in self.watch_events.lock().iter() {
            let _ = writeln!(
                out,
                "apiserver_watch_events_total{{group=\"{group}\",version=\"v1\",resource=\"{resource}\"}} {n}"
            );
        }
        out.push_str("# HELP apiserver_tls_handshake_errors_total Number of requests dropped with 'TLS handshake error from' error\n");
        out.push_str("# TYPE apiserver_tls_handshake_errors_total counter\n");
        let _ = writeln!(
            out,
            "apiserver_tls_handshake_errors_total {}",
            self.tls_handshake_errors.load(Ordering::Relaxed)
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_and_histograms_with_kubernetes_labels() {
        let m = Metrics::default();
        let l = RequestLabels {
            verb: "LIST".into(),
            resource: "kvcachebackends".into(),
            scope: "cluster".into(),
            ..RequestLabels::default()
        };
        m.observe(&l, 200, 0.003);
        m.observe(&l, 200, 0.3);
        let text = m.render();
        assert!(text.contains(r#"apiserver_request_total{verb="LIST",dry_run="",group="worker.gpustack.ai",version="v1",resource="kvcachebackends",subresource="",scope="cluster",component="apiserver",code="200"} 2"#), "{text}");
        assert!(text.contains(r#"le="0.005"} 1"#));
        assert!(text.contains(r#"le="0.4"} 2"#));
    }
}
