//! The key table: each object's slot number, found by its key's hash, with 32 bits of that hash
//! beside it ([`short`]) so that growing re-files entries without reading a slot. It is split in
//! [`SHARDS`] tables by other bits of the hash, each growing on its own: a doubling re-files one
//! shard's entries, not the whole table's (one table of 14.7 million entries had held the state
//! lock for a second doubling).

use hashbrown::HashTable;

use super::slots::Id;

/// Tables the entries are split in.
const SHARDS: usize = 64;

/// What an entry keeps of its key's hash.
fn short(hash: u64) -> u32 {
    (hash ^ (hash >> 32)) as u32
}

/// The hash a shard files an entry under, from its [`short`] hash alone.
fn filed(short: u32) -> u64 {
    u64::from(short) | (u64::from(short) << 32)
}

/// Which shard holds the entries of a hash: its top bits, which `short` folds into bits the
/// shard's buckets do not depend on alone.
fn shard(hash: u64) -> usize {
    (hash >> (64 - SHARDS.trailing_zeros())) as usize
}

/// Slot numbers by their key's hash.
#[derive(Debug)]
pub(super) struct KeyTable {
    shards: Vec<HashTable<(Id, u32)>>,
    len: usize,
}

impl Default for KeyTable {
    fn default() -> Self {
        KeyTable {
            shards: (0..SHARDS).map(|_| HashTable::new()).collect(),
            len: 0,
        }
    }
}

impl KeyTable {
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// The slot of the entry under `hash` that `is` (given the slot) says holds the key.
    pub(super) fn find(&self, hash: u64, is: impl Fn(Id) -> bool) -> Option<Id> {
        let s = short(hash);
        self.shards[shard(hash)]
            .find(filed(s), |(id, h)| *h == s && is(*id))
            .map(|(id, _)| *id)
    }

    /// Files slot `id` under `hash` (its key is not in the table).
    pub(super) fn insert(&mut self, hash: u64, id: Id) {
        let s = short(hash);
        self.shards[shard(hash)].insert_unique(filed(s), (id, s), |(_, h)| filed(*h));
        self.len += 1;
    }

    /// Takes out the entry under `hash` that `is` says holds the key; returns its slot.
    pub(super) fn remove(&mut self, hash: u64, is: impl Fn(Id) -> bool) -> Option<Id> {
        let s = short(hash);
        let entry = self.shards[shard(hash)].find_entry(filed(s), |(id, h)| *h == s && is(*id));
        let ((id, _), _) = entry.ok()?.remove();
        self.len -= 1;
        Some(id)
    }

    /// Bytes of its buckets: an entry and a control byte each.
    pub(super) fn bytes(&self) -> usize {
        let buckets: usize = self.shards.iter().map(HashTable::capacity).sum();
        buckets * (std::mem::size_of::<(Id, u32)>() + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_found_by_hash_and_slot_and_spread_over_the_shards() {
        let mut t = KeyTable::default();
        let hash = |i: u64| i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        for i in 0..10_000u64 {
            t.insert(hash(i), i as Id);
        }
        assert_eq!(t.len(), 10_000);
        assert!(t.shards.iter().all(|s| s.len() > 100), "every shard holds some");
        assert_eq!(t.find(hash(42), |id| id == 42), Some(42));
        assert_eq!(t.find(hash(42), |id| id == 43), None, "the slot decides");
        assert_eq!(t.remove(hash(42), |id| id == 42), Some(42));
        assert_eq!((t.find(hash(42), |_| true), t.len()), (None, 9_999));
        // two keys of one hash: each found by its slot
        t.insert(hash(7), 70_000);
        assert_eq!(t.find(hash(7), |id| id == 70_000), Some(70_000));
        assert_eq!(t.find(hash(7), |id| id == 7), Some(7));
    }
}
