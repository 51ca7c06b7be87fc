//! Reading request bodies, within the limit the body-limit filter set, and parsing them by
//! content type into bounded values.

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::HeaderMap;
use http_body_util::BodyExt;

use super::response::{bad_request, error};
use crate::decode::bounded::{self, BoundedError, Parsed};

/// Largest request body accepted (413 beyond), as kube-apiserver.
pub const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;

/// Bodies past the limit are read to their end (up to this much) and dropped, so that the client
/// finishes sending and reads our 413 instead of seeing its upload cut off.
pub const DRAIN_LIMIT_BYTES: usize = 64 * 1024 * 1024;

pub fn too_large(at_least: usize) -> Response {
    error(
        413,
        "RequestEntityTooLarge",
        format!("the request is too large: {at_least} bytes or more; the limit is {MAX_BODY_BYTES} bytes"),
    )
}

/// Reads `body`, at most [`MAX_BODY_BYTES`] of it (413 past it, after reading the rest away).
pub async fn read(body: Body) -> Result<Bytes, Response> {
    let mut body = body;
    let mut buf = bytes::BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| bad_request(format!("reading the request body: {e}")))?;
        let Ok(data) = frame.into_data() else { continue };
        if buf.len() + data.len() > MAX_BODY_BYTES {
            let read = buf.len() + data.len();
            drain(body).await;
            return Err(too_large(read));
        }
        buf.extend_from_slice(&data);
    }
    Ok(buf.freeze())
}

/// Reads and drops what is left of a body past the limit, up to [`DRAIN_LIMIT_BYTES`].
pub async fn drain(mut body: Body) {
    let mut total = 0usize;
    while let Some(Ok(frame)) = body.frame().await {
        total += frame.data_ref().map_or(0, Bytes::len);
        if total > DRAIN_LIMIT_BYTES {
            break;
        }
    }
}

/// The media type of `Content-Type`, without parameters.
pub fn media_type(headers: &HeaderMap) -> String {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase()
}

/// A parse failure as a response: 413 past the bounds, else 400.
pub fn parse_error(e: BoundedError) -> Response {
    match e {
        BoundedError::TooLarge => error(413, "RequestEntityTooLarge", e.to_string()),
        e => bad_request(e.to_string()),
    }
}

/// An object body (create, update) by its content type: JSON or YAML; 415 for anything else.
pub fn object(headers: &HeaderMap, body: &[u8]) -> Result<Parsed, Response> {
    match media_type(headers).as_str() {
        "" | "application/json" | "*/*" => bounded::json(body).map_err(parse_error),
        "application/yaml" => {
            let text = std::str::from_utf8(body).map_err(|_| bad_request("the body is not UTF-8"))?;
            bounded::yaml(text).map_err(parse_error)
        }
        other => Err(error(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format ({other}) - accepted media types include: application/json, application/yaml, application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
            ),
        )),
    }
}

/// A body of the core `kind` direct mode serves: JSON, YAML, or the protobuf kubectl 1.33 sends
/// for built-in types ([`crate::decode::protobuf`]).
pub fn core_object(headers: &HeaderMap, body: &[u8], kind: &str) -> Result<serde_json::Value, Response> {
    if media_type(headers) == crate::decode::protobuf::MEDIA_TYPE {
        return crate::decode::protobuf::decode(body, kind)
            .map_err(|e| bad_request(format!("the protobuf body is not a {kind}: {e}")));
    }
    object(headers, body).map(|p| p.value)
}
