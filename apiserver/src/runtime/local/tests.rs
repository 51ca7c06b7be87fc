//! Tests of the local runtime that need no store process (its binary is absent on purpose).

use super::*;
use crate::runtime::MemberPlan;
use kvcache_store::leader::LeaderConfig;
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
        tenant_namespaces: Default::default(),
        clean_tiers_after_delete: false,
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

#[test]
fn a_replica_gets_the_injection_then_its_roles_env_then_its_credential() {
    let dir = tempfile::tempdir().unwrap();
    let rt = LocalRuntime::new(LocalOptions::new(dir.path()));
    let injected = vec![("KVSTORE_TENANT".to_owned(), "default".to_owned())];
    let role = vec![
        ("KVSTORE_ROUNDS".to_owned(), "0".to_owned()),
        ("KVSTORE_CREDENTIAL".to_owned(), "the role's own".to_owned()),
    ];
    let replica = crate::runtime::Replica {
        name: "server-0".into(),
        role: "server".into(),
        env: injected.clone(),
        args: vec![],
        credential: Some(crate::runtime::credentials::ReplicaCredential::new("b", "minted")),
        client_config: None,
        package_image: None,
        engine: crate::runtime::EngineContainer {
            image: Ok("x".into()),
            pull_policy: None,
            pull_secrets: vec![],
            command: vec![],
            args: vec![],
            env: [injected, role].concat(),
            pod_ip_env: vec![],
            port: 8000,
            limits: Default::default(),
            grace_seconds: 30,
        },
    };
    let env = rt.replica_env("ns/md", &replica);
    // the process sees the last of duplicate names, as a container does
    let last = |k: &str| env.iter().rev().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    assert_eq!(last("KVSTORE_TENANT"), Some("default"));
    assert_eq!(last("KVSTORE_ROUNDS"), Some("0"), "the role's env shapes the workload");
    assert_eq!(
        last("KVSTORE_CREDENTIAL"),
        Some("minted"),
        "the credential is the Binding's"
    );
    // the simulator's launch fills in the workload's pace where nothing set it
    let launch = super::engines::launch(
        std::path::Path::new("/kv-store"),
        &crate::config::LocalRuntimeConfig::default(),
        &super::engines::Host::default(),
        &replica,
        env,
        8000,
        std::path::Path::new("/run/ev"),
    );
    let last = |k: &str| launch.env.iter().rev().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    assert_eq!(
        last("KVSTORE_AFTER_ROUNDS").as_deref(),
        Some("idle"),
        "defaults fill what is unset"
    );
    assert_eq!(last("KVSTORE_ROUNDS").as_deref(), Some("0"), "and only that");
}

#[test]
fn ports_handed_out_are_distinct_and_leave_the_next_one_alone() {
    let ports: Vec<u16> = (0..50).map(|_| loopback_port()).collect();
    let seen: std::collections::HashSet<u16> = ports.iter().copied().collect();
    assert_eq!(seen.len(), ports.len(), "a port handed out twice: {ports:?}");
    for p in &ports {
        assert!(!seen.contains(&(p + 1)), "{} handed out next to {p}", p + 1);
    }
}
