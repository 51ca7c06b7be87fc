//! An order of slots by last use, least recently used first: a list linked through the slots
//! (eight bytes each), and the span of each millisecond's ticks in it, so that an object that is
//! not the latest used (an adopted one, dated by its member's last use) finds its place by a
//! look-up and a short walk instead of a walk of the list.
//!
//! Ticks (`state::tick_at`) count 2^20 a millisecond; a term's own operations take one tick each
//! and so fill a span per million operations, at the list's end, where they are linked without a
//! walk.

use std::collections::BTreeMap;

use super::slots::{Id, NIL, Slots};

/// Ticks of a span: a millisecond's (`state::TICKS_PER_MS`).
const SPAN_BITS: u32 = 20;

/// The list's first and last slot, and its spans' first and last.
#[derive(Debug)]
pub(super) struct Order {
    head: Id,
    tail: Id,
    len: usize,
    /// by the span's millisecond: its first and last slot in the list
    spans: BTreeMap<u64, (Id, Id)>,
}

impl Default for Order {
    fn default() -> Self {
        Order {
            head: NIL,
            tail: NIL,
            len: 0,
            spans: BTreeMap::new(),
        }
    }
}

impl Order {
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Links slot `id` in by its `last_used`, after every slot used no later.
    pub(super) fn link(&mut self, slots: &mut Slots, id: Id) {
        let Some(t) = slots.get(id).map(|s| s.last_used) else {
            return;
        };
        let span = t >> SPAN_BITS;
        let after = match self.spans.get_mut(&span) {
            Some((first, last)) => {
                let mut at = *last;
                loop {
                    let Some(s) = slots.get(at) else { break NIL };
                    if s.last_used <= t {
                        if at == *last {
                            *last = id;
                        }
                        break at;
                    }
                    if at == *first {
                        *first = id;
                        break s.prev;
                    }
                    at = s.prev;
                }
            }
            None => {
                let after = self.spans.range(..span).next_back().map_or(NIL, |(_, (_, last))| *last);
                self.spans.insert(span, (id, id));
                after
            }
        };
        self.insert_after(slots, after, id);
    }

    /// Links `id` after `after` (`NIL`: first).
    fn insert_after(&mut self, slots: &mut Slots, after: Id, id: Id) {
        let next = if after == NIL {
            self.head
        } else {
            slots.get_mut(after).map_or(NIL, |s| std::mem::replace(&mut s.next, id))
        };
        if after == NIL {
            self.head = id;
        }
        match slots.get_mut(next) {
            Some(n) if next != NIL => n.prev = id,
            _ => self.tail = id,
        }
        if let Some(s) = slots.get_mut(id) {
            s.prev = after;
            s.next = next;
        }
        self.len += 1;
    }

    /// Unlinks slot `id`, which was linked when its last use was `last_used`.
    pub(super) fn unlink(&mut self, slots: &mut Slots, id: Id, last_used: u64) {
        let Some((prev, next)) = slots.get(id).map(|s| (s.prev, s.next)) else {
            return;
        };
        let span = last_used >> SPAN_BITS;
        if let Some((first, last)) = self.spans.get_mut(&span) {
            match (*first == id, *last == id) {
                (true, true) => {
                    self.spans.remove(&span);
                }
                (true, false) => *first = next,
                (false, true) => *last = prev,
                (false, false) => {}
            }
        }
        match slots.get_mut(prev) {
            Some(p) if prev != NIL => p.next = next,
            _ => self.head = next,
        }
        match slots.get_mut(next) {
            Some(n) if next != NIL => n.prev = prev,
            _ => self.tail = prev,
        }
        if let Some(s) = slots.get_mut(id) {
            s.prev = NIL;
            s.next = NIL;
        }
        self.len -= 1;
    }

    /// Its slots, least recently used first.
    pub(super) fn iter<'a>(&self, slots: &'a Slots) -> impl Iterator<Item = Id> + 'a {
        let mut at = self.head;
        std::iter::from_fn(move || {
            let id = at;
            at = slots.get(id)?.next;
            Some(id)
        })
    }

    /// Bytes of its spans (the links are in the slots), a B-tree's nodes taken as half again
    /// their entries.
    pub(super) fn bytes(&self) -> usize {
        self.spans.len() * std::mem::size_of::<(u64, (Id, Id))>() * 3 / 2
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::leader::index::keys::Keys;
    use crate::leader::index::slots::Slot;
    use crate::leader::objects::{Object, ObjectState};

    fn slots(uses: &[u64]) -> Slots {
        let mut keys = Keys::default();
        let mut slots = Slots::default();
        for (i, last_used) in uses.iter().enumerate() {
            let object = Object {
                member: 1,
                mount_id: 1,
                memory: None,
                disk: Some(1),
                size: 1,
                len: 64,
                charge: 0,
                state: ObjectState::Committed,
                lease_until: None,
                last_used: *last_used,
            };
            let key = keys.keep(&format!("k{i}")).unwrap();
            slots.push(Slot::new(key, 0, &object));
        }
        slots
    }

    fn walk(o: &Order, slots: &Slots) -> Vec<u64> {
        o.iter(slots).map(|id| slots.get(id).unwrap().last_used).collect()
    }

    const MS: u64 = 1 << SPAN_BITS;

    #[test]
    fn slots_are_linked_by_last_use_whatever_order_they_come_in() {
        let uses = [
            5 * MS,
            3 * MS + 2,
            3 * MS + 1,
            9 * MS,
            5 * MS + 7,
            0,
            3 * MS + 1,
            9 * MS - 1,
        ];
        let mut s = slots(&uses);
        let mut o = Order::default();
        for id in 0..uses.len() as Id {
            o.link(&mut s, id);
        }
        let mut want = uses.to_vec();
        want.sort_unstable();
        assert_eq!(walk(&o, &s), want);
        assert_eq!((o.len(), o.spans.len()), (8, 5));
        // out: a span's first, a span's last, a span's only slot, the list's last
        for (id, used) in [(2, 3 * MS + 1), (0, 5 * MS), (5, 0), (3, 9 * MS)] {
            o.unlink(&mut s, id, used);
        }
        assert_eq!(walk(&o, &s), [3 * MS + 1, 3 * MS + 2, 5 * MS + 7, 9 * MS - 1]);
        assert_eq!(o.spans.len(), 3);
        // back in, one of them used again latest
        s.get_mut(0).unwrap().last_used = 20 * MS;
        for id in [0, 2, 5, 3] {
            o.link(&mut s, id);
        }
        assert_eq!(
            walk(&o, &s),
            [
                0,
                3 * MS + 1,
                3 * MS + 1,
                3 * MS + 2,
                5 * MS + 7,
                9 * MS - 1,
                9 * MS,
                20 * MS
            ]
        );
        let firsts: Vec<u64> = o.spans.values().map(|(f, _)| s.get(*f).unwrap().last_used).collect();
        assert_eq!(firsts, [0, 3 * MS + 1, 5 * MS + 7, 9 * MS - 1, 9 * MS, 20 * MS]);
    }

    #[test]
    fn every_link_is_kept_through_many_changes() {
        let n = 3000u64;
        let uses: Vec<u64> = (0..n).map(|i| (i * 7919) % 5000 * (MS / 3)).collect();
        let mut s = slots(&uses);
        let mut o = Order::default();
        for id in 0..n as Id {
            o.link(&mut s, id);
        }
        for id in (0..n as Id).step_by(3) {
            let used = s.get(id).unwrap().last_used;
            o.unlink(&mut s, id, used);
        }
        let left = walk(&o, &s);
        assert!(left.is_sorted() && left.len() == o.len() && o.len() == 2000);
        let back: Vec<Id> = o.iter(&s).collect::<Vec<_>>().into_iter().rev().collect();
        let mut at = o.tail;
        for id in back {
            assert_eq!(at, id, "prev links mirror next links");
            at = s.get(id).unwrap().prev;
        }
    }
}
