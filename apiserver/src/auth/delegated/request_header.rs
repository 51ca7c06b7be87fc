//! Users forwarded by kube-apiserver's front proxy: when a connection's client certificate
//! chains to the front proxy's CA (and its common name is an allowed one), the user is read from
//! the request headers the cluster named (`X-Remote-User`, `X-Remote-Uid`, `X-Remote-Group`,
//! `X-Remote-Extra-*`). On any other connection those headers are never trusted: a request that
//! carries them gets 401 unless it proves another identity (a client certificate of the
//! cluster's client CA, a token), and then the headers are ignored.

use async_trait::async_trait;
use http::HeaderMap;

use super::extension::{RequestHeader, Source};
use crate::auth::{AuthError, Authenticator, ConnectionInfo, User};

#[derive(Debug)]
pub struct RequestHeaderAuth {
    source: Source,
}

impl RequestHeaderAuth {
    pub fn new(source: Source) -> RequestHeaderAuth {
        RequestHeaderAuth { source }
    }
}

fn untrusted(rh: &RequestHeader, why: &str) -> AuthError {
    let names: Vec<&str> = rh.username_headers.iter().map(|h| h.as_str()).collect();
    AuthError(format!(
        "the {} header is trusted only from kube-apiserver's front proxy, and {why}; reach this server through kube-apiserver, or authenticate with a client certificate or a token",
        names.join(", ")
    ))
}

#[async_trait]
impl Authenticator for RequestHeaderAuth {
    async fn authenticate(
        &self,
        parts: &http::request::Parts,
        conn: &ConnectionInfo,
    ) -> Result<Option<User>, AuthError> {
        let auth = self.source.current();
        let Some(rh) = &auth.request_header else {
            return Ok(None);
        };
        let claims = rh.username_headers.iter().any(|h| parts.headers.contains_key(h));
        let cert = match conn {
            ConnectionInfo::Tls { client: Some(cert), .. } => cert,
            _ if claims => return Err(untrusted(rh, "this request has no client certificate")),
            _ => return Ok(None),
        };
        if let Err(e) = rh.ca.verify(cert.chain()) {
            return if claims {
                Err(untrusted(
                    rh,
                    &format!("this client certificate is not the proxy's ({e})"),
                ))
            } else {
                Ok(None)
            };
        }
        let proxy = cert.user()?.name;
        if !rh.allowed_names.is_empty() && !rh.allowed_names.contains(&proxy) {
            return Err(AuthError(format!(
                "x509: subject with cn={proxy} is not in the allowed list of front proxy names ({})",
                rh.allowed_names.join(", ")
            )));
        }
        Ok(forwarded_user(rh, &parts.headers))
    }
}

/// The user the proxy's headers name; `None` without a user name.
fn forwarded_user(rh: &RequestHeader, headers: &HeaderMap) -> Option<User> {
    let first = |names: &[http::HeaderName]| {
        names
            .iter()
            .filter_map(|h| headers.get(h).and_then(|v| v.to_str().ok()))
            .find(|v| !v.is_empty())
            .map(str::to_owned)
    };
    let name = first(&rh.username_headers)?;
    let groups = rh
        .group_headers
        .iter()
        .flat_map(|h| headers.get_all(h))
        .filter_map(|v| v.to_str().ok())
        .map(str::to_owned)
        .collect();
    let mut extra = std::collections::BTreeMap::<String, Vec<String>>::new();
    for (header, value) in headers {
        let Some(key) = rh
            .extra_prefixes
            .iter()
            .find_map(|p| header.as_str().strip_prefix(p.as_str()))
        else {
            continue;
        };
        if let (Some(key), Ok(value)) = (percent_decode(key), value.to_str()) {
            extra.entry(key).or_default().push(value.to_owned());
        }
    }
    let mut user = User {
        name,
        uid: first(&rh.uid_headers).unwrap_or_default(),
        groups,
        extra,
    };
    super::authenticated(&mut user);
    Some(user)
}

/// Extra keys are percent-encoded by the proxy (`authentication.kubernetes.io%2fpod-name`).
fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;

    use super::super::extension::{self, ExtensionAuth};
    use super::*;
    use crate::auth::x509::ClientCertificate;

    struct Cluster {
        front_proxy: kvcache_certs::Authority,
        clients: kvcache_certs::Authority,
        auth: RequestHeaderAuth,
    }

    fn cluster() -> Cluster {
        let front_proxy = kvcache_certs::Authority::new("front-proxy-ca").unwrap();
        let clients = kvcache_certs::Authority::new("client-ca").unwrap();
        let data = [
            ("client-ca-file", clients.pair.cert_pem.as_str()),
            ("requestheader-client-ca-file", front_proxy.pair.cert_pem.as_str()),
            ("requestheader-allowed-names", r#"["front-proxy-client"]"#),
            ("requestheader-username-headers", r#"["X-Remote-User"]"#),
            ("requestheader-uid-headers", r#"["X-Remote-Uid"]"#),
            ("requestheader-group-headers", r#"["X-Remote-Group"]"#),
            ("requestheader-extra-headers-prefix", r#"["X-Remote-Extra-"]"#),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
        let auth: ExtensionAuth = extension::parse(&data).unwrap();
        Cluster {
            front_proxy,
            clients,
            auth: RequestHeaderAuth::new(Source::fixed(auth)),
        }
    }

    fn conn(pair: Option<&kvcache_certs::CertPair>) -> ConnectionInfo {
        ConnectionInfo::Tls {
            remote: "127.0.0.1:1".parse().unwrap(),
            client: pair.map(|p| {
                Arc::new(ClientCertificate::new(
                    CertificateDer::pem_slice_iter(p.cert_pem.as_bytes())
                        .map(Result::unwrap)
                        .collect(),
                ))
            }),
        }
    }

    fn forged(headers: &[(&str, &str)]) -> http::request::Parts {
        let mut b = http::Request::builder().uri("/apis/worker.gpustack.ai/v1/kvcachebackends");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).unwrap().into_parts().0
    }

    #[tokio::test]
    async fn the_proxy_forwards_users_and_nobody_else_can() {
        let c = cluster();
        let proxy = c.front_proxy.client("front-proxy-client", &[]).unwrap();
        let headers = [
            ("X-Remote-User", "alice"),
            ("X-Remote-Uid", "u-1"),
            ("X-Remote-Group", "devs"),
            ("X-Remote-Group", "system:authenticated"),
            ("X-Remote-Extra-Authentication.kubernetes.io%2fpod-name", "p"),
        ];
        let user = c
            .auth
            .authenticate(&forged(&headers), &conn(Some(&proxy)))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(user.name, "alice");
        assert_eq!(user.uid, "u-1");
        assert_eq!(
            user.groups,
            ["devs", "system:authenticated"],
            "the group is not added twice"
        );
        assert_eq!(user.extra["authentication.kubernetes.io/pod-name"], ["p"]);

        // The proxy without a user header names nobody.
        assert_eq!(c.auth.authenticate(&forged(&[]), &conn(Some(&proxy))).await, Ok(None));

        // Forged: no certificate, a user's certificate, the right CA but a name not allowed.
        let admin = [("X-Remote-User", "admin"), ("X-Remote-Group", "system:masters")];
        let e = c.auth.authenticate(&forged(&admin), &conn(None)).await.unwrap_err();
        assert!(e.0.contains("trusted only from kube-apiserver's front proxy"), "{e}");
        let user_cert = c.clients.client("bob", &[]).unwrap();
        assert!(
            c.auth
                .authenticate(&forged(&admin), &conn(Some(&user_cert)))
                .await
                .is_err()
        );
        let other = c.front_proxy.client("someone-else", &[]).unwrap();
        let e = c
            .auth
            .authenticate(&forged(&admin), &conn(Some(&other)))
            .await
            .unwrap_err();
        assert!(e.0.contains("not in the allowed list"), "{e}");

        // A user's certificate without the headers: not this authenticator's business.
        assert_eq!(
            c.auth.authenticate(&forged(&[]), &conn(Some(&user_cert))).await,
            Ok(None)
        );
        assert_eq!(
            c.auth.authenticate(&forged(&[]), &ConnectionInfo::Unknown).await,
            Ok(None)
        );
    }

    #[test]
    fn extra_keys_are_percent_decoded() {
        assert_eq!(percent_decode("a%2fb").as_deref(), Some("a/b"));
        assert_eq!(percent_decode("plain").as_deref(), Some("plain"));
        assert_eq!(percent_decode("bad%2"), None);
        assert_eq!(percent_decode("bad%zz"), None);
    }
}
