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

/// Desired state of a KVCachePoolBinding.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BindingSpec {
    /// The cluster-scoped pool; immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_ref: Option<LocalObjectReference>,
    /// Every field is immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<Domain>,
    /// The quota this namespace asks the pool for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<BindingQuota>,
}

impl Kind for BindingSpec {
    type Status = BindingStatus;
    const KIND: &'static str = "KVCachePoolBinding";
    const PLURAL: &'static str = "kvcachepoolbindings";
    const SINGULAR: &'static str = "kvcachepoolbinding";
    const SHORT_NAMES: &'static [&'static str] = &["kvcpb"];
    const SCOPE: Scope = Scope::Namespaced;
}

crate::object::kube_resource!(BindingSpec, kube_core::NamespaceResourceScope);

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

/// The cache domain: the store tenant and the format of its blocks.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Domain {
    /// Domain name, the store tenant that holds this cache: a DNS-1123 label not starting with `_`,
    /// unique per backend. Defaults to `default`; immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Tokens per cache block.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_size: Option<i32>,
    /// KV cache data type in lowercase, as engines spell it (for example `bfloat16`); at most 32
    /// characters. Engines attached through this Binding use it; immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtype: Option<String>,
}

/// The quota a Binding asks for.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BindingQuota {
    /// Bytes this namespace asks for, as a quantity such as `8Gi`; required, greater than 0 and at
    /// most the pool's total. The store may grant less.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ceiling: Option<Quantity>,
}

/// Every figure is optional: absent means not observed, a present `0`/`false` was observed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BindingStatus {
    /// Summary of the Binding's state, such as `Provisioning`, `Ready`, `Error` or `Deleting`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<crate::conditions::BindingPhase>,
    /// Why the Binding is in its phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase_message: Option<String>,
    /// Observations of the Binding, one per `type` (such as `QuotaObserved` and `QuotaGranted`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The quota the store records as requested for this domain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_quota: Option<Quantity>,
    /// The quota the store granted; below the ceiling when the pool's backend is oversubscribed.
    /// `0` is a real grant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effective_quota: Option<Quantity>,
    /// Bytes the store reports this domain holding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Quantity>,
    /// Whether the domain holds more than its current grant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub over_quota: Option<bool>,
    /// Number of cache blocks the domain holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocks: Option<i64>,
    /// Share of lookups that hit the cache, a decimal from 0 to 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hit_rate: Option<String>,
    /// Workloads of this namespace holding the Binding (written by ModelDeployments).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub used_by: Vec<UsedBy>,
}
