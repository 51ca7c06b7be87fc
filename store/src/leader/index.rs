//! A tenant's objects: found by key, and walked in the orders that eviction and reclaiming take
//! them in, so that a path which takes a few objects looks at those, not at every object the
//! tenant holds.
//!
//! - **By key**: a hash table of slot numbers (SipHash, keyed per process, as the standard map);
//!   each key is kept once, in its slot, a connector's key packed to 20 bytes (`index/keys.rs`).
//! - **By last use**, apart for values with bytes in memory and values only on a disk tier: the
//!   least recently used comes first, which is what eviction takes first (`eviction.rs`).
//! - **Reservations by when they are reclaimed** (`State::reap_reservations`).
//!
//! Every change to an object goes through [`ObjectMut`], which puts the object back in its place
//! in those orders when it is dropped: the orders cannot drift from the objects.
//!
//! Growing never stops the leader for long: slots come in chunks of [`CHUNK`] that never move,
//! and the hash table keeps 32 bits of each key's hash beside its slot number, so when it doubles
//! it re-files its entries without reading a slot (at 7 million objects the table's doubling had
//! held the state lock for over a second).

use std::collections::BTreeSet;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::ops::{Deref, DerefMut};
use std::time::Instant;

use hashbrown::HashTable;

use super::objects::{Object, ObjectState};

mod keys;
pub use keys::Name;
use keys::{Key, Prefixes};

type Id = usize;

/// Slots per chunk: a chunk is allocated whole once and never moves.
const CHUNK: usize = 1 << 16;

#[derive(Debug)]
struct Slot {
    key: Key,
    object: Object,
}

/// The slots, in chunks.
#[derive(Debug, Default)]
struct Slots {
    chunks: Vec<Vec<Option<Slot>>>,
    len: usize,
}

impl Slots {
    fn len(&self) -> usize {
        self.len
    }

    fn get(&self, id: Id) -> Option<&Slot> {
        self.chunks.get(id / CHUNK)?.get(id % CHUNK)?.as_ref()
    }

    fn entry(&mut self, id: Id) -> Option<&mut Option<Slot>> {
        self.chunks.get_mut(id / CHUNK)?.get_mut(id % CHUNK)
    }

    /// Adds a slot at the end; returns its number.
    fn push(&mut self, slot: Slot) -> Id {
        if self.chunks.last().is_none_or(|c| c.len() == CHUNK) {
            self.chunks.push(Vec::with_capacity(CHUNK));
        }
        if let Some(chunk) = self.chunks.last_mut() {
            chunk.push(Some(slot));
        }
        self.len += 1;
        self.len - 1
    }

    /// Slots `from..to`.
    fn range(&self, from: Id, to: Id) -> impl Iterator<Item = &Slot> {
        (from..to.min(self.len)).filter_map(|id| self.get(id))
    }

    fn iter(&self) -> impl Iterator<Item = &Slot> {
        self.chunks.iter().flatten().flatten()
    }
}

/// What the hash table keeps of a key's hash.
fn short(hash: u64) -> u32 {
    (hash ^ (hash >> 32)) as u32
}

/// The hash the table files an entry under, from its [`short`] hash alone.
fn filed(short: u32) -> u64 {
    u64::from(short) | (u64::from(short) << 32)
}

/// Where an object stands in the orders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Places {
    last_used: u64,
    in_memory: bool,
    reclaim_at: Option<Instant>,
}

impl Places {
    fn of(o: &Object) -> Places {
        Places {
            last_used: o.last_used,
            in_memory: o.memory.is_some(),
            reclaim_at: match o.state {
                ObjectState::Reserved { reclaim_at, .. } => Some(reclaim_at),
                ObjectState::Committed => None,
            },
        }
    }
}

/// A tenant's objects by key, by last use, and by reclaim time.
#[derive(Debug, Default)]
pub struct Objects {
    slots: Slots,
    /// slots free for the next insert
    free: Vec<Id>,
    /// each object's slot, and the [`short`] hash of its key
    by_key: HashTable<(Id, u32)>,
    hasher: RandomState,
    /// the namespaces of its packed keys
    prefixes: Prefixes,
    /// objects with bytes in memory, least recently used first
    in_memory: BTreeSet<(u64, Id)>,
    /// objects only on a disk tier, least recently used first
    on_disk: BTreeSet<(u64, Id)>,
    /// reserved objects, by when an abandoned put gives its space back
    reserved: BTreeSet<(Instant, Id)>,
    /// heap bytes of the keys kept as their bytes
    raw_key_bytes: usize,
}

impl Objects {
    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    fn slot(&self, id: Id) -> Option<&Slot> {
        self.slots.get(id)
    }

    fn find(&self, key: &str) -> Option<Id> {
        let form = self.prefixes.form(key)?;
        let h = short(self.hasher.hash_one(form));
        let slots = &self.slots;
        let same = |(id, hh): &(Id, u32)| *hh == h && slots.get(*id).is_some_and(|s| s.key.form() == form);
        self.by_key.find(filed(h), same).map(|(id, _)| *id)
    }

    fn name<'a>(&'a self, slot: &'a Slot) -> Name<'a> {
        self.prefixes.name(&slot.key)
    }

    pub fn get(&self, key: &str) -> Option<&Object> {
        self.slot(self.find(key)?).map(|s| &s.object)
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.find(key).is_some()
    }

    /// The object under `key`, to change: its places in the orders follow when the handle drops.
    pub fn get_mut(&mut self, key: &str) -> Option<ObjectMut<'_>> {
        let id = self.find(key)?;
        let before = Places::of(&self.slot(id)?.object);
        Some(ObjectMut {
            objects: self,
            id,
            before,
        })
    }

    /// Holds `object` under `key`; returns the object it replaces.
    pub fn insert(&mut self, key: &str, object: Object) -> Option<Object> {
        let replaced = self.remove(key);
        let places = Places::of(&object);
        let key = self.prefixes.keep(key);
        self.raw_key_bytes += key.heap_bytes();
        let h = short(self.hasher.hash_one(key.form()));
        let slot = Slot { key, object };
        let id = match self.free.pop() {
            Some(id) => {
                if let Some(free) = self.slots.entry(id) {
                    *free = Some(slot);
                }
                id
            }
            None => self.slots.push(slot),
        };
        self.place(id, places);
        self.by_key.insert_unique(filed(h), (id, h), |(_, h)| filed(*h));
        replaced
    }

    pub fn remove(&mut self, key: &str) -> Option<Object> {
        let form = self.prefixes.form(key)?;
        let h = short(self.hasher.hash_one(form));
        let slots = &self.slots;
        let same = |(id, hh): &(Id, u32)| *hh == h && slots.get(*id).is_some_and(|s| s.key.form() == form);
        let ((id, _), _) = self.by_key.find_entry(filed(h), same).ok()?.remove();
        let slot = self.slots.entry(id)?.take()?;
        self.unplace(id, Places::of(&slot.object));
        self.prefixes.release(&slot.key);
        self.raw_key_bytes = self.raw_key_bytes.saturating_sub(slot.key.heap_bytes());
        self.free.push(id);
        Some(slot.object)
    }

    fn place(&mut self, id: Id, p: Places) {
        if p.in_memory {
            self.in_memory.insert((p.last_used, id));
        } else {
            self.on_disk.insert((p.last_used, id));
        }
        if let Some(at) = p.reclaim_at {
            self.reserved.insert((at, id));
        }
    }

    fn unplace(&mut self, id: Id, p: Places) {
        if p.in_memory {
            self.in_memory.remove(&(p.last_used, id));
        } else {
            self.on_disk.remove(&(p.last_used, id));
        }
        if let Some(at) = p.reclaim_at {
            self.reserved.remove(&(at, id));
        }
    }

    /// The objects in slots `from..` (at most `slots` of them, free ones included), and the slot
    /// the next page starts at (`None`: this page reached the end). An object that keeps its slot
    /// is in exactly one page of a walk, however the others change meanwhile.
    pub fn page(&self, from: usize, slots: usize) -> (Vec<(Name<'_>, &Object)>, Option<usize>) {
        let end = from.saturating_add(slots).min(self.slots.len());
        let page = self.slots.range(from, end).map(|s| (self.name(s), &s.object)).collect();
        (page, (end < self.slots.len()).then_some(end))
    }

    /// Every object with its key, in no order.
    pub fn iter(&self) -> impl Iterator<Item = (Name<'_>, &Object)> {
        self.slots.iter().map(|s| (self.name(s), &s.object))
    }

    pub fn keys(&self) -> impl Iterator<Item = Name<'_>> {
        self.iter().map(|(k, _)| k)
    }

    fn entries<'a>(
        &'a self,
        ids: impl Iterator<Item = &'a (u64, Id)> + 'a,
    ) -> impl Iterator<Item = (Name<'a>, &'a Object)> {
        ids.filter_map(|(_, id)| self.slot(*id))
            .map(|s| (self.name(s), &s.object))
    }

    /// The objects with bytes in memory, least recently used first.
    pub fn in_memory_by_last_use(&self) -> impl Iterator<Item = (Name<'_>, &Object)> {
        self.entries(self.in_memory.iter())
    }

    /// The objects only on a disk tier, least recently used first.
    pub fn on_disk_by_last_use(&self) -> impl Iterator<Item = (Name<'_>, &Object)> {
        self.entries(self.on_disk.iter())
    }

    /// About the bytes it takes (`kvstore_leader_index_bytes`): the slots in use, the key table's
    /// buckets, the orders' entries (a B-tree's nodes half again their size), the free list,
    /// the namespaces, and the keys kept as their bytes.
    pub fn bytes(&self) -> u64 {
        let slots = self.slots.len() * std::mem::size_of::<Option<Slot>>();
        let table = self.by_key.capacity() * (std::mem::size_of::<(Id, u32)>() + 1);
        let entries = self.in_memory.len() + self.on_disk.len() + self.reserved.len();
        let orders = entries * std::mem::size_of::<(Instant, Id)>() * 3 / 2;
        let free = self.free.capacity() * std::mem::size_of::<Id>();
        (slots + table + orders + free + self.prefixes.bytes() + self.raw_key_bytes) as u64
    }

    /// How many objects are only on a disk tier.
    pub fn on_disk_only(&self) -> usize {
        self.on_disk.len()
    }

    /// The keys of reservations due to be reclaimed at `now`, the longest due first.
    pub fn reclaimable(&self, now: Instant) -> impl Iterator<Item = Name<'_>> {
        self.reserved
            .iter()
            .take_while(move |(at, _)| *at <= now)
            .filter_map(|(_, id)| self.slot(*id))
            .map(|s| self.name(s))
    }
}

/// For tests: `objects["key"]`.
#[cfg(test)]
impl std::ops::Index<&str> for Objects {
    type Output = Object;

    fn index(&self, key: &str) -> &Object {
        self.get(key).unwrap_or_else(|| panic!("no object {key:?}"))
    }
}

/// An object being changed: when dropped, it takes its places in the orders by what it became.
#[derive(Debug)]
pub struct ObjectMut<'a> {
    objects: &'a mut Objects,
    id: Id,
    before: Places,
}

impl ObjectMut<'_> {
    fn slot(&self) -> &Slot {
        self.objects
            .slot(self.id)
            .expect("a handle is made for a live slot, which lives as long as the handle")
    }
}

impl Deref for ObjectMut<'_> {
    type Target = Object;

    fn deref(&self) -> &Object {
        &self.slot().object
    }
}

impl DerefMut for ObjectMut<'_> {
    fn deref_mut(&mut self) -> &mut Object {
        let slot = self.objects.slots.entry(self.id).and_then(Option::as_mut);
        &mut slot
            .expect("a handle is made for a live slot, which lives as long as the handle")
            .object
    }
}

impl Drop for ObjectMut<'_> {
    fn drop(&mut self) {
        let after = Places::of(&self.slot().object);
        if after != self.before {
            self.objects.unplace(self.id, self.before);
            self.objects.place(self.id, after);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

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
            lease_until: Instant::now(),
            last_used,
        }
    }

    fn order<'a>(it: impl Iterator<Item = (Name<'a>, &'a Object)>) -> Vec<String> {
        it.map(|(k, _)| k.to_string()).collect()
    }

    #[test]
    fn objects_are_walked_least_recently_used_first_in_memory_and_on_disk_apart() {
        let mut o = Objects::default();
        o.insert("c", object(30, true, ObjectState::Committed));
        o.insert("a", object(10, true, ObjectState::Committed));
        o.insert("d", object(5, false, ObjectState::Committed));
        o.insert("b", object(20, true, ObjectState::Committed));
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
        assert!(o.insert("a", object(1, false, ObjectState::Committed)).is_some());
        o.insert("e", object(50, true, ObjectState::Committed));
        assert_eq!(order(o.in_memory_by_last_use()), ["e"]);
        assert_eq!(order(o.on_disk_by_last_use()), ["a", "d", "c"]);
        assert_eq!((o.len(), o.slots.len()), (4, 4));
        let mut keys: Vec<String> = o.keys().map(|k| k.to_string()).collect();
        keys.sort_unstable();
        assert_eq!(keys, ["a", "c", "d", "e"]);
        assert_eq!(o["e"].last_used, 50);
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
        o.insert("late", object(1, true, reserved(1, 9)));
        o.insert("soon", object(2, true, reserved(2, 3)));
        o.insert("kept", object(3, true, reserved(3, 1)));
        o.get_mut("kept").unwrap().state = ObjectState::Committed;
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
            o.insert(&format!("k{i}"), object(i, true, ObjectState::Committed));
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
                o.insert(&format!("new{n}"), object(n, true, ObjectState::Committed));
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
            o.insert(k, object(i as u64, true, ObjectState::Committed));
        }
        o.insert("plain", object(500, true, ObjectState::Committed));
        o.insert(
            &format!("{ns}/{:032X}", 0xabc),
            object(501, true, ObjectState::Committed),
        );
        assert_eq!(o.len(), 102);
        assert_eq!(o.prefixes.len(), 1);
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
        assert_eq!((o.len(), o.prefixes.len()), (2, 0));
        assert!(o.get(&keys[0]).is_none());
    }

    /// Slots past the first chunk are found, walked and taken again like the first.
    #[test]
    fn slots_span_chunks() {
        let mut o = Objects::default();
        let n = CHUNK as u64 + 100;
        for i in 0..n {
            o.insert(&format!("k{i}"), object(i, true, ObjectState::Committed));
        }
        assert_eq!((o.slots.chunks.len(), o.slots.len()), (2, n as usize));
        assert_eq!(o.get(&format!("k{}", n - 1)).unwrap().last_used, n - 1);
        assert!(o.remove(&format!("k{}", CHUNK + 5)).is_some());
        o.insert("again", object(n, true, ObjectState::Committed));
        assert_eq!(o.slots.len(), n as usize, "the freed slot is taken again");
        assert_eq!(o.iter().count(), n as usize);
        let (page, next) = o.page(CHUNK - 10, 20);
        assert_eq!((page.len(), next), (20, Some(CHUNK + 10)));
        assert_eq!(
            o.in_memory_by_last_use().last().map(|(k, _)| k.to_string()),
            Some("again".into())
        );
    }

    /// The index's size follows what it holds, a connector's key costing no heap bytes.
    #[test]
    fn its_size_follows_what_it_holds() {
        let mut o = Objects::default();
        let empty = o.bytes();
        let ns = "vllm/m/0123456789abcdef/tp0of1";
        for i in 0..1000u64 {
            o.insert(&format!("{ns}/{i:032x}"), object(i, true, ObjectState::Committed));
        }
        let packed = o.bytes();
        assert!(packed > empty + 1000 * 150, "{packed}");
        for i in 0..1000u64 {
            o.insert(&format!("raw-key-{i:064}"), object(i, true, ObjectState::Committed));
        }
        let both = o.bytes();
        assert!(
            both - packed > 1000 * (150 + 72),
            "a raw key's bytes count: {both} after {packed}"
        );
        for i in 0..1000u64 {
            o.remove(&format!("raw-key-{i:064}"));
        }
        assert!(o.bytes() < both, "its keys' bytes are given back");
        assert_eq!(o.raw_key_bytes, 0);
    }

    /// Many objects in and out keep the table and the orders in step.
    #[test]
    fn the_orders_follow_every_change() {
        let mut o = Objects::default();
        for i in 0..2000u64 {
            o.insert(&format!("k{i}"), object(i, i % 3 != 0, ObjectState::Committed));
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
}
