//! What kube-apiserver publishes for the API servers it aggregates, in the ConfigMap
//! `kube-system/extension-apiserver-authentication`: the cluster's client CA (`client-ca-file`),
//! and the front proxy's CA, allowed names and header names (`requestheader-*`). Read once before
//! serving, then watched: a change applies to the next request, without a restart. A change that
//! does not parse is reported and the previous configuration stays.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt as _;
use http::HeaderName;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::runtime::watcher;
use tokio::sync::watch;

use super::verify::CaBundle;

pub const NAMESPACE: &str = "kube-system";
pub const NAME: &str = "extension-apiserver-authentication";

/// The authentication configuration the cluster hands its extension servers.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExtensionAuth {
    /// Verifies client certificates of users (`client-ca-file`).
    pub client_ca: Option<CaBundle>,
    /// The front proxy's identity and header names (`requestheader-client-ca-file` and the rest).
    pub request_header: Option<RequestHeader>,
}

/// How to recognise kube-apiserver's proxy and read the user it forwards.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestHeader {
    pub ca: CaBundle,
    /// Common names the proxy's certificate may have; empty allows any the CA signed.
    pub allowed_names: Vec<String>,
    pub username_headers: Vec<HeaderName>,
    pub uid_headers: Vec<HeaderName>,
    pub group_headers: Vec<HeaderName>,
    /// Lowercased prefixes of the headers that carry `extra` (`x-remote-extra-`).
    pub extra_prefixes: Vec<String>,
}

impl RequestHeader {
    /// Every header the proxy may set: they are trusted only on its connections.
    pub fn all_headers(&self) -> impl Iterator<Item = &HeaderName> {
        self.username_headers
            .iter()
            .chain(&self.uid_headers)
            .chain(&self.group_headers)
    }
}

/// The ConfigMap's data, parsed. `requestheader-*` lists are JSON arrays of strings.
pub fn parse(data: &BTreeMap<String, String>) -> Result<ExtensionAuth, String> {
    let client_ca = data
        .get("client-ca-file")
        .map(|pem| CaBundle::from_pem(pem).map_err(|e| format!("client-ca-file: {e}")))
        .transpose()?;
    let request_header = match data.get("requestheader-client-ca-file") {
        None => None,
        Some(pem) => {
            let ca = CaBundle::from_pem(pem).map_err(|e| format!("requestheader-client-ca-file: {e}"))?;
            let list = |key: &str| -> Result<Vec<String>, String> {
                data.get(key)
                    .map_or(Ok(Vec::new()), |v| serde_json::from_str::<Vec<String>>(v))
                    .map_err(|e| format!("{key}: not a JSON array of strings: {e}"))
            };
            let headers = |key: &str| -> Result<Vec<HeaderName>, String> {
                list(key)?
                    .iter()
                    .filter(|h| !h.is_empty())
                    .map(|h| HeaderName::try_from(h.as_str()).map_err(|e| format!("{key}: {h:?}: {e}")))
                    .collect()
            };
            let username_headers = headers("requestheader-username-headers")?;
            if username_headers.is_empty() {
                return Err(
                    "requestheader-username-headers names no header; the front proxy's user cannot be read".into(),
                );
            }
            Some(RequestHeader {
                ca,
                allowed_names: list("requestheader-allowed-names")?,
                username_headers,
                uid_headers: headers("requestheader-uid-headers")?,
                group_headers: headers("requestheader-group-headers")?,
                extra_prefixes: list("requestheader-extra-headers-prefix")?
                    .into_iter()
                    .filter(|p| !p.is_empty())
                    .map(|p| p.to_ascii_lowercase())
                    .collect(),
            })
        }
    };
    Ok(ExtensionAuth {
        client_ca,
        request_header,
    })
}

/// Why the configuration could not be read at start.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(
        "reading the ConfigMap {NAMESPACE}/{NAME}: {0} (the server's identity needs the Role extension-apiserver-authentication-reader in {NAMESPACE}; deploy/ binds it)"
    )]
    Read(#[source] kube::Error),
    #[error("the ConfigMap {NAMESPACE}/{NAME}: {0}")]
    Invalid(String),
}

/// The current configuration, kept fresh by a watch on the ConfigMap.
#[derive(Debug, Clone)]
pub struct Source(watch::Receiver<Arc<ExtensionAuth>>);

impl Source {
    /// A fixed configuration (tests).
    pub fn fixed(auth: ExtensionAuth) -> Source {
        let (tx, rx) = watch::channel(Arc::new(auth));
        // Dropping the sender is fine: the receiver keeps the last value.
        drop(tx);
        Source(rx)
    }

    pub fn current(&self) -> Arc<ExtensionAuth> {
        self.0.borrow().clone()
    }

    /// Reads the ConfigMap, then watches it for as long as the server runs.
    pub async fn load_and_watch(client: kube::Client) -> Result<Source, LoadError> {
        let api: Api<ConfigMap> = Api::namespaced(client, NAMESPACE);
        let first = api.get(NAME).await.map_err(LoadError::Read)?;
        let first = parse(&first.data.unwrap_or_default()).map_err(LoadError::Invalid)?;
        let (tx, rx) = watch::channel(Arc::new(first));
        tokio::spawn(async move {
            let config = watcher::Config::default().fields(&format!("metadata.name={NAME}"));
            let mut events = std::pin::pin!(watcher(api, config));
            while let Some(event) = events.next().await {
                let cm = match event {
                    Ok(watcher::Event::Apply(cm) | watcher::Event::InitApply(cm)) => cm,
                    Ok(_) => continue,
                    Err(e) => {
                        tracing::warn!("watching {NAMESPACE}/{NAME}: {e}; retrying");
                        continue;
                    }
                };
                match parse(&cm.data.unwrap_or_default()) {
                    Ok(auth) => {
                        tx.send_if_modified(|cur| {
                            let changed = **cur != auth;
                            if changed {
                                tracing::info!(
                                    "{NAMESPACE}/{NAME} changed: new CAs and header names apply from now on"
                                );
                                *cur = Arc::new(auth);
                            }
                            changed
                        });
                    }
                    Err(e) => tracing::warn!("{NAMESPACE}/{NAME} changed but {e}; keeping the previous configuration"),
                }
                if tx.is_closed() {
                    return;
                }
            }
        });
        Ok(Source(rx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn the_configmap_parses_like_kube_apiserver_writes_it() {
        let ca = kvcache_certs::Authority::new("front-proxy-ca").unwrap();
        let pem = ca.pair.cert_pem.as_str();
        let auth = parse(&data(&[
            ("client-ca-file", pem),
            ("requestheader-client-ca-file", pem),
            ("requestheader-allowed-names", r#"["front-proxy-client"]"#),
            ("requestheader-username-headers", r#"["X-Remote-User"]"#),
            ("requestheader-uid-headers", r#"["X-Remote-Uid"]"#),
            ("requestheader-group-headers", r#"["X-Remote-Group"]"#),
            ("requestheader-extra-headers-prefix", r#"["X-Remote-Extra-"]"#),
        ]))
        .unwrap();
        assert!(auth.client_ca.is_some());
        let rh = auth.request_header.unwrap();
        assert_eq!(rh.allowed_names, ["front-proxy-client"]);
        assert_eq!(rh.username_headers, [HeaderName::from_static("x-remote-user")]);
        assert_eq!(rh.extra_prefixes, ["x-remote-extra-"]);
        assert_eq!(rh.all_headers().count(), 3);

        // No request-header CA: no front proxy. Nothing at all: nobody but tokens.
        assert_eq!(parse(&data(&[("client-ca-file", pem)])).unwrap().request_header, None);
        assert_eq!(parse(&data(&[])).unwrap(), ExtensionAuth::default());

        for (bad, says) in [
            (data(&[("client-ca-file", "x")]), "client-ca-file"),
            (
                data(&[
                    ("requestheader-client-ca-file", pem),
                    ("requestheader-username-headers", "X-Remote-User"),
                ]),
                "not a JSON array",
            ),
            (data(&[("requestheader-client-ca-file", pem)]), "names no header"),
            (
                data(&[
                    ("requestheader-client-ca-file", pem),
                    ("requestheader-username-headers", r#"["bad header"]"#),
                ]),
                "bad header",
            ),
        ] {
            let e = parse(&bad).unwrap_err();
            assert!(e.contains(says), "{e}");
        }
    }
}
