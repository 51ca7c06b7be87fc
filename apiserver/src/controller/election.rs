//! Which replica runs the controllers: a Lease (`coordination.k8s.io/v1`, `kube-system/
//! kvcache-controller`) kept in the server's own storage, campaigned for as client-go's leader
//! election does. Every write is a compare-and-swap on the record's revision; a holder's record is
//! judged expired on the local clock, from when this replica last saw it *change* (never from the
//! remote `renewTime`); a leader that cannot renew within the renew deadline stops leading before
//! the lease can run out; a leader that stops gracefully releases the Lease.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use tokio::sync::watch;

use crate::storage::{Compare, Op, Storage, Txn, TxnOutcome};

/// Where the Lease is stored (the key a served Lease of that name would have).
pub const KEY: &str = "/registry/coordination.k8s.io/leases/kube-system/kvcache-controller";

/// The campaign's timings.
#[derive(Clone, Debug)]
pub struct ElectionOptions {
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

impl ElectionOptions {
    /// client-go's defaults: 15 s lease, 10 s renew deadline, 2 s retry.
    pub fn new(identity: impl Into<String>) -> ElectionOptions {
        ElectionOptions {
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

fn now() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

fn record(identity: &str, lease: Duration, transitions: i32, acquired: Option<MicroTime>) -> Vec<u8> {
    let l = Lease {
        metadata: ObjectMeta {
            name: Some("kvcache-controller".into()),
            namespace: Some("kube-system".into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(identity.to_owned()),
            lease_duration_seconds: Some(i32::try_from(lease.as_secs()).unwrap_or(i32::MAX)),
            acquire_time: acquired.or_else(|| Some(now())),
            renew_time: Some(now()),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }),
    };
    let mut v = serde_json::to_value(&l).unwrap_or_default();
    v["apiVersion"] = "coordination.k8s.io/v1".into();
    v["kind"] = "Lease".into();
    serde_json::to_vec(&v).unwrap_or_default()
}

async fn cas(storage: &Arc<dyn Storage>, revision: u64, value: Vec<u8>) -> bool {
    let txn = Txn {
        compares: vec![Compare::ModRevision {
            key: KEY.into(),
            revision,
        }],
        ops: vec![Op::Put {
            key: KEY.into(),
            value: value.into(),
        }],
    };
    matches!(storage.txn(txn).await, Ok(TxnOutcome::Committed { .. }))
}

/// Campaigns until `stop` turns true, telling `leading` whether this replica leads; releases the
/// Lease when it stops while leading.
pub async fn campaign(
    storage: Arc<dyn Storage>,
    opts: ElectionOptions,
    leading: watch::Sender<bool>,
    mut stop: watch::Receiver<bool>,
) {
    // The record as last seen (revision) and when it was first seen so, on our clock.
    let mut seen: Option<(u64, Instant)> = None;
    let mut renewed: Option<Instant> = None;
    loop {
        let current = storage.get(KEY).await;
        let is_leader = *leading.borrow();
        match current {
            Ok(None) => {
                if cas(&storage, 0, record(&opts.identity, opts.lease_duration, 0, None)).await {
                    renewed = Some(Instant::now());
                    tracing::info!(identity = %opts.identity, "acquired the controllers' Lease");
                    leading.send_replace(true);
                }
            }
            Ok(Some(kv)) => {
                let lease: Option<Lease> = serde_json::from_slice(&kv.value).ok();
                let spec = lease.and_then(|l| l.spec).unwrap_or_default();
                let holder = spec.holder_identity.unwrap_or_default();
                let transitions = spec.lease_transitions.unwrap_or(0);
                if seen.is_none_or(|(r, _)| r != kv.mod_revision) {
                    seen = Some((kv.mod_revision, Instant::now()));
                }
                let expired = holder.is_empty() || seen.is_some_and(|(_, at)| at.elapsed() > opts.lease_duration);
                if holder == opts.identity {
                    let value = record(&opts.identity, opts.lease_duration, transitions, spec.acquire_time);
                    if cas(&storage, kv.mod_revision, value).await {
                        renewed = Some(Instant::now());
                        leading.send_replace(true);
                    }
                } else if expired {
                    let value = record(&opts.identity, opts.lease_duration, transitions + 1, None);
                    if cas(&storage, kv.mod_revision, value).await {
                        renewed = Some(Instant::now());
                        tracing::info!(identity = %opts.identity, previous = %holder, "took over the controllers' Lease");
                        leading.send_replace(true);
                    }
                } else if is_leader {
                    tracing::warn!(identity = %opts.identity, holder = %holder, "another replica holds the controllers' Lease");
                    leading.send_replace(false);
                }
            }
            Err(e) => tracing::warn!("reading the controllers' Lease failed: {e}"),
        }
        // Stop leading before the lease can run out for the others.
        let leads = *leading.borrow();
        if leads && renewed.is_none_or(|r| r.elapsed() > opts.renew_deadline) {
            tracing::warn!(identity = %opts.identity, "could not renew the controllers' Lease in time; stepping down");
            leading.send_replace(false);
        }
        tokio::select! {
            () = tokio::time::sleep(opts.retry_period) => {}
            () = async { let _ = stop.wait_for(|s| *s).await; } => {
                let was_leading = *leading.borrow();
                if was_leading {
                    release(&storage, &opts).await;
                    leading.send_replace(false);
                }
                return;
            }
        }
    }
}

/// Gives the Lease up (an empty holder), so another replica takes over at once.
async fn release(storage: &Arc<dyn Storage>, opts: &ElectionOptions) {
    let Ok(Some(kv)) = storage.get(KEY).await else { return };
    let lease: Option<Lease> = serde_json::from_slice(&kv.value).ok();
    let spec = lease.and_then(|l| l.spec).unwrap_or_default();
    if spec.holder_identity.as_deref() != Some(opts.identity.as_str()) {
        return;
    }
    let mut v: serde_json::Value = serde_json::from_slice(&kv.value).unwrap_or_default();
    v["spec"]["holderIdentity"] = "".into();
    if cas(storage, kv.mod_revision, serde_json::to_vec(&v).unwrap_or_default()).await {
        tracing::info!(identity = %opts.identity, "released the controllers' Lease");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::embedded::Embedded;

    /// Short enough for a test, with a renew deadline a loaded machine still meets.
    fn fast(id: &str) -> ElectionOptions {
        ElectionOptions {
            identity: id.into(),
            lease_duration: Duration::from_secs(4),
            renew_deadline: Duration::from_secs(3),
            retry_period: Duration::from_millis(100),
        }
    }

    async fn until(rx: &mut watch::Receiver<bool>, want: bool) {
        tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|l| *l == want))
            .await
            .expect("the election did not settle")
            .unwrap();
    }

    #[tokio::test]
    async fn one_leads_and_the_other_takes_over_when_it_stops() {
        let dir = tempfile::tempdir().unwrap();
        let storage: Arc<dyn Storage> = Arc::new(Embedded::open(dir.path(), Default::default()).unwrap());
        let (a_lead, mut a_rx) = watch::channel(false);
        let (b_lead, mut b_rx) = watch::channel(false);
        let (a_stop, a_stop_rx) = watch::channel(false);
        let (_b_stop, b_stop_rx) = watch::channel(false);
        let a = tokio::spawn(campaign(storage.clone(), fast("a"), a_lead, a_stop_rx));
        until(&mut a_rx, true).await;
        tokio::spawn(campaign(storage.clone(), fast("b"), b_lead, b_stop_rx));
        // B has seen A's Lease renewed (A's record moved on) while it stayed a follower.
        let first = storage.get(KEY).await.unwrap().unwrap().mod_revision;
        tokio::time::timeout(Duration::from_secs(10), async {
            while storage.get(KEY).await.unwrap().unwrap().mod_revision < first + 3 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("A renews its Lease");
        assert!(*a_rx.borrow() && !*b_rx.borrow(), "exactly one leads");
        // A stops gracefully: it releases, and B leads without waiting out the lease.
        a_stop.send_replace(true);
        a.await.unwrap();
        assert!(!*a_rx.borrow());
        until(&mut b_rx, true).await;
        let kv = storage.get(KEY).await.unwrap().unwrap();
        let lease: Lease = serde_json::from_slice(&kv.value).unwrap();
        let spec = lease.spec.unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some("b"));
        assert_eq!(spec.lease_transitions, Some(1));
    }
}
