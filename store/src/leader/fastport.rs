//! The leader's framed metadata port: the `Store` calls (put start/commit/revoke, get, exists,
//! remove) with the same protobuf messages as gRPC, in a framing that costs one TCP segment each
//! way. gRPC stays the portable protocol; this port exists because on small machines every extra
//! segment is a wake-up, and a wake-up costs more than the call (numbers in store/README.md).
//!
//! Request: `len u32 LE | method u8 | len bytes of protobuf`. Response: `len u32 LE | status u8
//! (0 ok, 1 refused) | len bytes` (the protobuf reply, or a UTF-8 "CODE: message"). One request
//! at a time per connection; clients pool connections.

use std::sync::Arc;
use std::time::Instant;

use bytes::{Buf, BufMut, BytesMut};
use prost::Message;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

use super::Leader;
use crate::error::{ErrorCode, StoreError};
use crate::proto::*;
use crate::spin::HotWindow;

/// Largest request body accepted (keys are at most 4 KiB; batches are not served here).
pub const MAX_REQUEST: usize = 1 << 20;

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
            _ => return None,
        })
    }
}

/// Serves the port until the process ends.
pub async fn serve(listener: TcpListener, leader: Leader, hot: Arc<HotWindow>) {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "fast port accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let leader = leader.clone();
        let hot = hot.clone();
        tokio::spawn(async move {
            if let Err(e) = connection(stream, &leader, &hot).await {
                tracing::debug!(error = %e, "fast port connection closed");
            }
        });
    }
}

async fn connection(mut s: TcpStream, leader: &Leader, hot: &HotWindow) -> std::io::Result<()> {
    let mut buf = BytesMut::new();
    let mut out = BytesMut::new();
    loop {
        let (method, body) = match crate::frame::read(&mut s, &mut buf, MAX_REQUEST).await {
            Ok(Some(f)) => f,
            Ok(None) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                let e = StoreError::new(
                    ErrorCode::InvalidArgument,
                    format!("{e}; this port serves small metadata calls"),
                );
                return write_reply(&mut s, &mut out, Err(e)).await;
            }
            Err(e) => return Err(e),
        };
        let reply = match Method::from_u8(method) {
            Some(m) => dispatch(leader, m, &body),
            None => Err(StoreError::new(
                ErrorCode::InvalidArgument,
                "unknown method on the fast port",
            )),
        };
        write_reply(&mut s, &mut out, reply).await?;
        // the same client's next call usually follows within microseconds
        hot.touch();
    }
}

fn decode<M: Message + Default>(body: &[u8]) -> Result<M, StoreError> {
    M::decode(body).map_err(|e| StoreError::new(ErrorCode::InvalidArgument, format!("malformed request: {e}")))
}

fn dispatch(leader: &Leader, method: Method, body: &[u8]) -> Result<Vec<u8>, StoreError> {
    let now = Instant::now();
    Ok(match method {
        Method::PutStart => {
            let r: PutStartRequest = decode(body)?;
            leader
                .with(|s| s.put_start(r.scope.as_ref(), &r.key, r.size, now))?
                .encode_to_vec()
        }
        Method::PutCommit => {
            let r: PutCommitRequest = decode(body)?;
            leader.with(|s| s.put_commit(r.scope.as_ref(), &r.key, r.put_id))?;
            PutCommitResponse {}.encode_to_vec()
        }
        Method::PutRevoke => {
            let r: PutRevokeRequest = decode(body)?;
            leader.with(|s| s.put_revoke(r.scope.as_ref(), &r.key, r.put_id))?;
            PutRevokeResponse {}.encode_to_vec()
        }
        Method::Get => {
            let r: GetRequest = decode(body)?;
            leader.with(|s| s.get(r.scope.as_ref(), &r.key, now))?.encode_to_vec()
        }
        Method::Exists => {
            let r: ExistsRequest = decode(body)?;
            ExistsResponse {
                exists: leader.with(|s| s.exists(r.scope.as_ref(), &r.key, now))?,
            }
            .encode_to_vec()
        }
        Method::Remove => {
            let r: RemoveRequest = decode(body)?;
            RemoveResponse {
                removed: leader.with(|s| s.remove(r.scope.as_ref(), &r.key, now))?,
            }
            .encode_to_vec()
        }
    })
}

async fn write_reply(s: &mut TcpStream, out: &mut BytesMut, reply: Result<Vec<u8>, StoreError>) -> std::io::Result<()> {
    out.clear();
    let (status, payload) = match reply {
        Ok(p) => (0u8, p),
        Err(e) => (1u8, e.to_string().into_bytes()),
    };
    out.put_u32_le(payload.len() as u32);
    out.put_u8(status);
    out.put_slice(&payload);
    s.write_all(out.chunk()).await
}
