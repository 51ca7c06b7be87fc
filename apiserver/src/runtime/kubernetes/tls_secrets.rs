//! The store's TLS in a cluster (`runtime/store_tls.rs`): the store's CA in the Secret
//! [`CA_SECRET`] of the store's namespace (made once and kept), and each backend's certificate as
//! keys `<backend>.tls.crt`, `.tls.key` and `.ca.crt` of the Secret [`render::TLS_SECRET`], which
//! its leader and member Pods mount (`render.rs`) and which are removed with the backend. A
//! backend's certificate is issued again when it is missing or was issued by another CA (the CA
//! Secret was replaced); its Pods read it when they start.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use parking_lot::RwLock;
use serde_json::json;

use super::render;
use crate::runtime::store_tls::StoreCa;

/// The Secret of the store's CA, in the store's namespace.
pub const CA_SECRET: &str = "kvcache-store-ca";
const CA_CERT_KEY: &str = "ca.crt";
const CA_KEY_KEY: &str = "ca.key";

use super::token_secrets::text;

/// The store's CA from its Secret, made first when it does not exist.
pub async fn ca(api: &Api<Secret>, namespace: &str) -> Result<StoreCa, String> {
    for _ in 0..2 {
        match api.get_opt(CA_SECRET).await {
            Ok(Some(s)) => {
                let (Some(cert_pem), Some(key_pem)) = (text(&s, CA_CERT_KEY), text(&s, CA_KEY_KEY)) else {
                    return Err(format!(
                        "the Secret {CA_SECRET} has no {CA_CERT_KEY:?} and {CA_KEY_KEY:?}; delete it and the controllers make a new CA"
                    ));
                };
                let authority = kvcache_certs::Authority::from_pair(kvcache_certs::CertPair { cert_pem, key_pem })
                    .map_err(|e| format!("the Secret {CA_SECRET}: {e}"))?;
                return Ok(StoreCa::new(authority));
            }
            Ok(None) => {}
            Err(e) => return Err(format!("reading the Secret {CA_SECRET}: {e}")),
        }
        let made =
            kvcache_certs::Authority::new("kvcache-store-ca").map_err(|e| format!("making the store's CA: {e}"))?;
        let secret: Secret = serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": CA_SECRET,
                "namespace": namespace,
                "labels": {
                    "app.kubernetes.io/managed-by": super::FIELD_MANAGER,
                    "app.kubernetes.io/part-of": "kvcache",
                },
            },
            "type": "Opaque",
            "stringData": {CA_CERT_KEY: made.pair.cert_pem, CA_KEY_KEY: made.pair.key_pem},
        }))
        .map_err(|e| format!("the Secret {CA_SECRET}: {e}"))?;
        match api.create(&PostParams::default(), &secret).await {
            Ok(_) => return Ok(StoreCa::new(made)),
            // another replica of the controllers made it between our read and create
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => return Err(format!("creating the Secret {CA_SECRET}: {e}")),
        }
    }
    Err(format!(
        "the Secret {CA_SECRET} was made and removed again while it was read; retrying"
    ))
}

/// Reads (or makes) the store's CA into `slot`, retrying every 2 s until it has it.
pub async fn keep_reading(api: Api<Secret>, namespace: String, slot: Arc<RwLock<Option<StoreCa>>>) {
    loop {
        match ca(&api, &namespace).await {
            Ok(read) => {
                *slot.write() = Some(read);
                return;
            }
            Err(e) => {
                tracing::warn!("the store's CA: {e}; retrying");
                tokio::time::sleep(std::time::Duration::from_secs(2)).await;
            }
        }
    }
}

/// `backend`'s certificate issued by `ca`, as keys of [`render::TLS_SECRET`]: made when missing
/// (if `make`), issued again when another CA issued it.
pub async fn ensure_backend(
    api: &Api<Secret>,
    namespace: &str,
    backend: &str,
    ca: &StoreCa,
    make: bool,
) -> Result<(), String> {
    let key = |f: &str| render::backend_key(backend, f);
    let current = api
        .get_opt(render::TLS_SECRET)
        .await
        .map_err(|e| format!("reading the Secret {}: {e}", render::TLS_SECRET))?;
    let issued_by = current.as_ref().and_then(|s| text(s, &key(render::TLS_CA_KEY)));
    match issued_by {
        Some(pem) if pem == ca.ca_pem() => return Ok(()),
        None if !make => return Ok(()),
        _ => {}
    }
    let pair = ca
        .issue(backend)
        .map_err(|e| format!("issuing the store's certificate of {backend}: {e}"))?;
    let values = std::collections::BTreeMap::from([
        (key(render::TLS_CERT_KEY), pair.cert_pem),
        (key(render::TLS_KEY_KEY), pair.key_pem),
        (key(render::TLS_CA_KEY), ca.ca_pem().to_owned()),
    ]);
    super::token_secrets::put_keys(api, namespace, render::TLS_SECRET, &values).await
}

/// Removes `backend`'s certificate from [`render::TLS_SECRET`].
pub async fn remove_keys(api: &Api<Secret>, backend: &str) -> Result<(), String> {
    let keys: Vec<String> = [render::TLS_CERT_KEY, render::TLS_KEY_KEY, render::TLS_CA_KEY]
        .iter()
        .map(|f| render::backend_key(backend, f))
        .collect();
    super::token_secrets::remove_keys(api, render::TLS_SECRET, &keys).await
}
