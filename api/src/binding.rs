//! `KVCachePoolBinding` (namespaced, short name `kvcpb`): a namespace's grant on a pool, under a
//! cache domain that is fixed for the Binding's life. The domain name is the store's tenant id.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{Condition, LocalObjectReference, UsedBy};
use crate::object::{Kind, Object, Scope};
use crate::quantity::Quantity;

pub type KVCachePoolBinding = Object<BindingSpec>;

/// The domain name stored when a Binding omits one.
pub const DEFAULT_DOMAIN: &str = "default";

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BindingSpec {
    /// The cluster-scoped pool; immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_ref: Option<LocalObjectReference>,
    /// Every field is immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<Domain>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<BindingQuota>,
}

impl Kind for BindingSpec {
    type Status = BindingStatus;
    const KIND: &'static str = "KVCachePoolBinding";
    const PLURAL: &'static str = "kvcachepoolbindings";
    const SINGULAR: &'static str = "kvcachepoolbinding";
    const SHORT_NAME: &'static str = "kvcpb";
    const SCOPE: Scope = Scope::Namespaced;
}

impl BindingSpec {
    pub fn pool_name(&self) -> &str {
        self.pool_ref.as_ref().map(|r| r.name.as_str()).unwrap_or_default()
    }

    /// The domain name as stored (after defaulting it is never empty).
    pub fn domain_name(&self) -> &str {
        self.domain
            .as_ref()
            .and_then(|d| d.name.as_deref())
            .unwrap_or(DEFAULT_DOMAIN)
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Domain {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Tokens per cache block.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_size: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtype: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BindingQuota {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ceiling: Option<Quantity>,
}

/// Every figure is optional: absent means not observed, a present `0`/`false` was observed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BindingStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase_message: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_quota: Option<Quantity>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effective_quota: Option<Quantity>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Quantity>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub over_quota: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocks: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hit_rate: Option<String>,
    /// Workloads of this namespace holding the Binding (written by ModelDeployments).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub used_by: Vec<UsedBy>,
}
