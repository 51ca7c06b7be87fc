//! `/healthz`, `/livez` and `/readyz` (with `?verbose`, `?exclude=` and one check by path), as
//! kube-apiserver answers them, and `/metrics`.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::extract::State;
use axum::response::Response;

use super::Api;
use super::response::{self, error, text};
use crate::request_info::Query;

pub async fn healthz(State(api): State<Arc<Api>>, uri: http::Uri) -> Response {
    answer(&api, "healthz", &uri)
}

pub async fn livez(State(api): State<Arc<Api>>, uri: http::Uri) -> Response {
    answer(&api, "livez", &uri)
}

pub async fn readyz(State(api): State<Arc<Api>>, uri: http::Uri) -> Response {
    answer(&api, "readyz", &uri)
}

fn answer(api: &Api, base: &str, uri: &http::Uri) -> Response {
    let q = Query::parse(uri.query());
    let check = uri
        .path()
        .trim_start_matches('/')
        .split_once('/')
        .map(|(_, c)| c)
        .filter(|c| !c.is_empty());
    let mut checks: Vec<(&str, bool)> = vec![("ping", true)];
    if base == "readyz" {
        checks.push(("storage", api.storage.health().is_ok()));
        checks.push(("shutdown", api.ready.load(Ordering::Relaxed)));
    }
    for excluded in q.all("exclude") {
        checks.retain(|(n, _)| *n != excluded);
    }
    if let Some(one) = check {
        return match checks.iter().find(|(n, _)| *n == one) {
            Some((_, true)) => text(200, "ok".into()),
            Some((n, false)) => text(503, format!("[-]{n} failed: reason withheld\n")),
            None => error(404, "NotFound", format!("no health check named {one:?}")),
        };
    }
    let ok = checks.iter().all(|(_, ok)| *ok);
    if q.has("verbose") || !ok {
        let mut body: String = checks
            .iter()
            .map(|(n, ok)| {
                if *ok {
                    format!("[+]{n} ok\n")
                } else {
                    format!("[-]{n} failed: reason withheld\n")
                }
            })
            .collect();
        body.push_str(&format!("{base} check {}\n", if ok { "passed" } else { "failed" }));
        return text(if ok { 200 } else { 503 }, body);
    }
    text(200, "ok".into())
}

/// `GET /metrics`: every subsystem's metrics.
pub async fn metrics(State(api): State<Arc<Api>>) -> Response {
    response::bytes(
        200,
        crate::metrics::CONTENT_TYPE,
        crate::metrics::render(&api.metrics_registry),
    )
}
