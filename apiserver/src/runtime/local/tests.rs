//! Tests of the local runtime that need no store process (its binary is absent on purpose).

use super::*;
use crate::runtime::MemberPlan;
use kvcache_store::member::MemberConfig;

#[tokio::test]
async fn members_that_would_need_more_memory_than_the_machine_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = LocalOptions::new(dir.path());
    opts.store_binary = dir.path().join("no-such-kv-store");
    opts.memory_limit = Some(1 << 30);
    let rt = LocalRuntime::new(opts);
    let member = |node: &str| MemberPlan {
        group: 0,
        node: node.into(),
        config: MemberConfig::new("127.0.0.1:1", 1 << 30),
        env: vec![],
    };
    let plan = StorePlan {
        backend: "b".into(),
        uid: String::new(),
        image: None,
        pull_policy: None,
        pull_secrets: vec![],
        existing_only: false,
        leader: LeaderConfig::default(),
        leader_env: vec![],
        members: vec![member("local-0"), member("local-1")],
        groups: vec![],
        election: None,
    };
    let obs = rt.ensure_store(&plan).await;
    assert_eq!(obs.members.len(), 2);
    for (_, st) in &obs.members {
        let why = st.refused.as_deref().unwrap_or_default();
        assert!(why.contains("2Gi") && why.contains("lower capacityPerMember"), "{why}");
        assert!(!st.running);
    }
    assert!(
        obs.client_endpoint.is_some(),
        "the leader still gets its stable endpoint"
    );
    rt.shutdown().await;
}
