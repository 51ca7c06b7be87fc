//! The small HTTP endpoint a leader or member serves on `--metrics-listen`: `GET /metrics` (the
//! process's `prometheus_client` registry in OpenMetrics text), `GET /healthz` (alive), `GET
//! /readyz` (200 only in [`Readiness::Serving`]; the body names the state either way), and on a
//! member with a disk tier `GET /flushed` (its Pod's preStop hook: answers once what is queued
//! for the tier is copied and the leader has heard of it). Any other path is 404, any other
//! method 405. Each subsystem registers its metrics on the registry passed
//! to it (no globals); the leader and member read theirs at scrape time through a `Collector`.
//!
//! A [`Private`] part (the leader's per-tenant series, whose labels name the cache domains) is
//! added to `/metrics` only for a scrape carrying its token as `Authorization: Bearer …`, when it
//! has one; every other scrape gets the rest.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::auth::Expected;
use crate::readiness::{Readiness, ReadinessHandle};

/// The `Content-Type` of `/metrics`: what `prometheus_client`'s text encoder writes.
pub const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// How long open scrapes may take to finish after a stop before the endpoint closes anyway.
const DRAIN: Duration = Duration::from_secs(2);

/// What `GET /flushed` waits for: `Ok` (200) once it holds, `Err` (503) saying what is left when
/// it gives up. Set only on a member with a disk tier (elsewhere the path is 404).
pub type Flushed = Arc<dyn Fn() -> futures::future::BoxFuture<'static, Result<String, String>> + Send + Sync>;

/// How many `GET /flushed` may wait at once (a Pod's hook is one; more are refused with 429, so
/// callers cannot pile waits up on the endpoint).
const FLUSH_WAITERS: usize = 4;

/// Series served only to scrapes that carry `token` (to every scrape when it is `None`: the
/// process was given no token, so nothing it serves is guarded).
pub struct Private {
    pub registry: Registry,
    pub token: Option<Expected>,
}

#[derive(Clone)]
struct Endpoint {
    registry: Arc<Registry>,
    private: Option<Arc<Private>>,
    readiness: ReadinessHandle,
    flushed: Option<Flushed>,
    waiters: Arc<tokio::sync::Semaphore>,
}

/// Serves the endpoint on `listener` until `cancel` fires.
pub async fn serve(
    listener: TcpListener,
    registry: Arc<Registry>,
    private: Option<Private>,
    readiness: ReadinessHandle,
    flushed: Option<Flushed>,
    cancel: CancellationToken,
) -> std::io::Result<()> {
    let app = axum::Router::new().fallback(answer).with_state(Endpoint {
        registry,
        private: private.map(Arc::new),
        readiness,
        flushed,
        waiters: Arc::new(tokio::sync::Semaphore::new(FLUSH_WAITERS)),
    });
    let server = axum::serve(listener, app).with_graceful_shutdown(cancel.clone().cancelled_owned());
    tokio::select! {
        r = server => r,
        () = async { cancel.cancelled().await; tokio::time::sleep(DRAIN).await } => Ok(()),
    }
}

async fn answer(State(ep): State<Endpoint>, method: Method, uri: Uri, headers: HeaderMap) -> Response {
    if method != Method::GET {
        return (
            StatusCode::METHOD_NOT_ALLOWED,
            [(header::ALLOW, "GET")],
            "only GET is served\n",
        )
            .into_response();
    }
    match uri.path() {
        "/metrics" => {
            let private = ep.private.as_deref().filter(|p| shown_to(p, &headers));
            metrics(&ep.registry, private.map(|p| &p.registry))
        }
        "/healthz" => text(StatusCode::OK, "ok\n".to_string()),
        "/readyz" => {
            let state = ep.readiness.get();
            let code = if state == Readiness::Serving {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            text(code, format!("{state}\n"))
        }
        "/flushed" => flushed(&ep).await,
        _ => text(StatusCode::NOT_FOUND, "try /metrics, /healthz or /readyz\n".to_string()),
    }
}

/// `GET /flushed`: waits for [`Flushed`], one of at most [`FLUSH_WAITERS`].
async fn flushed(ep: &Endpoint) -> Response {
    let Some(wait) = &ep.flushed else {
        return text(
            StatusCode::NOT_FOUND,
            "this process has no disk tier to flush; try /metrics, /healthz or /readyz\n".to_string(),
        );
    };
    let Ok(_permit) = ep.waiters.try_acquire() else {
        return text(
            StatusCode::TOO_MANY_REQUESTS,
            format!("{FLUSH_WAITERS} waits for the flush are already open; wait for one of them\n"),
        );
    };
    match wait().await {
        Ok(done) => text(StatusCode::OK, done),
        Err(left) => text(StatusCode::SERVICE_UNAVAILABLE, left),
    }
}

/// Whether a scrape with these headers sees `p`.
fn shown_to(p: &Private, headers: &HeaderMap) -> bool {
    let Some(token) = &p.token else { return true };
    let mut metadata = tonic::metadata::MetadataMap::new();
    if let Some(v) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| tonic::metadata::MetadataValue::try_from(v.as_bytes()).ok())
    {
        metadata.insert(crate::auth::AUTHORIZATION, v);
    }
    token.check(&metadata).is_ok()
}

fn metrics(registry: &Registry, private: Option<&Registry>) -> Response {
    let mut body = String::new();
    let encoded = (|| {
        prometheus_client::encoding::text::encode_registry(&mut body, registry)?;
        if let Some(p) = private {
            prometheus_client::encoding::text::encode_registry(&mut body, p)?;
        }
        prometheus_client::encoding::text::encode_eof(&mut body)
    })();
    match encoded {
        Ok(()) => (StatusCode::OK, [(header::CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)], body).into_response(),
        Err(e) => {
            tracing::warn!(error = %e, "encoding metrics failed");
            text(
                StatusCode::INTERNAL_SERVER_ERROR,
                "encoding metrics failed\n".to_string(),
            )
        }
    }
}

fn text(code: StatusCode, body: String) -> Response {
    (code, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], body).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn request(addr: std::net::SocketAddr, method: &str, path: &str) -> String {
        request_with(addr, method, path, "").await
    }

    async fn request_with(addr: std::net::SocketAddr, method: &str, path: &str, headers: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req = format!("{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{headers}\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    /// The endpoint serving on a port of its own until [`Running::stop`].
    struct Running {
        addr: std::net::SocketAddr,
        cancel: CancellationToken,
        server: tokio::task::JoinHandle<std::io::Result<()>>,
    }

    impl Running {
        async fn start(
            registry: Registry,
            private: Option<Private>,
            readiness: ReadinessHandle,
            flushed: Option<Flushed>,
        ) -> Running {
            let cancel = CancellationToken::new();
            let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = l.local_addr().unwrap();
            let server = tokio::spawn(serve(
                l,
                Arc::new(registry),
                private,
                readiness,
                flushed,
                cancel.clone(),
            ));
            Running { addr, cancel, server }
        }

        /// Cancels the endpoint and waits until it stopped.
        async fn stop(self) {
            self.cancel.cancel();
            tokio::time::timeout(Duration::from_secs(5), self.server)
                .await
                .expect("the endpoint stops when cancelled")
                .unwrap()
                .unwrap();
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn serves_metrics_health_and_readiness_and_refuses_the_rest() {
        let mut registry = Registry::default();
        let c = Counter::<u64>::default();
        c.inc_by(3);
        registry.register("test_things", "things counted", c);
        let readiness = ReadinessHandle::new();
        let running = Running::start(registry, None, readiness.clone(), None).await;
        let addr = running.addr;

        let m = request(addr, "GET", "/metrics").await;
        assert!(m.starts_with("HTTP/1.1 200"), "{m}");
        assert!(
            m.to_lowercase()
                .contains(&format!("content-type: {OPENMETRICS_CONTENT_TYPE}")),
            "{m}"
        );
        assert!(m.contains("test_things_total 3"), "{m}");
        assert!(m.trim_end().ends_with("# EOF"), "{m}");
        assert!(request(addr, "GET", "/healthz").await.starts_with("HTTP/1.1 200"));
        let r = request(addr, "GET", "/readyz").await;
        assert!(r.starts_with("HTTP/1.1 503") && r.ends_with("starting\n"), "{r}");
        readiness.set(Readiness::Serving);
        let r = request(addr, "GET", "/readyz?verbose").await;
        assert!(r.starts_with("HTTP/1.1 200") && r.ends_with("serving\n"), "{r}");
        readiness.set(Readiness::Standby);
        let r = request(addr, "GET", "/readyz").await;
        assert!(r.starts_with("HTTP/1.1 503") && r.ends_with("standby\n"), "{r}");
        assert!(request(addr, "GET", "/nope").await.starts_with("HTTP/1.1 404"));
        let r = request(addr, "GET", "/flushed").await;
        assert!(r.starts_with("HTTP/1.1 404") && r.contains("no disk tier"), "{r}");
        assert!(request(addr, "POST", "/metrics").await.starts_with("HTTP/1.1 405"));

        running.stop().await;
        assert!(tokio::net::TcpStream::connect(addr).await.is_err(), "port closed");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn private_series_only_to_a_scrape_with_the_token() {
        let counted = |name: &str| {
            let mut r = Registry::default();
            let c = Counter::<u64>::default();
            c.inc();
            r.register(name, "counted", c);
            r
        };
        let private = Private {
            registry: counted("secret_things"),
            token: Some(Expected::new("the-token", "the metrics", "--control-token-file")),
        };
        let running = Running::start(counted("open_things"), Some(private), ReadinessHandle::new(), None).await;
        let addr = running.addr;
        for (who, headers) in [
            ("no token", ""),
            ("a wrong token", "Authorization: Bearer guess\r\n"),
            ("another scheme", "Authorization: Basic dGhlLXRva2Vu\r\n"),
        ] {
            let m = request_with(addr, "GET", "/metrics", headers).await;
            assert!(
                m.starts_with("HTTP/1.1 200") && m.contains("open_things_total 1"),
                "{who}: {m}"
            );
            assert!(!m.contains("secret"), "{who}: {m}");
            assert!(m.trim_end().ends_with("# EOF"), "{who}: {m}");
        }
        let m = request_with(addr, "GET", "/metrics", "Authorization: Bearer the-token\r\n").await;
        assert!(
            m.contains("open_things_total 1") && m.contains("secret_things_total 1"),
            "{m}"
        );
        assert_eq!(m.matches("# EOF").count(), 1, "{m}");
        assert!(m.trim_end().ends_with("# EOF"), "{m}");
        running.stop().await;
    }

    #[tokio::test(flavor = "current_thread")]
    async fn flushed_answers_what_the_wait_says_and_bounds_the_waiters() {
        // the wait: held while the outcome is `None`, then what it says (`true`: flushed)
        let (outcome, rx) = tokio::sync::watch::channel(None::<bool>);
        let entered = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let e = entered.clone();
        let wait: Flushed = Arc::new(move || {
            let mut rx = rx.clone();
            e.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Box::pin(async move {
                let flushed = rx.wait_for(Option::is_some).await.ok().and_then(|v| *v);
                if flushed == Some(true) {
                    Ok("flushed\n".to_string())
                } else {
                    Err("2 values still queued\n".to_string())
                }
            })
        });
        let running = Running::start(Registry::default(), None, ReadinessHandle::new(), Some(wait)).await;
        let addr = running.addr;
        let waiting: Vec<_> = (0..FLUSH_WAITERS)
            .map(|_| tokio::spawn(request(addr, "GET", "/flushed")))
            .collect();
        // every permit taken: one more is refused at once
        crate::eventually::eventually_async(Duration::from_secs(5), "every waiter waiting", || {
            std::future::ready(entered.load(std::sync::atomic::Ordering::SeqCst) == FLUSH_WAITERS)
        })
        .await;
        let refused = request(addr, "GET", "/flushed").await;
        assert!(
            refused.starts_with("HTTP/1.1 429") && refused.contains("already open"),
            "{refused}"
        );
        outcome.send_replace(Some(true));
        for w in waiting {
            let r = w.await.unwrap();
            assert!(r.starts_with("HTTP/1.1 200") && r.ends_with("flushed\n"), "{r}");
        }
        outcome.send_replace(None);
        let given_up = tokio::spawn(request(addr, "GET", "/flushed"));
        crate::eventually::eventually_async(Duration::from_secs(5), "the last waiter waiting", || {
            std::future::ready(entered.load(std::sync::atomic::Ordering::SeqCst) == FLUSH_WAITERS + 1)
        })
        .await;
        outcome.send_replace(Some(false));
        let r = given_up.await.unwrap();
        assert!(
            r.starts_with("HTTP/1.1 503") && r.ends_with("2 values still queued\n"),
            "{r}"
        );
        running.stop().await;
    }
}
