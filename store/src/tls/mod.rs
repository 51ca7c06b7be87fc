//! TLS on the store's TCP ports: gRPC (leader and members), the leader's fast port and the
//! members' data port. The same-host socket is a Unix socket on the member's own host and stays
//! as it is. This module owns the flags (`--tls-cert`, `--tls-key`, `--tls-ca`,
//! `--tls-server-name`), the server and client configurations they load, and [`Conn`], a framed
//! port's connection, plain or encrypted. A leader takes [`ServeFlags`]; a member takes them and
//! [`DialFlags`] (it dials the leader); clients take [`DialFlags`], or a replica's environment.
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
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::flags::ConfigError;

pub mod sealed;
pub use sealed::Sealed;

/// How long a TLS handshake may take on a framed port, from the first byte.
pub const HANDSHAKE: Duration = Duration::from_secs(10);

/// The TLS flags of a process that serves store ports (a leader, a member).
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
pub struct ServeFlags {
    /// PEM certificate chain this process serves its TCP ports with (with `--tls-key`); every
    /// port is then TLS only. Without it the ports are plaintext.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of `--tls-cert`.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

/// The TLS flags of whatever dials a leader or member (a member, `bench`, `tenants`).
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
pub struct DialFlags {
    /// PEM certificates the leader's and members' certificates must chain to; connections to
    /// them then use TLS, and a peer whose certificate does not verify is refused.
    #[arg(long)]
    pub tls_ca: Option<PathBuf>,
    /// The name every leader's and member's certificate must carry (with `--tls-ca`); default:
    /// the host dialled.
    #[arg(long, requires = "tls_ca")]
    pub tls_server_name: Option<String>,
    /// The CA certificates themselves (PEM), instead of `--tls-ca`'s file: a replica's
    /// environment may carry them ([`CA_PEM_ENV`]). Not a flag.
    #[arg(skip)]
    pub tls_ca_pem: Option<String>,
}

/// The environment a replica's client reads TLS from: the CA as a file ([`CA_ENV`], as
/// `--tls-ca`) or inline ([`CA_PEM_ENV`], what injection sets: a CA certificate is public), and
/// the name ([`SERVER_NAME_ENV`], as `--tls-server-name`).
pub const CA_ENV: &str = "KVSTORE_TLS_CA";
pub const CA_PEM_ENV: &str = "KVSTORE_TLS_CA_PEM";
pub const SERVER_NAME_ENV: &str = "KVSTORE_TLS_SERVER_NAME";

impl ServeFlags {
    /// What a process serves with: `None` without `--tls-cert`.
    pub fn server(&self) -> Result<Option<ServerTls>, ConfigError> {
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => ServerTls::load(cert, key).map(Some),
            (None, None) => Ok(None),
            (Some(_), None) => Err(ConfigError::new(
                "tls-key",
                "goes with --tls-cert; give both or neither",
            )),
            (None, Some(_)) => Err(ConfigError::new(
                "tls-cert",
                "goes with --tls-key; give both or neither",
            )),
        }
    }

    /// The flags as a command line (for runtimes that spawn processes).
    pub fn to_args(&self, out: &mut Vec<String>) {
        use crate::flags::push;
        if let Some(p) = &self.tls_cert {
            push(out, "tls-cert", p.display());
        }
        if let Some(p) = &self.tls_key {
            push(out, "tls-key", p.display());
        }
    }
}

impl DialFlags {
    /// What the dialler trusts: `None` without `--tls-ca`.
    pub fn client(&self) -> Result<Option<ClientTls>, ConfigError> {
        match (&self.tls_ca, &self.tls_ca_pem) {
            (Some(ca), _) => ClientTls::load(ca, self.tls_server_name.clone()).map(Some),
            (None, Some(pem)) => ClientTls::from_pem(pem.as_bytes(), self.tls_server_name.clone()).map(Some),
            (None, None) if self.tls_server_name.is_some() => {
                Err(ConfigError::new("tls-server-name", "goes with --tls-ca"))
            }
            (None, None) => Ok(None),
        }
    }

    pub fn to_args(&self, out: &mut Vec<String>) {
        use crate::flags::push;
        if let Some(p) = &self.tls_ca {
            push(out, "tls-ca", p.display());
        }
        if let Some(n) = &self.tls_server_name {
            push(out, "tls-server-name", n);
        }
    }

    /// The same from a replica's environment ([`CA_ENV`], [`SERVER_NAME_ENV`]); errors name the
    /// variable.
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Self {
        let get = |k: &str| get(k).filter(|v| !v.is_empty());
        Self {
            tls_ca: get(CA_ENV).map(PathBuf::from),
            tls_server_name: get(SERVER_NAME_ENV),
            tls_ca_pem: get(CA_PEM_ENV),
        }
    }

    /// [`client`](Self::client), with errors naming the environment's variables.
    pub fn client_from_env(&self) -> Result<Option<ClientTls>, String> {
        self.client().map_err(|e| {
            let var = match (e.flag, &self.tls_ca) {
                ("tls-server-name", _) => SERVER_NAME_ENV,
                (_, None) => CA_PEM_ENV,
                _ => CA_ENV,
            };
            format!("{var}: {}", e.message)
        })
    }
}

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

/// A gRPC server builder, serving TLS as `tls` says.
pub fn grpc_server(tls: Option<&ServerTls>) -> Result<tonic::transport::Server, ConfigError> {
    let builder = tonic::transport::Server::builder();
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

/// A connection on a framed port: plain TCP, or TLS over it (`sealed.rs`).
#[derive(Debug)]
pub enum Conn {
    Plain(TcpStream),
    Sealed(Box<Sealed>),
}

impl Conn {
    /// The TCP connection underneath.
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Self::Plain(s) => s,
            Self::Sealed(s) => s.tcp(),
        }
    }

    /// Whether received bytes already wait here: a TLS record may hold more than one read takes,
    /// so a caller that polls the socket for readability must ask this first, or it would wait
    /// for bytes that are already here. Always `false` on a plain connection.
    pub fn has_buffered(&self) -> bool {
        match self {
            Self::Plain(_) => false,
            Self::Sealed(s) => s.has_buffered(),
        }
    }

    /// Whether a client should make a new connection rather than reuse this one (its keys have
    /// protected half of what they may: `sealed.rs`).
    pub fn worn_out(&self) -> bool {
        match self {
            Self::Plain(_) => false,
            Self::Sealed(s) => s.worn_out(),
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Self::Sealed(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Self::Sealed(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Self::Sealed(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Self::Plain(s) => s.is_write_vectored(),
            Self::Sealed(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_flush(cx),
            Self::Sealed(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Self::Sealed(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// A connection accepted on a framed port, as `tls` says: a TLS handshake first, or plain.
pub async fn accept(tls: Option<&ServerTls>, tcp: TcpStream) -> io::Result<Conn> {
    match tls {
        Some(t) => t.accept(tcp).await,
        None => Ok(Conn::Plain(tcp)),
    }
}

/// A connection made to `addr`, as `tls` says.
pub async fn connect(tls: Option<&ClientTls>, tcp: TcpStream, addr: &str) -> io::Result<Conn> {
    match tls {
        Some(t) => t.connect(tcp, addr).await,
        None => Ok(Conn::Plain(tcp)),
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

    #[test]
    fn flags_that_cannot_work_are_refused_with_the_flag_named() {
        let (ca, cert, key) = testing::issue("x");
        let dir = tempfile::tempdir().unwrap();
        let write = |n: &str, s: &str| {
            let p = dir.path().join(n);
            std::fs::write(&p, s).unwrap();
            p
        };
        let (ca, cert, key) = (write("ca", &ca), write("cert", &cert), write("key", &key));
        let junk = write("junk", "not pem");
        let dial = DialFlags {
            tls_ca: Some(ca.clone()),
            tls_server_name: Some("x".into()),
            tls_ca_pem: None,
        };
        let ok = ServeFlags {
            tls_cert: Some(cert.clone()),
            tls_key: Some(key.clone()),
        };
        assert!(ok.server().unwrap().is_some() && dial.client().unwrap().is_some());
        assert!(ServeFlags::default().server().unwrap().is_none() && DialFlags::default().client().unwrap().is_none());
        let cases = [
            (
                ServeFlags {
                    tls_cert: Some(junk.clone()),
                    ..ok.clone()
                }
                .server()
                .unwrap_err(),
                "tls-cert",
            ),
            (
                ServeFlags {
                    tls_key: Some(cert.clone()),
                    ..ok.clone()
                }
                .server()
                .unwrap_err(),
                "tls-key",
            ),
            (
                ServeFlags {
                    tls_key: Some(dir.path().join("none")),
                    ..ok.clone()
                }
                .server()
                .unwrap_err(),
                "tls-key",
            ),
            (
                DialFlags {
                    tls_ca: Some(junk.clone()),
                    ..dial.clone()
                }
                .client()
                .unwrap_err(),
                "tls-ca",
            ),
            (
                DialFlags {
                    tls_server_name: Some("a b".into()),
                    ..dial.clone()
                }
                .client()
                .unwrap_err(),
                "tls-server-name",
            ),
        ];
        for (e, flag) in cases {
            assert_eq!(e.flag, flag, "{e}");
        }
        let mut args = Vec::new();
        ok.to_args(&mut args);
        assert_eq!(crate::flags::parse_flags::<ServeFlags, _, _>(&args).unwrap(), ok);
        let mut args = Vec::new();
        dial.to_args(&mut args);
        assert_eq!(crate::flags::parse_flags::<DialFlags, _, _>(&args).unwrap(), dial);
        // a replica's environment
        let env = |k: &str| match k {
            CA_ENV => Some(junk.display().to_string()),
            _ => None,
        };
        let e = DialFlags::from_env(env).client_from_env().unwrap_err();
        assert!(e.starts_with("KVSTORE_TLS_CA: holds no PEM certificate"), "{e}");
        assert_eq!(DialFlags::from_env(|_| Some(String::new())), DialFlags::default());
        // the CA inline, as injection gives it
        let pem = std::fs::read_to_string(&ca).unwrap();
        let inline = DialFlags::from_env(|k| match k {
            CA_PEM_ENV => Some(pem.clone()),
            SERVER_NAME_ENV => Some("x".into()),
            _ => None,
        });
        assert!(inline.client_from_env().unwrap().is_some());
        let e = DialFlags::from_env(|k| (k == CA_PEM_ENV).then(|| "junk".to_owned()))
            .client_from_env()
            .unwrap_err();
        assert!(e.starts_with("KVSTORE_TLS_CA_PEM: "), "{e}");
    }
}
