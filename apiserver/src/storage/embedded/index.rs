//! The in-memory multi-version index: for every key, its versions in revision order, each
//! pointing at its value in the log (or holding it in memory until the log write is durable).
//!
//! Versions are kept until the next log compaction, so a paged list can read every page at the
//! revision of its first page. Values are never held here once durable: they are read from the
//! mapped log.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;

use super::super::Value;
use super::mmap::LogMap;

/// Where a version's value is.
#[derive(Clone, Debug)]
pub enum Loc {
    /// Assigned a revision, not yet durable: the value waits in memory for the committer.
    Pending(Value),
    /// Durable, at this offset of the current log file.
    Disk { offset: u64, len: u32 },
    /// The key was deleted at this revision.
    Tombstone,
}

#[derive(Clone, Debug)]
pub struct Version {
    pub mod_revision: u64,
    pub create_revision: u64,
    pub loc: Loc,
}

impl Version {
    pub fn is_live(&self) -> bool {
        !matches!(self.loc, Loc::Tombstone)
    }
}

/// A reference to a value that stays valid after the index changes (used for the previous value
/// of a watch event, resolved after the write is durable).
#[derive(Clone)]
pub enum ValueRef {
    Memory(Value),
    Mapped { map: Arc<LogMap>, offset: u64, len: u32 },
}

impl ValueRef {
    pub fn resolve(&self) -> Option<Value> {
        match self {
            ValueRef::Memory(v) => Some(v.clone()),
            ValueRef::Mapped { map, offset, len } => map.slice(*offset, *len as usize).map(Value::from),
        }
    }
}

#[derive(Default)]
pub struct Index {
    keys: BTreeMap<Arc<str>, Vec<Version>>,
    /// Bytes of keys and values of the latest live versions: what a compacted log would hold.
    pub live_bytes: u64,
}

impl Index {
    /// The newest version of `key`, durable or not.
    pub fn latest(&self, key: &str) -> Option<&Version> {
        self.keys.get(key)?.last()
    }

    /// The newest version of `key` at or before `revision`.
    pub fn at(&self, key: &str, revision: u64) -> Option<&Version> {
        self.keys.get(key)?.iter().rev().find(|v| v.mod_revision <= revision)
    }

    /// Whether any key under `prefix` has a version newer than `revision`.
    pub fn any_newer(&self, prefix: &str, revision: u64) -> bool {
        self.range_from(prefix, None)
            .any(|(_, versions)| versions.last().is_some_and(|v| v.mod_revision > revision))
    }

    /// Keys under `prefix` in order, starting after `after` when given.
    pub fn range_from<'a>(
        &'a self,
        prefix: &'a str,
        after: Option<&str>,
    ) -> impl Iterator<Item = (&'a Arc<str>, &'a Vec<Version>)> + 'a {
        let start: Bound<&str> = match after {
            Some(a) if a >= prefix => Bound::Excluded(a),
            _ => Bound::Included(prefix),
        };
        self.keys
            .range::<str, _>((start, Bound::Unbounded))
            .take_while(move |(k, _)| k.starts_with(prefix))
    }

    /// Records a put or delete at `revision`. Returns the previous live version, if any.
    /// A delete of a key with no live version records nothing and returns `None`.
    pub fn apply(&mut self, key: &str, revision: u64, value: Option<Value>) -> Option<Version> {
        let loc = value.map_or(Loc::Tombstone, Loc::Pending);
        self.push(key, revision, None, loc)
    }

    /// Points the version of `key` at `revision` to its durable location.
    pub fn set_durable(&mut self, key: &str, revision: u64, offset: u64, len: u32) {
        if let Some(v) = self
            .keys
            .get_mut(key)
            .and_then(|vs| vs.iter_mut().rev().find(|v| v.mod_revision == revision))
            && matches!(v.loc, Loc::Pending(_))
        {
            v.loc = Loc::Disk { offset, len };
        }
    }

    /// Inserts a durable version during recovery (versions arrive in revision order).
    pub fn recover(&mut self, key: &str, revision: u64, create_revision: Option<u64>, loc: Loc) {
        self.push(key, revision, create_revision, loc);
    }

    /// Appends a version, keeping `live_bytes`; the creation revision is the given one, else the
    /// previous live version's, else `revision`. A tombstone for a key that is not live records
    /// nothing. Returns the previous live version.
    fn push(&mut self, key: &str, revision: u64, create_revision: Option<u64>, loc: Loc) -> Option<Version> {
        let prev = self.latest(key).filter(|v| v.is_live()).cloned();
        if matches!(loc, Loc::Tombstone) && prev.is_none() {
            return None;
        }
        let key_len = key.len() as u64;
        if let Some(p) = &prev {
            self.live_bytes = self.live_bytes.saturating_sub(key_len + loc_len(&p.loc));
        }
        if !matches!(loc, Loc::Tombstone) {
            self.live_bytes += key_len + loc_len(&loc);
        }
        let version = Version {
            mod_revision: revision,
            create_revision: create_revision
                .or(prev.as_ref().map(|p| p.create_revision))
                .unwrap_or(revision),
            loc,
        };
        match self.keys.get_mut(key) {
            Some(versions) => versions.push(version),
            None => {
                self.keys.insert(Arc::from(key), vec![version]);
            }
        }
        prev
    }

    /// Every key's newest version at or before `revision` that is live: the content of a
    /// snapshot at `revision`.
    pub fn live_at(&self, revision: u64) -> impl Iterator<Item = (&Arc<str>, &Version)> {
        self.keys
            .iter()
            .filter_map(move |(k, vs)| vs.iter().rev().find(|v| v.mod_revision <= revision).map(|v| (k, v)))
            .filter(|(_, v)| v.is_live())
    }

    /// After a compaction at `revision`: drops every version older than the one visible at
    /// `revision`, and keys whose only remaining version is a tombstone at or before it.
    /// `relocate` gives the new location of each version kept from the snapshot.
    pub fn compact(&mut self, revision: u64, mut relocate: impl FnMut(&str) -> Option<(u64, u32)>) {
        self.keys.retain(|key, versions| {
            let visible = versions.iter().rposition(|v| v.mod_revision <= revision);
            if let Some(i) = visible {
                versions.drain(..i);
                let v = &mut versions[0];
                match v.loc {
                    Loc::Tombstone => {
                        versions.remove(0);
                    }
                    _ => {
                        if let Some((offset, len)) = relocate(key) {
                            v.loc = Loc::Disk { offset, len };
                        }
                    }
                }
            }
            !versions.is_empty()
        });
    }

    /// Forgets every version newer than `revision` (all of them pending: a commit that can no
    /// longer happen), restoring `live_bytes` as if they had never been applied. Returns how many
    /// versions were dropped.
    pub fn discard_after(&mut self, revision: u64) -> usize {
        let mut dropped = 0;
        let mut live_bytes = self.live_bytes;
        self.keys.retain(|key, versions| {
            let key_len = key.len() as u64;
            while versions.last().is_some_and(|v| v.mod_revision > revision) {
                let Some(gone) = versions.pop() else { break };
                dropped += 1;
                if gone.is_live() {
                    live_bytes = live_bytes.saturating_sub(key_len + loc_len(&gone.loc));
                }
                if let Some(prev) = versions.last().filter(|v| v.is_live()) {
                    live_bytes += key_len + loc_len(&prev.loc);
                }
            }
            !versions.is_empty()
        });
        self.live_bytes = live_bytes;
        dropped
    }

    pub fn key_count(&self) -> usize {
        self.keys.len()
    }
}

fn loc_len(loc: &Loc) -> u64 {
    match loc {
        Loc::Pending(v) => v.len() as u64,
        Loc::Disk { len, .. } => u64::from(*len),
        Loc::Tombstone => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Option<Value> {
        Some(Value::from(s.as_bytes()))
    }

    #[test]
    fn versions_and_revisions() {
        let mut ix = Index::default();
        assert!(ix.apply("/a", 1, v("x")).is_none());
        let prev = ix.apply("/a", 2, v("yy")).unwrap();
        assert_eq!(prev.mod_revision, 1);
        assert_eq!(ix.latest("/a").unwrap().create_revision, 1);
        assert_eq!(ix.at("/a", 1).unwrap().mod_revision, 1);
        assert!(ix.apply("/a", 3, None).is_some());
        assert!(!ix.latest("/a").unwrap().is_live());
        assert!(
            ix.apply("/a", 4, None).is_none(),
            "deleting a deleted key records nothing"
        );
        ix.apply("/a", 5, v("z"));
        assert_eq!(ix.latest("/a").unwrap().create_revision, 5);
        assert_eq!(ix.live_bytes, 3);
    }

    #[test]
    fn range_and_newer_checks() {
        let mut ix = Index::default();
        for (i, k) in ["/p/a", "/p/b", "/q/a"].iter().enumerate() {
            ix.apply(k, i as u64 + 1, v("v"));
        }
        let keys: Vec<_> = ix.range_from("/p/", None).map(|(k, _)| k.to_string()).collect();
        assert_eq!(keys, ["/p/a", "/p/b"]);
        let keys: Vec<_> = ix.range_from("/p/", Some("/p/a")).map(|(k, _)| k.to_string()).collect();
        assert_eq!(keys, ["/p/b"]);
        assert!(ix.any_newer("/p/", 1));
        assert!(!ix.any_newer("/p/", 2));
    }

    #[test]
    fn discarding_pending_versions_restores_the_index() {
        let mut ix = Index::default();
        ix.apply("/a", 1, v("one"));
        ix.apply("/b", 2, v("b"));
        let before = ix.live_bytes;
        ix.apply("/a", 3, v("three!"));
        ix.apply("/b", 4, None);
        ix.apply("/c", 5, v("c"));
        ix.apply("/a", 6, None);
        assert_eq!(ix.discard_after(2), 4);
        assert_eq!(ix.live_bytes, before);
        assert_eq!(ix.latest("/a").unwrap().mod_revision, 1);
        assert_eq!(ix.latest("/b").unwrap().mod_revision, 2);
        assert!(ix.latest("/c").is_none(), "a key created after the revision is gone");
        assert_eq!(ix.key_count(), 2);
        assert_eq!(ix.discard_after(2), 0);
    }

    #[test]
    fn compaction_keeps_the_visible_version_and_newer_ones() {
        let mut ix = Index::default();
        ix.apply("/a", 1, v("1"));
        ix.apply("/a", 2, v("2"));
        ix.apply("/b", 3, v("b"));
        ix.apply("/b", 4, None);
        ix.apply("/a", 5, v("5"));
        ix.compact(4, |_| Some((100, 1)));
        assert!(ix.latest("/b").is_none());
        assert!(ix.at("/a", 1).is_none());
        assert!(matches!(ix.at("/a", 4).unwrap().loc, Loc::Disk { offset: 100, .. }));
        assert_eq!(ix.latest("/a").unwrap().mod_revision, 5);
    }
}
