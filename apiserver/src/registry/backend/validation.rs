//! Object rules of a `KVCacheBackend`, on create and (ratcheted) on update.

use kvcache_api::backend::{
    BackendSpec, Connection, ElectionBackend, EndpointName, External, HostPath, KVCacheBackend, Leader, Managed,
    Medium, MemberGroup,
};
use kvcache_api::common::{Protocol, Transport};

use super::passthrough::{self, Side};
use crate::field::{ErrorList, Path};
use crate::registry::Context;
use crate::registry::validation;

const MAX_LEADER_REPLICAS: i32 = 5;
const MAX_MEMBER_GROUPS: usize = 32;
const MAX_PULL_SECRETS: usize = 32;
const MAX_HOST_PATHS: usize = 32;
const MAX_IMAGE: usize = 512;
const MAX_ADDRESS: usize = 259;
const MAX_HOST_PATH: usize = 1024;
const MAX_SCALE_IN_GRACE: i32 = 3600;

fn spec() -> Path {
    Path::new("spec")
}

fn managed_path() -> Path {
    spec().child("connection").child("managed")
}

/// Every object rule.
pub fn validate(obj: &KVCacheBackend, ctx: &Context) -> ErrorList {
    let mut errs = ErrorList::new();
    let s = &obj.spec;
    validate_pull_secrets(s, &mut errs);
    validate_transport(s.transport.as_ref(), &spec().child("transport"), &mut errs);
    let Some(connection) = validate_branch(s.connection.as_ref(), &mut errs) else {
        return errs;
    };
    match connection {
        Branch::Managed(m) => {
            validate_rendered_names(obj.name(), m.members.len(), &mut errs);
            validate_image(s, ctx, &mut errs);
            validate_managed(m, &mut errs);
        }
        Branch::External(e) => validate_external(e, &mut errs),
    }
    errs
}

enum Branch<'a> {
    Managed(&'a Managed),
    External(&'a External),
}

fn validate_branch<'a>(c: Option<&'a Connection>, errs: &mut ErrorList) -> Option<Branch<'a>> {
    let p = spec().child("connection");
    match c.map(|c| (c.managed.as_ref(), c.external.as_ref())) {
        Some((Some(m), None)) => Some(Branch::Managed(m)),
        Some((None, Some(e))) => Some(Branch::External(e)),
        Some((Some(_), Some(_))) => {
            errs.forbidden(&p, "only one of managed or external may be given");
            None
        }
        _ => {
            errs.required(
                &p,
                "name one of managed (a store this operator runs) or external (endpoints of a store run elsewhere)",
            );
            None
        }
    }
}

/// Every object a managed backend renders is named after it; each name must be a DNS-1035
/// label. One error, naming the first rendered object that does not fit.
fn validate_rendered_names(name: &str, groups: usize, errs: &mut ErrorList) {
    let rendered = std::iter::once(format!("{name}-leader")).chain((0..groups).map(|i| format!("{name}-member-{i}")));
    for r in rendered {
        if validation::dns1035_label(&r).is_err() {
            errs.invalid(
                &Path::new("metadata").child("name"),
                name,
                format!(
                    "a managed backend names its workloads after itself, and {r:?} is not a valid DNS-1035 label (at most 63 lowercase letters, digits or '-', starting with a letter); choose a shorter name without dots"
                ),
            );
            return;
        }
    }
}

fn validate_image(s: &BackendSpec, ctx: &Context, errs: &mut ErrorList) {
    let p = spec().child("image");
    match s.image.as_deref() {
        Some(image) => check_image(image, &p, errs),
        None => {
            if ctx.config.get().settings.kv_cache_backend_image.trim().is_empty() {
                errs.required(
                    &p,
                    "no image is named here and the server setting kvCacheBackendImage (kv-cache-backend-image) is blank; set one of the two",
                );
            }
        }
    }
}

fn check_image(image: &str, p: &Path, errs: &mut ErrorList) {
    if !validation::max_len(image, MAX_IMAGE, p, errs) {
        return;
    }
    if image.trim().is_empty() {
        errs.invalid(p, image, "name an image or leave the field out");
    } else if let Err(e) = validation::image_reference(image) {
        errs.invalid(p, image, e);
    }
}

fn validate_pull_secrets(s: &BackendSpec, errs: &mut ErrorList) {
    let p = spec().child("imagePullSecrets");
    if s.image_pull_secrets.len() > MAX_PULL_SECRETS {
        errs.too_many(&p, s.image_pull_secrets.len(), MAX_PULL_SECRETS);
    }
    for (i, r) in s.image_pull_secrets.iter().enumerate() {
        let pn = p.index(i).child("name");
        if r.name.is_empty() {
            errs.required(&pn, "name the Secret that holds the registry credentials");
        } else if let Err(e) = validation::dns1123_subdomain(&r.name) {
            errs.invalid(&pn, &r.name, e);
        }
    }
}

fn validate_transport(t: Option<&Transport>, p: &Path, errs: &mut ErrorList) {
    if let Some(proto) = t.and_then(|t| t.protocol)
        && !proto.is_supported()
    {
        errs.not_supported_yet(
            &p.child("protocol"),
            &format!("the {} transport (only Auto and TCP are)", proto.as_str()),
        );
    }
}

fn validate_managed(m: &Managed, errs: &mut ErrorList) {
    let p = managed_path();
    match &m.leader {
        None => errs.required(&p.child("leader"), "give the leader block; {} takes every default"),
        Some(l) => validate_leader(l, &p.child("leader"), errs),
    }
    if m.members.is_empty() {
        errs.required(&p.child("members"), "a managed backend needs at least one member group");
    } else if m.members.len() > MAX_MEMBER_GROUPS {
        errs.too_many(&p.child("members"), m.members.len(), MAX_MEMBER_GROUPS);
    }
    for (i, g) in m.members.iter().enumerate() {
        validate_group(g, &p.child("members").index(i), errs);
    }
    super::tier::one_tier_group(m, &p.child("members"), errs);
    if let Some(grace) = m.scale_in.as_ref().and_then(|s| s.grace_period_seconds) {
        let pg = p.child("scaleIn").child("gracePeriodSeconds");
        if grace < 0 {
            errs.invalid(&pg, grace, "must be greater than or equal to 0");
        } else if grace > MAX_SCALE_IN_GRACE {
            errs.invalid(&pg, grace, "must be at most 3600: a member refuses a longer drain wait");
        }
    }
}

fn validate_leader(l: &Leader, p: &Path, errs: &mut ErrorList) {
    let replicas = l.replicas.unwrap_or(1);
    let pr = p.child("replicas");
    if replicas < 1 {
        errs.invalid(&pr, replicas, "must be greater than or equal to 1");
    } else if replicas > MAX_LEADER_REPLICAS {
        errs.invalid(
            &pr,
            replicas,
            "must be at most 5: only one leader serves, the others are standbys waiting to take over",
        );
    } else if replicas > 1 && l.election_backend == Some(ElectionBackend::None) {
        errs.invalid(
            &pr,
            replicas,
            "more than one leader replica needs electionBackend: Kubernetes (with None every replica would serve alone)",
        );
    }
    passthrough::args(Side::Leader, &l.extra_args, &p.child("extraArgs"), errs);
    passthrough::env(Side::Leader, &l.extra_env, &p.child("extraEnv"), errs);
}

fn validate_group(g: &MemberGroup, p: &Path, errs: &mut ErrorList) {
    match &g.node_selector {
        None => errs.required(
            &p.child("nodeSelector"),
            "select the nodes of this group; {} selects every node",
        ),
        Some(sel) => validation::labels(sel, &p.child("nodeSelector"), errs),
    }
    match g.medium {
        None => errs.required(&p.child("medium"), "name the medium of the segments: DRAM"),
        Some(Medium::Vram) => {
            errs.not_supported_yet(&p.child("medium"), "VRAM (device memory) as a member medium (DRAM is)")
        }
        Some(Medium::Dram) => {}
    }
    match &g.capacity_per_member {
        None => errs.required(
            &p.child("capacityPerMember"),
            "give the memory each member contributes, e.g. 8Gi",
        ),
        Some(q) => {
            validation::byte_quantity(q, &p.child("capacityPerMember"), false, errs);
        }
    }
    if let Some(q) = &g.local_buffer_size {
        validation::byte_quantity(q, &p.child("localBufferSize"), true, errs);
    }
    passthrough::args(Side::Member, &g.extra_args, &p.child("extraArgs"), errs);
    passthrough::env(Side::Member, &g.extra_env, &p.child("extraEnv"), errs);
    if let Some(image) = &g.image {
        check_image(image, &p.child("image"), errs);
    }
    super::tier::validate(g, p, errs);
    validate_transport(g.transport.as_ref(), &p.child("transport"), errs);
    if let Some(count) = g.fabric_interface_count
        && count < 1
    {
        errs.invalid(
            &p.child("fabricInterfaceCount"),
            count,
            "must be greater than or equal to 1",
        );
    }
    validate_host_paths(&g.host_paths, &p.child("hostPaths"), errs);
    if let Some(rc) = &g.runtime_class_name
        && let Err(e) = validation::dns1123_subdomain(rc)
    {
        errs.invalid(&p.child("runtimeClassName"), rc, e);
    }
}

/// `^(/[^/]+)+$`: absolute, no trailing slash, no empty component.
fn is_clean_absolute(path: &str) -> bool {
    path.starts_with('/') && path[1..].split('/').all(|c| !c.is_empty())
}

/// Whether two absolute paths are equal or one contains the other, by path element.
pub fn overlaps(a: &str, b: &str) -> bool {
    let ea: Vec<&str> = a.split('/').filter(|c| !c.is_empty()).collect();
    let eb: Vec<&str> = b.split('/').filter(|c| !c.is_empty()).collect();
    let n = ea.len().min(eb.len());
    ea[..n] == eb[..n]
}

fn validate_host_paths(paths: &[HostPath], p: &Path, errs: &mut ErrorList) {
    if paths.len() > MAX_HOST_PATHS {
        errs.too_many(p, paths.len(), MAX_HOST_PATHS);
    }
    for (i, hp) in paths.iter().enumerate() {
        let pi = p.index(i);
        for (name, value) in [("path", &hp.path), ("mountPath", &hp.mount_path)] {
            let pf = pi.child(name);
            if value.is_empty() {
                errs.required(&pf, "give an absolute path");
            } else if validation::max_len(value, MAX_HOST_PATH, &pf, errs) && !is_clean_absolute(value) {
                errs.invalid(
                    &pf,
                    value,
                    "must be an absolute path without a trailing '/' or empty elements (^(/[^/]+)+$)",
                );
            }
        }
        if hp.mount_path.is_empty() || !is_clean_absolute(&hp.mount_path) {
            continue;
        }
        if overlaps(&hp.mount_path, "/dev/infiniband") {
            errs.forbidden(
                &pi.child("mountPath"),
                "mounting over /dev/infiniband is not allowed: the operator owns the fabric devices",
            );
        }
        if let Some(j) = paths[..i]
            .iter()
            .position(|earlier| is_clean_absolute(&earlier.mount_path) && overlaps(&earlier.mount_path, &hp.mount_path))
        {
            errs.invalid(
                &pi.child("mountPath"),
                &hp.mount_path,
                format!("overlaps the mountPath of hostPaths[{j}]; mounts may not nest or repeat"),
            );
        }
    }
}

fn validate_external(e: &External, errs: &mut ErrorList) {
    let p = spec().child("connection").child("external").child("endpoints");
    let mut seen: Vec<EndpointName> = Vec::new();
    for (i, ep) in e.endpoints.iter().enumerate() {
        let pi = p.index(i);
        match ep.name {
            None => errs.required(&pi.child("name"), "name the endpoint: Client or Admin"),
            Some(n) if seen.contains(&n) => {
                errs.duplicate(&pi.child("name"), n.as_str(), "each endpoint name may appear once")
            }
            Some(n) => seen.push(n),
        }
        let pa = pi.child("address");
        if ep.address.is_empty() {
            errs.required(&pa, "give the endpoint as host:port");
        } else if validation::max_len(&ep.address, MAX_ADDRESS, &pa, errs)
            && let Err(msg) = validation::host_port(&ep.address)
        {
            errs.invalid(&pa, &ep.address, msg);
        }
    }
    for needed in [EndpointName::Client, EndpointName::Admin] {
        if !seen.contains(&needed) {
            let role = match needed {
                EndpointName::Client => "the address engines dial",
                EndpointName::Admin => "the address the operator reads health, metrics and segments from",
            };
            errs.required(
                &p,
                format!("an endpoint named {} is required ({role})", needed.as_str()),
            );
        }
    }
}

/// Warnings that never refuse: settings that have no effect as written.
pub fn warnings(obj: &KVCacheBackend) -> Vec<String> {
    let mut out = Vec::new();
    let Some(m) = obj.spec.managed() else { return out };
    let backend_protocol = obj
        .spec
        .transport
        .as_ref()
        .and_then(|t| t.protocol)
        .unwrap_or(Protocol::Auto);
    for (i, g) in m.members.iter().enumerate() {
        let effective = g
            .transport
            .as_ref()
            .map_or(backend_protocol, |t| t.protocol.unwrap_or(Protocol::Auto));
        if g.fabric_interface_count.is_some() && !matches!(effective, Protocol::Rdma | Protocol::Efa) {
            out.push(format!(
                "spec.connection.managed.members[{i}].fabricInterfaceCount has no effect: the group's transport is {}, not RDMA or EFA",
                effective.as_str()
            ));
        }
        if g.local_disks.first().and_then(|d| d.clean_after_delete) == Some(true) {
            out.push(format!(
                "spec.connection.managed.members[{i}].localDisks[0].cleanAfterDelete: the local runtime empties the \
                 tier when the backend is deleted; in a cluster (--runtime kubernetes) it is not emptied yet, so empty \
                 the directory on the nodes yourself after deleting the backend"
            ));
        }
    }
    out
}
