//! What the command-line configurations share: the error a check reports ([`ConfigError`]), the
//! value parsers and their inverses (sizes, durations, `--tenant` entries, `--fast-listen`), and
//! the generic parts of `parse_flags`/`flag_names` that [`LeaderConfig`] and [`MemberConfig`]
//! expose.
//!
//! The flags themselves are defined once, as the fields of those two clap structs; the list of
//! long flag names comes from clap's own definition (`clap::Args::augment_args`), so it cannot
//! drift from what the binary accepts.
//!
//! [`LeaderConfig`]: crate::leader::LeaderConfig
//! [`MemberConfig`]: crate::member::MemberConfig

use std::ffi::OsString;
use std::net::SocketAddr;
use std::time::Duration;

use kvcache_units::{format_bytes, format_duration, parse_bytes};

use crate::proto::TenantEntry;

/// A configuration the store cannot run with: which flag, and what to do about it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--{flag}: {message}")]
pub struct ConfigError {
    /// the long flag name, without the dashes
    pub flag: &'static str,
    pub message: String,
}

impl ConfigError {
    pub fn new(flag: &'static str, message: impl Into<String>) -> Self {
        Self {
            flag,
            message: message.into(),
        }
    }
}

/// Parses a size flag (`8Gi`, `512Mi`, a byte count).
pub fn parse_size(s: &str) -> Result<u64, String> {
    parse_bytes(s).map_err(|e| e.to_string())
}

/// The spelling [`parse_size`] reads back to `bytes`.
pub fn format_size(bytes: u64) -> String {
    i64::try_from(bytes).map_or_else(|_| bytes.to_string(), format_bytes)
}

/// The spelling `kvcache_units::parse_duration` reads back to `d` (exact to the microsecond,
/// which is all the command line can express).
pub fn format_time(d: Duration) -> String {
    format_duration(d)
}

/// Parses a `--tenant` (or `tenants --set`) entry, `NAME=CEILING:BLOCK_SIZE:DTYPE`, then for
/// each credential the tenant's calls may carry `,sha256=HEX` (its SHA-256, 64 hex digits).
pub fn parse_tenant(s: &str) -> Result<TenantEntry, String> {
    let form = "write NAME=CEILING:BLOCK_SIZE:DTYPE[,sha256=HEX…], e.g. team-a=8Gi:64:bfloat16";
    let Some((name, rest)) = s.split_once('=') else {
        return Err(format!("{s:?} has no '='; {form}"));
    };
    let mut credentials = rest.split(',');
    let rest = credentials.next().unwrap_or_default();
    let mut credential_sha256 = Vec::new();
    for c in credentials {
        let hex = c
            .strip_prefix("sha256=")
            .ok_or_else(|| format!("{s:?}: {c:?} is not sha256=HEX; {form}"))?;
        credential_sha256.push(bytes::Bytes::from(parse_sha256(hex).ok_or_else(|| {
            format!("{s:?}: {hex:?} is not a SHA-256 (64 hex digits, e.g. from `sha256sum`)")
        })?));
    }
    let mut parts = rest.splitn(3, ':');
    let (Some(c), Some(b), Some(d)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(format!(
            "{s:?} has fewer than three ':'-separated parts after the name; {form}"
        ));
    };
    let ceiling = parse_bytes(c).map_err(|e| format!("{s:?}: the ceiling is not a size ({e})"))?;
    let block_size = b
        .parse()
        .map_err(|_| format!("{s:?}: block size {b:?} is not a whole number of tokens; {form}"))?;
    Ok(TenantEntry {
        name: name.to_string(),
        ceiling,
        block_size,
        dtype: d.to_string(),
        credential_sha256,
        // a tenant given on the command line is in no pool, and held by no Binding
        pool: String::new(),
        uid: String::new(),
    })
}

fn parse_sha256(hex: &str) -> Option<Vec<u8>> {
    if hex.len() != 64 || !hex.is_ascii() {
        return None;
    }
    (0..32)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok())
        .collect()
}

/// The spelling [`parse_tenant`] reads back to `e`.
pub fn format_tenant(e: &TenantEntry) -> String {
    let mut s = format!("{}={}:{}:{}", e.name, format_size(e.ceiling), e.block_size, e.dtype);
    for h in &e.credential_sha256 {
        s.push_str(",sha256=");
        for b in h.iter() {
            s.push_str(&format!("{b:02x}"));
        }
    }
    s
}

/// `--fast-listen`: no port, or a given address. Absent, the leader picks the gRPC port + 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FastListen {
    Off,
    At(SocketAddr),
}

impl FastListen {
    pub fn parse(s: &str) -> Result<Self, String> {
        if s == "off" {
            return Ok(Self::Off);
        }
        s.parse().map(Self::At).map_err(|_| {
            format!("{s:?} is neither `off` nor a HOST:PORT address such as 127.0.0.1:50052 (IP addresses only)")
        })
    }
}

impl std::fmt::Display for FastListen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Off => f.write_str("off"),
            Self::At(a) => write!(f, "{a}"),
        }
    }
}

/// The long names (without dashes) of every flag `A` defines, as clap sees them.
pub fn long_flags<A: clap::Args>() -> Vec<String> {
    A::augment_args(clap::Command::new("kv-store"))
        .get_arguments()
        .filter_map(|a| a.get_long().map(str::to_owned))
        .collect()
}

/// Parses flags alone (no program or subcommand name) into `A`, with clap's own errors.
pub fn parse_flags<A, I, T>(args: I) -> Result<A, clap::Error>
where
    A: clap::Args + clap::FromArgMatches,
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let matches = A::augment_args(clap::Command::new("kv-store").no_binary_name(true)).try_get_matches_from(args)?;
    A::from_arg_matches(&matches)
}

/// Pushes `--flag value` onto `out`.
pub fn push(out: &mut Vec<String>, flag: &str, value: impl std::fmt::Display) {
    out.push(format!("--{flag}"));
    out.push(value.to_string());
}

/// Checks that `v` is a share between 0 and 1.
pub fn share(flag: &'static str, v: f64, what: &str) -> Result<(), ConfigError> {
    if (0.0..=1.0).contains(&v) {
        return Ok(());
    }
    Err(ConfigError::new(
        flag,
        format!("{v} is not a share of capacity; give a number between 0 and 1 ({what})"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenants_sizes_and_fast_listen_read_back_what_they_write() {
        let e = parse_tenant("team-a=8Gi:64:bfloat16").unwrap();
        assert_eq!((e.name.as_str(), e.ceiling, e.block_size), ("team-a", 8 << 30, 64));
        assert_eq!(format_tenant(&e), "team-a=8Gi:64:bfloat16");
        let odd = parse_tenant("x=1000:1:fp8:e4m3").unwrap();
        assert_eq!(odd.dtype, "fp8:e4m3", "the dtype keeps its own colons");
        assert_eq!(parse_tenant(&format_tenant(&odd)).unwrap(), odd);
        let sha = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
        let bound = parse_tenant(&format!(
            "team-a=8Gi:64:bfloat16,sha256={sha},sha256={}",
            "0".repeat(64)
        ))
        .unwrap();
        assert_eq!(bound.credential_sha256.len(), 2);
        assert_eq!(bound.credential_sha256[0][..2], [0x9f, 0x86]);
        assert_eq!(parse_tenant(&format_tenant(&bound)).unwrap(), bound);
        for bad in [
            "team-a",
            "a=8Gi:64",
            "a=lots:64:bf16",
            "a=8Gi:-1:bf16",
            "a=1:1:x,sha256=12",
            "a=1:1:x,md5=00",
        ] {
            let err = parse_tenant(bad).unwrap_err();
            assert!(err.contains(bad), "{err}");
        }
        for n in [0, 1, 1000, 1536 << 20, u64::MAX] {
            assert_eq!(
                format_size(n)
                    .parse::<u64>()
                    .ok()
                    .or_else(|| parse_size(&format_size(n)).ok()),
                Some(n)
            );
        }
        assert_eq!(FastListen::parse("off"), Ok(FastListen::Off));
        let at = FastListen::parse("127.0.0.1:7").unwrap();
        assert_eq!(FastListen::parse(&at.to_string()), Ok(at));
        assert!(FastListen::parse("localhost:7").unwrap_err().contains("neither `off`"));
    }
}
