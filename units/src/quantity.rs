//! Kubernetes quantities, parsed exactly: `1Gi` and `1024Mi` compare equal, and a byte count above
//! `i64::MAX` is reported as an overflow rather than silently rounded.
//!
//! [`ParsedQuantity`] reads the whole Kubernetes syntax (`8Gi`, `1.5G`, `100m`, `1e3`).
//! [`parse_bytes`] is the stricter reading a size takes on a command line (a whole, non-negative
//! number of bytes), and [`format_bytes`] the canonical spelling a size is written back in.

use std::cmp::Ordering;

/// Why a quantity string does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$' (for example 8Gi, 512Mi, 1e9): {0}"
)]
pub struct QuantityError(pub &'static str);

/// An exact quantity: `sign × mantissa × 10^exp10 × 2^pow2`.
///
/// The mantissa holds at most 38 significant digits; longer inputs are refused as malformed,
/// which no real quantity needs.
#[derive(Clone, Copy, Debug)]
pub struct ParsedQuantity {
    negative: bool,
    mantissa: u128,
    exp10: i32,
    pow2: u32,
}

impl ParsedQuantity {
    pub fn parse(input: &str) -> Result<Self, QuantityError> {
        if input.is_empty() {
            return Err(QuantityError("the value is empty"));
        }
        let (negative, rest) = split_sign(input);
        // Split the number from the suffix.
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, suffix) = rest.split_at(num_end);
        let (mut mantissa, digits_exp10) = decimal(number)?;
        let (suffix_exp10, pow2) = scale(suffix)?;
        let mut exp10 = digits_exp10 + suffix_exp10;
        if mantissa == 0 {
            return Ok(ParsedQuantity {
                negative: false,
                mantissa: 0,
                exp10: 0,
                pow2: 0,
            });
        }
        // Normalise trailing zeros into the exponent so equal values look alike.
        while mantissa.is_multiple_of(10) {
            mantissa /= 10;
            exp10 += 1;
        }
        Ok(ParsedQuantity {
            negative,
            mantissa,
            exp10,
            pow2,
        })
    }

    pub fn is_zero(&self) -> bool {
        self.mantissa == 0
    }

    pub fn is_negative(&self) -> bool {
        self.negative && self.mantissa != 0
    }

    pub fn is_positive(&self) -> bool {
        !self.negative && self.mantissa != 0
    }

    /// The value rounded up to a whole number (as Kubernetes' `Value()` does), or `None` when it
    /// does not fit in an `i64`.
    pub fn to_i64_ceil(&self) -> Option<i64> {
        if self.mantissa == 0 {
            return Some(0);
        }
        let (whole, fraction) = if self.exp10 >= 0 {
            let v = self
                .mantissa
                .checked_mul(checked_pow10(self.exp10 as u32)?)?
                .checked_mul(1u128.checked_shl(self.pow2)?)?;
            (v, false)
        } else {
            let num = self.mantissa.checked_mul(1u128.checked_shl(self.pow2)?)?;
            match checked_pow10(self.exp10.unsigned_abs()) {
                Some(div) => (num / div, num % div != 0),
                // 10^k beyond u128 exceeds any numerator: the value is a pure fraction.
                None => (0, true),
            }
        };
        signed_ceil(self.negative, whole, fraction)
    }

    /// The value when it is a whole number that fits in an `i64`.
    pub fn to_whole_i64(&self) -> Option<i64> {
        let n = self.to_i64_ceil()?;
        let exact = ParsedQuantity {
            negative: n < 0,
            mantissa: u128::from(n.unsigned_abs()),
            exp10: 0,
            pow2: 0,
        };
        (exact == *self).then_some(n)
    }

    /// A lossy floating-point view, for messages and ordering of values beyond `u128`.
    pub fn as_f64(&self) -> f64 {
        let v = self.mantissa as f64 * 10f64.powi(self.exp10) * 2f64.powi(self.pow2 as i32);
        if self.negative { -v } else { v }
    }

    /// Exact comparison where the values fit in 128-bit arithmetic, else by magnitude.
    pub fn cmp_value(&self, other: &ParsedQuantity) -> Ordering {
        let sa = self.sign();
        let sb = other.sign();
        if sa != sb {
            return sa.cmp(&sb);
        }
        let magnitude = match (self.scaled(other), other.scaled(self)) {
            (Some(a), Some(b)) => a.cmp(&b),
            _ => self
                .as_f64()
                .abs()
                .partial_cmp(&other.as_f64().abs())
                .unwrap_or(Ordering::Equal),
        };
        if sa < 0 { magnitude.reverse() } else { magnitude }
    }

    fn sign(&self) -> i8 {
        if self.mantissa == 0 {
            0
        } else if self.negative {
            -1
        } else {
            1
        }
    }

    /// |self| expressed in units of 10^min(exp10) so that two values can be compared exactly.
    fn scaled(&self, other: &ParsedQuantity) -> Option<u128> {
        let base = self.exp10.min(other.exp10);
        let shift = (self.exp10 - base) as u32;
        self.mantissa
            .checked_mul(checked_pow10(shift)?)?
            .checked_mul(1u128.checked_shl(self.pow2)?)
    }
}

impl PartialEq for ParsedQuantity {
    fn eq(&self, other: &Self) -> bool {
        self.cmp_value(other) == Ordering::Equal
    }
}

fn checked_pow10(exp: u32) -> Option<u128> {
    10u128.checked_pow(exp)
}

fn signed_ceil(negative: bool, whole: u128, has_fraction: bool) -> Option<i64> {
    if negative {
        // -2.5 rounds up to -2.
        let w = i64::try_from(whole).ok()?;
        Some(-w)
    } else {
        let w = if has_fraction { whole.checked_add(1)? } else { whole };
        i64::try_from(w).ok()
    }
}

/// Why a size was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid size {input:?}: {reason}; write a byte count or a quantity such as 8Gi, 512Mi, 4M or 1e9")]
pub struct BytesError {
    input: String,
    reason: String,
}

/// A leading `-` or `+`, and the rest.
fn split_sign(s: &str) -> (bool, &str) {
    match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    }
}

/// The digits (and at most one point) of a number: its significant digits and their power of
/// ten.
fn decimal(number: &str) -> Result<(u128, i32), QuantityError> {
    if number.is_empty() || number == "." {
        return Err(QuantityError("no digits before the suffix"));
    }
    let mut mantissa: u128 = 0;
    let mut exp10: i32 = 0;
    let mut seen_dot = false;
    let mut digits = 0;
    for c in number.chars() {
        if c == '.' {
            if seen_dot {
                return Err(QuantityError("more than one decimal point"));
            }
            seen_dot = true;
            continue;
        }
        let d = u128::from(c as u8 - b'0');
        if mantissa == 0 && d == 0 {
            if seen_dot {
                exp10 -= 1;
            }
            continue;
        }
        digits += 1;
        if digits > 38 {
            return Err(QuantityError("too many significant digits"));
        }
        mantissa = mantissa * 10 + d;
        if seen_dot {
            exp10 -= 1;
        }
    }
    Ok((mantissa, exp10))
}

/// A suffix's power of ten and power of two: a binary (`Ki`..`Ei`) or decimal (`n`..`E`) SI
/// suffix, or a decimal exponent (`e3`, `E-2`).
fn scale(suffix: &str) -> Result<(i32, u32), QuantityError> {
    Ok(match suffix {
        "" => (0, 0),
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        "n" => (-9, 0),
        "u" => (-6, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        other => (exponent(other)?, 0),
    })
}

/// A decimal exponent suffix (`e3`, `E-2`, at most 1000 either way).
fn exponent(suffix: &str) -> Result<i32, QuantityError> {
    let exp = suffix
        .strip_prefix('e')
        .or_else(|| suffix.strip_prefix('E'))
        .ok_or(QuantityError("unknown suffix"))?;
    let (negative, digits) = split_sign(exp);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(QuantityError("the exponent is not a whole number"));
    }
    let e: i32 = digits
        .parse()
        .ok()
        .filter(|e| *e <= 1000)
        .ok_or(QuantityError("the exponent is out of range"))?;
    Ok(if negative { -e } else { e })
}

/// A size in bytes: any quantity that is a whole, non-negative number of bytes no larger than
/// `i64::MAX` (`8Gi`, `1e9`, `1.5Gi`, `1073741824`). Surrounding whitespace is ignored.
pub fn parse_bytes(input: &str) -> Result<u64, BytesError> {
    let err = |reason: &str| BytesError {
        input: input.to_owned(),
        reason: reason.to_owned(),
    };
    let q = ParsedQuantity::parse(input.trim()).map_err(|e| err(e.0))?;
    if q.is_negative() {
        return Err(err("it is negative"));
    }
    match q.to_whole_i64() {
        Some(n) => Ok(n.unsigned_abs()),
        None if q.to_i64_ceil().is_none() => Err(err("it is larger than 2^63-1 bytes")),
        None => Err(err("it is not a whole number of bytes")),
    }
}

/// The canonical binary-SI spelling of a byte count: the largest power-of-1024 suffix that
/// divides it exactly (`8589934592` → `8Gi`, `1536Mi` stays `1536Mi`, `1000` stays `1000`).
pub fn format_bytes(bytes: i64) -> String {
    const SUFFIXES: [&str; 7] = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    if bytes == 0 {
        return "0".to_owned();
    }
    let mut value = bytes;
    let mut idx = 0;
    while idx + 1 < SUFFIXES.len() && value % 1024 == 0 {
        value /= 1024;
        idx += 1;
    }
    format!("{value}{}", SUFFIXES[idx])
}

/// A byte count as a person reads it in a column: exact when that is short (`8Gi`, `1536Mi`),
/// else rounded in the largest binary-SI unit it reaches, with one decimal below 10
/// (`26347104` → `25Mi`, `1610612737` → `1.5Gi`, `1023` → `1023`).
pub fn approx_bytes(bytes: u64) -> String {
    const SUFFIXES: [&str; 7] = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    let exact = format_bytes(i64::try_from(bytes).unwrap_or(i64::MAX));
    if exact.trim_end_matches(char::is_alphabetic).len() <= 4 {
        return exact;
    }
    let mut idx = 0;
    let mut unit = 1u64;
    while idx + 1 < SUFFIXES.len() && bytes / unit >= 1024 {
        unit *= 1024;
        idx += 1;
    }
    let value = bytes as f64 / unit as f64;
    let shown = if value < 10.0 {
        let one = format!("{value:.1}");
        one.strip_suffix(".0").map(str::to_owned).unwrap_or(one)
    } else {
        format!("{value:.0}")
    };
    format!("{shown}{}", SUFFIXES[idx])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn approximate_bytes_read_as_quantities() {
        for (bytes, shown) in [
            (0, "0"),
            (1023, "1023"),
            (26_347_104, "25Mi"),
            (1_610_612_737, "1.5Gi"),
            (8 << 30, "8Gi"),
            (1536 << 20, "1536Mi"),
            (10_000, "9.8Ki"),
            (u64::MAX, "16Ei"),
        ] {
            assert_eq!(approx_bytes(bytes), shown, "{bytes}");
        }
    }

    fn bytes(s: &str) -> Option<i64> {
        ParsedQuantity::parse(s).expect(s).to_i64_ceil()
    }

    #[test]
    fn parses_binary_and_decimal_suffixes() {
        assert_eq!(bytes("8Gi"), Some(8 << 30));
        assert_eq!(bytes("1.5Gi"), Some(3 << 29));
        assert_eq!(bytes("16Mi"), Some(16 << 20));
        assert_eq!(bytes("1k"), Some(1000));
        assert_eq!(bytes("1e3"), Some(1000));
        assert_eq!(bytes("1E3"), Some(1000));
        assert_eq!(bytes("100m"), Some(1));
        assert_eq!(bytes("0"), Some(0));
        assert_eq!(bytes("-1Gi"), Some(-(1 << 30)));
        assert_eq!(bytes(".5Ki"), Some(512));
        assert_eq!(bytes("9223372036854775807"), Some(i64::MAX));
        let whole = |s: &str| ParsedQuantity::parse(s).unwrap().to_whole_i64();
        assert_eq!(whole("2"), Some(2));
        assert_eq!(whole("1k"), Some(1000));
        assert_eq!(whole("1.5"), None);
        assert_eq!(whole("500m"), None);
    }

    #[test]
    fn overflow_is_reported_not_rounded() {
        assert_eq!(bytes("9Ei"), None);
        assert_eq!(bytes("9223372036854775808"), None);
        assert_eq!(bytes("8Ei"), None);
        assert_eq!(bytes("7Ei"), Some(7 << 60));
        assert_eq!(bytes("1e100"), None);
    }

    #[test]
    fn malformed_values_are_refused() {
        for bad in ["", "Gi", "1.2.3", "1Xi", "1e", "1e1.5", "abc", "1 Gi", "--1", "."] {
            assert!(ParsedQuantity::parse(bad).is_err(), "{bad:?} should not parse");
        }
    }

    #[test]
    fn semantic_equality_and_order() {
        let q = |s: &str| ParsedQuantity::parse(s).unwrap();
        assert_eq!(q("1Gi"), q("1024Mi"));
        assert_eq!(q("1Ti"), q("1099511627776"));
        assert_eq!(q("20Ti"), q("21990232555520"));
        assert_eq!(q("1000"), q("1k"));
        assert_ne!(q("1G"), q("1Gi"));
        assert_eq!(q("1G").cmp_value(&q("1Gi")), Ordering::Less);
        assert_eq!(q("-1").cmp_value(&q("0")), Ordering::Less);
        assert_eq!(q("-2").cmp_value(&q("-1")), Ordering::Less);
        assert_eq!(q("0.5").cmp_value(&q("500m")), Ordering::Equal);
    }

    #[test]
    fn canonical_binary_spelling() {
        assert_eq!(format_bytes(8 << 30), "8Gi");
        assert_eq!(format_bytes(1536 << 20), "1536Mi");
        assert_eq!(format_bytes(1000), "1000");
        assert_eq!(format_bytes(0), "0");
    }

    #[test]
    fn sizes_are_whole_non_negative_byte_counts() {
        assert_eq!(parse_bytes("8Gi"), Ok(8 << 30));
        assert_eq!(parse_bytes("512Mi"), Ok(512 << 20));
        assert_eq!(parse_bytes("4M"), Ok(4_000_000));
        assert_eq!(parse_bytes("1.5Gi"), Ok(3 << 29));
        assert_eq!(parse_bytes("1073741824"), Ok(1 << 30));
        assert_eq!(parse_bytes(" 64Ki "), Ok(65536));
        // What the API accepts, a flag accepts too.
        assert_eq!(parse_bytes("1e9"), Ok(1_000_000_000));
        assert_eq!(parse_bytes("1E3"), Ok(1000));
        for bad in [
            "",
            "Gi",
            "-1",
            "1.5",
            "abc",
            "8GiB",
            "100m",
            "99999999999Ei",
            "0.0000001Ki",
            "1 Gi",
        ] {
            assert!(parse_bytes(bad).is_err(), "{bad} should be refused");
        }
        let msg = parse_bytes("8GB").unwrap_err().to_string();
        assert!(msg.contains("8Gi"), "{msg}");
        assert!(
            parse_bytes("1.5")
                .unwrap_err()
                .to_string()
                .contains("whole number of bytes")
        );
        assert!(parse_bytes("9Ei").unwrap_err().to_string().contains("2^63-1"));
    }
}
