//! An engine's answer on its way to the client: each frame passed on as it arrives (never
//! gathered), the request's deadline enforced on the stream too, time to first token and time
//! per output token measured on streamed answers, the worker's outstanding count held until the
//! end, and the request's outcome counted once however it ends ([`Tally`]). Dropping a [`Relay`]
//! (the client went away) drops the engine's body, which closes that connection: the engine
//! sees the disconnect and stops generating.

use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Instant;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use tokio::time::Sleep;

use crate::hits::HitScan;
use crate::metrics::{Metrics, Outcome};
use crate::workers::InFlight;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A request's outcome, counted exactly once: by [`Tally::finish`], or as cancelled when it is
/// dropped unfinished (the client went away and the server dropped the request's future or
/// body).
#[derive(Debug)]
pub struct Tally {
    metrics: Metrics,
    endpoint: &'static str,
    done: bool,
}

impl Tally {
    pub fn new(metrics: Metrics, endpoint: &'static str) -> Self {
        Self {
            metrics,
            endpoint,
            done: false,
        }
    }

    pub fn finish(&mut self, outcome: Outcome) {
        if !std::mem::replace(&mut self.done, true) {
            self.metrics.request(self.endpoint, outcome);
        }
    }
}

impl Drop for Tally {
    fn drop(&mut self) {
        self.finish(Outcome::Cancelled);
    }
}

/// Timing of a streamed answer: server-sent events counted as they pass.
#[derive(Debug)]
struct Timing {
    start: Instant,
    first: Option<Instant>,
    last: Option<Instant>,
    /// Events after the first chunk (each a token or a few), `[DONE]` left out.
    events: u64,
}

/// The body the client reads.
#[derive(Debug)]
pub struct Relay {
    first: Option<Frame<Bytes>>,
    rest: Incoming,
    deadline: Pin<Box<Sleep>>,
    end_outcome: Outcome,
    tally: Tally,
    timing: Option<Timing>,
    metrics: Metrics,
    finished: bool,
    /// the prediction and the scan for vLLM's report of it
    hits: Option<(u64, HitScan)>,
    _inflight: InFlight,
}

/// What a relay needs besides the engine's body.
#[derive(Debug)]
pub struct RelayParts {
    pub tally: Tally,
    pub inflight: InFlight,
    pub metrics: Metrics,
    pub deadline: tokio::time::Instant,
    /// The request asked for a stream: its timing is measured.
    pub streamed: bool,
    pub start: Instant,
    /// The engine's status was 2xx.
    pub success: bool,
    /// Prompt tokens the worker was predicted not to compute (`placement.rs`): checked against
    /// what vLLM reports.
    pub predicted_hit_tokens: Option<u64>,
}

impl Relay {
    /// `first`: the frame already read from `rest` (the router waits for it before answering,
    /// so that a decode worker that fails before its first byte can be replaced).
    pub fn new(first: Option<Frame<Bytes>>, rest: Incoming, parts: RelayParts) -> Self {
        let mut relay = Self {
            first: None,
            rest,
            deadline: Box::pin(tokio::time::sleep_until(parts.deadline)),
            end_outcome: if parts.success {
                Outcome::Ok
            } else {
                Outcome::EngineError
            },
            tally: parts.tally,
            timing: (parts.streamed && parts.success).then_some(Timing {
                start: parts.start,
                first: None,
                last: None,
                events: 0,
            }),
            metrics: parts.metrics,
            finished: false,
            hits: parts
                .predicted_hit_tokens
                .filter(|_| parts.success)
                .map(|p| (p, HitScan::default())),
            _inflight: parts.inflight,
        };
        if let Some(f) = &first {
            relay.observe(f);
        }
        relay.first = first;
        relay
    }

    fn observe(&mut self, frame: &Frame<Bytes>) {
        if let (Some((_, scan)), Some(data)) = (self.hits.as_mut(), frame.data_ref()) {
            scan.feed(data);
        }
        let (Some(t), Some(data)) = (self.timing.as_mut(), frame.data_ref()) else {
            return;
        };
        if data.is_empty() {
            return;
        }
        let now = Instant::now();
        match t.first {
            None => {
                t.first = Some(now);
                self.metrics
                    .time_to_first_token
                    .observe(now.duration_since(t.start).as_secs_f64());
            }
            Some(_) => {
                let events = count_events(data);
                if events > 0 {
                    t.events += events;
                    t.last = Some(now);
                }
            }
        }
    }

    /// Ends the relay with the frame just passed when the engine's body says it was the last:
    /// an answer of known length (a JSON one) is not polled again once whole, so its end would
    /// otherwise never be seen and the request counted as cancelled.
    fn end_if_whole(&mut self) {
        if self.rest.is_end_stream() {
            let outcome = self.end_outcome;
            self.end(outcome);
        }
    }

    fn end(&mut self, outcome: Outcome) {
        self.finished = true;
        if outcome == Outcome::Ok
            && let Some((predicted, scan)) = &self.hits
            && let Some(reported) = scan.cached_tokens()
        {
            tracing::debug!(predicted, reported, "hit tokens");
            self.metrics.hits_reported(*predicted, reported);
        }
        if outcome == Outcome::Ok
            && let Some(Timing {
                first: Some(first),
                last: Some(last),
                events,
                ..
            }) = self.timing
            && events > 0
        {
            let per = last.duration_since(first).as_secs_f64() / events as f64;
            self.metrics.time_per_output_token.observe(per);
        }
        self.tally.finish(outcome);
    }
}

/// Server-sent events ended in `data` (a blank line each), the final `[DONE]` not counted.
fn count_events(data: &[u8]) -> u64 {
    let ends = data.windows(2).filter(|w| w == b"\n\n").count() as u64;
    let done = data.windows(6).any(|w| w == b"[DONE]");
    ends.saturating_sub(u64::from(done))
}

impl Body for Relay {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if this.finished {
            return Poll::Ready(None);
        }
        if let Some(frame) = this.first.take() {
            this.end_if_whole();
            return Poll::Ready(Some(Ok(frame)));
        }
        if this.deadline.as_mut().poll(cx).is_ready() {
            tracing::warn!("request timed out while streaming; cutting the answer");
            this.end(Outcome::Timeout);
            return Poll::Ready(Some(Err("the request timed out".into())));
        }
        match ready!(Pin::new(&mut this.rest).poll_frame(cx)) {
            Some(Ok(frame)) => {
                this.observe(&frame);
                this.end_if_whole();
                Poll::Ready(Some(Ok(frame)))
            }
            Some(Err(e)) => {
                tracing::warn!(error = %e, "the engine's answer broke off");
                this.end(Outcome::Unavailable);
                Poll::Ready(Some(Err(e.into())))
            }
            None => {
                let outcome = this.end_outcome;
                this.end(outcome);
                Poll::Ready(None)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        // never "ended" before the relay saw the end itself, so that its outcome is counted
        self.finished
    }

    fn size_hint(&self) -> SizeHint {
        let rest = self.rest.size_hint();
        let first = self
            .first
            .as_ref()
            .and_then(|f| f.data_ref())
            .map_or(0, |d| d.len() as u64);
        let mut hint = SizeHint::new();
        // the upper bound first: a lower bound above the current upper one is refused
        if let Some(upper) = rest.upper() {
            hint.set_upper(upper.saturating_add(first));
        }
        hint.set_lower(rest.lower().saturating_add(first));
        hint
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_events_without_done() {
        assert_eq!(count_events(b"data: {\"a\":1}\n\n"), 1);
        assert_eq!(count_events(b"data: 1\n\ndata: 2\n\n"), 2);
        assert_eq!(count_events(b"data: 1\n\ndata: [DONE]\n\n"), 1);
        assert_eq!(count_events(b"data: [DONE]\n\n"), 0);
        assert_eq!(count_events(b"{\"id\":1}"), 0);
    }
}
