//! The store's TLS in a cluster (`runtime/store_tls.rs`): the store's CA in the Secret
//! [`CA_SECRET`] of the store's namespace (made once and kept, like the controllers' token), and
//! each backend's certificate in the Secret [`render::store_tls_secret`], which goes with the
//! backend and which its leader and member Pods mount (`render.rs`). A backend's Secret is issued
//! again when it is missing or was issued by another CA (the CA Secret was replaced); its Pods
//! read it when they start.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams, PostParams};
use parking_lot::RwLock;
use serde_json::{Value, json};

use super::render;
use crate::runtime::store_tls::StoreCa;

/// The Secret of the store's CA, in the store's namespace.
pub const CA_SECRET: &str = "kvcache-store-ca";
const CA_CERT_KEY: &str = "ca.crt";
const CA_KEY_KEY: &str = "ca.key";

fn text(s: &Secret, key: &str) -> Option<String> {
    s.data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|b| String::from_utf8_lossy(&b.0).into_owned())
        .or_else(|| s.string_data.as_ref().and_then(|d| d.get(key)).cloned())
}

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

/// The backend's certificate Secret (`meta`, from [`render::store_tls_metadata`]) issued by
/// `ca`: made when missing (if `make`), issued again when another CA issued it.
pub async fn ensure_backend(
    api: &Api<Secret>,
    meta: Value,
    backend: &str,
    ca: &StoreCa,
    make: bool,
) -> Result<(), String> {
    let name = meta["name"].as_str().unwrap_or_default().to_owned();
    let current = api
        .get_opt(&name)
        .await
        .map_err(|e| format!("reading the Secret {name}: {e}"))?;
    match &current {
        Some(s) if text(s, render::TLS_CA_KEY).as_deref() == Some(ca.ca_pem()) => return Ok(()),
        None if !make => return Ok(()),
        _ => {}
    }
    let pair = ca
        .issue(backend)
        .map_err(|e| format!("issuing the store's certificate of {backend}: {e}"))?;
    use base64::Engine as _;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
    let secret = json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": meta,
        "type": "Opaque",
        "data": {
            render::TLS_CERT_KEY: b64(&pair.cert_pem),
            render::TLS_KEY_KEY: b64(&pair.key_pem),
            render::TLS_CA_KEY: b64(ca.ca_pem()),
        },
    });
    let params = PatchParams::apply(super::FIELD_MANAGER).force();
    api.patch(&name, &params, &Patch::Apply(&secret))
        .await
        .map_err(|e| format!("writing the Secret {name}: {e}"))?;
    Ok(())
}
