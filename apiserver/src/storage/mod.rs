//! API persistence: a versioned key-value store with multi-key transactions and watch.
//!
//! The trait speaks keys, bytes and revisions, never kinds: the registry above it decides what a
//! key means. Its model is etcd's, so that an etcd backend is a thin adapter:
//!
//! - every committed transaction gets the next value of one global **revision** counter; a key's
//!   `mod_revision` is the object's `resourceVersion`;
//! - a [`Txn`] is a list of [`Compare`]s and a list of [`Op`]s: if every compare holds against the
//!   latest state, all ops apply atomically at one revision, else nothing applies and the caller
//!   re-reads and retries (optimistic concurrency);
//! - reads see only **durable** state: a value is visible to `get`/`list`/`watch` once it would
//!   survive a crash, never before;
//! - `watch` streams durable changes under a prefix after a revision, from a bounded history;
//!   a revision older than the history answers [`StorageError::Expired`] (HTTP 410).
//!
//! | module | owns |
//! |---|---|
//! | [`keys`] | the key layout of objects and claims |
//! | [`watch`] | the fan-out of durable events to watchers, with bounded history and queues |
//! | [`metrics`] | commit, sync, log size, compaction and object-count figures |
//! | [`embedded`] | the default implementation: an append-only, checksummed, group-committed log |
//! | [`etcd`] | the same trait over an etcd cluster (`--storage etcd://...`), for several replicas |

pub mod embedded;
pub mod etcd;
pub mod keys;
pub mod metrics;
pub mod watch;

#[cfg(test)]
mod conformance;

use std::sync::Arc;

use async_trait::async_trait;

pub use watch::{EventKind, WatchEvent, WatchStream};

/// Bytes of a stored value, shared without copying between the index, history and watchers.
pub type Value = Arc<[u8]>;

/// One key at one revision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyValue {
    pub key: String,
    pub value: Value,
    /// Revision at which the key was created (since its last deletion).
    pub create_revision: u64,
    /// Revision of the last change: the object's `resourceVersion`.
    pub mod_revision: u64,
}

/// A condition a transaction checks against the latest state before applying.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Compare {
    /// The key's `mod_revision` equals `revision`; `0` means the key does not exist.
    ModRevision { key: String, revision: u64 },
    /// No key under `prefix` was created or changed after `revision`.
    NoneNewer { prefix: String, revision: u64 },
}

/// A change a transaction applies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    Put {
        key: String,
        value: Value,
    },
    /// Deleting a key that does not exist is a no-op.
    Delete {
        key: String,
    },
}

/// Compares and ops applied atomically.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Txn {
    pub compares: Vec<Compare>,
    pub ops: Vec<Op>,
}

/// What a transaction did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxnOutcome {
    /// All ops applied at `revision` and are durable.
    Committed { revision: u64 },
    /// A compare failed; nothing applied. `revision` is the latest revision at that moment:
    /// wait for it with [`Storage::wait_for_revision`] before re-reading.
    CompareFailed { revision: u64 },
}

/// A filter evaluated inside `list`, so that `limit` counts matching items.
pub type ListFilter = Arc<dyn Fn(&KeyValue) -> bool + Send + Sync>;

/// A range read.
#[derive(Clone, Default)]
pub struct ListRequest {
    pub prefix: String,
    /// Read at this revision (for paging); `None` reads the latest durable state.
    pub revision: Option<u64>,
    /// Start strictly after this key (the continue point of the previous page).
    pub start_after: Option<String>,
    /// At most this many items; `None` or `0` means all.
    pub limit: Option<usize>,
    pub filter: Option<ListFilter>,
}

impl std::fmt::Debug for ListRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ListRequest")
            .field("prefix", &self.prefix)
            .field("revision", &self.revision)
            .field("start_after", &self.start_after)
            .field("limit", &self.limit)
            .field("filter", &self.filter.is_some())
            .finish()
    }
}

/// The result of a range read: items in key order, all as of `revision`.
#[derive(Clone, Debug, Default)]
pub struct ListResponse {
    pub items: Vec<KeyValue>,
    pub revision: u64,
    /// More matching items exist after the last one returned.
    pub more: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// The requested revision was compacted away: re-list from the latest state.
    #[error("the requested revision {requested} has been compacted; the oldest available is {oldest}")]
    Expired { requested: u64, oldest: u64 },
    /// The store cannot accept writes (a failed sync, a closed store). Reads may still work.
    #[error("storage is unavailable: {0}")]
    Unavailable(String),
    /// The disk is full: writes are refused until space returns, then resume by themselves.
    /// Reads keep working.
    #[error("storage is out of space: {0}")]
    NoSpace(String),
    /// The data on disk cannot be trusted; the message says where and what to do.
    #[error("storage data is corrupt: {0}")]
    Corrupt(String),
    #[error("invalid storage request: {0}")]
    InvalidRequest(String),
    #[error("storage I/O error: {context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

impl StorageError {
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        StorageError::Io {
            context: context.into(),
            source,
        }
    }
}

pub type Result<T, E = StorageError> = std::result::Result<T, E>;

/// A versioned key-value store with transactions and watch.
#[async_trait]
pub trait Storage: Send + Sync + 'static {
    /// The latest durable value of `key`.
    async fn get(&self, key: &str) -> Result<Option<KeyValue>>;

    /// Items under a prefix, consistent at one revision.
    async fn list(&self, request: ListRequest) -> Result<ListResponse>;

    /// Applies `txn` atomically if its compares hold; returns once the result is durable.
    async fn txn(&self, txn: Txn) -> Result<TxnOutcome>;

    /// Returns once reads reflect at least `revision`.
    async fn wait_for_revision(&self, revision: u64) -> Result<()>;

    /// The latest durable revision.
    async fn current_revision(&self) -> Result<u64>;

    /// Durable changes under `prefix` with a revision greater than `after_revision`.
    async fn watch(&self, prefix: &str, after_revision: u64) -> Result<WatchStream>;

    /// How many keys are under `prefix` (the objects-per-kind metric).
    async fn count(&self, prefix: &str) -> Result<u64> {
        let page = self
            .list(ListRequest {
                prefix: prefix.to_owned(),
                ..Default::default()
            })
            .await?;
        Ok(u64::try_from(page.items.len()).unwrap_or(u64::MAX))
    }

    /// Whether writes can still succeed (`/readyz` reports it).
    fn health(&self) -> Result<()> {
        Ok(())
    }
}
