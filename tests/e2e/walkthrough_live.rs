//! The walkthrough happens: real kubectl applies its steps 1–3
//! (`tests/fixtures/walkthrough/01..03`) to `kv-apiserver serve` with its controllers and the
//! local runtime, and sees the store assemble, the quota take effect and the workload attach.
//!
//! Member capacities are 1Gi instead of 8Gi (and the pool's total and the Binding's ceiling are
//! scaled the same way), so the suite fits any CI machine; members claim memory only as it is
//! written either way. The controllers requeue every 2 s here (15 s by default).

mod support;

use std::collections::BTreeSet;

use support::walkthrough::*;
use support::{Kubectl, Server, eventually};

const KUBECTL: &str = "1.33";

fn server() -> Server {
    Server::start_with(&["--requeue-interval", "2s"])
}

/// Status writes the controllers made so far (their metric); fails when the metric is not
/// served, so a renamed metric cannot make "nothing was written" pass.
fn status_writes(s: &Server) -> u64 {
    let body = s.get_body("/metrics", &[]);
    let samples: Vec<u64> = body
        .lines()
        .filter(|l| l.starts_with("kvcache_controller_status_writes_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .collect();
    assert!(
        !samples.is_empty(),
        "/metrics serves no kvcache_controller_status_writes_total sample"
    );
    samples.iter().sum()
}

/// Reconcile passes of every kind so far.
fn reconciles(s: &Server) -> u64 {
    let body = s.get_body("/metrics", &[]);
    let samples: Vec<u64> = body
        .lines()
        .filter(|l| l.starts_with("kvcache_controller_reconcile_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .collect();
    assert!(
        !samples.is_empty(),
        "/metrics serves no kvcache_controller_reconcile_total sample"
    );
    samples.iter().sum()
}

fn apply_walkthrough(k: &Kubectl) {
    k.must_apply(&manifest("01-backend.yaml"));
    k.must_apply(&manifest("02-pool-binding.yaml"));
    k.must_apply(&manifest("03-model-deployment.yaml"));
}

/// Steps 1–3 in order; the figures are the store's; describe shows conditions and events; a
/// settled walkthrough writes nothing; a killed member is reported and comes back.
#[test]
fn the_walkthrough_runs_on_one_machine() {
    let s = server();
    let k = s.kubectl(KUBECTL);
    k.must_apply(&manifest("01-backend.yaml"));
    wait_ready_backend(&k, "2Gi");
    let table = k.ok(&["get", "kvcb"]);
    let row: Vec<&str> = table.lines().nth(1).unwrap_or_default().split_whitespace().collect();
    assert_eq!(row.len(), 5, "{table}");
    assert_eq!(
        (row[0], row[1], row[2], row[4]),
        ("mooncake-dram", "Mooncake", "Ready", "2Gi")
    );
    assert!(row[3].starts_with("127.0.0.1:"), "{table}");
    for t in ["LeaderAvailable", "CapacityObserved", "MembersMounted"] {
        assert!(
            condition(&k, KVCB, t).starts_with("True|"),
            "{t}: {}",
            condition(&k, KVCB, t)
        );
    }
    // the store the runtime started takes only its controllers: the ledger cannot be replaced
    // without the controllers' token, and with it (kept 0600 under the data directory) it can be read
    let endpoint = row[3].to_owned();
    let store = std::path::Path::new(env!("CARGO_BIN_EXE_kv-apiserver")).with_file_name("kv-store");
    let anonymous = std::process::Command::new(&store)
        .args(["tenants", "--leader", &endpoint, "--set", "intruder=1Gi:64:bfloat16"])
        .args(store_tls(&s))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&anonymous.stderr);
    assert!(
        !anonymous.status.success() && said.contains("UNAUTHENTICATED"),
        "{said}"
    );
    let token = s.dir.path().join("store-tokens/control-mooncake-dram.token");
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&token).unwrap().permissions()) & 0o777,
        0o600
    );
    let read = std::process::Command::new(&store)
        .args(["tenants", "--leader", &endpoint, "--control-token-file"])
        .arg(&token)
        .args(store_tls(&s))
        .output()
        .unwrap();
    assert!(read.status.success(), "{}", String::from_utf8_lossy(&read.stderr));
    let nodes = jp(&k, KVCB, "{.status.members[*].nodeName}");
    let nodes: BTreeSet<&str> = nodes.split_whitespace().collect();
    assert_eq!(
        nodes,
        BTreeSet::from(["local-0", "local-1"]),
        "one member per stand-in node"
    );

    k.must_apply(&manifest("02-pool-binding.yaml"));
    wait_granted(&k, "1Gi");
    wait_jp(&k, KVCP, "{.status.phase}", "Ready");
    assert_eq!(jp(&k, KVCPB, "{.status.requestedQuota}"), "1Gi");

    k.must_apply(&manifest("03-model-deployment.yaml"));
    wait_attached(&k);
    assert!(condition(&k, MD, "DomainRegistered").starts_with("True|Registered|"));
    // The second replica reads blocks the first wrote (they share system prompts).
    let hit = eventually(60, "server-1 reports a hit rate above 0", || {
        s.get_body("/metrics", &[])
            .lines()
            .find(|l| l.starts_with("kvcache_replica_cache_hit_ratio{") && l.contains("replica=\"server-1\""))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .filter(|r| *r > 0.0)
    });
    assert!(hit > 0.0);
    eventually(60, "both replicas ready", || {
        (jp(&k, MD, "{.status.roleSummary} {.status.phase}") == "2S Ready").then_some(())
    });
    // describe shows the conditions and what the controllers did (core v1 Events).
    let described = eventually(30, "describe shows the leader's event", || {
        let d = k.ok(&["describe", "kvcb", "mooncake-dram"]);
        d.contains("LeaderAvailable is True").then_some(d)
    });
    for needle in [
        "LeaderAvailable",
        "MembersMounted",
        "Serving",
        "Mounted",
        "Capacity",
        "Events:",
        "kvcache-controller",
    ] {
        assert!(described.contains(needle), "describe lacks {needle}: {described}");
    }
    eventually(
        30,
        "kubectl get events -A lists the backend's and the deployment's events",
        || {
            let events = k.ok(&["get", "events", "-A"]);
            (events.contains("kvcachebackend/mooncake-dram")
                && events.contains("modeldeployment/qwen-chat")
                && events.contains("CacheActive"))
            .then_some(())
        },
    );

    // Settled: once the engines are idle, the controllers pass over every object three times
    // more (requeues and watches) without a status write. Counted in passes, not waited in time.
    // The counter moved while the walkthrough assembled: it counts the writes it is meant to.
    let mut mark = (status_writes(&s), reconciles(&s));
    assert!(
        mark.0 > 0,
        "the controllers wrote every status above, and the counter shows none"
    );
    let objects = k
        .ok(&["get", "kvcb,kvcp,kvcpb,md", "-A", "--no-headers"])
        .lines()
        .count() as u64;
    assert!(objects >= 4, "the walkthrough's objects: {objects}");
    eventually(90, "three passes over every object write no status", || {
        let now = (status_writes(&s), reconciles(&s));
        if now.0 != mark.0 {
            // a write: the passes count again from here
            mark = now;
            return None;
        }
        (now.1 >= mark.1 + 3 * objects).then_some(())
    });

    // SIGKILL one member: MembersMounted names its node and the capacity halves, then both return.
    let port = leader_port(&k);
    let member = store_processes(&s, &port)
        .into_iter()
        .find(|(_, c)| c.contains(" member ") && c.contains("mooncake-dram-member-0-local-1"))
        .expect("the member process on local-1");
    let watch = k.spawn_lines(&[
        "get",
        "kvcb",
        "mooncake-dram",
        "-w",
        "-o",
        "jsonpath={.status.capacity.total}|{.status.conditions[?(@.type==\"MembersMounted\")].status}|{.status.conditions[?(@.type==\"MembersMounted\")].message}{\"\\n\"}",
    ]);
    std::process::Command::new("kill")
        .args(["-KILL", &member.0.to_string()])
        .status()
        .unwrap();
    let seen = watch.wait_for(&["1Gi|False|", "local-1"]);
    assert!(seen.last().unwrap().contains("signal 9"), "{seen:?}");
    watch.wait_for(&["2Gi|True|"]);
    eventually(30, "the lost member is an event", || {
        k.ok(&["describe", "kvcb", "mooncake-dram"])
            .contains("MemberCrashLooping")
            .then_some(())
    });
}

/// Deleting in creation order is held at each step, then completes, leaving no process behind;
/// and `kill -9` of the server leaves no store process running.
#[test]
fn deletion_in_creation_order_is_held_then_completes() {
    let s = server();
    let k = s.kubectl(KUBECTL);
    apply_walkthrough(&k);
    wait_ready_backend(&k, "2Gi");
    wait_granted(&k, "1Gi");
    wait_attached(&k);
    let port = leader_port(&k);
    let processes = store_processes(&s, &port);
    assert_eq!(processes.len(), 5, "leader, two members, two engines: {processes:?}");

    k.ok(&["delete", "kvcb", "mooncake-dram", "--wait=false"]);
    eventually(30, "the backend held by the pool", || {
        let c = condition(&k, KVCB, "Deletable");
        (jp(&k, KVCB, "{.status.phase}") == "Deleting"
            && c.starts_with("False|InUse|")
            && c.contains("KVCachePool/shared-dram"))
        .then_some(())
    });
    k.ok(&["delete", "kvcp", "shared-dram", "--wait=false"]);
    eventually(30, "the pool held by the Binding", || {
        let c = condition(&k, KVCP, "Releasable");
        (c.starts_with("False|HeldByBindings|") && c.contains("team-a/team-a")).then_some(())
    });
    k.ok(&["-n", "team-a", "delete", "kvcpb", "team-a", "--wait=false"]);
    eventually(30, "the Binding held by the deployment", || {
        let c = condition(&k, KVCPB, "Releasable");
        (c.starts_with("False|HeldByWorkloads|") && c.contains("ModelDeployment/qwen-chat")).then_some(())
    });
    // The store still serves while it is held.
    assert!(processes.iter().all(|(p, _)| alive(*p)));
    k.ok(&["-n", "team-a", "delete", "md", "qwen-chat", "--wait=false"]);
    for (what, args) in [("md", MD), ("kvcpb", KVCPB), ("kvcp", KVCP), ("kvcb", KVCB)] {
        eventually(60, &format!("{what} deleted"), || {
            let mut a = vec!["get"];
            a.extend_from_slice(args);
            let r = k.run(&a);
            (!r.ok && r.stderr.contains("NotFound")).then_some(())
        });
    }
    eventually(30, "no store process left", || {
        processes.iter().all(|(p, _)| !alive(*p)).then_some(())
    });
    // nor a segment file: members unlink theirs as soon as it is mapped
    let left: Vec<String> = std::fs::read_dir("/dev/shm")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| {
            processes
                .iter()
                .any(|(p, _)| n.starts_with(&format!("kvstore-segment-{p}-")))
        })
        .collect();
    assert!(left.is_empty(), "segment files left behind: {left:?}");

    // kill -9 of the server: its children stop on their own.
    k.must_apply(&manifest("01-backend.yaml"));
    wait_ready_backend(&k, "2Gi");
    let processes = store_processes(&s, &leader_port(&k));
    assert_eq!(processes.len(), 3, "{processes:?}");
    drop(s); // SIGKILL
    eventually(20, "no store process outlives the server", || {
        processes.iter().all(|(p, _)| !alive(*p)).then_some(())
    });
}

/// The three manifests applied in reverse order converge to the same state.
#[test]
fn reverse_order_converges() {
    let s = server();
    let k = s.kubectl(KUBECTL);
    k.must_apply(&manifest("03-model-deployment.yaml"));
    k.must_apply(&manifest("02-pool-binding.yaml"));
    k.must_apply(&manifest("01-backend.yaml"));
    wait_ready_backend(&k, "2Gi");
    wait_granted(&k, "1Gi");
    wait_attached(&k);
    wait_jp(&k, KVCP, "{.status.phase}", "Ready");
    wait_jp(&k, MD, "{.status.phase}", "Ready");
}

/// Without multi-tenancy: the pool is admitted with a warning, the Binding is granted
/// `Unenforced`, and no EFFECTIVE figure is shown.
#[test]
fn a_single_tenant_backend_leaves_quota_unenforced() {
    let s = server();
    let k = s.kubectl(KUBECTL);
    k.must_apply(&manifest("01-backend.yaml").replace("leader: {}", "leader:\n        multiTenancy: false"));
    wait_ready_backend(&k, "2Gi");
    let r = k.apply(&[], &manifest("02-pool-binding.yaml"));
    assert!(r.ok, "{}", r.text());
    assert!(
        r.stderr.contains("Warning") && r.stderr.contains("multiTenancy: false"),
        "{}",
        r.text()
    );
    eventually(60, "QuotaGranted True Unenforced", || {
        condition(&k, KVCPB, "QuotaGranted")
            .starts_with("True|Unenforced|")
            .then_some(())
    });
    assert_eq!(jp(&k, KVCPB, "{.status.effectiveQuota}"), "");
    let row = k.ok(&["-n", "team-a", "get", "kvcpb", "team-a"]);
    assert_eq!(
        row.lines().nth(1).unwrap_or_default().split_whitespace().count(),
        6,
        "EFFECTIVE is empty: {row}"
    );
    assert_eq!(jp(&k, KVCPB, "{.status.phase}"), "Ready");
    // A deployment without kvCache runs with no cache at all.
    let plain = manifest("03-model-deployment.yaml").replace("  kvCache:\n    poolRef:\n      name: team-a\n", "");
    assert!(!plain.contains("kvCache"), "{plain}");
    k.must_apply(&plain);
    eventually(60, "a deployment without a cache is Ready", || {
        (jp(&k, MD, "{.status.phase} {.status.roles[0].ready}") == "Ready 2").then_some(())
    });
    assert!(condition(&k, MD, "CacheAttached").starts_with("True|NotApplicable|"));
    assert!(condition(&k, MD, "DomainRegistered").starts_with("True|NotApplicable|"));
    assert_eq!(jp(&k, MD, "{.status.kvCache}"), "");
}

/// Ceilings past the mounted capacity get proportional grants, read from the leader; larger
/// members roll and the grants follow.
#[test]
fn oversubscribed_ceilings_get_proportional_grants() {
    let s = server();
    let k = s.kubectl(KUBECTL);
    k.must_apply(&manifest("01-backend.yaml"));
    wait_ready_backend(&k, "2Gi");
    k.must_apply(
        "apiVersion: worker.gpustack.ai/v1\nkind: KVCachePool\nmetadata:\n  name: shared-dram\nspec:\n  backends: [mooncake-dram]\n  quota:\n    total: 4Gi\n",
    );
    for (ns, ceiling) in [("team-a", "3Gi"), ("team-b", "1Gi")] {
        k.must_apply(&format!(
            "apiVersion: worker.gpustack.ai/v1\nkind: KVCachePoolBinding\nmetadata:\n  name: {ns}\n  namespace: {ns}\nspec:\n  poolRef:\n    name: shared-dram\n  quota:\n    ceiling: {ceiling}\n  domain:\n    name: {ns}\n    blockSize: 64\n    dtype: bfloat16\n"
        ));
    }
    for (ns, grant) in [("team-a", "1536Mi"), ("team-b", "512Mi")] {
        eventually(60, &format!("{ns} granted {grant}"), || {
            let what = ["-n", ns, "kvcpb", ns];
            let e = jp(&k, &what, "{.status.effectiveQuota}");
            (e == grant && condition(&k, &what, "QuotaGranted").starts_with("True|Granted|")).then_some(())
        });
    }
    assert!(
        condition(&k, KVCP, "QuotaWithinTotal").starts_with("True|"),
        "4Gi asked of a 4Gi pool"
    );
    // Larger members roll, the capacity follows, and the ceilings now fit: full grants.
    k.ok(&[
        "patch",
        "kvcb",
        "mooncake-dram",
        "--type=json",
        "-p",
        r#"[{"op":"replace","path":"/spec/connection/managed/members/0/capacityPerMember","value":"2Gi"}]"#,
    ]);
    wait_ready_backend(&k, "4Gi");
    for (ns, grant) in [("team-a", "3Gi"), ("team-b", "1Gi")] {
        eventually(60, &format!("{ns} granted its whole ceiling {grant}"), || {
            (jp(&k, &["-n", ns, "kvcpb", ns], "{.status.effectiveQuota}") == grant).then_some(())
        });
    }
    eventually(30, "the grant change is an event", || {
        k.ok(&["-n", "team-a", "describe", "kvcpb", "team-a"])
            .contains("GrantChanged")
            .then_some(())
    });
}

/// A pool's total is what the store grants its Bindings at most: one pool asked for more than its
/// total has its Bindings cut within it, and another pool on the same backend keeps whole grants;
/// only the capacity, which the pools share, cuts them all.
#[test]
fn one_pools_oversubscription_leaves_another_pools_grants_whole() {
    let s = server();
    let k = s.kubectl(KUBECTL);
    k.must_apply(&manifest("01-backend.yaml"));
    wait_ready_backend(&k, "2Gi");
    for (pool, total) in [("small", "512Mi"), ("large", "1536Mi")] {
        k.must_apply(&format!(
            "apiVersion: worker.gpustack.ai/v1\nkind: KVCachePool\nmetadata:\n  name: {pool}\nspec:\n  backends: [mooncake-dram]\n  quota:\n    total: {total}\n"
        ));
    }
    for (ns, pool, ceiling) in [
        ("team-a", "small", "512Mi"),
        ("team-b", "small", "512Mi"),
        ("team-c", "large", "1536Mi"),
    ] {
        k.must_apply(&format!(
            "apiVersion: worker.gpustack.ai/v1\nkind: KVCachePoolBinding\nmetadata:\n  name: {ns}\n  namespace: {ns}\nspec:\n  poolRef:\n    name: {pool}\n  quota:\n    ceiling: {ceiling}\n  domain:\n    name: {ns}\n    blockSize: 64\n    dtype: bfloat16\n"
        ));
    }
    // 2.5Gi asked of 2Gi mounted: cut across the backend, every grant would be 4/5 of its ceiling;
    // but the pools may hand out 512Mi + 1.5Gi, which fits, so only "small" cuts, within its 512Mi
    let small_cut = "the Bindings of the pool \"small\" ask for more than its total of 512Mi";
    for (ns, grant, why) in [
        ("team-a", "256Mi", small_cut),
        ("team-b", "256Mi", small_cut),
        ("team-c", "1536Mi", "granted 1536Mi of the 1536Mi asked for"),
    ] {
        eventually(60, &format!("{ns} granted {grant}"), || {
            let what = ["-n", ns, "kvcpb", ns];
            let e = jp(&k, &what, "{.status.effectiveQuota}");
            let c = condition(&k, &what, "QuotaGranted");
            (e == grant && c.starts_with("True|Granted|") && c.contains(why)).then_some(())
        });
    }
    let small = condition(&k, &["kvcp", "small"], "QuotaWithinTotal");
    assert!(
        small.starts_with("False|Oversubscribed|") && small.contains("no other pool's grants shrink"),
        "{small}"
    );
    assert!(condition(&k, &["kvcp", "large"], "QuotaWithinTotal").starts_with("True|"));
    // "small" may now hand out 1Gi: the pools together (2.5Gi) outgrow the capacity, which they
    // share in proportion, and every status says the capacity cut
    k.ok(&[
        "patch",
        "kvcp",
        "small",
        "--type=merge",
        "-p",
        r#"{"spec":{"quota":{"total":"1Gi"}}}"#,
    ]);
    eventually(60, "team-c cut by the capacity", || {
        let c = condition(&k, &["-n", "team-c", "kvcpb", "team-c"], "QuotaGranted");
        (c.starts_with("True|Granted|") && c.contains("more than its mounted capacity")).then_some(())
    });
    for pool in ["small", "large"] {
        eventually(60, &format!("{pool} says the capacity cut its Bindings"), || {
            condition(&k, &["kvcp", pool], "CapacityAllocatable")
                .contains("less than its pools may hand out together")
                .then_some(())
        });
    }
    // every Binding's status follows on its own pass: wait until all three read the new grants,
    // which then add up to the capacity (but rounding), never past it
    let granted = eventually(60, "the three grants add up to the 2Gi mounted", || {
        let granted: u64 = ["team-a", "team-b", "team-c"]
            .iter()
            .map(|ns| {
                let q = jp(&k, &["-n", ns, "kvcpb", ns], "{.status.effectiveQuota}");
                kvcache_units::parse_bytes(&q).unwrap_or_else(|e| panic!("{ns}: {q:?}: {e}"))
            })
            .sum();
        (granted > (2 << 30) - 4096).then_some(granted)
    });
    assert!(
        granted <= 2 << 30,
        "grants add up to {granted} bytes, past the 2Gi mounted"
    );
}

/// The environment of a process, as `NAME=value` entries.
fn environ(pid: u32) -> Vec<String> {
    let raw = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    raw.split(|b| *b == 0)
        .map(|e| String::from_utf8_lossy(e).into_owned())
        .collect()
}

/// The Binding's credential file, parsed, with its mode.
fn credential_file(s: &Server) -> (serde_json::Value, u32) {
    let path = s.dir.path().join("tenant-credentials/team-a/team-a.json");
    let meta = std::fs::metadata(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let v = serde_json::from_slice(&std::fs::read(&path).expect("the credential file")).expect("JSON");
    (v, std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777)
}

/// The credentials the engine replicas of the walkthrough run with.
fn engine_credentials(s: &Server, port: &str) -> BTreeSet<String> {
    store_processes(s, port)
        .into_iter()
        .filter(|(_, c)| c.contains("engine-sim"))
        .flat_map(|(pid, _)| environ(pid))
        .filter_map(|e| e.strip_prefix("KVSTORE_CREDENTIAL=").map(str::to_owned))
        .collect()
}

/// The tenant `team-a`'s line of `kv-store tenants`, read with the controllers' token.
fn tenant_row(s: &Server, endpoint: &str) -> serde_json::Value {
    let store = std::path::Path::new(env!("CARGO_BIN_EXE_kv-apiserver")).with_file_name("kv-store");
    let out = std::process::Command::new(&store)
        .args(["tenants", "--leader", endpoint, "--control-token-file"])
        .arg(s.dir.path().join("store-tokens/control-mooncake-dram.token"))
        .args(store_tls(s))
        .output()
        .expect("kv-store tenants runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|t| t["name"] == "default")
        .expect("the Binding's tenant (its domain is named default)")
}

/// Rounds with the cache that the replica `name` logged (one JSON report per round, across its
/// restarts). Rounds without one (a replica started before its Binding was ready runs with no
/// cache, then is restarted attached) find and store nothing, and are left out.
fn rounds_logged(s: &Server, name: &str) -> Vec<serde_json::Value> {
    let log = s
        .dir
        .path()
        .join(format!("logs/_deployments/team-a/qwen-chat/{name}.log"));
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["stored"].as_u64().unwrap_or(0) + v["hits"].as_u64().unwrap_or(0) > 0)
        .collect()
}

/// A simulated engine of tenant `default` with `credential`: what its single round reports,
/// or why it failed.
fn engine_round(s: &Server, endpoint: &str, credential: Option<&str>) -> serde_json::Value {
    let store = std::path::Path::new(env!("CARGO_BIN_EXE_kv-apiserver")).with_file_name("kv-store");
    let mut cmd = std::process::Command::new(&store);
    cmd.arg("engine-sim")
        .env_clear()
        .env("KVSTORE_LEADER", endpoint)
        .env("KVSTORE_TENANT", "default")
        .env("KVSTORE_BLOCK_SIZE", "64")
        .env("KVSTORE_DTYPE", "bfloat16")
        .env("KVSTORE_BLOCK_BYTES", "16Ki")
        .env("KVSTORE_SESSIONS", "1")
        .env("KVSTORE_REQUESTS", "2")
        .env("KVSTORE_TLS_CA", s.dir.path().join("store-tls/ca.crt"))
        .env("KVSTORE_TLS_SERVER_NAME", "mooncake-dram.kvstore.internal");
    if let Some(c) = credential {
        cmd.env("KVSTORE_CREDENTIAL", c);
    }
    let out = cmd.output().expect("kv-store engine-sim runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().last().unwrap_or_default())
        .expect("the round's report")
}

/// The Binding's tenant credential: minted into a 0600 file under the data directory, never in
/// the API, handed to the replicas alone, required by the leader; rotated on request with the
/// replicas rolled onto the new one and no block written again (the cache stays warm), and the
/// old one refused once no replica runs with it.
#[test]
fn a_bindings_credential_is_private_injected_and_rotated_without_a_cold_cache() {
    let s = server();
    let k = s.kubectl(KUBECTL);
    apply_walkthrough(&k);
    wait_attached(&k);
    let port = leader_port(&k);
    let endpoint = format!("127.0.0.1:{port}");

    let (file, mode) = credential_file(&s);
    assert_eq!(mode, 0o600);
    let first = file["current"].as_str().unwrap().to_owned();
    assert_eq!(first.len(), 64);
    let everything = k.ok(&["get", "kvcpb,md,kvcp,kvcb", "-A", "-o", "yaml"]);
    assert!(!everything.contains(&first), "the credential is in the API");
    assert_eq!(engine_credentials(&s, &port), BTreeSet::from([first.clone()]));
    // and they trust the store's CA for the backend's name (every store port is TLS)
    for (pid, _) in store_processes(&s, &port)
        .into_iter()
        .filter(|(_, c)| c.contains("engine-sim"))
    {
        let env = environ(pid);
        assert!(
            env.iter()
                .any(|e| e == "KVSTORE_TLS_SERVER_NAME=mooncake-dram.kvstore.internal"),
            "{env:?}"
        );
        assert!(
            env.iter()
                .any(|e| e.starts_with("KVSTORE_TLS_CA_PEM=-----BEGIN CERTIFICATE-----"))
        );
    }
    assert_eq!(tenant_row(&s, &endpoint)["credentials"], 1);

    // Without the credential, or with another, every call is refused; with it, calls succeed.
    let none = engine_round(&s, &endpoint, None);
    assert_eq!(
        (none["hits"].as_u64(), none["stored"].as_u64()),
        (Some(0), Some(0)),
        "{none}"
    );
    assert!(none["errors"].as_u64().unwrap() > 0, "{none}");
    let wrong = engine_round(&s, &endpoint, Some("not-the-credential"));
    assert_eq!(wrong["hits"], 0, "{wrong}");
    assert!(wrong["errors"].as_u64().unwrap() > 0, "{wrong}");
    assert_eq!(engine_round(&s, &endpoint, Some(&first))["errors"], 0);

    // Both replicas ran their three rounds: from here a warm cache answers every block.
    eventually(90, "both replicas ran three rounds", || {
        (rounds_logged(&s, "server-0").len() >= 3 && rounds_logged(&s, "server-1").len() >= 3).then_some(())
    });
    let before = tenant_row(&s, &endpoint);

    k.ok(&[
        "annotate",
        "-n",
        "team-a",
        "kvcpb",
        "team-a",
        "gpustack.ai/credential-rotation=1",
    ]);
    let second = eventually(90, "the rotation completes", || {
        let (f, _) = credential_file(&s);
        let current = f["current"].as_str()?.to_owned();
        (current != first && f["rotation"]["state"] == "steady").then_some(current)
    });
    // The replicas rolled onto the new credential and none runs with the old one.
    assert_eq!(engine_credentials(&s, &port), BTreeSet::from([second.clone()]));
    eventually(30, "the rotation is two events", || {
        let events = k.ok(&[
            "get",
            "events",
            "-n",
            "team-a",
            "--field-selector",
            "reason=CredentialRotated",
        ]);
        (events.matches("CredentialRotated").count() >= 2).then_some(())
    });
    eventually(60, "the restarted replicas ran three rounds", || {
        (rounds_logged(&s, "server-0").len() >= 6 && rounds_logged(&s, "server-1").len() >= 6).then_some(())
    });
    // Warm: every block of the restarted replicas' rounds was found, none written again.
    for name in ["server-0", "server-1"] {
        for r in &rounds_logged(&s, name)[3..] {
            assert_eq!(
                (r["stored"].as_u64(), r["errors"].as_u64()),
                (Some(0), Some(0)),
                "{name}: {r}"
            );
            assert_eq!(r["hits"], r["blocks"], "{name}: {r}");
        }
    }
    let after = tenant_row(&s, &endpoint);
    assert_eq!(
        after["puts"], before["puts"],
        "blocks were written again: {before} {after}"
    );
    assert_eq!(after["credentials"], 1);
    let old = engine_round(&s, &endpoint, Some(&first));
    assert!(
        old["errors"].as_u64().unwrap() > 0,
        "the retired credential still works: {old}"
    );
    assert_eq!(engine_round(&s, &endpoint, Some(&second))["errors"], 0);
    assert_eq!(jp(&k, MD, "{.status.phase}"), "Ready");

    // Deleted and created again, the Binding gets a credential of its own.
    k.ok(&["delete", "-n", "team-a", "md", "qwen-chat"]);
    k.ok(&["delete", "-n", "team-a", "kvcpb", "team-a", "--wait=true"]);
    assert!(
        !s.dir.path().join("tenant-credentials/team-a/team-a.json").exists(),
        "a deleted Binding's credential is forgotten"
    );
    k.must_apply(&manifest("02-pool-binding.yaml"));
    let third = eventually(60, "the new Binding's credential", || {
        let path = s.dir.path().join("tenant-credentials/team-a/team-a.json");
        path.exists()
            .then(|| credential_file(&s).0["current"].as_str().unwrap().to_owned())
    });
    assert!(third != first && third != second);
}
