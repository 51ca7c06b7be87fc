//! Status bodies for the answers the HTTP/1 parser gives on its own.
//!
//! A request the parser refuses (a request line over 64 KiB, headers past the buffer, garbage)
//! never reaches the pipeline: hyper writes `414`, `431` or `400` with an empty body and closes
//! the connection. Every refusal of this server is a `metav1.Status`, so the connection's writes
//! go through [`StatusOnParseError`], which replaces such a head with the same code and a Status
//! body before closing.
//!
//! Telling hyper's own answers from ours is exact: they are the only responses this server
//! writes with a 4xx code and `content-length: 0` (every refusal of the pipeline carries a
//! Status body, and bodies are JSON or text, which never hold the `\r\n` a head needs). A head
//! always starts a write, since hyper flushes a response fully before it reads the next request.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The connection, with hyper's bodiless error answers given a Status body.
#[derive(Debug)]
pub struct StatusOnParseError<IO> {
    inner: IO,
    /// A replacement being written: the bytes and how many were written.
    pending: Option<(Vec<u8>, usize)>,
}

impl<IO> StatusOnParseError<IO> {
    pub fn new(inner: IO) -> Self {
        StatusOnParseError { inner, pending: None }
    }
}

/// The replacement for `head` when it is one of hyper's own error answers.
fn replacement(head: &[u8]) -> Option<Vec<u8>> {
    let end = head.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let text = std::str::from_utf8(&head[..end]).ok()?;
    let status_line = text.split("\r\n").next()?;
    let code: u16 = status_line.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()?;
    if !(400..500).contains(&code) {
        return None;
    }
    let empty = text.split("\r\n").any(|l| l.eq_ignore_ascii_case("content-length: 0"));
    if !empty {
        return None;
    }
    let (reason, message) = match code {
        414 => (
            "RequestURITooLong",
            "the request URI is longer than 64 KiB, the most this server reads; send the options in fewer or shorter query parameters",
        ),
        431 => (
            "RequestHeaderFieldsTooLarge",
            "the request headers are larger than this server reads; send fewer or smaller headers",
        ),
        _ => ("BadRequest", "the request is not valid HTTP/1.1 and could not be read"),
    };
    let status = crate::status::failure(code, reason, message);
    let body = serde_json::to_vec(&status).unwrap_or_default();
    let mut out = format!(
        "{status_line}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(&body);
    Some(out)
}

impl<IO: AsyncWrite + Unpin> StatusOnParseError<IO> {
    /// Writes what is left of a replacement; `Ready(Ok)` once it is all out.
    fn poll_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Some((bytes, written)) = self.pending.as_mut() {
            if *written == bytes.len() {
                self.pending = None;
                break;
            }
            match Pin::new(&mut self.inner).poll_write(cx, &bytes[*written..]) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => *written += n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for StatusOnParseError<IO> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for StatusOnParseError<IO> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        match this.poll_pending(cx) {
            Poll::Ready(Ok(())) => {}
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            Poll::Pending => return Poll::Pending,
        }
        if buf.starts_with(b"HTTP/1.1 4")
            && let Some(out) = replacement(buf)
        {
            this.pending = Some((out, 0));
            // hyper's head is consumed whole; the replacement goes out before anything else.
            return match this.poll_pending(cx) {
                Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
                _ => Poll::Ready(Ok(buf.len())),
            };
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    /// Vectored writes pass straight through (HTTP/2 frames, and HTTP/1 heads with their
    /// bodies): hyper's own error answers are written alone, so they come through `poll_write`
    /// or as the only non-empty slice.
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let mut non_empty = bufs.iter().filter(|b| !b.is_empty());
        if let (Some(only), None) = (non_empty.next(), non_empty.next())
            && only.starts_with(b"HTTP/1.1 4")
        {
            return self.poll_write(cx, only);
        }
        let this = &mut *self;
        match this.poll_pending(cx) {
            Poll::Ready(Ok(())) => {}
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            Poll::Pending => return Poll::Pending,
        }
        Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        match this.poll_pending(cx) {
            Poll::Ready(Ok(())) => Pin::new(&mut this.inner).poll_flush(cx),
            other => other,
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        match this.poll_pending(cx) {
            Poll::Ready(Ok(())) => Pin::new(&mut this.inner).poll_shutdown(cx),
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[test]
    fn only_bodiless_client_errors_are_replaced() {
        let hyper_414 =
            b"HTTP/1.1 414 URI Too Long\r\ncontent-length: 0\r\ndate: Tue, 01 Dec 2026 09:00:00 GMT\r\n\r\n";
        let out = String::from_utf8(replacement(hyper_414).unwrap()).unwrap();
        assert!(out.starts_with("HTTP/1.1 414 URI Too Long\r\n"), "{out}");
        let body = out.split("\r\n\r\n").nth(1).unwrap();
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!((v["kind"].as_str(), v["code"].as_u64()), (Some("Status"), Some(414)));
        assert!(out.contains(&format!("content-length: {}", body.len())));
        // Our own answers carry bodies; successes are never touched.
        assert!(replacement(b"HTTP/1.1 404 Not Found\r\ncontent-length: 120\r\n\r\n{").is_none());
        assert!(replacement(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").is_none());
        assert!(replacement(b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0").is_none());
    }

    #[tokio::test]
    async fn the_replacement_is_written_whole_through_a_small_pipe() {
        let (a, mut b) = tokio::io::duplex(16);
        let mut w = StatusOnParseError::new(a);
        let task = tokio::spawn(async move {
            w.write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
                .await
                .unwrap();
            w.shutdown().await.unwrap();
        });
        let mut got = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(&mut b, &mut got).await.unwrap();
        task.await.unwrap();
        let text = String::from_utf8(got).unwrap();
        assert!(
            text.starts_with("HTTP/1.1 400 Bad Request\r\n") && text.ends_with('}'),
            "{text}"
        );
    }
}
