//! A failover keeps the cache, and never at the price of a wrong byte, against the real binary:
//! a leader SIGKILLed in the middle of batches of puts, twenty times, then killed while a
//! tenant's credential is being rotated, twenty times; each time the restarted leader adopts what
//! the members hold, every value acknowledged and sealed (its seal reaches the member with the
//! next heartbeat answer) before the kill hits with exactly its bytes, and every other read is a
//! miss or exactly its key's bytes. And a writer that names its bytes as
//! another tenant's value (or another key) is refused before a byte lands, so nothing forged is
//! ever handed over; and what the leader removed or evicted before it failed stays gone. A member
//! whose report takes many pages hands over every value.

// Helpers outside #[test] fns state expectations with unwrap too (see clippy.toml).
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use kvcache_store::client::Client;
use kvcache_store::error::ErrorCode;
use kvcache_store::proto::{PutStartRequest, SetTenantsRequest, TenantEntry, store_client::StoreClient};
use kvcache_store::wire;
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The bytes `key` holds: derived from the key, so any read can be checked on its own.
fn value_of(key: &str, len: usize) -> Vec<u8> {
    random_bytes(xxhash_rust::xxh3::xxh3_64(key.as_bytes()), len)
}

/// Reads every key: acknowledged ones must hit with their bytes; the rest miss or hit with theirs.
async fn check(c: &Client, acknowledged: &[String], maybe: &[String], len: usize, round: usize) -> usize {
    for k in acknowledged {
        let got = c.get(k).await.unwrap();
        let got = got.unwrap_or_else(|| panic!("round {round}: {k} was acknowledged before the kill and misses"));
        assert!(got[..] == value_of(k, len)[..], "round {round}: {k} holds other bytes");
    }
    let mut hits = 0;
    for k in maybe {
        if let Some(got) = c.get(k).await.unwrap() {
            assert!(got[..] == value_of(k, len)[..], "round {round}: {k} holds other bytes");
            hits += 1;
        }
    }
    hits
}

/// Holds a [`writer`] between batches while on; `idle` says it stopped.
#[derive(Clone)]
struct Pause {
    on: Arc<tokio::sync::watch::Sender<bool>>,
    idle: Arc<tokio::sync::watch::Sender<bool>>,
}

impl Pause {
    fn new() -> Pause {
        Pause {
            on: Arc::new(tokio::sync::watch::Sender::new(false)),
            idle: Arc::new(tokio::sync::watch::Sender::new(false)),
        }
    }

    /// Stops the writer after its batch in flight; returns once it waits.
    async fn hold(&self) {
        self.on.send_replace(true);
        let _ = self.idle.subscribe().wait_for(|i| *i).await;
    }

    fn release(&self) {
        self.on.send_replace(false);
    }

    /// Waits while the writer is held; whether it was.
    async fn wait_while_held(&self) -> bool {
        if !*self.on.borrow() {
            return false;
        }
        self.idle.send_replace(true);
        let _ = self.on.subscribe().wait_for(|on| !on).await;
        self.idle.send_replace(false);
        true
    }
}

/// Holds the writer, waits until every value acknowledged so far is sealed at the members, and
/// lets it go on: what it acknowledged until then must survive the kill.
async fn settle(c: &Client, members: &[&Proc], pause: &Pause, acked: &Mutex<Vec<String>>) -> Vec<String> {
    pause.hold().await;
    wait_sealed(c, members).await;
    let settled = acked.lock().clone();
    pause.release();
    settled
}

/// The most batches a writer puts between holds: however fast the build, twenty rounds of them
/// fit the members (at most 128 values a round: 40 MiB of 16 KiB values against a 128 MiB
/// member, 160 MiB of 64 KiB values against two of 160 MiB), so nothing acknowledged is evicted.
const BATCHES_BETWEEN_HOLDS: usize = 8;

/// Writes batches of 8 values until the leader goes away ([`BATCHES_BETWEEN_HOLDS`] at most
/// between holds, then only checking that the leader answers); records what each batch
/// acknowledged and the batch in flight.
fn writer(
    c: Client,
    round: usize,
    len: usize,
    acked: Arc<Mutex<Vec<String>>>,
    in_flight: Arc<Mutex<Vec<String>>>,
    pause: Pause,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut run = 0;
        for batch in 0.. {
            if pause.wait_while_held().await {
                run = 0;
            }
            if run == BATCHES_BETWEEN_HOLDS {
                if c.exists("no-such-key").await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
            run += 1;
            let keys: Vec<String> = (0..8).map(|i| format!("r{round}/b{batch}/{i}")).collect();
            let values: Vec<Vec<u8>> = keys.iter().map(|k| value_of(k, len)).collect();
            *in_flight.lock() = keys.clone();
            let items: Vec<(&str, &[u8])> = keys
                .iter()
                .map(String::as_str)
                .zip(values.iter().map(Vec::as_slice))
                .collect();
            match c.batch_put(&items).await {
                Ok(results) => {
                    let mut acked = acked.lock();
                    for (k, r) in keys.iter().zip(results) {
                        if r.is_ok() {
                            acked.push(k.clone());
                        }
                    }
                }
                Err(_) => return,
            }
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_killed_in_the_middle_of_batches_hands_over_every_whole_value_and_nothing_else() {
    let flags = [
        "--tenant",
        "t=512Mi:64:bfloat16",
        "--member-ttl",
        "2s",
        "--fast-listen",
        "127.0.0.1:0",
    ];
    let mut l = leader(&flags);
    let addr = l.field("grpc");
    let m1 = member(&addr, "m1", "160Mi");
    let m2 = member(&addr, "m2", "160Mi");
    let len = 64 << 10;
    let mut every_acked: Vec<String> = Vec::new();
    let mut every_maybe: Vec<String> = Vec::new();
    let mut in_flight_hits = 0;
    for round in 0..20 {
        let c = client(&addr, "t").await;
        wait_members(&c, 2).await;
        let acked = Arc::new(Mutex::new(Vec::new()));
        let in_flight = Arc::new(Mutex::new(Vec::new()));
        let pause = Pause::new();
        let w = writer(c.clone(), round, len, acked.clone(), in_flight.clone(), pause.clone());
        // a few batches in, sealed; then more, and the kill lands at some point of the next one
        eventually("batches are acknowledged", || async {
            acked.lock().len() >= 8 * (2 + round % 3)
        })
        .await;
        let settled = settle(&c, &[&m1, &m2], &pause, &acked).await;
        eventually("more batches are acknowledged", || async {
            acked.lock().len() >= settled.len() + 8
        })
        .await;
        tokio::time::sleep(Duration::from_micros(500 * (round as u64 % 7))).await;
        l.kill();
        let _ = tokio::time::timeout(Duration::from_secs(30), w)
            .await
            .expect("the writer stops");
        l = leader_at(&addr, &flags);
        // acknowledged since the settling, or in flight: a miss, or its own bytes
        let maybe: Vec<String> = acked
            .lock()
            .iter()
            .chain(in_flight.lock().iter())
            .filter(|k| !settled.contains(k))
            .cloned()
            .collect();
        let acked = settled;
        let c = client(&addr, "t").await;
        wait_members(&c, 2).await;
        // this round's values, and every earlier round's (handed over again and again)
        in_flight_hits += check(&c, &acked, &maybe, len, round).await;
        check(&c, &every_acked, &every_maybe, len, round).await;
        every_acked.extend(acked);
        every_maybe.extend(maybe);
    }
    let t = tenant(&client(&addr, "t").await, "t").await;
    assert!(t.objects as usize >= every_acked.len(), "{} objects", t.objects);
    eprintln!(
        "20 kills: {} values sealed before the kills, all adopted; {in_flight_hits} of {} acknowledged since or in flight adopted whole",
        every_acked.len(),
        every_maybe.len()
    );
}

fn entry(name: &str, credentials: &[&str]) -> TenantEntry {
    TenantEntry {
        name: name.into(),
        ceiling: 256 << 20,
        block_size: 64,
        dtype: "bfloat16".into(),
        credential_sha256: credentials
            .iter()
            .map(|c| kvcache_store::leader::ledger::credential_hash(c).to_vec().into())
            .collect(),
        ..Default::default()
    }
}

async fn set_ledger(addr: &str, credentials: &[&str]) {
    let c = client(addr, "nobody").await;
    c.control()
        .set_tenants(SetTenantsRequest {
            tenants: vec![entry("t", credentials)],
            pools: vec![],
        })
        .await
        .unwrap();
}

async fn client_as(addr: &str, credential: &str) -> Client {
    let scope = kvcache_store::proto::Scope {
        credential: credential.into(),
        ..scope("t")
    };
    Client::connect(addr, scope).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_during_a_credential_rotation_serves_only_misses_or_exact_bytes() {
    // no --tenant: the ledger comes from SetTenants, as the controllers send it
    let flags = ["--member-ttl", "2s", "--fast-listen", "127.0.0.1:0"];
    let mut l = leader(&flags);
    let addr = l.field("grpc");
    let m1 = member(&addr, "m1", "128Mi");
    set_ledger(&addr, &["cred-0"]).await;
    let len = 16 << 10;
    let mut every_acked: Vec<String> = Vec::new();
    for round in 0..20 {
        let (old, new) = (format!("cred-{round}"), format!("cred-{}", round + 1));
        let c = client_as(&addr, &old).await;
        wait_members(&c, 1).await;
        // written under the old credential
        let mut acked = Vec::new();
        for i in 0..4 {
            let k = format!("r{round}/old/{i}");
            c.put(&k, Bytes::from(value_of(&k, len))).await.unwrap();
            acked.push(k);
        }
        // the rotation starts: both credentials are good; a writer moves to the new one
        set_ledger(&addr, &[&old, &new]).await;
        let c = client_as(&addr, &new).await;
        let acked_new = Arc::new(Mutex::new(Vec::new()));
        let in_flight = Arc::new(Mutex::new(Vec::new()));
        let pause = Pause::new();
        let w = writer(
            c.clone(),
            round,
            len,
            acked_new.clone(),
            in_flight.clone(),
            pause.clone(),
        );
        eventually("batches under the new credential", || async {
            !acked_new.lock().is_empty()
        })
        .await;
        let settled = settle(&c, &[&m1], &pause, &acked_new).await;
        eventually("more batches under the new credential", || async {
            acked_new.lock().len() > settled.len()
        })
        .await;
        l.kill();
        let _ = tokio::time::timeout(Duration::from_secs(30), w)
            .await
            .expect("the writer stops");
        l = leader_at(&addr, &flags);
        // the new leader waits for the ledger before it adopts; the rotation ends meanwhile
        tokio::time::sleep(Duration::from_millis(50 * (round as u64 % 5))).await;
        set_ledger(&addr, &[&new]).await;
        acked.extend(settled.iter().cloned());
        let maybe: Vec<String> = acked_new
            .lock()
            .iter()
            .chain(in_flight.lock().iter())
            .filter(|k| !acked.contains(k))
            .cloned()
            .collect();
        let c = client_as(&addr, &new).await;
        wait_members(&c, 1).await;
        check(&c, &acked, &maybe, len, round).await;
        check(&c, &every_acked, &[], len, round).await;
        every_acked.extend(acked);
        // the rotated-out credential reads nothing
        let stale = client_as(&addr, &old).await;
        assert_eq!(
            stale.get(&every_acked[0]).await.unwrap_err().code,
            ErrorCode::Unauthenticated
        );
    }
}

/// Sends a write on the data port with `tag` in place of the Location's; returns the refusal.
async fn write_with_tag(
    loc: &kvcache_store::proto::Location,
    deadline: u64,
    tag: &[u8],
    len: u64,
) -> Option<ErrorCode> {
    let mut s = tokio::net::TcpStream::connect(&loc.data_addr).await.unwrap();
    let head = wire::Request::granted(wire::Op::Write, loc, len, deadline, tag.len() as u16);
    s.write_all(&head.encode()).await.unwrap();
    s.write_all(tag).await.unwrap();
    s.write_all(&vec![0xee; len as usize]).await.unwrap();
    let mut resp = [0u8; wire::RESPONSE_LEN];
    s.read_exact(&mut resp).await.unwrap();
    let resp = wire::Response::decode(&resp).unwrap();
    if resp.ok {
        return None;
    }
    let mut msg = vec![0u8; resp.len as usize];
    s.read_exact(&mut msg).await.unwrap();
    Some(wire::refusal(&msg).code)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_a_writer_names_as_another_tenants_is_never_written_nor_handed_over() {
    let flags = [
        "--tenant",
        "a=64Mi:64:bfloat16",
        "--tenant",
        "b=64Mi:64:bfloat16",
        "--fast-listen",
        "127.0.0.1:0",
    ];
    let mut l = leader(&flags);
    let addr = l.field("grpc");
    let m = member(&addr, "m1", "32Mi");
    let a = client(&addr, "a").await;
    let b = client(&addr, "b").await;
    wait_members(&a, 1).await;
    b.put("victim", Bytes::from(value_of("victim", 4096))).await.unwrap();
    wait_sealed(&b, &[&m]).await;
    // A reserves a key of its own and tries to land the write as B's "victim", or as another key
    // of its own, or with no tag at all: the member refuses each before a byte is written
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let ours = kvcache_store::protocol::SendVersion(kvcache_store::protocol::ClientVersion::ours("adoption-test"));
    let mut raw = StoreClient::with_interceptor(channel, ours);
    let reserved = raw
        .put_start(PutStartRequest {
            scope: Some(scope("a")),
            key: "mine".into(),
            size: 4096,
        })
        .await
        .unwrap()
        .into_inner();
    let loc = reserved.location.unwrap();
    let deadline = reserved.write_deadline_unix_ms;
    let ours_tag = kvcache_store::grant::Tag::decode(&loc.tag).expect("the leader's tag");
    assert_eq!((ours_tag.tenant.as_str(), ours_tag.key.as_str()), ("a", "mine"));
    let forged = |tenant: &str, key: &str| {
        kvcache_store::grant::Tag {
            tenant: tenant.into(),
            key: key.into(),
            ..ours_tag.clone()
        }
        .encode()
    };
    for (what, tag) in [
        ("B's key", forged("b", "victim")),
        ("B's tenant, A's key", forged("b", "mine")),
        ("another key of A's", forged("a", "other")),
        ("no tag", Vec::new()),
    ] {
        assert_eq!(
            write_with_tag(&loc, deadline, &tag, 4096).await,
            Some(ErrorCode::Unauthenticated),
            "{what}"
        );
    }
    // the grant's own tag is taken
    assert_eq!(write_with_tag(&loc, deadline, &loc.tag, 4096).await, None);
    l.kill();
    let _l2 = leader_at(&addr, &flags);
    let a = client(&addr, "a").await;
    let b = client(&addr, "b").await;
    wait_members(&a, 1).await;
    // B's value is B's own bytes; nothing A wrote became B's or another key of A's
    assert_eq!(
        b.get("victim").await.unwrap().unwrap()[..],
        value_of("victim", 4096)[..]
    );
    assert_eq!(a.get("other").await.unwrap(), None);
    assert_eq!(b.get("mine").await.unwrap(), None);
    // A's write finished but was never committed: the leader never sealed it, so it is not handed
    // over (finding 9 of the second review)
    assert_eq!(a.get("mine").await.unwrap(), None);
}

/// What the leader removed or evicted is not handed to the next one: its heartbeat answers told
/// the member to stop holding it (the member's gauge shows it), so after a restart those keys
/// miss and every other one hits with its bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_leader_removed_or_evicted_before_a_restart_stays_gone() {
    let flags = ["--tenant", "t=1Mi:64:bfloat16"];
    let mut l = leader(&flags);
    let addr = l.field("grpc");
    let m = member_with(&addr, "m1", "8Mi", &["--metrics-listen", "127.0.0.1:0"]);
    let metrics = m.field("metrics");
    let c = client(&addr, "t").await;
    wait_members(&c, 1).await;
    let len = 200 << 10;
    let keys: Vec<String> = (0..6).map(|i| format!("v{i}")).collect();
    for k in &keys {
        c.put(k, Bytes::from(value_of(k, len))).await.unwrap();
    }
    // the newest is removed (asking whether a key exists leases it, so before anything is asked),
    // and six values of 200 KiB in a 1 MiB grant: the oldest were evicted
    let removed = keys[5].clone();
    assert!(c.remove(&removed).await.unwrap());
    let mut kept = Vec::new();
    for k in &keys {
        if c.exists(k).await.unwrap() {
            kept.push(k.clone());
        }
    }
    assert!(kept.len() < keys.len() - 1, "nothing was evicted");
    eventually("the member holds only what the leader kept", || async {
        gauge(&metrics, "kvstore_member_handover_values").await == kept.len() as u64
    })
    .await;
    assert_eq!(
        gauge(&metrics, "kvstore_member_handover_bytes").await,
        (kept.len() * len) as u64
    );
    l.kill();
    let _l = leader_at(&addr, &flags);
    let c = client(&addr, "t").await;
    wait_members(&c, 1).await;
    for k in &keys {
        match c.get(k).await.unwrap() {
            Some(got) => {
                assert!(kept.contains(k), "{k} was freed before the restart and came back");
                assert!(got[..] == value_of(k, len)[..], "{k} holds other bytes");
            }
            None => assert!(!kept.contains(k), "{k} was kept and misses after the restart"),
        }
    }
}

/// Finding 9 of the second review: a removal is answered once the member applied it, so a leader
/// killed the moment a removal was answered, twenty times over, never hands the removed value to
/// the next term; the values committed beside it are sealed within a round trip and all come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_removed_just_before_a_kill_stays_gone() {
    let flags = ["--tenant", "t=64Mi:64:bfloat16", "--fast-listen", "127.0.0.1:0"];
    let mut l = leader(&flags);
    let addr = l.field("grpc");
    let m = member(&addr, "m1", "64Mi");
    let len = 64 << 10;
    for round in 0..20 {
        let c = client(&addr, "t").await;
        wait_members(&c, 1).await;
        let keep = format!("r{round}/kept");
        let gone = format!("r{round}/removed");
        c.put(&keep, Bytes::from(value_of(&keep, len))).await.unwrap();
        c.put(&gone, Bytes::from(value_of(&gone, len))).await.unwrap();
        // the removed value's seal reached the member: only the removal can keep it out
        wait_sealed(&c, &[&m]).await;
        assert!(c.remove(&gone).await.unwrap());
        l.kill();
        l = leader_at(&addr, &flags);
        let c = client(&addr, "t").await;
        wait_members(&c, 1).await;
        eventually("the kept value is handed over", || async {
            c.get(&keep).await.ok().flatten().is_some()
        })
        .await;
        assert_eq!(
            c.get(&gone).await.unwrap(),
            None,
            "round {round}: the removed value came back"
        );
    }
}

/// A member that holds more values than one page of its report carries (about 7,000 here)
/// hands every one of them to the next term, page after page: all adopted, all read back exact.
/// (A report used to be one message, cut at 48 MiB, whose answer a member could not even read
/// past about 100,000 values.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_of_many_pages_is_adopted_whole() {
    const VALUES: usize = 70_000;
    let flags = ["--tenant", "t=256Mi:64:bfloat16"];
    let mut l = leader(&flags);
    let addr = l.field("grpc");
    let m = member(&addr, "m1", "64Mi");
    let c = client(&addr, "t").await;
    wait_members(&c, 1).await;
    let keys: Vec<String> = (0..VALUES).map(|i| format!("paged/{i:08}")).collect();
    let values: Vec<Vec<u8>> = keys.iter().map(|k| value_of(k, 64)).collect();
    for (keys, values) in keys.chunks(1000).zip(values.chunks(1000)) {
        let items: Vec<(&str, &[u8])> = keys
            .iter()
            .map(String::as_str)
            .zip(values.iter().map(Vec::as_slice))
            .collect();
        for r in c.batch_put(&items).await.unwrap() {
            r.unwrap();
        }
    }
    wait_sealed(&c, &[&m]).await;
    l.kill();
    let _l = leader_at(&addr, &flags);
    let c = client(&addr, "t").await;
    eventually("every value adopted", || async {
        c.control()
            .health(kvcache_store::proto::HealthRequest {})
            .await
            .is_ok_and(|h| h.into_inner().adopted_objects == VALUES as u64)
    })
    .await;
    for (keys, values) in keys.chunks(1000).zip(values.chunks(1000)) {
        let mut bufs = vec![vec![0u8; 64]; keys.len()];
        let mut items: Vec<(&str, &mut [u8])> = keys
            .iter()
            .map(String::as_str)
            .zip(bufs.iter_mut().map(Vec::as_mut_slice))
            .collect();
        let got = c.batch_get_into(&mut items).await.unwrap();
        for ((k, r), (b, want)) in keys.iter().zip(got).zip(bufs.iter().zip(values)) {
            assert_eq!(r.unwrap(), Some(64), "{k} misses after the restart");
            assert!(b == want, "{k} holds other bytes");
        }
    }
}
