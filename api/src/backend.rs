//! `KVCacheBackend` (cluster-scoped, short name `kvcb`): a KV-cache store, either managed (a
//! leader and member groups this project runs) or external (endpoints of a store run elsewhere).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::SecurityContext;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{Condition, EnvVar, LocalObjectReference, PullPolicy, Transport, UsedBy};
use crate::object::{Kind, Object, Scope};
use crate::quantity::Quantity;

pub type KVCacheBackend = Object<BackendSpec>;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackendSpec {
    /// The store model. `Mooncake` is the only value.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<BackendType>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<PullPolicy>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_pull_secrets: Vec<LocalObjectReference>,
    /// Exactly one of `managed` or `external`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection: Option<Connection>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport: Option<Transport>,
}

impl Kind for BackendSpec {
    type Status = BackendStatus;
    const KIND: &'static str = "KVCacheBackend";
    const PLURAL: &'static str = "kvcachebackends";
    const SINGULAR: &'static str = "kvcachebackend";
    const SHORT_NAME: &'static str = "kvcb";
    const SCOPE: Scope = Scope::Cluster;
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum BackendType {
    Mooncake,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Connection {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub managed: Option<Managed>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external: Option<External>,
}

/// A store this project runs: one leader (plus standbys) and member groups.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Managed {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<Leader>,
    /// A group's position is its identity: append or remove at the end.
    #[serde(default)]
    pub members: Vec<MemberGroup>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_in: Option<ScaleIn>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Leader {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub election_backend: Option<ElectionBackend>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member_addressing: Option<MemberAddressing>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocation_strategy: Option<AllocationStrategy>,
    /// Per-tenant quota ledger on the leader. Defaults to on; an explicit `false` is kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multi_tenancy: Option<bool>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_args: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_env: Vec<EnvVar>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ElectionBackend {
    Kubernetes,
    None,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum MemberAddressing {
    Lease,
    Service,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum AllocationStrategy {
    Random,
    FreeRatioFirst,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScaleIn {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace_period_seconds: Option<i32>,
}

/// A member group: every selected node runs one member contributing `capacityPerMember`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemberGroup {
    /// Required; `{}` selects every node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub medium: Option<Medium>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_per_member: Option<Quantity>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_buffer_size: Option<Quantity>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_args: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_env: Vec<EnvVar>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// A local disk tier. Not supported yet.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub local_disks: Vec<LocalDisk>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport: Option<Transport>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric_interface_count: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_context: Option<SecurityContext>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub host_paths: Vec<HostPath>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_class_name: Option<String>,
}

/// Where a member's segment lives. Only `DRAM` is supported yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Medium {
    #[serde(rename = "DRAM")]
    Dram,
    #[serde(rename = "VRAM")]
    Vram,
}

impl Medium {
    pub fn as_str(self) -> &'static str {
        match self {
            Medium::Dram => "DRAM",
            Medium::Vram => "VRAM",
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LocalDisk {
    #[serde(default)]
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<Quantity>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_limit: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eviction: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clean_after_delete: Option<bool>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostPath {
    #[serde(default)]
    pub path: String,
    #[serde(default)]
    pub mount_path: String,
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<HostPathType>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only: Option<bool>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum HostPathType {
    #[serde(rename = "")]
    Unset,
    DirectoryOrCreate,
    Directory,
    FileOrCreate,
    File,
    Socket,
    CharDevice,
    BlockDevice,
}

/// A store run elsewhere, reached through its endpoints.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct External {
    #[serde(default)]
    pub endpoints: Vec<Endpoint>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Endpoint {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<EndpointName>,
    #[serde(default)]
    pub address: String,
}

/// `Client` is what engines dial; `Admin` is what the operator reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
pub enum EndpointName {
    Client,
    Admin,
}

impl EndpointName {
    pub fn as_str(self) -> &'static str {
        match self {
            EndpointName::Client => "Client",
            EndpointName::Admin => "Admin",
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackendStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase_message: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub endpoints: Vec<Endpoint>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<Capacity>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<MemberStatus>,
    /// Consumers holding this backend (written by pools).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub used_by: Vec<UsedBy>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Capacity {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total: Option<Quantity>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used: Option<Quantity>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemberStatus {
    #[serde(rename = "segmentID")]
    pub segment_id: String,
    #[serde(rename = "clientID")]
    pub client_id: String,
    pub segment_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub medium: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
}

impl BackendSpec {
    pub fn managed(&self) -> Option<&Managed> {
        self.connection.as_ref()?.managed.as_ref()
    }

    pub fn external(&self) -> Option<&External> {
        self.connection.as_ref()?.external.as_ref()
    }

    /// Whether the leader keeps a per-tenant ledger, as declared. `None` for an external backend,
    /// whose ledger is learned by observation.
    pub fn declared_multi_tenancy(&self) -> Option<bool> {
        let leader = self.managed()?.leader.as_ref();
        Some(leader.and_then(|l| l.multi_tenancy).unwrap_or(true))
    }
}
