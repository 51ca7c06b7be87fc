//! The protobuf bodies kubectl 1.33 sends for the core types direct mode serves — a Namespace
//! (`kubectl create namespace`) and the self-reviews (`kubectl auth can-i`) — decoded by hand into
//! the JSON their handlers read. Only the fields those handlers read are decoded; every other
//! field is skipped. Field numbers follow the Kubernetes `generated.proto` files
//! (`k8s.io/api/core/v1`, `k8s.io/api/authorization/v1`, `k8s.io/apimachinery/pkg/runtime`).
//!
//! A body is the envelope `k8s\0` + `runtime.Unknown{typeMeta, raw}`; malformed input of any
//! shape is an error, never a panic.

use serde_json::{Map, Value, json};

/// The content type of a Kubernetes protobuf body.
pub const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";

const MAGIC: &[u8] = b"k8s\0";

/// One field's value on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wire<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed,
}

fn varint(buf: &[u8], at: &mut usize) -> Result<u64, String> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *buf.get(*at).ok_or("a varint runs past the end")?;
        *at += 1;
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err("a varint is longer than 10 bytes".into())
}

/// Every field of one message, in order.
fn fields(buf: &[u8]) -> Result<Vec<(u64, Wire<'_>)>, String> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < buf.len() {
        let tag = varint(buf, &mut at)?;
        let value = match tag & 7 {
            0 => Wire::Varint(varint(buf, &mut at)?),
            1 | 5 => {
                at += if tag & 7 == 1 { 8 } else { 4 };
                Wire::Fixed
            }
            2 => {
                let len = usize::try_from(varint(buf, &mut at)?).map_err(|_| "a length does not fit")?;
                let end = at
                    .checked_add(len)
                    .filter(|e| *e <= buf.len())
                    .ok_or("a field runs past the end")?;
                let b = &buf[at..end];
                at = end;
                Wire::Bytes(b)
            }
            w => return Err(format!("wire type {w} is not supported")),
        };
        if at > buf.len() {
            return Err("a field runs past the end".into());
        }
        out.push((tag >> 3, value));
    }
    Ok(out)
}

/// The last value of string field `n` (protobuf's rule for a repeated scalar read once).
fn string(msg: &[(u64, Wire<'_>)], n: u64) -> Result<Option<String>, String> {
    let mut s = None;
    for (f, w) in msg {
        if *f == n
            && let Wire::Bytes(b) = w
        {
            s = Some(String::from_utf8(b.to_vec()).map_err(|_| format!("field {n} is not UTF-8"))?);
        }
    }
    Ok(s)
}

/// The bytes of message field `n`, if present.
fn message<'a>(msg: &[(u64, Wire<'a>)], n: u64) -> Option<&'a [u8]> {
    msg.iter().rev().find_map(|(f, w)| match w {
        Wire::Bytes(b) if *f == n => Some(*b),
        _ => None,
    })
}

/// A `map<string, string>` field `n`: entries `{1: key, 2: value}`.
fn string_map(msg: &[(u64, Wire<'_>)], n: u64) -> Result<Map<String, Value>, String> {
    let mut out = Map::new();
    for (f, w) in msg {
        if *f == n
            && let Wire::Bytes(b) = w
        {
            let entry = fields(b)?;
            out.insert(
                string(&entry, 1)?.unwrap_or_default(),
                Value::String(string(&entry, 2)?.unwrap_or_default()),
            );
        }
    }
    Ok(out)
}

/// The string fields `names[i]` = field `i + 1` of a message, where present.
fn strings(buf: &[u8], names: &[&str]) -> Result<Map<String, Value>, String> {
    let msg = fields(buf)?;
    let mut out = Map::new();
    for (i, name) in names.iter().enumerate() {
        if let Some(s) = string(&msg, i as u64 + 1)? {
            out.insert((*name).to_owned(), Value::String(s));
        }
    }
    Ok(out)
}

/// `ObjectMeta`: name (1), generateName (2), namespace (3), labels (11), annotations (12).
fn object_meta(buf: &[u8]) -> Result<Value, String> {
    let msg = fields(buf)?;
    let mut m = strings(buf, &["name", "generateName", "namespace"])?;
    for (n, key) in [(11, "labels"), (12, "annotations")] {
        let map = string_map(&msg, n)?;
        if !map.is_empty() {
            m.insert(key.into(), Value::Object(map));
        }
    }
    Ok(Value::Object(m))
}

/// The type and the serialized object of an envelope.
fn envelope(body: &[u8]) -> Result<(String, String, &[u8]), String> {
    let unknown = body.strip_prefix(MAGIC).ok_or("a protobuf body starts with k8s\\0")?;
    let msg = fields(unknown)?;
    let type_meta = fields(message(&msg, 1).unwrap_or_default())?;
    Ok((
        string(&type_meta, 1)?.unwrap_or_default(),
        string(&type_meta, 2)?.unwrap_or_default(),
        message(&msg, 2).unwrap_or_default(),
    ))
}

/// A protobuf body of `kind` (`Namespace`, `SelfSubjectAccessReview`, `SelfSubjectRulesReview`)
/// as the JSON the handler reads.
pub fn decode(body: &[u8], kind: &str) -> Result<Value, String> {
    let (api_version, sent, raw) = envelope(body)?;
    if sent != kind {
        return Err(format!("the body is a {sent:?}, not a {kind}"));
    }
    let obj = fields(raw)?;
    let metadata = object_meta(message(&obj, 1).unwrap_or_default())?;
    let spec_bytes = message(&obj, 2).unwrap_or_default();
    let spec = match kind {
        "Namespace" => json!({}),
        "SelfSubjectRulesReview" => Value::Object(strings(spec_bytes, &["namespace"])?),
        "SelfSubjectAccessReview" => {
            let s = fields(spec_bytes)?;
            let mut spec = Map::new();
            if let Some(r) = message(&s, 1) {
                let names = [
                    "namespace",
                    "verb",
                    "group",
                    "version",
                    "resource",
                    "subresource",
                    "name",
                ];
                spec.insert("resourceAttributes".into(), Value::Object(strings(r, &names)?));
            }
            if let Some(n) = message(&s, 2) {
                spec.insert(
                    "nonResourceAttributes".into(),
                    Value::Object(strings(n, &["path", "verb"])?),
                );
            }
            Value::Object(spec)
        }
        other => return Err(format!("{other} bodies are not read as protobuf")),
    };
    Ok(json!({"apiVersion": api_version, "kind": kind, "metadata": metadata, "spec": spec}))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(n: u64, b: &[u8]) -> Vec<u8> {
        let mut out = vec![u8::try_from(n << 3 | 2).unwrap(), u8::try_from(b.len()).unwrap()];
        out.extend_from_slice(b);
        out
    }

    fn wrap(api_version: &str, kind: &str, raw: &[u8]) -> Vec<u8> {
        let type_meta = [field(1, api_version.as_bytes()), field(2, kind.as_bytes())].concat();
        [MAGIC.to_vec(), field(1, &type_meta), field(2, raw)].concat()
    }

    #[test]
    fn a_namespace_and_an_access_review_read_as_kubectl_sends_them() {
        let label = [field(1, b"tier"), field(2, b"gold")].concat();
        let meta = [field(1, b"team-a"), field(11, &label)].concat();
        let ns = decode(&wrap("v1", "Namespace", &field(1, &meta)), "Namespace").unwrap();
        assert_eq!(ns["metadata"], json!({"name": "team-a", "labels": {"tier": "gold"}}));

        let attrs = [
            field(1, b"team-a"),
            field(2, b"create"),
            field(3, b"worker.gpustack.ai"),
            field(5, b"kvcachepoolbindings"),
        ]
        .concat();
        let review = [field(1, &[]), field(2, &field(1, &attrs))].concat();
        let v = decode(
            &wrap("authorization.k8s.io/v1", "SelfSubjectAccessReview", &review),
            "SelfSubjectAccessReview",
        )
        .unwrap();
        assert_eq!(
            v["spec"]["resourceAttributes"],
            json!({"namespace": "team-a", "verb": "create", "group": "worker.gpustack.ai", "resource": "kvcachepoolbindings"})
        );
    }

    #[test]
    fn malformed_bodies_are_errors() {
        for body in [
            &b""[..],
            b"k8s",
            b"k8s\0\x0a\xff",
            b"k8s\0\x0a\x05ab",
            b"k8s\0\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff",
            b"k8s\0\x0b",
        ] {
            assert!(decode(body, "Namespace").is_err(), "{body:?}");
        }
        let lease = wrap("coordination.k8s.io/v1", "Lease", &[]);
        assert!(decode(&lease, "Namespace").unwrap_err().contains("not a Namespace"));
    }
}
