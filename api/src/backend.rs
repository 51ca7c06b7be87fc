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

/// Desired state of a KVCacheBackend.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackendSpec {
    /// The store model. `Mooncake` is the only value.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<BackendType>,
    /// Container image of the leader and members of a managed backend. When unset, the server
    /// setting `kv-cache-backend-image` is used; an external backend ignores it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Pull policy for the backend's images: `Always`, `IfNotPresent` or `Never`. When unset, it
    /// follows the image tag as Kubernetes does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<PullPolicy>,
    /// Secrets holding registry credentials for the backend's images (at most 32). Each name must
    /// be a DNS-1123 subdomain.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_pull_secrets: Vec<LocalObjectReference>,
    /// Exactly one of `managed` or `external`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection: Option<Connection>,
    /// How engines and members move data to and from the store; defaults to `{protocol: Auto}`. A
    /// member group may override it with its own `transport`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport: Option<Transport>,
}

impl Kind for BackendSpec {
    type Status = BackendStatus;
    const KIND: &'static str = "KVCacheBackend";
    const PLURAL: &'static str = "kvcachebackends";
    const SINGULAR: &'static str = "kvcachebackend";
    const SHORT_NAMES: &'static [&'static str] = &["kvcb"];
    const SCOPE: Scope = Scope::Cluster;
}

crate::object::kube_resource!(BackendSpec, kube_core::ClusterResourceScope);

/// The store model a backend implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum BackendType {
    Mooncake,
}

/// Where the store runs: here (`managed`) or elsewhere (`external`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Connection {
    /// A store this server runs: a leader and member groups. Give it or `external`, not both; the
    /// choice is immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub managed: Option<Managed>,
    /// A store run elsewhere, reached through its endpoints. Give it or `managed`, not both; the
    /// choice is immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external: Option<External>,
}

/// A store this project runs: one leader (plus standbys) and member groups.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Managed {
    /// The leader that coordinates the store. Required; `{}` takes every default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<Leader>,
    /// A group's position is its identity: append or remove at the end.
    #[serde(default)]
    pub members: Vec<MemberGroup>,
    /// How members shut down when they leave the store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_in: Option<ScaleIn>,
}

/// The leader that coordinates the store: the replica that serves and its standbys.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Leader {
    /// Number of leader replicas, 1 to 5 (default 1): one serves, the rest are standbys. More than
    /// 1 needs `electionBackend: Kubernetes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// How the serving leader is chosen: `Kubernetes` (a Lease election, the default) or `None` (no
    /// election, a single replica).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub election_backend: Option<ElectionBackend>,
    /// How members find the serving leader while the election is on: `Service` (the default,
    /// through the leader Service) or `Lease` (read from the election Lease).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member_addressing: Option<MemberAddressing>,
    /// How the leader picks the member that stores a new object: `FreeRatioFirst` (the default,
    /// prefers emptier members) or `Random`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocation_strategy: Option<AllocationStrategy>,
    /// Per-tenant quota ledger on the leader. Defaults to on; an explicit `false` is kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multi_tenancy: Option<bool>,
    /// Extra flags of `kv-store leader`, one token per entry (`--flag` or `--flag=value`, such as
    /// `--lease-ttl=20s`), added after the ones the server renders. Unknown flags, values the
    /// leader would refuse, and flags a spec field already sets are refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_args: Vec<String>,
    /// Extra environment variables for the leader; names must be unique. Names the server sets
    /// itself are refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_env: Vec<EnvVar>,
}

/// How the serving leader replica is chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ElectionBackend {
    Kubernetes,
    None,
}

/// How members find the serving leader.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum MemberAddressing {
    Lease,
    Service,
}

/// How the leader chooses the member that stores a new object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum AllocationStrategy {
    Random,
    FreeRatioFirst,
}

/// How members shut down when they leave the store.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScaleIn {
    /// Seconds a leaving member may spend draining before it stops, 0 to 3600 (default 0). It only
    /// matters for a group with a local disk tier.
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
    /// Memory that holds each member's segment: `DRAM` (host memory), the only value supported;
    /// `VRAM` is not supported yet and the server refuses it. Required; immutable for the group's
    /// position.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub medium: Option<Medium>,
    /// Memory each member contributes to the store, as a byte quantity such as `8Gi`. Required;
    /// must be greater than 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_per_member: Option<Quantity>,
    /// Size of each member's registered staging buffer for transfers, as a byte quantity; defaults
    /// to 0 (none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_buffer_size: Option<Quantity>,
    /// Extra flags of `kv-store member`, one token per entry (`--flag` or `--flag=value`, such as
    /// `--no-prefault`). Unknown flags, values the member would refuse, and flags a spec field
    /// already sets are refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_args: Vec<String>,
    /// Extra environment variables for the members of this group; names must be unique. Names the
    /// server sets itself are refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_env: Vec<EnvVar>,
    /// Container image of this group's members. When unset, the backend's `image` (or the server
    /// setting) is used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// A disk tier under the members' memory (at most one entry, and one group per backend).
    /// Its presence and path cannot change.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub local_disks: Vec<LocalDisk>,
    /// Overrides the backend's `transport` for this group. When the block is present without a
    /// protocol it means `Auto` (TCP); leave it out to inherit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport: Option<Transport>,
    /// Number of fabric interfaces (RDMA or EFA devices) each member requests, at least 1; unset
    /// means 1. It has no effect, only a warning, when the group's protocol is not RDMA or EFA.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric_interface_count: Option<i32>,
    /// Container security context for the members, merged onto the one the server derives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_context: Option<SecurityContext>,
    /// Host directories or files mounted into each member (at most 32). Mount paths must not
    /// overlap each other or `/dev/infiniband`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub host_paths: Vec<HostPath>,
    /// Name of the RuntimeClass the member Pods run with; a DNS-1123 subdomain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_class_name: Option<String>,
}

/// Where a member's segment lives. Only `DRAM` is supported yet: `VRAM` is decoded so that
/// admission refuses it by name, and left out of the schema, which lists only accepted values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Medium {
    #[serde(rename = "DRAM")]
    Dram,
    #[serde(rename = "VRAM")]
    #[schemars(skip)]
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

/// A disk tier under a member group's memory: every value the group's members hold is copied
/// there, a value evicted from memory stays readable from it, and its contents outlive member
/// restarts. At most one entry, in at most one group of a backend.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LocalDisk {
    /// Directory on each selected node that holds the tier's files: absolute, without `..`, not
    /// `/`. It must exist on the node, writable by the member (uid 65532 in the store's image).
    /// Immutable, as is the entry's presence.
    #[serde(default)]
    pub path: String,
    /// Most bytes the tier may hold on each node, at least `16Mi` when set; unset or 0 takes the
    /// free space of the directory's file system when the member starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<Quantity>,
    /// Most values the tier may hold on each node, at least 64 when set; unset or 0: no limit but
    /// its capacity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_limit: Option<i64>,
    /// How the tier makes room when full; unset drops its oldest content (FIFO).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eviction: Option<TierEviction>,
    /// Empty the tier's directory on every selected node when the backend is deleted (its
    /// contents, never the directory itself); defaults to false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clean_after_delete: Option<bool>,
}

/// How a disk tier makes room.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TierEviction {
    /// Whether the tier drops content to take new content when full (true when the block is
    /// present); false keeps what it holds and copies nothing more until values are removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// What goes first: `FIFO` (the oldest written) or `LRU` (the least recently read), a file
    /// of the tier at a time; defaults to FIFO.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<TierEvictionPolicy>,
    /// Percentages of `capacity` (which it requires): above `high` the tier drops content until
    /// it holds `low`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watermark: Option<TierWatermark>,
}

/// What a full disk tier drops first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum TierEvictionPolicy {
    #[serde(rename = "FIFO")]
    Fifo,
    #[serde(rename = "LRU")]
    Lru,
}

/// A disk tier's eviction marks, in percent of its capacity.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TierWatermark {
    /// Percent (1 to 100) above which the tier drops content. Required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub high: Option<i32>,
    /// Percent (1 to 100, below `high`) the tier drops content down to. Required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub low: Option<i32>,
}

/// A path on the node mounted into each member of a group.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostPath {
    /// Absolute path on the node to mount. Required.
    #[serde(default)]
    pub path: String,
    /// Absolute path inside the member container where it is mounted. Required.
    #[serde(default)]
    pub mount_path: String,
    /// Kubernetes hostPath type the kubelet checks before mounting, such as `Directory` or `File`;
    /// empty skips the check.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<HostPathType>,
    /// Mount the path read-only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only: Option<bool>,
}

/// The check the kubelet makes on a host path before mounting it; empty means none.
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
    /// Addresses of the external store: one named `Client` and one named `Admin`, each given once.
    #[serde(default)]
    pub endpoints: Vec<Endpoint>,
}

/// A named `host:port` address of a store.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Endpoint {
    /// Which endpoint this is: `Client` (what engines dial) or `Admin` (what the server reads
    /// health, metrics and members from).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<EndpointName>,
    /// The endpoint as `host:port`, at most 259 characters.
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

/// Observed state of a KVCacheBackend.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackendStatus {
    /// Summary of the backend's state: `Provisioning`, `Ready`, `Degraded`, `Error` or `Deleting`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<crate::conditions::BackendPhase>,
    /// Why the backend is in its phase; empty when `Ready`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase_message: Option<String>,
    /// Observations of the backend, one per `type` (such as `LeaderAvailable` and
    /// `MembersMounted`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Published `Client` and `Admin` addresses: derived from the leader Service for a managed
    /// backend, copied from the spec for an external one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub endpoints: Vec<Endpoint>,
    /// Store capacity as the leader reports it; absent while it has not been observed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<Capacity>,
    /// Leader replicas: how many should run and how many are ready. Under an election exactly
    /// one serves and the others are standbys that are deliberately not ready, so `3 desired /
    /// 1 ready` is the healthy state. Absent for an external backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<LeaderReplicas>,
    /// Segments the leader reports as mounted, one row per member, sorted by `segmentID`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<MemberStatus>,
    /// Consumers holding this backend (written by pools).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub used_by: Vec<UsedBy>,
}

/// Leader replicas, desired and ready.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LeaderReplicas {
    /// Leader replicas that should run (`spec.connection.managed.leader.replicas`; 1 without an
    /// election).
    pub replicas: i32,
    /// Leader replicas that are ready: the one that serves (two, briefly, during a handover).
    pub ready_replicas: i32,
}

/// Store capacity as the leader reports it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Capacity {
    /// Total bytes the store can hold, as a binary-SI quantity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total: Option<Quantity>,
    /// Bytes currently allocated in the store, as a binary-SI quantity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used: Option<Quantity>,
}

/// One mounted segment, as the leader reports it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemberStatus {
    /// The store's identifier of the segment.
    #[serde(rename = "segmentID")]
    pub segment_id: String,
    /// The store's identifier of the member process that mounted the segment.
    #[serde(rename = "clientID")]
    pub client_id: String,
    /// The segment's name as the store reports it.
    pub segment_name: String,
    /// Node of the member Pod serving the segment, when it could be matched; empty for an external
    /// backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// Medium of the member group serving the segment (`DRAM` or `VRAM`), when it could be matched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub medium: Option<String>,
    /// Transport protocol the segment registered with, in the store's spelling (for example `tcp`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    /// Segment state: `OK`, `Draining`, `Drained`, `GracefullyUnmounting`, `Unmounting` or
    /// `Undefined`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// Whether clients on the member's node may map its segment instead of using TCP (the
    /// member was started with `--same-host`, through its group's `extraArgs`). Such a client
    /// can read and write every tenant's bytes in the segment, not only its own: true only
    /// where the backend's owner chose it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub same_host: Option<bool>,
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
