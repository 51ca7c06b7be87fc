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
