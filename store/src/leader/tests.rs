//! The leader's tables without processes: time is passed in, so leases, reservations, liveness
//! and eviction are checked at exact instants.

use std::time::{Duration, Instant};

use super::state::State;
use super::{AllocationStrategy, LeaderConfig};
use crate::error::ErrorCode;
use crate::proto::{HeartbeatRequest, MountRequest, Scope, TenantEntry};

pub(super) const MIB: u64 = 1 << 20;
/// Room in a ceiling for what the leader charges per object besides its bytes (its key and
/// overhead, `objects::charge`), for the few short-keyed objects a test puts.
const SLACK: u64 = 16 * super::objects::OBJECT_OVERHEAD;

pub(super) fn scope(t: &str) -> Scope {
    Scope {
        tenant: t.into(),
        block_size: 64,
        dtype: "bf16".into(),
        ..Default::default()
    }
}

pub(super) fn entry(t: &str, ceiling: u64) -> TenantEntry {
    TenantEntry {
        name: t.into(),
        ceiling,
        block_size: 64,
        dtype: "bf16".into(),
        ..Default::default()
    }
}

pub(super) fn mount_req(name: &str, capacity: u64, instance_id: u64) -> MountRequest {
    MountRequest {
        name: name.into(),
        data_addr: format!("{name}:1"),
        grpc_addr: format!("{name}:2"),
        capacity,
        mount_id: 0,
        instance_id,
        local_addr: String::new(),
        holdings: Vec::new(),
        handover: crate::protocol::HANDOVER,
        ..Default::default()
    }
}

/// Mounts as a fresh process (its own instance id).
pub(super) fn mount(s: &mut State, name: &str, capacity: u64, now: Instant) -> u64 {
    let instance = uuid::Uuid::new_v4().as_u64_pair().0 | 1;
    s.mount(&mount_req(name, capacity, instance), now).unwrap().member_id
}

pub(super) fn hb(member_id: u64, mount_id: u64) -> HeartbeatRequest {
    HeartbeatRequest {
        member_id,
        mount_id,
        ..Default::default()
    }
}

/// A heartbeat of a member that applied every answer before this one: its answer carries what
/// the member has not been sent.
pub(super) fn told(s: &mut State, req: &HeartbeatRequest, now: Instant) -> crate::proto::HeartbeatResponse {
    let sent = s.members.get(&req.member_id).map_or(0, |m| m.notices.sent());
    let req = HeartbeatRequest {
        applied_through: req.applied_through.max(sent),
        ..req.clone()
    };
    s.answer_heartbeat(&req, now)
}

pub(super) fn state(cfg: LeaderConfig) -> (State, Instant) {
    (
        State::new(cfg, std::sync::Arc::new(crate::grant::SealKey::generate())),
        Instant::now(),
    )
}

/// A leader that reclaims an abandoned reservation 2 s after it was made (1 s TTL, 1 s grace).
fn reaped_after_2s() -> LeaderConfig {
    LeaderConfig {
        put_ttl: Duration::from_secs(1),
        put_grace: Duration::from_secs(1),
        ..Default::default()
    }
}

/// Reserves and commits `key`.
pub(super) fn put(s: &mut State, t: &str, key: &str, size: u64, now: Instant) -> Result<(), ErrorCode> {
    let r = s.put_start(Some(&scope(t)), key, size, now).map_err(|e| e.code)?;
    if !r.already_exists {
        s.put_commit(Some(&scope(t)), key, r.put_id).map_err(|e| e.code)?;
    }
    Ok(())
}

#[test]
fn reserved_values_are_invisible_until_committed_and_reaped_when_abandoned() {
    let (mut s, t0) = state(reaped_after_2s());
    s.set_tenants(&[entry("t", 8 * MIB)], &[]).unwrap();
    mount(&mut s, "m", 8 * MIB, t0);
    let r = s.put_start(Some(&scope("t")), "k", 100, t0).unwrap();
    assert!(!r.already_exists);
    assert!(!s.get(Some(&scope("t")), "k", t0).unwrap().found);
    assert!(!s.exists(Some(&scope("t")), "k", t0).unwrap());
    assert_eq!(
        s.remove(Some(&scope("t")), "k", t0).unwrap_err().code,
        ErrorCode::PutInProgress
    );
    assert_eq!(s.used(), 128);
    // a second writer of the same key does not get a second reservation
    assert!(s.put_start(Some(&scope("t")), "k", 100, t0).unwrap().already_exists);
    assert_eq!(s.reap_reservations(t0 + Duration::from_millis(1999)), 0);
    assert_eq!(s.reap_reservations(t0 + Duration::from_secs(2)), 1);
    assert_eq!(s.used(), 0);
    let e = s.put_commit(Some(&scope("t")), "k", r.put_id).unwrap_err();
    assert_eq!(e.code, ErrorCode::PutExpired);
}

#[test]
fn leases_protect_from_removal_and_eviction_until_they_end() {
    let cfg = LeaderConfig {
        read_lease_ttl: Duration::from_secs(10),
        ..Default::default()
    };
    let (mut s, t0) = state(cfg);
    s.set_tenants(&[entry("t", 2 * MIB + SLACK)], &[]).unwrap();
    mount(&mut s, "m", 8 * MIB, t0);
    put(&mut s, "t", "a", MIB, t0).unwrap();
    put(&mut s, "t", "b", MIB, t0).unwrap();
    assert!(s.get(Some(&scope("t")), "a", t0).unwrap().found);
    assert!(s.exists(Some(&scope("t")), "b", t0).unwrap());
    assert_eq!(
        s.remove(Some(&scope("t")), "a", t0).unwrap_err().code,
        ErrorCode::ObjectHasLease
    );
    // the grant is full and both are leased: nothing can make room
    assert_eq!(put(&mut s, "t", "c", MIB, t0), Err(ErrorCode::TenantQuotaExceeded));
    let later = t0 + Duration::from_secs(10);
    put(&mut s, "t", "c", MIB, later).unwrap();
    assert_eq!(s.tenant_statuses()[0].evictions, 1);
    assert!(s.remove(Some(&scope("t")), "c", later).unwrap());
}

#[test]
fn tenant_eviction_takes_the_least_recently_used_and_only_its_own() {
    let (mut s, t0) = state(LeaderConfig::default());
    s.set_tenants(&[entry("t", 3 * MIB + SLACK), entry("u", 3 * MIB + SLACK)], &[])
        .unwrap();
    mount(&mut s, "m", 16 * MIB, t0);
    put(&mut s, "u", "x", MIB, t0).unwrap();
    for k in ["a", "b", "c"] {
        put(&mut s, "t", k, MIB, t0).unwrap();
    }
    // touching "a" makes "b" the least recently used (the lease it takes has ended by `later`)
    assert!(s.get(Some(&scope("t")), "a", t0).unwrap().found);
    let later = t0 + Duration::from_secs(11);
    put(&mut s, "t", "d", MIB, later).unwrap();
    let present = |s: &mut State, t: &str, k: &str| s.exists(Some(&scope(t)), k, later).unwrap();
    assert!(!present(&mut s, "t", "b"));
    assert!(present(&mut s, "t", "a") && present(&mut s, "t", "c") && present(&mut s, "t", "d"));
    assert!(present(&mut s, "u", "x"));
}

#[test]
fn watermark_eviction_frees_a_share_and_prefers_tenants_over_their_grant() {
    let cfg = LeaderConfig {
        high_watermark: 0.4,
        eviction_ratio: 0.25,
        ..Default::default()
    };
    let (mut s, t0) = state(cfg);
    s.set_tenants(&[entry("big", 8 * MIB), entry("small", 8 * MIB)], &[])
        .unwrap();
    mount(&mut s, "m", 8 * MIB, t0);
    put(&mut s, "small", "s0", MIB, t0).unwrap();
    for i in 0..3 {
        put(&mut s, "big", &format!("b{i}"), MIB, t0).unwrap();
    }
    assert_eq!(
        s.watermark_round(t0),
        2,
        "4 of 8 MiB used, above 40%: free a quarter (2 MiB)"
    );
    let t = s.tenant_statuses();
    let (big, small) = (&t[0], &t[1]);
    // both were within their grant (4 MiB each after the cut), so plain LRU: s0 and b0 went
    assert_eq!((big.objects, small.objects), (2, 0));
    assert_eq!(s.watermark_round(t0), 0, "2 of 8 MiB is not above 40%");
}

#[test]
fn a_silent_member_loses_its_objects_and_a_remount_starts_empty() {
    let cfg = LeaderConfig {
        member_ttl: Duration::from_secs(2),
        allocation_strategy: AllocationStrategy::Random,
        ..Default::default()
    };
    let (mut s, t0) = state(cfg);
    s.set_tenants(&[entry("t", 64 * MIB)], &[]).unwrap();
    let m1 = mount(&mut s, "m1", 8 * MIB, t0);
    for i in 0..4 {
        put(&mut s, "t", &format!("k{i}"), MIB, t0).unwrap();
    }
    assert_eq!(s.tenant_statuses()[0].grant, 8 * MIB);
    let mount_id = s.member_statuses(t0)[0].mount_id;
    assert!(s.heartbeat(&hb(m1, mount_id), t0 + Duration::from_secs(1)));
    assert!(
        !s.heartbeat(&hb(m1, mount_id + 1), t0),
        "a wrong mount is told to remount"
    );
    assert_eq!(s.expire_members(t0 + Duration::from_secs(3)), 0);
    assert_eq!(s.expire_members(t0 + Duration::from_millis(3001)), 1);
    assert_eq!(s.object_count(), 0);
    assert_eq!(s.tenant_statuses()[0].used, 0);
    assert_eq!(s.tenant_statuses()[0].grant, 0, "nothing mounted, nothing granted");
    assert!(!s.heartbeat(&hb(m1, mount_id), t0));
    mount(&mut s, "m1", 8 * MIB, t0);
    assert!(!s.get(Some(&scope("t")), "k0", t0).unwrap().found);
}

#[test]
fn a_member_its_supervisor_saw_end_is_dropped_at_once() {
    let (mut s, t0) = state(LeaderConfig::default());
    s.set_tenants(&[entry("t", 64 * MIB)], &[]).unwrap();
    mount(&mut s, "a", 8 * MIB, t0);
    mount(&mut s, "b", 8 * MIB, t0);
    put(&mut s, "t", "k", MIB, t0).unwrap();
    assert_eq!(s.capacity(), 16 * MIB);
    assert!(s.remove_member("b"));
    assert_eq!(
        s.capacity(),
        8 * MIB,
        "its capacity is gone without waiting for the TTL"
    );
    assert_eq!(s.tenant_statuses()[0].grant, 8 * MIB);
    assert!(!s.remove_member("nobody"));
    // the same name mounts again at once (a new instance), and starts empty
    assert!(s.mount(&mount_req("b", 8 * MIB, 99), t0).is_ok());
    assert_eq!(s.capacity(), 16 * MIB);
}

#[test]
fn placement_spreads_by_free_ratio_and_reports_no_space() {
    let (mut s, t0) = state(LeaderConfig::default());
    s.set_tenants(&[entry("t", 64 * MIB)], &[]).unwrap();
    mount(&mut s, "a", 4 * MIB, t0);
    mount(&mut s, "b", 4 * MIB, t0);
    // values a little under 1 MiB, so that eight of them and their charges fit the grant
    let size = MIB - 4096;
    for i in 0..8 {
        let r = s.put_start(Some(&scope("t")), &format!("k{i}"), size, t0).unwrap();
        assert!(r.location.is_some());
    }
    let m = s.member_statuses(t0);
    assert_eq!((m[0].used, m[1].used), (4 * size, 4 * size));
    // full, and every object is still reserved (not evictable): the grant (cut to the 8 MiB
    // mounted) is the first limit met
    let e = s.put_start(Some(&scope("t")), "k8", size, t0).unwrap_err();
    assert_eq!(e.code, ErrorCode::TenantQuotaExceeded);
    // within the grant but larger than any one segment: no space, and the message says what to do
    for i in 0..8 {
        s.put_revoke(Some(&scope("t")), &format!("k{i}"), (i + 1) as u64)
            .unwrap();
    }
    assert_eq!(s.used(), 0);
    let e = s.put_start(Some(&scope("t")), "huge", 5 * MIB, t0).unwrap_err();
    assert_eq!(e.code, ErrorCode::NoSpace);
    assert!(e.message.contains("add members"), "{e}");
}

#[test]
fn malformed_requests_are_refused_not_panicked_on() {
    let (mut s, t0) = state(LeaderConfig {
        max_value_size: MIB,
        ..Default::default()
    });
    s.set_tenants(&[entry("t", 8 * MIB)], &[]).unwrap();
    mount(&mut s, "m", 8 * MIB, t0);
    assert_eq!(
        s.put_start(None, "k", 1, t0).unwrap_err().code,
        ErrorCode::InvalidArgument
    );
    assert_eq!(
        s.put_start(Some(&scope("t")), "", 1, t0).unwrap_err().code,
        ErrorCode::InvalidArgument
    );
    let long = "k".repeat(5000);
    assert_eq!(
        s.put_start(Some(&scope("t")), &long, 1, t0).unwrap_err().code,
        ErrorCode::InvalidArgument
    );
    assert_eq!(
        s.put_start(Some(&scope("t")), "k", 0, t0).unwrap_err().code,
        ErrorCode::ValueTooLarge
    );
    assert_eq!(
        s.put_start(Some(&scope("t")), "k", MIB + 1, t0).unwrap_err().code,
        ErrorCode::ValueTooLarge
    );
    assert_eq!(
        s.put_start(Some(&scope("t")), "k", u64::MAX, t0).unwrap_err().code,
        ErrorCode::ValueTooLarge
    );
    assert_eq!(
        s.put_commit(Some(&scope("t")), "nope", 7).unwrap_err().code,
        ErrorCode::PutExpired
    );
    assert!(s.put_revoke(Some(&scope("t")), "nope", 7).is_ok());
    let bad = MountRequest {
        name: String::new(),
        ..Default::default()
    };
    assert_eq!(s.mount(&bad, t0).unwrap_err().code, ErrorCode::InvalidArgument);
    // more holdings than a segment of its size can hold values
    let padded = MountRequest {
        holdings: vec![Default::default(); 4096 / 64 + 1],
        ..mount_req("p", 4096, 9)
    };
    let e = s.mount(&padded, t0).unwrap_err();
    assert!(
        e.code == ErrorCode::InvalidArgument && e.message.contains("at most 64"),
        "{e}"
    );
}

#[test]
fn a_name_held_by_a_live_process_is_refused_until_the_holder_expires() {
    let cfg = LeaderConfig {
        member_ttl: Duration::from_secs(2),
        ..Default::default()
    };
    let (mut s, t0) = state(cfg);
    s.set_tenants(&[entry("t", 64 * MIB)], &[]).unwrap();
    let first = s.mount(&mount_req("host", 8 * MIB, 11), t0).unwrap();
    put(&mut s, "t", "k", MIB, t0).unwrap();

    // another process under the same name: refused, and the holder keeps its mount and objects
    let e = s
        .mount(&mount_req("host", 8 * MIB, 22), t0 + Duration::from_secs(1))
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::MemberNameTaken);
    assert!(
        e.message.contains("\"host\"") && e.message.contains("its own --name"),
        "{e}"
    );
    assert_eq!(s.member_statuses(t0)[0].member_id, first.member_id);
    assert!(s.get(Some(&scope("t")), "k", t0).unwrap().found);
    // a process that sends no instance id cannot prove it is the holder either
    assert!(s.mount(&mount_req("host", 8 * MIB, 0), t0).is_err());

    // the holder heartbeats (with its instance id) and stays; a wrong instance id is told to remount
    let beat = |instance_id| HeartbeatRequest {
        member_id: first.member_id,
        mount_id: first.mount_id,
        instance_id,
        ..Default::default()
    };
    assert!(s.heartbeat(&beat(11), t0 + Duration::from_secs(2)));
    assert!(!s.heartbeat(&beat(22), t0 + Duration::from_secs(2)));
    let live = t0 + Duration::from_secs(4);
    assert!(
        s.mount(&mount_req("host", 8 * MIB, 22), live).is_err(),
        "heartbeat at 2 s, ttl 2 s"
    );

    // the same process mounting again replaces its own mount (it starts empty)
    let again = s.mount(&mount_req("host", 8 * MIB, 11), live).unwrap();
    assert_ne!(again.member_id, first.member_id);
    assert_eq!(s.member_statuses(live).len(), 1);
    assert!(!s.get(Some(&scope("t")), "k", live).unwrap().found);

    // once the holder is silent past the ttl, a new process may take the name
    let dead = live + Duration::from_millis(2001);
    let taken = s.mount(&mount_req("host", 8 * MIB, 22), dead).unwrap();
    let members = s.member_statuses(dead);
    assert_eq!(members.len(), 1);
    assert_eq!(members[0].member_id, taken.member_id);
}

#[test]
fn each_named_caller_is_counted_within_its_tenant() {
    let (mut s, t0) = state(LeaderConfig::default());
    s.set_tenants(&[entry("t", 8 * MIB), entry("u", 8 * MIB)], &[]).unwrap();
    mount(&mut s, "m", 16 * MIB, t0);
    let as_client = |t: &str, client: &str| Scope {
        client: client.into(),
        ..scope(t)
    };
    let a = as_client("t", "md/server-0");
    let r = s.put_start(Some(&a), "k", 100, t0).unwrap();
    s.put_commit(Some(&a), "k", r.put_id).unwrap();
    s.get(Some(&a), "k", t0).unwrap();
    s.get(Some(&as_client("t", "md/server-1")), "k", t0).unwrap();
    s.get(Some(&as_client("t", "md/server-1")), "missing", t0).unwrap();
    s.get(Some(&as_client("u", "md/server-0")), "k", t0).unwrap();
    let counts = |tenant: &str| -> Vec<(String, u64, u64, u64)> {
        s.tenant_statuses()
            .into_iter()
            .find(|x| x.name == tenant)
            .unwrap()
            .clients
            .into_iter()
            .map(|c| (c.name, c.gets, c.hits, c.puts))
            .collect()
    };
    assert_eq!(
        counts("t"),
        [("md/server-1".to_owned(), 2, 1, 0), ("md/server-0".to_owned(), 1, 1, 1)]
    );
    assert_eq!(
        counts("u"),
        [("md/server-0".to_owned(), 1, 0, 0)],
        "another tenant's caller of the same name is counted apart"
    );
    let long = as_client("t", &"x".repeat(300));
    assert_eq!(
        s.get(Some(&long), "k", t0).unwrap_err().code,
        ErrorCode::InvalidArgument
    );
}

/// A holding sealed as `s`'s leaders seal (a value one of them committed).
pub(super) fn holding(
    s: &State,
    tenant: &str,
    key: &str,
    block_size: u32,
    offset: u64,
    size: u64,
    epoch: u64,
) -> crate::proto::Holding {
    let tag = crate::grant::Tag {
        tenant: tenant.into(),
        uid: String::new(),
        block_size,
        dtype: "bf16".into(),
        key: key.into(),
    }
    .encode();
    sealed(s, tag, offset, size, epoch)
}

fn sealed(s: &State, tag: Vec<u8>, offset: u64, size: u64, epoch: u64) -> crate::proto::Holding {
    let seal = s.seal_key.seal(&tag, &crate::grant::Placed { offset, size, epoch });
    crate::proto::Holding {
        tag: tag.into(),
        offset,
        size,
        epoch,
        last_used_unix_ms: 0,
        seal: bytes::Bytes::copy_from_slice(&seal),
    }
}

/// What a member hands over is adopted only where the leader can stand behind it: a leader's seal
/// over its tag and place, a tenant of the ledger held by the same Binding with the same layout, a
/// key not held, a whole aligned range of the segment that overlaps nothing adopted, an epoch not
/// from the future.
#[test]
fn a_new_term_adopts_only_what_it_can_stand_behind() {
    let (mut s, now) = state(LeaderConfig::default());
    s.epoch = 3;
    s.set_tenants(&[entry("a", 64 * MIB), entry("b", 64 * MIB)], &[])
        .unwrap();
    let bogus = sealed(&s, b"not a tag".to_vec(), 0, 100, 3);
    // what a member (or whoever has the member token) makes up: no seal, another key's, a seal
    // moved to another place, and a value of another holder of tenant a's name
    let mut unsealed = holding(&s, "a", "f1", 64, 45056, 100, 3);
    unsealed.seal = bytes::Bytes::new();
    let mut forged = holding(&s, "a", "f2", 64, 49152, 100, 3);
    forged.seal = bytes::Bytes::copy_from_slice(&crate::grant::SealKey::generate().seal(
        &forged.tag,
        &crate::grant::Placed {
            offset: 49152,
            size: 100,
            epoch: 3,
        },
    ));
    let mut moved = holding(&s, "a", "f3", 64, 53248, 100, 3);
    moved.offset = 57344;
    let other_holder = crate::grant::Tag {
        tenant: "a".into(),
        uid: "binding-of-another-team".into(),
        block_size: 64,
        dtype: "bf16".into(),
        key: "f4".into(),
    }
    .encode();
    let offered = vec![
        holding(&s, "a", "k1", 64, 0, 100, 2),          // adopted
        holding(&s, "a", "k2", 64, 128, 4096, 3),       // adopted
        holding(&s, "a", "k3", 64, 64, 100, 3),         // overlaps k1's 128-byte range
        holding(&s, "a", "k1", 64, 8192, 100, 3),       // k1 is held already
        holding(&s, "nobody", "k4", 64, 16384, 100, 3), // not in the ledger
        holding(&s, "b", "k5", 16, 20480, 100, 3),      // b registered another layout
        holding(&s, "a", "k6", 64, 24577, 100, 3),      // not aligned
        holding(&s, "a", "k7", 64, MIB - 64, 128, 3),   // past the segment's end
        holding(&s, "a", "k8", 64, 28672, 100, 4),      // an epoch this leader never served
        holding(&s, "a", "", 64, 32768, 100, 3),        // no key
        bogus,                                          // no tag a leader wrote
        holding(&s, "b", "k9", 64, 36864, 0, 3),        // empty
        holding(&s, "b", "k10", 64, 40960, 2000, 3),    // adopted
        unsealed,                                       // never sealed
        forged,                                         // sealed with another key
        moved,                                          // sealed for another place
        sealed(&s, other_holder, 61440, 100, 3),        // another Binding's tenant a
    ];
    let req = crate::proto::MountRequest {
        holdings: offered,
        ..mount_req("m", MIB, 7)
    };
    let r = s.mount(&req, now).unwrap();
    let adopted: Vec<bool> = r.adopted.iter().map(|a| *a != 0).collect();
    assert_eq!(
        adopted,
        [
            true, true, false, false, false, false, false, false, false, false, false, false, true, false, false,
            false, false
        ]
    );
    let numbers: std::collections::BTreeSet<u64> = r.adopted.iter().copied().filter(|a| *a != 0).collect();
    assert_eq!(numbers.len(), 3, "each adopted value gets its own allocation number");
    // no seal is made anew: the seals they came with stay good for every later term of the
    // backend, which adopts them again from the same report
    let (mut later, _) = state(LeaderConfig::default());
    later.seal_key = std::sync::Arc::clone(&s.seal_key);
    later.epoch = 5;
    later
        .set_tenants(&[entry("a", 64 * MIB), entry("b", 64 * MIB)], &[])
        .unwrap();
    let kept: Vec<crate::proto::Holding> = req
        .holdings
        .iter()
        .zip(&adopted)
        .filter(|(_, a)| **a)
        .map(|(h, _)| h.clone())
        .collect();
    let again = later
        .mount(
            &crate::proto::MountRequest {
                holdings: kept,
                ..mount_req("m", MIB, 7)
            },
            now,
        )
        .unwrap();
    assert_eq!(again.adopted.iter().filter(|a| **a != 0).count(), 3);
    assert_eq!(
        s.adopted(),
        super::state::Adopted {
            objects: 3,
            bytes: 6196
        }
    );
    // adopted values hit, are charged as puts are, and the ranges they hold are not placed again
    let got = s.get(Some(&scope("a")), "k2", now).unwrap();
    let loc = got.location.unwrap();
    assert_eq!((loc.offset, loc.len, loc.allocation), (128, 4096, r.adopted[1]));
    let charged = super::objects::charge(128, "k1".len()) + super::objects::charge(4096, "k2".len());
    assert_eq!(s.tenants["a"].used, charged);
    for i in 0..20 {
        let p = s.put_start(Some(&scope("a")), &format!("new{i}"), 100, now).unwrap();
        let at = p.location.unwrap().offset;
        assert!(
            !(0..128).contains(&at) && !(128..4224).contains(&at),
            "{at} is adopted space"
        );
    }
}

/// A member's report waits for this term's ledger (a while), so no tenant's values are freed
/// only because the controllers had not sent it yet; one with nothing to report mounts at once.
#[test]
fn holdings_wait_for_the_ledger_and_an_empty_report_does_not() {
    let (mut s, now) = state(LeaderConfig::default());
    let req = crate::proto::MountRequest {
        holdings: vec![holding(&s, "a", "k", 64, 0, 100, 0)],
        ..mount_req("m", MIB, 7)
    };
    assert_eq!(s.mount(&req, now).unwrap_err().code, ErrorCode::LedgerPending);
    assert!(s.mount(&mount_req("n", MIB, 8), now).is_ok(), "nothing to hand over");
    // past the wait it mounts against whatever ledger there is (none: nothing adopted)
    let late = now + super::LEDGER_WAIT;
    assert_eq!(s.mount(&req, late).unwrap().adopted, [0]);
    // once the ledger is there, at once
    let (mut s, now) = state(LeaderConfig::default());
    s.set_tenants(&[entry("a", 64 * MIB)], &[]).unwrap();
    let req = crate::proto::MountRequest {
        holdings: vec![holding(&s, "a", "k", 64, 0, 100, 0)],
        ..mount_req("m", MIB, 7)
    };
    assert_ne!(s.mount(&req, now).unwrap().adopted, [0]);
}

/// Adopted values are evicted in the order their members last used them, whichever member held
/// them and whenever it mounted: the values engines kept reading stay.
#[test]
fn adopted_values_are_evicted_least_recently_used_first_across_members() {
    let (mut s, now) = state(LeaderConfig::default());
    s.set_tenants(&[entry("a", 64 * MIB)], &[]).unwrap();
    let used = |key: &str, offset: u64, at: u64| crate::proto::Holding {
        last_used_unix_ms: at,
        ..holding(&s, "a", key, 64, offset, 4096, 0)
    };
    // member m1 mounts first with a value read a moment ago and one untouched for long
    let m1 = crate::proto::MountRequest {
        holdings: vec![used("cold", 0, 1_000), used("hot", 4096, 3_000)],
        ..mount_req("m1", MIB, 1)
    };
    let m2 = crate::proto::MountRequest {
        holdings: vec![used("warm", 0, 2_000)],
        ..mount_req("m2", MIB, 2)
    };
    s.mount(&m1, now).unwrap();
    s.mount(&m2, now).unwrap();
    let one = super::objects::charge(4096, "cold".len());
    assert_eq!(s.evict_tenant("a", one, now), one);
    let held: std::collections::BTreeSet<String> = s.tenants["a"].objects.keys().map(|k| k.to_string()).collect();
    assert_eq!(
        held,
        ["hot".to_owned(), "warm".to_owned()].into(),
        "the coldest went first"
    );
    s.evict_tenant("a", 1, now);
    assert!(
        s.tenants["a"].objects.contains_key("hot"),
        "then the warm one, not the hot one"
    );
    // and this term's own use comes after every adopted value's
    put(&mut s, "a", "new", 100, now).unwrap();
    s.evict_tenant("a", 1, now);
    assert!(s.tenants["a"].objects.contains_key("new"));
}

/// A tenant at its grant is evicted a little ahead of need, so choosing what goes (a look at every
/// object) is paid once per many puts rather than on each.
#[test]
fn a_full_tenant_is_evicted_ahead_of_need() {
    let (mut s, now) = state(LeaderConfig::default());
    s.set_tenants(&[entry("a", 4 * MIB)], &[]).unwrap();
    mount(&mut s, "m", 64 * MIB, now);
    let mut i = 0;
    while put(&mut s, "a", &format!("k{i}"), 1000, now).is_ok() && s.tenants["a"].counters.evictions == 0 {
        i += 1;
    }
    let evicted = s.tenants["a"].counters.evictions;
    let each = super::objects::charge(1024, "k1000".len());
    assert!(
        evicted * each >= 4 * MIB / super::state::EVICTION_BATCH,
        "{evicted} evicted at once"
    );
    // and the next puts need none
    for j in 0..evicted - 1 {
        put(&mut s, "a", &format!("n{j}"), 1000, now).unwrap();
    }
    assert_eq!(s.tenants["a"].counters.evictions, evicted);
}

/// What a member holds for a next leader: each value this leader committed, sealed, told once; a
/// member's grant key is its mount's own.
#[test]
fn heartbeat_answers_seal_each_value_committed_since_the_last_once() {
    let (mut s, t0) = state(LeaderConfig::default());
    s.epoch = 5;
    s.set_tenants(&[entry("t", 8 * MIB)], &[]).unwrap();
    let m = mount(&mut s, "m", 8 * MIB, t0);
    let n = mount(&mut s, "n", 8 * MIB, t0);
    let mount_id = s.members[&m].mount_id;
    assert_ne!(
        s.members[&m].grant_key.to_bytes(),
        s.members[&n].grant_key.to_bytes(),
        "each mount its own grant key"
    );
    let p = s.put_start(Some(&scope("t")), "k", 100, t0).unwrap();
    let loc = p.location.clone().unwrap();
    let on_m = loc.member_id == m;
    let (member, member_mount) = if on_m {
        (m, mount_id)
    } else {
        (n, s.members[&n].mount_id)
    };
    assert!(
        told(&mut s, &hb(member, member_mount), t0).seals.is_empty(),
        "not committed yet: nothing sealed"
    );
    s.put_commit(Some(&scope("t")), "k", p.put_id).unwrap();
    let answer = told(&mut s, &hb(member, member_mount), t0);
    assert_eq!(answer.sealed_offsets, [loc.offset]);
    assert_eq!(answer.sealed_allocations, [loc.allocation]);
    let at = crate::grant::Placed {
        offset: loc.offset,
        size: 100,
        epoch: 5,
    };
    assert!(s.seal_key.verifies(&loc.tag, &at, &answer.seals[0]));
    assert!(
        told(&mut s, &hb(member, member_mount), t0).seals.is_empty(),
        "told once"
    );
}

/// What a member must stop holding for a next leader: every range this leader freed, told once,
/// in bounded answers.
#[test]
fn heartbeat_answers_name_each_range_freed_since_the_last_once() {
    use super::notices::{PER_ANSWER, QUEUED};
    let (mut s, t0) = state(reaped_after_2s());
    s.set_tenants(&[entry("t", 8 * MIB)], &[]).unwrap();
    let m = mount(&mut s, "m", 8 * MIB, t0);
    let mount_id = s.member_statuses(t0)[0].mount_id;
    for k in ["a", "b"] {
        put(&mut s, "t", k, MIB, t0).unwrap();
    }
    s.put_start(Some(&scope("t")), "abandoned", 100, t0).unwrap();
    let at = |s: &State, k: &str| {
        let r = s.tenants["t"].objects.of(k).memory.unwrap();
        (r.offset, r.allocation)
    };
    let (a, abandoned) = (at(&s, "a"), at(&s, "abandoned"));
    let answer = told(&mut s, &hb(m, mount_id), t0);
    assert!(
        !answer.need_remount && answer.freed_offsets.is_empty(),
        "nothing freed yet"
    );
    assert!(s.remove(Some(&scope("t")), "a", t0).unwrap());
    assert_eq!(s.reap_reservations(t0 + Duration::from_secs(2)), 1);
    let answer = told(&mut s, &hb(m, mount_id), t0);
    let freed: Vec<(u64, u64)> = answer
        .freed_offsets
        .iter()
        .copied()
        .zip(answer.freed_allocations.iter().copied())
        .collect();
    assert_eq!(freed, [a, abandoned], "the removed value and the reclaimed reservation");
    assert!(told(&mut s, &hb(m, mount_id), t0).freed_offsets.is_empty(), "told once");
    // another mount is told to remount, and nothing of this one
    s.members.get_mut(&m).unwrap().notices.freed(1, 1);
    let other = told(&mut s, &hb(m, mount_id + 1), t0);
    assert!(other.need_remount && other.freed_offsets.is_empty());
    // a long queue goes out in bounded answers
    for i in 0..PER_ANSWER as u64 {
        s.members.get_mut(&m).unwrap().notices.freed(i + 2, i + 2);
    }
    let answer = told(&mut s, &hb(m, mount_id), t0);
    assert_eq!(answer.freed_offsets.len(), PER_ANSWER);
    assert_eq!(answer.freed_allocations.len(), PER_ANSWER);
    assert_eq!(answer.freed_offsets[0], 1);
    assert_eq!(told(&mut s, &hb(m, mount_id), t0).freed_offsets.len(), 1);
    // a member that falls too far behind is unmounted, and its next mount hands over nothing
    let instance = s.members[&m].instance_id;
    for i in 0..=QUEUED as u64 {
        s.members.get_mut(&m).unwrap().notices.freed(i, i);
    }
    assert!(told(&mut s, &hb(m, mount_id), t0).need_remount);
    assert_eq!(s.expire_members(t0), 1);
    let again = crate::proto::MountRequest {
        holdings: vec![holding(&s, "t", "b", 64, 0, 100, 0)],
        ..mount_req("m", 8 * MIB, instance)
    };
    assert_eq!(s.mount(&again, t0).unwrap().adopted, [0]);
}

/// A removal is answered once the member applied it: the heartbeats that carry the notice and say
/// it was applied release the waiter.
#[test]
fn a_removal_waits_for_its_member_to_apply_it() {
    let (mut s, t0) = state(LeaderConfig::default());
    s.set_tenants(&[entry("t", 8 * MIB)], &[]).unwrap();
    let m = mount(&mut s, "m", 8 * MIB, t0);
    let mount_id = s.members[&m].mount_id;
    put(&mut s, "t", "k", 1000, t0).unwrap();
    let answer = s.answer_heartbeat(&hb(m, mount_id), t0);
    let sealed_through = answer.through;
    assert_eq!(s.applied().len(), 1, "the seal is sent, not applied yet");
    let acked = HeartbeatRequest {
        applied_through: sealed_through,
        ..hb(m, mount_id)
    };
    assert!(s.heartbeat(&acked, t0));
    assert!(s.applied().is_empty(), "applied: nothing waits on it");
    assert!(s.remove(Some(&scope("t")), "k", t0).unwrap());
    let waiters = s.applied();
    assert_eq!(waiters.len(), 1);
    assert!(!waiters[0].done());
    // a held heartbeat would answer at once: there is news
    let held = HeartbeatRequest {
        wait_ms: 500,
        applied_through: sealed_through,
        ..hb(m, mount_id)
    };
    assert!(s.hold_heartbeat(&held, t0).is_none());
    let answer = s.answer_heartbeat(&held, t0);
    assert_eq!(answer.freed_offsets.len(), 1);
    assert!(!waiters[0].done(), "sent, not applied yet");
    let applied = HeartbeatRequest {
        applied_through: answer.through,
        ..held
    };
    assert!(s.hold_heartbeat(&applied, t0).is_some(), "nothing to tell: held");
    assert!(waiters[0].done(), "the member said it applied the free");
}

/// Finding 10 of the second review: a tenant's domain given to another Binding (another uid) is a
/// new tenant: the old holder's values are dropped, and a holding of the old holder is not
/// adopted for the new one.
#[test]
fn a_domain_given_to_another_binding_starts_empty() {
    let (mut s, now) = state(LeaderConfig::default());
    let held_by = |uid: &str| TenantEntry {
        uid: uid.into(),
        ..entry("a", 8 * MIB)
    };
    s.set_tenants(&[held_by("binding-1")], &[]).unwrap();
    mount(&mut s, "m", 8 * MIB, now);
    put(&mut s, "a", "k", 1000, now).unwrap();
    let tag = crate::grant::Tag::decode(&s.tag("a", "k")).unwrap();
    assert_eq!(tag.uid, "binding-1", "the tag names the holder");
    // the same holder again: nothing changes
    assert_eq!(s.set_tenants(&[held_by("binding-1")], &[]).unwrap(), 0);
    assert!(s.exists(Some(&scope("a")), "k", now).unwrap());
    // another Binding took the domain: the old values go
    assert_eq!(s.set_tenants(&[held_by("binding-2")], &[]).unwrap(), 1);
    assert!(!s.exists(Some(&scope("a")), "k", now).unwrap());
    assert_eq!(s.tenant_statuses()[0].uid, "binding-2");
}

#[test]
fn a_lost_member_takes_its_values_in_events_of_a_bounded_size() {
    use crate::proto::block_event::Event;
    let (mut s, t0) = state(LeaderConfig::default());
    s.set_tenants(&[entry("t", 256 * MIB)], &[]).unwrap();
    let a = mount(&mut s, "a", 64 * MIB, t0);
    let b = mount(&mut s, "b", 64 * MIB, t0);
    for i in 0..3000 {
        put(&mut s, "t", &format!("k{i}"), 1000, t0).unwrap();
    }
    let on = |s: &State, m: u64| {
        let mut keys: Vec<String> = s.tenants["t"]
            .objects
            .iter()
            .filter(|(_, o)| o.member == m)
            .map(|(k, _)| k.to_string())
            .collect();
        keys.sort();
        keys
    };
    let (on_a, on_b) = (on(&s, a), on(&s, b));
    assert!(
        on_a.len() > 2 * 512 && on_a.len() + on_b.len() == 3000,
        "{} on a",
        on_a.len()
    );
    let charged_b: u64 = on_b.iter().map(|k| s.tenants["t"].objects.of(k).charge).sum();
    let mut rx = s.tenants["t"].log.listen();
    s.unmount(a);
    let (mut told, mut ids) = (Vec::new(), Vec::new());
    while let Ok(e) = rx.try_recv() {
        let Some(Event::Removed(r)) = e.event else {
            panic!("{e:?}")
        };
        assert!(
            r.keys.len() <= 512 && r.reason == "member",
            "{} keys, {}",
            r.keys.len(),
            r.reason
        );
        told.extend(r.keys);
        ids.push(e.id);
    }
    told.sort();
    assert_eq!(told, on_a, "every value of a told once");
    assert!(
        ids.windows(2).all(|w| w[1] == w[0] + 1),
        "numbered without a gap: {ids:?}"
    );
    assert_eq!((on(&s, a), on(&s, b).len()), (vec![], on_b.len()));
    assert_eq!(s.tenants["t"].used, charged_b);
    // unheard, b's removal makes no event and still takes a number
    drop(rx);
    let last = s.tenants["t"].log.last_id();
    s.unmount(b);
    assert_eq!((s.tenants["t"].used, s.tenants["t"].objects.len()), (0, 0));
    assert_eq!(s.tenants["t"].log.last_id(), last + 1);
}
