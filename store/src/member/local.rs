//! The member's same-host socket: a Linux abstract unix socket (`@kvstore-member-<instance>`, in
//! the member's network namespace, so only processes that share it can connect), through which a
//! client on this host maps the segment itself and moves each value with one memcpy instead of
//! a trip through TCP.
//!
//! Protocol (headers of `wire.rs`, one request at a time per connection):
//! - `Map` with a grant the leader gave for this mount (a write or read range, as a claim carries
//!   it): answered with the segment's descriptor (SCM_RIGHTS, on the header's bytes), then 16
//!   bytes: `capacity u64 | flags u64` (bit 0: every page is resident, so a client may map it
//!   with its page tables filled in at once). Without one it is refused: a process that reaches
//!   the socket but was never granted a range by the leader maps nothing. A `Map` that arrives
//!   while this member's Mount call is still in flight waits for its answer (bounded);
//! - `ClaimWrite` / `ClaimRead` with the leader's grant: the same checks as the data port (mount,
//!   epoch, deadline, bounds, and the range table, `mmap.rs`), then the claim is held for the
//!   connection until
//! - `TierFile` with the leader's grant of a read of a value's copy on the disk tier (its tag
//!   follows): the same checks as op 7 on the data port, and the copy's record must be live and
//!   the granted value's; answered with a descriptor of the tier file that holds it, opened for
//!   the answer (SCM_RIGHTS), and the file's number (`wire::TierFile`), or, when the copy is not
//!   there, with no descriptor and `len` 0 (a miss, reported to the leader as op 7 reports it).
//!   Nothing is held: the client reads the record itself (`client/disk.rs`), and may keep the
//!   descriptor for later reads of the same file;
//! - `Release`, answered once the claim is dropped; a closed connection drops it too.
//!
//! A read claim is held at most until its grant's deadline (the read lease: past it the leader may
//! free the range and place another value there), a write claim until its deadline plus
//! [`WRITE_GRACE`] (the leader reuses an abandoned reservation only after a longer grace); past
//! that the connection is closed and the range is free again, so a client that stalls cannot pin
//! a range. A tier file's bytes never change once written (records are appended and only their
//! flags rewritten, and a file's number is never reused), so a handed-out descriptor can read
//! nothing but what the file's records were; what it keeps is a deleted file's space, until the
//! client closes it (`client/disk.rs` keeps a file at most [`FILE_KEEP`] after it was handed
//! over, then asks again: each ask touches the file as a read does, for `--tier-lru`).

use std::io;
use std::os::fd::AsFd;
use std::os::linux::net::SocketAddrExt;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::{UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;

use super::dataport::WRITE_GRACE;
use super::mmap::ReadRange;
use super::segment::{Grant, Segment, Writing};
use super::tiering::Tiering;
use crate::error::{ErrorCode, StoreError};
use crate::grant::Access;
use crate::spin::HotWindow;
use crate::time::now_unix_ms;
use crate::wire::{Op, REQUEST_LEN, Request, Response, TierFile};

/// How long a same-host client keeps a tier file's descriptor after it was handed over: the
/// longest a file the tier deleted (its records all dead) keeps its space on disk for such a
/// client, and how long its reads of a file may go unseen by the tier's use order.
pub const FILE_KEEP: Duration = Duration::from_secs(5);

/// Bytes after the header of a `Map` answer.
pub const MAP_ANSWER_LEN: usize = 16;
/// `Map` answer flag: every page of the segment is resident.
pub const RESIDENT: u64 = 1;

/// The socket name a member of `instance_id` serves, as clients see it in a Location (`@` marks
/// the abstract namespace).
pub fn socket_name(instance_id: u64) -> String {
    format!("@kvstore-member-{instance_id:016x}")
}

/// Binds the abstract socket `name` (`@...`).
pub fn bind(name: &str) -> io::Result<UnixListener> {
    let abstract_name = name
        .strip_prefix('@')
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "an abstract socket name starts with @"))?;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(abstract_name)?;
    let l = std::os::unix::net::UnixListener::bind_addr(&addr)?;
    l.set_nonblocking(true)?;
    UnixListener::from_std(l)
}

/// Serves the socket until `cancel` fires, then closes every connection (their claims drop).
pub async fn serve(
    listener: UnixListener,
    stores: super::dataport::Stores,
    resident: bool,
    hot: Arc<HotWindow>,
    cancel: CancellationToken,
) {
    let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
    crate::net::serve_connections(incoming, "same-host socket", cancel, move |stream: UnixStream| {
        let segment = stores.segment.clone();
        let tiering = stores.tiering.clone();
        let hot = hot.clone();
        async move {
            if let Err(e) = connection(stream, &segment, tiering.as_deref(), resident, &hot).await {
                tracing::debug!(error = %e, "same-host connection closed");
            }
        }
    })
    .await;
}

/// The claim a connection holds.
enum Claim<'a> {
    None,
    Write(Writing<'a>),
    Read(ReadRange<'a>),
}

/// Serves one connection's requests in turn until it closes, fails, or holds a claim past its
/// deadline.
async fn connection(
    mut s: UnixStream,
    segment: &Segment,
    tiering: Option<&Tiering>,
    resident: bool,
    hot: &HotWindow,
) -> io::Result<()> {
    let mut head = [0u8; REQUEST_LEN];
    let mut claim = Claim::None;
    // when the held claim must be given up
    let mut until: Option<tokio::time::Instant> = None;
    loop {
        if !read_head(&mut s, &mut head, until).await? {
            return Ok(());
        }
        hot.touch();
        let req = match Request::decode(&head) {
            Ok(r) => r,
            Err(e) => return refuse(&mut s, &e).await,
        };
        // a write's tag follows its header (a map may show a write grant too)
        if let Err(e) = check_tag_len(&req) {
            return refuse(&mut s, &e).await;
        }
        let mut tag = vec![0u8; usize::from(req.tag_len)];
        s.read_exact(&mut tag).await?;
        let grant = Grant::of(&req);
        let answer = match req.op {
            // Only a caller the serving leader granted a range of this mount may map it.
            Op::Map => match segment.check_map(&grant, req.len, &tag).await {
                Ok(()) => {
                    map(&s, segment, resident).await?;
                    continue;
                }
                Err(e) => Err(e),
            },
            Op::ClaimWrite | Op::ClaimRead if !matches!(claim, Claim::None) => Err(StoreError::new(
                ErrorCode::InvalidArgument,
                "this connection holds a claim already; release it first",
            )),
            Op::ClaimWrite => {
                segment.settle(&grant, Access::Write, req.len, &tag).await;
                segment.begin_write(grant, req.len, &tag).map(|r| {
                    claim = Claim::Write(r);
                    until = Some(claim_deadline(req.deadline_unix_ms, Access::Write));
                })
            }
            Op::ClaimRead => {
                segment.settle(&grant, Access::Read, req.len, &[]).await;
                segment.begin_read(grant, req.len).map(|r| {
                    claim = Claim::Read(r);
                    until = Some(claim_deadline(req.deadline_unix_ms, Access::Read));
                })
            }
            Op::TierFile => match hand_tier_file(&s, segment, tiering, grant, req.len, &tag).await? {
                Some(answer) => answer,
                None => continue,
            },
            Op::Release => {
                until = None;
                release(std::mem::replace(&mut claim, Claim::None), segment);
                Ok(())
            }
            Op::Write | Op::Read | Op::ReadDisk => Err(StoreError::new(
                ErrorCode::InvalidArgument,
                "ops 1, 2 and 7 carry bytes: send them to the member's data port; this socket serves ops 3 to 6 and 8",
            )),
        };
        match answer {
            Ok(()) => s.write_all(&Response { ok: true, len: 0 }.encode()).await?,
            Err(e) => refuse(&mut s, &e).await?,
        }
        hot.touch();
    }
}

/// Reads the next request header into `head`, waiting no later than `until` while a claim is
/// held; `false` when the connection is done (closed by the client, or closed here because the
/// claim outlived its deadline).
async fn read_head(
    s: &mut UnixStream,
    head: &mut [u8; REQUEST_LEN],
    until: Option<tokio::time::Instant>,
) -> io::Result<bool> {
    let read = s.read_exact(head);
    let got = match until {
        Some(t) => match tokio::time::timeout_at(t, read).await {
            Ok(r) => r,
            Err(_) => {
                tracing::warn!("a same-host client held a claim past its deadline; closing its connection");
                return Ok(false);
            }
        },
        None => read.await,
    };
    match got {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(e),
    }
}

/// Refuses a request whose tag is longer than a tag may be.
fn check_tag_len(req: &Request) -> Result<(), StoreError> {
    if usize::from(req.tag_len) > crate::grant::MAX_TAG_LEN {
        return Err(StoreError::new(
            ErrorCode::InvalidArgument,
            format!("a tag is at most {} bytes", crate::grant::MAX_TAG_LEN),
        ));
    }
    Ok(())
}

/// Answers op 8 with the tier file that holds the copy (`None`: sent), or says what to answer:
/// nothing more than the header when the copy is not there (a miss, reported to the leader by
/// `open_read`), or the refusal.
async fn hand_tier_file(
    s: &UnixStream,
    segment: &Segment,
    tiering: Option<&Tiering>,
    grant: Grant,
    len: u64,
    tag: &[u8],
) -> io::Result<Option<Result<(), StoreError>>> {
    match tier_file(segment, tiering, grant, len, tag).await {
        Ok(Some((answer, file))) => {
            send_with_fd(s, &ok_with(&answer.encode()), file.as_fd()).await?;
            segment
                .counters
                .tier_files
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Ok(None)
        }
        Ok(None) => Ok(Some(Ok(()))),
        Err(e) => Ok(Some(Err(e))),
    }
}

/// Checks an op 8 request as op 7's (`dataport/disk.rs`) and opens the copy's file: the answer,
/// with the descriptor to hand out, or `None` when the copy is not there.
async fn tier_file(
    segment: &Segment,
    tiering: Option<&Tiering>,
    grant: Grant,
    len: u64,
    tag: &[u8],
) -> Result<Option<(TierFile, std::fs::File)>, StoreError> {
    let Some(tiering) = tiering else {
        return Err(StoreError::new(
            ErrorCode::InvalidArgument,
            "this member has no disk tier: op 8 asks only for values a Location says are on disk",
        ));
    };
    segment.admit(&grant, Access::ReadDisk, len, tag).await?;
    let Some(stream) = tiering.open_read(grant.offset, tag, len) else {
        return Ok(None);
    };
    // the descriptor opened for this read (with `O_DIRECT` where the file system allows it)
    let file = stream.file().try_clone().map_err(|e| {
        StoreError::new(
            ErrorCode::Internal,
            format!("the tier file could not be handed out: {e}"),
        )
    })?;
    let answer = TierFile {
        file: stream.id().file(),
        direct: stream.is_direct(),
    };
    Ok(Some((answer, file)))
}

/// Drops a released claim: a write is finished and counted, a read counted.
fn release(claim: Claim<'_>, segment: &Segment) {
    match claim {
        Claim::Write(r) => {
            let len = r.len();
            r.finish();
            segment.wrote(len);
            segment
                .counters
                .local_writes
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Claim::Read(r) => {
            segment.read(r.len());
            segment
                .counters
                .local_reads
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Claim::None => {}
    }
}

/// When a claim of `access` taken under a grant with this deadline must be given up.
fn claim_deadline(deadline_unix_ms: u64, access: Access) -> tokio::time::Instant {
    let left = Duration::from_millis(deadline_unix_ms.saturating_sub(now_unix_ms()));
    let grace = match access {
        Access::Write => WRITE_GRACE,
        Access::Read | Access::ReadDisk => Duration::ZERO,
    };
    tokio::time::Instant::now() + left + grace
}

/// Answers `Map`: the header and the capacity and flags, with the segment's descriptor.
async fn map(s: &UnixStream, segment: &Segment, resident: bool) -> io::Result<()> {
    let mut words = [0u8; MAP_ANSWER_LEN];
    words[..8].copy_from_slice(&segment.capacity().to_le_bytes());
    let flags = if resident { RESIDENT } else { 0 };
    words[8..].copy_from_slice(&flags.to_le_bytes());
    let Some(fd) = segment.hand_out() else {
        return Err(io::Error::other("the segment is not sealed; it is not handed out"));
    };
    send_with_fd(s, &ok_with(&words), fd).await
}

/// An accepting header followed by `words`.
fn ok_with(words: &[u8]) -> Vec<u8> {
    let mut answer = Response {
        ok: true,
        len: words.len() as u64,
    }
    .encode()
    .to_vec();
    answer.extend_from_slice(words);
    answer
}

/// Sends `answer` with the descriptor `fd` riding on its first bytes (SCM_RIGHTS).
async fn send_with_fd(s: &UnixStream, answer: &[u8], fd: std::os::fd::BorrowedFd<'_>) -> io::Result<()> {
    let fds = [fd];
    let mut sent = 0;
    while sent < answer.len() {
        s.writable().await?;
        let r = s.try_io(Interest::WRITABLE, || {
            let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
            let mut control = rustix::net::SendAncillaryBuffer::new(&mut space);
            // the descriptor rides on the first bytes only
            if sent == 0 && !control.push(rustix::net::SendAncillaryMessage::ScmRights(&fds)) {
                return Err(io::Error::other("no room for the descriptor"));
            }
            rustix::net::sendmsg(
                s,
                &[io::IoSlice::new(&answer[sent..])],
                &mut control,
                rustix::net::SendFlags::NOSIGNAL,
            )
            .map_err(io::Error::from)
        });
        match r {
            Ok(n) => sent += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Answers a refusal: the header, then `e`'s message.
async fn refuse(s: &mut UnixStream, e: &StoreError) -> io::Result<()> {
    let msg = e.to_string();
    let head = Response {
        ok: false,
        len: msg.len() as u64,
    }
    .encode();
    s.write_all(&head).await?;
    s.write_all(msg.as_bytes()).await
}
