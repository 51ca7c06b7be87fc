//! Reading and writing a leader through its Control API (`kvstore.v1.Control`): health and
//! capacity, mounted members, and the tenant ledger. A pass connects once ([`LeaderClient::connect`])
//! and makes its calls on that channel; every call has a deadline, so an unreachable leader is an
//! observation ("unreachable: ..."), never a stuck pass.

use std::time::Duration;

use kvcache_store::proto::control_client::ControlClient;
use kvcache_store::proto::{
    GetMembersRequest, GetTenantsRequest, GetTenantsResponse, HealthRequest, HealthResponse, MemberStatus, PoolEntry,
    SetTenantsRequest, TenantEntry,
};
use tonic::transport::Channel;

/// A leader's answer, read in one pass.
#[derive(Clone, Debug, PartialEq)]
pub struct LeaderView {
    pub health: HealthResponse,
    pub members: Vec<MemberStatus>,
}

/// A failed call: what was asked and why it failed, in the store's own words.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct LeaderError(pub String);

impl LeaderError {
    /// Whether the leader refused the ledger itself (not a transport failure).
    pub fn is_refusal(&self) -> bool {
        self.0.contains("INVALID_TENANT_LEDGER") || self.0.contains("TENANT_LAYOUT_IMMUTABLE")
    }
}

/// One channel to a leader's Control API.
pub struct LeaderClient {
    endpoint: String,
    timeout: Duration,
    control: ControlClient<Channel>,
    /// the controllers' token, shown on every call when the runtime started the leader with one
    token: Option<String>,
}

impl LeaderClient {
    /// Connects to the leader at `endpoint` (HOST:PORT), over TLS with `tls`; each call then has
    /// `timeout`.
    pub async fn connect(
        endpoint: &str,
        timeout: Duration,
        token: Option<String>,
        tls: Option<kvcache_store::tls::ClientTls>,
    ) -> Result<LeaderClient, LeaderError> {
        let unreachable = |e: String| LeaderError(format!("cannot reach the leader at {endpoint}: {e}"));
        let channel = kvcache_store::tls::grpc_endpoint(endpoint, tls.as_ref())
            .map_err(|e| unreachable(e.to_string()))?
            .connect_timeout(timeout)
            .timeout(timeout)
            .connect()
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        Ok(LeaderClient {
            endpoint: endpoint.to_owned(),
            timeout,
            control: ControlClient::new(channel),
            token,
        })
    }

    /// `msg` as a request carrying the token, if there is one.
    fn request<T>(&self, msg: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        if let Some(t) = &self.token {
            // a token the runtime wrote is one printable word, so it always fits in metadata
            let _ = kvcache_store::auth::attach(&mut r, t);
        }
        r
    }

    async fn call<T>(
        &self,
        what: &str,
        f: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, LeaderError> {
        let endpoint = &self.endpoint;
        match tokio::time::timeout(self.timeout, f).await {
            Err(_) => Err(LeaderError(format!(
                "{what} at the leader {endpoint} did not answer within {:?}",
                self.timeout
            ))),
            Ok(Err(s)) => Err(LeaderError(format!("{what} at the leader {endpoint}: {}", s.message()))),
            Ok(Ok(r)) => Ok(r.into_inner()),
        }
    }

    /// Health (capacity, whether it serves) and the mounted members.
    pub async fn observe(&self) -> Result<LeaderView, LeaderError> {
        let health = self
            .call("Health", self.control.clone().health(self.request(HealthRequest {})))
            .await?;
        let members = self
            .call(
                "GetMembers",
                self.control.clone().get_members(self.request(GetMembersRequest {})),
            )
            .await?
            .members;
        Ok(LeaderView { health, members })
    }

    /// The ledger with grants and usage.
    pub async fn tenants(&self) -> Result<GetTenantsResponse, LeaderError> {
        self.call(
            "GetTenants",
            self.control.clone().get_tenants(self.request(GetTenantsRequest {})),
        )
        .await
    }

    /// Replaces the whole ledger; returns how many objects of removed tenants were dropped.
    pub async fn set_tenants(&self, tenants: Vec<TenantEntry>, pools: Vec<PoolEntry>) -> Result<u64, LeaderError> {
        let r = self
            .call(
                "SetTenants",
                self.control
                    .clone()
                    .set_tenants(self.request(SetTenantsRequest { tenants, pools })),
            )
            .await?;
        Ok(r.objects_dropped)
    }
}
