//! The namespaces the runtime writes to besides the store's own: those of the ModelDeployments
//! whose engine Pods it runs and of the Bindings whose credential Secrets it keeps. The runtime
//! holds Secret and Pod rights in no other namespace, and it cannot grant itself any: an
//! administrator lets it into a namespace with the RoleBinding [`ROLE_BINDING`], which binds its
//! ServiceAccount to the ClusterRole [`TENANT_ROLE`] there (`deploy/README.md`, "Tenant
//! namespaces"; `kubectl create rolebinding`, as [`not_let_in`] says). The runtime holds no right to write RoleBindings
//! anywhere, so a compromised runtime cannot reach a namespace nobody let it into.
//!
//! Entering a namespace (before the first read or write there) checks that the namespace exists
//! and that the runtime may use it, and starts watching the engine Pods there; a namespace that
//! does not let it in is refused with what to run. A namespace whose access was refused later is
//! entered again on the next use (someone deleted the RoleBinding).
//!
//! Without a ServiceAccount (a server outside the cluster, on an administrator's kubeconfig) the
//! runtime's own credentials must reach those namespaces, and nothing is checked.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, ListParams};
use parking_lot::Mutex;

use crate::runtime::Changed;

/// The ClusterRole a tenant namespace's RoleBinding grants (`deploy/rbac-runtime.yaml`): engine
/// Pods and credential Secrets.
pub const TENANT_ROLE: &str = "kvcache-apiserver-tenant";
/// The RoleBinding in each tenant namespace.
pub const ROLE_BINDING: &str = "kvcache-apiserver-tenant";

/// What entering a namespace found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entered {
    /// The runtime may use the namespace.
    Yes,
    /// The namespace does not exist (an object of ours may name one that was never made or is
    /// gone): nothing of ours is there, and nothing can be written there.
    NoSuchNamespace,
}

/// The namespaces entered so far, each with its engine-Pod watch.
pub struct TenantNamespaces {
    client: kube::Client,
    /// `(namespace, name)` of the runtime's ServiceAccount.
    service_account: Option<(String, String)>,
    changes: tokio::sync::broadcast::Sender<Changed>,
    entered: Mutex<BTreeMap<String, tokio::task::JoinHandle<()>>>,
}

impl Drop for TenantNamespaces {
    fn drop(&mut self) {
        for (_, watch) in std::mem::take(&mut *self.entered.lock()) {
            watch.abort();
        }
    }
}

impl TenantNamespaces {
    pub fn new(
        client: kube::Client,
        service_account: Option<(String, String)>,
        changes: tokio::sync::broadcast::Sender<Changed>,
    ) -> TenantNamespaces {
        TenantNamespaces {
            client,
            service_account,
            changes,
            entered: Mutex::default(),
        }
    }

    /// Makes `namespace` one the runtime uses, once it checked it may: then its engine-Pod watch.
    pub async fn enter(&self, namespace: &str) -> Result<Entered, String> {
        if self.entered.lock().contains_key(namespace) {
            return Ok(Entered::Yes);
        }
        if let Some((sa_namespace, sa)) = &self.service_account
            && self.check(namespace, sa_namespace, sa).await? == Entered::NoSuchNamespace
        {
            return Ok(Entered::NoSuchNamespace);
        }
        let mut entered = self.entered.lock();
        if !entered.contains_key(namespace) {
            let watch = super::watch_pods(
                Api::namespaced(self.client.clone(), namespace),
                // engine Pods and router Pods wake their deployment
                "app.kubernetes.io/name in (model-deployment,kvcache-router)",
                self.changes.clone(),
                |namespace, instance| Changed::Replicas(format!("{namespace}/{instance}")),
            );
            entered.insert(namespace.to_owned(), watch);
        }
        Ok(Entered::Yes)
    }

    /// Forgets `namespace` after `error`, when the error was a refusal of access: the next use
    /// enters it again.
    pub fn forget_if_forbidden(&self, namespace: &str, error: &kube::Error) {
        if matches!(error, kube::Error::Api(s) if s.code == 403)
            && let Some(watch) = self.entered.lock().remove(namespace)
        {
            watch.abort();
        }
    }

    /// Whether `namespace` exists and lets the runtime in (a Pod list of at most one).
    async fn check(&self, namespace: &str, sa_namespace: &str, sa: &str) -> Result<Entered, String> {
        match Api::<Namespace>::all(self.client.clone()).get_opt(namespace).await {
            Ok(Some(_)) => {}
            Ok(None) => return Ok(Entered::NoSuchNamespace),
            Err(e) => return Err(format!("reading the namespace {namespace}: {e}")),
        }
        let pods = Api::<Pod>::namespaced(self.client.clone(), namespace);
        match pods.list(&ListParams::default().limit(1)).await {
            Ok(_) => Ok(Entered::Yes),
            Err(kube::Error::Api(s)) if s.code == 403 => Err(not_let_in(namespace, sa_namespace, sa)),
            Err(e) => Err(format!("listing Pods in namespace {namespace}: {e}")),
        }
    }
}

/// The refusal of a namespace that does not let the runtime in, with what lets it in.
pub fn not_let_in(namespace: &str, sa_namespace: &str, sa: &str) -> String {
    format!(
        "namespace {namespace} does not let the runtime in (no RoleBinding {ROLE_BINDING} binds the ClusterRole \
         {TENANT_ROLE} to its ServiceAccount {sa_namespace}/{sa} there); an administrator runs: kubectl -n \
         {namespace} create rolebinding {ROLE_BINDING} --clusterrole={TENANT_ROLE} \
         --serviceaccount={sa_namespace}:{sa}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_that_does_not_let_the_runtime_in_says_what_does() {
        let how = not_let_in("team-a", "gpustack-system", "kvcache-apiserver");
        assert!(
            how.contains(
                "kubectl -n team-a create rolebinding kvcache-apiserver-tenant --clusterrole=kvcache-apiserver-tenant \
                 --serviceaccount=gpustack-system:kvcache-apiserver"
            ),
            "{how}"
        );
    }
}
