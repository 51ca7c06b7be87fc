//! Which replica runs the controllers: the Lease `kube-system/kvcache-controller`
//! (`coordination.k8s.io/v1`, served by this server like any Lease), campaigned for with the
//! store's election (`kvcache_store::election`: client-go's rules) over the served Lease functions
//! in this process. Every write is a compare-and-swap on the record's revision; a holder's record
//! is judged expired on the local clock, from when this replica last saw it *change*; a leader
//! that cannot renew within the renew deadline stops leading before the lease can run out; a
//! leader that stops gracefully releases the Lease.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::coordination::v1::Lease;
use kvcache_store::election::{Event, LeaseError, LeaseStore, Timings};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::leases::{self, LEASES};
use crate::storage::Storage;

/// Where the Lease is: `kube-system/kvcache-controller`, a served Lease like any other.
pub const NAMESPACE: &str = "kube-system";
pub const NAME: &str = "kvcache-controller";
/// Its storage key.
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
        let t = Timings::CLIENT_GO;
        ElectionOptions {
            identity: identity.into(),
            lease_duration: t.lease_duration,
            renew_deadline: t.renew_deadline,
            retry_period: t.retry_period,
        }
    }
}

/// The Lease through the same functions that serve `coordination.k8s.io/v1` Leases
/// ([`crate::leases`]), in this process: validation, system fields, compare-and-swap.
struct StoredLease {
    storage: Arc<dyn Storage>,
}

fn refused(r: crate::plain::Refusal) -> LeaseError {
    if r.0 == 409 {
        LeaseError::Conflict
    } else {
        LeaseError::Other(r.1.message.unwrap_or_default())
    }
}

fn typed(v: serde_json::Value) -> Result<Lease, LeaseError> {
    serde_json::from_value(v).map_err(|e| LeaseError::Other(format!("a stored Lease does not decode: {e}")))
}

fn untyped(l: &Lease) -> Result<serde_json::Value, LeaseError> {
    serde_json::to_value(l).map_err(|e| LeaseError::Other(e.to_string()))
}

#[async_trait]
impl LeaseStore for StoredLease {
    async fn get(&self) -> Result<Option<Lease>, LeaseError> {
        match LEASES.get(&self.storage, NAMESPACE, NAME).await {
            Ok(v) => typed(v).map(Some),
            Err(r) if r.0 == 404 => Ok(None),
            Err(r) => Err(refused(r)),
        }
    }

    async fn create(&self, lease: Lease) -> Result<Lease, LeaseError> {
        let v = leases::create(&self.storage, NAMESPACE, &untyped(&lease)?)
            .await
            .map_err(refused)?;
        typed(v)
    }

    async fn update(&self, lease: Lease) -> Result<Lease, LeaseError> {
        if lease.metadata.resource_version.is_none() {
            return Err(LeaseError::Other(
                "an update needs the resourceVersion it replaces".into(),
            ));
        }
        let (v, _) = leases::update(&self.storage, NAMESPACE, NAME, &untyped(&lease)?)
            .await
            .map_err(refused)?;
        typed(v)
    }
}

/// Campaigns until `stop` turns true, telling `leading` whether this replica leads; releases the
/// Lease when it stops while leading.
pub async fn campaign(
    storage: Arc<dyn Storage>,
    opts: ElectionOptions,
    leading: watch::Sender<bool>,
    mut stop: watch::Receiver<bool>,
) {
    let token = CancellationToken::new();
    let cancel = token.clone();
    let stopper = tokio::spawn(async move {
        let _ = stop.wait_for(|s| *s).await;
        cancel.cancel();
    });
    let timings = Timings {
        lease_duration: opts.lease_duration,
        renew_deadline: opts.renew_deadline,
        retry_period: opts.retry_period,
    };
    let on = |e: Event| {
        leading.send_replace(!matches!(e, Event::Deposed));
    };
    let store = StoredLease { storage };
    kvcache_store::election::campaign(&store, NAME, &opts.identity, timings, on, token).await;
    stopper.abort();
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
