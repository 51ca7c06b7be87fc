//! A backend with a disk tier, end to end through the API server: the walkthrough's backend with
//! 16Mi of memory per member and a 128Mi tier under each (`localDisks`), its pool and Binding; a
//! working set four times the memory written and read back byte-exact through the Binding's
//! credential, the leader reporting the split between memory and disk (and `status.capacity`
//! counting the tiers); a member `kill -9`, restarted by the runtime, then a leader `kill -9`,
//! after each of which at least 99% of the values are read back byte-exact within 10 s of the
//! store being back; bytes flipped in the tiers' files are misses, counted, never returned; and
//! deleting the backend (`cleanAfterDelete`) empties its tiers.

// Helpers outside #[test] fns state expectations with unwrap too (see clippy.toml).
#![allow(clippy::unwrap_used)]

mod support;

use std::time::{Duration, Instant};

use kvcache_store::client::Client;
use kvcache_store::proto::{GetTenantsRequest, Scope, TenantStatus};
use support::walkthrough::*;
use support::{Kubectl, Server, eventually, eventually_async, random_bytes};

const KUBECTL: &str = "1.33";
const LEN: usize = 256 << 10;
/// The leader's `--lease-ttl` (below).
const LEASE_TTL: Duration = Duration::from_millis(500);
/// Two members of 16Mi: the working set is four times that.
const VALUES: usize = 4 * 32 * (1 << 20) / LEN;

const TIER: &str = "          capacityPerMember: 16Mi\n          localDisks:\n            - path: /mnt/nvme/kvcache\n              capacity: 128Mi\n              cleanAfterDelete: true\n";

/// The walkthrough's backend with a tier under its members, and read leases of 500 ms: a read
/// holds its value in memory only while it reads it (the default 10 s would keep every value
/// read in the last 10 s in memory, so a reader going through four times memory in a row would
/// find no room to load the rest: store/README.md, "Disk tier").
fn backend() -> String {
    let m = manifest("01-backend.yaml");
    let tiered = m.replace("          capacityPerMember: 1Gi\n", TIER).replace(
        "      leader: {}\n",
        &format!(
            "      leader:\n        extraArgs: [\"--lease-ttl={}ms\"]\n",
            LEASE_TTL.as_millis()
        ),
    );
    assert_eq!(
        tiered.matches("localDisks").count() + tiered.matches("lease-ttl").count(),
        2
    );
    tiered
}

/// A key's bytes, derived from it (FNV-1a of the key as the seed).
fn value_of(key: &str) -> Vec<u8> {
    let seed = key.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    random_bytes(seed, LEN)
}

fn key(i: usize) -> String {
    format!("block/{i:05}")
}

/// A client of the Binding's tenant (its domain is named `default`), with its credential, over
/// the store's TLS.
async fn client(s: &Server, endpoint: &str) -> Client {
    try_client(s, endpoint).await.expect("connect")
}

/// [`client`], or why it cannot connect (a leader not serving yet).
async fn try_client(s: &Server, endpoint: &str) -> Result<Client, kvcache_store::error::StoreError> {
    let file = s.dir.path().join("tenant-credentials/team-a/team-a.json");
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).expect("the credential file")).unwrap();
    let scope = Scope {
        tenant: "default".into(),
        block_size: 64,
        dtype: "bfloat16".into(),
        credential: v["current"].as_str().expect("a credential").into(),
        ..Default::default()
    };
    let tls = kvcache_store::tls::ClientTls::load(
        &s.dir.path().join("store-tls/ca.crt"),
        Some("mooncake-dram.kvstore.internal".into()),
    )
    .expect("the store's CA");
    Client::connect_tls(endpoint, scope, Some(tls)).await
}

/// The tenant as the leader reports it, read with the controllers' token.
async fn tenant(s: &Server, endpoint: &str) -> TenantStatus {
    let token = std::fs::read_to_string(s.dir.path().join("store-tokens/control-mooncake-dram.token")).unwrap();
    let c = client(s, endpoint).await;
    let mut ask = tonic::Request::new(GetTenantsRequest {});
    kvcache_store::auth::attach(&mut ask, token.trim()).unwrap();
    let t = c.control().get_tenants(ask).await.expect("get tenants").into_inner();
    t.tenants.into_iter().find(|t| t.name == "default").expect("the tenant")
}

/// Reads every value, 16 to a batch (a batch's values on disk are loaded together): (exact,
/// misses); a wrong byte fails the test. A value a batch did not bring back is read alone: a
/// read that fails (on a busy machine one may outlast its 500 ms lease, and a leader may be
/// failing over) is tried again, up to five times, and a miss until it reads back or two lease
/// TTLs have passed (at this pace the values read in the last 500 ms fill memory, and a load
/// finds no room until their leases end; or the member had not applied the load within the
/// leader's wait), before it counts as a miss. Where misses are expected (`expect_misses`: damaged copies),
/// a miss is not tried again.
async fn read_all(c: &Client, expect_misses: bool) -> (usize, usize) {
    let (mut exact, mut misses) = (0, 0);
    for batch in (0..VALUES).collect::<Vec<_>>().chunks(16) {
        let keys: Vec<String> = batch.iter().map(|&i| key(i)).collect();
        let mut bufs = vec![vec![0u8; LEN]; keys.len()];
        let mut items: Vec<(&str, &mut [u8])> = keys
            .iter()
            .zip(bufs.iter_mut())
            .map(|(k, b)| (k.as_str(), &mut b[..]))
            .collect();
        let got = c.batch_get_into(&mut items).await;
        for (i, k) in keys.iter().enumerate() {
            let whole = match &got {
                Ok(r) => matches!(r[i], Ok(Some(LEN))),
                Err(_) => false,
            };
            if whole {
                assert!(bufs[i][..] == value_of(k)[..], "{k}: other bytes");
                exact += 1;
            } else if read_one(c, k, expect_misses).await {
                exact += 1;
            } else {
                misses += 1;
            }
        }
    }
    (exact, misses)
}

/// Reads one value, trying again as [`read_all`] says: whether it came back (a wrong byte fails
/// the test).
async fn read_one(c: &Client, k: &str, expect_misses: bool) -> bool {
    let mut got = c.get(k).await;
    for _ in 0..5 {
        if got.is_ok() {
            break;
        }
        got = c.get(k).await;
    }
    // a miss: the value is there once the leases that fill memory have ended (one lease TTL),
    // or once the member has applied its load
    let until = Instant::now() + 2 * LEASE_TTL;
    while matches!(got, Ok(None)) && !expect_misses && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(50)).await;
        got = c.get(k).await;
    }
    match got {
        Ok(Some(got)) => {
            assert!(got[..] == value_of(k)[..], "{k}: other bytes");
            true
        }
        Ok(None) | Err(_) => false,
    }
}

/// Reads everything, round after round, until a round brings at least 99% back or 10 s from
/// `since` have passed: that round's (exact, misses), and when it ended.
async fn back_within_10s(s: &Server, endpoint: &str, since: Instant) -> (usize, usize, Duration) {
    loop {
        let c = client(s, endpoint).await;
        let (exact, misses) = read_all(&c, false).await;
        eprintln!("  {exact} exact, {misses} misses, {:.1?} in", since.elapsed());
        if exact * 100 >= VALUES * 99 || since.elapsed() > Duration::from_secs(10) {
            return (exact, misses, since.elapsed());
        }
    }
}

fn kill9(pid: u32) {
    assert!(
        std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()
            .unwrap()
            .success()
    );
}

fn store_back(k: &Kubectl) -> Instant {
    eventually(60, "both members mounted again", || {
        condition(k, KVCB, "MembersMounted").starts_with("True|").then_some(())
    });
    Instant::now()
}

#[test]
fn a_backend_with_a_disk_tier_holds_four_times_its_memory_across_restarts() {
    let s = Server::start_with(&["--requeue-interval", "2s"]);
    let k = s.kubectl(KUBECTL);
    k.must_apply(&backend());
    k.must_apply(&manifest("02-pool-binding.yaml"));
    // memory and the tiers' ceiling together: 2 x (16Mi + 128Mi)
    wait_ready_backend(&k, "288Mi");
    let observed = condition(&k, KVCB, "CapacityObserved");
    assert!(observed.contains("disk tiers: 256Mi of capacity"), "{observed}");
    // the tiers were new: decided once, Empty
    eventually(60, "TierWasEmpty decided", || {
        condition(&k, KVCB, "TierWasEmpty")
            .starts_with("True|Empty|")
            .then_some(())
    });
    eventually(60, "the Binding granted", || {
        condition(&k, KVCPB, "QuotaGranted").starts_with("True|").then_some(())
    });
    let endpoint = format!("127.0.0.1:{}", leader_port(&k));
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let c = client(&s, &endpoint).await;
        let started = Instant::now();
        for batch in 0..VALUES / 16 {
            for i in batch * 16..(batch + 1) * 16 {
                let k = key(i);
                c.put(&k, bytes::Bytes::from(value_of(&k))).await.expect("a put");
            }
            // each batch on disk before the next: eviction then keeps what it takes from memory
            let on_disk = ((batch + 1) * 16 * LEN) as u64;
            eventually_async(
                Duration::from_secs(30),
                &format!("batch {batch} on the disk tiers"),
                || async { tenant(&s, &endpoint).await.disk_used >= on_disk },
            )
            .await;
        }
        let wrote = started.elapsed();
        let t = tenant(&s, &endpoint).await;
        assert_eq!(t.objects as usize, VALUES, "{t:?}");
        assert!(t.on_disk_only as usize >= VALUES / 2, "{t:?}");
        assert_eq!(t.disk_used, (VALUES * LEN) as u64);
        let started = Instant::now();
        let (exact, misses) = read_all(&c, false).await;
        assert_eq!((exact, misses), (VALUES, 0), "{:?}", tenant(&s, &endpoint).await);
        eprintln!(
            "{VALUES} values of 256 KiB (4x the members' memory) written in {wrote:.1?}, read back exact in {:.1?}",
            started.elapsed()
        );
    });

    // a member killed: the runtime starts it again, its tier is found and handed over
    let port = leader_port(&k);
    let member = store_processes(&s, &port)
        .into_iter()
        .find(|(_, c)| c.contains(" member ") && c.contains("mooncake-dram-member-0-local-1"))
        .expect("the member on local-1");
    kill9(member.0);
    eventually(60, "the member's loss seen", || {
        condition(&k, KVCB, "MembersMounted")
            .starts_with("False|")
            .then_some(())
    });
    let back = store_back(&k);
    let (exact, misses, took) = rt.block_on(back_within_10s(&s, &endpoint, back));
    eprintln!("member killed: {exact} of {VALUES} read back exact {took:.1?} after it was back ({misses} misses)");
    assert!(
        exact * 100 >= VALUES * 99 && took <= Duration::from_secs(10),
        "{exact} of {VALUES} in {took:.1?}"
    );

    // the leader killed: the runtime starts it again, it adopts memory and tiers
    let leader = store_processes(&s, &port)
        .into_iter()
        .find(|(_, c)| c.contains(" leader "))
        .expect("the leader");
    kill9(leader.0);
    let killed = Instant::now();
    let endpoint = format!("127.0.0.1:{}", leader_port(&k));
    rt.block_on(eventually_async(
        Duration::from_secs(60),
        "a leader serves again",
        || async {
            match try_client(&s, &endpoint).await {
                Ok(c) => c.get("nothing").await.is_ok(),
                Err(_) => false,
            }
        },
    ));
    let back = Instant::now();
    let (exact, misses, took) = rt.block_on(back_within_10s(&s, &endpoint, back));
    eprintln!(
        "leader killed: serving again after {:.1?}, {exact} of {VALUES} read back exact {took:.1?} after that ({misses} misses)",
        back - killed
    );
    assert!(
        exact * 100 >= VALUES * 99 && took <= Duration::from_secs(10),
        "{exact} of {VALUES} in {took:.1?}"
    );

    // bytes flipped in the tiers' files behind the members' backs: misses, counted
    let tiers = s.dir.path().join("tiers/mooncake-dram");
    let mut flipped = 0;
    for member in std::fs::read_dir(&tiers).expect("the tiers under the data directory") {
        for f in std::fs::read_dir(member.unwrap().path()).unwrap() {
            let path = f.unwrap().path();
            if path.extension().and_then(|e| e.to_str()) != Some("kvt") {
                continue;
            }
            let mut b = std::fs::read(&path).unwrap();
            let mut at = 8192;
            while at < b.len() {
                b[at] ^= 0x5a;
                flipped += 1;
                at += 1 << 20;
            }
            std::fs::write(&path, &b).unwrap();
        }
    }
    assert!(flipped > 8, "{flipped} bytes flipped");
    rt.block_on(async {
        let c = client(&s, &endpoint).await;
        let (exact, misses) = read_all(&c, true).await;
        // the member tells the leader of each damaged copy in its next heartbeat
        let until = Instant::now() + Duration::from_secs(10);
        let mut t = tenant(&s, &endpoint).await;
        while t.load_failures == 0 && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(50)).await;
            t = tenant(&s, &endpoint).await;
        }
        eprintln!(
            "{flipped} bytes flipped: {exact} exact, {misses} misses, {} load failures",
            t.load_failures
        );
        assert!(misses > 0 && t.load_failures > 0, "{misses} misses, {t:?}");
    });

    // deleted with cleanAfterDelete: its tiers go with it
    k.ok(&["delete", "kvcpb", "-n", "team-a", "team-a"]);
    k.ok(&["delete", "kvcp", "shared-dram"]);
    k.ok(&["delete", "kvcb", "mooncake-dram"]);
    eventually(60, "the tiers emptied", || (!tiers.exists()).then_some(()));
}
