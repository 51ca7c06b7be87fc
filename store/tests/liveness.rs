//! Member and leader failures: a killed member's objects miss once its TTL passes; a restarted
//! leader adopts what its members hold as they remount (every value hits again, byte for byte),
//! and ranges handed out before are refused.

// Helpers outside #[test] fns state expectations with unwrap too (see clippy.toml).
#![allow(clippy::unwrap_used)]

mod common;

use bytes::Bytes;
use common::*;
use kvcache_store::error::ErrorCode;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_members_objects_miss_within_the_ttl() {
    let l = leader(&["--tenant", "t=64Mi:64:bfloat16", "--member-ttl", "3s"]);
    let addr = l.field("grpc");
    let mut m1 = member(&addr, "m1", "32Mi");
    let _m2 = member(&addr, "m2", "32Mi");
    let c = client(&addr, "t").await;
    wait_members(&c, 2).await;

    let mut on_m1 = Vec::new();
    let mut on_m2 = Vec::new();
    for i in 0..40u64 {
        let key = format!("k{i}");
        c.put(&key, Bytes::from(random_bytes(i, 100_000))).await.unwrap();
        let (loc, _) = c.locate(&key).await.unwrap().unwrap();
        let name = if loc.data_addr == m1.field("data") { "m1" } else { "m2" };
        if name == "m1" { on_m1.push(i) } else { on_m2.push(i) }
    }
    assert!(
        !on_m1.is_empty() && !on_m2.is_empty(),
        "values spread over both members"
    );
    // short leases would otherwise keep nothing alive here: locate() leased them for 10 s, and a
    // dead member's objects go regardless of leases
    m1.kill();
    wait_members(&c, 1).await;
    for i in &on_m1 {
        assert!(
            c.get(&format!("k{i}")).await.unwrap().is_none(),
            "k{i} lived on the killed member"
        );
    }
    for i in &on_m2 {
        let v = c.get(&format!("k{i}")).await.unwrap().expect("survivor");
        assert!(v[..] == random_bytes(*i, 100_000)[..]);
    }
    let t = tenant(&c, "t").await;
    assert_eq!(t.objects as usize, on_m2.len());
    let charged: u64 = on_m2
        .iter()
        .map(|i| kvcache_store::leader::objects::charge(100_032, format!("k{i}").len()))
        .sum();
    assert_eq!(t.used, charged, "charges of the lost objects are returned");
    // new puts land on the survivor
    c.put("after", Bytes::from_static(b"still works")).await.unwrap();
    // a member that comes back under the same name starts empty and mounts again
    let _m1b = member(&addr, "m1", "32Mi");
    wait_members(&c, 2).await;
    assert!(c.get(&format!("k{}", on_m1[0])).await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_leader_adopts_what_its_members_hold() {
    let tenants = ["--tenant", "t=64Mi:64:bfloat16", "--member-ttl", "2s"];
    let mut l = leader(&tenants);
    let addr = l.field("grpc");
    let _m1 = member(&addr, "m1", "32Mi");
    let _m2 = member(&addr, "m2", "32Mi");
    let c = client(&addr, "t").await;
    wait_members(&c, 2).await;
    for i in 0..10u64 {
        c.put(&format!("k{i}"), Bytes::from(random_bytes(i, 50_000)))
            .await
            .unwrap();
    }
    let before = tenant(&c, "t").await;
    let (old_loc, old_lease) = c.locate("k0").await.unwrap().unwrap();
    wait_sealed(&c, &[&_m1, &_m2]).await;

    l.kill();
    // the fast port moves (any free port): clients must find it again through Health
    let mut restart_flags = tenants.to_vec();
    restart_flags.extend_from_slice(&["--fast-listen", "127.0.0.1:0"]);
    let _l2 = leader_at(&addr, &restart_flags);
    let c2 = client(&addr, "t").await;
    wait_members(&c2, 2).await;
    // the members handed over what they held: every value hits, byte for byte
    for i in 0..10u64 {
        let v = c2.get(&format!("k{i}")).await.unwrap().expect("adopted");
        assert!(v[..] == random_bytes(i, 50_000)[..], "k{i} is its own bytes");
    }
    let after = tenant(&c2, "t").await;
    assert_eq!(after.objects, 10);
    assert_eq!(after.used, before.used, "charged as before");
    let health = c2
        .control()
        .health(kvcache_store::proto::HealthRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!((health.adopted_objects, health.adopted_bytes), (10, 500_000));
    // a client from before the restart reconnects on its own (its pooled connections died)
    assert!(c.get("k1").await.unwrap().is_some());
    // the old leader's location is refused by the member: its segment was remounted
    let reader = kvcache_store::client::Client::connect(&addr, scope("t")).await.unwrap();
    let err = raw_read(&old_loc, old_lease.lease_deadline_unix_ms).await;
    assert_eq!(err, Some(ErrorCode::StaleMount));
    // and the store works again
    reader.put("fresh", Bytes::from_static(b"new leader")).await.unwrap();
    assert_eq!(
        reader.get("fresh").await.unwrap().unwrap(),
        Bytes::from_static(b"new leader")
    );
}

/// Reads a location straight from the member's data port; returns the refusal code, if any.
async fn raw_read(loc: &kvcache_store::proto::Location, deadline: u64) -> Option<ErrorCode> {
    use kvcache_store::wire;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(&loc.data_addr).await.unwrap();
    let req = wire::Request::granted(wire::Op::Read, loc, loc.len, deadline, 0);
    s.write_all(&req.encode()).await.unwrap();
    let mut head = [0u8; wire::RESPONSE_LEN];
    s.read_exact(&mut head).await.unwrap();
    let resp = wire::Response::decode(&head).unwrap();
    if resp.ok {
        return None;
    }
    let mut msg = vec![0u8; resp.len as usize];
    s.read_exact(&mut msg).await.unwrap();
    Some(wire::refusal(&msg).code)
}

/// Two members on one host started without `--name` both take the host name. The second must be
/// refused (it never evicts the first), say which name clashes and what to do, and give up with a
/// non-zero exit once the first has stayed alive for about twice the leader's member TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_member_under_a_live_members_name_is_refused_and_evicts_nothing() {
    let l = leader(&["--tenant", "t=64Mi:64:bfloat16", "--member-ttl", "2s"]);
    let addr = l.field("grpc");
    let first = member(&addr, "same-host", "16Mi");
    let c = client(&addr, "t").await;
    wait_members(&c, 1).await;
    for i in 0..8u64 {
        c.put(&format!("k{i}"), Bytes::from(random_bytes(i, 10_000)))
            .await
            .unwrap();
    }
    let err_file = tempfile::NamedTempFile::new().unwrap();
    let mut second = Proc::start_with_stderr(
        &[
            "member",
            "--leader",
            &addr,
            "--capacity",
            "16Mi",
            "--name",
            "same-host",
            "--no-prefault",
        ],
        err_file.reopen().unwrap(),
    );
    let mut status = None;
    eventually("the second member gives up", || {
        status = status.or_else(|| second.exited());
        async move { status.is_some() }
    })
    .await;
    assert!(!status.unwrap().success(), "the refused member exits non-zero");
    let stderr = std::fs::read_to_string(err_file.path()).unwrap();
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("kv-store: error: MEMBER_NAME_TAKEN") && last.contains("\"same-host\""),
        "{stderr}"
    );
    assert!(last.contains("its own --name"), "{stderr}");
    // the first member kept its mount and every object
    let members = c
        .control()
        .get_members(kvcache_store::proto::GetMembersRequest {})
        .await
        .unwrap()
        .into_inner()
        .members;
    assert_eq!(members.len(), 1, "{members:?}");
    assert_eq!(members[0].data_addr, first.field("data"));
    assert_eq!(members[0].objects, 8);
    for i in 0..8u64 {
        let v = c.get(&format!("k{i}")).await.unwrap().expect("kept");
        assert!(v[..] == random_bytes(i, 10_000)[..]);
    }
}

/// A reader that sends its request and then stops reading holds its range only until its lease
/// ends: the member drops the transfer then, so the value placed next in that range is written,
/// not refused `RANGE_BUSY`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_stops_reading_holds_its_range_no_longer_than_its_lease() {
    use kvcache_store::wire;
    use tokio::io::AsyncWriteExt;
    let l = leader(&["--tenant", "t=256Mi:64:bfloat16", "--lease-ttl", "1s"]);
    let addr = l.field("grpc");
    let _m = member(&addr, "m1", "128Mi");
    let c = client(&addr, "t").await.without_local();
    wait_members(&c, 1).await;
    // far more than the socket buffers on both sides hold, so the member's send blocks
    let size = 32 << 20;
    c.put("held", Bytes::from(random_bytes(1, size))).await.unwrap();
    let (loc, got) = c.locate("held").await.unwrap().unwrap();

    let stalled = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    stalled.set_recv_buffer_size(4096).unwrap();
    let to: std::net::SocketAddr = loc.data_addr.parse().unwrap();
    stalled.connect(&to.into()).unwrap();
    stalled.set_nonblocking(true).unwrap();
    let mut stalled = tokio::net::TcpStream::from_std(stalled.into()).unwrap();
    let req = wire::Request::granted(wire::Op::Read, &loc, loc.len, got.lease_deadline_unix_ms, 0);
    stalled.write_all(&req.encode()).await.unwrap();

    // once the lease is over the value may go, and the next of its size takes its range
    eventually("the lease ends and the value is removed", || async {
        c.remove("held").await.is_ok_and(|removed| removed)
    })
    .await;
    let next = Bytes::from(random_bytes(2, size));
    c.put("next", next.clone()).await.unwrap();
    let (placed, _) = c.locate("next").await.unwrap().unwrap();
    assert_eq!(placed.offset, loc.offset, "best fit places it in the freed range");
    assert_eq!(c.get("next").await.unwrap().unwrap(), next);
    drop(stalled);
}
