//! `kv-store bench`: put, get and exists against a running store, one sequential client as in the
//! reference's peer benchmark, for 64 KiB, 1 MiB and 4 MiB values. Prints one JSON line per
//! operation and size: `{"op","size","ops_per_s","bytes_per_s","p50_us","p99_us"}`.
//!
//! Method (the reference's): ops/s = ops ÷ the sum of per-call latencies; a ring of keys of at
//! most `ring_bytes` per size is written, and a slot is removed outside the timed region before it
//! is rewritten; reads cycle over the keys just written; the last read is compared byte for byte.
//!
//! [`BenchArgs`] are the flags of `kv-store bench`. Against a leader whose ledger lacks the bench
//! tenant, [`ensure_tenant`] registers it (with `--register-tenant`, or a ceiling that holds every
//! size's ring at once, since leased keys of one size outlive its phase).

use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::Serialize;

use crate::client::{Client, PutOutcome};
use crate::error::{ErrorCode, Result, StoreError};
use crate::flags;
use crate::leader::placement::aligned;
use crate::proto::{GetTenantsRequest, Scope, SetTenantsRequest, TenantEntry};

/// The flags of `kv-store bench`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct BenchArgs {
    /// The leader's gRPC address, HOST:PORT.
    #[arg(long)]
    pub leader: String,
    #[arg(long, default_value = "bench")]
    pub tenant: String,
    #[arg(long, default_value_t = 64)]
    pub block_size: u32,
    #[arg(long, default_value = "bfloat16")]
    pub dtype: String,
    /// The tenant's credential, carried by every call; a tenant the bench registers is bound to
    /// it, so the figures include proving the tenant. The default is fixed (the bench's tenant
    /// guards no one's data; a later run must prove the same tenant again).
    #[arg(long, default_value = "kv-store-bench")]
    pub credential: String,
    /// The controllers' token, for a leader started with `--control-token-file` (the bench reads
    /// and may set the ledger).
    #[arg(long)]
    pub control_token_file: Option<std::path::PathBuf>,
    /// Add the tenant to the leader's ledger with this ceiling before running (without it, the
    /// tenant is registered only if the ledger lacks it, with a ceiling that fits the rings).
    #[arg(long, value_parser = flags::parse_size)]
    pub register_tenant: Option<u64>,
    #[arg(long, default_value_t = 2000)]
    pub ops: usize,
    #[arg(long, default_value = "20s", value_parser = kvcache_units::parse_duration)]
    pub max_time: Duration,
    #[arg(long, default_value = "256Mi", value_parser = flags::parse_size)]
    pub ring: u64,
    #[arg(long, value_delimiter = ',', default_value = "64Ki,1Mi,4Mi", value_parser = flags::parse_size)]
    pub sizes: Vec<u64>,
    /// Poll this long for each reply before sleeping; 0 never polls.
    #[arg(long, default_value = "200us", value_parser = kvcache_units::parse_duration)]
    pub spin: Duration,
    /// Move the bytes through the member's mapped segment when it is on this host (without: over
    /// TCP, as the reference's remote mode does).
    #[arg(long)]
    pub same_host: bool,
    /// TLS to the leader and members (`--tls-ca`, `--tls-server-name`).
    #[command(flatten)]
    pub tls: crate::tls::DialFlags,
}

impl BenchArgs {
    pub fn scope(&self) -> Scope {
        Scope {
            tenant: self.tenant.clone(),
            block_size: self.block_size,
            dtype: self.dtype.clone(),
            credential: self.credential.clone(),
            client: String::new(),
        }
    }

    pub fn config(&self) -> BenchConfig {
        BenchConfig {
            sizes: self.sizes.clone(),
            ops: self.ops,
            max_time: self.max_time,
            ring_bytes: self.ring,
        }
    }
}

/// Slots of the key ring for values of `size`.
fn ring_slots(cfg: &BenchConfig, size: u64) -> u64 {
    (cfg.ring_bytes / size.max(1)).clamp(1, cfg.ops.max(1) as u64)
}

/// A ceiling that holds every size's ring (plus the slot being rewritten) at once.
pub fn ceiling_for(cfg: &BenchConfig) -> u64 {
    cfg.sizes
        .iter()
        .map(|&size| (ring_slots(cfg, size) + 1).saturating_mul(aligned(size)))
        .fold(0u64, u64::saturating_add)
        .max(1)
}

/// Registers the bench tenant with `--register-tenant` (replacing its entry), or, without it,
/// with [`ceiling_for`] the rings when the leader's ledger lacks the tenant. Returns the entry it
/// registered, if any. Nothing to do with multi-tenancy off.
pub async fn ensure_tenant(client: &Client, args: &BenchArgs) -> Result<Option<TenantEntry>> {
    let status = |s: tonic::Status| StoreError::from_status(&s);
    let token = match &args.control_token_file {
        Some(p) => Some(
            crate::auth::read_token(p)
                .map_err(|e| StoreError::new(ErrorCode::InvalidArgument, format!("--control-token-file: {e}")))?,
        ),
        None => None,
    };
    let mut control = client.control();
    let ledger = control
        .get_tenants(crate::auth::request(GetTenantsRequest {}, token.as_deref())?)
        .await
        .map_err(status)?
        .into_inner();
    if !ledger.multi_tenancy {
        return Ok(None);
    }
    let present = ledger.tenants.iter().any(|t| t.name == args.tenant);
    let ceiling = match args.register_tenant {
        Some(c) => c,
        None if present => return Ok(None),
        None => ceiling_for(&args.config()),
    };
    let mine = TenantEntry {
        name: args.tenant.clone(),
        ceiling,
        block_size: args.block_size,
        dtype: args.dtype.clone(),
        credential_sha256: vec![crate::leader::ledger::credential_hash(&args.credential).to_vec().into()],
        // in no pool: only the mounted capacity cuts the bench's grant
        pool: String::new(),
        uid: String::new(),
    };
    if let Some(t) = ledger
        .tenants
        .iter()
        .find(|t| t.name != args.tenant && t.credentials > 0)
    {
        return Err(StoreError::new(
            ErrorCode::InvalidArgument,
            format!(
                "the leader's ledger binds tenant {:?} to credentials, which SetTenants would have to be sent again \
                 and the bench cannot see; register the bench tenant where the ledger is kept (its Binding), or \
                 bench a leader of its own",
                t.name
            ),
        ));
    }
    let pools = ledger.pools;
    let mut entries: Vec<TenantEntry> = ledger
        .tenants
        .into_iter()
        .filter(|t| t.name != args.tenant)
        .map(|t| TenantEntry {
            name: t.name,
            ceiling: t.ceiling,
            block_size: t.block_size,
            dtype: t.dtype,
            pool: t.pool,
            uid: t.uid,
            ..Default::default()
        })
        .collect();
    entries.push(mine.clone());
    control
        .set_tenants(crate::auth::request(
            SetTenantsRequest {
                tenants: entries,
                pools,
            },
            token.as_deref(),
        )?)
        .await
        .map_err(status)?;
    Ok(Some(mine))
}

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    pub sizes: Vec<u64>,
    pub ops: usize,
    pub max_time: Duration,
    pub ring_bytes: u64,
}

/// One output line.
#[derive(Debug, Clone, Serialize)]
pub struct Line {
    pub op: &'static str,
    pub size: u64,
    pub ops_per_s: f64,
    pub bytes_per_s: f64,
    pub p50_us: f64,
    pub p99_us: f64,
}

fn summarize(op: &'static str, size: u64, lat: &mut [Duration]) -> Line {
    lat.sort_unstable();
    let total: f64 = lat.iter().map(Duration::as_secs_f64).sum();
    let n = lat.len() as f64;
    let pct = |p: f64| {
        if lat.is_empty() {
            return 0.0;
        }
        let i = ((p * n).ceil() as usize).clamp(1, lat.len()) - 1;
        lat[i].as_secs_f64() * 1e6
    };
    let ops_per_s = if total > 0.0 { n / total } else { 0.0 };
    let bytes_per_s = if op == "exists" { 0.0 } else { ops_per_s * size as f64 };
    Line {
        op,
        size,
        ops_per_s,
        bytes_per_s,
        p50_us: pct(0.50),
        p99_us: pct(0.99),
    }
}

fn pattern(size: u64, seed: u64) -> Bytes {
    let mut v = vec![0u8; size as usize];
    let mut x = seed | 1;
    for chunk in v.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x.to_le_bytes();
        chunk.copy_from_slice(&b[..chunk.len()]);
    }
    Bytes::from(v)
}

/// Runs every phase; calls `emit` with each line as soon as it is measured.
pub async fn run(client: &Client, cfg: &BenchConfig, mut emit: impl FnMut(&Line)) -> Result<Vec<Line>> {
    wait_for_capacity(client).await?;
    let run_id = uuid::Uuid::new_v4().simple().to_string();
    let mut lines = Vec::new();
    let mut record = |line: Line| {
        emit(&line);
        lines.push(line);
    };
    for &size in &cfg.sizes {
        let ring = Ring::new(&run_id, size, ring_slots(cfg, size) as usize);
        // warm-up: one pass over the ring, untimed, so segment pages and connections are ready
        for slot in 0..ring.slots {
            client.put(&ring.key(slot, 0), ring.value(slot)).await?;
        }
        let mut live: Vec<String> = (0..ring.slots).map(|s| ring.key(s, 0)).collect();
        record(put_phase(client, cfg, &ring, &mut live).await?);
        record(get_phase(client, cfg, &ring, &live).await?);
        record(exists_phase(client, cfg, &ring, &live).await?);
        // leave the space to the next size: leased keys go when their lease ends (or by eviction)
        for k in &live {
            let _ = client.remove(k).await;
        }
    }
    Ok(lines)
}

/// One size's ring of keys: how many slots, the values written to them, and the keys' names.
struct Ring<'a> {
    run_id: &'a str,
    size: u64,
    slots: usize,
    values: Vec<Bytes>,
}

impl<'a> Ring<'a> {
    /// A ring of `slots` keys of `size`-byte values for the run `run_id`.
    fn new(run_id: &'a str, size: u64, slots: usize) -> Self {
        let values = (0..4).map(|i| pattern(size, size ^ (i + 1))).collect();
        Self {
            run_id,
            size,
            slots,
            values,
        }
    }

    /// The key written to `slot` in `round` (0: the warm-up).
    fn key(&self, slot: usize, round: usize) -> String {
        format!("bench/{}/{}/{slot}/{round}", self.run_id, self.size)
    }

    /// The value written to `slot`.
    fn value(&self, slot: usize) -> Bytes {
        self.values[slot % 4].clone()
    }
}

/// Times puts over the ring, each to a slot whose key was removed first (untimed); `live` holds
/// each slot's current key.
async fn put_phase(client: &Client, cfg: &BenchConfig, ring: &Ring<'_>, live: &mut [String]) -> Result<Line> {
    let mut lat = Vec::with_capacity(cfg.ops);
    let t0 = Instant::now();
    for i in 0..cfg.ops {
        if t0.elapsed() > cfg.max_time {
            break;
        }
        let slot = i % ring.slots;
        remove_patiently(client, &live[slot]).await?;
        let k = ring.key(slot, i + 1);
        let v = ring.value(slot);
        let start = Instant::now();
        let outcome = client.put(&k, v).await?;
        lat.push(start.elapsed());
        if outcome != PutOutcome::Stored {
            return Err(StoreError::new(
                ErrorCode::Internal,
                format!("bench key {k} already existed"),
            ));
        }
        live[slot] = k;
    }
    Ok(summarize("put", ring.size, &mut lat))
}

/// Times gets cycling over the `live` keys, and compares the last value read with what was
/// written.
async fn get_phase(client: &Client, cfg: &BenchConfig, ring: &Ring<'_>, live: &[String]) -> Result<Line> {
    let mut lat = Vec::with_capacity(cfg.ops);
    let mut buf = Vec::new();
    let t0 = Instant::now();
    let mut last = 0;
    for i in 0..cfg.ops {
        if t0.elapsed() > cfg.max_time {
            break;
        }
        let slot = i % ring.slots;
        let start = Instant::now();
        let found = client.get_into(&live[slot], &mut buf).await?;
        lat.push(start.elapsed());
        if !found {
            return Err(StoreError::new(
                ErrorCode::Internal,
                format!("bench key {} missed", live[slot]),
            ));
        }
        last = slot;
    }
    if buf != ring.values[last % 4] {
        return Err(StoreError::new(
            ErrorCode::Internal,
            "a value read back differs from what was written",
        ));
    }
    Ok(summarize("get", ring.size, &mut lat))
}

/// Times exists calls cycling over the `live` keys.
async fn exists_phase(client: &Client, cfg: &BenchConfig, ring: &Ring<'_>, live: &[String]) -> Result<Line> {
    let mut lat = Vec::with_capacity(cfg.ops);
    let t0 = Instant::now();
    for i in 0..cfg.ops {
        if t0.elapsed() > cfg.max_time {
            break;
        }
        let start = Instant::now();
        let hit = client.exists(&live[i % ring.slots]).await?;
        lat.push(start.elapsed());
        if !hit {
            return Err(StoreError::new(ErrorCode::Internal, "exists missed a key just written"));
        }
    }
    Ok(summarize("exists", ring.size, &mut lat))
}

/// Waits (up to a minute) until some member has mounted, so a bench started beside fresh members
/// measures the store rather than its start-up.
async fn wait_for_capacity(client: &Client) -> Result<()> {
    for _ in 0..1200 {
        let health = client.control().health(crate::proto::HealthRequest {}).await;
        if health.is_ok_and(|h| h.get_ref().capacity > 0) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(StoreError::new(
        ErrorCode::NoSpace,
        "no member mounted a segment within a minute; start members first",
    ))
}

/// Removes a bench key, waiting out a read lease if one still protects it.
async fn remove_patiently(client: &Client, key: &str) -> Result<()> {
    for _ in 0..600 {
        match client.remove(key).await {
            Ok(_) => return Ok(()),
            Err(e) if e.code == ErrorCode::ObjectHasLease => tokio::time::sleep(Duration::from_millis(50)).await,
            Err(e) => return Err(e),
        }
    }
    Err(StoreError::new(
        ErrorCode::ObjectHasLease,
        format!("bench key {key} stayed leased for 30 s"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registered_ceiling_holds_every_ring() {
        let cfg = BenchConfig {
            sizes: vec![64 << 10, 1 << 20, 4 << 20],
            ops: 2000,
            max_time: Duration::from_secs(20),
            ring_bytes: 256 << 20,
        };
        // 2000 (ops cap) + 1 slots of 64 KiB, 257 of 1 MiB, 65 of 4 MiB
        assert_eq!(ceiling_for(&cfg), 2001 * (64 << 10) + 257 * (1 << 20) + 65 * (4 << 20));
        let tiny = BenchConfig {
            sizes: vec![100],
            ops: 20,
            ..cfg
        };
        assert_eq!(
            ceiling_for(&tiny),
            21 * 128,
            "sizes are charged at the 64-byte granularity"
        );
    }

    #[test]
    fn summary_uses_latency_sums_and_percentiles() {
        let mut lat: Vec<Duration> = (1..=100).map(Duration::from_micros).collect();
        let l = summarize("put", 1000, &mut lat);
        assert!((l.p50_us - 50.0).abs() < 1e-9);
        assert!((l.p99_us - 99.0).abs() < 1e-9);
        let expected = 100.0 / (5050.0 * 1e-6);
        assert!((l.ops_per_s - expected).abs() < 1e-6);
        assert!((l.bytes_per_s - expected * 1000.0).abs() < 1e-3);
        let json = serde_json::to_string(&l).unwrap();
        assert!(
            json.starts_with("{\"op\":\"put\",\"size\":1000,\"ops_per_s\":"),
            "{json}"
        );
    }
}
