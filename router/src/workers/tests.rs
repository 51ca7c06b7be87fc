//! Merging sources, keeping a worker's state across changes, health transitions and selection.

use std::sync::Arc;

use prometheus_client::registry::Registry;

use super::*;
use crate::metrics;

fn pool() -> (Pool, Registry) {
    let mut registry = Registry::default();
    let m = Metrics::register(&mut registry);
    (Pool::new(2, m), registry)
}

fn sets(kind: Kind, urls: &[&str]) -> WorkerSets {
    let mut s = WorkerSets::default();
    s.set(kind, urls.iter().map(|u| u.to_string()).collect());
    s
}

fn urls(ws: &[Arc<Worker>]) -> Vec<&str> {
    ws.iter().map(|w| &*w.url).collect()
}

#[test]
fn sources_merge_and_workers_keep_their_state() {
    let (p, registry) = pool();
    p.set_source(Source::File, sets(Kind::Decode, &["http://a:1", "http://b:1"]));
    p.set_source(Source::Dns(0), sets(Kind::Decode, &["http://b:1", "http://c:1"]));
    let ws = p.workers(Kind::Decode);
    assert_eq!(urls(&ws), ["http://a:1", "http://b:1", "http://c:1"]);
    let b = ws[1].clone();
    let _busy = b.begin();
    p.failed(&b, "test");
    p.failed(&b, "test");
    assert!(!b.is_healthy());
    // b stays (the DNS source still names it), with its state; a goes
    p.set_source(Source::File, sets(Kind::Decode, &["http://b:1"]));
    let ws = p.workers(Kind::Decode);
    assert_eq!(urls(&ws), ["http://b:1", "http://c:1"]);
    assert!(Arc::ptr_eq(&ws[0], &b));
    assert_eq!(ws[0].inflight(), 1);
    let text = metrics::encode(&registry);
    assert!(
        text.contains("kvrouter_workers{kind=\"decode\",state=\"unhealthy\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("kvrouter_workers{kind=\"decode\",state=\"healthy\"} 1"),
        "{text}"
    );
    assert!(
        !text.contains("worker=\"http://a:1\""),
        "a removed worker's series goes: {text}"
    );
}

#[test]
fn a_worker_goes_out_after_n_failures_and_back_after_a_success() {
    let (p, _r) = pool();
    p.set_source(Source::File, sets(Kind::Server, &["http://a:1"]));
    let a = p.workers(Kind::Server)[0].clone();
    p.failed(&a, "x");
    assert!(a.is_healthy(), "one failure is not enough");
    p.succeeded(&a);
    p.failed(&a, "x");
    assert!(a.is_healthy(), "a success resets the count");
    p.failed(&a, "x");
    assert!(!a.is_healthy());
    assert!(p.pick(&[Kind::Server], &[]).is_none());
    p.succeeded(&a);
    assert!(a.is_healthy());
    assert!(p.pick(&[Kind::Server], &[]).is_some());
}

#[test]
fn picks_the_least_loaded_and_round_robins_ties() {
    let (p, _r) = pool();
    p.set_source(
        Source::File,
        sets(Kind::Server, &["http://a:1", "http://b:1", "http://c:1"]),
    );
    let mut seen = Vec::new();
    for _ in 0..6 {
        seen.push(p.pick(&[Kind::Server], &[]).unwrap().url.to_string());
    }
    for u in ["http://a:1", "http://b:1", "http://c:1"] {
        assert_eq!(seen.iter().filter(|s| *s == u).count(), 2, "{seen:?}");
    }
    let ws = p.workers(Kind::Server);
    let _a = ws[0].begin();
    let _c = ws[2].begin();
    for _ in 0..4 {
        assert_eq!(&*p.pick(&[Kind::Server], &[]).unwrap().url, "http://b:1");
    }
    let _b1 = ws[1].begin();
    let _b2 = ws[1].begin();
    let picked = p.pick(&[Kind::Server], &[]).unwrap();
    assert!(["http://a:1", "http://c:1"].contains(&&*picked.url));
}

#[test]
fn pick_skips_tried_and_unhealthy_workers_and_spans_kinds() {
    let (p, _r) = pool();
    p.set_source(Source::File, sets(Kind::Decode, &["http://a:1", "http://b:1"]));
    let ws = p.workers(Kind::Decode);
    let tried = [ws[0].url.clone()];
    for _ in 0..3 {
        assert_eq!(&*p.pick(&[Kind::Decode], &tried).unwrap().url, "http://b:1");
    }
    p.failed(&ws[1], "x");
    p.failed(&ws[1], "x");
    assert!(p.pick(&[Kind::Decode], &tried).is_none());
    assert!(p.pick(&[Kind::Server, Kind::Decode], &[]).is_some());
    assert!(p.pick(&[Kind::Prefill], &[]).is_none());
}
