//! The Rust client: one multiplexed gRPC channel to the leader for metadata, and pooled plain TCP
//! connections to each member's data port for the bytes. A put is `PutStart` (leader) → write
//! (member) → `PutCommit` (leader), revoked if the write fails; a get is `Get` (leader, grants a
//! read lease) → read (member), reported as failed if the lease ran out before the read finished.
//! Only idempotent metadata calls (get, exists, batch exists) are retried, once, on a transport
//! failure.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use parking_lot::Mutex;
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tonic::transport::{Channel, Endpoint};

use crate::error::{ErrorCode, Result, StoreError};
use crate::leader::fastport::Method;
use crate::proto::control_client::ControlClient;
use crate::proto::store_client::StoreClient;
use crate::proto::*;
use crate::time::now_unix_ms;
use crate::wire::{self, Op, RESPONSE_LEN};

/// Idle data connections kept per member.
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
    store: StoreClient<Channel>,
    channel: Channel,
    /// the leader's framed metadata port, when it serves one (used instead of gRPC for `Store`)
    fast: Option<Arc<FastPort>>,
    scope: Scope,
    pool: Arc<Mutex<HashMap<String, Vec<TcpStream>>>>,
}

/// Pooled connections to the leader's framed metadata port (format in `leader/fastport.rs`).
#[derive(Debug)]
struct FastPort {
    host: String,
    port: std::sync::atomic::AtomicU32,
    /// to ask the leader again which port it serves, after a restart
    channel: Channel,
    idle: Mutex<Vec<TcpStream>>,
}

impl FastPort {
    async fn call<Q: Message, R: Message + Default>(&self, method: Method, req: &Q) -> Result<R> {
        let mut frame = BytesMut::with_capacity(5 + req.encoded_len());
        frame.put_u32_le(req.encoded_len() as u32);
        frame.put_u8(method as u8);
        req.encode(&mut frame)
            .map_err(|e| StoreError::new(ErrorCode::Internal, e.to_string()))?;
        let pooled = self.idle.lock().pop();
        let reused = pooled.is_some();
        let first = match pooled {
            Some(s) => self.exchange(s, &frame).await,
            None => self.exchange(self.connect().await?, &frame).await,
        };
        let (status, body) = match first {
            Ok(r) => r,
            // an idle pooled connection the leader closed (it restarted): the request never
            // reached a live leader, so sending it once more on a fresh connection is safe
            Err(e) if reused && closed(&e) => self.exchange(self.connect().await?, &frame).await.map_err(transport)?,
            Err(e) => return Err(transport(e)),
        };
        if status != 0 {
            return Err(wire::refusal(&body));
        }
        R::decode(&body[..]).map_err(|e| StoreError::new(ErrorCode::Transport, format!("malformed reply: {e}")))
    }

    /// Connects to the port, asking the leader for it again if the one known refuses (a
    /// restarted leader may serve it elsewhere).
    async fn connect(&self) -> Result<TcpStream> {
        use std::sync::atomic::Ordering;
        let port = self.port.load(Ordering::Acquire);
        let first = TcpStream::connect(format!("{}:{port}", self.host)).await;
        let s = match first {
            Ok(s) => s,
            Err(e) => {
                let health = ControlClient::new(self.channel.clone()).health(HealthRequest {}).await;
                let fresh = health.map(|h| h.into_inner().fast_port).unwrap_or(0);
                if fresh == 0 || fresh == port {
                    return Err(transport(format!(
                        "cannot reach the leader's fast port {}:{port}: {e}",
                        self.host
                    )));
                }
                self.port.store(fresh, Ordering::Release);
                TcpStream::connect(format!("{}:{fresh}", self.host))
                    .await
                    .map_err(|e| {
                        transport(format!(
                            "cannot reach the leader's fast port {}:{fresh}: {e}",
                            self.host
                        ))
                    })?
            }
        };
        s.set_nodelay(true).map_err(transport)?;
        Ok(s)
    }

    async fn exchange(&self, mut s: TcpStream, frame: &[u8]) -> std::io::Result<(u8, BytesMut)> {
        s.write_all(frame).await?;
        let mut buf = BytesMut::new();
        let reply = crate::frame::read(&mut s, &mut buf, MAX_REPLY)
            .await?
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::UnexpectedEof))?;
        let mut idle = self.idle.lock();
        if idle.len() < POOL_PER_MEMBER {
            idle.push(s);
        }
        Ok(reply)
    }
}

/// Largest fast-port reply accepted.
const MAX_REPLY: usize = 16 << 20;

fn closed(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        UnexpectedEof | ConnectionReset | BrokenPipe | ConnectionAborted
    )
}

fn transport(e: impl std::fmt::Display) -> StoreError {
    StoreError::new(ErrorCode::Transport, e.to_string())
}

fn status(s: tonic::Status) -> StoreError {
    StoreError::from_status(&s)
}

impl Client {
    /// Connects to the leader at `HOST:PORT`.
    pub async fn connect(leader: &str, scope: Scope) -> Result<Self> {
        let channel = Endpoint::from_shared(format!("http://{leader}"))
            .map_err(|e| {
                StoreError::new(
                    ErrorCode::InvalidArgument,
                    format!("bad leader address {leader:?}: {e}"),
                )
            })?
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(5))
            .connect()
            .await
            .map_err(|e| transport(format!("cannot reach the leader at {leader}: {e}")))?;
        let health = ControlClient::new(channel.clone())
            .health(HealthRequest {})
            .await
            .map_err(status)?;
        let port = health.into_inner().fast_port;
        let fast = match leader.rsplit_once(':') {
            Some((host, _)) if port != 0 => Some(Arc::new(FastPort {
                host: host.to_string(),
                port: port.into(),
                channel: channel.clone(),
                idle: Mutex::new(Vec::new()),
            })),
            _ => None,
        };
        Ok(Self {
            store: StoreClient::new(channel.clone()),
            channel,
            fast,
            scope,
            pool: Arc::default(),
        })
    }

    /// The same client, speaking gRPC to the leader even if it serves the framed port.
    pub fn grpc_only(mut self) -> Self {
        self.fast = None;
        self
    }

    /// Whether metadata calls go to the leader's framed port.
    pub fn uses_fast_port(&self) -> bool {
        self.fast.is_some()
    }

    async fn put_start(&self, req: PutStartRequest) -> Result<PutStartResponse> {
        match &self.fast {
            Some(f) => f.call(Method::PutStart, &req).await,
            None => Ok(self.store.clone().put_start(req).await.map_err(status)?.into_inner()),
        }
    }

    async fn put_commit(&self, req: PutCommitRequest) -> Result<()> {
        match &self.fast {
            Some(f) => f.call::<_, PutCommitResponse>(Method::PutCommit, &req).await.map(drop),
            None => self.store.clone().put_commit(req).await.map(drop).map_err(status),
        }
    }

    async fn put_revoke(&self, req: PutRevokeRequest) -> Result<()> {
        match &self.fast {
            Some(f) => f.call::<_, PutRevokeResponse>(Method::PutRevoke, &req).await.map(drop),
            None => self.store.clone().put_revoke(req).await.map(drop).map_err(status),
        }
    }

    /// The same connections, acting for another scope.
    pub fn with_scope(&self, scope: Scope) -> Self {
        Self { scope, ..self.clone() }
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
        let write = self.write(&loc, r.write_deadline_unix_ms, value).await;
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
        self.read(&loc, r.lease_deadline_unix_ms, Sink::Fresh(&mut buf)).await?;
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
        self.read(&loc, r.lease_deadline_unix_ms, Sink::Slice(buf.as_mut_slice()))
            .await?;
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
            Some(f) => f.call(Method::Get, &req).await?,
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
                .call::<_, ExistsResponse>(Method::Exists, &req)
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
        retry_once(|| {
            let mut store = self.store.clone();
            let req = req.clone();
            async move { store.batch_exists(req).await.map(|r| r.into_inner().exists) }
        })
        .await
    }

    /// Removes a value; `false` if there was none. Refused while a read lease protects it.
    pub async fn remove(&self, key: &str) -> Result<bool> {
        let req = RemoveRequest {
            scope: Some(self.scope.clone()),
            key: key.to_string(),
        };
        if let Some(f) = &self.fast {
            return f
                .call::<_, RemoveResponse>(Method::Remove, &req)
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

    fn take_conn(&self, addr: &str) -> Option<TcpStream> {
        self.pool.lock().get_mut(addr).and_then(Vec::pop)
    }

    fn give_back(&self, addr: &str, s: TcpStream) {
        let mut pool = self.pool.lock();
        let v = pool.entry(addr.to_string()).or_default();
        if v.len() < POOL_PER_MEMBER {
            v.push(s);
        }
    }

    async fn conn(&self, addr: &str) -> Result<TcpStream> {
        if let Some(s) = self.take_conn(addr) {
            return Ok(s);
        }
        crate::net::connect_data(addr)
            .await
            .map_err(|e| transport(format!("cannot reach member {addr}: {e}")))
    }

    async fn write(&self, loc: &Location, deadline: u64, value: Bytes) -> Result<()> {
        let mut s = self.conn(&loc.data_addr).await?;
        let head = wire::Request {
            op: Op::Write,
            mount_id: loc.mount_id,
            offset: loc.offset,
            len: value.len() as u64,
            deadline_unix_ms: deadline,
        }
        .encode();
        let mut buf = Buf::chain(&head[..], value);
        s.write_all_buf(&mut buf).await.map_err(transport)?;
        let resp = read_response(&mut s).await?;
        if resp.ok {
            self.give_back(&loc.data_addr, s);
            return Ok(());
        }
        let err = read_refusal(&mut s, resp.len).await?;
        self.give_back(&loc.data_addr, s);
        Err(err)
    }

    async fn read(&self, loc: &Location, deadline: u64, sink: Sink<'_>) -> Result<()> {
        let mut s = self.conn(&loc.data_addr).await?;
        let head = wire::Request {
            op: Op::Read,
            mount_id: loc.mount_id,
            offset: loc.offset,
            len: loc.len,
            deadline_unix_ms: deadline,
        }
        .encode();
        s.write_all(&head).await.map_err(transport)?;
        let resp = read_response(&mut s).await?;
        if !resp.ok {
            let err = read_refusal(&mut s, resp.len).await?;
            self.give_back(&loc.data_addr, s);
            return Err(err);
        }
        if resp.len != loc.len {
            return Err(StoreError::new(
                ErrorCode::Transport,
                "the member sent a value of the wrong length",
            ));
        }
        match sink {
            Sink::Slice(out) => {
                s.read_exact(out).await.map_err(transport)?;
            }
            Sink::Fresh(out) => {
                let mut limited = (&mut s).take(resp.len);
                while (out.len() as u64) < resp.len {
                    if limited.read_buf(out).await.map_err(transport)? == 0 {
                        return Err(transport("the member closed the connection mid-value"));
                    }
                }
            }
        }
        self.give_back(&loc.data_addr, s);
        Ok(())
    }
}

enum Sink<'a> {
    Slice(&'a mut [u8]),
    Fresh(&'a mut BytesMut),
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

async fn read_response(s: &mut TcpStream) -> Result<wire::Response> {
    let mut head = [0u8; RESPONSE_LEN];
    s.read_exact(&mut head).await.map_err(transport)?;
    wire::Response::decode(&head)
}

async fn read_refusal(s: &mut TcpStream, len: u64) -> Result<StoreError> {
    if len > wire::MAX_MESSAGE {
        return Err(transport("the member sent an oversized refusal"));
    }
    let mut msg = vec![0u8; len as usize];
    s.read_exact(&mut msg).await.map_err(transport)?;
    Ok(wire::refusal(&msg))
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
