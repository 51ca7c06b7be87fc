//! What one caller can cost the store, with real `kv-store` processes: a tenant's grant bounds
//! the leader's memory as well as the members', however small its values and long its keys.

#![allow(clippy::unwrap_used)]

mod common;

use common::{leader, member, scope};
use kvcache_store::proto::BatchPutStartRequest;
use kvcache_store::proto::store_client::StoreClient;

/// A process's resident memory now and at its peak (`VmRSS`, `VmHWM`), in bytes.
fn rss(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        let kib = status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap();
        kib << 10
    };
    (field("VmRSS:"), field("VmHWM:"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_thousand_puts_under_4_kib_keys_stay_within_the_grant_on_the_leader() {
    const GRANT: u64 = 8 << 20;
    let l = leader(&["--tenant", "t=8Mi:64:bfloat16"]);
    let addr = l.field("grpc");
    let _m = member(&addr, "m1", "64Mi");
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let ours = kvcache_store::protocol::SendVersion(kvcache_store::protocol::ClientVersion::ours("bounds-test"));
    let mut store = StoreClient::with_interceptor(channel, ours)
        .max_encoding_message_size(usize::MAX)
        .max_decoding_message_size(usize::MAX);
    let pid = l.child.id();
    let (_, before) = rss(pid);

    // 100,000 reservations of 64-byte values under 4 KiB keys, 1,000 per call
    let mut reserved = 0u64;
    let mut refused = 0u64;
    for batch in 0..100 {
        let keys: Vec<String> = (0..1000)
            .map(|i| format!("{batch:03}/{i:04}/{}", "k".repeat(4096 - 9)))
            .collect();
        let answer = loop {
            let r = store
                .batch_put_start(BatchPutStartRequest {
                    scope: Some(scope("t")),
                    sizes: vec![64; keys.len()],
                    keys: keys.clone(),
                })
                .await;
            match r {
                Ok(a) => break a.into_inner(),
                // until the member has mounted
                Err(e) if batch == 0 && e.code() == tonic::Code::ResourceExhausted => {
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await
                }
                Err(e) => panic!("{e:?}"),
            }
        };
        for r in answer.results {
            if r.error.is_empty() {
                reserved += 1;
            } else {
                assert!(r.error.starts_with("TENANT_QUOTA_EXCEEDED"), "{}", r.error);
                refused += 1;
            }
        }
    }
    let (_, after) = rss(pid);
    let rise = after.saturating_sub(before);
    let per_object = kvcache_store::leader::objects::charge(64, "k".repeat(4096).len());
    eprintln!(
        "{reserved} reserved, {refused} refused; {per_object} bytes charged per object; leader peak RSS rose {:.1} MiB \
         for a {} MiB grant",
        rise as f64 / (1 << 20) as f64,
        GRANT >> 20
    );
    assert_eq!(reserved, GRANT / per_object, "the grant holds this many objects");
    assert_eq!(reserved + refused, 100_000);
    // the objects' memory is bounded by the grant; the rest is one call's request at a time
    // (about 8 MiB, as received and as decoded)
    assert!(
        rise <= GRANT + (24 << 20),
        "the leader's peak memory rose by {} MiB for a {} MiB grant",
        rise >> 20,
        GRANT >> 20
    );
}
