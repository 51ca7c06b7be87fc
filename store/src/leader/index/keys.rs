//! How the index keeps a key (`index.rs`). A key as the vLLM connector makes it,
//! `NAMESPACE/HASH` with HASH 32 lowercase hex digits, is kept as its namespace's number (each
//! namespace kept once per tenant, while a key uses it) and the hash's 16 bytes: 20 bytes in the
//! slot instead of the key's 70 to 100 bytes on the heap. Any other key is kept as its bytes.
//! Either way the key is kept exactly: it is written back out byte for byte ([`Name`]).

use std::collections::HashMap;
use std::fmt;

/// A key as a slot keeps it.
#[derive(Debug)]
pub(super) enum Key {
    Packed { prefix: u32, hash: [u8; 16] },
    Raw(Box<str>),
}

/// A key as it is compared and hashed: a kept [`Key`]'s, or a looked-up key's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Form<'a> {
    Packed(u32, [u8; 16]),
    Raw(&'a str),
}

impl Key {
    /// Bytes it keeps on the heap (a key kept as its bytes, with the allocator's 16).
    pub(super) fn heap_bytes(&self) -> usize {
        match self {
            Key::Packed { .. } => 0,
            Key::Raw(k) => k.len() + 16,
        }
    }

    pub(super) fn form(&self) -> Form<'_> {
        match self {
            Key::Packed { prefix, hash } => Form::Packed(*prefix, *hash),
            Key::Raw(k) => Form::Raw(k),
        }
    }
}

/// The namespace and hash of a connector's key; `None` for any other key.
fn split(key: &str) -> Option<(&str, [u8; 16])> {
    let (prefix, hex) = key.rsplit_once('/')?;
    if hex.len() != 32 {
        return None;
    }
    let mut hash = [0u8; 16];
    for (byte, pair) in hash.iter_mut().zip(hex.as_bytes().chunks_exact(2)) {
        let [high, low] = pair else { return None };
        *byte = (digit(*high)? << 4) | digit(*low)?;
    }
    Some((prefix, hash))
}

/// A lowercase hex digit's value (an uppercase one would not be written back the same).
fn digit(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        _ => None,
    }
}

/// The namespaces of a tenant's packed keys, each kept once while a key uses it.
#[derive(Debug, Default)]
pub(super) struct Prefixes {
    ids: HashMap<Box<str>, u32>,
    /// by number: the namespace and how many kept keys use it (`None`: a free number)
    names: Vec<Option<(Box<str>, u64)>>,
    free: Vec<u32>,
}

impl Prefixes {
    /// How `key` is looked up; `None` for a connector's key of a namespace no kept key uses (it
    /// is not held).
    pub(super) fn form<'a>(&self, key: &'a str) -> Option<Form<'a>> {
        match split(key) {
            Some((prefix, hash)) => self.ids.get(prefix).map(|id| Form::Packed(*id, hash)),
            None => Some(Form::Raw(key)),
        }
    }

    /// How `key` is kept, its namespace counted once more.
    pub(super) fn keep(&mut self, key: &str) -> Key {
        let Some((prefix, hash)) = split(key) else {
            return Key::Raw(key.into());
        };
        let id = match self.ids.get(prefix) {
            Some(id) => *id,
            None => {
                let Some(id) = self.free.pop().or_else(|| u32::try_from(self.names.len()).ok()) else {
                    return Key::Raw(key.into());
                };
                let entry = Some((Box::from(prefix), 0));
                match self.names.get_mut(id as usize) {
                    Some(free) => *free = entry,
                    None => self.names.push(entry),
                }
                self.ids.insert(prefix.into(), id);
                id
            }
        };
        if let Some(Some((_, keys))) = self.names.get_mut(id as usize) {
            *keys += 1;
        }
        Key::Packed { prefix: id, hash }
    }

    /// Counts a kept key's namespace once less; a namespace no kept key uses is forgotten.
    pub(super) fn release(&mut self, key: &Key) {
        let Key::Packed { prefix, .. } = key else { return };
        let Some(entry) = self.names.get_mut(*prefix as usize) else {
            return;
        };
        if let Some((name, keys)) = entry {
            *keys = keys.saturating_sub(1);
            if *keys == 0 {
                self.ids.remove(name);
                *entry = None;
                self.free.push(*prefix);
            }
        }
    }

    /// `key`, to write out.
    pub(super) fn name<'a>(&'a self, key: &'a Key) -> Name<'a> {
        match key {
            Key::Raw(k) => Name { head: k, hash: None },
            Key::Packed { prefix, hash } => {
                let head = self
                    .names
                    .get(*prefix as usize)
                    .and_then(Option::as_ref)
                    .map_or("", |(n, _)| &**n);
                Name { head, hash: Some(hash) }
            }
        }
    }

    /// Namespaces kept.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.ids.len()
    }

    /// About the bytes it takes: each namespace twice (the map's key and the list's), with the
    /// allocator's 16 each, and the map's and the list's entries.
    pub(super) fn bytes(&self) -> usize {
        let names: usize = self.ids.keys().map(|n| 2 * (n.len() + 16)).sum();
        names
            + self.ids.capacity() * (16 + 4 + 1)
            + self.names.capacity() * std::mem::size_of::<Option<(Box<str>, u64)>>()
    }
}

/// A kept key, written out on demand (`Display`, `to_string()`).
#[derive(Debug, Clone, Copy)]
pub struct Name<'a> {
    /// the namespace of a packed key, or the whole of any other
    head: &'a str,
    hash: Option<&'a [u8; 16]>,
}

impl fmt::Display for Name<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.head)?;
        if let Some(hash) = self.hash {
            f.write_str("/")?;
            for b in hash {
                write!(f, "{b:02x}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HASH: &str = "9bfcbae53e9d0ddc6ce6c83cede95c1f";

    #[test]
    fn a_connectors_key_is_packed_and_written_back_exactly() {
        let mut p = Prefixes::default();
        let key = format!("vllm/Qwen/Qwen2.5-0.5B/0123456789abcdef/tp1of2/{HASH}");
        let kept = p.keep(&key);
        assert!(matches!(kept, Key::Packed { prefix: 0, .. }));
        assert_eq!(p.name(&kept).to_string(), key);
        assert_eq!(p.form(&key), Some(kept.form()));
        // another namespace's key with the same hash is another key
        let other = format!("vllm/other/{HASH}");
        assert_eq!(p.form(&other), None, "no key of that namespace is kept");
        let kept_other = p.keep(&other);
        assert_ne!(kept_other.form(), kept.form());
        assert_eq!(p.len(), 2);
    }

    #[test]
    fn any_other_key_is_kept_as_its_bytes() {
        let mut p = Prefixes::default();
        for key in [
            "plain",
            "a/short",
            "ns/9BFCBAE53E9D0DDC6CE6C83CEDE95C1F",
            "ns/9bfcbae53e9d0ddc6ce6c83cede95c1",
            "ns/9bfcbae53e9d0ddc6ce6c83cede95c1fa",
            "ns/9bfcbae53e9d0ddc6ce6c83cede95c1g",
            "ns/9bfcbae53e9d0ddc6ce6c83cede95c€",
        ] {
            let kept = p.keep(key);
            assert!(matches!(kept, Key::Raw(_)), "{key}");
            assert_eq!(p.name(&kept).to_string(), key);
            assert_eq!(p.form(key), Some(Form::Raw(key)));
        }
        assert_eq!(p.len(), 0);
        // an empty namespace is a namespace
        let kept = p.keep(&format!("/{HASH}"));
        assert_eq!(p.name(&kept).to_string(), format!("/{HASH}"));
    }

    #[test]
    fn a_namespace_is_forgotten_with_its_last_key_and_its_number_taken_again() {
        let mut p = Prefixes::default();
        let a = p.keep(&format!("a/{HASH}"));
        let a2 = p.keep(&format!("a/{}", "0".repeat(32)));
        let b = p.keep(&format!("b/{HASH}"));
        p.release(&a);
        assert_eq!(p.len(), 2, "a still has a key");
        p.release(&a2);
        assert_eq!(p.len(), 1);
        assert_eq!(p.form(&format!("a/{HASH}")), None);
        let c = p.keep(&format!("c/{HASH}"));
        assert!(matches!(c, Key::Packed { prefix: 0, .. }), "a's number is free again");
        assert_eq!(p.name(&c).to_string(), format!("c/{HASH}"));
        assert_eq!(p.name(&b).to_string(), format!("b/{HASH}"));
    }
}
