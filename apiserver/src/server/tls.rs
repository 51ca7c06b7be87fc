//! The TLS configuration: our serving certificate, ALPN h2 and http/1.1, and client
//! certificates verified against our CA when presented (anonymous clients are allowed through
//! TLS; authorization decides what they may do).

use std::sync::Arc;

use rustls::ServerConfig;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading PEM: {0}")]
    Pem(#[from] rustls_pki_types::pem::Error),
    #[error("building the TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("building the client certificate verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
}

pub fn server_config(ca_pem: &str, cert_pem: &str, key_pem: &str) -> Result<Arc<ServerConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(ca?)?;
    }
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .allow_unauthenticated()
        .build()?;
    let chain = CertificateDer::pem_slice_iter(cert_pem.as_bytes()).collect::<Result<Vec<_>, _>>()?;
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
