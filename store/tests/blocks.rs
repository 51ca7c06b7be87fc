//! KV events (`Store.WatchBlocks`) against the real binary: a stream starts with
//! `AllBlocksCleared` and the blocks held, a put is `BlockStored`, a removal and an eviction are
//! `BlockRemoved` with their reason (a member that went away too), ids rise by one per live
//! event, and a restarted leader's stream starts with `AllBlocksCleared`, then the blocks its
//! member handed over.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use kvcache_store::proto::BlockEvent;
use kvcache_store::proto::block_event::Event;

async fn next(s: &mut tonic::Streaming<BlockEvent>) -> BlockEvent {
    tokio::time::timeout(Duration::from_secs(10), s.message())
        .await
        .expect("an event within 10 s")
        .expect("the stream is healthy")
        .expect("the stream goes on")
}

fn keys(e: &BlockEvent) -> (&'static str, Vec<String>) {
    match e.event.as_ref().expect("an event") {
        Event::Cleared(_) => ("cleared", vec![]),
        Event::Stored(s) => ("stored", s.keys.clone()),
        Event::Removed(r) => (
            match r.reason.as_str() {
                "removed" => "removed",
                "evicted" => "evicted",
                "member" => "member",
                other => panic!("unexpected reason {other}"),
            },
            r.keys.clone(),
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn puts_removals_and_evictions_are_events_and_a_restart_brings_back_what_members_hold() {
    // room for three 256 KiB values in the tenant's grant: the fourth evicts the oldest
    let tenants = ["--tenant", "t=800Ki:64:bfloat16"];
    let mut l = leader(&tenants);
    let addr = l.field("grpc");
    let mut m = member(&addr, "m1", "32Mi");
    let c = client(&addr, "t").await;
    wait_members(&c, 1).await;
    let v = Bytes::from(vec![1u8; 256 << 10]);
    c.put("held", v.clone()).await.unwrap();

    let mut s = c.watch_blocks().await.unwrap();
    let first = next(&mut s).await;
    assert_eq!((keys(&first).0, first.snapshot, first.id), ("cleared", true, 1));
    let held = next(&mut s).await;
    assert_eq!(keys(&held), ("stored", vec!["held".to_owned()]));
    assert!(held.snapshot);
    assert!(matches!(&held.event, Some(Event::Stored(b)) if b.size == 256 << 10));

    c.put("a", v.clone()).await.unwrap();
    let e = next(&mut s).await;
    assert_eq!(
        (keys(&e), e.snapshot, e.id),
        (("stored", vec!["a".to_owned()]), false, 2)
    );
    assert!(c.remove("a").await.unwrap());
    let e = next(&mut s).await;
    assert_eq!((keys(&e), e.id), (("removed", vec!["a".to_owned()]), 3));
    // fill the grant: the least recently used ("held") is evicted for the fourth value
    for k in ["b", "c", "d"] {
        c.put(k, v.clone()).await.unwrap();
    }
    let mut seen = Vec::new();
    for _ in 0..4 {
        seen.push(keys(&next(&mut s).await));
    }
    assert!(seen.contains(&("evicted", vec!["held".to_owned()])), "{seen:?}");
    for k in ["b", "c", "d"] {
        assert!(seen.contains(&("stored", vec![k.to_owned()])), "{seen:?}");
    }

    // a restarted leader holds what its member handed over: the stream ends, and a new one
    // starts with the clear and then the adopted blocks
    wait_sealed(&c, &[&m]).await;
    l.kill();
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match s.message().await {
                Ok(Some(_)) => continue,
                Ok(None) | Err(_) => return,
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the stream of a killed leader ends");
    // (on any fast port: the old one may not be free again yet)
    let _l2 = leader_at(
        &addr,
        &[
            tenants[0],
            tenants[1],
            "--member-ttl",
            "1s",
            "--fast-listen",
            "127.0.0.1:0",
        ],
    );
    let c2 = client(&addr, "t").await;
    let mut s2 = c2.watch_blocks().await.unwrap();
    let first = next(&mut s2).await;
    assert_eq!(keys(&first).0, "cleared");
    // b, c and d come back, in the snapshot or as the member's values are adopted
    let mut back = std::collections::BTreeSet::new();
    while !["b", "c", "d"].iter().all(|k| back.contains(*k)) {
        let e = next(&mut s2).await;
        let (what, ks) = keys(&e);
        assert_eq!(what, "stored", "{e:?}");
        back.extend(ks);
    }
    wait_members(&c2, 1).await;
    // (the grant is full again: this put evicts the least recently used adopted block)
    c2.put("after", v.clone()).await.unwrap();
    let e = loop {
        let e = next(&mut s2).await;
        if keys(&e).1.contains(&"after".to_owned()) {
            break e;
        }
    };
    assert_eq!(keys(&e).0, "stored");
    // the member goes silent: its blocks are gone once the leader drops the mount
    m.kill();
    let e = next(&mut s2).await;
    let (why, gone) = keys(&e);
    assert_eq!(why, "member");
    assert!(gone.contains(&"after".to_owned()), "{gone:?}");
    assert_eq!(gone.len(), 3, "after and the two adopted blocks left: {gone:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_outside_the_ledger_cannot_watch() {
    let l = leader(&["--tenant", "t=1Mi:64:bfloat16"]);
    let c = client(&l.field("grpc"), "nobody").await;
    let e = c.watch_blocks().await.unwrap_err();
    assert_eq!(e.code, kvcache_store::error::ErrorCode::Unauthenticated);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_ends_when_its_credential_is_rotated_out() {
    use kvcache_store::client::Client;
    use kvcache_store::leader::ledger::credential_hash;
    use kvcache_store::proto::control_client::ControlClient;
    use kvcache_store::proto::{Scope, SetTenantsRequest, TenantEntry};

    let l = leader(&[]);
    let addr = l.field("grpc");
    let _m = member(&addr, "m1", "32Mi");
    let mut control = ControlClient::connect(format!("http://{addr}")).await.unwrap();
    let ledger = |credentials: &[&str]| SetTenantsRequest {
        tenants: vec![TenantEntry {
            name: "t".into(),
            ceiling: 8 << 20,
            block_size: 64,
            dtype: "bfloat16".into(),
            credential_sha256: credentials.iter().map(|c| credential_hash(c).to_vec().into()).collect(),
            ..Default::default()
        }],
        ..Default::default()
    };
    let with = |credential: &str| Scope {
        credential: credential.into(),
        ..scope("t")
    };
    control.set_tenants(ledger(&["old"])).await.unwrap();
    let old = Client::connect(&addr, with("old")).await.unwrap();
    wait_members(&old, 1).await;
    let mut s = old.watch_blocks().await.unwrap();
    assert_eq!(keys(&next(&mut s).await).0, "cleared");

    // the rotation's overlap: both credentials hold, and the stream goes on
    control.set_tenants(ledger(&["old", "new"])).await.unwrap();
    let new = Client::connect(&addr, with("new")).await.unwrap();
    new.put("during", Bytes::from_static(b"x")).await.unwrap();
    assert_eq!(keys(&next(&mut s).await), ("stored", vec!["during".to_owned()]));
    let mut kept = new.watch_blocks().await.unwrap();
    assert_eq!(keys(&next(&mut kept).await).0, "cleared");
    assert_eq!(keys(&next(&mut kept).await), ("stored", vec!["during".to_owned()]));

    // the old credential leaves the ledger: its stream ends with the refusal a call would get,
    // and carries no key written after
    control.set_tenants(ledger(&["new"])).await.unwrap();
    new.put("after", Bytes::from_static(b"y")).await.unwrap();
    let end = tokio::time::timeout(Duration::from_secs(10), s.message())
        .await
        .expect("the old stream ends within 10 s");
    let status = end.expect_err("the old stream ends with a refusal, not an event");
    assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
    assert_eq!(keys(&next(&mut kept).await), ("stored", vec!["after".to_owned()]));
    assert!(old.watch_blocks().await.is_err(), "and cannot start again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_may_hold_only_so_many_watches_at_once() {
    use kvcache_store::leader::blocks::MAX_WATCHES;
    let l = leader(&["--tenant", "t=8Mi:64:bfloat16"]);
    let c = client(&l.field("grpc"), "t").await;
    let mut open = Vec::new();
    for _ in 0..MAX_WATCHES {
        let mut s = c.watch_blocks().await.unwrap();
        assert_eq!(keys(&next(&mut s).await).0, "cleared");
        open.push(s);
    }
    let refused = c.watch_blocks().await.unwrap_err();
    assert_eq!(
        refused.code,
        kvcache_store::error::ErrorCode::TenantQuotaExceeded,
        "{refused}"
    );
    assert!(refused.message.contains("close one"), "{refused}");
    // closing one makes room again
    drop(open.pop());
    eventually("a closed stream's place is free again", || async {
        c.watch_blocks().await.is_ok()
    })
    .await;
}

/// A tenant's blocks come in a snapshot of many pages (more than one page of the index's slots
/// here), none left out, while puts go on: applying the snapshot, then the live events, gives
/// exactly what the tenant holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_of_many_pages_holds_every_block_while_puts_go_on() {
    const HELD: usize = 10_000;
    let l = leader(&["--tenant", "t=256Mi:64:bfloat16"]);
    let addr = l.field("grpc");
    let _m = member(&addr, "m1", "64Mi");
    let c = client(&addr, "t").await;
    wait_members(&c, 1).await;
    let all: Vec<String> = (0..HELD).map(|i| format!("snap/{i:06}")).collect();
    for chunk in all.chunks(1000) {
        let items: Vec<(&str, &[u8])> = chunk.iter().map(|k| (k.as_str(), &b"v"[..])).collect();
        for r in c.batch_put(&items).await.unwrap() {
            r.unwrap();
        }
    }
    let mut s = c.watch_blocks().await.unwrap();
    // puts and removals race the snapshot's pages
    let writer = {
        let c = c.clone();
        tokio::spawn(async move {
            for i in 0..200 {
                c.put(&format!("late/{i}"), Bytes::from_static(b"w")).await.unwrap();
                assert!(c.remove(&format!("snap/{:06}", i * 7)).await.unwrap());
            }
        })
    };
    let mut view = std::collections::BTreeSet::new();
    let mut snapshot_events = 0;
    let mut live = 0;
    // 200 puts and 200 removals follow the snapshot as live events (some may be in it already)
    while live < 400 {
        let e = next(&mut s).await;
        let (kind, ks) = keys(&e);
        if e.snapshot {
            snapshot_events += 1;
        } else {
            live += 1;
        }
        match kind {
            "cleared" => view.clear(),
            "stored" => view.extend(ks),
            "removed" => {
                for k in ks {
                    view.remove(&k);
                }
            }
            other => panic!("unexpected {other}"),
        }
    }
    writer.await.unwrap();
    let want: std::collections::BTreeSet<String> = all
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 7 != 0 || *i / 7 >= 200)
        .map(|(_, k)| k.clone())
        .chain((0..200).map(|i| format!("late/{i}")))
        .collect();
    assert_eq!(view.len(), want.len());
    assert!(view == want, "the view is what the tenant holds");
    assert!(snapshot_events > HELD / 512, "{snapshot_events} snapshot events");
}
