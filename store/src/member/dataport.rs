//! The member's framed data port (format in `wire.rs`). On a plain connection writes are
//! received from the socket straight into the segment and reads are sent straight from it, with
//! no copy in between (the system calls take the mapping's raw pointers: `mmap.rs`). Over TLS
//! (`--tls-cert`, `tls/sealed.rs`) a write's records are decrypted in place in the buffer the
//! socket filled and copied into the segment from there; a read's bytes are copied from the
//! segment into the buffer they are encrypted in: one copy each way besides the cipher.
//!
//! What one connection may cost is bounded: a connection idle for [`IDLE`] between requests is
//! closed (clients check a pooled connection before reusing it); a header, once begun, must be
//! whole within [`HEADER`]; a write must end by its deadline plus [`WRITE_GRACE`], a read by its
//! lease's deadline (past it the leader may place another value in the range, which a reader
//! that stopped reading must not keep claimed); a write whose grant the leader did not sign is
//! refused and the connection closed without reading its payload.

use std::sync::Arc;
use std::time::Duration;

use bytes::Buf;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use super::mmap::{ReadRange, WriteRange};
use super::segment::{Grant, Segment};
use super::tiering::Tiering;
use crate::error::StoreError;
use crate::grant::Access;
use crate::spin::HotWindow;
use crate::time::now_unix_ms;
use crate::tls::{Conn, Sealed, ServerTls};
use crate::wire::{Op, REQUEST_LEN, Request, Response};

pub mod disk;

/// How long past its deadline a write that already started may take. The leader reuses an
/// abandoned reservation only after its own grace (`--put-grace`, 30 s), which is longer.
pub const WRITE_GRACE: Duration = Duration::from_secs(10);
/// How long a connection may sit between requests.
pub const IDLE: Duration = Duration::from_secs(120);
/// How long a request header may take once its first byte arrived.
pub const HEADER: Duration = Duration::from_secs(10);

/// What the data port serves bytes from: the segment, and the disk tier when there is one.
#[derive(Debug, Clone)]
pub struct Stores {
    pub segment: Arc<Segment>,
    pub tiering: Option<Arc<Tiering>>,
}

impl Stores {
    pub fn new(segment: &Arc<Segment>, tiering: Option<&Arc<Tiering>>) -> Stores {
        Stores {
            segment: segment.clone(),
            tiering: tiering.cloned(),
        }
    }
}

/// Serves the data port until `cancel` fires, then closes every connection (a transfer cut off
/// mid-way is refused by its client's checks, and its range is released with the task).
pub async fn serve(
    listener: TcpListener,
    tls: Option<ServerTls>,
    stores: Stores,
    hot: Arc<HotWindow>,
    cancel: CancellationToken,
) {
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    crate::net::serve_connections(incoming, "data port", cancel, move |stream: TcpStream| {
        let _ = stream.set_nodelay(true);
        let peer = stream.peer_addr();
        if let Ok(peer) = &peer {
            crate::net::tune_data_connection(socket2::SockRef::from(&stream), peer);
        }
        let stores = stores.clone();
        let hot = hot.clone();
        let tls = tls.clone();
        async move {
            let served = match crate::tls::accept(tls.as_ref(), stream).await {
                Ok(s) => connection(s, &stores, &hot).await,
                Err(e) => Err(e),
            };
            if let Err(e) = served {
                tracing::debug!(?peer, error = %e, "data connection closed");
            }
        }
    })
    .await;
}

async fn connection(mut s: Conn, stores: &Stores, hot: &HotWindow) -> std::io::Result<()> {
    let segment = &*stores.segment;
    let mut head = [0u8; REQUEST_LEN];
    loop {
        // the whole header usually arrives at once
        let got = match tokio::time::timeout(IDLE, s.read(&mut head)).await {
            Ok(Ok(0)) | Err(_) => return Ok(()),
            Ok(Ok(n)) => n,
            Ok(Err(e)) => return Err(e),
        };
        match tokio::time::timeout(HEADER, s.read_exact(&mut head[got..])).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Ok(Err(e)) => return Err(e),
            Err(_) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "header not sent in time",
                ));
            }
        }
        let req = match Request::decode(&head) {
            Ok(r) => r,
            Err(e) => {
                // the stream cannot be trusted past a bad header: answer and close
                return refuse(&mut s, &e).await;
            }
        };
        hot.touch();
        match req.op {
            Op::Write => {
                if !write(&mut s, segment, req).await? {
                    return Ok(());
                }
            }
            Op::Read => {
                if !read(&mut s, segment, req).await? {
                    return Ok(());
                }
            }
            Op::ReadDisk => {
                if !disk::read(&mut s, stores, req).await? {
                    return Ok(());
                }
            }
            Op::Map | Op::ClaimWrite | Op::ClaimRead | Op::Release | Op::TierFile => {
                let e = StoreError::new(
                    crate::error::ErrorCode::InvalidArgument,
                    "ops 3 to 6 and 8 are served on the member's same-host socket only; send 1 (write), 2 (read) or 7 (read \
                     from the disk tier) here",
                );
                return refuse(&mut s, &e).await;
            }
        }
        // the same client's next transfer usually follows within microseconds
        hot.touch();
    }
}

/// Reads the value's tag that follows a write's or disk read's header (within [`HEADER`]); `None`
/// when the connection must close.
pub(super) async fn read_tag(s: &mut Conn, req: &Request) -> std::io::Result<Option<Vec<u8>>> {
    let n = usize::from(req.tag_len);
    if n > crate::grant::MAX_TAG_LEN {
        let e = StoreError::new(
            crate::error::ErrorCode::InvalidArgument,
            format!(
                "a tag is at most {} bytes; this one says {n}",
                crate::grant::MAX_TAG_LEN
            ),
        );
        refuse(s, &e).await?;
        return Ok(None);
    }
    let mut tag = vec![0u8; n];
    match tokio::time::timeout(HEADER, s.read_exact(&mut tag)).await {
        Ok(Ok(_)) => Ok(Some(tag)),
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(None),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "tag not sent in time",
        )),
    }
}

/// Returns `false` when the connection must close.
async fn write(s: &mut Conn, segment: &Segment, req: Request) -> std::io::Result<bool> {
    let Some(tag) = read_tag(s, &req).await? else {
        return Ok(false);
    };
    segment.settle(&Grant::of(&req), Access::Write, req.len, &tag).await;
    match segment.begin_write(Grant::of(&req), req.len, &tag) {
        Ok(mut range) => {
            let left = Duration::from_millis(req.deadline_unix_ms.saturating_sub(now_unix_ms())) + WRITE_GRACE;
            // the bytes are hashed piece by piece as they arrive: over TLS as they are copied
            // in, on a plain port as each piece lands in the segment
            let received = async {
                match s {
                    Conn::Plain(tcp) => range.recv_from(tcp).await,
                    Conn::Sealed(tls) => recv_decrypted(tls, &mut range).await,
                }
            };
            let checksum = match tokio::time::timeout(left, received).await {
                Ok(r) => r?,
                Err(_) => {
                    tracing::warn!(
                        offset = req.offset,
                        len = req.len,
                        "write passed its deadline, dropping connection"
                    );
                    return Ok(false);
                }
            };
            range.finish_with(checksum);
            segment.wrote(req.len);
            s.write_all(&Response { ok: true, len: 0 }.encode()).await?;
            s.flush().await?;
            Ok(true)
        }
        Err(e) => {
            // a grant the leader did not sign (or a payload larger than the segment): not worth
            // reading; answer and close
            if e.code == crate::error::ErrorCode::Unauthenticated || req.len > segment.capacity() {
                refuse(s, &e).await?;
                return Ok(false);
            }
            // a signed grant refused for now (expired, remounted, busy): keep the connection
            // usable by consuming the payload, within the time a write of it would have had
            let left = Duration::from_millis(req.deadline_unix_ms.saturating_sub(now_unix_ms())) + WRITE_GRACE;
            let drained = tokio::time::timeout(left, async {
                let mut rest = req.len;
                let mut sink = [0u8; 16 * 1024];
                while rest > 0 {
                    let n = rest.min(sink.len() as u64) as usize;
                    s.read_exact(&mut sink[..n]).await?;
                    rest -= n as u64;
                }
                std::io::Result::Ok(())
            })
            .await;
            match drained {
                Ok(r) => r?,
                Err(_) => return Ok(false),
            }
            refuse(s, &e).await?;
            Ok(true)
        }
    }
}

/// Returns `false` when the connection must close.
async fn read(s: &mut Conn, segment: &Segment, req: Request) -> std::io::Result<bool> {
    segment.settle(&Grant::of(&req), Access::Read, req.len, &[]).await;
    match segment.begin_read(Grant::of(&req), req.len) {
        Ok(range) => {
            let head = Response { ok: true, len: req.len }.encode();
            // the claim ends with the lease: a reader that stops reading loses the connection
            let left = Duration::from_millis(req.deadline_unix_ms.saturating_sub(now_unix_ms()));
            let sent = async {
                match s {
                    Conn::Plain(tcp) => range.send_to(tcp, &head).await,
                    Conn::Sealed(tls) => send_encrypted(tls, &range, &head).await,
                }
            };
            match tokio::time::timeout(left, sent).await {
                Ok(r) => r?,
                Err(_) => {
                    tracing::warn!(
                        offset = req.offset,
                        len = req.len,
                        "read passed its lease, dropping connection"
                    );
                    return Ok(false);
                }
            }
            drop(range);
            segment.read(req.len);
            Ok(true)
        }
        Err(e) => {
            refuse(s, &e).await?;
            Ok(true)
        }
    }
}

/// Fills `range` from a TLS connection, each decrypted record copied in from TLS's own buffer;
/// returns the bytes' XXH3-64, hashed from that buffer as they are copied.
async fn recv_decrypted(tls: &mut Sealed, range: &mut WriteRange<'_>) -> std::io::Result<u64> {
    use tokio::io::AsyncBufReadExt;
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    let mut done = 0;
    while done < range.len() {
        let buf = tls.fill_buf().await?;
        if buf.is_empty() {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let n = buf.len().min((range.len() - done) as usize);
        range.copy_part(done, &buf[..n]).map_err(std::io::Error::other)?;
        hasher.update(&buf[..n]);
        tls.consume(n);
        done += n as u64;
    }
    Ok(hasher.digest())
}

/// Sends `head` and then the range's bytes on a TLS connection, each piece copied from the
/// segment straight into the buffer it is encrypted in.
async fn send_encrypted(tls: &mut Sealed, range: &ReadRange<'_>, head: &[u8]) -> std::io::Result<()> {
    let h = head.len() as u64;
    tls.send_with(h + range.len(), |at, dst| {
        let mut dst = dst;
        let mut at = at;
        if at < h {
            let n = ((h - at) as usize).min(dst.len());
            dst[..n].copy_from_slice(&head[at as usize..at as usize + n]);
            dst = &mut dst[n..];
            at += n as u64;
        }
        if dst.is_empty() {
            return Ok(());
        }
        range.copy_part(at - h, dst).map_err(std::io::Error::other)
    })
    .await
}

pub(super) async fn refuse(s: &mut Conn, e: &StoreError) -> std::io::Result<()> {
    let msg = e.to_string();
    let head = Response {
        ok: false,
        len: msg.len() as u64,
    }
    .encode();
    let mut buf = Buf::chain(&head[..], msg.as_bytes());
    s.write_all_buf(&mut buf).await?;
    s.flush().await
}
