//! The Rust client: one multiplexed gRPC channel to the leader for metadata (or the leader's
//! framed port, `fast.rs`, when it serves one), and for the bytes pooled plain TCP connections
//! to each member's data port (`data.rs`), or, for a member on this host, its segment mapped
//! here (`local.rs`). Batch calls are in `batch.rs`. A put is `PutStart` (leader) → write (member) →
//! `PutCommit` (leader), revoked if the write fails; a get is `Get` (leader, grants a read lease) →
//! read (member), reported as failed if the lease ran out before the read finished. Only
//! idempotent metadata calls (get, exists, batch exists) are retried, once, on a transport failure.

mod batch;
mod data;
mod disk;
mod fast;
mod local;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use tonic::transport::Channel;

use crate::error::{ErrorCode, Result, StoreError};
use crate::leader::fastport::Method;
use crate::proto::control_client::ControlClient;
use crate::proto::store_client::StoreClient;
use crate::proto::*;
use crate::protocol::{ClientVersion, SendCaller};
use crate::time::now_unix_ms;
use crate::tls::{ClientTls, Conn};
use data::Sink;
use fast::FastPort;

/// Idle connections kept per member (and to the leader's fast port).
const POOL_PER_MEMBER: usize = 64;

/// What a put did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutOutcome {
    Stored,
    /// the key already existed (values are immutable; keys are content-derived)
    AlreadyExisted,
}

/// A connection to one leader, acting for one tenant scope.
#[derive(Debug, Clone)]
pub struct Client {
    /// `Store` over gRPC, every call carrying this client's protocol version (`protocol.rs`) and
    /// its scope's credential in the metadata
    store: StoreClient<tonic::service::interceptor::InterceptedService<Channel, SendCaller>>,
    /// what this client says of itself
    version: ClientVersion,
    channel: Channel,
    /// the leader's framed metadata port, when it serves one (used instead of gRPC for `Store`)
    fast: Option<Arc<FastPort>>,
    scope: Scope,
    /// TLS to the leader and members (`tls.rs`); `None`: plaintext
    tls: Option<ClientTls>,
    pool: Arc<Mutex<HashMap<String, Vec<Conn>>>>,
    /// members' segments mapped on this host (`local.rs`); `None`: every byte goes over TCP
    local: Option<Arc<local::Local>>,
    /// how long to poll for a reply before sleeping (`spin.rs`)
    spin: Duration,
}

fn transport(e: impl std::fmt::Display) -> StoreError {
    StoreError::new(ErrorCode::Transport, e.to_string())
}

fn status(s: tonic::Status) -> StoreError {
    StoreError::from_status(&s)
}

impl Client {
    /// Connects to the leader at `HOST:PORT`, as this build's Rust client.
    pub async fn connect(leader: &str, scope: Scope) -> Result<Self> {
        Self::connect_as(leader, scope, ClientVersion::ours("kvcache-store")).await
    }

    /// [`connect`](Self::connect), over TLS to the leader and every member when `tls` is given.
    pub async fn connect_tls(leader: &str, scope: Scope, tls: Option<ClientTls>) -> Result<Self> {
        Self::connect_with(leader, scope, ClientVersion::ours("kvcache-store"), tls).await
    }

    /// Connects to the leader at `HOST:PORT`, saying `version` of itself: the protocol the
    /// leader checks on every call (`protocol.rs`) and the client's name for its messages.
    pub async fn connect_as(leader: &str, scope: Scope, version: ClientVersion) -> Result<Self> {
        Self::connect_with(leader, scope, version, None).await
    }

    /// [`connect_as`](Self::connect_as), over TLS to the leader and every member when `tls` is
    /// given (`tls.rs`).
    pub async fn connect_with(
        leader: &str,
        scope: Scope,
        version: ClientVersion,
        tls: Option<ClientTls>,
    ) -> Result<Self> {
        let channel = crate::tls::grpc_endpoint(leader, tls.as_ref())
            .map_err(|e| {
                StoreError::new(
                    ErrorCode::InvalidArgument,
                    format!("bad leader address {leader:?}: {e}"),
                )
            })?
            .tcp_nodelay(true)
            .connect_timeout(crate::net::CONNECT_TIMEOUT)
            // a leader gone without closing the connection (its Pod deleted) is noticed by
            // pings, and the channel connects again to whoever serves the address now
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(5))
            .keep_alive_while_idle(true)
            .connect()
            .await
            .map_err(|e| {
                transport(format!(
                    "cannot reach the leader at {leader}: {}",
                    crate::error::chain(&e)
                ))
            })?;
        let health = ControlClient::new(channel.clone())
            .health(HealthRequest {})
            .await
            .map_err(|s| match &tls {
                // a TLS server's first bytes read as a malformed HTTP/2 frame
                None if s.message().contains("h2 protocol error") => transport(format!(
                    "the leader at {leader} did not answer in plaintext gRPC ({}); if it serves TLS, \
                     connect with its CA (--tls-ca, KVSTORE_TLS_CA)",
                    s.message()
                )),
                _ => status(s),
            })?;
        let port = health.into_inner().fast_port;
        let fast = match leader.rsplit_once(':') {
            Some((host, _)) if port != 0 => Some(Arc::new(FastPort {
                host: host.to_string(),
                port: port.into(),
                channel: channel.clone(),
                idle: Mutex::new(Vec::new()),
                hello: version.hello(&scope.credential),
                tls: tls.clone(),
            })),
            _ => None,
        };
        Ok(Self {
            store: StoreClient::with_interceptor(channel.clone(), SendCaller::new(version.clone(), &scope.credential)),
            version,
            channel,
            fast,
            scope,
            tls,
            pool: Arc::default(),
            local: Some(Arc::default()),
            spin: crate::spin::DEFAULT_SPIN,
        })
    }

    /// The same client, polling up to `spin` for each reply before sleeping (zero: never poll;
    /// default [`DEFAULT_SPIN`](crate::spin::DEFAULT_SPIN)); a reply that follows a value's
    /// bytes gets the time they take at 1 GB/s on top. The calling task keeps its thread while it
    /// polls, so give zero on a runtime whose threads other work needs at once.
    pub fn with_spin(mut self, spin: Duration) -> Self {
        self.spin = spin;
        self
    }

    /// The same client, speaking gRPC to the leader even if it serves the framed port.
    pub fn grpc_only(mut self) -> Self {
        self.fast = None;
        self
    }

    /// The same client, sending every byte over TCP even to members on this host (which it
    /// would otherwise map, `local.rs`).
    pub fn without_local(mut self) -> Self {
        self.local = None;
        self
    }

    /// Whether transfers to members on this host go through their mapped segments.
    pub fn uses_local(&self) -> bool {
        self.local.is_some()
    }

    /// How many members' segments this client holds mapped now.
    pub fn mapped_segments(&self) -> usize {
        self.local.as_ref().map_or(0, |l| l.mapped())
    }

    /// Whether metadata calls go to the leader's framed port.
    pub fn uses_fast_port(&self) -> bool {
        self.fast.is_some()
    }

    async fn put_start(&self, req: PutStartRequest) -> Result<PutStartResponse> {
        match &self.fast {
            Some(f) => f.call(Method::PutStart, &req, self.spin).await,
            None => Ok(self.store.clone().put_start(req).await.map_err(status)?.into_inner()),
        }
    }

    async fn put_commit(&self, req: PutCommitRequest) -> Result<()> {
        match &self.fast {
            Some(f) => f
                .call::<_, PutCommitResponse>(Method::PutCommit, &req, self.spin)
                .await
                .map(drop),
            None => self.store.clone().put_commit(req).await.map(drop).map_err(status),
        }
    }

    async fn put_revoke(&self, req: PutRevokeRequest) -> Result<()> {
        match &self.fast {
            Some(f) => f
                .call::<_, PutRevokeResponse>(Method::PutRevoke, &req, self.spin)
                .await
                .map(drop),
            None => self.store.clone().put_revoke(req).await.map(drop).map_err(status),
        }
    }

    /// The same connections, acting for another scope (with another credential: the same
    /// channel, and fast-port connections of its own, which show that credential).
    pub fn with_scope(&self, scope: Scope) -> Self {
        if scope.credential == self.scope.credential {
            return Self { scope, ..self.clone() };
        }
        Self {
            store: StoreClient::with_interceptor(
                self.channel.clone(),
                SendCaller::new(self.version.clone(), &scope.credential),
            ),
            fast: self.fast.as_ref().map(|f| Arc::new(f.showing(&scope.credential))),
            scope,
            ..self.clone()
        }
    }

    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    /// The controller API on the same channel.
    pub fn control(&self) -> ControlClient<Channel> {
        ControlClient::new(self.channel.clone())
    }

    /// Stores `value` under `key`.
    pub async fn put(&self, key: &str, value: Bytes) -> Result<PutOutcome> {
        let start = PutStartRequest {
            scope: Some(self.scope.clone()),
            key: key.to_string(),
            size: value.len() as u64,
        };
        let r = self.put_start(start).await?;
        if r.already_exists {
            return Ok(PutOutcome::AlreadyExisted);
        }
        let loc = r
            .location
            .ok_or_else(|| StoreError::new(ErrorCode::Internal, "the leader sent no location"))?;
        let write = self.write(&loc, r.write_deadline_unix_ms, &value).await;
        if let Err(e) = write {
            let revoke = PutRevokeRequest {
                scope: Some(self.scope.clone()),
                key: key.to_string(),
                put_id: r.put_id,
            };
            if let Err(re) = self.put_revoke(revoke).await {
                tracing::debug!(error = %re, "revoke after a failed write failed; the leader reclaims it later");
            }
            return Err(e);
        }
        let commit = PutCommitRequest {
            scope: Some(self.scope.clone()),
            key: key.to_string(),
            put_id: r.put_id,
        };
        self.put_commit(commit).await?;
        Ok(PutOutcome::Stored)
    }

    /// Reads the value under `key`, or `None` if there is none.
    pub async fn get(&self, key: &str) -> Result<Option<Bytes>> {
        let started = Instant::now();
        let Some((loc, r)) = self.locate(key).await? else {
            return Ok(None);
        };
        let mut buf = BytesMut::with_capacity(loc.len as usize);
        if !self.read(&loc, r.lease_deadline_unix_ms, Sink::Fresh(&mut buf)).await? {
            return Ok(None);
        }
        check_lease(started, &r)?;
        Ok(Some(buf.freeze()))
    }

    /// Like [`get`](Self::get), reusing `buf` (resized to the value); `false` if there is no value.
    pub async fn get_into(&self, key: &str, buf: &mut Vec<u8>) -> Result<bool> {
        let started = Instant::now();
        let Some((loc, r)) = self.locate(key).await? else {
            return Ok(false);
        };
        buf.resize(loc.len as usize, 0);
        if !self
            .read(&loc, r.lease_deadline_unix_ms, Sink::Slice(buf.as_mut_slice()))
            .await?
        {
            return Ok(false);
        }
        check_lease(started, &r)?;
        Ok(true)
    }

    /// Where a committed value is (granting a read lease), without reading it.
    pub async fn locate(&self, key: &str) -> Result<Option<(Location, GetResponse)>> {
        let req = GetRequest {
            scope: Some(self.scope.clone()),
            key: key.to_string(),
        };
        let r = match &self.fast {
            Some(f) => f.call(Method::Get, &req, self.spin).await?,
            None => {
                retry_once(|| {
                    let mut store = self.store.clone();
                    let req = req.clone();
                    async move { store.get(req).await.map(|r| r.into_inner()) }
                })
                .await?
            }
        };
        if !r.found {
            return Ok(None);
        }
        let loc = r
            .location
            .clone()
            .ok_or_else(|| StoreError::new(ErrorCode::Internal, "found without location"))?;
        Ok(Some((loc, r)))
    }

    pub async fn exists(&self, key: &str) -> Result<bool> {
        let req = ExistsRequest {
            scope: Some(self.scope.clone()),
            key: key.to_string(),
        };
        if let Some(f) = &self.fast {
            return f
                .call::<_, ExistsResponse>(Method::Exists, &req, self.spin)
                .await
                .map(|r| r.exists);
        }
        retry_once(|| {
            let mut store = self.store.clone();
            let req = req.clone();
            async move { store.exists(req).await.map(|r| r.into_inner().exists) }
        })
        .await
    }

    pub async fn batch_exists(&self, keys: &[String]) -> Result<Vec<bool>> {
        let req = BatchExistsRequest {
            scope: Some(self.scope.clone()),
            keys: keys.to_vec(),
        };
        if let Some(f) = &self.fast {
            return f
                .call::<_, BatchExistsResponse>(Method::BatchExists, &req, self.spin)
                .await
                .map(|r| r.exists);
        }
        retry_once(|| {
            let mut store = self.store.clone();
            let req = req.clone();
            async move { store.batch_exists(req).await.map(|r| r.into_inner().exists) }
        })
        .await
    }

    /// Removes a value; `false` if there was none. Refused while a read lease protects it.
    /// Follows what this tenant's cache holds (`WatchBlocks`): `AllBlocksCleared`, the blocks
    /// held now, then every change, until the leader stops serving.
    pub async fn watch_blocks(&self) -> Result<tonic::Streaming<BlockEvent>> {
        let req = WatchBlocksRequest {
            scope: Some(self.scope.clone()),
        };
        Ok(self.store.clone().watch_blocks(req).await.map_err(status)?.into_inner())
    }

    pub async fn remove(&self, key: &str) -> Result<bool> {
        let req = RemoveRequest {
            scope: Some(self.scope.clone()),
            key: key.to_string(),
        };
        if let Some(f) = &self.fast {
            return f
                .call::<_, RemoveResponse>(Method::Remove, &req, self.spin)
                .await
                .map(|r| r.removed);
        }
        Ok(self
            .store
            .clone()
            .remove(req)
            .await
            .map_err(status)?
            .into_inner()
            .removed)
    }
}

fn check_lease(started: Instant, r: &GetResponse) -> Result<()> {
    // measured from before the Get was sent, so a slow reply only makes the check stricter
    if started.elapsed() >= Duration::from_millis(r.lease_ttl_ms) || now_unix_ms() > r.lease_deadline_unix_ms {
        return Err(StoreError::new(
            ErrorCode::LeaseExpired,
            "the read lease ran out before the read finished, so the bytes may have been reused; read again",
        ));
    }
    Ok(())
}

async fn retry_once<T, F, Fut>(mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = std::result::Result<T, tonic::Status>>,
{
    match f().await {
        Ok(v) => Ok(v),
        Err(s) => {
            let e = status(s);
            if e.code != ErrorCode::Transport {
                return Err(e);
            }
            f().await.map_err(status)
        }
    }
}
