//! The Lease over a real Kubernetes API with kube-rs: our API server in direct mode, or
//! kube-apiserver in a cluster. Reads are plain GETs, writes are create or replace with the
//! read `resourceVersion` (409 is [`LeaseError::Conflict`]), and a watch on the one Lease feeds
//! the change hint.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, PostParams, WatchEvent, WatchParams};
use tokio::sync::Notify;

use super::{LeaseError, LeaseStore};

/// Where a Lease is: `NAMESPACE/NAME`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRef {
    pub namespace: String,
    pub name: String,
}

impl LeaseRef {
    /// Parses `NAMESPACE/NAME`.
    pub fn parse(s: &str) -> Result<LeaseRef, String> {
        match s.split_once('/') {
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => Ok(LeaseRef {
                namespace: ns.to_owned(),
                name: name.to_owned(),
            }),
            _ => Err(format!(
                "{s:?} is not NAMESPACE/NAME (e.g. kvcache-system/mooncake-dram-leader)"
            )),
        }
    }
}

impl std::fmt::Display for LeaseRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// A kube client from `kubeconfig`, else from the environment (`KUBECONFIG`, `~/.kube/config`,
/// or the in-cluster service account).
pub async fn client(kubeconfig: Option<&Path>) -> Result<kube::Client, String> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| format!("reading the kubeconfig {}: {e}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| format!("using the kubeconfig {}: {e}", path.display()))?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| format!("no kubeconfig given and none found in the environment: {e}"))?,
    };
    kube::Client::try_from(config).map_err(|e| format!("making a Kubernetes client: {e}"))
}

/// One Lease through the Kubernetes API.
pub struct KubeLeases {
    api: Api<Lease>,
    at: LeaseRef,
    changed: Arc<Notify>,
    watcher: tokio::task::JoinHandle<()>,
}

impl Drop for KubeLeases {
    fn drop(&mut self) {
        self.watcher.abort();
    }
}

fn other(at: &LeaseRef, what: &str, e: &kube::Error) -> LeaseError {
    LeaseError::Other(format!("{what} Lease {at}: {e}"))
}

fn is_code(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

impl KubeLeases {
    pub fn new(client: kube::Client, at: LeaseRef) -> KubeLeases {
        let api: Api<Lease> = Api::namespaced(client, &at.namespace);
        let changed = Arc::new(Notify::new());
        let watcher = tokio::spawn(watch(api.clone(), at.name.clone(), changed.clone()));
        KubeLeases {
            api,
            at,
            changed,
            watcher,
        }
    }

    /// The holder the Lease names now, if any.
    pub async fn holder(&self) -> Result<Option<String>, LeaseError> {
        Ok(self.get().await?.as_ref().and_then(super::holder))
    }
}

/// Wakes `changed` on every event of the Lease; reconnects after a second when the watch ends.
async fn watch(api: Api<Lease>, name: String, changed: Arc<Notify>) {
    loop {
        let params = WatchParams::default()
            .fields(&format!("metadata.name={name}"))
            .timeout(290);
        if let Ok(stream) = api.watch(&params, "0").await {
            let mut stream = std::pin::pin!(stream);
            while let Some(ev) = stream.next().await {
                match ev {
                    Ok(WatchEvent::Added(_) | WatchEvent::Modified(_) | WatchEvent::Deleted(_)) => changed.notify_one(),
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[async_trait::async_trait]
impl LeaseStore for KubeLeases {
    async fn get(&self) -> Result<Option<Lease>, LeaseError> {
        self.api
            .get_opt(&self.at.name)
            .await
            .map_err(|e| other(&self.at, "reading", &e))
    }

    async fn create(&self, mut lease: Lease) -> Result<Lease, LeaseError> {
        lease.metadata.name = Some(self.at.name.clone());
        lease.metadata.namespace = Some(self.at.namespace.clone());
        lease.metadata.resource_version = None;
        match self.api.create(&PostParams::default(), &lease).await {
            Ok(l) => Ok(l),
            Err(e) if is_code(&e, 409) => Err(LeaseError::Conflict),
            Err(e) => Err(other(&self.at, "creating", &e)),
        }
    }

    async fn update(&self, mut lease: Lease) -> Result<Lease, LeaseError> {
        lease.metadata.name = Some(self.at.name.clone());
        lease.metadata.namespace = Some(self.at.namespace.clone());
        match self.api.replace(&self.at.name, &PostParams::default(), &lease).await {
            Ok(l) => Ok(l),
            Err(e) if is_code(&e, 409) || is_code(&e, 404) => Err(LeaseError::Conflict),
            Err(e) => Err(other(&self.at, "updating", &e)),
        }
    }

    async fn changed(&self) {
        self.changed.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_refs_parse() {
        let r = LeaseRef::parse("kvcache-system/b-leader").unwrap();
        assert_eq!((r.namespace.as_str(), r.name.as_str()), ("kvcache-system", "b-leader"));
        assert_eq!(r.to_string(), "kvcache-system/b-leader");
        for bad in ["b-leader", "/b", "ns/", "a/b/c"] {
            assert!(LeaseRef::parse(bad).is_err(), "{bad}");
        }
    }
}
