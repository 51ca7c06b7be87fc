//! The router's part of a deployment's decisions: the router `spec.router` plans ([`router`]),
//! the ROLES column with the router first ([`role_summary`]), and RouterReady
//! ([`router_ready_of`]). Table-tested in `router/tests.rs`.

use kvcache_api::ModelDeployment;
use kvcache_api::conditions::model_deployment::router_ready;
use kvcache_api::conditions::{self, ConditionStatus, Observation};
use kvcache_api::model_deployment::{EngineName, RoleKind, RoleStatus};

use crate::runtime::{ENGINE_EVENTS_PORT, ENGINE_REPLAY_PORT, Replica, RouterObservation, RouterPlan, RouterRole};

/// The ROLES column: `<n>R` ready router replicas first when a router is declared, then the
/// ready replicas of each kind in the order the kinds first appear, roles of one kind summed
/// (`1R1P1D`, `1R2S`, `2S`); a declared kind with none ready shows 0.
pub fn role_summary(roles: &[RoleStatus], router_ready: Option<i32>) -> String {
    let mut out = router_ready.map(|n| format!("{n}R")).unwrap_or_default();
    let mut kinds: Vec<(&str, i32)> = Vec::new();
    for r in roles {
        match kinds.iter_mut().find(|(k, _)| *k == r.kind) {
            Some((_, n)) => *n += r.ready,
            None => kinds.push((&r.kind, r.ready)),
        }
    }
    for (kind, n) in kinds {
        out.push_str(&format!("{n}{}", &kind[..1]));
    }
    out
}

/// RouterReady: True (NotApplicable) with no router and no Prefill/Decode role; False (NoRouter)
/// when Prefill and Decode roles run with no router to pair them; with a router, False
/// (RenderFailed) when the runtime cannot run it, False (NoReadyReplicas) while none of its
/// replicas answers `/health`, else True (Ready).
pub(super) fn router_ready_of(obj: &ModelDeployment, router: Option<&RouterObservation>) -> Observation {
    let o = |status, reason: conditions::Reason, msg: String| Observation::new(router_ready::TYPE, status, reason, msg);
    let split = obj
        .spec
        .roles
        .iter()
        .any(|r| matches!(r.kind, Some(RoleKind::Prefill | RoleKind::Decode)));
    if obj.spec.router.is_none() {
        return if split {
            o(
                ConditionStatus::False,
                router_ready::NO_ROUTER,
                "the Prefill and Decode roles run, but nothing pairs the roles: without spec.router no request is split between them; add router: {name: kvcache-router}".into(),
            )
        } else {
            o(
                ConditionStatus::True,
                router_ready::NOT_APPLICABLE,
                "no router is declared: clients reach the replicas directly".into(),
            )
        };
    }
    let Some(r) = router else {
        return o(
            ConditionStatus::False,
            router_ready::NO_READY_REPLICAS,
            "the router has not been observed yet".into(),
        );
    };
    if let Some(why) = &r.state.refused {
        return o(ConditionStatus::False, router_ready::RENDER_FAILED, why.clone());
    }
    if r.ready > 0 {
        let at = r.url.as_deref().map(|u| format!(" at {u}")).unwrap_or_default();
        return o(
            ConditionStatus::True,
            router_ready::READY,
            format!("{} of {} router replicas are ready{at}", r.ready, r.replicas),
        );
    }
    let fault = r
        .state
        .waiting
        .as_ref()
        .map(|(reason, msg)| format!("; {reason}: {msg}"))
        .or_else(|| {
            r.state
                .last_exit
                .as_ref()
                .map(|e| format!("; it ended ({})", e.describe()))
        })
        .unwrap_or_default();
    o(
        ConditionStatus::False,
        router_ready::NO_READY_REPLICAS,
        format!(
            "0 of {} router replicas are ready: a router is ready once a Decode or Server replica behind it answers /health{fault}",
            r.replicas
        ),
    )
}

/// The router `spec.router` asks for, in front of `replicas` (each role's serving port is its
/// replicas'); `None` without `spec.router`. The image is the router's own, else the store's
/// image setting, which ships `kv-router` next to `kv-store`. With replicas of our store, the
/// router follows that store ([`store_env`]).
pub fn router(obj: &ModelDeployment, replicas: &[Replica], config: &crate::config::Config) -> Option<RouterPlan> {
    let r = obj.spec.router.as_ref()?;
    let engine = obj
        .spec
        .engine
        .as_ref()
        .and_then(|e| e.name)
        .unwrap_or(EngineName::Vllm);
    let roles = obj
        .spec
        .roles
        .iter()
        .map(|role| RouterRole {
            role: role.name.clone(),
            kind: role.kind.unwrap_or(RoleKind::Server),
            port: replicas
                .iter()
                .find(|x| x.role == role.name)
                .map_or_else(|| crate::controller::engine::default_port(engine), |x| x.engine.port),
        })
        .collect();
    let image = r
        .image
        .as_deref()
        .map(str::trim)
        .filter(|i| !i.is_empty())
        .map(str::to_owned)
        .or_else(|| {
            let setting = config.settings.kv_cache_backend_image.trim();
            (!setting.is_empty()).then(|| setting.to_owned())
        })
        .ok_or_else(|| {
            "the router names no image and the server setting kvCacheBackendImage is blank; set one of the two"
                .to_owned()
        });
    let mut args = Vec::new();
    if let Some(m) = obj.spec.model.as_ref().filter(|m| !m.name.is_empty()) {
        args.extend(["--model".to_owned(), m.name.clone()]);
    }
    if let Some(n) = r.request_timeout_seconds {
        args.extend(["--request-timeout-seconds".to_owned(), n.to_string()]);
    }
    if let Some(n) = r.disaggregation_threshold_tokens {
        args.extend(["--disaggregation-threshold-tokens".to_owned(), n.to_string()]);
    }
    if engine == EngineName::Vllm {
        // where each replica publishes its KV events (`engine::routed_args`)
        args.extend([
            "--engine-events-ports".to_owned(),
            format!("{ENGINE_EVENTS_PORT},{ENGINE_REPLAY_PORT}"),
        ]);
    }
    args.extend(r.extra_args.iter().cloned());
    // the first replica of our store (the one that loads our `kvcache` package): every replica
    // of a deployment has the same cache
    let ours = replicas.iter().find(|x| x.package_image.is_some());
    Some(RouterPlan {
        name: r.name.clone().unwrap_or_default(),
        replicas: r.replicas.unwrap_or(1).max(1),
        image,
        pull_policy: r
            .image_pull_policy
            .and_then(|p| serde_json::to_value(p).ok().and_then(|v| v.as_str().map(str::to_owned))),
        pull_secrets: r.image_pull_secrets.iter().map(|s| s.name.clone()).collect(),
        args,
        roles,
        store_env: ours.map(store_env).unwrap_or_default(),
        credential: ours.and_then(|x| x.credential.clone()),
    })
}

/// What names our store to a replica, which the router reads the same way (its
/// `store_index.rs`).
pub const STORE_ENV: [&str; 6] = [
    "KVSTORE_LEADER",
    "KVSTORE_TENANT",
    "KVSTORE_BLOCK_SIZE",
    "KVSTORE_DTYPE",
    crate::controller::injection::STORE_CA_ENV,
    crate::controller::injection::STORE_SERVER_NAME_ENV,
];

/// [`STORE_ENV`] as replica `r` of our store receives it.
fn store_env(r: &Replica) -> Vec<(String, String)> {
    STORE_ENV
        .iter()
        .filter_map(|name| r.env.iter().find(|(k, _)| k == name).cloned())
        .collect()
}

#[cfg(test)]
mod tests;
