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

use crate::error::{ErrorCode, Result, StoreError};

/// Bytes of a MAC.
pub const MAC_LEN: usize = 32;
/// Bytes of a key.
pub const KEY_LEN: usize = 32;

/// What a range was granted for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Write = 1,
    Read = 2,
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
    key: ring::hmac::Key,
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

    fn from_raw(raw: [u8; KEY_LEN]) -> Self {
        GrantKey {
            raw,
            key: ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &raw),
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

    pub fn sign(&self, range: &Range) -> Vec<u8> {
        ring::hmac::sign(&self.key, &range.message()).as_ref().to_vec()
    }

    /// Refuses a range whose MAC does not verify.
    pub fn verify(&self, range: &Range, mac: &[u8]) -> Result<()> {
        ring::hmac::verify(&self.key, &range.message(), mac).map_err(|_| {
            StoreError::new(
                ErrorCode::Unauthenticated,
                "this range's grant does not verify: a member serves only ranges the serving leader handed out, \
                 exactly as handed out; ask the leader for the key again",
            )
        })
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
        let mac = k.sign(&r);
        assert_eq!(mac.len(), MAC_LEN);
        assert!(k.verify(&r, &mac).is_ok());
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
                k.verify(&s, &mac).unwrap_err().code,
                ErrorCode::Unauthenticated,
                "{s:?}"
            );
        }
        assert!(k.verify(&r, &mac[..16]).is_err(), "a cut MAC does not verify");
        assert!(k.verify(&r, &[]).is_err());
        let other = GrantKey::generate();
        assert!(other.verify(&r, &mac).is_err(), "another term's key does not verify it");
        let sent = GrantKey::from_bytes(&k.to_bytes()).unwrap();
        assert!(sent.verify(&r, &mac).is_ok());
        assert!(GrantKey::from_bytes(&[0; 5]).is_err());
    }
}
