//! TLS of each backend's store (`store/README.md`, "TLS"). A runtime keeps a CA of the store's
//! own, apart from the server's (a store's key can then sign nothing the API trusts): locally
//! `<data-dir>/store-tls/ca.crt` and `ca.key`, in a cluster the Secret `kvcache-store-ca`. It
//! issues each backend one certificate for the backend's store name, [`server_name`], which its
//! leaders and members serve, and hands the CA to whatever dials them: the controllers
//! ([`StoreCa::client`]) and engines (`KVSTORE_TLS_CA_PEM`, `KVSTORE_TLS_SERVER_NAME`: injection).

use std::sync::Arc;

use kvcache_certs::{Authority, CertError, CertPair};
use kvcache_store::tls::ClientTls;

/// The name every leader and member of `backend` carries on its certificate, and clients check.
pub fn server_name(backend: &str) -> String {
    format!("{backend}.kvstore.internal")
}

/// The store's CA.
#[derive(Clone, Debug)]
pub struct StoreCa {
    authority: Arc<Authority>,
}

impl StoreCa {
    pub fn new(authority: Authority) -> StoreCa {
        StoreCa {
            authority: Arc::new(authority),
        }
    }

    /// The CA's certificate (PEM): what clients trust.
    pub fn ca_pem(&self) -> &str {
        &self.authority.pair.cert_pem
    }

    /// A certificate for `backend`'s store name, valid for a year.
    pub fn issue(&self, backend: &str) -> Result<CertPair, CertError> {
        let name = server_name(backend);
        self.authority.serving(std::slice::from_ref(&name), &name)
    }

    /// What dials `backend`'s leaders and members: this CA, that name.
    pub fn client(&self, backend: &str) -> Option<ClientTls> {
        ClientTls::from_pem(self.ca_pem().as_bytes(), Some(server_name(backend)))
            .inspect_err(|e| tracing::error!(%backend, error = %e, "the store CA does not load as a client's trust"))
            .ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_backends_certificate_is_trusted_for_its_own_name_only() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let ca = StoreCa::new(Authority::new("test store CA").unwrap());
        let pair = ca.issue("team-a").unwrap();
        let server =
            kvcache_store::tls::ServerTls::from_pem(pair.cert_pem.as_bytes(), pair.key_pem.as_bytes()).unwrap();
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        for (backend, ok) in [("team-a", true), ("team-b", false)] {
            let client = ca.client(backend).unwrap();
            let dial = async {
                client
                    .connect(tokio::net::TcpStream::connect(&addr).await.unwrap(), &addr)
                    .await
            };
            let answer = async { server.accept(l.accept().await.unwrap().0).await };
            let (c, _) = tokio::join!(dial, answer);
            assert_eq!(c.is_ok(), ok, "{backend}: {c:?}");
        }
        assert_eq!(server_name("team-a"), "team-a.kvstore.internal");
    }
}
