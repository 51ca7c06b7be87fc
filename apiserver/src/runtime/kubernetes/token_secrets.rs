//! The store's own Secrets in a cluster, under fixed names in the store's namespace so that the
//! runtime's rights to Secrets there are to these alone, by name (`deploy/rbac-runtime.yaml`):
//! every backend's tokens and seal key ([`render::Token`]) as keys of [`render::TOKENS_SECRET`], and
//! its certificate as keys of [`render::TLS_SECRET`] (`tls_secrets.rs`). A backend's keys are
//! made once (256 random bits each) and kept until the backend goes ([`remove_keys`]); they are
//! added and removed with merge patches, so backends never overwrite each other's. The leader and
//! member Pods mount their backend's keys (`render.rs`), and the controllers read the Control token
//! back to call the leaders' Control API.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use super::render::{self, Token};

fn b64(b: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(b)
}

/// A key's value in `s`, as text (`None`: absent or blank).
pub fn text(s: &Secret, key: &str) -> Option<String> {
    s.data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|b| String::from_utf8_lossy(&b.0).into_owned())
        .or_else(|| s.string_data.as_ref().and_then(|d| d.get(key)).cloned())
        .filter(|v| !v.trim().is_empty())
}

/// Adds (or replaces) `values` as keys of the Secret `name`, making the Secret when it does not
/// exist yet.
pub async fn put_keys(
    api: &Api<Secret>,
    namespace: &str,
    name: &str,
    values: &BTreeMap<String, String>,
) -> Result<(), String> {
    let data: BTreeMap<&String, String> = values.iter().map(|(k, v)| (k, b64(v.as_bytes()))).collect();
    let patch = json!({"data": data});
    // Two rounds: another replica of the controllers may make it between our patch and create.
    for _ in 0..2 {
        match api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(format!("writing the Secret {name}: {e}")),
        }
        let secret: Secret = serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {
                    "app.kubernetes.io/managed-by": super::FIELD_MANAGER,
                    "app.kubernetes.io/part-of": "kvcache",
                },
            },
            "type": "Opaque",
            "data": patch["data"],
        }))
        .map_err(|e| format!("the Secret {name}: {e}"))?;
        match api.create(&PostParams::default(), &secret).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => return Err(format!("creating the Secret {name}: {e}")),
        }
    }
    Err(format!(
        "the Secret {name} was made and removed again meanwhile; retrying"
    ))
}

/// Removes `keys` from the Secret `name` (a Secret that does not exist holds none).
pub async fn remove_keys(api: &Api<Secret>, name: &str, keys: &[String]) -> Result<(), String> {
    let nulls: BTreeMap<&String, Value> = keys.iter().map(|k| (k, Value::Null)).collect();
    match api
        .patch(name, &PatchParams::default(), &Patch::Merge(&json!({"data": nulls})))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(format!("removing keys of the Secret {name}: {e}")),
    }
}

/// `backend`'s tokens, each made first when it does not exist and `make` allows; returns its
/// Control token (`None`: it does not exist and was not to be made).
pub async fn ensure(api: &Api<Secret>, namespace: &str, backend: &str, make: bool) -> Result<Option<String>, String> {
    let current = api
        .get_opt(render::TOKENS_SECRET)
        .await
        .map_err(|e| format!("reading the Secret {}: {e}", render::TOKENS_SECRET))?;
    let mut have: BTreeMap<Token, String> = BTreeMap::new();
    let mut missing = BTreeMap::new();
    for token in Token::ALL {
        match current.as_ref().and_then(|s| text(s, &token.key(backend))) {
            Some(v) => {
                have.insert(token, v.trim().to_owned());
            }
            None if make => {
                let fresh = crate::runtime::tokens::fresh();
                missing.insert(token.key(backend), fresh.clone());
                have.insert(token, fresh);
            }
            None => {}
        }
    }
    if !missing.is_empty() {
        put_keys(api, namespace, render::TOKENS_SECRET, &missing).await?;
    }
    Ok(have.remove(&Token::Control))
}

/// The keys of `backend`'s tokens.
pub fn keys(backend: &str) -> Vec<String> {
    Token::ALL.iter().map(|t| t.key(backend)).collect()
}
