//! Which allocation last wrote each range of a segment (`grant.rs`: the leader numbers every
//! placement, rising within a term). A grant is only good for the allocation it names: a write
//! is refused where a newer allocation has written, and a read is served only from a range
//! exactly as its allocation wrote it. So a grant kept after its range was freed and placed again
//! (a revoked put, a removed or evicted value) can neither overwrite nor read the next owner's
//! bytes, though its MAC and deadline still hold.
//!
//! The ranges are disjoint: a write replaces what it overlaps (keeping the parts it does not
//! cover). There is at most one entry per value placed and not yet overwritten, so the table is
//! bounded by the segment's capacity over the smallest placement (64 bytes); it is emptied when
//! the segment is mounted anew, since a new mount's grants start a new count.

use std::collections::BTreeMap;

/// Why a grant's allocation was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stale {
    /// A newer allocation wrote (part of) the range: it was freed and placed again.
    Replaced { newer: u64 },
    /// The range holds nothing written under that allocation (never written, or overwritten in
    /// part).
    NotWritten,
}

/// The ranges of one mount, by start: `(end, allocation)`.
#[derive(Debug, Default)]
pub struct Written {
    ranges: BTreeMap<u64, (u64, u64)>,
}

impl Written {
    /// The entries overlapping `[start, end)`, as `(start, end, allocation)`.
    fn overlapping(&self, start: u64, end: u64) -> Vec<(u64, u64, u64)> {
        let mut out: Vec<(u64, u64, u64)> = self
            .ranges
            .range(..end)
            .rev()
            .take_while(|(_, (e, _))| *e > start)
            .map(|(s, (e, a))| (*s, *e, *a))
            .collect();
        out.reverse();
        out
    }

    /// Records that `allocation` writes `[start, start + len)`, unless a newer allocation wrote
    /// any of it.
    pub fn write(&mut self, start: u64, len: u64, allocation: u64) -> Result<(), Stale> {
        let end = start.saturating_add(len);
        let overlapping = self.overlapping(start, end);
        if let Some(newer) = overlapping.iter().map(|(_, _, a)| *a).filter(|a| *a > allocation).max() {
            return Err(Stale::Replaced { newer });
        }
        for (s, e, a) in overlapping {
            self.ranges.remove(&s);
            if s < start {
                self.ranges.insert(s, (start, a));
            }
            if e > end {
                self.ranges.insert(end, (e, a));
            }
        }
        self.ranges.insert(start, (end, allocation));
        Ok(())
    }

    /// Whether `[start, start + len)` is exactly what `allocation` wrote.
    pub fn read(&self, start: u64, len: u64, allocation: u64) -> Result<(), Stale> {
        let end = start.saturating_add(len);
        match self.ranges.get(&start) {
            Some(&(e, a)) if e == end && a == allocation => Ok(()),
            _ => match self.overlapping(start, end).iter().map(|(_, _, a)| *a).max() {
                Some(newer) if newer > allocation => Err(Stale::Replaced { newer }),
                _ => Err(Stale::NotWritten),
            },
        }
    }

    /// Forgets every range (the segment was mounted anew).
    pub fn clear(&mut self) {
        self.ranges.clear();
    }

    /// How many ranges are recorded.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grant_for_a_freed_and_replaced_range_neither_writes_nor_reads() {
        let mut w = Written::default();
        // A's reservation at [0, 100), then B's value placed there after A's was freed
        w.write(0, 100, 5).unwrap();
        w.write(0, 100, 9).unwrap();
        assert_eq!(
            w.write(0, 100, 5),
            Err(Stale::Replaced { newer: 9 }),
            "A's replayed write"
        );
        assert_eq!(
            w.read(0, 100, 5),
            Err(Stale::Replaced { newer: 9 }),
            "A's old read grant"
        );
        assert_eq!(w.read(0, 100, 9), Ok(()), "B reads its own");
        // the same allocation writes again (a retried transfer)
        assert_eq!(w.write(0, 100, 9), Ok(()));
        assert_eq!(w.len(), 1);
    }

    #[test]
    fn a_newer_placement_over_part_of_a_range_keeps_the_rest() {
        let mut w = Written::default();
        w.write(0, 100, 1).unwrap();
        w.write(200, 100, 2).unwrap();
        // a larger value placed over the end of one and the start of the other
        w.write(50, 200, 3).unwrap();
        assert_eq!(w.len(), 3);
        assert_eq!(w.read(0, 100, 1), Err(Stale::Replaced { newer: 3 }));
        assert_eq!(w.read(200, 100, 2), Err(Stale::Replaced { newer: 3 }));
        assert_eq!(w.read(50, 200, 3), Ok(()));
        // the parts it left are still their old allocations', which cannot write over it
        assert_eq!(w.write(0, 50, 1), Ok(()));
        assert_eq!(w.write(0, 100, 1), Err(Stale::Replaced { newer: 3 }));
        assert_eq!(w.write(250, 50, 2), Ok(()));
    }

    #[test]
    fn nothing_written_reads_nothing_and_a_new_mount_starts_empty() {
        let mut w = Written::default();
        assert_eq!(w.read(0, 64, 1), Err(Stale::NotWritten));
        w.write(64, 64, 4).unwrap();
        assert_eq!(w.read(64, 32, 4), Err(Stale::NotWritten), "only the range as written");
        assert_eq!(w.read(0, 64, 7), Err(Stale::NotWritten));
        w.clear();
        assert!(w.is_empty());
        assert_eq!(w.read(64, 64, 4), Err(Stale::NotWritten));
        // adjacent ranges do not overlap
        w.write(0, 64, 1).unwrap();
        w.write(64, 64, 2).unwrap();
        assert_eq!(w.write(0, 64, 1), Ok(()));
        assert_eq!(w.read(64, 64, 2), Ok(()));
    }
}
