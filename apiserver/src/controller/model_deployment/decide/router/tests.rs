//! The router's part of a deployment's status (ROLES, `status.router`, RouterReady, phase,
//! endpoint) and the router the spec plans, as tables.

use kvcache_api::conditions::model_deployment::router_ready;
use serde_json::json;

use super::super::{Resolved, attach, replicas, report};
use super::*;
use crate::runtime::{ReplicaObservation, WorkloadState};

/// A deployment of `roles` (`[name, kind, replicas]`), with our router when `routed`.
fn deployment(roles: &[(&str, &str, i32)], routed: bool) -> ModelDeployment {
    let roles: Vec<_> = roles
        .iter()
        .map(|(name, kind, replicas)| json!({"name": name, "kind": kind, "replicas": replicas}))
        .collect();
    let mut v = json!({
        "metadata": {"name": "qwen-pd", "namespace": "team-a", "generation": 2},
        "spec": {"model": {"name": "Qwen/Qwen3-0.6B"}, "engine": {"name": "vLLM"}, "roles": roles},
    });
    if routed {
        v["spec"]["router"] = json!({"name": "kvcache-router", "replicas": 1});
    }
    serde_json::from_value(v).unwrap()
}

fn ready_replica(role: &str, i: usize) -> ReplicaObservation {
    ReplicaObservation {
        name: format!("{role}-{i}"),
        role: role.into(),
        state: WorkloadState {
            running: true,
            ready: true,
            ..WorkloadState::default()
        },
        url: Some(format!("http://127.0.0.1:{}", 9000 + i)),
        ..ReplicaObservation::default()
    }
}

fn router(ready: i32, refused: Option<&str>) -> RouterObservation {
    RouterObservation {
        replicas: 1,
        ready,
        url: Some("http://127.0.0.1:8800".into()),
        state: WorkloadState {
            running: refused.is_none(),
            ready: ready > 0,
            refused: refused.map(str::to_owned),
            ..WorkloadState::default()
        },
    }
}

const PD: &[(&str, &str, i32)] = &[("prefill", "Prefill", 1), ("decode", "Decode", 1)];

/// case, roles, routed, the router's observation, ROLES, RouterReady, phase, endpoint
type Case = (
    &'static str,
    &'static [(&'static str, &'static str, i32)],
    bool,
    Option<RouterObservation>,
    &'static str,
    &'static str,
    &'static str,
    Option<&'static str>,
);

fn cases() -> Vec<Case> {
    vec![
        (
            "1P1D behind a ready router",
            PD,
            true,
            Some(router(1, None)),
            "1R1P1D",
            "True|Ready",
            "Ready",
            Some("http://127.0.0.1:8800"),
        ),
        (
            "1P1D, the router not ready yet",
            PD,
            true,
            Some(router(0, None)),
            "0R1P1D",
            "False|NoReadyReplicas",
            "Degraded",
            None,
        ),
        (
            "1P1D, the router cannot run",
            PD,
            true,
            Some(router(0, Some("kv-router is not next to kv-store"))),
            "0R1P1D",
            "False|RenderFailed",
            "Degraded",
            None,
        ),
        (
            "1P1D, the router not observed",
            PD,
            true,
            None,
            "0R1P1D",
            "False|NoReadyReplicas",
            "Degraded",
            None,
        ),
        (
            "1P1D without a router: nothing pairs the roles",
            PD,
            false,
            None,
            "1P1D",
            "False|NoRouter",
            "Ready",
            Some("http://127.0.0.1:9000"),
        ),
        (
            "two Server roles behind a router, summed",
            &[("a", "Server", 1), ("b", "Server", 1)],
            true,
            Some(router(1, None)),
            "1R2S",
            "True|Ready",
            "Ready",
            Some("http://127.0.0.1:8800"),
        ),
        (
            "Server replicas, no router",
            &[("server", "Server", 2)],
            false,
            None,
            "2S",
            "True|NotApplicable",
            "Ready",
            Some("http://127.0.0.1:9000"),
        ),
        (
            "a runtime's router observation without spec.router is ignored",
            &[("server", "Server", 1)],
            false,
            Some(router(1, None)),
            "1S",
            "True|NotApplicable",
            "Ready",
            Some("http://127.0.0.1:9000"),
        ),
    ]
}

#[test]
fn what_the_router_makes_of_the_status() {
    let now = crate::registry::meta::now();
    for (name, roles, routed, observed_router, summary, condition, phase, endpoint) in cases() {
        let md = deployment(roles, routed);
        let observed: Vec<ReplicaObservation> = roles
            .iter()
            .flat_map(|(role, _, n)| (0..usize::try_from(*n).unwrap()).map(move |i| ready_replica(role, i)))
            .collect();
        let attached = attach(&md, &Resolved::default(), "");
        let st = report(&md, &attached, &observed, observed_router.as_ref(), &now);
        assert_eq!(st.role_summary.as_deref(), Some(summary), "{name}");
        let c = conditions::find(&st.conditions, router_ready::TYPE).unwrap();
        assert_eq!(format!("{}|{}", c.status, c.reason), condition, "{name}: {}", c.message);
        assert_eq!(c.observed_generation, Some(2), "{name}");
        assert_eq!(
            st.phase.map(|p| p.as_str()),
            Some(phase),
            "{name}: {:?}",
            st.phase_message
        );
        assert_eq!(st.endpoint.as_deref(), endpoint, "{name}");
        match (&st.router, routed) {
            (Some(r), true) => {
                let o = observed_router.clone().unwrap_or_default();
                assert_eq!(
                    (r.name.as_str(), r.replicas, r.ready, r.endpoint.as_deref()),
                    ("kvcache-router", o.replicas, o.ready, endpoint),
                    "{name}"
                );
            }
            (None, false) => {}
            (r, _) => panic!("{name}: status.router {r:?}"),
        }
    }
}

#[test]
fn the_router_conditions_say_why() {
    let now = crate::registry::meta::now();
    let message = |md: &ModelDeployment, r: Option<RouterObservation>| {
        let observed = vec![ready_replica("prefill", 0), ready_replica("decode", 0)];
        let st = report(md, &attach(md, &Resolved::default(), ""), &observed, r.as_ref(), &now);
        let c = conditions::find(&st.conditions, router_ready::TYPE).unwrap();
        (c.message.clone(), st.phase_message.unwrap_or_default())
    };
    let (m, _) = message(&deployment(PD, false), None);
    assert!(
        m.contains("nothing pairs the roles") && m.contains("kvcache-router"),
        "{m}"
    );
    let (m, phase) = message(&deployment(PD, true), Some(router(0, None)));
    assert!(
        m.contains("0 of 1 router replicas are ready") && m.contains("Decode or Server replica"),
        "{m}"
    );
    assert!(
        phase.starts_with("2 of 2 replicas are ready, the router is not: 0 of 1"),
        "{phase}"
    );
    let (m, _) = message(
        &deployment(PD, true),
        Some(router(0, Some("no kv-router next to kv-store"))),
    );
    assert_eq!(m, "no kv-router next to kv-store");
    let (m, _) = message(&deployment(PD, true), Some(router(1, None)));
    assert_eq!(m, "1 of 1 router replicas are ready at http://127.0.0.1:8800");
}

/// The router follows the store the replicas of our store use, with their credential; a store
/// of the reference's protocol (no block events) gives it nothing.
#[test]
fn the_router_follows_our_store_as_the_replicas_do() {
    use crate::controller::injection::{Connection, StoreKind, StoreTrust};
    use crate::runtime::credentials::ReplicaCredential;

    let md = deployment(PD, true);
    let config = crate::config::Config::default();
    let ours = Connection {
        endpoint: "cache-leader.kvcache-system.svc:7000".into(),
        store: StoreKind::Ours {
            package_image: "ghcr.io/gpustack/kvcache-store:v0.1.0".into(),
        },
        tenant: Some("team-a-cache".into()),
        block_size: 16,
        dtype: "bfloat16".into(),
        protocol: "tcp".into(),
        credential: Some(ReplicaCredential::new("cache", "minted")),
        tls: Some(StoreTrust {
            ca_pem: "-----BEGIN CERTIFICATE-----".into(),
            server_name: "cache".into(),
        }),
    };
    let plan = super::router(&md, &replicas(&md, Some(&ours), &config), &config).unwrap();
    let env: Vec<(&str, &str)> = plan.store_env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    assert_eq!(
        env,
        [
            ("KVSTORE_LEADER", "cache-leader.kvcache-system.svc:7000"),
            ("KVSTORE_TENANT", "team-a-cache"),
            ("KVSTORE_BLOCK_SIZE", "16"),
            ("KVSTORE_DTYPE", "bfloat16"),
            ("KVSTORE_TLS_CA_PEM", "-----BEGIN CERTIFICATE-----"),
            ("KVSTORE_TLS_SERVER_NAME", "cache"),
        ]
    );
    assert_eq!(plan.credential, ours.credential);
    let reference = Connection {
        store: StoreKind::Mooncake,
        tls: None,
        ..ours
    };
    let plan = super::router(&md, &replicas(&md, Some(&reference), &config), &config).unwrap();
    assert!(plan.store_env.is_empty() && plan.credential.is_none());
}

#[test]
fn the_router_the_spec_plans() {
    let mut md = deployment(PD, true);
    let r = md.spec.router.as_mut().unwrap();
    r.request_timeout_seconds = Some(30);
    r.disaggregation_threshold_tokens = Some(256);
    r.extra_args = vec!["--log-level=debug".into()];
    md.spec.roles[1].ports = vec![serde_json::from_value(json!({"port": 9100})).unwrap()];
    md.spec.roles[0].image = Some("vllm/vllm-openai:v0.32.0".into());
    md.spec.roles[1].image = Some("vllm/vllm-openai:v0.32.0".into());
    let config = crate::config::Config::default();
    let replicas = replicas(&md, None, &config);
    let plan = super::router(&md, &replicas, &config).unwrap();
    assert_eq!(plan.name, "kvcache-router");
    assert_eq!(plan.replicas, 1);
    assert_eq!(
        plan.image.as_deref(),
        Ok(config.settings.kv_cache_backend_image.as_str()),
        "the store's image ships kv-router"
    );
    assert_eq!(
        plan.args,
        [
            "--model",
            "Qwen/Qwen3-0.6B",
            "--request-timeout-seconds",
            "30",
            "--disaggregation-threshold-tokens",
            "256",
            "--engine-events-ports",
            "5557,5558",
            "--log-level=debug"
        ]
    );
    let roles: Vec<(&str, RoleKind, u16)> = plan.roles.iter().map(|r| (r.role.as_str(), r.kind, r.port)).collect();
    assert_eq!(
        roles,
        [("prefill", RoleKind::Prefill, 8000), ("decode", RoleKind::Decode, 9100)]
    );
    // its own image wins; no router, no plan
    md.spec.router.as_mut().unwrap().image = Some("example.com/router:1".into());
    assert_eq!(
        super::router(&md, &replicas, &config).unwrap().image.as_deref(),
        Ok("example.com/router:1")
    );
    // no cache: no store to follow
    assert!(plan.store_env.is_empty() && plan.credential.is_none());
    md.spec.router = None;
    assert!(super::router(&md, &replicas, &config).is_none());
    // a blank setting and no image: the plan says why
    let mut md = deployment(PD, true);
    let mut blank = crate::config::Config::default();
    blank.settings.kv_cache_backend_image = " ".into();
    md.spec.router.as_mut().unwrap().image = None;
    assert!(super::router(&md, &replicas, &blank).unwrap().image.is_err());
}
