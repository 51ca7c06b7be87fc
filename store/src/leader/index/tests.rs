//! The index's own tests: orders, reservations, pages, keys, chunks, size.

use std::time::{Duration, Instant};

use super::slots::CHUNK;
use super::*;
use crate::leader::objects::Resident;

fn object(last_used: u64, in_memory: bool, state: ObjectState) -> Object {
    Object {
        member: 1,
        mount_id: 1,
        memory: in_memory.then_some(Resident {
            offset: 0,
            allocation: 1,
            ready: true,
        }),
        disk: (!in_memory).then_some(7),
        size: 10,
        len: 64,
        charge: 0,
        state,
        lease_until: None,
        last_used,
    }
}

fn order<'a>(it: impl Iterator<Item = (Name<'a>, Object)>) -> Vec<String> {
    it.map(|(k, _)| k.to_string()).collect()
}

#[test]
fn objects_are_walked_least_recently_used_first_in_memory_and_on_disk_apart() {
    let mut o = Objects::default();
    o.insert("c", object(30, true, ObjectState::Committed)).unwrap();
    o.insert("a", object(10, true, ObjectState::Committed)).unwrap();
    o.insert("d", object(5, false, ObjectState::Committed)).unwrap();
    o.insert("b", object(20, true, ObjectState::Committed)).unwrap();
    assert_eq!(order(o.in_memory_by_last_use()), ["a", "b", "c"]);
    assert_eq!(order(o.on_disk_by_last_use()), ["d"]);
    // a read of a moves it last; c leaves memory for its disk copy
    o.get_mut("a").unwrap().last_used = 40;
    o.get_mut("c").unwrap().memory = None;
    assert_eq!(order(o.in_memory_by_last_use()), ["b", "a"]);
    assert_eq!(order(o.on_disk_by_last_use()), ["d", "c"]);
    assert_eq!(o.on_disk_only(), 2);
    // removed and replaced objects leave their places; a freed slot is taken again
    assert_eq!(o.remove("b").unwrap().last_used, 20);
    assert!(
        o.insert("a", object(1, false, ObjectState::Committed))
            .unwrap()
            .is_some()
    );
    o.insert("e", object(50, true, ObjectState::Committed)).unwrap();
    assert_eq!(order(o.in_memory_by_last_use()), ["e"]);
    assert_eq!(order(o.on_disk_by_last_use()), ["a", "d", "c"]);
    assert_eq!((o.len(), o.slots.len()), (4, 4));
    let mut keys: Vec<String> = o.keys().map(|k| k.to_string()).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["a", "c", "d", "e"]);
    assert_eq!(o.of("e").last_used, 50);
    assert!(o.get("b").is_none() && !o.contains_key("b"));
}

#[test]
fn reservations_are_found_by_when_they_are_due_until_committed() {
    let t0 = Instant::now();
    let reserved = |put_id, secs| ObjectState::Reserved {
        put_id,
        reclaim_at: t0 + Duration::from_secs(secs),
    };
    let mut o = Objects::default();
    o.insert("late", object(1, true, reserved(1, 9))).unwrap();
    o.insert("soon", object(2, true, reserved(2, 3))).unwrap();
    o.insert("kept", object(3, true, reserved(3, 1))).unwrap();
    assert_eq!(
        o.in_memory_by_last_use().count(),
        0,
        "nothing evicts a value being written"
    );
    o.get_mut("kept").unwrap().state = ObjectState::Committed;
    assert_eq!(
        order(o.in_memory_by_last_use()),
        ["kept"],
        "committed, it is in the order"
    );
    assert_eq!(
        o.of("soon").state,
        reserved(2, 3),
        "a reservation's put and time are kept"
    );
    assert_eq!(o.reclaimable(t0).count(), 0);
    let due = |o: &Objects, secs| -> Vec<String> {
        o.reclaimable(t0 + Duration::from_secs(secs))
            .map(|k| k.to_string())
            .collect()
    };
    assert_eq!(due(&o, 5), ["soon"]);
    assert_eq!(due(&o, 9), ["soon", "late"]);
    o.remove("soon");
    assert_eq!(due(&o, 9), ["late"]);
}

/// A walk in pages sees every object that keeps its slot exactly once, however others come
/// and go meanwhile, and no page looks at more slots than asked.
#[test]
fn a_walk_in_pages_sees_each_object_that_stays_once() {
    let mut o = Objects::default();
    for i in 0..10_000u64 {
        o.insert(&format!("k{i}"), object(i, true, ObjectState::Committed))
            .unwrap();
    }
    let mut seen = std::collections::BTreeMap::new();
    let (mut from, mut pages, mut n) = (Some(0), 0, 0u64);
    while let Some(at) = from {
        let (page, next) = o.page(at, 1000);
        assert!(page.len() <= 1000);
        for (k, _) in page {
            *seen.entry(k.to_string()).or_insert(0) += 1;
        }
        from = next;
        pages += 1;
        // between pages: 50 go, 50 come (in the freed slots, behind or ahead of the walk)
        for _ in 0..50 {
            o.remove(&format!("k{}", (n * 97) % 10_000));
            o.insert(&format!("new{n}"), object(n, true, ObjectState::Committed))
                .unwrap();
            n += 1;
        }
    }
    assert!(pages >= 10);
    let gone: std::collections::BTreeSet<String> = (0..n).map(|i| format!("k{}", (i * 97) % 10_000)).collect();
    for i in 0..10_000u64 {
        let k = format!("k{i}");
        if !gone.contains(&k) {
            assert_eq!(seen.get(&k), Some(&1), "{k} stayed, and is seen once");
        }
    }
    assert!(seen.values().all(|n| *n == 1));
}

/// Connector keys (packed) and other keys live side by side, found, written out and removed
/// exactly; a namespace is forgotten with its last key.
#[test]
fn connector_keys_are_found_and_written_back_exactly() {
    let mut o = Objects::default();
    let ns = "vllm/Qwen/Qwen2.5-0.5B/0123456789abcdef/tp0of1";
    let keys: Vec<String> = (0..100u64).map(|i| format!("{ns}/{i:032x}")).collect();
    for (i, k) in keys.iter().enumerate() {
        o.insert(k, object(i as u64, true, ObjectState::Committed)).unwrap();
    }
    o.insert("plain", object(500, true, ObjectState::Committed)).unwrap();
    o.insert(
        &format!("{ns}/{:032X}", 0xabc),
        object(501, true, ObjectState::Committed),
    )
    .unwrap();
    assert_eq!(o.len(), 102);
    assert_eq!(o.keys.namespaces(), 1);
    assert_eq!(o.get(&keys[42]).unwrap().last_used, 42);
    assert!(o.get(&format!("{ns}/{:032x}", 100)).is_none());
    assert!(o.get(&format!("vllm/other/{:032x}", 1)).is_none());
    assert_eq!(
        o.get(&format!("{ns}/{:032X}", 0xabc)).unwrap().last_used,
        501,
        "uppercase is another key"
    );
    let mut written: Vec<String> = o.keys().map(|k| k.to_string()).collect();
    written.sort();
    let mut want = keys.clone();
    want.extend(["plain".to_owned(), format!("{ns}/{:032X}", 0xabc)]);
    want.sort();
    assert_eq!(written, want);
    for k in &keys {
        assert!(o.remove(k).is_some());
    }
    assert_eq!((o.len(), o.keys.namespaces()), (2, 0));
    assert!(o.get(&keys[0]).is_none());
}

/// Slots past the first chunk are found, walked and taken again like the first.
#[test]
fn slots_span_chunks() {
    let mut o = Objects::default();
    let n = CHUNK as u64 + 100;
    for i in 0..n {
        o.insert(&format!("k{i}"), object(i, true, ObjectState::Committed))
            .unwrap();
    }
    assert_eq!((o.slots.chunks(), o.slots.len()), (2, n as usize));
    assert_eq!(o.get(&format!("k{}", n - 1)).unwrap().last_used, n - 1);
    assert!(o.remove(&format!("k{}", CHUNK + 5)).is_some());
    o.insert("again", object(n, true, ObjectState::Committed)).unwrap();
    assert_eq!(o.slots.len(), n as usize, "the freed slot is taken again");
    assert_eq!(o.iter().count(), n as usize);
    let (page, next) = o.page(CHUNK - 10, 20);
    assert_eq!((page.len(), next), (20, Some(CHUNK + 10)));
    assert_eq!(
        o.in_memory_by_last_use().last().map(|(k, _)| k.to_string()),
        Some("again".into())
    );
}

/// The index's size follows what it holds: a connector's key costs a slot and a table entry (about
/// 100 bytes), any other key its bytes besides.
#[test]
fn its_size_follows_what_it_holds() {
    let mut o = Objects::default();
    let empty = o.bytes();
    let ns = "vllm/m/0123456789abcdef/tp0of1";
    for i in 0..1000u64 {
        o.insert(&format!("{ns}/{i:032x}"), object(i, true, ObjectState::Committed))
            .unwrap();
    }
    let packed = o.bytes();
    let each = (packed - empty) / 1000;
    assert!((72 + 9..=130).contains(&each), "{each} bytes an object");
    for i in 0..1000u64 {
        o.insert(&format!("raw-key-{i:064}"), object(i, true, ObjectState::Committed))
            .unwrap();
    }
    let both = o.bytes();
    assert!(
        both - packed > 1000 * (72 + 72 + 16),
        "a raw key's bytes count: {both} after {packed}"
    );
    for i in 0..1000u64 {
        o.remove(&format!("raw-key-{i:064}"));
    }
    assert!(o.bytes() < both, "its keys' bytes are given back");
    assert_eq!(o.keys.raw_bytes(), 0);
}

/// Many objects in and out keep the table and the orders in step.
#[test]
fn the_orders_follow_every_change() {
    let mut o = Objects::default();
    for i in 0..2000u64 {
        o.insert(&format!("k{i}"), object(i, i % 3 != 0, ObjectState::Committed))
            .unwrap();
    }
    for i in (0..2000u64).step_by(2) {
        assert!(o.remove(&format!("k{i}")).is_some());
    }
    for i in (1..2000u64).step_by(4) {
        o.get_mut(&format!("k{i}")).unwrap().last_used = 10_000 - i;
    }
    assert_eq!(o.len(), 1000);
    assert_eq!(
        o.in_memory_by_last_use().count() + o.on_disk_by_last_use().count(),
        1000
    );
    let uses: Vec<u64> = o.in_memory_by_last_use().map(|(_, o)| o.last_used).collect();
    assert!(uses.is_sorted(), "least recently used first");
    for (k, ob) in o.iter() {
        assert_eq!(o.get(&k.to_string()).unwrap().last_used, ob.last_used);
    }
}

/// A lease is kept beside its slot while it lasts, read back exactly, and forgotten once ended; a
/// lease alone changing does not move the object in its order.
#[test]
fn leases_are_kept_until_they_end() {
    let t0 = Instant::now();
    let mut o = Objects::default();
    for (i, k) in ["a", "b", "c"].into_iter().enumerate() {
        o.insert(k, object(i as u64, true, ObjectState::Committed)).unwrap();
    }
    o.get_mut("a").unwrap().lease(t0 + Duration::from_secs(5));
    o.get_mut("b").unwrap().lease(t0 + Duration::from_secs(1));
    o.get_mut("a").unwrap().lease(t0 + Duration::from_secs(2));
    assert_eq!(
        o.of("a").lease_until,
        Some(t0 + Duration::from_secs(5)),
        "a lease only grows"
    );
    assert_eq!(order(o.in_memory_by_last_use()), ["a", "b", "c"]);
    assert!(!o.of("a").evictable(t0 + Duration::from_secs(4)));
    o.end_leases(t0 + Duration::from_secs(1));
    assert_eq!((o.of("b").lease_until, o.leases.len()), (None, 1), "b's lease ended");
    assert!(o.of("b").evictable(t0));
    assert_eq!(o.remove("a").unwrap().lease_until, Some(t0 + Duration::from_secs(5)));
    assert!(
        o.leases.is_empty() && o.lease_ends.is_empty(),
        "a removed object's lease goes"
    );
    o.end_leases(t0 + Duration::from_secs(9));
    assert_eq!(o.of("c").lease_until, None);
}

/// `insert_new` holds a key once: a second object under it changes nothing, whatever its form.
#[test]
fn a_new_key_is_inserted_once() {
    let mut o = Objects::default();
    let ns = "vllm/m/0123456789abcdef/tp0of1";
    for key in [format!("{ns}/{:032x}", 7), "plain".to_owned()] {
        assert_eq!(o.insert_new(&key, object(1, true, ObjectState::Committed)), Ok(true));
        assert_eq!(o.insert_new(&key, object(2, false, ObjectState::Committed)), Ok(false));
        assert_eq!(o.of(&key).last_used, 1, "the first object stays");
    }
    assert_eq!((o.len(), o.keys.namespaces()), (2, 1));
    assert_eq!(order(o.in_memory_by_last_use()).len(), 2);
    assert_eq!(o.on_disk_only(), 0);
    assert_eq!(
        o.keys.raw_bytes(),
        "plain".len() + 16,
        "the refused key's bytes are not kept"
    );
}

#[test]
fn a_mounts_objects_go_together_and_nothing_else_does() {
    let t0 = Instant::now();
    let on = |member, mount_id, last_used, state| Object {
        member,
        mount_id,
        ..object(last_used, true, state)
    };
    let mut o = Objects::default();
    // mount 1 of member 1 holds every third object, reservations and disk-only ones among them;
    // member 2, and member 1's later mount 2, the others
    let mut gone = Vec::new();
    for i in 0..3 * CHUNK as u64 {
        let key = format!("k{i}");
        let (member, mount_id) = [(1, 1), (2, 1), (1, 2)][(i % 3) as usize];
        let state = if i % 7 == 0 {
            ObjectState::Reserved {
                put_id: i,
                reclaim_at: t0,
            }
        } else {
            ObjectState::Committed
        };
        let mut ob = on(member, mount_id, i, state);
        if i % 5 == 0 {
            (ob.memory, ob.disk) = (None, Some(i));
        }
        o.insert(&key, ob).unwrap();
        if (member, mount_id) == (1, 1) {
            gone.push(key);
        }
    }
    let mut told = Vec::new();
    let removed = o.remove_placed_in(1, 1, |k, ob| {
        assert_eq!((ob.member, ob.mount_id), (1, 1));
        told.push(k.to_string());
    });
    assert_eq!(removed, gone.len() as u64);
    assert_eq!(told, gone, "each told once, in slot order");
    assert_eq!(o.len(), 2 * CHUNK);
    assert!(gone.iter().all(|k| o.get(k).is_none()));
    assert!(o.get("k1").is_some_and(|ob| ob.member == 2) && o.get("k2").is_some_and(|ob| ob.mount_id == 2));
    // the orders and reservations kept exactly the others
    let walked = o.in_memory_by_last_use().count() + o.on_disk_by_last_use().count() + o.reclaimable(t0).count();
    assert_eq!(walked, 2 * CHUNK);
    assert!(
        o.in_memory_by_last_use()
            .chain(o.on_disk_by_last_use())
            .all(|(_, ob)| (ob.member, ob.mount_id) != (1, 1))
    );
    // a mount with nothing left, or never used, removes nothing; freed slots are taken again
    assert_eq!(o.remove_placed_in(1, 1, |_, _| panic!("nothing is left")), 0);
    assert_eq!(o.remove_placed_in(9, 9, |_, _| panic!("never used")), 0);
    let slots = o.slots.len();
    o.insert("new", on(1, 1, 1, ObjectState::Committed)).unwrap();
    assert_eq!((o.slots.len(), o.of("new").member), (slots, 1));
    assert_eq!(o.remove_placed_in(1, 1, |_, _| {}), 1);
    // a tenant all of whose objects are there is emptied at once, each told
    let (mut told, left) = (0, o.len() as u64);
    let mut all = Objects::default();
    for i in 0..CHUNK as u64 + 10 {
        all.insert(&format!("a{i}"), on(3, 1, i, ObjectState::Committed))
            .unwrap();
    }
    assert_eq!(
        all.remove_placed_in(3, 1, |_, ob| told += ob.last_used + 1),
        CHUNK as u64 + 10
    );
    assert_eq!(told, (1..=CHUNK as u64 + 10).sum::<u64>());
    assert_eq!(
        (all.len(), all.slots.len(), all.in_memory_by_last_use().count()),
        (0, 0, 0)
    );
    all.insert("a0", on(3, 1, 0, ObjectState::Committed)).unwrap();
    assert_eq!((all.len(), o.len() as u64), (1, left));
}
