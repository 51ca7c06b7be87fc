//! The TLS 1.3 record layer of the fast and data ports (`tls/sealed.rs`), as a peer feeds it. The
//! input describes records: each a control byte (low 2 bits: content type application data,
//! alert or handshake; next bits: padding), a content length and its bytes, sealed under the
//! connection's key; a final byte may flip one bit anywhere in the stream, and stray bytes may
//! follow. Opening must never panic; a stream left whole must give back exactly the application
//! data before its first alert, and one refused record must end it with an error.

#![no_main]

use kvcache_store::tls::fuzzing::Records;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut sealer = Records::new([7; 16], [9; 12]);
    let mut stream = Vec::new();
    let mut want = Vec::new();
    let mut open = true;
    let mut rest = data;
    while rest.len() >= 3 {
        let control = rest[0];
        let len = u16::from_le_bytes([rest[1], rest[2]]) as usize;
        rest = &rest[3..];
        let content = &rest[..len.min(rest.len())];
        rest = &rest[content.len()..];
        let kind = [23u8, 21, 22, 23][(control & 3) as usize];
        let pad = (control >> 2) as usize * 7;
        let record = sealer.seal(content, kind, pad);
        if open {
            match kind {
                23 => want.extend_from_slice(&content[..content.len().min(16 * 1024)]),
                _ => open = false,
            }
        }
        stream.extend_from_slice(&record);
        if control == 0xff {
            break;
        }
    }
    let mut whole = true;
    if let [flip @ .., last] = rest
        && !stream.is_empty()
    {
        let at = u32::from_le_bytes([*last, *flip.first().unwrap_or(&0), 0, 0]) as usize % stream.len();
        stream[at] ^= 1 << (last % 8);
        whole = false;
        stream.extend_from_slice(flip);
    }
    let mut opener = Records::new([7; 16], [9; 12]);
    let opened = opener.open_all(&mut stream);
    if whole {
        match opened {
            // only a handshake record is refused, and the data before it was not the answer
            Err(_) => assert!(!open),
            Ok(got) => assert_eq!(got, want),
        }
    }
});
