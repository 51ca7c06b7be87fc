//! Length-prefixed frames (`len u32 LE | tag u8 | len bytes`) for the leader's fast port, read
//! with as few reads as the kernel allows: usually one for a whole frame. Room for a frame grows
//! with the bytes that arrive ([`GROWTH`] at a time), never from the declared length alone, so a
//! header that announces a large frame and sends nothing costs its sender, not the reader.

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};

/// The most room reserved ahead of the bytes received.
pub const GROWTH: usize = 64 * 1024;

/// Takes one whole frame off the front of `buf`, if it holds one; an error if the frame it
/// starts is over `max` bytes. Otherwise reserves room for more of it (at most [`GROWTH`]) and
/// answers `None`.
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
    buf.reserve((5 + len - buf.len()).min(GROWTH));
    Ok(None)
}

/// Reads one frame; `None` if the peer closed the connection cleanly between frames.
pub async fn read(
    s: &mut (impl AsyncRead + Unpin),
    buf: &mut BytesMut,
    max: usize,
) -> std::io::Result<Option<(u8, BytesMut)>> {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `store/WIRE.md` section 1: `len u32 | tag u8 | len bytes`, `len` counting the body alone.
    #[test]
    fn a_frame_lies_where_wire_md_says() {
        let mut buf = BytesMut::from(&[3u8, 0, 0, 0, 12, b'a', b'b', b'c', 0xff][..]);
        let (tag, body) = split(&mut buf, 1024).unwrap().unwrap();
        assert_eq!((tag, &body[..]), (12, &b"abc"[..]));
        assert_eq!(&buf[..], &[0xff], "the next frame's first byte stays");
    }
    use bytes::BufMut;

    #[test]
    fn a_large_declared_frame_takes_room_only_as_its_bytes_arrive() {
        let mut buf = BytesMut::new();
        buf.put_u32_le(5 << 20);
        buf.put_u8(1);
        assert!(split(&mut buf, 5 << 20).unwrap().is_none());
        assert!(
            buf.capacity() <= 5 + GROWTH,
            "{} bytes reserved for 5 bytes received",
            buf.capacity()
        );
        // the rest arrives: the frame comes out whole
        buf.put_bytes(7, 5 << 20);
        let (tag, body) = split(&mut buf, 5 << 20).unwrap().unwrap();
        assert_eq!((tag, body.len()), (1, 5 << 20));
        assert!(buf.is_empty());
        // over the limit: refused from the header alone
        let mut big = BytesMut::new();
        big.put_u32_le(6 << 20);
        big.put_u8(1);
        assert!(split(&mut big, 5 << 20).is_err());
    }
}
