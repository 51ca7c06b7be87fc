//! Leader election through a Kubernetes `coordination.k8s.io/v1` Lease, campaigned for the way
//! client-go's `leaderelection` package does, with the term number exposed as a fencing epoch.
//!
//! - Every write is a compare-and-swap on the Lease's `resourceVersion` ([`LeaseStore::update`]).
//! - A holder's record counts as expired on *this* process's clock: `leaseDurationSeconds` after
//!   the moment this candidate last saw the record change, never from the remote `renewTime`.
//! - The holder renews every retry period and reports each renewal with a deadline, `renew
//!   deadline` after the renewal was *sent*; it must stop serving at that deadline unless a later
//!   renewal extends it. Since the others can take over only a whole lease duration after they
//!   saw that renewal, a holder that cannot renew (paused, partitioned, its API gone) has stopped
//!   serving `lease duration − renew deadline` before anyone else can start.
//! - `leaseTransitions` is the term: it rises by one on every change of holder, and the holder
//!   serves under it as its epoch ([`Event::Elected`]). Members refuse ranges of an older epoch.
//! - The identity is the holder's address, so a record under this candidate's own identity that
//!   it did not write in this process was left by an earlier process at the same address: it is
//!   another holder's record, waited out like any other and taken over in a new term.
//! - A holder that stops gracefully releases the Lease (an empty holder), so a standby takes
//!   over at once instead of waiting out the lease.
//! - Standbys also wake on a change hint ([`LeaseStore::changed`], a watch where the API serves
//!   one), so a release is noticed within milliseconds; the hint never decides anything.
//!
//! [`campaign`] is the loop; [`kube::KubeLeases`] is the store over a real Lease API (our own
//! server in direct mode, kube-apiserver in a cluster).

pub mod kube;
#[cfg(test)]
pub(crate) mod memory;

use std::time::{Duration, Instant};

use async_trait::async_trait;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use tokio_util::sync::CancellationToken;

/// Why a Lease read or write failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeaseError {
    /// Another write came first (409: the resourceVersion moved on, or the Lease exists).
    #[error("the Lease changed under this write")]
    Conflict,
    #[error("{0}")]
    Other(String),
}

/// One Lease, read and written with compare-and-swap.
#[async_trait]
pub trait LeaseStore: Send + Sync {
    /// The Lease, or `None` when there is none.
    async fn get(&self) -> Result<Option<Lease>, LeaseError>;
    /// Creates the Lease; [`LeaseError::Conflict`] when it exists.
    async fn create(&self, lease: Lease) -> Result<Lease, LeaseError>;
    /// Replaces the Lease if its `metadata.resourceVersion` is still the stored one.
    async fn update(&self, lease: Lease) -> Result<Lease, LeaseError>;
    /// Resolves when the Lease may have changed. Only a hint: it may fire for nothing, and a
    /// store without one never fires (the campaign polls every retry period anyway).
    async fn changed(&self) {
        std::future::pending::<()>().await;
    }
}

/// The campaign's timings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timings {
    /// How long a record is honoured after it last changed; written as whole seconds
    /// (`leaseDurationSeconds`), so at least 1 s.
    pub lease_duration: Duration,
    /// How long a holder serves after a renewal was sent; shorter than the lease.
    pub renew_deadline: Duration,
    /// Time between attempts (and between a holder's renewals).
    pub retry_period: Duration,
}

impl Timings {
    /// client-go's defaults: 15 s, 10 s, 2 s.
    pub const CLIENT_GO: Timings = Timings {
        lease_duration: Duration::from_secs(15),
        renew_deadline: Duration::from_secs(10),
        retry_period: Duration::from_secs(2),
    };

    /// The checks client-go makes, each saying what to change.
    pub fn validate(&self) -> Result<(), String> {
        if self.lease_duration < Duration::from_secs(1) || self.lease_duration.subsec_nanos() != 0 {
            return Err("the lease duration must be a whole number of seconds, at least 1s".into());
        }
        if self.renew_deadline >= self.lease_duration {
            return Err("the renew deadline must be shorter than the lease duration".into());
        }
        if self.retry_period.is_zero() || self.retry_period >= self.renew_deadline {
            return Err("the retry period must be longer than 0 and shorter than the renew deadline".into());
        }
        Ok(())
    }

    fn lease_seconds(&self) -> i32 {
        i32::try_from(self.lease_duration.as_secs()).unwrap_or(i32::MAX)
    }
}

/// What a candidate learns about its own leadership.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// It holds the Lease in a new term: serve under `epoch` until `until` (unless renewed).
    Elected { epoch: u64, until: Instant },
    /// It renewed: serve until `until`.
    Renewed { until: Instant },
    /// It no longer leads (another holds the Lease, renewal failed past the deadline, or it is
    /// stopping): stop serving now.
    Deposed,
}

fn now_micro() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

fn spec_of(l: &Lease) -> LeaseSpec {
    l.spec.clone().unwrap_or_default()
}

/// The holder of a Lease, if it names one.
pub fn holder(l: &Lease) -> Option<String> {
    spec_of(l).holder_identity.filter(|h| !h.is_empty())
}

/// Campaigns as `identity` until `stop` fires, reporting every change of its leadership to
/// `on`; a holder that stops reports [`Event::Deposed`] first, then releases the Lease.
pub async fn campaign(
    store: &dyn LeaseStore,
    name: &str,
    identity: &str,
    timings: Timings,
    mut on: impl FnMut(Event) + Send,
    stop: CancellationToken,
) {
    let mut c = Candidate {
        name,
        identity,
        timings,
        observed: None,
        term: None,
        renewed: None,
        transitions_seen: -1,
    };
    loop {
        let sent = Instant::now();
        let attempt = tokio::select! {
            r = tokio::time::timeout(timings.renew_deadline, c.try_acquire_or_renew(store)) => r,
            () = stop.cancelled() => Ok(Err(LeaseError::Other("stopping".into()))),
        };
        if stop.is_cancelled() {
            break;
        }
        match attempt {
            Ok(Ok(Some(epoch))) => {
                let until = sent + timings.renew_deadline;
                if c.term == Some(epoch) {
                    on(Event::Renewed { until });
                } else {
                    tracing::info!(lease = name, identity, epoch, "elected");
                    on(Event::Elected { epoch, until });
                }
                c.term = Some(epoch);
                c.renewed = Some(sent);
            }
            Ok(Ok(None)) => {
                if c.term.take().is_some() {
                    tracing::warn!(
                        lease = name,
                        identity,
                        "another candidate holds the Lease; stepping down"
                    );
                    on(Event::Deposed);
                }
            }
            Ok(Err(e)) => c.failed(&mut on, &e.to_string()),
            Err(_) => c.failed(&mut on, "the Lease API did not answer in time"),
        }
        let pause = c.pause(Instant::now());
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = store.changed(), if c.term.is_none() => {}
            () = stop.cancelled() => break,
        }
    }
    if c.term.take().is_some() {
        on(Event::Deposed);
        release(store, identity).await;
    }
}

/// The campaign's memory between attempts.
struct Candidate<'a> {
    name: &'a str,
    identity: &'a str,
    timings: Timings,
    /// The record's resourceVersion as last seen, when it was first seen so (local clock), and
    /// the lease duration it declared.
    observed: Option<(String, Instant, Duration)>,
    /// The epoch this candidate serves under, while it leads.
    term: Option<u64>,
    /// When the last successful renewal was sent.
    renewed: Option<Instant>,
    /// The highest `leaseTransitions` seen, so a re-created Lease never reuses an epoch this
    /// candidate knows of.
    transitions_seen: i32,
}

impl Candidate<'_> {
    /// One attempt: `Some(epoch)` when this candidate holds the Lease afterwards, `None` when
    /// another does.
    async fn try_acquire_or_renew(&mut self, store: &dyn LeaseStore) -> Result<Option<u64>, LeaseError> {
        let Some(current) = store.get().await? else {
            let transitions = self.transitions_seen + 1;
            let created = store.create(self.record(None, transitions, None)).await?;
            self.observe(&created, Instant::now());
            return Ok(Some(u64::try_from(transitions).unwrap_or(0)));
        };
        // observed when the answer arrived: later, never earlier, than the change it shows
        self.observe(&current, Instant::now());
        let spec = spec_of(&current);
        let held_by = spec.holder_identity.clone().unwrap_or_default();
        let transitions = spec.lease_transitions.unwrap_or(0);
        self.transitions_seen = self.transitions_seen.max(transitions);
        // Ours only while this process holds the term: a record under our identity left by an
        // earlier process at this address is another holder's, waited out like any other and
        // taken over in a new term, so nothing that process handed out passes the fence (and a
        // standby, already campaigning, takes over first).
        let ours = held_by == self.identity && self.term.is_some();
        if !ours && !held_by.is_empty() && !self.expired(Instant::now()) {
            return Ok(None);
        }
        let (transitions, acquired) = if ours {
            (transitions, spec.acquire_time)
        } else {
            (transitions.saturating_add(1), None)
        };
        let rv = current.metadata.resource_version.clone();
        let updated = store.update(self.record(rv, transitions, acquired)).await?;
        self.observe(&updated, Instant::now());
        if !ours {
            tracing::info!(lease = self.name, previous = %held_by, transitions, "took over the Lease");
        }
        Ok(Some(u64::try_from(transitions).unwrap_or(0)))
    }

    /// Notes when the record last changed, on this clock.
    fn observe(&mut self, l: &Lease, now: Instant) {
        let rv = l.metadata.resource_version.clone().unwrap_or_default();
        let secs = spec_of(l).lease_duration_seconds.unwrap_or(0).max(0);
        let declared = Duration::from_secs(u64::try_from(secs).unwrap_or(0));
        if self.observed.as_ref().is_none_or(|(seen, _, _)| *seen != rv) {
            self.observed = Some((rv, now, declared));
        }
    }

    fn expired(&self, now: Instant) -> bool {
        self.observed
            .as_ref()
            .is_none_or(|(_, at, declared)| now >= *at + *declared)
    }

    fn record(&self, resource_version: Option<String>, transitions: i32, acquired: Option<MicroTime>) -> Lease {
        let now = now_micro();
        let mut l = Lease {
            spec: Some(LeaseSpec {
                holder_identity: Some(self.identity.to_owned()),
                lease_duration_seconds: Some(self.timings.lease_seconds()),
                acquire_time: Some(acquired.unwrap_or_else(|| now.clone())),
                renew_time: Some(now),
                lease_transitions: Some(transitions),
                ..LeaseSpec::default()
            }),
            ..Lease::default()
        };
        l.metadata.name = Some(self.name.to_owned());
        l.metadata.resource_version = resource_version;
        l
    }

    /// A failed attempt: a holder keeps its term until the renew deadline has passed since its
    /// last renewal (the gate it was given closes by itself at that moment).
    fn failed(&mut self, on: &mut (impl FnMut(Event) + Send), why: &str) {
        let Some(epoch) = self.term else {
            tracing::debug!(lease = self.name, "campaign attempt failed: {why}");
            return;
        };
        let late = self.renewed.is_none_or(|r| r.elapsed() >= self.timings.renew_deadline);
        tracing::warn!(lease = self.name, epoch, "renewing the Lease failed: {why}");
        if late {
            tracing::warn!(
                lease = self.name,
                epoch,
                "could not renew within the renew deadline; stepping down"
            );
            self.term = None;
            on(Event::Deposed);
        }
    }

    /// How long to wait before the next attempt: a holder renews every retry period; a standby
    /// tries again after the retry period, or at the moment the holder's record expires if
    /// that comes first.
    fn pause(&self, now: Instant) -> Duration {
        let retry = self.timings.retry_period;
        if self.term.is_some() {
            return retry;
        }
        match &self.observed {
            Some((_, at, declared)) => (*at + *declared).saturating_duration_since(now).min(retry),
            None => retry,
        }
    }
}

/// Gives the Lease up: an empty holder and a one-second duration, the term kept, so the next
/// holder's term is one higher.
async fn release(store: &dyn LeaseStore, identity: &str) {
    let Ok(Some(mut l)) = store.get().await else { return };
    let mut spec = spec_of(&l);
    if spec.holder_identity.as_deref() != Some(identity) {
        return;
    }
    spec.holder_identity = Some(String::new());
    spec.lease_duration_seconds = Some(1);
    spec.renew_time = Some(now_micro());
    l.spec = Some(spec);
    match store.update(l).await {
        Ok(_) => tracing::info!(identity, "released the Lease"),
        Err(e) => tracing::warn!(identity, "releasing the Lease failed: {e}"),
    }
}

#[cfg(test)]
mod tests;
