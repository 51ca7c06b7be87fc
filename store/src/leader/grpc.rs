//! The leader's gRPC faces: `Store` for engines (each call is its function in `calls.rs`, shared
//! with the fast port), `Membership` for members, `Control` for controllers. Each handler locks
//! the state once, does one operation, and maps errors through `error.rs`. Membership and Control
//! calls first show their token (`auth.rs`) when the leader was given one; `Health` is open (it
//! says only where the fast port is and whether this leader serves). Every `Store` call first
//! shows its client's protocol version (`protocol.rs`) and a tenant's credential. All of that is
//! checked from the headers, before a body is read (`front.rs`); the handlers check the tokens
//! again, and the scope's credential is checked against its own tenant once read.

use std::sync::Arc;
use std::time::Instant;

use tonic::transport::server::Router;
use tonic::{Request, Response, Status};

use super::{Leader, calls};
use crate::proto::control_server::{Control, ControlServer};
use crate::proto::membership_server::{Membership, MembershipServer};
use crate::proto::store_server::{Store, StoreServer};
use crate::proto::*;

/// All three services on one server, behind the front door (`front.rs`): callers show what they
/// must before any body is read, and no body is longer than its method needs.
pub(super) fn router(
    leader: Leader,
    tls: Option<&crate::tls::ServerTls>,
) -> Result<
    Router<tower::layer::util::Stack<super::front::FrontLayer, tower::layer::util::Identity>>,
    crate::flags::ConfigError,
> {
    Ok(crate::tls::grpc_server(tls)?
        .layer(super::front::FrontLayer(leader.clone()))
        .add_routes(services(leader)))
}

/// The three services, each reading messages of at most what its largest method needs.
fn services(leader: Leader) -> tonic::service::Routes {
    tonic::service::Routes::new(
        StoreServer::new(leader.clone()).max_decoding_message_size(super::fastport::MAX_REQUEST),
    )
    .add_service(MembershipServer::new(leader.clone()).max_decoding_message_size(crate::member::MAX_MOUNT_MESSAGE))
    .add_service(ControlServer::new(leader).max_decoding_message_size(super::front::LEDGER_BODY))
}

/// What the gRPC port runs for each call, without the port: the front door and the services, for
/// the fuzz target that sends them requests (`fuzz/fuzz_targets/grpc_services.rs`).
#[doc(hidden)]
pub fn fuzzing(leader: Leader) -> super::front::Front<tonic::service::Routes> {
    tower::Layer::layer(&super::front::FrontLayer(leader.clone()), services(leader))
}

type Reply<T> = Result<Response<T>, Status>;

/// Each `Store` call is the function of the same name in `calls.rs` (`WatchBlocks`, a stream,
/// is `blocks.rs`).
#[tonic::async_trait]
impl Store for Leader {
    type WatchBlocksStream = tokio_stream::wrappers::ReceiverStream<Result<BlockEvent, Status>>;

    async fn watch_blocks(&self, req: Request<WatchBlocksRequest>) -> Reply<Self::WatchBlocksStream> {
        let scope = req.into_inner().scope;
        let sub = self.serving(|s| s.watch_blocks(scope.as_ref(), false))?;
        let (tx, rx) = tokio::sync::mpsc::channel(256);
        tokio::spawn(super::blocks::feed(self.clone(), scope, sub, tx));
        Ok(Response::new(tokio_stream::wrappers::ReceiverStream::new(rx)))
    }

    async fn put_start(&self, req: Request<PutStartRequest>) -> Reply<PutStartResponse> {
        Ok(Response::new(calls::put_start(self, req.into_inner(), Instant::now())?))
    }

    async fn put_commit(&self, req: Request<PutCommitRequest>) -> Reply<PutCommitResponse> {
        Ok(Response::new(calls::put_commit(self, req.into_inner())?))
    }

    async fn put_revoke(&self, req: Request<PutRevokeRequest>) -> Reply<PutRevokeResponse> {
        Ok(Response::new(calls::put_revoke(self, req.into_inner())?))
    }

    async fn get(&self, req: Request<GetRequest>) -> Reply<GetResponse> {
        Ok(Response::new(
            calls::get_waiting(self, req.into_inner(), Instant::now()).await?,
        ))
    }

    async fn exists(&self, req: Request<ExistsRequest>) -> Reply<ExistsResponse> {
        Ok(Response::new(calls::exists(self, req.into_inner(), Instant::now())?))
    }

    async fn remove(&self, req: Request<RemoveRequest>) -> Reply<RemoveResponse> {
        let (answer, durable) = calls::remove(self, req.into_inner(), Instant::now())?;
        durable.wait(self).await;
        Ok(Response::new(answer))
    }

    async fn batch_exists(&self, req: Request<BatchExistsRequest>) -> Reply<BatchExistsResponse> {
        Ok(Response::new(calls::batch_exists(
            self,
            req.into_inner(),
            Instant::now(),
        )?))
    }

    async fn batch_get(&self, req: Request<BatchGetRequest>) -> Reply<BatchGetResponse> {
        Ok(Response::new(
            calls::batch_get_waiting(self, req.into_inner(), Instant::now()).await?,
        ))
    }

    async fn batch_put_start(&self, req: Request<BatchPutStartRequest>) -> Reply<BatchPutStartResponse> {
        Ok(Response::new(calls::batch_put_start(
            self,
            req.into_inner(),
            Instant::now(),
        )?))
    }

    async fn batch_put_commit(&self, req: Request<BatchPutCommitRequest>) -> Reply<BatchPutCommitResponse> {
        Ok(Response::new(calls::batch_put_commit(self, req.into_inner())?))
    }

    async fn batch_remove(&self, req: Request<BatchRemoveRequest>) -> Reply<BatchRemoveResponse> {
        let (answer, durable) = calls::batch_remove(self, req.into_inner(), Instant::now())?;
        durable.wait(self).await;
        Ok(Response::new(answer))
    }
}

#[tonic::async_trait]
impl Membership for Leader {
    async fn mount(&self, req: Request<MountRequest>) -> Reply<MountResponse> {
        self.check_member(req.metadata())?;
        let r = req.into_inner();
        Ok(Response::new(self.serving(|s| s.mount(&r, Instant::now()))?))
    }

    /// The page is read from its packed form, and its seals are checked, outside the state lock
    /// and off the runtime's thread (which goes on reading the next page meanwhile); pages are
    /// adopted in the report's order (`adoption.rs`).
    async fn handover(&self, req: Request<HandoverRequest>) -> Reply<HandoverResponse> {
        self.check_member(req.metadata())?;
        let vouching = Arc::new(self.serving(|s| Ok(s.vouching()))?);
        let (r, sealed) = off_thread({
            let (mut r, vouching) = (req.into_inner(), Arc::clone(&vouching));
            move || {
                super::adoption::unpack_page(&mut r)?;
                let sealed = vouching.sealed_all(&r.holdings);
                Ok::<_, crate::error::StoreError>((Arc::new(r), sealed))
            }
        })
        .await??;
        let adopted = self
            .in_report_order(|s| s.handover_sealed(&r, &vouching, &sealed, Instant::now()))
            .await?;
        Ok(Response::new(HandoverResponse { adopted }))
    }

    /// Held while there is nothing to tell the member, at most its `wait_ms` and the heartbeat
    /// interval (`notices.rs`).
    async fn heartbeat(&self, req: Request<HeartbeatRequest>) -> Reply<HeartbeatResponse> {
        self.check_member(req.metadata())?;
        let r = req.into_inner();
        let (news, interval) = self.serving(|s| {
            // what its tier did comes before how far it applied its notices: a failed load is
            // reported lost in the heartbeat that acknowledges it
            s.tier_report(&r, Instant::now());
            Ok((s.hold_heartbeat(&r, Instant::now()), s.cfg.heartbeat_interval()))
        })?;
        if let Some(news) = news {
            let wait = std::time::Duration::from_millis(r.wait_ms).min(interval);
            if tokio::time::timeout(wait, news.notified()).await.is_ok() {
                // the notices of a burst of puts go out together, not one answer each, unless a
                // removal waits for them
                let until = tokio::time::Instant::now() + super::notices::GATHER;
                while !self.with(|s| s.urgent(r.member_id)) {
                    if tokio::time::timeout_at(until, news.notified()).await.is_err() {
                        break;
                    }
                }
            }
        }
        Ok(Response::new(
            self.serving(|s| Ok(s.answer_heartbeat(&r, Instant::now())))?,
        ))
    }
}

#[tonic::async_trait]
impl Control for Leader {
    async fn set_tenants(&self, req: Request<SetTenantsRequest>) -> Reply<SetTenantsResponse> {
        self.check_control(req.metadata())?;
        let r = req.into_inner();
        let objects_dropped = self.serving(|s| s.set_tenants(&r.tenants, &r.pools))?;
        tracing::info!(
            tenants = r.tenants.len(),
            pools = r.pools.len(),
            objects_dropped,
            "tenant ledger set"
        );
        Ok(Response::new(SetTenantsResponse { objects_dropped }))
    }

    async fn get_tenants(&self, req: Request<GetTenantsRequest>) -> Reply<GetTenantsResponse> {
        self.check_control(req.metadata())?;
        Ok(Response::new(self.serving(|s| {
            Ok(GetTenantsResponse {
                multi_tenancy: s.cfg.multi_tenancy,
                tenants: s.tenant_statuses(),
                pools: s.pool_entries(),
            })
        })?))
    }

    async fn get_members(&self, req: Request<GetMembersRequest>) -> Reply<GetMembersResponse> {
        self.check_control(req.metadata())?;
        let now = Instant::now();
        Ok(Response::new(self.serving(|s| {
            Ok(GetMembersResponse {
                members: s.member_statuses(now),
            })
        })?))
    }

    async fn remove_member(&self, req: Request<RemoveMemberRequest>) -> Reply<RemoveMemberResponse> {
        self.check_control(req.metadata())?;
        let name = req.into_inner().name;
        let removed = self.serving(|s| Ok(s.remove_member(&name)))?;
        Ok(Response::new(RemoveMemberResponse { removed }))
    }

    async fn health(&self, _req: Request<HealthRequest>) -> Reply<HealthResponse> {
        let serving = self.is_serving();
        let role = if self.readiness().get() == crate::readiness::Readiness::Standby {
            "standby"
        } else {
            "leader"
        };
        let fast_port = self.advertised_fast_port();
        Ok(Response::new(self.with(|s| HealthResponse {
            serving,
            epoch: s.epoch,
            member_ttl_ms: s.cfg.member_ttl.as_millis() as u64,
            role: role.into(),
            capacity: s.capacity(),
            used: s.used(),
            members: s.members.len() as u64,
            objects: s.object_count(),
            fast_port,
            adopted_objects: s.adopted.objects,
            adopted_bytes: s.adopted.bytes,
            tier_capacity: s.tier_usage().0,
            tier_used: s.tier_usage().1,
        })))
    }
}

/// Runs `f`, hashing work of a page of a member's report, on the runtime's blocking threads.
async fn off_thread<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> Result<R, Status> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Status::internal(format!("a page's seal check stopped: {e}")))
}
