//! Storage figures, on the registry the composition root passes in: objects per kind
//! (`apiserver_storage_objects`, kube-apiserver's name, refreshed periodically), how long a
//! commit takes from queueing to acknowledgement, how long each `fdatasync` takes, the log's size,
//! the compactions done, and the watch fan-out's open watchers and the bytes its history holds.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabel {
    pub resource: &'static str,
}

/// The storage's metrics. [`StorageMetrics::default`] makes unregistered ones (offline tools and
/// tests, which serve no `/metrics`).
#[derive(Clone, Debug)]
pub struct StorageMetrics {
    pub objects: Family<ResourceLabel, Gauge>,
    pub commit_duration: Histogram,
    pub fsync_duration: Histogram,
    pub log_bytes: Gauge,
    pub compactions: Counter,
    /// 1 while writes are refused because the disk is full.
    pub out_of_space: Gauge,
    /// Bytes of keys and values (new and previous) the watch history keeps alive.
    pub watch_history_bytes: Gauge,
    /// Watch streams the storage feeds.
    pub watchers: Gauge,
}

fn seconds() -> Histogram {
    // 50 µs to ~1.6 s.
    Histogram::new(exponential_buckets(0.00005, 2.0, 16))
}

impl Default for StorageMetrics {
    fn default() -> Self {
        StorageMetrics {
            objects: Family::default(),
            commit_duration: seconds(),
            fsync_duration: seconds(),
            log_bytes: Gauge::default(),
            compactions: Counter::default(),
            out_of_space: Gauge::default(),
            watch_history_bytes: Gauge::default(),
            watchers: Gauge::default(),
        }
    }
}

impl StorageMetrics {
    pub fn register(registry: &mut Registry) -> StorageMetrics {
        let m = StorageMetrics::default();
        registry.register(
            "apiserver_storage_objects",
            "Number of stored objects at the time of last check split by kind",
            m.objects.clone(),
        );
        registry.register(
            "apiserver_storage_commit_duration_seconds",
            "Time from a write entering the commit queue to its acknowledgement once durable",
            m.commit_duration.clone(),
        );
        registry.register(
            "apiserver_storage_fsync_duration_seconds",
            "Duration of each fdatasync of the storage log",
            m.fsync_duration.clone(),
        );
        registry.register(
            "apiserver_storage_log_size_bytes",
            "Bytes written to the current storage log",
            m.log_bytes.clone(),
        );
        registry.register(
            "apiserver_storage_compactions",
            "Compactions of the storage log into a new generation",
            m.compactions.clone(),
        );
        registry.register(
            "apiserver_storage_out_of_space",
            "1 while writes are refused because the storage's file system is full",
            m.out_of_space.clone(),
        );
        registry.register(
            "apiserver_storage_watch_history_bytes",
            "Bytes of keys and values the watch history keeps for watches that start in the past",
            m.watch_history_bytes.clone(),
        );
        registry.register(
            "apiserver_storage_watchers",
            "Watch streams the storage currently feeds",
            m.watchers.clone(),
        );
        m
    }
}
