//! The client's same-host path. A Location names the member's same-host socket
//! (`member/local.rs`); a client that can connect to it shares the member's host and network
//! namespace, maps the member's segment once (the descriptor comes over the socket), and moves
//! each value with one memcpy: claim the range on the socket (the member checks mount, epoch,
//! deadline and the range table, as for TCP), copy, release. No byte crosses a socket.
//!
//! Anything else falls back to the data port over TCP: no socket in the Location, a socket this
//! process cannot reach (another host, another network namespace), a member that refuses to
//! map, or a same-host path turned off ([`Client::without_local`](super::Client::without_local)).
//! A socket found unreachable is not tried again for [`RETRY_UNREACHABLE`].
//!
//! A value only on the member's disk tier is read from the tier's file here
//! ([`Client::local_disk_read`]): the member checks a grant and hands over the file (op 8), which
//! is kept for the file's later reads, and this process reads and checks the record itself
//! (`disk.rs`). A copy found wrong, or that cannot be read, is read again through the data port
//! (op 7), whose answer is the word on it (the member drops a damaged copy).

use std::collections::HashMap;
use std::io;
use std::os::linux::net::SocketAddrExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::UnixStream;

use super::data::Sink;
use super::disk::{DiskReads, TierFile, TierFiles};
use super::{Client, POOL_PER_MEMBER, transport};
use crate::error::{Result, StoreError};
use crate::member::local::{MAP_ANSWER_LEN, RESIDENT};
use crate::member::mmap::SharedMap;
use crate::member::tier::DiskId;
use crate::proto::Location;
use crate::wire::{self, Op, RESPONSE_LEN};

/// How long a member socket that could not be reached (or mapped) is left alone.
pub const RETRY_UNREACHABLE: Duration = Duration::from_secs(10);

/// The same-host segments this client knows, by socket name.
#[derive(Debug, Default)]
pub(super) struct Local {
    peers: Mutex<HashMap<String, Peer>>,
    /// tier files members handed over, for reads of values on their disk tiers
    tier_files: TierFiles,
    /// the window and piece buffers those reads share
    disk_reads: DiskReads,
}

#[derive(Debug, Clone)]
enum Peer {
    Unreachable(Instant),
    Mapped(Arc<Mapped>),
}

/// A member's segment, mapped here, and idle connections to its socket.
#[derive(Debug)]
struct Mapped {
    map: SharedMap,
    idle: Mutex<Vec<UnixStream>>,
}

/// Where the bytes of one transfer go or come from.
pub(super) enum Bytes<'a, 'b> {
    From(&'a [u8]),
    /// a value held as several slices, one after the other
    FromParts(&'a [&'b [u8]]),
    Into(&'a mut [u8]),
    /// a value read into several slices, one after the other
    IntoParts(&'a mut [&'b mut [u8]]),
    Fresh(&'a mut BytesMut),
}

fn connect(name: &str) -> io::Result<UnixStream> {
    let abstract_name = name
        .strip_prefix('@')
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "not an abstract socket name"))?;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(abstract_name)?;
    let s = std::os::unix::net::UnixStream::connect_addr(&addr)?;
    s.set_nonblocking(true)?;
    UnixStream::from_std(s)
}

async fn read_response(s: &mut UnixStream, spin: Duration) -> io::Result<wire::Response> {
    crate::spin::until_readable(s, Instant::now() + spin);
    let mut head = [0u8; RESPONSE_LEN];
    s.read_exact(&mut head).await?;
    wire::Response::decode(&head).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))
}

async fn read_refusal(s: &mut UnixStream, len: u64) -> io::Result<StoreError> {
    if len > wire::MAX_MESSAGE {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "oversized refusal"));
    }
    let mut msg = vec![0u8; len as usize];
    s.read_exact(&mut msg).await?;
    Ok(wire::refusal(&msg))
}

/// Connects to the member's socket and maps its segment, showing `grant` (a claim request for a
/// range the leader gave, as `Op::Map`).
async fn map(name: &str, grant: wire::Request, tag: &[u8]) -> io::Result<Mapped> {
    let mut s = connect(name)?;
    let ask = wire::Request { op: Op::Map, ..grant };
    s.write_all(&ask.encode()).await?;
    s.write_all(tag).await?;
    let mut answer = [0u8; RESPONSE_LEN + MAP_ANSWER_LEN];
    let mut fd = None;
    recv_with_fd(&s, &mut answer, &mut fd).await?;
    let mut head = [0u8; RESPONSE_LEN];
    head.copy_from_slice(&answer[..RESPONSE_LEN]);
    let resp = wire::Response::decode(&head).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
    if !resp.ok || resp.len != MAP_ANSWER_LEN as u64 {
        return Err(io::Error::other("the member refused to map its segment"));
    }
    let word = |at: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&answer[RESPONSE_LEN + at..RESPONSE_LEN + at + 8]);
        u64::from_le_bytes(w)
    };
    let (capacity, flags) = (word(0), word(8));
    let fd = fd.ok_or_else(|| io::Error::other("the member sent no descriptor"))?;
    let map = tokio::task::spawn_blocking(move || SharedMap::attach(fd, capacity, flags & RESIDENT != 0))
        .await
        .map_err(io::Error::other)??;
    Ok(Mapped {
        map,
        idle: Mutex::new(vec![s]),
    })
}

/// Fills `buf` from the socket, keeping the descriptor that rides on its bytes (the first one, if
/// several came) in `fd`.
async fn recv_with_fd(s: &UnixStream, buf: &mut [u8], fd: &mut Option<std::os::fd::OwnedFd>) -> io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        s.readable().await?;
        let r = s.try_io(Interest::READABLE, || {
            let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
            let mut control = rustix::net::RecvAncillaryBuffer::new(&mut space);
            let mut iov = [io::IoSliceMut::new(&mut buf[got..])];
            let msg = rustix::net::recvmsg(s, &mut iov, &mut control, rustix::net::RecvFlags::CMSG_CLOEXEC)?;
            for m in control.drain() {
                if let rustix::net::RecvAncillaryMessage::ScmRights(fds) = m {
                    for f in fds {
                        fd.get_or_insert(f);
                    }
                }
            }
            Ok(msg.bytes)
        });
        match r {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

impl Local {
    /// The mapped segment behind socket `name`, mapping it on first use with `grant`; `None`
    /// when it cannot be reached (another host) or mapped.
    async fn peer(&self, name: &str, grant: wire::Request, tag: &[u8]) -> Option<Arc<Mapped>> {
        match self.peers.lock().get(name) {
            Some(Peer::Mapped(m)) => return Some(m.clone()),
            Some(Peer::Unreachable(since)) if since.elapsed() < RETRY_UNREACHABLE => return None,
            _ => {}
        }
        match map(name, grant, tag).await {
            Ok(m) => {
                let m = Arc::new(m);
                let mut peers = self.peers.lock();
                // A new segment usually means a member restarted: forget the segments of members
                // that went away (whose sockets no longer accept), as no transfer will meet their
                // failure, and their mappings hold their memory for as long as they are kept.
                peers.retain(|n, p| matches!(p, Peer::Mapped(_)) && connect(n).is_ok());
                peers.insert(name.to_string(), Peer::Mapped(m.clone()));
                tracing::debug!(socket = name, "same-host segment mapped");
                Some(m)
            }
            Err(e) => {
                tracing::debug!(socket = name, error = %e, "same-host socket unreachable; using TCP");
                self.peers
                    .lock()
                    .insert(name.to_string(), Peer::Unreachable(Instant::now()));
                None
            }
        }
    }

    /// How many segments are mapped.
    pub(super) fn mapped(&self) -> usize {
        self.peers
            .lock()
            .values()
            .filter(|p| matches!(p, Peer::Mapped(_)))
            .count()
    }

    /// A connection to the socket `name` of `peer`: an idle one, else a new one; `None` (and the
    /// segment forgotten) when the socket no longer accepts.
    fn connection(&self, peer: &Mapped, name: &str) -> Option<UnixStream> {
        let pooled = peer.idle.lock().pop();
        match pooled {
            Some(s) => Some(s),
            None => match connect(name) {
                Ok(s) => Some(s),
                Err(_) => {
                    self.forget(name);
                    None
                }
            },
        }
    }

    /// A connection to the socket `name` to ask for a tier file, which needs no mapping: a pooled
    /// one when the segment is mapped, else a new one; `None` when the socket was found
    /// unreachable lately, or is now.
    fn plain_connection(&self, name: &str) -> Option<(Option<Arc<Mapped>>, UnixStream)> {
        let peer = match self.peers.lock().get(name) {
            Some(Peer::Mapped(m)) => Some(m.clone()),
            Some(Peer::Unreachable(since)) if since.elapsed() < RETRY_UNREACHABLE => return None,
            _ => None,
        };
        if let Some(p) = &peer {
            return self.connection(p, name).map(|s| (peer, s));
        }
        match connect(name) {
            Ok(s) => Some((None, s)),
            Err(_) => {
                self.peers
                    .lock()
                    .insert(name.to_string(), Peer::Unreachable(Instant::now()));
                None
            }
        }
    }

    /// Forgets a segment whose socket failed (its member went away): the mapping is dropped once
    /// no transfer uses it, which returns the member's memory to the system.
    fn forget(&self, name: &str) {
        self.peers.lock().remove(name);
        self.tier_files.forget(name);
    }
}

impl Client {
    /// One transfer through the member's mapped segment: `None` when the same-host path is not
    /// available for this Location (the caller uses TCP), else its outcome.
    pub(super) async fn local_transfer(
        &self,
        loc: &Location,
        deadline: u64,
        bytes: Bytes<'_, '_>,
    ) -> Option<Result<()>> {
        let local = self.local.as_ref()?;
        if loc.local_addr.is_empty() {
            return None;
        }
        let write = matches!(bytes, Bytes::From(_) | Bytes::FromParts(_));
        let tag: &[u8] = if write { &loc.tag } else { &[] };
        let claim = claim_request(loc, deadline, write, tag);
        let peer = local.peer(&loc.local_addr, claim, tag).await?;
        let mut s = local.connection(&peer, &loc.local_addr)?;
        let resp = match ask(&mut s, claim, tag, self.spin).await {
            Ok(r) => r,
            // nothing was copied yet: the member went away, so TCP tells the caller what it can
            Err(_) => {
                local.forget(&loc.local_addr);
                return None;
            }
        };
        if !resp.ok {
            return Some(match read_refusal(&mut s, resp.len).await {
                Ok(e) => {
                    give_back(&peer, s);
                    Err(e)
                }
                Err(e) => Err(transport(e)),
            });
        }
        let copied = peer.copy(loc, bytes);
        let release = wire::Request {
            op: Op::Release,
            tag_len: 0,
            ..claim
        };
        match ask(&mut s, release, &[], self.spin).await {
            Ok(r) if r.ok => {}
            Ok(_) | Err(_) => {
                local.forget(&loc.local_addr);
                return Some(Err(transport(
                    "the member's same-host socket failed during a transfer; retry",
                )));
            }
        }
        give_back(&peer, s);
        Some(copied)
    }
}

impl Client {
    /// A read of a value only on its member's disk tier from the tier's file (`disk.rs`), asking
    /// the member for the file (op 8) unless it is kept: `None` when that is not available for
    /// this Location, or the record read here was not the value or could not be read (the caller
    /// reads it through the data port, whose answer is the word on it; `sink` is then as it
    /// was), else whether the value was there (`false`: a miss).
    pub(super) async fn local_disk_read(
        &self,
        loc: &Location,
        deadline: u64,
        sink: &mut Sink<'_, '_>,
    ) -> Option<Result<bool>> {
        let local = self.local.as_ref()?;
        if loc.local_addr.is_empty() {
            return None;
        }
        let number = DiskId(loc.offset).file();
        let file = match local.tier_files.get(&loc.local_addr, number) {
            Some(f) => f,
            None => match local.ask_tier_file(loc, deadline).await? {
                Some(f) => {
                    local.tier_files.keep(&loc.local_addr, number, f.clone());
                    f
                }
                None => return Some(Ok(false)),
            },
        };
        match super::disk::read_copy(&file, loc, sink, &local.disk_reads).await {
            Ok(true) => Some(Ok(true)),
            outcome => {
                tracing::debug!(
                    disk_id = loc.offset,
                    ?outcome,
                    "a disk copy read here was not the value; reading it through the member"
                );
                if let Sink::Fresh(out) = sink {
                    out.clear();
                }
                None
            }
        }
    }
}

impl Local {
    /// Asks the member for the tier file that holds `loc`'s copy (op 8): `Some(None)` when the
    /// copy is not there (a miss); `None` when it refused (a member without op 8 too) or failed.
    async fn ask_tier_file(&self, loc: &Location, deadline: u64) -> Option<Option<TierFile>> {
        let (peer, mut s) = self.plain_connection(&loc.local_addr)?;
        let ask = wire::Request::granted(Op::TierFile, loc, loc.len, deadline, loc.tag.len() as u16);
        let answered = async {
            s.write_all(&ask.encode()).await?;
            s.write_all(&loc.tag).await?;
            let mut head = [0u8; RESPONSE_LEN];
            let mut fd = None;
            recv_with_fd(&s, &mut head, &mut fd).await?;
            let resp =
                wire::Response::decode(&head).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
            io::Result::Ok(match (resp.ok, resp.len) {
                (true, 0) => Some(None),
                (true, len) if len == wire::TierFile::LEN as u64 => {
                    let mut words = [0u8; wire::TierFile::LEN];
                    recv_with_fd(&s, &mut words, &mut fd).await?;
                    match (wire::TierFile::decode(&words), fd) {
                        (Some(answer), Some(fd)) => Some(Some(TierFile {
                            file: Arc::new(std::fs::File::from(fd)),
                            direct: answer.direct,
                        })),
                        _ => None,
                    }
                }
                // refused: the refusal's words stay unread, and the connection is dropped
                _ => None,
            })
        };
        match answered.await {
            Ok(Some(answer)) => {
                if let Some(p) = &peer {
                    give_back(p, s);
                }
                Some(answer)
            }
            Ok(None) | Err(_) => None,
        }
    }
}

/// The claim of `loc`'s range until `deadline`: a write's (naming its `tag`) or a read's.
fn claim_request(loc: &Location, deadline: u64, write: bool, tag: &[u8]) -> wire::Request {
    let op = if write { Op::ClaimWrite } else { Op::ClaimRead };
    wire::Request::granted(op, loc, loc.len, deadline, tag.len() as u16)
}

/// Sends `req` and its `tag` (if any) on the socket, and reads the answer's header.
async fn ask(s: &mut UnixStream, req: wire::Request, tag: &[u8], spin: Duration) -> io::Result<wire::Response> {
    s.write_all(&req.encode()).await?;
    if !tag.is_empty() {
        s.write_all(tag).await?;
    }
    read_response(s, spin).await
}

impl Mapped {
    /// Copies a transfer's bytes into, or out of, the range `loc` names in the mapped segment.
    fn copy(&self, loc: &Location, bytes: Bytes<'_, '_>) -> Result<()> {
        match bytes {
            Bytes::From(src) => self.map.copy_in(loc.offset, src),
            Bytes::FromParts(parts) => parts
                .iter()
                .try_fold(loc.offset, |at, src| {
                    self.map.copy_in(at, src).map(|()| at + src.len() as u64)
                })
                .map(drop),
            Bytes::Into(dst) => self.map.copy_out(loc.offset, dst),
            Bytes::IntoParts(parts) => parts
                .iter_mut()
                .try_fold(loc.offset, |at, dst| {
                    self.map.copy_out(at, dst).map(|()| at + dst.len() as u64)
                })
                .map(drop),
            Bytes::Fresh(out) => self.map.copy_out_into(loc.offset, loc.len, out),
        }
    }
}

/// Returns a connection to `peer`'s idle pool, unless the pool is full.
fn give_back(peer: &Mapped, s: UnixStream) {
    let mut idle = peer.idle.lock();
    if idle.len() < POOL_PER_MEMBER {
        idle.push(s);
    }
}
