//! Each controller's reconcile, run pass by pass against the API in this process, a leader in
//! this process and the fake runtime ([`super::testing`]): what it writes to the API, what it sets
//! on the leader and what it asks the runtime to run.

use std::sync::Arc;

use kube::runtime::controller::Action;
use kvcache_api::conditions;
use kvcache_api::{KVCacheBackend, KVCachePool, KVCachePoolBinding, ModelDeployment};

use super::testing::{Harness, condition};
use super::{backend, binding, model_deployment, pool};

const BACKEND: &str = include_str!("../../../tests/fixtures/walkthrough/01-backend.yaml");
const POOL_BINDING: &str = include_str!("../../../tests/fixtures/walkthrough/02-pool-binding.yaml");
const DEPLOYMENT: &str = include_str!("../../../tests/fixtures/walkthrough/03-model-deployment.yaml");
const PREFILL_DECODE: &str = include_str!("../../../tests/fixtures/walkthrough/05-prefill-decode.yaml");
const NS: Option<&str> = Some("team-a");

async fn backend_pass(h: &Harness) -> Action {
    let b = h.get::<KVCacheBackend>(None, "mooncake-dram").await.unwrap();
    backend::reconcile(b, h.ctx.clone()).await.unwrap()
}

async fn pool_pass(h: &Harness) -> Option<Action> {
    let p = h.get::<KVCachePool>(None, "shared-dram").await?;
    Some(pool::reconcile(p, h.ctx.clone()).await.unwrap())
}

async fn binding_pass(h: &Harness) -> Option<Action> {
    let b = h.get::<KVCachePoolBinding>(NS, "team-a").await?;
    Some(binding::reconcile(b, h.ctx.clone()).await.unwrap())
}

/// The store planned and its endpoints published: two passes (the finalizer, then the work).
async fn published_backend(h: &Harness) -> Arc<KVCacheBackend> {
    h.create(BACKEND).await;
    assert_eq!(
        backend_pass(h).await,
        Action::await_change(),
        "the first pass adds the finalizer"
    );
    backend_pass(h).await;
    h.get::<KVCacheBackend>(None, "mooncake-dram").await.unwrap()
}

#[tokio::test]
async fn a_backends_pass_runs_its_store_and_publishes_what_the_leader_says() {
    let h = Harness::start().await;
    let b = published_backend(&h).await;
    let plans = h.runtime.store_plans.lock().clone();
    assert_eq!(plans.len(), 1);
    assert_eq!(plans[0].members.len(), 1, "one member per matching node");
    let st = b.status.clone().unwrap();
    assert!(
        st.endpoints.iter().any(|e| e.address == h.leader_address()),
        "{:?}",
        st.endpoints
    );
    let leader = condition(&st.conditions, conditions::backend::leader_available::TYPE);
    assert!(leader.starts_with("True|"), "{leader}");
    // the fake's member never mounts at the leader: the leader's word wins, and a backend never
    // Ready is still starting (Unknown, Provisioning), not degraded
    let mounted = condition(&st.conditions, conditions::backend::members_mounted::TYPE);
    assert!(
        mounted.starts_with("Unknown|NoSegments|the members are starting"),
        "{mounted}"
    );
    assert_eq!(st.phase, Some(conditions::BackendPhase::Provisioning));
}

#[tokio::test]
async fn pool_and_binding_passes_set_the_ledger_read_the_grant_and_release_in_order() {
    let h = Harness::start().await;
    published_backend(&h).await;
    h.create(POOL_BINDING).await;
    // the Binding's credential is minted before the pool renders the ledger
    binding_pass(&h).await;
    binding_pass(&h).await;
    let b = h.get::<KVCachePoolBinding>(NS, "team-a").await.unwrap();
    let observed = condition(
        &b.status.clone().unwrap().conditions,
        conditions::binding::quota_observed::TYPE,
    );
    assert!(observed.starts_with("True|TenantNotInLedger|"), "{observed}");

    pool_pass(&h).await;
    pool_pass(&h).await;
    let ledger = h.leader.with(|s| (s.tenant_statuses(), s.pool_entries()));
    assert_eq!(ledger.0.len(), 1);
    assert_eq!(
        (ledger.0[0].name.as_str(), ledger.0[0].pool.as_str()),
        ("default", "shared-dram")
    );
    assert_eq!(ledger.0[0].credentials, 1, "bound to the Binding's credential");
    assert_eq!(
        (ledger.1[0].name.as_str(), ledger.1[0].total),
        ("shared-dram", 16 << 30)
    );
    let p = h.get::<KVCachePool>(None, "shared-dram").await.unwrap();
    let st = p.status.clone().unwrap();
    let writable = condition(&st.conditions, conditions::pool::quota_policy_writable::TYPE);
    assert!(
        writable.starts_with("True|Writable|the ledger holds 1 domains across 1 pools"),
        "{writable}"
    );
    assert_eq!(st.used_by.len(), 1);

    binding_pass(&h).await;
    let b = h.get::<KVCachePoolBinding>(NS, "team-a").await.unwrap();
    let st = b.status.clone().unwrap();
    let granted = condition(&st.conditions, conditions::binding::quota_granted::TYPE);
    assert!(
        granted.starts_with("False|ZeroGranted|the leader grants nothing: the pools on the backend may hand out more than its mounted capacity"),
        "nothing is mounted: {granted}"
    );
    assert_eq!(st.requested_quota.map(|q| q.0), Some("8Gi".into()));

    // the pool's deletion waits for its Binding, whose own deletion completes with no workload
    h.delete::<KVCachePool>(None, "shared-dram").await;
    pool_pass(&h).await;
    let p = h.get::<KVCachePool>(None, "shared-dram").await.unwrap();
    let held = condition(
        &p.status.clone().unwrap().conditions,
        conditions::pool::releasable::TYPE,
    );
    assert!(
        held.starts_with("False|HeldByBindings|held by KVCachePoolBinding/team-a/team-a"),
        "{held}"
    );
    h.delete::<KVCachePoolBinding>(NS, "team-a").await;
    binding_pass(&h).await;
    assert!(h.get::<KVCachePoolBinding>(NS, "team-a").await.is_none(), "released");
    assert!(
        h.ctx
            .secrets
            .credentials()
            .get(&crate::runtime::credentials::BindingKey::new(
                NS.unwrap_or_default(),
                "team-a"
            ))
            .await
            .unwrap()
            .is_none(),
        "its credential forgotten"
    );
    pool_pass(&h).await;
    assert!(h.get::<KVCachePool>(None, "shared-dram").await.is_none(), "released");
    let ledger = h.leader.with(|s| (s.tenant_statuses(), s.pool_entries()));
    assert!(
        ledger.0.is_empty() && ledger.1.is_empty(),
        "the ledger without the pool: {ledger:?}"
    );
}

#[tokio::test]
async fn a_deployments_pass_asks_the_runtime_for_its_replicas_with_the_binding_injected() {
    let h = Harness::start().await;
    published_backend(&h).await;
    h.mount_member(16 << 30);
    h.create(POOL_BINDING).await;
    binding_pass(&h).await;
    binding_pass(&h).await;
    pool_pass(&h).await;
    pool_pass(&h).await;
    binding_pass(&h).await;
    let b = h.get::<KVCachePoolBinding>(NS, "team-a").await.unwrap();
    let granted = condition(
        &b.status.clone().unwrap().conditions,
        conditions::binding::quota_granted::TYPE,
    );
    assert_eq!(granted, "True|Granted|granted 8Gi of the 8Gi asked for");
    h.create(DEPLOYMENT).await;
    for _ in 0..2 {
        let md = h.get::<ModelDeployment>(NS, "qwen-chat").await.unwrap();
        model_deployment::reconcile(md, h.ctx.clone()).await.unwrap();
    }
    let plans = h.runtime.replica_plans.lock().clone();
    let plan = plans.last().expect("a replica plan");
    assert_eq!(plan.owner, "team-a/qwen-chat");
    assert_eq!(plan.replicas.len(), 2);
    let env: Vec<&str> = plan.replicas[0].env.iter().map(|(k, _)| k.as_str()).collect();
    assert!(env.contains(&"KVSTORE_LEADER"), "{env:?}");
    assert!(
        plan.replicas[0].credential.is_some(),
        "the Binding's credential is handed over"
    );
    let md = h.get::<ModelDeployment>(NS, "qwen-chat").await.unwrap();
    let st = md.status.clone().unwrap();
    let registered = condition(&st.conditions, conditions::model_deployment::domain_registered::TYPE);
    assert!(registered.starts_with("True|Registered|"), "{registered}");
    assert_eq!(st.role_summary.as_deref(), Some("2S"));
    let routed = condition(&st.conditions, conditions::model_deployment::router_ready::TYPE);
    assert!(routed.starts_with("True|NotApplicable|"), "{routed}");

    // The prefill/decode example: its halves get their kv_role, the runtime runs its router, and
    // the status reads the router first.
    h.create(PREFILL_DECODE).await;
    for _ in 0..2 {
        let md = h.get::<ModelDeployment>(NS, "qwen-pd").await.unwrap();
        model_deployment::reconcile(md, h.ctx.clone()).await.unwrap();
    }
    let plans = h.runtime.replica_plans.lock().clone();
    let plan = plans.last().expect("a replica plan");
    assert_eq!(plan.owner, "team-a/qwen-pd");
    let roles: Vec<(&str, &str)> = plan
        .replicas
        .iter()
        .map(|r| {
            let at = r.args.iter().position(|a| a == "--kv-transfer-config").unwrap();
            let role = if r.args[at + 1].contains("kv_consumer") {
                "kv_consumer"
            } else {
                "kv_both"
            };
            (r.name.as_str(), role)
        })
        .collect();
    assert_eq!(roles, [("prefill-0", "kv_both"), ("decode-0", "kv_consumer")]);
    let router = plan.router.as_ref().expect("a router plan");
    assert_eq!(router.args[..2], ["--model", "Qwen/Qwen2.5-7B-Instruct"]);
    let md = h.get::<ModelDeployment>(NS, "qwen-pd").await.unwrap();
    let st = md.status.clone().unwrap();
    assert_eq!(st.role_summary.as_deref(), Some("1R1P1D"));
    let routed = condition(&st.conditions, conditions::model_deployment::router_ready::TYPE);
    assert!(
        routed.starts_with("True|Ready|1 of 1 router replicas are ready"),
        "{routed}"
    );
    assert_eq!(st.endpoint.as_deref(), Some("http://team-a.qwen-pd-router.fake:8000"));
    assert_eq!(st.router.map(|r| (r.name, r.ready)), Some(("kvcache-router".into(), 1)));
}

#[test]
fn adopted_bytes_read_rounded() {
    use crate::controller::approx_bytes;
    assert_eq!(approx_bytes(0), "0 B");
    assert_eq!(approx_bytes(1023), "1023 B");
    assert_eq!(approx_bytes(1024), "1.0 KiB");
    assert_eq!(approx_bytes(1_272_250_368), "1.2 GiB");
    assert_eq!(approx_bytes(u64::MAX), "16.0 EiB");
}
