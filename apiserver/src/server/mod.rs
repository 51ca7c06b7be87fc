//! The HTTPS server kubectl talks to (`kv-apiserver serve`): the PKI and kubeconfig files, the
//! TLS listener, HTTP/1.1 and HTTP/2 connections into the application's pipeline, and a graceful
//! shutdown.
//!
//! | module | owns |
//! |---|---|
//! | [`filters`] | the per-request filters (metrics, authentication, authorization, limits, span) |
//! | [`tls`] | the TLS configuration that verifies client certificates |
//! | [`parse_errors`] | Status bodies for what the HTTP/1 parser refuses on its own |

pub mod parse_errors;
pub mod tls;

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;

use crate::app::App;
use crate::auth::ConnectionInfo;
use crate::auth::x509::ClientCertificate;

/// How long a client may take to finish its TLS handshake, and then to send its request head.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Most header bytes an HTTP/2 request may carry, as Go's (and kube-apiserver's) 1 MB: a long
/// path is refused on its stream, never by closing the connection.
const MAX_HTTP2_HEADER_LIST_BYTES: u32 = 1 << 20;

/// How to serve.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub listen: SocketAddr,
    /// Where `pki/` and the kubeconfig files are written.
    pub data_dir: PathBuf,
    /// After a shutdown signal: how long to keep serving with `/readyz` failing.
    pub shutdown_delay: Duration,
    /// Where the CA and certificates live (`<data-dir>/pki` unless `--pki-dir`): replicas that
    /// share it share one CA and serving certificate, so one kubeconfig reaches any of them.
    pub pki_dir: Option<PathBuf>,
    /// Aggregated mode: the serving certificate and key files (reloaded when they change). No PKI
    /// or kubeconfig is written; client certificates are verified by the delegated
    /// authenticators.
    pub serving_files: Option<(PathBuf, PathBuf)>,
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("preparing certificates: {0}")]
    Certs(#[from] kvcache_certs::CertError),
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    #[error("listening on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// Paths a running server wrote.
#[derive(Debug, Clone)]
pub struct Written {
    pub kubeconfig: PathBuf,
    pub viewer_kubeconfig: PathBuf,
}

fn serving_names(listen: &SocketAddr) -> Vec<String> {
    let mut names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
    if !listen.ip().is_unspecified() {
        names.push(listen.ip().to_string());
    }
    names
}

/// The serving line on stdout; a reader that went away is not a reason to stop serving.
fn say(line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let _ = writeln!(std::io::stdout().lock(), "{line}");
}

fn server_url(listen: &SocketAddr) -> String {
    let ip = if listen.ip().is_unspecified() {
        IpAddr::from([127, 0, 0, 1])
    } else {
        listen.ip()
    };
    match ip {
        IpAddr::V4(v4) => format!("https://{v4}:{}", listen.port()),
        IpAddr::V6(v6) => format!("https://[{v6}]:{}", listen.port()),
    }
}

/// The kubeconfig the local runtime hands the store's processes (`<data-dir>/store.kubeconfig`):
/// the election's Lease API.
pub use crate::runtime::local::STORE_KUBECONFIG;

/// Creates the PKI if needed and writes the kubeconfig files (admin, viewer, store).
pub fn prepare_credentials(
    data_dir: &Path,
    pki_dir: Option<&Path>,
    listen: &SocketAddr,
) -> Result<(kvcache_certs::Pki, Written), ServeError> {
    let dir = pki_dir.map_or_else(|| data_dir.join("pki"), Path::to_path_buf);
    let pki = kvcache_certs::Pki::ensure(&dir, &serving_names(listen))?;
    let server = server_url(listen);
    let written = Written {
        kubeconfig: data_dir.join("kubeconfig"),
        viewer_kubeconfig: data_dir.join("viewer.kubeconfig"),
    };
    let store_kubeconfig = data_dir.join(STORE_KUBECONFIG);
    for (path, user, creds) in [
        (&written.kubeconfig, "kvcache-admin", &pki.admin),
        (&written.viewer_kubeconfig, "kvcache-viewer", &pki.viewer),
        (&store_kubeconfig, kvcache_certs::STORE.user, &pki.store),
    ] {
        kvcache_certs::Kubeconfig {
            server: &server,
            ca_pem: &pki.ca.cert_pem,
            user: kvcache_certs::KubeconfigUser {
                name: user,
                credentials: creds,
            },
        }
        .write(path)?;
    }
    Ok((pki, written))
}

/// A background task that ends with its owner.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Serves `app` until `stop` resolves, then shuts down gracefully: `/readyz` fails at once,
/// serving goes on for the shutdown delay, then watches end and in-flight requests drain.
pub async fn serve(
    app: App,
    opts: ServeOptions,
    stop: impl std::future::Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let TlsSetup {
        config,
        written,
        reloader: _reloader,
    } = tls_setup(&opts)?;
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let listener = TcpListener::bind(opts.listen)
        .await
        .map_err(|source| ServeError::Listen {
            addr: opts.listen,
            source,
        })?;
    app.start();
    announce(&opts.listen, written.as_ref());
    let app = Arc::new(app);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    accept_until_stopped(&listener, &acceptor, &app, &graceful, &opts, stop).await;
    tracing::info!("shutting down: readyz fails, watches end, in-flight requests drain");
    app.shut_down();
    drop(listener);
    if tokio::time::timeout(
        opts.shutdown_delay.max(Duration::from_secs(1)) * 10,
        graceful.shutdown(),
    )
    .await
    .is_err()
    {
        tracing::warn!("connections still open after the drain timeout; closing them");
    }
    app.stop_workloads().await;
    Ok(())
}

/// How connections are secured, and what preparing that wrote or keeps running.
struct TlsSetup {
    config: Arc<rustls::ServerConfig>,
    /// The kubeconfig files written (direct mode).
    written: Option<Written>,
    /// Reloads the serving files while the server runs (aggregated mode).
    reloader: Option<AbortOnDrop>,
}

/// The TLS configuration: from our own PKI (writing the kubeconfig files), or, in aggregated
/// mode, from the serving files, kept fresh by a task.
fn tls_setup(opts: &ServeOptions) -> Result<TlsSetup, ServeError> {
    Ok(match &opts.serving_files {
        None => {
            let (pki, written) = prepare_credentials(&opts.data_dir, opts.pki_dir.as_deref(), &opts.listen)?;
            TlsSetup {
                config: tls::server_config(&pki.ca.cert_pem, &pki.serving.cert_pem, &pki.serving.key_pem)?,
                written: Some(written),
                reloader: None,
            }
        }
        Some((cert, key)) => {
            let serving = tls::ReloadingCert::open(cert, key)?;
            let reloader = AbortOnDrop(serving.keep_fresh());
            TlsSetup {
                config: tls::delegated_server_config(serving)?,
                written: None,
                reloader: Some(reloader),
            }
        }
    })
}

/// Says on stdout where the server is and how to reach it (the kubeconfig files it wrote, or
/// kube-apiserver in aggregated mode).
fn announce(listen: &SocketAddr, written: Option<&Written>) {
    let absolute = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_owned());
    match written {
        Some(written) => {
            let (admin, viewer) = (absolute(&written.kubeconfig), absolute(&written.viewer_kubeconfig));
            say(format_args!(
                "kv-apiserver serving {} ; kubeconfig written to {} (use: export KUBECONFIG={} ; kubectl get kvcb). Read-only: {}",
                server_url(listen),
                admin.display(),
                admin.display(),
                viewer.display()
            ));
        }
        None => say(format_args!(
            "kv-apiserver serving {} in aggregated mode: users and permissions come from the cluster; reach it through kube-apiserver (APIService v1.{})",
            server_url(listen),
            kvcache_api::GROUP
        )),
    }
}

/// Accepts connections, each served on a task of its own, until the shutdown delay after `stop`
/// has passed.
async fn accept_until_stopped(
    listener: &TcpListener,
    acceptor: &tokio_rustls::TlsAcceptor,
    app: &Arc<App>,
    graceful: &hyper_util::server::graceful::GracefulShutdown,
    opts: &ServeOptions,
    stop: impl std::future::Future<Output = ()> + Send,
) {
    tokio::pin!(stop);
    // After the stop signal: keep serving for `shutdown_delay` with /readyz failing, so that
    // load balancers take us out before connections are refused.
    let mut stopping: Option<std::pin::Pin<Box<tokio::time::Sleep>>> = None;
    loop {
        let (tcp, remote) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut stop, if stopping.is_none() => {
                tracing::info!(delay = ?opts.shutdown_delay, "stop requested: readyz fails from now on");
                app.set_unready();
                stopping = Some(Box::pin(tokio::time::sleep(opts.shutdown_delay)));
                continue;
            }
            () = async { if let Some(s) = stopping.as_mut() { s.await } }, if stopping.is_some() => break,
        };
        let _ = tcp.set_nodelay(true);
        tokio::spawn(serve_connection(
            tcp,
            remote,
            acceptor.clone(),
            app.clone(),
            graceful.watcher(),
        ));
    }
}

/// One connection: the TLS handshake, then HTTP/1.1 or HTTP/2 into the application's pipeline
/// until it ends or the graceful shutdown closes it.
async fn serve_connection(
    tcp: tokio::net::TcpStream,
    remote: SocketAddr,
    acceptor: tokio_rustls::TlsAcceptor,
    app: Arc<App>,
    watcher: hyper_util::server::graceful::Watcher,
) {
    let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            app.metrics.tls_handshake_error();
            tracing::debug!(%remote, "TLS handshake error: {e}");
            return;
        }
        Err(_) => return,
    };
    // The client certificate is fixed for the connection; its user is parsed once.
    let client = tls.get_ref().1.peer_certificates().map(|c| {
        Arc::new(ClientCertificate::new(
            c.iter().map(|d| d.clone().into_owned()).collect(),
        ))
    });
    let conn_info = ConnectionInfo::Tls { remote, client };
    let pipeline = app.service();
    let service = hyper::service::service_fn(move |mut req: http::Request<hyper::body::Incoming>| {
        req.extensions_mut().insert(conn_info.clone());
        pipeline.handle(req)
    });
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    builder.http2().max_header_list_size(MAX_HTTP2_HEADER_LIST_BYTES);
    let io = TokioIo::new(parse_errors::StatusOnParseError::new(tls));
    let conn = builder.serve_connection(io, service);
    if let Err(e) = watcher.watch(conn.into_owned()).await {
        tracing::debug!(%remote, "connection ended: {e}");
    }
}
