//! A leader's lifecycle: bind its listeners ([`LeaderListeners::bind`]), then
//! [`Leader::serve`] them (gRPC, the fast port, the metrics endpoint, housekeeping) until the
//! cancellation token fires. Readiness: `Starting` until everything is bound and the housekeeping
//! runs, `Serving` while gRPC serves, `Stopping` from the moment the token fires.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::{Election, Leader, LeaderConfig, fastport, grpc, metrics};
use crate::lifecycle::{self, ServeError, Task};
use crate::readiness::Readiness;

/// A leader's listeners, bound as its config says.
#[derive(Debug)]
pub struct LeaderListeners {
    /// what the gRPC and fast ports serve with (`--tls-cert`); `None`: plaintext
    tls: Option<crate::tls::ServerTls>,
    grpc: TcpListener,
    fast: Option<TcpListener>,
    metrics: Option<TcpListener>,
    addrs: LeaderAddrs,
}

/// Where a leader's listeners are bound (with port 0 resolved).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaderAddrs {
    pub grpc: SocketAddr,
    pub fast: Option<SocketAddr>,
    pub metrics: Option<SocketAddr>,
}

impl LeaderListeners {
    /// Binds `--listen`, the fast port (unless off) and `--metrics-listen` (if given).
    pub async fn bind(cfg: &LeaderConfig) -> Result<Self, ServeError> {
        let grpc = lifecycle::bind("listen", cfg.listen).await?;
        let grpc_addr = lifecycle::local_addr("listen", &grpc, cfg.listen)?;
        let fast = match cfg.fast_addr(cfg.listen) {
            Some(a) => Some((lifecycle::bind("fast-listen", a).await?, a)),
            None => None,
        };
        let fast_addr = match &fast {
            Some((l, a)) => Some(lifecycle::local_addr("fast-listen", l, *a)?),
            None => None,
        };
        let metrics = match cfg.metrics_listen {
            Some(a) => Some((lifecycle::bind("metrics-listen", a).await?, a)),
            None => None,
        };
        let metrics_addr = match &metrics {
            Some((l, a)) => Some(lifecycle::local_addr("metrics-listen", l, *a)?),
            None => None,
        };
        Ok(Self {
            tls: cfg.tls.server()?,
            grpc,
            fast: fast.map(|(l, _)| l),
            metrics: metrics.map(|(l, _)| l),
            addrs: LeaderAddrs {
                grpc: grpc_addr,
                fast: fast_addr,
                metrics: metrics_addr,
            },
        })
    }

    pub fn addrs(&self) -> LeaderAddrs {
        self.addrs
    }
}

/// Spawns `leader`'s metrics endpoint on `listener` until `stop` fires: `registry`, and the
/// per-tenant series to scrapes with the metrics token.
fn spawn_metrics(
    leader: &Leader,
    listener: TcpListener,
    registry: Registry,
    stop: &CancellationToken,
) -> Task<std::io::Result<()>> {
    Task::spawn(crate::metrics::serve(
        listener,
        Arc::new(registry),
        Some(crate::metrics::Private {
            registry: metrics::tenant_registry(leader),
            token: leader.tokens.metrics.clone(),
        }),
        leader.readiness.clone(),
        None,
        stop.clone(),
    ))
}

impl Leader {
    /// Serves gRPC, the fast port and the metrics endpoint on `listeners`, with the housekeeping
    /// loops (member liveness, reservation reaping, watermark eviction) beside them, until
    /// `cancel` fires; then stops accepting, drains gRPC (at most [`lifecycle::DRAIN`]), closes
    /// the fast port's connections, stops the housekeeping, and returns `Ok(())`. The leader's
    /// metrics are registered on `registry`, which the endpoint serves.
    pub async fn serve(
        self,
        listeners: LeaderListeners,
        mut registry: Registry,
        cancel: CancellationToken,
    ) -> Result<(), ServeError> {
        let LeaderListeners {
            tls,
            grpc,
            fast,
            metrics: metrics_listener,
            addrs,
        } = listeners;
        // everything below stops on `stop`: the caller's token, or gRPC failing on its own
        let stop = cancel.child_token();
        metrics::register(&self, &mut registry);
        let endpoint = metrics_listener.map(|l| spawn_metrics(&self, l, registry, &stop));
        let housekeeping = Task::spawn(self.clone().housekeeping(stop.clone()));
        let spin = self.with(|s| s.cfg.spin);
        let hot = crate::spin::HotWindow::start(spin);
        let fast_port = fast.map(|l| {
            if let Some(a) = addrs.fast {
                self.fast_port.store(u32::from(a.port()), Ordering::Release);
            }
            Task::spawn(fastport::serve(l, tls.clone(), self.clone(), hot.clone(), stop.clone()))
        });
        *self.bound.lock() = Some(addrs.grpc);
        let election = if self.with(|s| s.cfg.election) == Election::None {
            self.gate.open();
            self.readiness.set(Readiness::Serving);
            tracing::info!(grpc = %addrs.grpc, fast = ?addrs.fast, metrics = ?addrs.metrics, "leader serving");
            None
        } else {
            tracing::info!(grpc = %addrs.grpc, fast = ?addrs.fast, metrics = ?addrs.metrics, "leader listening; campaigning for the Lease");
            Some(Task::spawn(self.clone().run_election(stop.clone())))
        };

        let stopping = {
            let (stop, readiness, gate) = (stop.clone(), self.readiness.clone(), self.gate.clone());
            async move {
                stop.cancelled().await;
                readiness.set(Readiness::Stopping);
                gate.shut();
            }
        };
        let server = grpc::router(self.clone(), tls.as_ref())?.serve_with_incoming_shutdown(
            crate::net::incoming_limited(grpc, crate::net::MAX_GRPC_CONNECTIONS, "leader gRPC"),
            stopping,
        );
        let result = lifecycle::drained(server, &stop, "gRPC").await;
        self.readiness.set(Readiness::Stopping);
        stop.cancel();
        if let Some(t) = fast_port {
            t.join().await;
        }
        self.fast_port.store(0, Ordering::Release);
        if let Some(t) = election {
            t.join().await;
        }
        hot.stop();
        housekeeping.join().await;
        if let Some(t) = endpoint
            && let Some(Err(e)) = t.join().await
        {
            tracing::warn!(error = %e, "metrics endpoint failed");
        }
        tracing::info!("leader stopped");
        result
    }

    async fn housekeeping(self, stop: CancellationToken) {
        let interval = self.with(|s| s.cfg.eviction_interval);
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = ticker.tick() => {}
            }
            let now = Instant::now();
            self.with(|s| {
                s.expire_members(now);
                s.reap_reservations(now);
                s.end_leases(now);
                s.watermark_round(now);
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn serve_returns_when_cancelled_and_closes_its_ports() {
        let cfg = LeaderConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            metrics_listen: Some("127.0.0.1:0".parse().unwrap()),
            ..Default::default()
        };
        let leader = Leader::new(cfg.clone()).unwrap();
        let listeners = LeaderListeners::bind(&cfg).await.unwrap();
        let addrs = listeners.addrs();
        let fast = addrs.fast.expect("a fast port by default");
        assert_eq!(leader.readiness().get(), Readiness::Starting);
        let cancel = CancellationToken::new();
        let serving = tokio::spawn(leader.clone().serve(listeners, Registry::default(), cancel.clone()));
        assert!(leader.readiness().wait_for(Readiness::Serving).await);
        // a client holds a pooled fast-port connection and a gRPC channel across the stop
        let client = crate::client::Client::connect(&addrs.grpc.to_string(), Default::default())
            .await
            .unwrap();
        assert!(client.uses_fast_port());
        let _held = tokio::net::TcpStream::connect(fast).await.unwrap();
        assert_eq!(leader.fast_port(), u32::from(fast.port()));

        let t0 = Instant::now();
        cancel.cancel();
        tokio::time::timeout(Duration::from_secs(3), serving)
            .await
            .expect("serve returns within 3 s of the cancel")
            .unwrap()
            .unwrap();
        assert!(t0.elapsed() < Duration::from_secs(3));
        assert_eq!(leader.readiness().get(), Readiness::Stopping);
        assert_eq!(leader.fast_port(), 0);
        for addr in [addrs.grpc, fast, addrs.metrics.unwrap()] {
            assert!(
                tokio::net::TcpStream::connect(addr).await.is_err(),
                "{addr} still accepts"
            );
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_taken_port_names_its_flag() {
        let taken = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let cfg = LeaderConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            fast_listen: Some(crate::flags::FastListen::At(taken.local_addr().unwrap())),
            ..Default::default()
        };
        let e = LeaderListeners::bind(&cfg).await.unwrap_err();
        assert!(
            e.to_string().starts_with("cannot listen on --fast-listen 127.0.0.1:"),
            "{e}"
        );
    }
}
