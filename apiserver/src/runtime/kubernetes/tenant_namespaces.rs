//! The namespaces the runtime writes to besides the store's own: those of the ModelDeployments
//! whose engine Pods it runs and of the Bindings whose credential Secrets it keeps. The runtime
//! holds Secret and Pod rights in no other namespace. Entering one (before the first read or
//! write there) binds the runtime's ServiceAccount to the ClusterRole [`TENANT_ROLE`] by the
//! RoleBinding [`ROLE_BINDING`] of that namespace, waits until the grant takes effect, and starts
//! watching the engine Pods there. A namespace whose access was refused is entered again on the
//! next use (someone deleted the RoleBinding).
//!
//! Without a ServiceAccount (a server outside the cluster, on an administrator's kubeconfig) no
//! RoleBinding is written and the runtime's own credentials must reach those namespaces.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, ListParams, Patch, PatchParams};
use parking_lot::Mutex;
use serde_json::json;

use crate::runtime::Changed;

/// The ClusterRole a tenant namespace's RoleBinding grants (`deploy/rbac-runtime.yaml`): engine
/// Pods and credential Secrets.
pub const TENANT_ROLE: &str = "kvcache-apiserver-tenant";
/// The RoleBinding in each tenant namespace.
pub const ROLE_BINDING: &str = "kvcache-apiserver-tenant";
/// How long a fresh RoleBinding may take to reach the cluster's authorizer.
const GRANT_WAIT: Duration = Duration::from_secs(10);

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

    /// Makes `namespace` one the runtime may use: its RoleBinding, then its engine-Pod watch.
    pub async fn enter(&self, namespace: &str) -> Result<Entered, String> {
        if self.entered.lock().contains_key(namespace) {
            return Ok(Entered::Yes);
        }
        if let Some((sa_namespace, sa)) = &self.service_account
            && self.bind(namespace, sa_namespace, sa).await? == Entered::NoSuchNamespace
        {
            return Ok(Entered::NoSuchNamespace);
        }
        let mut entered = self.entered.lock();
        if !entered.contains_key(namespace) {
            let watch = super::watch_pods(
                Api::namespaced(self.client.clone(), namespace),
                "app.kubernetes.io/name=model-deployment",
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

    async fn bind(&self, namespace: &str, sa_namespace: &str, sa: &str) -> Result<Entered, String> {
        let binding = role_binding(namespace, sa_namespace, sa);
        let applied = Api::<RoleBinding>::namespaced(self.client.clone(), namespace)
            .patch(
                ROLE_BINDING,
                &PatchParams::apply(super::FIELD_MANAGER).force(),
                &Patch::Apply(&binding),
            )
            .await;
        match applied {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 && s.details.as_ref().is_some_and(|d| d.kind == "namespaces") => {
                return Ok(Entered::NoSuchNamespace);
            }
            Err(e) => {
                return Err(format!(
                    "binding {TENANT_ROLE} in namespace {namespace} (RoleBinding {ROLE_BINDING}): {e}"
                ));
            }
        }
        // The authorizer learns of the RoleBinding from its own watch: wait until it lets us in.
        let pods = Api::<Pod>::namespaced(self.client.clone(), namespace);
        let deadline = tokio::time::Instant::now() + GRANT_WAIT;
        loop {
            match pods.list(&ListParams::default().limit(1)).await {
                Ok(_) => return Ok(Entered::Yes),
                Err(kube::Error::Api(s)) if s.code == 403 && tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => {
                    return Err(format!(
                        "namespace {namespace}: RoleBinding {ROLE_BINDING} written, but Pods cannot be listed: {e}"
                    ));
                }
            }
        }
    }
}

/// The RoleBinding granting [`TENANT_ROLE`] in `namespace` to the runtime's ServiceAccount.
pub fn role_binding(namespace: &str, sa_namespace: &str, sa: &str) -> serde_json::Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {
            "name": ROLE_BINDING,
            "namespace": namespace,
            "labels": {
                "app.kubernetes.io/managed-by": super::FIELD_MANAGER,
                "app.kubernetes.io/part-of": "kvcache",
            },
        },
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": TENANT_ROLE},
        "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": sa_namespace}],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_role_binding_grants_the_tenant_role_to_the_runtime_alone() {
        let b: RoleBinding =
            serde_json::from_value(role_binding("team-a", "gpustack-system", "kvcache-apiserver")).unwrap();
        assert_eq!(b.metadata.namespace.as_deref(), Some("team-a"));
        assert_eq!(
            (b.role_ref.kind.as_str(), b.role_ref.name.as_str()),
            ("ClusterRole", TENANT_ROLE)
        );
        let subjects = b.subjects.unwrap();
        assert_eq!(subjects.len(), 1);
        assert_eq!(
            (
                subjects[0].kind.as_str(),
                subjects[0].name.as_str(),
                subjects[0].namespace.as_deref()
            ),
            ("ServiceAccount", "kvcache-apiserver", Some("gpustack-system"))
        );
    }
}
