//! The leader's framed metadata port: the unary `Store` calls (put start/commit/revoke, get,
//! exists, remove, and their batch forms) with the same protobuf messages as gRPC, in a framing that costs one TCP segment each
//! way. gRPC stays the portable protocol; this port exists because on small machines every extra
//! segment is a wake-up, and a wake-up costs more than the call (numbers in store/README.md).
//!
//! Request: `len u32 LE | method u8 | len bytes of protobuf`. Response: `len u32 LE | status u8
//! (0 ok, 1 refused) | len bytes` (the protobuf reply, or a UTF-8 "CODE: message"). One request
//! at a time per connection; clients pool connections. Each method runs the function of the same
//! name in `calls.rs`, as gRPC does, and its reply is encoded straight into the connection's
//! reusable output buffer. A connection opens with a `Hello` (method 12, a `ClientHello`): the
//! client's protocol version, which the leader checks (`protocol.rs`), and a tenant's credential
//! (`State::admits`), before it serves anything else on that connection.
//!
//! Bounds per connection: the opening frame may be at most [`MAX_HELLO`] bytes, later ones
//! [`MAX_REQUEST`], and room for a frame grows only as its bytes arrive (`frame.rs`); a frame
//! must arrive whole within [`IDLE`] of the previous answer, or the connection is closed (clients
//! send a request again on a fresh connection when a pooled one was closed), and the hello within
//! [`HELLO_WITHIN`] of the connection's start. So only a caller
//! that showed a credential the ledger holds gets to send a frame larger than a hello, and one
//! whose credential left the ledger since is closed before its next frame is read.

use std::sync::Arc;
use std::time::Instant;

use bytes::{Buf, BufMut, BytesMut};
use prost::Message;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use super::{Leader, calls};
use crate::error::{ErrorCode, StoreError};
use crate::proto::{BatchGetRequest, GetRequest};
use crate::spin::HotWindow;
use crate::tls::{Conn, ServerTls};

/// Largest request body accepted: a batch of 1,024 keys of the longest size (4 KiB) fits.
pub const MAX_REQUEST: usize = 5 << 20;
/// Largest opening frame: a `ClientHello` is a protocol number and a client name.
pub const MAX_HELLO: usize = 1024;
/// How long a connection may wait for its next whole frame.
pub const IDLE: std::time::Duration = std::time::Duration::from_secs(120);
/// How long a new connection may take to send its hello: a caller that shows nothing holds a
/// place only this long.
pub const HELLO_WITHIN: std::time::Duration = std::time::Duration::from_secs(10);

/// Method numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Method {
    PutStart = 1,
    PutCommit = 2,
    PutRevoke = 3,
    Get = 4,
    Exists = 5,
    Remove = 6,
    BatchExists = 7,
    BatchGet = 8,
    BatchPutStart = 9,
    BatchPutCommit = 10,
    BatchRemove = 11,
    /// The opening frame: a `ClientHello`, answered with a `ServerHello` or a refusal.
    Hello = 12,
}

impl Method {
    fn from_u8(b: u8) -> Option<Self> {
        Some(match b {
            1 => Self::PutStart,
            2 => Self::PutCommit,
            3 => Self::PutRevoke,
            4 => Self::Get,
            5 => Self::Exists,
            6 => Self::Remove,
            7 => Self::BatchExists,
            8 => Self::BatchGet,
            9 => Self::BatchPutStart,
            10 => Self::BatchPutCommit,
            11 => Self::BatchRemove,
            12 => Self::Hello,
            _ => return None,
        })
    }
}

/// Serves the port until `cancel` fires, then closes every connection.
pub async fn serve(
    listener: TcpListener,
    tls: Option<ServerTls>,
    leader: Leader,
    hot: Arc<HotWindow>,
    cancel: CancellationToken,
) {
    let incoming = crate::net::incoming(listener);
    crate::net::serve_connections(incoming, "fast port", cancel, move |stream: TcpStream| {
        let leader = leader.clone();
        let hot = hot.clone();
        let tls = tls.clone();
        async move {
            let served = match crate::tls::accept(tls.as_ref(), stream).await {
                Ok(s) => connection(s, &leader, &hot).await,
                Err(e) => Err(e),
            };
            if let Err(e) = served {
                tracing::debug!(error = %e, "fast port connection closed");
            }
        }
    })
    .await;
}

async fn connection(mut s: Conn, leader: &Leader, hot: &HotWindow) -> std::io::Result<()> {
    let mut buf = BytesMut::new();
    let mut out = BytesMut::new();
    let mut greeted = false;
    // the credential the hello showed, checked again before every later frame
    let mut credential = String::new();
    loop {
        if greeted && leader.with(|s| s.admits(Some(&credential))).is_err() {
            // it left the ledger (a rotation, a deleted Binding): the client sends the request
            // again on a fresh connection, whose hello shows its credential now
            return Ok(());
        }
        let (max, within) = if greeted {
            (MAX_REQUEST, IDLE)
        } else {
            (MAX_HELLO, HELLO_WITHIN)
        };
        let Ok(frame) = tokio::time::timeout(within, crate::frame::read(&mut s, &mut buf, max)).await else {
            return Ok(());
        };
        let (method, body) = match frame {
            Ok(Some(f)) => f,
            Ok(None) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                let e = StoreError::new(
                    ErrorCode::InvalidArgument,
                    if greeted {
                        format!("{e}; this port serves metadata calls of at most {MAX_REQUEST} bytes: split the batch")
                    } else {
                        format!("{e}; a connection opens with a ClientHello of at most {MAX_HELLO} bytes")
                    },
                );
                refusal(&mut out, &e);
                return send(&mut s, &out).await;
            }
            Err(e) => return Err(e),
        };
        if !greeted {
            // the first frame says which protocol the client speaks; nothing else is served before
            match greet(leader, method, &body) {
                Ok((hello, shown)) => {
                    reply(&mut out, &hello).map_err(std::io::Error::other)?;
                    greeted = true;
                    credential = shown;
                }
                Err(e) => {
                    refusal(&mut out, &e);
                    return send(&mut s, &out).await;
                }
            }
        } else if let Some(after) = answer(leader, method, &body, &mut out) {
            after.finish(leader, &mut out).await;
        }
        send(&mut s, &out).await?;
        // the same client's next call usually follows within microseconds
        hot.touch();
    }
}

/// Sends a reply frame whole (over TLS, flushing what the encryption holds back).
async fn send(s: &mut Conn, out: &BytesMut) -> std::io::Result<()> {
    s.write_all(out.chunk()).await?;
    s.flush().await
}

/// The answer to a connection's first frame: a `ServerHello` when it is a `Hello` naming a
/// protocol this leader serves and showing a credential it takes (with that credential).
fn greet(leader: &Leader, method: u8, body: &[u8]) -> Result<(crate::protocol::ServerHello, String), StoreError> {
    use crate::protocol::{ClientVersion, check, server_hello};
    let hello: crate::protocol::ClientHello = if method == Method::Hello as u8 {
        decode(body)?
    } else {
        Default::default()
    };
    let client = if method == Method::Hello as u8 {
        ClientVersion::from_hello(&hello)
    } else {
        ClientVersion {
            protocol: None,
            client: String::new(),
        }
    };
    check(&client)?;
    leader.serving(|s| s.admits(Some(&hello.credential)))?;
    Ok((server_hello(), hello.credential))
}

/// What must happen before a reply is sent (`calls.rs`).
#[derive(Debug)]
pub enum After {
    /// a removal's: the members applied the frees (`out` holds the reply)
    Durable(calls::Durable),
    /// a get's: the values it asked for were loaded from disk; then it looks again and the
    /// reply is written
    Get(GetRequest, calls::Loads),
    BatchGet(BatchGetRequest, calls::Loads),
}

impl After {
    /// Waits, and for a get writes its reply (or its refusal) into `out`.
    pub async fn finish(self, leader: &Leader, out: &mut BytesMut) {
        let replied = match self {
            After::Durable(d) => {
                d.wait(leader).await;
                Ok(())
            }
            After::Get(r, loads) => {
                let loaded = loads.wait(leader).await;
                calls::get_loaded(leader, &r, loaded).and_then(|a| reply(out, &a))
            }
            After::BatchGet(r, loads) => {
                let loaded = loads.wait(leader).await;
                calls::batch_get_loaded(leader, &r, loaded).and_then(|a| reply(out, &a))
            }
        };
        if let Err(e) = replied {
            refusal(out, &e);
        }
    }
}

/// `out` = the reply frame to one request frame (`method`, `body`): its answer, or a refusal;
/// or what must happen before it is (complete and) sent.
pub fn answer(leader: &Leader, method: u8, body: &[u8], out: &mut BytesMut) -> Option<After> {
    let served = match Method::from_u8(method) {
        Some(m) => dispatch(leader, m, body, out),
        None => Err(StoreError::new(
            ErrorCode::InvalidArgument,
            "unknown method on the fast port",
        )),
    };
    match served {
        Ok(durable) => durable,
        Err(e) => {
            refusal(out, &e);
            None
        }
    }
}

fn decode<M: Message + Default>(body: &[u8]) -> Result<M, StoreError> {
    M::decode(body).map_err(|e| StoreError::new(ErrorCode::InvalidArgument, format!("malformed request: {e}")))
}

/// Decodes the request, runs its call (`calls.rs`, shared with gRPC) and writes the reply frame
/// into `out`; on an error `out` is left for the caller to overwrite with the refusal.
fn dispatch(leader: &Leader, method: Method, body: &[u8], out: &mut BytesMut) -> Result<Option<After>, StoreError> {
    let now = Instant::now();
    match method {
        Method::Remove => {
            let (answer, durable) = calls::remove(leader, decode(body)?, now)?;
            reply(out, &answer)?;
            return Ok(Some(After::Durable(durable)));
        }
        Method::BatchRemove => {
            let (answer, durable) = calls::batch_remove(leader, decode(body)?, now)?;
            reply(out, &answer)?;
            return Ok(Some(After::Durable(durable)));
        }
        Method::Get => {
            let r: GetRequest = decode(body)?;
            return match calls::get(leader, &r, now)? {
                calls::Step::Done(answer) => reply(out, &answer).map(|()| None),
                calls::Step::Wait(loads) => Ok(Some(After::Get(r, loads))),
            };
        }
        Method::BatchGet => {
            let r: BatchGetRequest = decode(body)?;
            return match calls::batch_get(leader, &r, now)? {
                calls::Step::Done(answer) => reply(out, &answer).map(|()| None),
                calls::Step::Wait(loads) => Ok(Some(After::BatchGet(r, loads))),
            };
        }
        _ => {}
    }
    match method {
        Method::PutStart => reply(out, &calls::put_start(leader, decode(body)?, now)?),
        Method::PutCommit => reply(out, &calls::put_commit(leader, decode(body)?)?),
        Method::PutRevoke => reply(out, &calls::put_revoke(leader, decode(body)?)?),
        Method::Exists => reply(out, &calls::exists(leader, decode(body)?, now)?),

        Method::BatchExists => reply(out, &calls::batch_exists(leader, decode(body)?, now)?),
        Method::BatchPutStart => reply(out, &calls::batch_put_start(leader, decode(body)?, now)?),
        Method::BatchPutCommit => reply(out, &calls::batch_put_commit(leader, decode(body)?)?),

        // said once, first (`connection`); again later it changes nothing
        Method::Hello => reply(out, &crate::protocol::server_hello()),
        Method::Remove | Method::BatchRemove | Method::Get | Method::BatchGet => Ok(()),
    }
    .map(|()| None)
}

/// `out` = one reply frame carrying `m`, encoded in place.
fn reply(out: &mut BytesMut, m: &impl Message) -> Result<(), StoreError> {
    let len = m.encoded_len();
    out.clear();
    out.reserve(5 + len);
    out.put_u32_le(len as u32);
    out.put_u8(0);
    m.encode(out)
        .map_err(|e| StoreError::new(ErrorCode::Internal, format!("encoding the reply: {e}")))
}

/// `out` = one refusal frame, "CODE: message".
fn refusal(out: &mut BytesMut, e: &StoreError) {
    let msg = e.to_string();
    out.clear();
    out.put_u32_le(msg.len() as u32);
    out.put_u8(1);
    out.put_slice(msg.as_bytes());
}
