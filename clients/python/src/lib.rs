//! `kvcache._native`: the store's Rust client as a Python class, `Store`. Metadata goes to the
//! leader's fast port and the bytes straight to the members' data ports, as for any Rust
//! client; the GIL is released for every network call. Refusals raise `StoreError`, whose `code`
//! is the store's (`"TENANT_QUOTA_EXCEEDED"`, ...). Batch calls answer key by key with integers:
//! bytes moved (or 0 for a put), [`KEY_NOT_FOUND`] for a miss, and a negative number per store
//! code (`codes()` names them).
//!
//! The shapes follow the reference store's Python client (`setup`/`register_buffer`/
//! `batch_put_from`/`batch_get_into`/`is_exist`/`batch_is_exist`/`remove`/`close`), so adapters
//! written for it port easily; `buffers` holds the one unsafe fence (copies from and to
//! registered memory).

mod buffers;
mod exit;
mod watch;

/// Values are megabytes and short-lived: an allocator that keeps freed large blocks avoids a
/// page fault per 4 KiB of every value (the system allocator maps and unmaps each one).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use kvcache_store::client::Client;
use kvcache_store::engine_sim::SimConfig;
use kvcache_store::error::{ALL, ErrorCode, StoreError as Refusal};
use kvcache_store::proto::Scope;
use kvcache_store::tls::DialFlags;
use parking_lot::RwLock;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use watch::BlockWatch;

pyo3::create_exception!(
    kvcache,
    StoreError,
    PyException,
    "A refusal or failure of the store; `code` is the store's code (e.g. TENANT_QUOTA_EXCEEDED)."
);

/// A batch entry whose key is not in the store.
pub const KEY_NOT_FOUND: i64 = -1;

/// The negative number a batch answers for a store code: -(100 + its place in the list).
fn number(code: ErrorCode) -> i64 {
    let at = ALL.iter().position(|c| *c == code).unwrap_or(ALL.len());
    -(100 + at as i64)
}

fn raise(e: Refusal) -> PyErr {
    Python::attach(|py| {
        let err = StoreError::new_err(e.to_string());
        let _ = err.value(py).setattr("code", e.code.as_str());
        err
    })
}

fn invalid(message: impl Into<String>) -> Refusal {
    Refusal::new(ErrorCode::InvalidArgument, message)
}

/// A connection to one store, for one tenant (reuse domain) and its block layout.
#[pyclass(module = "kvcache._native", frozen)]
struct Store {
    rt: tokio::runtime::Runtime,
    client: RwLock<Option<Client>>,
    buffers: buffers::Buffers,
    endpoint: String,
    /// Longest a call may take before it is given up (`TRANSPORT`); `None`: no limit.
    timeout: Option<Duration>,
}

impl Store {
    fn connect(
        endpoint: &str,
        scope: Scope,
        spin_us: u64,
        same_host: bool,
        timeout_ms: u64,
        tls: DialFlags,
        stop: exit::Stop,
    ) -> Result<Store, Refusal> {
        let tls = tls
            .client_from_env()
            .map_err(|e| Refusal::new(ErrorCode::InvalidArgument, e))?;
        // worker threads, so calls from several Python threads run at once
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("kvcache-client")
            .enable_all()
            .build()
            .map_err(|e| Refusal::new(ErrorCode::Internal, format!("starting the client's runtime: {e}")))?;
        let timeout = (timeout_ms > 0).then(|| Duration::from_millis(timeout_ms));
        let version = kvcache_store::protocol::ClientVersion::ours("kvcache-python");
        let connect = Client::connect_with(endpoint, scope, version, tls);
        let mut client = rt
            .block_on(stop.or(within(timeout, connect)))?
            .with_spin(Duration::from_micros(spin_us));
        if !same_host {
            client = client.without_local();
        }
        Ok(Store {
            rt,
            client: RwLock::new(Some(client)),
            buffers: buffers::Buffers::default(),
            endpoint: endpoint.to_owned(),
            timeout,
        })
    }

    fn client(&self) -> Result<Client, Refusal> {
        self.client
            .read()
            .clone()
            .ok_or_else(|| Refusal::new(ErrorCode::InvalidArgument, "this Store was closed; make a new one"))
    }

    /// Runs `f` on the client's runtime with the GIL released, for at most the Store's timeout.
    fn run<T: Send, F: Future<Output = Result<T, Refusal>> + Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(Client) -> F + Send,
    ) -> PyResult<T> {
        self.run_within(py, self.timeout, f)
    }

    /// [`Store::run`] for at most `timeout`.
    fn run_within<T: Send, F: Future<Output = Result<T, Refusal>> + Send>(
        &self,
        py: Python<'_>,
        timeout: Option<Duration>,
        f: impl FnOnce(Client) -> F + Send,
    ) -> PyResult<T> {
        let client = self.client().map_err(raise)?;
        exit::detach(py, |stop| self.rt.block_on(stop.or(within(timeout, f(client))))).map_err(raise)
    }

    /// A call's own timeout (`timeout_ms`, 0: none), else the Store's.
    fn timeout_of(&self, timeout_ms: Option<u64>) -> Option<Duration> {
        match timeout_ms {
            Some(0) => None,
            Some(ms) => Some(Duration::from_millis(ms)),
            None => self.timeout,
        }
    }
}

/// `f`, given up after `timeout`. Giving up drops the call's future where it waits, so a read
/// into registered memory writes nothing more once this returns (every byte is copied while the
/// future is polled, never by a task of its own).
async fn within<T>(timeout: Option<Duration>, f: impl Future<Output = Result<T, Refusal>>) -> Result<T, Refusal> {
    let Some(t) = timeout else { return f.await };
    match tokio::time::timeout(t, f).await {
        Ok(r) => r,
        Err(_) => Err(Refusal::new(
            ErrorCode::Transport,
            format!(
                "the store did not answer within {} ms; the call was given up (a reservation it made expires on its own)",
                t.as_millis()
            ),
        )),
    }
}

#[pymethods]
impl Store {
    /// `Store(endpoint, tenant, block_size, dtype, spin_us=0, same_host=True, credential="",
    /// timeout_ms=0, client="")`: connects to the leader at `endpoint` (HOST:PORT, the backend's Client
    /// endpoint). With `same_host`, values held by a member on this host move through its mapped
    /// segment (one memcpy) instead of TCP. `credential` proves the tenant, when the ledger binds
    /// it to one. With `timeout_ms`, a call (connecting too) that takes longer is given up with
    /// `TRANSPORT`. `client` names the caller within its tenant (a replica, as `KVSTORE_CLIENT`),
    /// for the leader's per-caller counters. With `tls_ca` (a PEM file; default
    /// `KVSTORE_TLS_CA`, or the PEM itself in `KVSTORE_TLS_CA_PEM`) every connection is TLS, and the leader and members must present
    /// certificates that chain to it and carry `tls_server_name` (default
    /// `KVSTORE_TLS_SERVER_NAME`, else the host dialled).
    #[new]
    #[pyo3(signature = (endpoint, tenant, block_size, dtype, spin_us = 0, same_host = true, credential = String::new(), timeout_ms = 0, client = String::new(), tls_ca = None, tls_server_name = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        endpoint: String,
        tenant: String,
        block_size: u32,
        dtype: String,
        spin_us: u64,
        same_host: bool,
        credential: String,
        timeout_ms: u64,
        client: String,
        tls_ca: Option<String>,
        tls_server_name: Option<String>,
    ) -> PyResult<Self> {
        let env = DialFlags::from_env(|k| std::env::var(k).ok());
        let tls = match tls_ca {
            Some(ca) => DialFlags {
                tls_ca: Some(ca.into()),
                tls_server_name: tls_server_name.or(env.tls_server_name),
                tls_ca_pem: None,
            },
            None => DialFlags {
                tls_server_name: tls_server_name.or(env.tls_server_name),
                ..env
            },
        };
        let scope = Scope {
            tenant,
            block_size,
            dtype,
            credential,
            client,
        };
        exit::detach(py, |stop| {
            Store::connect(&endpoint, scope, spin_us, same_host, timeout_ms, tls, stop)
        })
        .map_err(raise)
    }

    /// A Store from exactly what injection gives a replica: `KVSTORE_LEADER` (or
    /// `MOONCAKE_MASTER`), `KVSTORE_TENANT` (or `MOONCAKE_TENANT_ID`, default `default`),
    /// `KVSTORE_BLOCK_SIZE`, `KVSTORE_DTYPE`, `KVSTORE_CREDENTIAL`, `KVSTORE_CLIENT`,
    /// `KVSTORE_TLS_CA` (or `KVSTORE_TLS_CA_PEM`) and `KVSTORE_TLS_SERVER_NAME`.
    #[staticmethod]
    #[pyo3(signature = (spin_us = 0, same_host = true, timeout_ms = 0))]
    fn from_env(py: Python<'_>, spin_us: u64, same_host: bool, timeout_ms: u64) -> PyResult<Self> {
        let cfg = SimConfig::from_env(|k| std::env::var(k).ok()).map_err(raise)?;
        let Some(endpoint) = cfg.leader else {
            return Err(raise(invalid(
                "no store is configured: set KVSTORE_LEADER (or MOONCAKE_MASTER) to the backend's Client endpoint",
            )));
        };
        let tls = DialFlags::from_env(|k| std::env::var(k).ok());
        exit::detach(py, |stop| {
            Store::connect(&endpoint, cfg.scope, spin_us, same_host, timeout_ms, tls, stop)
        })
        .map_err(raise)
    }

    /// The leader's address this Store talks to.
    #[getter]
    fn endpoint(&self) -> String {
        self.endpoint.clone()
    }

    /// Stores `value` under `key`; a key that exists already is left as it is (values are
    /// immutable, keys content-derived).
    fn put(&self, py: Python<'_>, key: String, value: &[u8]) -> PyResult<()> {
        let value = Bytes::copy_from_slice(value);
        self.run(py, |c| async move { c.put(&key, value).await.map(drop) })
    }

    /// The value under `key`, or `None`.
    fn get<'py>(&self, py: Python<'py>, key: String) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let got = self.run(py, |c| async move { c.get(&key).await })?;
        Ok(got.map(|b| PyBytes::new(py, &b)))
    }

    /// 1 if `key` is stored, else 0.
    fn is_exist(&self, py: Python<'_>, key: String) -> PyResult<i64> {
        self.run(py, |c| async move { c.exists(&key).await.map(i64::from) })
    }

    /// 1 or 0 per key, in order.
    fn batch_is_exist(&self, py: Python<'_>, keys: Vec<String>) -> PyResult<Vec<i64>> {
        self.run(py, |c| async move {
            Ok(c.batch_exists(&keys).await?.into_iter().map(i64::from).collect())
        })
    }

    /// Removes `key`: 1 if it was stored, 0 if not.
    fn remove(&self, py: Python<'_>, key: String) -> PyResult<i64> {
        self.run(py, |c| async move { c.remove(&key).await.map(i64::from) })
    }

    /// Registers host memory that `batch_put_from` and `batch_get_into` may name: it must stay
    /// allocated, and not be written by others while a call naming it runs. Returns 0.
    fn register_buffer(&self, ptr: usize, size: usize) -> PyResult<i64> {
        self.buffers.register(ptr, size).map_err(|e| raise(invalid(e)))?;
        Ok(0)
    }

    /// Stores `size` bytes of registered memory at `ptr` under `key`, straight from that memory:
    /// 0, or a negative code.
    fn put_from(&self, py: Python<'_>, key: String, ptr: usize, size: usize) -> PyResult<i64> {
        Ok(self.batch_put_from(py, vec![key], vec![ptr], vec![size], None)?[0])
    }

    /// Reads the value of `key` straight into registered memory at `ptr` (at most `size`
    /// bytes): the bytes read, `KEY_NOT_FOUND`, or a negative code.
    fn get_into(&self, py: Python<'_>, key: String, ptr: usize, size: usize) -> PyResult<i64> {
        Ok(self.batch_get_into(py, vec![key], vec![ptr], vec![size], None)?[0])
    }

    /// Forgets a registered buffer: 0, or -1 if none starts at `ptr`.
    fn unregister_buffer(&self, ptr: usize) -> i64 {
        if self.buffers.unregister(ptr) { 0 } else { -1 }
    }

    /// Stores `sizes[i]` bytes of registered memory at `ptrs[i]` under `keys[i]`: one leader
    /// call reserves them all, the bytes go straight from that memory to the members, one call
    /// commits. Per key 0 (stored, or already there), or a negative code. `timeout_ms` replaces
    /// the Store's timeout for this call (0: none).
    #[pyo3(signature = (keys, ptrs, sizes, timeout_ms = None))]
    fn batch_put_from(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        ptrs: Vec<usize>,
        sizes: Vec<usize>,
        timeout_ms: Option<u64>,
    ) -> PyResult<Vec<i64>> {
        same_lengths(keys.len(), ptrs.len(), sizes.len())?;
        let ranges: Vec<(usize, usize)> = ptrs.into_iter().zip(sizes).collect();
        let mut out = vec![number(ErrorCode::InvalidArgument); keys.len()];
        let (mut at, mut items) = (Vec::new(), Vec::new());
        for (i, src) in self.buffers.sources(&ranges).into_iter().enumerate() {
            if let Ok(src) = src {
                at.push(i);
                items.push((keys[i].as_str(), src));
            }
        }
        if items.is_empty() {
            return Ok(out);
        }
        let done = self.run_within(
            py,
            self.timeout_of(timeout_ms),
            |c| async move { c.batch_put(&items).await },
        )?;
        for (i, r) in at.into_iter().zip(done) {
            out[i] = match r {
                Ok(_) => 0,
                Err(e) => number(e.code),
            };
        }
        Ok(out)
    }

    /// Reads the values of `keys` straight into registered memory at `ptrs` (at most
    /// `sizes[i]` bytes each; a range overlapping an earlier one is refused): one leader call locates them all.
    /// Per key the bytes read, `KEY_NOT_FOUND`, or a negative code (a value larger than its
    /// size is not read: `VALUE_TOO_LARGE`). `timeout_ms` replaces the Store's timeout for this
    /// call (0: none).
    #[pyo3(signature = (keys, ptrs, sizes, timeout_ms = None))]
    fn batch_get_into(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        ptrs: Vec<usize>,
        sizes: Vec<usize>,
        timeout_ms: Option<u64>,
    ) -> PyResult<Vec<i64>> {
        same_lengths(keys.len(), ptrs.len(), sizes.len())?;
        let ranges: Vec<(usize, usize)> = ptrs.into_iter().zip(sizes).collect();
        let mut out = vec![number(ErrorCode::InvalidArgument); keys.len()];
        let (mut at, mut items) = (Vec::new(), Vec::new());
        for (i, sink) in self.buffers.sinks(&ranges).into_iter().enumerate() {
            if let Ok(sink) = sink {
                at.push(i);
                items.push((keys[i].as_str(), sink));
            }
        }
        if items.is_empty() {
            return Ok(out);
        }
        let got = self.run_within(py, self.timeout_of(timeout_ms), |c| async move {
            c.batch_get_into(&mut items).await
        })?;
        for (i, r) in at.into_iter().zip(got) {
            out[i] = match r {
                Ok(Some(n)) => n as i64,
                Ok(None) => KEY_NOT_FOUND,
                Err(e) => number(e.code),
            };
        }
        Ok(out)
    }

    /// `batch_put_from` of values each gathered from several ranges of registered memory, one
    /// after the other (`ptrs[i]` and `sizes[i]` are lists: key `i`'s value is their
    /// concatenation), with no copy of ours first. Per key 0, or a negative code.
    #[pyo3(signature = (keys, ptrs, sizes, timeout_ms = None))]
    fn batch_put_from_parts(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        ptrs: Vec<Vec<usize>>,
        sizes: Vec<Vec<usize>>,
        timeout_ms: Option<u64>,
    ) -> PyResult<Vec<i64>> {
        same_lengths(keys.len(), ptrs.len(), sizes.len())?;
        let (ranges, bounds) = flatten(&ptrs, &sizes);
        let mut lent = self.buffers.sources(&ranges).into_iter();
        let mut out = vec![number(ErrorCode::InvalidArgument); keys.len()];
        let (mut at, mut held) = (Vec::new(), Vec::new());
        for (i, n) in bounds.into_iter().enumerate() {
            let parts: Vec<_> = lent.by_ref().take(n).collect();
            if n > 0 && parts.iter().all(Result::is_ok) {
                at.push(i);
                held.push(parts.into_iter().flatten().collect::<Vec<&[u8]>>());
            }
        }
        if at.is_empty() {
            return Ok(out);
        }
        let items: Vec<(&str, &[&[u8]])> = at.iter().zip(&held).map(|(&i, p)| (keys[i].as_str(), &p[..])).collect();
        let done = self.run_within(py, self.timeout_of(timeout_ms), |c| async move {
            c.batch_put_parts(&items).await
        })?;
        for (i, r) in at.into_iter().zip(done) {
            out[i] = match r {
                Ok(_) => 0,
                Err(e) => number(e.code),
            };
        }
        Ok(out)
    }

    /// `batch_get_into` of values each scattered into several ranges of registered memory, one
    /// after the other (`ptrs[i]` and `sizes[i]` are lists, which must add up to the value's
    /// length exactly; no range may overlap another). Per key the bytes read, `KEY_NOT_FOUND`,
    /// or a negative code.
    #[pyo3(signature = (keys, ptrs, sizes, timeout_ms = None))]
    fn batch_get_into_parts(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        ptrs: Vec<Vec<usize>>,
        sizes: Vec<Vec<usize>>,
        timeout_ms: Option<u64>,
    ) -> PyResult<Vec<i64>> {
        same_lengths(keys.len(), ptrs.len(), sizes.len())?;
        let (ranges, bounds) = flatten(&ptrs, &sizes);
        let mut lent = self.buffers.sinks(&ranges).into_iter();
        let mut out = vec![number(ErrorCode::InvalidArgument); keys.len()];
        let (mut at, mut held) = (Vec::new(), Vec::new());
        for (i, n) in bounds.into_iter().enumerate() {
            let parts: Vec<_> = lent.by_ref().take(n).collect();
            if n > 0 && parts.iter().all(Result::is_ok) {
                at.push(i);
                held.push(parts.into_iter().flatten().collect::<Vec<&mut [u8]>>());
            }
        }
        if at.is_empty() {
            return Ok(out);
        }
        let mut items: Vec<(&str, &mut [&mut [u8]])> = at
            .iter()
            .zip(held.iter_mut())
            .map(|(&i, p)| (keys[i].as_str(), &mut p[..]))
            .collect();
        let got = self.run_within(py, self.timeout_of(timeout_ms), |c| async move {
            c.batch_get_into_parts(&mut items).await
        })?;
        for (i, r) in at.into_iter().zip(got) {
            out[i] = match r {
                Ok(Some(n)) => n as i64,
                Ok(None) => KEY_NOT_FOUND,
                Err(e) => number(e.code),
            };
        }
        Ok(out)
    }

    /// Follows what this tenant's cache holds (KV events, for routers): an iterator of dicts,
    /// `AllBlocksCleared` and the blocks held first (`snapshot` true), then every change. See
    /// `store/README.md`, "KV events".
    fn watch_blocks(&self, py: Python<'_>) -> PyResult<BlockWatch> {
        let stream = self.run(py, |c| async move { c.watch_blocks().await })?;
        Ok(BlockWatch::new(self.rt.handle().clone(), stream))
    }

    /// Closes the connections; later calls raise.
    fn close(&self) {
        self.client.write().take();
    }

    fn __repr__(&self) -> String {
        format!("Store(endpoint={:?})", self.endpoint)
    }
}

/// The ranges of every key's parts, one list, and how many belong to each key (0 for a key
/// whose pointers and sizes differ in number, which is refused).
fn flatten(ptrs: &[Vec<usize>], sizes: &[Vec<usize>]) -> (Vec<(usize, usize)>, Vec<usize>) {
    let mut ranges = Vec::new();
    let mut counts = Vec::with_capacity(ptrs.len());
    for (p, z) in ptrs.iter().zip(sizes) {
        if p.len() == z.len() {
            ranges.extend(p.iter().copied().zip(z.iter().copied()));
            counts.push(p.len());
        } else {
            counts.push(0);
        }
    }
    (ranges, counts)
}

fn same_lengths(keys: usize, ptrs: usize, sizes: usize) -> PyResult<()> {
    if keys == ptrs && keys == sizes {
        return Ok(());
    }
    Err(raise(invalid(format!(
        "{keys} keys, {ptrs} pointers and {sizes} sizes: give one of each per key"
    ))))
}

/// Every store code and the negative number batch calls answer with for it.
#[pyfunction]
fn codes() -> Vec<(&'static str, i64)> {
    ALL.iter().map(|c| (c.as_str(), number(*c))).collect()
}

/// This build's release (the workspace version) and the store protocol it speaks.
#[pyfunction]
fn version() -> (&'static str, u32) {
    (kvcache_store::protocol::RELEASE, kvcache_store::protocol::PROTOCOL)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(version, m)?)?;
    m.add_class::<Store>()?;
    m.add_class::<BlockWatch>()?;
    m.add("StoreError", m.py().get_type::<StoreError>())?;
    m.add("KEY_NOT_FOUND", KEY_NOT_FOUND)?;
    m.add_function(wrap_pyfunction!(codes, m)?)?;
    exit::register(m)?;
    Ok(())
}
