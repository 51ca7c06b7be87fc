//! What vLLM reports it did not compute for a prompt, read from its answer as the answer passes:
//! `usage.prompt_tokens_details.cached_tokens` (served with `--enable-prompt-tokens-details`;
//! in a stream, the usage chunk a client asks for with `stream_options.include_usage`). The
//! bytes are scanned, never parsed whole, so an answer of any size costs a few bytes kept between
//! frames. The last figure in the answer counts.

/// The key vLLM writes.
const KEY: &[u8] = b"\"cached_tokens\"";
/// Bytes kept between frames: the key, a colon, some white space and a 20-digit number.
const CARRY: usize = 64;

/// One answer's scan.
#[derive(Debug, Default)]
pub struct HitScan {
    carry: Vec<u8>,
    found: Option<u64>,
}

impl HitScan {
    /// Reads the next bytes of the answer.
    pub fn feed(&mut self, data: &[u8]) {
        let mut buf = std::mem::take(&mut self.carry);
        buf.extend_from_slice(data);
        let mut at = 0;
        while let Some(i) = find(&buf[at..], KEY) {
            let after = at + i + KEY.len();
            if let Some(n) = number_after_colon(&buf[after..]) {
                self.found = Some(n);
            }
            at = after;
        }
        let keep = buf.len().saturating_sub(CARRY);
        self.carry = buf.split_off(keep);
    }

    /// The figure the answer carried, if any.
    pub fn cached_tokens(&self) -> Option<u64> {
        self.found
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// `  :  123,` → 123; `None` when no whole number follows (yet).
fn number_after_colon(b: &[u8]) -> Option<u64> {
    let mut it = b.iter().copied().skip_while(u8::is_ascii_whitespace);
    if it.next()? != b':' {
        return None;
    }
    let mut it = it.skip_while(u8::is_ascii_whitespace).peekable();
    let mut n: u64 = 0;
    let mut digits = 0;
    loop {
        match it.next() {
            Some(c) if c.is_ascii_digit() => {
                n = n.checked_mul(10)?.checked_add(u64::from(c - b'0'))?;
                digits += 1;
            }
            // the number must be followed by something: a number at the end may go on
            Some(_) if digits > 0 => return Some(n),
            _ => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(frames: &[&[u8]]) -> Option<u64> {
        let mut s = HitScan::default();
        frames.iter().for_each(|f| s.feed(f));
        s.cached_tokens()
    }

    #[test]
    fn finds_the_figure_however_the_answer_is_cut() {
        let body = br#"{"id":"x","usage":{"prompt_tokens":1200,"prompt_tokens_details":{"cached_tokens":1184},"total_tokens":1210}}"#;
        assert_eq!(scan(&[body]), Some(1184));
        for cut in 0..body.len() {
            assert_eq!(scan(&[&body[..cut], &body[cut..]]), Some(1184), "cut at {cut}");
        }
        let sse = b"data: {\"choices\":[]}\n\ndata: {\"usage\":{\"prompt_tokens_details\": {\"cached_tokens\" : 32}}}\n\ndata: [DONE]\n\n";
        assert_eq!(scan(&[sse]), Some(32));
        let bytes: Vec<&[u8]> = sse.chunks(1).collect();
        assert_eq!(scan(&bytes), Some(32));
    }

    #[test]
    fn no_figure_no_report() {
        for body in [
            &br#"{"usage":{"prompt_tokens":12,"prompt_tokens_details":null}}"#[..],
            br#"{"usage":{"prompt_tokens_details":{"cached_tokens":null}}}"#,
            br#"{"cached_tokens":"12"}"#,
            br#"{"cached_tokens":99999999999999999999999}"#,
            br#"{"cached_tokens":12"#,
            b"",
        ] {
            assert_eq!(scan(&[body]), None, "{}", String::from_utf8_lossy(body));
        }
        // the last figure counts
        assert_eq!(scan(&[br#"{"cached_tokens":1} {"cached_tokens":2}"#]), Some(2));
    }
}
