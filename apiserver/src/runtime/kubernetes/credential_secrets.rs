//! Tenant credentials in a cluster: one Secret per namespace, [`SECRET`], in the Bindings' own
//! namespaces, holding two keys per Binding: [`credential_key`] (the credential replicas receive;
//! engine Pods reference it with `valueFrom.secretKeyRef`, so the value never appears in a Pod
//! spec) and [`record_key`] (the whole rotation state). One Secret of a fixed name, so the
//! runtime's rights there are to that Secret alone, by name (`deploy/rbac-runtime.yaml`): it lists
//! no Secret of a tenant namespace and reads none of the tenant's own. Keys are added and removed
//! with merge patches, so Bindings of one namespace never overwrite each other's.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use super::tenant_namespaces::{Entered, TenantNamespaces};
use crate::runtime::credentials::{BindingKey, Keeper, KeeperError, ReplicaCredential, TenantCredentials};

/// The Secret of each tenant namespace that holds its Bindings' credentials.
pub const SECRET: &str = "kvcache-credentials";
/// The pod annotation naming the credential an engine Pod runs with (its fingerprint).
pub const FINGERPRINT_ANNOTATION: &str = "kvcache.gpustack.ai/credential-fingerprint";

/// What a Binding's keys start with: its name, or, for a name too long to leave room for the
/// suffixes (a key is at most 253 characters), a hash of it.
fn key_stem(binding: &str) -> String {
    if binding.len() <= 200 {
        return binding.to_owned();
    }
    format!("h-{}", crate::runtime::credentials::fingerprint(binding))
}

/// The key of the credential Binding `binding`'s replicas receive.
pub fn credential_key(binding: &str) -> String {
    format!("{}.credential", key_stem(binding))
}

/// The key of Binding `binding`'s rotation state (JSON).
pub fn record_key(binding: &str) -> String {
    format!("{}.credentials.json", key_stem(binding))
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

fn decode(s: &Secret, key: &BindingKey) -> Result<Option<TenantCredentials>, KeeperError> {
    let Some(record) = s.data.as_ref().and_then(|d| d.get(&record_key(&key.name))) else {
        return Ok(None);
    };
    serde_json::from_slice(&record.0).map(Some).map_err(|e| {
        KeeperError::new(
            key,
            format!("its key {:?} in the Secret {SECRET}: {e}", record_key(&key.name)),
        )
    })
}

/// A merge patch of one Binding's keys (`None`: removed).
fn keys_patch(binding: &str, c: Option<&TenantCredentials>) -> Result<serde_json::Value, serde_json::Error> {
    use base64::Engine as _;
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let (credential, record) = match c {
        Some(c) => (json!(b64(c.current.as_bytes())), json!(b64(&serde_json::to_vec(c)?))),
        None => (serde_json::Value::Null, serde_json::Value::Null),
    };
    Ok(json!({"data": {credential_key(binding): credential, record_key(binding): record}}))
}

#[async_trait]
impl Keeper for SecretKeeper {
    async fn of(&self, bindings: &[BindingKey]) -> Result<HashMap<BindingKey, TenantCredentials>, KeeperError> {
        let mut by_namespace: BTreeMap<&str, HashSet<&str>> = BTreeMap::new();
        for b in bindings {
            by_namespace.entry(&b.namespace).or_default().insert(&b.name);
        }
        let mut out = HashMap::new();
        for (namespace, names) in by_namespace {
            let what = format!("the Bindings of namespace {namespace}");
            let Some(api) = self.api(namespace, &what).await? else {
                continue;
            };
            let secret = match api.get_opt(SECRET).await {
                Ok(Some(s)) => s,
                Ok(None) => continue,
                Err(e) => {
                    self.tenants.forget_if_forbidden(namespace, &e);
                    return Err(KeeperError::new(what, format!("reading the Secret {SECRET}: {e}")));
                }
            };
            for name in names {
                let key = BindingKey::new(namespace, name);
                match decode(&secret, &key) {
                    Ok(Some(c)) => {
                        out.insert(key, c);
                    }
                    Ok(None) => {}
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
        match api.get_opt(SECRET).await {
            Ok(Some(s)) => decode(&s, binding),
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
        let patch = keys_patch(&binding.name, Some(c)).map_err(|e| KeeperError::new(binding, e))?;
        let writing = format!("writing its keys of the Secret {}/{SECRET}", binding.namespace);
        // Two rounds: the namespace's Secret is made by whichever Binding writes first.
        for _ in 0..2 {
            match api.patch(SECRET, &PatchParams::default(), &Patch::Merge(&patch)).await {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(self.failed(binding, &writing, e)),
            }
            let made: Secret = serde_json::from_value(json!({
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {
                    "name": SECRET,
                    "namespace": binding.namespace,
                    "labels": {
                        "app.kubernetes.io/component": "tenant-credentials",
                        "app.kubernetes.io/managed-by": super::FIELD_MANAGER,
                    },
                },
                "type": "Opaque",
                "data": patch["data"],
            }))
            .map_err(|e| KeeperError::new(binding, e))?;
            match api.create(&PostParams::default(), &made).await {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(s)) if s.code == 409 => continue,
                Err(e) => return Err(self.failed(binding, &writing, e)),
            }
        }
        Err(KeeperError::new(
            binding,
            format!(
                "the Secret {}/{SECRET} was made and removed again meanwhile; retrying",
                binding.namespace
            ),
        ))
    }

    async fn remove(&self, binding: &BindingKey) -> Result<(), KeeperError> {
        let Some(api) = self.api(&binding.namespace, binding).await? else {
            return Ok(());
        };
        let patch = keys_patch(&binding.name, None).map_err(|e| KeeperError::new(binding, e))?;
        match api.patch(SECRET, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(self.failed(binding, "removing its keys of the Secret", e)),
        }
    }
}

/// The credential's variable in a Pod's container, from the Binding's Secret: its value never
/// enters the Pod spec.
pub fn credential_env(c: &ReplicaCredential) -> serde_json::Value {
    json!({"name": crate::runtime::credentials::ENV, "valueFrom": {"secretKeyRef": {
        "name": SECRET,
        "key": credential_key(&c.binding),
    }}})
}

/// Whether an engine or router Pod in `namespace` that has not ended runs with the credential
/// `fingerprint`.
pub async fn in_use(client: &kube::Client, namespace: &str, fingerprint: &str) -> Result<bool, String> {
    let pods = Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().labels("app.kubernetes.io/name in (model-deployment,kvcache-router)"))
        .await
        .map_err(|e| format!("listing engine and router Pods in {namespace}: {e}"))?;
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
    fn a_bindings_keys_fit_the_api_whatever_its_name() {
        assert_eq!(credential_key("cache"), "cache.credential");
        assert_eq!(record_key("cache"), "cache.credentials.json");
        let long = "b".repeat(253);
        assert!(credential_key(&long).len() <= 253 && record_key(&long).len() <= 253);
        assert_ne!(credential_key(&long), credential_key(&"c".repeat(253)));
    }

    #[test]
    fn a_removal_patch_nulls_exactly_the_bindings_keys() {
        let p = keys_patch("cache", None).unwrap();
        assert_eq!(
            p,
            json!({"data": {"cache.credential": null, "cache.credentials.json": null}})
        );
    }
}
