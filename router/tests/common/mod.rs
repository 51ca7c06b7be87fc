//! What the router's integration tests share: stand-in vLLM workers ([`standin`]), the real
//! `kv-router` binary started against them ([`router`]), and an HTTP client.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

pub mod router;
pub mod standin;

#[path = "../../../tests/support/eventually.rs"]
pub mod eventually;

use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::task::JoinHandle;

/// A client connection of its own: dropping it (and aborting its task) closes the socket.
pub struct Conn {
    pub send: SendRequest<Full<Bytes>>,
    task: JoinHandle<()>,
}

impl Conn {
    pub async fn open(addr: SocketAddr) -> Conn {
        let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream.set_nodelay(true).unwrap();
        let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        let task = tokio::spawn(async move {
            let _ = conn.await;
        });
        Conn { send, task }
    }

    pub async fn request(&mut self, method: &str, path: &str, body: Bytes) -> Response<Incoming> {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header("host", "router")
            .header("content-type", "application/json")
            .body(Full::new(body))
            .unwrap();
        self.send.send_request(req).await.unwrap()
    }

    /// Closes the connection at once.
    pub fn close(self) {
        self.task.abort();
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One request on a fresh connection; the status and the whole body.
pub async fn call(addr: SocketAddr, method: &str, path: &str, body: impl Into<Bytes>) -> (u16, Bytes) {
    let mut c = Conn::open(addr).await;
    let r = c.request(method, path, body.into()).await;
    let status = r.status().as_u16();
    let body = r.into_body().collect().await.unwrap().to_bytes();
    (status, body)
}

/// [`call`] with a JSON body, the answer read as JSON.
pub async fn post_json(addr: SocketAddr, path: &str, body: Value) -> (u16, Value) {
    let (status, bytes) = call(addr, "POST", path, body.to_string()).await;
    let v = serde_json::from_slice(&bytes).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()));
    (status, v)
}

/// The next data frame of a body, as text; `None` at its end.
pub async fn next_chunk(body: &mut Incoming) -> Option<String> {
    loop {
        let frame = body.frame().await?.unwrap();
        if let Ok(data) = frame.into_data() {
            return Some(String::from_utf8(data.to_vec()).unwrap());
        }
    }
}

/// Asserts an OpenAI-style error body with `code`.
pub fn assert_openai_error(body: &Value, code: &str) {
    let e = body["error"]
        .as_object()
        .unwrap_or_else(|| panic!("not an OpenAI error: {body}"));
    assert_eq!(e["code"], code, "{body}");
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{body}");
    assert!(e["type"].is_string(), "{body}");
}
