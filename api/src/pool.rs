//! `KVCachePool` (cluster-scoped, short name `kvcp`): a quota handed out on exactly one backend.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{Condition, UsedBy};
use crate::object::{Kind, Object, Scope};
use crate::quantity::Quantity;

pub type KVCachePool = Object<PoolSpec>;

/// Desired state of a KVCachePool.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolSpec {
    /// Exactly one backend name; immutable.
    #[serde(default)]
    pub backends: Vec<String>,
    /// The quota this pool hands out to its Bindings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<PoolQuota>,
}

impl Kind for PoolSpec {
    type Status = PoolStatus;
    const KIND: &'static str = "KVCachePool";
    const PLURAL: &'static str = "kvcachepools";
    const SINGULAR: &'static str = "kvcachepool";
    const SHORT_NAMES: &'static [&'static str] = &["kvcp"];
    const SCOPE: Scope = Scope::Cluster;
}

crate::object::kube_resource!(PoolSpec, kube_core::ClusterResourceScope);

impl PoolSpec {
    /// The one backend this pool names, when it names exactly one.
    pub fn backend(&self) -> Option<&str> {
        match self.backends.as_slice() {
            [one] if !one.is_empty() => Some(one),
            _ => None,
        }
    }
}

/// The quota a pool hands out.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolQuota {
    /// Total bytes the pool hands out, as a quantity such as `16Gi`. Required; must be greater than
    /// 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total: Option<Quantity>,
}

/// Observed state of a KVCachePool.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolStatus {
    /// Summary of the pool's state, such as `Provisioning`, `Ready`, `Error` or `Deleting`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<crate::conditions::PoolPhase>,
    /// Why the pool is in its phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase_message: Option<String>,
    /// Observations of the pool, one per `type` (such as `BackendResolved` and
    /// `QuotaLedgerAvailable`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The backend's `Client` endpoint, copied verbatim once published.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_endpoint: Option<String>,
    /// Bytes the store reports for this pool's own domains; absent until observed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<PoolUsage>,
    /// Cache domains the pool's Bindings declared, sorted by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub domains: Vec<PoolDomain>,
    /// The Bindings holding this pool; while any remain, deletion waits.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub used_by: Vec<UsedBy>,
}

/// What a pool's domains hold in the store.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolUsage {
    /// Bytes held by this pool's domains, summed, as a binary-SI quantity; absent until observed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total: Option<Quantity>,
}

/// A cache domain declared by one of the pool's Bindings.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolDomain {
    /// The domain name (the store tenant).
    pub name: String,
    /// The Binding that declared the domain.
    pub binding: NamespacedName,
    /// Tokens per cache block, echoed from the Binding.
    pub block_size: i32,
    /// KV cache data type, echoed from the Binding.
    pub dtype: String,
    /// Number of cache blocks the domain holds; absent until observed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocks: Option<i64>,
    /// Share of lookups that hit the cache, a decimal from 0 to 1; absent until observed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hit_rate: Option<String>,
}

/// A namespaced object named by namespace and name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct NamespacedName {
    /// Namespace of the object.
    pub namespace: String,
    /// Name of the object.
    pub name: String,
}
