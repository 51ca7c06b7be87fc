//! TLS 1.3 records (RFC 8446) as the framed ports carry them: each direction's key, IV and
//! sequence number ([`Direction`]), opening the record at the front of a buffer in place
//! ([`open_front`]) and sealing one into a buffer ([`seal_one`]). `sealed.rs` runs them over a
//! socket; [`fuzzing`] without one.

use std::io;

use ring::aead::{AES_128_GCM, AES_256_GCM, Aad, CHACHA20_POLY1305, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use rustls::ConnectionTrafficSecrets;

/// Largest plaintext of one record.
pub(super) const MAX_PLAIN: usize = 16 * 1024;
/// Header (5), content type (1) and tag (16) around a record's plaintext.
pub(super) const OVERHEAD: usize = 5 + 1 + 16;
/// Largest record a peer may send: the plaintext, its type and up to 255 bytes of padding and tag
/// (RFC 8446: 2^14 + 256 after the header).
pub(super) const MAX_RECORD: usize = 5 + MAX_PLAIN + 256;
/// Records one key protects on a connection before the connection is closed (2^23, a quarter of
/// AES-GCM's limit for TLS 1.3, and 128 GiB of values).
pub const KEY_LIMIT: u64 = 1 << 23;
/// A client stops reusing a pooled connection at half of it, so no transfer meets the limit.
pub const WORN_OUT: u64 = KEY_LIMIT / 2;

pub(super) const APPLICATION_DATA: u8 = 23;
pub(super) const ALERT: u8 = 21;

pub(super) fn invalid(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// One direction's key, IV and next sequence number.
pub(super) struct Direction {
    key: LessSafeKey,
    iv: [u8; NONCE_LEN],
    pub(super) seq: u64,
}

impl Direction {
    pub(super) fn new(seq: u64, secrets: ConnectionTrafficSecrets) -> io::Result<Self> {
        let (alg, key, iv) = match &secrets {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv } => (&AES_128_GCM, key, iv),
            ConnectionTrafficSecrets::Aes256Gcm { key, iv } => (&AES_256_GCM, key, iv),
            ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => (&CHACHA20_POLY1305, key, iv),
            _ => return Err(io::Error::other("a cipher suite this port does not run")),
        };
        let key =
            UnboundKey::new(alg, key.as_ref()).map_err(|_| io::Error::other("a traffic key of the wrong size"))?;
        let iv: [u8; NONCE_LEN] = iv
            .as_ref()
            .try_into()
            .map_err(|_| io::Error::other("an IV of the wrong size"))?;
        Ok(Self {
            key: LessSafeKey::new(key),
            iv,
            seq,
        })
    }

    /// The next record's nonce (the IV with the sequence number in its last 8 bytes, XORed).
    #[allow(clippy::big_endian_bytes, reason = "TLS numbers are big-endian (RFC 8446)")]
    fn nonce(&mut self) -> io::Result<Nonce> {
        if self.seq >= KEY_LIMIT {
            return Err(io::Error::other(
                "this connection used its key for as many records as it may; reconnect",
            ));
        }
        let mut n = self.iv;
        for (b, s) in n[NONCE_LEN - 8..].iter_mut().zip(self.seq.to_be_bytes()) {
            *b ^= s;
        }
        self.seq += 1;
        Ok(Nonce::assume_unique_for_key(n))
    }
}

/// What the record at the front of a buffer held.
pub(super) enum Opened {
    /// no whole record is there yet
    NeedMore,
    /// application data, decrypted in place at `buf[from..to]`
    Data(usize, usize),
    /// an alert: the peer is done
    Closed,
}

/// Opens the record at the front of `buf[start..end]` under `rx`, in place; returns what it held
/// and how many bytes it took (0 when it is not whole yet). An error: the connection cannot go on.
pub(super) fn open_front(rx: &mut Direction, buf: &mut [u8], start: usize, end: usize) -> io::Result<(Opened, usize)> {
    let have = end.saturating_sub(start);
    if have < 5 {
        return Ok((Opened::NeedMore, 0));
    }
    let header: [u8; 5] = buf[start..start + 5].try_into().unwrap_or([0; 5]);
    #[allow(clippy::big_endian_bytes, reason = "TLS numbers are big-endian (RFC 8446)")]
    let len = u16::from_be_bytes([header[3], header[4]]) as usize;
    if header[0] != APPLICATION_DATA || header[1..3] != [3, 3] {
        return Err(invalid("not a TLS 1.3 record"));
    }
    if !(17..=MAX_RECORD - 5).contains(&len) {
        return Err(invalid(format!("a TLS record of {len} bytes")));
    }
    if have < 5 + len {
        return Ok((Opened::NeedMore, 0));
    }
    let nonce = rx.nonce()?;
    let opened = rx
        .key
        .open_in_place(nonce, Aad::from(header), &mut buf[start + 5..start + 5 + len])
        .map_err(|_| invalid("a TLS record that does not decrypt"))?;
    // the content type is the last byte that is not padding
    let Some(kind_at) = opened.iter().rposition(|b| *b != 0) else {
        return Err(invalid("a TLS record without a content type"));
    };
    match opened[kind_at] {
        APPLICATION_DATA => Ok((Opened::Data(start + 5, start + 5 + kind_at), 5 + len)),
        // a close_notify, or any other alert
        ALERT => Ok((Opened::Closed, 5 + len)),
        other => Err(invalid(format!(
            "a TLS record of content type {other}, which this port does not take"
        ))),
    }
}

/// Writes one record into the front of `out`: `n` bytes of content that `fill` writes, content
/// type `kind`, `pad` zero bytes of padding; returns its length.
pub(super) fn seal_one(
    tx: &mut Direction,
    out: &mut [u8],
    kind: u8,
    n: usize,
    pad: usize,
    fill: impl FnOnce(&mut [u8]) -> io::Result<()>,
) -> io::Result<usize> {
    let body_len = n + 1 + pad + 16;
    if body_len > MAX_RECORD - 5 || out.len() < 5 + body_len {
        return Err(io::Error::other("a TLS record too large for its buffer"));
    }
    let header = [APPLICATION_DATA, 3, 3, (body_len >> 8) as u8, body_len as u8];
    out[..5].copy_from_slice(&header);
    fill(&mut out[5..5 + n])?;
    out[5 + n] = kind;
    out[6 + n..6 + n + pad].fill(0);
    let nonce = tx.nonce()?;
    let tag = tx
        .key
        .seal_in_place_separate_tag(nonce, Aad::from(header), &mut out[5..6 + n + pad])
        .map_err(|_| io::Error::other("sealing a TLS record failed"))?;
    out[6 + n + pad..6 + n + pad + 16].copy_from_slice(tag.as_ref());
    Ok(5 + body_len)
}

pub mod fuzzing {
    //! The record layer without a socket, for the fuzz target (`store/fuzz`, `tls_records`).

    use super::*;

    /// Both directions under one AES-128-GCM key, so what it seals it opens.
    pub struct Records {
        tx: Direction,
        rx: Direction,
    }

    impl Records {
        pub fn new(key: [u8; 16], iv: [u8; NONCE_LEN]) -> Self {
            let dir = || Direction {
                key: LessSafeKey::new(UnboundKey::new(&AES_128_GCM, &key).unwrap_or_else(|_| unreachable!())),
                iv,
                seq: 0,
            };
            Self { tx: dir(), rx: dir() }
        }

        /// One record of `content`, content type `kind`, `pad` bytes of padding (none past what
        /// a record may hold: the length is cut).
        pub fn seal(&mut self, content: &[u8], kind: u8, pad: usize) -> Vec<u8> {
            let n = content.len().min(MAX_PLAIN);
            let pad = pad.min(MAX_RECORD - 5 - 17 - n);
            let mut out = vec![0u8; 5 + n + 1 + pad + 16];
            match seal_one(&mut self.tx, &mut out, kind, n, pad, |dst| {
                dst.copy_from_slice(&content[..n]);
                Ok(())
            }) {
                Ok(len) => out.truncate(len),
                Err(_) => out.clear(),
            }
            out
        }

        /// Opens every whole record of `bytes` in turn, as a connection would: the application
        /// data they held, up to an alert; or the error that ends the connection.
        pub fn open_all(&mut self, bytes: &mut [u8]) -> io::Result<Vec<u8>> {
            let mut data = Vec::new();
            let mut at = 0;
            loop {
                let end = bytes.len();
                match open_front(&mut self.rx, bytes, at, end)? {
                    (Opened::NeedMore, _) => return Ok(data),
                    (Opened::Data(from, to), used) => {
                        data.extend_from_slice(&bytes[from..to]);
                        at += used;
                    }
                    (Opened::Closed, _) => return Ok(data),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `store/WIRE.md` section 3: type 23, version 0x0303, a big-endian length of ciphertext and
    /// tag, the content and its type byte under AES-GCM, no padding from us.
    #[test]
    fn a_record_lies_where_wire_md_says() {
        use super::fuzzing::Records;
        let record = Records::new([1; 16], [2; 12]).seal(b"abc", APPLICATION_DATA, 0);
        assert_eq!(record.len(), 5 + 3 + 1 + 16);
        assert_eq!(&record[0..5], &[23, 3, 3, 0, 3 + 1 + 16]);
        // the first record's nonce is the IV itself (sequence number 0)
        let key = LessSafeKey::new(UnboundKey::new(&AES_128_GCM, &[1; 16]).unwrap());
        let mut body = record[5..].to_vec();
        let header: [u8; 5] = record[0..5].try_into().unwrap();
        let plain = key
            .open_in_place(Nonce::assume_unique_for_key([2; 12]), Aad::from(header), &mut body)
            .unwrap();
        assert_eq!(plain, b"abc\x17");
    }

    #[test]
    fn padding_alerts_and_other_content_types_read_as_the_rfc_says() {
        use super::fuzzing::Records;
        let mut tx = Records::new([1; 16], [2; 12]);
        let mut stream = Vec::new();
        stream.extend(tx.seal(b"one", APPLICATION_DATA, 0));
        stream.extend(tx.seal(b"two", APPLICATION_DATA, 200));
        stream.extend(tx.seal(b"", APPLICATION_DATA, 0));
        stream.extend(tx.seal(&[0], ALERT, 3));
        stream.extend(tx.seal(b"after the alert", APPLICATION_DATA, 0));
        let mut rx = Records::new([1; 16], [2; 12]);
        assert_eq!(rx.open_all(&mut stream.clone()).unwrap(), b"onetwo");
        // a handshake record (a key update, a ticket) is refused
        let mut tx = Records::new([1; 16], [2; 12]);
        let mut s2 = tx.seal(b"x", APPLICATION_DATA, 0);
        s2.extend(tx.seal(b"ticket", 22, 0));
        let e = Records::new([1; 16], [2; 12]).open_all(&mut s2).unwrap_err();
        assert!(e.to_string().contains("content type 22"), "{e}");
        // a record cut short waits for the rest
        let mut tx = Records::new([1; 16], [2; 12]);
        let mut cut = tx.seal(b"one", APPLICATION_DATA, 0);
        cut.extend(tx.seal(b"two", APPLICATION_DATA, 0));
        cut.pop();
        let mut rx = Records::new([1; 16], [2; 12]);
        assert_eq!(rx.open_all(&mut cut).unwrap(), b"one");
    }
}
