//! Wall-clock milliseconds, the unit deadlines cross process boundaries in.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// `now + d` in Unix milliseconds, saturating.
pub fn unix_ms_after(d: Duration) -> u64 {
    now_unix_ms().saturating_add(d.as_millis() as u64)
}

/// Parses `200us`, `500ms`, `2s`, `5m`, `1h` (a bare number is seconds).
pub fn parse_duration(input: &str) -> Result<Duration, String> {
    let s = input.trim();
    let (num, unit_us) = if let Some(n) = s.strip_suffix("us") {
        (n, 1)
    } else if let Some(n) = s.strip_suffix("ms") {
        (n, 1_000)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1_000_000)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60_000_000)
    } else if let Some(n) = s.strip_suffix('h') {
        (n, 3_600_000_000)
    } else {
        (s, 1_000_000)
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("invalid duration {input:?}; write a whole number with us, ms, s, m or h, such as 10s"))?;
    n.checked_mul(unit_us)
        .map(Duration::from_micros)
        .ok_or_else(|| format!("duration {input:?} is too long"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_durations() {
        assert_eq!(parse_duration("200us"), Ok(Duration::from_micros(200)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert!(parse_duration("fast").is_err());
        assert!(parse_duration("-1s").is_err());
    }
}
