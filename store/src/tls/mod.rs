//! TLS on the store's TCP ports: gRPC (leader and members), the leader's fast port and the
//! members' data port. The same-host socket is a Unix socket on the member's own host and stays
//! as it is. This file holds the server and client configurations ([`ServerTls`], [`ClientTls`]);
//! `flags.rs` the flags that load them (a leader takes [`ServeFlags`]; a member takes them and
//! [`DialFlags`]; clients take [`DialFlags`], or a replica's environment); `conn.rs` [`Conn`], a
//! framed port's connection, plain or encrypted; `record.rs` the TLS 1.3 records of the framed
//! ports and `sealed.rs` the stream that carries them.
//!
//! **Whose name a client checks.** Every process of one backend (its leaders and its members)
//! serves one certificate, which the runtime issues for the backend's store name. Clients dial
//! whatever address they are handed (a Service, a Pod's IP, the address a member advertised) and
//! check every peer against that one name (`--tls-server-name`), not against the address: a peer
//! is trusted when it holds a key the runtime issued for this backend. Without
//! `--tls-server-name` the host dialled is the name checked, as usual.
//!
//! **Cipher.** TLS 1.3 only; AES-128-GCM first: on CPUs with AES instructions it is the fastest
//! of the suites ring offers (measured here: ~9.7 GB/s against ~8.5 for AES-256-GCM and ~2.6 for
//! ChaCha20-Poly1305 on one core), and the data port moves every value through it. Servers send
//! no session tickets: connections are pooled and long-lived, and a ticket arriving unasked would
//! look like data on a pooled connection.

use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;

use crate::flags::ConfigError;

pub mod bound;
mod conn;
mod flags;
mod record;
mod sealed;

pub use conn::{Conn, accept, connect};
pub use flags::{CA_ENV, CA_PEM_ENV, DialFlags, SERVER_NAME_ENV, ServeFlags};
#[doc(hidden)]
pub use record::fuzzing;
pub use sealed::Sealed;

/// How long a TLS handshake may take on a framed port, from the first byte.
pub const HANDSHAKE: Duration = Duration::from_secs(10);

/// The ring provider with AES-128-GCM first (module doc).
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    use rustls::crypto::ring::cipher_suite::*;
    let mut p = rustls::crypto::ring::default_provider();
    p.cipher_suites = vec![
        TLS13_AES_128_GCM_SHA256,
        TLS13_AES_256_GCM_SHA384,
        TLS13_CHACHA20_POLY1305_SHA256,
    ];
    Arc::new(p)
}

fn read(flag: &'static str, path: &Path) -> Result<Vec<u8>, ConfigError> {
    std::fs::read(path).map_err(|e| ConfigError::new(flag, format!("cannot read {}: {e}", path.display())))
}

fn certificates(flag: &'static str, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, ConfigError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| ConfigError::new(flag, format!("not PEM certificates: {e}")))?;
    if certs.is_empty() {
        return Err(ConfigError::new(
            flag,
            "holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
        ));
    }
    Ok(certs)
}

/// The server side: a certificate and its key.
#[derive(Clone)]
pub struct ServerTls {
    acceptor: tokio_rustls::TlsAcceptor,
    cert_pem: Arc<[u8]>,
    key_pem: Arc<[u8]>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ServerTls")
    }
}

impl ServerTls {
    pub fn load(cert: &Path, key: &Path) -> Result<Self, ConfigError> {
        Self::from_pem(&read("tls-cert", cert)?, &read("tls-key", key)?)
    }

    pub fn from_pem(cert_pem: &[u8], key_pem: &[u8]) -> Result<Self, ConfigError> {
        let chain = certificates("tls-cert", cert_pem)?;
        let key = PrivateKeyDer::from_pem_slice(key_pem)
            .map_err(|e| ConfigError::new("tls-key", format!("not a PEM private key: {e}")))?;
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| ConfigError::new("tls-cert", e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(|e| ConfigError::new("tls-key", format!("does not go with the certificate: {e}")))?;
        config.send_tls13_tickets = 0;
        config.alpn_protocols = vec![b"h2".to_vec(), b"kvstore".to_vec()];
        // the framed ports run the record layer themselves (`sealed.rs`)
        config.enable_secret_extraction = true;
        Ok(Self {
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
            cert_pem: cert_pem.into(),
            key_pem: key_pem.into(),
        })
    }

    /// Completes the handshake on an accepted connection of a framed port, within [`HANDSHAKE`],
    /// and takes its keys over (`sealed.rs`). The client sends nothing after its `Finished`
    /// until this side's first record, an empty one, so no byte is left in rustls's buffers when
    /// the keys leave it.
    pub async fn accept(&self, tcp: TcpStream) -> io::Result<Conn> {
        let sealed = tokio::time::timeout(HANDSHAKE, async {
            let tls = self.acceptor.accept(tcp).await?;
            let (tcp, conn) = tls.into_inner();
            let secrets = conn.dangerous_extract_secrets().map_err(io::Error::other)?;
            let mut sealed = Sealed::new(tcp, secrets)?;
            sealed.send_ready().await?;
            io::Result::Ok(sealed)
        })
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "TLS handshake not done in time"))??;
        Ok(Conn::Sealed(Box::new(sealed)))
    }

    /// The same identity for a gRPC server.
    pub fn grpc(&self) -> tonic::transport::ServerTlsConfig {
        tonic::transport::ServerTlsConfig::new()
            .identity(tonic::transport::Identity::from_pem(&self.cert_pem, &self.key_pem))
            .timeout(HANDSHAKE)
    }
}

/// The client side: the certificates peers must chain to, and the name they must carry.
#[derive(Clone)]
pub struct ClientTls {
    connector: tokio_rustls::TlsConnector,
    ca_pem: Arc<[u8]>,
    server_name: Option<String>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("server_name", &self.server_name)
            .finish()
    }
}

impl ClientTls {
    pub fn load(ca: &Path, server_name: Option<String>) -> Result<Self, ConfigError> {
        Self::from_pem(&read("tls-ca", ca)?, server_name)
    }

    pub fn from_pem(ca_pem: &[u8], server_name: Option<String>) -> Result<Self, ConfigError> {
        let mut roots = rustls::RootCertStore::empty();
        for c in certificates("tls-ca", ca_pem)? {
            roots
                .add(c)
                .map_err(|e| ConfigError::new("tls-ca", format!("not a usable CA certificate: {e}")))?;
        }
        if let Some(n) = &server_name {
            ServerName::try_from(n.clone()).map_err(|e| {
                ConfigError::new("tls-server-name", format!("{n:?} is not a DNS name or IP address: {e}"))
            })?;
        }
        let mut config = rustls::ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| ConfigError::new("tls-ca", e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"kvstore".to_vec()];
        config.resumption = rustls::client::Resumption::disabled();
        config.enable_secret_extraction = true;
        Ok(Self {
            connector: tokio_rustls::TlsConnector::from(Arc::new(config)),
            ca_pem: ca_pem.into(),
            server_name,
        })
    }

    /// The name a peer at `addr` (HOST:PORT) must carry.
    pub fn name_for(&self, addr: &str) -> String {
        match &self.server_name {
            Some(n) => n.clone(),
            None => host(addr).to_owned(),
        }
    }

    /// Completes the handshake on a connection to `addr`'s framed port, within [`HANDSHAKE`],
    /// and takes its keys over once the server says it has taken its own (`accept`).
    pub async fn connect(&self, tcp: TcpStream, addr: &str) -> io::Result<Conn> {
        let name = ServerName::try_from(self.name_for(addr))
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{addr}: {e}")))?;
        let sealed = tokio::time::timeout(HANDSHAKE, async {
            let tls = self.connector.connect(name, tcp).await?;
            let (tcp, conn) = tls.into_inner();
            let secrets = conn.dangerous_extract_secrets().map_err(io::Error::other)?;
            let mut sealed = Sealed::new(tcp, secrets)?;
            sealed.receive_ready().await?;
            io::Result::Ok(sealed)
        })
        .await
        .map_err(|_| {
            io::Error::new(
                io::ErrorKind::TimedOut,
                format!("{addr}: TLS handshake not done in time"),
            )
        })??;
        Ok(Conn::Sealed(Box::new(sealed)))
    }

    /// The same trust for a gRPC channel to `addr`.
    pub fn grpc(&self, addr: &str) -> tonic::transport::ClientTlsConfig {
        tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(&self.ca_pem))
            .domain_name(self.name_for(addr))
            .timeout(HANDSHAKE)
    }
}

/// The host of `HOST:PORT` (brackets of an IPv6 address removed).
fn host(addr: &str) -> &str {
    let h = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    h.trim_start_matches('[').trim_end_matches(']')
}

/// How often a gRPC server pings a connection that is quiet, and how long it waits for the answer
/// before it closes the connection (a peer that went away without closing it).
pub const GRPC_KEEPALIVE: (Duration, Duration) = (Duration::from_secs(20), Duration::from_secs(10));
/// The longest a gRPC call's handler may take, its request's body included (a stream's
/// messages come after and are not counted).
pub const GRPC_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// A gRPC server builder, serving TLS as `tls` says, with keepalive pings and a timeout on every
/// call ([`GRPC_KEEPALIVE`], [`GRPC_REQUEST_TIMEOUT`]).
pub fn grpc_server(tls: Option<&ServerTls>) -> Result<tonic::transport::Server, ConfigError> {
    let builder = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(GRPC_KEEPALIVE.0))
        .http2_keepalive_timeout(Some(GRPC_KEEPALIVE.1))
        .timeout(GRPC_REQUEST_TIMEOUT);
    match tls {
        None => Ok(builder),
        Some(t) => builder
            .tls_config(t.grpc())
            .map_err(|e| ConfigError::new("tls-cert", format!("cannot serve gRPC with it: {e}"))),
    }
}

/// `http://` or `https://` in front of `addr`, as a gRPC endpoint, with the TLS it takes.
pub fn grpc_endpoint(
    addr: &str,
    tls: Option<&ClientTls>,
) -> Result<tonic::transport::Endpoint, tonic::transport::Error> {
    match tls {
        None => tonic::transport::Endpoint::from_shared(format!("http://{addr}")),
        Some(t) => tonic::transport::Endpoint::from_shared(format!("https://{addr}"))?.tls_config(t.grpc(addr)),
    }
}

#[cfg(test)]
pub mod testing {
    //! A CA and a certificate for a store name, made in memory for tests.

    /// (CA PEM, certificate PEM, key PEM) for `name`.
    pub fn issue(name: &str) -> (String, String, String) {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca.distinguished_name.push(rcgen::DnType::CommonName, "test store CA");
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca, ca_key);
        let key = rcgen::KeyPair::generate().unwrap();
        let leaf = rcgen::CertificateParams::new(vec![name.to_owned()]).unwrap();
        let cert = leaf.signed_by(&key, &issuer).unwrap();
        (ca_cert.pem(), cert.pem(), key.serialize_pem())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn pair(server: &ServerTls, client: &ClientTls) -> (io::Result<Conn>, io::Result<Conn>) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let dial = async {
            let tcp = TcpStream::connect(&addr).await.unwrap();
            client.connect(tcp, &addr).await
        };
        let answer = async {
            let (tcp, _) = l.accept().await.unwrap();
            server.accept(tcp).await
        };
        tokio::join!(dial, answer)
    }

    #[tokio::test]
    async fn a_client_talks_to_a_server_holding_the_name_it_expects_and_to_no_other() {
        let (ca, cert, key) = testing::issue("store.team-a.kvcache");
        let server = ServerTls::from_pem(cert.as_bytes(), key.as_bytes()).unwrap();
        let client = ClientTls::from_pem(ca.as_bytes(), Some("store.team-a.kvcache".into())).unwrap();
        let (c, s) = pair(&server, &client).await;
        let (mut c, mut s) = (c.unwrap(), s.unwrap());
        c.write_all(b"ping").await.unwrap();
        c.flush().await.unwrap();
        let mut got = [0u8; 4];
        s.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"ping");

        // another backend's name: refused by the client
        let other = ClientTls::from_pem(ca.as_bytes(), Some("store.team-b.kvcache".into())).unwrap();
        let (c, _) = pair(&server, &other).await;
        let e = c.unwrap_err().to_string();
        assert!(e.contains("NotValidForName") || e.contains("not valid"), "{e}");
        // another CA: refused by the client
        let (ca2, _, _) = testing::issue("store.team-a.kvcache");
        let stranger = ClientTls::from_pem(ca2.as_bytes(), Some("store.team-a.kvcache".into())).unwrap();
        let (c, _) = pair(&server, &stranger).await;
        let e = c.unwrap_err().to_string();
        assert!(e.contains("UnknownIssuer") || e.contains("BadSignature"), "{e}");
        // the host dialled is the name when none is given: 127.0.0.1 is not on the certificate
        let by_address = ClientTls::from_pem(ca.as_bytes(), None).unwrap();
        assert_eq!(by_address.name_for("127.0.0.1:7"), "127.0.0.1");
        assert_eq!(by_address.name_for("[::1]:7"), "::1");
        let (c, _) = pair(&server, &by_address).await;
        assert!(c.is_err());
    }
}
