//! The HTTPS API server kubectl talks to: `kv-apiserver serve`.
//!
//! | module | owns |
//! |---|---|
//! | [`api`] | the request pipeline (authn → route → authz → handler), system endpoints |
//! | [`rest`] | the REST verbs on our resources |
//! | [`resource`] | kinds behind one JSON trait; patches and field management on the way in |
//! | [`fieldmanager`] | `managedFields` and server-side apply |
//! | [`watch`] | watch streams |
//! | [`table`] | `kubectl get` columns |
//! | [`selectors`] | label and field selectors |
//! | [`discovery`], [`openapi`], [`openapi_proto`] | what clients learn about the API |
//! | [`negotiate`] | `Accept` and content types |
//! | [`auth`], [`tls`] | who is asking, what they may do, and the TLS that tells us |
//! | [`metrics`] | Prometheus metrics |

pub mod api;
pub mod auth;
pub mod discovery;
pub mod fieldmanager;
pub mod metrics;
pub mod negotiate;
pub mod openapi;
pub mod openapi_proto;
pub mod request;
pub mod resource;
pub mod rest;
pub mod selectors;
pub mod table;
pub mod tls;
pub mod watch;

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;

use crate::config::Config;
use crate::registry::{Context, Registries};
use crate::storage::Storage;
use crate::storage::embedded::{Embedded, Options as StorageOptions};

/// How to run the server.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    pub config: Config,
    /// How often watches with `allowWatchBookmarks` get a BOOKMARK.
    pub bookmark_interval: Duration,
    /// After a shutdown signal: how long to keep serving with `/readyz` failing.
    pub shutdown_delay: Duration,
    /// Changes kept for watches resuming from an older revision (older ones get 410).
    pub watch_history: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("opening the storage in {path}: {source}")]
    Storage {
        path: PathBuf,
        #[source]
        source: crate::storage::StorageError,
    },
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

/// Creates the PKI if needed and writes both kubeconfig files.
pub fn prepare_credentials(data_dir: &Path, listen: &SocketAddr) -> Result<(kvcache_certs::Pki, Written), ServeError> {
    let pki = kvcache_certs::Pki::ensure(&data_dir.join("pki"), &serving_names(listen))?;
    let server = server_url(listen);
    let written = Written {
        kubeconfig: data_dir.join("kubeconfig"),
        viewer_kubeconfig: data_dir.join("viewer.kubeconfig"),
    };
    for (path, user, creds) in [
        (&written.kubeconfig, "kvcache-admin", &pki.admin),
        (&written.viewer_kubeconfig, "kvcache-viewer", &pki.viewer),
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

/// Runs the server until `stop` resolves, then shuts down gracefully.
pub async fn serve(opts: ServeOptions, stop: impl std::future::Future<Output = ()> + Send) -> Result<(), ServeError> {
    let storage_dir = opts.data_dir.join("storage");
    let storage: Arc<dyn Storage> = Arc::new(
        Embedded::open(
            &storage_dir,
            StorageOptions {
                watch_history: opts.watch_history.max(1),
                ..StorageOptions::default()
            },
        )
        .map_err(|source| ServeError::Storage {
            path: storage_dir.clone(),
            source,
        })?,
    );
    let (pki, written) = prepare_credentials(&opts.data_dir, &opts.listen)?;
    let tls_config = tls::server_config(&pki.ca.cert_pem, &pki.serving.cert_pem, &pki.serving.key_pem)?;
    let acceptor = tokio_rustls::TlsAcceptor::from(tls_config);
    let listener = TcpListener::bind(opts.listen)
        .await
        .map_err(|source| ServeError::Listen {
            addr: opts.listen,
            source,
        })?;
    let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
    let registries = Registries::new(
        storage.clone(),
        Context {
            config: Arc::new(opts.config.clone()),
        },
    );
    let api = Arc::new(api::Api::new(
        registries,
        storage,
        Box::new(auth::X509Authenticator),
        Box::new(auth::StaticPolicy),
        shutdown_rx,
        opts.bookmark_interval,
    ));
    let absolute = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_owned());
    let (admin, viewer) = (absolute(&written.kubeconfig), absolute(&written.viewer_kubeconfig));
    println!(
        "kv-apiserver serving {} ; kubeconfig written to {} (use: export KUBECONFIG={} ; kubectl get kvcb). Read-only: {}",
        server_url(&opts.listen),
        admin.display(),
        admin.display(),
        viewer.display()
    );
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    tokio::pin!(stop);
    // After the stop signal: keep serving for `shutdown_delay` with /readyz failing, so that
    // load balancers take us out before connections are refused.
    let mut stopping: Option<std::pin::Pin<Box<tokio::time::Sleep>>> = None;
    loop {
        let (tcp, peer_addr) = tokio::select! {
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
                api.ready.store(false, std::sync::atomic::Ordering::Relaxed);
                stopping = Some(Box::pin(tokio::time::sleep(opts.shutdown_delay)));
                continue;
            }
            () = async { if let Some(s) = stopping.as_mut() { s.await } }, if stopping.is_some() => break,
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let api = api.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let tls = match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => {
                    api.metrics
                        .tls_handshake_errors
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    tracing::debug!(%peer_addr, "TLS handshake error: {e}");
                    return;
                }
                Err(_) => return,
            };
            // The client certificate is fixed for the connection: authenticate once.
            let peer: Option<Vec<_>> = tls
                .get_ref()
                .1
                .peer_certificates()
                .map(|c| c.iter().map(|d| d.clone().into_owned()).collect());
            let user = Arc::new(api.authn.authenticate(peer.as_deref()));
            let service = service_fn(move |req| api::handle(api.clone(), req, user.clone()));
            let builder = auto::Builder::new(TokioExecutor::new());
            let conn = builder.serve_connection(TokioIo::new(tls), service);
            if let Err(e) = watcher.watch(conn.into_owned()).await {
                tracing::debug!(%peer_addr, "connection ended: {e}");
            }
        });
    }
    tracing::info!("shutting down: readyz fails, watches end, in-flight requests drain");
    api.ready.store(false, std::sync::atomic::Ordering::Relaxed);
    let _ = shutdown_tx.send(true);
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
    Ok(())
}
