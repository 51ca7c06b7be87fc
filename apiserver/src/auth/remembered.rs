//! Answers remembered for a while, at most a fixed number of them: the store behind the
//! TokenReview and SubjectAccessReview caches. Past the bound the least recently used answer
//! goes, so a caller sending a new random token per request costs one review each but never
//! pushes out the answers that the server's real users keep hitting (wiping the whole map at the
//! bound would make every one of them a review again).
//!
//! Each entry carries a use stamp; `order` maps stamps back to keys, so the oldest is the first
//! of `order`. Every operation is O(log n) under the caller's lock.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::time::Instant;

/// A bounded map of answers, each good until its own instant.
#[derive(Debug)]
pub struct Remembered<K, V> {
    bound: usize,
    entries: HashMap<K, Entry<V>, foldhash::fast::RandomState>,
    /// use stamp → key, oldest first
    order: BTreeMap<u64, K>,
    next_stamp: u64,
}

#[derive(Debug)]
struct Entry<V> {
    value: V,
    until: Instant,
    stamp: u64,
}

impl<K: Hash + Eq + Clone, V: Clone> Remembered<K, V> {
    /// Keeps at most `bound` answers (at least one).
    pub fn new(bound: usize) -> Self {
        Remembered {
            bound: bound.max(1),
            entries: HashMap::default(),
            order: BTreeMap::new(),
            next_stamp: 0,
        }
    }

    fn stamp(&mut self) -> u64 {
        self.next_stamp += 1;
        self.next_stamp
    }

    /// The answer for `key` if it still holds at `now`, marked as just used. An expired one is
    /// dropped.
    pub fn get(&mut self, key: &K, now: Instant) -> Option<V> {
        let stamp = self.stamp();
        let entry = self.entries.get_mut(key)?;
        if entry.until <= now {
            let old = entry.stamp;
            self.entries.remove(key);
            self.order.remove(&old);
            return None;
        }
        let old = std::mem::replace(&mut entry.stamp, stamp);
        let value = entry.value.clone();
        if let Some(k) = self.order.remove(&old) {
            self.order.insert(stamp, k);
        }
        Some(value)
    }

    /// Remembers `value` for `key` until `until`, forgetting the least recently used answer
    /// when the bound is reached.
    pub fn insert(&mut self, key: K, value: V, until: Instant) {
        let stamp = self.stamp();
        if let Some(old) = self.entries.get(&key).map(|e| e.stamp) {
            self.order.remove(&old);
        } else if self.entries.len() >= self.bound
            && let Some((_, oldest)) = self.order.pop_first()
        {
            self.entries.remove(&oldest);
        }
        self.order.insert(stamp, key.clone());
        self.entries.insert(key, Entry { value, until, stamp });
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_flood_of_new_keys_pushes_out_the_idle_answers_not_the_used_ones() {
        let now = Instant::now();
        let later = now + Duration::from_secs(60);
        let mut r = Remembered::new(100);
        r.insert("hot".to_string(), 1, later);
        r.insert("cold".to_string(), 2, later);
        for i in 0..10_000 {
            // the real user keeps coming back between the junk
            assert_eq!(r.get(&"hot".to_string(), now), Some(1), "after {i} junk keys");
            r.insert(format!("junk-{i}"), 0, later);
            assert!(r.len() <= 100);
        }
        assert_eq!(r.get(&"cold".to_string(), now), None, "the idle answer went first");
        assert_eq!(r.len(), 100);
        assert_eq!(r.order.len(), r.len(), "one use stamp per entry");
    }

    #[test]
    fn an_answer_holds_until_its_instant_and_is_replaced_in_place() {
        let now = Instant::now();
        let mut r = Remembered::new(2);
        r.insert(1u8, "a", now + Duration::from_secs(1));
        assert_eq!(r.get(&1, now), Some("a"));
        assert_eq!(r.get(&1, now + Duration::from_secs(1)), None, "expired at its instant");
        assert!(r.is_empty() && r.order.is_empty());
        r.insert(1, "a", now + Duration::from_secs(5));
        r.insert(1, "b", now + Duration::from_secs(5));
        r.insert(2, "c", now + Duration::from_secs(5));
        assert_eq!((r.len(), r.order.len()), (2, 2), "a replaced key is one entry");
        assert_eq!(r.get(&1, now), Some("b"));
        // 2 is now the least recently used
        r.insert(3, "d", now + Duration::from_secs(5));
        assert_eq!(
            (r.get(&1, now), r.get(&2, now), r.get(&3, now)),
            (Some("b"), None, Some("d"))
        );
    }
}
