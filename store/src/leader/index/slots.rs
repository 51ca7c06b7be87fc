//! Where the index keeps its objects: one slot of 72 bytes each, in chunks of [`CHUNK`] that are
//! allocated whole and never move. A slot packs an [`Object`]: the key in 20 bytes
//! (`keys.rs`), the member and mount as one shared number, the size in 32 bits (no value is
//! larger: `config/checks.rs`), the states as bits, and the links of its order by last use
//! (`order.rs`). What the object's fields give again is not kept (the allocated length and the
//! charge: `Slot::object`), nor what few objects have at a time: a reservation's put and reclaim
//! time (objects being written) and a read lease's end (objects read in the last seconds), kept
//! beside the slots (`index.rs`).

use std::time::Instant;

use super::keys::Key;
use crate::leader::objects::{Object, ObjectState, Resident, charge};
use crate::leader::placement::aligned;

/// A slot's number.
pub(super) type Id = u32;

/// No slot: the end of a list.
pub(super) const NIL: Id = u32::MAX;

/// Slots per chunk: a chunk is allocated whole once and never moves.
pub(super) const CHUNK: usize = 1 << 16;

const LIVE: u8 = 1;
const IN_MEMORY: u8 = 2;
const READY: u8 = 4;
const ON_DISK: u8 = 8;
const RESERVED: u8 = 16;
const LEASED: u8 = 32;

/// One object, packed.
#[derive(Debug, Clone, Copy)]
pub(super) struct Slot {
    pub(super) key: Key,
    /// the member and mount it was placed in, as `Objects::mounts` numbers them
    pub(super) mount: u32,
    size: u32,
    /// its neighbours in its order by last use
    pub(super) prev: Id,
    pub(super) next: Id,
    flags: u8,
    offset: u64,
    allocation: u64,
    disk: u64,
    pub(super) last_used: u64,
}

const _: () = assert!(std::mem::size_of::<Slot>() == 72);

impl Slot {
    /// A live slot holding `object` under `key`, placed in mount number `mount`, linked nowhere.
    pub(super) fn new(key: Key, mount: u32, object: &Object) -> Slot {
        let mut slot = Slot {
            key,
            mount,
            size: 0,
            prev: NIL,
            next: NIL,
            flags: 0,
            offset: 0,
            allocation: 0,
            disk: 0,
            last_used: 0,
        };
        slot.set(mount, object);
        slot
    }

    /// Packs `object` (placed in mount number `mount`) into the slot, its key and links kept.
    pub(super) fn set(&mut self, mount: u32, o: &Object) {
        debug_assert_eq!(o.len, aligned(o.size), "the allocated length follows the size");
        let mut flags = LIVE;
        if let Some(r) = o.memory {
            flags |= IN_MEMORY;
            if r.ready {
                flags |= READY;
            }
            self.offset = r.offset;
            self.allocation = r.allocation;
        }
        if let Some(d) = o.disk {
            flags |= ON_DISK;
            self.disk = d;
        }
        if matches!(o.state, ObjectState::Reserved { .. }) {
            flags |= RESERVED;
        }
        if o.lease_until.is_some() {
            flags |= LEASED;
        }
        self.flags = flags;
        self.mount = mount;
        self.size = u32::try_from(o.size).unwrap_or(u32::MAX);
        self.last_used = o.last_used;
    }

    /// The object it holds, placed in `member`'s mount `mount_id`, in `state`, leased until
    /// `lease_until` (both kept beside the slot), under a key of `key_len` bytes.
    pub(super) fn object(
        &self,
        (member, mount_id): (u64, u64),
        state: ObjectState,
        lease_until: Option<Instant>,
        key_len: usize,
    ) -> Object {
        let size = u64::from(self.size);
        let len = aligned(size);
        let memory = self.in_memory().then_some(Resident {
            offset: self.offset,
            allocation: self.allocation,
            ready: self.flags & READY != 0,
        });
        Object {
            member,
            mount_id,
            memory,
            disk: (self.flags & ON_DISK != 0).then_some(self.disk),
            size,
            len,
            charge: if memory.is_some() { charge(len, key_len) } else { 0 },
            state,
            lease_until,
            last_used: self.last_used,
        }
    }

    pub(super) fn live(&self) -> bool {
        self.flags & LIVE != 0
    }

    pub(super) fn in_memory(&self) -> bool {
        self.flags & IN_MEMORY != 0
    }

    pub(super) fn reserved(&self) -> bool {
        self.flags & RESERVED != 0
    }

    pub(super) fn leased(&self) -> bool {
        self.flags & LEASED != 0
    }

    /// Forgets its lease (which ended).
    pub(super) fn end_lease(&mut self) {
        self.flags &= !LEASED;
    }

    /// Frees the slot (it stays where it is, to be taken again).
    pub(super) fn vacate(&mut self) {
        self.flags = 0;
        self.prev = NIL;
        self.next = NIL;
    }
}

/// The slots, in chunks.
#[derive(Debug, Default)]
pub(super) struct Slots {
    chunks: Vec<Vec<Slot>>,
    len: usize,
}

impl Slots {
    /// Slots made so far, free ones included.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// The live slot `id`.
    pub(super) fn get(&self, id: Id) -> Option<&Slot> {
        let id = id as usize;
        self.chunks.get(id / CHUNK)?.get(id % CHUNK).filter(|s| s.live())
    }

    /// Slot `id`, live or free.
    pub(super) fn get_mut(&mut self, id: Id) -> Option<&mut Slot> {
        let id = id as usize;
        self.chunks.get_mut(id / CHUNK)?.get_mut(id % CHUNK)
    }

    /// Adds a slot at the end; returns its number (`None` when every number is taken).
    pub(super) fn push(&mut self, slot: Slot) -> Option<Id> {
        let id = Id::try_from(self.len).ok().filter(|id| *id != NIL)?;
        if self.chunks.last().is_none_or(|c| c.len() == CHUNK) {
            self.chunks.push(Vec::with_capacity(CHUNK));
        }
        self.chunks.last_mut()?.push(slot);
        self.len += 1;
        Some(id)
    }

    /// The live slots among `from..to`, with their numbers.
    pub(super) fn range(&self, from: usize, to: usize) -> impl Iterator<Item = (Id, &Slot)> {
        (from..to.min(self.len)).filter_map(|id| {
            let id = Id::try_from(id).ok()?;
            Some((id, self.get(id)?))
        })
    }

    /// Bytes of the slots made (a chunk's pages are taken from the system as slots are made in
    /// them).
    pub(super) fn bytes(&self) -> usize {
        self.len * std::mem::size_of::<Slot>()
    }

    #[cfg(test)]
    pub(super) fn chunks(&self) -> usize {
        self.chunks.len()
    }
}
