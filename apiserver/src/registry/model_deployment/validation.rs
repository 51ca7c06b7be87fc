//! Object rules of a `ModelDeployment`: shapes and bounds, the engine-owned keys that
//! `extraArgs` and `env` may not set, and the parts of the API not built yet (refused by name);
//! role kinds, the router and `kvTransfer` in `router.rs`.

use std::collections::BTreeSet;

use kvcache_api::model_deployment::{EngineName, ModelDeployment, ModelDeploymentSpec, Role};

use crate::field::{ErrorList, Path};
use crate::registry::Context;
use crate::registry::validation;

const MAX_ROLES: usize = 10;
const MAX_REPLICAS: i32 = 1024;
const MAX_SIZE: i32 = 64;
const MAX_IMAGE: usize = 512;
const MAX_PULL_SECRETS: usize = 32;
const MAX_MOUNT_PATH: usize = 1024;

/// Flags the operator renders per engine (any spelling the engine parses as the same flag).
fn owned_args(engine: EngineName) -> &'static [&'static str] {
    match engine {
        EngineName::Vllm => &["kv-transfer-config", "kv-events-config"],
        EngineName::Sglang => &[
            "hicache-storage-backend",
            "hicache-storage-backend-extra-config",
            "disaggregation-mode",
            "disaggregation-transfer-backend",
            "disaggregation-bootstrap-port",
        ],
    }
}

/// The engine's flag for tokens per KV cache block, which an attached role gets from its domain.
fn block_size_flag(engine: EngineName) -> &'static str {
    match engine {
        EngineName::Vllm => "block-size",
        EngineName::Sglang => "page-size",
    }
}

/// Environment variables the operator renders per engine.
fn owned_env(engine: EngineName) -> &'static [&'static str] {
    match engine {
        EngineName::Vllm => &["MOONCAKE_CONFIG_PATH", "VLLM_MOONCAKE_BOOTSTRAP_PORT"],
        EngineName::Sglang => &[
            "SGLANG_HICACHE_MOONCAKE_CONFIG_PATH",
            "MOONCAKE_MASTER",
            "MOONCAKE_TE_META_DATA_SERVER",
            "MOONCAKE_PROTOCOL",
            "MOONCAKE_DEVICE",
            "MOONCAKE_GLOBAL_SEGMENT_SIZE",
            "MOONCAKE_LOCAL_HOSTNAME",
        ],
    }
}

/// Owned on every engine: the rank variables, and the tenant (a workload must not pick its own
/// cache domain; the Binding decides it).
const OWNED_ENV_ALL: &[&str] = &[
    "GPUSTACK_REPLICA_LEADER_ADDRESS",
    "GPUSTACK_REPLICA_SIZE",
    "GPUSTACK_MEMBER_INDEX",
    "MOONCAKE_TENANT_ID",
];

pub fn validate(obj: &ModelDeployment, ctx: &Context) -> ErrorList {
    let mut errs = ErrorList::new();
    let s = &obj.spec;
    let spec = Path::new("spec");
    if let Err(e) = validation::dns1035_label(obj.name()) {
        errs.invalid(
            &Path::new("metadata").child("name"),
            obj.name(),
            format!("the deployment is served by a Service of the same name: {e}"),
        );
    }
    if let Some(labels) = &obj.metadata.labels
        && labels.keys().any(|k| k.starts_with("kueue.x-k8s.io/"))
    {
        errs.not_supported_yet(
            &Path::new("metadata").child("labels"),
            "Kueue admission (kueue.x-k8s.io/ labels)",
        );
    }
    validate_model(s, &spec, &mut errs);
    let engine = validate_engine(s, &spec, &mut errs);
    validate_kv_cache(obj, &spec, &mut errs);
    super::router::router(obj, ctx, &spec, &mut errs);
    let rp = spec.child("roles");
    if s.roles.is_empty() {
        errs.required(&rp, "declare at least one role");
    } else if s.roles.len() > MAX_ROLES {
        errs.too_many(&rp, s.roles.len(), MAX_ROLES);
    }
    let mut names = BTreeSet::new();
    for (i, role) in s.roles.iter().enumerate() {
        let p = rp.index(i);
        if !role.name.is_empty() && !names.insert(role.name.as_str()) {
            errs.duplicate(&p.child("name"), &role.name, "role names must be unique");
        }
        validate_role(obj, role, engine, &p, ctx, &mut errs);
    }
    if !s.roles.is_empty() {
        super::router::role_kinds(s, &spec, &mut errs);
    }
    errs
}

fn validate_model(s: &ModelDeploymentSpec, spec: &Path, errs: &mut ErrorList) {
    let p = spec.child("model");
    match &s.model {
        None => errs.required(&p, "name the model to serve"),
        Some(m) => {
            if m.name.is_empty() {
                errs.required(
                    &p.child("name"),
                    "name the model to serve, e.g. Qwen/Qwen2.5-7B-Instruct",
                );
            } else {
                validation::max_len(&m.name, 253, &p.child("name"), errs);
            }
            if m.artifact_ref.is_some() {
                errs.not_supported_yet(&p.child("artifactRef"), "model artifacts");
            }
        }
    }
}

fn validate_engine(s: &ModelDeploymentSpec, spec: &Path, errs: &mut ErrorList) -> Option<EngineName> {
    let p = spec.child("engine");
    let Some(engine) = &s.engine else {
        errs.required(&p, "name the engine: vLLM or SGLang");
        return None;
    };
    if engine.name.is_none() {
        errs.required(&p.child("name"), "name the engine: vLLM or SGLang");
    }
    match engine.version.as_deref() {
        Some("") => errs.invalid(&p.child("version"), "", "must be 1 to 64 characters, or left out"),
        Some(v) => {
            validation::max_len(v, 64, &p.child("version"), errs);
        }
        None => {
            if let Some(role) = s.roles.iter().find(|r| r.image.is_none()) {
                errs.required(
                    &p.child("version"),
                    format!(
                        "role {:?} names no image, and its image is chosen from the engine version; give engine.version or the role's image",
                        role.name
                    ),
                );
            }
        }
    }
    engine.name
}

fn validate_kv_cache(obj: &ModelDeployment, spec: &Path, errs: &mut ErrorList) {
    let Some(kv) = &obj.spec.kv_cache else { return };
    let p = spec.child("kvCache").child("poolRef");
    match &kv.pool_ref {
        Some(r) if !r.name.is_empty() => {
            if let Err(e) = validation::dns1123_subdomain(&r.name) {
                errs.invalid(&p.child("name"), &r.name, e);
            }
            if let Some(ns) = &r.namespace {
                errs.forbidden(
                    &p.child("namespace"),
                    format!(
                        "a ModelDeployment attaches only through a KVCachePoolBinding in its own namespace ({:?}), so the reference takes no namespace (got {ns:?}); ask an administrator for a Binding in this namespace",
                        obj.namespace()
                    ),
                );
            }
        }
        _ => errs.required(
            &p.child("name"),
            "name a KVCachePoolBinding in this namespace: the Binding is what grants access to a shared cache",
        ),
    }
}

fn validate_role(
    obj: &ModelDeployment,
    role: &Role,
    engine: Option<EngineName>,
    p: &Path,
    ctx: &Context,
    errs: &mut ErrorList,
) {
    validate_role_name(obj, role, p, errs);
    validate_role_shape(role, p, errs);
    let instance = validate_instance_type(role, p, ctx, errs);
    validate_resources(role, instance.as_ref(), p, errs);
    validate_image(role, p, errs);
    if role.privileged == Some(true) {
        errs.not_supported_yet(&p.child("privileged"), "a privileged engine container");
    }
    validate_ports(role, p, errs);
    validate_volumes(role, p, errs);
    if role.shm_size.is_some() {
        errs.not_supported_yet(&p.child("shmSize"), "sizing /dev/shm");
    }
    if !role.command.is_empty() {
        errs.not_supported_yet(&p.child("command"), "replacing the engine command (take-over roles)");
    }
    if let Some(engine) = engine {
        validate_extra_args(role, engine, obj.spec.kv_cache.is_some(), p, ctx, errs);
        validate_env(role, engine, p, errs);
    }
    if role.topology.is_some() {
        errs.not_supported_yet(&p.child("topology"), "topology-aware placement");
    }
    if let Some(grace) = role.termination_grace_period_seconds
        && !(15..=3600).contains(&grace)
    {
        errs.invalid(
            &p.child("terminationGracePeriodSeconds"),
            grace,
            "must be between 15 and 3600",
        );
    }
    if role.elastic_ep.is_some() {
        errs.not_supported_yet(&p.child("elasticEp"), "elastic expert parallelism");
    }
}

/// The role's name: given, a DNS-1123 label, and short enough for the role's Service name.
fn validate_role_name(obj: &ModelDeployment, role: &Role, p: &Path, errs: &mut ErrorList) {
    let pn = p.child("name");
    if role.name.is_empty() {
        errs.required(&pn, "name the role, e.g. server");
    } else if let Err(e) = validation::dns1123_label(&role.name) {
        errs.invalid(&pn, &role.name, e);
    } else {
        let service = format!("{}-{}", obj.name(), role.name);
        if validation::dns1035_label(&service).is_err() {
            errs.invalid(
                &pn,
                &role.name,
                format!("the role's Service {service:?} must be a DNS-1035 label of at most 63 characters; shorten the deployment or role name"),
            );
        }
    }
}

/// The role's replicas and size (Pods per replica); its kind is judged with the other roles'
/// (`router.rs`).
fn validate_role_shape(role: &Role, p: &Path, errs: &mut ErrorList) {
    let replicas = role.replicas.unwrap_or(1);
    if !(1..=MAX_REPLICAS).contains(&replicas) {
        errs.invalid(&p.child("replicas"), replicas, "must be between 1 and 1024");
    }
    let size = role.size.unwrap_or(1);
    if !(1..=MAX_SIZE).contains(&size) {
        errs.invalid(&p.child("size"), size, "must be between 1 and 64");
    } else if size > 1 {
        errs.not_supported_yet(&p.child("size"), "a replica spanning more than one Pod (size > 1)");
    }
}

/// The role's image reference and the Secrets it is pulled with.
fn validate_image(role: &Role, p: &Path, errs: &mut ErrorList) {
    if let Some(image) = &role.image
        && validation::max_len(image, MAX_IMAGE, &p.child("image"), errs)
        && let Err(e) = validation::image_reference(image)
    {
        errs.invalid(&p.child("image"), image, e);
    }
    if role.image_pull_secrets.len() > MAX_PULL_SECRETS {
        errs.too_many(
            &p.child("imagePullSecrets"),
            role.image_pull_secrets.len(),
            MAX_PULL_SECRETS,
        );
    }
    for (i, r) in role.image_pull_secrets.iter().enumerate() {
        let pi = p.child("imagePullSecrets").index(i).child("name");
        if r.name.is_empty() {
            errs.required(&pi, "name the Secret that holds the registry credentials");
        } else if let Err(e) = validation::dns1123_subdomain(&r.name) {
            errs.invalid(&pi, &r.name, e);
        }
    }
}

fn validate_instance_type(
    role: &Role,
    p: &Path,
    ctx: &Context,
    errs: &mut ErrorList,
) -> Option<crate::config::InstanceType> {
    let pi = p.child("instanceType");
    let name = match role.instance_type.as_deref() {
        None | Some("") => {
            errs.required(&pi, "name the instance type the role runs on");
            return None;
        }
        Some(n) => n,
    };
    if !validation::max_len(name, 253, &pi, errs) {
        return None;
    }
    let found = ctx.config.get().instance_type(name).cloned();
    if found.is_none() {
        let config = ctx.config.get();
        let known: Vec<&str> = config.instance_types.iter().map(|t| t.name.as_str()).collect();
        errs.not_found(
            &pi,
            name,
            format!(
                "no such instance type in the server configuration (known: {})",
                known.join(", ")
            ),
        );
    }
    found
}

fn validate_resources(role: &Role, instance: Option<&crate::config::InstanceType>, p: &Path, errs: &mut ErrorList) {
    let Some(r) = &role.resources else { return };
    let p = p.child("resources");
    if let Some(q) = &r.accelerator {
        let pa = p.child("accelerator");
        if let Some(parsed) = validation::parse_quantity(q, &pa, errs) {
            match parsed.to_whole_i64() {
                Some(n) if n >= 0 => {
                    if let Some(t) = instance
                        && n > i64::from(t.accelerators)
                    {
                        errs.invalid(
                            &pa,
                            q.as_str(),
                            format!(
                                "instance type {:?} has {} accelerator(s) per replica",
                                t.name, t.accelerators
                            ),
                        );
                    }
                }
                _ => errs.invalid(&pa, q.as_str(), "must be a whole non-negative number of accelerators"),
            }
        }
    }
    if r.accelerator_sliced_memory_percentage.is_some() || r.accelerator_sliced_cores_percentage.is_some() {
        errs.not_supported_yet(&p, "accelerator slicing");
    }
    if r.accelerator_partitioned_profile.is_some() {
        errs.not_supported_yet(
            &p.child("acceleratorPartitionedProfile"),
            "accelerator partition profiles",
        );
    }
    if r.interface.is_some() {
        errs.not_supported_yet(&p.child("interface"), "fabric interfaces (RDMA/EFA)");
    }
}

fn validate_ports(role: &Role, p: &Path, errs: &mut ErrorList) {
    let mut seen = BTreeSet::new();
    for (i, port) in role.ports.iter().enumerate() {
        let pp = p.child("ports").index(i);
        if !(1..=65535).contains(&port.port) {
            errs.invalid(&pp.child("port"), port.port, "must be between 1 and 65535");
        }
        let proto = port.protocol.map_or("TCP", |pr| match pr {
            kvcache_api::model_deployment::PortProtocol::Tcp => "TCP",
            kvcache_api::model_deployment::PortProtocol::Udp => "UDP",
            kvcache_api::model_deployment::PortProtocol::Sctp => "SCTP",
        });
        if !seen.insert((port.port, proto)) {
            errs.duplicate(
                &pp,
                format!("{}/{proto}", port.port),
                "each port and protocol may appear once",
            );
        }
    }
}

fn validate_volumes(role: &Role, p: &Path, errs: &mut ErrorList) {
    let mut mounts = BTreeSet::new();
    for (i, v) in role.additional_volumes.iter().enumerate() {
        let pv = p.child("additionalVolumes").index(i);
        let pm = pv.child("mountPath");
        if v.mount_path.is_empty() {
            errs.required(&pm, "give an absolute mount path");
        } else if validation::max_len(&v.mount_path, MAX_MOUNT_PATH, &pm, errs) {
            let clean = v.mount_path.starts_with('/') && v.mount_path[1..].split('/').all(|c| !c.is_empty());
            if !clean {
                errs.invalid(
                    &pm,
                    &v.mount_path,
                    "must be an absolute path without a trailing '/' or empty elements",
                );
            } else if !mounts.insert(v.mount_path.as_str()) {
                errs.duplicate(&pm, &v.mount_path, "each mount path may appear once");
            }
        }
        if let Some(sub) = &v.sub_path
            && (sub.starts_with('/') || sub.split('/').any(|c| c == ".."))
        {
            errs.invalid(&pv.child("subPath"), sub, "must be a relative path without '..'");
        }
        if v.host_path.is_some() {
            errs.not_supported_yet(&pv.child("hostPath"), "mounting host paths into engines");
        }
        let sources =
            usize::from(v.config_map.is_some()) + usize::from(v.secret.is_some()) + usize::from(v.host_path.is_some());
        if sources == 0 {
            errs.required(&pv, "name the volume's source: configMap or secret");
        } else if sources > 1 {
            errs.forbidden(&pv, "name exactly one source: configMap or secret");
        }
    }
}

/// The flag a token sets, normalised: `--kv_transfer_config=x` → `kv-transfer-config`; for vLLM
/// a dotted member (`--kv-transfer-config.kv_role`) sets its parent.
fn flag_of(token: &str, engine: EngineName) -> Option<String> {
    let body = token.strip_prefix("--")?;
    let name = body.split_once('=').map_or(body, |(k, _)| k);
    let name = match engine {
        EngineName::Vllm => name.split_once('.').map_or(name, |(k, _)| k),
        EngineName::Sglang => name,
    };
    (!name.is_empty()).then(|| name.replace('_', "-"))
}

/// Whether `flag` is `owned` or an abbreviation the engine's parser would expand to it.
fn sets(flag: &str, owned: &str) -> bool {
    flag == owned || (owned.starts_with(flag) && flag.len() > 3 && flag.contains('-'))
}

fn validate_extra_args(role: &Role, engine: EngineName, attached: bool, p: &Path, ctx: &Context, errs: &mut ErrorList) {
    let dtype_owned = attached && ctx.config.get().settings.model_deployment_kv_cache_dtype_owned;
    for (i, token) in role.extra_args.iter().enumerate() {
        let Some(flag) = flag_of(token, engine) else { continue };
        let pi = p.child("extraArgs").index(i);
        if let Some(owned) = owned_args(engine).iter().find(|o| sets(&flag, o)) {
            errs.forbidden(
                &pi,
                format!(
                    "--{owned} is rendered by the operator for {}; remove it (or take over the whole command with roles[].command, not supported yet)",
                    engine.as_str()
                ),
            );
        } else if dtype_owned && sets(&flag, "kv-cache-dtype") {
            errs.forbidden(
                &pi,
                "--kv-cache-dtype comes from the attached KVCachePoolBinding's domain.dtype, so every engine reads the shared cache in the same type; remove it",
            );
        } else if attached && sets(&flag, block_size_flag(engine)) {
            errs.forbidden(
                &pi,
                format!(
                    "--{} comes from the attached KVCachePoolBinding's domain.blockSize, so every engine's cache blocks are the domain's; remove it",
                    block_size_flag(engine)
                ),
            );
        }
    }
}

fn validate_env(role: &Role, engine: EngineName, p: &Path, errs: &mut ErrorList) {
    let mut seen = BTreeSet::new();
    for (i, e) in role.env.iter().enumerate() {
        let pn = p.child("env").index(i).child("name");
        if e.name.is_empty() {
            errs.required(&pn, "an environment variable needs a name");
            continue;
        }
        if !seen.insert(e.name.as_str()) {
            errs.duplicate(&pn, &e.name, "each name may appear once");
            continue;
        }
        if owned_env(engine).contains(&e.name.as_str()) || OWNED_ENV_ALL.contains(&e.name.as_str()) {
            errs.forbidden(
                &pn,
                format!("{:?} is set by the operator for {}; remove it", e.name, engine.as_str()),
            );
        }
    }
}
