//! `KVCachePool` (cluster-scoped, short name `kvcp`): a quota handed out on exactly one backend.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{Condition, UsedBy};
use crate::object::{Kind, Object, Scope};
use crate::quantity::Quantity;

pub type KVCachePool = Object<PoolSpec>;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolSpec {
    /// Exactly one backend name; immutable.
    #[serde(default)]
    pub backends: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<PoolQuota>,
}

impl Kind for PoolSpec {
    type Status = PoolStatus;
    const KIND: &'static str = "KVCachePool";
    const PLURAL: &'static str = "kvcachepools";
    const SINGULAR: &'static str = "kvcachepool";
    const SHORT_NAME: &'static str = "kvcp";
    const SCOPE: Scope = Scope::Cluster;
}

impl PoolSpec {
    /// The one backend this pool names, when it names exactly one.
    pub fn backend(&self) -> Option<&str> {
        match self.backends.as_slice() {
            [one] if !one.is_empty() => Some(one),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolQuota {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total: Option<Quantity>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase_message: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The backend's `Client` endpoint, copied verbatim once published.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_endpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<PoolUsage>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub domains: Vec<PoolDomain>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub used_by: Vec<UsedBy>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolUsage {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total: Option<Quantity>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolDomain {
    pub name: String,
    pub binding: NamespacedName,
    pub block_size: i32,
    pub dtype: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocks: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hit_rate: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct NamespacedName {
    pub namespace: String,
    pub name: String,
}
