//! Members' disk tiers as the leader sees them, at exact instants and without processes: a
//! member's heartbeats are built by hand from what the leader told it.

use std::time::Instant;

use super::super::config::{LeaderConfig, TierReads};
use super::super::objects::OBJECT_OVERHEAD;
use super::super::state::State;
use super::super::tests::{MIB, entry, hb, mount_req, put, scope, state, told};
use crate::proto::{DiskHolding, HeartbeatRequest, HeartbeatResponse};

/// Room in a ceiling for the leader's own charge per value (its key and overhead).
const SLACK: u64 = 16 * OBJECT_OVERHEAD;

/// A mounted member with a 64 MiB disk tier: (member id, mount id).
fn mount_tiered(s: &mut State, name: &str, capacity: u64, now: Instant) -> (u64, u64) {
    let req = crate::proto::MountRequest {
        tier_capacity: 64 * MIB,
        ..mount_req(name, capacity, 42)
    };
    let r = s.mount(&req, now).unwrap();
    (r.member_id, r.mount_id)
}

/// The member copied `keys` (each sealed in `answer`, in order) to its tier as disk ids 1, 2, ...
fn copies(s: &State, tenant: &str, keys: &[&str], answer: &HeartbeatResponse, size: u64) -> HeartbeatRequest {
    let mut hb = HeartbeatRequest::default();
    for (i, key) in keys.iter().enumerate() {
        hb.spilled.push(DiskHolding {
            tag: s.tag(tenant, key).into(),
            disk_id: i as u64 + 1,
            size,
            seal_epoch: s.epoch(),
            seal_offset: answer.sealed_offsets[i],
            seal: answer.seals[i].clone(),
            written_unix_ms: crate::time::now_unix_ms(),
        });
        hb.spilled_allocations.push(answer.sealed_allocations[i]);
    }
    hb
}

/// `hb` as member `(id, mount)` sends it, applied through `through`: its tier report, then its
/// acknowledgement, as the gRPC face takes them.
fn send(
    s: &mut State,
    (id, mount): (u64, u64),
    mut req: HeartbeatRequest,
    through: u64,
    now: Instant,
) -> HeartbeatResponse {
    req.member_id = id;
    req.mount_id = mount;
    req.instance_id = 42;
    req.applied_through = through;
    s.tier_report(&req, now);
    s.answer_heartbeat(&req, now)
}

fn tenant(s: &State, t: &str) -> crate::proto::TenantStatus {
    s.tenant_statuses().into_iter().find(|x| x.name == t).unwrap()
}

/// A leader that loads values on disk back into memory for a get (`--tier-reads load`).
fn loading() -> LeaderConfig {
    LeaderConfig {
        tier_reads: TierReads::Load,
        ..Default::default()
    }
}

/// Two 1 MiB values copied to disk in a grant of two, on a leader that reads values on disk as
/// `reads` says: (state, now, member).
fn two_copied_with(reads: TierReads) -> (State, Instant, (u64, u64)) {
    let (mut s, t0) = state(LeaderConfig {
        tier_reads: reads,
        ..Default::default()
    });
    s.set_tenants(&[entry("t", 2 * MIB + SLACK)], &[]).unwrap();
    let m = mount_tiered(&mut s, "m", 8 * MIB, t0);
    put(&mut s, "t", "a", MIB, t0).unwrap();
    put(&mut s, "t", "b", MIB, t0).unwrap();
    let sealed = told(&mut s, &hb(m.0, m.1), t0);
    let report = copies(&s, "t", &["a", "b"], &sealed, MIB);
    send(&mut s, m, report, sealed.through, t0);
    (s, t0, m)
}

/// [`two_copied_with`] a leader that loads values on disk into memory for a get.
fn two_copied() -> (State, Instant, (u64, u64)) {
    two_copied_with(TierReads::Load)
}

#[test]
fn a_get_of_a_value_only_on_disk_reads_it_from_disk_under_a_grant_for_that_copy() {
    let (mut s, t0, m) = two_copied_with(TierReads::Direct);
    put(&mut s, "t", "c", MIB, t0).unwrap();
    assert_eq!(s.tenants["t"].objects.of("a").memory, None, "a left memory for c");
    assert!(
        s.start_loads(Some(&scope("t")), &["a".into()], t0).unwrap().is_empty(),
        "nothing is loaded into memory"
    );
    let got = s.get(Some(&scope("t")), "a", t0).unwrap();
    let loc = got.location.unwrap();
    assert!(got.found && loc.on_disk);
    assert_eq!((loc.offset, loc.len, loc.mount_id), (1, MIB, m.1), "its copy's disk id");
    assert_eq!(&loc.tag[..], &s.tag("t", "a")[..]);
    // the grant is for a disk read of that copy of that value, on that mount, and nothing else
    let key = s.grant_key.for_mount(m.1);
    let range = crate::grant::Range {
        access: crate::grant::Access::ReadDisk,
        mount_id: m.1,
        epoch: s.epoch(),
        allocation: 0,
        offset: 1,
        len: MIB,
        deadline_unix_ms: got.lease_deadline_unix_ms,
    };
    assert!(key.verify(&range, &loc.tag, &loc.grant_mac).is_ok());
    let read = crate::grant::Range {
        access: crate::grant::Access::Read,
        ..range
    };
    assert!(key.verify(&read, &[], &loc.grant_mac).is_err(), "not a memory read");
    assert!(
        key.verify(&range, &s.tag("t", "b"), &loc.grant_mac).is_err(),
        "not b's copy"
    );
    // b is in memory: read from there
    let b = s.get(Some(&scope("t")), "b", t0).unwrap().location.unwrap();
    assert!(!b.on_disk);
    let t = tenant(&s, "t");
    assert_eq!((t.loads, t.hits, t.on_disk_only), (1, 2, 1));

    // the member found the copy damaged on a read: counted, forgotten, and a get misses
    let damaged = HeartbeatRequest {
        lost_disk_ids: vec![1],
        failed_read_disk_ids: vec![1],
        ..Default::default()
    };
    let answer = send(&mut s, m, damaged, 0, t0);
    assert!(answer.disk_freed.is_empty(), "the copy is gone already");
    assert!(!s.get(Some(&scope("t")), "a", t0).unwrap().found);
    let t = tenant(&s, "t");
    assert_eq!((t.load_failures, t.disk_used, t.on_disk_only), (1, MIB, 0));
}

#[test]
fn a_value_copied_to_disk_leaves_memory_when_evicted_and_a_get_loads_it_back() {
    let (mut s, t0, m) = two_copied();
    let t = tenant(&s, "t");
    assert_eq!(
        (t.disk_used, t.on_disk_only),
        (2 * MIB, 0),
        "both copied, both in memory"
    );
    assert_eq!(s.member_statuses(t0)[0].disk_objects, 2);

    // a third value passes the grant: the least recently used one leaves memory, not the store
    put(&mut s, "t", "c", MIB, t0).unwrap();
    let a = s.tenants["t"].objects.of("a");
    assert_eq!((a.memory, a.disk), (None, Some(1)));
    let t = tenant(&s, "t");
    assert_eq!((t.on_disk_only, t.demotions, t.evictions), (1, 1, 0));
    assert!(s.exists(Some(&scope("t")), "a", t0).unwrap(), "still in the store");
    let freed = told(&mut s, &hb(m.0, m.1), t0);
    assert_eq!(freed.freed_offsets.len(), 1, "its memory is freed on the member");
    assert!(freed.disk_freed.is_empty(), "its copy stays");

    // a get finds it on disk: a miss until the member loaded it
    assert!(!s.get(Some(&scope("t")), "a", t0).unwrap().found);
    let waits = s.start_loads(Some(&scope("t")), &["a".into(), "c".into()], t0).unwrap();
    assert_eq!(waits.len(), 1, "only a is on disk");
    assert!(!waits[0].done());
    let told = told(&mut s, &hb(m.0, m.1), t0);
    assert_eq!(told.load_disk_ids, [1]);
    let (offset, allocation) = (told.load_offsets[0], told.load_allocations[0]);
    assert_eq!(&told.load_tags[0][..], &s.tag("t", "a")[..]);
    let placed = crate::grant::Placed {
        offset,
        size: MIB,
        epoch: s.epoch(),
    };
    assert!(
        s.seal_key.verifies(&s.tag("t", "a"), &placed, &told.load_seals[0]),
        "the loaded value is sealed for its new range: a next leader adopts it"
    );
    // to load it within the grant, b (copied too) left memory
    assert_eq!(s.tenants["t"].objects.of("b").memory, None);
    assert!(
        !s.get(Some(&scope("t")), "a", t0).unwrap().found,
        "not readable before the member applied the load"
    );
    send(&mut s, m, HeartbeatRequest::default(), told.through, t0);
    assert!(waits[0].done());
    let got = s.get(Some(&scope("t")), "a", t0).unwrap().location.unwrap();
    assert_eq!((got.offset, got.allocation, got.len), (offset, allocation, MIB));
    let t = tenant(&s, "t");
    assert_eq!((t.loads, t.load_failures, t.on_disk_only), (1, 0, 1));
    assert_eq!(t.disk_used, 2 * MIB, "a and b on disk; c was never copied");
    assert!(t.used <= t.grant, "{} of {}", t.used, t.grant);
}

#[test]
fn a_load_that_finds_its_copy_damaged_is_a_miss_and_the_value_is_dropped() {
    let (mut s, t0, m) = two_copied();
    put(&mut s, "t", "c", MIB, t0).unwrap();
    told(&mut s, &hb(m.0, m.1), t0);
    let waits = s.start_loads(Some(&scope("t")), &["a".into()], t0).unwrap();
    let told = told(&mut s, &hb(m.0, m.1), t0);
    assert_eq!(told.load_disk_ids, [1]);
    // the member read it back, and its checksum did not match: lost, in the heartbeat that
    // acknowledges the load
    let lost = HeartbeatRequest {
        lost_disk_ids: vec![1],
        ..Default::default()
    };
    let answer = send(&mut s, m, lost, told.through, t0);
    assert!(waits[0].done());
    assert!(
        !s.get(Some(&scope("t")), "a", t0).unwrap().found,
        "a miss, never its range"
    );
    assert!(!s.exists(Some(&scope("t")), "a", t0).unwrap());
    let t = tenant(&s, "t");
    assert_eq!((t.load_failures, t.disk_used), (1, MIB));
    assert_eq!(
        answer.freed_offsets,
        [told.load_offsets[0]],
        "the range it was loaded into is freed"
    );
    assert!(answer.disk_freed.is_empty(), "the copy is gone already");
}

#[test]
fn copies_the_tier_drops_are_forgotten_and_a_value_only_there_goes() {
    let (mut s, t0, m) = two_copied();
    put(&mut s, "t", "c", MIB, t0).unwrap();
    assert_eq!(s.tenants["t"].objects.of("a").memory, None, "a only on disk");
    // the tier dropped its oldest file, both copies in it
    let lost = HeartbeatRequest {
        lost_disk_ids: vec![1, 2],
        tier_used: 4096,
        ..Default::default()
    };
    send(&mut s, m, lost, 0, t0);
    assert!(!s.exists(Some(&scope("t")), "a", t0).unwrap(), "a went with its copy");
    let b = &s.tenants["t"].objects.of("b");
    assert!(b.memory.is_some() && b.disk.is_none(), "b stays in memory");
    let t = tenant(&s, "t");
    assert_eq!((t.disk_used, t.evictions, t.on_disk_only), (0, 1, 0));
    let member = &s.member_statuses(t0)[0];
    assert_eq!((member.tier_used, member.disk_objects), (4096, 0));
    // without a copy, b is dropped when evicted
    put(&mut s, "t", "d", MIB, t0).unwrap();
    assert!(!s.exists(Some(&scope("t")), "b", t0).unwrap());
}

#[test]
fn copies_of_values_gone_or_replaced_are_told_to_go_and_a_removal_frees_both() {
    let (mut s, t0) = state(LeaderConfig::default());
    s.set_tenants(&[entry("t", 8 * MIB)], &[]).unwrap();
    let m = mount_tiered(&mut s, "m", 8 * MIB, t0);
    put(&mut s, "t", "a", 100, t0).unwrap();
    put(&mut s, "t", "b", 100, t0).unwrap();
    let sealed = told(&mut s, &hb(m.0, m.1), t0);
    // a is removed before its copy is reported; b's report names another allocation
    assert!(s.remove(Some(&scope("t")), "a", t0).unwrap());
    let mut report = copies(&s, "t", &["a", "b"], &sealed, 100);
    report.spilled_allocations[1] += 1000;
    let answer = send(&mut s, m, report, sealed.through, t0);
    assert_eq!(answer.disk_freed, [1, 2]);
    assert_eq!(tenant(&s, "t").disk_used, 0);

    put(&mut s, "t", "c", 100, t0).unwrap();
    let sealed = told(&mut s, &hb(m.0, m.1), t0);
    let report = copies(&s, "t", &["c"], &sealed, 100);
    send(&mut s, m, report, sealed.through, t0);
    assert_eq!(tenant(&s, "t").disk_used, 128, "its allocated length");
    assert!(s.remove(Some(&scope("t")), "c", t0).unwrap());
    let answer = told(&mut s, &hb(m.0, m.1), t0);
    assert_eq!((answer.freed_offsets.len(), answer.disk_freed.clone()), (1, vec![1]));
    assert_eq!(tenant(&s, "t").disk_used, 0);
}

/// A member that restarts (its memory gone) or a new term hands over its tier's records: those
/// whose seal verifies are adopted, only on disk or as the disk copy of the same value adopted
/// from memory; a get loads them.
#[test]
fn a_mount_hands_over_its_tier_and_what_verifies_is_adopted() {
    let (mut s, t0, m) = two_copied();
    // the records as the member's tier holds them (its copies of a and b)
    let sealed_a = told(&mut s, &hb(m.0, m.1), t0);
    assert!(sealed_a.seals.is_empty());
    let mut records: Vec<DiskHolding> = Vec::new();
    for (i, key) in ["a", "b"].iter().enumerate() {
        let o = s.tenants["t"].objects.of(key);
        let r = o.memory.unwrap();
        let tag = s.tag("t", key);
        let placed = crate::grant::Placed {
            offset: r.offset,
            size: MIB,
            epoch: s.epoch(),
        };
        records.push(DiskHolding {
            seal: s.seal_key.seal(&tag, &placed).to_vec().into(),
            tag: tag.into(),
            disk_id: i as u64 + 1,
            size: MIB,
            seal_epoch: s.epoch(),
            seal_offset: r.offset,
            written_unix_ms: crate::time::now_unix_ms(),
        });
    }
    let mut forged = records[0].clone();
    forged.disk_id = 3;
    forged.size = MIB / 2;
    let mut stranger = records[1].clone();
    stranger.disk_id = 4;
    stranger.tag = s.tag("nobody", "b").into();

    // a new term, same backend (the seal key is the backend's), the member's memory gone
    let mut next = State::new(loading(), s.seal_key.clone());
    next.set_tenants(&[entry("t", 2 * MIB + SLACK)], &[]).unwrap();
    let req = crate::proto::MountRequest {
        tier_capacity: 64 * MIB,
        disk_holdings: vec![records[0].clone(), records[1].clone(), forged, stranger],
        ..mount_req("m", 8 * MIB, 43)
    };
    let r = next.mount(&req, t0).unwrap();
    assert_eq!(r.disk_adopted, [true, true, false, false]);
    let t = tenant(&next, "t");
    assert_eq!((t.objects, t.on_disk_only, t.disk_used), (2, 2, 2 * MIB));
    assert_eq!(t.used, 0, "nothing in memory: nothing charged to the grant");
    let waits = next.start_loads(Some(&scope("t")), &["b".into()], t0).unwrap();
    assert_eq!(waits.len(), 1);
    let told = next.answer_heartbeat(&hb(r.member_id, r.mount_id), t0);
    assert_eq!(told.load_disk_ids, [2]);
    let mut ack = hb(r.member_id, r.mount_id);
    ack.applied_through = told.through;
    next.answer_heartbeat(&ack, t0);
    assert!(next.get(Some(&scope("t")), "b", t0).unwrap().found);

    // the same member mounting with the value in memory as well: one value, both places
    let mut third = State::new(loading(), s.seal_key.clone());
    third.set_tenants(&[entry("t", 8 * MIB)], &[]).unwrap();
    let a = s.tenants["t"].objects.of("a").memory.unwrap();
    let tag = s.tag("t", "a");
    let placed = crate::grant::Placed {
        offset: a.offset,
        size: MIB,
        epoch: s.epoch(),
    };
    let memory = crate::proto::Holding {
        seal: s.seal_key.seal(&tag, &placed).to_vec().into(),
        tag: tag.into(),
        offset: a.offset,
        size: MIB,
        epoch: s.epoch(),
        ..Default::default()
    };
    let req = crate::proto::MountRequest {
        tier_capacity: 64 * MIB,
        holdings: vec![memory],
        disk_holdings: vec![records[0].clone()],
        ..mount_req("m", 8 * MIB, 44)
    };
    let r = third.mount(&req, t0).unwrap();
    assert_ne!(r.adopted, [0]);
    assert_eq!(r.disk_adopted, [true]);
    let o = &third.tenants["t"].objects.of("a");
    assert!(o.memory.is_some() && o.disk == Some(1));
    assert_eq!(tenant(&third, "t").disk_used, MIB);

    // a member of another release: none of its memory report is adopted (it would not
    // understand the answer, and drop what this leader took it to hold), its tier's is
    let mut fourth = State::new(loading(), s.seal_key.clone());
    fourth.set_tenants(&[entry("t", 8 * MIB)], &[]).unwrap();
    let older = crate::proto::MountRequest {
        handover: 0,
        more_holdings: true,
        ..req.clone()
    };
    let r = fourth.mount(&older, t0).unwrap();
    assert_eq!((&r.adopted[..], &r.disk_adopted[..]), (&[0][..], &[true][..]));
    let o = &fourth.tenants["t"].objects.of("a");
    assert!(o.memory.is_none() && o.disk == Some(1), "a value only on disk");
    // nor any further page of its report
    let page = crate::proto::HandoverRequest {
        member_id: r.member_id,
        mount_id: r.mount_id,
        instance_id: 44,
        holdings: older.holdings.clone(),
        last: true,
        ..Default::default()
    };
    assert_eq!(fourth.handover(&page, t0).unwrap().adopted, [0]);
}

#[test]
fn a_member_leaving_takes_its_disk_values_with_it() {
    let (mut s, t0, _m) = two_copied();
    put(&mut s, "t", "c", MIB, t0).unwrap();
    assert!(s.remove_member("m"));
    let t = tenant(&s, "t");
    assert_eq!((t.objects, t.disk_used, t.used), (0, 0, 0));
}
