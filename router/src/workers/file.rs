//! `--workers-file`: `{"server":[worker...],"prefill":[worker...],"decode":[worker...]}` (a
//! missing kind has no workers), each worker its base URL, or `{"url": URL, "events":
//! "tcp://HOST:PORT", "replay": "tcp://HOST:PORT"}` for one that publishes its KV events
//! (`ipc:///PATH` too; `replay` optional); written atomically by the local runtime. Read every 250 ms and applied when
//! its bytes change; a file that cannot be read or parsed keeps the last good set, and says why
//! once per distinct problem.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use thiserror::Error;
use tokio_util::sync::CancellationToken;

use super::{Kind, Pool, Source, WorkerSets};
use crate::engine_memory::follow::Publisher;
use crate::zmtp::address;

/// How often the file is read.
pub const POLL: Duration = Duration::from_millis(250);

#[derive(Debug, Error)]
pub enum FileError {
    #[error("not a workers file ({{\"server\":[url...],\"prefill\":[url...],\"decode\":[url...]}}): {0}")]
    Json(#[from] serde_json::Error),
    #[error("{kind} worker {url:?}: {why}")]
    Url {
        kind: &'static str,
        url: String,
        why: String,
    },
}

#[derive(Debug, Deserialize)]
struct Format {
    #[serde(default)]
    server: Vec<Entry>,
    #[serde(default)]
    prefill: Vec<Entry>,
    #[serde(default)]
    decode: Vec<Entry>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Entry {
    Url(String),
    Publishing {
        url: String,
        events: String,
        #[serde(default)]
        replay: Option<String>,
    },
}

/// Reads a workers file's content.
pub fn parse(bytes: &[u8]) -> Result<WorkerSets, FileError> {
    let f: Format = serde_json::from_slice(bytes)?;
    let mut sets = WorkerSets::default();
    for (kind, urls) in [
        (Kind::Server, f.server),
        (Kind::Prefill, f.prefill),
        (Kind::Decode, f.decode),
    ] {
        let mut out: Vec<String> = Vec::with_capacity(urls.len());
        for entry in urls {
            let (url, publisher) = match entry {
                Entry::Url(url) => (url, None),
                Entry::Publishing { url, events, replay } => (url, Some(Publisher { events, replay })),
            };
            let refuse = |why: String| FileError::Url {
                kind: kind.label(),
                url: url.clone(),
                why,
            };
            let n = normalize_url(&url).map_err(refuse)?;
            if let Some(p) = publisher {
                for e in std::iter::once(&p.events).chain(&p.replay) {
                    address(e).map_err(|e| refuse(e.to_string()))?;
                }
                sets.set_publisher(n.clone(), p);
            }
            if !out.contains(&n) {
                out.push(n);
            }
        }
        sets.set(kind, out);
    }
    Ok(sets)
}

/// `http://host:port[/]` → `http://host:port`: the base URL an engine's paths are appended to.
pub fn normalize_url(s: &str) -> Result<String, String> {
    let uri: http::Uri = s.parse().map_err(|e| format!("not a URL: {e}"))?;
    if uri.scheme_str() != Some("http") {
        return Err("the scheme must be http".into());
    }
    let authority = uri.authority().ok_or("no host")?;
    if authority.host().is_empty() {
        return Err("no host".into());
    }
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return Err("a worker is a base URL, without a path".into());
    }
    if authority.as_str().contains('@') {
        return Err("no user information in a worker's URL".into());
    }
    Ok(format!("http://{authority}"))
}

/// The watch on one workers file.
#[derive(Debug)]
pub struct FileWatch {
    path: PathBuf,
    last: Option<Vec<u8>>,
    last_error: Option<String>,
}

impl FileWatch {
    pub fn new(path: PathBuf) -> Self {
        Self {
            path,
            last: None,
            last_error: None,
        }
    }

    /// Reads the file once and applies it if it changed.
    pub async fn poll(&mut self, pool: &Pool) {
        let result = match tokio::fs::read(&self.path).await {
            Err(e) => Err(format!("cannot read it: {e}")),
            Ok(bytes) if self.last.as_ref() == Some(&bytes) => return,
            Ok(bytes) => match parse(&bytes) {
                Ok(sets) => {
                    self.last = Some(bytes);
                    Ok(sets)
                }
                Err(e) => Err(e.to_string()),
            },
        };
        match result {
            Ok(sets) => {
                self.last_error = None;
                pool.set_source(Source::File, sets);
            }
            Err(why) if self.last_error.as_ref() != Some(&why) => {
                tracing::warn!(path = %self.path.display(), error = %why, "workers file refused; keeping the last good set");
                self.last_error = Some(why);
            }
            Err(_) => {}
        }
    }

    /// Polls every [`POLL`] until `cancel` fires.
    pub async fn run(mut self, pool: Arc<Pool>, cancel: CancellationToken) {
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(POLL) => self.poll(&pool).await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_designs_format() {
        let s = parse(br#"{"prefill":["http://10.0.0.1:8000/"],"decode":["http://10.0.0.2:8000","http://10.0.0.2:8000"],"extra":1}"#)
            .unwrap();
        assert!(s.get(Kind::Server).is_empty());
        assert_eq!(s.get(Kind::Prefill), ["http://10.0.0.1:8000"]);
        assert_eq!(s.get(Kind::Decode), ["http://10.0.0.2:8000"], "duplicates collapse");
        assert_eq!(parse(b"{}").unwrap(), WorkerSets::default());
        let s = parse(br#"{"server":[{"url":"http://a:1","events":"tcp://a:2","replay":"tcp://a:3"},{"url":"http://b:1","events":"tcp://b:2"},"http://c:1"]}"#)
            .unwrap();
        assert_eq!(s.get(Kind::Server), ["http://a:1", "http://b:1", "http://c:1"]);
        let p = |e: &str, r: Option<&str>| Publisher {
            events: e.into(),
            replay: r.map(Into::into),
        };
        assert_eq!(s.publisher("http://a:1"), Some(&p("tcp://a:2", Some("tcp://a:3"))));
        assert_eq!(s.publisher("http://b:1"), Some(&p("tcp://b:2", None)));
        assert_eq!(s.publisher("http://c:1"), None);
    }

    #[test]
    fn refuses_what_is_not_a_workers_file() {
        for bad in [
            &br#"{"server":"http://a:1"}"#[..],
            br#"{"server":[1]}"#,
            br#"["http://a:1"]"#,
            br#"{"server":["http://a:1""#,
            br#"{"server":["https://a:1"]}"#,
            br#"{"server":["a:1"]}"#,
            br#"{"server":["http://a:1/v1"]}"#,
            br#"{"server":["http://u:p@a:1"]}"#,
            br#"{"server":[{"url":"http://a:1"}]}"#,
            br#"{"server":[{"url":"http://a:1","events":"http://a:2"}]}"#,
            br#"{"server":[{"url":"http://a:1","events":"tcp://a:2","replay":"tcp://a"}]}"#,
            b"",
        ] {
            assert!(parse(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn normalizes_urls() {
        assert_eq!(normalize_url("http://[::1]:8000/").unwrap(), "http://[::1]:8000");
        assert_eq!(normalize_url("http://host").unwrap(), "http://host");
    }
}
