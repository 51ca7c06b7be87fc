//! Listener plumbing shared by the leader and members: accepted gRPC connections get
//! `TCP_NODELAY`, because every call here is a small request waiting for a small reply; the
//! framed ports (fast port, data port, same-host socket) share one accept loop.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_stream::{Stream, StreamExt};
use tokio_util::sync::CancellationToken;

/// The accepted connections of `listener`, with Nagle's algorithm off.
pub fn incoming(listener: TcpListener) -> impl tokio_stream::Stream<Item = std::io::Result<TcpStream>> {
    TcpListenerStream::new(listener).map(|r| {
        r.inspect(|s| {
            if let Err(e) = s.set_nodelay(true) {
                tracing::debug!(error = %e, "set_nodelay failed");
            }
        })
    })
}

/// Connections one framed port serves at once; past it a new connection is closed as soon as it
/// is accepted (clients pool a few per peer, so only a caller that opens and holds many meets it).
pub const MAX_CONNECTIONS: usize = 4096;

/// Connections one gRPC server serves at once (see [`incoming_limited`]).
pub const MAX_GRPC_CONNECTIONS: usize = 4096;

/// Connections one source address may hold open on one port, of its [`MAX_CONNECTIONS`] or
/// [`MAX_GRPC_CONNECTIONS`]: one caller (a Pod, whatever it runs) cannot take a port's places
/// from everyone else. An engine keeps at most 64 pooled connections per member and to the
/// leader's fast port; the local runtime's engines all come from loopback and share this.
pub const MAX_PER_SOURCE: usize = 512;

/// How many connections each source address holds on one port.
#[derive(Debug, Clone)]
pub struct PerSource {
    limit: usize,
    open: Arc<parking_lot::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>>,
}

/// A connection's place among its source's ([`PerSource::admit`]); given back when dropped.
#[derive(Debug)]
pub struct SourcePlace {
    ip: std::net::IpAddr,
    open: Arc<parking_lot::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>>,
}

impl PerSource {
    pub fn new(limit: usize) -> Self {
        PerSource {
            limit,
            open: Arc::default(),
        }
    }

    /// A place for one more connection from `ip`, if it holds fewer than the limit.
    pub fn admit(&self, ip: std::net::IpAddr) -> Option<SourcePlace> {
        let mut open = self.open.lock();
        let n = open.entry(ip).or_default();
        if *n >= self.limit {
            return None;
        }
        *n += 1;
        Some(SourcePlace {
            ip,
            open: self.open.clone(),
        })
    }
}

impl Drop for SourcePlace {
    fn drop(&mut self) {
        let mut open = self.open.lock();
        if let Some(n) = open.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// [`incoming`], each connection holding one of `limit` places, and one of its source address's
/// [`MAX_PER_SOURCE`], until it closes: past either a new connection is closed as soon as it is
/// accepted, so a caller that opens and holds connections cannot make a server keep more than
/// `limit` of them, nor take more than its share.
pub fn incoming_limited(
    listener: TcpListener,
    limit: usize,
    what: &'static str,
) -> impl tokio_stream::Stream<Item = std::io::Result<Limited>> {
    let places = Arc::new(Semaphore::new(limit));
    let sources = PerSource::new(MAX_PER_SOURCE);
    incoming(listener).filter_map(move |accepted| match accepted {
        Ok(stream) => {
            let source = match stream.peer_addr() {
                Ok(peer) => match sources.admit(peer.ip()) {
                    Some(p) => p,
                    None => {
                        tracing::warn!(source = %peer.ip(), "{what}: {MAX_PER_SOURCE} connections open from one source, closing a new one");
                        return None;
                    }
                },
                // the peer already went away
                Err(_) => return None,
            };
            match places.clone().try_acquire_owned() {
                Ok(place) => Some(Ok(Limited {
                    stream,
                    _place: place,
                    _source: source,
                })),
                Err(_) => {
                    tracing::warn!("{what}: {limit} connections open, closing a new one");
                    None
                }
            }
        }
        Err(e) => Some(Err(e)),
    })
}

/// An accepted connection holding its place among a server's connections ([`incoming_limited`]).
#[derive(Debug)]
pub struct Limited {
    stream: TcpStream,
    _place: OwnedSemaphorePermit,
    _source: SourcePlace,
}

impl AsyncRead for Limited {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Limited {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for Limited {
    type ConnectInfo = <TcpStream as tonic::transport::server::Connected>::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}

/// Where a framed port's connection comes from, for [`MAX_PER_SOURCE`] (`None`: a local socket).
pub trait Source {
    fn source(&self) -> Option<std::net::IpAddr>;
}

impl Source for TcpStream {
    fn source(&self) -> Option<std::net::IpAddr> {
        self.peer_addr().ok().map(|a| a.ip())
    }
}

impl Source for tokio::net::UnixStream {
    fn source(&self) -> Option<std::net::IpAddr> {
        None
    }
}

/// Accepts from `incoming` until `cancel` fires, serving each connection in a task of its own
/// (at most [`MAX_CONNECTIONS`] at once, and [`MAX_PER_SOURCE`] from one address); then stops
/// accepting and aborts every connection, so no per-request work watches the token. A failed
/// accept (out of descriptors, say) is logged and retried after 50 ms.
pub async fn serve_connections<S: Source, I, F, Fut>(
    mut incoming: I,
    what: &'static str,
    cancel: CancellationToken,
    mut serve: F,
) where
    I: Stream<Item = std::io::Result<S>> + Unpin,
    F: FnMut(S) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut conns = JoinSet::new();
    let sources = PerSource::new(MAX_PER_SOURCE);
    let stop = cancel.cancelled();
    tokio::pin!(stop);
    loop {
        let accepted = tokio::select! {
            () = &mut stop => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
            a = incoming.next() => a,
        };
        match accepted {
            Some(Ok(conn)) => {
                while conns.len() >= MAX_CONNECTIONS && conns.try_join_next().is_some() {}
                if conns.len() >= MAX_CONNECTIONS {
                    tracing::warn!("{what}: {MAX_CONNECTIONS} connections open, closing a new one");
                    drop(conn);
                    continue;
                }
                let place = match conn.source() {
                    Some(ip) => match sources.admit(ip) {
                        Some(p) => Some(p),
                        None => {
                            tracing::warn!(source = %ip, "{what}: {MAX_PER_SOURCE} connections open from one source, closing a new one");
                            drop(conn);
                            continue;
                        }
                    },
                    None => None,
                };
                let served = serve(conn);
                conns.spawn(async move {
                    served.await;
                    drop(place);
                });
            }
            Some(Err(e)) => {
                tracing::warn!(error = %e, "{what} accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            None => break,
        }
    }
    drop(incoming);
    conns.shutdown().await;
}

/// Socket buffer size asked for on data connections: a whole 4 MiB value fits in flight, so a
/// transfer is one write on one side and a few reads on the other instead of many small
/// wake-ups. The kernel caps it at `net.core.wmem_max`/`rmem_max`.
pub const DATA_SOCKET_BUFFER: u32 = 4 << 20;

fn data_socket(addr: &std::net::SocketAddr) -> std::io::Result<tokio::net::TcpSocket> {
    let s = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    // best effort: a smaller buffer only costs speed
    let _ = s.set_send_buffer_size(DATA_SOCKET_BUFFER);
    let _ = s.set_recv_buffer_size(DATA_SOCKET_BUFFER);
    Ok(s)
}

/// The congestion control data connections use when both ends are on one host.
pub const LOOPBACK_CONGESTION_CONTROL: &str = "reno";

/// Picks the congestion control of a data connection whose peer is `peer`. Over loopback there
/// is no network to share, and BBR (a common system default, this machine's) models the path
/// from a round-trip time of a few microseconds: it keeps a congestion window of about 2 MiB and
/// paces packets out from timers, so half of a 4 MiB value leaves from the CPU that processes the
/// receiver's acknowledgements. Packets of one flow then leave two CPUs' queues out of order,
/// and TCP takes the reordering for loss: measured here, ~140 spurious retransmissions and ~2,000
/// reorderings per benchmark run with BBR, none with Reno, and 4 MiB puts 1.6x faster. Other
/// peers keep the system's choice. Best effort: a refusal only costs speed.
pub fn tune_data_connection(sock: socket2::SockRef<'_>, peer: &std::net::SocketAddr) {
    if peer.ip().is_loopback()
        && let Err(e) = sock.set_tcp_congestion(LOOPBACK_CONGESTION_CONTROL.as_bytes())
    {
        tracing::debug!(error = %e, "cannot choose the loopback congestion control");
    }
}

/// A listener for data connections (accepted sockets inherit its buffer sizes).
pub fn data_listener(addr: std::net::SocketAddr) -> std::io::Result<TcpListener> {
    let s = data_socket(&addr)?;
    s.set_reuseaddr(true)?;
    s.bind(addr)?;
    s.listen(1024)
}

/// How long a client waits for a new connection to a leader or member. A peer that vanished
/// without a trace (a deleted Pod's address, or a Service's stale connection-tracking entry that
/// still points at it) answers no SYN, and the system's own retries take minutes; giving up
/// sooner lets the next attempt, from a new port, reach whoever serves now.
pub const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// `connect` under [`CONNECT_TIMEOUT`].
pub async fn within_connect_timeout<T>(
    addr: impl std::fmt::Display,
    connect: impl Future<Output = std::io::Result<T>>,
) -> std::io::Result<T> {
    tokio::time::timeout(CONNECT_TIMEOUT, connect).await.map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("{addr} did not answer within {CONNECT_TIMEOUT:?}"),
        )
    })?
}

/// Connects a data connection to `addr` (HOST:PORT), with Nagle's algorithm off.
pub async fn connect_data(addr: &str) -> std::io::Result<TcpStream> {
    let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, format!("{addr} resolved to no address"));
    for a in tokio::net::lookup_host(addr).await? {
        let sock = data_socket(&a)?;
        tune_data_connection(socket2::SockRef::from(&sock), &a);
        match within_connect_timeout(a, sock.connect(a)).await {
            Ok(s) => {
                s.set_nodelay(true)?;
                return Ok(s);
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn loopback_data_connections_use_the_loopback_congestion_control_on_both_ends() {
        let l = data_listener("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = l.local_addr().unwrap();
        let client = connect_data(&addr.to_string()).await.unwrap();
        let (server, peer) = l.accept().await.unwrap();
        tune_data_connection(socket2::SockRef::from(&server), &peer);
        for s in [&client, &server] {
            let cc = socket2::SockRef::from(s).tcp_congestion().unwrap();
            let name = String::from_utf8_lossy(&cc);
            assert_eq!(name.trim_end_matches('\0'), LOOPBACK_CONGESTION_CONTROL);
        }
        assert!(client.nodelay().unwrap());
    }

    #[test]
    fn one_source_holds_at_most_its_share_and_gets_places_back_as_it_closes() {
        let sources = PerSource::new(2);
        let a: std::net::IpAddr = "10.0.0.1".parse().unwrap();
        let b: std::net::IpAddr = "10.0.0.2".parse().unwrap();
        let first = sources.admit(a).unwrap();
        let _second = sources.admit(a).unwrap();
        assert!(sources.admit(a).is_none(), "a third from the same source");
        let _other = sources.admit(b).expect("another source is not held back");
        drop(first);
        assert!(sources.admit(a).is_some(), "a place given back is taken again");
    }

    #[tokio::test]
    async fn a_server_keeps_no_more_connections_than_its_limit() {
        use tokio::io::AsyncReadExt;
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let mut accepted = Box::pin(incoming_limited(l, 2, "test"));
        let mut clients = Vec::new();
        let mut held = Vec::new();
        for _ in 0..2 {
            clients.push(TcpStream::connect(addr).await.unwrap());
            held.push(accepted.next().await.unwrap().unwrap());
        }
        // the third is closed at once: the stream yields nothing for it
        let mut third = TcpStream::connect(addr).await.unwrap();
        let mut byte = [0u8; 1];
        let closed = tokio::time::timeout(std::time::Duration::from_secs(10), async {
            tokio::select! {
                served = accepted.next() => panic!("a connection past the limit was served: {served:?}"),
                read = third.read(&mut byte) => read,
            }
        })
        .await;
        assert!(
            matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
            "closed by the server: {closed:?}"
        );
        // a place freed is taken by the next
        drop(held.pop());
        let _fourth = TcpStream::connect(addr).await.unwrap();
        assert!(accepted.next().await.unwrap().is_ok());
    }
}
