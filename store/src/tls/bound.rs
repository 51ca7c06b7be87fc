//! `kv-store tls-bound`: what TLS can reach on this machine with nothing of the store around it,
//! the bounds our data port's TLS puts and gets are measured against (`store/bench/compare.sh`).
//!
//! **The crypto bound** ([`crypto_bound`]): AES-128-GCM through ring alone, as our records use it
//! (16 KiB records, in place): one thread seals values of `size`, another opens them, two buffers
//! handed between them, so both sides' cipher runs on these cores at once and nothing else does
//! (no copy, no socket). Prints `{"op":"crypto_bound",…}`.
//!
//! **The transfer bound**: two threads, each on a runtime of its own as a client and a member
//! would be, one loopback TCP connection tuned as the data port's (`net.rs`), a real TLS 1.3
//! handshake with the certificate given (AES-128-GCM, as the store negotiates), then our record
//! layer (`sealed.rs`) over ring: a `put` seals `size` bytes copied from the sender's buffer, the
//! receiver opens them and copies them out, and answers one byte; a `get` is the same the other
//! way. That is the least a TLS transfer costs here: one copy into the sealing buffer, the cipher
//! on each side, the kernel's copies; the store adds its metadata calls, the segment's claims and
//! the checksum it takes of every value it receives. Both sides poll their runtimes throughout
//! (`spin.rs`, as the store's hot paths do), so no wake-up is in the figure. This is how fast our
//! record layer moves a value, not a bound the store cannot pass: the store's own transfers
//! sometimes do better. Prints one JSON line per direction:
//! `{"op":"tls_bound_put"|"tls_bound_get","size","ops_per_s","bytes_per_s","p50_us","p99_us"}`.

use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

use super::{ClientTls, Conn, DialFlags, ServeFlags, ServerTls};
use crate::error::{ErrorCode, Result, StoreError};

/// The flags of `kv-store tls-bound`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct BoundArgs {
    /// Bytes per transfer.
    #[arg(long, default_value = "4Mi", value_parser = crate::flags::parse_size)]
    pub size: u64,
    /// Transfers each way.
    #[arg(long, default_value_t = 400)]
    pub ops: usize,
    /// The certificate the receiving end serves (`--tls-cert`, `--tls-key`).
    #[command(flatten)]
    pub serve: ServeFlags,
    /// What the sending end trusts (`--tls-ca`, `--tls-server-name`).
    #[command(flatten)]
    pub dial: DialFlags,
}

/// One direction's figures.
#[derive(Debug, Clone, Serialize)]
pub struct BoundRow {
    pub op: &'static str,
    pub size: u64,
    pub ops_per_s: f64,
    pub bytes_per_s: f64,
    pub p50_us: f64,
    pub p99_us: f64,
}

/// Plaintext bytes per record, as our records carry them.
const RECORD: usize = 16 * 1024;

/// Seals `ops` values of `size` on one thread and opens them on another (module doc).
pub fn crypto_bound(size: usize, ops: usize) -> Result<BoundRow> {
    use ring::aead::{AES_128_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, Tag, UnboundKey};
    let mut raw = [0u8; 16];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut raw)
        .map_err(|_| failed("a key", "no randomness"))?;
    let key =
        move || LessSafeKey::new(UnboundKey::new(&AES_128_GCM, &raw).unwrap_or_else(|_| unreachable!("a 16-byte key")));
    let nonce = |seq: u64| {
        let mut n = [0u8; NONCE_LEN];
        n[4..].copy_from_slice(&seq.to_le_bytes());
        Nonce::assume_unique_for_key(n)
    };
    let header = |n: usize| [23u8, 3, 3, (n >> 8) as u8, n as u8];
    type Sealed = (Vec<u8>, Vec<Tag>);
    let (to_open, opened_rx) = std::sync::mpsc::sync_channel::<Sealed>(1);
    let (to_reuse, reuse_rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(2);
    for _ in 0..2 {
        let _ = to_reuse.send((0..size).map(|i| (i * 31 % 251) as u8).collect());
    }
    let started = Instant::now();
    let opener = std::thread::spawn(move || -> std::result::Result<Vec<Duration>, &'static str> {
        let key = key();
        let mut seq = 0u64;
        let mut took = Vec::with_capacity(ops);
        for _ in 0..ops {
            let (mut value, tags) = opened_rx.recv().map_err(|_| "the sealer stopped")?;
            let t = Instant::now();
            for (chunk, tag) in value.chunks_mut(RECORD).zip(tags) {
                let aad = Aad::from(header(chunk.len() + 16));
                key.open_in_place_separate_tag(nonce(seq), aad, tag, chunk, 0..)
                    .map_err(|_| "a record does not open")?;
                seq += 1;
            }
            took.push(t.elapsed());
            let _ = to_reuse.send(value);
        }
        Ok(took)
    });
    let key = key();
    let mut seq = 0u64;
    for _ in 0..ops {
        let mut value = reuse_rx
            .recv()
            .map_err(|_| failed("crypto bound", "the opener stopped"))?;
        let mut tags = Vec::with_capacity(size.div_ceil(RECORD));
        for chunk in value.chunks_mut(RECORD) {
            let aad = Aad::from(header(chunk.len() + 16));
            let tag = key
                .seal_in_place_separate_tag(nonce(seq), aad, chunk)
                .map_err(|_| failed("crypto bound", "sealing failed"))?;
            tags.push(tag);
            seq += 1;
        }
        if to_open.send((value, tags)).is_err() {
            break;
        }
    }
    let opened = opener
        .join()
        .map_err(|_| failed("crypto bound", "the opener panicked"))?
        .map_err(|e| failed("crypto bound", e))?;
    // values per second through the pipeline (both threads busy at once), each value's open time
    // for the percentiles
    let elapsed = started.elapsed().as_secs_f64();
    let mut r = row("crypto_bound", size as u64, opened);
    r.ops_per_s = ops as f64 / elapsed;
    r.bytes_per_s = ops as f64 * size as f64 / elapsed;
    Ok(r)
}

/// How long each side keeps polling after its last transfer began (longer than one transfer).
const HOT: Duration = Duration::from_millis(50);

fn failed(what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::new(ErrorCode::Internal, format!("{what}: {e}"))
}

fn sealed(c: Conn) -> Result<Box<super::Sealed>> {
    match c {
        Conn::Sealed(s) => Ok(s),
        Conn::Plain(_) => Err(failed("tls-bound", "the connection is not TLS")),
    }
}

/// Receives `size` bytes into `dst`, copied out of each record as it is opened.
async fn receive(s: &mut super::Sealed, dst: &mut [u8]) -> std::io::Result<()> {
    let mut done = 0;
    while done < dst.len() {
        let buf = s.fill_buf().await?;
        if buf.is_empty() {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let n = buf.len().min(dst.len() - done);
        dst[done..done + n].copy_from_slice(&buf[..n]);
        s.consume(n);
        done += n;
    }
    Ok(())
}

/// Sends `src`, copied into the buffer it is sealed in.
async fn send(s: &mut super::Sealed, src: &[u8]) -> std::io::Result<()> {
    s.send_with(src.len() as u64, |at, dst| {
        let at = at as usize;
        dst.copy_from_slice(&src[at..at + dst.len()]);
        Ok(())
    })
    .await
}

/// The member's side: receives `ops` values and answers each, then sends `ops` values, each after
/// a one-byte request.
async fn serve_side(listener: tokio::net::TcpListener, tls: ServerTls, size: usize, ops: usize) -> std::io::Result<()> {
    let (tcp, peer) = listener.accept().await?;
    tcp.set_nodelay(true)?;
    crate::net::tune_data_connection(socket2::SockRef::from(&tcp), &peer);
    let Conn::Sealed(mut s) = tls.accept(tcp).await? else {
        return Err(std::io::Error::other("not TLS"));
    };
    let hot = crate::spin::HotWindow::start(HOT);
    let mut value = vec![0u8; size];
    for _ in 0..ops {
        hot.touch();
        receive(&mut s, &mut value).await?;
        s.write_all(&[1]).await?;
        s.flush().await?;
    }
    for _ in 0..ops {
        hot.touch();
        let mut ask = [0u8; 1];
        s.read_exact(&mut ask).await?;
        send(&mut s, &value).await?;
    }
    hot.stop();
    Ok(())
}

fn row(op: &'static str, size: u64, mut took: Vec<Duration>) -> BoundRow {
    took.sort();
    let total: f64 = took.iter().map(Duration::as_secs_f64).sum();
    let at = |q: f64| took[((took.len() as f64 - 1.0) * q).round() as usize].as_secs_f64() * 1e6;
    BoundRow {
        op,
        size,
        ops_per_s: took.len() as f64 / total,
        bytes_per_s: took.len() as f64 * size as f64 / total,
        p50_us: at(0.5),
        p99_us: at(0.99),
    }
}

/// Measures both directions; the member's side runs on a thread and runtime of its own.
pub fn run(args: &BoundArgs) -> Result<Vec<BoundRow>> {
    let needs = || {
        StoreError::new(
            ErrorCode::InvalidArgument,
            "the bound is of TLS: give --tls-cert, --tls-key and --tls-ca",
        )
    };
    let config = |e: crate::flags::ConfigError| StoreError::new(ErrorCode::InvalidArgument, e.to_string());
    let server: ServerTls = args.serve.server().map_err(config)?.ok_or_else(needs)?;
    let client: ClientTls = args.dial.client().map_err(config)?.ok_or_else(needs)?;
    let size = usize::try_from(args.size).map_err(|e| failed("--size", e))?;
    let ops = args.ops.max(1);
    let listener = crate::net::data_listener("127.0.0.1:0".parse().map_err(|e| failed("address", e))?)
        .map_err(|e| failed("listening", e))?;
    let addr = listener.local_addr().map_err(|e| failed("listening", e))?;
    let std_listener = listener.into_std().map_err(|e| failed("listening", e))?;
    let member = std::thread::spawn(move || -> std::io::Result<()> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(std_listener)?;
            serve_side(listener, server, size, ops).await
        })
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| failed("runtime", e))?;
    let rows = rt.block_on(async move {
        let tcp = crate::net::connect_data(&addr.to_string())
            .await
            .map_err(|e| failed("connecting", e))?;
        let mut s = sealed(
            client
                .connect(tcp, &addr.to_string())
                .await
                .map_err(|e| failed("handshake", e))?,
        )?;
        let hot = crate::spin::HotWindow::start(HOT);
        let value: Vec<u8> = (0..size).map(|i| (i * 31 % 251) as u8).collect();
        let mut put = Vec::with_capacity(ops);
        for _ in 0..ops {
            hot.touch();
            let t = Instant::now();
            send(&mut s, &value).await.map_err(|e| failed("sending", e))?;
            let mut ack = [0u8; 1];
            s.read_exact(&mut ack).await.map_err(|e| failed("the answer", e))?;
            put.push(t.elapsed());
        }
        let mut into = vec![0u8; size];
        let mut get = Vec::with_capacity(ops);
        for _ in 0..ops {
            hot.touch();
            let t = Instant::now();
            s.write_all(&[2]).await.map_err(|e| failed("asking", e))?;
            s.flush().await.map_err(|e| failed("asking", e))?;
            receive(&mut s, &mut into).await.map_err(|e| failed("receiving", e))?;
            get.push(t.elapsed());
        }
        hot.stop();
        if into != value {
            return Err(failed("tls-bound", "the bytes came back changed"));
        }
        Ok::<_, StoreError>(vec![
            row("tls_bound_put", size as u64, put),
            row("tls_bound_get", size as u64, get),
        ])
    })?;
    member
        .join()
        .map_err(|_| failed("the member's side", "panicked"))?
        .map_err(|e| failed("the member's side", e))?;
    let mut rows = rows;
    rows.insert(0, crypto_bound(size, ops)?);
    Ok(rows)
}
