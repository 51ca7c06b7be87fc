//! gRPC request bodies read under a byte limit and a deadline. The leader's front (`leader/front.rs`)
//! and the member's (`member/grpc.rs`) check what a call shows in its headers first, then hand
//! the service a [`Bounded`] body: the bytes it may read are what the method needs (a `Write`'s:
//! the length its grant names), and they must all arrive before the deadline. Past either, the
//! body ends with a status that says which (`RESOURCE_EXHAUSTED` or `DEADLINE_EXCEEDED`), which
//! tonic answers the call with; nothing past the limit is ever buffered by the service.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

/// Bytes a gRPC message takes on the wire beyond its protobuf encoding: the 5-byte frame header.
pub const FRAME_HEADER: usize = 5;

/// A request body that yields at most `limit` bytes, all before `deadline`.
pub struct Bounded {
    inner: tonic::body::Body,
    limit: usize,
    seen: usize,
    /// why the body was cut, for the status
    method: &'static str,
    deadline: Pin<Box<tokio::time::Sleep>>,
    within: Duration,
    /// set once the body failed: it yields nothing more
    done: bool,
}

impl std::fmt::Debug for Bounded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bounded")
            .field("limit", &self.limit)
            .field("seen", &self.seen)
            .field("method", &self.method)
            .finish_non_exhaustive()
    }
}

impl Bounded {
    /// `inner`, cut at `limit` bytes and at `within` from now; `method` names the call in the
    /// refusals.
    pub fn new(inner: tonic::body::Body, limit: usize, within: Duration, method: &'static str) -> Self {
        Self {
            inner,
            limit,
            seen: 0,
            method,
            deadline: Box::pin(tokio::time::sleep(within)),
            within,
            done: false,
        }
    }

    /// Wraps `req`'s body.
    pub fn request(
        req: http::Request<tonic::body::Body>,
        limit: usize,
        within: Duration,
        method: &'static str,
    ) -> http::Request<tonic::body::Body> {
        req.map(|b| tonic::body::Body::new(Bounded::new(b, limit, within, method)))
    }

    fn too_large(&self) -> tonic::Status {
        tonic::Status::resource_exhausted(format!(
            "{}: the request is larger than the {} bytes this call takes; nothing past them was read",
            self.method, self.limit
        ))
    }

    fn too_slow(&self) -> tonic::Status {
        tonic::Status::deadline_exceeded(format!(
            "{}: the request did not arrive whole within {:?}; send it again",
            self.method, self.within
        ))
    }
}

impl Body for Bounded {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        if self.done {
            return Poll::Ready(None);
        }
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    self.seen = self.seen.saturating_add(data.len());
                    if self.seen > self.limit {
                        self.done = true;
                        return Poll::Ready(Some(Err(self.too_large())));
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                self.done = true;
                Poll::Ready(Some(Err(tonic::Status::from_error(e.into()))))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => match self.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    self.done = true;
                    Poll::Ready(Some(Err(self.too_slow())))
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let mut h = self.inner.size_hint();
        if h.upper().is_none_or(|u| u > self.limit as u64) {
            h.set_upper(self.limit as u64);
            if h.lower() > self.limit as u64 {
                h.set_lower(self.limit as u64);
            }
        }
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    fn body(chunks: Vec<&'static [u8]>) -> tonic::body::Body {
        let frames = chunks
            .into_iter()
            .map(|c| Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from_static(c))));
        tonic::body::Body::new(http_body_util::StreamBody::new(futures::stream::iter(frames)))
    }

    #[tokio::test]
    async fn a_body_within_its_limit_passes_whole() {
        let b = Bounded::new(body(vec![b"abc", b"de"]), 5, Duration::from_secs(5), "Test");
        let got = b.collect().await.unwrap().to_bytes();
        assert_eq!(&got[..], b"abcde");
    }

    #[tokio::test]
    async fn a_body_past_its_limit_ends_with_resource_exhausted() {
        let b = Bounded::new(body(vec![b"abc", b"def"]), 5, Duration::from_secs(5), "Test");
        let e = b.collect().await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);
        assert!(e.message().contains("5 bytes"), "{e}");
    }

    #[tokio::test]
    async fn a_body_that_stalls_ends_at_its_deadline() {
        let stalled = tonic::body::Body::new(http_body_util::StreamBody::new(futures::stream::pending::<
            Result<Frame<Bytes>, std::convert::Infallible>,
        >()));
        let b = Bounded::new(stalled, 5, Duration::from_millis(50), "Test");
        let e = b.collect().await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::DeadlineExceeded);
    }
}
