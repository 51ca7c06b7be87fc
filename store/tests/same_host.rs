//! The same-host path: clients on the member's host map its segment and move bytes with one
//! memcpy (`src/client/local.rs`, `src/member/local.rs`), and nothing they read is ever another
//! key's bytes, even while eviction reuses ranges under them; clients that cannot use it (turned
//! off, or a member that serves no socket) go over TCP.

// Helpers outside #[test] fns state expectations with unwrap too (see clippy.toml).
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use common::*;
use parking_lot::Mutex;

/// A member's counter from its /metrics.
async fn member_counter(metrics: &str, name: &str) -> u64 {
    let body = tokio::task::spawn_blocking({
        let url = format!("http://{metrics}/metrics");
        move || {
            let out = std::process::Command::new("curl").args(["-sf", &url]).output().unwrap();
            String::from_utf8(out.stdout).unwrap()
        }
    })
    .await
    .unwrap();
    body.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}_total ")))
        .unwrap_or_else(|| panic!("{name}_total missing from /metrics:\n{body}"))
        .trim()
        .parse()
        .unwrap()
}

/// The value under `key`: its length and bytes follow from the key alone, so any read can be
/// checked against it.
fn value_of(key: &str) -> Vec<u8> {
    let seed = key.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let len = 4096 + (seed % (192 * 1024)) as usize;
    random_bytes(seed, len)
}

/// A member that serves the same-host socket (`--same-host`).
fn start_member(leader: &str, name: &str, capacity: &str, extra: &[&str]) -> Proc {
    let mut args = vec!["--metrics-listen", "127.0.0.1:0", "--same-host"];
    args.extend_from_slice(extra);
    member_with(leader, name, capacity, &args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_same_host_clients_never_read_another_keys_bytes_while_ranges_are_reused() {
    // an 8 MiB member under a 64 MiB ceiling: about 80 values fit, so every few puts evict and
    // the freed ranges are handed to other keys while other clients read
    let l = leader(&["--tenant", "t=64Mi:64:bfloat16", "--lease-ttl", "2s"]);
    let addr = l.field("grpc");
    let m = start_member(&addr, "m1", "8Mi", &[]);
    let metrics = m.field("metrics");
    wait_members(&client(&addr, "t").await, 1).await;

    let written: Arc<Mutex<Vec<String>>> = Arc::default();
    let mut tasks = Vec::new();
    for c in 0..16u64 {
        let addr = addr.clone();
        let written = written.clone();
        tasks.push(tokio::spawn(async move {
            let client = client(&addr, "t").await;
            assert!(client.uses_local());
            let (mut hits, mut stored, mut checked) = (0u64, 0u64, HashMap::<&str, u64>::new());
            for i in 0..150u64 {
                let key = format!("c{c}-k{i}");
                match client.put(&key, Bytes::from(value_of(&key))).await {
                    Ok(_) => {
                        written.lock().push(key.clone());
                        stored += 1;
                    }
                    // every range may be leased or being written by the 15 others for a moment
                    Err(e) if e.code.as_str() == "TENANT_QUOTA_EXCEEDED" || e.code.as_str() == "NO_SPACE" => {}
                    Err(e) => panic!("put {key}: {e}"),
                }
                // read back one recent key of any client, and one older one (likely evicted)
                let picks: Vec<String> = {
                    let w = written.lock();
                    let n = w.len();
                    [
                        n.saturating_sub(1 + (i as usize * 7 + c as usize) % 24),
                        (i as usize * 13) % n.max(1),
                    ]
                    .into_iter()
                    .filter_map(|j| w.get(j).cloned())
                    .collect()
                };
                for k in picks {
                    let mut buf = Vec::new();
                    match client.get_into(&k, &mut buf).await {
                        Ok(true) => {
                            assert!(buf == value_of(&k), "a read of {k} returned other bytes");
                            hits += 1;
                        }
                        Ok(false) => *checked.entry("miss").or_default() += 1,
                        // reported, never returned: a read that outlived its lease, or a range
                        // another transfer holds for a moment
                        Err(e) if matches!(e.code.as_str(), "LEASE_EXPIRED" | "RANGE_BUSY") => {
                            *checked.entry(e.code.as_str()).or_default() += 1;
                        }
                        Err(e) => panic!("get {k}: {e}"),
                    }
                }
            }
            (hits, stored)
        }));
    }
    let (mut hits, mut stored) = (0, 0);
    for t in tasks {
        let (h, s) = t.await.unwrap();
        hits += h;
        stored += s;
    }
    assert!(hits > 100, "only {hits} reads hit; the test did not exercise reads");
    // how many puts find room depends on how the 16 clients interleave (a busy machine refuses
    // more of them), so the writes are checked against the puts that were acknowledged
    assert!(
        stored > 100,
        "only {stored} puts were stored; the test did not exercise writes"
    );
    let c = client(&addr, "t").await;
    let t = tenant(&c, "t").await;
    assert!(
        t.evictions > 100,
        "only {} evictions: ranges were not reused",
        t.evictions
    );
    let local_reads = member_counter(&metrics, "kvstore_member_local_reads").await;
    let local_writes = member_counter(&metrics, "kvstore_member_local_writes").await;
    assert!(
        local_reads >= hits && local_writes >= stored,
        "the bytes did not go through the mapped segment: {local_reads} local reads for {hits} hits, \
         {local_writes} local writes for {stored} stored puts"
    );
    drop(m);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_without_the_same_host_path_and_members_without_a_socket_use_tcp() {
    let l = leader(&["--tenant", "t=64Mi:64:bfloat16"]);
    let addr = l.field("grpc");
    let local = start_member(&addr, "m1", "16Mi", &[]);
    let c = client(&addr, "t").await;
    wait_members(&c, 1).await;
    let tcp = c.clone().without_local();
    assert!(!tcp.uses_local());
    for (i, size) in [1usize, 4096, 1 << 20].into_iter().enumerate() {
        let key = format!("tcp-{i}");
        let v = Bytes::from(random_bytes(i as u64, size));
        tcp.put(&key, v.clone()).await.unwrap();
        assert_eq!(tcp.get(&key).await.unwrap(), Some(v.clone()), "{size} bytes over TCP");
        // the same bytes through the mapping
        assert_eq!(c.get(&key).await.unwrap(), Some(v), "{size} bytes through the mapping");
    }
    let metrics = local.field("metrics");
    assert_eq!(member_counter(&metrics, "kvstore_member_local_writes").await, 0);
    assert_eq!(member_counter(&metrics, "kvstore_member_local_reads").await, 3);
    assert_eq!(member_counter(&metrics, "kvstore_member_reads").await, 6);
    drop(local);

    // a member without --same-host (the default) hands out no socket: a client that would map
    // falls back to TCP, and the leader says the member serves none
    let l2 = leader(&["--tenant", "t=64Mi:64:bfloat16"]);
    let addr2 = l2.field("grpc");
    let plain = member_with(&addr2, "m2", "16Mi", &["--metrics-listen", "127.0.0.1:0"]);
    let c2 = client(&addr2, "t").await;
    wait_members(&c2, 1).await;
    let v = Bytes::from(random_bytes(9, 300_000));
    c2.put("k", v.clone()).await.unwrap();
    assert_eq!(c2.get("k").await.unwrap(), Some(v));
    let metrics = plain.field("metrics");
    assert_eq!(member_counter(&metrics, "kvstore_member_local_writes").await, 0);
    assert_eq!(member_counter(&metrics, "kvstore_member_local_reads").await, 0);
    assert_eq!(member_counter(&metrics, "kvstore_member_writes").await, 1);
    // the leader tells which members serve the socket (the backend's status shows it)
    let same_host = |c: kvcache_store::client::Client| async move {
        let r = c
            .control()
            .get_members(kvcache_store::proto::GetMembersRequest {})
            .await
            .unwrap();
        r.into_inner().members.iter().map(|m| m.same_host).collect::<Vec<_>>()
    };
    assert_eq!(same_host(c2).await, [false]);
    let l3 = leader(&["--tenant", "t=64Mi:64:bfloat16"]);
    let _mapped = start_member(&l3.field("grpc"), "m3", "16Mi", &[]);
    let c3 = client(&l3.field("grpc"), "t").await;
    wait_members(&c3, 1).await;
    assert_eq!(same_host(c3).await, [true]);
}

/// Asks the member's socket `name` to map its segment with `grant`; whether it was answered with
/// the segment (header ok) or refused.
fn map_with(name: &str, grant: kvcache_store::wire::Request) -> bool {
    use std::io::{Read, Write};
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.strip_prefix('@').unwrap()).unwrap();
    let mut s = std::os::unix::net::UnixStream::connect_addr(&addr).unwrap();
    s.write_all(&grant.encode()).unwrap();
    let mut head = [0u8; kvcache_store::wire::RESPONSE_LEN];
    s.read_exact(&mut head).unwrap();
    kvcache_store::wire::Response::decode(&head).unwrap().ok
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_caller_the_leader_granted_a_range_maps_the_segment() {
    let l = leader(&["--tenant", "t=64Mi:64:bfloat16"]);
    let addr = l.field("grpc");
    let m = start_member(&addr, "m1", "16Mi", &[]);
    let socket = m.field("local");
    let c = client(&addr, "t").await;
    wait_members(&c, 1).await;
    // a granted client maps it (its transfers go through the mapping)
    let v = Bytes::from(random_bytes(1, 100_000));
    c.put("k", v.clone()).await.unwrap();
    assert_eq!(c.get("k").await.unwrap(), Some(v));
    assert_eq!(
        member_counter(&m.field("metrics"), "kvstore_member_local_reads").await,
        1
    );
    // a process that reaches the socket with no grant, or a forged one, maps nothing
    let ungranted = kvcache_store::wire::Request {
        op: kvcache_store::wire::Op::Map,
        mount_id: 0,
        offset: 0,
        len: 0,
        deadline_unix_ms: 0,
        epoch: 0,
        allocation: 0,
        mac: [0; kvcache_store::grant::MAC_LEN],
        tag_len: 0,
    };
    let socket2 = socket.clone();
    assert!(
        !tokio::task::spawn_blocking(move || map_with(&socket2, ungranted))
            .await
            .unwrap()
    );
    let forged = kvcache_store::wire::Request {
        len: 100_000,
        mac: [7; kvcache_store::grant::MAC_LEN],
        tag_len: 0,
        ..ungranted
    };
    assert!(
        !tokio::task::spawn_blocking(move || map_with(&socket, forged))
            .await
            .unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_lets_go_of_the_segments_of_members_that_went_away() {
    let l = leader(&["--tenant", "t=64Mi:64:bfloat16", "--member-ttl", "1s"]);
    let addr = l.field("grpc");
    let c = client(&addr, "t").await;
    // each member in turn: mapped, then killed and replaced by the next
    for i in 0..3 {
        let m = start_member(&addr, &format!("m{i}"), "16Mi", &[]);
        wait_members(&c, 1).await;
        let v = Bytes::from(random_bytes(i, 100_000));
        let key = format!("k{i}");
        // the client maps the new segment on its first transfer there (a map that comes while
        // the member still awaits its mount answer waits for it): transfer until it is mapped
        eventually("the new member's segment is mapped", || async {
            c.put(&key, v.clone()).await.unwrap();
            assert_eq!(c.get(&key).await.unwrap(), Some(v.clone()));
            let mapped = c.mapped_segments();
            assert!(mapped <= 1, "a dead member's mapping is kept: {mapped} mapped");
            mapped == 1
        })
        .await;
        drop(m);
        wait_members(&c, 0).await;
    }
}

/// The memfds this process holds open (what a same-host client received from members).
fn received_segments() -> Vec<std::fs::File> {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            let target = std::fs::read_link(e.path()).ok()?;
            if !target.to_string_lossy().starts_with("/memfd:kvstore-segment") {
                return None;
            }
            // a second descriptor of the same memory, as the member handed it over (read-write)
            std::fs::OpenOptions::new().read(true).write(true).open(e.path()).ok()
        })
        .collect()
}

/// Finding 3 of the second review: a same-host client that got the segment's memfd cannot
/// truncate it (which would end the member and every engine mapping it with SIGBUS), nor grow
/// it; the member keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_received_segment_cannot_be_truncated_and_the_member_keeps_serving() {
    let l = leader(&["--tenant", "t=16Mi:64:bfloat16"]);
    let addr = l.field("grpc");
    let mut m = start_member(&addr, "m1", "16Mi", &[]);
    let c = client(&addr, "t").await;
    wait_members(&c, 1).await;
    c.put("k", Bytes::from(value_of("k"))).await.unwrap();
    assert_eq!(c.mapped_segments(), 1, "the client mapped the member's segment");
    let received = received_segments();
    assert!(!received.is_empty(), "no segment descriptor in this process");
    for f in &received {
        let shrink = f.set_len(0).unwrap_err();
        assert_eq!(shrink.raw_os_error(), Some(libc::EPERM), "{shrink}");
        let grow = f.set_len(64 << 20).unwrap_err();
        assert_eq!(grow.raw_os_error(), Some(libc::EPERM), "{grow}");
    }
    // the member and this client's mapping carry on
    assert_eq!(c.get("k").await.unwrap().unwrap(), Bytes::from(value_of("k")));
    c.put("k2", Bytes::from(value_of("k2"))).await.unwrap();
    assert_eq!(c.get("k2").await.unwrap().unwrap(), Bytes::from(value_of("k2")));
    let tcp = client(&addr, "t").await.without_local();
    assert_eq!(tcp.get("k").await.unwrap().unwrap(), Bytes::from(value_of("k")));
    assert!(m.exited().is_none(), "the member is still running");
}
