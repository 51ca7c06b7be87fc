//! What the leader's and the member's `serve` share: the error a start or a run ends with
//! ([`ServeError`]), binding a listener with the flag it came from, running a background task
//! until a token fires, and waiting a bounded time for servers to drain after a stop.
//!
//! Every long-running task takes a `CancellationToken`; `serve` returns once its token has fired
//! and its servers and loops have stopped (connections still open after [`DRAIN`] are dropped).

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::error::StoreError;
use crate::flags::ConfigError;

/// How long servers may take to finish open requests after a stop.
pub const DRAIN: Duration = Duration::from_secs(5);

/// Why a leader or member could not start, or stopped other than by its token.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cannot listen on --{flag} {addr}; pick a free port or stop what holds it")]
    Bind {
        flag: &'static str,
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("the {what} server failed")]
    Server {
        what: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Binds `addr`, naming `flag` if it cannot.
pub async fn bind(flag: &'static str, addr: SocketAddr) -> Result<TcpListener, ServeError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { flag, addr, source })
}

/// The address a listener is bound to, naming `flag` if it cannot be read.
pub fn local_addr(flag: &'static str, l: &TcpListener, asked: SocketAddr) -> Result<SocketAddr, ServeError> {
    l.local_addr().map_err(|source| ServeError::Bind {
        flag,
        addr: asked,
        source,
    })
}

/// Runs `server` (which stops by itself once `cancel` fires) and returns its result, or gives
/// up on it [`DRAIN`] after `cancel` fired (its remaining connections are dropped with it).
pub async fn drained<F, E>(server: F, cancel: &CancellationToken, what: &'static str) -> Result<(), ServeError>
where
    F: Future<Output = Result<(), E>>,
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    tokio::select! {
        r = server => r.map_err(|e| ServeError::Server { what, source: e.into() }),
        () = async { cancel.cancelled().await; tokio::time::sleep(DRAIN).await } => {
            tracing::warn!(server = what, drain_ms = DRAIN.as_millis() as u64, "connections still open after the drain; closing them");
            Ok(())
        }
    }
}

/// A spawned task that is aborted if it is still running when this is dropped.
#[derive(Debug)]
pub struct Task<T>(Option<tokio::task::JoinHandle<T>>);

impl<T: Send + 'static> Task<T> {
    pub fn spawn(f: impl Future<Output = T> + Send + 'static) -> Self {
        Self(Some(tokio::spawn(f)))
    }

    /// Waits for the task (which must be stopping: its token fired) up to [`DRAIN`]; `None` if it
    /// panicked or had to be aborted.
    pub async fn join(mut self) -> Option<T> {
        let handle = self.0.take()?;
        let abort = handle.abort_handle();
        match tokio::time::timeout(DRAIN, handle).await {
            Ok(r) => r.ok(),
            Err(_) => {
                abort.abort();
                None
            }
        }
    }
}

impl<T> Drop for Task<T> {
    fn drop(&mut self) {
        if let Some(h) = &self.0 {
            h.abort();
        }
    }
}
