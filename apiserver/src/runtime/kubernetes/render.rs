//! What a backend's store is as Kubernetes objects, computed from its [`StorePlan`] alone (no
//! cluster access), so the runtime applies it and `kv-apiserver render` prints it:
//!
//! - the leader: Deployment `<name>-leader` (one serving replica, standbys not ready), Service
//!   `<name>-leader`, and while the election is on the ServiceAccount, Role and RoleBinding
//!   `<name>-leader` its Pods campaign for the Lease `<name>-leader` with;
//! - the members: one DaemonSet `<name>-member-<i>` per group on the group's nodes, and while the
//!   election is on the ServiceAccount, Role and RoleBinding `<name>-member` (Lease reads);
//! - the tokens and keys they prove themselves with, each the backend's own ([`Token`]), as keys
//!   `<backend>.<file>` of the one Secret [`TOKENS_SECRET`] the runtime keeps: the leader mounts
//!   the backend's Control token, scrape token, member token and seal key, each member the member
//!   token alone, under [`TOKENS_DIR`];
//! - their TLS (`tls_secrets.rs`): leader and members mount the backend's certificate (keys
//!   `<backend>.tls.crt`, `.tls.key` and `.ca.crt` of the Secret [`TLS_SECRET`]) under [`TLS_DIR`]
//!   and serve every port with it; members check the leader for the backend's store name.
//!
//! The store's Secrets have fixed names, so the runtime's rights to Secrets in the store's
//! namespace are to those alone, by name (`deploy/rbac-runtime.yaml`): it lists none, and reads no
//! other Secret there.
//!
//! Every object carries the resource-type label, the ownership notes (backend, role, group) that
//! decide what belongs to the backend, and a controller owner reference that never blocks the
//! owner's deletion. Every flag of the store comes from its
//! `LeaderConfig` / `MemberConfig` (`to_args()`); the Pod-specific values are the downward API's
//! `$(POD_NAME)`, `$(POD_IP)` and `$(NODE_NAME)`, which the kubelet expands in arguments.

use std::net::SocketAddr;

use kvcache_store::leader::{Election, LeaderConfig};
use kvcache_store::member::MemberConfig;
use serde_json::{Value, json};

use crate::runtime::{GroupPlan, StorePlan};

/// The label that finds every object rendered for a kind of ours.
pub const TYPE_LABEL: &str = "resource.gpustack.ai/type";
/// The note that says which backend an object belongs to: only an object carrying it is ever
/// updated or deleted for that backend.
pub const BACKEND_NOTE: &str = "note.gpustack.ai/backend";
pub const ROLE_NOTE: &str = "note.gpustack.ai/role";
pub const GROUP_NOTE: &str = "note.gpustack.ai/group";

mod secrets;
pub use secrets::{
    STORE_FS_GROUP, TLS_CA_KEY, TLS_CERT_KEY, TLS_DIR, TLS_KEY_KEY, TLS_SECRET, TOKENS_DIR, TOKENS_SECRET, Token,
    backend_key,
};
use secrets::{
    serve_tls, store_pod_security, tls_file, tls_mount, tls_volume, token_file, tokens_mount, tokens_volume,
};

/// The leader's ports: engines and controllers (gRPC), the fast metadata port, metrics and probes.
pub const LEADER_RPC_PORT: u16 = 50051;
pub const LEADER_FAST_PORT: u16 = 50052;
pub const LEADER_METRICS_PORT: u16 = 9003;
/// A member's ports (its own Pod network namespace, so the same on every member).
pub const MEMBER_PORT: u16 = 7000;
pub const MEMBER_DATA_PORT: u16 = 7001;
pub const MEMBER_METRICS_PORT: u16 = 7002;

pub use super::store_target::{Target, pull_policy};

/// The leader's Service address, which engines and Service-addressed members use.
pub fn leader_address(plan: &StorePlan, namespace: &str) -> String {
    format!("{}-leader.{namespace}.svc:{LEADER_RPC_PORT}", plan.backend)
}

fn identity(backend: &str, component: &str) -> Value {
    json!({
        "app.kubernetes.io/name": "kv-cache-backend",
        "app.kubernetes.io/instance": backend,
        "app.kubernetes.io/component": component,
    })
}

fn labels(backend: &str, component: &str) -> Value {
    let mut l = identity(backend, component);
    l[TYPE_LABEL] = json!("kvcachebackends");
    l["app.kubernetes.io/part-of"] = json!("kvcache");
    l
}

/// Metadata of every rendered object: name, namespace, labels, notes and the owner reference.
fn metadata(plan: &StorePlan, t: &Target, name: &str, component: &str, role: &str, group: Option<usize>) -> Value {
    let mut notes = json!({ BACKEND_NOTE: plan.backend, ROLE_NOTE: role });
    if let Some(i) = group {
        notes[GROUP_NOTE] = json!(i.to_string());
    }
    let mut meta = json!({
        "name": name,
        "namespace": t.namespace,
        "labels": labels(&plan.backend, component),
        "annotations": notes,
    });
    // Offline (`kv-apiserver render`) the backend has no UID yet: the reference comes with it.
    if !plan.uid.is_empty() {
        meta["ownerReferences"] = json!([owner_reference("KVCacheBackend", &plan.backend, &plan.uid)]);
    }
    meta
}

/// A controller owner reference to our object `kind`/`name`, which never blocks its deletion.
pub(super) fn owner_reference(kind: &str, name: &str, uid: &str) -> Value {
    json!({
        "apiVersion": format!("{}/v1", kvcache_api::GROUP),
        "kind": kind,
        "name": name,
        "uid": uid,
        "controller": true,
        "blockOwnerDeletion": false,
    })
}

pub(super) fn field_env(name: &str, path: &str) -> Value {
    json!({"name": name, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": path}}})
}

pub(super) fn plain_env(pairs: &[(String, String)]) -> Vec<Value> {
    pairs.iter().map(|(k, v)| json!({"name": k, "value": v})).collect()
}

fn any(port: u16) -> SocketAddr {
    SocketAddr::from(([0, 0, 0, 0], port))
}

/// The leader's flags in a Pod: every listen address on the Pod's network, and while the
/// election is on the Lease of this backend in the runtime's namespace, the Pod as identity and
/// its IP as the address the Lease advertises.
pub fn leader_config(plan: &StorePlan, t: &Target) -> LeaderConfig {
    let mut c = plan.leader.clone();
    c.listen = any(LEADER_RPC_PORT);
    c.fast_listen = Some(kvcache_store::flags::FastListen::At(any(LEADER_FAST_PORT)));
    c.metrics_listen = Some(any(LEADER_METRICS_PORT));
    c.kubeconfig = None;
    c.control_token_file = Some(token_file(Token::Control.file()));
    c.metrics_token_file = Some(token_file(Token::Metrics.file()));
    c.member_token_file = Some(token_file(Token::Member.file()));
    c.seal_key_file = Some(token_file(Token::Seal.file()));
    c.tls = serve_tls();
    match &plan.election {
        Some(e) => {
            c.election = Election::Kubernetes;
            c.election_lease = Some(format!("{}/{}", t.namespace, e.lease));
            c.identity = Some("$(POD_NAME)".into());
            c.advertise_host = Some("$(POD_IP)".into());
            c.advertise_fast_port = Some(LEADER_FAST_PORT);
        }
        None => {
            c.election = Election::None;
            c.election_lease = None;
            c.identity = None;
            c.advertise_host = None;
            c.advertise_fast_port = None;
        }
    }
    c
}

/// A member's flags in a Pod of group `g`: the leader's Service, or the Lease when members
/// follow it; its name `<backend>-member-<i>-<node>` (as the controllers plan it), its Pod IP.
pub fn member_config(plan: &StorePlan, g: &GroupPlan, t: &Target) -> MemberConfig {
    let mut c = g.config.clone();
    c.leader = match &plan.election {
        Some(e) if e.members_follow_lease => format!("k8s://{}/{}", t.namespace, e.lease),
        _ => leader_address(plan, &t.namespace),
    };
    c.kubeconfig = None;
    c.listen = any(MEMBER_PORT);
    c.data_listen = any(MEMBER_DATA_PORT);
    c.metrics_listen = Some(any(MEMBER_METRICS_PORT));
    c.name = Some(format!("{}-member-{}-$(NODE_NAME)", plan.backend, g.index));
    c.advertise_host = Some("$(POD_IP)".into());
    c.shm_dir = "/dev/shm".into();
    c.member_token_file = Some(token_file(Token::Member.file()));
    c.tls = serve_tls();
    c.dial = kvcache_store::tls::DialFlags {
        tls_ca: Some(tls_file(TLS_CA_KEY)),
        tls_server_name: Some(crate::runtime::store_tls::server_name(&plan.backend)),
        tls_ca_pem: None,
    };
    c
}

pub(super) fn http_probe(path: &str, port: u16, period: u32, failures: u32) -> Value {
    json!({
        "httpGet": {"path": path, "port": port, "scheme": "HTTP"},
        "periodSeconds": period,
        "failureThreshold": failures,
    })
}

fn pull_secrets(t: &Target) -> Vec<Value> {
    t.pull_secrets.iter().map(|s| json!({"name": s})).collect()
}

/// A `kv-store` container: `args` after the command, `env`, named TCP ports, and ready when
/// `/readyz` on `ready_port` answers (serving).
fn store_container(
    name: &str,
    image: &str,
    t: &Target,
    args: Vec<String>,
    env: Vec<Value>,
    ports: &[(&str, u16)],
    ready_port: u16,
) -> Value {
    let ports: Vec<Value> = ports
        .iter()
        .map(|(n, p)| json!({"name": n, "containerPort": p, "protocol": "TCP"}))
        .collect();
    json!({
        "name": name,
        "image": image,
        "imagePullPolicy": pull_policy(image, t.pull_policy.as_deref()),
        "command": ["kv-store"],
        "args": args,
        "env": env,
        "ports": ports,
        "readinessProbe": http_probe("/readyz", ready_port, 5, 3),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    })
}

/// A member Pod's memory: it requests its segment (the `/dev/shm` emptyDir, which counts against
/// the Pod) and may use, besides, a quarter of it and at least [`MEMBER_HEAP_FLOOR`] for its heap:
/// the tags of the values it holds, transfers in flight and its connections. Past the limit the
/// kernel ends the member alone (its values are lost, as at any member restart) instead of
/// whatever else runs on the node.
pub fn member_resources(capacity: u64) -> Value {
    let limit = capacity.saturating_add((capacity / 4).max(MEMBER_HEAP_FLOOR));
    json!({"requests": {"memory": quantity(capacity)}, "limits": {"memory": quantity(limit)}})
}

/// A leader Pod's memory: [`LEADER_HEAP_FLOOR`] plus an eighth of one member's segment per group.
/// The leader keeps metadata only, about 300 bytes per value and its key, and each tenant's grant
/// (which counts 384 bytes and the key per value besides its bytes) bounds how many values it
/// keeps, so this holds the metadata of groups whose values average 4 KiB or more; it requests
/// the floor.
pub fn leader_resources(plan: &StorePlan) -> Value {
    let per_groups: u64 = plan.groups.iter().map(|g| g.config.capacity / 8).sum();
    let limit = LEADER_HEAP_FLOOR.saturating_add(per_groups);
    json!({"requests": {"memory": quantity(LEADER_HEAP_FLOOR)}, "limits": {"memory": quantity(limit)}})
}

/// The least heap a member Pod's limit allows beside its segment.
pub const MEMBER_HEAP_FLOOR: u64 = 256 << 20;
/// The least memory a leader Pod's limit allows (and what it requests).
pub const LEADER_HEAP_FLOOR: u64 = 512 << 20;

fn quantity(bytes: u64) -> String {
    kvcache_units::format_bytes(i64::try_from(bytes).unwrap_or(i64::MAX))
}

/// Deployment `<name>-leader`.
pub fn leader_deployment(plan: &StorePlan, t: &Target) -> Value {
    let name = format!("{}-leader", plan.backend);
    let replicas = plan.election.as_ref().map_or(1, |e| e.replicas.max(1));
    let elects = plan.election.is_some();
    // The Pod's name and IP are the election's identity and advertised address.
    let mut env = if elects {
        vec![
            field_env("POD_NAME", "metadata.name"),
            field_env("POD_IP", "status.podIP"),
        ]
    } else {
        Vec::new()
    };
    env.extend(plain_env(&plan.leader_env));
    let mut args = vec!["leader".to_owned()];
    args.extend(leader_config(plan, t).to_args());
    let strategy = if replicas == 1 {
        json!({"type": "Recreate"})
    } else {
        // Exactly one replica is ever available (the others stand by), so a smaller
        // maxUnavailable would never let a rollout proceed.
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": replicas}})
    };
    // Ready only while serving: standbys stay out of the Service.
    let mut container = store_container(
        "leader",
        &t.image,
        t,
        args,
        env,
        &[
            ("rpc", LEADER_RPC_PORT),
            ("fast", LEADER_FAST_PORT),
            ("metrics", LEADER_METRICS_PORT),
        ],
        LEADER_METRICS_PORT,
    );
    container["livenessProbe"] = http_probe("/healthz", LEADER_METRICS_PORT, 10, 6);
    container["resources"] = leader_resources(plan);
    container["volumeMounts"] = json!([tokens_mount(), tls_mount()]);
    let tokens = tokens_volume(&plan.backend, &Token::ALL);
    let tls = tls_volume(&plan.backend);
    let mut spec = json!({
        "replicas": replicas,
        "selector": {"matchLabels": identity(&plan.backend, "leader")},
        "strategy": strategy,
        "template": {
            "metadata": {"labels": labels(&plan.backend, "leader")},
            "spec": {
                "automountServiceAccountToken": elects,
                "securityContext": store_pod_security(),
                "imagePullSecrets": pull_secrets(t),
                "containers": [container],
                "volumes": [tokens, tls],
            },
        },
    });
    if elects {
        spec["template"]["spec"]["serviceAccountName"] = json!(name);
    }
    if replicas > 1 {
        // A Deployment with standbys never reports complete.
        spec["progressDeadlineSeconds"] = json!(i32::MAX);
    }
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(plan, t, &name, "leader", "leader", None),
        "spec": spec,
    })
}

/// Service `<name>-leader`: the serving leader only (standbys are not ready).
pub fn leader_service(plan: &StorePlan, t: &Target) -> Value {
    let name = format!("{}-leader", plan.backend);
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(plan, t, &name, "leader", "leader", None),
        "spec": {
            "type": "ClusterIP",
            "selector": identity(&plan.backend, "leader"),
            "publishNotReadyAddresses": false,
            "ports": [
                {"name": "rpc", "port": LEADER_RPC_PORT, "targetPort": "rpc", "protocol": "TCP"},
                {"name": "fast", "port": LEADER_FAST_PORT, "targetPort": "fast", "protocol": "TCP"},
                {"name": "metrics", "port": LEADER_METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"},
            ],
        },
    })
}

/// ServiceAccount, Role and RoleBinding named `name` granting `rules`.
fn rbac(plan: &StorePlan, t: &Target, name: &str, component: &str, role: &str, rules: Value) -> [Value; 3] {
    let meta = || metadata(plan, t, name, component, role, None);
    [
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta()}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta(), "rules": rules}),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta(),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": t.namespace}],
        }),
    ]
}

/// DaemonSet `<name>-member-<i>`: one member per node the group selects, its memory request
/// and shared memory the segment's size.
pub fn member_daemon_set(plan: &StorePlan, g: &GroupPlan, t: &Target) -> Value {
    let name = format!("{}-member-{}", plan.backend, g.index);
    let component = format!("member-{}", g.index);
    let config = member_config(plan, g, t);
    let capacity = kvcache_units::format_bytes(i64::try_from(config.capacity).unwrap_or(i64::MAX));
    let mut args = vec!["member".to_owned()];
    args.extend(config.to_args());
    let mut env = vec![
        field_env("POD_NAME", "metadata.name"),
        field_env("POD_IP", "status.podIP"),
        field_env("NODE_NAME", "spec.nodeName"),
    ];
    env.extend(plain_env(&g.env));
    let image = g
        .image
        .as_deref()
        .filter(|i| !i.trim().is_empty())
        .unwrap_or(&t.image)
        .trim()
        .to_owned();
    let reads_lease = plan.election.as_ref().is_some_and(|e| e.members_follow_lease);
    // Ready once the segment is mounted at the serving leader.
    let mut container = store_container(
        "member",
        &image,
        t,
        args,
        env,
        &[
            ("rpc", MEMBER_PORT),
            ("data", MEMBER_DATA_PORT),
            ("metrics", MEMBER_METRICS_PORT),
        ],
        MEMBER_METRICS_PORT,
    );
    container["resources"] = member_resources(config.capacity);
    container["volumeMounts"] = json!([{"name": "segment", "mountPath": "/dev/shm"}, tokens_mount(), tls_mount()]);
    let mut pod = json!({
        "nodeSelector": g.node_selector,
        "automountServiceAccountToken": reads_lease,
        "securityContext": store_pod_security(),
        "imagePullSecrets": pull_secrets(t),
        "terminationGracePeriodSeconds": 60,
        "containers": [container],
        "volumes": [
            {"name": "segment", "emptyDir": {"medium": "Memory", "sizeLimit": capacity}},
            tokens_volume(&plan.backend, &[Token::Member]),
            tls_volume(&plan.backend),
        ],
    });
    if reads_lease {
        pod["serviceAccountName"] = json!(format!("{}-member", plan.backend));
    }
    if let Some(dir) = &config.tier_dir {
        mount_tier(&mut pod, &dir.display().to_string());
    }
    json!({
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": metadata(plan, t, &name, &component, "member", Some(g.index)),
        "spec": {
            "selector": {"matchLabels": identity(&plan.backend, &component)},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
            "template": {"metadata": {"labels": labels(&plan.backend, &component)}, "spec": pod},
        },
    })
}

/// A member Pod's disk tier: the node's directory (`type: Directory`: the kubelet refuses to
/// start the Pod while it is missing, never creates it root-owned), mounted where the member's
/// `--tier-dir` names it, and the init container `tier-survey`, which counts what the directory
/// holds before the member first opens it and leaves that as its termination message
/// (`TierWasEmpty`); and a preStop hook, `GET /flushed` on the metrics port, which answers once
/// nothing is queued for the tier and the leader has heard of every copy (up to 25 s of the Pod's
/// 60 s grace), so a Pod deleted keeps on disk what it held, and the leader knows it, while the
/// member still serves. What comes after the hook is queued again on SIGTERM (up to 5 s).
fn mount_tier(pod: &mut Value, dir: &str) {
    if let Some(v) = pod["volumes"].as_array_mut() {
        v.push(json!({"name": "tier", "hostPath": {"path": dir, "type": "Directory"}}));
    }
    let mount = json!({"name": "tier", "mountPath": dir});
    if let Some(m) = pod["containers"][0]["volumeMounts"].as_array_mut() {
        m.push(mount.clone());
    }
    pod["containers"][0]["lifecycle"] = json!({"preStop": {"httpGet": {"path": "/flushed", "port": "metrics"}}});
    let main = &pod["containers"][0];
    let survey = json!({
        "name": "tier-survey",
        "image": main["image"],
        "imagePullPolicy": main["imagePullPolicy"],
        "command": main["command"],
        "args": ["tier-survey", "--dir", dir, "--write", "/dev/termination-log"],
        "terminationMessagePolicy": "File",
        "resources": {"requests": {"memory": "16Mi"}, "limits": {"memory": "64Mi"}},
        "volumeMounts": [mount],
    });
    pod["initContainers"] = json!([survey]);
}

/// NetworkPolicy `<backend>-store`: the store's ports (gRPC, fast, data) take connections only
/// from the backend's own Pods, the API server's Pods (its controllers), and engine Pods in the
/// namespaces of the backend's Bindings; the metrics ports stay open to scrapers and probes.
pub fn network_policy(plan: &StorePlan, t: &Target) -> Value {
    let store_pods = json!({
        "app.kubernetes.io/name": "kv-cache-backend",
        "app.kubernetes.io/instance": plan.backend,
    });
    let store_ports = json!([
        {"protocol": "TCP", "port": "rpc"},
        {"protocol": "TCP", "port": "fast"},
        {"protocol": "TCP", "port": "data"},
    ]);
    let mut from = vec![
        json!({"podSelector": {"matchLabels": store_pods}}),
        json!({
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": t.server_namespace}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "kvcache-apiserver"}},
        }),
    ];
    if !plan.tenant_namespaces.is_empty() {
        from.push(json!({
            "namespaceSelector": {"matchExpressions": [{
                "key": "kubernetes.io/metadata.name",
                "operator": "In",
                "values": plan.tenant_namespaces,
            }]},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "model-deployment"}},
        }));
    }
    json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(plan, t, &format!("{}-store", plan.backend), "store", "store", None),
        "spec": {
            "podSelector": {"matchLabels": store_pods},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": from, "ports": store_ports},
                {"ports": [
                    {"protocol": "TCP", "port": "metrics"},
                ]},
            ],
        },
    })
}

/// Every object of the backend, in the order they are applied: RBAC before the workloads that
/// use it, the NetworkPolicy and Service before the Deployment.
pub fn store(plan: &StorePlan, t: &Target) -> Vec<Value> {
    let mut out = Vec::new();
    if let Some(e) = &plan.election {
        // Only this backend's Lease: reading, watching (by its name's field selector) and
        // renewing it. Kubernetes cannot limit `create` by name (the name is not known when the
        // request is authorized), so creating stays a rule of its own, as for the control
        // plane's own leader elections.
        let leases = json!([
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "watch", "update"], "resourceNames": [e.lease]},
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        ]);
        out.extend(rbac(plan, t, &e.lease, "leader", "leader", leases));
        if e.members_follow_lease {
            let read = json!([
                {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "watch"], "resourceNames": [e.lease]},
            ]);
            out.extend(rbac(
                plan,
                t,
                &format!("{}-member", plan.backend),
                "member",
                "member",
                read,
            ));
        }
    }
    out.push(network_policy(plan, t));
    out.push(leader_service(plan, t));
    out.push(leader_deployment(plan, t));
    for g in &plan.groups {
        out.push(member_daemon_set(plan, g, t));
    }
    out
}

#[cfg(test)]
mod tests;
