//! The duration syntax of every flag of both binaries: a whole number and a unit, `us`, `ms`, `s`,
//! `m` or `h` (`200us`, `500ms`, `10s`, `5m`, `1h`). A bare number is seconds, so the older
//! spelling `--shutdown-delay 5` keeps working. [`format_duration`] writes the canonical spelling
//! back, so `parse_duration(&format_duration(d)) == d` for every whole number of microseconds.

use std::time::Duration;

/// Why a duration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {input:?}: {reason}; write a whole number with us, ms, s, m or h, such as 10s or 500ms")]
pub struct DurationError {
    input: String,
    reason: &'static str,
}

const UNITS: [(&str, u64); 5] = [
    ("h", 3_600_000_000),
    ("m", 60_000_000),
    ("s", 1_000_000),
    ("ms", 1_000),
    ("us", 1),
];

/// Parses `200us`, `500ms`, `2s`, `5m`, `1h`; a bare number is seconds.
pub fn parse_duration(input: &str) -> Result<Duration, DurationError> {
    let err = |reason| DurationError {
        input: input.to_owned(),
        reason,
    };
    let s = input.trim();
    let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (number, unit) = s.split_at(digits);
    if number.is_empty() {
        return Err(err("it does not start with a number"));
    }
    let micros_per = match unit {
        "" => 1_000_000,
        u => UNITS
            .iter()
            .find(|(name, _)| *name == u)
            .map(|(_, m)| *m)
            .ok_or_else(|| err("the unit is not one of us, ms, s, m, h"))?,
    };
    let n: u64 = number.parse().map_err(|_| err("the number is too large"))?;
    n.checked_mul(micros_per)
        .map(Duration::from_micros)
        .ok_or_else(|| err("it is too long"))
}

/// The canonical spelling: the largest unit that divides the duration exactly (`90s` → `90s`,
/// `120s` → `2m`, `0` → `0s`). Below a microsecond, precision is dropped.
pub fn format_duration(d: Duration) -> String {
    let micros = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
    if micros == 0 {
        return "0s".to_owned();
    }
    for (unit, per) in UNITS {
        if micros.is_multiple_of(per) {
            return format!("{}{unit}", micros / per);
        }
    }
    format!("{micros}us")
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
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        for bad in ["fast", "-1s", "1.5s", "s", "", "10 s", "10sec", "99999999999999999999h"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} should be refused");
        }
        assert!(parse_duration("10x").unwrap_err().to_string().contains("such as 10s"));
    }

    #[test]
    fn formats_back_to_the_same_duration() {
        for (d, text) in [
            (Duration::ZERO, "0s"),
            (Duration::from_micros(200), "200us"),
            (Duration::from_millis(500), "500ms"),
            (Duration::from_millis(1500), "1500ms"),
            (Duration::from_secs(10), "10s"),
            (Duration::from_secs(120), "2m"),
            (Duration::from_secs(7200), "2h"),
        ] {
            assert_eq!(format_duration(d), text);
            assert_eq!(parse_duration(text), Ok(d));
        }
    }
}
