//! The leader's gRPC faces: `Store` for engines, `Membership` for members, `Control` for
//! controllers. Each handler locks the state once, does one operation, and maps errors through
//! `error.rs`.

use std::time::Instant;

use tonic::transport::server::Router;
use tonic::{Request, Response, Status};

use super::Leader;
use crate::error::{ErrorCode, StoreError};
use crate::proto::control_server::{Control, ControlServer};
use crate::proto::membership_server::{Membership, MembershipServer};
use crate::proto::store_server::{Store, StoreServer};
use crate::proto::*;

/// All three services on one server.
pub(super) fn router(leader: Leader) -> Router {
    tonic::transport::Server::builder()
        .add_service(StoreServer::new(leader.clone()))
        .add_service(MembershipServer::new(leader.clone()))
        .add_service(ControlServer::new(leader))
}

type Reply<T> = Result<Response<T>, Status>;

fn same_len(a: usize, b: usize, what: &str) -> Result<(), Status> {
    if a == b {
        return Ok(());
    }
    Err(StoreError::new(
        ErrorCode::InvalidArgument,
        format!("{a} keys but {b} {what}; send one per key"),
    )
    .into())
}

#[tonic::async_trait]
impl Store for Leader {
    async fn put_start(&self, req: Request<PutStartRequest>) -> Reply<PutStartResponse> {
        let r = req.into_inner();
        let resp = self.with(|s| s.put_start(r.scope.as_ref(), &r.key, r.size, Instant::now()))?;
        Ok(Response::new(resp))
    }

    async fn put_commit(&self, req: Request<PutCommitRequest>) -> Reply<PutCommitResponse> {
        let r = req.into_inner();
        self.with(|s| s.put_commit(r.scope.as_ref(), &r.key, r.put_id))?;
        Ok(Response::new(PutCommitResponse {}))
    }

    async fn put_revoke(&self, req: Request<PutRevokeRequest>) -> Reply<PutRevokeResponse> {
        let r = req.into_inner();
        self.with(|s| s.put_revoke(r.scope.as_ref(), &r.key, r.put_id))?;
        Ok(Response::new(PutRevokeResponse {}))
    }

    async fn get(&self, req: Request<GetRequest>) -> Reply<GetResponse> {
        let r = req.into_inner();
        Ok(Response::new(
            self.with(|s| s.get(r.scope.as_ref(), &r.key, Instant::now()))?,
        ))
    }

    async fn exists(&self, req: Request<ExistsRequest>) -> Reply<ExistsResponse> {
        let r = req.into_inner();
        let exists = self.with(|s| s.exists(r.scope.as_ref(), &r.key, Instant::now()))?;
        Ok(Response::new(ExistsResponse { exists }))
    }

    async fn remove(&self, req: Request<RemoveRequest>) -> Reply<RemoveResponse> {
        let r = req.into_inner();
        let removed = self.with(|s| s.remove(r.scope.as_ref(), &r.key, Instant::now()))?;
        Ok(Response::new(RemoveResponse { removed }))
    }

    async fn batch_exists(&self, req: Request<BatchExistsRequest>) -> Reply<BatchExistsResponse> {
        let r = req.into_inner();
        let now = Instant::now();
        let exists = self.with(|s| {
            r.keys
                .iter()
                .map(|k| s.exists(r.scope.as_ref(), k, now))
                .collect::<Result<Vec<_>, StoreError>>()
        })?;
        Ok(Response::new(BatchExistsResponse { exists }))
    }

    async fn batch_get(&self, req: Request<BatchGetRequest>) -> Reply<BatchGetResponse> {
        let r = req.into_inner();
        let now = Instant::now();
        let results = self.with(|s| {
            r.keys
                .iter()
                .map(|k| s.get(r.scope.as_ref(), k, now))
                .collect::<Result<Vec<_>, StoreError>>()
        })?;
        Ok(Response::new(BatchGetResponse { results }))
    }

    async fn batch_put_start(&self, req: Request<BatchPutStartRequest>) -> Reply<BatchPutStartResponse> {
        let r = req.into_inner();
        same_len(r.keys.len(), r.sizes.len(), "sizes")?;
        let now = Instant::now();
        let results = self.with(|s| -> Result<Vec<_>, StoreError> {
            s.tenant_name(r.scope.as_ref())?;
            let each = r.keys.iter().zip(&r.sizes);
            Ok(each
                .map(|(k, size)| match s.put_start(r.scope.as_ref(), k, *size, now) {
                    Ok(reserved) => PutStartResult {
                        reserved: Some(reserved),
                        error: String::new(),
                    },
                    Err(e) => PutStartResult {
                        reserved: None,
                        error: e.to_string(),
                    },
                })
                .collect())
        })?;
        Ok(Response::new(BatchPutStartResponse { results }))
    }

    async fn batch_put_commit(&self, req: Request<BatchPutCommitRequest>) -> Reply<BatchPutCommitResponse> {
        let r = req.into_inner();
        same_len(r.keys.len(), r.put_ids.len(), "put_ids")?;
        let errors = self.with(|s| -> Result<Vec<_>, StoreError> {
            s.tenant_name(r.scope.as_ref())?;
            let each = r.keys.iter().zip(&r.put_ids);
            Ok(each
                .map(|(k, id)| {
                    s.put_commit(r.scope.as_ref(), k, *id)
                        .err()
                        .map(|e| e.to_string())
                        .unwrap_or_default()
                })
                .collect())
        })?;
        Ok(Response::new(BatchPutCommitResponse { errors }))
    }

    async fn batch_remove(&self, req: Request<BatchRemoveRequest>) -> Reply<BatchRemoveResponse> {
        let r = req.into_inner();
        let now = Instant::now();
        let (removed, errors) = self.with(|s| -> Result<(Vec<_>, Vec<_>), StoreError> {
            // a bad scope refuses the whole batch before anything is removed
            s.tenant_name(r.scope.as_ref())?;
            Ok(r.keys
                .iter()
                .map(|k| match s.remove(r.scope.as_ref(), k, now) {
                    Ok(removed) => (removed, String::new()),
                    Err(e) => (false, e.to_string()),
                })
                .unzip())
        })?;
        Ok(Response::new(BatchRemoveResponse { removed, errors }))
    }
}

#[tonic::async_trait]
impl Membership for Leader {
    async fn mount(&self, req: Request<MountRequest>) -> Reply<MountResponse> {
        let r = req.into_inner();
        Ok(Response::new(self.with(|s| s.mount(&r, Instant::now()))?))
    }

    async fn heartbeat(&self, req: Request<HeartbeatRequest>) -> Reply<HeartbeatResponse> {
        let r = req.into_inner();
        let known = self.with(|s| s.heartbeat(r.member_id, r.mount_id, Instant::now()));
        Ok(Response::new(HeartbeatResponse { need_remount: !known }))
    }
}

#[tonic::async_trait]
impl Control for Leader {
    async fn set_tenants(&self, req: Request<SetTenantsRequest>) -> Reply<SetTenantsResponse> {
        let r = req.into_inner();
        let objects_dropped = self.with(|s| s.set_tenants(&r.tenants))?;
        tracing::info!(tenants = r.tenants.len(), objects_dropped, "tenant ledger set");
        Ok(Response::new(SetTenantsResponse { objects_dropped }))
    }

    async fn get_tenants(&self, _req: Request<GetTenantsRequest>) -> Reply<GetTenantsResponse> {
        Ok(Response::new(self.with(|s| GetTenantsResponse {
            multi_tenancy: s.cfg.multi_tenancy,
            tenants: s.tenant_statuses(),
        })))
    }

    async fn get_members(&self, _req: Request<GetMembersRequest>) -> Reply<GetMembersResponse> {
        let now = Instant::now();
        Ok(Response::new(self.with(|s| GetMembersResponse {
            members: s.member_statuses(now),
        })))
    }

    async fn health(&self, _req: Request<HealthRequest>) -> Reply<HealthResponse> {
        let serving = self.serving();
        Ok(Response::new(self.with(|s| HealthResponse {
            serving,
            role: "leader".into(),
            capacity: s.capacity(),
            used: s.used(),
            members: s.members.len() as u64,
            objects: s.object_count(),
            fast_port: self.fast_port(),
        })))
    }
}
