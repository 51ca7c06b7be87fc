//! Op 7: a value only on the member's disk tier, streamed from disk to the reader (the leader's
//! `--tier-reads direct`). The grant (for [`Access::ReadDisk`], over the value's tag) is checked
//! first; the copy is then read in [`PIECE`]s on the tier's reader threads (`tiering/readers.rs`:
//! a few for the whole member, taking pieces in the order asked), [`IN_FLIGHT`] asked for at once
//! while the ones before are sent (and at most `tiering::direct::MAX_PIECES` held on all
//! connections), each hashed once sent, and the answer ends with the [`Verdict`]: whether the
//! bytes matched their checksum. A copy that cannot be opened is answered with no bytes and
//! [`Verdict::Damaged`] (a miss); either way the tier reports the copy lost (`tiering/direct.rs`).

use std::collections::VecDeque;
use std::time::Duration;

use tokio::io::AsyncWriteExt;

use super::{Stores, read_tag, refuse};
use crate::error::{ErrorCode, StoreError};
use crate::grant::Access;
use crate::member::segment::Grant;
use crate::member::tier::{ReadError, Stream};
use crate::member::tiering::Tiering;
use crate::time::now_unix_ms;
use crate::tls::Conn;
use crate::wire::{Request, Response, Verdict};

/// Bytes read from disk at a time, each piece a request of its own to the device: all of
/// [`PIECE`] (small, so that little is left to send once the device is done:
/// `tiering/readers.rs` has the figures), not tapering as a same-host client's pieces
/// (`tier::tapering`). Op 7 sends its pieces in order, and the reader threads put a read's pieces
/// to the device together: a large first piece that lands last holds every send back until the
/// device is done (tried: one get at a time over TCP 82, 68 and 60% of `dd` in three bench runs,
/// against 80 and 85% with these in the two before).
const PIECE: u64 = crate::member::tier::PIECE;
/// Pieces of one read asked for at once: the device works on the next ones while the first is
/// sent.
pub const IN_FLIGHT: usize = 8;

/// Returns `false` when the connection must close.
pub async fn read(s: &mut Conn, stores: &Stores, req: Request) -> std::io::Result<bool> {
    let Some(tag) = read_tag(s, &req).await? else {
        return Ok(false);
    };
    let Some(tiering) = &stores.tiering else {
        let e = StoreError::new(
            ErrorCode::InvalidArgument,
            "this member has no disk tier: op 7 reads only values a Location says are on disk",
        );
        refuse(s, &e).await?;
        return Ok(true);
    };
    if let Err(e) = stores
        .segment
        .admit(&Grant::of(&req), Access::ReadDisk, req.len, &tag)
        .await
    {
        refuse(s, &e).await?;
        return Ok(true);
    }
    let Some(stream) = tiering.open_read(req.offset, &tag, req.len) else {
        s.write_all(&Response { ok: true, len: 0 }.encode()).await?;
        s.write_all(&Verdict::Damaged.encode()).await?;
        s.flush().await?;
        return Ok(true);
    };
    let id = stream.id();
    // a reader that stops reading loses the connection once its grant's deadline passed
    let left = Duration::from_millis(req.deadline_unix_ms.saturating_sub(now_unix_ms()));
    match tokio::time::timeout(left, send(s, tiering, stream)).await {
        Ok(Ok(outcome)) => {
            let verdict = match outcome {
                Ok(()) => Verdict::Intact,
                Err(_) => Verdict::Damaged,
            };
            tiering.read_done(id, outcome);
            s.write_all(&verdict.encode()).await?;
            s.flush().await?;
            stores.segment.read(req.len);
            Ok(true)
        }
        Ok(Err(e)) => Err(e),
        Err(_) => {
            tracing::warn!(
                disk_id = req.offset,
                len = req.len,
                "a disk read passed its deadline, dropping connection"
            );
            Ok(false)
        }
    }
}

/// Sends the answer's header and the value's bytes, up to [`IN_FLIGHT`] pieces asked of the
/// tier's readers at once (as the member's room for pieces allows, `tiering::direct::MAX_PIECES`)
/// while the ones before go out in order: the outer error ends the connection, the
/// inner one says what was wrong with the copy (its bytes were then not all sent, or not the
/// value).
async fn send(s: &mut Conn, tiering: &Tiering, mut stream: Stream) -> std::io::Result<Result<(), ReadError>> {
    let len = stream.len;
    s.write_all(&Response { ok: true, len }.encode()).await?;
    let mut pieces = stream.pieces(PIECE).into_iter().peekable();
    let mut reading = VecDeque::new();
    let mut sent = 0u64;
    loop {
        while reading.len() < IN_FLIGHT && pieces.peek().is_some() {
            // wait for room only holding none: with pieces in flight, send the first instead
            let held = if reading.is_empty() {
                tiering.piece_room().await
            } else if let Some(held) = tiering.try_piece_room() {
                held
            } else {
                break;
            };
            let Some(p) = pieces.next() else { break };
            let read = tiering.read_piece(stream.read_piece(p));
            reading.push_back((read, held));
        }
        let Some((first, _held)) = reading.pop_front() else {
            return Ok(stream.finish());
        };
        match first.await.map_err(std::io::Error::other)? {
            Ok(p) => {
                // sent first, hashed while the reader takes it in
                s.write_all(p.bytes()).await?;
                sent += p.bytes().len() as u64;
                stream.take(&p);
                tiering.give_back(p.into_buffer());
            }
            Err(e) => {
                // the rest cannot come: zeros keep the answer's length, the verdict says why
                fill(s, len - sent).await?;
                return Ok(Err(e));
            }
        }
    }
}

/// Zeros for the `n` bytes a failed read could not send (its verdict says they are not the value).
async fn fill(s: &mut Conn, mut n: u64) -> std::io::Result<()> {
    let zeros = [0u8; 16 * 1024];
    while n > 0 {
        let k = n.min(zeros.len() as u64) as usize;
        s.write_all(&zeros[..k]).await?;
        n -= k as u64;
    }
    Ok(())
}
