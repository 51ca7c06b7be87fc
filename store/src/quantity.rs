//! Sizes as operators write them: Kubernetes quantities (`8Gi`, `512Mi`, `4M`, `1.5Gi`) or plain
//! byte counts (`1073741824`). Only whole byte results are accepted.

use thiserror::Error;

/// Why a size was refused.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("invalid size {input:?}: {reason}; write a byte count or a quantity such as 8Gi, 512Mi or 4M")]
pub struct QuantityError {
    input: String,
    reason: &'static str,
}

const SUFFIXES: &[(&str, u128)] = &[
    ("Ki", 1 << 10),
    ("Mi", 1 << 20),
    ("Gi", 1 << 30),
    ("Ti", 1 << 40),
    ("Pi", 1 << 50),
    ("Ei", 1 << 60),
    ("k", 1_000),
    ("M", 1_000_000),
    ("G", 1_000_000_000),
    ("T", 1_000_000_000_000),
    ("P", 1_000_000_000_000_000),
    ("E", 1_000_000_000_000_000_000),
];

/// Parses a size into bytes.
pub fn parse_size(input: &str) -> Result<u64, QuantityError> {
    let err = |reason| QuantityError {
        input: input.to_string(),
        reason,
    };
    let s = input.trim();
    if s.is_empty() {
        return Err(err("it is empty"));
    }
    let (number, multiplier) = SUFFIXES
        .iter()
        .find_map(|(suffix, m)| s.strip_suffix(suffix).map(|n| (n, *m)))
        .unwrap_or((s, 1));
    let (whole, frac) = match number.split_once('.') {
        Some((w, f)) => (w, f),
        None => (number, ""),
    };
    if whole.is_empty() && frac.is_empty() {
        return Err(err("it has no digits"));
    }
    if !whole.bytes().all(|b| b.is_ascii_digit()) || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return Err(err("it is not a non-negative number with an optional unit suffix"));
    }
    if frac.len() > 18 {
        return Err(err("it has too many decimal places"));
    }
    let whole: u128 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| err("it is too large"))?
    };
    let frac_digits: u128 = if frac.is_empty() {
        0
    } else {
        frac.parse().map_err(|_| err("it is too large"))?
    };
    let scale = 10u128.pow(frac.len() as u32);
    let total = whole
        .checked_mul(multiplier)
        .and_then(|w| frac_digits.checked_mul(multiplier).map(|f| (w, f)))
        .ok_or_else(|| err("it is too large"))?;
    if total.1 % scale != 0 {
        return Err(err("it is not a whole number of bytes"));
    }
    let bytes = total.0 + total.1 / scale;
    u64::try_from(bytes)
        .ok()
        .filter(|b| *b <= i64::MAX as u64)
        .ok_or_else(|| err("it is larger than 2^63-1 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_quantities_and_byte_counts() {
        assert_eq!(parse_size("8Gi"), Ok(8 << 30));
        assert_eq!(parse_size("512Mi"), Ok(512 << 20));
        assert_eq!(parse_size("4M"), Ok(4_000_000));
        assert_eq!(parse_size("1.5Gi"), Ok(3 << 29));
        assert_eq!(parse_size("1073741824"), Ok(1 << 30));
        assert_eq!(parse_size(" 64Ki "), Ok(65536));
    }

    #[test]
    fn refuses_what_is_not_a_size() {
        for bad in [
            "",
            "Gi",
            "-1",
            "1.5",
            "abc",
            "8GiB",
            "1e3",
            "99999999999Ei",
            "0.0000001Ki",
        ] {
            assert!(parse_size(bad).is_err(), "{bad} should be refused");
        }
        let msg = parse_size("8GB").unwrap_err().to_string();
        assert!(msg.contains("8Gi"), "{msg}");
    }
}
