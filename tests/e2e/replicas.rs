//! Two `kv-apiserver serve` replicas on one etcd (Debian's, started here and stopped at the end):
//! the invariants that live in storage transactions hold across replicas exactly as in one
//! process, and a write on one is seen by watches on the other; the controllers run on the one
//! replica that holds their Lease, and move when it dies.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::{Etcd, Kubectl, Server, binding, eventually, eventually_within, pool};

const KUBECTL: &str = "1.33";

const BACKEND: &str = "apiVersion: worker.gpustack.ai/v1\nkind: KVCacheBackend\nmetadata:\n  name: mooncake-dram\nspec:\n  type: Mooncake\n  connection:\n    managed:\n      leader: {}\n      members:\n      - nodeSelector: {}\n        medium: DRAM\n        capacityPerMember: 1Gi\n";
/// The Lease timings of the failover tests.
const LEASE: Duration = Duration::from_secs(3);
const RETRY: Duration = Duration::from_millis(500);

/// Flags of a replica with controllers on `etcd`, sharing `pki`, with short Lease timings.
fn electing(etcd: &Etcd, pki: &tempfile::TempDir) -> Vec<String> {
    [
        "--storage",
        &etcd.storage_flag(),
        "--pki-dir",
        &pki.path().display().to_string(),
        "--requeue-interval",
        "2s",
        "--leader-elect-lease-duration",
        "3s",
        "--leader-elect-renew-deadline",
        "2s",
        "--leader-elect-retry-period",
        "500ms",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn start(flags: &[String]) -> Server {
    Server::start_with(&flags.iter().map(String::as_str).collect::<Vec<_>>())
}

/// `phase capacity endpoint` of the backend.
fn backend_state(k: &Kubectl) -> String {
    let out = k.run(&[
        "get",
        "kvcb",
        "mooncake-dram",
        "-o",
        "jsonpath={.status.phase} {.status.capacity.total} {.status.endpoints[0].address}",
    ]);
    if out.ok { out.stdout } else { String::new() }
}

fn replica(etcd: &Etcd) -> Server {
    let storage = etcd.storage_flag();
    Server::start_with(&["--controllers=false", "--storage", &storage])
}

#[test]
fn a_domain_is_claimed_once_across_replicas() {
    let etcd = Etcd::start();
    let (a, b) = (replica(&etcd), replica(&etcd));
    let (ka, kb) = (a.kubectl(KUBECTL), b.kubectl(KUBECTL));
    ka.must_apply(BACKEND);
    kb.must_apply(&pool("shared-dram", ""));
    // 16 Bindings in 16 namespaces, all claiming domain "shared", half through each replica, at once.
    let results: Vec<bool> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..16)
            .map(|i| {
                let k = if i % 2 == 0 { &ka } else { &kb };
                scope.spawn(move || {
                    let manifest = binding(&format!("ns{i}"), "b", "shared-dram", "1Gi")
                        .replace("name: b\n    blockSize", "name: shared\n    blockSize");
                    k.apply(&[], &manifest).ok
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(
        results.iter().filter(|ok| **ok).count(),
        1,
        "exactly one claim wins: {results:?}"
    );
    let listed = ka.ok(&["get", "kvcpb", "-A", "-o", "name"]);
    assert_eq!(listed.lines().count(), 1, "exactly one is stored: {listed}");
    assert_eq!(
        kb.ok(&["get", "kvcpb", "-A", "-o", "name"]),
        listed,
        "both replicas read the same"
    );
}

#[test]
fn a_watch_on_one_replica_sees_every_write_of_the_other_in_order() {
    let etcd = Etcd::start();
    let (a, b) = (replica(&etcd), replica(&etcd));
    let rv = b.get_body("/apis/worker.gpustack.ai/v1/kvcachepools", &[]);
    let rv: serde_json::Value = serde_json::from_str(&rv).unwrap();
    let rv = rv["metadata"]["resourceVersion"].as_str().unwrap().to_owned();
    // A raw watch on B from that revision.
    let mut watch = Command::new("curl")
        .arg("--cacert")
        .arg(b.pki_file("ca.crt"))
        .arg("--cert")
        .arg(b.pki_file("admin.crt"))
        .arg("--key")
        .arg(b.pki_file("admin.key"))
        .args(["-sN", "--max-time", "60"])
        .arg(b.url(&format!(
            "/apis/worker.gpustack.ai/v1/kvcachepools?watch=true&resourceVersion={rv}"
        )))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = watch.stdout.take().unwrap();
    let ka = a.kubectl(KUBECTL);
    const N: usize = 30;
    for i in 0..N {
        ka.must_apply(&pool(&format!("p{i:02}"), ""));
    }
    ka.ok(&["delete", "kvcp", "p00"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut seen = Vec::new();
    for line in BufReader::new(out).lines().map_while(Result::ok) {
        let ev: serde_json::Value = serde_json::from_str(&line).unwrap();
        let name = ev["object"]["metadata"]["name"].as_str().unwrap_or_default().to_owned();
        let rv: u64 = ev["object"]["metadata"]["resourceVersion"]
            .as_str()
            .and_then(|r| r.parse().ok())
            .unwrap_or(0);
        seen.push((ev["type"].as_str().unwrap_or_default().to_owned(), name, rv));
        if seen.len() == N + 1 || Instant::now() > deadline {
            break;
        }
    }
    let _ = watch.kill();
    let _ = watch.wait();
    assert_eq!(seen.len(), N + 1, "every write, no gaps: {seen:?}");
    for (i, (kind, name, _)) in seen.iter().take(N).enumerate() {
        assert_eq!((kind.as_str(), name.as_str()), ("ADDED", format!("p{i:02}").as_str()));
    }
    assert_eq!((seen[N].0.as_str(), seen[N].1.as_str()), ("DELETED", "p00"));
    assert!(seen.windows(2).all(|w| w[0].2 < w[1].2), "in revision order: {seen:?}");
}

fn leads(s: &Server) -> bool {
    s.get_body("/metrics", &[])
        .lines()
        .any(|l| l.starts_with("kvcache_controller_leader ") && l.ends_with(" 1"))
}

/// The controllers run on exactly one replica (the holder of their Lease, kept in etcd); when
/// that replica is killed the other takes over within the lease and the store runs again.
#[test]
fn the_controllers_fail_over_to_the_other_replica() {
    let etcd = Etcd::start();
    let pki = tempfile::tempdir().unwrap();
    let flags = electing(&etcd, &pki);
    let (a, b) = (start(&flags), start(&flags));
    eventually(30, "a replica takes the controllers' Lease", || {
        (leads(&a) || leads(&b)).then_some(())
    });
    assert!(leads(&a) != leads(&b), "exactly one replica runs the controllers");
    let (leader, other) = if leads(&a) { (a, b) } else { (b, a) };
    let k = other.kubectl(KUBECTL);
    k.must_apply(BACKEND);
    let ready = || {
        let s = backend_state(&k);
        s.starts_with("Ready 2Gi ").then_some(s)
    };
    let before = eventually(60, "the backend is Ready", ready);
    drop(leader); // SIGKILL: its store processes follow it
    eventually(30, "the other replica takes the controllers over", || {
        leads(&other).then_some(())
    });
    // The new leader runs the store itself: Ready again, at its own endpoint.
    eventually(60, "the store moves to the new leader", || {
        ready().filter(|now| *now != before)
    });
}

#[test]
fn replicas_sharing_a_pki_dir_are_reached_with_one_kubeconfig() {
    let etcd = Etcd::start();
    let pki = tempfile::tempdir().unwrap();
    let storage = etcd.storage_flag();
    let pki_dir = pki.path().display().to_string();
    let flags = ["--controllers=false", "--storage", &storage, "--pki-dir", &pki_dir];
    let a = Server::start_with(&flags);
    let b = Server::start_with(&flags);
    let ka = a.kubectl(KUBECTL);
    ka.must_apply(&pool("shared", ""));
    // A's kubeconfig, pointed at B: B presents the same serving certificate and trusts the same
    // client CA.
    let through_b = ka.ok(&["--server", &b.url(""), "get", "kvcp", "shared", "-o", "name"]);
    assert_eq!(through_b.trim(), "kvcachepool.worker.gpustack.ai/shared");
}

#[test]
fn readyz_follows_the_replicas_own_connection_to_etcd() {
    let etcd = Etcd::start();
    let s = replica(&etcd);
    assert_eq!(s.get_body("/readyz", &[]), "ok");
    drop(etcd);
    eventually(30, "/readyz fails with etcd gone", || {
        let out = s.curl_anon(&["-s", "-o", "/dev/null", "-w", "%{http_code}", &s.url("/readyz")]);
        (String::from_utf8_lossy(&out.stdout) == "503").then_some(())
    });
    let verbose = s.get_body("/readyz?verbose", &[]);
    assert!(verbose.contains("[-]storage"), "{verbose}");
}

/// Ten times: SIGKILL the replica that runs the controllers while writes go on; the other takes
/// over within the lease, no acknowledged write is lost, and the backend's status comes back.
#[test]
fn ten_failovers_under_write_load_lose_no_acknowledged_write() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    let etcd = Etcd::start();
    let pki = tempfile::tempdir().unwrap();
    let flags = electing(&etcd, &pki);
    let mut servers = vec![start(&flags), start(&flags)];
    servers[0].kubectl(KUBECTL).must_apply(BACKEND);
    servers[0].kubectl(KUBECTL).must_apply(&pool("shared-dram", ""));
    servers[0]
        .kubectl(KUBECTL)
        .must_apply(&binding("team-a", "team-a", "shared-dram", "1Gi"));
    // Writers: create pools through whichever replica answers; remember every acknowledged one.
    let urls = Arc::new(Mutex::new(servers.iter().map(|s| s.url("")).collect::<Vec<_>>()));
    let acked = Arc::new(Mutex::new(Vec::<String>::new()));
    let done = Arc::new(AtomicBool::new(false));
    let (ca, cert, key) = (
        servers[0].pki_file("ca.crt"),
        servers[0].pki_file("admin.crt"),
        servers[0].pki_file("admin.key"),
    );
    let writer = {
        let (urls, acked, done) = (urls.clone(), acked.clone(), done.clone());
        std::thread::spawn(move || {
            let mut i = 0;
            while !done.load(Ordering::Relaxed) {
                i += 1;
                let name = format!("w-{i:05}");
                let body = format!(
                    r#"{{"apiVersion":"worker.gpustack.ai/v1","kind":"KVCachePool","metadata":{{"name":"{name}"}},"spec":{{"backends":["mooncake-dram"],"quota":{{"total":"1Gi"}}}}}}"#
                );
                let targets = urls.lock().unwrap().clone();
                for url in targets {
                    let out = Command::new("curl")
                        .arg("--cacert")
                        .arg(&ca)
                        .arg("--cert")
                        .arg(&cert)
                        .arg("--key")
                        .arg(&key)
                        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "5"])
                        .args(["-H", "content-type: application/json", "-d", &body])
                        .arg(format!("{url}/apis/worker.gpustack.ai/v1/kvcachepools"))
                        .output()
                        .unwrap();
                    let code = String::from_utf8_lossy(&out.stdout).into_owned();
                    if code == "201" {
                        acked.lock().unwrap().push(name.clone());
                        break;
                    }
                    if code == "409" {
                        // an earlier attempt landed, though its answer was lost
                        break;
                    }
                }
            }
        })
    };
    let ready = |s: &Server| {
        backend_state(&s.kubectl(KUBECTL))
            .starts_with("Ready 2Gi ")
            .then_some(())
    };
    for round in 0..10 {
        let leader = eventually(30, &format!("round {round}: a replica leads"), || {
            servers.iter().position(leads)
        });
        eventually(
            60,
            &format!("round {round}: the backend is Ready before the kill"),
            || ready(&servers[1 - leader]),
        );
        let killed_at = Instant::now();
        drop(servers.remove(leader)); // SIGKILL
        // The lease runs from the holder's last renewal (at most one retry period before the
        // kill), judged on the survivor's clock from when it saw that renewal.
        let bound = LEASE + RETRY * 2 + Duration::from_secs(1);
        eventually_within(bound, &format!("round {round}: takeover within the lease"), || {
            leads(&servers[0]).then_some(())
        });
        eprintln!("round {round}: takeover after {:?}", killed_at.elapsed());
        // a fresh replica in place of the killed one
        servers.push(start(&flags));
        *urls.lock().unwrap() = servers.iter().map(|s| s.url("")).collect();
    }
    done.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    eventually(60, "the backend's status comes back after the last failover", || {
        ready(&servers[0])
    });
    // The Binding's grant is read back from the store the last leader runs.
    eventually(60, "the Binding is granted after the failovers", || {
        let out = servers[0].kubectl(KUBECTL).run(&[
            "-n",
            "team-a",
            "get",
            "kvcpb",
            "team-a",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"QuotaGranted\")].status} {.status.effectiveQuota}",
        ]);
        (out.ok && out.stdout == "True 1Gi").then_some(())
    });
    let listed = servers[0].kubectl(KUBECTL).ok(&["get", "kvcp", "-o", "name"]);
    let acked = acked.lock().unwrap().clone();
    assert!(acked.len() > 10, "the writers made progress: {}", acked.len());
    for name in &acked {
        assert!(
            listed.contains(&format!("kvcachepool.worker.gpustack.ai/{name}\n")),
            "acknowledged write {name} lost"
        );
    }
}
