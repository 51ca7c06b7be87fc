//! The member's gRPC face, `SegmentData`: the same writes and reads as the data port, for callers
//! that speak only gRPC (any language with generated stubs). Values travel as one message, so the
//! server's message limit is raised to the largest value.
//!
//! A `Write` carries its grant in metadata ([`GRANT_METADATA`], the data port's request header),
//! and [`GrantFirst`], in front of the service, checks it before the message is read: a caller
//! without a grant the member would serve costs it a header, never a value's worth of memory.
//! Streams per connection are capped ([`MAX_STREAMS`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use tonic::codegen::http;
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Request, Response, Status};

use super::segment::{Grant, Segment};
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

/// A `Write` of `data` under a Location's grant, with the grant in its metadata.
pub fn write_request(loc: &crate::proto::Location, deadline_unix_ms: u64, data: Bytes) -> Request<WriteRequest> {
    let head = wire::Request {
        op: wire::Op::Write,
        mount_id: loc.mount_id,
        offset: loc.offset,
        len: data.len() as u64,
        deadline_unix_ms,
        epoch: loc.epoch,
        allocation: loc.allocation,
        mac: Grant::mac_from(&loc.grant_mac),
        tag_len: loc.tag.len() as u16,
    };
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
    let grant = Grant {
        mount_id: req.mount_id,
        epoch: req.epoch,
        offset: req.offset,
        allocation: req.allocation,
        deadline_unix_ms: req.deadline_unix_ms,
        mac: req.mac,
    };
    Ok((grant, req.len, tag.to_vec()))
}

/// In front of the member's gRPC services: refuses a `Write` whose grant the member would not
/// serve before its message is read.
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

impl<S, B> tower::Service<http::Request<B>> for GrantFirst<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        // the readied service serves this call; a clone waits for the next (tower's rule)
        let ready = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, ready);
        let segment = self.segment.clone();
        Box::pin(async move {
            if req.uri().path() == WRITE_PATH {
                let metadata = MetadataMap::from_headers(req.headers().clone());
                let admitted = match write_grant(&metadata) {
                    Ok((grant, len, tag)) => segment.admit(&grant, Access::Write, len, &tag).await,
                    Err(e) => Err(e),
                };
                if let Err(e) = admitted {
                    return Ok(Status::from(e).into_http());
                }
            }
            inner.call(req).await
        })
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

    async fn read(&self, req: Request<ReadRequest>) -> Result<Response<ReadResponse>, Status> {
        let r = req.into_inner();
        let grant = Grant {
            mount_id: r.mount_id,
            epoch: r.epoch,
            offset: r.offset,
            allocation: r.allocation,
            deadline_unix_ms: r.lease_deadline_unix_ms,
            mac: Grant::mac_from(&r.grant_mac),
        };
        self.segment.settle(&grant, Access::Read, r.len, &[]).await;
        let range = self.segment.begin_read(grant, r.len)?;
        let data = Bytes::from(range.to_vec());
        drop(range);
        self.segment.read(r.len);
        Ok(Response::new(ReadResponse { data }))
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
