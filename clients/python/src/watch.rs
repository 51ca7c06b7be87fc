//! `BlockWatch`: one tenant's block events (`Store.watch_blocks()`, KV events for routers) as a
//! Python iterator of dicts, each wait given up when the interpreter exits (`exit.rs`).

use std::time::Duration;

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
    stream: parking_lot::Mutex<Option<tonic::Streaming<BlockEvent>>>,
}

impl BlockWatch {
    pub fn new(rt: tokio::runtime::Handle, stream: tonic::Streaming<BlockEvent>) -> Self {
        Self {
            rt,
            stream: parking_lot::Mutex::new(Some(stream)),
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
        let got = exit::detach(py, |stop| {
            let mut guard = self.stream.lock();
            let Some(stream) = guard.as_mut() else {
                return Ok(None);
            };
            // `None`: nothing came within the limit
            let wait = async {
                Ok(match limit {
                    Some(t) => tokio::time::timeout(t, stream.message()).await.ok(),
                    None => Some(stream.message().await),
                })
            };
            let Some(r) = self.rt.block_on(stop.or(wait))? else {
                return Ok(None);
            };
            match r {
                Ok(Some(e)) => Ok(Some(e)),
                Ok(None) => {
                    guard.take();
                    Ok(None)
                }
                Err(status) => {
                    guard.take();
                    Err(Refusal::from_status(&status))
                }
            }
        });
        let Some(e) = got.map_err(raise)? else { return Ok(None) };
        event_dict(py, e).map(Some)
    }

    /// Stops following.
    fn close(&self) {
        self.stream.lock().take();
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
