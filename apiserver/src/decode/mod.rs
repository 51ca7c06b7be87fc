//! Decoding request bodies into typed objects, with Kubernetes' `fieldValidation` semantics.
//!
//! Bodies are first parsed by [`bounded`] (depth and size bounded, duplicate keys noted), then
//! decoded into the types:
//!
//! - Unknown fields are found while decoding (every field the types skip is reported with its
//!   path). `Strict` refuses them (400, `strict decoding error: unknown field "spec.foo"`),
//!   `Warn` drops them and returns one warning each, `Ignore` drops them silently. They are never
//!   stored. Duplicate keys are treated the same way (`duplicate field "metadata.name"`): the
//!   last value is the one kept.
//! - A value of the wrong shape where the path is known (an enum value outside its set, a string
//!   where a number belongs) is a field error (422) naming the path; malformed JSON or YAML is a
//!   400.

pub mod bounded;
pub mod protobuf;

use serde::de::DeserializeOwned;

pub use self::bounded::{BoundedError, Parsed};
use crate::field::{ErrorList, ErrorType, FieldError, Path};

/// The `fieldValidation` query parameter.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FieldValidation {
    Strict,
    /// The default of kube-apiserver 1.27 and later.
    #[default]
    Warn,
    Ignore,
}

impl FieldValidation {
    pub fn parse(s: &str) -> Option<FieldValidation> {
        match s {
            "Strict" => Some(FieldValidation::Strict),
            "Warn" => Some(FieldValidation::Warn),
            "Ignore" => Some(FieldValidation::Ignore),
            _ => None,
        }
    }
}

/// A decoded value and the warnings decoding produced.
#[derive(Debug)]
pub struct Decoded<T> {
    pub value: T,
    pub warnings: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// The body is not well-formed, or (Strict) it has unknown or duplicate fields.
    #[error("{0}")]
    BadRequest(String),
    /// A field has a value of the wrong shape.
    #[error("{0}")]
    Invalid(ErrorList),
    /// The body would build a value past the bounds (413).
    #[error("{0}")]
    TooLarge(String),
}

impl From<BoundedError> for DecodeError {
    fn from(e: BoundedError) -> Self {
        match e {
            BoundedError::TooLarge => DecodeError::TooLarge(e.to_string()),
            BoundedError::Syntax(m) => DecodeError::BadRequest(m),
            BoundedError::TooDeep(_) => DecodeError::BadRequest(e.to_string()),
        }
    }
}

/// Decodes a JSON body.
pub fn from_json<T: DeserializeOwned>(bytes: &[u8], mode: FieldValidation) -> Result<Decoded<T>, DecodeError> {
    from_parsed(bounded::json(bytes)?, mode)
}

/// Decodes a YAML document (as kubectl's manifests and `apply-patch+yaml` bodies are).
pub fn from_yaml<T: DeserializeOwned>(text: &str, mode: FieldValidation) -> Result<Decoded<T>, DecodeError> {
    from_parsed(bounded::yaml(text)?, mode)
}

/// Decodes a parsed body: unknown fields and duplicate keys are judged together by `mode`.
pub fn from_parsed<T: DeserializeOwned>(parsed: Parsed, mode: FieldValidation) -> Result<Decoded<T>, DecodeError> {
    decode_value(parsed.value, &parsed.duplicates, mode)
}

/// Decodes an already-built JSON value (for example the result of applying a patch).
pub fn from_value<T: DeserializeOwned>(
    value: serde_json::Value,
    mode: FieldValidation,
) -> Result<Decoded<T>, DecodeError> {
    decode_value(value, &[], mode)
}

fn decode_value<T: DeserializeOwned>(
    value: serde_json::Value,
    duplicates: &[String],
    mode: FieldValidation,
) -> Result<Decoded<T>, DecodeError> {
    // Fast path: no path tracking (only an error needs the path); unknown fields are still
    // collected. A failure is decoded again with tracking to name the field.
    let mut unknown = Vec::new();
    match serde_ignored::deserialize(&value, |path| unknown.push(format_path(&path))) {
        Ok(v) => finish(v, &unknown, duplicates, mode),
        Err(_) => decode_with(value, duplicates, mode),
    }
}

fn decode_with<'de, D, T>(de: D, duplicates: &[String], mode: FieldValidation) -> Result<Decoded<T>, DecodeError>
where
    D: serde::Deserializer<'de, Error: std::fmt::Display>,
    T: DeserializeOwned,
{
    let mut track = serde_path_to_error::Track::new();
    let mut unknown = Vec::new();
    let result = {
        let tracked = serde_path_to_error::Deserializer::new(de, &mut track);
        serde_ignored::deserialize(tracked, |path| unknown.push(format_path(&path)))
    };
    let value: T = match result {
        Ok(v) => v,
        Err(e) => return Err(shape_error(track.path().to_string(), e.to_string())),
    };
    finish(value, &unknown, duplicates, mode)
}

/// Applies `mode` to the unknown fields and duplicate keys found while decoding `value`.
fn finish<T>(
    value: T,
    unknown: &[String],
    duplicates: &[String],
    mode: FieldValidation,
) -> Result<Decoded<T>, DecodeError> {
    if (unknown.is_empty() && duplicates.is_empty()) || mode == FieldValidation::Ignore {
        return Ok(Decoded {
            value,
            warnings: Vec::new(),
        });
    }
    let messages: Vec<String> = unknown
        .iter()
        .map(|p| format!("unknown field {p:?}"))
        .chain(duplicates.iter().map(|p| format!("duplicate field {p:?}")))
        .collect();
    match mode {
        FieldValidation::Strict => Err(DecodeError::BadRequest(format!(
            "strict decoding error: {}",
            messages.join(", ")
        ))),
        _ => Ok(Decoded {
            value,
            warnings: messages,
        }),
    }
}

/// Turns a serde error at `path` into a field error when it is about a value's shape, or a 400
/// when it is about the document's syntax.
fn shape_error(path: String, message: String) -> DecodeError {
    let path = if path == "." { String::new() } else { path };
    // serde's messages: "unknown variant `X`, expected one of `A`, `B`", "invalid type: ...",
    // "invalid value: ...", "duplicate field `x`", "missing field `x`".
    if let Some(rest) = message.strip_prefix("unknown variant ") {
        let (value, expected) = rest.split_once(", expected ").unwrap_or((rest, ""));
        let value = value.trim_matches('`');
        let supported: Vec<String> = expected
            .trim_start_matches("one of ")
            .split([',', ' '])
            .map(|s| s.trim_matches('`'))
            .filter(|s| !s.is_empty() && *s != "or")
            .map(|s| format!("{s:?}"))
            .collect();
        return DecodeError::Invalid(ErrorList(vec![FieldError {
            kind: ErrorType::NotSupported,
            field: Path::new(&path),
            value: Some(format!("{value:?}")),
            detail: format!("supported values: {}", supported.join(", ")),
        }]));
    }
    if message.starts_with("duplicate field") {
        let at = if path.is_empty() {
            String::new()
        } else {
            format!(" in {path}")
        };
        return DecodeError::BadRequest(format!("strict decoding error: {message}{at}"));
    }
    if (message.starts_with("invalid type") || message.starts_with("invalid value")) && !path.is_empty() {
        return DecodeError::Invalid(ErrorList(vec![FieldError {
            kind: ErrorType::TypeInvalid,
            field: Path::new(&path),
            value: None,
            detail: message,
        }]));
    }
    let at = if path.is_empty() {
        String::new()
    } else {
        format!(" at {path}")
    };
    DecodeError::BadRequest(format!("the body cannot be decoded{at}: {message}"))
}

/// Formats a path the Kubernetes way: `spec.members[0].foo`.
fn format_path(p: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path as P;
    match p {
        P::Root => String::new(),
        P::Seq { parent, index } => format!("{}[{index}]", format_path(parent)),
        P::Map { parent, key } => {
            let parent = format_path(parent);
            if parent.is_empty() {
                key.clone()
            } else {
                format!("{parent}.{key}")
            }
        }
        P::Some { parent } | P::NewtypeStruct { parent } | P::NewtypeVariant { parent } => format_path(parent),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvcache_api::KVCacheBackend;

    const BACKEND: &str = r#"{"apiVersion":"worker.gpustack.ai/v1","kind":"KVCacheBackend",
        "metadata":{"name":"b","bogusMeta":1},
        "spec":{"metadata":{},"connection":{"managed":{"leader":{},"members":[{"medium":"DRAM","capacityPerMember":"1Gi","nodeSelector":{},"extra":true}]}}}}"#;

    #[test]
    fn strict_refuses_unknown_fields_with_their_paths() {
        let err = from_json::<KVCacheBackend>(BACKEND.as_bytes(), FieldValidation::Strict).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, DecodeError::BadRequest(_)));
        assert!(msg.starts_with("strict decoding error: "), "{msg}");
        assert!(msg.contains(r#"unknown field "metadata.bogusMeta""#), "{msg}");
        assert!(msg.contains(r#"unknown field "spec.metadata""#), "{msg}");
        assert!(
            msg.contains(r#"unknown field "spec.connection.managed.members[0].extra""#),
            "{msg}"
        );
    }

    #[test]
    fn warn_drops_and_reports_ignore_drops_silently() {
        let d = from_json::<KVCacheBackend>(BACKEND.as_bytes(), FieldValidation::Warn).unwrap();
        assert_eq!(d.warnings.len(), 3);
        let d = from_json::<KVCacheBackend>(BACKEND.as_bytes(), FieldValidation::Ignore).unwrap();
        assert!(d.warnings.is_empty());
        let back = serde_json::to_string(&d.value).unwrap();
        assert!(
            !back.contains("extra") && !back.contains("bogusMeta"),
            "unknown fields are never kept"
        );
    }

    #[test]
    fn enum_values_outside_the_set_are_field_errors() {
        let body = r#"{"spec":{"transport":{"protocol":"HIP"}}}"#;
        let DecodeError::Invalid(errs) =
            from_json::<KVCacheBackend>(body.as_bytes(), FieldValidation::Strict).unwrap_err()
        else {
            panic!("expected a field error")
        };
        let e = &errs.0[0];
        assert_eq!(e.field.as_str(), "spec.transport.protocol");
        assert_eq!(e.kind, ErrorType::NotSupported);
        assert!(
            e.message().contains(r#""HIP""#) && e.message().contains(r#""RDMA""#),
            "{}",
            e.message()
        );
    }

    #[test]
    fn wrong_types_are_field_errors_and_bad_syntax_is_a_bad_request() {
        let body = r#"{"spec":{"connection":{"managed":{"leader":{"replicas":"three"}}}}}"#;
        let DecodeError::Invalid(errs) =
            from_json::<KVCacheBackend>(body.as_bytes(), FieldValidation::Strict).unwrap_err()
        else {
            panic!()
        };
        assert_eq!(errs.0[0].field.as_str(), "spec.connection.managed.leader.replicas");
        assert!(matches!(
            from_json::<KVCacheBackend>(b"{not json", FieldValidation::Strict),
            Err(DecodeError::BadRequest(_))
        ));
        assert!(matches!(
            from_json::<KVCacheBackend>(br#"{"spec":{},"spec":{}}"#, FieldValidation::Strict),
            Err(DecodeError::BadRequest(_))
        ));
    }

    #[test]
    fn duplicate_keys_follow_field_validation() {
        let body = br#"{"metadata":{"name":"a","name":"b"},"spec":{}}"#;
        let err = from_json::<KVCacheBackend>(body, FieldValidation::Strict).unwrap_err();
        assert!(err.to_string().contains(r#"duplicate field "metadata.name""#), "{err}");
        let d = from_json::<KVCacheBackend>(body, FieldValidation::Warn).unwrap();
        assert_eq!(d.warnings, vec![r#"duplicate field "metadata.name""#.to_owned()]);
        assert_eq!(d.value.metadata.name.as_deref(), Some("b"));
        assert!(
            from_json::<KVCacheBackend>(body, FieldValidation::Ignore)
                .unwrap()
                .warnings
                .is_empty()
        );
    }

    #[test]
    fn yaml_manifests_decode() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/walkthrough/01-backend.yaml"
        ))
        .unwrap();
        let d = from_yaml::<KVCacheBackend>(&text, FieldValidation::Strict).unwrap();
        assert_eq!(d.value.metadata.name.as_deref(), Some("mooncake-dram"));
    }
}
