//! Walkthrough steps 4 and 5 happen: three leader processes elected through a Lease that our
//! own server serves, one serving and two standing by; crash failovers under an engine's load
//! that never serve a wrong byte and keep the cache (the members hand what they hold to the new
//! term); and a paused leader that lost its
//! Lease and can place no byte when it resumes (the fence is the Lease's term, carried by every
//! range the leader hands out).
//!
//! Capacities are scaled down as in `walkthrough_live.rs` (1Gi members, a 1Gi ceiling).

mod support;

use std::collections::BTreeSet;
use std::process::{Child, Command, Stdio};

use bytes::Bytes;
use kvcache_store::client::Client;
use kvcache_store::proto::{
    HealthRequest, PutCommitRequest, PutStartRequest, Scope, segment_data_client::SegmentDataClient,
    store_client::StoreClient,
};
use support::walkthrough::*;
use support::{Kubectl, Server, eventually};

const KUBECTL: &str = "1.33";
const LEASE: &[&str] = &["-n", "kvcache-system", "lease", "mooncake-dram-leader"];

fn server() -> Server {
    Server::start_with(&["--requeue-interval", "2s"])
}

/// The Binding's tenant credential, as the runtime keeps it for `s`'s replicas.
fn credential(s: &Server) -> String {
    let path = s.dir.path().join("tenant-credentials/team-a/team-a.json");
    let kept: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).expect("the Binding's credential file")).expect("JSON");
    kept["current"].as_str().expect("a current credential").to_owned()
}

/// The walkthrough's tenant, as injection describes it to an engine (with its credential).
fn scope(s: &Server) -> Scope {
    Scope {
        tenant: "default".into(),
        block_size: 64,
        dtype: "bfloat16".into(),
        credential: credential(s),
        ..Default::default()
    }
}

/// What dials the backend's store: the local runtime serves it with TLS, under the store CA it
/// keeps in the data directory, for the backend's store name.
fn tls(s: &Server) -> kvcache_store::tls::ClientTls {
    let ca = s.dir.path().join("store-tls/ca.crt");
    kvcache_store::tls::ClientTls::load(&ca, Some("mooncake-dram.kvstore.internal".into())).expect("the store's CA")
}

/// A gRPC channel to a leader or member process of the backend.
async fn channel(s: &Server, addr: &str) -> Option<tonic::transport::Channel> {
    kvcache_store::tls::grpc_endpoint(addr, Some(&tls(s)))
        .ok()?
        .connect()
        .await
        .ok()
}

/// A client of the walkthrough's tenant (or `scope`) through `front`.
async fn client(s: &Server, front: &str, scope: Scope) -> Option<Client> {
    Client::connect_tls(front, scope, Some(tls(s))).await.ok()
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// Waits until every member of the backend heartbeated twice since `since` (Unix ms): the answer
/// to the first carried the seals of every value committed before `since` (a member hands a next
/// leader only what a leader sealed), and the second shows that answer arrived.
fn wait_sealed_since(s: &Server, front: &str, since: u64) {
    use kvcache_store::proto::GetMembersRequest;
    use kvcache_store::proto::control_client::ControlClient;
    let token = std::fs::read_to_string(s.dir.path().join("store-tokens/control-mooncake-dram.token"))
        .expect("the backend's Control token")
        .trim()
        .to_owned();
    let mut first: std::collections::HashMap<String, u64> = Default::default();
    let mut twice: BTreeSet<String> = BTreeSet::new();
    eventually(
        30,
        "every member heartbeated twice since the value was committed",
        || {
            rt().block_on(async {
                let req = kvcache_store::auth::request(GetMembersRequest {}, Some(&token)).ok()?;
                let members = ControlClient::new(channel(s, front).await?)
                    .get_members(req)
                    .await
                    .ok()?
                    .into_inner()
                    .members;
                let now = kvcache_store::time::now_unix_ms();
                for m in &members {
                    let at = now.saturating_sub(m.last_heartbeat_ms_ago);
                    // (clock readings of two processes: a margin either side)
                    if at > since + 20 {
                        match first.get(&m.name) {
                            None => {
                                first.insert(m.name.clone(), at);
                            }
                            Some(f) if at > f + 50 => {
                                twice.insert(m.name.clone());
                            }
                            Some(_) => {}
                        }
                    }
                }
                (!members.is_empty() && members.iter().all(|m| twice.contains(&m.name))).then_some(())
            })
        },
    );
}

/// The Lease's holder and term.
fn holder(k: &Kubectl) -> Option<(String, u64)> {
    let out = jp(k, LEASE, "{.spec.holderIdentity} {.spec.leaseTransitions}");
    let (h, t) = out.split_once(' ')?;
    Some((h.to_owned(), t.parse().unwrap_or(0))).filter(|(h, _)| !h.is_empty())
}

/// The leader process listening on `addr`.
fn leader_pid(s: &Server, port: &str, addr: &str) -> u32 {
    store_processes(s, port)
        .into_iter()
        .find(|(_, c)| c.contains(" leader ") && c.contains(&format!("--listen {addr} ")))
        .unwrap_or_else(|| panic!("no leader process listens on {addr}"))
        .0
}

fn leaders(s: &Server, port: &str) -> BTreeSet<u32> {
    store_processes(s, port)
        .into_iter()
        .filter(|(_, c)| c.contains(" leader "))
        .map(|(p, _)| p)
        .collect()
}

fn signal(sig: &str, pid: u32) {
    assert!(
        Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .expect("kill runs")
            .success()
    );
}

/// All three leader replicas run: one serves, two stand by (after a kill, the runtime restarts a
/// replica with back-off; each failover starts with its standbys up).
fn wait_standbys(s: &Server, port: &str) {
    eventually(90, "one leader and two standbys", || {
        let addrs: Vec<String> = store_processes(s, port)
            .into_iter()
            .filter(|(_, c)| c.contains(" leader "))
            .filter_map(|(_, c)| Some(c.split("--listen ").nth(1)?.split(' ').next()?.to_owned()))
            .collect();
        let mut roles = rt().block_on(async {
            let mut roles = Vec::new();
            for a in &addrs {
                let mut c = kvcache_store::proto::control_client::ControlClient::new(channel(s, a).await?);
                roles.push(c.health(HealthRequest {}).await.ok()?.into_inner().role);
            }
            Some(roles)
        })?;
        roles.sort();
        (roles == ["leader", "standby", "standby"]).then_some(())
    });
}

/// The store is whole again: a leader serves through the front with both members mounted.
fn wait_whole(s: &Server, front: &str, capacity: u64) {
    eventually(30, "the new leader serves with both members mounted", || {
        rt().block_on(async {
            let c = client(s, front, Scope::default()).await?;
            let h = c.control().health(HealthRequest {}).await.ok()?.into_inner();
            (h.serving && h.members == 2 && h.capacity == capacity).then_some(())
        })
    });
}

fn apply_with_standbys(k: &Kubectl) {
    k.must_apply(&manifest("01-backend.yaml"));
    k.must_apply(&manifest("02-pool-binding.yaml"));
    k.must_apply(&manifest("04-high-availability.yaml"));
    wait_ready_backend(k, "2Gi");
    wait_jp(
        k,
        KVCB,
        "{.status.leader.replicas}/{.status.leader.readyReplicas}",
        "3/1",
    );
    wait_granted(k, "1Gi");
}

/// Step 4: `leader.replicas: 3` adds two standbys and touches nothing else: the first leader
/// process and both members keep running (same pids), the status reads 3 desired / 1 ready, and
/// the Lease names a holder.
#[test]
fn step_four_adds_two_standbys_and_keeps_every_process() {
    let s = server();
    let k = s.kubectl(KUBECTL);
    k.must_apply(&manifest("01-backend.yaml"));
    k.must_apply(&manifest("02-pool-binding.yaml"));
    k.must_apply(&manifest("03-model-deployment.yaml"));
    wait_ready_backend(&k, "2Gi");
    wait_granted(&k, "1Gi");
    wait_attached(&k);
    let port = leader_port(&k);
    assert!(
        condition(&k, KVCB, "ElectionObserved").starts_with("True|Electing|"),
        "the election runs at one replica too"
    );
    let before = store_processes(&s, &port);
    let first = leaders(&s, &port);
    assert_eq!(first.len(), 1, "{before:?}");
    let members: BTreeSet<u32> = before
        .iter()
        .filter(|(_, c)| c.contains(" member "))
        .map(|(p, _)| *p)
        .collect();
    assert_eq!(members.len(), 2, "{before:?}");

    k.must_apply(&manifest("04-high-availability.yaml"));
    wait_jp(
        &k,
        KVCB,
        "{.status.leader.replicas}/{.status.leader.readyReplicas}",
        "3/1",
    );
    eventually(30, "three leader processes", || {
        (leaders(&s, &port).len() == 3).then_some(())
    });
    eventually(30, "ElectionObserved and RolloutComplete", || {
        (condition(&k, KVCB, "ElectionObserved").starts_with("True|Electing|")
            && condition(&k, KVCB, "RolloutComplete").starts_with("True|Complete|"))
        .then_some(())
    });
    let after = store_processes(&s, &port);
    for (pid, cmd) in &before {
        assert!(
            after.iter().any(|(p, _)| p == pid),
            "{cmd} (pid {pid}) was restarted by the scale-up"
        );
    }
    assert!(first.is_subset(&leaders(&s, &port)), "the first leader keeps running");
    let (h, _) = holder(&k).expect("the Lease names a holder");
    assert_eq!(
        leader_pid(&s, &port, &h),
        *first.iter().next().unwrap(),
        "the first leader still serves"
    );
    let wide = k.ok(&["get", "kvcb", "-o", "wide"]);
    assert!(wide.contains("LEADERS") && wide.contains("1/3"), "{wide}");
    let described = k.ok(&["describe", "kvcb", "mooncake-dram"]);
    assert!(
        described.contains("Ready Replicas:") && described.contains("ElectionObserved"),
        "{described}"
    );
    let leases = k.ok(&["get", "leases", "-n", "kvcache-system"]);
    assert!(
        leases.contains("mooncake-dram-leader") && leases.contains(&h),
        "{leases}"
    );
    // the workload stays attached, the Binding granted
    wait_attached(&k);
    wait_granted(&k, "1Gi");
}

/// A child process stopped when dropped, so a failing test leaves no engine running.
struct Stopped(Child);

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// An engine simulator against the Client endpoint, forever, printing a report per round.
fn engine(front: &str, s: &Server) -> Stopped {
    let dir = s.dir.path();
    let credential = credential(s);
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_kv-apiserver")).with_file_name("kv-store");
    Command::new(bin)
        .arg("engine-sim")
        .env_clear()
        .envs([
            ("KVSTORE_LEADER", front),
            ("KVSTORE_TENANT", "default"),
            ("KVSTORE_BLOCK_SIZE", "64"),
            ("KVSTORE_DTYPE", "bfloat16"),
            ("KVSTORE_BLOCK_BYTES", "16Ki"),
            ("KVSTORE_SESSIONS", "4"),
            ("KVSTORE_REQUESTS", "8"),
            ("KVSTORE_ROUNDS", "0"),
            ("KVSTORE_ROUND_PAUSE", "50ms"),
            ("KVSTORE_CREDENTIAL", credential.as_str()),
            ("KVSTORE_TLS_SERVER_NAME", "mooncake-dram.kvstore.internal"),
        ])
        .env("KVSTORE_TLS_CA", s.dir.path().join("store-tls/ca.crt"))
        .stdout(std::fs::File::create(dir.join("engine.out")).expect("the engine's output file"))
        .stderr(std::fs::File::create(dir.join("engine.err")).expect("the engine's log file"))
        .stdin(Stdio::null())
        .spawn()
        .map(Stopped)
        .expect("kv-store engine-sim starts")
}

/// Step 5, twenty times: SIGKILL the serving leader while an engine reads and writes. Each time
/// another leader serves in a new term, members remount and the capacity returns in full, the key
/// written before the kill hits with its bytes in the new term (and every earlier one still does
/// at the end), and a handover event says what was adopted; the engine checks every block it
/// reads against what its key holds and never sees other bytes.
#[test]
fn twenty_crash_failovers_under_load_never_serve_a_wrong_byte() {
    let s = server();
    let k = s.kubectl(KUBECTL);
    apply_with_standbys(&k);
    let port = leader_port(&k);
    let front = format!("127.0.0.1:{port}");
    let capacity = 2u64 << 30;
    wait_whole(&s, &front, capacity);
    let mut sim = engine(&front, &s);
    let rounds = || std::fs::read_to_string(s.dir.path().join("engine.out")).unwrap_or_default();
    eventually(30, "the engine runs rounds", || {
        (rounds().lines().count() >= 2).then_some(())
    });
    let value = |i: usize| Bytes::from(vec![i as u8; 4096 + i]);
    for i in 0..20 {
        wait_standbys(&s, &port);
        let (h, term) = holder(&k).expect("a holder");
        let marker = format!("marker/{i}");
        eventually(30, "a marker is written before the kill", || {
            rt().block_on(async {
                let c = client(&s, &front, scope(&s)).await?;
                c.put(&marker, value(i)).await.ok()
            })
        });
        // its seal reaches its member with the next heartbeat answer; a value committed within
        // that (at most 500 ms) of a kill misses afterwards, never serving other bytes
        wait_sealed_since(&s, &front, kvcache_store::time::now_unix_ms());
        signal("-KILL", leader_pid(&s, &port, &h));
        let (h2, term2) = eventually(30, "another term serves", || holder(&k).filter(|(_, t)| *t > term));
        assert_ne!(h2, h, "failover {i}: a standby serves, not the killed leader restarted");
        wait_whole(&s, &front, capacity);
        // the cache survives: the marker hits with its bytes once its member has handed it over
        // (a miss until then is allowed; other bytes never are)
        eventually(30, "the marker written before the kill hits in the new term", || {
            rt().block_on(async {
                let c = client(&s, &front, scope(&s)).await?;
                let got = c.get(&marker).await.ok()??;
                assert_eq!(got, value(i), "failover {i}: the marker holds other bytes");
                Some(())
            })
        });
        assert!(
            sim.0.try_wait().unwrap().is_none(),
            "failover {i} ({h} → {h2}, term {term2}): the engine stopped: {}",
            std::fs::read_to_string(s.dir.path().join("engine.err")).unwrap_or_default()
        );
    }
    // the engine still runs, never saw other bytes, and hits again after the last failover
    let before = rounds().lines().count();
    eventually(30, "the engine runs rounds after the failovers", || {
        (rounds().lines().count() >= before + 2).then_some(())
    });
    assert!(sim.0.try_wait().unwrap().is_none());
    drop(sim);
    let err = std::fs::read_to_string(s.dir.path().join("engine.err")).unwrap_or_default();
    assert!(!err.contains("other bytes"), "{err}");
    let reports: Vec<serde_json::Value> = rounds().lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    assert!(reports.len() >= 4, "{reports:?}");
    assert!(reports.last().unwrap()["hits"].as_u64().unwrap() > 0, "{reports:?}");
    // every marker, handed over once per failover since it was written, still hits
    rt().block_on(async {
        let c = client(&s, &front, scope(&s)).await.expect("a client");
        for i in 0..20 {
            let got = c.get(&format!("marker/{i}")).await.expect("a read");
            assert_eq!(got, Some(value(i)), "marker/{i} after {} failovers", 20 - i);
        }
    });
    eventually(30, "a handover event per failover", || {
        let events = k.ok(&[
            "get",
            "events",
            "--field-selector",
            "reason=KVCacheLeaderHandover",
            "-o",
            "name",
        ]);
        (events.lines().count() >= 20).then_some(())
    });
    let said = k.ok(&[
        "get",
        "events",
        "--field-selector",
        "reason=KVCacheLeaderHandover",
        "-o",
        "jsonpath={.items[*].message}",
    ]);
    assert!(
        said.contains("its members handed over what they held: it adopted "),
        "{said}"
    );
    wait_granted(&k, "1Gi");
    wait_jp(
        &k,
        KVCB,
        "{.status.leader.replicas}/{.status.leader.readyReplicas}",
        "3/1",
    );
}

/// The fence: a leader paused (SIGSTOP) past its lease loses it to a standby; when it resumes
/// (SIGCONT), the range it handed out before the pause is refused by the member (an older
/// epoch), it refuses calls itself, and nothing it placed reaches a reader.
#[test]
fn a_paused_leader_that_lost_its_lease_places_no_byte() {
    let s = server();
    let k = s.kubectl(KUBECTL);
    apply_with_standbys(&k);
    let port = leader_port(&k);
    let front = format!("127.0.0.1:{port}");
    wait_whole(&s, &front, 2 << 30);
    let (old, term) = holder(&k).expect("a holder");
    let pid = leader_pid(&s, &port, &old);
    let rt = rt();
    // a writer that talks to the old leader directly reserves a range before the pause
    let to_old = rt
        .block_on(
            kvcache_store::tls::grpc_endpoint(&old, Some(&tls(&s)))
                .unwrap()
                .connect(),
        )
        .unwrap();
    let ours = kvcache_store::protocol::SendCaller::new(
        kvcache_store::protocol::ClientVersion::ours("ha-test"),
        &credential(&s),
    );
    let mut direct = StoreClient::with_interceptor(to_old, ours);
    let reserved = rt
        .block_on(direct.put_start(PutStartRequest {
            scope: Some(scope(&s)),
            key: "fence/k".into(),
            size: 4096,
        }))
        .unwrap()
        .into_inner();
    let loc = reserved.location.clone().unwrap();
    assert_eq!(loc.epoch, term, "ranges carry the leader's term");
    signal("-STOP", pid);
    let resumed = std::panic::catch_unwind(|| {
        let (new, term2) = eventually(30, "a standby takes over", || holder(&k).filter(|(_, t)| *t > term));
        assert_ne!(new, old);
        wait_whole(&s, &front, 2 << 30);
        term2
    });
    signal("-CONT", pid);
    let term2 = resumed.unwrap_or_else(|e| std::panic::resume_unwind(e));
    // the member refuses the old leader's range: an older epoch than it mounted under
    let mut member = rt
        .block_on(channel(&s, &loc.grpc_addr))
        .map(SegmentDataClient::new)
        .unwrap();
    let write = rt.block_on(member.write(kvcache_store::member::grpc::write_request(
        &loc,
        reserved.write_deadline_unix_ms,
        vec![7u8; 4096].into(),
    )));
    let refusal = write
        .expect_err("a deposed leader's range was written")
        .message()
        .to_owned();
    assert!(refusal.starts_with("STALE_EPOCH:"), "{refusal}");
    assert!(
        refusal.contains(&format!("epoch {term}")) && refusal.contains(&format!("epoch {term2}")),
        "{refusal}"
    );
    // the old leader itself refuses: its serving deadline passed while it was paused
    let commit = rt.block_on(direct.put_commit(PutCommitRequest {
        scope: Some(scope(&s)),
        key: "fence/k".into(),
        put_id: reserved.put_id,
    }));
    assert!(commit.unwrap_err().message().starts_with("NOT_SERVING:"));
    let again = rt.block_on(direct.put_start(PutStartRequest {
        scope: Some(scope(&s)),
        key: "fence/other".into(),
        size: 4096,
    }));
    assert!(again.unwrap_err().message().starts_with("NOT_SERVING:"));
    // nothing of it reaches a reader, and the old leader stands by under the new holder
    rt.block_on(async {
        let c = client(&s, &front, scope(&s)).await.unwrap();
        assert_eq!(c.get("fence/k").await.unwrap(), None);
        assert_eq!(c.get("fence/other").await.unwrap(), None);
    });
    eventually(30, "the resumed leader stands by", || {
        rt.block_on(async {
            let mut c = kvcache_store::proto::control_client::ControlClient::new(channel(&s, &old).await?);
            let h = c.health(HealthRequest {}).await.ok()?.into_inner();
            (!h.serving && h.role == "standby").then_some(())
        })
    });
    assert_eq!(holder(&k).map(|(_, t)| t), Some(term2));
}

/// `memberAddressing: Lease`: members are given the Lease (`k8s://kvcache-system/...`), not the
/// front, connect to its holder, and remount at the new holder after a failover.
#[test]
fn lease_addressed_members_follow_the_holder() {
    let s = server();
    let k = s.kubectl(KUBECTL);
    k.must_apply(&manifest("01-backend.yaml"));
    k.must_apply(&manifest("02-pool-binding.yaml"));
    k.must_apply(
        &manifest("04-high-availability.yaml").replace("replicas: 3", "replicas: 3\n        memberAddressing: Lease"),
    );
    wait_ready_backend(&k, "2Gi");
    wait_jp(
        &k,
        KVCB,
        "{.status.leader.replicas}/{.status.leader.readyReplicas}",
        "3/1",
    );
    let port = leader_port(&k);
    let front = format!("127.0.0.1:{port}");
    let members: Vec<String> = store_processes(&s, &port)
        .into_iter()
        .filter(|(_, c)| c.contains(" member "))
        .map(|(_, c)| c)
        .collect();
    assert_eq!(members.len(), 2, "{members:?}");
    for m in &members {
        assert!(
            m.contains("--leader k8s://kvcache-system/mooncake-dram-leader") && !m.contains(&front),
            "{m}"
        );
    }
    wait_whole(&s, &front, 2 << 30);
    let (h, term) = holder(&k).expect("a holder");
    signal("-KILL", leader_pid(&s, &port, &h));
    eventually(30, "another term serves", || holder(&k).filter(|(_, t)| *t > term));
    wait_whole(&s, &front, 2 << 30);
    wait_granted(&k, "1Gi");
}
