//! Calls to engines: one pooled HTTP/1 client (keep-alive, TCP_NODELAY) for every worker, the
//! headers a request carries on and an answer carries back, and reading a small JSON answer.
//! Dropping a response future or a response body before its end closes that connection, which
//! is how a client that goes away cancels the engine's work.

use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, header};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use thiserror::Error;

/// How long a connection attempt to an engine may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

#[derive(Debug, Error)]
pub enum UpstreamError {
    /// The engine could not be reached at all: a sign of a dead worker.
    #[error("cannot connect: {0}")]
    Connect(String),
    /// The request was sent and the exchange broke.
    #[error("the exchange failed: {0}")]
    Exchange(String),
    #[error("bad worker URL {0:?}")]
    Url(String),
}

impl UpstreamError {
    pub fn is_connect(&self) -> bool {
        matches!(self, Self::Connect(_))
    }
}

/// The client every call to an engine goes through.
#[derive(Debug, Clone)]
pub struct Upstream {
    client: Client<HttpConnector, Full<Bytes>>,
}

impl Default for Upstream {
    fn default() -> Self {
        Self::new()
    }
}

impl Upstream {
    pub fn new() -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .pool_max_idle_per_host(256)
            .build(connector);
        Self { client }
    }

    /// `method base+path` with `body` as JSON and the client's end-to-end `headers`.
    pub async fn send(
        &self,
        method: Method,
        base: &str,
        path: &str,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Result<Response<Incoming>, UpstreamError> {
        let uri = format!("{base}{path}");
        let mut builder = Request::builder().method(method).uri(&uri);
        if let Some(h) = builder.headers_mut() {
            for (name, value) in headers {
                if forwarded(name) {
                    h.append(name, value.clone());
                }
            }
            if !body.is_empty() {
                h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
            }
        }
        let request = builder.body(Full::new(body)).map_err(|_| UpstreamError::Url(uri))?;
        self.client.request(request).await.map_err(|e| {
            // the error's chain says what happened (refused, reset, ...)
            let mut why = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                why = format!("{why}: {s}");
                source = s.source();
            }
            if e.is_connect() {
                UpstreamError::Connect(why)
            } else {
                UpstreamError::Exchange(why)
            }
        })
    }

    /// `GET base+path` without a body.
    pub async fn get(&self, base: &str, path: &str) -> Result<Response<Incoming>, UpstreamError> {
        self.send(Method::GET, base, path, &HeaderMap::new(), Bytes::new())
            .await
    }
}

/// Headers that concern one connection, never passed on (RFC 9110, 7.6.1), and those the router
/// sets itself.
fn forwarded(name: &header::HeaderName) -> bool {
    !matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "host"
            | "content-length"
            | "content-type"
            | "expect"
            | "accept-encoding"
    )
}

/// An engine's answer headers as the client gets them: without the hop-by-hop ones.
pub fn answer_headers(from: &HeaderMap) -> HeaderMap {
    let mut out = HeaderMap::with_capacity(from.len());
    for (name, value) in from {
        if !matches!(
            name.as_str(),
            "connection" | "keep-alive" | "proxy-connection" | "te" | "trailer" | "transfer-encoding" | "upgrade"
        ) {
            out.append(name, value.clone());
        }
    }
    out
}

/// Reads a whole answer of at most `limit` bytes.
pub async fn read_body(response: Response<Incoming>, limit: usize) -> Result<(StatusCode, Bytes), String> {
    let status = response.status();
    let body = Limited::new(response.into_body(), limit)
        .collect()
        .await
        .map_err(|e| e.to_string())?;
    Ok((status, body.to_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_stay_behind() {
        let mut h = HeaderMap::new();
        h.insert("authorization", HeaderValue::from_static("Bearer x"));
        h.insert("x-request-id", HeaderValue::from_static("1"));
        h.insert("connection", HeaderValue::from_static("keep-alive"));
        h.insert("transfer-encoding", HeaderValue::from_static("chunked"));
        h.insert("content-length", HeaderValue::from_static("3"));
        let on: Vec<&str> = h.keys().filter(|n| forwarded(n)).map(|n| n.as_str()).collect();
        assert_eq!(on.len(), 2);
        assert!(on.contains(&"authorization") && on.contains(&"x-request-id"));
        let back = answer_headers(&h);
        assert!(back.get("transfer-encoding").is_none() && back.get("connection").is_none());
        assert_eq!(back.get("content-length").unwrap(), "3");
    }
}
