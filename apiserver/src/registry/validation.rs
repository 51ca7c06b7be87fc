//! Syntax checks shared by every kind: Kubernetes names and labels, environment variable names,
//! image references, `host:port` addresses, quantities. Each returns `Err(detail)` with a message
//! fit for a field error.

use kvcache_api::common::Condition;
use kvcache_api::conditions::ConditionStatus;
use kvcache_api::quantity::{ParsedQuantity, Quantity};

use crate::field::{ErrorList, Path};

const DNS1123_LABEL_MAX: usize = 63;
const DNS1123_SUBDOMAIN_MAX: usize = 253;

fn is_label_body(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// A DNS-1123 label: lowercase alphanumerics and `-`, alphanumeric at both ends, at most 63.
pub fn dns1123_label(s: &str) -> Result<(), String> {
    if s.len() > DNS1123_LABEL_MAX {
        return Err(format!("must be no more than {DNS1123_LABEL_MAX} characters"));
    }
    if !is_label_body(s) {
        return Err("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name', or '123-abc')".into());
    }
    Ok(())
}

/// A DNS-1035 label: like a DNS-1123 label, but starting with a letter.
pub fn dns1035_label(s: &str) -> Result<(), String> {
    if s.len() > DNS1123_LABEL_MAX {
        return Err(format!("must be no more than {DNS1123_LABEL_MAX} characters"));
    }
    if !is_label_body(s) || !s.as_bytes()[0].is_ascii_lowercase() {
        return Err("a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name', or 'abc-123')".into());
    }
    Ok(())
}

/// A DNS-1123 subdomain: dot-separated labels, at most 253 characters.
pub fn dns1123_subdomain(s: &str) -> Result<(), String> {
    if s.len() > DNS1123_SUBDOMAIN_MAX {
        return Err(format!("must be no more than {DNS1123_SUBDOMAIN_MAX} characters"));
    }
    if s.is_empty() || !s.split('.').all(is_label_body) {
        return Err("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com')".into());
    }
    Ok(())
}

fn is_qualified_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// A qualified name (label and annotation keys, finalizers): `[prefix/]name`, the prefix a DNS
/// subdomain, the name at most 63 characters of alphanumerics, `-`, `_`, `.`.
pub fn qualified_name(s: &str) -> Result<(), String> {
    let (prefix, name) = match s.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    if let Some(p) = prefix {
        if p.is_empty() {
            return Err("prefix part must be non-empty".into());
        }
        dns1123_subdomain(p).map_err(|e| format!("prefix part {e}"))?;
    }
    if !is_qualified_name_part(name) {
        return Err("name part must consist of alphanumeric characters, '-', '_' or '.', must start and end with an alphanumeric character and be at most 63 characters (e.g. 'MyName', 'my.name', or '123-abc'), with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')".into());
    }
    Ok(())
}

/// A label value: empty, or at most 63 alphanumerics, `-`, `_`, `.`, alphanumeric at both ends.
pub fn label_value(s: &str) -> Result<(), String> {
    if s.is_empty() || is_qualified_name_part(s) {
        Ok(())
    } else {
        Err("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character and be at most 63 characters".into())
    }
}

/// The strict (C identifier) environment variable name rule.
pub fn c_identifier(s: &str) -> Result<(), String> {
    let b = s.as_bytes();
    let ok = !b.is_empty()
        && (b[0].is_ascii_alphabetic() || b[0] == b'_')
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_');
    if ok {
        Ok(())
    } else {
        Err("a valid environment variable name must consist of alphabetic characters, digits or '_', and must not start with a digit (e.g. 'MY_ENV_VAR')".into())
    }
}

/// A container image reference: `[registry[:port]/]path[:tag][@algorithm:hex]`.
pub fn image_reference(s: &str) -> Result<(), String> {
    let fail = |why: &str| {
        Err(format!(
            "not a valid image reference ({why}); use a form like registry.example.com/team/image:1.0"
        ))
    };
    if s.is_empty() {
        return fail("empty");
    }
    if s.len() > 512 {
        return fail("longer than 512 characters");
    }
    let (rest, digest) = match s.split_once('@') {
        Some((r, d)) => (r, Some(d)),
        None => (s, None),
    };
    if let Some(d) = digest {
        let Some((alg, hex)) = d.split_once(':') else {
            return fail("the digest must be algorithm:hex");
        };
        let alg_ok = !alg.is_empty()
            && alg.as_bytes()[0].is_ascii_alphabetic()
            && alg
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'+' | b'.'));
        if !alg_ok || hex.len() < 32 || !hex.bytes().all(|c| c.is_ascii_hexdigit()) {
            return fail("the digest must be algorithm:hex with at least 32 hex digits");
        }
    }
    // A tag follows the last ':' that comes after the last '/'.
    let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match rest[last_slash..].rfind(':') {
        Some(i) => (&rest[..last_slash + i], Some(&rest[last_slash + i + 1..])),
        None => (rest, None),
    };
    if let Some(t) = tag {
        let b = t.as_bytes();
        let ok = !b.is_empty()
            && b.len() <= 128
            && (b[0].is_ascii_alphanumeric() || b[0] == b'_')
            && b.iter()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'));
        if !ok {
            return fail("the tag may contain letters, digits, '_', '.', '-' and at most 128 characters");
        }
    }
    if name.is_empty() {
        return fail("no repository name");
    }
    let mut components: Vec<&str> = name.split('/').collect();
    let first = components[0];
    if components.len() > 1 && (first.contains('.') || first.contains(':') || first == "localhost") {
        if !registry_host(first) {
            return fail("the registry host is malformed");
        }
        components.remove(0);
    }
    for c in components {
        if !path_component(c) {
            return fail(
                "repository path components must be lowercase letters and digits, separated by '.', '_', '__' or '-'",
            );
        }
    }
    Ok(())
}

fn registry_host(s: &str) -> bool {
    let (host, port) = match s.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || s.starts_with('[') => (h, Some(p)),
        _ => (s, None),
    };
    if let Some(p) = port
        && (p.is_empty() || !p.bytes().all(|c| c.is_ascii_digit()))
    {
        return false;
    }
    if host.starts_with('[') {
        return host.ends_with(']') && host.len() > 2;
    }
    !host.is_empty()
        && host.split('.').all(|l| {
            let b = l.as_bytes();
            !b.is_empty()
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-')
        })
}

fn path_component(c: &str) -> bool {
    let b = c.as_bytes();
    if b.is_empty() || !b[0].is_ascii_alphanumeric() || !b[b.len() - 1].is_ascii_alphanumeric() {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        let ch = b[i];
        if ch.is_ascii_lowercase() || ch.is_ascii_digit() {
            i += 1;
            continue;
        }
        // Separators: '.', '_', '__', or one or more '-'.
        let start = i;
        while i < b.len() && matches!(b[i], b'.' | b'_' | b'-') {
            i += 1;
        }
        let sep = &c[start..i];
        let ok = sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|x| x == b'-');
        if !ok || sep.is_empty() {
            return false;
        }
    }
    true
}

/// A `host:port` address as an engine or the operator dials it. The authority must round-trip
/// exactly, so `a/b:1`, `a?b:1`, `user@h:1` and `bad host:1` are refused; IPv6 goes in brackets.
pub fn host_port(s: &str) -> Result<(), String> {
    if s.trim() != s {
        return Err("must not have leading or trailing whitespace".into());
    }
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let Some((h, p)) = rest.split_once(']') else {
            return Err("an IPv6 host must be closed with ']'".into());
        };
        let Some(p) = p.strip_prefix(':') else {
            return Err("must be host:port".into());
        };
        if h.is_empty() || !h.bytes().all(|c| c.is_ascii_hexdigit() || c == b':' || c == b'.') {
            return Err("the bracketed host must be an IPv6 address".into());
        }
        (h, p)
    } else {
        let Some((h, p)) = s.rsplit_once(':') else {
            return Err("must be host:port (missing port)".into());
        };
        if h.contains(':') {
            return Err("an IPv6 host must be written in brackets, e.g. [::1]:9003".into());
        }
        let allowed = |c: u8| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~' | b'%');
        if !h.bytes().all(allowed) {
            return Err("the host may contain only letters, digits, '-', '.', '_' and '~' (no path, query, user info or spaces)".into());
        }
        (h, p)
    };
    if host.is_empty() {
        return Err("the host must not be empty".into());
    }
    match port.parse::<u32>() {
        Ok(p) if (1..=65535).contains(&p) && port.bytes().all(|c| c.is_ascii_digit()) => Ok(()),
        _ => Err("the port must be a number from 1 to 65535".into()),
    }
}

/// Parses a quantity that must be a byte count: positive (or non-negative when `allow_zero`)
/// and at most `i64::MAX` bytes. Overflow is checked before sign. Returns the bytes.
pub fn byte_quantity(q: &Quantity, field: &Path, allow_zero: bool, errs: &mut ErrorList) -> Option<i64> {
    let parsed = match q.parse() {
        Ok(p) => p,
        Err(e) => {
            errs.invalid(field, q.as_str(), e.to_string());
            return None;
        }
    };
    let Some(bytes) = parsed.to_i64_ceil() else {
        errs.invalid(
            field,
            q.as_str(),
            "must not exceed 9223372036854775807 bytes (the largest signed 64-bit byte count)",
        );
        return None;
    };
    if bytes < 0 || (!allow_zero && bytes == 0) {
        let bound = if allow_zero {
            "greater than or equal to 0"
        } else {
            "greater than 0"
        };
        errs.invalid(field, q.as_str(), format!("must be {bound}"));
        return None;
    }
    Some(bytes)
}

/// Parses a quantity, recording a field error when it is malformed.
pub fn parse_quantity(q: &Quantity, field: &Path, errs: &mut ErrorList) -> Option<ParsedQuantity> {
    match q.parse() {
        Ok(p) => Some(p),
        Err(e) => {
            errs.invalid(field, q.as_str(), e.to_string());
            None
        }
    }
}

/// Checks a string length in bytes against a maximum.
pub fn max_len(s: &str, max: usize, field: &Path, errs: &mut ErrorList) -> bool {
    if s.len() > max {
        errs.too_long(field, max);
        false
    } else {
        true
    }
}

/// Labels (or a node selector): qualified keys and valid values.
pub fn labels<'a>(map: impl IntoIterator<Item = (&'a String, &'a String)>, field: &Path, errs: &mut ErrorList) {
    for (k, v) in map {
        if let Err(e) = qualified_name(k) {
            errs.invalid(field, k, e);
        }
        if let Err(e) = label_value(v) {
            errs.invalid(&field.key(k), v, e);
        }
    }
}

/// Longest condition message, as Kubernetes' `ValidateConditions`.
const MAX_CONDITION_MESSAGE: usize = 32 * 1024;
const MAX_CONDITION_REASON: usize = 1024;

/// `status.conditions`, as Kubernetes' `metav1validation.ValidateConditions`: each `type` a
/// qualified name appearing once, `status` one of True, False or Unknown, a CamelCase `reason`,
/// a message of at most 32 KiB, and a non-negative `observedGeneration`.
pub fn conditions(conditions: &[Condition], field: &Path, errs: &mut ErrorList) {
    let mut seen: Vec<&str> = Vec::new();
    for (i, c) in conditions.iter().enumerate() {
        let p = field.index(i);
        if c.type_.is_empty() {
            errs.required(&p.child("type"), "name the condition type, e.g. Ready");
        } else if let Err(e) = qualified_name(&c.type_) {
            errs.invalid(&p.child("type"), &c.type_, e);
        } else if seen.contains(&c.type_.as_str()) {
            errs.duplicate(&p.child("type"), &c.type_, "each condition type may appear once");
        } else {
            seen.push(&c.type_);
        }
        if ConditionStatus::parse(&c.status).is_none() {
            errs.not_supported(&p.child("status"), &c.status, &["True", "False", "Unknown"]);
        }
        let reason_ok = c.reason.chars().next().is_some_and(|ch| ch.is_ascii_alphabetic())
            && c.reason
                .chars()
                .all(|ch| ch.is_ascii_alphanumeric() || matches!(ch, '_' | ',' | ':'))
            && !c.reason.ends_with([',', ':']);
        if c.reason.is_empty() {
            errs.required(&p.child("reason"), "give the reason as one CamelCase word");
        } else if max_len(&c.reason, MAX_CONDITION_REASON, &p.child("reason"), errs) && !reason_ok {
            errs.invalid(
                &p.child("reason"),
                &c.reason,
                "a reason is one CamelCase word: letters, digits and '_', starting with a letter",
            );
        }
        max_len(&c.message, MAX_CONDITION_MESSAGE, &p.child("message"), errs);
        if c.observed_generation.is_some_and(|g| g < 0) {
            errs.invalid(
                &p.child("observedGeneration"),
                c.observed_generation,
                "must be greater than or equal to 0",
            );
        }
    }
}

/// A hit rate: a decimal from 0 to 1 with at most four decimals (`0.25`, `1.0`).
pub fn hit_rate(s: &str, field: &Path, errs: &mut ErrorList) {
    let (whole, frac) = s.split_once('.').unwrap_or((s, ""));
    let digits = |t: &str| t.bytes().all(|b| b.is_ascii_digit());
    let ok = match whole {
        "0" => frac.len() <= 4 && digits(frac) && (s == "0" || !frac.is_empty()),
        "1" => frac.len() <= 4 && frac.bytes().all(|b| b == b'0') && (s == "1" || !frac.is_empty()),
        _ => false,
    };
    if !ok {
        errs.invalid(
            field,
            s,
            "must be a decimal from 0 to 1 with at most four decimals, such as 0.25",
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_conditions_and_hit_rates() {
        let cond = |t: &str, s: &str, r: &str| Condition {
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ),
            message: String::new(),
            observed_generation: None,
            reason: r.to_owned(),
            status: s.to_owned(),
            type_: t.to_owned(),
        };
        let mut errs = ErrorList::new();
        conditions(
            &[
                cond("Ready", "True", "Serving"),
                cond("Ready", "Maybe", "bad reason"),
                cond("", "True", ""),
            ],
            &Path::new("status").child("conditions"),
            &mut errs,
        );
        let fields: Vec<&str> = errs.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "status.conditions[1].type",
                "status.conditions[1].status",
                "status.conditions[1].reason",
                "status.conditions[2].type",
                "status.conditions[2].reason"
            ]
        );
        for ok in ["0", "1", "0.25", "1.0", "0.0001", "1.0000"] {
            let mut e = ErrorList::new();
            hit_rate(ok, &Path::new("h"), &mut e);
            assert!(e.is_empty(), "{ok}");
        }
        for bad in ["", "2", "0.12345", "1.5", "-0.1", "0.", ".5", "1e-3"] {
            let mut e = ErrorList::new();
            hit_rate(bad, &Path::new("h"), &mut e);
            assert!(!e.is_empty(), "{bad}");
        }
    }

    #[test]
    fn names() {
        assert!(dns1123_label("team-a").is_ok());
        assert!(dns1123_label("Team-A").is_err());
        assert!(dns1123_label("team_a").is_err());
        assert!(dns1123_label(&"a".repeat(64)).is_err());
        assert!(dns1035_label("1abc").is_err());
        assert!(dns1035_label("abc-1").is_ok());
        assert!(dns1123_subdomain("a.b").is_ok());
        assert!(dns1123_subdomain("a..b").is_err());
        assert!(qualified_name("kubernetes.io/os").is_ok());
        assert!(qualified_name("gpustack.ai/controlled").is_ok());
        assert!(qualified_name("/x").is_err());
        assert!(qualified_name("a/b/c").is_err());
        assert!(label_value("").is_ok());
        assert!(label_value("linux").is_ok());
        assert!(label_value("-x").is_err());
        assert!(c_identifier("MY_VAR").is_ok());
        assert!(c_identifier("1BAD").is_err());
        assert!(c_identifier("A-B").is_err());
    }

    #[test]
    fn images() {
        for ok in [
            "gpustack/mirrored-mooncake:0.3.13.post1-cpu",
            "repo",
            "repo:latest",
            "registry.example.com:5000/team/image:1.0",
            "localhost/x",
            "repo@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "a__b/c-d/e.f:tag_1",
        ] {
            assert!(image_reference(ok).is_ok(), "{ok}");
        }
        for bad in [
            "not a valid image!",
            "UPPER/case",
            "repo:",
            ":tag",
            "repo@sha256:xyz",
            "a//b",
            "-a",
        ] {
            assert!(image_reference(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn addresses() {
        for ok in ["[::1]:9003", "h.example:50051", "10.0.0.1:1", "h:65535"] {
            assert!(host_port(ok).is_ok(), "{ok}");
        }
        for bad in [
            " h:1",
            "h:1 ",
            "h",
            "h:0",
            "h:65536",
            "h:x",
            ":1",
            "a/b:1",
            "a?b:1",
            "a#b:1",
            "u@h:1",
            "bad host:1",
            "::1:9003",
            "h:+1",
        ] {
            assert!(host_port(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn byte_quantities() {
        let p = Path::new("q");
        let mut e = ErrorList::new();
        assert_eq!(byte_quantity(&Quantity::new("8Gi"), &p, false, &mut e), Some(8 << 30));
        assert!(byte_quantity(&Quantity::new("0"), &p, false, &mut e).is_none());
        assert!(byte_quantity(&Quantity::new("0"), &p, true, &mut e).is_some());
        assert!(byte_quantity(&Quantity::new("-9Ei"), &p, false, &mut e).is_none());
        assert!(
            e.0.last().unwrap().detail.contains("must not exceed"),
            "overflow is checked before sign"
        );
    }
}
