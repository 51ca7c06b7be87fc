//! Who may call the store, with real `kv-store` processes: the Control API takes only the
//! controllers' token, a member without the backend's member token cannot mount, a call for a
//! tenant proves itself with that tenant's credential (on gRPC and on the fast port), a
//! member's data port serves only ranges the leader signed, and junk writes cost a member no
//! memory.

#![allow(clippy::unwrap_used)]

mod common;

use bytes::Bytes;
use common::{Proc, eventually, leader, member_with, scope};
use kvcache_store::client::Client;
use kvcache_store::error::{ErrorCode, StoreError};
use kvcache_store::member::grpc::write_request;
use kvcache_store::proto::control_client::ControlClient;
use kvcache_store::proto::segment_data_client::SegmentDataClient;
use kvcache_store::proto::store_client::StoreClient;
use kvcache_store::proto::{
    GetMembersRequest, PutRevokeRequest, PutStartRequest, Scope, SetTenantsRequest, TenantEntry,
};
use kvcache_store::wire;

const CONTROL_TOKEN: &str = "controllers-0123456789abcdef";
const MEMBER_TOKEN: &str = "members-fedcba9876543210";
const CREDENTIAL_A: &str = "credential-of-team-a";
const CREDENTIAL_B: &str = "credential-of-team-b";

struct Store {
    _dir: tempfile::TempDir,
    leader: Proc,
    member: Proc,
}

fn token_file(dir: &std::path::Path, name: &str, token: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, format!("{token}\n")).unwrap();
    p.display().to_string()
}

/// A leader that wants both tokens, and a member that shows its token.
fn start(fast: bool) -> Store {
    let dir = tempfile::tempdir().unwrap();
    let control = token_file(dir.path(), "control", CONTROL_TOKEN);
    let members = token_file(dir.path(), "member", MEMBER_TOKEN);
    let mut args = vec!["--control-token-file", &control, "--member-token-file", &members];
    if !fast {
        args.extend(["--fast-listen", "off"]);
    }
    let leader = leader(&args);
    let member = member_with(&leader.field("grpc"), "m1", "64Mi", &["--member-token-file", &members]);
    Store {
        _dir: dir,
        leader,
        member,
    }
}

fn authorized<T>(msg: T, token: &str) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    kvcache_store::auth::attach(&mut r, token).unwrap();
    r
}

async fn control(addr: &str) -> ControlClient<tonic::transport::Channel> {
    ControlClient::connect(format!("http://{addr}")).await.unwrap()
}

fn entry(name: &str, credential: &str) -> TenantEntry {
    TenantEntry {
        name: name.into(),
        ceiling: 16 << 20,
        block_size: 64,
        dtype: "bfloat16".into(),
        credential_sha256: vec![
            kvcache_store::leader::ledger::credential_hash(credential)
                .to_vec()
                .into(),
        ],
        ..Default::default()
    }
}

fn unauthenticated(e: &StoreError) -> bool {
    e.code == ErrorCode::Unauthenticated
}

fn as_tenant(tenant: &str, credential: &str) -> Scope {
    Scope {
        credential: credential.into(),
        ..scope(tenant)
    }
}

#[tokio::test]
async fn the_control_api_takes_only_the_controllers_token() {
    let s = start(true);
    let addr = s.leader.field("grpc");
    let mut c = control(&addr).await;
    let ledger = SetTenantsRequest {
        tenants: vec![entry("team-a", CREDENTIAL_A)],
        ..Default::default()
    };
    let refused = c.set_tenants(ledger.clone()).await.unwrap_err();
    let e = StoreError::from_status(&refused);
    assert!(unauthenticated(&e), "{e}");
    assert!(e.message.contains("carries none"), "{e}");
    let wrong = c.set_tenants(authorized(ledger.clone(), "guess")).await.unwrap_err();
    assert!(unauthenticated(&StoreError::from_status(&wrong)));
    assert!(
        c.get_members(GetMembersRequest {}).await.is_err(),
        "reading the members needs it too"
    );
    c.set_tenants(authorized(ledger, CONTROL_TOKEN)).await.unwrap();
}

#[tokio::test]
async fn a_member_without_the_member_token_cannot_mount() {
    let s = start(true);
    let addr = s.leader.field("grpc");
    let dir = tempfile::tempdir().unwrap();
    let wrong = token_file(dir.path(), "wrong", "not-the-token");
    // their warnings (stderr) say each refused mount
    let logs = [dir.path().join("stranger.log"), dir.path().join("impostor.log")];
    let _stranger = refused_member(&addr, "stranger", &logs[0], &[]);
    let _impostor = refused_member(&addr, "impostor", &logs[1], &["--member-token-file", &wrong]);
    let c = control(&addr).await;
    let names = || {
        let mut c = c.clone();
        async move {
            let r = c
                .get_members(authorized(GetMembersRequest {}, CONTROL_TOKEN))
                .await
                .unwrap();
            r.into_inner().members.into_iter().map(|m| m.name).collect::<Vec<_>>()
        }
    };
    eventually("the member with the token mounts", || async { names().await == ["m1"] }).await;
    // the two others keep asking; once each was refused twice, neither got in
    eventually("both were refused twice", || async {
        logs.iter().all(|l| {
            let text = std::fs::read_to_string(l).unwrap_or_default();
            text.matches("mount refused")
                .filter(|_| text.contains("UNAUTHENTICATED"))
                .count()
                >= 2
        })
    })
    .await;
    assert_eq!(names().await, ["m1"]);
}

/// A member whose stderr goes to `log`.
fn refused_member(leader: &str, name: &str, log: &std::path::Path, extra: &[&str]) -> Proc {
    let mut args = vec![
        "member",
        "--leader",
        leader,
        "--capacity",
        "64Mi",
        "--name",
        name,
        "--no-prefault",
    ];
    args.extend_from_slice(extra);
    Proc::start_with_stderr(&args, std::fs::File::create(log).unwrap())
}

#[tokio::test]
async fn a_credential_opens_its_own_tenant_only_on_grpc_and_on_the_fast_port() {
    for fast in [true, false] {
        let s = start(fast);
        let addr = s.leader.field("grpc");
        control(&addr)
            .await
            .set_tenants(authorized(
                SetTenantsRequest {
                    tenants: vec![entry("team-a", CREDENTIAL_A), entry("team-b", CREDENTIAL_B)],
                    ..Default::default()
                },
                CONTROL_TOKEN,
            ))
            .await
            .unwrap();
        let b = Client::connect(&addr, as_tenant("team-b", CREDENTIAL_B)).await.unwrap();
        eventually("team-b can write", || async {
            b.put("b/key", Bytes::from_static(b"b's bytes")).await.is_ok()
        })
        .await;
        // team-a's credential on team-b's domain
        let a_on_b = Client::connect(&addr, as_tenant("team-b", CREDENTIAL_A)).await.unwrap();
        let none_on_b = Client::connect(&addr, as_tenant("team-b", "")).await.unwrap();
        for (who, c) in [("team-a's credential", &a_on_b), ("no credential", &none_on_b)] {
            let what = format!("{who} on team-b, fast port {fast}");
            let put = c.put("b/other", Bytes::from_static(b"x")).await.unwrap_err();
            assert!(unauthenticated(&put), "{what}: put: {put}");
            let get = c.get("b/key").await.unwrap_err();
            assert!(unauthenticated(&get), "{what}: get: {get}");
            let exists = c.exists("b/key").await.unwrap_err();
            assert!(unauthenticated(&exists), "{what}: exists: {exists}");
            let batch = c.batch_exists(&["b/key".to_owned()]).await;
            assert!(batch.is_err_and(|e| unauthenticated(&e)), "{what}: batch exists");
            let remove = c.remove("b/key").await.unwrap_err();
            assert!(unauthenticated(&remove), "{what}: remove: {remove}");
        }
        // a domain the ledger does not have gets the very answer a wrong credential gets, so a
        // caller cannot tell which tenants exist; a caller that shows no credential of any tenant
        // is refused before its request is read, naming no tenant either
        let nobody = Client::connect(&addr, as_tenant("team-c", CREDENTIAL_A)).await.unwrap();
        let unknown = nobody.get("b/key").await.unwrap_err();
        let wrong = a_on_b.get("b/key").await.unwrap_err();
        let missing = none_on_b.get("b/key").await.unwrap_err();
        assert_eq!(
            (unknown.code, unknown.message.replace("team-c", "team-b")),
            (wrong.code, wrong.message.clone()),
            "fast port {fast}"
        );
        assert_eq!(missing.code, ErrorCode::Unauthenticated);
        assert!(
            missing.message.contains("x-kvstore-credential") && !missing.message.contains("team-b"),
            "{missing}"
        );
        // team-a's own domain takes it, and team-b's value is untouched
        let a = Client::connect(&addr, as_tenant("team-a", CREDENTIAL_A)).await.unwrap();
        a.put("a/key", Bytes::from_static(b"a's bytes")).await.unwrap();
        assert_eq!(a.get("a/key").await.unwrap().unwrap(), Bytes::from_static(b"a's bytes"));
        assert!(a.get("b/key").await.unwrap().is_none(), "tenants do not share keys");
        assert_eq!(b.get("b/key").await.unwrap().unwrap(), Bytes::from_static(b"b's bytes"));
    }
}

#[tokio::test]
async fn the_data_port_serves_only_ranges_the_leader_signed() {
    let s = start(true);
    let addr = s.leader.field("grpc");
    control(&addr)
        .await
        .set_tenants(authorized(
            SetTenantsRequest {
                tenants: vec![entry("team-a", CREDENTIAL_A)],
                ..Default::default()
            },
            CONTROL_TOKEN,
        ))
        .await
        .unwrap();
    let a = Client::connect(&addr, as_tenant("team-a", CREDENTIAL_A))
        .await
        .unwrap()
        .without_local();
    let secret = vec![42u8; 8192];
    eventually("team-a can write", || async {
        a.put("secret", Bytes::from(secret.clone())).await.is_ok()
    })
    .await;
    let (loc, r) = a.locate("secret").await.unwrap().unwrap();
    let deadline = r.lease_deadline_unix_ms;
    // the granted range reads
    assert_eq!(
        raw_read(&loc, loc.offset, loc.len, deadline, &loc.grant_mac).await,
        Ok(secret.clone())
    );
    // a forged MAC, the range stretched, moved, or kept past its lease: refused
    let forged = Bytes::from(vec![0u8; 32]);
    for (what, offset, len, until, mac) in [
        ("a forged MAC", loc.offset, loc.len, deadline, &forged),
        ("a longer range", loc.offset, loc.len + 4096, deadline, &loc.grant_mac),
        ("another offset", loc.offset + 4096, loc.len, deadline, &loc.grant_mac),
        (
            "a later deadline",
            loc.offset,
            loc.len,
            deadline + 60_000,
            &loc.grant_mac,
        ),
    ] {
        let got = raw_read(&loc, offset, len, until, mac).await;
        assert_eq!(
            got.as_ref().map(|_| ()).unwrap_err(),
            &ErrorCode::Unauthenticated,
            "{what}"
        );
    }
    // and a write into a range nobody was given
    let mut conn = tokio::net::TcpStream::connect(&loc.data_addr).await.unwrap();
    let head = wire::Request {
        op: wire::Op::Write,
        mount_id: loc.mount_id,
        offset: loc.offset,
        len: 4,
        deadline_unix_ms: 0,
        epoch: loc.epoch,
        allocation: loc.allocation,
        mac: [1; 32],
        tag_len: 0,
    };
    use tokio::io::AsyncWriteExt;
    conn.write_all(&head.encode()).await.unwrap();
    conn.write_all(b"evil").await.unwrap();
    assert_eq!(response(&mut conn).await.unwrap_err(), ErrorCode::Unauthenticated);
    assert_eq!(
        a.get("secret").await.unwrap().unwrap(),
        Bytes::from(secret),
        "the bytes are intact"
    );
}

#[tokio::test]
async fn a_write_grant_kept_past_its_release_cannot_overwrite_the_next_tenants_value() {
    let s = start(true);
    let addr = s.leader.field("grpc");
    control(&addr)
        .await
        .set_tenants(authorized(
            SetTenantsRequest {
                tenants: vec![entry("team-a", CREDENTIAL_A), entry("team-b", CREDENTIAL_B)],
                ..Default::default()
            },
            CONTROL_TOKEN,
        ))
        .await
        .unwrap();
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let ours = kvcache_store::protocol::SendCaller::new(
        kvcache_store::protocol::ClientVersion::ours("auth-test"),
        CREDENTIAL_A,
    );
    let mut store = StoreClient::with_interceptor(channel, ours);
    let attacker = as_tenant("team-a", CREDENTIAL_A);
    let b = Client::connect(&addr, as_tenant("team-b", CREDENTIAL_B))
        .await
        .unwrap()
        .without_local();
    let size = 64 << 10;
    // Tenant A reserves a range and revokes the reservation at once: the range is free again,
    // while A still holds a write grant for it (its deadline is 30 s away).
    let mut tries = 0;
    let reserved = loop {
        tries += 1;
        match store
            .put_start(PutStartRequest {
                scope: Some(attacker.clone()),
                key: "bait".into(),
                size,
            })
            .await
        {
            Ok(r) => break r.into_inner(),
            // until the member has mounted
            Err(e) if tries < 100 => {
                assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await
            }
            Err(e) => panic!("no reservation after 10 s: {e:?}"),
        }
    };
    let grant = reserved.location.clone().expect("a location");
    store
        .put_revoke(PutRevokeRequest {
            scope: Some(attacker.clone()),
            key: "bait".into(),
            put_id: reserved.put_id,
        })
        .await
        .unwrap();
    // Tenant B's value of the same size lands in that range.
    let victim = vec![0x5a_u8; size as usize];
    b.put("victim", Bytes::from(victim.clone())).await.unwrap();
    let (placed, _) = b.locate("victim").await.unwrap().unwrap();
    assert_eq!(
        (placed.member_id, placed.offset),
        (grant.member_id, grant.offset),
        "the freed range is placed again (the attack needs it)"
    );
    assert!(
        placed.allocation > grant.allocation,
        "a new placement, a newer allocation"
    );
    // A replays its write with the old grant: refused, and B reads its own bytes.
    let mut conn = tokio::net::TcpStream::connect(&grant.data_addr).await.unwrap();
    let head = wire::Request::granted(
        wire::Op::Write,
        &grant,
        size,
        reserved.write_deadline_unix_ms,
        grant.tag.len() as u16,
    );
    use tokio::io::AsyncWriteExt;
    conn.write_all(&head.encode()).await.unwrap();
    conn.write_all(&grant.tag).await.unwrap();
    conn.write_all(&vec![0xee_u8; size as usize]).await.unwrap();
    assert_eq!(response(&mut conn).await.unwrap_err(), ErrorCode::PutExpired);
    // and over gRPC
    let mut member = SegmentDataClient::connect(format!("http://{}", grant.grpc_addr))
        .await
        .unwrap();
    let refused = member
        .write(write_request(
            &grant,
            reserved.write_deadline_unix_ms,
            vec![0xee_u8; size as usize].into(),
        ))
        .await
        .unwrap_err();
    assert!(refused.message().starts_with("PUT_EXPIRED:"), "{refused:?}");
    assert_eq!(
        b.get("victim").await.unwrap().unwrap(),
        Bytes::from(victim),
        "B's own bytes"
    );
}

async fn raw_read(
    loc: &kvcache_store::proto::Location,
    offset: u64,
    len: u64,
    deadline: u64,
    mac: &[u8],
) -> Result<Vec<u8>, ErrorCode> {
    use tokio::io::AsyncWriteExt;
    let mut s = tokio::net::TcpStream::connect(&loc.data_addr).await.unwrap();
    let req = wire::Request {
        op: wire::Op::Read,
        mount_id: loc.mount_id,
        offset,
        len,
        deadline_unix_ms: deadline,
        epoch: loc.epoch,
        allocation: loc.allocation,
        mac: kvcache_store::grant::mac_from(mac),
        tag_len: 0,
    };
    s.write_all(&req.encode()).await.unwrap();
    response(&mut s).await
}

async fn response(s: &mut tokio::net::TcpStream) -> Result<Vec<u8>, ErrorCode> {
    use tokio::io::AsyncReadExt;
    let mut head = [0u8; wire::RESPONSE_LEN];
    s.read_exact(&mut head).await.unwrap();
    let resp = wire::Response::decode(&head).unwrap();
    let mut body = vec![0u8; resp.len as usize];
    s.read_exact(&mut body).await.unwrap();
    if resp.ok {
        Ok(body)
    } else {
        Err(wire::refusal(&body).code)
    }
}

#[tokio::test]
async fn per_tenant_metrics_only_to_the_control_token() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let token = token_file(dir.path(), "control", CONTROL_TOKEN);
    let l = leader(&["--control-token-file", &token, "--metrics-listen", "127.0.0.1:0"]);
    let addr = l.field("grpc");
    control(&addr)
        .await
        .set_tenants(authorized(
            SetTenantsRequest {
                tenants: vec![entry("team-a", CREDENTIAL_A)],
                ..Default::default()
            },
            CONTROL_TOKEN,
        ))
        .await
        .unwrap();
    let scrape = |authorization: Option<String>| {
        let metrics = l.field("metrics");
        async move {
            let mut s = tokio::net::TcpStream::connect(metrics).await.unwrap();
            let header = authorization.map_or(String::new(), |a| format!("Authorization: {a}\r\n"));
            let req = format!("GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{header}\r\n");
            s.write_all(req.as_bytes()).await.unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).await.unwrap();
            assert!(out.starts_with("HTTP/1.1 200"), "{out}");
            out
        }
    };
    for anyone in [scrape(None).await, scrape(Some("Bearer guess".into())).await] {
        assert!(anyone.contains("kvstore_capacity_bytes"), "{anyone}");
        assert!(
            !anyone.contains("team-a") && !anyone.contains("kvstore_tenant_"),
            "no tenant's name or series without the token:\n{anyone}"
        );
    }
    let controllers = scrape(Some(format!("Bearer {CONTROL_TOKEN}"))).await;
    assert!(
        controllers.contains("kvstore_tenant_ceiling_bytes{tenant=\"team-a\"} 16777216"),
        "{controllers}"
    );
}

/// Finding 5 of the second review: with a scrape token of its own, a leader shows the per-tenant
/// series to it alone, and that token opens nothing of the Control API (nor does the Control
/// token open the series any more).
#[tokio::test]
async fn a_scrape_token_shows_the_tenants_series_and_opens_nothing_else() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const SCRAPE_TOKEN: &str = "scrape-0123456789abcdef";
    let dir = tempfile::tempdir().unwrap();
    let control_file = token_file(dir.path(), "control", CONTROL_TOKEN);
    let scrape_file = token_file(dir.path(), "metrics", SCRAPE_TOKEN);
    let l = leader(&[
        "--control-token-file",
        &control_file,
        "--metrics-token-file",
        &scrape_file,
        "--metrics-listen",
        "127.0.0.1:0",
    ]);
    let addr = l.field("grpc");
    let ledger = SetTenantsRequest {
        tenants: vec![entry("team-a", CREDENTIAL_A)],
        ..Default::default()
    };
    let refused = control(&addr)
        .await
        .set_tenants(authorized(ledger.clone(), SCRAPE_TOKEN))
        .await
        .unwrap_err();
    assert!(unauthenticated(&StoreError::from_status(&refused)), "{refused:?}");
    control(&addr)
        .await
        .set_tenants(authorized(ledger, CONTROL_TOKEN))
        .await
        .unwrap();
    let scrape = |token: &str| {
        let metrics = l.field("metrics");
        let header = format!("Authorization: Bearer {token}\r\n");
        async move {
            let mut s = tokio::net::TcpStream::connect(metrics).await.unwrap();
            let req = format!("GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{header}\r\n");
            s.write_all(req.as_bytes()).await.unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).await.unwrap();
            out
        }
    };
    assert!(
        scrape(SCRAPE_TOKEN)
            .await
            .contains("kvstore_tenant_ceiling_bytes{tenant=\"team-a\"}")
    );
    let with_control = scrape(CONTROL_TOKEN).await;
    assert!(
        with_control.contains("kvstore_capacity_bytes") && !with_control.contains("team-a"),
        "{with_control}"
    );
}

/// The peak resident memory of a process (`VmHWM`), in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap();
    kib << 10
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_connections_of_junk_writes_cost_a_member_no_memory() {
    let s = start(true);
    let addr = s.leader.field("grpc");
    control(&addr)
        .await
        .set_tenants(authorized(
            SetTenantsRequest {
                tenants: vec![entry("team-a", CREDENTIAL_A)],
                ..Default::default()
            },
            CONTROL_TOKEN,
        ))
        .await
        .unwrap();
    let a = Client::connect(&addr, as_tenant("team-a", CREDENTIAL_A))
        .await
        .unwrap()
        .without_local();
    eventually("team-a can write", || async {
        a.put("warm", Bytes::from_static(b"x")).await.is_ok()
    })
    .await;
    let (loc, _) = a.locate("warm").await.unwrap().unwrap();
    let member_pid = s.member.child.id();
    let before = peak_rss(member_pid);

    // 50 connections, each sending 8 MiB writes: with no grant, with a forged one, and with a
    // real header whose MAC was tampered with
    let junk = Bytes::from(vec![0xab_u8; 8 << 20]);
    let mut forged = loc.clone();
    forged.grant_mac = vec![0; 32].into();
    let mut tasks = Vec::new();
    for i in 0..50 {
        let (grpc, junk, forged) = (loc.grpc_addr.clone(), junk.clone(), forged.clone());
        tasks.push(tokio::spawn(async move {
            let mut m = SegmentDataClient::connect(format!("http://{grpc}"))
                .await
                .unwrap()
                .max_encoding_message_size(usize::MAX);
            for round in 0..2 {
                let req = if (i + round) % 2 == 0 {
                    tonic::Request::new(kvcache_store::proto::WriteRequest { data: junk.clone() })
                } else {
                    write_request(&forged, u64::MAX, junk.clone())
                };
                let refused = m.write(req).await.unwrap_err();
                assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");
            }
        }));
    }
    // meanwhile the member keeps serving the tenant
    for i in 0..20 {
        let v = Bytes::from(vec![i as u8; 64 << 10]);
        a.put(&format!("during/{i}"), v.clone()).await.unwrap();
        assert_eq!(a.get(&format!("during/{i}")).await.unwrap().unwrap(), v);
    }
    for t in tasks {
        t.await.unwrap();
    }
    let rise = peak_rss(member_pid).saturating_sub(before);
    // 100 refused writes of 8 MiB: had any been read whole, the peak would have risen by 8 MiB
    // for each read at once
    assert!(rise < 48 << 20, "the member's peak memory rose by {} MiB", rise >> 20);
    eprintln!(
        "member peak RSS rise over 100 junk 8 MiB writes: {:.1} MiB",
        rise as f64 / (1 << 20) as f64
    );
}
