//! The TLS configurations.
//!
//! Direct mode ([`server_config`]): our own serving certificate, and client certificates verified
//! against our own CA when presented (anonymous clients are allowed through TLS; authorization
//! decides what they may do).
//!
//! Delegated mode ([`delegated_server_config`]): the serving certificate comes from files and is
//! reloaded when they change ([`ReloadingCert`]). Client certificates are requested but their
//! chains are not judged here, as kube-apiserver's `RequestClientCert`: TLS proves the client
//! holds the certificate's key, and each authenticator verifies the chain against its own CA
//! (the cluster's client CA, the front proxy's CA), which the cluster may rotate at any time.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;

use crate::config::FileStamp;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, ServerConfig, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, UnixTime};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading PEM: {0}")]
    Pem(#[from] rustls_pki_types::pem::Error),
    #[error("building the TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("building the client certificate verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0} holds no certificate")]
    NoCertificate(PathBuf),
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

pub fn server_config(ca_pem: &str, cert_pem: &str, key_pem: &str) -> Result<Arc<ServerConfig>, TlsError> {
    let provider = provider();
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

/// The delegated-mode configuration: `cert` serves, client certificates are requested and left
/// to the authenticators.
pub fn delegated_server_config(cert: Arc<ReloadingCert>) -> Result<Arc<ServerConfig>, TlsError> {
    let provider = provider();
    let verifier = Arc::new(RequestClientCert {
        algorithms: provider.signature_verification_algorithms,
    });
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(cert);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Asks for a client certificate, takes any chain, and checks that the client signed the
/// handshake with the certificate's key. The chain is verified later, by the authenticator whose
/// CA it must chain to; until then the certificate names nobody.
#[derive(Debug)]
struct RequestClientCert {
    algorithms: WebPkiSupportedAlgorithms,
}

impl ClientCertVerifier for RequestClientCert {
    fn client_auth_mandatory(&self) -> bool {
        false
    }

    /// No hints: Go clients (kubectl, kube-apiserver's proxy) then send the certificate they have.
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// How often the serving certificate's files are looked at.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(1);

/// A serving certificate and key read from two files, read again whenever either changes
/// (a Secret volume updated by the kubelet, `kv-apiserver certs` run again). A pair that does
/// not load (half-written, mismatched) is reported and the previous one keeps serving.
#[derive(Debug)]
pub struct ReloadingCert {
    cert_file: PathBuf,
    key_file: PathBuf,
    current: RwLock<(Stamp, Arc<CertifiedKey>)>,
}

/// What tells either file changed.
type Stamp = [FileStamp; 2];

fn stamp(cert_file: &Path, key_file: &Path) -> Stamp {
    [FileStamp::of(cert_file), FileStamp::of(key_file)]
}

fn load(cert_file: &Path, key_file: &Path) -> Result<CertifiedKey, TlsError> {
    let read = |p: &Path| {
        std::fs::read(p).map_err(|source| TlsError::Read {
            path: p.to_owned(),
            source,
        })
    };
    let chain = CertificateDer::pem_slice_iter(&read(cert_file)?).collect::<Result<Vec<_>, _>>()?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate(cert_file.to_owned()));
    }
    let key = PrivateKeyDer::from_pem_slice(&read(key_file)?)?;
    Ok(CertifiedKey::from_der(chain, key, &provider())?)
}

impl ReloadingCert {
    /// Loads the pair; an error names the file and what is wrong with it.
    pub fn open(cert_file: &Path, key_file: &Path) -> Result<Arc<ReloadingCert>, TlsError> {
        let at = stamp(cert_file, key_file);
        let key = load(cert_file, key_file)?;
        Ok(Arc::new(ReloadingCert {
            cert_file: cert_file.to_owned(),
            key_file: key_file.to_owned(),
            current: RwLock::new((at, Arc::new(key))),
        }))
    }

    /// Reads the files again if they changed; `Ok(true)` when a new pair now serves.
    pub fn refresh(&self) -> Result<bool, TlsError> {
        let at = stamp(&self.cert_file, &self.key_file);
        if self.current.read().0 == at {
            return Ok(false);
        }
        let key = load(&self.cert_file, &self.key_file)?;
        *self.current.write() = (at, Arc::new(key));
        Ok(true)
    }

    /// Refreshes every [`RELOAD_INTERVAL`] for as long as the server runs.
    pub fn keep_fresh(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let this = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut failing = false;
            loop {
                tokio::time::sleep(RELOAD_INTERVAL).await;
                let Some(this) = this.upgrade() else { return };
                match this.refresh() {
                    Ok(true) => {
                        failing = false;
                        tracing::info!(file = %this.cert_file.display(), "serving certificate reloaded");
                    }
                    Ok(false) => {}
                    // Reported once per bad state, retried every interval (a writer may be midway).
                    Err(e) if !failing => {
                        failing = true;
                        tracing::warn!(
                            "the serving certificate changed but does not load; still serving the previous one: {e}"
                        );
                    }
                    Err(_) => {}
                }
            }
        })
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.read().1.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, pair: &kvcache_certs::CertPair) {
        std::fs::write(dir.join("tls.crt"), &pair.cert_pem).unwrap();
        std::fs::write(dir.join("tls.key"), &pair.key_pem).unwrap();
    }

    fn leaf(r: &ReloadingCert) -> Vec<u8> {
        r.current.read().1.cert[0].to_vec()
    }

    #[test]
    fn a_rotated_pair_replaces_the_old_one_and_a_broken_one_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let ca = kvcache_certs::Authority::new("test-ca").unwrap();
        let names = ["localhost".to_owned()];
        write(dir.path(), &ca.serving(&names, "a").unwrap());
        let (crt, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        let r = ReloadingCert::open(&crt, &key).unwrap();
        let first = leaf(&r);
        assert!(!r.refresh().unwrap(), "nothing changed");

        let second = ca.serving(&names, "b").unwrap();
        write(dir.path(), &second);
        assert!(r.refresh().unwrap());
        assert_ne!(leaf(&r), first);
        let serving = leaf(&r);

        // A certificate whose key is another one's: refused, the previous pair still serves.
        let third = ca.serving(&names, "c").unwrap();
        std::fs::write(&crt, &third.cert_pem).unwrap();
        std::fs::write(&key, format!("{}\n", second.key_pem)).unwrap();
        assert!(r.refresh().is_err());
        assert_eq!(leaf(&r), serving);

        assert!(matches!(
            ReloadingCert::open(&dir.path().join("missing.crt"), &key),
            Err(TlsError::Read { .. })
        ));
    }
}
