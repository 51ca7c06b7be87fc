use super::*;

fn plan(yaml: &str) -> StorePlan {
    let spec: kvcache_api::backend::BackendSpec = yaml_serde::from_str(yaml).unwrap();
    let (mut p, _) = crate::controller::backend::plan("b", &spec, &[]).unwrap();
    p.uid = "u-1".into();
    p
}

fn target() -> Target {
    Target {
        namespace: "gpustack-system".into(),
        image: "registry.example/kv-store:v1".into(),
        pull_policy: None,
        pull_secrets: vec!["regcred".into()],
        server_namespace: "kvcache-server".into(),
    }
}

const ONE: &str = "type: Mooncake\nconnection:\n  managed:\n    leader: {}\n    members:\n    - nodeSelector: {gpu: a100}\n      capacityPerMember: 2Gi\n      extraEnv: [{name: X, value: y}]\n";

fn args(container: &Value) -> Vec<String> {
    container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn every_object_is_owned_noted_and_labelled() {
    let objects = store(&plan(ONE), &target());
    let kinds: Vec<&str> = objects.iter().map(|o| o["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "ServiceAccount",
            "Role",
            "RoleBinding",
            "NetworkPolicy",
            "Service",
            "Deployment",
            "DaemonSet"
        ]
    );
    for o in &objects {
        let m = &o["metadata"];
        assert_eq!(m["namespace"], "gpustack-system");
        assert_eq!(m["annotations"][BACKEND_NOTE], "b");
        assert_eq!(m["labels"][TYPE_LABEL], "kvcachebackends");
        let owner = &m["ownerReferences"][0];
        assert_eq!(
            (
                &owner["kind"],
                &owner["uid"],
                &owner["controller"],
                &owner["blockOwnerDeletion"]
            ),
            (&json!("KVCacheBackend"), &json!("u-1"), &json!(true), &json!(false))
        );
    }
}

#[test]
fn the_leaders_and_members_reach_only_their_backends_lease() {
    let p = plan(&ONE.replace("leader: {}", "leader: {memberAddressing: Lease}"));
    let objects = store(&p, &target());
    let rules = |name: &str| {
        objects
            .iter()
            .find(|o| o["kind"] == "Role" && o["metadata"]["name"] == name)
            .map(|o| o["rules"].clone())
            .unwrap_or_else(|| panic!("no Role {name}"))
    };
    let named = json!(["b-leader"]);
    let leader = rules("b-leader");
    assert_eq!(leader[0]["verbs"], json!(["get", "watch", "update"]));
    assert_eq!(leader[0]["resourceNames"], named);
    // create cannot be limited by name in Kubernetes: it is the only verb without one
    assert_eq!(leader[1]["verbs"], json!(["create"]));
    assert_eq!(leader.as_array().map(Vec::len), Some(2));
    let member = rules("b-member");
    assert_eq!(member[0]["verbs"], json!(["get", "watch"]));
    assert_eq!(member[0]["resourceNames"], named);
}

#[test]
fn the_leader_elects_through_its_lease_and_is_ready_only_while_serving() {
    let p = plan(ONE);
    let d = leader_deployment(&p, &target());
    assert_eq!(d["spec"]["replicas"], 1);
    assert_eq!(d["spec"]["strategy"]["type"], "Recreate");
    assert!(d["spec"].get("progressDeadlineSeconds").is_none());
    let pod = &d["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "b-leader");
    assert_eq!(pod["automountServiceAccountToken"], true);
    assert_eq!(pod["imagePullSecrets"], json!([{"name": "regcred"}]));
    let c = &pod["containers"][0];
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(
        c["resources"],
        json!({"requests": {"memory": "512Mi"}, "limits": {"memory": "768Mi"}}),
        "a floor, and an eighth of the 2Gi group's segment"
    );
    assert_eq!(c["imagePullPolicy"], "IfNotPresent");
    let a = args(c);
    assert_eq!(a[0], "leader");
    // The flags parse back into the store's own config, Pod references and all.
    let parsed = LeaderConfig::parse_args(&a[1..]).unwrap();
    assert_eq!(parsed, leader_config(&p, &target()));
    assert_eq!(parsed.election_lease.as_deref(), Some("gpustack-system/b-leader"));
    assert_eq!(parsed.identity.as_deref(), Some("$(POD_NAME)"));
    // Its tokens and key, each the backend's own, from their Secrets, where the flags name them.
    let file = |f: &Option<std::path::PathBuf>| f.as_ref().map(|p| p.display().to_string());
    assert_eq!(
        [
            file(&parsed.control_token_file),
            file(&parsed.metrics_token_file),
            file(&parsed.member_token_file),
            file(&parsed.seal_key_file)
        ],
        ["control.token", "metrics.token", "member.token", "seal.key"]
            .map(|f| Some(format!("/etc/gpustack/kvcache/tokens/{f}")))
    );
    assert_eq!(c["volumeMounts"][0]["mountPath"], TOKENS_DIR);
    let sources = &pod["volumes"][0]["projected"]["sources"];
    assert_eq!(
        sources,
        &json!([{"secret": {"name": TOKENS_SECRET, "items": [
            {"key": "b.control.token", "path": "control.token"},
            {"key": "b.metrics.token", "path": "metrics.token"},
            {"key": "b.member.token", "path": "member.token"},
            {"key": "b.seal.key", "path": "seal.key"},
        ]}}]),
        "the backend's own keys, no token shared with another backend"
    );
    // TLS on every port, with the backend's certificate from its Secret
    assert_eq!(
        parsed.tls.tls_cert.as_deref(),
        Some(std::path::Path::new("/etc/gpustack/kvcache/tls/tls.crt"))
    );
    assert_eq!(
        parsed.tls.tls_key.as_deref(),
        Some(std::path::Path::new("/etc/gpustack/kvcache/tls/tls.key"))
    );
    assert_eq!(c["volumeMounts"][1]["mountPath"], TLS_DIR);
    assert_eq!(
        pod["volumes"][1]["projected"]["sources"],
        json!([{"secret": {"name": TLS_SECRET, "items": [
            {"key": "b.tls.crt", "path": "tls.crt"},
            {"key": "b.tls.key", "path": "tls.key"},
            {"key": "b.ca.crt", "path": "ca.crt"},
        ]}}])
    );
    assert_eq!(pod["volumes"][1]["projected"]["defaultMode"], 0o400);
    assert_eq!(
        d["spec"]["selector"]["matchLabels"],
        json!({"app.kubernetes.io/name": "kv-cache-backend", "app.kubernetes.io/instance": "b", "app.kubernetes.io/component": "leader"})
    );
    let svc = leader_service(&p, &target());
    assert_eq!(svc["spec"]["selector"], d["spec"]["selector"]["matchLabels"]);
}

#[test]
fn three_replicas_roll_one_at_a_time_and_members_are_untouched() {
    let one = plan(ONE);
    let three = plan(&ONE.replace("leader: {}", "leader: {replicas: 3}"));
    let d = leader_deployment(&three, &target());
    assert_eq!(d["spec"]["replicas"], 3);
    assert_eq!(
        d["spec"]["strategy"],
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 3}})
    );
    assert_eq!(d["spec"]["progressDeadlineSeconds"], i32::MAX);
    assert_eq!(
        d["spec"]["template"],
        leader_deployment(&one, &target())["spec"]["template"],
        "the Pod template does not change with the count"
    );
    assert_eq!(
        member_daemon_set(&three, &three.groups[0], &target()),
        member_daemon_set(&one, &one.groups[0], &target())
    );
}

#[test]
fn a_member_group_requests_its_segment_and_finds_the_leader() {
    let p = plan(ONE);
    let ds = member_daemon_set(&p, &p.groups[0], &target());
    assert_eq!(ds["metadata"]["name"], "b-member-0");
    assert_eq!(ds["metadata"]["annotations"][GROUP_NOTE], "0");
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["nodeSelector"], json!({"gpu": "a100"}));
    assert_eq!(pod["automountServiceAccountToken"], false);
    let c = &pod["containers"][0];
    assert_eq!(
        c["resources"],
        json!({"requests": {"memory": "2Gi"}, "limits": {"memory": "2560Mi"}}),
        "its segment, and a quarter of it for its heap"
    );
    assert_eq!(
        pod["volumes"][0]["emptyDir"],
        json!({"medium": "Memory", "sizeLimit": "2Gi"})
    );
    assert_eq!(c["env"][3], json!({"name": "X", "value": "y"}));
    let a = args(c);
    let parsed = MemberConfig::parse_args(&a[1..]).unwrap();
    assert_eq!(parsed.leader, "b-leader.gpustack-system.svc:50051");
    assert_eq!(parsed.capacity, 2 << 30);
    assert_eq!(parsed.name.as_deref(), Some("b-member-0-$(NODE_NAME)"));
    assert_eq!(
        parsed.member_token_file.as_deref(),
        Some(std::path::Path::new("/etc/gpustack/kvcache/tokens/member.token"))
    );
    let sources = &pod["volumes"][1]["projected"]["sources"];
    assert_eq!(
        sources,
        &json!([{"secret": {"name": TOKENS_SECRET, "items": [{"key": "b.member.token", "path": "member.token"}]}}]),
        "a member gets the member token alone"
    );
    // TLS: it serves the backend's certificate and checks the leader for the backend's name
    assert!(parsed.tls.tls_cert.is_some() && parsed.tls.tls_key.is_some());
    assert_eq!(
        parsed.dial.tls_ca.as_deref(),
        Some(std::path::Path::new("/etc/gpustack/kvcache/tls/ca.crt"))
    );
    assert_eq!(parsed.dial.tls_server_name.as_deref(), Some("b.kvstore.internal"));
    assert_eq!(
        pod["volumes"][2]["projected"]["sources"][0]["secret"]["name"],
        TLS_SECRET
    );

    let lease = plan(&ONE.replace("leader: {}", "leader: {memberAddressing: Lease}"));
    let ds = member_daemon_set(&lease, &lease.groups[0], &target());
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "b-member");
    let parsed = MemberConfig::parse_args(&args(&pod["containers"][0])[1..]).unwrap();
    assert_eq!(parsed.leader, "k8s://gpustack-system/b-leader");
    assert_eq!(store(&lease, &target()).len(), 10, "the member RBAC is rendered too");
}

#[test]
fn without_the_election_there_is_no_rbac_and_no_token() {
    let p = plan(&ONE.replace("leader: {}", "leader: {electionBackend: None}"));
    let objects = store(&p, &target());
    assert_eq!(objects.len(), 4);
    let d = leader_deployment(&p, &target());
    let pod = &d["spec"]["template"]["spec"];
    assert_eq!(pod["automountServiceAccountToken"], false);
    assert!(pod.get("serviceAccountName").is_none());
    let parsed = LeaderConfig::parse_args(&args(&pod["containers"][0])[1..]).unwrap();
    assert_eq!(parsed.election, Election::None);
}

#[test]
fn the_store_ports_admit_its_own_pods_the_server_and_its_tenants_engines_only() {
    let mut p = plan(ONE);
    let policy = |p: &StorePlan| {
        let n: k8s_openapi::api::networking::v1::NetworkPolicy =
            serde_json::from_value(network_policy(p, &target())).expect("a NetworkPolicy");
        n.spec.expect("a spec")
    };
    let spec = policy(&p);
    assert_eq!(spec.policy_types, Some(vec!["Ingress".to_owned()]));
    let selected = spec.pod_selector.unwrap().match_labels.unwrap();
    assert_eq!(selected["app.kubernetes.io/instance"], "b");
    let ingress = spec.ingress.unwrap();
    let store_rule = &ingress[0];
    let ports: Vec<String> = store_rule
        .ports
        .iter()
        .flatten()
        .map(|p| match p.port.clone().unwrap() {
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(s) => s,
            other => panic!("a named port, not {other:?}"),
        })
        .collect();
    assert_eq!(ports, ["rpc", "fast", "data"]);
    let from = store_rule.from.as_ref().unwrap();
    assert_eq!(from.len(), 2, "no tenant namespace, no engine admitted: {from:?}");
    let server = from[1]
        .namespace_selector
        .as_ref()
        .unwrap()
        .match_labels
        .as_ref()
        .unwrap();
    assert_eq!(server["kubernetes.io/metadata.name"], "kvcache-server");
    // The metrics ports alone are open to anyone (probes, scrapers).
    assert!(ingress[1].from.is_none());
    assert_eq!(ingress[1].ports.as_ref().unwrap().len(), 1);

    p.tenant_namespaces = ["team-a".to_owned(), "team-b".to_owned()].into();
    let from = policy(&p).ingress.unwrap()[0].from.clone().unwrap();
    let engines = &from[2];
    let expr = &engines
        .namespace_selector
        .as_ref()
        .unwrap()
        .match_expressions
        .as_ref()
        .unwrap()[0];
    assert_eq!(
        (expr.key.as_str(), expr.operator.as_str()),
        ("kubernetes.io/metadata.name", "In")
    );
    assert_eq!(expr.values, Some(vec!["team-a".to_owned(), "team-b".to_owned()]));
    assert_eq!(
        engines.pod_selector.as_ref().unwrap().match_labels.as_ref().unwrap()["app.kubernetes.io/name"],
        "model-deployment"
    );
}

#[test]
fn a_group_with_a_disk_tier_mounts_the_nodes_directory_and_runs_the_members_with_it() {
    let tiered = ONE.replace(
        "      extraEnv: [{name: X, value: y}]\n",
        "      extraEnv: [{name: X, value: y}]\n      localDisks:\n      - path: /mnt/nvme/kv\n        capacity: 4Ti\n        keyLimit: 1000000\n        eviction: {policy: LRU, watermark: {high: 90, low: 80}}\n",
    );
    let p = plan(&tiered);
    let ds = member_daemon_set(&p, &p.groups[0], &target());
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(
        pod["volumes"][3],
        json!({"name": "tier", "hostPath": {"path": "/mnt/nvme/kv", "type": "Directory"}})
    );
    let c = &pod["containers"][0];
    assert_eq!(
        c["volumeMounts"][3],
        json!({"name": "tier", "mountPath": "/mnt/nvme/kv"})
    );
    let parsed = MemberConfig::parse_args(&args(c)[1..]).unwrap();
    assert_eq!(parsed.tier_dir.as_deref(), Some(std::path::Path::new("/mnt/nvme/kv")));
    assert_eq!(parsed.tier_capacity, 4 << 40);
    assert_eq!(parsed.tier_key_limit, 1_000_000);
    assert_eq!(parsed.tier_watermark, Some((90, 80)));
    assert!(parsed.tier_lru && !parsed.tier_keep_when_full);
    parsed.validate().unwrap();
    // the preStop hook waits on the member's /flushed, on its metrics port
    assert_eq!(
        c["lifecycle"],
        json!({"preStop": {"httpGet": {"path": "/flushed", "port": "metrics"}}})
    );
    assert!(
        c["ports"].as_array().unwrap().iter().any(|p| p["name"] == "metrics"),
        "{}",
        c["ports"]
    );
    let survey = &pod["initContainers"][0];
    assert_eq!(survey["name"], "tier-survey");
    assert_eq!(survey["image"], c["image"]);
    assert_eq!(
        survey["args"],
        json!([
            "tier-survey",
            "--dir",
            "/mnt/nvme/kv",
            "--write",
            "/dev/termination-log"
        ])
    );
    assert_eq!(survey["terminationMessagePolicy"], "File");
    assert_eq!(
        survey["volumeMounts"],
        json!([{"name": "tier", "mountPath": "/mnt/nvme/kv"}])
    );

    // without a tier: none of it
    let p = plan(ONE);
    let pod = &member_daemon_set(&p, &p.groups[0], &target())["spec"]["template"]["spec"];
    assert_eq!(pod["volumes"].as_array().unwrap().len(), 3);
    assert!(pod["initContainers"].is_null());
    assert!(pod["containers"][0]["lifecycle"].is_null());
    let parsed = MemberConfig::parse_args(&args(&pod["containers"][0])[1..]).unwrap();
    assert!(parsed.tier_dir.is_none());
}
