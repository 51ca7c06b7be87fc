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

/// Desired state of a ModelDeployment.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelDeploymentSpec {
    /// The model to serve. Required; immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<Model>,
    /// The inference engine. Required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<Engine>,
    /// Attachment to a shared cache; absent means none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache: Option<KvCache>,
    /// The roles of the deployment, 1 to 10 with unique names. Roles cannot be added, removed or
    /// renamed after create.
    #[serde(default)]
    pub roles: Vec<Role>,
    /// A router of ours (`kvcache-router`) in front of the roles: clients send requests to it, and
    /// it pairs `Prefill` and `Decode` roles (or balances `Server` replicas). Absent means no
    /// router. It may be added or removed later.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub router: Option<Router>,
    /// Refused: a direct prefill-to-decode KV transfer leg. Prefill hands a prompt's KV to decode
    /// through the shared store (`kvCache`), so there is no direct leg to configure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_transfer: Option<KvTransfer>,
}

impl Kind for ModelDeploymentSpec {
    type Status = ModelDeploymentStatus;
    const KIND: &'static str = "ModelDeployment";
    const PLURAL: &'static str = "modeldeployments";
    const SINGULAR: &'static str = "modeldeployment";
    const SHORT_NAMES: &'static [&'static str] = &["md"];
    const SCOPE: Scope = Scope::Namespaced;
}

crate::object::kube_resource!(ModelDeploymentSpec, kube_core::NamespaceResourceScope);

/// The model a deployment serves.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Model {
    /// The served model name, such as `Qwen/Qwen2.5-7B-Instruct`; 1 to 253 characters. Required;
    /// immutable.
    #[serde(default)]
    pub name: String,
    /// Not supported yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_ref: Option<LocalObjectReference>,
}

/// The inference engine and its version.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Engine {
    /// The engine: `vLLM` or `SGLang`. Required; immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<EngineName>,
    /// Engine version (1 to 64 characters), used to choose the image of roles that name none;
    /// required when a role has no `image`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// The inference engine.
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

/// Attachment to a shared KV cache through a KVCachePoolBinding.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KvCache {
    /// Names a `KVCachePoolBinding` in this ModelDeployment's own namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_ref: Option<BindingRef>,
    /// The store client the engines use; `Mooncake` (the default) is the only value. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connector: Option<Connector>,
}

/// A Binding by name, resolved in the ModelDeployment's own namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct BindingRef {
    /// Name of a KVCachePoolBinding in the ModelDeployment's own namespace. Required; immutable.
    #[serde(default)]
    pub name: String,
    /// Never valid: decoded only so that a cross-namespace reference is refused by name in every
    /// `fieldValidation` mode instead of being dropped as an unknown field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(skip)]
    pub namespace: Option<String>,
}

/// The store client engines use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Connector {
    Mooncake,
}

/// A set of engine replicas with one purpose and shape.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Role {
    /// Role name, unique within the deployment: a DNS-1123 label, and `<deployment>-<role>` must
    /// fit in 63 characters.
    #[serde(default)]
    pub name: String,
    /// What the role serves: `Server` (the default, whole requests), or one half of a split
    /// request: `Prefill` (computes the prompt's KV and saves it into the shared store) or
    /// `Decode` (loads it from the store and generates). `Server` never mixes with the other two;
    /// a `Prefill` role needs a `Decode` role and the reverse; only `Server` may appear in more
    /// than one role. The halves need `kvCache` (the handoff goes through the store) and vLLM, and
    /// a `router` to pair them. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<RoleKind>,
    /// Number of engine replicas, 1 to 1024; defaults to 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// Pods per replica. Only 1 is supported yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<i32>,
    /// An opaque name resolved through the server's configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_type: Option<String>,
    /// Accelerators each replica gets. Cannot change after create yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<RoleResources>,
    /// Engine container image. When unset, it is chosen from `engine.name` and `engine.version`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Pull policy for the engine image: `Always`, `IfNotPresent` or `Never`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<PullPolicy>,
    /// Secrets holding registry credentials for the engine image (at most 32). Each name must be a
    /// DNS-1123 subdomain.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_pull_secrets: Vec<LocalObjectReference>,
    /// Run the engine container privileged. Not supported yet: the server refuses `true`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub privileged: Option<bool>,
    /// Container ports of the engine; each port and protocol may appear once.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<Port>,
    /// ConfigMaps or Secrets mounted into the engine container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub additional_volumes: Vec<AdditionalVolume>,
    /// Size of the engine's `/dev/shm`, as a byte quantity. Not supported yet: the server refuses
    /// it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shm_size: Option<Quantity>,
    /// Replaces the whole engine command line. Not supported yet: the server refuses it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// Extra engine arguments, appended after the ones the server renders. Flags the server sets
    /// itself (such as `--kv-transfer-config`) are refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_args: Vec<String>,
    /// Extra environment variables for the engine; names must be unique. Names the server sets
    /// itself are refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    /// Topology-aware placement of the role's Pods. Not supported yet: the server refuses it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<Topology>,
    /// Seconds an engine Pod gets to shut down, 15 to 3600; defaults to 30.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub termination_grace_period_seconds: Option<i64>,
    /// Elastic expert parallelism. Not supported yet: the server refuses it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elastic_ep: Option<ElasticEp>,
}

/// What a role serves: whole requests (`Server`), or one half of a split request (`Prefill`,
/// `Decode`).
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

    /// The letter the ROLES column counts the kind's ready replicas under (`S`, `P`, `D`).
    pub fn letter(self) -> char {
        match self {
            RoleKind::Server => 'S',
            RoleKind::Prefill => 'P',
            RoleKind::Decode => 'D',
        }
    }
}

/// Accelerators and interfaces per replica of a role.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RoleResources {
    /// Whole accelerators per replica.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accelerator: Option<Quantity>,
    /// Percent of one accelerator's memory a replica gets, for a sliced accelerator. Not supported
    /// yet: the server refuses it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accelerator_sliced_memory_percentage: Option<i32>,
    /// Percent of one accelerator's compute cores a replica gets, for a sliced accelerator. Not
    /// supported yet: the server refuses it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accelerator_sliced_cores_percentage: Option<i32>,
    /// Name of an accelerator partition profile to use instead of whole accelerators. Not supported
    /// yet: the server refuses it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accelerator_partitioned_profile: Option<String>,
    /// Number of fabric (RDMA or EFA) interfaces per replica. Not supported yet: the server refuses
    /// it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<Quantity>,
}

/// A container port of the engine.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Port {
    /// Port number, 1 to 65535.
    #[serde(default)]
    pub port: i32,
    /// `TCP` (the default), `UDP` or `SCTP`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<PortProtocol>,
}

/// Protocol of a container port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum PortProtocol {
    #[serde(rename = "TCP")]
    Tcp,
    #[serde(rename = "UDP")]
    Udp,
    #[serde(rename = "SCTP")]
    Sctp,
}

/// A ConfigMap or Secret mounted into a role's engine container.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AdditionalVolume {
    /// Absolute path in the engine container where the volume is mounted; unique within the role.
    /// Required.
    #[serde(default)]
    pub mount_path: String,
    /// Mount the volume read-only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only: Option<bool>,
    /// Path inside the volume to mount instead of its root; relative, without `..`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sub_path: Option<String>,
    /// Mount this ConfigMap from the ModelDeployment's namespace. Give exactly one of `configMap`
    /// or `secret`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map: Option<ConfigMapVolumeSource>,
    /// Mount this Secret from the ModelDeployment's namespace. Give exactly one of `configMap` or
    /// `secret`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<SecretVolumeSource>,
    /// Not supported yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<HostPathVolumeSource>,
}

/// Topology-aware placement. Not supported yet: the server refuses it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Topology {
    /// Node label key naming the topology domain all of a replica's Pods must share. Not supported
    /// yet: the server refuses it.
    #[serde(default)]
    pub required_level: String,
}

/// Elastic expert parallelism. Not supported yet: the server refuses it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ElasticEp {
    /// Expert-parallel width. Not supported yet: the server refuses it.
    #[serde(default)]
    pub width: i32,
}

/// Our router name, the one `spec.router.name` accepts.
pub const KVCACHE_ROUTER: &str = "kvcache-router";

/// A request router in front of the roles: ours, `kvcache-router` (the `kv-router` binary of the
/// store's image). It sends a prompt to a `Prefill` replica, which saves its KV into the store,
/// then to a `Decode` replica, which loads it from there; it spreads requests over `Server`
/// replicas by the fewest outstanding requests.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Router {
    /// Which router runs: `kvcache-router` (ours). The reference's external routers
    /// (`llm-d-router`, `vllm-router`, `sglang-gateway`) are refused. Required; cannot change
    /// while the router block stays.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Number of router replicas, at least 1; defaults to 1. On one machine (the local runtime)
    /// one router process runs whatever the number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// Router container image; defaults to the store's image (the server setting
    /// `kvCacheBackendImage`), which ships `kv-router` next to `kv-store`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Extra router flags, one per entry, written `--flag=value` and checked as `kv-router` parses
    /// them: `--health-interval-ms`, `--unhealthy-after`, `--prefill-timeout-seconds`,
    /// `--max-body-bytes`, `--log-level`. Flags the server renders (`--listen`, `--model`,
    /// `--workers-file`, `--workers-dns`, `--request-timeout-seconds`,
    /// `--disaggregation-threshold-tokens`) are refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_args: Vec<String>,
    /// Pull policy for the router image: `Always`, `IfNotPresent` or `Never`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<PullPolicy>,
    /// Secrets holding registry credentials for the router image (at most 32).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_pull_secrets: Vec<LocalObjectReference>,
    /// Seconds a client request may take end to end, at least 1; unset keeps the router's
    /// default (600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_timeout_seconds: Option<i32>,
    /// Prompts with fewer tokens than this skip prefill and go straight to a `Decode` replica,
    /// and so do prompts of which the store lacks fewer tokens than this (the router follows
    /// what the store holds; decode loads it); at least 0. Unset or 0: every prompt goes
    /// through a `Prefill` replica.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disaggregation_threshold_tokens: Option<i32>,
}

/// Refused: a direct KV transfer leg between roles. Prefill hands a prompt's KV to decode through
/// the shared store instead.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KvTransfer {
    /// Transport of the direct leg. Refused with the whole `kvTransfer`: the handoff goes through
    /// the store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<Protocol>,
}

/// Observed state of a ModelDeployment.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelDeploymentStatus {
    /// Summary of the deployment's state: `Starting`, `Ready`, `Degraded` or `Deleting`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<crate::conditions::ModelDeploymentPhase>,
    /// Why the deployment is in its phase, such as how many replicas are ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase_message: Option<String>,
    /// Observations of the deployment, one per `type` (such as `DomainRegistered` and
    /// `CacheAttached`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// URL clients use to reach the model. With a router: the router's address once it is ready
    /// (on one machine `http://127.0.0.1:<port>`, in a cluster `http://<name>-router.<namespace>.svc:8000`).
    /// Without: on one machine (the local runtime) the address of the first role's first
    /// replica; unset in a cluster, where no Service fronts the replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// Replica counts per role.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub roles: Vec<RoleStatus>,
    /// The cache domain the deployment is attached to, echoed from its Binding; absent until the
    /// Binding has been read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache: Option<KvCacheStatus>,
    /// Ready replicas by kind, for the ROLES column: `R` ready router replicas (first, only with a
    /// router), then `S` (`Server`), `P` (`Prefill`), `D` (`Decode`), roles of one kind summed;
    /// for example `1R1P1D`, or `2S` for two ready `Server` replicas without a router.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role_summary: Option<String>,
    /// The router, as it runs; absent without `spec.router`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub router: Option<RouterStatus>,
}

/// The router of a deployment, as it runs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RouterStatus {
    /// The router (`kvcache-router`).
    pub name: String,
    /// Where clients reach it, once a replica is ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// Router replicas that run (one process on one machine).
    pub replicas: i32,
    /// Router replicas that are ready: they answer `/health`, which needs a healthy `Decode` or
    /// `Server` worker behind them.
    pub ready: i32,
}

/// Replica counts of one role.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RoleStatus {
    /// The role's name.
    pub name: String,
    /// The role's kind, with the default applied.
    pub kind: String,
    /// Replicas the spec asks for.
    pub desired: i32,
    /// Replicas whose Pods are all ready.
    pub ready: i32,
    /// Replicas whose quota is reserved by a queueing system (Kueue), which is not supported yet.
    #[serde(default)]
    pub quota_reserved: i32,
    /// Whether the role replaces the engine command (`command`), so the server does not manage its
    /// engine.
    #[serde(default)]
    pub unmanaged: bool,
}

/// The cache attachment of a deployment, echoed from its Binding.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KvCacheStatus {
    /// Name of the KVCachePoolBinding the deployment uses.
    pub binding: String,
    /// Name of the KVCachePool behind that Binding.
    pub pool: String,
    /// The Binding's cache domain.
    pub domain: KvCacheDomainStatus,
}

/// A cache domain as declared by a Binding.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KvCacheDomainStatus {
    /// Domain name (the store tenant).
    pub name: String,
    /// Tokens per cache block.
    pub block_size: i32,
    /// KV cache data type the engines use.
    pub dtype: String,
}

impl ModelDeploymentSpec {
    /// The Binding name this deployment attaches through, if any.
    pub fn binding_name(&self) -> Option<&str> {
        self.kv_cache.as_ref()?.pool_ref.as_ref().map(|r| r.name.as_str())
    }
}
