//! `BlockWatch`: one tenant's block events (`Store.watch_blocks()`, KV events for routers) as a
//! Python iterator of dicts, each wait given up when the interpreter exits (`exit.rs`) or the
//! watch is closed.
//!
//! Waits never hold the GIL, and nothing that holds the GIL waits for a wait: `next()` waits on
//! the stream with the GIL released, and `close()` only fires [`BlockWatch::closed`], which every
//! wait selects on, then drops the stream once that wait let it go (again with the GIL
//! released). So a thread blocked in `next()` never keeps another thread's `close()` waiting, and
//! that `next()` answers `None` at once.

use std::time::Duration;

use tokio::sync::watch;

use kvcache_store::error::StoreError as Refusal;
use kvcache_store::proto::BlockEvent;
use pyo3::prelude::*;

use crate::{exit, raise};

/// A stream of one tenant's block events (`Store.watch_blocks()`). Each event is a dict:
/// `epoch`, `id`, `snapshot`, `type` (`cleared`, `stored` or `removed`), `keys`, and `size`
/// (stored) or `reason` (removed). The stream ends with `StoreError` (`NOT_SERVING`) when the
/// leader stops serving: watch again, and the new leader's stream starts with `cleared`.
#[pyclass(module = "kvcache._native", frozen)]
pub struct BlockWatch {
    rt: tokio::runtime::Handle,
    /// held by the one `next()` that waits on it; `None` once the stream ended or was closed
    stream: tokio::sync::Mutex<Option<tonic::Streaming<BlockEvent>>>,
    /// `true` once `close()` was called: every wait gives up
    closed: watch::Sender<bool>,
}

impl BlockWatch {
    pub fn new(rt: tokio::runtime::Handle, stream: tonic::Streaming<BlockEvent>) -> Self {
        Self {
            rt,
            stream: tokio::sync::Mutex::new(Some(stream)),
            closed: watch::Sender::new(false),
        }
    }
}

#[pymethods]
impl BlockWatch {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        match self.next(py, None)? {
            Some(e) => Ok(e),
            None => Err(pyo3::exceptions::PyStopIteration::new_err(())),
        }
    }

    /// The next event, waiting at most `timeout` seconds (`None` when none came, or the stream
    /// was closed).
    #[pyo3(signature = (timeout = None))]
    fn next<'py>(&self, py: Python<'py>, timeout: Option<f64>) -> PyResult<Option<Bound<'py, pyo3::types::PyDict>>> {
        // a timeout too long for a Duration (or infinite) waits as long as none
        let limit = timeout.and_then(|t| Duration::try_from_secs_f64(t.max(0.0)).ok());
        let mut closed = self.closed.subscribe();
        let got = exit::detach(py, |stop| {
            let wait = async {
                // a wait that is still out (another thread's) holds the stream: waiting for it
                // is waiting for the next event too, and both give up on close
                let mut guard = tokio::select! {
                    g = self.stream.lock() => g,
                    _ = closed.wait_for(|c| *c) => return Ok(None),
                };
                let Some(stream) = guard.as_mut() else {
                    return Ok(None);
                };
                let next = async {
                    match limit {
                        Some(t) => tokio::time::timeout(t, stream.message()).await.ok(),
                        None => Some(stream.message().await),
                    }
                };
                // `None`: nothing came within the limit, or the watch was closed
                let r = tokio::select! {
                    r = next => r,
                    _ = closed.wait_for(|c| *c) => None,
                };
                match r {
                    None => Ok(None),
                    Some(Ok(Some(e))) => Ok(Some(e)),
                    Some(Ok(None)) => {
                        guard.take();
                        Ok(None)
                    }
                    Some(Err(status)) => {
                        guard.take();
                        Err(Refusal::from_status(&status))
                    }
                }
            };
            self.rt.block_on(stop.or(wait))
        });
        let Some(e) = got.map_err(raise)? else { return Ok(None) };
        event_dict(py, e).map(Some)
    }

    /// Stops following: a `next()` waiting in another thread answers `None` at once, and so
    /// does every later one.
    fn close(&self, py: Python<'_>) {
        self.closed.send_replace(true);
        // the waits let go of the stream as soon as they see the close; dropping it ends the call
        // (refused only while the interpreter exits, which ends the call anyway)
        let _ = exit::detach(py, |_| {
            drop(self.rt.block_on(self.stream.lock()).take());
            Ok(())
        });
    }
}

fn event_dict(py: Python<'_>, e: BlockEvent) -> PyResult<Bound<'_, pyo3::types::PyDict>> {
    use kvcache_store::proto::block_event::Event;
    let d = pyo3::types::PyDict::new(py);
    d.set_item("epoch", e.epoch)?;
    d.set_item("id", e.id)?;
    d.set_item("snapshot", e.snapshot)?;
    match e.event {
        Some(Event::Cleared(_)) | None => {
            d.set_item("type", "cleared")?;
            d.set_item("keys", Vec::<String>::new())?;
        }
        Some(Event::Stored(s)) => {
            d.set_item("type", "stored")?;
            d.set_item("keys", s.keys)?;
            d.set_item("size", s.size)?;
        }
        Some(Event::Removed(r)) => {
            d.set_item("type", "removed")?;
            d.set_item("keys", r.keys)?;
            d.set_item("reason", r.reason)?;
        }
    }
    Ok(d)
}
