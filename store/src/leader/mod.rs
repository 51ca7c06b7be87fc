//! The leader: metadata only. It mounts members' segments, places values, runs the two-phase put,
//! grants read leases, keeps the tenant ledger and quota, evicts, and unmounts silent members.
//! Bytes never pass through it.
//!
//! Map: `state` (the lock-protected tables and engine operations), `ledger` (tenant validation,
//! grants), `tenants` (the ledger applied), `status` (read-outs), `objects` (per-value and
//! per-tenant records), `placement` (free space, segment choice), `eviction`, `members` (mount,
//! heartbeat, liveness), `service` (the gRPC faces), `fastport` (the framed metadata port),
//! `metrics` (the Prometheus text of this leader).

mod eviction;
pub mod fastport;
pub mod ledger;
mod members;
mod metrics;
pub mod objects;
pub mod placement;
mod service;
pub mod state;
mod status;
mod tenants;
#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio_util_shim::CancelOnDrop;

pub use placement::Strategy;
pub use state::State;

/// How a leader behaves.
#[derive(Debug, Clone)]
pub struct LeaderConfig {
    pub multi_tenancy: bool,
    /// the default tenant's layout when multi-tenancy is off (none: not checked)
    pub default_layout: Option<ledger::Layout>,
    pub strategy: Strategy,
    pub lease_ttl: Duration,
    pub member_ttl: Duration,
    /// how long a writer has to send the bytes of a reservation
    pub put_ttl: Duration,
    /// extra time before an abandoned reservation's space is reused
    pub put_grace: Duration,
    pub max_value_size: u64,
    pub high_watermark: f64,
    pub eviction_ratio: f64,
    pub eviction_interval: Duration,
    /// how long the metadata port keeps polling after a request (`spin.rs`); zero: never
    pub spin: Duration,
}

impl Default for LeaderConfig {
    fn default() -> Self {
        Self {
            multi_tenancy: true,
            default_layout: None,
            strategy: Strategy::FreeRatioFirst,
            lease_ttl: Duration::from_secs(10),
            member_ttl: Duration::from_secs(10),
            put_ttl: Duration::from_secs(30),
            put_grace: Duration::from_secs(30),
            max_value_size: 64 << 20,
            high_watermark: 0.90,
            eviction_ratio: 0.05,
            eviction_interval: Duration::from_millis(100),
            spin: crate::spin::DEFAULT_SPIN,
        }
    }
}

impl LeaderConfig {
    /// Members heartbeat a few times per TTL, at most once per second.
    pub fn heartbeat_interval(&self) -> Duration {
        (self.member_ttl / 4).clamp(Duration::from_millis(50), Duration::from_secs(1))
    }
}

/// A running leader's shared handle.
#[derive(Debug, Clone)]
pub struct Leader {
    state: Arc<Mutex<State>>,
    serving: Arc<AtomicBool>,
    fast_port: Arc<AtomicU32>,
}

impl Leader {
    pub fn new(cfg: LeaderConfig) -> Self {
        Self {
            state: Arc::new(Mutex::new(State::new(cfg))),
            serving: Arc::new(AtomicBool::new(false)),
            fast_port: Arc::new(AtomicU32::new(0)),
        }
    }

    /// Runs `f` on the locked state.
    pub fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        f(&mut self.state.lock())
    }

    pub fn serving(&self) -> bool {
        self.serving.load(Ordering::Acquire)
    }

    /// The framed metadata port's number, 0 if none is served.
    pub fn fast_port(&self) -> u32 {
        self.fast_port.load(Ordering::Acquire)
    }

    /// Serves gRPC on `listener` (and the framed metadata port on `fast`, if given) until the
    /// process ends, with the housekeeping loops (member liveness, reservation reaping, watermark
    /// eviction) running beside it.
    pub async fn serve(self, listener: TcpListener, fast: Option<TcpListener>) -> std::io::Result<()> {
        let _housekeeping = CancelOnDrop(tokio::spawn(self.clone().housekeeping()));
        let _fast = match fast {
            Some(l) => {
                self.fast_port
                    .store(u32::from(l.local_addr()?.port()), Ordering::Release);
                let hot = crate::spin::HotWindow::start(self.with(|s| s.cfg.spin));
                Some(CancelOnDrop(tokio::spawn(fastport::serve(l, self.clone(), hot))))
            }
            None => None,
        };
        let addr: SocketAddr = listener.local_addr()?;
        self.serving.store(true, Ordering::Release);
        tracing::info!(%addr, "leader serving");
        let result = service::router(self.clone())
            .serve_with_incoming(crate::net::incoming(listener))
            .await;
        self.serving.store(false, Ordering::Release);
        result.map_err(std::io::Error::other)
    }

    async fn housekeeping(self) {
        let interval = self.with(|s| s.cfg.eviction_interval);
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            let now = Instant::now();
            self.with(|s| {
                s.expire_members(now);
                s.reap_reservations(now);
                s.watermark_round(now);
            });
        }
    }

    /// The Prometheus text of this leader.
    pub fn metrics_text(&self) -> String {
        let serving = self.serving();
        self.with(|s| metrics::render(s, serving))
    }
}

mod tokio_util_shim {
    //! Aborts a background task when its owner goes away.
    #[derive(Debug)]
    pub struct CancelOnDrop<T>(pub tokio::task::JoinHandle<T>);
    impl<T> Drop for CancelOnDrop<T> {
        fn drop(&mut self) {
            self.0.abort();
        }
    }
}

impl crate::metrics::Source for Leader {
    fn metrics(&self) -> String {
        self.metrics_text()
    }

    fn ready(&self) -> bool {
        self.serving()
    }
}
