//! `ModelDeployment` (namespaced, short name `md`): an inference workload made of roles, each a
//! set of engine replicas, optionally attached to a shared KV cache through a Binding of its own
//! namespace.
//!
//! The full reference shape decodes (so manifests written for the reference are read, not
//! rejected as unknown fields); the parts not built yet are refused by validation with a message
//! that says so.

use k8s_openapi::api::core::v1::{ConfigMapVolumeSource, HostPathVolumeSource, SecretVolumeSource};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{Condition, EnvVar, LocalObjectReference, Protocol, PullPolicy};
use crate::object::{Kind, Object, Scope};
use crate::quantity::Quantity;

pub type ModelDeployment = Object<ModelDeploymentSpec>;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelDeploymentSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<Model>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<Engine>,
    /// Attachment to a shared cache; absent means none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache: Option<KvCache>,
    #[serde(default)]
    pub roles: Vec<Role>,
    /// Not supported yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub router: Option<Router>,
    /// Not supported yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_transfer: Option<KvTransfer>,
}

impl Kind for ModelDeploymentSpec {
    type Status = ModelDeploymentStatus;
    const KIND: &'static str = "ModelDeployment";
    const PLURAL: &'static str = "modeldeployments";
    const SINGULAR: &'static str = "modeldeployment";
    const SHORT_NAME: &'static str = "md";
    const SCOPE: Scope = Scope::Namespaced;
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Model {
    #[serde(default)]
    pub name: String,
    /// Not supported yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_ref: Option<LocalObjectReference>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Engine {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<EngineName>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum EngineName {
    #[serde(rename = "vLLM")]
    Vllm,
    #[serde(rename = "SGLang")]
    Sglang,
}

impl EngineName {
    pub fn as_str(self) -> &'static str {
        match self {
            EngineName::Vllm => "vLLM",
            EngineName::Sglang => "SGLang",
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KvCache {
    /// Names a `KVCachePoolBinding` in this ModelDeployment's own namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_ref: Option<BindingRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connector: Option<Connector>,
}

/// A Binding by name, resolved in the ModelDeployment's own namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct BindingRef {
    #[serde(default)]
    pub name: String,
    /// Never valid: decoded only so that a cross-namespace reference is refused by name in every
    /// `fieldValidation` mode instead of being dropped as an unknown field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(skip)]
    pub namespace: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Connector {
    Mooncake,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Role {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<RoleKind>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// Pods per replica. Only 1 is supported yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<i32>,
    /// An opaque name resolved through the server's configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<RoleResources>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<PullPolicy>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_pull_secrets: Vec<LocalObjectReference>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub privileged: Option<bool>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<Port>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub additional_volumes: Vec<AdditionalVolume>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shm_size: Option<Quantity>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_args: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<Topology>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub termination_grace_period_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elastic_ep: Option<ElasticEp>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum RoleKind {
    Server,
    Prefill,
    Decode,
}

impl RoleKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RoleKind::Server => "Server",
            RoleKind::Prefill => "Prefill",
            RoleKind::Decode => "Decode",
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RoleResources {
    /// Whole accelerators per replica.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accelerator: Option<Quantity>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accelerator_sliced_memory_percentage: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accelerator_sliced_cores_percentage: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accelerator_partitioned_profile: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<Quantity>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Port {
    #[serde(default)]
    pub port: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<PortProtocol>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum PortProtocol {
    #[serde(rename = "TCP")]
    Tcp,
    #[serde(rename = "UDP")]
    Udp,
    #[serde(rename = "SCTP")]
    Sctp,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AdditionalVolume {
    #[serde(default)]
    pub mount_path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sub_path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map: Option<ConfigMapVolumeSource>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<SecretVolumeSource>,
    /// Not supported yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<HostPathVolumeSource>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Topology {
    #[serde(default)]
    pub required_level: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ElasticEp {
    #[serde(default)]
    pub width: i32,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Router {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_args: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<PullPolicy>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_pull_secrets: Vec<LocalObjectReference>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_timeout_seconds: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disaggregation_threshold_tokens: Option<i32>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KvTransfer {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<Protocol>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelDeploymentStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase_message: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub roles: Vec<RoleStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache: Option<KvCacheStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role_summary: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RoleStatus {
    pub name: String,
    pub kind: String,
    pub desired: i32,
    pub ready: i32,
    #[serde(default)]
    pub quota_reserved: i32,
    #[serde(default)]
    pub unmanaged: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KvCacheStatus {
    pub binding: String,
    pub pool: String,
    pub domain: KvCacheDomainStatus,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KvCacheDomainStatus {
    pub name: String,
    pub block_size: i32,
    pub dtype: String,
}

impl ModelDeploymentSpec {
    /// The Binding name this deployment attaches through, if any.
    pub fn binding_name(&self) -> Option<&str> {
        self.kv_cache.as_ref()?.pool_ref.as_ref().map(|r| r.name.as_str())
    }
}
