//! The leader: metadata only. It mounts members' segments, places values, runs the two-phase put,
//! grants read leases, keeps the tenant ledger and quota, evicts, and unmounts silent members.
//! Bytes never pass through it.
//!
//! Map: `config` (the flags, [`LeaderConfig`]), `serve` (binding, serving until cancelled,
//! housekeeping), `state` (the lock-protected tables and engine operations), `put` (the two-phase put), `calls` (each
//! `Store` call, shared by both faces), `service` (the gRPC faces), `front` (what a gRPC call shows before its body is read), `fastport` (the framed
//! metadata port), `ledger` (tenant validation, grants), `tenants` (the ledger applied),
//! `status` (read-outs), `adoption` (a new term takes over what its members hold), `blocks` (KV events: `WatchBlocks`), `objects` (per-value and per-tenant records), `clients` (each caller's counters), `placement` (free space,
//! segment choice), `eviction`, `tiered` (members' disk tiers: copies, loads, adoption), `members` (mount, heartbeat, liveness), `notices` (what each member must be told), `metrics` (the collector).

mod adoption;
pub mod blocks;
pub mod calls;
pub mod clients;
mod config;
mod eviction;
pub mod fastport;
pub mod front;
pub mod grpc;
mod index;
pub mod ledger;
mod members;
mod metrics;
mod mounted;
pub mod notices;
pub mod objects;
pub mod placement;
mod put;
mod serve;
pub mod state;
mod status;
mod tenant;
mod tenants;
mod term;
#[cfg(test)]
mod tests;
mod tiered;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use parking_lot::Mutex;

pub use adoption::{LEDGER_WAIT, PageTurn, Vouching};

/// The longest a page of a member's report that came before the pages preceding it waits for
/// them.
pub const EARLY_PAGE_WAIT: std::time::Duration = std::time::Duration::from_secs(30);
pub use config::{ELECTION_TIMINGS, Election, LeaderConfig, TierReads};
pub use placement::AllocationStrategy;
pub use serve::{LeaderAddrs, LeaderListeners};
pub use state::State;
pub use term::Gate;

use crate::flags::ConfigError;
use crate::readiness::ReadinessHandle;

/// A leader's shared handle: its state, its readiness, and the fast port it serves.
#[derive(Debug, Clone)]
pub struct Leader {
    state: Arc<Mutex<State>>,
    readiness: ReadinessHandle,
    fast_port: Arc<AtomicU32>,
    /// whether it may serve now (the election's deadline; `term.rs`)
    gate: Arc<Gate>,
    /// the gRPC address it is bound to, once bound
    bound: Arc<Mutex<Option<std::net::SocketAddr>>>,
    /// the tokens the Control and Membership APIs take (`auth.rs`), when configured
    tokens: Arc<Tokens>,
    /// told each time a page of a member's report is adopted: a page that came early waits on it
    pages: Arc<tokio::sync::Notify>,
}

/// What the leader's own APIs check callers with, and the key it seals committed values with.
#[derive(Debug)]
pub struct Tokens {
    pub control: Option<crate::auth::Expected>,
    pub member: Option<crate::auth::Expected>,
    /// what a scrape shows to see the per-tenant series (`--metrics-token-file`, else the Control
    /// token's)
    pub metrics: Option<crate::auth::Expected>,
    /// `--seal-key-file`'s key, else one of this process's own (`grant.rs`)
    pub seal: Arc<crate::grant::SealKey>,
}

impl Leader {
    /// A leader in [`Readiness::Starting`](crate::readiness::Readiness::Starting) with the
    /// config's initial ledger (`--tenant`), after [`LeaderConfig::validate`].
    pub fn new(cfg: LeaderConfig) -> Result<Self, ConfigError> {
        cfg.validate()?;
        let tokens = Tokens {
            control: crate::auth::Expected::load(
                cfg.control_token_file.as_ref(),
                "the Control API",
                "--control-token-file",
            )
            .map_err(|e| ConfigError::new("control-token-file", e))?,
            member: crate::auth::Expected::load(
                cfg.member_token_file.as_ref(),
                "the Membership API",
                "--member-token-file",
            )
            .map_err(|e| ConfigError::new("member-token-file", e))?,
            metrics: crate::auth::Expected::load(
                cfg.metrics_token_file.as_ref().or(cfg.control_token_file.as_ref()),
                "the leader's per-tenant metrics",
                if cfg.metrics_token_file.is_some() {
                    "--metrics-token-file"
                } else {
                    "--control-token-file"
                },
            )
            .map_err(|e| ConfigError::new("metrics-token-file", e))?,
            seal: Arc::new(match &cfg.seal_key_file {
                Some(p) => crate::grant::SealKey::from_secret(
                    crate::auth::read_token(p)
                        .map_err(|e| ConfigError::new("seal-key-file", e))?
                        .as_bytes(),
                ),
                None => crate::grant::SealKey::generate(),
            }),
        };
        let tenants = cfg.tenants.clone();
        let mut state = State::new(cfg, tokens.seal.clone());
        if !tenants.is_empty() {
            state
                .set_tenants(&tenants, &[])
                .map_err(|e| ConfigError::new("tenant", e.to_string()))?;
        }
        Ok(Self {
            state: Arc::new(Mutex::new(state)),
            readiness: ReadinessHandle::new(),
            fast_port: Arc::new(AtomicU32::new(0)),
            gate: Arc::new(Gate::default()),
            bound: Arc::default(),
            tokens: Arc::new(tokens),
            pages: Arc::default(),
        })
    }

    /// Refuses a Control call without the controllers' token (when one is configured).
    pub fn check_control(&self, metadata: &tonic::metadata::MetadataMap) -> crate::error::Result<()> {
        self.tokens.control.as_ref().map_or(Ok(()), |t| t.check(metadata))
    }

    /// Refuses a Membership call without the member token (when one is configured).
    pub fn check_member(&self, metadata: &tonic::metadata::MetadataMap) -> crate::error::Result<()> {
        self.tokens.member.as_ref().map_or(Ok(()), |t| t.check(metadata))
    }

    /// Runs `f` on the locked state.
    pub fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        f(&mut self.state.lock())
    }

    /// Runs `f` on the locked state if this leader serves now (`NOT_SERVING` otherwise): every
    /// call that reads or changes the metadata goes through here.
    pub fn serving<R>(&self, f: impl FnOnce(&mut State) -> crate::error::Result<R>) -> crate::error::Result<R> {
        let mut s = self.state.lock();
        self.gate.check()?;
        f(&mut s)
    }

    /// Runs `f`, a page of a member's report, under [`Leader::serving`] once the pages before it
    /// are adopted: a page that came early waits for the leader to adopt another, at most
    /// [`EARLY_PAGE_WAIT`] in all (its member mounts again when the pages before it are lost).
    pub async fn in_report_order<R>(
        &self,
        mut f: impl FnMut(&mut State) -> crate::error::Result<adoption::PageTurn<R>>,
    ) -> crate::error::Result<R> {
        let deadline = tokio::time::Instant::now() + EARLY_PAGE_WAIT;
        loop {
            let adopted = self.pages.notified();
            tokio::pin!(adopted);
            adopted.as_mut().enable();
            match self.serving(&mut f)? {
                adoption::PageTurn::Adopted(r) => {
                    self.pages.notify_waiters();
                    return Ok(r);
                }
                adoption::PageTurn::Early => {
                    if tokio::time::timeout_at(deadline, adopted).await.is_err() {
                        return Err(crate::error::StoreError::new(
                            crate::error::ErrorCode::StaleMount,
                            format!(
                                "the pages of the report before this one did not come within {} s; mount again \
                                 and report from the start",
                                EARLY_PAGE_WAIT.as_secs()
                            ),
                        ));
                    }
                }
            }
        }
    }

    /// Whether it serves now: ready, and (under an election) holding the Lease.
    pub fn is_serving(&self) -> bool {
        self.readiness.is_serving() && self.gate.is_open()
    }

    /// The epoch it serves (or last served) under.
    pub fn epoch(&self) -> u64 {
        self.with(|s| s.epoch)
    }

    /// The identity it campaigns as: `--identity`, else its advertised gRPC address.
    pub fn identity(&self) -> String {
        let cfg = self.config();
        if let Some(i) = cfg.identity {
            return i;
        }
        match *self.bound.lock() {
            Some(a) => cfg.advertised(a),
            None => cfg.advertised(cfg.listen),
        }
    }

    /// This leader's readiness (`Health.serving`, `/readyz`); an election may drive it.
    pub fn readiness(&self) -> &ReadinessHandle {
        &self.readiness
    }

    /// The framed metadata port's number, 0 if none is served.
    pub fn fast_port(&self) -> u32 {
        self.fast_port.load(Ordering::Acquire)
    }

    /// The fast port clients are told: `--advertise-fast-port`, else the one served (0: none).
    pub fn advertised_fast_port(&self) -> u32 {
        match (self.fast_port(), self.with(|s| s.cfg.advertise_fast_port)) {
            (0, _) => 0,
            (_, Some(p)) => u32::from(p),
            (p, None) => p,
        }
    }

    /// A copy of the configuration it runs with.
    pub fn config(&self) -> LeaderConfig {
        self.with(|s| s.cfg.clone())
    }
}
