//! Cluster mode on a real single-node Kubernetes cluster (`scripts/cluster`): a kubelet, containerd
//! and runc, the CNI bridge, kube-proxy and CoreDNS, and our images (`scripts/image`) imported
//! into containerd. `kubectl apply -k deploy/` installs the server as Pods on the etcd of
//! `deploy/`, behind the APIService; the walkthrough then runs through kube-apiserver with kubectl.
//! The test writes nothing a kubelet or a controller would write: every Pod status, Lease,
//! endpoint and condition it reads was written by the component that owns it.
//!
//! Step 3's engines run a test image built here from the store image
//! (`localhost/kvcache-test/engine:1`, `tests/cluster/engine`): its `vllm serve` runs kv-store's
//! engine simulator with the injected environment, after checking that the connector module the
//! injected `--kv-transfer-config` names is in the package the init container copied.
//!
//! Needs root (a kubelet, containerd and iptables) and the fixed addresses of `scripts/cluster`,
//! so one such test runs at a time on a machine; `scripts/test` runs this binary on its own.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use support::walkthrough::{KVCB, KVCPB, MD, condition, jp, manifest, wait_granted, wait_ready_backend};
use support::{Kubectl, eventually};

const APISERVICE: &str = "apiservice/v1.worker.gpustack.ai";
const NAMESPACE: &str = "gpustack-system";
const LEASE: &[&str] = &["-n", NAMESPACE, "lease", "mooncake-dram-leader"];
const LEADER_PODS: &str = "app.kubernetes.io/instance=mooncake-dram,app.kubernetes.io/component=leader";
const ENGINE_PODS: &str = "app.kubernetes.io/instance=qwen-chat";

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts").join(name)
}

/// Runs one of our scripts; its stderr is the test's; panics with its name when it fails.
fn run_script(name: &str, args: &[&str]) -> String {
    let began = Instant::now();
    let out = Command::new(script(name))
        .args(args)
        .stderr(std::process::Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("run scripts/{name}: {e}"));
    assert!(out.status.success(), "scripts/{name} {args:?} failed");
    eprintln!("scripts/{name} {args:?}: {:.1}s", began.elapsed().as_secs_f64());
    String::from_utf8(out.stdout).expect("utf-8").trim().to_owned()
}

/// The cluster, brought up for the test and torn down when dropped (even when the test fails).
struct Cluster {
    kubeconfig: PathBuf,
}

impl Cluster {
    fn up() -> Cluster {
        // SAFETY of the fixed addresses: one cluster per machine, which `up` checks.
        let uid = Command::new("id").arg("-u").output().expect("id -u");
        assert_eq!(
            String::from_utf8_lossy(&uid.stdout).trim(),
            "0",
            "the real-cluster test runs a kubelet and containerd: run it as root"
        );
        // Our images, from this checkout (a release build; nothing to do when it is current),
        // and the stand-in engine on top of the store image, all imported by `cluster up`.
        run_script("image", &[]);
        engine_image();
        // A cluster left by an interrupted run is taken down first.
        run_script("cluster", &["down"]);
        let kubeconfig = PathBuf::from(run_script("cluster", &["up"]));
        Cluster { kubeconfig }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::env::var_os("KVCACHE_KEEP_CLUSTER").is_some() {
            eprintln!(
                "KVCACHE_KEEP_CLUSTER: left up, KUBECONFIG={}",
                self.kubeconfig.display()
            );
            return;
        }
        let _ = Command::new(script("cluster")).arg("down").status();
    }
}

const ENGINE_IMAGE: &str = "localhost/kvcache-test/engine:1";

/// Builds the stand-in engine image from the store image `scripts/image` just built, as an OCI
/// archive next to the others (`scripts/cluster up` imports them all).
fn engine_image() {
    let tools = std::env::var_os("KVCACHE_TOOLS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/kvcache-tools"));
    let context = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/cluster/engine");
    let store = format!("ghcr.io/gpustack/kvcache-store:v{}", env!("CARGO_PKG_VERSION"));
    let run = |args: &[&str]| {
        let out = Command::new("buildah").args(args).output().expect("buildah runs");
        assert!(
            out.status.success(),
            "buildah {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&[
        "build",
        "--quiet",
        "--layers=false",
        "--build-arg",
        &format!("STORE_IMAGE={store}"),
        "-f",
        context.join("Containerfile").to_str().expect("a UTF-8 path"),
        "-t",
        ENGINE_IMAGE,
        context.to_str().expect("a UTF-8 path"),
    ]);
    let archive = tools.join("images/test-engine.tar");
    let _ = std::fs::remove_file(&archive);
    run(&[
        "push",
        "--quiet",
        ENGINE_IMAGE,
        &format!("oci-archive:{}:{ENGINE_IMAGE}", archive.display()),
    ]);
}

/// `deploy/` in a folder of the test's own, with the serving certificate `kv-apiserver certs`
/// writes there (as the deploy README says), so the checkout stays clean.
fn deploy_copy(dir: &Path) -> PathBuf {
    let to = dir.join("deploy");
    let from = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    let status = Command::new("cp").arg("-R").arg(&from).arg(&to).status().expect("cp");
    assert!(status.success());
    let out = Command::new(env!("CARGO_BIN_EXE_kv-apiserver"))
        .args(["certs", "--out"])
        .arg(to.join("tls"))
        .output()
        .expect("kv-apiserver certs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    to
}

/// Waits on `kubectl wait` in rounds, so a slow start reads as a timeout with the object's state.
fn wait(k: &Kubectl, secs: u64, args: &[&str]) {
    let mut all = vec!["wait", "--timeout=5s"];
    all.extend_from_slice(args);
    eventually(secs, &format!("kubectl {}", all.join(" ")), || {
        k.run(&all).ok.then_some(())
    });
}

/// The Lease's holder (a leader Pod's name) and term.
fn holder(k: &Kubectl) -> Option<(String, u64)> {
    let out = jp(k, LEASE, "{.spec.holderIdentity} {.spec.leaseTransitions}");
    let (h, t) = out.split_once(' ')?;
    Some((h.to_owned(), t.parse().ok()?)).filter(|(h, _)| !h.is_empty())
}

/// `name ready restarts` of each Pod `selector` picks in `namespace`, one per line.
/// On a failure, what the cluster holds: every Pod, the engine Pods described and their logs,
/// the kinds' objects and the recent Events, so a failed run says why without a rerun.
struct DumpOnFailure<'a>(&'a Kubectl);

impl Drop for DumpOnFailure<'_> {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let k = self.0;
        for args in [
            &["get", "pods", "-A", "-o", "wide"][..],
            &["describe", "pods", "-n", "team-a"],
            &[
                "logs",
                "-n",
                "team-a",
                "-l",
                ENGINE_PODS,
                "--tail",
                "40",
                "--all-containers",
            ],
            &["get", "kvcb,kvcp,kvcpb,md", "-A", "-o", "yaml"],
            &["get", "events", "-A", "--sort-by", ".lastTimestamp"],
            &[
                "logs",
                "-n",
                NAMESPACE,
                "-l",
                "app.kubernetes.io/component=leader",
                "--tail",
                "40",
            ],
        ] {
            let r = k.run(args);
            eprintln!("--- kubectl {}\n{}{}", args.join(" "), r.stdout, r.stderr);
        }
    }
}

fn pods(k: &Kubectl, namespace: &str, selector: &str) -> Vec<(String, bool, u32)> {
    let out = k.run(&[
        "get",
        "pods",
        "-n",
        namespace,
        "-l",
        selector,
        "-o",
        "jsonpath={range .items[?(@.status.phase==\"Running\")]}{.metadata.name} {.status.containerStatuses[0].ready} {.status.containerStatuses[0].restartCount}{\"\\n\"}{end}",
    ]);
    out.stdout
        .lines()
        .filter_map(|l| {
            let mut f = l.split(' ');
            Some((f.next()?.to_owned(), f.next()? == "true", f.next()?.parse().ok()?))
        })
        .collect()
}

/// The engine simulator's round reports in a Pod's log (its JSON lines).
fn reports(k: &Kubectl, pod: &str) -> Vec<serde_json::Value> {
    k.run(&["logs", "-n", "team-a", pod, "-c", "engine"])
        .stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// `KVCacheLeaderHandover` events so far.
fn handovers(k: &Kubectl) -> usize {
    k.run(&[
        "get",
        "events",
        "-A",
        "--field-selector",
        "reason=KVCacheLeaderHandover",
        "-o",
        "name",
    ])
    .stdout
    .lines()
    .count()
}

/// After a failover that began at `began` from the term `term`: a leader serves in a later
/// term, the backend records the handover and reads Ready with its capacity in full (the members
/// remounted through the Service, handing over what they held), the Binding is granted again, and
/// the engines, which never restarted (a block with another key's bytes ends the simulator), hit
/// in full again in the new term without storing their blocks again. Prints the times and how
/// many rounds had to store blocks.
fn recovers(k: &Kubectl, what: &str, began: Instant, term: u64, handovers_before: usize, engines: &[Engine]) {
    let (h, t) = eventually(90, "a leader serves in a new term", || {
        holder(k).filter(|(_, t)| *t > term)
    });
    let handed = began.elapsed();
    eventually(60, "the backend records the handover", || {
        (handovers(k) > handovers_before).then_some(())
    });
    wait_ready_backend(k, "1Gi");
    wait_granted(k, "1Gi");
    let whole = began.elapsed();
    // Warm, every block of an engine's round hits and none is stored (it only reuses the shared
    // prefixes). The new term adopted what the members held, so the engines' rounds hit in full
    // again (a round the failover interrupted may have failed calls or misses meanwhile).
    let after = eventually(120, "the engines hit in full in the new term", || {
        let after: Vec<Vec<serde_json::Value>> = engines
            .iter()
            .map(|e| reports(k, &e.pod).into_iter().skip(e.seen).collect())
            .collect();
        after.iter().all(|a| a.last().is_some_and(warm)).then_some(after)
    });
    let stored_again = after
        .iter()
        .flatten()
        .filter(|r| r["stored"].as_u64() > Some(0))
        .count();
    for Engine { pod, .. } in engines {
        let p = pods(k, "team-a", ENGINE_PODS);
        let (_, _, restarts) = p
            .iter()
            .find(|(n, _, _)| n == pod)
            .unwrap_or_else(|| panic!("{pod} is gone: {p:?}"));
        assert_eq!(
            *restarts, 0,
            "{pod} restarted: a store error it cannot explain, or another key's bytes"
        );
    }
    // one handover per failover: nothing else (such as the leader Deployment shrinking while a
    // Pod is replaced) stopped the standby that took over
    assert_eq!(t, term + 1, "{what}: the Lease moved more than once");
    assert_eq!(
        holder(k),
        Some((h.clone(), t)),
        "{what}: the Lease moved again after the handover"
    );
    assert_eq!(
        k.ok(&[
            "get",
            "deployment",
            "-n",
            NAMESPACE,
            "mooncake-dram-leader",
            "-o",
            "jsonpath={.spec.replicas}"
        ]),
        "3"
    );
    eprintln!(
        "{what}: {h} serves term {t} after {:.1}s; Ready with full capacity and the Binding granted after {:.1}s; \
         {stored_again} engine rounds stored blocks again after it",
        handed.as_secs_f64(),
        whole.as_secs_f64()
    );
}

/// Waits for three leader Pods, one ready (serving) and two standbys, and returns the holder.
fn wait_standbys(k: &Kubectl) -> (String, u64) {
    eventually(180, "three leader Pods, one serving and two standing by", || {
        let p = pods(k, NAMESPACE, LEADER_PODS);
        let (h, t) = holder(k)?;
        (p.len() == 3
            && p.iter().filter(|(_, ready, _)| *ready).count() == 1
            && p.iter().any(|(n, r, _)| *n == h && *r))
        .then_some((h, t))
    })
}

/// A round in which every block hit and nothing had to be stored again.
fn warm(r: &serde_json::Value) -> bool {
    r["errors"].as_u64() == Some(0) && r["stored"].as_u64() == Some(0) && r["hits"] == r["blocks"]
}

/// An engine Pod before a failover, and how many reports it logged so far.
struct Engine {
    pod: String,
    seen: usize,
}

/// The engine Pods once each one's last round was warm.
fn engines_now(k: &Kubectl) -> Vec<Engine> {
    eventually(60, "every engine's rounds hit in full", || {
        pods(k, "team-a", ENGINE_PODS)
            .into_iter()
            .map(|(pod, _, _)| {
                let r = reports(k, &pod);
                r.last().is_some_and(warm).then_some(Engine { pod, seen: r.len() })
            })
            .collect::<Option<Vec<Engine>>>()
            .filter(|e| e.len() == 2)
    })
}

/// The node's containerd (`scripts/cluster`).
fn containerd_socket() -> String {
    std::env::var("KVCACHE_CLUSTER_DIR").unwrap_or_else(|_| "/var/lib/kvcache-cluster".into())
        + "/containerd/containerd.sock"
}

/// Runs `args` in a throwaway container of `image` under the node's containerd (through the
/// cluster's runc wrapper); its output.
fn in_container(image: &str, args: &[&str]) -> String {
    let runc = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/cluster/runc");
    let out = Command::new("ctr")
        .args([
            "--address",
            &containerd_socket(),
            "-n",
            "k8s.io",
            "run",
            "--rm",
            "--runc-binary",
        ])
        .arg(&runc)
        .args([image, &format!("kvcache-test-{}", std::process::id())])
        .args(args)
        .output()
        .expect("ctr runs");
    assert!(
        out.status.success(),
        "ctr run {image} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// The containerd id of a Pod's first container.
fn container_id(k: &Kubectl, pod: &str) -> String {
    let id = k.ok(&[
        "get",
        "pod",
        "-n",
        NAMESPACE,
        pod,
        "-o",
        "jsonpath={.status.containerStatuses[0].containerID}",
    ]);
    id.strip_prefix("containerd://")
        .unwrap_or_else(|| panic!("{pod}: container id {id:?}"))
        .to_owned()
}

#[test]
fn the_walkthrough_on_a_real_single_node_cluster() {
    let tmp = tempfile::tempdir().unwrap();
    let cluster = Cluster::up();
    let k = Kubectl::new("1.33", &cluster.kubeconfig, &tmp.path().join("kubectl-cache"));
    let _dump = DumpOnFailure(&k);
    // Our images run under containerd, as their non-root user.
    let version = env!("CARGO_PKG_VERSION");
    for (image, bin) in [("kvcache-apiserver", "kv-apiserver"), ("kvcache-store", "kv-store")] {
        let image = format!("ghcr.io/gpustack/{image}:v{version}");
        assert_eq!(in_container(&image, &[bin, "--version"]), format!("{bin} {version}"));
        assert_eq!(
            in_container(&image, &["id", "-u"]),
            "65532",
            "{image} runs as a non-root user"
        );
    }
    let node = k.ok(&["get", "nodes", "-o", "jsonpath={.items[*].metadata.name}"]);
    assert_eq!(node, "kvcache-node", "one node");

    // Install: kubectl apply -k deploy/ for real. The server's Pods start on the etcd of deploy/
    // and the APIService turns Available once kube-apiserver reaches them through the Service.
    let began = Instant::now();
    let deploy = deploy_copy(tmp.path());
    let applied = k.ok(&["apply", "-k", deploy.to_str().unwrap()]);
    assert!(
        applied.contains("apiservice.apiregistration.k8s.io/v1.worker.gpustack.ai created"),
        "{applied}"
    );
    wait(&k, 180, &["--for=condition=Available", APISERVICE]);
    wait(
        &k,
        60,
        &[
            "-n",
            NAMESPACE,
            "--for=condition=Available",
            "deployment/kvcache-apiserver",
        ],
    );
    eprintln!(
        "apply -k deploy/ to APIService Available: {:.1}s",
        began.elapsed().as_secs_f64()
    );
    let installed = k.ok(&["get", "pods", "-n", NAMESPACE, "-o", "wide"]);
    assert!(
        installed.contains("kvcache-etcd-0") && installed.contains("kvcache-apiserver-"),
        "{installed}"
    );

    // Least privilege: a namespace's editor reads Bindings and writes ModelDeployments, but only
    // a cluster administrator hands out pool quota; and the administrator lets the runtime into
    // team-a (deploy/README.md, "Tenant namespaces"), where it cannot let itself in.
    k.ok(&["create", "namespace", "team-a"]);
    k.ok(&[
        "-n",
        "team-a",
        "create",
        "rolebinding",
        "kvcache-apiserver-tenant",
        "--clusterrole=kvcache-apiserver-tenant",
        "--serviceaccount=gpustack-system:kvcache-apiserver",
    ]);
    k.ok(&[
        "create",
        "rolebinding",
        "eddie-edit",
        "-n",
        "team-a",
        "--clusterrole=edit",
        "--user=eddie",
    ]);
    eventually(60, "edit aggregates our rules", || {
        (k.run(&[
            "auth",
            "can-i",
            "list",
            "kvcachepoolbindings.worker.gpustack.ai",
            "-n",
            "team-a",
            "--as=eddie",
        ])
        .stdout
        .trim()
            == "yes")
            .then_some(())
    });
    let can = |verb: &str, what: &str| {
        k.run(&["auth", "can-i", verb, what, "-n", "team-a", "--as=eddie"])
            .stdout
            .trim()
            .to_owned()
    };
    assert_eq!(can("create", "modeldeployments.worker.gpustack.ai"), "yes");
    assert_eq!(can("create", "kvcachepoolbindings.worker.gpustack.ai"), "no");
    let step2 = manifest("02-pool-binding.yaml");
    let binding = step2
        .split("\n---\n")
        .find(|d| d.contains("KVCachePoolBinding"))
        .expect("a Binding in step 2");
    let refused = k.run_stdin(&["apply", "-f", "-", "--as=eddie"], Some(binding));
    assert!(!refused.ok, "a namespace editor created a Binding: {}", refused.text());
    assert!(
        refused.text().contains("Forbidden") && refused.text().contains("kvcachepoolbindings"),
        "{}",
        refused.text()
    );

    // Step 1: the leader Deployment's Pod and one member Pod per node run; the backend reads
    // Ready with the Service endpoint and the capacity its leader reports.
    let began = Instant::now();
    assert!(k.must_apply(&manifest("01-backend.yaml")).contains("created"));
    eventually(180, "kvcb Ready with the capacity the leader reports", || {
        let r = jp(&k, KVCB, "{.status.phase} {.status.capacity.total}");
        (r == "Ready 1Gi").then_some(())
    });
    wait_ready_backend(&k, "1Gi");
    eprintln!("step 1, backend Ready: {:.1}s", began.elapsed().as_secs_f64());
    let table = k.ok(&["get", "kvcb"]);
    assert!(
        table.contains("mooncake-dram-leader.gpustack-system.svc:50051") && table.contains("1Gi"),
        "{table}"
    );
    let running = |selector: &str| {
        k.ok(&[
            "get",
            "pods",
            "-n",
            NAMESPACE,
            "-l",
            selector,
            "--field-selector=status.phase=Running",
            "-o",
            "jsonpath={.items[*].metadata.name}",
        ])
    };
    assert_eq!(
        running("app.kubernetes.io/instance=mooncake-dram,app.kubernetes.io/component=leader")
            .split(' ')
            .count(),
        1
    );
    assert_eq!(
        running("app.kubernetes.io/instance=mooncake-dram,app.kubernetes.io/component=member")
            .split(' ')
            .count(),
        1,
        "one member per node"
    );

    // Step 2: the administrator's Binding is granted; EFFECTIVE is read back from the leader.
    let began = Instant::now();
    k.must_apply(&manifest("02-pool-binding.yaml"));
    wait_granted(&k, "1Gi");
    eprintln!("step 2, Binding granted: {:.1}s", began.elapsed().as_secs_f64());
    let granted = condition(&k, KVCPB, "QuotaGranted");
    assert!(granted.starts_with("True|Granted|"), "{granted}");
    // The runtime is in team-a (the administrator's RoleBinding) and in no other namespace, and
    // the store's NetworkPolicy admits team-a's engines. The harness's bridge CNI does not enforce
    // NetworkPolicies, so a Pod of another namespace is not refused here: only the policy is
    // checked.
    let tenant_bindings = k.ok(&[
        "get",
        "rolebindings",
        "-A",
        "--field-selector=metadata.name=kvcache-apiserver-tenant",
        "-o",
        "jsonpath={.items[*].metadata.namespace}",
    ]);
    assert_eq!(tenant_bindings.trim(), "team-a");
    eventually(60, "the store's NetworkPolicy admits team-a's engines", || {
        let values = k.ok(&[
            "-n",
            "gpustack-system",
            "get",
            "networkpolicy",
            "mooncake-dram-store",
            "-o",
            "jsonpath={.spec.ingress[0].from[2].namespaceSelector.matchExpressions[0].values}",
        ]);
        (values.trim() == r#"["team-a"]"#).then_some(())
    });

    // Step 3: two engine Pods (the stand-in image) attach through the injected environment;
    // the leader counts each replica's cache use under its name, and CacheAttached turns True
    // from those counts.
    let began = Instant::now();
    let md = manifest("03-model-deployment.yaml").replace(
        "    - name: server\n",
        &format!(
            "    - name: server\n      image: {ENGINE_IMAGE}\n      env:\n        - {{name: KVSTORE_SESSIONS, value: \"2\"}}\n        - {{name: KVSTORE_REQUESTS, value: \"4\"}}\n        - {{name: KVSTORE_BLOCK_BYTES, value: 16Ki}}\n        - {{name: KVSTORE_SUFFIX_BLOCKS, value: \"0\"}}\n"
        ),
    );
    assert!(md.contains(ENGINE_IMAGE), "{md}");
    k.must_apply(&md);
    eventually(180, "two engine Pods ready", || {
        let p = pods(&k, "team-a", ENGINE_PODS);
        (p.len() == 2 && p.iter().all(|(_, ready, _)| *ready)).then_some(())
    });
    eventually(
        60,
        "CacheAttached True from both replicas' counts at the leader",
        || {
            let c = condition(&k, MD, "CacheAttached");
            (c.starts_with("True|CacheActive|") && c.contains("server-0 (hit rate") && c.contains("server-1 (hit rate"))
                .then_some(())
        },
    );
    eprintln!(
        "step 3, two engines attached: {:.1}s ({})",
        began.elapsed().as_secs_f64(),
        condition(&k, MD, "CacheAttached")
    );

    // Step 6 (before 4, while one leader serves): prefill and decode stand-in engines behind our
    // router, a Deployment of the store's image. Its Pod finds the roles' Pods through their
    // headless Services (DNS, no API access), and a request through the router's Service
    // reaches an engine: the stand-in lists its model.
    let began = Instant::now();
    let pd = manifest("05-prefill-decode.yaml").replace(
        "      instanceType: local-small\n",
        &format!(
            "      instanceType: local-small\n      image: {ENGINE_IMAGE}\n      env:\n        - {{name: KVSTORE_SESSIONS, value: \"1\"}}\n        - {{name: KVSTORE_REQUESTS, value: \"2\"}}\n        - {{name: KVSTORE_BLOCK_BYTES, value: 16Ki}}\n"
        ),
    );
    assert_eq!(pd.matches(ENGINE_IMAGE).count(), 2, "{pd}");
    k.must_apply(&pd);
    let row = eventually(240, "qwen-pd: the router, prefill and decode ready", || {
        let row = k.ok(&["get", "-n", "team-a", "md", "qwen-pd", "--no-headers"]);
        row.contains("1R1P1D").then_some(row)
    });
    let endpoint = jp(&k, &["-n", "team-a", "md", "qwen-pd"], "{.status.endpoint}");
    assert_eq!(endpoint, "http://qwen-pd-router.team-a.svc:8000", "{row}");
    let ip = jp(&k, &["-n", "team-a", "svc", "qwen-pd-router"], "{.spec.clusterIP}");
    let models = eventually(60, "the router's Service answers with an engine's model list", || {
        let out = Command::new("curl")
            .args(["-sS", "--max-time", "5", &format!("http://{ip}:8000/v1/models")])
            .output()
            .ok()?;
        let body = String::from_utf8_lossy(&out.stdout).into_owned();
        body.contains("Qwen/Qwen2.5-7B-Instruct").then_some(body)
    });
    assert!(models.contains("kv-store engine-sim"), "{models}");
    eprintln!(
        "step 6, prefill/decode behind the router: {:.1}s ({})",
        began.elapsed().as_secs_f64(),
        row.split_whitespace().collect::<Vec<_>>().join(" ")
    );
    k.ok(&["delete", "-n", "team-a", "md", "qwen-pd", "--wait=false"]);

    // Step 4: three leader Pods, one serving; LEADERS 1/3; the Lease the serving leader holds is
    // what ElectionObserved reports.
    let began = Instant::now();
    k.must_apply(&manifest("04-high-availability.yaml"));
    let (serving, term) = wait_standbys(&k);
    eventually(60, "kvcb LEADERS 1/3 with ElectionObserved", || {
        (jp(&k, KVCB, "{.status.leader.replicas}/{.status.leader.readyReplicas}") == "3/1"
            && condition(&k, KVCB, "ElectionObserved").starts_with("True|Electing|"))
        .then_some(())
    });
    let wide = k.ok(&["get", "kvcb", "-o", "wide"]);
    assert!(wide.contains("1/3"), "{wide}");
    let election = condition(&k, KVCB, "ElectionObserved");
    // the Lease's holder is the one ready leader Pod (wait_standbys), and ElectionObserved reads
    // that Lease
    assert!(
        election.contains(&format!("the Lease {NAMESPACE}/mooncake-dram-leader names a holder")),
        "{election}"
    );
    eprintln!(
        "step 4, three leaders: {:.1}s ({serving} serves term {term})",
        began.elapsed().as_secs_f64()
    );

    // Step 5: the serving leader's Pod is deleted; a standby takes over.
    let marks = engines_now(&k);
    let before = handovers(&k);
    let began = Instant::now();
    k.ok(&["delete", "pod", "-n", NAMESPACE, &serving, "--wait=false"]);
    recovers(&k, "step 5, leader Pod deleted", began, term, before, &marks);

    // ... and, separately, the serving leader's container is killed (SIGKILL through containerd).
    let (serving, term) = wait_standbys(&k);
    let marks = engines_now(&k);
    let before = handovers(&k);
    let socket = containerd_socket();
    let id = container_id(&k, &serving);
    let began = Instant::now();
    let killed = Command::new("ctr")
        .args([
            "--address",
            &socket,
            "-n",
            "k8s.io",
            "tasks",
            "kill",
            "-s",
            "SIGKILL",
            &id,
        ])
        .output()
        .expect("ctr runs");
    assert!(
        killed.status.success(),
        "ctr tasks kill: {}",
        String::from_utf8_lossy(&killed.stderr)
    );
    recovers(&k, "step 5, leader container killed", began, term, before, &marks);

    // A backend whose image cannot run kv-store says so in its status, in the runtime's words.
    let began = Instant::now();
    k.must_apply(
        "apiVersion: worker.gpustack.ai/v1\nkind: KVCacheBackend\nmetadata: {name: no-store}\nspec:\n  type: Mooncake\n  \
         image: localhost/kvcache-test/pause:1\n  connection:\n    managed:\n      leader: {}\n      members:\n        \
         - {nodeSelector: {kubernetes.io/os: linux}, medium: DRAM, capacityPerMember: 64Mi}\n",
    );
    let said = eventually(120, "the backend says its image has no kv-store", || {
        let r = jp(&k, &["kvcb", "no-store"], "{.status.phase}: {.status.phaseMessage}");
        (r.starts_with("Error: ") && r.contains("\"kv-store\": executable file not found")).then_some(r)
    });
    eprintln!(
        "an image without kv-store, after {:.1}s: {said}",
        began.elapsed().as_secs_f64()
    );

    // A backend with a disk tier: the node's directory (made by the administrator, owned by the
    // image's user) is mounted into the member, surveyed first (TierWasEmpty), and counted in
    // the capacity.
    let began = Instant::now();
    let tier = tmp.path().join("tier");
    std::fs::create_dir(&tier).unwrap();
    let owned = Command::new("chown").args(["65532:0"]).arg(&tier).status().unwrap();
    assert!(owned.success());
    k.must_apply(&format!(
        "apiVersion: worker.gpustack.ai/v1\nkind: KVCacheBackend\nmetadata: {{name: tiered}}\nspec:\n  type: Mooncake\n  \
         connection:\n    managed:\n      leader: {{}}\n      members:\n        - nodeSelector: {{kubernetes.io/os: linux}}\n          \
         medium: DRAM\n          capacityPerMember: 16Mi\n          localDisks:\n            - path: {}\n              \
         capacity: 64Mi\n",
        tier.display()
    ));
    eventually(180, "the tiered backend Ready, its tier counted", || {
        (jp(&k, &["kvcb", "tiered"], "{.status.phase} {.status.capacity.total}") == "Ready 80Mi").then_some(())
    });
    let decided = eventually(60, "TierWasEmpty decided", || {
        let c = condition(&k, &["kvcb", "tiered"], "TierWasEmpty");
        (!c.starts_with('|')).then_some(c)
    });
    assert!(decided.starts_with("True|Empty|"), "{decided}");
    let held = std::fs::read_dir(&tier).unwrap().count();
    assert!(held >= 1, "the member opened its tier there (its lock file)");
    eprintln!(
        "a backend with a disk tier on the node, Ready in {:.1}s: {decided}",
        began.elapsed().as_secs_f64()
    );
}
