//! Prometheus text helpers and the small HTTP endpoint leader and member expose it on:
//! `GET /metrics` (text format 0.0.4), `GET /healthz` (alive), `GET /readyz` (200 only while the
//! process serves). One request per connection; anything else is answered 404 or 405.

use std::fmt::Write as _;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A metric family's name, help and type.
#[derive(Debug, Clone, Copy)]
pub struct Family<'a> {
    name: &'a str,
    help: &'a str,
    kind: &'a str,
}

impl<'a> Family<'a> {
    pub fn new(name: &'a str, help: &'a str, kind: &'a str) -> Self {
        Self { name, help, kind }
    }

    pub fn header(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "# HELP {} {}\n# TYPE {} {}",
            self.name, self.help, self.name, self.kind
        );
    }

    /// Header plus one sample with the given label set (`""` for none).
    pub fn sample(&self, out: &mut String, labels: &str, v: u64) {
        self.header(out);
        let _ = writeln!(out, "{}{labels} {v}", self.name);
    }
}

/// Escapes a label value.
pub fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// What the endpoint asks of the process it describes.
pub trait Source: Send + Sync + 'static {
    fn metrics(&self) -> String;
    fn ready(&self) -> bool;
}

/// Serves the endpoint until the process ends.
pub async fn serve(listener: TcpListener, source: Arc<dyn Source>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let source = source.clone();
        tokio::spawn(async move {
            if let Err(e) = answer(stream, source.as_ref()).await {
                tracing::debug!(error = %e, "metrics request failed");
            }
        });
    }
}

async fn answer(mut stream: TcpStream, source: &dyn Source) -> std::io::Result<()> {
    let mut buf = vec![0u8; 8192];
    let mut n = 0;
    while !buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
        if n == buf.len() {
            return respond(
                &mut stream,
                "431 Request Header Fields Too Large",
                "text/plain",
                "headers too large\n",
            )
            .await;
        }
        let r = stream.read(&mut buf[n..]).await?;
        if r == 0 {
            return Ok(());
        }
        n += r;
    }
    let head = String::from_utf8_lossy(&buf[..n]);
    let mut parts = head.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    if method != "GET" {
        return respond(
            &mut stream,
            "405 Method Not Allowed",
            "text/plain",
            "only GET is served\n",
        )
        .await;
    }
    match path {
        "/metrics" => respond(&mut stream, "200 OK", "text/plain; version=0.0.4", &source.metrics()).await,
        "/healthz" => respond(&mut stream, "200 OK", "text/plain", "ok\n").await,
        "/readyz" if source.ready() => respond(&mut stream, "200 OK", "text/plain", "ready\n").await,
        "/readyz" => respond(&mut stream, "503 Service Unavailable", "text/plain", "not serving\n").await,
        _ => {
            respond(
                &mut stream,
                "404 Not Found",
                "text/plain",
                "try /metrics, /healthz or /readyz\n",
            )
            .await
        }
    }
}

async fn respond(stream: &mut TcpStream, status: &str, ctype: &str, body: &str) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}
