//! Tenant credentials in a cluster: one Secret per Binding, in the Binding's namespace, named
//! [`secret_name`]. Its key [`KEY`] holds the credential replicas receive (engine Pods reference
//! it with `valueFrom.secretKeyRef`, so the value never appears in a Pod spec), and
//! [`RECORD_KEY`] the whole rotation state. Found by the label [`COMPONENT_LABEL`], listed only
//! in the Bindings' own namespaces (the runtime may list Secrets nowhere else).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;

use super::tenant_namespaces::{Entered, TenantNamespaces};
use crate::runtime::credentials::{BindingKey, Keeper, KeeperError, TenantCredentials};

/// The key of the credential replicas receive.
pub const KEY: &str = "credential";
/// The key of the rotation state (JSON).
pub const RECORD_KEY: &str = "credentials.json";
/// The annotation naming the Binding a Secret belongs to.
pub const BINDING_NOTE: &str = "note.gpustack.ai/kv-cache-pool-binding";
/// The pod annotation naming the credential an engine Pod runs with (its fingerprint).
pub const FINGERPRINT_ANNOTATION: &str = "kvcache.gpustack.ai/credential-fingerprint";
const COMPONENT_LABEL: (&str, &str) = ("app.kubernetes.io/component", "tenant-credential");

/// The Secret of Binding `binding`: `kvcache-credential-<binding>`, or, for a name too long for
/// that, `kvcache-credential-` and a hash of it.
pub fn secret_name(binding: &str) -> String {
    let plain = format!("kvcache-credential-{binding}");
    if plain.len() <= 253 {
        return plain;
    }
    let h = crate::runtime::credentials::fingerprint(binding);
    format!("kvcache-credential-{h}")
}

/// Secrets through kube-rs, in namespaces entered first.
pub struct SecretKeeper {
    pub client: kube::Client,
    pub tenants: Arc<TenantNamespaces>,
}

impl SecretKeeper {
    /// The Secrets of `namespace`, entered first; `None` when the namespace does not exist.
    async fn api(&self, namespace: &str, binding: impl std::fmt::Display) -> Result<Option<Api<Secret>>, KeeperError> {
        match self.tenants.enter(namespace).await {
            Ok(Entered::Yes) => Ok(Some(Api::namespaced(self.client.clone(), namespace))),
            Ok(Entered::NoSuchNamespace) => Ok(None),
            Err(why) => Err(KeeperError::new(binding, why)),
        }
    }

    fn failed(&self, binding: &BindingKey, what: &str, e: kube::Error) -> KeeperError {
        self.tenants.forget_if_forbidden(&binding.namespace, &e);
        KeeperError::new(binding, format!("{what}: {e}"))
    }
}

fn decode(s: &Secret, key: &BindingKey) -> Result<TenantCredentials, KeeperError> {
    let record = s
        .data
        .as_ref()
        .and_then(|d| d.get(RECORD_KEY))
        .ok_or_else(|| KeeperError::new(key, format!("its Secret has no key {RECORD_KEY:?}")))?;
    serde_json::from_slice(&record.0).map_err(|e| KeeperError::new(key, format!("its Secret's {RECORD_KEY:?}: {e}")))
}

#[async_trait]
impl Keeper for SecretKeeper {
    async fn of(&self, bindings: &[BindingKey]) -> Result<HashMap<BindingKey, TenantCredentials>, KeeperError> {
        let mut by_namespace: BTreeMap<&str, HashSet<&str>> = BTreeMap::new();
        for b in bindings {
            by_namespace.entry(&b.namespace).or_default().insert(&b.name);
        }
        let selector = format!("{}={}", COMPONENT_LABEL.0, COMPONENT_LABEL.1);
        let mut out = HashMap::new();
        for (namespace, names) in by_namespace {
            let what = format!("the Bindings of namespace {namespace}");
            let Some(api) = self.api(namespace, &what).await? else {
                continue;
            };
            let list = match api.list(&ListParams::default().labels(&selector)).await {
                Ok(l) => l,
                Err(e) => {
                    self.tenants.forget_if_forbidden(namespace, &e);
                    return Err(KeeperError::new(what, format!("listing Secrets: {e}")));
                }
            };
            for s in list.items {
                let Some(name) = s.metadata.annotations.as_ref().and_then(|a| a.get(BINDING_NOTE)) else {
                    continue;
                };
                if !names.contains(name.as_str()) {
                    continue;
                }
                let key = BindingKey::new(namespace, name);
                match decode(&s, &key) {
                    Ok(c) => {
                        out.insert(key, c);
                    }
                    Err(e) => tracing::warn!("{e}; it is left out of the ledger until it parses"),
                }
            }
        }
        Ok(out)
    }

    async fn get(&self, binding: &BindingKey) -> Result<Option<TenantCredentials>, KeeperError> {
        let Some(api) = self.api(&binding.namespace, binding).await? else {
            return Ok(None);
        };
        match api.get_opt(&secret_name(&binding.name)).await {
            Ok(Some(s)) => decode(&s, binding).map(Some),
            Ok(None) => Ok(None),
            Err(e) => Err(self.failed(binding, "reading its Secret", e)),
        }
    }

    async fn put(&self, binding: &BindingKey, c: &TenantCredentials) -> Result<(), KeeperError> {
        let Some(api) = self.api(&binding.namespace, binding).await? else {
            return Err(KeeperError::new(
                binding,
                format!("the namespace {} does not exist; create it", binding.namespace),
            ));
        };
        let name = secret_name(&binding.name);
        let record = serde_json::to_vec(c).map_err(|e| KeeperError::new(binding, e))?;
        let data = [
            (KEY.to_owned(), ByteString(c.current.clone().into_bytes())),
            (RECORD_KEY.to_owned(), ByteString(record)),
        ];
        let secret = json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": name,
                "namespace": binding.namespace,
                "labels": {
                    COMPONENT_LABEL.0: COMPONENT_LABEL.1,
                    "app.kubernetes.io/managed-by": super::FIELD_MANAGER,
                },
                "annotations": {BINDING_NOTE: binding.name},
            },
            "type": "Opaque",
            "data": std::collections::BTreeMap::from(data),
        });
        api.patch(
            &name,
            &PatchParams::apply(super::FIELD_MANAGER).force(),
            &Patch::Apply(&secret),
        )
        .await
        .map_err(|e| self.failed(binding, &format!("writing its Secret {}/{name}", binding.namespace), e))?;
        Ok(())
    }

    async fn remove(&self, binding: &BindingKey) -> Result<(), KeeperError> {
        let Some(api) = self.api(&binding.namespace, binding).await? else {
            return Ok(());
        };
        match api.delete(&secret_name(&binding.name), &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(self.failed(binding, "deleting its Secret", e)),
        }
    }
}

/// Whether an engine Pod in `namespace` that has not ended runs with the credential `fingerprint`.
pub async fn in_use(client: &kube::Client, namespace: &str, fingerprint: &str) -> Result<bool, String> {
    let pods = Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().labels("app.kubernetes.io/name=model-deployment"))
        .await
        .map_err(|e| format!("listing engine Pods in {namespace}: {e}"))?;
    Ok(pods.items.iter().any(|p| {
        let ended = p
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|ph| ph == "Succeeded" || ph == "Failed");
        !ended
            && p.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(FINGERPRINT_ANNOTATION))
                .is_some_and(|f| f == fingerprint)
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_name_fits_the_api_whatever_the_binding_name() {
        assert_eq!(secret_name("cache"), "kvcache-credential-cache");
        let long = "b".repeat(253);
        assert!(secret_name(&long).len() <= 253);
    }
}
