//! A tenant's objects: found by key, and walked in the orders that eviction and reclaiming take
//! them in, so that a path which takes a few objects looks at those, not at every object the
//! tenant holds; in about 90 bytes an object (`store/README.md`, "Scale").
//!
//! - **Slots** (`index/slots.rs`): each object packed into 72 bytes, in chunks that never move.
//! - **By key** (`index/table.rs`): slot numbers by the key's hash (SipHash, keyed per process,
//!   as the standard map), in shards that grow apart and re-file entries without reading a
//!   slot, so growing never holds the state lock long. A key is kept once, in its slot
//!   (`index/keys.rs`).
//! - **By last use** (`index/order.rs`), apart for values with bytes in memory and values only
//!   on a disk tier: the least recently used comes first, which is what eviction takes first
//!   (`eviction.rs`). Values still being written are not in these orders: nothing evicts them.
//! - **Reservations** (the few objects being written) beside the slots, by slot and by when
//!   they are reclaimed (`State::reap_reservations`); **read leases** likewise, by slot and by
//!   when they end, forgotten once they did (`State::end_leases`).
//!
//! Objects are read out of their slots as [`Object`] values; every change goes through
//! [`ObjectMut`], which packs the object back and puts it in its place in the orders when it is
//! dropped: the orders cannot drift from the objects.

use std::collections::hash_map::RandomState;
use std::collections::{BTreeSet, HashMap};
use std::hash::BuildHasher;
use std::ops::{Deref, DerefMut};
use std::time::Instant;

use super::objects::{Object, ObjectState};

mod keys;
mod numbered;
mod order;
mod slots;
mod table;
#[cfg(test)]
mod tests;

pub use keys::Name;
use keys::{Form, Keys};
use numbered::Shared;
use order::Order;
use slots::{Id, NIL, Slot, Slots};
use table::KeyTable;

/// Whether slot `id` holds the key of `form`.
fn holds<'a>(slots: &'a Slots, keys: &'a Keys, form: Form<'a>) -> impl Fn(Id) -> bool + 'a {
    move |id| slots.get(id).is_some_and(|s| keys.form_of(&s.key) == form)
}

/// The index holds as many objects as slot numbers go (about four billion); no grant comes near.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the leader's index of this tenant is full ({} objects)", NIL - 1)]
pub struct IndexFull;

/// Where an object stands in the orders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Places {
    last_used: u64,
    in_memory: bool,
    reservation: Option<(u64, Instant)>,
}

impl Places {
    fn of(o: &Object) -> Places {
        Places {
            last_used: o.last_used,
            in_memory: o.memory.is_some(),
            reservation: match o.state {
                ObjectState::Reserved { put_id, reclaim_at } => Some((put_id, reclaim_at)),
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
    /// each object's slot, by its key's hash
    by_key: KeyTable,
    hasher: RandomState,
    keys: Keys,
    /// the members and mounts its objects were placed in
    mounts: Shared<(u64, u64)>,
    /// committed objects with bytes in memory, least recently used first
    in_memory: Order,
    /// committed objects only on a disk tier, least recently used first
    on_disk: Order,
    /// reserved objects' put and reclaim time, by slot
    reservations: HashMap<Id, (u64, Instant)>,
    /// reserved objects, by when an abandoned put gives its space back
    reserved: BTreeSet<(Instant, Id)>,
    /// leased objects' lease end, by slot, until [`end_leases`](Self::end_leases) forgets it
    leases: HashMap<Id, Instant>,
    /// the same, by lease end
    lease_ends: BTreeSet<(Instant, Id)>,
}

impl Objects {
    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_key.len() == 0
    }

    fn hash(&self, form: Form<'_>) -> u64 {
        self.hasher.hash_one(form)
    }

    fn find(&self, key: &str) -> Option<Id> {
        let form = self.keys.form(key)?;
        self.by_key.find(self.hash(form), holds(&self.slots, &self.keys, form))
    }

    /// The object in slot `id`.
    fn object(&self, id: Id) -> Option<Object> {
        let slot = self.slots.get(id)?;
        Some(self.unpack(id, slot))
    }

    fn unpack(&self, id: Id, slot: &Slot) -> Object {
        let mount = self.mounts.get(slot.mount).copied().unwrap_or_default();
        let reservation = if slot.reserved() {
            self.reservations.get(&id)
        } else {
            None
        };
        let state = match reservation {
            Some((put_id, reclaim_at)) => ObjectState::Reserved {
                put_id: *put_id,
                reclaim_at: *reclaim_at,
            },
            None => ObjectState::Committed,
        };
        let lease_until = if slot.leased() {
            self.leases.get(&id).copied()
        } else {
            None
        };
        slot.object(mount, state, lease_until, self.keys.name(&slot.key).byte_len())
    }

    /// Slot `id`'s key and object.
    fn entry(&self, id: Id) -> Option<(Name<'_>, Object)> {
        let slot = self.slots.get(id)?;
        Some((self.keys.name(&slot.key), self.unpack(id, slot)))
    }

    pub fn get(&self, key: &str) -> Option<Object> {
        self.object(self.find(key)?)
    }

    #[cfg(test)]
    pub fn contains_key(&self, key: &str) -> bool {
        self.find(key).is_some()
    }

    /// The object under `key`, to change: it is packed back, and its places in the orders
    /// follow, when the handle drops.
    pub fn get_mut(&mut self, key: &str) -> Option<ObjectMut<'_>> {
        let id = self.find(key)?;
        let object = self.object(id)?;
        Some(ObjectMut {
            before: object.clone(),
            object,
            objects: self,
            id,
        })
    }

    /// A slot is free or can be made for one more object.
    pub fn has_room(&self) -> bool {
        !self.free.is_empty() || self.slots.len() < (NIL - 1) as usize
    }

    /// Holds `object` under `key`; returns the object it replaces. Refused only when
    /// [`has_room`](Self::has_room) is not.
    pub fn insert(&mut self, key: &str, object: Object) -> Result<Option<Object>, IndexFull> {
        if !self.has_room() {
            return Err(IndexFull);
        }
        let replaced = self.remove(key);
        self.insert_new(key, object)?;
        Ok(replaced)
    }

    /// Holds `object` under `key` unless the key is held already (`Ok(false)`: nothing changed).
    /// One look-up where a check and an [`insert`](Self::insert) take three: adoption's way.
    pub fn insert_new(&mut self, key: &str, object: Object) -> Result<bool, IndexFull> {
        if !self.has_room() {
            return Err(IndexFull);
        }
        let kept = self.keys.keep(key).ok_or(IndexFull)?;
        let form = self.keys.form_of(&kept);
        let h = self.hash(form);
        if self.by_key.find(h, holds(&self.slots, &self.keys, form)).is_some() {
            self.keys.release(&kept);
            return Ok(false);
        }
        let Some(mount) = self
            .mounts
            .keep(&(object.member, object.mount_id), || (object.member, object.mount_id))
        else {
            self.keys.release(&kept);
            return Err(IndexFull);
        };
        let slot = Slot::new(kept, mount, &object);
        let id = match self.free.pop() {
            Some(id) => {
                if let Some(free) = self.slots.get_mut(id) {
                    *free = slot;
                }
                id
            }
            None => self.slots.push(slot).ok_or(IndexFull)?,
        };
        self.place(id, Places::of(&object));
        self.file_lease(id, object.lease_until);
        self.by_key.insert(h, id);
        Ok(true)
    }

    pub fn remove(&mut self, key: &str) -> Option<Object> {
        let form = self.keys.form(key)?;
        let id = self
            .by_key
            .remove(self.hash(form), holds(&self.slots, &self.keys, form))?;
        self.vacate(id)
    }

    /// Removes every object placed in mount `mount_id` of `member`, each handed to `each` with
    /// its key first; returns how many. The slots are walked only while some of them are left to
    /// find (the mount's count says how many), a key is read only for an object that goes, a
    /// tenant with none there is not walked at all, and one with all there is emptied at once.
    pub fn remove_placed_in(&mut self, member: u64, mount_id: u64, mut each: impl FnMut(Name<'_>, &Object)) -> u64 {
        let Some(mount) = self.mounts.number(&(member, mount_id)) else {
            return 0;
        };
        let (mut left, mut removed) = (self.mounts.uses(mount), 0);
        if left == self.len() as u64 {
            // all of them: told, then dropped at once, with no look-up, link or count undone
            for (id, slot) in self.slots.range(0, self.slots.len()) {
                each(self.keys.name(&slot.key), &self.unpack(id, slot));
            }
            *self = Objects::default();
            return left;
        }
        let mut id: Id = 0;
        while left > 0 && (id as usize) < self.slots.len() {
            if let Some(slot) = self.slots.get(id).filter(|s| s.mount == mount) {
                let form = self.keys.form_of(&slot.key);
                let h = self.hash(form);
                if let Some((name, object)) = self.entry(id) {
                    each(name, &object);
                }
                self.by_key.remove(h, |found| found == id);
                self.vacate(id);
                (left, removed) = (left - 1, removed + 1);
            }
            id += 1;
        }
        removed
    }

    /// Empties live slot `id`, already out of the key table: out of the orders and the leases,
    /// its key and mount released, the slot free for the next insert.
    fn vacate(&mut self, id: Id) -> Option<Object> {
        let object = self.object(id)?;
        self.unplace(id, Places::of(&object));
        self.unfile_lease(id, object.lease_until);
        let slot = self.slots.get_mut(id)?;
        let (kept, mount) = (slot.key, slot.mount);
        slot.vacate();
        self.keys.release(&kept);
        self.mounts.release(mount);
        self.free.push(id);
        Some(object)
    }

    fn order(&mut self, in_memory: bool) -> &mut Order {
        if in_memory {
            &mut self.in_memory
        } else {
            &mut self.on_disk
        }
    }

    /// Files live slot `id` in the orders by `p` (what its slot holds): a committed object by
    /// last use, a reserved one (which nothing evicts) by reclaim time.
    fn place(&mut self, id: Id, p: Places) {
        if let Some((put_id, at)) = p.reservation {
            self.reservations.insert(id, (put_id, at));
            self.reserved.insert((at, id));
            return;
        }
        let mut order = std::mem::take(self.order(p.in_memory));
        order.link(&mut self.slots, id);
        *self.order(p.in_memory) = order;
    }

    /// Takes live slot `id` out of the orders it was filed in by `p`.
    fn unplace(&mut self, id: Id, p: Places) {
        if let Some((_, at)) = p.reservation {
            self.reservations.remove(&id);
            self.reserved.remove(&(at, id));
            return;
        }
        let mut order = std::mem::take(self.order(p.in_memory));
        order.unlink(&mut self.slots, id, p.last_used);
        *self.order(p.in_memory) = order;
    }

    /// Keeps slot `id`'s lease (if any) beside it.
    fn file_lease(&mut self, id: Id, lease_until: Option<Instant>) {
        if let Some(until) = lease_until {
            self.leases.insert(id, until);
            self.lease_ends.insert((until, id));
        }
    }

    /// Forgets slot `id`'s lease, which ends at `lease_until`.
    fn unfile_lease(&mut self, id: Id, lease_until: Option<Instant>) {
        if let Some(until) = lease_until {
            self.leases.remove(&id);
            self.lease_ends.remove(&(until, id));
        }
    }

    /// Forgets the leases that ended by `now` (an object then reads as never leased), so that
    /// only objects read in the last lease's time keep one beside their slot.
    pub fn end_leases(&mut self, now: Instant) {
        while let Some(&(until, id)) = self.lease_ends.first()
            && until <= now
        {
            self.lease_ends.pop_first();
            self.leases.remove(&id);
            if let Some(slot) = self.slots.get_mut(id) {
                slot.end_lease();
            }
        }
    }

    /// The objects in slots `from..` (at most `slots` of them, free ones included), and the slot
    /// the next page starts at (`None`: this page reached the end). An object that keeps its slot
    /// is in exactly one page of a walk, however the others change meanwhile.
    pub fn page(&self, from: usize, slots: usize) -> (Vec<(Name<'_>, Object)>, Option<usize>) {
        let end = from.saturating_add(slots).min(self.slots.len());
        let page = self
            .slots
            .range(from, end)
            .map(|(id, s)| (self.keys.name(&s.key), self.unpack(id, s)))
            .collect();
        (page, (end < self.slots.len()).then_some(end))
    }

    /// Every object with its key, in no order (tests: the leader itself walks slots only a page
    /// at a time, or up to what it looks for).
    #[cfg(test)]
    pub fn iter(&self) -> impl Iterator<Item = (Name<'_>, Object)> {
        self.slots
            .range(0, self.slots.len())
            .map(|(id, s)| (self.keys.name(&s.key), self.unpack(id, s)))
    }

    #[cfg(test)]
    pub fn keys(&self) -> impl Iterator<Item = Name<'_>> {
        self.slots
            .range(0, self.slots.len())
            .map(|(_, s)| self.keys.name(&s.key))
    }

    /// The committed objects with bytes in memory, least recently used first.
    pub fn in_memory_by_last_use(&self) -> impl Iterator<Item = (Name<'_>, Object)> {
        self.in_memory.iter(&self.slots).filter_map(|id| self.entry(id))
    }

    /// The committed objects only on a disk tier, least recently used first.
    pub fn on_disk_by_last_use(&self) -> impl Iterator<Item = (Name<'_>, Object)> {
        self.on_disk.iter(&self.slots).filter_map(|id| self.entry(id))
    }

    /// About the bytes it takes (`kvstore_leader_index_bytes`): the slots' chunks, the key
    /// table's buckets, the orders' spans, the reservations (a B-tree's nodes taken as half
    /// again their entries), the leases, the free list, the keys and the mounts.
    pub fn bytes(&self) -> usize {
        let table = self.by_key.bytes();
        let reservations = self.reservations.capacity() * (std::mem::size_of::<(Id, (u64, Instant))>() + 1)
            + self.reserved.len() * std::mem::size_of::<(Instant, Id)>() * 3 / 2;
        let leases = self.leases.capacity() * (std::mem::size_of::<(Id, Instant)>() + 1)
            + self.lease_ends.len() * std::mem::size_of::<(Instant, Id)>() * 3 / 2;
        let free = self.free.capacity() * std::mem::size_of::<Id>();
        self.slots.bytes()
            + table
            + self.in_memory.bytes()
            + self.on_disk.bytes()
            + reservations
            + leases
            + free
            + self.keys.bytes()
            + self.mounts.bytes()
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
            .filter_map(|(_, id)| self.slots.get(*id))
            .map(|s| self.keys.name(&s.key))
    }
}

/// For tests: `objects["key"]`.
#[cfg(test)]
impl Objects {
    pub fn of(&self, key: &str) -> Object {
        self.get(key).unwrap_or_else(|| panic!("no object {key:?}"))
    }
}

/// An object being changed: when dropped, it is packed back into its slot and takes its places
/// in the orders by what it became.
#[derive(Debug)]
pub struct ObjectMut<'a> {
    objects: &'a mut Objects,
    id: Id,
    before: Object,
    object: Object,
}

impl Deref for ObjectMut<'_> {
    type Target = Object;

    fn deref(&self) -> &Object {
        &self.object
    }
}

impl DerefMut for ObjectMut<'_> {
    fn deref_mut(&mut self) -> &mut Object {
        &mut self.object
    }
}

impl Drop for ObjectMut<'_> {
    fn drop(&mut self) {
        let (id, o) = (self.id, &mut *self.objects);
        let (before, after) = (Places::of(&self.before), Places::of(&self.object));
        let (leased, leases) = (self.before.lease_until, self.object.lease_until);
        if after != before {
            o.unplace(id, before);
        }
        if leased != leases {
            o.unfile_lease(id, leased);
        }
        let Some(mut mount) = o.slots.get(id).map(|s| s.mount) else {
            return;
        };
        let (was, is) = (
            (self.before.member, self.before.mount_id),
            (self.object.member, self.object.mount_id),
        );
        if was != is
            && let Some(kept) = o.mounts.keep(&is, || is)
        {
            o.mounts.release(mount);
            mount = kept;
        }
        if let Some(slot) = o.slots.get_mut(id) {
            slot.set(mount, &self.object);
        }
        if after != before {
            o.place(id, after);
        }
        if leased != leases {
            o.file_lease(id, leases);
        }
    }
}
