//! The TLS 1.3 record layer of the framed ports (fast port, data port), run here with the
//! traffic keys rustls hands over once its handshake is done (`dangerous_extract_secrets`, the
//! hand-over kernel TLS offload uses). On the wire these are ordinary TLS 1.3 records (RFC 8446
//! §5.2: a 5-byte header that is the additional data, the content and its type encrypted with
//! AES-GCM or ChaCha20-Poly1305 under a nonce of the IV and the record's sequence number).
//!
//! Why not rustls's own streams: they copy every byte three times on its way in (socket to a
//! 4 KiB read buffer, that to a plaintext queue, that to the caller) and encrypt from a copy on
//! its way out; for a 4 MiB value those copies cost more than the cipher. Here a record is
//! decrypted in place in the buffer the socket filled and handed to the caller from there
//! ([`AsyncBufRead`]), and a value is copied once into the buffer it is encrypted in
//! ([`Sealed::send_with`]).
//!
//! What it does not do: key updates and any record other than application data and alerts
//! (neither end sends them: servers send no tickets); a connection closes before its sequence
//! numbers reach [`KEY_LIMIT`] records, far below AES-GCM's bound, so no key is used past it.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use ring::aead::{AES_128_GCM, AES_256_GCM, Aad, CHACHA20_POLY1305, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use rustls::ConnectionTrafficSecrets;
use tokio::io::{AsyncBufRead, AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// Largest plaintext of one record.
const MAX_PLAIN: usize = 16 * 1024;
/// Header (5), content type (1) and tag (16) around a record's plaintext.
const OVERHEAD: usize = 5 + 1 + 16;
/// Largest record a peer may send: the plaintext, its type and up to 255 bytes of padding and tag
/// (RFC 8446 §5.2: 2^14 + 256 after the header).
const MAX_RECORD: usize = 5 + MAX_PLAIN + 256;
/// Bytes read from the socket at once (and room kept for a whole record behind them).
const IN_BUFFER: usize = 128 * 1024 + MAX_RECORD;
/// Plaintext encrypted ahead of the socket at once.
const OUT_PLAIN: usize = 8 * MAX_PLAIN;
const OUT_BUFFER: usize = OUT_PLAIN + 8 * OVERHEAD;
/// Records one key protects on a connection before the connection is closed (2^23, a quarter of
/// AES-GCM's limit for TLS 1.3, and 128 GiB of values).
pub const KEY_LIMIT: u64 = 1 << 23;
/// A client stops reusing a pooled connection at half of it, so no transfer meets the limit.
pub const WORN_OUT: u64 = KEY_LIMIT / 2;

const APPLICATION_DATA: u8 = 23;
const ALERT: u8 = 21;

fn invalid(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// One direction's key, IV and next sequence number.
struct Direction {
    key: LessSafeKey,
    iv: [u8; NONCE_LEN],
    seq: u64,
}

impl Direction {
    fn new(seq: u64, secrets: ConnectionTrafficSecrets) -> io::Result<Self> {
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
    #[allow(clippy::big_endian_bytes, reason = "TLS numbers are big-endian (RFC 8446 §5.3)")]
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

/// A TCP connection carrying TLS 1.3 records under keys taken over from rustls.
pub struct Sealed {
    tcp: TcpStream,
    tx: Direction,
    rx: Direction,
    /// received bytes: `inbuf[in_start..in_end]` not yet taken apart into records
    inbuf: Vec<u8>,
    in_start: usize,
    in_end: usize,
    /// the decrypted payload of the current record, `inbuf[plain.0..plain.1]`
    plain: (usize, usize),
    peer_closed: bool,
    /// records not yet written: `out[out_pos..out_len]`
    out: Vec<u8>,
    out_pos: usize,
    out_len: usize,
}

impl std::fmt::Debug for Sealed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sealed")
            .field("tcp", &self.tcp)
            .field("tx_seq", &self.tx.seq)
            .field("rx_seq", &self.rx.seq)
            .finish_non_exhaustive()
    }
}

impl Sealed {
    /// The connection `tcp`, whose handshake rustls completed and whose secrets it gave up.
    pub fn new(tcp: TcpStream, secrets: rustls::ExtractedSecrets) -> io::Result<Self> {
        let (tx_seq, tx) = secrets.tx;
        let (rx_seq, rx) = secrets.rx;
        Ok(Self {
            tcp,
            tx: Direction::new(tx_seq, tx)?,
            rx: Direction::new(rx_seq, rx)?,
            inbuf: Vec::new(),
            in_start: 0,
            in_end: 0,
            plain: (0, 0),
            peer_closed: false,
            out: Vec::new(),
            out_pos: 0,
            out_len: 0,
        })
    }

    pub fn tcp(&self) -> &TcpStream {
        &self.tcp
    }

    /// Whether received bytes wait here (decrypted, or still to decrypt), so the socket may be
    /// quiet although a read would not wait.
    pub fn has_buffered(&self) -> bool {
        self.plain.0 < self.plain.1 || self.in_start < self.in_end
    }

    /// Whether the connection has used half of what its keys may protect (a client then makes a
    /// new one instead of reusing it).
    pub fn worn_out(&self) -> bool {
        self.tx.seq >= WORN_OUT || self.rx.seq >= WORN_OUT
    }

    /// Takes the next whole record buffered, if there is one: decrypts it in place and makes its
    /// payload the current one. `Ok(false)`: no whole record is buffered.
    fn open_record(&mut self) -> io::Result<bool> {
        let (opened, used) = open_front(&mut self.rx, &mut self.inbuf, self.in_start, self.in_end)?;
        self.in_start += used;
        match opened {
            Opened::NeedMore => return Ok(false),
            Opened::Data(from, to) => self.plain = (from, to),
            Opened::Closed => self.peer_closed = true,
        }
        Ok(true)
    }

    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            if self.plain.0 < self.plain.1 || self.peer_closed {
                return Poll::Ready(Ok(()));
            }
            if self.open_record()? {
                continue;
            }
            if !ready!(self.poll_receive(cx))? {
                self.peer_closed = true;
                return Poll::Ready(Ok(()));
            }
        }
    }

    /// Reads what the socket has after the bytes buffered; `false` when the peer closed it.
    fn poll_receive(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<bool>> {
        if self.inbuf.is_empty() {
            self.inbuf = vec![0; IN_BUFFER];
        }
        // keep room for a whole record after what is buffered
        if self.inbuf.len() - self.in_end < MAX_RECORD {
            self.inbuf.copy_within(self.in_start..self.in_end, 0);
            self.in_end -= self.in_start;
            self.in_start = 0;
        }
        let mut rb = ReadBuf::new(&mut self.inbuf[self.in_end..]);
        ready!(Pin::new(&mut self.tcp).poll_read(cx, &mut rb))?;
        let n = rb.filled().len();
        if n == 0 {
            if self.in_start < self.in_end {
                return Poll::Ready(Err(io::ErrorKind::UnexpectedEof.into()));
            }
            return Poll::Ready(Ok(false));
        }
        self.in_end += n;
        Poll::Ready(Ok(true))
    }

    /// Sends one record with no content: a server's word that it took over the connection's
    /// keys (see `accept` in `tls/mod.rs`).
    pub async fn send_ready(&mut self) -> io::Result<()> {
        self.seal(0, |_, _| Ok(()))?;
        std::future::poll_fn(|cx| self.poll_drain(cx)).await
    }

    /// Waits for the server's empty record ([`send_ready`](Self::send_ready)).
    pub async fn receive_ready(&mut self) -> io::Result<()> {
        std::future::poll_fn(|cx| {
            loop {
                if self.open_record()? {
                    return Poll::Ready(if self.plain.0 == self.plain.1 && !self.peer_closed {
                        Ok(())
                    } else {
                        Err(invalid("the server sent data before its ready record"))
                    });
                }
                if !ready!(self.poll_receive(cx))? {
                    return Poll::Ready(Err(io::ErrorKind::UnexpectedEof.into()));
                }
            }
        })
        .await
    }

    /// Appends records for `len` bytes of plaintext that `fill` writes (at the plaintext's offset
    /// `from`) to the outgoing buffer, which must be empty, at most [`OUT_PLAIN`] bytes.
    fn seal(&mut self, len: usize, mut fill: impl FnMut(usize, &mut [u8]) -> io::Result<()>) -> io::Result<()> {
        debug_assert!(self.out_len == 0 && len <= OUT_PLAIN);
        if self.out.is_empty() {
            self.out = vec![0; OUT_BUFFER];
        }
        self.out_pos = 0;
        let mut at = 0;
        let mut done = 0;
        // at least one record: an empty one says "ready"
        while done < len || at == 0 {
            let n = (len - done).min(MAX_PLAIN);
            at += seal_one(&mut self.tx, &mut self.out[at..], APPLICATION_DATA, n, 0, |dst| {
                fill(done, dst)
            })?;
            done += n;
        }
        self.out_len = at;
        Ok(())
    }

    /// Writes the outgoing buffer to the socket, all of it.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.out_pos < self.out_len {
            let n = ready!(Pin::new(&mut self.tcp).poll_write(cx, &self.out[self.out_pos..self.out_len]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.out_pos += n;
        }
        self.out_pos = 0;
        self.out_len = 0;
        Poll::Ready(Ok(()))
    }

    /// Sends `len` bytes that `fill` writes, a buffer at a time (`fill(offset, dst)` fills
    /// `dst` with the bytes from `offset` on): the sender copies its bytes once, into the buffer
    /// they are encrypted in.
    pub async fn send_with(
        &mut self,
        len: u64,
        mut fill: impl FnMut(u64, &mut [u8]) -> io::Result<()>,
    ) -> io::Result<()> {
        let mut done = 0u64;
        std::future::poll_fn(|cx| self.poll_drain(cx)).await?;
        while done < len {
            let n = (len - done).min(OUT_PLAIN as u64) as usize;
            self.seal(n, |at, dst| fill(done + at as u64, dst))?;
            done += n as u64;
            std::future::poll_fn(|cx| self.poll_drain(cx)).await?;
        }
        Ok(())
    }
}

/// What the record at the front of a buffer held.
enum Opened {
    /// no whole record is there yet
    NeedMore,
    /// application data, decrypted in place at `buf[from..to]`
    Data(usize, usize),
    /// an alert: the peer is done
    Closed,
}

/// Opens the record at the front of `buf[start..end]` under `rx`, in place; returns what it held
/// and how many bytes it took (0 when it is not whole yet). An error: the connection cannot go on.
fn open_front(rx: &mut Direction, buf: &mut [u8], start: usize, end: usize) -> io::Result<(Opened, usize)> {
    let have = end.saturating_sub(start);
    if have < 5 {
        return Ok((Opened::NeedMore, 0));
    }
    let header: [u8; 5] = buf[start..start + 5].try_into().unwrap_or([0; 5]);
    #[allow(clippy::big_endian_bytes, reason = "TLS numbers are big-endian (RFC 8446 §5.1)")]
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
fn seal_one(
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

#[doc(hidden)]
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

impl AsyncRead for Sealed {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_fill(cx))?;
        let (from, to) = this.plain;
        let n = (to - from).min(buf.remaining());
        buf.put_slice(&this.inbuf[from..from + n]);
        this.plain.0 += n;
        Poll::Ready(Ok(()))
    }
}

impl AsyncBufRead for Sealed {
    fn poll_fill_buf(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<&[u8]>> {
        let this = self.get_mut();
        ready!(this.poll_fill(cx))?;
        Poll::Ready(Ok(&this.inbuf[this.plain.0..this.plain.1]))
    }

    fn consume(self: Pin<&mut Self>, amt: usize) {
        let this = self.get_mut();
        this.plain.0 = (this.plain.0 + amt).min(this.plain.1);
    }
}

impl AsyncWrite for Sealed {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[io::IoSlice::new(buf)])
    }

    /// Packs the slices into as few records as they fit (a request's header and its value share
    /// one), encrypts them, and starts writing them.
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        let total: usize = bufs.iter().map(|b| b.len()).sum::<usize>().min(OUT_PLAIN);
        if total == 0 {
            return Poll::Ready(Ok(0));
        }
        this.seal(total, |from, dst| {
            // copy `dst.len()` bytes starting at offset `from` of the slices laid end to end
            let (mut skip, mut at) = (from, 0);
            for b in bufs {
                if skip >= b.len() {
                    skip -= b.len();
                    continue;
                }
                let n = (b.len() - skip).min(dst.len() - at);
                dst[at..at + n].copy_from_slice(&b[skip..skip + n]);
                at += n;
                skip = 0;
                if at == dst.len() {
                    break;
                }
            }
            Ok(())
        })?;
        // the records are taken: start them on their way, and let a blocked socket wait for
        // the next write or the flush
        if let Poll::Ready(Err(e)) = this.poll_drain(cx) {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(total))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.tcp).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.tcp).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::{ClientTls, Conn, ServerTls, testing};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Both ends of a framed-port connection after a real handshake.
    async fn pair() -> (Box<Sealed>, Box<Sealed>) {
        let (ca, cert, key) = testing::issue("s.kvstore.internal");
        let server = ServerTls::from_pem(cert.as_bytes(), key.as_bytes()).unwrap();
        let client = ClientTls::from_pem(ca.as_bytes(), Some("s.kvstore.internal".into())).unwrap();
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let dial = async { client.connect(TcpStream::connect(&addr).await.unwrap(), &addr).await };
        let answer = async { server.accept(l.accept().await.unwrap().0).await };
        match tokio::join!(dial, answer) {
            (Ok(Conn::Sealed(c)), Ok(Conn::Sealed(s))) => (c, s),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn bytes_cross_whole_in_records_of_every_size() {
        let (mut c, mut s) = pair().await;
        let value: Vec<u8> = (0..(4 << 20) + 3)
            .map(|i: u32| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let sizes = [
            0usize,
            1,
            MAX_PLAIN - 1,
            MAX_PLAIN,
            MAX_PLAIN + 1,
            OUT_PLAIN + 5,
            value.len(),
        ];
        for len in sizes {
            let (send, recv) = tokio::join!(
                async {
                    // a header and a value in one vectored write, as the client sends them
                    let mut buf = bytes::Buf::chain(&b"head"[..], &value[..len]);
                    c.write_all_buf(&mut buf).await.unwrap();
                    c.flush().await.unwrap();
                },
                async {
                    let mut got = vec![0u8; 4 + len];
                    s.read_exact(&mut got).await.unwrap();
                    got
                }
            );
            let () = send;
            assert_eq!(&recv[..4], b"head");
            assert!(recv[4..] == value[..len], "{len} bytes");
        }
        // the other way, filled straight into the buffer it is sealed in
        let len = value.len() as u64;
        let (sent, got) = tokio::join!(
            s.send_with(len, |at, dst| {
                dst.copy_from_slice(&value[at as usize..at as usize + dst.len()]);
                Ok(())
            }),
            async {
                let mut got = vec![0u8; value.len()];
                c.read_exact(&mut got).await.unwrap();
                got
            }
        );
        sent.unwrap();
        assert!(got == value);
        assert!(!c.has_buffered() && !s.has_buffered());
    }

    #[tokio::test]
    async fn a_record_changed_on_the_way_or_out_of_order_is_refused() {
        let (mut c, mut s) = pair().await;
        // seal two records on the client without sending them
        c.seal(10, |_, d| {
            d.fill(7);
            Ok(())
        })
        .unwrap();
        let first = c.out[..c.out_len].to_vec();
        c.out_len = 0;
        c.seal(10, |_, d| {
            d.fill(8);
            Ok(())
        })
        .unwrap();
        let second = c.out[..c.out_len].to_vec();
        c.out_len = 0;
        let feed = |s: &mut Sealed, bytes: &[u8]| {
            s.inbuf = vec![0; IN_BUFFER];
            s.inbuf[..bytes.len()].copy_from_slice(bytes);
            s.in_start = 0;
            s.in_end = bytes.len();
        };
        // out of order: the second record under the first's nonce does not decrypt
        feed(&mut s, &second);
        assert_eq!(s.open_record().unwrap_err().kind(), io::ErrorKind::InvalidData);
        // a flipped bit in the payload
        let (_, mut s2) = pair().await;
        let mut bad = first.clone();
        bad[8] ^= 1;
        feed(&mut s2, &bad);
        assert!(s2.open_record().is_err());
        // a header that is not a TLS 1.3 application-data record
        let (_, mut s3) = pair().await;
        let mut bad = first.clone();
        bad[0] = 22;
        feed(&mut s3, &bad);
        assert!(
            s3.open_record()
                .unwrap_err()
                .to_string()
                .contains("not a TLS 1.3 record")
        );
        // a record longer than TLS allows is refused from its header alone
        let (_, mut s4) = pair().await;
        feed(&mut s4, &[23, 3, 3, 0xff, 0xff]);
        assert!(s4.open_record().is_err());
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

    #[tokio::test]
    async fn a_key_is_not_used_past_its_limit() {
        let (mut c, _s) = pair().await;
        c.tx.seq = KEY_LIMIT - 1;
        assert!(c.worn_out());
        c.seal(1, |_, d| {
            d[0] = 1;
            Ok(())
        })
        .unwrap();
        c.out_len = 0;
        let e = c.seal(1, |_, _| Ok(())).unwrap_err();
        assert!(e.to_string().contains("reconnect"), "{e}");
    }
}
