//! Admission table of `KVCacheBackend`. On create: the connection (managed or external, not both),
//! names and their lengths, images and pull secrets, external endpoints, leader replicas and the
//! election, `extraArgs` checked against the store's own flags (those the server derives
//! refused), env the server sets refused, member groups, capacities, media, transports and
//! hostPaths. On update: groups keep their index and medium
//! (appending, removing the last, widening a selector and editing capacity are fine), a managed
//! backend does not become external, and multi-tenancy is not withdrawn while pools use it.

use kvcache_api::backend::{BackendSpec, KVCacheBackend};
use kvcache_api::common::UsedBy;
use serde_json::{Value, json};

use crate::config::Config;
use crate::field::ErrorType::{self, *};
use crate::registry::generic::{DeleteOptions, WriteOptions};
use crate::registry::testing::{Expect, Harness, check, decode, registries, remove, render_refuses_alike, set};
use crate::registry::{RegistryError, encode};
use crate::storage::{Op, Txn, keys};

type Edit = fn(&mut Value);

fn base() -> Value {
    json!({
        "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCacheBackend",
        "metadata": {"name": "mooncake-dram"},
        "spec": {"type": "Mooncake", "connection": {"managed": {"leader": {}, "members": [
            {"nodeSelector": {"kubernetes.io/os": "linux"}, "medium": "DRAM", "capacityPerMember": "8Gi"}
        ]}}}
    })
}

fn external(v: &mut Value) {
    set(
        v,
        "/spec/connection",
        json!({"external": {"endpoints": [
            {"name": "Client", "address": "store.example:50051"},
            {"name": "Admin", "address": "store.example:9003"}
        ]}}),
    );
}

/// Gives the first group a disk tier.
fn tier(v: &mut Value, disk: Value) {
    set(v, "/spec/connection/managed/members/0/localDisks", json!([disk]));
}

fn group(name: &str) -> Value {
    json!({"nodeSelector": {"pool": name}, "medium": "DRAM", "capacityPerMember": "1Gi"})
}

fn refused(kind: ErrorType, field: &'static str) -> Expect {
    Expect::Refused(kind, field)
}

async fn create(h: &Harness, v: &Value) -> Result<(KVCacheBackend, Vec<String>), RegistryError> {
    let obj = decode::<BackendSpec>(v)?;
    h.reg
        .backends
        .create("", obj, WriteOptions::default())
        .await
        .map(|w| (w.object, w.warnings))
}

fn create_cases() -> Vec<(&'static str, Edit, Expect)> {
    vec![
        ("walkthrough backend", |_| {}, Expect::Admitted),
        (
            "neither managed nor external",
            |v| set(v, "/spec/connection", json!({})),
            refused(Required, "spec.connection"),
        ),
        (
            "connection missing",
            |v| remove(v, "/spec/connection"),
            refused(Required, "spec.connection"),
        ),
        (
            "both managed and external",
            |v| set(v, "/spec/connection/external", json!({"endpoints": []})),
            refused(Forbidden, "spec.connection"),
        ),
        (
            "managed name with a dot",
            |v| set(v, "/metadata/name", json!("a.b")),
            refused(Invalid, "metadata.name"),
        ),
        (
            "external name with a dot",
            |v| {
                set(v, "/metadata/name", json!("a.b"));
                external(v)
            },
            Expect::Admitted,
        ),
        (
            "managed name starting with a digit",
            |v| set(v, "/metadata/name", json!("1store")),
            refused(Invalid, "metadata.name"),
        ),
        (
            "55-character name, one group",
            |v| set(v, "/metadata/name", json!("a".repeat(55))),
            refused(Invalid, "metadata.name"),
        ),
        (
            "54-character name, one group",
            |v| set(v, "/metadata/name", json!("a".repeat(54))),
            Expect::Admitted,
        ),
        (
            "54-character name, eleven groups",
            |v| {
                set(v, "/metadata/name", json!("a".repeat(54)));
                set(
                    v,
                    "/spec/connection/managed/members",
                    Value::Array((0..11).map(|i| group(&i.to_string())).collect()),
                );
            },
            refused(Invalid, "metadata.name"),
        ),
        (
            "53-character name, eleven groups",
            |v| {
                set(v, "/metadata/name", json!("a".repeat(53)));
                set(
                    v,
                    "/spec/connection/managed/members",
                    Value::Array((0..11).map(|i| group(&i.to_string())).collect()),
                );
            },
            Expect::Admitted,
        ),
        (
            "blank image",
            |v| set(v, "/spec/image", json!("   ")),
            refused(Invalid, "spec.image"),
        ),
        (
            "malformed image",
            |v| set(v, "/spec/image", json!("not a valid image!")),
            refused(Invalid, "spec.image"),
        ),
        (
            "image longer than 512",
            |v| set(v, "/spec/image", json!(format!("r/{}", "a".repeat(512)))),
            refused(TooLong, "spec.image"),
        ),
        (
            "valid image",
            |v| set(v, "/spec/image", json!("registry.example.com:5000/store/leader:1.0")),
            Expect::Admitted,
        ),
        (
            "blank member image",
            |v| set(v, "/spec/connection/managed/members/0/image", json!(" ")),
            refused(Invalid, "spec.connection.managed.members[0].image"),
        ),
        (
            "pull secret without a name",
            |v| set(v, "/spec/imagePullSecrets", json!([{}])),
            refused(Required, "spec.imagePullSecrets[0].name"),
        ),
        (
            "pull secret with a bad name",
            |v| set(v, "/spec/imagePullSecrets", json!([{"name": "Bad_Name"}])),
            refused(Invalid, "spec.imagePullSecrets[0].name"),
        ),
        (
            "33 pull secrets",
            |v| {
                set(
                    v,
                    "/spec/imagePullSecrets",
                    Value::Array((0..33).map(|i| json!({"name": format!("s{i}")})).collect()),
                )
            },
            refused(TooMany, "spec.imagePullSecrets"),
        ),
        (
            "external with only Client",
            |v| {
                external(v);
                remove(v, "/spec/connection/external/endpoints/1");
            },
            refused(Required, "spec.connection.external.endpoints"),
        ),
        (
            "external with only Admin",
            |v| {
                external(v);
                remove(v, "/spec/connection/external/endpoints/0");
            },
            refused(Required, "spec.connection.external.endpoints"),
        ),
        (
            "external with duplicate names",
            |v| {
                external(v);
                set(v, "/spec/connection/external/endpoints/1/name", json!("Client"));
            },
            refused(Duplicate, "spec.connection.external.endpoints[1].name"),
        ),
        (
            "external endpoint named Other",
            |v| {
                external(v);
                set(v, "/spec/connection/external/endpoints/1/name", json!("Other"));
            },
            refused(NotSupported, "spec.connection.external.endpoints[1].name"),
        ),
        (
            "external address missing",
            |v| {
                external(v);
                set(v, "/spec/connection/external/endpoints/0/address", json!(""));
            },
            refused(Required, "spec.connection.external.endpoints[0].address"),
        ),
        (
            "external address of 260 characters",
            |v| {
                external(v);
                set(
                    v,
                    "/spec/connection/external/endpoints/0/address",
                    json!(format!("{}:1", "h".repeat(258))),
                );
            },
            refused(TooLong, "spec.connection.external.endpoints[0].address"),
        ),
        (
            "external IPv6 and DNS addresses",
            |v| {
                external(v);
                set(v, "/spec/connection/external/endpoints/0/address", json!("[::1]:9003"));
                set(
                    v,
                    "/spec/connection/external/endpoints/1/address",
                    json!("h.example:50051"),
                );
            },
            Expect::Admitted,
        ),
        (
            "leader replicas 6",
            |v| set(v, "/spec/connection/managed/leader/replicas", json!(6)),
            refused(Invalid, "spec.connection.managed.leader.replicas"),
        ),
        (
            "leader replicas 0",
            |v| set(v, "/spec/connection/managed/leader/replicas", json!(0)),
            refused(Invalid, "spec.connection.managed.leader.replicas"),
        ),
        (
            "three replicas without election",
            |v| {
                set(
                    v,
                    "/spec/connection/managed/leader",
                    json!({"replicas": 3, "electionBackend": "None"}),
                )
            },
            refused(Invalid, "spec.connection.managed.leader.replicas"),
        ),
        (
            "three replicas with election",
            |v| {
                set(
                    v,
                    "/spec/connection/managed/leader",
                    json!({"replicas": 3, "electionBackend": "Kubernetes"}),
                )
            },
            Expect::Admitted,
        ),
        (
            "leader missing",
            |v| remove(v, "/spec/connection/managed/leader"),
            refused(Required, "spec.connection.managed.leader"),
        ),
        (
            "election backend outside its set",
            |v| set(v, "/spec/connection/managed/leader/electionBackend", json!("Etcd")),
            refused(NotSupported, "spec.connection.managed.leader.electionBackend"),
        ),
        (
            "member addressing outside its set",
            |v| set(v, "/spec/connection/managed/leader/memberAddressing", json!("DNS")),
            refused(NotSupported, "spec.connection.managed.leader.memberAddressing"),
        ),
        (
            "allocation strategy outside its set",
            |v| {
                set(
                    v,
                    "/spec/connection/managed/leader/allocationStrategy",
                    json!("RoundRobin"),
                )
            },
            refused(NotSupported, "spec.connection.managed.leader.allocationStrategy"),
        ),
        (
            "type outside its set",
            |v| set(v, "/spec/type", json!("Redis")),
            refused(NotSupported, "spec.type"),
        ),
        (
            "extraArgs entry without dashes",
            |v| set(v, "/spec/connection/managed/leader/extraArgs", json!(["lease-ttl=5s"])),
            refused(Invalid, "spec.connection.managed.leader.extraArgs[0]"),
        ),
        (
            "extraArgs in the reference's single-dash spelling",
            |v| {
                set(
                    v,
                    "/spec/connection/managed/leader/extraArgs",
                    json!(["-rpc_timeout=5000"]),
                )
            },
            refused(Invalid, "spec.connection.managed.leader.extraArgs[0]"),
        ),
        (
            "extraArgs value as its own entry",
            |v| {
                set(
                    v,
                    "/spec/connection/managed/leader/extraArgs",
                    json!(["--lease-ttl", "20s"]),
                )
            },
            refused(Invalid, "spec.connection.managed.leader.extraArgs[0]"),
        ),
        (
            "extraArgs duplicate flag",
            |v| {
                set(
                    v,
                    "/spec/connection/managed/leader/extraArgs",
                    json!(["--lease-ttl=5s", "--lease-ttl=6s"]),
                )
            },
            refused(Duplicate, "spec.connection.managed.leader.extraArgs[1]"),
        ),
        (
            "extraArgs empty flag",
            |v| set(v, "/spec/connection/managed/leader/extraArgs", json!(["--=1"])),
            refused(Invalid, "spec.connection.managed.leader.extraArgs[0]"),
        ),
        (
            "leader flag the binary does not have",
            |v| {
                set(
                    v,
                    "/spec/connection/managed/leader/extraArgs",
                    json!(["--enable-snapshot"]),
                )
            },
            refused(Invalid, "spec.connection.managed.leader.extraArgs[0]"),
        ),
        (
            "leader flag of the reference store",
            |v| set(v, "/spec/connection/managed/leader/extraArgs", json!(["--rpc_port=1"])),
            refused(Invalid, "spec.connection.managed.leader.extraArgs[0]"),
        ),
        (
            "leader value the binary refuses",
            |v| {
                set(
                    v,
                    "/spec/connection/managed/leader/extraArgs",
                    json!(["--lease-ttl=soon"]),
                )
            },
            refused(Invalid, "spec.connection.managed.leader.extraArgs[0]"),
        ),
        (
            "leader value its checks refuse",
            |v| {
                set(
                    v,
                    "/spec/connection/managed/leader/extraArgs",
                    json!(["--high-watermark=1.5"]),
                )
            },
            refused(Invalid, "spec.connection.managed.leader.extraArgs[0]"),
        ),
        (
            "derived --listen",
            |v| {
                set(
                    v,
                    "/spec/connection/managed/leader/extraArgs",
                    json!(["--listen=0.0.0.0:1"]),
                )
            },
            refused(Forbidden, "spec.connection.managed.leader.extraArgs[0]"),
        ),
        (
            "derived --multi-tenancy",
            |v| {
                set(
                    v,
                    "/spec/connection/managed/leader/extraArgs",
                    json!(["--multi-tenancy=false"]),
                )
            },
            refused(Forbidden, "spec.connection.managed.leader.extraArgs[0]"),
        ),
        (
            "derived --tenant",
            |v| {
                set(
                    v,
                    "/spec/connection/managed/leader/extraArgs",
                    json!(["--tenant=a=1Gi:64:bfloat16"]),
                )
            },
            refused(Forbidden, "spec.connection.managed.leader.extraArgs[0]"),
        ),
        (
            "derived --allocation-strategy",
            |v| {
                set(
                    v,
                    "/spec/connection/managed/leader/extraArgs",
                    json!(["--allocation-strategy=random"]),
                )
            },
            refused(Forbidden, "spec.connection.managed.leader.extraArgs[0]"),
        ),
        (
            "settable leader flags",
            |v| {
                set(
                    v,
                    "/spec/connection/managed/leader/extraArgs",
                    json!([
                        "--lease-ttl=20s",
                        "--member-ttl=30s",
                        "--max-value-size=128Mi",
                        "--high-watermark=0.8",
                        "--spin=0"
                    ]),
                )
            },
            Expect::Admitted,
        ),
        (
            "member derived --capacity",
            |v| {
                set(
                    v,
                    "/spec/connection/managed/members/0/extraArgs",
                    json!(["--capacity=1Gi"]),
                )
            },
            refused(Forbidden, "spec.connection.managed.members[0].extraArgs[0]"),
        ),
        (
            "member derived --name",
            |v| set(v, "/spec/connection/managed/members/0/extraArgs", json!(["--name=n"])),
            refused(Forbidden, "spec.connection.managed.members[0].extraArgs[0]"),
        ),
        (
            "member flag of the reference store",
            |v| {
                set(
                    v,
                    "/spec/connection/managed/members/0/extraArgs",
                    json!(["--protocol=rdma"]),
                )
            },
            refused(Invalid, "spec.connection.managed.members[0].extraArgs[0]"),
        ),
        (
            "member value the binary refuses",
            |v| {
                set(
                    v,
                    "/spec/connection/managed/members/0/extraArgs",
                    json!(["--no-prefault=maybe"]),
                )
            },
            refused(Invalid, "spec.connection.managed.members[0].extraArgs[0]"),
        ),
        (
            "settable member flags",
            |v| {
                set(
                    v,
                    "/spec/connection/managed/members/0/extraArgs",
                    json!(["--no-prefault", "--max-value-size=16Mi", "--spin=100us"]),
                )
            },
            Expect::Admitted,
        ),
        (
            "member env MOONCAKE_MASTER",
            |v| {
                set(
                    v,
                    "/spec/connection/managed/members/0/extraEnv",
                    json!([{"name": "MOONCAKE_MASTER", "value": "x"}]),
                )
            },
            refused(Forbidden, "spec.connection.managed.members[0].extraEnv[0].name"),
        ),
        (
            "member env MC_TE_METRIC",
            |v| {
                set(
                    v,
                    "/spec/connection/managed/members/0/extraEnv",
                    json!([{"name": "MC_TE_METRIC", "value": "0"}]),
                )
            },
            refused(Forbidden, "spec.connection.managed.members[0].extraEnv[0].name"),
        ),
        (
            "member env MOONCAKE_OFFLOAD_*",
            |v| {
                set(
                    v,
                    "/spec/connection/managed/members/0/extraEnv",
                    json!([{"name": "MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT", "value": "1"}]),
                )
            },
            refused(Forbidden, "spec.connection.managed.members[0].extraEnv[0].name"),
        ),
        (
            "member env NVIDIA_VISIBLE_DEVICES on DRAM",
            |v| {
                set(
                    v,
                    "/spec/connection/managed/members/0/extraEnv",
                    json!([{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]),
                )
            },
            refused(Forbidden, "spec.connection.managed.members[0].extraEnv[0].name"),
        ),
        (
            "leader env KUBERNETES_POD_IP",
            |v| {
                set(
                    v,
                    "/spec/connection/managed/leader/extraEnv",
                    json!([{"name": "KUBERNETES_POD_IP", "value": "x"}]),
                )
            },
            refused(Forbidden, "spec.connection.managed.leader.extraEnv[0].name"),
        ),
        (
            "env name 1BAD",
            |v| {
                set(
                    v,
                    "/spec/connection/managed/leader/extraEnv",
                    json!([{"name": "1BAD", "value": "x"}]),
                )
            },
            refused(Invalid, "spec.connection.managed.leader.extraEnv[0].name"),
        ),
        (
            "duplicate env names",
            |v| {
                set(
                    v,
                    "/spec/connection/managed/leader/extraEnv",
                    json!([{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]),
                )
            },
            refused(Duplicate, "spec.connection.managed.leader.extraEnv[1].name"),
        ),
        (
            "env without a value",
            |v| set(v, "/spec/connection/managed/leader/extraEnv", json!([{"name": "A"}])),
            refused(Required, "spec.connection.managed.leader.extraEnv[0].value"),
        ),
        (
            "capacity 0",
            |v| set(v, "/spec/connection/managed/members/0/capacityPerMember", json!("0")),
            refused(Invalid, "spec.connection.managed.members[0].capacityPerMember"),
        ),
        (
            "capacity -1Gi",
            |v| set(v, "/spec/connection/managed/members/0/capacityPerMember", json!("-1Gi")),
            refused(Invalid, "spec.connection.managed.members[0].capacityPerMember"),
        ),
        (
            "capacity 9Ei overflows",
            |v| set(v, "/spec/connection/managed/members/0/capacityPerMember", json!("9Ei")),
            refused(Invalid, "spec.connection.managed.members[0].capacityPerMember"),
        ),
        (
            "capacity malformed",
            |v| set(v, "/spec/connection/managed/members/0/capacityPerMember", json!("8 GB")),
            refused(Invalid, "spec.connection.managed.members[0].capacityPerMember"),
        ),
        (
            "capacity as a plain number",
            |v| {
                set(
                    v,
                    "/spec/connection/managed/members/0/capacityPerMember",
                    json!(8589934592u64),
                )
            },
            Expect::Admitted,
        ),
        (
            "capacity missing",
            |v| remove(v, "/spec/connection/managed/members/0/capacityPerMember"),
            refused(Required, "spec.connection.managed.members[0].capacityPerMember"),
        ),
        (
            "local buffer -1",
            |v| set(v, "/spec/connection/managed/members/0/localBufferSize", json!("-1")),
            refused(Invalid, "spec.connection.managed.members[0].localBufferSize"),
        ),
        (
            "medium missing",
            |v| remove(v, "/spec/connection/managed/members/0/medium"),
            refused(Required, "spec.connection.managed.members[0].medium"),
        ),
        (
            "medium VRAM (not supported yet)",
            |v| set(v, "/spec/connection/managed/members/0/medium", json!("VRAM")),
            refused(Forbidden, "spec.connection.managed.members[0].medium"),
        ),
        (
            "medium LocalDisk (former value)",
            |v| set(v, "/spec/connection/managed/members/0/medium", json!("LocalDisk")),
            refused(NotSupported, "spec.connection.managed.members[0].medium"),
        ),
        (
            "node selector missing",
            |v| remove(v, "/spec/connection/managed/members/0/nodeSelector"),
            refused(Required, "spec.connection.managed.members[0].nodeSelector"),
        ),
        (
            "node selector {} selects every node",
            |v| set(v, "/spec/connection/managed/members/0/nodeSelector", json!({})),
            Expect::Admitted,
        ),
        (
            "node selector bad key",
            |v| {
                set(
                    v,
                    "/spec/connection/managed/members/0/nodeSelector",
                    json!({"bad key": "x"}),
                )
            },
            refused(Invalid, "spec.connection.managed.members[0].nodeSelector"),
        ),
        (
            "node selector bad value",
            |v| set(v, "/spec/connection/managed/members/0/nodeSelector", json!({"k": "-x"})),
            refused(Invalid, "spec.connection.managed.members[0].nodeSelector[k]"),
        ),
        (
            "no member groups",
            |v| set(v, "/spec/connection/managed/members", json!([])),
            refused(Required, "spec.connection.managed.members"),
        ),
        (
            "33 member groups",
            |v| {
                set(v, "/metadata/name", json!("s"));
                set(
                    v,
                    "/spec/connection/managed/members",
                    Value::Array((0..33).map(|i| group(&i.to_string())).collect()),
                );
            },
            refused(TooMany, "spec.connection.managed.members"),
        ),
        (
            "a disk tier",
            |v| tier(v, json!({"path": "/mnt/nvme/kvcache"})),
            Expect::Admitted,
        ),
        (
            "a disk tier with every field",
            |v| {
                tier(
                    v,
                    json!({"path": "/mnt/nvme/kvcache", "capacity": "4Ti", "keyLimit": 10000000,
                           "eviction": {"enabled": true, "policy": "LRU", "watermark": {"high": 90, "low": 80}},
                           "cleanAfterDelete": true}),
                )
            },
            Expect::Warned("cleanAfterDelete"),
        ),
        (
            "a tier without a path",
            |v| tier(v, json!({"path": "  "})),
            refused(Required, "spec.connection.managed.members[0].localDisks[0].path"),
        ),
        (
            "a relative tier path",
            |v| tier(v, json!({"path": "var/cache"})),
            refused(Invalid, "spec.connection.managed.members[0].localDisks[0].path"),
        ),
        (
            "a tier path with ..",
            |v| tier(v, json!({"path": "/mnt/../etc"})),
            refused(Invalid, "spec.connection.managed.members[0].localDisks[0].path"),
        ),
        (
            "a tier path with a trailing space",
            |v| tier(v, json!({"path": "/mnt/cache "})),
            refused(Invalid, "spec.connection.managed.members[0].localDisks[0].path"),
        ),
        (
            "the root as a tier",
            |v| tier(v, json!({"path": "/"})),
            refused(Invalid, "spec.connection.managed.members[0].localDisks[0].path"),
        ),
        (
            "a tier in /dev/infiniband",
            |v| tier(v, json!({"path": "/dev/infiniband/x"})),
            refused(Invalid, "spec.connection.managed.members[0].localDisks[0].path"),
        ),
        (
            "a tier of 1Mi",
            |v| tier(v, json!({"path": "/t", "capacity": "1Mi"})),
            refused(Invalid, "spec.connection.managed.members[0].localDisks[0].capacity"),
        ),
        (
            "a key limit of 10",
            |v| tier(v, json!({"path": "/t", "keyLimit": 10})),
            refused(Invalid, "spec.connection.managed.members[0].localDisks[0].keyLimit"),
        ),
        (
            "a negative key limit",
            |v| tier(v, json!({"path": "/t", "keyLimit": -1})),
            refused(Invalid, "spec.connection.managed.members[0].localDisks[0].keyLimit"),
        ),
        (
            "a policy with eviction off",
            |v| {
                tier(
                    v,
                    json!({"path": "/t", "eviction": {"enabled": false, "policy": "FIFO"}}),
                )
            },
            refused(
                Forbidden,
                "spec.connection.managed.members[0].localDisks[0].eviction.policy",
            ),
        ),
        (
            "a watermark with eviction off",
            |v| {
                tier(
                    v,
                    json!({"path": "/t", "capacity": "1Gi", "eviction": {"enabled": false, "watermark": {"high": 90, "low": 80}}}),
                )
            },
            refused(
                Forbidden,
                "spec.connection.managed.members[0].localDisks[0].eviction.watermark",
            ),
        ),
        (
            "a watermark without a capacity",
            |v| {
                tier(
                    v,
                    json!({"path": "/t", "eviction": {"watermark": {"high": 90, "low": 80}}}),
                )
            },
            refused(Required, "spec.connection.managed.members[0].localDisks[0].capacity"),
        ),
        (
            "a low mark above the high one",
            |v| {
                tier(
                    v,
                    json!({"path": "/t", "capacity": "1Gi", "eviction": {"watermark": {"high": 50, "low": 80}}}),
                )
            },
            refused(
                Invalid,
                "spec.connection.managed.members[0].localDisks[0].eviction.watermark.low",
            ),
        ),
        (
            "a watermark without its low mark",
            |v| {
                tier(
                    v,
                    json!({"path": "/t", "capacity": "1Gi", "eviction": {"watermark": {"high": 50}}}),
                )
            },
            refused(
                Required,
                "spec.connection.managed.members[0].localDisks[0].eviction.watermark.low",
            ),
        ),
        (
            "a high mark of 101",
            |v| {
                tier(
                    v,
                    json!({"path": "/t", "capacity": "1Gi", "eviction": {"watermark": {"high": 101, "low": 80}}}),
                )
            },
            refused(
                Invalid,
                "spec.connection.managed.members[0].localDisks[0].eviction.watermark.high",
            ),
        ),
        (
            "an unknown eviction policy",
            |v| tier(v, json!({"path": "/t", "eviction": {"policy": "random"}})),
            refused(
                NotSupported,
                "spec.connection.managed.members[0].localDisks[0].eviction.policy",
            ),
        ),
        (
            "two tiers in a group",
            |v| {
                set(
                    v,
                    "/spec/connection/managed/members/0/localDisks",
                    json!([{"path": "/a"}, {"path": "/b"}]),
                )
            },
            refused(TooMany, "spec.connection.managed.members[0].localDisks"),
        ),
        (
            "a tier in a second group",
            |v| {
                tier(v, json!({"path": "/a"}));
                set(v, "/spec/connection/managed/members/1", group("b"));
                set(
                    v,
                    "/spec/connection/managed/members/1/localDisks",
                    json!([{"path": "/b"}]),
                );
            },
            refused(Forbidden, "spec.connection.managed.members[1].localDisks"),
        ),
        (
            "a tier over an 8Mi segment",
            |v| {
                tier(v, json!({"path": "/t"}));
                set(v, "/spec/connection/managed/members/0/capacityPerMember", json!("8Mi"));
            },
            refused(Invalid, "spec.connection.managed.members[0].capacityPerMember"),
        ),
        (
            "a host path mounted over the tier",
            |v| {
                tier(v, json!({"path": "/mnt/nvme"}));
                set(
                    v,
                    "/spec/connection/managed/members/0/hostPaths",
                    json!([{"path": "/x", "mountPath": "/mnt/nvme/sub"}]),
                );
            },
            refused(Invalid, "spec.connection.managed.members[0].hostPaths[0].mountPath"),
        ),
        (
            "RDMA transport (not supported yet)",
            |v| set(v, "/spec/transport/protocol", json!("RDMA")),
            refused(Forbidden, "spec.transport.protocol"),
        ),
        (
            "old spelling HIP",
            |v| set(v, "/spec/transport/protocol", json!("HIP")),
            refused(NotSupported, "spec.transport.protocol"),
        ),
        (
            "lowercase tcp",
            |v| set(v, "/spec/transport/protocol", json!("tcp")),
            refused(NotSupported, "spec.transport.protocol"),
        ),
        (
            "TCP transport",
            |v| set(v, "/spec/transport/protocol", json!("TCP")),
            Expect::Admitted,
        ),
        (
            "member EFA transport (not supported yet)",
            |v| {
                set(
                    v,
                    "/spec/connection/managed/members/0/transport",
                    json!({"protocol": "EFA"}),
                )
            },
            refused(Forbidden, "spec.connection.managed.members[0].transport.protocol"),
        ),
        (
            "nested hostPath mounts",
            |v| {
                set(
                    v,
                    "/spec/connection/managed/members/0/hostPaths",
                    json!([
                {"path": "/a", "mountPath": "/a"}, {"path": "/b", "mountPath": "/a/b"}]),
                )
            },
            refused(Invalid, "spec.connection.managed.members[0].hostPaths[1].mountPath"),
        ),
        (
            "hostPath over /dev/infiniband",
            |v| {
                set(
                    v,
                    "/spec/connection/managed/members/0/hostPaths",
                    json!([{"path": "/x", "mountPath": "/dev/infiniband"}]),
                )
            },
            refused(Forbidden, "spec.connection.managed.members[0].hostPaths[0].mountPath"),
        ),
        (
            "hostPath with a trailing slash",
            |v| {
                set(
                    v,
                    "/spec/connection/managed/members/0/hostPaths",
                    json!([{"path": "/x/", "mountPath": "/y"}]),
                )
            },
            refused(Invalid, "spec.connection.managed.members[0].hostPaths[0].path"),
        ),
        (
            "hostPath relative",
            |v| {
                set(
                    v,
                    "/spec/connection/managed/members/0/hostPaths",
                    json!([{"path": "x", "mountPath": "/y"}]),
                )
            },
            refused(Invalid, "spec.connection.managed.members[0].hostPaths[0].path"),
        ),
        (
            "hostPath type outside its set",
            |v| {
                set(
                    v,
                    "/spec/connection/managed/members/0/hostPaths",
                    json!([{"path": "/x", "mountPath": "/y", "type": "Pipe"}]),
                )
            },
            refused(NotSupported, "spec.connection.managed.members[0].hostPaths[0].type"),
        ),
        (
            "hostPath /dev/infiniband-cache is fine",
            |v| {
                set(
                    v,
                    "/spec/connection/managed/members/0/hostPaths",
                    json!([{"path": "/x", "mountPath": "/dev/infiniband-cache", "type": "DirectoryOrCreate"}]),
                )
            },
            Expect::Admitted,
        ),
        (
            "fabricInterfaceCount on TCP warns",
            |v| set(v, "/spec/connection/managed/members/0/fabricInterfaceCount", json!(2)),
            Expect::Warned("fabricInterfaceCount has no effect"),
        ),
        (
            "fabricInterfaceCount 0",
            |v| set(v, "/spec/connection/managed/members/0/fabricInterfaceCount", json!(0)),
            refused(Invalid, "spec.connection.managed.members[0].fabricInterfaceCount"),
        ),
        (
            "scale-in grace -1",
            |v| set(v, "/spec/connection/managed/scaleIn", json!({"gracePeriodSeconds": -1})),
            refused(Invalid, "spec.connection.managed.scaleIn.gracePeriodSeconds"),
        ),
        (
            "scale-in grace 3601",
            |v| {
                set(
                    v,
                    "/spec/connection/managed/scaleIn",
                    json!({"gracePeriodSeconds": 3601}),
                )
            },
            refused(Invalid, "spec.connection.managed.scaleIn.gracePeriodSeconds"),
        ),
        (
            "runtime class Bad_Class",
            |v| {
                set(
                    v,
                    "/spec/connection/managed/members/0/runtimeClassName",
                    json!("Bad_Class"),
                )
            },
            refused(Invalid, "spec.connection.managed.members[0].runtimeClassName"),
        ),
        (
            "unknown field spec.metadata",
            |v| set(v, "/spec/metadata", json!({})),
            Expect::BadRequest(r#"unknown field "spec.metadata""#),
        ),
        (
            "pull policy outside its set",
            |v| set(v, "/spec/imagePullPolicy", json!("Sometimes")),
            refused(NotSupported, "spec.imagePullPolicy"),
        ),
    ]
}

#[tokio::test]
async fn create_admission_table() {
    let cases = create_cases();
    assert!(cases.len() >= 90, "{} cases", cases.len());
    for (name, edit, expect) in cases {
        let h = Harness::new();
        let mut v = base();
        edit(&mut v);
        let result = create(&h, &v).await;
        if let Err(e) = &result {
            render_refuses_alike(name, &[], &v, e).await;
        }
        check(name, result, expect);
    }
}

#[tokio::test]
async fn defaults_are_stored() {
    let h = Harness::new();
    let (b, _) = create(&h, &base()).await.unwrap();
    let stored = serde_json::to_value(&b.spec).unwrap();
    assert_eq!(stored["type"], "Mooncake");
    assert_eq!(stored["transport"], json!({"protocol": "Auto"}));
    assert_eq!(
        stored["connection"]["managed"]["leader"],
        json!({"replicas": 1, "electionBackend": "Kubernetes", "memberAddressing": "Service",
               "allocationStrategy": "FreeRatioFirst", "multiTenancy": true})
    );
    let mut v = base();
    set(&mut v, "/metadata/name", json!("explicit"));
    set(&mut v, "/spec/connection/managed/leader/multiTenancy", json!(false));
    set(&mut v, "/spec/connection/managed/members/0/transport", json!({}));
    let (b, _) = create(&h, &v).await.unwrap();
    let m = b.spec.managed().unwrap();
    assert_eq!(
        m.leader.as_ref().unwrap().multi_tenancy,
        Some(false),
        "an explicit false is kept"
    );
    assert_eq!(
        m.members[0].transport.as_ref().unwrap().protocol,
        Some(kvcache_api::common::Protocol::Auto),
        "a present member transport block means Auto"
    );
}

#[tokio::test]
async fn image_setting_is_judged_on_create_and_when_the_image_changes() {
    let blank = Config {
        settings: crate::config::Settings {
            kv_cache_backend_image: "  ".into(),
            ..Default::default()
        },
        ..Default::default()
    };
    let h = Harness::with_config(blank.clone());
    let msg = check(
        "no image anywhere",
        create(&h, &base()).await,
        refused(Required, "spec.image"),
    );
    assert!(msg.contains("kvCacheBackendImage"), "{msg}");
    let mut ext = base();
    external(&mut ext);
    check("external skips image checks", create(&h, &ext).await, Expect::Admitted);

    // Admitted while the setting was set; the setting is cleared later.
    let h = Harness::new();
    let (b, _) = create(&h, &base()).await.unwrap();
    let later = registries(h.storage.clone(), blank);
    let mut relabeled = b.clone();
    relabeled.metadata.labels = Some([("team".to_string(), "a".to_string())].into());
    later
        .backends
        .update("", b.name(), relabeled, WriteOptions::default())
        .await
        .expect("a label edit is not re-judged");
    let current = later.backends.get("", b.name()).await.unwrap();
    let mut with_image = current.clone();
    with_image.spec.image = Some("repo:1".into());
    let current = later
        .backends
        .update("", b.name(), with_image, WriteOptions::default())
        .await
        .unwrap()
        .object;
    let mut without = current.clone();
    without.spec.image = None;
    check(
        "removing the image with a blank setting",
        later
            .backends
            .update("", b.name(), without, WriteOptions::default())
            .await
            .map(|w| (w.object, w.warnings)),
        refused(Required, "spec.image"),
    );
}

async fn update_case(h: &Harness, before: &Value, edit: Edit) -> Result<(KVCacheBackend, Vec<String>), RegistryError> {
    let (created, _) = create(h, before).await.expect("base admitted");
    let mut v = serde_json::to_value(&created).unwrap();
    edit(&mut v);
    let obj = decode::<BackendSpec>(&v)?;
    h.reg
        .backends
        .update("", created.name(), obj, WriteOptions::default())
        .await
        .map(|w| (w.object, w.warnings))
}

fn three_groups() -> Value {
    let mut v = base();
    set(
        &mut v,
        "/spec/connection/managed/members",
        json!([group("a"), group("b"), group("c")]),
    );
    v
}

type UpdateCase = (&'static str, fn() -> Value, Edit, Expect);

/// The walkthrough backend with a disk tier under its group.
fn tiered() -> Value {
    let mut v = base();
    tier(&mut v, json!({"path": "/t"}));
    v
}

fn update_cases() -> Vec<UpdateCase> {
    vec![
        (
            "managed to external",
            base,
            external,
            refused(Forbidden, "spec.connection"),
        ),
        (
            "medium DRAM to VRAM",
            base,
            |v| set(v, "/spec/connection/managed/members/0/medium", json!("VRAM")),
            refused(Forbidden, "spec.connection.managed.members[0].medium"),
        ),
        (
            "swap two groups",
            three_groups,
            |v| {
                let m = v
                    .pointer_mut("/spec/connection/managed/members")
                    .unwrap()
                    .as_array_mut()
                    .unwrap();
                m.swap(0, 1);
            },
            refused(Forbidden, "spec.connection.managed.members[0]"),
        ),
        (
            "[A,B,C] to [A,C]",
            three_groups,
            |v| remove(v, "/spec/connection/managed/members/1"),
            refused(Forbidden, "spec.connection.managed.members[1]"),
        ),
        (
            "[A,B,C] to [A,C,C]",
            three_groups,
            |v| set(v, "/spec/connection/managed/members/1", group("c")),
            Expect::Admitted,
        ),
        (
            "append a group",
            three_groups,
            |v| set(v, "/spec/connection/managed/members/3", group("d")),
            Expect::Admitted,
        ),
        (
            "remove the last group",
            three_groups,
            |v| remove(v, "/spec/connection/managed/members/2"),
            Expect::Admitted,
        ),
        (
            "widen a selector in place",
            three_groups,
            |v| set(v, "/spec/connection/managed/members/1/nodeSelector", json!({})),
            Expect::Admitted,
        ),
        (
            "1Gi to 1024Mi is no change",
            three_groups,
            |v| {
                set(
                    v,
                    "/spec/connection/managed/members/0/capacityPerMember",
                    json!("1024Mi"),
                )
            },
            Expect::Admitted,
        ),
        (
            "narrow a group to match an unmoved one",
            three_groups,
            |v| {
                set(
                    v,
                    "/spec/connection/managed/members/1/nodeSelector",
                    json!({"pool": "a"}),
                )
            },
            Expect::Admitted,
        ),
        (
            "raise leader replicas",
            base,
            |v| set(v, "/spec/connection/managed/leader/replicas", json!(3)),
            Expect::Admitted,
        ),
        (
            "edit capacity",
            base,
            |v| set(v, "/spec/connection/managed/members/0/capacityPerMember", json!("16Gi")),
            Expect::Admitted,
        ),
        (
            "add a disk tier to a group",
            base,
            |v| tier(v, json!({"path": "/t"})),
            refused(Forbidden, "spec.connection.managed.members[0].localDisks"),
        ),
        (
            "remove a group's disk tier",
            tiered,
            |v| remove(v, "/spec/connection/managed/members/0/localDisks"),
            refused(Forbidden, "spec.connection.managed.members[0].localDisks"),
        ),
        (
            "move a disk tier",
            tiered,
            |v| set(v, "/spec/connection/managed/members/0/localDisks/0/path", json!("/u")),
            refused(Forbidden, "spec.connection.managed.members[0].localDisks[0].path"),
        ),
        (
            "edit a disk tier's capacity, key limit, eviction and clean-up",
            tiered,
            |v| {
                tier(
                    v,
                    json!({"path": "/t", "capacity": "2Gi", "keyLimit": 100, "eviction": {"policy": "LRU"}}),
                )
            },
            Expect::Admitted,
        ),
        (
            "multiTenancy off with no consumers",
            base,
            |v| set(v, "/spec/connection/managed/leader/multiTenancy", json!(false)),
            Expect::Admitted,
        ),
    ]
}

#[tokio::test]
async fn update_admission_table() {
    for (name, before, edit, expect) in update_cases() {
        let h = Harness::new();
        check(name, update_case(&h, &before(), edit).await, expect);
    }
}

#[tokio::test]
async fn tenancy_cannot_be_withdrawn_while_pools_use_the_backend() {
    let h = Harness::new();
    let (b, _) = create(&h, &base()).await.unwrap();
    let mut with_status = b.clone();
    let used_by: Vec<UsedBy> = (0..25)
        .map(|i| UsedBy {
            kind: "KVCachePool".into(),
            namespace: String::new(),
            name: format!("pool-{i:02}"),
        })
        .collect();
    with_status.status = Some(kvcache_api::backend::BackendStatus {
        used_by,
        ..Default::default()
    });
    let b = h
        .reg
        .backends
        .update_status("", b.name(), with_status, WriteOptions::default())
        .await
        .unwrap()
        .object;
    let mut off = b.clone();
    off.spec
        .connection
        .as_mut()
        .unwrap()
        .managed
        .as_mut()
        .unwrap()
        .leader
        .as_mut()
        .unwrap()
        .multi_tenancy = Some(false);
    let msg = check(
        "withdraw with 25 consumers",
        h.reg
            .backends
            .update("", b.name(), off, WriteOptions::default())
            .await
            .map(|w| (w.object, w.warnings)),
        refused(Forbidden, "spec.connection.managed.leader.multiTenancy"),
    );
    assert!(
        msg.contains("KVCachePool/pool-00") && msg.contains("KVCachePool/pool-19"),
        "{msg}"
    );
    assert!(!msg.contains("pool-20") && msg.contains("and 5 more"), "{msg}");
}

/// Writes an object straight to storage, as if admitted under older rules.
async fn store_raw(h: &Harness, b: &KVCacheBackend) {
    let txn = Txn {
        compares: vec![],
        ops: vec![Op::Put {
            key: keys::object_key::<BackendSpec>("", b.name()),
            value: encode(b).unwrap().into(),
        }],
    };
    h.storage.txn(txn).await.unwrap();
}

#[tokio::test]
async fn updates_do_not_rejudge_untouched_values() {
    let h = Harness::new();
    let (mut b, _) = create(&h, &base()).await.unwrap();
    // Admitted before the key was reserved: a stale derived flag and a capacity now refused.
    {
        let m = b.spec.connection.as_mut().unwrap().managed.as_mut().unwrap();
        m.leader.as_mut().unwrap().extra_args = vec!["--listen=10.0.0.1:1".into()];
        m.members[0].capacity_per_member = Some("0".into());
    }
    b.metadata.finalizers = Some(vec!["gpustack.ai/controlled".into()]);
    store_raw(&h, &b).await;
    let b = h.reg.backends.get("", b.name()).await.unwrap();

    let mut labeled = b.clone();
    labeled.metadata.labels = Some([("a".to_string(), "b".to_string())].into());
    let b = h
        .reg
        .backends
        .update("", b.name(), labeled, WriteOptions::default())
        .await
        .expect("unrelated edit")
        .object;

    let mut replicas = b.clone();
    replicas
        .spec
        .connection
        .as_mut()
        .unwrap()
        .managed
        .as_mut()
        .unwrap()
        .leader
        .as_mut()
        .unwrap()
        .replicas = Some(2);
    let b = h
        .reg
        .backends
        .update("", b.name(), replicas, WriteOptions::default())
        .await
        .expect("another field edited")
        .object;

    let mut edit_list = b.clone();
    edit_list
        .spec
        .connection
        .as_mut()
        .unwrap()
        .managed
        .as_mut()
        .unwrap()
        .leader
        .as_mut()
        .unwrap()
        .extra_args = vec!["--listen=10.0.0.1:2".into()];
    check(
        "editing the stale list",
        h.reg
            .backends
            .update("", b.name(), edit_list, WriteOptions::default())
            .await
            .map(|w| (w.object, w.warnings)),
        refused(Forbidden, "spec.connection.managed.leader.extraArgs[0]"),
    );
    let mut flip = b.clone();
    flip.spec
        .connection
        .as_mut()
        .unwrap()
        .managed
        .as_mut()
        .unwrap()
        .leader
        .as_mut()
        .unwrap()
        .election_backend = Some(kvcache_api::backend::ElectionBackend::None);
    flip.spec
        .connection
        .as_mut()
        .unwrap()
        .managed
        .as_mut()
        .unwrap()
        .leader
        .as_mut()
        .unwrap()
        .replicas = Some(1);
    check(
        "flipping the election re-judges the leader's lists",
        h.reg
            .backends
            .update("", b.name(), flip, WriteOptions::default())
            .await
            .map(|w| (w.object, w.warnings)),
        refused(Forbidden, "spec.connection.managed.leader.extraArgs[0]"),
    );

    // Deletion waits for the finalizer; removing it is never refused, and removes the object.
    h.reg
        .backends
        .delete("", b.name(), DeleteOptions::default())
        .await
        .unwrap();
    let deleting = h.reg.backends.get("", b.name()).await.unwrap();
    assert!(deleting.metadata.deletion_timestamp.is_some());
    let mut done = deleting.clone();
    done.metadata.finalizers = Some(vec![]);
    h.reg
        .backends
        .update("", b.name(), done, WriteOptions::default())
        .await
        .expect("finalizer removal");
    assert!(matches!(
        h.reg.backends.get("", b.name()).await,
        Err(RegistryError::NotFound { .. })
    ));
}

#[tokio::test]
async fn spec_changes_bump_generation_and_status_writes_do_not() {
    let h = Harness::new();
    let (b, _) = create(&h, &base()).await.unwrap();
    assert_eq!(b.metadata.generation, Some(1));
    let mut s = b.clone();
    s.status = Some(kvcache_api::backend::BackendStatus {
        phase: Some(kvcache_api::conditions::BackendPhase::Ready),
        ..Default::default()
    });
    let b = h
        .reg
        .backends
        .update_status("", b.name(), s.clone(), WriteOptions::default())
        .await
        .unwrap()
        .object;
    assert_eq!(b.metadata.generation, Some(1));
    assert_eq!(
        b.status.as_ref().unwrap().phase,
        Some(kvcache_api::conditions::BackendPhase::Ready)
    );
    let mut spec = b.clone();
    spec.status = None;
    spec.spec.connection.as_mut().unwrap().managed.as_mut().unwrap().members[0].capacity_per_member =
        Some("4Gi".into());
    let b2 = h
        .reg
        .backends
        .update("", b.name(), spec, WriteOptions::default())
        .await
        .unwrap()
        .object;
    assert_eq!(b2.metadata.generation, Some(2));
    assert_eq!(b2.status, b.status, "a main-resource write keeps the stored status");
    // A stale resourceVersion is a conflict.
    let stale = b.clone();
    assert!(matches!(
        h.reg
            .backends
            .update("", b.name(), stale, WriteOptions::default())
            .await,
        Err(RegistryError::Conflict { .. })
    ));
    // Writing the same object again changes nothing, not even the resourceVersion.
    let same = h
        .reg
        .backends
        .update("", b.name(), b2.clone(), WriteOptions::default())
        .await
        .unwrap()
        .object;
    assert_eq!(same.metadata.resource_version, b2.metadata.resource_version);
}

#[tokio::test]
async fn delete_honours_uid_and_resource_version_preconditions() {
    let h = Harness::new();
    let (b, _) = create(&h, &base()).await.unwrap();
    let wrong_uid = DeleteOptions {
        precondition_uid: Some("not-the-uid".into()),
        ..Default::default()
    };
    let Err(RegistryError::Conflict { message, .. }) = h.reg.backends.delete("", b.name(), wrong_uid).await else {
        panic!("a wrong uid is a conflict")
    };
    assert!(
        message.starts_with("Precondition failed: UID in precondition: not-the-uid"),
        "{message}"
    );
    let stale = DeleteOptions {
        precondition_resource_version: Some("999".into()),
        ..Default::default()
    };
    assert!(matches!(
        h.reg.backends.delete("", b.name(), stale).await,
        Err(RegistryError::Conflict { .. })
    ));
    let exact = DeleteOptions {
        precondition_uid: b.metadata.uid.clone(),
        precondition_resource_version: b.metadata.resource_version.clone(),
        ..Default::default()
    };
    assert!(matches!(
        h.reg.backends.delete("", b.name(), exact).await,
        Ok(crate::registry::generic::Deleted::Gone(_))
    ));
}
