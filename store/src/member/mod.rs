//! A member: one process per node holding a segment of memory. It maps the segment, mounts it at
//! the leader, heartbeats, remounts whenever the leader does not know it (handing over what it
//! holds: `mount.rs`), and serves
//! writes and reads of byte ranges on its data port and over gRPC, until its cancellation token
//! fires.
//!
//! Map: `config` (the flags, [`MemberConfig`]), `mmap` (the shared memory and the only unsafe
//! code), `segment` (transfer checks), `dataport` (framed TCP), `local` (the same-host socket:
//! clients map the segment), `service` (gRPC `SegmentData`), `mount`
//! (mounting, heartbeats, refusals), `metrics` (the collector), `tier` (the disk tier under the
//! segment: its files and their checks), and here binding and serving.
//!
//! Readiness: `Starting` until the segment is mounted (and again while it remounts), `Serving`
//! while mounted, `Stopping` once the token fires. The protocol has no unmount call, so a stopped
//! member simply goes silent: the leader drops its segment when its liveness TTL passes.

mod config;
pub mod dataport;
pub mod grpc;
pub mod local;
pub mod metrics;
pub mod mmap;
mod mount;
mod report;
pub mod segment;
pub mod tier;
pub mod tiering;
mod written;

use std::net::SocketAddr;
use std::sync::Arc;

use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use config::{LEASE_SCHEME, MemberConfig};
pub use mount::MAX_MOUNT_MESSAGE;
use segment::Segment;

use crate::error::{ErrorCode, StoreError};
use crate::lifecycle::{self, ServeError, Task};
use crate::proto::MountRequest;
use crate::readiness::{Readiness, ReadinessHandle};

/// A member with its segment mapped and its listeners bound, ready to serve.
#[derive(Debug)]
pub struct Member {
    cfg: MemberConfig,
    segment: Arc<Segment>,
    grpc: TcpListener,
    data: TcpListener,
    /// the same-host socket and its name (only with `--same-host`)
    local: Option<(tokio::net::UnixListener, String)>,
    metrics: Option<TcpListener>,
    addrs: MemberAddrs,
    readiness: ReadinessHandle,
    /// random, fresh for this process: tells the leader a remount of ours from another process
    /// that took the same name
    instance_id: u64,
    /// the member token (`--member-token-file`), shown on every Membership call
    token: Option<String>,
    tls: Tls,
    /// the disk tier (`--tier-dir`)
    tiering: Option<Arc<tiering::Tiering>>,
}

/// A member's TLS: what its gRPC and data ports serve with, and what it trusts the leader by.
#[derive(Debug)]
struct Tls {
    server: Option<crate::tls::ServerTls>,
    client: Option<crate::tls::ClientTls>,
}

/// Where a member's listeners are bound (with port 0 resolved).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemberAddrs {
    pub grpc: SocketAddr,
    pub data: SocketAddr,
    pub metrics: Option<SocketAddr>,
}

impl Member {
    /// Checks the config, maps the segment (touching every page unless `--no-prefault`) and binds
    /// the gRPC, data and metrics listeners.
    pub async fn bind(cfg: MemberConfig) -> Result<Self, ServeError> {
        cfg.validate()?;
        let token = read_member_token(&cfg)?;
        let tls = Tls {
            server: cfg.tls.server()?,
            client: cfg.dial.client()?,
        };
        let tiering = match &cfg.tier_dir {
            Some(dir) => Some(open_tier(dir, cfg.tier_capacity, cfg.tier_file_size, tier_policy(&cfg)).await?),
            None => None,
        };
        let segment = Arc::new(Segment::new(map_segment(&cfg)?));
        if !cfg.no_prefault {
            prefault(&segment).await?;
        }
        let grpc = lifecycle::bind("listen", cfg.listen).await?;
        let data = crate::net::data_listener(cfg.data_listen).map_err(|source| ServeError::Bind {
            flag: "data-listen",
            addr: cfg.data_listen,
            source,
        })?;
        let metrics = match cfg.metrics_listen {
            Some(a) => Some(lifecycle::bind("metrics-listen", a).await?),
            None => None,
        };
        let addrs = MemberAddrs {
            grpc: lifecycle::local_addr("listen", &grpc, cfg.listen)?,
            data: lifecycle::local_addr("data-listen", &data, cfg.data_listen)?,
            metrics: match (&metrics, cfg.metrics_listen) {
                (Some(l), Some(a)) => Some(lifecycle::local_addr("metrics-listen", l, a)?),
                _ => None,
            },
        };
        let instance_id = uuid::Uuid::new_v4().as_u64_pair().0 | 1;
        let local = if cfg.same_host {
            Some(bind_same_host(instance_id)?)
        } else {
            None
        };
        Ok(Self {
            cfg,
            segment,
            grpc,
            data,
            local,
            metrics,
            addrs,
            readiness: ReadinessHandle::new(),
            instance_id,
            token,
            tls,
            tiering,
        })
    }

    pub fn segment(&self) -> Arc<Segment> {
        self.segment.clone()
    }

    pub fn addrs(&self) -> MemberAddrs {
        self.addrs
    }

    /// The same-host socket's name (`@kvstore-member-…`), with `--same-host`.
    pub fn local_socket(&self) -> Option<String> {
        self.local.as_ref().map(|(_, n)| n.clone())
    }

    pub fn readiness(&self) -> &ReadinessHandle {
        &self.readiness
    }

    fn advertised(&self, addr: SocketAddr) -> String {
        match &self.cfg.advertise_host {
            Some(h) => format!("{h}:{}", addr.port()),
            None => addr.to_string(),
        }
    }

    /// The first mount this member asks for: its name, addresses and capacity, holding nothing.
    fn mount_request(&self) -> MountRequest {
        MountRequest {
            name: self.cfg.resolved_name(),
            data_addr: self.advertised(self.addrs.data),
            grpc_addr: self.advertised(self.addrs.grpc),
            capacity: self.cfg.capacity,
            mount_id: 0,
            instance_id: self.instance_id,
            local_addr: self.local_socket().unwrap_or_default(),
            holdings: Vec::new(),
            tier_capacity: self.tiering.as_ref().map_or(0, |t| t.usage().1),
            handover: crate::protocol::HANDOVER,
            ..Default::default()
        }
    }

    /// Serves the data port, gRPC and the metrics endpoint, and keeps the segment mounted at the
    /// leader, until `cancel` fires; then stops them and returns `Ok(())`. Returns an error if
    /// the leader keeps refusing the mount (another live member holds this member's name). The
    /// member's metrics are registered on `registry`, which the endpoint serves.
    pub async fn serve(self, mut registry: Registry, cancel: CancellationToken) -> Result<(), ServeError> {
        let stop = cancel.child_token();
        let req = self.mount_request();
        let Self {
            cfg,
            segment,
            grpc,
            data,
            local: local_listener,
            metrics: metrics_listener,
            readiness,
            token,
            tls,
            tiering,
            ..
        } = self;
        metrics::register(segment.clone(), tiering.clone(), readiness.clone(), &mut registry);
        let flushed = tiering.clone().map(tiering::flushed);
        let endpoint = metrics_listener.map(|l| spawn_metrics(l, registry, &readiness, flushed, &stop));
        tracing::info!(name = %req.name, grpc = %req.grpc_addr, data = %req.data_addr, capacity = cfg.capacity, "member serving");
        let hot = crate::spin::HotWindow::start(cfg.spin);
        let stores = dataport::Stores::new(&segment, tiering.as_ref());
        let port = dataport::serve(data, tls.server.clone(), stores, hot.clone(), stop.clone());
        let dataport = Task::spawn(port);
        let same_host = local_listener.map(|(l, _)| {
            Task::spawn(local::serve(
                l,
                dataport::Stores::new(&segment, tiering.as_ref()),
                !cfg.no_prefault,
                hot.clone(),
                stop.clone(),
            ))
        });
        let grpc = spawn_grpc(grpc, &cfg, tls.server.as_ref(), &segment, &readiness, &stop)?;
        let copying = tiering
            .clone()
            .map(|t| Task::spawn(t.run(segment.clone(), stop.clone())));
        let serving = Serving {
            grpc,
            dataport,
            same_host,
            hot: hot.clone(),
            endpoint,
        };

        let mounted = tokio::select! {
            r = mount::stay_mounted(
                &cfg.leader,
                cfg.kubeconfig.as_deref(),
                req,
                token.as_deref(),
                tls.client.as_ref(),
                &segment,
                tiering.as_ref(),
                &readiness,
                &hot,
            ) => r,
            () = stop.cancelled() => Ok(()),
        };
        readiness.set(Readiness::Stopping);
        stop.cancel();
        if let Some(c) = copying {
            // A clean stop copies what is still queued for the disk tier (the copier empties its
            // queue before it looks at the stop; `Task::join` waits up to its drain time), with
            // the mount still set so the copies are made: what this member held comes back from
            // disk after a restart. A supervisor that runs out of patience kills it mid-batch; a
            // torn record is left out at the next start.
            c.join().await;
        }
        // ranges of this mount are refused from here on
        segment.set_mount(0);
        let grpc_result = serving.join().await;
        tracing::info!("member stopped");
        mounted?;
        grpc_result
    }
}

/// Reads the member token (`--member-token-file`), if one is given.
fn read_member_token(cfg: &MemberConfig) -> Result<Option<String>, crate::flags::ConfigError> {
    cfg.member_token_file
        .as_ref()
        .map(|p| crate::auth::read_token(p))
        .transpose()
        .map_err(|e| crate::flags::ConfigError::new("member-token-file", e))
}

/// Opens the disk tier in `dir` (its scan on the blocking pool): `capacity` 0 takes the file
/// system's free space less a sixteenth, plus what the tier already holds.
async fn open_tier(
    dir: &std::path::Path,
    capacity: u64,
    file_size: u64,
    policy: tiering::Policy,
) -> Result<Arc<tiering::Tiering>, ServeError> {
    let dir = dir.to_path_buf();
    let opened = tokio::task::spawn_blocking(move || {
        let capacity = if capacity == 0 {
            tier::default_capacity(&dir)?
        } else {
            capacity
        };
        let cfg = tier::TierConfig {
            dir: dir.clone(),
            capacity,
            file_size,
        };
        tier::Tier::open(&cfg)
    })
    .await
    .map_err(|e| StoreError::new(ErrorCode::Internal, format!("opening the disk tier failed: {e}")))?;
    let (tier, scan) = opened.map_err(|e| crate::flags::ConfigError::new("tier-dir", e.to_string()))?;
    tracing::info!(
        dir = %tier.dir().display(),
        capacity = tier.capacity(),
        values = scan.found.len(),
        used = tier.used(),
        dead = scan.dead,
        damaged = scan.damaged,
        torn = scan.torn,
        emptied = scan.emptied,
        "disk tier opened"
    );
    if scan.damaged > 0 || scan.torn > 0 {
        tracing::warn!(
            damaged = scan.damaged,
            torn = scan.torn,
            "the disk tier holds damaged or torn records (a crash mid-write, or a file changed behind the member's back): skipped, never served"
        );
    }
    let tiering = tiering::Tiering::new(tier, scan.found, policy).map_err(|e| {
        StoreError::new(
            ErrorCode::Internal,
            format!("starting the disk tier's readers failed: {e}"),
        )
    })?;
    Ok(tiering)
}

/// How the disk tier makes room, from `--tier-key-limit`, `--tier-keep-when-full`,
/// `--tier-watermark` and `--tier-lru`.
fn tier_policy(cfg: &MemberConfig) -> tiering::Policy {
    tiering::Policy {
        key_limit: cfg.tier_key_limit,
        evict: !cfg.tier_keep_when_full,
        watermark: cfg.tier_watermark,
        lru: cfg.tier_lru,
    }
}

/// Maps the segment's shared memory (`--shm-dir`, `--capacity`); with `--same-host` it must be a
/// sealed memfd, since clients map it too.
fn map_segment(cfg: &MemberConfig) -> Result<mmap::SharedMap, ServeError> {
    let map = mmap::SharedMap::create(&cfg.shm_dir, cfg.capacity, !cfg.no_prefault).map_err(|e| {
        StoreError::new(
            ErrorCode::Internal,
            format!(
                "cannot map a {}-byte segment in {}: {e}; check the directory exists and has room (--shm-dir)",
                cfg.capacity,
                cfg.shm_dir.display()
            ),
        )
    })?;
    if cfg.same_host && !map.is_sealed() {
        return Err(StoreError::new(
            ErrorCode::Internal,
            format!(
                "--same-host hands the segment's memory to clients on this host, which needs a memfd sealed at its \
                 size, and this kernel gave a file in {} instead; run without --same-host",
                cfg.shm_dir.display()
            ),
        )
        .into());
    }
    Ok(map)
}

/// Touches every page of the segment (off the async threads), so serving never faults one in.
async fn prefault(segment: &Arc<Segment>) -> Result<(), StoreError> {
    let s = segment.clone();
    tokio::task::spawn_blocking(move || s.prefault())
        .await
        .map_err(|e| StoreError::new(ErrorCode::Internal, format!("prefaulting the segment failed: {e}")))
}

/// Binds the same-host socket of this process (`--same-host`), returning it with its name.
fn bind_same_host(instance_id: u64) -> Result<(tokio::net::UnixListener, String), StoreError> {
    let name = local::socket_name(instance_id);
    let l = local::bind(&name).map_err(|e| {
        StoreError::new(
            ErrorCode::Internal,
            format!("cannot bind the same-host socket {name}: {e}; or run without --same-host"),
        )
    })?;
    Ok((l, name))
}

/// Spawns the metrics endpoint on `listener`, serving `registry` (and `/flushed`, with a disk
/// tier) until `stop` fires.
fn spawn_metrics(
    listener: TcpListener,
    registry: Registry,
    readiness: &ReadinessHandle,
    flushed: Option<crate::metrics::Flushed>,
    stop: &CancellationToken,
) -> Task<std::io::Result<()>> {
    Task::spawn(crate::metrics::serve(
        listener,
        Arc::new(registry),
        None,
        readiness.clone(),
        flushed,
        stop.clone(),
    ))
}

/// Spawns the gRPC `SegmentData` server on `listener` until `stop` fires, taking messages up to
/// `--max-value-size` plus room for their framing.
fn spawn_grpc(
    listener: TcpListener,
    cfg: &MemberConfig,
    tls: Option<&crate::tls::ServerTls>,
    segment: &Arc<Segment>,
    readiness: &ReadinessHandle,
    stop: &CancellationToken,
) -> Result<Task<Result<(), ServeError>>, ServeError> {
    let max = usize::try_from(cfg.max_value_size)
        .unwrap_or(usize::MAX)
        .saturating_add(64 * 1024);
    let svc = grpc::DataService {
        segment: segment.clone(),
        readiness: readiness.clone(),
    }
    .server(max);
    let builder = crate::tls::grpc_server(tls)?;
    let stop = stop.clone();
    let segment = segment.clone();
    Ok(Task::spawn(async move {
        let server = builder
            .max_concurrent_streams(grpc::MAX_STREAMS)
            .layer(grpc::GrantFirstLayer(segment.clone()))
            .add_service(svc)
            .serve_with_incoming_shutdown(
                crate::net::incoming_limited(listener, crate::net::MAX_GRPC_CONNECTIONS, "member gRPC"),
                stop.clone().cancelled_owned(),
            );
        lifecycle::drained(server, &stop, "member gRPC").await
    }))
}

/// A serving member's tasks and its polling window, stopped together once its token fired.
struct Serving {
    grpc: Task<Result<(), ServeError>>,
    dataport: Task<()>,
    same_host: Option<Task<()>>,
    hot: Arc<crate::spin::HotWindow>,
    endpoint: Option<Task<std::io::Result<()>>>,
}

impl Serving {
    /// Waits for gRPC, the data port and the same-host socket to drain, stops the polling window,
    /// then waits for the metrics endpoint; returns how gRPC ended.
    async fn join(self) -> Result<(), ServeError> {
        let grpc_result = self.grpc.join().await.unwrap_or(Ok(()));
        self.dataport.join().await;
        if let Some(t) = self.same_host {
            t.join().await;
        }
        self.hot.stop();
        if let Some(t) = self.endpoint
            && let Some(Err(e)) = t.join().await
        {
            tracing::warn!(error = %e, "metrics endpoint failed");
        }
        grpc_result
    }
}
