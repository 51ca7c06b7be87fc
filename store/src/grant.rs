//! Grant MACs: the proof, on a member's data paths, that the leader handed a range out. Each
//! leader term draws a random key and gives it to every member it mounts (in `MountResponse`,
//! over the Membership API, which the member token guards). Every `Location` it hands out carries
//! `HMAC-SHA256(key, access | mount | epoch | allocation | offset | len | deadline)`; a member
//! serves a write or read of a range only when the MAC the client sends with it verifies. A client
//! that was not given a range cannot forge one, nor stretch one it was given (another offset, a
//! longer length, a later deadline, a read turned into a write, another allocation).
//!
//! The allocation is the leader's number for one placement of one value (rising within a term):
//! a range freed and placed again gets a higher one, and a member refuses a grant whose
//! allocation is older than the one that last wrote the range (`member/written.rs`), so a grant
//! kept past its range's release can neither overwrite nor read the next owner's bytes.
//!
//! Each member gets its own key, derived from the term's for its mount ([`GrantKey::for_mount`]):
//! a member (or whoever holds the member token and mounts) can sign nothing another member
//! accepts.
//!
//! A write grant also covers its value's [`Tag`]: whose value it is (tenant and the Binding that
//! holds it, block layout, key), which the leader writes and the writer passes on to the member
//! untouched. The member keeps the tag of every value it finished writing, so after a failover it
//! can tell the next leader what it holds (`member/written.rs`): since the MAC covers the tag, a
//! writer cannot make a member believe its bytes are another tenant's value, or another key's.
//!
//! Once a value is committed the leader **seals** it ([`SealKey`]): a MAC over its tag, offset,
//! size and epoch under a key only the backend's leaders hold (`--seal-key-file`), which the
//! member keeps beside the tag. A next leader adopts only holdings whose seal verifies, so no
//! member, and no one holding the member token, can plant a value under any tenant's key, nor
//! hand over a value that was never committed.

mod hmac;

use crate::error::{ErrorCode, Result, StoreError};
use hmac::HmacKey;

/// Bytes of a MAC.
pub const MAC_LEN: usize = 32;

/// A MAC as it came off the wire: anything but [`MAC_LEN`] bytes never verifies.
pub fn mac_from(b: &[u8]) -> [u8; MAC_LEN] {
    b.try_into().unwrap_or([0; MAC_LEN])
}
/// Bytes of a key.
pub const KEY_LEN: usize = 32;

/// What a range was granted for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Write = 1,
    Read = 2,
    /// a read of a value's copy on its member's disk tier: the range's offset is the copy's disk
    /// id, and the MAC covers the value's tag, which the member checks against the record's
    ReadDisk = 3,
}

/// The fields a MAC covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    pub access: Access,
    pub mount_id: u64,
    pub epoch: u64,
    /// the placement the range was granted for (rising within a term)
    pub allocation: u64,
    pub offset: u64,
    pub len: u64,
    pub deadline_unix_ms: u64,
}

impl Range {
    fn message(&self) -> [u8; 49] {
        let mut m = [0u8; 49];
        m[0] = self.access as u8;
        for (i, v) in [
            self.mount_id,
            self.epoch,
            self.allocation,
            self.offset,
            self.len,
            self.deadline_unix_ms,
        ]
        .into_iter()
        .enumerate()
        {
            m[1 + 8 * i..9 + 8 * i].copy_from_slice(&v.to_le_bytes());
        }
        m
    }
}

/// A term's key.
#[derive(Clone)]
pub struct GrantKey {
    raw: [u8; KEY_LEN],
    key: HmacKey,
}

impl std::fmt::Debug for GrantKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GrantKey(..)")
    }
}

impl GrantKey {
    /// A fresh random key.
    pub fn generate() -> Self {
        let mut raw = [0u8; KEY_LEN];
        if ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut raw).is_err() {
            // getrandom failing is not something a leader can run without; uuid's v4 reads the
            // same source, so this only spells out the failure
            panic!("the system's random source failed; the leader cannot draw a grant key");
        }
        Self::from_raw(raw)
    }

    /// The key of one mount: what that member verifies its grants with, and all it learns of
    /// the term's key (an HMAC of the mount id under it, which no other key can be derived from).
    pub fn for_mount(&self, mount_id: u64) -> Self {
        Self::from_raw(self.key.mac(&[b"kvstore grant key of mount ", &mount_id.to_le_bytes()]))
    }

    fn from_raw(raw: [u8; KEY_LEN]) -> Self {
        GrantKey {
            raw,
            key: HmacKey::new(&raw),
        }
    }

    /// The key as sent to members.
    pub fn to_bytes(&self) -> Vec<u8> {
        self.raw.to_vec()
    }

    /// The key a leader sent; refused unless it is [`KEY_LEN`] bytes.
    pub fn from_bytes(b: &[u8]) -> Result<Self> {
        let raw: [u8; KEY_LEN] = b.try_into().map_err(|_| {
            StoreError::new(
                ErrorCode::InvalidArgument,
                format!(
                    "the leader's grant key is {} bytes, not {KEY_LEN}; run one version of the store",
                    b.len()
                ),
            )
        })?;
        Ok(Self::from_raw(raw))
    }

    /// The MAC of a range and, for a write, its value's tag (empty for a read).
    pub fn sign(&self, range: &Range, tag: &[u8]) -> Vec<u8> {
        self.key.mac(&[&range.message(), tag]).to_vec()
    }

    /// Refuses a range (and tag) whose MAC does not verify.
    pub fn verify(&self, range: &Range, tag: &[u8], mac: &[u8]) -> Result<()> {
        // the range's message is of fixed length, so the tag after it is unambiguous
        if !same(&self.key.mac(&[&range.message(), tag]), mac) {
            return Err(StoreError::new(
                ErrorCode::Unauthenticated,
                "this range's grant does not verify: a member serves only ranges the serving leader handed out, \
                 exactly as handed out; ask the leader for the key again",
            ));
        }
        Ok(())
    }
}

/// Whether a MAC made here equals one that came off the wire, compared in constant time (a MAC
/// of another length never does).
fn same(mac: &[u8; MAC_LEN], given: &[u8]) -> bool {
    let differs = mac.iter().zip(given).fold(0u8, |d, (a, b)| d | (a ^ b));
    given.len() == MAC_LEN && std::hint::black_box(differs) == 0
}

/// The leader-only key values are sealed with once committed (module doc): a backend's leaders
/// share it (`--seal-key-file`); members never see it.
#[derive(Clone)]
pub struct SealKey {
    key: HmacKey,
}

impl std::fmt::Debug for SealKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SealKey(..)")
    }
}

/// What a seal covers besides the tag: where the value lies and the term that sealed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placed {
    pub offset: u64,
    pub size: u64,
    pub epoch: u64,
}

impl SealKey {
    /// The key a secret (the file's token) names.
    pub fn from_secret(secret: &[u8]) -> Self {
        SealKey {
            key: HmacKey::new(&HmacKey::new(secret).mac(&[b"kvstore seal key"])),
        }
    }

    /// A fresh random key: seals only this process can verify.
    pub fn generate() -> Self {
        Self::from_secret(GrantKey::generate().raw.as_slice())
    }

    /// The MAC of `offset | size | epoch | tag` (little-endian), made without copying the tag: a
    /// new leader makes and checks two per value it adopts.
    fn mac(&self, tag: &[u8], at: &Placed) -> [u8; MAC_LEN] {
        let mut head = [0u8; 24];
        for (i, v) in [at.offset, at.size, at.epoch].into_iter().enumerate() {
            head[8 * i..8 * i + 8].copy_from_slice(&v.to_le_bytes());
        }
        self.key.mac(&[&head, tag])
    }

    /// The seal of the value `tag` names, placed `at`.
    pub fn seal(&self, tag: &[u8], at: &Placed) -> [u8; MAC_LEN] {
        self.mac(tag, at)
    }

    /// Whether `seal` is this key's seal of the value `tag` names, placed `at` (compared in
    /// constant time).
    pub fn verifies(&self, tag: &[u8], at: &Placed, seal: &[u8]) -> bool {
        same(&self.mac(tag, at), seal)
    }
}

/// Longest tag accepted: a 4 KiB key, a tenant, its holder and a dtype with room to spare.
pub const MAX_TAG_LEN: usize = 8 * 1024;
const TAG_VERSION: u8 = 2;

/// Whose value a write is, as the leader names it in the write's grant: the tenant and who holds
/// it (the Binding's UID, empty when the ledger names none), the block layout the tenant had, and
/// the key. On the wire (`Location.tag`, after the data port's header): `version u8 (2) |
/// tenant_len u16 | tenant | uid_len u16 | uid | block_size u32 | dtype_len u16 | dtype | key`,
/// little-endian; the key is the rest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tag {
    pub tenant: String,
    pub uid: String,
    pub block_size: u32,
    pub dtype: String,
    pub key: String,
}

impl Tag {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(11 + self.tenant.len() + self.uid.len() + self.dtype.len() + self.key.len());
        b.push(TAG_VERSION);
        b.extend_from_slice(&(self.tenant.len() as u16).to_le_bytes());
        b.extend_from_slice(self.tenant.as_bytes());
        b.extend_from_slice(&(self.uid.len() as u16).to_le_bytes());
        b.extend_from_slice(self.uid.as_bytes());
        b.extend_from_slice(&self.block_size.to_le_bytes());
        b.extend_from_slice(&(self.dtype.len() as u16).to_le_bytes());
        b.extend_from_slice(self.dtype.as_bytes());
        b.extend_from_slice(self.key.as_bytes());
        b
    }

    /// Reads a tag a member reports; `None` for anything a leader did not write.
    pub fn decode(b: &[u8]) -> Option<Tag> {
        TagRef::decode(b).map(|t| t.to_owned())
    }
}

/// A [`Tag`] read in place from its bytes: a new leader reads one per value it adopts, and copies
/// only what it keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TagRef<'a> {
    pub tenant: &'a str,
    pub uid: &'a str,
    pub block_size: u32,
    pub dtype: &'a str,
    pub key: &'a str,
}

impl<'a> TagRef<'a> {
    /// Reads a tag a member reports; `None` for anything a leader did not write.
    pub fn decode(b: &'a [u8]) -> Option<Self> {
        fn take<'a>(b: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
            let (head, rest) = b.split_at_checked(n)?;
            *b = rest;
            Some(head)
        }
        fn u16_of(b: &mut &[u8]) -> Option<usize> {
            Some(u16::from_le_bytes(take(b, 2)?.try_into().ok()?) as usize)
        }
        fn str_of<'a>(b: &mut &'a [u8]) -> Option<&'a str> {
            let n = u16_of(b)?;
            std::str::from_utf8(take(b, n)?).ok()
        }
        let mut b = b;
        if take(&mut b, 1)? != [TAG_VERSION] {
            return None;
        }
        let tenant = str_of(&mut b)?;
        let uid = str_of(&mut b)?;
        let block_size = u32::from_le_bytes(take(&mut b, 4)?.try_into().ok()?);
        let dtype = str_of(&mut b)?;
        let key = std::str::from_utf8(b).ok()?;
        if key.is_empty() {
            return None;
        }
        Some(TagRef {
            tenant,
            uid,
            block_size,
            dtype,
            key,
        })
    }

    pub fn to_owned(self) -> Tag {
        Tag {
            tenant: self.tenant.to_owned(),
            uid: self.uid.to_owned(),
            block_size: self.block_size,
            dtype: self.dtype.to_owned(),
            key: self.key.to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range() -> Range {
        Range {
            access: Access::Write,
            mount_id: 7,
            epoch: 2,
            allocation: 5,
            offset: 4096,
            len: 100,
            deadline_unix_ms: 1_000,
        }
    }

    #[test]
    fn only_the_granted_range_verifies() {
        let k = GrantKey::generate();
        let r = range();
        let tag = Tag {
            tenant: "a".into(),
            uid: String::new(),
            block_size: 16,
            dtype: "bf16".into(),
            key: "k".into(),
        }
        .encode();
        let mac = k.sign(&r, &tag);
        assert_eq!(mac.len(), MAC_LEN);
        assert!(k.verify(&r, &tag, &mac).is_ok());
        let other_tenant = Tag {
            tenant: "b".into(),
            uid: String::new(),
            block_size: 16,
            dtype: "bf16".into(),
            key: "k".into(),
        }
        .encode();
        assert!(
            k.verify(&r, &other_tenant, &mac).is_err(),
            "the MAC covers whose value it is"
        );
        assert!(k.verify(&r, &[], &mac).is_err(), "a write without its tag");
        let stretched = [
            Range {
                access: Access::Read,
                ..r
            },
            Range { mount_id: 8, ..r },
            Range { epoch: 3, ..r },
            Range { allocation: 6, ..r },
            Range { offset: 0, ..r },
            Range { len: 101, ..r },
            Range {
                deadline_unix_ms: 2_000,
                ..r
            },
        ];
        for s in stretched {
            assert_eq!(
                k.verify(&s, &tag, &mac).unwrap_err().code,
                ErrorCode::Unauthenticated,
                "{s:?}"
            );
        }
        assert!(k.verify(&r, &tag, &mac[..16]).is_err(), "a cut MAC does not verify");
        assert!(k.verify(&r, &tag, &[]).is_err());
        let other = GrantKey::generate();
        assert!(
            other.verify(&r, &tag, &mac).is_err(),
            "another term's key does not verify it"
        );
        let sent = GrantKey::from_bytes(&k.to_bytes()).unwrap();
        assert!(sent.verify(&r, &tag, &mac).is_ok());
        assert!(GrantKey::from_bytes(&[0; 5]).is_err());
    }

    #[test]
    fn a_mounts_key_signs_nothing_another_mount_accepts() {
        let term = GrantKey::generate();
        let (m7, m8) = (term.for_mount(7), term.for_mount(8));
        assert_eq!(
            m7.to_bytes(),
            term.for_mount(7).to_bytes(),
            "the leader derives it again"
        );
        let r = range();
        // the member of mount 7 signs a range of mount 8's (say, to read another member's values)
        let forged = m7.sign(&Range { mount_id: 8, ..r }, &[]);
        assert!(m8.verify(&Range { mount_id: 8, ..r }, &[], &forged).is_err());
        assert!(m7.verify(&r, &[], &m7.sign(&r, &[])).is_ok());
        assert_ne!(m7.to_bytes(), term.to_bytes());
    }

    /// The seal key a secret names, derived with `ring` as every leader version derives it:
    /// seals made by an older leader keep verifying.
    pub(super) fn ring_seal_key(secret: &[u8]) -> ring::hmac::Key {
        let derived = ring::hmac::sign(
            &ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret),
            b"kvstore seal key",
        );
        ring::hmac::Key::new(ring::hmac::HMAC_SHA256, derived.as_ref())
    }

    #[test]
    fn only_the_leaders_key_seals_and_a_seal_covers_tag_place_and_term() {
        let key = SealKey::from_secret(b"the backend's seal secret");
        let at = Placed {
            offset: 4096,
            size: 100,
            epoch: 3,
        };
        let seal = key.seal(b"tag", &at);
        assert!(SealKey::from_secret(b"the backend's seal secret").verifies(b"tag", &at, &seal));
        assert!(!key.verifies(b"tag2", &at, &seal), "another value");
        for moved in [
            Placed { offset: 0, ..at },
            Placed { size: 101, ..at },
            Placed { epoch: 4, ..at },
        ] {
            assert!(!key.verifies(b"tag", &moved, &seal), "{moved:?}");
        }
        assert!(!SealKey::generate().verifies(b"tag", &at, &seal), "another key");
        assert!(!key.verifies(b"tag", &at, &[]), "no seal");
        assert!(!key.verifies(b"tag", &at, &seal[..MAC_LEN - 1]), "a cut seal");
        assert!(!key.verifies(b"tag", &at, &[&seal[..], &[0]].concat()), "a longer seal");
        // what is sealed, as every leader version seals it: offset | size | epoch | tag
        let mut message = Vec::new();
        for v in [4096u64, 100, 3] {
            message.extend_from_slice(&v.to_le_bytes());
        }
        message.extend_from_slice(b"tag");
        assert_eq!(
            &seal[..],
            ring::hmac::sign(&ring_seal_key(b"the backend's seal secret"), &message).as_ref()
        );
        // a member's grant key, or anything derived from the term's, is not the seal key
        let grant = GrantKey::generate();
        assert!(!key.verifies(b"tag", &at, &grant.sign(&range(), b"tag")));
    }
}

#[cfg(test)]
mod tag_tests {
    use super::*;

    /// `store/WIRE.md` section 5, byte for byte.
    #[test]
    fn a_tag_lies_where_wire_md_says() {
        let t = Tag {
            tenant: "ns".into(),
            uid: "u".into(),
            block_size: 0x0403_0201,
            dtype: "bf".into(),
            key: "k1".into(),
        };
        let want: Vec<u8> = [
            &[2][..],
            &[2, 0],
            b"ns",
            &[1, 0],
            b"u",
            &[1, 2, 3, 4],
            &[2, 0],
            b"bf",
            b"k1",
        ]
        .concat();
        assert_eq!(t.encode(), want);
    }

    /// `store/WIRE.md` section 4: the grant's 49-byte message, then the tag.
    #[test]
    fn a_grants_message_lies_where_wire_md_says() {
        let r = Range {
            access: Access::Read,
            mount_id: 0x0807_0605_0403_0201,
            epoch: 0x1817_1615_1413_1211,
            allocation: 0x2827_2625_2423_2221,
            offset: 0x3837_3635_3433_3231,
            len: 0x4847_4645_4443_4241,
            deadline_unix_ms: 0x5857_5655_5453_5251,
        };
        let m = r.message();
        assert_eq!(m[0], 2, "access: read");
        for (at, first) in [(1, 0x01), (9, 0x11), (17, 0x21), (25, 0x31), (33, 0x41), (41, 0x51)] {
            let want: Vec<u8> = (first..first + 8).collect();
            assert_eq!(&m[at..at + 8], want.as_slice(), "the u64 at {at}");
        }
        let key = GrantKey::generate();
        let ring_key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &key.raw);
        let by_hand = ring::hmac::sign(&ring_key, &[&m[..], b"tag"].concat());
        assert_eq!(key.sign(&r, b"tag"), by_hand.as_ref());
        let seal = SealKey::from_secret(b"secret");
        let at = Placed {
            offset: 1,
            size: 2,
            epoch: 3,
        };
        let message = [
            &1u64.to_le_bytes()[..],
            &2u64.to_le_bytes(),
            &3u64.to_le_bytes(),
            b"tag",
        ]
        .concat();
        assert_eq!(
            &seal.seal(b"tag", &at)[..],
            ring::hmac::sign(&super::tests::ring_seal_key(b"secret"), &message).as_ref()
        );
    }

    #[test]
    fn a_tag_reads_back_and_nothing_else_reads_as_one() {
        let t = Tag {
            tenant: "ns-a".into(),
            uid: "4b1c0d2e".into(),
            block_size: 16,
            dtype: "bfloat16".into(),
            key: "chunk:0123".into(),
        };
        assert_eq!(Tag::decode(&t.encode()), Some(t.clone()));
        let b = t.encode();
        for cut in 0..b.len() - "chunk:0123".len() {
            assert_eq!(Tag::decode(&b[..cut]), None, "cut at {cut}");
        }
        let mut v1 = b.clone();
        v1[0] = 1;
        assert_eq!(Tag::decode(&v1), None, "another version");
        let no_key = Tag {
            key: String::new(),
            ..t
        };
        assert_eq!(Tag::decode(&no_key.encode()), None);
    }
}
