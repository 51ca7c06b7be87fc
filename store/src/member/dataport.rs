//! The member's framed data port (format in `wire.rs`): writes are received from the socket
//! straight into the segment and reads are sent straight from it, with no copy in between (the
//! system calls take the mapping's raw pointers: `mmap.rs`).

use std::sync::Arc;
use std::time::Duration;

use bytes::Buf;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use super::segment::{Grant, Segment};
use crate::error::StoreError;
use crate::grant::Access;
use crate::spin::HotWindow;
use crate::time::now_unix_ms;
use crate::wire::{Op, REQUEST_LEN, Request, Response};

/// How long past its deadline a write that already started may take. The leader reuses an
/// abandoned reservation only after its own grace (`--put-grace`, 30 s), which is longer.
pub const WRITE_GRACE: Duration = Duration::from_secs(10);

/// Serves the data port until `cancel` fires, then closes every connection (a transfer cut off
/// mid-way is refused by its client's checks, and its range is released with the task).
pub async fn serve(listener: TcpListener, segment: Arc<Segment>, hot: Arc<HotWindow>, cancel: CancellationToken) {
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    crate::net::serve_connections(incoming, "data port", cancel, move |stream: TcpStream| {
        let _ = stream.set_nodelay(true);
        let peer = stream.peer_addr();
        if let Ok(peer) = &peer {
            crate::net::tune_data_connection(socket2::SockRef::from(&stream), peer);
        }
        let segment = segment.clone();
        let hot = hot.clone();
        async move {
            if let Err(e) = connection(stream, &segment, &hot).await {
                tracing::debug!(?peer, error = %e, "data connection closed");
            }
        }
    })
    .await;
}

async fn connection(mut s: TcpStream, segment: &Segment, hot: &HotWindow) -> std::io::Result<()> {
    let mut head = [0u8; REQUEST_LEN];
    loop {
        match s.read_exact(&mut head).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
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
            Op::Read => read(&mut s, segment, req).await?,
            Op::Map | Op::ClaimWrite | Op::ClaimRead | Op::Release => {
                let e = StoreError::new(
                    crate::error::ErrorCode::InvalidArgument,
                    "ops 3 to 6 are served on the member's same-host socket only; send 1 (write) or 2 (read) here",
                );
                return refuse(&mut s, &e).await;
            }
        }
        // the same client's next transfer usually follows within microseconds
        hot.touch();
    }
}

fn grant(req: &Request) -> Grant {
    Grant {
        mount_id: req.mount_id,
        epoch: req.epoch,
        offset: req.offset,
        deadline_unix_ms: req.deadline_unix_ms,
        mac: req.mac,
    }
}

/// Returns `false` when the connection must close.
async fn write(s: &mut TcpStream, segment: &Segment, req: Request) -> std::io::Result<bool> {
    segment.settle(&grant(&req), Access::Write, req.len).await;
    match segment.begin_write(grant(&req), req.len) {
        Ok(mut range) => {
            let left = Duration::from_millis(req.deadline_unix_ms.saturating_sub(now_unix_ms())) + WRITE_GRACE;
            match tokio::time::timeout(left, range.recv_from(s)).await {
                Ok(r) => {
                    r?;
                }
                Err(_) => {
                    tracing::warn!(
                        offset = req.offset,
                        len = req.len,
                        "write passed its deadline, dropping connection"
                    );
                    return Ok(false);
                }
            }
            drop(range);
            segment.wrote(req.len);
            s.write_all(&Response { ok: true, len: 0 }.encode()).await?;
            Ok(true)
        }
        Err(e) => {
            // keep the connection usable by consuming the payload, if it is of a sane size
            if req.len > segment.capacity() {
                refuse(s, &e).await?;
                return Ok(false);
            }
            let mut rest = req.len;
            let mut sink = vec![0u8; 64 * 1024];
            while rest > 0 {
                let n = rest.min(sink.len() as u64) as usize;
                s.read_exact(&mut sink[..n]).await?;
                rest -= n as u64;
            }
            refuse(s, &e).await?;
            Ok(true)
        }
    }
}

async fn read(s: &mut TcpStream, segment: &Segment, req: Request) -> std::io::Result<()> {
    segment.settle(&grant(&req), Access::Read, req.len).await;
    match segment.begin_read(grant(&req), req.len) {
        Ok(range) => {
            let head = Response { ok: true, len: req.len }.encode();
            range.send_to(s, &head).await?;
            drop(range);
            segment.read(req.len);
            Ok(())
        }
        Err(e) => refuse(s, &e).await,
    }
}

async fn refuse(s: &mut TcpStream, e: &StoreError) -> std::io::Result<()> {
    let msg = e.to_string();
    let head = Response {
        ok: false,
        len: msg.len() as u64,
    }
    .encode();
    let mut buf = Buf::chain(&head[..], msg.as_bytes());
    s.write_all_buf(&mut buf).await
}
