//! The ZeroMQ wire protocol (ZMTP 3.0, RFC 23/ZMTP, NULL security) as far as the router needs it
//! to follow a vLLM replica's KV events: a `SUB` connection to its `PUB` socket and a `DEALER`
//! connection to its replay `ROUTER`, over TCP (`tcp://host:port`, a Pod's) or a Unix socket
//! (`ipc:///path`, a replica on the router's machine, reachable by nobody else). Every length a peer sends is checked against
//! [`Limits`] before anything is allocated, so a peer that is not what it claims costs an error,
//! never the router's memory.
//!
//! The exchange: each side sends a 64-byte greeting (signature, version 3.0, mechanism `NULL`),
//! then a `READY` command naming its socket type; then frames, each `flags` (`MORE`, `LONG`,
//! `COMMAND`), a size (one byte, or eight when `LONG`) and the body. A message is the frames up to
//! one without `MORE`. A 3.0 subscriber subscribes with a message `0x01 ‖ topic`.

use std::time::Duration;

use std::path::PathBuf;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::{TcpStream, UnixStream};

const MORE: u8 = 0x01;
const LONG: u8 = 0x02;
const COMMAND: u8 = 0x04;
const GREETING_LEN: usize = 64;

/// The socket types this client speaks as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SocketType {
    Sub,
    Dealer,
}

impl SocketType {
    fn name(self) -> &'static str {
        match self {
            Self::Sub => "SUB",
            Self::Dealer => "DEALER",
        }
    }

    /// The peer types ZMTP lets this one talk to.
    fn accepts(self, peer: &[u8]) -> bool {
        match self {
            Self::Sub => matches!(peer, b"PUB" | b"XPUB"),
            Self::Dealer => matches!(peer, b"ROUTER" | b"DEALER"),
        }
    }
}

/// Bounds on what a peer may send.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The largest frame.
    pub frame: usize,
    /// The most frames in one message.
    pub parts: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            frame: 64 << 20,
            parts: 8,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ZmtpError {
    #[error("{0:?} is neither tcp://HOST:PORT nor ipc:///PATH")]
    Endpoint(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("no connection within {0:?}")]
    Timeout(Duration),
    #[error("the peer does not speak ZMTP 3 with NULL security: {0}")]
    Handshake(String),
    #[error("the peer sent {what} of {size} bytes, above the limit of {limit}")]
    TooLarge { what: &'static str, size: u64, limit: u64 },
    #[error("the peer broke the protocol: {0}")]
    Protocol(&'static str),
}

/// Where a peer listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    /// `host:port`
    Tcp(String),
    /// an absolute path
    Ipc(PathBuf),
}

/// `tcp://host:port` or `ipc:///path`.
pub fn address(endpoint: &str) -> Result<Address, ZmtpError> {
    let bad = || ZmtpError::Endpoint(endpoint.to_owned());
    if let Some(path) = endpoint.strip_prefix("ipc://") {
        return path.starts_with('/').then(|| Address::Ipc(path.into())).ok_or_else(bad);
    }
    let addr = endpoint.strip_prefix("tcp://").ok_or_else(bad)?;
    match addr.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => Ok(Address::Tcp(addr.to_owned())),
        _ => Err(bad()),
    }
}

type Reader = BufReader<Box<dyn AsyncRead + Send + Unpin>>;
type Writer = BufWriter<Box<dyn AsyncWrite + Send + Unpin>>;

/// One ZMTP connection, after its handshake.
pub struct Connection {
    reader: Reader,
    writer: Writer,
    limits: Limits,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl Connection {
    /// Connects to `endpoint` (`tcp://host:port`, `ipc:///path`) as `kind` and completes the
    /// handshake, all within `timeout`.
    pub async fn connect(
        endpoint: &str,
        kind: SocketType,
        limits: Limits,
        timeout: Duration,
    ) -> Result<Self, ZmtpError> {
        let addr = address(endpoint)?;
        let setup = async {
            let (r, w): (Box<dyn AsyncRead + Send + Unpin>, Box<dyn AsyncWrite + Send + Unpin>) = match &addr {
                Address::Tcp(a) => {
                    let stream = TcpStream::connect(a.as_str()).await?;
                    stream.set_nodelay(true)?;
                    let (r, w) = stream.into_split();
                    (Box::new(r), Box::new(w))
                }
                Address::Ipc(path) => {
                    let (r, w) = UnixStream::connect(path).await?.into_split();
                    (Box::new(r), Box::new(w))
                }
            };
            Self::handshake(r, w, kind, limits).await
        };
        tokio::time::timeout(timeout, setup)
            .await
            .map_err(|_| ZmtpError::Timeout(timeout))?
    }

    /// The handshake over an open stream's halves.
    async fn handshake(
        r: Box<dyn AsyncRead + Send + Unpin>,
        w: Box<dyn AsyncWrite + Send + Unpin>,
        kind: SocketType,
        limits: Limits,
    ) -> Result<Self, ZmtpError> {
        let mut c = Self {
            reader: BufReader::new(r),
            writer: BufWriter::new(w),
            limits,
        };
        c.writer.write_all(&greeting()).await?;
        c.writer.flush().await?;
        let mut peer = [0u8; GREETING_LEN];
        c.reader.read_exact(&mut peer).await?;
        check_greeting(&peer)?;
        c.write_frame(COMMAND, &ready(kind)).await?;
        c.writer.flush().await?;
        let (flags, body) = c.read_frame().await?;
        if flags & COMMAND == 0 {
            return Err(ZmtpError::Handshake("a message before READY".into()));
        }
        let peer_type = ready_socket_type(&body)?;
        if !kind.accepts(&peer_type) {
            return Err(ZmtpError::Handshake(format!(
                "a {} cannot talk to a {}",
                kind.name(),
                String::from_utf8_lossy(&peer_type)
            )));
        }
        Ok(c)
    }

    /// Subscribes a `SUB` connection to messages whose first frame starts with `topic`.
    pub async fn subscribe(&mut self, topic: &[u8]) -> Result<(), ZmtpError> {
        let mut body = Vec::with_capacity(1 + topic.len());
        body.push(1);
        body.extend_from_slice(topic);
        self.send(&[&body]).await
    }

    /// Sends one message of `parts`.
    pub async fn send(&mut self, parts: &[&[u8]]) -> Result<(), ZmtpError> {
        for (i, part) in parts.iter().enumerate() {
            let flags = if i + 1 < parts.len() { MORE } else { 0 };
            self.write_frame(flags, part).await?;
        }
        self.writer.flush().await?;
        Ok(())
    }

    /// The next message, its frames in order; commands (a heartbeat, say) are read and passed
    /// over.
    pub async fn recv(&mut self) -> Result<Vec<Vec<u8>>, ZmtpError> {
        let mut parts = Vec::new();
        loop {
            let (flags, body) = self.read_frame().await?;
            if flags & COMMAND != 0 {
                if !parts.is_empty() {
                    return Err(ZmtpError::Protocol("a command inside a message"));
                }
                continue;
            }
            if parts.len() == self.limits.parts {
                return Err(ZmtpError::TooLarge {
                    what: "a message",
                    size: parts.len() as u64 + 1,
                    limit: self.limits.parts as u64,
                });
            }
            parts.push(body);
            if flags & MORE == 0 {
                return Ok(parts);
            }
        }
    }

    #[allow(clippy::big_endian_bytes, reason = "ZMTP sizes are big-endian (RFC 23)")]
    async fn write_frame(&mut self, flags: u8, body: &[u8]) -> Result<(), ZmtpError> {
        match u8::try_from(body.len()) {
            Ok(n) => self.writer.write_all(&[flags, n]).await?,
            Err(_) => {
                self.writer.write_all(&[flags | LONG]).await?;
                self.writer.write_all(&(body.len() as u64).to_be_bytes()).await?;
            }
        }
        self.writer.write_all(body).await?;
        Ok(())
    }

    #[allow(clippy::big_endian_bytes, reason = "ZMTP sizes are big-endian (RFC 23)")]
    async fn read_frame(&mut self) -> Result<(u8, Vec<u8>), ZmtpError> {
        let flags = self.reader.read_u8().await?;
        if flags & !(MORE | LONG | COMMAND) != 0 {
            return Err(ZmtpError::Protocol("reserved frame flags set"));
        }
        let size = if flags & LONG != 0 {
            let mut b = [0u8; 8];
            self.reader.read_exact(&mut b).await?;
            u64::from_be_bytes(b)
        } else {
            u64::from(self.reader.read_u8().await?)
        };
        let limit = self.limits.frame as u64;
        if size > limit {
            return Err(ZmtpError::TooLarge {
                what: "a frame",
                size,
                limit,
            });
        }
        let mut body = vec![0u8; size as usize];
        self.reader.read_exact(&mut body).await?;
        Ok((flags, body))
    }
}

/// Ours: signature, version 3.0, `NULL`, not the server, filler.
fn greeting() -> [u8; GREETING_LEN] {
    let mut g = [0u8; GREETING_LEN];
    g[0] = 0xff;
    g[9] = 0x7f;
    g[10] = 3;
    g[11] = 0;
    g[12..16].copy_from_slice(b"NULL");
    g
}

fn check_greeting(g: &[u8; GREETING_LEN]) -> Result<(), ZmtpError> {
    if g[0] != 0xff || g[9] & 0x01 != 0x01 {
        return Err(ZmtpError::Handshake("no ZMTP signature".into()));
    }
    if g[10] < 3 {
        return Err(ZmtpError::Handshake(format!("version {}.{}", g[10], g[11])));
    }
    let mechanism = &g[12..32];
    let name_len = mechanism.iter().position(|b| *b == 0).unwrap_or(mechanism.len());
    if &mechanism[..name_len] != b"NULL" {
        return Err(ZmtpError::Handshake(format!(
            "mechanism {}",
            String::from_utf8_lossy(&mechanism[..name_len])
        )));
    }
    Ok(())
}

/// `READY` with the one property a peer needs, `Socket-Type`.
#[allow(clippy::big_endian_bytes, reason = "ZMTP sizes are big-endian (RFC 23)")]
fn ready(kind: SocketType) -> Vec<u8> {
    let name = b"Socket-Type";
    let value = kind.name().as_bytes();
    let mut body = vec![5];
    body.extend_from_slice(b"READY");
    body.push(name.len() as u8);
    body.extend_from_slice(name);
    body.extend_from_slice(&(value.len() as u32).to_be_bytes());
    body.extend_from_slice(value);
    body
}

/// The peer's socket type from its `READY` command.
#[allow(clippy::big_endian_bytes, reason = "ZMTP sizes are big-endian (RFC 23)")]
fn ready_socket_type(body: &[u8]) -> Result<Vec<u8>, ZmtpError> {
    let bad = |why: &str| ZmtpError::Handshake(format!("its READY {why}"));
    let (&name_len, rest) = body.split_first().ok_or_else(|| bad("is empty"))?;
    let (name, mut props) = rest
        .split_at_checked(usize::from(name_len))
        .ok_or_else(|| bad("is cut short"))?;
    if name != b"READY" {
        return Err(bad(&format!("is a {} command", String::from_utf8_lossy(name))));
    }
    while let Some((&n, rest)) = props.split_first() {
        let (key, rest) = rest
            .split_at_checked(usize::from(n))
            .ok_or_else(|| bad("is cut short"))?;
        let (len, rest) = rest.split_at_checked(4).ok_or_else(|| bad("is cut short"))?;
        let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
        let (value, rest) = rest.split_at_checked(len).ok_or_else(|| bad("is cut short"))?;
        if key.eq_ignore_ascii_case(b"Socket-Type") {
            return Ok(value.to_vec());
        }
        props = rest;
    }
    Err(bad("names no Socket-Type"))
}

#[cfg(test)]
mod tests;
