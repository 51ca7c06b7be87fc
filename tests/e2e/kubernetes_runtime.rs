//! Cluster mode, part 2: the controllers with `--runtime kubernetes` against the harness's real
//! kube-apiserver, with kube-controller-manager's Deployment, ReplicaSet, DaemonSet, ServiceAccount
//! and garbage-collector controllers. No kubelet runs: the test schedules member Pods (a Binding,
//! as the scheduler would) and writes Pod statuses through `/status`, as a kubelet would, to drive
//! each fault.

mod cluster;
mod support;

use std::time::Duration;

use cluster::{ControlPlane, NAMESPACE};
use serde_json::Value;
use support::walkthrough::{condition, manifest};
use support::{Kubectl, eventually};

const KVCB: &[&str] = &["kvcb", "mooncake-dram"];

fn json(k: &Kubectl, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    serde_json::from_str(&k.ok(&all)).expect("kubectl -o json")
}

fn try_json(k: &Kubectl, args: &[&str]) -> Option<Value> {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    let r = k.run(&all);
    r.ok.then(|| serde_json::from_str(&r.stdout).expect("kubectl -o json"))
}

fn store(k: &Kubectl, kind: &str, name: &str) -> Option<Value> {
    try_json(k, &["-n", NAMESPACE, "get", kind, name])
}

/// deploy/ applied to `plane`, and our server behind it with the controllers on the Kubernetes
/// runtime (acting as the ServiceAccount of deploy/), passing every second, with `extra` flags.
fn runtime_server(plane: &ControlPlane, extra: &[&str]) -> cluster::Aggregated {
    let deploy = cluster::prepare_deploy(plane);
    let mut flags = vec![
        "--runtime=kubernetes",
        "--store-namespace=gpustack-system",
        "--requeue-interval=1s",
    ];
    flags.extend_from_slice(extra);
    cluster::start_behind_with(plane, &deploy, &flags)
}

/// The one leader Pod the ReplicaSet made.
fn leader_pod(k: &Kubectl) -> String {
    eventually(60, "the leader Pod exists", || {
        let pods = json(
            k,
            &[
                "-n",
                NAMESPACE,
                "get",
                "pods",
                "-l",
                "app.kubernetes.io/component=leader",
            ],
        );
        pods["items"][0]["metadata"]["name"].as_str().map(str::to_owned)
    })
}

/// Writes `status` on a Pod through its status subresource, as the kubelet does.
fn kubelet_writes(k: &Kubectl, namespace: &str, pod: &str, status: &Value) {
    let patch = serde_json::json!({ "status": status }).to_string();
    k.ok(&[
        "-n",
        namespace,
        "patch",
        "pod",
        pod,
        "--subresource=status",
        "--type=merge",
        "-p",
        &patch,
    ]);
}

fn waiting(reason: &str, message: &str, restarts: u32, last_exit: Option<i32>) -> Value {
    let mut c = serde_json::json!({
        "name": "leader", "ready": false, "restartCount": restarts, "image": "x", "imageID": "",
        "state": {"waiting": {"reason": reason, "message": message}},
    });
    if let Some(code) = last_exit {
        c["lastState"] = serde_json::json!({"terminated": {"exitCode": code, "reason": "Error", "message": "flag --bogus not recognised", "startedAt": "2026-12-01T00:00:00Z", "finishedAt": "2026-12-01T00:00:01Z"}});
    }
    serde_json::json!({"phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "False"}], "containerStatuses": [c]})
}

#[test]
fn the_store_runs_as_workloads_of_the_cluster() {
    let plane = ControlPlane::start_with(&[
        "clusterrole-aggregation-controller",
        "serviceaccount-controller",
        "deployment-controller",
        "replicaset-controller",
        "daemonset-controller",
        "garbage-collector-controller",
    ]);
    let k = plane.kubectl();
    for node in ["node-a", "node-b"] {
        k.must_apply(&format!(
            "apiVersion: v1\nkind: Node\nmetadata:\n  name: {node}\n  labels:\n    kubernetes.io/hostname: {node}\n    kubernetes.io/os: linux\n"
        ));
    }
    let server = runtime_server(&plane, &[]);
    // A DaemonSet with our labels and a name of ours but no ownership note: never ours.
    let foreign = format!(
        "apiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: mooncake-dram-member-9\n  namespace: {NAMESPACE}\n  labels:\n    app.kubernetes.io/instance: mooncake-dram\n    resource.gpustack.ai/type: kvcachebackends\nspec:\n  selector:\n    matchLabels: {{app: foreign}}\n  template:\n    metadata:\n      labels: {{app: foreign}}\n    spec:\n      nodeSelector: {{nowhere: \"true\"}}\n      containers: [{{name: c, image: busybox}}]\n"
    );
    k.must_apply(&foreign);

    // Step 1: the leader Deployment, its Service and election RBAC, the member DaemonSet.
    k.must_apply(&manifest("01-backend.yaml"));
    let uid = json(&k, &["get", "kvcb", "mooncake-dram"])["metadata"]["uid"]
        .as_str()
        .expect("a uid")
        .to_owned();
    let d = eventually(60, "the leader Deployment", || {
        store(&k, "deployment", "mooncake-dram-leader")
    });
    // The tokens the leader and members prove themselves with, each the backend's own, as keys of
    // the store's one tokens Secret (gone with the backend), and its certificate's.
    let tokens = store(&k, "secret", "kvcache-store-tokens").expect("the Secret kvcache-store-tokens");
    let items = &d["spec"]["template"]["spec"]["volumes"][0]["projected"]["sources"][0]["secret"];
    assert_eq!(items["name"], "kvcache-store-tokens");
    for (i, file) in ["control.token", "metrics.token", "member.token", "seal.key"]
        .iter()
        .enumerate()
    {
        let key = format!("mooncake-dram.{file}");
        assert_eq!(
            tokens["data"][&key].as_str().map(str::len),
            Some(88),
            "{key}: 64 hex digits in base64"
        );
        assert_eq!(items["items"][i]["key"], key.as_str());
    }
    let tls = store(&k, "secret", "kvcache-store-tls").expect("the Secret kvcache-store-tls");
    assert!(tls["data"]["mooncake-dram.tls.crt"].is_string(), "{tls}");
    for kind in ["service", "serviceaccount", "role", "rolebinding"] {
        let o = store(&k, kind, "mooncake-dram-leader").unwrap_or_else(|| panic!("{kind} mooncake-dram-leader"));
        assert_eq!(
            o["metadata"]["annotations"]["note.gpustack.ai/backend"], "mooncake-dram",
            "{kind}"
        );
        assert_eq!(o["metadata"]["ownerReferences"][0]["uid"], uid.as_str(), "{kind}");
        assert_eq!(
            o["metadata"]["ownerReferences"][0]["blockOwnerDeletion"], false,
            "{kind}"
        );
    }
    // The store's ports: its own Pods and the server's, and no engine before a Binding.
    let policy = store(&k, "networkpolicy", "mooncake-dram-store").expect("the store's NetworkPolicy");
    assert_eq!(policy["spec"]["policyTypes"], serde_json::json!(["Ingress"]));
    let from = &policy["spec"]["ingress"][0]["from"];
    assert_eq!(from.as_array().map(Vec::len), Some(2), "{from}");
    assert_eq!(
        from[1]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
        NAMESPACE
    );
    let ds = store(&k, "daemonset", "mooncake-dram-member-0").expect("the member DaemonSet");
    assert_eq!(d["spec"]["replicas"], 1);
    assert_eq!(d["spec"]["strategy"]["type"], "Recreate");
    assert_eq!(
        d["spec"]["selector"]["matchLabels"],
        serde_json::json!({"app.kubernetes.io/name": "kv-cache-backend", "app.kubernetes.io/instance": "mooncake-dram", "app.kubernetes.io/component": "leader"})
    );
    let leader = &d["spec"]["template"]["spec"];
    assert_eq!(leader["serviceAccountName"], "mooncake-dram-leader");
    let c = &leader["containers"][0];
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    let args: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let lease_at = args.iter().position(|a| *a == "--lease").expect("--lease");
    assert_eq!(args[lease_at + 1], "gpustack-system/mooncake-dram-leader");
    let member = &ds["spec"]["template"]["spec"];
    assert_eq!(member["nodeSelector"], serde_json::json!({"kubernetes.io/os": "linux"}));
    assert_eq!(member["containers"][0]["resources"]["requests"]["memory"], "1Gi");
    assert_eq!(member["volumes"][0]["emptyDir"]["sizeLimit"], "1Gi");
    let margs: Vec<&str> = member["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(
        &margs[..3],
        ["member", "--leader", "mooncake-dram-leader.gpustack-system.svc:50051"]
    );
    assert_eq!(
        json(&k, &["get", "kvcb", "mooncake-dram"])["status"]["endpoints"][0]["address"],
        "mooncake-dram-leader.gpustack-system.svc:50051"
    );

    // The kubelet's faults, one at a time, on the leader Pod: each is the backend's reason.
    let pod = leader_pod(&k);
    let faults = [
        (
            waiting(
                "CrashLoopBackOff",
                "back-off 10s restarting failed container",
                3,
                Some(2),
            ),
            "False|LeaderCrashLooping|",
            "Error",
        ),
        (
            waiting("ImagePullBackOff", "Back-off pulling image", 0, None),
            "False|ImagePullBackOff|Back-off pulling image",
            "Error",
        ),
        (
            serde_json::json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/2 nodes are available: insufficient memory"}], "containerStatuses": []}),
            "False|LeaderUnschedulable|",
            "Error",
        ),
        (
            serde_json::json!({"phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "False"}],
                "containerStatuses": [{"name": "leader", "ready": false, "restartCount": 0, "image": "x", "imageID": "", "state": {"running": {"startedAt": "2026-12-01T00:00:00Z"}}}]}),
            "False|LeaderStarting|",
            "Provisioning",
        ),
    ];
    for (status, want, phase) in faults {
        kubelet_writes(&k, NAMESPACE, &pod, &status);
        eventually(30, &format!("LeaderAvailable {want} and phase {phase}"), || {
            let c = condition(&k, KVCB, "LeaderAvailable");
            let p = support::walkthrough::jp(&k, KVCB, "{.status.phase}");
            (c.starts_with(want) && p == phase).then_some(())
        });
    }
    let crash = waiting("CrashLoopBackOff", "back-off", 3, Some(2));
    kubelet_writes(&k, NAMESPACE, &pod, &crash);
    eventually(
        30,
        "the crash loop names the exit code and the termination message",
        || {
            let c = condition(&k, KVCB, "LeaderAvailable");
            (c.contains("exit code 2") && c.contains("flag --bogus not recognised")).then_some(())
        },
    );

    // Step 4: three leaders, rolled one at a time; the member DaemonSet is not touched.
    let ds_generation = ds["metadata"]["generation"].clone();
    let template = d["spec"]["template"].clone();
    k.must_apply(&manifest("04-high-availability.yaml"));
    let d3 = eventually(60, "the Deployment at 3 replicas", || {
        store(&k, "deployment", "mooncake-dram-leader").filter(|d| d["spec"]["replicas"] == 3)
    });
    assert_eq!(
        d3["spec"]["strategy"],
        serde_json::json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 3}})
    );
    assert_eq!(d3["spec"]["progressDeadlineSeconds"], i32::MAX);
    assert_eq!(d3["spec"]["template"], template, "the Pod template does not change");
    let ds_after = store(&k, "daemonset", "mooncake-dram-member-0").expect("the DaemonSet");
    assert_eq!(ds_after["metadata"]["generation"], ds_generation, "members untouched");
    // RolloutComplete is the Deployment's account (the ReplicaSet controller makes the Pods).
    eventually(60, "RolloutComplete from the Deployment", || {
        condition(&k, KVCB, "RolloutComplete")
            .starts_with("True|Complete|")
            .then_some(())
    });

    // The election is read from the cluster's Lease (kube-apiserver serves Leases in a cluster):
    // the test writes it as the serving leader would.
    k.must_apply(&format!(
        "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata:\n  name: mooncake-dram-leader\n  namespace: {NAMESPACE}\nspec:\n  holderIdentity: {pod}\n  leaseDurationSeconds: 2\n  leaseTransitions: 0\n"
    ));
    eventually(30, "ElectionObserved from the cluster's Lease", || {
        condition(&k, KVCB, "ElectionObserved")
            .starts_with("True|Electing|")
            .then_some(())
    });

    // Deleting the backend, then the pool that uses it, removes every rendered object, and only
    // those: the foreign DaemonSet stays; the Lease goes too.
    k.must_apply(&manifest("02-pool-binding.yaml"));
    k.ok(&["delete", "kvcb", "mooncake-dram", "--wait=false"]);
    eventually(30, "the backend waits for its pool", || {
        (support::walkthrough::jp(&k, KVCB, "{.status.phase}") == "Deleting").then_some(())
    });
    assert!(
        store(&k, "deployment", "mooncake-dram-leader").is_some(),
        "kept while in use"
    );
    k.ok(&["delete", "kvcpb", "team-a", "-n", "team-a", "--wait=false"]);
    k.ok(&["delete", "kvcp", "shared-dram", "--wait=false"]);
    // what the runtime made for the backend, still in the cluster
    let left = || -> Vec<&str> {
        [
            ("deployment", "mooncake-dram-leader"),
            ("service", "mooncake-dram-leader"),
            ("serviceaccount", "mooncake-dram-leader"),
            ("role", "mooncake-dram-leader"),
            ("rolebinding", "mooncake-dram-leader"),
            ("networkpolicy", "mooncake-dram-store"),
            ("daemonset", "mooncake-dram-member-0"),
        ]
        .iter()
        .filter(|(kind, name)| store(&k, kind, name).is_some())
        .map(|(kind, _)| *kind)
        .chain(
            ["kvcache-store-tokens", "kvcache-store-tls"]
                .into_iter()
                .filter(|s| {
                    store(&k, "secret", s).is_some_and(|s| {
                        s["data"]
                            .as_object()
                            .is_some_and(|d| d.keys().any(|k| k.starts_with("mooncake-dram.")))
                    })
                })
                .map(|_| "the backend's keys of a Secret"),
        )
        .collect()
    };
    if support::poll_within(Duration::from_secs(90), Duration::from_millis(500), || {
        left().is_empty().then_some(())
    })
    .is_none()
    {
        panic!(
            "not gone within 90s: {:?}; the Binding: {}; the server's warnings:\n{}",
            left(),
            k.run(&["get", "kvcpb", "-A", "-o", "yaml"]).stdout,
            std::fs::read_to_string(&server.log)
                .unwrap_or_default()
                .lines()
                .filter(|l| l.contains("WARN") || l.contains("ERROR"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    eventually(60, "the backend is gone", || {
        (!k.run(&["get", "kvcb", "mooncake-dram"]).ok).then_some(())
    });
    assert!(
        store(&k, "lease", "mooncake-dram-leader").is_none(),
        "the election Lease is deleted"
    );
    assert!(
        store(&k, "daemonset", "mooncake-dram-member-9").is_some(),
        "an object without our note is never deleted"
    );
}

/// A process of the test's own, killed when dropped.
struct Process(std::process::Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `kv-store` with `args` (listening on port 0) and returns it with the gRPC address it
/// announces on its first line; the rest of its output goes to `log`.
fn kv_store(args: &[&str], log: &std::path::Path) -> (Process, String) {
    use std::io::{BufRead, Write};
    let bin = support::server_binary().with_file_name("kv-store");
    let mut log = std::fs::File::create(log).expect("a log file");
    let mut child = std::process::Command::new(bin)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(log.try_clone().expect("log"))
        .spawn()
        .expect("kv-store starts");
    let mut out = std::io::BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    out.read_line(&mut line).expect("kv-store announces where it listens");
    let announced: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line:?}: {e}"));
    let grpc = announced["grpc"].as_str().expect("a gRPC address").to_owned();
    std::thread::spawn(move || {
        for l in out.lines().map_while(Result::ok) {
            let _ = writeln!(log, "{l}");
        }
    });
    (Process(child), grpc)
}

/// The engine Pods of a ModelDeployment attached through an external backend (a real leader and
/// member on loopback, so the Binding is granted and the connection resolves): one Pod per
/// replica with exactly what injection computed, the kubelet's faults as the deployment's phase,
/// and nothing left once it is deleted.
#[test]
fn engine_pods_carry_the_injection_and_report_the_kubelets_faults() {
    // the Deployment and ReplicaSet controllers make the router's Pod (step 5, prefill/decode)
    let plane = ControlPlane::start_with(&[
        "clusterrole-aggregation-controller",
        "serviceaccount-controller",
        "deployment-controller",
        "replicaset-controller",
    ]);
    let k = plane.kubectl();
    let d = plane.dir.path();
    let (_leader, leader_at) = kv_store(&["leader", "--listen", "127.0.0.1:0"], &d.join("leader.log"));
    let shm = d.join("shm");
    std::fs::create_dir_all(&shm).unwrap();
    let shm = shm.display().to_string();
    let (_member, _) = kv_store(
        &[
            "member",
            "--leader",
            &leader_at,
            "--capacity",
            "2Gi",
            "--shm-dir",
            &shm,
            "--name",
            "m0",
        ],
        &d.join("member.log"),
    );
    let _server = runtime_server(&plane, &[]);
    k.must_apply(&format!(
        "apiVersion: worker.gpustack.ai/v1\nkind: KVCacheBackend\nmetadata:\n  name: mooncake-dram\nspec:\n  type: Mooncake\n  connection:\n    external:\n      endpoints:\n      - {{name: Client, address: \"{leader_at}\"}}\n      - {{name: Admin, address: \"{leader_at}\"}}\n"
    ));
    k.ok(&["create", "namespace", "team-a"]);
    k.ok(&["create", "namespace", "team-b"]);
    // The runtime's rights: none in a namespace until an administrator lets it in, no way to let
    // itself in, and Secrets by name only (finding 7 of the second review).
    let who = format!("--as=system:serviceaccount:{NAMESPACE}:{}", cluster::SERVICE);
    let runtime_may = |verb: &str, resource: &str, namespace: &str| {
        let scope = if namespace == "--all-namespaces" {
            vec![namespace]
        } else {
            vec!["-n", namespace]
        };
        let mut args = vec!["auth", "can-i", verb, resource, who.as_str()];
        args.extend(scope);
        k.run(&args).stdout.trim() == "yes"
    };
    for ns in ["team-a", "team-b", "kube-system"] {
        assert!(!runtime_may("list", "secrets", ns), "no Secret list in {ns}");
        assert!(!runtime_may("create", "pods", ns), "no Pod in {ns}");
        assert!(
            !runtime_may("create", "rolebindings", ns),
            "the runtime cannot let itself into {ns}"
        );
    }
    assert!(
        !runtime_may("bind", "clusterroles/kvcache-apiserver-tenant", "--all-namespaces"),
        "nor bind the tenant role anywhere"
    );
    assert!(
        !runtime_may("list", "secrets", "--all-namespaces"),
        "no cluster-wide Secret list"
    );
    assert!(
        !runtime_may("list", "secrets", NAMESPACE),
        "no Secret list in the store's namespace (the etcd client key is there)"
    );
    assert!(!runtime_may("get", "secrets/kvcache-etcd-client", NAMESPACE));
    assert!(runtime_may("get", "secrets/kvcache-store-tokens", NAMESPACE));
    // A Binding in team-a before the administrator let the runtime in: it says what to run.
    k.must_apply(&manifest("02-pool-binding.yaml"));
    eventually(60, "the Binding says the runtime is not let into team-a", || {
        let described = k.run(&["describe", "kvcpb", "team-a", "-n", "team-a"]).stdout;
        described
            .contains("kubectl -n team-a create rolebinding kvcache-apiserver-tenant")
            .then_some(())
    });
    k.ok(&[
        "-n",
        "team-a",
        "create",
        "rolebinding",
        "kvcache-apiserver-tenant",
        "--clusterrole=kvcache-apiserver-tenant",
        &format!("--serviceaccount={NAMESPACE}:{}", cluster::SERVICE),
    ]);
    support::walkthrough::wait_jp(&k, &["kvcpb", "team-a", "-n", "team-a"], "{.status.phase}", "Ready");
    // In team-a now, and nowhere else; its Secret there by name alone.
    assert!(runtime_may("get", "secrets/kvcache-credentials", "team-a"));
    assert!(!runtime_may("list", "secrets", "team-a"));
    assert!(!runtime_may("get", "secrets/someone-elses", "team-a"));
    assert!(runtime_may("create", "pods", "team-a"));
    assert!(!runtime_may("create", "pods", "team-b"));
    let kept = json(&k, &["-n", "team-a", "get", "secret", "kvcache-credentials"]);
    assert!(kept["data"]["team-a.credential"].is_string(), "{kept}");
    let md = manifest("03-model-deployment.yaml").replace(
        "instanceType: local-small",
        "instanceType: local-small\n      image: vllm/vllm-openai:v0.29.0",
    );
    k.must_apply(&md);
    let uid = json(&k, &["get", "md", "qwen-chat", "-n", "team-a"])["metadata"]["uid"]
        .as_str()
        .expect("a uid")
        .to_owned();

    // One Pod per replica, attached: the connector flags, our variables, the client file (an
    // external store speaks the reference's protocol, so engines get the reference's connector).
    let env_of = |p: &Value| -> Vec<(String, String)> {
        p["spec"]["containers"][0]["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e["name"].as_str().unwrap().to_owned(),
                    e["value"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    };
    for replica in ["qwen-chat-server-0", "qwen-chat-server-1"] {
        let pod = eventually(60, &format!("{replica} runs attached"), || {
            try_json(&k, &["-n", "team-a", "get", "pod", replica])
                .filter(|p| env_of(p).iter().any(|(n, v)| n == "KVSTORE_LEADER" && *v == leader_at))
        });
        let meta = &pod["metadata"];
        assert_eq!(meta["ownerReferences"][0]["uid"], uid.as_str());
        assert_eq!(meta["ownerReferences"][0]["kind"], "ModelDeployment");
        assert_eq!(meta["annotations"]["note.gpustack.ai/model-deployment"], "qwen-chat");
        assert_eq!(meta["labels"]["app.kubernetes.io/component"], "server");
        let c = &pod["spec"]["containers"][0];
        assert_eq!(c["image"], "vllm/vllm-openai:v0.29.0");
        assert_eq!(c["command"], serde_json::json!(["vllm", "serve"]));
        let args: Vec<&str> = c["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        assert_eq!(args[0], "Qwen/Qwen2.5-7B-Instruct");
        let at = args
            .iter()
            .position(|a| *a == "--kv-transfer-config")
            .expect("the connector flag");
        let connector: Value = serde_json::from_str(args[at + 1]).unwrap();
        assert_eq!(
            connector,
            serde_json::json!({"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both"})
        );
        let dtype = args
            .iter()
            .position(|a| *a == "--kv-cache-dtype")
            .expect("--kv-cache-dtype");
        assert_eq!(args[dtype + 1], "bfloat16");
        assert_eq!(&args[args.len() - 4..], ["--host", "0.0.0.0", "--port", "8000"]);
        let env = env_of(&pod);
        for (name, want) in [
            ("KVSTORE_BLOCK_SIZE", "64"),
            ("KVSTORE_DTYPE", "bfloat16"),
            ("MC_TE_METRIC", "1"),
            ("MOONCAKE_CONFIG_PATH", "/etc/gpustack/kvcache/mooncake.json"),
        ] {
            assert!(
                env.iter().any(|(n, v)| n == name && v == want),
                "{name}={want} in {env:?}"
            );
        }
        assert!(env.iter().any(|(n, _)| n == "KVSTORE_TENANT"), "{env:?}");
        // The tenant credential comes from the Binding's Secret, never as a value in the Pod.
        let credential = c["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == "KVSTORE_CREDENTIAL")
            .expect("KVSTORE_CREDENTIAL");
        assert_eq!(
            credential["valueFrom"]["secretKeyRef"],
            serde_json::json!({"name": "kvcache-credentials", "key": "team-a.credential"})
        );
        let secret = json(&k, &["-n", "team-a", "get", "secret", "kvcache-credentials"]);
        assert_eq!(
            secret["metadata"]["labels"]["app.kubernetes.io/component"],
            "tenant-credentials"
        );
        use base64::Engine as _;
        let value = base64::engine::general_purpose::STANDARD
            .decode(secret["data"]["team-a.credential"].as_str().unwrap())
            .unwrap();
        let value = String::from_utf8(value).unwrap();
        assert_eq!(value.len(), 64);
        assert!(
            !pod.to_string().contains(&value),
            "the credential's value is in the Pod"
        );
        let fingerprint: String = ring::digest::digest(&ring::digest::SHA256, value.as_bytes()).as_ref()[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(
            meta["annotations"]["kvcache.gpustack.ai/credential-fingerprint"],
            fingerprint.as_str()
        );
        assert!(
            !k.ok(&["get", "kvcpb", "-n", "team-a", "-o", "yaml"]).contains(&value),
            "the credential is in the Binding"
        );
        let config: Value = serde_json::from_str(
            meta["annotations"]["kvcache.gpustack.ai/client-config"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(config["master_server_address"], leader_at.as_str());
        assert_eq!(c["volumeMounts"][0]["mountPath"], "/etc/gpustack/kvcache");
        assert_eq!(
            pod["spec"]["volumes"][0]["downwardAPI"]["items"][0]["path"],
            "mooncake.json"
        );
        for probe in ["startupProbe", "readinessProbe", "livenessProbe"] {
            assert_eq!(c[probe]["httpGet"]["path"], "/health", "{probe}");
            assert_eq!(c[probe]["httpGet"]["port"], 8000, "{probe}");
        }
    }

    // The kubelet's faults, then readiness, as the deployment's phase.
    let kubelet = |pod: &str, status: &Value| kubelet_writes(&k, "team-a", pod, status);
    let md_phase = || {
        support::walkthrough::jp(
            &k,
            &["md", "qwen-chat", "-n", "team-a"],
            "{.status.phase}|{.status.phaseMessage}",
        )
    };
    let engine_waiting = |reason: &str, message: &str| {
        serde_json::json!({"phase": "Pending", "containerStatuses": [{"name": "engine", "ready": false, "restartCount": 2, "image": "x", "imageID": "",
            "state": {"waiting": {"reason": reason, "message": message}},
            "lastState": {"terminated": {"exitCode": 1, "message": "CUDA out of memory", "finishedAt": "2026-12-01T00:00:01Z"}}}]})
    };
    let faults = [
        (
            engine_waiting(
                "ImagePullBackOff",
                "Back-off pulling image \"vllm/vllm-openai:v0.29.0\"",
            ),
            "Starting|0 of 2 replicas are ready; server-0: ImagePullBackOff: Back-off pulling image",
        ),
        (
            engine_waiting("CrashLoopBackOff", "back-off 20s restarting failed container"),
            "Starting|0 of 2 replicas are ready; server-0: CrashLoopBackOff: back-off 20s",
        ),
        (
            serde_json::json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes have a free nvidia.com/gpu"}], "containerStatuses": []}),
            "Starting|0 of 2 replicas are ready; server-0: Unschedulable: 0/3 nodes have a free nvidia.com/gpu",
        ),
        (
            serde_json::json!({"phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "False"}],
                "containerStatuses": [{"name": "engine", "ready": false, "restartCount": 0, "image": "x", "imageID": "", "state": {"running": {}}}]}),
            "Starting|0 of 2 replicas are ready",
        ),
    ];
    for (status, want) in faults {
        kubelet("qwen-chat-server-0", &status);
        eventually(30, &format!("the deployment reads {want:?}"), || {
            let p = md_phase();
            (p.starts_with(want) && (want.contains("; ") || !p.contains("; "))).then_some(())
        });
    }
    assert!(
        condition(&k, &["md", "qwen-chat", "-n", "team-a"], "CacheAttached").starts_with("Unknown|NoReplicaReady|"),
        "nothing ready: the cache is not observed"
    );
    let ready = serde_json::json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}],
        "containerStatuses": [{"name": "engine", "ready": true, "restartCount": 0, "image": "x", "imageID": "", "state": {"running": {}}}]});
    kubelet("qwen-chat-server-0", &ready);
    eventually(30, "one of two ready", || {
        md_phase().starts_with("Degraded|1 of 2").then_some(())
    });
    kubelet("qwen-chat-server-1", &ready);
    eventually(30, "both ready", || md_phase().starts_with("Ready").then_some(()));

    // The prefill/decode example behind our router: the router's Deployment and Service and a
    // headless Service per role in the deployment's namespace, the router's readiness read from
    // its Deployment, everything of the router pruned when spec.router goes.
    let pd = manifest("05-prefill-decode.yaml").replace(
        "instanceType: local-small",
        "instanceType: local-small\n      image: vllm/vllm-openai:v0.29.0",
    );
    k.must_apply(&pd);
    let router = eventually(60, "the router's Deployment", || {
        try_json(&k, &["-n", "team-a", "get", "deployment", "qwen-pd-router"])
    });
    let pod = &router["spec"]["template"]["spec"];
    assert_eq!(pod["automountServiceAccountToken"], false);
    assert_eq!(pod["containers"][0]["command"], serde_json::json!(["kv-router"]));
    let args = pod["containers"][0]["args"].to_string();
    assert!(
        args.contains("prefill=qwen-pd-prefill-workers.team-a.svc.cluster.local:8000")
            && args.contains("decode=qwen-pd-decode-workers.team-a.svc.cluster.local:8000"),
        "{args}"
    );
    let headless = json(&k, &["-n", "team-a", "get", "service", "qwen-pd-decode-workers"]);
    assert_eq!(headless["spec"]["clusterIP"], "None");
    assert_eq!(headless["spec"]["selector"]["app.kubernetes.io/component"], "decode");
    assert!(try_json(&k, &["-n", "team-a", "get", "service", "qwen-pd-router"]).is_some());
    let pd_status = || {
        support::walkthrough::jp(
            &k,
            &["md", "qwen-pd", "-n", "team-a"],
            "{.status.roleSummary}|{.status.phase}|{.status.endpoint}",
        )
    };
    for pod in ["qwen-pd-prefill-0", "qwen-pd-decode-0"] {
        eventually(60, pod, || try_json(&k, &["-n", "team-a", "get", "pod", pod]));
        kubelet(pod, &ready);
    }
    eventually(30, "the halves ready, the router not", || {
        (pd_status() == "0R1P1D|Degraded|").then_some(())
    });
    // a router Pod (the Deployment controller made it) that answers /health: the Deployment
    // counts it ready, and the Pod's change wakes the deployment
    let router_pod = eventually(60, "a router Pod", || {
        let pods = json(
            &k,
            &[
                "-n",
                "team-a",
                "get",
                "pods",
                "-l",
                "app.kubernetes.io/name=kvcache-router",
            ],
        );
        pods["items"][0]["metadata"]["name"].as_str().map(str::to_owned)
    });
    kubelet(
        &router_pod,
        &serde_json::json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "router", "ready": true, "restartCount": 0, "image": "x", "imageID": "", "state": {"running": {}}}]}),
    );
    eventually(30, "1R1P1D through the router's Service", || {
        (pd_status() == "1R1P1D|Ready|http://qwen-pd-router.team-a.svc:8000").then_some(())
    });
    k.ok(&[
        "-n",
        "team-a",
        "patch",
        "md",
        "qwen-pd",
        "--type=json",
        "-p",
        r#"[{"op":"remove","path":"/spec/router"}]"#,
    ]);
    eventually(60, "the router's objects are pruned", || {
        (try_json(&k, &["-n", "team-a", "get", "deployment", "qwen-pd-router"]).is_none()
            && try_json(&k, &["-n", "team-a", "get", "service", "qwen-pd-decode-workers"]).is_none())
        .then_some(())
    });
    assert!(
        condition(&k, &["md", "qwen-pd", "-n", "team-a"], "RouterReady").starts_with("False|NoRouter|"),
        "without the router nothing pairs the roles"
    );
    k.ok(&["-n", "team-a", "delete", "md", "qwen-pd", "--wait=false"]);

    // Scale to one: the highest ordinal goes. Deleting the deployment removes the rest.
    k.ok(&[
        "-n",
        "team-a",
        "patch",
        "md",
        "qwen-chat",
        "--type=json",
        "-p",
        r#"[{"op":"replace","path":"/spec/roles/0/replicas","value":1}]"#,
    ]);
    eventually(30, "server-1 is gone", || {
        try_json(&k, &["-n", "team-a", "get", "pod", "qwen-chat-server-1"])
            .is_none()
            .then_some(())
    });
    assert!(try_json(&k, &["-n", "team-a", "get", "pod", "qwen-chat-server-0"]).is_some());
    k.ok(&["-n", "team-a", "delete", "md", "qwen-chat", "--wait=false"]);
    eventually(60, "no engine Pod is left", || {
        // (the router's ReplicaSet and Pod stay: this plane runs no garbage collector)
        let pods = json(
            &k,
            &[
                "-n",
                "team-a",
                "get",
                "pods",
                "-l",
                "app.kubernetes.io/name=model-deployment",
            ],
        );
        pods["items"].as_array().is_some_and(Vec::is_empty).then_some(())
    });
    // The Binding's deletion completes and takes its credential's keys with it.
    k.ok(&["-n", "team-a", "delete", "kvcpb", "team-a"]);
    let left = try_json(&k, &["-n", "team-a", "get", "secret", "kvcache-credentials"]);
    assert!(
        left.as_ref().is_none_or(|s| s["data"]
            .as_object()
            .is_none_or(|d| !d.keys().any(|k| k.starts_with("team-a.")))),
        "the deleted Binding's keys are left: {left:?}"
    );
}

/// Rising past one replica while the live template does not elect yet goes through one
/// electing replica first (RolloutComplete False/ReplicasPending meanwhile), then the real count.
#[test]
fn rising_past_one_without_the_election_goes_through_one_replica_first() {
    let plane = ControlPlane::start_with(&[
        "clusterrole-aggregation-controller",
        "serviceaccount-controller",
        "deployment-controller",
        "replicaset-controller",
    ]);
    let k = plane.kubectl();
    // The settings file, as a mounted ConfigMap: watched.
    let config = plane.dir.path().join("config.yaml");
    std::fs::write(
        &config,
        "settings:\n  kvCacheBackendImage: registry.example/kv-store:v1\n",
    )
    .unwrap();
    let config_flag = format!("--config={}", config.display());
    let _server = runtime_server(&plane, &[&config_flag]);
    k.must_apply(&manifest("01-backend.yaml").replace("leader: {}", "leader: {electionBackend: None}"));
    let d = eventually(60, "the leader Deployment without the election", || {
        store(&k, "deployment", "mooncake-dram-leader")
    });
    let args = d["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    assert!(args.contains(r#""--election","none""#), "{args}");
    eventually(60, "the first rollout completes", || {
        condition(&k, KVCB, "RolloutComplete")
            .starts_with("True|Complete|")
            .then_some(())
    });

    // Every version of the Deployment, as a watch sees them.
    let versions = k.spawn_lines(&[
        "-n",
        NAMESPACE,
        "get",
        "deployment",
        "mooncake-dram-leader",
        "-w",
        "-o",
        r#"jsonpath={.spec.replicas} {.spec.strategy.type} {.spec.template.spec.containers[0].args[?(@=="kubernetes")]}{"\n"}"#,
    ]);
    versions.wait_for(&["1 Recreate"]);
    k.ok(&[
        "patch",
        "kvcb",
        "mooncake-dram",
        "--type=merge",
        "-p",
        r#"{"spec":{"connection":{"managed":{"leader":{"electionBackend":"Kubernetes","replicas":3}}}}}"#,
    ]);
    // The first write: the electing template at one replica, Recreate; then the real count.
    let seen = versions.wait_for(&["3 RollingUpdate kubernetes"]);
    let electing: Vec<&String> = seen.iter().filter(|l| l.ends_with("kubernetes")).collect();
    assert_eq!(
        electing.first().map(|l| l.as_str()),
        Some("1 Recreate kubernetes"),
        "the first electing version has one replica: {seen:#?}"
    );
    eventually(60, "the rollout completes at three", || {
        condition(&k, KVCB, "RolloutComplete")
            .starts_with("True|Complete|")
            .then_some(())
    });

    // A new default image in the settings reaches the leader without a restart of the server.
    let image = |d: &Value| {
        d["spec"]["template"]["spec"]["containers"][0]["image"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    assert_eq!(
        image(&store(&k, "deployment", "mooncake-dram-leader").unwrap()),
        "registry.example/kv-store:v1"
    );
    std::fs::write(
        &config,
        "settings:\n  kvCacheBackendImage: registry.example/kv-store:v2\n",
    )
    .unwrap();
    eventually(30, "the leader runs the new default image", || {
        store(&k, "deployment", "mooncake-dram-leader")
            .filter(|d| image(d) == "registry.example/kv-store:v2")
            .map(|_| ())
    });
}
