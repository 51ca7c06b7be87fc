//! Object rules of prefill/decode and of the router: which role kinds may be combined
//! ([`role_kinds`]), `spec.router` ([`router`]) with its `extraArgs` checked against the flags
//! `kv-router` has, and `spec.kvTransfer`, refused because the handoff goes through the store.
//!
//! A router `extraArgs` entry is one flag of `kv-router`, `--flag=value` (as a backend's
//! `extraArgs`, `registry/backend/passthrough.rs`), checked against the flags the router really
//! has and parsed as it parses them; the flags the server renders from the spec are refused, so
//! an extra argument never silently overrides a spec field.

use kvcache_api::model_deployment::{
    EngineName, KVCACHE_ROUTER, ModelDeployment, ModelDeploymentSpec, RoleKind, Router,
};

use clap::{CommandFactory, Parser};
use kvcache_router::config::Config;

use crate::field::{ErrorList, ErrorType, FieldError, Path};
use crate::registry::Context;
use crate::registry::extra_args::{self, first_line};
use crate::registry::validation;

const MAX_IMAGE: usize = 512;
const MAX_PULL_SECRETS: usize = 32;

/// The reference's routers, which this server does not run.
const EXTERNAL_ROUTERS: &[&str] = &["llm-d-router", "vllm-router", "sglang-gateway"];

/// `kv-router` flags the server renders: the listen address, the served model, where the workers
/// come from, and the two spec fields.
pub const ROUTER_OWNED: &[&str] = &[
    "listen",
    "model",
    "workers-file",
    "workers-dns",
    "request-timeout-seconds",
    "disaggregation-threshold-tokens",
];

/// The role kinds together: `Server` never with `Prefill`/`Decode`; `Prefill` and `Decode` each
/// need the other, at most one role of each, with a cache to hand over through and vLLM (whose
/// `kv_transfer_params` carry the handoff).
pub fn role_kinds(s: &ModelDeploymentSpec, spec: &Path, errs: &mut ErrorList) {
    let rp = spec.child("roles");
    let kind = |i: usize| s.roles[i].kind.unwrap_or(RoleKind::Server);
    let first = |k: RoleKind| (0..s.roles.len()).find(|&i| kind(i) == k);
    let (server, prefill, decode) = (
        first(RoleKind::Server),
        first(RoleKind::Prefill),
        first(RoleKind::Decode),
    );
    if let Some(si) = server {
        for i in (0..s.roles.len()).filter(|&i| kind(i) != RoleKind::Server) {
            errs.forbidden(
                &rp.index(i).child("kind"),
                format!(
                    "a {} role cannot share a deployment with Server roles (role {:?} is Server): a deployment either serves whole requests or splits them between Prefill and Decode",
                    kind(i).as_str(),
                    s.roles[si].name
                ),
            );
        }
        return;
    }
    for k in [RoleKind::Prefill, RoleKind::Decode] {
        let Some(at) = first(k) else { continue };
        for i in (at + 1..s.roles.len()).filter(|&i| kind(i) == k) {
            errs.duplicate(
                &rp.index(i).child("kind"),
                k.as_str(),
                format!(
                    "only Server may appear in more than one role; give the {} role {:?} more replicas instead",
                    k.as_str(),
                    s.roles[at].name
                ),
            );
        }
    }
    match (prefill, decode) {
        (Some(p), None) => errs.invalid(
            &rp.index(p).child("kind"),
            "Prefill",
            "a Prefill role needs a Decode role: prefill computes a prompt's KV and Decode generates from it; add a role of kind Decode",
        ),
        (None, Some(d)) => errs.invalid(
            &rp.index(d).child("kind"),
            "Decode",
            "a Decode role needs a Prefill role to hand it the prompt's KV; add a role of kind Prefill, or make this role a Server",
        ),
        _ => {}
    }
    let Some(at) = prefill.or(decode) else { return };
    if s.kv_cache.is_none() {
        errs.required(
            &spec.child("kvCache"),
            format!(
                "role {:?} is {}: Prefill hands a prompt's KV to Decode through the shared store, so the deployment needs kvCache.poolRef",
                s.roles[at].name,
                kind(at).as_str()
            ),
        );
    }
    if s.engine.as_ref().and_then(|e| e.name) == Some(EngineName::Sglang) {
        errs.forbidden(
            &rp.index(at).child("kind"),
            "Prefill and Decode roles are supported for vLLM only yet (the handoff rides on vLLM's kv_transfer_params); use Server roles with SGLang",
        );
    }
}

/// `spec.router` and `spec.kvTransfer`.
pub fn router(obj: &ModelDeployment, ctx: &Context, spec: &Path, errs: &mut ErrorList) {
    if obj.spec.kv_transfer.is_some() {
        errs.forbidden(
            &spec.child("kvTransfer"),
            "there is no direct prefill-to-decode KV transfer leg: Prefill hands a prompt's KV to Decode through the shared store (spec.kvCache), and spec.router pairs them; remove kvTransfer",
        );
    }
    let Some(r) = &obj.spec.router else { return };
    let p = spec.child("router");
    router_name(r, &p, errs);
    let rendered = format!("{}-router", obj.name());
    if !obj.name().is_empty() && validation::dns1035_label(&rendered).is_err() {
        errs.invalid(
            &Path::new("metadata").child("name"),
            obj.name(),
            format!("the router's Deployment and Service are named {rendered:?}, which must be a DNS-1035 label of at most 63 characters; shorten the deployment's name"),
        );
    }
    for (i, role) in obj.spec.roles.iter().enumerate() {
        let workers = format!("{}-{}-workers", obj.name(), role.name);
        if !role.name.is_empty() && validation::dns1035_label(&workers).is_err() {
            errs.invalid(
                &spec.child("roles").index(i).child("name"),
                &role.name,
                format!("the router finds the role's replicas through the headless Service {workers:?}, which must be a DNS-1035 label of at most 63 characters; shorten the deployment or role name"),
            );
        }
    }
    if let Some(n) = r.replicas
        && n < 1
    {
        errs.invalid(&p.child("replicas"), n, "must be greater than or equal to 1");
    }
    if let Some(n) = r.request_timeout_seconds
        && n < 1
    {
        errs.invalid(
            &p.child("requestTimeoutSeconds"),
            n,
            "must be greater than or equal to 1 (seconds a request may take end to end); leave it out for the router's default of 600",
        );
    }
    if let Some(n) = r.disaggregation_threshold_tokens
        && n < 0
    {
        errs.invalid(
            &p.child("disaggregationThresholdTokens"),
            n,
            "must be greater than or equal to 0 (0: every prompt goes through prefill)",
        );
    }
    router_image(r, ctx, &p, errs);
    args(&r.extra_args, &p.child("extraArgs"), errs);
}

fn router_name(r: &Router, p: &Path, errs: &mut ErrorList) {
    let pn = p.child("name");
    match r.name.as_deref() {
        None | Some("") => errs.required(&pn, format!("name the router: {KVCACHE_ROUTER}")),
        Some(KVCACHE_ROUTER) => {}
        Some(other) => {
            let detail = if EXTERNAL_ROUTERS.contains(&other) {
                format!(
                    "this server does not run the reference's external routers; use {KVCACHE_ROUTER:?}, our router, which pairs Prefill and Decode through the store and balances Server replicas"
                )
            } else {
                format!("supported values: {KVCACHE_ROUTER:?}")
            };
            errs.push(FieldError {
                kind: ErrorType::NotSupported,
                field: pn,
                value: Some(format!("{other:?}")),
                detail,
            });
        }
    }
}

fn router_image(r: &Router, ctx: &Context, p: &Path, errs: &mut ErrorList) {
    let pi = p.child("image");
    match r.image.as_deref() {
        Some(image) => {
            if !validation::max_len(image, MAX_IMAGE, &pi, errs) {
                // too long: said
            } else if image.trim().is_empty() {
                errs.invalid(&pi, image, "name an image or leave the field out");
            } else if let Err(e) = validation::image_reference(image) {
                errs.invalid(&pi, image, e);
            }
        }
        None => {
            if ctx.config.get().settings.kv_cache_backend_image.trim().is_empty() {
                errs.required(
                    &pi,
                    "no image is named here and the server setting kvCacheBackendImage (kv-cache-backend-image), whose store image ships kv-router, is blank; set one of the two",
                );
            }
        }
    }
    let ps = p.child("imagePullSecrets");
    if r.image_pull_secrets.len() > MAX_PULL_SECRETS {
        errs.too_many(&ps, r.image_pull_secrets.len(), MAX_PULL_SECRETS);
    }
    for (i, s) in r.image_pull_secrets.iter().enumerate() {
        let pn = ps.index(i).child("name");
        if s.name.is_empty() {
            errs.required(&pn, "name the Secret that holds the registry credentials");
        } else if let Err(e) = validation::dns1123_subdomain(&s.name) {
            errs.invalid(&pn, &s.name, e);
        }
    }
}

/// Checks the router's `extraArgs` (`registry/extra_args.rs`) against the flags of `kv-router`
/// (its one definition of them, `kvcache_router::config::Config`). Every one of them takes a
/// value, written in the same entry.
pub fn args(entries: &[String], field: &Path, errs: &mut ErrorList) {
    let known: Vec<String> = Config::command()
        .get_arguments()
        .filter_map(|a| a.get_long().map(str::to_owned))
        .filter(|l| l != "help" && l != "version")
        .collect();
    let parse = |entry: &str| {
        let flag = entry.trim_start_matches("--");
        if !flag.contains('=') {
            return Err(format!("--{flag} takes a value: write --{flag}=VALUE in one entry"));
        }
        Config::try_parse_from(["kv-router", entry])
            .map(drop)
            .map_err(first_line)
    };
    let flags = extra_args::Flags {
        binary: "kv-router",
        form: "--flag=value",
        known,
        owned: ROUTER_OWNED,
        owned_by: " (listen address, model, workers, spec.router fields)",
        parse: &parse,
    };
    extra_args::check(&flags, entries, field, errs);
}
