//! A stand-in vLLM worker on 127.0.0.1: `/health`, `/v1/models`, `/tokenize` (one token per
//! whitespace-separated word: the number it is, else 0), and `/v1/completions` and `/v1/chat/completions` answering JSON
//! or server-sent events. A request with `kv_transfer_params.do_remote_decode` is a prefill: it
//! answers with a handoff. Streams can be gated (each chunk after the first waits for
//! [`StandIn::release`]) and count the clients that left before their end. It can be stopped
//! (every connection closed) and started again on the same port.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

/// What the completion endpoints do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Answer normally.
    Normal,
    /// Answer this status with an error body.
    Status(u16),
    /// A prefill answer without `kv_transfer_params`.
    NoParams,
    /// Never answer.
    Hang,
}

/// The handoff every stand-in prefill answers with.
pub fn handoff() -> Value {
    json!({"kvcache_handoff": {"blocks": 2, "bytes": 1000, "fingerprint": "f00d"},
           "prompt_token_ids": [1, 2, 3]})
}

#[derive(Debug)]
pub struct Seen {
    pub path: String,
    pub body: Value,
}

/// What a stand-in does and what it saw.
pub struct State {
    pub name: String,
    pub mode: Mutex<Mode>,
    pub healthy: AtomicBool,
    /// Chunks of a streamed answer (a final `[DONE]` follows).
    pub chunks: AtomicUsize,
    /// Each chunk after the first waits for a permit.
    pub gated: AtomicBool,
    pub interval: Mutex<Duration>,
    pub release: Semaphore,
    pub sent: AtomicUsize,
    /// Answers (streamed or hanging) dropped before their end: the client went away.
    pub disconnects: AtomicUsize,
    pub seen: Mutex<Vec<Seen>>,
}

impl State {
    /// Completion requests seen at `path` (prefix), as JSON.
    pub fn bodies(&self, path: &str) -> Vec<Value> {
        let seen = self.seen.lock().unwrap();
        seen.iter()
            .filter(|s| s.path.starts_with(path))
            .map(|s| s.body.clone())
            .collect()
    }

    /// Every request seen except health checks.
    pub fn requests(&self) -> usize {
        self.seen.lock().unwrap().iter().filter(|s| s.path != "/health").count()
    }
}

pub struct StandIn {
    pub addr: SocketAddr,
    pub state: Arc<State>,
    accept: Option<tokio::task::JoinHandle<()>>,
}

impl StandIn {
    pub async fn start(name: &str) -> StandIn {
        let state = Arc::new(State {
            name: name.to_string(),
            mode: Mutex::new(Mode::Normal),
            healthy: AtomicBool::new(true),
            chunks: AtomicUsize::new(3),
            gated: AtomicBool::new(false),
            interval: Mutex::new(Duration::from_millis(5)),
            release: Semaphore::new(0),
            sent: AtomicUsize::new(0),
            disconnects: AtomicUsize::new(0),
            seen: Mutex::new(Vec::new()),
        });
        Self::serve("127.0.0.1:0".parse().unwrap(), state).await
    }

    async fn serve(addr: SocketAddr, state: Arc<State>) -> StandIn {
        let listener = TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let st = state.clone();
        let accept = tokio::spawn(async move {
            let mut conns = JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let st = st.clone();
                conns.spawn(async move {
                    let svc = hyper::service::service_fn(move |req| answer(st.clone(), req));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
                while conns.try_join_next().is_some() {}
            }
        });
        StandIn {
            addr,
            state,
            accept: Some(accept),
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Closes the listener and every connection.
    pub async fn stop(&mut self) {
        if let Some(a) = self.accept.take() {
            a.abort();
            let _ = a.await;
        }
    }

    /// Serves again on the same port, with the same state.
    pub async fn restart(&mut self) {
        self.stop().await;
        let again = Self::serve(self.addr, self.state.clone()).await;
        *self = again;
    }

    pub fn set_mode(&self, mode: Mode) {
        *self.state.mode.lock().unwrap() = mode;
    }

    /// Lets one more gated chunk go.
    pub fn release(&self) {
        self.state.release.add_permits(1);
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        if let Some(a) = self.accept.take() {
            a.abort();
        }
    }
}

type Body = UnsyncBoxBody<Bytes, Infallible>;

fn full(status: u16, v: Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(v.to_string())).boxed_unsync())
        .unwrap()
}

/// Counts a disconnect when dropped before `done`.
struct Watch {
    state: Arc<State>,
    done: bool,
}

impl Watch {
    fn finish(&mut self) {
        self.done = true;
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if !self.done {
            self.state.disconnects.fetch_add(1, Ordering::SeqCst);
        }
    }
}

async fn answer(state: Arc<State>, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let path = req.uri().path().to_string();
    let bytes = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    state.seen.lock().unwrap().push(Seen {
        path: path.clone(),
        body: body.clone(),
    });
    let r = match path.as_str() {
        "/health" if state.healthy.load(Ordering::SeqCst) => full(200, json!({})),
        "/health" => full(503, json!({"error": "unhealthy"})),
        "/v1/models" => full(
            200,
            json!({"object": "list", "data": [{"id": state.name, "object": "model"}]}),
        ),
        "/tokenize" => {
            let text = body["prompt"].as_str().unwrap_or_default();
            let tokens: Vec<i64> = text.split_whitespace().map(|w| w.parse().unwrap_or(0)).collect();
            full(
                200,
                json!({"count": tokens.len(), "max_model_len": 4096, "tokens": tokens}),
            )
        }
        "/v1/completions" | "/v1/chat/completions" => complete(&state, &body).await,
        _ => full(404, json!({"error": "no such path"})),
    };
    Ok(r)
}

async fn complete(state: &Arc<State>, body: &Value) -> Response<Body> {
    let mode = *state.mode.lock().unwrap();
    let prefill = body["kv_transfer_params"]["do_remote_decode"] == json!(true);
    match mode {
        Mode::Status(s) => return full(s, json!({"error": {"message": "stand-in failure", "code": s}})),
        Mode::Hang => {
            let _watch = Watch {
                state: state.clone(),
                done: false,
            };
            std::future::pending::<()>().await;
        }
        Mode::NoParams if prefill => return full(200, json!({"id": "p", "choices": [{"text": "x"}]})),
        _ => {}
    }
    if prefill {
        return full(
            200,
            json!({"id": "p", "choices": [{"text": "x"}], "kv_transfer_params": handoff()}),
        );
    }
    if body["stream"] != json!(true) {
        return full(
            200,
            json!({"id": "d", "worker": state.name, "choices": [{"text": "hello"}],
                   "kv_transfer_params": body.get("kv_transfer_params")}),
        );
    }
    let chunks = state.chunks.load(Ordering::SeqCst);
    let gated = state.gated.load(Ordering::SeqCst);
    let interval = *state.interval.lock().unwrap();
    let watch = Watch {
        state: state.clone(),
        done: false,
    };
    let name = state.name.clone();
    let stream = futures::stream::unfold((0usize, watch), move |(i, mut watch)| {
        let name = name.clone();
        async move {
            if i > chunks {
                watch.finish();
                return None;
            }
            if i > 0 {
                if gated {
                    watch.state.release.acquire().await.unwrap().forget();
                } else {
                    tokio::time::sleep(interval).await;
                }
            }
            let data = if i == chunks {
                "data: [DONE]\n\n".to_string()
            } else {
                watch.state.sent.fetch_add(1, Ordering::SeqCst);
                format!("data: {{\"i\":{i},\"worker\":\"{name}\"}}\n\n")
            };
            Some((Ok::<_, Infallible>(Frame::data(Bytes::from(data))), (i + 1, watch)))
        }
    });
    Response::builder()
        .status(200)
        .header("content-type", "text/event-stream")
        .body(StreamBody::new(stream.boxed()).boxed_unsync())
        .unwrap()
}
