//! The leader's Prometheus text: capacity and usage, objects, puts, gets, misses, evictions,
//! store-wide and per tenant, grant and usage per tenant, and readiness.

use std::fmt::Write;

use super::state::State;
use crate::metrics::{Family, escape};

/// A per-tenant family: name, help, type, and how to read the value.
type TenantFamily = (
    &'static str,
    &'static str,
    &'static str,
    fn(&super::objects::Tenant) -> u64,
);

pub(super) fn render(s: &State, serving: bool) -> String {
    let mut out = String::new();
    let totals = s.totals();
    let mut g = |name: &str, help: &str, kind: &str, v: u64| Family::new(name, help, kind).sample(&mut out, "", v);
    g(
        "kvstore_leader_ready",
        "1 while this leader serves requests",
        "gauge",
        serving as u64,
    );
    g(
        "kvstore_capacity_bytes",
        "mounted segment capacity",
        "gauge",
        s.capacity(),
    );
    g(
        "kvstore_used_bytes",
        "bytes allocated in mounted segments",
        "gauge",
        s.used(),
    );
    g("kvstore_members", "mounted members", "gauge", s.members.len() as u64);
    g(
        "kvstore_objects",
        "objects (reserved and committed)",
        "gauge",
        s.object_count(),
    );
    g("kvstore_puts_total", "committed puts", "counter", totals.puts);
    g(
        "kvstore_put_revokes_total",
        "revoked puts",
        "counter",
        totals.put_revokes,
    );
    g("kvstore_gets_total", "get requests", "counter", totals.gets);
    g(
        "kvstore_hits_total",
        "gets that found a committed value",
        "counter",
        totals.hits,
    );
    g(
        "kvstore_misses_total",
        "gets that found nothing",
        "counter",
        totals.misses,
    );
    g(
        "kvstore_evictions_total",
        "objects evicted (watermark, allocation and tenant quota)",
        "counter",
        totals.evictions,
    );
    g(
        "kvstore_quota_refusals_total",
        "puts refused with TENANT_QUOTA_EXCEEDED",
        "counter",
        totals.quota_refusals,
    );

    let mut tenants: Vec<_> = s.tenants.iter().collect();
    tenants.sort_by(|a, b| a.0.cmp(b.0));
    let per_tenant: [TenantFamily; 9] = [
        ("kvstore_tenant_ceiling_bytes", "requested ceiling", "gauge", |t| {
            t.ceiling
        }),
        ("kvstore_tenant_grant_bytes", "effective grant", "gauge", |t| t.grant),
        ("kvstore_tenant_used_bytes", "bytes charged", "gauge", |t| t.used),
        ("kvstore_tenant_objects", "objects", "gauge", |t| t.objects.len() as u64),
        ("kvstore_tenant_puts_total", "committed puts", "counter", |t| {
            t.counters.puts
        }),
        ("kvstore_tenant_gets_total", "get requests", "counter", |t| {
            t.counters.gets
        }),
        (
            "kvstore_tenant_misses_total",
            "gets that found nothing",
            "counter",
            |t| t.counters.misses,
        ),
        ("kvstore_tenant_evictions_total", "objects evicted", "counter", |t| {
            t.counters.evictions
        }),
        (
            "kvstore_tenant_quota_refusals_total",
            "puts refused at quota",
            "counter",
            |t| t.counters.quota_refusals,
        ),
    ];
    for (name, help, kind, f) in per_tenant {
        let fam = Family::new(name, help, kind);
        fam.header(&mut out);
        for (tname, t) in &tenants {
            let _ = writeln!(out, "{name}{{tenant=\"{}\"}} {}", escape(tname), f(t));
        }
    }
    let fam = Family::new("kvstore_member_capacity_bytes", "capacity per member", "gauge");
    fam.header(&mut out);
    for m in s.members.values() {
        let _ = writeln!(
            out,
            "kvstore_member_capacity_bytes{{member=\"{}\"}} {}",
            escape(&m.name),
            m.alloc.capacity()
        );
    }
    let fam = Family::new("kvstore_member_used_bytes", "allocated bytes per member", "gauge");
    fam.header(&mut out);
    for m in s.members.values() {
        let _ = writeln!(
            out,
            "kvstore_member_used_bytes{{member=\"{}\"}} {}",
            escape(&m.name),
            m.alloc.used()
        );
    }
    out
}
