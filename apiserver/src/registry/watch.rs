//! Watches of one kind: the initial state as `Added` events when asked for, then durable changes
//! as typed events, filtered by the label and field selectors (an object that starts or stops
//! matching is `Added` or `Deleted` for this watcher, as in Kubernetes).
//!
//! Events carry the stored JSON with its `resourceVersion` spliced in, so a watcher of thousands
//! of objects costs copies, not decodes. How events are written on the wire (JSON lines, Tables,
//! bookmarks, timeouts) is the watch handler's job.

use std::collections::VecDeque;
use std::sync::Arc;

use super::dynamic::{MetaFilter, metadata_matches};
use super::encoded_with_revision;
use super::errors::RegistryError;
use crate::storage::{EventKind, KeyValue, Storage, StorageError, WatchStream, watch::WatchClosed};

/// Where a watch starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// The current state first, as `Added` events (`resourceVersion` unset or `0`).
    Initial,
    /// Only changes after this revision.
    After(u64),
    /// Only changes from now on (`sendInitialEvents=false` without a `resourceVersion`).
    Now,
}

/// What a watch asks for.
#[derive(Clone)]
pub struct WatchOptions {
    pub start: Start,
    pub filter: Option<MetaFilter>,
    /// End the initial events with [`Event::InitialEventsEnd`] (`sendInitialEvents=true`).
    pub initial_events_end: bool,
}

/// One event for a watcher. Objects are JSON bytes with `resourceVersion` set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Added(Vec<u8>),
    Modified(Vec<u8>),
    Deleted(Vec<u8>),
    /// The initial events are over; the state is complete as of this revision.
    InitialEventsEnd(u64),
}

/// Why a watch ended.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Closed {
    #[error(transparent)]
    Storage(#[from] WatchClosed),
}

/// An open watch.
pub struct Watch {
    initial: VecDeque<Event>,
    stream: WatchStream,
    filter: Option<MetaFilter>,
    revision: u64,
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch").field("revision", &self.revision).finish()
    }
}

impl Watch {
    /// Opens a watch of the keys under `prefix`. A start older than the storage keeps answers
    /// [`RegistryError::Expired`]: the client lists again.
    pub async fn open(storage: &Arc<dyn Storage>, prefix: String, opts: WatchOptions) -> Result<Watch, RegistryError> {
        let mut initial = VecDeque::new();
        let revision = match opts.start {
            Start::After(rv) => rv,
            Start::Now => storage.current_revision().await?,
            Start::Initial => {
                let page = storage
                    .list(crate::storage::ListRequest {
                        prefix: prefix.clone(),
                        filter: opts.filter.clone().map(|f| {
                            let f: crate::storage::ListFilter =
                                Arc::new(move |kv: &KeyValue| metadata_matches(kv, Some(&f)));
                            f
                        }),
                        ..Default::default()
                    })
                    .await?;
                for kv in &page.items {
                    initial.push_back(Event::Added(encoded_with_revision(kv)?));
                }
                page.revision
            }
        };
        if opts.initial_events_end {
            initial.push_back(Event::InitialEventsEnd(revision));
        }
        let stream = match storage.watch(&prefix, revision).await {
            Ok(s) => s,
            Err(StorageError::Expired { requested, oldest }) => {
                return Err(RegistryError::Expired(format!(
                    "too old resource version: {requested} ({oldest})"
                )));
            }
            Err(e) => return Err(e.into()),
        };
        Ok(Watch {
            initial,
            stream,
            filter: opts.filter,
            revision,
        })
    }

    /// The revision of the last event returned (or where the watch started).
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// Resolves once the storage closed this watch as too slow (see `WatchStream::lagged`).
    pub async fn lagged(&self) {
        self.stream.lagged().await;
    }

    /// The next event for this watcher, or why the watch ended.
    pub async fn next(&mut self) -> Result<Event, Closed> {
        if let Some(e) = self.initial.pop_front() {
            return Ok(e);
        }
        loop {
            let ev = self.stream.next().await?;
            self.revision = ev.revision;
            let kv = |value: &crate::storage::Value| KeyValue {
                key: ev.key.clone(),
                value: value.clone(),
                create_revision: ev.create_revision,
                mod_revision: ev.revision,
            };
            let filter = self.filter.as_ref();
            let matches = |value: &crate::storage::Value| metadata_matches(&kv(value), filter);
            let was = ev.prev_value.as_ref().is_some_and(matches);
            let event = match ev.kind {
                EventKind::Put => match (matches(&ev.value), was) {
                    (true, true) => Event::Modified,
                    (true, false) => Event::Added,
                    // It stopped matching the selectors: gone from this watcher's view.
                    (false, true) => Event::Deleted,
                    (false, false) => continue,
                },
                EventKind::Delete if matches(&ev.value) => Event::Deleted,
                EventKind::Delete => continue,
            };
            match encoded_with_revision(&kv(&ev.value)) {
                Ok(bytes) => return Ok(event(bytes)),
                Err(e) => {
                    tracing::warn!(key = ev.key, error = %e, "a stored object could not be encoded for a watch; skipped");
                }
            }
        }
    }
}
