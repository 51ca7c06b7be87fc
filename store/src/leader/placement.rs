//! Space inside one member's segment (a best-fit free list that coalesces on free) and the choice
//! of segment for a new value (`FreeRatioFirst` or `Random`).

use std::collections::{BTreeMap, BTreeSet};

/// Allocation granularity: every range starts and ends on this boundary, so a value never shares
/// a cache line with its neighbour.
pub const ALIGN: u64 = 64;

/// Rounds a value size up to what it is charged and allocated.
pub fn aligned(size: u64) -> u64 {
    size.div_ceil(ALIGN).saturating_mul(ALIGN)
}

/// Free space of one segment.
#[derive(Debug)]
pub struct SegmentAllocator {
    capacity: u64,
    used: u64,
    by_offset: BTreeMap<u64, u64>,
    by_size: BTreeSet<(u64, u64)>,
}

impl SegmentAllocator {
    pub fn new(capacity: u64) -> Self {
        let capacity = capacity / ALIGN * ALIGN;
        let mut a = Self {
            capacity,
            used: 0,
            by_offset: BTreeMap::new(),
            by_size: BTreeSet::new(),
        };
        if capacity > 0 {
            a.insert_free(0, capacity);
        }
        a
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    pub fn used(&self) -> u64 {
        self.used
    }

    pub fn free(&self) -> u64 {
        self.capacity - self.used
    }

    /// Whether a range of `len` (already aligned) fits somewhere.
    pub fn fits(&self, len: u64) -> bool {
        self.by_size.range((len, 0)..).next().is_some()
    }

    /// Takes the smallest free range that fits `len` (already aligned); returns its offset.
    pub fn allocate(&mut self, len: u64) -> Option<u64> {
        if len == 0 {
            return None;
        }
        let &(size, offset) = self.by_size.range((len, 0)..).next()?;
        self.remove_free(offset, size);
        if size > len {
            self.insert_free(offset + len, size - len);
        }
        self.used += len;
        Some(offset)
    }

    /// Takes exactly `offset..offset + len` (aligned), if all of it is free: a value a member
    /// already holds there, adopted after a failover. `false` changes nothing.
    pub fn take(&mut self, offset: u64, len: u64) -> bool {
        if len == 0 || !offset.is_multiple_of(ALIGN) || !len.is_multiple_of(ALIGN) {
            return false;
        }
        let Some(end) = offset.checked_add(len) else {
            return false;
        };
        let Some((&free_at, &free_len)) = self.by_offset.range(..=offset).next_back() else {
            return false;
        };
        if free_at + free_len < end {
            return false;
        }
        self.remove_free(free_at, free_len);
        if free_at < offset {
            self.insert_free(free_at, offset - free_at);
        }
        if end < free_at + free_len {
            self.insert_free(end, free_at + free_len - end);
        }
        self.used += len;
        true
    }

    /// Returns a range taken by [`allocate`](Self::allocate), merging it with free neighbours.
    pub fn release(&mut self, offset: u64, len: u64) {
        debug_assert!(offset + len <= self.capacity);
        let mut start = offset;
        let mut end = offset + len;
        if let Some((&prev_off, &prev_len)) = self.by_offset.range(..offset).next_back()
            && prev_off + prev_len == start
        {
            self.remove_free(prev_off, prev_len);
            start = prev_off;
        }
        if let Some(&next_len) = self.by_offset.get(&end) {
            self.remove_free(end, next_len);
            end += next_len;
        }
        self.insert_free(start, end - start);
        self.used = self.used.saturating_sub(len);
    }

    fn insert_free(&mut self, offset: u64, len: u64) {
        self.by_offset.insert(offset, len);
        self.by_size.insert((len, offset));
    }

    fn remove_free(&mut self, offset: u64, len: u64) {
        self.by_offset.remove(&offset);
        self.by_size.remove(&(len, offset));
    }
}

/// How a segment is chosen for a new value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AllocationStrategy {
    /// The segment with the largest share of free space.
    FreeRatioFirst,
    /// Any segment with room, picked at random.
    Random,
}

/// Picks one candidate `(id, free, capacity)` that can hold the value.
pub fn choose(strategy: AllocationStrategy, candidates: &[(u64, u64, u64)], seed: &mut u64) -> Option<u64> {
    match strategy {
        AllocationStrategy::FreeRatioFirst => candidates
            .iter()
            .max_by(|a, b| {
                let ra = a.1 as u128 * b.2 as u128;
                let rb = b.1 as u128 * a.2 as u128;
                ra.cmp(&rb).then(b.0.cmp(&a.0))
            })
            .map(|c| c.0),
        AllocationStrategy::Random => {
            if candidates.is_empty() {
                return None;
            }
            // xorshift64: placement only needs spread, not unpredictability
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            Some(candidates[(*seed % candidates.len() as u64) as usize].0)
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn take_claims_exactly_a_free_range_and_nothing_else() {
        let mut a = super::SegmentAllocator::new(1024);
        assert!(a.take(128, 64));
        assert!(!a.take(128, 64), "taken already");
        assert!(!a.take(64, 128), "overlaps a taken range");
        assert!(!a.take(100, 64), "not aligned");
        assert!(!a.take(1024, 64), "past the end");
        assert!(!a.take(u64::MAX - 63, 64), "overflow");
        assert!(a.take(0, 128), "the free range before it");
        assert_eq!(a.used(), 192);
        assert_eq!(
            a.allocate(64),
            Some(192),
            "the rest is still free, from where it starts"
        );
        a.release(128, 64);
        assert!(a.take(128, 64), "freed, then taken again");
        assert_eq!(a.free(), 1024 - 256);
    }

    use super::*;

    #[test]
    fn allocates_best_fit_and_coalesces() {
        let mut a = SegmentAllocator::new(1024);
        let x = a.allocate(256).unwrap();
        let y = a.allocate(256).unwrap();
        let z = a.allocate(512).unwrap();
        assert_eq!((x, y, z), (0, 256, 512));
        assert!(a.allocate(64).is_none());
        a.release(y, 256);
        a.release(x, 256);
        assert_eq!(a.allocate(512), Some(0));
        a.release(0, 512);
        a.release(z, 512);
        assert_eq!(a.used(), 0);
        assert_eq!(a.allocate(1024), Some(0));
    }

    #[test]
    fn ranges_never_overlap() {
        let mut a = SegmentAllocator::new(64 * 100);
        let mut live: Vec<(u64, u64)> = Vec::new();
        let mut seed = 7u64;
        for i in 0..2000u64 {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            if live.len() > 5 && (seed >> 33).is_multiple_of(3) {
                let (off, len) = live.swap_remove(((seed >> 40) as usize) % live.len());
                a.release(off, len);
            } else {
                let len = aligned(1 + (seed >> 20) % 400);
                if let Some(off) = a.allocate(len) {
                    for &(o, l) in &live {
                        assert!(off + len <= o || o + l <= off, "overlap at step {i}");
                    }
                    live.push((off, len));
                }
            }
            assert_eq!(a.used(), live.iter().map(|l| l.1).sum::<u64>());
        }
    }

    #[test]
    fn free_ratio_first_prefers_the_emptiest() {
        let mut seed = 1;
        let c = [(1, 50, 100), (2, 90, 1000), (3, 80, 100)];
        assert_eq!(choose(AllocationStrategy::FreeRatioFirst, &c, &mut seed), Some(3));
        assert!(choose(AllocationStrategy::Random, &c, &mut seed).is_some());
        assert_eq!(choose(AllocationStrategy::Random, &[], &mut seed), None);
    }
}
