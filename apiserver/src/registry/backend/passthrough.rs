//! The escape hatches `extraArgs` and `extraEnv` of the leader and of member groups.
//!
//! An `extraArgs` entry is one flag token of our store binary, `--flag` or `--flag=value`,
//! checked against the flags `kv-store leader` and `kv-store member` really have (their one
//! definition is `kvcache_store::leader::LeaderConfig` and `kvcache_store::member::MemberConfig`)
//! and parsed as the binary parses it, so a value the process would refuse is refused here.
//! Flags that a spec field (or the runtime) already renders are refused, so an extra argument can
//! never silently override the spec.

use kvcache_api::common::EnvVar;
use kvcache_store::leader::LeaderConfig;
use kvcache_store::member::MemberConfig;

use crate::field::{ErrorList, Path};
use crate::registry::extra_args::{self, first_line};
use crate::registry::validation;

/// Leader flags the runtime renders from the spec (addresses, the ledger and its switch, the
/// allocation strategy, the election and its Lease). The election's timings
/// (`--lease-duration`, `--renew-deadline`, `--retry-period`) are left to `extraArgs`.
const LEADER_DERIVED: &[&str] = &[
    "listen",
    "fast-listen",
    "metrics-listen",
    "multi-tenancy",
    "default-block-size",
    "default-dtype",
    "allocation-strategy",
    "tenant",
    "election",
    "lease",
    "kubeconfig",
    "identity",
    "advertise-host",
    "advertise-fast-port",
];

/// Member flags the runtime renders from the spec and the node (the leader, the capacity, the
/// addresses and the member's name).
const MEMBER_DERIVED: &[&str] = &[
    "leader",
    "kubeconfig",
    "capacity",
    "listen",
    "data-listen",
    "name",
    "shm-dir",
    "advertise-host",
    "metrics-listen",
    // the disk tier is `members[].localDisks`' (refused until the runtimes set it up)
    "tier-dir",
    "tier-capacity",
    "tier-file-size",
    "tier-key-limit",
    "tier-keep-when-full",
    "tier-watermark",
    "tier-lru",
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

/// Checks an `extraArgs` list (`registry/extra_args.rs`) against the flags of `kv-store leader`
/// or `kv-store member`.
pub fn args(side: Side, entries: &[String], field: &Path, errs: &mut ErrorList) {
    let (binary, known, owned) = match side {
        Side::Leader => ("kv-store leader", LeaderConfig::flag_names(), LEADER_DERIVED),
        Side::Member => ("kv-store member", MemberConfig::flag_names(), MEMBER_DERIVED),
    };
    let parse = |entry: &str| parses(side, entry);
    let flags = extra_args::Flags {
        binary,
        form: "--flag or --flag=value",
        known,
        owned,
        owned_by: "",
        parse: &parse,
    };
    extra_args::check(&flags, entries, field, errs);
}

/// Whether `entry` parses and passes the binary's own checks on its own.
fn parses(side: Side, entry: &str) -> Result<(), String> {
    match side {
        Side::Leader => LeaderConfig::parse_args([entry])
            .map_err(first_line)?
            .validate()
            .map_err(|e| e.to_string()),
        Side::Member => {
            // The two required flags are the runtime's; any valid value stands in for them.
            MemberConfig::parse_args(["--leader=127.0.0.1:1", "--capacity=1Gi", entry])
                .map_err(first_line)?
                .validate()
                .map_err(|e| e.to_string())
        }
    }
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
