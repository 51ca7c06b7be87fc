//! The leader's term: whether it may serve right now, and under which epoch.
//!
//! [`Gate`] is checked under the state lock by every call that reads or changes the metadata
//! (engine calls on both faces, mounts, heartbeats, the ledger). It holds a deadline on the
//! monotonic clock: without an election it is open for good once the leader serves; with one it
//! is open until the deadline of the last renewal (`election.rs`), so a leader that was paused
//! or cut off stops answering at that moment by itself, before the task that would notice runs.
//!
//! [`Leader::run_election`] drives the campaign: elected → a fresh state under the new epoch,
//! the gate opened, readiness `Serving`; renewed → the gate extended; deposed → the gate shut,
//! a fresh state (a deposed leader's knowledge is stale), readiness `Standby`.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use tokio_util::sync::CancellationToken;

use super::{Leader, State};
use crate::election::{self, Event};
use crate::error::{ErrorCode, Result, StoreError};
use crate::readiness::Readiness;

/// The process's reference instant for deadlines kept in atomics.
fn base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

fn nanos(at: Instant) -> u64 {
    u64::try_from(at.saturating_duration_since(base()).as_nanos()).unwrap_or(u64::MAX - 1)
}

/// Until when this leader may serve (0: not now; `u64::MAX`: for good).
#[derive(Debug, Default)]
pub struct Gate {
    until: AtomicU64,
}

impl Gate {
    /// Open for good (no election).
    pub fn open(&self) {
        self.until.store(u64::MAX, Ordering::Release);
    }

    /// Open until `at`.
    pub fn open_until(&self, at: Instant) {
        self.until.store(nanos(at).max(1), Ordering::Release);
    }

    pub fn shut(&self) {
        self.until.store(0, Ordering::Release);
    }

    pub fn is_open(&self) -> bool {
        let until = self.until.load(Ordering::Acquire);
        until == u64::MAX || (until != 0 && nanos(Instant::now()) < until)
    }

    /// `NOT_SERVING` unless open.
    pub fn check(&self) -> Result<()> {
        if self.is_open() {
            return Ok(());
        }
        Err(StoreError::new(
            ErrorCode::NotServing,
            "this leader is not serving (a standby, or a leader whose Lease lapsed); reach the store through the \
             backend's Client endpoint, which leads to the serving leader",
        ))
    }
}

impl Leader {
    /// Starts a new term: a fresh state (the initial `--tenant` ledger, no members, no objects)
    /// under `epoch`.
    fn fresh_state(&self, epoch: u64) {
        let cfg = self.config();
        let tenants = cfg.tenants.clone();
        let mut s = State::new(cfg, self.tokens.seal.clone());
        if !tenants.is_empty() {
            // checked when the leader was made
            let _ = s.set_tenants(&tenants, &[]);
        }
        s.epoch = epoch;
        self.with(|st| *st = s);
    }

    /// Campaigns for `--lease` until `stop` fires, serving only while it holds it; releases the
    /// Lease on the way out (after it stopped serving).
    pub(super) async fn run_election(self, stop: CancellationToken) {
        let cfg = self.config();
        let Some(at) = cfg.lease_ref() else { return };
        let identity = cfg.identity.clone().unwrap_or_else(|| self.identity());
        let client = loop {
            match election::kube::client(cfg.kubeconfig.as_deref()).await {
                Ok(c) => break c,
                Err(e) => {
                    tracing::warn!(lease = %at, "cannot reach the Lease API, retrying: {e}");
                    tokio::select! {
                        () = tokio::time::sleep(cfg.retry_period) => {}
                        () = stop.cancelled() => return,
                    }
                }
            }
        };
        let leases = election::kube::KubeLeases::new(client, at.clone());
        self.campaign(&leases, &at.name, &identity, stop).await;
    }

    /// Campaigns on `leases` until `stop` fires; every change of leadership is applied here.
    pub(super) async fn campaign(
        self,
        leases: &dyn election::LeaseStore,
        name: &str,
        identity: &str,
        stop: CancellationToken,
    ) {
        let timings = self.config().timings();
        self.readiness.set(Readiness::Standby);
        let me = self.clone();
        let on = move |e: Event| match e {
            Event::Elected { epoch, until } => {
                me.fresh_state(epoch);
                me.gate.open_until(until);
                me.readiness.set(Readiness::Serving);
                tracing::info!(epoch, "serving: this leader holds the Lease");
            }
            Event::Renewed { until } => me.gate.open_until(until),
            Event::Deposed => {
                me.gate.shut();
                let epoch = me.with(|s| s.epoch);
                me.fresh_state(epoch);
                me.readiness.set(Readiness::Standby);
                tracing::warn!(epoch, "standing by: this leader no longer holds the Lease");
            }
        };
        election::campaign(leases, name, identity, timings, on, stop).await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::election::memory::Memory;
    use crate::leader::{Election, LeaderConfig, calls};
    use crate::proto::{MountRequest, PutStartRequest, Scope};

    fn put(l: &Leader) -> crate::error::Result<crate::proto::PutStartResponse> {
        let r = PutStartRequest {
            scope: Some(Scope {
                tenant: "t".into(),
                block_size: 16,
                dtype: "bf16".into(),
                ..Default::default()
            }),
            key: "k".into(),
            size: 64,
        };
        calls::put_start(l, r, Instant::now())
    }

    async fn until(what: &str, f: impl Fn() -> bool) {
        crate::eventually::eventually_async(Duration::from_secs(10), what, || std::future::ready(f())).await
    }

    /// A leader serves only in its term, under its epoch, and starts every term empty.
    #[tokio::test]
    async fn a_leader_serves_only_while_it_holds_the_lease() {
        let cfg = LeaderConfig {
            election: Election::Kubernetes,
            election_lease: Some("ns/b-leader".into()),
            tenants: vec![crate::flags::parse_tenant("t=1Mi:16:bf16").unwrap()],
            lease_duration: Duration::from_secs(1),
            renew_deadline: Duration::from_millis(600),
            retry_period: Duration::from_millis(50),
            ..Default::default()
        };
        let leader = Leader::new(cfg).unwrap();
        assert_eq!(
            put(&leader).unwrap_err().code,
            ErrorCode::NotServing,
            "not before it campaigns"
        );
        // another holder first: this leader stands by
        let leases = Arc::new(Memory::default());
        let stop_other = CancellationToken::new();
        let other = tokio::spawn({
            let (leases, stop) = (leases.clone(), stop_other.clone());
            async move {
                crate::election::campaign(
                    &*leases,
                    "b-leader",
                    "other",
                    crate::election::Timings {
                        lease_duration: Duration::from_secs(1),
                        renew_deadline: Duration::from_millis(600),
                        retry_period: Duration::from_millis(50),
                    },
                    |_| {},
                    stop,
                )
                .await;
            }
        });
        until("the other holds the Lease", || leases.stored().is_some()).await;
        let stop = CancellationToken::new();
        let task = tokio::spawn({
            let (l, leases, stop) = (leader.clone(), leases.clone(), stop.clone());
            async move { l.campaign(&*leases, "b-leader", "me", stop).await }
        });
        until("standby", || leader.readiness().get() == Readiness::Standby).await;
        assert_eq!(put(&leader).unwrap_err().code, ErrorCode::NotServing);
        let mount = MountRequest {
            name: "m".into(),
            data_addr: "127.0.0.1:1".into(),
            grpc_addr: "127.0.0.1:2".into(),
            capacity: 1 << 20,
            mount_id: 7,
            instance_id: 1,
            local_addr: String::new(),
            holdings: Vec::new(),
            ..Default::default()
        };
        assert_eq!(
            leader.serving(|s| s.mount(&mount, Instant::now())).unwrap_err().code,
            ErrorCode::NotServing,
            "a standby takes no mounts"
        );
        // the other stops (and releases): this one serves in the next term
        stop_other.cancel();
        other.await.unwrap();
        until("serving", || leader.is_serving()).await;
        assert_eq!(leader.epoch(), 1);
        let m = leader.serving(|s| s.mount(&mount, Instant::now())).unwrap();
        assert_eq!(m.epoch, 1, "a mount answer carries the epoch");
        let placed = put(&leader).unwrap();
        assert_eq!(placed.location.unwrap().epoch, 1, "every range carries the epoch");
        // it stops: deposed first (the gate shuts), then the Lease is released
        stop.cancel();
        task.await.unwrap();
        assert!(!leader.gate.is_open());
        assert_eq!(put(&leader).unwrap_err().code, ErrorCode::NotServing);
        let spec = leases.stored().unwrap().spec.unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some(""), "released");
        assert_eq!(
            leader.with(|s| s.members.len()),
            0,
            "a deposed leader forgets its members"
        );
    }

    #[test]
    fn the_gate_closes_at_its_deadline_by_itself() {
        let g = Gate::default();
        assert!(!g.is_open(), "shut until told");
        assert_eq!(g.check().unwrap_err().code, ErrorCode::NotServing);
        g.open_until(Instant::now() + Duration::from_secs(60));
        assert!(g.is_open());
        g.open_until(Instant::now());
        assert!(
            !g.is_open(),
            "at the renewal's deadline it is shut, with nobody shutting it"
        );
        g.open();
        assert!(g.is_open());
        g.shut();
        assert!(!g.is_open());
    }
}
