//! The store's own tokens in a cluster: each backend's Control token, scrape token, member token
//! and seal key ([`render::Token`]), each a Secret that goes with the backend. Each is made once,
//! with 256 random bits, and kept; the leader and member Pods mount them (`render.rs`), and the
//! controllers read the Control token back to call the leaders' Control API.

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

use super::render::TOKEN_KEY;

/// The token in the Secret `meta` names, made first when it does not exist and `make` allows.
/// `None`: it does not exist and was not to be made.
pub async fn get_or_make(api: &Api<Secret>, meta: Value, make: bool) -> Result<Option<String>, String> {
    let name = meta["name"].as_str().unwrap_or_default().to_owned();
    // Two rounds: another replica of the controllers may make it between our read and create.
    for _ in 0..2 {
        match api.get_opt(&name).await {
            Ok(Some(s)) => return token_of(&s, &name).map(Some),
            Ok(None) if !make => return Ok(None),
            Ok(None) => {}
            Err(e) => return Err(format!("reading the Secret {name}: {e}")),
        }
        let secret: Secret = serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": meta,
            "type": "Opaque",
            "stringData": {TOKEN_KEY: crate::runtime::tokens::fresh()},
        }))
        .map_err(|e| format!("the Secret {name}: {e}"))?;
        match api.create(&PostParams::default(), &secret).await {
            Ok(s) => return token_of(&s, &name).map(Some),
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => return Err(format!("creating the Secret {name}: {e}")),
        }
    }
    Err(format!(
        "the Secret {name} was made and removed again while it was read; retrying"
    ))
}

fn token_of(s: &Secret, name: &str) -> Result<String, String> {
    let from_data = s.data.as_ref().and_then(|d| d.get(TOKEN_KEY)).map(|b| b.0.clone());
    let from_string = s
        .string_data
        .as_ref()
        .and_then(|d| d.get(TOKEN_KEY))
        .map(|v| v.clone().into_bytes());
    let token = from_data
        .or(from_string)
        .map(|b| String::from_utf8_lossy(&b).trim().to_owned())
        .unwrap_or_default();
    if token.is_empty() {
        return Err(format!(
            "the Secret {name} has no {TOKEN_KEY:?}; delete it and the controllers make a new one"
        ));
    }
    Ok(token)
}
