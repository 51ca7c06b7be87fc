//! Length-prefixed frames (`len u32 LE | tag u8 | len bytes`) for the leader's fast port, read
//! with as few reads as the kernel allows: usually one for a whole frame.

use bytes::{Buf, BytesMut};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// Takes one whole frame off the front of `buf`, if it holds one; an error if the frame it
/// starts is over `max` bytes. Otherwise reserves room for the rest and answers `None`.
pub fn split(buf: &mut BytesMut, max: usize) -> std::io::Result<Option<(u8, BytesMut)>> {
    if buf.len() < 5 {
        buf.reserve(4096);
        return Ok(None);
    }
    let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    if len > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("frame of {len} bytes is over the {max}-byte limit"),
        ));
    }
    if buf.len() >= 5 + len {
        let mut frame = buf.split_to(5 + len);
        let tag = frame[4];
        frame.advance(5);
        return Ok(Some((tag, frame)));
    }
    buf.reserve(5 + len - buf.len());
    Ok(None)
}

/// Reads one frame; `None` if the peer closed the connection cleanly between frames.
pub async fn read(s: &mut TcpStream, buf: &mut BytesMut, max: usize) -> std::io::Result<Option<(u8, BytesMut)>> {
    loop {
        if let Some(frame) = split(buf, max)? {
            return Ok(Some(frame));
        }
        if s.read_buf(buf).await? == 0 {
            if buf.is_empty() {
                return Ok(None);
            }
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
    }
}
