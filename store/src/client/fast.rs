//! Pooled connections to the leader's framed metadata port (format in `leader/fastport.rs`),
//! found through `Health.fast_port` and found again after a leader restart.

use std::time::{Duration, Instant};

use bytes::{BufMut, BytesMut};
use parking_lot::Mutex;
use prost::Message;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tonic::transport::Channel;

use super::{POOL_PER_MEMBER, transport};
use crate::error::{ErrorCode, Result, StoreError};
use crate::leader::fastport::Method;
use crate::proto::HealthRequest;
use crate::proto::control_client::ControlClient;
use crate::tls::{ClientTls, Conn};
use crate::wire;

/// Pooled connections to the leader's framed metadata port (format in `leader/fastport.rs`).
#[derive(Debug)]
pub(super) struct FastPort {
    pub(super) host: String,
    pub(super) port: std::sync::atomic::AtomicU32,
    /// to ask the leader again which port it serves, after a restart
    pub(super) channel: Channel,
    pub(super) idle: Mutex<Vec<Conn>>,
    /// what every new connection opens with (`protocol.rs`)
    pub(super) hello: crate::protocol::ClientHello,
    /// TLS to the port, as to the leader's gRPC (`tls.rs`)
    pub(super) tls: Option<ClientTls>,
}

impl FastPort {
    /// The same port, with a pool of connections of its own whose hello shows `credential`.
    pub(super) fn showing(&self, credential: &str) -> FastPort {
        FastPort {
            host: self.host.clone(),
            port: std::sync::atomic::AtomicU32::new(self.port.load(std::sync::atomic::Ordering::Acquire)),
            channel: self.channel.clone(),
            idle: Mutex::new(Vec::new()),
            hello: crate::protocol::ClientHello {
                credential: credential.to_owned(),
                ..self.hello.clone()
            },
            tls: self.tls.clone(),
        }
    }

    /// One call; polls up to `spin` for the reply before sleeping (`spin.rs`).
    pub(super) async fn call<Q: Message, R: Message + Default>(
        &self,
        method: Method,
        req: &Q,
        spin: Duration,
    ) -> Result<R> {
        let mut frame = BytesMut::with_capacity(5 + req.encoded_len());
        frame.put_u32_le(req.encoded_len() as u32);
        frame.put_u8(method as u8);
        req.encode(&mut frame)
            .map_err(|e| StoreError::new(ErrorCode::Internal, e.to_string()))?;
        let pooled = self.idle.lock().pop();
        let reused = pooled.is_some();
        let first = match pooled {
            Some(s) => self.exchange(s, &frame, spin).await,
            None => self.exchange(self.connect().await?, &frame, spin).await,
        };
        let (status, body) = match first {
            Ok(r) => r,
            // an idle pooled connection the leader closed (it restarted): the request never
            // reached a live leader, so sending it once more on a fresh connection is safe
            Err(e) if reused && closed(&e) => self
                .exchange(self.connect().await?, &frame, spin)
                .await
                .map_err(transport)?,
            Err(e) => return Err(transport(e)),
        };
        if status != 0 {
            return Err(wire::refusal(&body));
        }
        R::decode(&body[..]).map_err(|e| StoreError::new(ErrorCode::Transport, format!("malformed reply: {e}")))
    }

    /// Connects to the port, asking the leader for it again if the one known refuses (a
    /// restarted leader may serve it elsewhere).
    async fn connect(&self) -> Result<Conn> {
        use std::sync::atomic::Ordering;
        let port = self.port.load(Ordering::Acquire);
        let addr = format!("{}:{port}", self.host);
        let first = crate::net::within_connect_timeout(&addr, TcpStream::connect(&addr)).await;
        let (s, addr) = match first {
            Ok(s) => (s, addr),
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
                let addr = format!("{}:{fresh}", self.host);
                let s = crate::net::within_connect_timeout(&addr, TcpStream::connect(&addr))
                    .await
                    .map_err(|e| {
                        transport(format!(
                            "cannot reach the leader's fast port {}:{fresh}: {e}",
                            self.host
                        ))
                    })?;
                (s, addr)
            }
        };
        s.set_nodelay(true).map_err(transport)?;
        let s = crate::tls::connect(self.tls.as_ref(), s, &addr)
            .await
            .map_err(|e| transport(format!("the leader's fast port {addr}: {e}")))?;
        self.greet(s).await
    }

    /// Says which protocol this client speaks, first on a new connection; the leader's refusal
    /// (`CLIENT_VERSION_UNSUPPORTED`) is the call's answer.
    async fn greet(&self, mut s: Conn) -> Result<Conn> {
        let mut frame = BytesMut::with_capacity(5 + self.hello.encoded_len());
        frame.put_u32_le(self.hello.encoded_len() as u32);
        frame.put_u8(Method::Hello as u8);
        self.hello
            .encode(&mut frame)
            .map_err(|e| StoreError::new(ErrorCode::Internal, e.to_string()))?;
        s.write_all(&frame).await.map_err(transport)?;
        s.flush().await.map_err(transport)?;
        let mut buf = BytesMut::new();
        let (status, body) = crate::frame::read(&mut s, &mut buf, MAX_REPLY)
            .await
            .map_err(transport)?
            .ok_or_else(|| transport("the leader's fast port closed the connection at its hello"))?;
        if status != 0 {
            return Err(wire::refusal(&body));
        }
        Ok(s)
    }

    /// One request and its reply, given up after [`CALL_TIMEOUT`] (a leader gone without closing
    /// the connection never answers).
    async fn exchange(&self, s: Conn, frame: &[u8], spin: Duration) -> std::io::Result<(u8, BytesMut)> {
        tokio::time::timeout(CALL_TIMEOUT, self.exchange_now(s, frame, spin))
            .await
            .map_err(|_| {
                std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("the leader's fast port did not answer within {CALL_TIMEOUT:?}"),
                )
            })?
    }

    async fn exchange_now(&self, mut s: Conn, frame: &[u8], spin: Duration) -> std::io::Result<(u8, BytesMut)> {
        s.write_all(frame).await?;
        s.flush().await?;
        // nothing of an earlier reply is left over: each is read whole
        crate::spin::until_readable(s.tcp(), Instant::now() + spin);
        let mut buf = BytesMut::new();
        let reply = crate::frame::read(&mut s, &mut buf, MAX_REPLY)
            .await?
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::UnexpectedEof))?;
        let mut idle = self.idle.lock();
        if idle.len() < POOL_PER_MEMBER && !s.worn_out() {
            idle.push(s);
        }
        Ok(reply)
    }
}

/// How long one fast-port call may take: far above any answer a live leader gives (metadata
/// only, no bytes of values), well below a hung engine.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Largest fast-port reply accepted.
const MAX_REPLY: usize = 16 << 20;

fn closed(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        UnexpectedEof | ConnectionReset | BrokenPipe | ConnectionAborted
    )
}
