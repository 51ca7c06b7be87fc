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
//! retired in place ([`Written::retire`]): its finished values wait, in the segment's order,
//! for the member's report to the leader, and become the new mount's only as the leader adopts
//! them, under the allocation numbers of its term ([`Written::adopt`]); a waiting value is read
//! and fenced by no grant. A write still in flight has recorded nothing, so it is never
//! reported: it is adopted whole or not at all. Only a value the leader sealed once it was
//! committed (its heartbeat answers hand the seals over, [`Written::seal`]) is held for a next
//! leader; one it freed since ([`Written::forget`]) is not: a next leader is not handed it.
//!
//! Nothing of the table is moved when a mount ends: tens of millions of values change which
//! mount they are of where they lie, and a page of the report's answer is applied by a walk of
//! its range (a table rebuilt from the report cost a failover at 20 million values about 2 s
//! before the first page and twice the member's time a page, most of it the kernel clearing
//! fresh memory for the new table).

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

/// Whether a value of the current mount counts among what is held for a next leader: finished
/// and sealed.
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
    of: Of,
}

/// Which mount an entry is of.
#[derive(Debug, Clone)]
enum Of {
    /// the current mount: what `allocation` wrote, and what it holds once the write finished
    Mount { allocation: u64, held: Option<Held> },
    /// a mount that ended: a finished, sealed value waiting for a leader to adopt it (a report,
    /// `segment/handover.rs`); no grant reads or fences it
    Ended(Held),
}

impl Entry {
    /// The allocation of the current mount that wrote it (`None`: a value of an ended mount).
    fn allocation(&self) -> Option<u64> {
        match self.of {
            Of::Mount { allocation, .. } => Some(allocation),
            Of::Ended(_) => None,
        }
    }

    /// What `allocation` of the current mount holds here, if it wrote this entry.
    fn held_by(&mut self, allocation: u64) -> Option<&mut Option<Held>> {
        match &mut self.of {
            Of::Mount { allocation: a, held } if *a == allocation => Some(held),
            _ => None,
        }
    }
}

/// A finished value of an ended mount, as a report's page carries it: its range and what was
/// recorded.
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

/// The ranges of the current mount and the values of ended mounts waiting for a leader, by
/// start.
#[derive(Debug)]
pub struct Written {
    ranges: BTreeMap<u64, Entry>,
    /// how many entries of the current mount hold a sealed value, and their bytes
    held: Count,
    /// how many values of ended mounts wait, and their bytes
    waiting: Count,
    /// whether an entry of the current mount was made since the last [`retire`](Self::retire):
    /// a retire with none walks nothing (a mount refused and made again, tens of millions of
    /// values waiting)
    mounted_since: bool,
    /// the clock uses are stamped with (Unix milliseconds; a test passes its own)
    clock: fn() -> u64,
}

impl Default for Written {
    fn default() -> Self {
        Self {
            ranges: BTreeMap::new(),
            held: Count::default(),
            waiting: Count::default(),
            mounted_since: false,
            clock: crate::time::now_unix_ms,
        }
    }
}

impl Written {
    /// The entries overlapping `[start, end)`, as `(start, end, allocation)` (`None`: a value of
    /// an ended mount).
    fn overlapping(&self, start: u64, end: u64) -> Vec<(u64, u64, Option<u64>)> {
        let mut out: Vec<(u64, u64, Option<u64>)> = self
            .ranges
            .range(..end)
            .rev()
            .take_while(|(_, e)| e.end > start)
            .map(|(s, e)| (*s, e.end, e.allocation()))
            .collect();
        out.reverse();
        out
    }

    fn now(&self) -> u64 {
        (self.clock)()
    }

    /// Takes out the entry at `start`, counting what it held out.
    fn remove(&mut self, start: u64) -> Option<Entry> {
        let e = self.ranges.remove(&start)?;
        self.count_out(start, &e);
        Some(e)
    }

    /// Counts out what entry `e` at `start`, no longer in the table, held.
    fn count_out(&mut self, start: u64, e: &Entry) {
        match &e.of {
            Of::Mount { held, .. } if counted(held) => self.held.sub(e.end - start),
            Of::Mount { .. } => {}
            Of::Ended(_) => self.waiting.sub(e.end - start),
        }
    }

    /// Records that `allocation` writes `[start, start + len)`, unless a newer allocation wrote
    /// any of it. Nothing is held there until the write finishes ([`Written::finish`]). A value
    /// of an ended mount there is no longer waiting (a leader places there only once it did not
    /// adopt it).
    pub fn write(&mut self, start: u64, len: u64, allocation: u64) -> Result<(), Stale> {
        let end = start.saturating_add(len);
        let overlapping = self.overlapping(start, end);
        if let Some(newer) = overlapping
            .iter()
            .filter_map(|(_, _, a)| *a)
            .filter(|a| *a > allocation)
            .max()
        {
            return Err(Stale::Replaced { newer });
        }
        self.mounted_since = true;
        for (s, e, a) in overlapping {
            self.remove(s);
            // what is left of a value cut in part is no longer a value; the current mount's
            // part stays fenced for its allocation
            let Some(a) = a else { continue };
            let fence = |end| Entry {
                end,
                of: Of::Mount {
                    allocation: a,
                    held: None,
                },
            };
            if s < start {
                self.ranges.insert(s, fence(start));
            }
            if e > end {
                self.ranges.insert(end, fence(e));
            }
        }
        let entry = Entry {
            end,
            of: Of::Mount { allocation, held: None },
        };
        // (only an empty write can find an entry at its start that it did not overlap)
        if let Some(old) = self.ranges.insert(start, entry) {
            self.count_out(start, &old);
        }
        Ok(())
    }

    /// Records that the write of `allocation` to `[start, start + len)` finished, with its tag,
    /// checksum and epoch; `false` (nothing recorded) if a newer write replaced it meanwhile or
    /// the mount changed.
    pub fn finish(&mut self, start: u64, len: u64, allocation: u64, tag: Arc<[u8]>, checksum: u64, epoch: u64) -> bool {
        let used = self.now();
        let Some(e) = self
            .ranges
            .get_mut(&start)
            .filter(|e| e.end == start.saturating_add(len))
        else {
            return false;
        };
        let Some(held) = e.held_by(allocation) else {
            return false;
        };
        if counted(held) {
            self.held.sub(len);
        }
        *held = Some(Held {
            tag,
            checksum,
            epoch,
            used,
            checked: false,
            seal: None,
        });
        true
    }

    /// Whether `allocation`'s value of `len` bytes at `start` is here (finished or not), without
    /// counting a use.
    pub fn holds(&self, start: u64, len: u64, allocation: u64) -> bool {
        self.ranges
            .get(&start)
            .is_some_and(|e| e.end == start.saturating_add(len) && e.allocation() == Some(allocation))
    }

    /// Whether `[start, start + len)` is exactly what `allocation` wrote (a read of it counts as
    /// a use).
    pub fn read(&mut self, start: u64, len: u64, allocation: u64) -> Result<(), Stale> {
        let end = start.saturating_add(len);
        let used = self.now();
        if let Some(held) = self
            .ranges
            .get_mut(&start)
            .filter(|e| e.end == end)
            .and_then(|e| e.held_by(allocation))
        {
            if let Some(h) = held {
                h.used = used;
            }
            return Ok(());
        }
        match self.overlapping(start, end).iter().filter_map(|(_, _, a)| *a).max() {
            Some(newer) if newer > allocation => Err(Stale::Replaced { newer }),
            _ => Err(Stale::NotWritten),
        }
    }

    /// Checks the finished values (of the current mount and waiting ones of ended mounts)
    /// starting at `from` or later that were not checked yet, until [`CHECK_ENTRIES`] entries
    /// were looked at or [`CHECK_BYTES`] hashed: `checksum` gives the checksum of a range's bytes
    /// now (`None`: unreadable). A value whose bytes no longer match is forgotten as a value (a
    /// range of the current mount stays fenced for its allocation). Returns where the next call
    /// starts (`None`: the table's end), so a caller that takes the table's lock per call lets
    /// transfers go on between calls.
    pub fn check_from(&mut self, from: u64, checksum: impl Fn(u64, u64) -> Option<u64>) -> Option<u64> {
        let (mut looked, mut hashed) = (0, 0);
        // waiting values whose bytes changed: taken out once the walk is done
        let mut changed = Vec::new();
        let mut next = None;
        for (&start, e) in self.ranges.range_mut(from..) {
            if looked == CHECK_ENTRIES || hashed >= CHECK_BYTES {
                next = Some(start);
                break;
            }
            looked += 1;
            let len = e.end - start;
            let (Of::Mount { held: Some(h), .. } | Of::Ended(h)) = &mut e.of else {
                continue;
            };
            if h.checked {
                continue;
            }
            hashed += len;
            if checksum(start, len) == Some(h.checksum) {
                h.checked = true;
                continue;
            }
            match &mut e.of {
                Of::Mount { held, .. } => {
                    if counted(held) {
                        self.held.sub(len);
                    }
                    *held = None;
                }
                Of::Ended(_) => changed.push(start),
            }
        }
        for start in changed {
            self.remove(start);
        }
        next
    }

    /// Ends the table's mount: its ranges are forgotten (a new mount's grants start a new count),
    /// and the finished values the leader sealed wait for the next leader, with the values of
    /// earlier mounts that no leader adopted yet, in the segment's order ([`ended_from`]). In
    /// place: nothing is moved or copied, however many there are. Returns what waits.
    ///
    /// [`ended_from`]: Self::ended_from
    pub fn retire(&mut self) -> Count {
        self.held = Count::default();
        if std::mem::take(&mut self.mounted_since) {
            let mut waiting = Count::default();
            self.ranges.retain(|&start, e| {
                if let Of::Mount { held, .. } = &mut e.of {
                    match held.take().filter(Held::sealed) {
                        Some(h) => e.of = Of::Ended(h),
                        None => return false,
                    }
                }
                waiting.add(e.end - start);
                true
            });
            self.waiting = waiting;
        }
        self.waiting
    }

    /// What waits for a next leader: the values of ended mounts, and their bytes.
    pub fn waiting(&self) -> Count {
        self.waiting
    }

    /// The waiting values of ended mounts from `from` on, in the segment's order.
    pub fn ended_from(&self, from: u64) -> impl Iterator<Item = (u64, u64, &Held)> {
        self.ranges.range(from..).filter_map(|(&start, e)| match &e.of {
            Of::Ended(h) => Some((start, e.end - start, h)),
            Of::Mount { .. } => None,
        })
    }

    /// Stops waiting for the value of an ended mount at `start` whose checksum is `checksum`
    /// (its bytes no longer match it): its range is free. `false` if no such value waits there.
    pub fn drop_ended(&mut self, start: u64, checksum: u64) -> bool {
        let waits = self
            .ranges
            .get(&start)
            .is_some_and(|e| matches!(&e.of, Of::Ended(h) if h.checksum == checksum));
        waits && self.remove(start).is_some()
    }

    /// Stops waiting for every value of ended mounts (the report ended before a leader adopted
    /// them: their ranges are free). Returns how many there were.
    pub fn drop_all_ended(&mut self) -> u64 {
        let dropped = self.waiting.values;
        if dropped > 0 {
            self.ranges.retain(|_, e| matches!(e.of, Of::Mount { .. }));
        }
        self.waiting = Count::default();
        dropped
    }

    /// Applies a leader's answer to a page of a report: the waiting value at `page[i]` is adopted
    /// under `allocations[i]` of the current mount (its tag, seal and last use kept; checked
    /// again before the next report), or, where that is 0, stops waiting (its range is free).
    /// `page` is in the segment's order, as the report made it; a value no longer waiting there
    /// (its bytes were found changed meanwhile) is passed over. Returns how many were adopted.
    pub fn adopt(&mut self, page: &[u64], allocations: &[u64]) -> u64 {
        let (Some(&first), Some(&last)) = (page.first(), page.last()) else {
            return 0;
        };
        let mut answers = page
            .iter()
            .zip(allocations.iter().chain(std::iter::repeat(&0)))
            .peekable();
        let (mut adopted, mut free) = (0, Vec::new());
        let Written {
            ranges,
            held,
            waiting,
            mounted_since,
            ..
        } = self;
        for (&start, e) in ranges.range_mut(first..=last) {
            while answers.next_if(|(at, _)| **at < start).is_some() {}
            let Some((_, &allocation)) = answers.next_if(|(at, _)| **at == start) else {
                continue;
            };
            let Of::Ended(h) = &e.of else { continue };
            if allocation == 0 {
                free.push(start);
                continue;
            }
            let h = Held {
                checked: false,
                ..h.clone()
            };
            held.add(e.end - start);
            waiting.sub(e.end - start);
            *mounted_since = true;
            e.of = Of::Mount {
                allocation,
                held: Some(h),
            };
            adopted += 1;
        }
        for start in free {
            self.remove(start);
        }
        adopted
    }

    /// Records the leader's seal of the value `allocation` wrote at `start`, which it committed:
    /// from now on it is held for a next leader. `false` if no finished value of that allocation
    /// is there (it was replaced, or its write never finished).
    pub fn seal(&mut self, start: u64, allocation: u64, seal: [u8; crate::grant::MAC_LEN]) -> bool {
        let Some(e) = self.ranges.get_mut(&start) else {
            return false;
        };
        let len = e.end - start;
        match e.held_by(allocation) {
            Some(Some(h)) => {
                if h.seal.is_none() {
                    self.held.add(len);
                }
                h.seal = Some(seal);
                true
            }
            _ => false,
        }
    }

    /// Drops what `allocation` began writing at `start` and never finished (a load from the disk
    /// tier whose bytes did not check): nothing of it may be read, and nothing was held.
    pub fn discard(&mut self, start: u64, allocation: u64) {
        if self
            .ranges
            .get_mut(&start)
            .and_then(|e| e.held_by(allocation))
            .is_some_and(|held| held.is_none())
        {
            self.ranges.remove(&start);
        }
    }

    /// Forgets the value `allocation` wrote at `start`, which the leader freed: it is no longer
    /// held (its range stays fenced for its allocation). `false` if nothing of it was held there.
    pub fn forget(&mut self, start: u64, allocation: u64) -> bool {
        let Some(e) = self.ranges.get_mut(&start) else {
            return false;
        };
        let len = e.end - start;
        match e.held_by(allocation) {
            Some(held @ Some(_)) => {
                if counted(held) {
                    self.held.sub(len);
                }
                *held = None;
                true
            }
            _ => false,
        }
    }

    /// The sealed value `allocation` wrote at `start`, if it is still there: its length and what
    /// was recorded of it (what the disk tier copies).
    pub fn sealed_value(&self, start: u64, allocation: u64) -> Option<(u64, Held)> {
        let e = self.ranges.get(&start)?;
        match &e.of {
            Of::Mount {
                allocation: a,
                held: Some(h),
            } if *a == allocation && h.sealed() => Some((e.end - start, h.clone())),
            _ => None,
        }
    }

    /// The values held, and their bytes.
    pub fn held(&self) -> Count {
        self.held
    }

    /// How many ranges are recorded (of the current mount, and values waiting).
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
