//! The member's gRPC face, `SegmentData`: the same writes and reads as the data port, for callers
//! that speak only gRPC (any language with generated stubs). A write travels as one message, so
//! the server's message limit is raised to the largest value; a read answers a stream of pieces
//! of at most [`READ_PIECE`] bytes.
//!
//! What one caller may cost is bounded:
//! - a `Write` carries its grant in metadata ([`GRANT_METADATA`], the data port's request header),
//!   and [`GrantFirst`], in front of the service, checks it before the message is read: a caller
//!   without a grant the member would serve costs it a header, never a value's worth of memory.
//!   The body may then be no longer than the granted value, and must arrive by the grant's
//!   deadline plus [`WRITE_GRACE`] (`bounded.rs`); every other call's body is a few KiB;
//! - a `Read` copies one piece at a time out of the segment, only as the caller takes them (at
//!   most two pieces wait per stream), and gives its range up at the read lease's deadline, as the
//!   data port does: a caller that stops reading pins neither memory nor the range, and its
//!   stream then ends with `LEASE_EXPIRED`;
//! - streams per connection are capped ([`MAX_STREAMS`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use tonic::codegen::http;
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Request, Response, Status};

use super::dataport::WRITE_GRACE;
use super::segment::{Grant, Segment};
use crate::bounded::{Bounded, FRAME_HEADER};
use crate::error::{ErrorCode, StoreError};
use crate::grant::Access;
use crate::proto::segment_data_server::{SegmentData, SegmentDataServer};
use crate::proto::{HealthRequest, HealthResponse, ReadRequest, ReadResponse, WriteRequest, WriteResponse};
use crate::readiness::ReadinessHandle;
use crate::wire;

/// The gRPC service over a segment.
#[derive(Debug, Clone)]
pub struct DataService {
    pub segment: Arc<Segment>,
    /// `Health.serving`: true only while the segment is mounted
    pub readiness: ReadinessHandle,
}

impl DataService {
    pub fn server(self, max_message: usize) -> SegmentDataServer<Self> {
        SegmentDataServer::new(self)
            .max_decoding_message_size(max_message)
            .max_encoding_message_size(max_message)
    }
}

/// The metadata key a `Write`'s grant travels in (binary: the 88-byte `wire::Request`, then the
/// value's tag, `tag_len` bytes).
pub const GRANT_METADATA: &str = "x-kvstore-grant-bin";
/// Concurrent streams per connection.
pub const MAX_STREAMS: u32 = 16;
/// The path of `SegmentData.Write`.
const WRITE_PATH: &str = "/kvstore.v1.SegmentData/Write";
/// The most bytes of a value one message of a `Read` stream carries.
pub const READ_PIECE: usize = 64 * 1024;
/// The body of a call other than `Write` (a `ReadRequest` carries a grant; `Health` nothing).
const SMALL_BODY: usize = 4096;
/// How long the body of a call other than `Write` may take to arrive.
const SMALL_BODY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// A `WriteRequest`'s protobuf bytes beyond its value: the field's tag and length.
const WRITE_OVERHEAD: usize = 1 + 10;

/// A `Write` of `data` under a Location's grant, with the grant in its metadata.
pub fn write_request(loc: &crate::proto::Location, deadline_unix_ms: u64, data: Bytes) -> Request<WriteRequest> {
    let head = wire::Request::granted(
        wire::Op::Write,
        loc,
        data.len() as u64,
        deadline_unix_ms,
        loc.tag.len() as u16,
    );
    let mut meta = head.encode().to_vec();
    meta.extend_from_slice(&loc.tag);
    let mut r = Request::new(WriteRequest { data });
    r.metadata_mut()
        .insert_bin(GRANT_METADATA, MetadataValue::from_bytes(&meta));
    r
}

/// The grant, length and tag a `Write`'s metadata names.
fn write_grant(metadata: &MetadataMap) -> Result<(Grant, u64, Vec<u8>), StoreError> {
    let missing = || {
        StoreError::new(
            ErrorCode::Unauthenticated,
            format!(
                "a Write carries its grant in the metadata {GRANT_METADATA:?} (the data port's request header for \
                 op 1: store/src/wire.rs); this one carries none that reads as one"
            ),
        )
    };
    let raw = metadata
        .get_bin(GRANT_METADATA)
        .and_then(|v| v.to_bytes().ok())
        .ok_or_else(missing)?;
    let (head, tag) = raw.split_at_checked(wire::REQUEST_LEN).ok_or_else(missing)?;
    let head: &[u8; wire::REQUEST_LEN] = head.try_into().map_err(|_| missing())?;
    let req = wire::Request::decode(head)?;
    if req.op != wire::Op::Write || tag.len() != usize::from(req.tag_len) {
        return Err(missing());
    }
    let grant = Grant::of(&req);
    Ok((grant, req.len, tag.to_vec()))
}

/// In front of the member's gRPC services: refuses a `Write` whose grant the member would not
/// serve before its message is read, and bounds every call's body (module doc).
#[derive(Debug, Clone)]
pub struct GrantFirst<S> {
    inner: S,
    segment: Arc<Segment>,
}

/// Puts [`GrantFirst`] in front of a service.
#[derive(Debug, Clone)]
pub struct GrantFirstLayer(pub Arc<Segment>);

impl<S> tower::Layer<S> for GrantFirstLayer {
    type Service = GrantFirst<S>;

    fn layer(&self, inner: S) -> GrantFirst<S> {
        GrantFirst {
            inner,
            segment: self.0.clone(),
        }
    }
}

impl<S> tower::Service<http::Request<tonic::body::Body>> for GrantFirst<S>
where
    S: tower::Service<http::Request<tonic::body::Body>, Response = http::Response<tonic::body::Body>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        // the readied service serves this call; a clone waits for the next (tower's rule)
        let ready = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, ready);
        let segment = self.segment.clone();
        Box::pin(async move {
            if req.uri().path() != WRITE_PATH {
                let req = Bounded::request(req, SMALL_BODY, SMALL_BODY_TIMEOUT, "a SegmentData call");
                return inner.call(req).await;
            }
            let metadata = MetadataMap::from_headers(req.headers().clone());
            let admitted = match write_grant(&metadata) {
                Ok((grant, len, tag)) => segment
                    .admit(&grant, Access::Write, len, &tag)
                    .await
                    .map(|()| (grant, len)),
                Err(e) => Err(e),
            };
            let (grant, len) = match admitted {
                Ok(g) => g,
                Err(e) => return Ok(Status::from(e).into_http()),
            };
            // the value granted and nothing more, by the grant's deadline (plus the grace a write
            // that started in time gets on the data port too)
            let limit = usize::try_from(len)
                .unwrap_or(usize::MAX)
                .saturating_add(WRITE_OVERHEAD + FRAME_HEADER);
            let left =
                std::time::Duration::from_millis(grant.deadline_unix_ms.saturating_sub(crate::time::now_unix_ms()));
            let req = Bounded::request(req, limit, left + WRITE_GRACE, "SegmentData.Write");
            inner.call(req).await
        })
    }
}

/// Claims a read's range and sends its bytes piece by piece, each copied out of the segment only
/// once the one before was taken; gives up (dropping the claim) at the read lease's deadline, or
/// when the caller went away.
async fn send_pieces(
    segment: Arc<Segment>,
    grant: Grant,
    len: u64,
    claimed: tokio::sync::oneshot::Sender<Result<(), StoreError>>,
    pieces: tokio::sync::mpsc::Sender<ReadResponse>,
) {
    let range = match segment.begin_read(grant, len) {
        Ok(r) => r,
        Err(e) => {
            let _ = claimed.send(Err(e));
            return;
        }
    };
    if claimed.send(Ok(())).is_err() {
        return;
    }
    let lease = crate::time::instant_of_unix_ms(grant.deadline_unix_ms);
    let mut at = 0;
    while at < len {
        let n = (len - at).min(READ_PIECE as u64);
        let mut piece = bytes::BytesMut::zeroed(n as usize);
        if range.copy_part(at, &mut piece).is_err() {
            return;
        }
        let sent = match lease {
            Some(deadline) => {
                tokio::time::timeout_at(deadline, pieces.send(ReadResponse { data: piece.freeze() })).await
            }
            None => Ok(pieces.send(ReadResponse { data: piece.freeze() }).await),
        };
        match sent {
            Ok(Ok(())) => at += n,
            Ok(Err(_)) => return,
            Err(_) => {
                tracing::debug!(
                    offset = grant.offset,
                    "a gRPC reader did not take its value within its read lease; giving the range up"
                );
                return;
            }
        }
    }
    drop(range);
    segment.read(len);
}

/// A `Read`'s answer: the pieces as [`send_pieces`] hands them over, then `LEASE_EXPIRED` if it
/// gave up before the last.
#[derive(Debug)]
pub struct Pieces {
    rx: tokio::sync::mpsc::Receiver<ReadResponse>,
    /// bytes not yet handed over
    left: u64,
}

impl tokio_stream::Stream for Pieces {
    type Item = Result<ReadResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(piece)) => {
                self.left = self.left.saturating_sub(piece.data.len() as u64);
                Poll::Ready(Some(Ok(piece)))
            }
            Poll::Ready(None) if self.left > 0 => {
                self.left = 0;
                Poll::Ready(Some(Err(StoreError::new(
                    ErrorCode::LeaseExpired,
                    "the read lease ran out before this value was read whole (the member gave the range up); ask \
                     the leader again",
                )
                .into())))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

#[tonic::async_trait]
impl SegmentData for DataService {
    async fn write(&self, req: Request<WriteRequest>) -> Result<Response<WriteResponse>, Status> {
        let (grant, len, tag) = write_grant(req.metadata())?;
        let r = req.into_inner();
        if r.data.len() as u64 != len {
            return Err(StoreError::new(
                ErrorCode::InvalidArgument,
                format!(
                    "the grant's header names {len} bytes and the message carries {}",
                    r.data.len()
                ),
            )
            .into());
        }
        self.segment.settle(&grant, Access::Write, len, &tag).await;
        let mut range = self.segment.begin_write(grant, len, &tag)?;
        range.copy_from(&r.data)?;
        range.finish_with(xxhash_rust::xxh3::xxh3_64(&r.data));
        self.segment.wrote(len);
        Ok(Response::new(WriteResponse {}))
    }

    type ReadStream = Pieces;

    async fn read(&self, req: Request<ReadRequest>) -> Result<Response<Pieces>, Status> {
        let r = req.into_inner();
        let grant = Grant {
            mount_id: r.mount_id,
            epoch: r.epoch,
            offset: r.offset,
            allocation: r.allocation,
            deadline_unix_ms: r.lease_deadline_unix_ms,
            mac: crate::grant::mac_from(&r.grant_mac),
        };
        self.segment.settle(&grant, Access::Read, r.len, &[]).await;
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let (claimed, claim) = tokio::sync::oneshot::channel();
        tokio::spawn(send_pieces(self.segment.clone(), grant, r.len, claimed, tx));
        // the claim's refusal is the call's answer; past it, the pieces follow
        claim
            .await
            .map_err(|_| Status::internal("the read ended before it claimed its range"))??;
        Ok(Response::new(Pieces { rx, left: r.len }))
    }

    async fn health(&self, _req: Request<HealthRequest>) -> Result<Response<HealthResponse>, Status> {
        Ok(Response::new(HealthResponse {
            serving: self.readiness.is_serving(),
            role: "member".into(),
            capacity: self.segment.capacity(),
            ..Default::default()
        }))
    }
}
