//! A report in pages: adopted whole however long, and the segment takes no new value until its
//! last page.

use std::time::Instant;

use super::super::state::State;
use super::super::tests::{MIB, entry, holding, mount_req, put, scope, state};
use crate::error::ErrorCode;
use crate::proto::{HandoverRequest, Holding, MountRequest, MountResponse};

/// 3,000 values of 64 bytes, back to back from offset 0, of tenant `a`.
fn held(s: &State) -> Vec<Holding> {
    (0..3000u64)
        .map(|i| holding(s, "a", &format!("k{i}"), 64, i * 64, 64, 0))
        .collect()
}

/// A further page of `holdings`, packed as a member sends it.
fn page(r: &MountResponse, holdings: &[Holding], last: bool) -> HandoverRequest {
    HandoverRequest {
        member_id: r.member_id,
        mount_id: r.mount_id,
        instance_id: 1,
        holdings: Vec::new(),
        last,
        first: 0,
        packed: crate::holdings::pack(holdings.iter().map(crate::holdings::Record::from)),
    }
}

fn adopted(allocations: &[u64]) -> usize {
    allocations.iter().filter(|a| **a != 0).count()
}

/// A leader whose ledger holds tenant `a`, and 3,000 values of it a member holds.
fn leader_and_holdings() -> (State, Instant, Vec<Holding>) {
    let (mut s, now) = state(Default::default());
    s.set_tenants(&[entry("a", 64 * MIB)], &[]).unwrap();
    let held = held(&s);
    (s, now, held)
}

/// A mount of a segment of `capacity` bytes whose report starts with `holdings`, more to come.
fn first_page(holdings: &[Holding], capacity: u64) -> MountRequest {
    MountRequest {
        holdings: holdings.to_vec(),
        more_holdings: true,
        ..mount_req("m", capacity, 1)
    }
}

/// The refusal of a put while the only member hands over.
fn refusal(s: &mut State, now: Instant) -> String {
    let e = s.put_start(Some(&scope("a")), "new", 100, now).unwrap_err();
    assert_eq!(e.code, ErrorCode::NoSpace);
    e.message
}

#[test]
fn a_report_in_pages_is_adopted_whole_and_the_segment_takes_new_values_after_its_last_page() {
    let (mut s, now, held) = leader_and_holdings();
    let r = s.mount(&first_page(&held[..1000], MIB), now).unwrap();
    assert_eq!(adopted(&r.adopted), 1000);
    // the free space may be what a later page holds: nothing new goes there, and nothing adopted
    // is evicted to make room
    assert!(refusal(&mut s, now).contains("hand over"), "{}", refusal(&mut s, now));
    assert_eq!(s.tenants["a"].objects.len(), 1000);
    let second = s.handover(&page(&r, &held[1000..2000], false), now).unwrap();
    assert_eq!(adopted(&second.adopted), 1000);
    assert!(refusal(&mut s, now).contains("hand over"));
    let third = s.handover(&page(&r, &held[2000..], true), now).unwrap();
    assert_eq!(adopted(&third.adopted), 1000);
    assert_eq!((s.tenants["a"].objects.len(), s.adopted.objects), (3000, 3000));
    put(&mut s, "a", "new", 100, now).expect("placed once the report ended");
    // a page after the last is refused, and so is a page of a mount the leader does not know
    assert_eq!(
        s.handover(&page(&r, &[], true), now).unwrap_err().code,
        ErrorCode::InvalidArgument
    );
    let stale = HandoverRequest {
        mount_id: r.mount_id ^ 2,
        ..page(&r, &[], true)
    };
    assert_eq!(s.handover(&stale, now).unwrap_err().code, ErrorCode::StaleMount);
}

/// A member unmounted for falling behind on what it was told hands over nothing, in any page, and
/// still takes no new value until its last page: its report may name ranges it never freed.
/// A page is read packed or as messages, never both; one that does not read whole is refused
/// before anything of it is adopted, and the report goes on from the same place.
#[test]
fn a_page_packed_badly_or_both_ways_is_refused_and_adopts_nothing() {
    let (mut s, now, held) = leader_and_holdings();
    let r = s.mount(&first_page(&held[..1000], MIB), now).unwrap();
    let both = HandoverRequest {
        holdings: held[1000..1010].to_vec(),
        ..page(&r, &held[1000..2000], false)
    };
    let e = s.handover(&both, now).unwrap_err();
    assert!(e.message.contains("one or the other"), "{}", e.message);
    let mut cut = page(&r, &held[1000..2000], false);
    cut.packed.truncate(cut.packed.len() - 1);
    let e = s.handover(&cut, now).unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidArgument);
    assert!(e.message.contains("record 999 "), "{}", e.message);
    assert_eq!(s.tenants["a"].objects.len(), 1000, "nothing of either adopted");
    let whole = s.handover(&page(&r, &held[1000..2000], false), now).unwrap();
    assert_eq!(adopted(&whole.adopted), 1000);
}

#[test]
fn a_distrusted_members_pages_adopt_nothing() {
    let (mut s, now, held) = leader_and_holdings();
    s.distrusted.insert(1);
    let r = s.mount(&first_page(&held[..1000], MIB), now).unwrap();
    assert_eq!((adopted(&r.adopted), r.adopted.len()), (0, 1000));
    refusal(&mut s, now);
    let last = s.handover(&page(&r, &held[1000..], true), now).unwrap();
    assert_eq!((adopted(&last.adopted), last.adopted.len()), (0, 2000));
    assert!(s.tenants["a"].objects.is_empty());
    put(&mut s, "a", "new", 100, now).unwrap();
}

/// A page that would take the report past what its segment can hold is refused.
#[test]
fn a_report_longer_than_its_segment_holds_is_refused() {
    let (mut s, now, held) = leader_and_holdings();
    // 2,048 places of 64 bytes
    let r = s.mount(&first_page(&held[..2000], 128 * 1024), now).unwrap();
    let e = s.handover(&page(&r, &held[2000..2100], false), now).unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidArgument);
    assert!(e.message.contains("at most 2048"), "{}", e.message);
}

/// Pages sent ahead of their answers are adopted in the report's order: one that comes before
/// the pages preceding it changes nothing and is told to wait, and a page sent twice is refused.
#[test]
fn pages_are_adopted_in_the_reports_order_whatever_order_they_come_in() {
    use super::PageTurn;
    let (mut s, now, held) = leader_and_holdings();
    let r = s.mount(&first_page(&held[..1000], MIB), now).unwrap();
    // as messages: what the gRPC face makes of a packed page before it checks the seals
    let numbered = |from: usize, to: usize, last: bool| HandoverRequest {
        first: from as u64,
        holdings: held[from..to].to_vec(),
        ..page(&r, &[], last)
    };
    let vouching = s.vouching();
    let (second, third) = (numbered(1000, 2000, false), numbered(2000, 3000, true));
    let third_sealed = vouching.sealed_all(&third.holdings);
    let early = s.handover_sealed(&third, &vouching, &third_sealed, now).unwrap();
    assert_eq!(early, PageTurn::Early);
    assert_eq!(s.tenants["a"].objects.len(), 1000, "an early page adopts nothing");
    assert!(third_sealed.iter().all(|s| *s), "every seal of the page verifies");
    let sealed = vouching.sealed_all(&second.holdings);
    let PageTurn::Adopted(a) = s.handover_sealed(&second, &vouching, &sealed, now).unwrap() else {
        panic!("the second page's turn has come");
    };
    assert_eq!(adopted(&a), 1000);
    let PageTurn::Adopted(a) = s.handover_sealed(&third, &vouching, &third_sealed, now).unwrap() else {
        panic!("the third page's turn has come");
    };
    assert_eq!(adopted(&a), 1000);
    assert_eq!(s.tenants["a"].objects.len(), 3000);
    put(&mut s, "a", "new", 100, now).expect("placed once the last page is adopted");

    // a page sent again, to a report still going on, is refused
    let r = s
        .mount(&first_page(&held[..1000], MIB * 2), now)
        .unwrap_or_else(|e| panic!("{e}"));
    let again = HandoverRequest {
        first: 500,
        ..page(&r, &held[500..510], false)
    };
    let e = s.handover(&again, now).unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidArgument);
    assert!(e.message.contains("sent once"), "{}", e.message);
}
