//! A CA bundle that client certificate chains are verified against, outside TLS: in delegated
//! mode TLS takes any chain, and each authenticator verifies against its own CA (see
//! `server::tls`). Verification is webpki's, as in the TLS handshake: validity period, chain to a
//! root of the bundle, the client-authentication key usage.

use std::sync::Arc;

use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::ClientCertVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, UnixTime};

/// The roots of one CA file (one or more PEM certificates).
#[derive(Clone)]
pub struct CaBundle {
    pem: String,
    verifier: Arc<dyn ClientCertVerifier>,
}

impl std::fmt::Debug for CaBundle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaBundle").field("pem_bytes", &self.pem.len()).finish()
    }
}

impl PartialEq for CaBundle {
    fn eq(&self, other: &CaBundle) -> bool {
        self.pem == other.pem
    }
}

impl CaBundle {
    /// The bundle in `pem`; an error says what is wrong with it.
    pub fn from_pem(pem: &str) -> Result<CaBundle, String> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
            let cert = cert.map_err(|e| format!("not PEM certificates: {e}"))?;
            roots.add(cert).map_err(|e| format!("not a CA certificate: {e}"))?;
        }
        if roots.is_empty() {
            return Err("no certificate in the bundle".into());
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .map_err(|e| format!("unusable roots: {e}"))?;
        Ok(CaBundle {
            pem: pem.to_owned(),
            verifier,
        })
    }

    /// Whether `chain` (leaf first) chains to this bundle and may authenticate a client now.
    pub fn verify(&self, chain: &[CertificateDer<'static>]) -> Result<(), String> {
        let (leaf, intermediates) = chain.split_first().ok_or("an empty certificate chain")?;
        self.verifier
            .verify_client_cert(leaf, intermediates, UnixTime::now())
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn der(pem: &str) -> Vec<CertificateDer<'static>> {
        CertificateDer::pem_slice_iter(pem.as_bytes())
            .map(Result::unwrap)
            .collect()
    }

    #[test]
    fn a_chain_verifies_against_its_own_ca_only() {
        let a = kvcache_certs::Authority::new("a").unwrap();
        let b = kvcache_certs::Authority::new("b").unwrap();
        let bundle = CaBundle::from_pem(&a.pair.cert_pem).unwrap();
        let alice = a.client("alice", &[]).unwrap();
        assert_eq!(bundle.verify(&der(&alice.cert_pem)), Ok(()));
        assert!(
            bundle
                .verify(&der(&b.client("mallory", &[]).unwrap().cert_pem))
                .is_err()
        );
        // A serving certificate of the right CA cannot authenticate a client.
        let serving = a.serving(&["localhost".to_owned()], "s").unwrap();
        assert!(bundle.verify(&der(&serving.cert_pem)).is_err());
        assert!(bundle.verify(&[]).is_err());
        assert!(CaBundle::from_pem("not pem").is_err());
        assert!(CaBundle::from_pem("").is_err());
    }
}
