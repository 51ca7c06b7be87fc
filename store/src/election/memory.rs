//! A Lease in memory with the API's compare-and-swap and change notifications, for tests of the
//! campaign and of a leader's term.

use async_trait::async_trait;
use k8s_openapi::api::coordination::v1::Lease;
use parking_lot::Mutex;

use super::{LeaseError, LeaseStore};

/// A Lease in memory with the API's compare-and-swap.
#[derive(Default)]
pub struct Memory {
    lease: Mutex<Option<Lease>>,
    version: Mutex<u64>,
    notify: tokio::sync::Notify,
}

impl Memory {
    pub fn stored(&self) -> Option<Lease> {
        self.lease.lock().clone()
    }
    pub fn put(&self, mut l: Lease) -> Lease {
        let mut v = self.version.lock();
        *v += 1;
        l.metadata.resource_version = Some(v.to_string());
        *self.lease.lock() = Some(l.clone());
        self.notify.notify_waiters();
        l
    }
}

#[async_trait]
impl LeaseStore for Memory {
    async fn get(&self) -> Result<Option<Lease>, LeaseError> {
        Ok(self.stored())
    }
    async fn create(&self, l: Lease) -> Result<Lease, LeaseError> {
        if self.stored().is_some() {
            return Err(LeaseError::Conflict);
        }
        Ok(self.put(l))
    }
    async fn update(&self, l: Lease) -> Result<Lease, LeaseError> {
        let current = self.stored().and_then(|c| c.metadata.resource_version);
        if current.is_none() || current != l.metadata.resource_version {
            return Err(LeaseError::Conflict);
        }
        Ok(self.put(l))
    }
    async fn changed(&self) {
        self.notify.notified().await;
    }
}
