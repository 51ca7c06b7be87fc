//! The member's gRPC face, `SegmentData`: the same writes and reads as the data port, for callers
//! that speak only gRPC (any language with generated stubs). Values travel as one message, so the
//! server's message limit is raised to the largest value.

use std::sync::Arc;

use bytes::Bytes;
use tonic::{Request, Response, Status};

use super::segment::{Grant, Segment};
use crate::grant::Access;
use crate::proto::segment_data_server::{SegmentData, SegmentDataServer};
use crate::proto::{HealthRequest, HealthResponse, ReadRequest, ReadResponse, WriteRequest, WriteResponse};
use crate::readiness::ReadinessHandle;

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

#[tonic::async_trait]
impl SegmentData for DataService {
    async fn write(&self, req: Request<WriteRequest>) -> Result<Response<WriteResponse>, Status> {
        let r = req.into_inner();
        let len = r.data.len() as u64;
        let grant = Grant {
            mount_id: r.mount_id,
            epoch: r.epoch,
            offset: r.offset,
            allocation: r.allocation,
            deadline_unix_ms: r.write_deadline_unix_ms,
            mac: Grant::mac_from(&r.grant_mac),
        };
        self.segment.settle(&grant, Access::Write, len).await;
        let mut range = self.segment.begin_write(grant, len)?;
        range.copy_from(&r.data)?;
        drop(range);
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
        self.segment.settle(&grant, Access::Read, r.len).await;
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
