//! The TLS 1.3 record layer of the framed ports (fast port, data port), run here with the
//! traffic keys rustls hands over once its handshake is done (`dangerous_extract_secrets`, the
//! hand-over kernel TLS offload uses). On the wire these are ordinary TLS 1.3 records
//! (RFC 8446: a 5-byte header that is the additional data, the content and its type
//! encrypted with AES-GCM or ChaCha20-Poly1305 under a nonce of the IV and the record's sequence
//! number).
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

use tokio::io::{AsyncBufRead, AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::record::{
    APPLICATION_DATA, Direction, MAX_PLAIN, MAX_RECORD, OVERHEAD, Opened, WORN_OUT, invalid, open_front, seal_one,
};

/// Bytes read from the socket at once (and room kept for a whole record behind them).
const IN_BUFFER: usize = 128 * 1024 + MAX_RECORD;
/// Plaintext encrypted ahead of the socket at once.
const OUT_PLAIN: usize = 8 * MAX_PLAIN;
const OUT_BUFFER: usize = OUT_PLAIN + 8 * OVERHEAD;

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
    use crate::tls::record::KEY_LIMIT;
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
