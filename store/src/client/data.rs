//! The client's side of the members' data port (`wire.rs`): pooled connections, a write sent as
//! one vectored write, a read received straight into the caller's buffer. A member on this host
//! is served through its mapped segment instead (`local.rs`) when it can be.

use std::time::Instant;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{Client, POOL_PER_MEMBER, local, transport};
use crate::error::{ErrorCode, Result, StoreError};
use crate::proto::Location;
use crate::tls::Conn;
use crate::wire::{self, Op, RESPONSE_LEN};

impl Client {
    /// A pooled connection the member has not closed (it closes idle ones: `dataport.rs`).
    fn take_conn(&self, addr: &str) -> Option<Conn> {
        let mut pool = self.pool.lock();
        let conns = pool.get_mut(addr)?;
        while let Some(s) = conns.pop() {
            // between requests the member sends nothing: anything readable is its close
            let mut probe = [0u8; 1];
            // (over TLS too: a close, or an alert, is all that could be there)
            if !s.worn_out()
                && matches!(s.tcp().try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
            {
                return Some(s);
            }
        }
        None
    }

    fn give_back(&self, addr: &str, s: Conn) {
        let mut pool = self.pool.lock();
        let v = pool.entry(addr.to_string()).or_default();
        if v.len() < POOL_PER_MEMBER {
            v.push(s);
        }
    }

    async fn conn(&self, addr: &str) -> Result<Conn> {
        if let Some(s) = self.take_conn(addr) {
            return Ok(s);
        }
        let tcp = crate::net::connect_data(addr)
            .await
            .map_err(|e| transport(format!("cannot reach member {addr}: {e}")))?;
        crate::tls::connect(self.tls.as_ref(), tcp, addr)
            .await
            .map_err(|e| transport(format!("member {addr}: {e}")))
    }

    pub(super) async fn write(&self, loc: &Location, deadline: u64, value: &[u8]) -> Result<()> {
        self.write_parts(loc, deadline, &[value]).await
    }

    /// Writes a value held as `parts`, one after the other (one slice is the common case).
    pub(super) async fn write_parts(&self, loc: &Location, deadline: u64, parts: &[&[u8]]) -> Result<()> {
        debug_assert!(!parts.is_empty());
        let same_host = match parts {
            [one] => local::Bytes::From(one),
            _ => local::Bytes::FromParts(parts),
        };
        if let Some(done) = self.local_transfer(loc, deadline, same_host).await {
            return done;
        }
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let mut s = self.conn(&loc.data_addr).await?;
        let until = Instant::now() + crate::spin::after_transfer(self.spin, len as u64);
        let head = wire::Request::granted(Op::Write, loc, len as u64, deadline, loc.tag.len() as u16).encode();
        // the header, then the value's tag: one send with the (first part of the) value
        let mut head = head.to_vec();
        head.extend_from_slice(&loc.tag);
        match parts {
            [one] => {
                let mut buf = Buf::chain(&head[..], *one);
                s.write_all_buf(&mut buf).await.map_err(transport)?;
            }
            _ => {
                s.write_all(&head).await.map_err(transport)?;
                for p in parts {
                    s.write_all(p).await.map_err(transport)?;
                }
            }
        }
        s.flush().await.map_err(transport)?;
        let (s, _) = self.answer(s, &loc.data_addr, until).await?;
        self.give_back(&loc.data_addr, s);
        Ok(())
    }

    /// The member's answer to the request just sent on `s`: its header when it accepted, or its
    /// refusal as the error (the connection pooled again).
    async fn answer(&self, mut s: Conn, addr: &str, until: Instant) -> Result<(Conn, wire::Response)> {
        let resp = read_response(&mut s, until).await?;
        if resp.ok {
            return Ok((s, resp));
        }
        let err = read_refusal(&mut s, resp.len).await?;
        self.give_back(addr, s);
        Err(err)
    }

    /// Reads the value `loc` names into `sink`: `false` when it was on its member's disk tier and
    /// the member found its copy damaged or gone (a miss; whatever `sink` holds is not the value).
    pub(super) async fn read(&self, loc: &Location, deadline: u64, sink: Sink<'_, '_>) -> Result<bool> {
        if loc.on_disk {
            return self.read_disk(loc, deadline, sink).await;
        }
        self.read_memory(loc, deadline, sink).await.map(|()| true)
    }

    async fn read_memory(&self, loc: &Location, deadline: u64, mut sink: Sink<'_, '_>) -> Result<()> {
        let same_host = match &mut sink {
            Sink::Slice(out) => local::Bytes::Into(out),
            Sink::Parts(parts) => local::Bytes::IntoParts(parts),
            Sink::Fresh(out) => local::Bytes::Fresh(out),
        };
        if let Some(done) = self.local_transfer(loc, deadline, same_host).await {
            return done;
        }
        let mut s = self.conn(&loc.data_addr).await?;
        let until = Instant::now() + crate::spin::after_transfer(self.spin, loc.len);
        let head = wire::Request::granted(Op::Read, loc, loc.len, deadline, 0).encode();
        s.write_all(&head).await.map_err(transport)?;
        s.flush().await.map_err(transport)?;
        let (mut s, resp) = self.answer(s, &loc.data_addr, until).await?;
        if resp.len != loc.len {
            return Err(wrong_length());
        }
        receive(&mut s, sink, resp.len, until).await?;
        self.give_back(&loc.data_addr, s);
        Ok(())
    }

    /// A value only on its member's disk tier (op 7), streamed from disk: the bytes count only
    /// if the verdict after them says they matched their checksum. A member on this host hands
    /// the copy's file over instead, when it can (`local.rs`).
    async fn read_disk(&self, loc: &Location, deadline: u64, mut sink: Sink<'_, '_>) -> Result<bool> {
        if let Some(done) = self.local_disk_read(loc, deadline, &mut sink).await {
            return done;
        }
        let mut s = self.conn(&loc.data_addr).await?;
        // no polling: the bytes come off a disk over milliseconds, and a polling reader would
        // take a core from the member that hashes and sends them
        let until = Instant::now();
        let mut head = wire::Request::granted(Op::ReadDisk, loc, loc.len, deadline, loc.tag.len() as u16)
            .encode()
            .to_vec();
        head.extend_from_slice(&loc.tag);
        s.write_all(&head).await.map_err(transport)?;
        s.flush().await.map_err(transport)?;
        let (mut s, resp) = self.answer(s, &loc.data_addr, until).await?;
        if resp.len != 0 && resp.len != loc.len {
            return Err(wrong_length());
        }
        if resp.len != 0 {
            receive(&mut s, sink, resp.len, until).await?;
        }
        let mut verdict = [0u8; wire::VERDICT_LEN];
        s.read_exact(&mut verdict).await.map_err(transport)?;
        self.give_back(&loc.data_addr, s);
        Ok(resp.len != 0 && wire::Verdict::decode(&verdict) == wire::Verdict::Intact)
    }
}

fn wrong_length() -> StoreError {
    StoreError::new(ErrorCode::Transport, "the member sent a value of the wrong length")
}

/// Receives a value's `len` bytes into `sink`.
async fn receive(s: &mut Conn, sink: Sink<'_, '_>, len: u64, until: Instant) -> Result<()> {
    match sink {
        Sink::Slice(out) => read_exactly(s, out, until).await,
        Sink::Parts(parts) => {
            for out in parts.iter_mut() {
                read_exactly(s, out, until).await?;
            }
            Ok(())
        }
        Sink::Fresh(out) => {
            let mut limited = s.take(len);
            while (out.len() as u64) < len {
                until_readable(limited.get_mut(), until);
                if limited.read_buf(out).await.map_err(transport)? == 0 {
                    return Err(transport("the member closed the connection mid-value"));
                }
            }
            Ok(())
        }
    }
}

pub(super) enum Sink<'a, 'b> {
    Slice(&'a mut [u8]),
    /// several slices the value fills one after the other (their lengths add up to it)
    Parts(&'a mut [&'b mut [u8]]),
    Fresh(&'a mut BytesMut),
}

/// Fills `out` from the connection.
async fn read_exactly(s: &mut Conn, out: &mut [u8], until: Instant) -> Result<()> {
    let mut got = 0;
    while got < out.len() {
        until_readable(s, until);
        match s.read(&mut out[got..]).await.map_err(transport)? {
            0 => return Err(transport("the member closed the connection mid-value")),
            n => got += n,
        }
    }
    Ok(())
}

/// Polls for the member's next bytes until `until` (`spin.rs`), unless some already wait
/// decrypted.
fn until_readable(s: &mut Conn, until: Instant) {
    if !s.has_buffered() {
        crate::spin::until_readable(s.tcp(), until);
    }
}

async fn read_response(s: &mut Conn, until: Instant) -> Result<wire::Response> {
    until_readable(s, until);
    let mut head = [0u8; RESPONSE_LEN];
    s.read_exact(&mut head).await.map_err(transport)?;
    wire::Response::decode(&head)
}

async fn read_refusal(s: &mut Conn, len: u64) -> Result<StoreError> {
    if len > wire::MAX_MESSAGE {
        return Err(transport("the member sent an oversized refusal"));
    }
    let mut msg = vec![0u8; len as usize];
    s.read_exact(&mut msg).await.map_err(transport)?;
    Ok(wire::refusal(&msg))
}
