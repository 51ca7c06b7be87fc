//! The leader's metrics, read from its state at scrape time by a `prometheus_client` collector:
//! readiness, capacity and usage, objects, and the put/get/eviction counters store-wide, per
//! tenant (grant, ceiling, usage) and per member (capacity, usage). Labels are tenant and member
//! names only: bounded by the ledger and the mounted members, never by keys or requests.
//!
//! The per-tenant series are a registry of their own ([`tenant_registry`]), served only to
//! scrapes carrying the Control token when the leader has one (`crate::metrics::Private`): their
//! labels are the cache domains, which would otherwise tell anyone on the network who the
//! tenants are and how much each uses.
//!
//! Counters are registered without `_total`; the OpenMetrics encoder appends it, so the sample
//! names are the ones store/README.md lists (`kvstore_puts_total`, ...).

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::{Registry, Unit};

use super::Leader;
use super::state::State;
use super::tenant::{Counters, Tenant};

/// What one scrape reports, copied out under the lock so encoding happens without it.
#[derive(Debug, Default)]
struct Snapshot {
    ready: bool,
    capacity: u64,
    used: u64,
    members: u64,
    objects: u64,
    index_bytes: u64,
    totals: Counters,
    /// (name, capacity, used)
    segments: Vec<(String, u64, u64)>,
    /// the members' disk tiers: (name, capacity, used), for members with one
    tiers: Vec<(String, u64, u64)>,
}

#[derive(Debug, Clone, Copy)]
struct TenantRow {
    ceiling: u64,
    grant: u64,
    used: u64,
    disk_used: u64,
    objects: u64,
    counters: Counters,
}

impl TenantRow {
    fn of(t: &Tenant) -> Self {
        Self {
            ceiling: t.ceiling,
            grant: t.grant,
            used: t.used,
            disk_used: t.disk_used,
            objects: t.objects.len() as u64,
            counters: t.counters,
        }
    }
}

impl Snapshot {
    fn of(s: &State, ready: bool) -> Self {
        Self {
            ready,
            capacity: s.capacity(),
            used: s.used(),
            members: s.members.len() as u64,
            objects: s.object_count(),
            index_bytes: s.index_bytes(),
            totals: s.totals(),
            segments: s
                .members
                .values()
                .map(|m| (m.name.clone(), m.alloc.capacity(), m.alloc.used()))
                .collect(),
            tiers: s
                .members
                .values()
                .filter(|m| m.tier_capacity > 0)
                .map(|m| (m.name.clone(), m.tier_capacity, m.tier_used))
                .collect(),
        }
    }
}

/// Registers the leader's collector on `registry`.
pub(super) fn register(leader: &Leader, registry: &mut Registry) {
    registry.register_collector(Box::new(LeaderCollector(leader.clone())));
}

/// The per-tenant series, in a registry of their own.
pub(super) fn tenant_registry(leader: &Leader) -> Registry {
    let mut r = Registry::default();
    r.register_collector(Box::new(TenantCollector(leader.clone())));
    r
}

#[derive(Debug)]
struct LeaderCollector(Leader);

#[derive(Debug)]
struct TenantCollector(Leader);

impl Collector for TenantCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut tenants: Vec<(String, TenantRow)> = self
            .0
            .with(|s| s.tenants.iter().map(|(n, t)| (n.clone(), TenantRow::of(t))).collect());
        tenants.sort_by(|a, b| a.0.cmp(&b.0));
        for (name, help, unit, is_counter, f) in &TENANT_FAMILIES {
            let rows = tenants.iter().map(|(n, t)| (n.as_str(), f(t)));
            labelled(&mut e, (name, help, unit.as_ref()), "tenant", *is_counter, rows)?;
        }
        Ok(())
    }
}

type Enc<'a> = DescriptorEncoder<'a>;

fn gauge(e: &mut Enc<'_>, name: &str, help: &str, unit: Option<&Unit>, v: u64) -> Result<(), std::fmt::Error> {
    let g = ConstGauge::new(v);
    g.encode(e.encode_descriptor(name, help, unit, g.metric_type())?)
}

fn counter(e: &mut Enc<'_>, name: &str, help: &str, v: u64) -> Result<(), std::fmt::Error> {
    let c = ConstCounter::new(v);
    c.encode(e.encode_descriptor(name, help, None, c.metric_type())?)
}

/// One family with one sample per `(label value, value)`.
fn labelled<'a>(
    e: &mut Enc<'_>,
    (name, help, unit): (&str, &str, Option<&Unit>),
    label: &'static str,
    counter: bool,
    rows: impl Iterator<Item = (&'a str, u64)>,
) -> Result<(), std::fmt::Error> {
    let kind = if counter {
        ConstCounter::new(0u64).metric_type()
    } else {
        ConstGauge::new(0u64).metric_type()
    };
    let mut family = e.encode_descriptor(name, help, unit, kind)?;
    for (value, v) in rows {
        let labels = [(label, value)];
        let sample = family.encode_family(&labels)?;
        if counter {
            ConstCounter::new(v).encode(sample)?;
        } else {
            ConstGauge::new(v).encode(sample)?;
        }
    }
    Ok(())
}

type TenantFamily = (&'static str, &'static str, Option<Unit>, bool, fn(&TenantRow) -> u64);

const TENANT_FAMILIES: [TenantFamily; 12] = [
    (
        "kvstore_tenant_ceiling",
        "requested ceiling",
        Some(Unit::Bytes),
        false,
        |t| t.ceiling,
    ),
    (
        "kvstore_tenant_grant",
        "effective grant",
        Some(Unit::Bytes),
        false,
        |t| t.grant,
    ),
    ("kvstore_tenant_used", "bytes charged", Some(Unit::Bytes), false, |t| {
        t.used
    }),
    (
        "kvstore_tenant_disk_used",
        "bytes of its values' copies on disk tiers",
        Some(Unit::Bytes),
        false,
        |t| t.disk_used,
    ),
    ("kvstore_tenant_objects", "objects", None, false, |t| t.objects),
    (
        "kvstore_tenant_loads",
        "values read back from a disk tier for a get",
        None,
        true,
        |t| t.counters.loads,
    ),
    (
        "kvstore_tenant_load_failures",
        "reads back from a disk tier that found the copy missing or damaged",
        None,
        true,
        |t| t.counters.load_failures,
    ),
    ("kvstore_tenant_puts", "committed puts", None, true, |t| t.counters.puts),
    ("kvstore_tenant_gets", "get requests", None, true, |t| t.counters.gets),
    ("kvstore_tenant_misses", "gets that found nothing", None, true, |t| {
        t.counters.misses
    }),
    ("kvstore_tenant_evictions", "objects evicted", None, true, |t| {
        t.counters.evictions
    }),
    (
        "kvstore_tenant_quota_refusals",
        "puts refused at quota",
        None,
        true,
        |t| t.counters.quota_refusals,
    ),
];

impl Collector for LeaderCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let ready = self.0.readiness().is_serving();
        let s = self.0.with(|s| Snapshot::of(s, ready));
        let bytes = Some(&Unit::Bytes);
        gauge(
            &mut e,
            "kvstore_leader_ready",
            "1 while this leader serves requests",
            None,
            u64::from(s.ready),
        )?;
        gauge(
            &mut e,
            "kvstore_capacity",
            "mounted segment capacity",
            bytes,
            s.capacity,
        )?;
        gauge(
            &mut e,
            "kvstore_used",
            "bytes allocated in mounted segments",
            bytes,
            s.used,
        )?;
        gauge(&mut e, "kvstore_members", "mounted members", None, s.members)?;
        gauge(
            &mut e,
            "kvstore_objects",
            "objects (reserved and committed)",
            None,
            s.objects,
        )?;
        gauge(
            &mut e,
            "kvstore_leader_index",
            "about the memory the leader's object index takes",
            bytes,
            s.index_bytes,
        )?;
        let t = &s.totals;
        counter(&mut e, "kvstore_puts", "committed puts", t.puts)?;
        counter(&mut e, "kvstore_put_revokes", "revoked puts", t.put_revokes)?;
        counter(&mut e, "kvstore_gets", "get requests", t.gets)?;
        counter(&mut e, "kvstore_hits", "gets that found a committed value", t.hits)?;
        counter(&mut e, "kvstore_misses", "gets that found nothing", t.misses)?;
        counter(
            &mut e,
            "kvstore_evictions",
            "objects evicted (watermark, allocation and tenant quota)",
            t.evictions,
        )?;
        counter(
            &mut e,
            "kvstore_quota_refusals",
            "puts refused with TENANT_QUOTA_EXCEEDED",
            t.quota_refusals,
        )?;
        encode_tiers(&mut e, &s)?;
        labelled(
            &mut e,
            ("kvstore_member_capacity", "capacity per member", bytes),
            "member",
            false,
            s.segments.iter().map(|(n, c, _)| (n.as_str(), *c)),
        )?;
        labelled(
            &mut e,
            ("kvstore_member_used", "allocated bytes per member", bytes),
            "member",
            false,
            s.segments.iter().map(|(n, _, u)| (n.as_str(), *u)),
        )
    }
}

/// The disk tiers' counters and, per member with one, its capacity and usage.
fn encode_tiers(e: &mut Enc<'_>, s: &Snapshot) -> Result<(), std::fmt::Error> {
    let (t, bytes) = (&s.totals, Some(&Unit::Bytes));
    counter(
        e,
        "kvstore_demotions",
        "values whose memory was freed while a disk copy kept them",
        t.demotions,
    )?;
    counter(
        e,
        "kvstore_loads",
        "values read back from a disk tier for a get",
        t.loads,
    )?;
    counter(
        e,
        "kvstore_load_failures",
        "reads back from a disk tier that found the copy missing or damaged (a miss; the value is dropped)",
        t.load_failures,
    )?;
    labelled(
        e,
        ("kvstore_member_tier_capacity", "disk tier capacity per member", bytes),
        "member",
        false,
        s.tiers.iter().map(|(n, c, _)| (n.as_str(), *c)),
    )?;
    labelled(
        e,
        (
            "kvstore_member_tier_used",
            "bytes of records on each member's disk tier",
            bytes,
        ),
        "member",
        false,
        s.tiers.iter().map(|(n, _, u)| (n.as_str(), *u)),
    )?;
    Ok(())
}
