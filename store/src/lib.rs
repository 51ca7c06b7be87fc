//! The KV-cache store: a metadata-only leader, members that hold the bytes in shared-memory
//! segments, and the client library engines, benchmarks and controllers use to reach them.
//!
//! Map:
//! - [`proto`]: the generated gRPC types (`proto/kvstore.proto`);
//! - [`error`]: the one place store errors become `tonic::Status` (and back);
//! - [`flags`]: what the command-line configurations share ([`leader::LeaderConfig`] and
//!   [`member::MemberConfig`] are the flags of `kv-store leader` and `kv-store member`);
//! - [`election`]: a Lease campaign (client-go's rules) whose term is the leader's epoch;
//! - [`lifecycle`]: binding, serving until a cancellation token fires, draining;
//! - [`readiness`]: `Starting` → `Serving` | `Standby` → `Stopping`, observable;
//! - [`tls`]: TLS on the TCP ports, and the connection type of the framed ports;
//! - [`wire`]: the member's framed data port protocol;
//! - [`bounded`]: gRPC request bodies read under a byte limit and a deadline;
//! - [`protocol`]: which client protocol versions a leader serves, and the refusal of others;
//! - [`leader`]: segments, objects, placement, tenants and quota, leases, eviction, liveness;
//! - [`member`]: the mapped segment, its gRPC service and data port, mounting and heartbeats;
//! - [`client`]: pooled connections to a leader and its members;
//! - [`spin`]: polling instead of sleeping for a short while, because waking a halted vCPU
//!   costs more than a metadata call;
//! - [`metrics`]: `/metrics` (a `prometheus_client` registry), `/healthz` and `/readyz` over HTTP;
//! - [`bench`], [`engine_sim`]: the two workload commands.

pub mod auth;
pub mod bench;
pub mod bounded;
pub mod client;
pub mod election;
pub mod engine_sim;
pub mod error;
pub mod flags;
pub mod frame;
pub mod grant;
pub mod holdings;
pub mod leader;
pub mod lifecycle;
pub mod member;
pub mod metrics;
pub mod net;
pub mod proto;
pub mod protocol;
pub mod readiness;
pub mod spin;
pub mod time;
pub mod tls;
pub mod wire;

/// The workspace's one way for a test to wait on a condition.
#[cfg(test)]
#[path = "../../tests/support/eventually.rs"]
pub(crate) mod eventually;
