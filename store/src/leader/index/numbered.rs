//! Things kept under small numbers that are taken again once freed: the index's namespaces,
//! keys kept as their bytes, and the mounts its objects were placed in (`keys.rs`, `index.rs`),
//! so that a slot names each in four bytes.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;

/// Items under numbers `0..u32::MAX - 1` (the last number is left for callers to mean "none").
#[derive(Debug)]
pub(super) struct Numbered<T> {
    items: Vec<Option<T>>,
    free: Vec<u32>,
}

impl<T> Default for Numbered<T> {
    fn default() -> Self {
        Numbered {
            items: Vec::new(),
            free: Vec::new(),
        }
    }
}

impl<T> Numbered<T> {
    /// Keeps `item` under a free number; `None` when every number is taken.
    pub(super) fn add(&mut self, item: T) -> Option<u32> {
        if let Some(n) = self.free.pop() {
            if let Some(free) = self.items.get_mut(n as usize) {
                *free = Some(item);
            }
            return Some(n);
        }
        let n = u32::try_from(self.items.len()).ok().filter(|n| *n < u32::MAX - 1)?;
        self.items.push(Some(item));
        Some(n)
    }

    pub(super) fn get(&self, n: u32) -> Option<&T> {
        self.items.get(n as usize)?.as_ref()
    }

    pub(super) fn get_mut(&mut self, n: u32) -> Option<&mut T> {
        self.items.get_mut(n as usize)?.as_mut()
    }

    /// Frees number `n`, giving back what it kept.
    pub(super) fn take(&mut self, n: u32) -> Option<T> {
        let item = self.items.get_mut(n as usize)?.take()?;
        self.free.push(n);
        Some(item)
    }

    /// Bytes of its own lists (not what the items own on the heap).
    pub(super) fn bytes(&self) -> usize {
        self.items.capacity() * std::mem::size_of::<Option<T>>() + self.free.capacity() * 4
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.items.len() - self.free.len()
    }
}

/// Values many slots share, each kept once under a number while a slot uses it.
#[derive(Debug)]
pub(super) struct Shared<K> {
    numbers: HashMap<K, u32>,
    /// by number: the value and how many slots use it
    values: Numbered<(K, u64)>,
}

impl<K> Default for Shared<K> {
    fn default() -> Self {
        Shared {
            numbers: HashMap::new(),
            values: Numbered::default(),
        }
    }
}

impl<K: Hash + Eq + Clone> Shared<K> {
    pub(super) fn number<Q: Hash + Eq + ?Sized>(&self, value: &Q) -> Option<u32>
    where
        K: Borrow<Q>,
    {
        self.numbers.get(value).copied()
    }

    /// The number of `value` (`owned` makes it to keep), counted once more; `None` when numbers
    /// ran out.
    pub(super) fn keep<Q: Hash + Eq + ?Sized>(&mut self, value: &Q, owned: impl FnOnce() -> K) -> Option<u32>
    where
        K: Borrow<Q>,
    {
        let n = match self.numbers.get(value) {
            Some(n) => *n,
            None => {
                let kept = owned();
                let n = self.values.add((kept.clone(), 0))?;
                self.numbers.insert(kept, n);
                n
            }
        };
        if let Some((_, uses)) = self.values.get_mut(n) {
            *uses += 1;
        }
        Some(n)
    }

    /// Counts number `n` once less; a value no slot uses is forgotten.
    pub(super) fn release(&mut self, n: u32) {
        let Some((_, uses)) = self.values.get_mut(n) else {
            return;
        };
        *uses = uses.saturating_sub(1);
        if *uses == 0
            && let Some((value, _)) = self.values.take(n)
        {
            self.numbers.remove(&value);
        }
    }

    pub(super) fn get(&self, n: u32) -> Option<&K> {
        self.values.get(n).map(|(v, _)| v)
    }

    /// How many slots use number `n` (0: none, or a number not kept).
    pub(super) fn uses(&self, n: u32) -> u64 {
        self.values.get(n).map_or(0, |(_, uses)| *uses)
    }

    /// Values kept.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.numbers.len()
    }

    /// Bytes of its map and list (not what the values own on the heap).
    pub(super) fn bytes(&self) -> usize {
        self.numbers.capacity() * (std::mem::size_of::<(K, u32)>() + 1) + self.values.bytes()
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &K> {
        self.numbers.keys()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_freed_number_is_taken_again() {
        let mut n = Numbered::default();
        assert_eq!((n.add("a"), n.add("b"), n.add("c")), (Some(0), Some(1), Some(2)));
        assert_eq!(n.take(1), Some("b"));
        assert_eq!(n.take(1), None, "taken once");
        assert_eq!(n.get(1), None);
        assert_eq!(n.add("d"), Some(1));
        assert_eq!((n.get(1), n.len()), (Some(&"d"), 3));
    }

    #[test]
    fn a_shared_value_is_kept_while_used() {
        let mut s: Shared<Box<str>> = Shared::default();
        let a = s.keep("a", || "a".into()).unwrap();
        assert_eq!(s.keep("a", || "a".into()), Some(a));
        let b = s.keep("b", || "b".into()).unwrap();
        s.release(a);
        assert_eq!((s.number("a"), s.len()), (Some(a), 2), "a is still used once");
        s.release(a);
        assert_eq!((s.number("a"), s.get(a), s.len()), (None, None, 1));
        assert_eq!(s.keep("c", || "c".into()), Some(a), "a's number is taken again");
        assert_eq!(s.get(b).map(|v| &**v), Some("b"));
    }
}
