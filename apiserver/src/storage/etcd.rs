//! The [`Storage`] trait over etcd (`--storage etcd://host:port[,host:port...]`), for when one
//! machine is not enough. Keys live under `--storage-prefix` (default `/kvcache`); the
//! `resourceVersion` is etcd's mod revision; a transaction is one etcd `Txn` (a `ModRevision`
//! compare is `mod_revision(key) == r`, which a missing key meets with `r = 0`; `NoneNewer` is a
//! range compare over the prefix). Lists are read at one revision and filtered before the
//! limit, page by page. Watches come from one etcd watch of the whole prefix, started where the
//! connection began, fanned out through the same bounded [`Hub`] as the embedded storage; a
//! start older than the hub's history is "too old" (410). Compaction runs periodically, to the
//! revision seen one interval earlier, as kube-apiserver's does.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, Txn as EtcdTxn, TxnOp, WatchOptions,
};

use super::watch::{EventKind, Hub, WatchEvent, WatchStream};
use super::{KeyValue, ListRequest, ListResponse, Op, Result, Storage, StorageError, Txn, TxnOutcome};

/// How the server reaches etcd.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdOptions {
    /// `host:port` of each member.
    pub endpoints: Vec<String>,
    /// Prefix of every key this server writes (`/kvcache`).
    pub prefix: String,
    /// Time between compactions; zero never compacts.
    pub compaction_interval: Duration,
    pub request_timeout: Duration,
    /// TLS to etcd: the CA to trust (`--etcd-cafile`), and a client certificate and key
    /// (`--etcd-certfile`, `--etcd-keyfile`), as PEM.
    pub tls: Option<EtcdTls>,
}

/// TLS material for etcd, as PEM bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdTls {
    pub ca: Vec<u8>,
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl EtcdOptions {
    /// Parses `etcd://host:port[,host:port...]`.
    pub fn parse(url: &str) -> std::result::Result<EtcdOptions, String> {
        let rest = url
            .strip_prefix("etcd://")
            .ok_or_else(|| format!("{url:?}: an etcd storage is written etcd://host:port[,host:port...]"))?;
        let endpoints: Vec<String> = rest
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(str::to_owned)
            .collect();
        if endpoints.is_empty() || endpoints.iter().any(|e| !e.contains(':') || e.contains('/')) {
            return Err(format!(
                "{url:?}: name each etcd member as host:port, separated by commas (etcd://127.0.0.1:2379)"
            ));
        }
        Ok(EtcdOptions {
            endpoints,
            prefix: "/kvcache".into(),
            compaction_interval: Duration::from_secs(300),
            request_timeout: Duration::from_secs(10),
            tls: None,
        })
    }
}

/// Objects in etcd.
pub struct Etcd {
    client: Client,
    prefix: String,
    hub: Arc<Hub>,
    healthy: Arc<AtomicBool>,
    stop: tokio_util::sync::CancellationToken,
}

impl std::fmt::Debug for Etcd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Etcd")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn unavailable(e: etcd_client::Error) -> StorageError {
    StorageError::Unavailable(format!("etcd: {e}"))
}

fn rev(r: i64) -> u64 {
    u64::try_from(r).unwrap_or(0)
}

fn irev(r: u64) -> i64 {
    i64::try_from(r).unwrap_or(i64::MAX)
}

/// The first key after every key starting with `prefix` (etcd's range end for a prefix).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

impl Etcd {
    /// Connects, and starts the watch feeding `hub` and the periodic compaction.
    pub async fn connect(opts: &EtcdOptions, hub: Arc<Hub>) -> Result<Etcd> {
        let mut options = ConnectOptions::new()
            .with_connect_timeout(opts.request_timeout)
            .with_timeout(opts.request_timeout)
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5));
        if let Some(tls) = &opts.tls {
            let mut t = etcd_client::TlsOptions::new().ca_certificate(etcd_client::Certificate::from_pem(&tls.ca));
            if let Some((cert, key)) = &tls.identity {
                t = t.identity(etcd_client::Identity::from_pem(cert, key));
            }
            options = options.with_tls(t);
        }
        let mut client = Client::connect(&opts.endpoints, Some(options)).await.map_err(|e| {
            StorageError::Unavailable(format!("connecting to etcd at {}: {e}", opts.endpoints.join(",")))
        })?;
        let prefix = opts.prefix.trim_end_matches('/').to_owned();
        let start = rev(client
            .get(prefix.as_bytes(), Some(GetOptions::new().with_count_only()))
            .await
            .map_err(unavailable)?
            .header()
            .map_or(0, |h| h.revision()));
        hub.start_after(start);
        let healthy = Arc::new(AtomicBool::new(true));
        let stop = tokio_util::sync::CancellationToken::new();
        tokio::spawn(pump(
            client.clone(),
            prefix.clone(),
            hub.clone(),
            start,
            healthy.clone(),
            stop.clone(),
        ));
        if !opts.compaction_interval.is_zero() {
            tokio::spawn(compact(client.clone(), opts.compaction_interval, stop.clone()));
        }
        Ok(Etcd {
            client,
            prefix,
            hub,
            healthy,
            stop,
        })
    }

    fn full(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    fn ours(&self, kv: &etcd_client::KeyValue) -> KeyValue {
        let key = String::from_utf8_lossy(kv.key());
        KeyValue {
            key: key.strip_prefix(&self.prefix).unwrap_or(&key).to_owned(),
            value: Arc::from(kv.value()),
            create_revision: rev(kv.create_revision()),
            mod_revision: rev(kv.mod_revision()),
        }
    }
}

/// Feeds the hub from one etcd watch of the whole prefix; after a broken stream it resumes from
/// the last revision it delivered, and if etcd compacted past that it ends every watcher (they
/// list again) and starts over from now.
async fn pump(
    mut client: Client,
    prefix: String,
    hub: Arc<Hub>,
    start: u64,
    healthy: Arc<AtomicBool>,
    stop: tokio_util::sync::CancellationToken,
) {
    let mut next = start + 1;
    while !stop.is_cancelled() {
        let opts = WatchOptions::new()
            .with_prefix()
            .with_prev_key()
            .with_start_revision(irev(next));
        let opened = tokio::select! {
            r = client.watch(prefix.as_bytes(), Some(opts)) => r,
            () = stop.cancelled() => return,
        };
        let mut stream = match opened {
            Ok(w) => w,
            Err(e) => {
                healthy.store(false, Ordering::Relaxed);
                tracing::warn!("etcd watch could not start, retrying: {e}");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        healthy.store(true, Ordering::Relaxed);
        loop {
            let msg = tokio::select! {
                m = stream.message() => m,
                () = stop.cancelled() => return,
            };
            let resp = match msg {
                Ok(Some(r)) => r,
                Ok(None) | Err(_) => break,
            };
            if resp.compact_revision() > 0 {
                next = restart_after_compaction(&mut client, &prefix, &hub, resp.compact_revision(), next).await;
                break;
            }
            hub.publish(watch_events(&resp, &prefix, &mut next));
        }
        healthy.store(false, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// etcd compacted past the watch: ends every watcher and restarts the hub after etcd's current
/// revision (`next - 1` if it cannot be read); returns the revision to watch from.
async fn restart_after_compaction(client: &mut Client, prefix: &str, hub: &Hub, compacted: i64, next: u64) -> u64 {
    tracing::warn!(
        compacted,
        "etcd compacted past this server's watch; every watcher lists again"
    );
    hub.close_all();
    let now = client
        .get(prefix.as_bytes(), Some(GetOptions::new().with_count_only()))
        .await
        .ok()
        .and_then(|r| r.header().map(|h| rev(h.revision())))
        .unwrap_or(next);
    hub.start_after(now);
    now + 1
}

/// The hub's events for one watch response, keys without `prefix`; advances `next` past them.
fn watch_events(resp: &etcd_client::WatchResponse, prefix: &str, next: &mut u64) -> Vec<WatchEvent> {
    let strip = |k: &[u8]| {
        let k = String::from_utf8_lossy(k);
        k.strip_prefix(prefix).unwrap_or(&k).to_owned()
    };
    let mut batch = Vec::new();
    for ev in resp.events() {
        let Some(kv) = ev.kv() else { continue };
        let prev = ev.prev_kv().map(|p| Arc::from(p.value()));
        let revision = rev(kv.mod_revision());
        let (kind, value, create_revision) = match ev.event_type() {
            EventType::Put => (EventKind::Put, Arc::from(kv.value()), rev(kv.create_revision())),
            EventType::Delete => (
                EventKind::Delete,
                prev.clone().unwrap_or_else(|| Arc::from(&b""[..])),
                ev.prev_kv().map_or(0, |p| rev(p.create_revision())),
            ),
        };
        *next = (*next).max(revision + 1);
        batch.push(WatchEvent {
            kind,
            key: strip(kv.key()),
            revision,
            value,
            prev_value: prev,
            create_revision,
        });
    }
    batch
}

/// Compacts to the revision seen one interval earlier.
async fn compact(mut client: Client, every: Duration, stop: tokio_util::sync::CancellationToken) {
    let mut previous: Option<i64> = None;
    loop {
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = stop.cancelled() => return,
        }
        let now = match client
            .get("compaction", Some(GetOptions::new().with_count_only()))
            .await
        {
            Ok(r) => r.header().map_or(0, |h| h.revision()),
            Err(e) => {
                tracing::warn!("etcd compaction skipped: {e}");
                continue;
            }
        };
        if let Some(p) = previous
            && p > 0
            && let Err(e) = client.compact(p, None).await
        {
            tracing::debug!(revision = p, "etcd compaction: {e}");
        }
        previous = Some(now);
    }
}

#[async_trait]
impl Storage for Etcd {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        let mut kv = self.client.kv_client();
        let r = kv.get(self.full(key), None).await.map_err(unavailable)?;
        Ok(r.kvs().first().map(|kv| self.ours(kv)))
    }

    async fn list(&self, req: ListRequest) -> Result<ListResponse> {
        let mut kv = self.client.kv_client();
        let limit = req.limit.filter(|l| *l > 0).unwrap_or(usize::MAX);
        let start = self.full(&req.prefix);
        let end = prefix_end(start.as_bytes());
        let mut from: Vec<u8> = match &req.start_after {
            // the first key after it
            Some(after) => {
                let mut k = self.full(after).into_bytes();
                k.push(0);
                k
            }
            None => start.clone().into_bytes(),
        };
        let mut revision = req.revision.map(irev);
        let mut items = Vec::new();
        let batch = i64::try_from(limit.clamp(1, 1000)).unwrap_or(1000);
        loop {
            let mut opts = GetOptions::new().with_range(end.clone()).with_limit(batch);
            if let Some(r) = revision {
                opts = opts.with_revision(r);
            }
            let r = match kv.get(from.clone(), Some(opts)).await {
                Ok(r) => r,
                Err(etcd_client::Error::GRpcStatus(s)) if s.message().contains("compacted") => {
                    return Err(StorageError::Expired {
                        requested: req.revision.unwrap_or(0),
                        oldest: 0,
                    });
                }
                Err(e) => return Err(unavailable(e)),
            };
            let at = r.header().map_or(0, |h| h.revision());
            let read_at = *revision.get_or_insert(at);
            let kvs = r.kvs();
            for item in kvs {
                let ours = self.ours(item);
                if req.filter.as_ref().is_some_and(|f| !f(&ours)) {
                    continue;
                }
                if items.len() == limit {
                    return Ok(ListResponse {
                        items,
                        revision: rev(read_at),
                        more: true,
                    });
                }
                // whether more follow a full page is decided by the next match
                items.push(ours);
            }
            if !r.more() || kvs.is_empty() {
                return Ok(ListResponse {
                    items,
                    revision: rev(read_at),
                    more: false,
                });
            }
            from = kvs
                .last()
                .map(|k| {
                    let mut v = k.key().to_vec();
                    v.push(0);
                    v
                })
                .unwrap_or_default();
        }
    }

    async fn txn(&self, txn: Txn) -> Result<TxnOutcome> {
        let compares: Vec<Compare> = txn
            .compares
            .iter()
            .map(|c| match c {
                super::Compare::ModRevision { key, revision } => {
                    Compare::mod_revision(self.full(key), CompareOp::Equal, irev(*revision))
                }
                super::Compare::NoneNewer { prefix, revision } => {
                    let p = self.full(prefix);
                    let end = prefix_end(p.as_bytes());
                    Compare::mod_revision(p, CompareOp::Less, irev(*revision).saturating_add(1)).with_range(end)
                }
            })
            .collect();
        let ops: Vec<TxnOp> = txn
            .ops
            .iter()
            .map(|o| match o {
                Op::Put { key, value } => TxnOp::put(self.full(key), value.to_vec(), None),
                Op::Delete { key } => TxnOp::delete(self.full(key), None),
            })
            .collect();
        let mut kv = self.client.kv_client();
        let r = kv
            .txn(EtcdTxn::new().when(compares).and_then(ops))
            .await
            .map_err(unavailable)?;
        let revision = rev(r.header().map_or(0, |h| h.revision()));
        Ok(if r.succeeded() {
            TxnOutcome::Committed { revision }
        } else {
            TxnOutcome::CompareFailed { revision }
        })
    }

    async fn wait_for_revision(&self, revision: u64) -> Result<()> {
        while self.current_revision().await? < revision {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(())
    }

    async fn current_revision(&self) -> Result<u64> {
        let mut kv = self.client.kv_client();
        let r = kv
            .get(self.prefix.as_bytes(), Some(GetOptions::new().with_count_only()))
            .await
            .map_err(unavailable)?;
        Ok(rev(r.header().map_or(0, |h| h.revision())))
    }

    async fn watch(&self, prefix: &str, after_revision: u64) -> Result<WatchStream> {
        self.hub.subscribe(prefix, after_revision)
    }

    async fn count(&self, prefix: &str) -> Result<u64> {
        let mut kv = self.client.kv_client();
        let start = self.full(prefix);
        let end = prefix_end(start.as_bytes());
        let r = kv
            .get(start, Some(GetOptions::new().with_range(end).with_count_only()))
            .await
            .map_err(unavailable)?;
        Ok(rev(r.count()))
    }

    fn health(&self) -> Result<()> {
        if self.healthy.load(Ordering::Relaxed) {
            Ok(())
        } else {
            Err(StorageError::Unavailable(
                "the watch of etcd is down; reconnecting".into(),
            ))
        }
    }
}

#[cfg(test)]
mod tests;
