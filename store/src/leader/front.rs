//! The leader's gRPC front door: what a call must show in its headers before any byte of its
//! body is read, and how many bytes of body it may then send.
//!
//! | service | shown in the metadata | body at most |
//! |---|---|---|
//! | `Store` | `x-kvstore-protocol` (`protocol.rs`), then a tenant's credential in `x-kvstore-credential` (`State::admits`) | 16 KiB; the batch calls [`MAX_REQUEST`](super::fastport::MAX_REQUEST) |
//! | `Membership` | the member token (`authorization: Bearer …`) | `Mount` and `Handover` [`MAX_MOUNT_MESSAGE`](crate::member::MAX_MOUNT_MESSAGE), `Heartbeat` 16 KiB |
//! | `Control` | the controllers' token, except `Health` | `SetTenants` 4 MiB, the rest 16 KiB |
//!
//! A call that shows too little is answered at once from its headers (`UNAUTHENTICATED`,
//! `CLIENT_VERSION_UNSUPPORTED`): its body, however large it was declared, is never read, so a
//! caller with no credential costs the leader a header's worth of memory. Every body must also
//! arrive whole within [`BODY_TIMEOUT`] (`bounded.rs`). The services behind it check the same
//! again once the request is read (the scope's credential is the tenant's own), so nothing here is
//! the only check.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tonic::codegen::http;
use tonic::metadata::MetadataMap;

use super::Leader;
use crate::bounded::{Bounded, FRAME_HEADER};
use crate::error::StoreError;

/// How long a request body may take to arrive once its headers did.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// The body of a call that names one key (a 4 KiB key, a scope, room to spare), and of every
/// call that names none.
pub const SMALL_BODY: usize = 16 << 10;
/// The body of a `SetTenants`: the whole ledger.
pub const LEDGER_BODY: usize = 4 << 20;

/// Who must show what before a call's body is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Caller {
    /// an engine: its protocol, then a tenant's credential
    Engine,
    /// a member: the member token
    Member,
    /// a controller: the controllers' token
    Controller,
    /// anyone (`Control.Health`)
    Anyone,
}

/// What a method's caller shows, and the most body it may send.
fn rule(path: &str) -> (Caller, usize, &'static str) {
    const BATCH: usize = super::fastport::MAX_REQUEST + FRAME_HEADER;
    const MOUNT: usize = crate::member::MAX_MOUNT_MESSAGE + FRAME_HEADER;
    let (service, method) = path
        .strip_prefix("/kvstore.v1.")
        .and_then(|p| p.split_once('/'))
        .unwrap_or(("", ""));
    match (service, method) {
        ("Store", "BatchExists") => (Caller::Engine, BATCH, "Store.BatchExists"),
        ("Store", "BatchGet") => (Caller::Engine, BATCH, "Store.BatchGet"),
        ("Store", "BatchPutStart") => (Caller::Engine, BATCH, "Store.BatchPutStart"),
        ("Store", "BatchPutCommit") => (Caller::Engine, BATCH, "Store.BatchPutCommit"),
        ("Store", "BatchRemove") => (Caller::Engine, BATCH, "Store.BatchRemove"),
        ("Store", _) => (Caller::Engine, SMALL_BODY, "a Store call"),
        ("Membership", "Mount") => (Caller::Member, MOUNT, "Membership.Mount"),
        ("Membership", "Handover") => (Caller::Member, MOUNT, "Membership.Handover"),
        ("Membership", _) => (Caller::Member, SMALL_BODY, "a Membership call"),
        ("Control", "Health") => (Caller::Anyone, SMALL_BODY, "Control.Health"),
        ("Control", "SetTenants") => (Caller::Controller, LEDGER_BODY + FRAME_HEADER, "Control.SetTenants"),
        ("Control", _) => (Caller::Controller, SMALL_BODY, "a Control call"),
        // tonic answers UNIMPLEMENTED; nothing to read
        _ => (Caller::Anyone, SMALL_BODY, "an unknown call"),
    }
}

impl Leader {
    /// Whether a call whose headers are `metadata` may send its body to `caller`'s service.
    fn admit(&self, caller: Caller, metadata: &MetadataMap) -> Result<(), StoreError> {
        match caller {
            Caller::Engine => {
                crate::protocol::check(&crate::protocol::ClientVersion::from_metadata(metadata))?;
                // a standby has no ledger to check against: it answers NOT_SERVING, unread
                self.gate.check()?;
                let credential = metadata
                    .get(crate::protocol::CREDENTIAL_HEADER)
                    .and_then(|v| v.to_str().ok());
                self.with(|s| s.admits(credential))
            }
            Caller::Member => self.check_member(metadata),
            Caller::Controller => self.check_control(metadata),
            Caller::Anyone => Ok(()),
        }
    }
}

/// In front of the leader's services: [`rule`] for every call.
#[derive(Debug, Clone)]
pub struct Front<S> {
    inner: S,
    leader: Leader,
}

/// Puts [`Front`] in front of a leader's services.
#[derive(Debug, Clone)]
pub struct FrontLayer(pub Leader);

impl<S> tower::Layer<S> for FrontLayer {
    type Service = Front<S>;

    fn layer(&self, inner: S) -> Front<S> {
        Front {
            inner,
            leader: self.0.clone(),
        }
    }
}

impl<S> tower::Service<http::Request<tonic::body::Body>> for Front<S>
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
        let (caller, limit, method) = rule(req.uri().path());
        let metadata = MetadataMap::from_headers(req.headers().clone());
        if let Err(e) = self.leader.admit(caller, &metadata) {
            tracing::debug!(method, error = %e, "refused before its body was read");
            let refusal = tonic::Status::from(e).into_http();
            return Box::pin(async move { Ok(refusal) });
        }
        let req = Bounded::request(req, limit, BODY_TIMEOUT, method);
        Box::pin(inner.call(req))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_method_has_its_caller_and_limit() {
        assert_eq!(rule("/kvstore.v1.Store/Get").0, Caller::Engine);
        assert_eq!(rule("/kvstore.v1.Store/Get").1, SMALL_BODY);
        assert_eq!(rule("/kvstore.v1.Store/WatchBlocks").1, SMALL_BODY);
        assert!(rule("/kvstore.v1.Store/BatchPutStart").1 > super::super::fastport::MAX_REQUEST);
        assert_eq!(rule("/kvstore.v1.Membership/Mount").0, Caller::Member);
        assert_eq!(rule("/kvstore.v1.Membership/Heartbeat").1, SMALL_BODY);
        assert_eq!(rule("/kvstore.v1.Membership/Handover").0, Caller::Member);
        assert!(rule("/kvstore.v1.Membership/Handover").1 > crate::member::MAX_MOUNT_MESSAGE);
        assert_eq!(rule("/kvstore.v1.Control/SetTenants").0, Caller::Controller);
        assert_eq!(rule("/kvstore.v1.Control/GetTenants").0, Caller::Controller);
        assert_eq!(rule("/kvstore.v1.Control/Health").0, Caller::Anyone);
        assert_eq!(
            rule("/other.Service/Call"),
            (Caller::Anyone, SMALL_BODY, "an unknown call")
        );
        assert_eq!(rule("garbage").1, SMALL_BODY);
    }
}
