//! Listener plumbing shared by the leader and members: accepted gRPC connections get
//! `TCP_NODELAY`, because every call here is a small request waiting for a small reply.

use tokio::net::{TcpListener, TcpStream};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::TcpListenerStream;

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

/// A listener for data connections (accepted sockets inherit its buffer sizes).
pub fn data_listener(addr: std::net::SocketAddr) -> std::io::Result<TcpListener> {
    let s = data_socket(&addr)?;
    s.set_reuseaddr(true)?;
    s.bind(addr)?;
    s.listen(1024)
}

/// Connects a data connection to `addr` (HOST:PORT), with Nagle's algorithm off.
pub async fn connect_data(addr: &str) -> std::io::Result<TcpStream> {
    let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, format!("{addr} resolved to no address"));
    for a in tokio::net::lookup_host(addr).await? {
        match data_socket(&a)?.connect(a).await {
            Ok(s) => {
                s.set_nodelay(true)?;
                return Ok(s);
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}
