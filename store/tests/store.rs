//! A leader, two members and clients on loopback: values round-trip byte for byte under
//! concurrency; tenants, grants, quota eviction, leases, layouts; multi-tenancy off; metrics.

// Helpers outside #[test] fns state expectations with unwrap too (see clippy.toml).
#![allow(clippy::unwrap_used)]

mod common;

use bytes::Bytes;
use common::*;
use kvcache_store::client::PutOutcome;
use kvcache_store::error::ErrorCode;
use kvcache_store::proto::{GetTenantsRequest, GrantLimit, PoolEntry, SetTenantsRequest, TenantEntry};

const MIB: u64 = 1 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_values_round_trip_under_16_concurrent_clients() {
    let l = leader(&["--tenant", "t=256Mi:64:bfloat16"]);
    let addr = l.field("grpc");
    let _m1 = member(&addr, "m1", "64Mi");
    let _m2 = member(&addr, "m2", "64Mi");
    let c = client(&addr, "t").await;
    wait_members(&c, 2).await;

    let mut tasks = Vec::new();
    for worker in 0..16u64 {
        let addr = addr.clone();
        tasks.push(tokio::spawn(async move {
            // half the clients speak gRPC to the leader, half its framed port
            let c = client(&addr, "t").await;
            assert!(c.uses_fast_port());
            let c = if worker % 2 == 0 { c } else { c.grpc_only() };
            let mut written = Vec::new();
            for i in 0..24u64 {
                let seed = worker * 1000 + i;
                // sizes from 1 byte to ~1.5 MiB, including unaligned ones
                let len = match i % 4 {
                    0 => 1 + (seed % 97) as usize,
                    1 => 4096 + (seed % 4099) as usize,
                    2 => 65536 + (seed % 65537) as usize,
                    _ => (1 << 20) + (seed % (1 << 19)) as usize,
                };
                let key = format!("w{worker}/k{i}");
                let value = random_bytes(seed, len);
                assert_eq!(
                    c.put(&key, Bytes::from(value.clone())).await.unwrap(),
                    PutOutcome::Stored
                );
                written.push((key, value));
            }
            for (key, value) in &written {
                let got = c.get(key).await.unwrap().unwrap_or_else(|| panic!("{key} missing"));
                assert!(got[..] == value[..], "{key}: bytes differ");
                let mut buf = Vec::new();
                assert!(c.get_into(key, &mut buf).await.unwrap());
                assert!(buf == *value, "{key}: bytes differ (get_into)");
            }
            written.len()
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    assert_eq!(total, 16 * 24);
    let members = c
        .control()
        .get_members(kvcache_store::proto::GetMembersRequest {})
        .await
        .unwrap()
        .into_inner()
        .members;
    assert_eq!(members.len(), 2);
    assert!(
        members.iter().all(|m| m.objects > 0),
        "both members hold values: {members:?}"
    );
    let t = tenant(&c, "t").await;
    assert_eq!(t.objects, 16 * 24);
    assert_eq!(t.puts, 16 * 24);
    // a put of an existing key is a no-op success, and never changes the bytes
    assert_eq!(
        c.put("w0/k0", Bytes::from_static(b"other")).await.unwrap(),
        PutOutcome::AlreadyExisted
    );
    assert_eq!(c.get("w0/k0").await.unwrap().unwrap()[..], random_bytes(0, 1)[..]);
}

/// A batch of more small values than a member accepts connections from one host (512): they
/// move a bounded number at a time, and every one round-trips.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_thousands_of_small_values_round_trips() {
    let l = leader(&["--tenant", "t=256Mi:64:bfloat16"]);
    let addr = l.field("grpc");
    let _m = member(&addr, "m", "64Mi");
    let c = client(&addr, "t").await;
    wait_members(&c, 1).await;
    let keys: Vec<String> = (0..2_000).map(|i| format!("many/{i:05}")).collect();
    let values: Vec<Vec<u8>> = (0..2_000u64).map(|i| random_bytes(i, 16)).collect();
    let items: Vec<(&str, &[u8])> = keys
        .iter()
        .zip(&values)
        .map(|(k, v)| (k.as_str(), v.as_slice()))
        .collect();
    for (k, r) in keys.iter().zip(c.batch_put(&items).await.unwrap()) {
        assert_eq!(r.unwrap_or_else(|e| panic!("{k}: {e}")), PutOutcome::Stored);
    }
    let mut bufs: Vec<Vec<u8>> = vec![vec![0u8; 16]; 2_000];
    let mut reads: Vec<(&str, &mut [u8])> = keys
        .iter()
        .zip(bufs.iter_mut())
        .map(|(k, b)| (k.as_str(), b.as_mut_slice()))
        .collect();
    for (i, r) in c.batch_get_into(&mut reads).await.unwrap().into_iter().enumerate() {
        assert_eq!(r.unwrap_or_else(|e| panic!("{}: {e}", keys[i])), Some(16));
    }
    assert!(bufs == values, "every value round-trips");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_evicts_the_tenants_own_objects_then_refuses_when_all_are_leased() {
    let l = leader(&[
        "--tenant",
        // four 4 MiB values and what the leader charges for each (its key and overhead)
        "q=16388Ki:64:bfloat16",
        "--tenant",
        "other=16Mi:64:bfloat16",
        "--lease-ttl",
        "5m",
    ]);
    let addr = l.field("grpc");
    let _m1 = member(&addr, "m1", "64Mi");
    let _m2 = member(&addr, "m2", "64Mi");
    let c = client(&addr, "q").await;
    wait_members(&c, 2).await;
    let other = client(&addr, "other").await;
    other.put("keep", Bytes::from(vec![9u8; 4 << 20])).await.unwrap();

    for i in 0..8u64 {
        let v = Bytes::from(random_bytes(i, (4 * MIB) as usize));
        assert_eq!(c.put(&format!("b{i}"), v).await.unwrap(), PutOutcome::Stored, "put {i}");
    }
    let t = tenant(&c, "q").await;
    assert_eq!(t.grant, 16 * MIB + 4096);
    assert_eq!(t.objects, 4, "four 4 MiB objects fit a 16 MiB grant");
    let each = kvcache_store::leader::objects::charge(4 * MIB, "b0".len());
    assert_eq!(each, 4 * MIB + 384 + 2, "the value, the leader's overhead and the key");
    assert_eq!(t.used, 4 * each, "exactly four objects charged");
    assert_eq!(t.evictions, 4);
    // the least recently used went first; the survivors read back intact (and are now leased)
    for i in 0..4u64 {
        assert!(
            c.get(&format!("b{i}")).await.unwrap().is_none(),
            "b{i} should have been evicted"
        );
    }
    for i in 4..8u64 {
        let v = c.get(&format!("b{i}")).await.unwrap().expect("survivor");
        assert!(v[..] == random_bytes(i, (4 * MIB) as usize)[..]);
    }
    // every object is leased now: nothing can be evicted, so the next put is refused
    let err = c
        .put("b8", Bytes::from(vec![1u8; (4 * MIB) as usize]))
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::TenantQuotaExceeded, "{err}");
    assert!(err.message.contains("leased"), "the message says why: {err}");
    // a leased object cannot be removed either
    assert_eq!(c.remove("b4").await.unwrap_err().code, ErrorCode::ObjectHasLease);
    // the other tenant was never touched
    assert!(other.get("keep").await.unwrap().is_some());
    assert_eq!(tenant(&c, "other").await.evictions, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unregistered_tenants_and_mismatched_layouts_are_refused() {
    let l = leader(&["--tenant", "known=8Mi:64:bfloat16"]);
    let addr = l.field("grpc");
    let _m1 = member(&addr, "m1", "32Mi");
    let c = client(&addr, "known").await;
    wait_members(&c, 1).await;
    c.put("k", Bytes::from_static(b"hello")).await.unwrap();

    let stranger = client(&addr, "stranger").await;
    let err = stranger.put("k", Bytes::from_static(b"x")).await.unwrap_err();
    assert_eq!(err.code, ErrorCode::Unauthenticated, "{err}");
    assert!(err.message.contains("KVCachePoolBinding"), "{err}");
    assert_eq!(stranger.get("k").await.unwrap_err().code, ErrorCode::Unauthenticated);

    let mut fp8 = scope("known");
    fp8.dtype = "fp8_e4m3".into();
    let wrong = c.with_scope(fp8);
    let err = wrong.get("k").await.unwrap_err();
    assert_eq!(err.code, ErrorCode::TenantLayoutMismatch, "{err}");
    assert!(
        err.message.contains("bfloat16") && err.message.contains("fp8_e4m3"),
        "{err}"
    );
    assert_eq!(
        wrong.put("k2", Bytes::from_static(b"x")).await.unwrap_err().code,
        ErrorCode::TenantLayoutMismatch
    );
    let mut bs = scope("known");
    bs.block_size = 16;
    assert_eq!(
        c.with_scope(bs).exists("k").await.unwrap_err().code,
        ErrorCode::TenantLayoutMismatch
    );

    // the layout of a tenant holding objects cannot be changed under them
    let entry = TenantEntry {
        name: "known".into(),
        ceiling: 8 * MIB,
        block_size: 64,
        dtype: "fp8_e4m3".into(),
        ..Default::default()
    };
    let err = c
        .control()
        .set_tenants(SetTenantsRequest {
            tenants: vec![entry],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(
        err.message().starts_with("TENANT_LAYOUT_IMMUTABLE"),
        "{}",
        err.message()
    );
    // the value is still there, in its layout
    assert_eq!(c.get("k").await.unwrap().unwrap(), Bytes::from_static(b"hello"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversubscribed_ceilings_get_proportional_grants() {
    let l = leader(&[]);
    let addr = l.field("grpc");
    let _m1 = member(&addr, "m1", "64Mi");
    let _m2 = member(&addr, "m2", "64Mi");
    let c = client(&addr, "a").await;
    wait_members(&c, 2).await;
    let entry = |name: &str, mib: u64| TenantEntry {
        name: name.into(),
        ceiling: mib * MIB,
        block_size: 64,
        dtype: "bfloat16".into(),
        ..Default::default()
    };
    // fits: grants equal ceilings
    c.control()
        .set_tenants(SetTenantsRequest {
            tenants: vec![entry("a", 64), entry("b", 32)],
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(tenant(&c, "a").await.grant, 64 * MIB);
    assert_eq!(tenant(&c, "b").await.grant, 32 * MIB);
    // 192 + 64 = 256 MiB asked of 128 MiB mounted: each cut in half
    c.control()
        .set_tenants(SetTenantsRequest {
            tenants: vec![entry("a", 192), entry("b", 64)],
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(tenant(&c, "a").await.grant, 96 * MIB);
    assert_eq!(tenant(&c, "b").await.grant, 32 * MIB);
    // an invalid ledger is refused whole
    let err = c
        .control()
        .set_tenants(SetTenantsRequest {
            tenants: vec![entry("_x", 1)],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(err.message().starts_with("INVALID_TENANT_LEDGER"), "{}", err.message());
    assert_eq!(tenant(&c, "a").await.grant, 96 * MIB);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_over_its_total_leaves_another_pools_grants_whole() {
    let l = leader(&[]);
    let addr = l.field("grpc");
    let _m1 = member(&addr, "m1", "64Mi");
    let _m2 = member(&addr, "m2", "64Mi");
    let c = client(&addr, "a").await;
    wait_members(&c, 2).await;
    let entry = |name: &str, mib: u64, pool: &str| TenantEntry {
        name: name.into(),
        ceiling: mib * MIB,
        block_size: 64,
        dtype: "bfloat16".into(),
        pool: pool.into(),
        ..Default::default()
    };
    let pool = |name: &str, mib: u64| PoolEntry {
        name: name.into(),
        total: mib * MIB,
    };
    // pool p (32 MiB) is asked 64 + 64 MiB; pool q (64 MiB) 48 MiB: 128 MiB mounted holds both
    // pools' totals, so only p's Bindings are cut, within p's 32 MiB
    c.control()
        .set_tenants(SetTenantsRequest {
            tenants: vec![entry("a", 64, "p"), entry("b", 64, "p"), entry("c", 48, "q")],
            pools: vec![pool("p", 32), pool("q", 64)],
        })
        .await
        .unwrap();
    let (a, b, q) = (tenant(&c, "a").await, tenant(&c, "b").await, tenant(&c, "c").await);
    assert_eq!((a.grant, b.grant), (16 * MIB, 16 * MIB));
    assert_eq!(a.limited_by(), GrantLimit::PoolTotal);
    assert_eq!((q.grant, q.limited_by()), (48 * MIB, GrantLimit::None));
    assert_eq!(q.pool, "q");
    let read = c
        .control()
        .get_tenants(GetTenantsRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(read.pools, [pool("p", 32), pool("q", 64)]);
    // pools asking more than is mounted (96 + 64 MiB of 128) share it by what they may hand out
    c.control()
        .set_tenants(SetTenantsRequest {
            tenants: vec![entry("a", 96, "p"), entry("c", 64, "q")],
            pools: vec![pool("p", 96), pool("q", 64)],
        })
        .await
        .unwrap();
    let (a, q) = (tenant(&c, "a").await, tenant(&c, "c").await);
    assert_eq!((a.grant, q.grant), (96 * MIB * 128 / 160, 64 * MIB * 128 / 160));
    assert_eq!(
        (a.limited_by(), q.limited_by()),
        (GrantLimit::Capacity, GrantLimit::Capacity)
    );
    // a tenant naming a pool the request does not list: refused whole, nothing changes
    let err = c
        .control()
        .set_tenants(SetTenantsRequest {
            tenants: vec![entry("a", 1, "elsewhere")],
            pools: vec![],
        })
        .await
        .unwrap_err();
    assert!(err.message().starts_with("INVALID_TENANT_LEDGER"), "{}", err.message());
    assert_eq!(tenant(&c, "c").await.pool, "q");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_multi_tenancy_off_every_request_lands_in_one_tenant() {
    let l = leader(&["--multi-tenancy=false"]);
    let addr = l.field("grpc");
    let _m1 = member(&addr, "m1", "16Mi");
    let a = client(&addr, "alpha").await;
    wait_members(&a, 1).await;
    let b = client(&addr, "beta").await;
    a.put("shared", Bytes::from_static(b"written by alpha")).await.unwrap();
    assert_eq!(
        b.get("shared").await.unwrap().unwrap(),
        Bytes::from_static(b"written by alpha")
    );
    let t = tenant(&a, "default").await;
    assert_eq!(t.grant, 16 * MIB);
    assert_eq!(t.objects, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_and_readiness_are_served() {
    let l = leader(&["--tenant", "t=8Mi:64:bfloat16", "--metrics-listen", "127.0.0.1:0"]);
    let addr = l.field("grpc");
    let m = Proc::start(&[
        "member",
        "--leader",
        &addr,
        "--capacity",
        "8Mi",
        "--name",
        "m1",
        "--no-prefault",
        "--metrics-listen",
        "127.0.0.1:0",
    ]);
    let c = client(&addr, "t").await;
    wait_members(&c, 1).await;
    c.put("k", Bytes::from_static(b"v")).await.unwrap();
    assert!(c.get("k").await.unwrap().is_some());
    assert!(c.get("missing").await.unwrap().is_none());

    let text = http_get(&l.field("metrics"), "/metrics").await;
    for needle in [
        "kvstore_leader_ready 1",
        "kvstore_capacity_bytes 8388608",
        "kvstore_used_bytes 64",
        "kvstore_objects 1",
        "kvstore_leader_index_bytes ",
        "kvstore_puts_total 1",
        "kvstore_gets_total 2",
        "kvstore_misses_total 1",
        "kvstore_evictions_total 0",
        "kvstore_tenant_grant_bytes{tenant=\"t\"} 8388608",
        "kvstore_tenant_used_bytes{tenant=\"t\"} 449",
        "kvstore_tenant_evictions_total{tenant=\"t\"} 0",
        "kvstore_member_used_bytes{member=\"m1\"} 64",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in\n{text}");
    }
    let ready = http_get(&l.field("metrics"), "/readyz").await;
    assert!(
        ready.starts_with("HTTP/1.1 200") && ready.ends_with("serving\n"),
        "{ready}"
    );
    let ready = http_get(&m.field("metrics"), "/readyz").await;
    assert!(
        ready.starts_with("HTTP/1.1 200") && ready.ends_with("serving\n"),
        "{ready}"
    );
    let mtext = http_get(&m.field("metrics"), "/metrics").await;
    assert!(mtext.contains("kvstore_member_ready 1"), "{mtext}");
    assert!(mtext.contains("kvstore_member_writes_total 1"), "{mtext}");
    assert!(mtext.contains("kvstore_member_reads_total 1"), "{mtext}");
    let h = c
        .control()
        .health(kvcache_store::proto::HealthRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(h.serving);
    assert_eq!(h.role, "leader");
}

/// The batch calls engines use answer key by key: a refused key does not sink the others, and
/// a refused key keeps its object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_calls_answer_key_by_key() {
    use kvcache_store::proto::segment_data_client::SegmentDataClient;
    use kvcache_store::proto::store_client::StoreClient;
    use kvcache_store::proto::*;

    let l = leader(&["--tenant", "b=16Mi:64:bfloat16", "--lease-ttl", "5m"]);
    let addr = l.field("grpc");
    let _m = member(&addr, "m1", "32Mi");
    let c = client(&addr, "b").await;
    wait_members(&c, 1).await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let ours = kvcache_store::protocol::SendVersion(kvcache_store::protocol::ClientVersion::ours("store-test"));
    let mut store = StoreClient::with_interceptor(channel, ours);
    let sc = || Some(scope("b"));

    // reserve three values and one that cannot fit the tenant's 16 MiB grant
    let keys: Vec<String> = ["a", "b", "c", "huge"].iter().map(|k| k.to_string()).collect();
    let values: Vec<Vec<u8>> = (0..3u64).map(|i| random_bytes(i, 1000 + i as usize)).collect();
    let mut sizes: Vec<u64> = values.iter().map(|v| v.len() as u64).collect();
    sizes.push(32 * MIB);
    let started = store
        .batch_put_start(BatchPutStartRequest {
            scope: sc(),
            keys: keys.clone(),
            sizes,
        })
        .await
        .unwrap()
        .into_inner()
        .results;
    assert_eq!(started.len(), 4);
    assert!(
        started[3].reserved.is_none() && !started[3].error.is_empty(),
        "{:?}",
        started[3]
    );
    let mut ids = Vec::new();
    for (i, v) in values.iter().enumerate() {
        assert!(started[i].error.is_empty(), "{}: {}", keys[i], started[i].error);
        let r = started[i].reserved.clone().unwrap();
        let loc = r.location.unwrap();
        SegmentDataClient::connect(format!("http://{}", loc.grpc_addr))
            .await
            .unwrap()
            .write(kvcache_store::member::grpc::write_request(
                &loc,
                r.write_deadline_unix_ms,
                v.clone().into(),
            ))
            .await
            .unwrap();
        ids.push(r.put_id);
    }
    // a key that holds no reservation is refused, alone
    let errors = store
        .batch_put_commit(BatchPutCommitRequest {
            scope: sc(),
            keys: vec!["a".into(), "b".into(), "c".into(), "never".into()],
            put_ids: vec![ids[0], ids[1], ids[2], ids[2] + 1000],
        })
        .await
        .unwrap()
        .into_inner()
        .errors;
    assert_eq!(&errors[..3], &["", "", ""], "{errors:?}");
    assert!(errors[3].starts_with("PUT_EXPIRED"), "{errors:?}");
    // lists of different lengths are refused whole
    let err = store
        .batch_put_commit(BatchPutCommitRequest {
            scope: sc(),
            keys: vec!["a".into()],
            put_ids: vec![],
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("1 keys but 0 put_ids"), "{err:?}");

    // committed values read back byte for byte; reading `a` leases it
    assert_eq!(c.get("a").await.unwrap().unwrap()[..], values[0][..]);
    let removed = store
        .batch_remove(BatchRemoveRequest {
            scope: sc(),
            keys: vec!["a".into(), "b".into(), "missing".into()],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(removed.removed, [false, true, false]);
    assert!(
        removed.errors[0].starts_with("OBJECT_HAS_LEASE"),
        "{:?}",
        removed.errors
    );
    assert_eq!(&removed.errors[1..], &["", ""]);

    let exists = store
        .batch_exists(BatchExistsRequest {
            scope: sc(),
            keys: vec!["a".into(), "b".into(), "c".into()],
        })
        .await
        .unwrap()
        .into_inner()
        .exists;
    assert_eq!(exists, [true, false, true]);
    let got = store
        .batch_get(BatchGetRequest {
            scope: sc(),
            keys: vec!["c".into(), "b".into()],
        })
        .await
        .unwrap()
        .into_inner()
        .results;
    assert!(got[0].found && !got[1].found);
    assert_eq!(got[0].location.as_ref().unwrap().len, values[2].len() as u64);

    // a scope the leader does not know refuses the whole batch, changing nothing
    let stranger = || Some(scope("stranger"));
    let refusals = [
        store
            .batch_remove(BatchRemoveRequest {
                scope: stranger(),
                keys: vec!["c".into()],
            })
            .await
            .map(drop),
        store
            .batch_put_start(BatchPutStartRequest {
                scope: stranger(),
                keys: vec!["x".into()],
                sizes: vec![1],
            })
            .await
            .map(drop),
        store
            .batch_put_commit(BatchPutCommitRequest {
                scope: stranger(),
                keys: vec!["x".into()],
                put_ids: vec![1],
            })
            .await
            .map(drop),
    ];
    for r in refusals {
        let err = r.unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err:?}");
        assert!(err.message().starts_with("UNAUTHENTICATED"), "{err:?}");
    }
    assert!(c.exists("c").await.unwrap());
}
