//! Which allocation last wrote each range of a segment (`grant.rs`: the leader numbers every
//! placement, rising within a term). A grant is only good for the allocation it names: a write
//! is refused where a newer allocation has written, and a read is served only from a range
//! exactly as its allocation wrote it. So a grant kept after its range was freed and placed again
//! (a revoked put, a removed or evicted value) can neither overwrite nor read the next owner's
//! bytes, though its MAC and deadline still hold.
//!
//! The ranges are disjoint: a write replaces what it overlaps (keeping the parts it does not
//! cover, which are no longer whole values). There is at most one entry per value placed and not
//! yet overwritten, so the table is bounded by the segment's capacity over the smallest placement
//! (64 bytes).
//!
//! A write that finished also records what was written ([`Held`]): the value's tag from its grant
//! (tenant, layout, key), a checksum of its bytes and the epoch it was written under. When the
//! segment is mounted anew (a new leader, or the same one that lost the mount) the table is
//! retired ([`Written::retire`]): the finished values are what the member reports to the leader,
//! and the new mount's table starts with only those the leader adopted, under the allocation
//! numbers of its term ([`Written::adopt`]). A write still in flight has recorded nothing, so it
//! is never reported: it is adopted whole or not at all. Only a value the leader sealed once it
//! was committed (its heartbeat answers hand the seals over, [`Written::seal`]) is held for a next
//! leader; one it freed since ([`Written::forget`]) is not: a next leader is not handed it.

use std::collections::BTreeMap;
use std::sync::Arc;

/// Why a grant's allocation was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stale {
    /// A newer allocation wrote (part of) the range: it was freed and placed again.
    Replaced { newer: u64 },
    /// The range holds nothing written under that allocation (never written, or overwritten in
    /// part).
    NotWritten,
}

/// A value the member finished writing: what to tell a new leader about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// the value's tag as its grant carried it (`grant::Tag`, encoded)
    pub tag: Arc<[u8]>,
    /// XXH3-64 of its bytes when the write finished
    pub checksum: u64,
    /// the leader epoch it was written under
    pub epoch: u64,
    /// when it was last written or read (Unix milliseconds): reports carry it, and the next
    /// leader orders eviction by it across all its members, so the values engines keep reading
    /// stay cached after a failover
    pub used: u64,
    /// its bytes were found to match `checksum` since the mount that holds it was lost (or since
    /// its leader stopped answering): a report need not hash them again
    pub checked: bool,
    /// the leader's seal, once it committed the value (`grant::SealKey`): only a sealed value is
    /// handed to a next leader
    pub seal: Option<[u8; crate::grant::MAC_LEN]>,
}

impl Held {
    fn sealed(&self) -> bool {
        self.seal.is_some()
    }
}

/// Whether an entry's value counts among what is held for a next leader: finished and sealed.
fn counted(held: &Option<Held>) -> bool {
    held.as_ref().is_some_and(Held::sealed)
}

/// The most entries one [`Written::check_from`] looks at.
pub const CHECK_ENTRIES: usize = 4096;
/// The most bytes one [`Written::check_from`] hashes (past it by one value at most).
pub const CHECK_BYTES: u64 = 16 << 20;

#[derive(Debug, Clone)]
struct Entry {
    end: u64,
    allocation: u64,
    held: Option<Held>,
}

/// A finished value of a retired mount: its range and what was recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retired {
    pub offset: u64,
    pub len: u64,
    pub held: Held,
}

/// Values held and their bytes.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Count {
    pub values: u64,
    pub bytes: u64,
}

impl Count {
    fn add(&mut self, len: u64) {
        self.values += 1;
        self.bytes += len;
    }

    fn sub(&mut self, len: u64) {
        self.values = self.values.saturating_sub(1);
        self.bytes = self.bytes.saturating_sub(len);
    }
}

/// The ranges of one mount, by start.
#[derive(Debug)]
pub struct Written {
    ranges: BTreeMap<u64, Entry>,
    /// how many entries hold a sealed value, and their bytes
    held: Count,
    /// the clock uses are stamped with (Unix milliseconds; a test passes its own)
    clock: fn() -> u64,
}

impl Default for Written {
    fn default() -> Self {
        Self {
            ranges: BTreeMap::new(),
            held: Count::default(),
            clock: crate::time::now_unix_ms,
        }
    }
}

impl Written {
    /// The entries overlapping `[start, end)`, as `(start, end, allocation)`.
    fn overlapping(&self, start: u64, end: u64) -> Vec<(u64, u64, u64)> {
        let mut out: Vec<(u64, u64, u64)> = self
            .ranges
            .range(..end)
            .rev()
            .take_while(|(_, e)| e.end > start)
            .map(|(s, e)| (*s, e.end, e.allocation))
            .collect();
        out.reverse();
        out
    }

    fn now(&self) -> u64 {
        (self.clock)()
    }

    /// Records that `allocation` writes `[start, start + len)`, unless a newer allocation wrote
    /// any of it. Nothing is held there until the write finishes ([`Written::finish`]).
    pub fn write(&mut self, start: u64, len: u64, allocation: u64) -> Result<(), Stale> {
        let end = start.saturating_add(len);
        let overlapping = self.overlapping(start, end);
        if let Some(newer) = overlapping.iter().map(|(_, _, a)| *a).filter(|a| *a > allocation).max() {
            return Err(Stale::Replaced { newer });
        }
        for (s, e, a) in overlapping {
            if self.ranges.remove(&s).is_some_and(|old| counted(&old.held)) {
                self.held.sub(e - s);
            }
            // what is left of a value cut in part is no longer a value
            if s < start {
                self.ranges.insert(
                    s,
                    Entry {
                        end: start,
                        allocation: a,
                        held: None,
                    },
                );
            }
            if e > end {
                self.ranges.insert(
                    end,
                    Entry {
                        end: e,
                        allocation: a,
                        held: None,
                    },
                );
            }
        }
        let replaced = self.ranges.insert(
            start,
            Entry {
                end,
                allocation,
                held: None,
            },
        );
        // (only an empty write can find an entry at its start that it did not overlap)
        if let Some(old) = replaced
            && counted(&old.held)
        {
            self.held.sub(old.end - start);
        }
        Ok(())
    }

    /// Records that the write of `allocation` to `[start, start + len)` finished, with its tag,
    /// checksum and epoch; `false` (nothing recorded) if a newer write replaced it meanwhile or
    /// the mount changed.
    pub fn finish(&mut self, start: u64, len: u64, allocation: u64, tag: Arc<[u8]>, checksum: u64, epoch: u64) -> bool {
        let used = self.now();
        match self.ranges.get_mut(&start) {
            Some(e) if e.end == start.saturating_add(len) && e.allocation == allocation => {
                if counted(&e.held) {
                    self.held.sub(len);
                }
                e.held = Some(Held {
                    tag,
                    checksum,
                    epoch,
                    used,
                    checked: false,
                    seal: None,
                });
                true
            }
            _ => false,
        }
    }

    /// Whether `[start, start + len)` is exactly what `allocation` wrote (a read of it counts as
    /// a use).
    /// Whether `allocation`'s value of `len` bytes at `start` is here (finished or not), without
    /// counting a use.
    pub fn holds(&self, start: u64, len: u64, allocation: u64) -> bool {
        self.ranges
            .get(&start)
            .is_some_and(|e| e.end == start.saturating_add(len) && e.allocation == allocation)
    }

    pub fn read(&mut self, start: u64, len: u64, allocation: u64) -> Result<(), Stale> {
        let end = start.saturating_add(len);
        let used = self.now();
        match self.ranges.get_mut(&start) {
            Some(e) if e.end == end && e.allocation == allocation => {
                if let Some(h) = &mut e.held {
                    h.used = used;
                }
                Ok(())
            }
            _ => match self.overlapping(start, end).iter().map(|(_, _, a)| *a).max() {
                Some(newer) if newer > allocation => Err(Stale::Replaced { newer }),
                _ => Err(Stale::NotWritten),
            },
        }
    }

    /// Checks the finished values starting at `from` or later that were not checked yet, until
    /// [`CHECK_ENTRIES`] entries were looked at or [`CHECK_BYTES`] hashed: `checksum` gives the
    /// checksum of a range's bytes now (`None`: unreadable). A value whose bytes no longer match
    /// is forgotten as a value (its range stays fenced for its allocation). Returns where the
    /// next call starts (`None`: the table's end), so a caller that takes the table's lock per
    /// call lets transfers go on between calls.
    pub fn check_from(&mut self, from: u64, checksum: impl Fn(u64, u64) -> Option<u64>) -> Option<u64> {
        let (mut looked, mut hashed) = (0, 0);
        let held = &mut self.held;
        for (&start, e) in self.ranges.range_mut(from..) {
            if looked == CHECK_ENTRIES || hashed >= CHECK_BYTES {
                return Some(start);
            }
            looked += 1;
            let len = e.end - start;
            let Some(h) = e.held.as_mut().filter(|h| !h.checked) else {
                continue;
            };
            hashed += len;
            if checksum(start, len) == Some(h.checksum) {
                h.checked = true;
            } else {
                if counted(&e.held) {
                    held.sub(len);
                }
                e.held = None;
            }
        }
        None
    }

    /// Ends the table's mount: every range is forgotten (a new mount's grants start a new count),
    /// and the finished values the leader sealed are returned in the segment's order (by offset:
    /// the table's own, so nothing is sorted however many there are, and the next leader takes
    /// their ranges one after the other).
    pub fn retire(&mut self) -> Vec<Retired> {
        self.held = Count::default();
        let ranges = std::mem::take(&mut self.ranges);
        // at its size at once: grown by doubling, tens of millions of records moved several times
        let mut out = Vec::with_capacity(ranges.len());
        out.extend(ranges.into_iter().filter_map(|(offset, e)| {
            e.held.filter(Held::sealed).map(|held| Retired {
                offset,
                len: e.end - offset,
                held,
            })
        }));
        out
    }

    /// Starts the new mount's table with a value the leader adopted under `allocation` (its tag,
    /// seal and last use kept; checked again before the next report).
    pub fn adopt(&mut self, r: Retired, allocation: u64) {
        self.held.add(r.len);
        let replaced = self.ranges.insert(
            r.offset,
            Entry {
                end: r.offset + r.len,
                allocation,
                held: Some(Held {
                    checked: false,
                    ..r.held
                }),
            },
        );
        if let Some(old) = replaced
            && counted(&old.held)
        {
            self.held.sub(old.end - r.offset);
        }
    }

    /// Records the leader's seal of the value `allocation` wrote at `start`, which it committed:
    /// from now on it is held for a next leader. `false` if no finished value of that allocation
    /// is there (it was replaced, or its write never finished).
    pub fn seal(&mut self, start: u64, allocation: u64, seal: [u8; crate::grant::MAC_LEN]) -> bool {
        match self.ranges.get_mut(&start) {
            Some(e) if e.allocation == allocation => match &mut e.held {
                Some(h) => {
                    if h.seal.is_none() {
                        self.held.add(e.end - start);
                    }
                    h.seal = Some(seal);
                    true
                }
                None => false,
            },
            _ => false,
        }
    }

    /// Drops what `allocation` began writing at `start` and never finished (a load from the disk
    /// tier whose bytes did not check): nothing of it may be read, and nothing was held.
    pub fn discard(&mut self, start: u64, allocation: u64) {
        if self
            .ranges
            .get(&start)
            .is_some_and(|e| e.allocation == allocation && e.held.is_none())
        {
            self.ranges.remove(&start);
        }
    }

    /// Forgets the value `allocation` wrote at `start`, which the leader freed: it is no longer
    /// held (its range stays fenced for its allocation). `false` if nothing of it was held there.
    pub fn forget(&mut self, start: u64, allocation: u64) -> bool {
        match self.ranges.get_mut(&start) {
            Some(e) if e.allocation == allocation && e.held.is_some() => {
                if counted(&e.held) {
                    self.held.sub(e.end - start);
                }
                e.held = None;
                true
            }
            _ => false,
        }
    }

    /// The sealed value `allocation` wrote at `start`, if it is still there: its length and what
    /// was recorded of it (what the disk tier copies).
    pub fn sealed_value(&self, start: u64, allocation: u64) -> Option<(u64, Held)> {
        let e = self.ranges.get(&start).filter(|e| e.allocation == allocation)?;
        let h = e.held.as_ref().filter(|h| h.sealed())?;
        Some((e.end - start, h.clone()))
    }

    /// The values held, and their bytes.
    pub fn held(&self) -> Count {
        self.held
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
mod tests;
