//! What should run for a managed backend: its leader's flags and one member per (group,
//! matching node), each with the group's `extraArgs` and `extraEnv` applied to the store's own
//! flag definitions (`LeaderConfig`, `MemberConfig`).

use std::collections::BTreeMap;

use kvcache_api::backend::BackendSpec;
use kvcache_store::leader::{AllocationStrategy, LeaderConfig};
use kvcache_store::member::MemberConfig;

use kvcache_api::backend::{ElectionBackend, MemberAddressing};

use crate::runtime::{ElectionPlan, GroupPlan, MemberPlan, Node, StorePlan};

/// What should run for a managed backend on these nodes, and the groups that match no node.
pub fn plan(name: &str, spec: &BackendSpec, nodes: &[Node]) -> Option<(StorePlan, Vec<String>)> {
    let managed = spec.managed()?;
    let leader_spec = managed.leader.clone().unwrap_or_default();
    let mut leader = LeaderConfig {
        multi_tenancy: leader_spec.multi_tenancy.unwrap_or(true),
        ..LeaderConfig::default()
    };
    leader.allocation_strategy = match leader_spec.allocation_strategy {
        Some(kvcache_api::backend::AllocationStrategy::Random) => AllocationStrategy::Random,
        _ => AllocationStrategy::FreeRatioFirst,
    };
    let leader = with_extra_args(leader.to_args(), &leader_spec.extra_args, LeaderConfig::parse_args).unwrap_or(leader);
    let (members, groups, unmatched) = member_plans(&managed.members, nodes);
    // The election is on unless switched off, even at one replica; off means one
    // leader, whatever the count says.
    let election = (leader_spec.election_backend != Some(ElectionBackend::None)).then(|| ElectionPlan {
        replicas: leader_spec.replicas.unwrap_or(1).clamp(1, 5) as u32,
        lease: lease_name(name),
        members_follow_lease: leader_spec.member_addressing == Some(MemberAddressing::Lease),
    });
    Some((
        StorePlan {
            backend: name.to_owned(),
            uid: String::new(),
            image: spec
                .image
                .as_deref()
                .map(str::trim)
                .filter(|i| !i.is_empty())
                .map(str::to_owned),
            pull_policy: spec
                .image_pull_policy
                .and_then(|p| serde_json::to_value(p).ok().and_then(|v| v.as_str().map(str::to_owned))),
            pull_secrets: spec.image_pull_secrets.iter().map(|r| r.name.clone()).collect(),
            existing_only: false,
            leader,
            leader_env: env_pairs(&leader_spec.extra_env),
            members,
            groups,
            election,
            tenant_namespaces: Default::default(),
            clean_tiers_after_delete: managed
                .members
                .iter()
                .filter_map(|g| g.local_disks.first())
                .any(|d| d.clean_after_delete == Some(true)),
        },
        unmatched,
    ))
}

/// One member per (group, matching node) and one plan per group, with the selectors that match
/// no node.
fn member_plans(
    declared: &[kvcache_api::backend::MemberGroup],
    nodes: &[Node],
) -> (Vec<MemberPlan>, Vec<GroupPlan>, Vec<String>) {
    let mut members = Vec::new();
    let mut groups = Vec::new();
    let mut unmatched = Vec::new();
    for (i, group) in declared.iter().enumerate() {
        let selector = group.node_selector.clone().unwrap_or_default();
        let capacity = group
            .capacity_per_member
            .as_ref()
            .and_then(|q| kvcache_units::parse_bytes(q.as_str()).ok())
            .unwrap_or(0);
        let matching: Vec<&Node> = nodes.iter().filter(|n| n.matches(&selector)).collect();
        if matching.is_empty() {
            unmatched.push(format!("members[{i}].nodeSelector {}", selector_text(&selector)));
        }
        let mut base = MemberConfig::new(String::from("127.0.0.1:1"), capacity);
        if let Some(disk) = group.local_disks.first() {
            with_tier(&mut base, disk);
        }
        let config = with_extra_args(base.to_args(), &group.extra_args, MemberConfig::parse_args).unwrap_or(base);
        for node in matching {
            members.push(MemberPlan {
                group: i,
                node: node.name.clone(),
                config: config.clone(),
                env: env_pairs(&group.extra_env),
            });
        }
        groups.push(GroupPlan {
            index: i,
            node_selector: selector,
            config,
            env: env_pairs(&group.extra_env),
            image: group.image.clone(),
        });
    }
    (members, groups, unmatched)
}

/// A member's disk tier flags from its group's `localDisks` entry (the runtime may move the
/// directory: the local runtime keeps every member's under its data directory).
fn with_tier(config: &mut MemberConfig, disk: &kvcache_api::backend::LocalDisk) {
    use kvcache_api::backend::TierEvictionPolicy;
    config.tier_dir = Some(std::path::PathBuf::from(&disk.path));
    config.tier_capacity = disk
        .capacity
        .as_ref()
        .and_then(|q| kvcache_units::parse_bytes(q.as_str()).ok())
        .unwrap_or(0);
    config.tier_key_limit = disk.key_limit.and_then(|n| u64::try_from(n).ok()).unwrap_or(0);
    let eviction = disk.eviction.as_ref();
    config.tier_keep_when_full = eviction.is_some_and(|e| e.enabled == Some(false));
    config.tier_lru = eviction.is_some_and(|e| e.policy == Some(TierEvictionPolicy::Lru));
    config.tier_watermark = eviction
        .and_then(|e| e.watermark.as_ref())
        .and_then(|w| Some((u8::try_from(w.high?).ok()?, u8::try_from(w.low?).ok()?)));
}

/// The namespaces of the Bindings on `backend`'s pools.
pub fn tenant_namespaces(
    backend: &str,
    pools: &[kvcache_api::KVCachePool],
    bindings: &[kvcache_api::KVCachePoolBinding],
) -> std::collections::BTreeSet<String> {
    let on_backend: Vec<&str> = pools
        .iter()
        .filter(|p| p.spec.backend() == Some(backend))
        .filter_map(|p| p.metadata.name.as_deref())
        .collect();
    bindings
        .iter()
        .filter(|b| on_backend.contains(&b.spec.pool_name()))
        .filter_map(|b| b.metadata.namespace.clone())
        .collect()
}

/// The election Lease of a backend: `<backend>-leader`.
pub fn lease_name(backend: &str) -> String {
    format!("{backend}-leader")
}

fn env_pairs(env: &[kvcache_api::common::EnvVar]) -> Vec<(String, String)> {
    env.iter()
        .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
        .collect()
}

fn selector_text(selector: &BTreeMap<String, String>) -> String {
    let pairs: Vec<String> = selector.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("{{{}}}", pairs.join(","))
}

/// `base` (every flag, as `to_args` writes them) with the flags `extra` names replaced by
/// `extra`'s values, parsed back into a config. Admission already checked `extra` against the
/// store's flags; what still fails to parse leaves the config as it was.
fn with_extra_args<C>(
    base: Vec<String>,
    extra: &[String],
    parse: fn(Vec<String>) -> Result<C, clap::Error>,
) -> Option<C> {
    if extra.is_empty() {
        return None;
    }
    let named: Vec<String> = extra
        .iter()
        .filter_map(|a| a.strip_prefix("--"))
        .map(|a| a.split('=').next().unwrap_or(a).to_owned())
        .collect();
    let mut out = Vec::new();
    let mut skip_value = false;
    for a in base {
        if skip_value {
            skip_value = false;
            if !a.starts_with("--") {
                continue;
            }
        }
        if let Some(flag) = a.strip_prefix("--")
            && named.iter().any(|n| n == flag.split('=').next().unwrap_or(flag))
        {
            skip_value = !flag.contains('=');
            continue;
        }
        out.push(a);
    }
    out.extend(extra.iter().cloned());
    parse(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(yaml: &str) -> BackendSpec {
        yaml_serde::from_str(yaml).unwrap()
    }

    #[test]
    fn one_member_per_matching_node_and_group() {
        let s = spec(
            "type: Mooncake\nconnection:\n  managed:\n    leader: {}\n    members:\n    - nodeSelector: {kubernetes.io/os: linux}\n      capacityPerMember: 1Gi\n    - nodeSelector: {kubernetes.io/hostname: local-1}\n      capacityPerMember: 2Gi\n    - nodeSelector: {zone: nowhere}\n      capacityPerMember: 1Gi\n",
        );
        let nodes = [Node::stand_in("local-0"), Node::stand_in("local-1")];
        let (plan, unmatched) = plan("b", &s, &nodes).unwrap();
        let names: Vec<String> = plan.members.iter().map(|m| m.name("b")).collect();
        assert_eq!(
            names,
            ["b-member-0-local-0", "b-member-0-local-1", "b-member-1-local-1"]
        );
        assert_eq!(plan.members[2].config.capacity, 2 << 30);
        assert_eq!(unmatched, ["members[2].nodeSelector {zone=nowhere}"]);
        assert!(plan.leader.multi_tenancy);
        let e = plan
            .election
            .expect("the election is on by default, at one replica too");
        assert_eq!(
            (e.replicas, e.lease.as_str(), e.members_follow_lease),
            (1, "b-leader", false)
        );
    }

    #[test]
    fn the_election_follows_the_switches() {
        let three = spec(
            "type: Mooncake\nconnection:\n  managed:\n    leader:\n      replicas: 3\n      memberAddressing: Lease\n    members: []\n",
        );
        let e = plan("b", &three, &[]).unwrap().0.election.unwrap();
        assert_eq!((e.replicas, e.members_follow_lease), (3, true));
        let off = spec(
            "type: Mooncake\nconnection:\n  managed:\n    leader:\n      electionBackend: None\n    members: []\n",
        );
        assert_eq!(plan("b", &off, &[]).unwrap().0.election, None);
    }

    #[test]
    fn extra_args_replace_the_flags_they_name() {
        let s = spec(
            "type: Mooncake\nconnection:\n  managed:\n    leader:\n      multiTenancy: false\n      extraArgs: [\"--lease-ttl\", \"3s\", \"--eviction-ratio=0.2\"]\n    members: []\n",
        );
        let (plan, _) = plan("b", &s, &[]).unwrap();
        assert_eq!(plan.leader.read_lease_ttl, std::time::Duration::from_secs(3));
        assert!((plan.leader.eviction_ratio - 0.2).abs() < 1e-9);
        assert!(!plan.leader.multi_tenancy);
    }
}
