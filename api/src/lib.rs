//! The `worker.gpustack.ai/v1` API as Rust types: what a `KVCacheBackend`, `KVCachePool`,
//! `KVCachePoolBinding` and `ModelDeployment` look like on the wire.
//!
//! This crate has no I/O and no rules: what may be stored (defaults, validation, immutability,
//! claims) lives in the API server's registry. Field names use the Kubernetes JSON spelling; every
//! type derives a JSON Schema (schemars) that the OpenAPI document is built from.
//!
//! | module | owns |
//! |---|---|
//! | [`object`] | the envelope shared by the four kinds (`apiVersion`, `kind`, `metadata`, `spec`, `status`) and the per-kind identity ([`Kind`]) |
//! | [`backend`] | `KVCacheBackend`: the store's leader and member groups, or an external store |
//! | [`pool`] | `KVCachePool`: quota handed out on one backend |
//! | [`binding`] | `KVCachePoolBinding`: a namespace's grant on a pool under a fixed cache domain |
//! | [`model_deployment`] | `ModelDeployment`: an inference workload, optionally attached through a Binding |
//! | [`conditions`] | every condition type and reason per kind, typed phases, and the helper that records a condition |
//! | [`common`] | small shapes the kinds share (env vars, references, `usedBy` entries, conditions) |
//! | [`quantity`] | Kubernetes quantities: wire form and exact parsing |

pub mod backend;
pub mod binding;
pub mod common;
pub mod conditions;
pub mod model_deployment;
pub mod object;
pub mod pool;
pub mod quantity;

pub use backend::KVCacheBackend;
pub use binding::KVCachePoolBinding;
pub use model_deployment::ModelDeployment;
pub use object::{Kind, Object, Scope};
pub use pool::KVCachePool;
pub use quantity::Quantity;

/// Re-exported so that users of the types name the same `ObjectMeta` and timestamps.
pub use k8s_openapi;

/// The API group served.
pub const GROUP: &str = "worker.gpustack.ai";
/// The one served version.
pub const VERSION: &str = "v1";
/// `group/version`, the value of `apiVersion` on every object.
pub const API_VERSION: &str = "worker.gpustack.ai/v1";
