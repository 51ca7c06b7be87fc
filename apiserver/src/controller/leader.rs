//! Reading and writing a leader through its Control API (`kvstore.v1.Control`): health and
//! capacity, mounted members, and the tenant ledger. Every call has a deadline, so an unreachable
//! leader is an observation ("unreachable: ..."), never a stuck pass.

use std::time::Duration;

use kvcache_store::client::Client;
use kvcache_store::proto::{
    GetMembersRequest, GetTenantsRequest, GetTenantsResponse, HealthRequest, HealthResponse, MemberStatus, Scope,
    SetTenantsRequest, TenantEntry,
};

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

async fn control(endpoint: &str, timeout: Duration) -> Result<Client, LeaderError> {
    tokio::time::timeout(timeout, Client::connect(endpoint, Scope::default()))
        .await
        .map_err(|_| LeaderError(format!("the leader at {endpoint} did not answer within {timeout:?}")))?
        .map_err(|e| LeaderError(format!("cannot reach the leader at {endpoint}: {e}")))
}

async fn call<T>(
    endpoint: &str,
    timeout: Duration,
    what: &str,
    f: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, LeaderError> {
    match tokio::time::timeout(timeout, f).await {
        Err(_) => Err(LeaderError(format!(
            "{what} at the leader {endpoint} did not answer within {timeout:?}"
        ))),
        Ok(Err(s)) => Err(LeaderError(format!("{what} at the leader {endpoint}: {}", s.message()))),
        Ok(Ok(r)) => Ok(r.into_inner()),
    }
}

/// Health (capacity, whether it serves) and the mounted members.
pub async fn observe(endpoint: &str, timeout: Duration) -> Result<LeaderView, LeaderError> {
    let client = control(endpoint, timeout).await?;
    let mut c = client.control();
    let health = call(endpoint, timeout, "Health", c.health(HealthRequest {})).await?;
    let members = call(endpoint, timeout, "GetMembers", c.get_members(GetMembersRequest {}))
        .await?
        .members;
    Ok(LeaderView { health, members })
}

/// The ledger with grants and usage.
pub async fn tenants(endpoint: &str, timeout: Duration) -> Result<GetTenantsResponse, LeaderError> {
    let client = control(endpoint, timeout).await?;
    let mut c = client.control();
    call(endpoint, timeout, "GetTenants", c.get_tenants(GetTenantsRequest {})).await
}

/// Replaces the whole ledger.
pub async fn set_tenants(endpoint: &str, timeout: Duration, tenants: Vec<TenantEntry>) -> Result<u64, LeaderError> {
    let client = control(endpoint, timeout).await?;
    let mut c = client.control();
    Ok(call(
        endpoint,
        timeout,
        "SetTenants",
        c.set_tenants(SetTenantsRequest { tenants }),
    )
    .await?
    .objects_dropped)
}
