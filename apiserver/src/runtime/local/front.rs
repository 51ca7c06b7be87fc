//! A backend's front address in the local runtime: what a Service is for the leader Pods in a
//! cluster. Two stable loopback ports (gRPC and the fast port) forward every connection to the
//! leader process that serves now — ready, and under the highest epoch when a deposed one has not
//! noticed yet — the way a Service's endpoints select ready Pods. Members and engines are given
//! this address, so a failover needs no reconfiguration of anyone.
//!
//! With no serving leader a connection is closed at once (a Service without endpoints refuses).
//! When the serving leader changes, every connection forwarded to the previous one is closed,
//! so clients reconnect to the new one at once instead of waiting on a leader that died or hangs.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use super::process::Probe;

/// One leader process behind the front: its own ports and its readiness.
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub grpc: SocketAddr,
    pub fast: SocketAddr,
    pub probe: Probe,
}

/// Where connections go now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Target {
    grpc: SocketAddr,
    fast: SocketAddr,
}

/// A running front; dropping it stops forwarding.
#[derive(Debug)]
pub struct Front {
    pub grpc: SocketAddr,
    pub fast: SocketAddr,
    endpoints: Arc<Mutex<Vec<Endpoint>>>,
    target: watch::Sender<Option<Target>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Front {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        // closes every forwarded connection
        self.target.send_replace(None);
    }
}

impl Front {
    /// Listens on `grpc` and `fast` (port 0: any).
    pub fn bind(grpc: SocketAddr, fast: SocketAddr) -> std::io::Result<Front> {
        let listen = |a: SocketAddr| -> std::io::Result<TcpListener> {
            let l = std::net::TcpListener::bind(a)?;
            l.set_nonblocking(true)?;
            TcpListener::from_std(l)
        };
        let (g, f) = (listen(grpc)?, listen(fast)?);
        let (grpc, fast) = (g.local_addr()?, f.local_addr()?);
        let target = watch::Sender::new(None);
        let tasks = vec![
            tokio::spawn(accept(g, target.subscribe(), |t: Target| t.grpc)),
            tokio::spawn(accept(f, target.subscribe(), |t: Target| t.fast)),
        ];
        Ok(Front {
            grpc,
            fast,
            endpoints: Arc::default(),
            target,
            tasks,
        })
    }

    /// The leader processes behind the front.
    pub fn set_endpoints(&self, endpoints: Vec<Endpoint>) {
        *self.endpoints.lock() = endpoints;
        self.reselect();
    }

    /// Something to call whenever a leader's readiness changes.
    pub fn reselector(&self) -> impl Fn() + Send + Sync + 'static {
        let (endpoints, target) = (self.endpoints.clone(), self.target.clone());
        move || select(&endpoints, &target)
    }

    /// Chooses the serving leader again.
    pub fn reselect(&self) {
        select(&self.endpoints, &self.target);
    }

    /// The serving leader's gRPC address, if one serves.
    pub fn serving(&self) -> Option<SocketAddr> {
        self.target.borrow().map(|t| t.grpc)
    }
}

fn select(endpoints: &Mutex<Vec<Endpoint>>, target: &watch::Sender<Option<Target>>) {
    let best = endpoints
        .lock()
        .iter()
        .filter_map(|e| e.probe.serving().map(|epoch| (epoch, e)))
        .max_by_key(|(epoch, _)| *epoch)
        .map(|(_, e)| Target {
            grpc: e.grpc,
            fast: e.fast,
        });
    target.send_if_modified(|t| {
        if *t == best {
            return false;
        }
        tracing::info!(from = ?t.map(|t| t.grpc), to = ?best.map(|t| t.grpc), "front: serving leader changed");
        *t = best;
        true
    });
}

/// Forwards each accepted connection to the current target's port until the target changes.
async fn accept(listener: TcpListener, target: watch::Receiver<Option<Target>>, port: fn(Target) -> SocketAddr) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let mut rx = target.clone();
        let Some(t) = *rx.borrow_and_update() else {
            // no serving leader: refuse, as a Service without ready endpoints
            drop(client);
            continue;
        };
        tokio::spawn(async move {
            let Ok(Ok(mut upstream)) = tokio::time::timeout(Duration::from_secs(1), TcpStream::connect(port(t))).await
            else {
                return;
            };
            let _ = upstream.set_nodelay(true);
            let _ = client.set_nodelay(true);
            let mut client = client;
            tokio::select! {
                _ = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {}
                _ = rx.wait_for(|now| *now != Some(t)) => {}
            }
        });
    }
}
