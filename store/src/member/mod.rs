//! A member: one process per node holding a segment of memory. It maps the segment, mounts it at
//! the leader, heartbeats, remounts (empty) whenever the leader does not know it, and serves
//! writes and reads of byte ranges on its data port and over gRPC.
//!
//! Map: `mmap` (the mapping and the only unsafe code), `segment` (transfer checks), `dataport`
//! (framed TCP), `service` (gRPC `SegmentData`), and here the mount and heartbeat loop.

pub mod dataport;
pub mod mmap;
pub mod segment;
pub mod service;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;

use crate::error::{ErrorCode, StoreError};
use crate::metrics::{Family, Source};
use crate::proto::membership_client::MembershipClient;
use crate::proto::{HeartbeatRequest, MountRequest};
use segment::Segment;

/// How a member runs.
#[derive(Debug, Clone)]
pub struct MemberConfig {
    pub leader: String,
    pub name: String,
    pub capacity: u64,
    pub shm_dir: PathBuf,
    /// host written into the addresses given to the leader (defaults to the listen address's)
    pub advertise_host: Option<String>,
    pub max_value_size: u64,
    pub prefault: bool,
    /// how long the data port keeps polling after a request (`spin.rs`); zero: never
    pub spin: Duration,
}

/// A member with its listeners bound, ready to run.
#[derive(Debug)]
pub struct Member {
    cfg: MemberConfig,
    segment: Arc<Segment>,
    grpc: TcpListener,
    data: TcpListener,
}

impl Member {
    /// Maps the segment and binds the gRPC and data listeners.
    pub async fn bind(cfg: MemberConfig, grpc: SocketAddr, data: SocketAddr) -> Result<Self, StoreError> {
        let map = mmap::SharedMap::create(&cfg.shm_dir, cfg.capacity).map_err(|e| {
            StoreError::new(
                ErrorCode::Internal,
                format!(
                    "cannot map a {}-byte segment in {}: {e}; check the directory exists and has room (--shm-dir)",
                    cfg.capacity,
                    cfg.shm_dir.display()
                ),
            )
        })?;
        let segment = Arc::new(Segment::new(map));
        if cfg.prefault {
            let s = segment.clone();
            tokio::task::spawn_blocking(move || s.prefault())
                .await
                .map_err(|e| bind_err("prefault", e))?;
        }
        let grpc = TcpListener::bind(grpc)
            .await
            .map_err(|e| bind_err("gRPC listen address", e))?;
        let data = crate::net::data_listener(data).map_err(|e| bind_err("data listen address", e))?;
        Ok(Self {
            cfg,
            segment,
            grpc,
            data,
        })
    }

    pub fn segment(&self) -> Arc<Segment> {
        self.segment.clone()
    }

    fn advertised(&self, addr: SocketAddr) -> Result<String, StoreError> {
        match &self.cfg.advertise_host {
            Some(h) => Ok(format!("{h}:{}", addr.port())),
            None if addr.ip().is_unspecified() => Err(StoreError::new(
                ErrorCode::InvalidArgument,
                "the member listens on an unspecified address; give --advertise-host so engines know where to connect",
            )),
            None => Ok(addr.to_string()),
        }
    }

    /// Serves and keeps the segment mounted until the process ends.
    pub async fn run(self) -> Result<(), StoreError> {
        let grpc_addr = self.advertised(self.grpc.local_addr().map_err(|e| bind_err("gRPC", e))?)?;
        let data_addr = self.advertised(self.data.local_addr().map_err(|e| bind_err("data", e))?)?;
        tracing::info!(%grpc_addr, %data_addr, capacity = self.cfg.capacity, "member serving");
        let hot = crate::spin::HotWindow::start(self.cfg.spin);
        tokio::spawn(dataport::serve(self.data, self.segment.clone(), hot));
        let max = usize::try_from(self.cfg.max_value_size)
            .unwrap_or(usize::MAX)
            .saturating_add(64 * 1024);
        let svc = service::DataService {
            segment: self.segment.clone(),
        }
        .server(max);
        let incoming = crate::net::incoming(self.grpc);
        tokio::spawn(async move {
            if let Err(e) = tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming(incoming)
                .await
            {
                tracing::error!(error = %e, "member gRPC server stopped");
            }
        });
        let req = MountRequest {
            name: self.cfg.name.clone(),
            data_addr,
            grpc_addr,
            capacity: self.cfg.capacity,
            mount_id: 0,
        };
        stay_mounted(&self.cfg.leader, req, &self.segment).await;
        Ok(())
    }
}

fn bind_err(what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::new(ErrorCode::Internal, format!("cannot set up the {what}: {e}"))
}

/// Mounts, heartbeats, and mounts again (starting empty) whenever the leader asks.
async fn stay_mounted(leader: &str, req: MountRequest, segment: &Segment) {
    let endpoint = format!("http://{leader}");
    let mut backoff = Duration::from_millis(100);
    loop {
        segment.set_mount(0);
        let mut client = match MembershipClient::connect(endpoint.clone()).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(%leader, error = %e, "leader unreachable, retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
                continue;
            }
        };
        // adopt the new mount first: the leader may place values here as soon as it answers
        let mount_id = uuid::Uuid::new_v4().as_u64_pair().0 | 1;
        segment.set_mount(mount_id);
        let mounted = match client
            .mount(MountRequest {
                mount_id,
                ..req.clone()
            })
            .await
        {
            Ok(r) => r.into_inner(),
            Err(e) => {
                tracing::warn!(%leader, error = %e, "mount refused, retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
                continue;
            }
        };
        backoff = Duration::from_millis(100);
        // the leader keeps the member's choice unless it clashes with another mount
        segment.set_mount(mounted.mount_id);
        tracing::info!(
            member_id = mounted.member_id,
            mount_id = mounted.mount_id,
            "segment mounted"
        );
        let interval = Duration::from_millis(mounted.heartbeat_interval_ms.max(10));
        loop {
            tokio::time::sleep(interval).await;
            let hb = HeartbeatRequest {
                member_id: mounted.member_id,
                mount_id: mounted.mount_id,
            };
            match client.heartbeat(hb).await {
                Ok(r) if r.get_ref().need_remount => {
                    tracing::warn!("leader does not know this mount; remounting empty");
                    break;
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "heartbeat failed"),
            }
        }
    }
}

/// Metrics and readiness of a member.
#[derive(Debug)]
pub struct MemberMetrics(pub Arc<Segment>);

impl Source for MemberMetrics {
    fn metrics(&self) -> String {
        use std::sync::atomic::Ordering::Relaxed;
        let s = &self.0;
        let c = &s.counters;
        let mut out = String::new();
        let mut g = |n: &str, h: &str, k: &str, v: u64| Family::new(n, h, k).sample(&mut out, "", v);
        g(
            "kvstore_member_ready",
            "1 while the segment is mounted at a leader",
            "gauge",
            u64::from(s.mount_id() != 0),
        );
        g(
            "kvstore_member_capacity_bytes",
            "segment capacity",
            "gauge",
            s.capacity(),
        );
        g(
            "kvstore_member_writes_total",
            "values written",
            "counter",
            c.writes.load(Relaxed),
        );
        g(
            "kvstore_member_reads_total",
            "values read",
            "counter",
            c.reads.load(Relaxed),
        );
        g(
            "kvstore_member_written_bytes_total",
            "bytes written",
            "counter",
            c.bytes_written.load(Relaxed),
        );
        g(
            "kvstore_member_read_bytes_total",
            "bytes read",
            "counter",
            c.bytes_read.load(Relaxed),
        );
        g(
            "kvstore_member_refusals_total",
            "transfers refused (stale mount, deadline, range)",
            "counter",
            c.refusals.load(Relaxed),
        );
        out
    }

    fn ready(&self) -> bool {
        self.0.mount_id() != 0
    }
}

impl Member {
    /// The bound gRPC and data addresses.
    pub fn local_addrs(&self) -> Result<(SocketAddr, SocketAddr), StoreError> {
        let g = self.grpc.local_addr().map_err(|e| bind_err("gRPC", e))?;
        let d = self.data.local_addr().map_err(|e| bind_err("data", e))?;
        Ok((g, d))
    }
}
