//! How the index keeps a key (`index.rs`): in 20 bytes of its slot. A key as the vLLM connector
//! makes it, `NAMESPACE/HASH` with HASH 32 lowercase hex digits, is kept as its namespace's
//! number (each namespace kept once per tenant, while a key uses it) and the hash's 16 bytes,
//! instead of the key's 70 to 100 bytes on the heap. Any other key is kept as its bytes on the
//! heap, under a number. Either way the key is kept exactly: it is written back out byte for byte
//! ([`Name`]).

use std::fmt;

use super::numbered::{Numbered, Shared};

/// The namespace number that marks a key kept as its bytes.
const RAW: u32 = u32::MAX;

/// A key as a slot keeps it: a namespace's number and a hash, or (`number` [`RAW`]) the number
/// of a key kept as its bytes in the first four bytes of `hash`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Key {
    number: u32,
    hash: [u8; 16],
}

/// A key as it is compared and hashed: a kept [`Key`]'s, or a looked-up key's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Form<'a> {
    Packed(u32, [u8; 16]),
    Raw(&'a str),
}

impl Key {
    fn raw(n: u32) -> Key {
        let mut hash = [0; 16];
        hash[..4].copy_from_slice(&n.to_le_bytes());
        Key { number: RAW, hash }
    }

    /// The number of a key kept as its bytes; `None` for a packed key.
    fn raw_number(&self) -> Option<u32> {
        let [a, b, c, d, ..] = self.hash;
        (self.number == RAW).then_some(u32::from_le_bytes([a, b, c, d]))
    }
}

/// The namespace and hash of a connector's key; `None` for any other key.
fn split(key: &str) -> Option<(&str, [u8; 16])> {
    let (prefix, hex) = key.rsplit_once('/')?;
    if hex.len() != 32 {
        return None;
    }
    let mut hash = [0u8; 16];
    let mut any_bad = 0u8;
    for (byte, pair) in hash.iter_mut().zip(hex.as_bytes().chunks_exact(2)) {
        let (high, low) = (DIGITS[pair[0] as usize], DIGITS[pair[1] as usize]);
        any_bad |= (high | low) & 0xf0;
        *byte = (high << 4) | (low & 0x0f);
    }
    (any_bad == 0).then_some((prefix, hash))
}

/// Each byte's value as a lowercase hex digit, [`NOT_HEX`] for any other byte (an uppercase
/// digit would not be written back the same).
const DIGITS: [u8; 256] = {
    let mut t = [NOT_HEX; 256];
    let mut i = 0;
    while i < 10 {
        t[b'0' as usize + i] = i as u8;
        i += 1;
    }
    let mut i = 0;
    while i < 6 {
        t[b'a' as usize + i] = 10 + i as u8;
        i += 1;
    }
    t
};
const NOT_HEX: u8 = 0xff;

/// The keys of a tenant's slots: the namespaces of its packed keys (each kept once while a key
/// uses it) and the keys kept as their bytes.
#[derive(Debug, Default)]
pub(super) struct Keys {
    names: Shared<Box<str>>,
    raw: Numbered<Box<str>>,
    /// heap bytes of the keys kept as their bytes, with the allocator's 16 each
    raw_bytes: usize,
}

impl Keys {
    /// How `key` is looked up; `None` for a connector's key of a namespace no kept key uses (it
    /// is not held).
    pub(super) fn form<'a>(&self, key: &'a str) -> Option<Form<'a>> {
        match split(key) {
            Some((prefix, hash)) => self.names.number(prefix).map(|id| Form::Packed(id, hash)),
            None => Some(Form::Raw(key)),
        }
    }

    /// How a kept key is compared and hashed.
    pub(super) fn form_of(&self, key: &Key) -> Form<'_> {
        match key.raw_number() {
            Some(n) => Form::Raw(self.raw.get(n).map_or("", |k| k)),
            None => Form::Packed(key.number, key.hash),
        }
    }

    /// Keeps `key`, its namespace counted once more; `None` when numbers ran out (four billion
    /// namespaces or keys kept as bytes).
    pub(super) fn keep(&mut self, key: &str) -> Option<Key> {
        let Some((prefix, hash)) = split(key) else {
            let n = self.raw.add(key.into())?;
            self.raw_bytes += key.len() + 16;
            return Some(Key::raw(n));
        };
        let number = self.names.keep(prefix, || prefix.into())?;
        Some(Key { number, hash })
    }

    /// Forgets a kept key: a key kept as bytes gives them back, a namespace no kept key uses is
    /// forgotten.
    pub(super) fn release(&mut self, key: &Key) {
        if let Some(n) = key.raw_number() {
            if let Some(k) = self.raw.take(n) {
                self.raw_bytes = self.raw_bytes.saturating_sub(k.len() + 16);
            }
            return;
        }
        self.names.release(key.number);
    }

    /// `key`, to write out.
    pub(super) fn name(&self, key: &Key) -> Name<'_> {
        match key.raw_number() {
            Some(n) => Name {
                head: self.raw.get(n).map_or("", |k| k),
                hash: None,
            },
            None => Name {
                head: self.names.get(key.number).map_or("", |n| n),
                hash: Some(key.hash),
            },
        }
    }

    /// Namespaces kept.
    #[cfg(test)]
    pub(super) fn namespaces(&self) -> usize {
        self.names.len()
    }

    /// About the bytes it takes: each namespace twice (the map's key and the list's), with the
    /// allocator's 16 each, the map's and the lists' entries, and the keys kept as their bytes.
    pub(super) fn bytes(&self) -> usize {
        let names: usize = self.names.values().map(|n| 2 * (n.len() + 16)).sum();
        names + self.names.bytes() + self.raw.bytes() + self.raw_bytes
    }

    /// Heap bytes of the keys kept as their bytes.
    #[cfg(test)]
    pub(super) fn raw_bytes(&self) -> usize {
        self.raw_bytes
    }
}

/// A kept key, written out on demand (`Display`, `to_string()`).
#[derive(Debug, Clone, Copy)]
pub struct Name<'a> {
    /// the namespace of a packed key, or the whole of any other
    head: &'a str,
    hash: Option<[u8; 16]>,
}

impl Name<'_> {
    /// Its length in bytes, written out.
    pub fn byte_len(&self) -> usize {
        self.head.len() + self.hash.map_or(0, |h| 1 + 2 * h.len())
    }
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
        let mut p = Keys::default();
        let key = format!("vllm/Qwen/Qwen2.5-0.5B/0123456789abcdef/tp1of2/{HASH}");
        let kept = p.keep(&key).unwrap();
        assert_eq!((kept.number, kept.raw_number()), (0, None));
        assert_eq!(p.name(&kept).to_string(), key);
        assert_eq!(p.name(&kept).byte_len(), key.len());
        assert_eq!(p.form(&key), Some(p.form_of(&kept)));
        // another namespace's key with the same hash is another key
        let other = format!("vllm/other/{HASH}");
        assert_eq!(p.form(&other), None, "no key of that namespace is kept");
        let kept_other = p.keep(&other).unwrap();
        assert_ne!(p.form_of(&kept_other), p.form_of(&kept));
        assert_eq!((p.namespaces(), p.raw_bytes()), (2, 0));
    }

    #[test]
    fn any_other_key_is_kept_as_its_bytes() {
        let mut p = Keys::default();
        let keys = [
            "plain",
            "a/short",
            "ns/9BFCBAE53E9D0DDC6CE6C83CEDE95C1F",
            "ns/9bfcbae53e9d0ddc6ce6c83cede95c1",
            "ns/9bfcbae53e9d0ddc6ce6c83cede95c1fa",
            "ns/9bfcbae53e9d0ddc6ce6c83cede95c1g",
            "ns/9bfcbae53e9d0ddc6ce6c83cede95c€",
        ];
        let kept: Vec<Key> = keys.iter().map(|k| p.keep(k).unwrap()).collect();
        for (key, kept) in keys.iter().zip(&kept) {
            assert!(kept.raw_number().is_some(), "{key}");
            assert_eq!(p.name(kept).to_string(), *key);
            assert_eq!(p.name(kept).byte_len(), key.len());
            assert_eq!(p.form(key), Some(Form::Raw(key)));
            assert_eq!(p.form_of(kept), Form::Raw(key));
        }
        assert_eq!(p.namespaces(), 0);
        let bytes: usize = keys.iter().map(|k| k.len() + 16).sum();
        assert_eq!(p.raw_bytes(), bytes);
        for k in &kept {
            p.release(k);
        }
        assert_eq!(p.raw_bytes(), 0, "released keys give their bytes back");
        assert_eq!(
            p.keep("again").unwrap().raw_number(),
            kept[6].raw_number(),
            "numbers are taken again"
        );
        // an empty namespace is a namespace
        let kept = p.keep(&format!("/{HASH}")).unwrap();
        assert_eq!(p.name(&kept).to_string(), format!("/{HASH}"));
    }

    #[test]
    fn a_namespace_is_forgotten_with_its_last_key_and_its_number_taken_again() {
        let mut p = Keys::default();
        let a = p.keep(&format!("a/{HASH}")).unwrap();
        let a2 = p.keep(&format!("a/{}", "0".repeat(32))).unwrap();
        let b = p.keep(&format!("b/{HASH}")).unwrap();
        p.release(&a);
        assert_eq!(p.namespaces(), 2, "a still has a key");
        p.release(&a2);
        assert_eq!(p.namespaces(), 1);
        assert_eq!(p.form(&format!("a/{HASH}")), None);
        let c = p.keep(&format!("c/{HASH}")).unwrap();
        assert_eq!(c.number, 0, "a's number is free again");
        assert_eq!(p.name(&c).to_string(), format!("c/{HASH}"));
        assert_eq!(p.name(&b).to_string(), format!("b/{HASH}"));
    }
}
