//! Building responses: JSON bodies, `metav1.Status` refusals (from [`crate::status`]), and
//! `Warning` headers capped as kube-apiserver caps them.

use axum::body::Body;
use axum::response::Response;
use http::{HeaderValue, StatusCode, header};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use serde_json::Value;

use crate::registry::RegistryError;
use crate::registry::dynamic::Outcome;
use crate::registry::kinds::KindEntry;
use crate::status::failure;

/// Total warning text (in characters) before warnings are truncated, and the length each is cut
/// to then: kube-apiserver's limits, so that any client can read the headers.
const WARNINGS_TOTAL_CHARS: usize = 4 * 1024;
const WARNING_TRUNCATED_CHARS: usize = 256;

/// A response with a body of `content_type`.
pub fn bytes(code: u16, content_type: &str, body: impl Into<Body>) -> Response {
    let mut r = Response::new(body.into());
    *r.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if let Ok(v) = HeaderValue::from_str(content_type) {
        r.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    r
}

/// A JSON response.
pub fn json(code: u16, body: Vec<u8>) -> Response {
    bytes(code, "application/json", body)
}

/// Plain text (health checks).
pub fn text(code: u16, body: String) -> Response {
    bytes(code, "text/plain; charset=utf-8", body)
}

/// `v` as JSON, indented with `?pretty=true`.
pub fn encode(v: &Value, pretty: bool) -> Vec<u8> {
    if pretty {
        serde_json::to_vec_pretty(v).unwrap_or_default()
    } else {
        serde_json::to_vec(v).unwrap_or_default()
    }
}

/// A `metav1.Status` response; a `retryAfterSeconds` in it becomes `Retry-After`.
pub fn status(code: u16, status: &Status) -> Response {
    let mut r = json(code, serde_json::to_vec(status).unwrap_or_default());
    if let Some(secs) = status.details.as_ref().and_then(|d| d.retry_after_seconds)
        && let Ok(v) = HeaderValue::from_str(&secs.to_string())
    {
        r.headers_mut().insert(header::RETRY_AFTER, v);
    }
    r
}

/// A refusal outside any one object.
pub fn error(code: u16, reason: &str, message: impl Into<String>) -> Response {
    status(code, &failure(code, reason, message))
}

pub fn bad_request(message: impl Into<String>) -> Response {
    error(400, "BadRequest", message)
}

pub fn not_found(path: &str) -> Response {
    error(
        404,
        "NotFound",
        format!("the server could not find the requested resource ({path})"),
    )
}

pub fn method_not_allowed(method: &http::Method, what: &str) -> Response {
    error(405, "MethodNotAllowed", format!("{method} is not supported on {what}"))
}

pub fn not_acceptable(accept: &str) -> Response {
    error(
        406,
        "NotAcceptable",
        format!(
            "only the following media types are accepted: application/json, application/json;as=Table;v=v1;g=meta.k8s.io (asked for {accept:?})"
        ),
    )
}

/// A registry refusal of an operation on `kind`'s object `name`.
pub fn registry_error(kind: &KindEntry, name: &str, e: &RegistryError) -> Response {
    let crate::status::Refusal(code, s) = crate::status::for_resource(kind.plural, name, e);
    status(code, &s)
}

/// The answer to a write: the object written (201 when it was created) with the warnings.
pub fn written(out: Outcome, pretty: bool) -> Response {
    let code = if out.created { 201 } else { 200 };
    let body = if pretty {
        let v: Value = serde_json::from_slice(&out.object).unwrap_or_default();
        encode(&v, true)
    } else {
        out.object
    };
    with_warnings(json(code, body), &out.warnings)
}

/// Adds `warnings` as `Warning: 299 - "..."` headers, each once. Past 4 Ki characters in all,
/// every warning is cut to 256 characters, and those that still do not fit are dropped.
pub fn with_warnings(mut r: Response, warnings: &[String]) -> Response {
    let mut seen = std::collections::HashSet::with_capacity(warnings.len());
    let unique: Vec<&str> = warnings
        .iter()
        .map(String::as_str)
        .filter(|w| seen.insert(*w))
        .collect();
    let total: usize = unique.iter().map(|w| w.chars().count()).sum();
    let truncate = total > WARNINGS_TOTAL_CHARS;
    let mut written = 0usize;
    for w in unique {
        let text: String = if truncate {
            w.chars().take(WARNING_TRUNCATED_CHARS).collect()
        } else {
            w.to_owned()
        };
        let chars = text.chars().count();
        if written + chars > WARNINGS_TOTAL_CHARS {
            break;
        }
        written += chars;
        let value = format!("299 - {:?}", text.replace('"', "'"));
        if let Ok(v) = HeaderValue::from_str(&value) {
            r.headers_mut().append(header::WARNING, v);
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warnings_are_deduplicated_and_capped() {
        let many: Vec<String> = (0..100_000).map(|i| format!("unknown field \"spec.f{i}\"")).collect();
        let r = with_warnings(json(200, Vec::new()), &many);
        let headers: Vec<_> = r.headers().get_all(header::WARNING).iter().collect();
        let total: usize = headers.iter().map(|h| h.len()).sum();
        assert!(!headers.is_empty() && headers.len() < 300, "{}", headers.len());
        assert!(total < 8 * 1024, "{total}");
        let r = with_warnings(json(200, Vec::new()), &["a".into(), "a".into(), "b".into()]);
        assert_eq!(r.headers().get_all(header::WARNING).iter().count(), 2);
        let long = vec!["x".repeat(10_000)];
        let r = with_warnings(json(200, Vec::new()), &long);
        let h = r.headers().get(header::WARNING).unwrap().to_str().unwrap();
        assert!(h.len() < 300, "{}", h.len());
    }

    #[test]
    fn retry_after_follows_the_status() {
        let e = RegistryError::TooLargeResourceVersion(9);
        let r = registry_error(&crate::registry::kinds::KINDS[0], "", &e);
        assert_eq!(r.status(), 504);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
    }
}
