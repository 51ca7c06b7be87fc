//! Small shapes shared by several kinds.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

/// A reference by name to an object in the same namespace (or to a cluster-scoped object).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct LocalObjectReference {
    /// Name of the referenced object.
    #[serde(default)]
    pub name: String,
}

/// One environment variable: `{name, value}`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct EnvVar {
    /// Name of the variable. Required.
    #[serde(default)]
    pub name: String,
    /// Value of the variable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

/// A consumer holding an object: written by the consumer, read by the holder's deletion logic.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
pub struct UsedBy {
    /// Kind of the consumer, such as `KVCachePool` or `ModelDeployment`.
    pub kind: String,
    /// Empty for a cluster-scoped consumer; required on the wire but may be `""`.
    #[serde(default)]
    pub namespace: String,
    /// Name of the consumer.
    pub name: String,
}

/// Image pull policy, as on a container.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum PullPolicy {
    Always,
    IfNotPresent,
    Never,
}

/// `spec.transport.protocol` of a backend or a member group, and `kvTransfer.protocol` of a
/// ModelDeployment. Only `Auto` (which means TCP) and `TCP` are supported yet; the others are
/// decoded so that admission refuses them by name, and left out of the schema, which lists only
/// the values the server accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Protocol {
    Auto,
    #[serde(rename = "TCP")]
    Tcp,
    #[serde(rename = "RDMA")]
    #[schemars(skip)]
    Rdma,
    #[serde(rename = "EFA")]
    #[schemars(skip)]
    Efa,
    #[serde(rename = "CANN")]
    #[schemars(skip)]
    Cann,
    #[serde(rename = "ROCM")]
    #[schemars(skip)]
    Rocm,
    #[serde(rename = "MUSA")]
    #[schemars(skip)]
    Musa,
    #[serde(rename = "MACA")]
    #[schemars(skip)]
    Maca,
}

impl Protocol {
    /// The spelling on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Auto => "Auto",
            Protocol::Tcp => "TCP",
            Protocol::Rdma => "RDMA",
            Protocol::Efa => "EFA",
            Protocol::Cann => "CANN",
            Protocol::Rocm => "ROCM",
            Protocol::Musa => "MUSA",
            Protocol::Maca => "MACA",
        }
    }

    /// Whether our store speaks this protocol today.
    pub fn is_supported(self) -> bool {
        matches!(self, Protocol::Auto | Protocol::Tcp)
    }
}

/// `{protocol}` block used by a backend and by a member group.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Transport {
    /// Data transport: `Auto` (TCP, the default) or `TCP`. `RDMA`, `EFA`, `CANN`, `ROCM`, `MUSA`
    /// and `MACA` are not supported yet: the server refuses them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<Protocol>,
}
