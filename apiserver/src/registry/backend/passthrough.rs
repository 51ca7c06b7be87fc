//! The escape hatches `extraArgs` and `extraEnv` of the leader and of member groups.
//!
//! An entry is one flag token (`-flag` or `-flag=value`). Keys that a spec field already renders
//! (derived) are refused, so an extra argument can never silently override the spec; keys whose
//! effect would break the store are refused with their own reason. The tables name the store's
//! flags in the reference's (Mooncake) spelling, which is what manifests written for the
//! reference carry.

use kvcache_api::common::EnvVar;

use crate::registry::field::{ErrorList, Path};
use crate::registry::validation;

/// Leader flags a spec field renders.
const LEADER_DERIVED: &[&str] = &[
    "allocation_strategy",
    "cluster_id",
    "enable_ha",
    "ha_backend_connstring",
    "ha_backend_type",
    "rpc_address",
    "rpc_interface",
    "enable_offload",
    "offload_on_evict",
    "enable_multi_tenants",
    "tenant_quota_connector_uri",
    "metrics_port",
    "pod_name",
    "pod_namespace",
    "rpc_port",
];

/// Leader flags refused with their own reason.
const LEADER_FORBIDDEN: &[(&str, &str)] = &[
    (
        "enable_oplog",
        "the operation log needs an etcd election backend, which cannot run beside the Kubernetes Lease election, so the leader would not start",
    ),
    (
        "etcd_endpoints",
        "etcd is not used by this store: the election runs on a Kubernetes Lease",
    ),
    (
        "config_path",
        "a configuration file makes the leader ignore most command-line flags, so every setting derived from this spec would be dropped silently",
    ),
    (
        "tenant_quota_connector_type",
        "quota policies are delivered by the operator's connector; another connector leaves the per-tenant quotas unread",
    ),
    (
        "enable_cxl",
        "the CXL allocator replaces the allocation strategy and advertises capacity that may not exist",
    ),
    ("cxl_path", "it is read only with enable_cxl, which is refused"),
    ("cxl_size", "it is read only with enable_cxl, which is refused"),
    (
        "port",
        "it is a deprecated alias of rpc_port, which always wins, so it would change nothing while looking like a change",
    ),
    (
        "enable_snapshot",
        "snapshots are not offered: a restored snapshot can serve another key's bytes instead of a miss",
    ),
    (
        "enable_snapshot_restore",
        "snapshots are not offered: a restored snapshot can serve another key's bytes instead of a miss",
    ),
    (
        "memory_allocator",
        "it moves the store off the allocator these rules were made for",
    ),
];

/// Member configuration keys a spec field renders.
const MEMBER_DERIVED: &[&str] = &[
    "enable_ssd_offload",
    "ssd_offload_path",
    "global_segment_size",
    "local_buffer_size",
    "local_hostname",
    "master_server_address",
    "metadata_server",
    "protocol",
];

/// Leader environment variables the operator sets.
const LEADER_ENV_DERIVED: &[&str] = &["KUBERNETES_POD_NAME", "KUBERNETES_POD_NAMESPACE", "KUBERNETES_POD_IP"];

/// Member environment variables the operator sets (plus every `MOONCAKE_OFFLOAD_*`).
const MEMBER_ENV_DERIVED: &[&str] = &[
    "MOONCAKE_TE_META_DATA_SERVER",
    "MOONCAKE_MASTER",
    "MOONCAKE_PROTOCOL",
    "MOONCAKE_LOCAL_HOSTNAME",
    "MOONCAKE_GLOBAL_SEGMENT_SIZE",
    "MOONCAKE_LOCAL_BUFFER_SIZE",
    "MC_TE_METRIC",
    // Device visibility is set to `void` on DRAM groups (the only medium supported yet).
    "NVIDIA_VISIBLE_DEVICES",
    "AMD_VISIBLE_DEVICES",
    "CAMBRICON_VISIBLE_DEVICES",
    "IX_VISIBLE_DEVICES",
    "MTHREADS_VISIBLE_DEVICES",
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Leader,
    Member,
}

/// Checks an `extraArgs` list.
pub fn args(side: Side, entries: &[String], field: &Path, errs: &mut ErrorList) {
    let mut seen: Vec<&str> = Vec::new();
    for (i, entry) in entries.iter().enumerate() {
        let p = field.index(i);
        if !entry.starts_with('-') {
            errs.invalid(
                &p,
                entry,
                "each entry is a single flag token such as -flag or -flag=value; a value that starts with a dash goes after '=' in the same token",
            );
            continue;
        }
        let key = entry.trim_start_matches('-');
        let key = key.split_once('=').map_or(key, |(k, _)| k);
        if key.is_empty() || key.chars().any(char::is_whitespace) {
            errs.invalid(&p, entry, "the flag name must be non-empty and contain no whitespace");
            continue;
        }
        if seen.contains(&key) {
            errs.duplicate(
                &p,
                entry,
                format!("the flag {key:?} is already given by an earlier entry"),
            );
            continue;
        }
        seen.push(key);
        match side {
            Side::Leader => {
                if let Some((_, why)) = LEADER_FORBIDDEN.iter().find(|(k, _)| *k == key) {
                    errs.forbidden(&p, format!("the flag {key:?} is not allowed: {why}"));
                } else if key.starts_with("snapshot_") {
                    errs.forbidden(
                        &p,
                        format!("the flag {key:?} is not allowed: snapshot flags are read only with enable_snapshot, which is refused"),
                    );
                } else if LEADER_DERIVED.contains(&key) {
                    errs.forbidden(&p, derived_message(key));
                }
            }
            Side::Member => {
                if MEMBER_DERIVED.contains(&key) {
                    errs.forbidden(&p, derived_message(key));
                }
            }
        }
    }
}

fn derived_message(key: &str) -> String {
    format!("the flag {key:?} is set by the operator from this spec; change the spec field that renders it instead")
}

/// Checks an `extraEnv` list.
pub fn env(side: Side, entries: &[EnvVar], field: &Path, errs: &mut ErrorList) {
    let mut seen: Vec<&str> = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        let p = field.index(i);
        if e.name.is_empty() {
            errs.required(&p.child("name"), "an environment variable needs a name");
            continue;
        }
        if let Err(msg) = validation::c_identifier(&e.name) {
            errs.invalid(&p.child("name"), &e.name, msg);
            continue;
        }
        if seen.contains(&e.name.as_str()) {
            errs.duplicate(&p.child("name"), &e.name, "each name may appear once");
            continue;
        }
        seen.push(&e.name);
        if e.value.is_none() {
            errs.required(&p.child("value"), "give a value (it may be empty)");
        }
        let derived = match side {
            Side::Leader => LEADER_ENV_DERIVED.contains(&e.name.as_str()),
            Side::Member => MEMBER_ENV_DERIVED.contains(&e.name.as_str()) || e.name.starts_with("MOONCAKE_OFFLOAD_"),
        };
        if derived {
            errs.forbidden(
                &p.child("name"),
                format!("{:?} is set by the operator and cannot be overridden", e.name),
            );
        }
    }
}
