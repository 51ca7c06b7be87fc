//! [`Conn`]: a framed port's connection (fast port, data port), plain TCP or TLS over it, and
//! how one is accepted or made as the process's TLS says.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::{ClientTls, Sealed, ServerTls};

/// A connection on a framed port: plain TCP, or TLS over it (`sealed.rs`).
#[derive(Debug)]
pub enum Conn {
    Plain(TcpStream),
    Sealed(Box<Sealed>),
}

impl Conn {
    /// The TCP connection underneath.
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Self::Plain(s) => s,
            Self::Sealed(s) => s.tcp(),
        }
    }

    /// Whether received bytes already wait here: a TLS record may hold more than one read takes,
    /// so a caller that polls the socket for readability must ask this first, or it would wait
    /// for bytes that are already here. Always `false` on a plain connection.
    pub fn has_buffered(&self) -> bool {
        match self {
            Self::Plain(_) => false,
            Self::Sealed(s) => s.has_buffered(),
        }
    }

    /// Whether a client should make a new connection rather than reuse this one (its keys have
    /// protected half of what they may: `sealed.rs`).
    pub fn worn_out(&self) -> bool {
        match self {
            Self::Plain(_) => false,
            Self::Sealed(s) => s.worn_out(),
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Self::Sealed(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Self::Sealed(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Self::Sealed(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Self::Plain(s) => s.is_write_vectored(),
            Self::Sealed(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_flush(cx),
            Self::Sealed(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Self::Sealed(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// A connection accepted on a framed port, as `tls` says: a TLS handshake first, or plain.
pub async fn accept(tls: Option<&ServerTls>, tcp: TcpStream) -> io::Result<Conn> {
    match tls {
        Some(t) => t.accept(tcp).await,
        None => Ok(Conn::Plain(tcp)),
    }
}

/// A connection made to `addr`, as `tls` says.
pub async fn connect(tls: Option<&ClientTls>, tcp: TcpStream, addr: &str) -> io::Result<Conn> {
    match tls {
        Some(t) => t.connect(tcp, addr).await,
        None => Ok(Conn::Plain(tcp)),
    }
}
