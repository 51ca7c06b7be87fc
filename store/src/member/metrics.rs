//! The member's metrics, read at scrape time by a `prometheus_client` collector: readiness, the
//! segment's capacity, what it would hand a next leader, and the transfer counters the data port
//! and gRPC face keep on the segment (plain atomics, so the data path pays nothing for metrics);
//! with a disk tier, its usage and what it copied, loaded, dropped and found damaged. No labels.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::{Registry, Unit};

use super::segment::Segment;
use super::tiering::Tiering;
use crate::readiness::ReadinessHandle;

/// Registers a member's collector on `registry`.
pub fn register(
    segment: Arc<Segment>,
    tiering: Option<Arc<Tiering>>,
    readiness: ReadinessHandle,
    registry: &mut Registry,
) {
    registry.register_collector(Box::new(MemberCollector {
        segment,
        tiering,
        readiness,
    }));
}

#[derive(Debug)]
struct MemberCollector {
    segment: Arc<Segment>,
    tiering: Option<Arc<Tiering>>,
    readiness: ReadinessHandle,
}

/// The disk tier's gauges and counters.
fn encode_tier(t: &Tiering, e: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
    let (used, capacity) = t.usage();
    for (name, help, v) in [
        ("kvstore_member_tier_capacity", "the disk tier's capacity", capacity),
        ("kvstore_member_tier_used", "bytes of records on the disk tier", used),
    ] {
        let g = ConstGauge::new(v);
        g.encode(e.encode_descriptor(name, help, Some(&Unit::Bytes), g.metric_type())?)?;
    }
    let c = t.counts();
    for (name, help, v) in [
        ("kvstore_member_tier_copies", "values copied to the disk tier", c.copied),
        (
            "kvstore_member_tier_skips",
            "sealed values not copied (freed or changed before their copy, or the queue full)",
            c.skipped,
        ),
        (
            "kvstore_member_tier_dropped",
            "copies dropped with the tier's oldest file to make room",
            c.dropped_full,
        ),
        (
            "kvstore_member_tier_loads",
            "values read back from the tier: loaded into memory, or streamed to a reader",
            c.loaded,
        ),
        (
            "kvstore_member_tier_damaged",
            "copies found damaged on a read back (checksum or tag): dropped, never taken",
            c.damaged,
        ),
        (
            "kvstore_member_tier_failures",
            "copies or loads that failed (an I/O error, a sync that failed, a range taken)",
            c.failed,
        ),
    ] {
        let m = ConstCounter::new(v);
        m.encode(e.encode_descriptor(name, help, None, m.metric_type())?)?;
    }
    Ok(())
}

/// The data port's and the same-host socket's transfer counters.
fn encode_transfers(c: &super::segment::DataCounters, e: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
    let counters = [
        ("kvstore_member_writes", "values written", None, c.writes.load(Relaxed)),
        ("kvstore_member_reads", "values read", None, c.reads.load(Relaxed)),
        (
            "kvstore_member_written",
            "bytes written",
            Some(Unit::Bytes),
            c.bytes_written.load(Relaxed),
        ),
        (
            "kvstore_member_read",
            "bytes read",
            Some(Unit::Bytes),
            c.bytes_read.load(Relaxed),
        ),
        (
            "kvstore_member_local_writes",
            "values same-host clients wrote into the mapped segment (of kvstore_member_writes)",
            None,
            c.local_writes.load(Relaxed),
        ),
        (
            "kvstore_member_local_reads",
            "values same-host clients read from the mapped segment (of kvstore_member_reads)",
            None,
            c.local_reads.load(Relaxed),
        ),
        (
            "kvstore_member_local_tier_files",
            "tier files handed to same-host clients, which read copies on the disk tier from them themselves",
            None,
            c.tier_files.load(Relaxed),
        ),
        (
            "kvstore_member_refusals",
            "transfers refused (stale mount, deadline, range)",
            None,
            c.refusals.load(Relaxed),
        ),
    ];
    for (name, help, unit, v) in &counters {
        let m = ConstCounter::new(*v);
        m.encode(e.encode_descriptor(name, help, unit.as_ref(), m.metric_type())?)?;
    }
    Ok(())
}

impl Collector for MemberCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let ready = ConstGauge::new(u64::from(self.readiness.is_serving()));
        ready.encode(e.encode_descriptor(
            "kvstore_member_ready",
            "1 while the segment is mounted at a leader",
            None,
            ready.metric_type(),
        )?)?;
        let cap = ConstGauge::new(self.segment.capacity());
        cap.encode(e.encode_descriptor(
            "kvstore_member_capacity",
            "segment capacity",
            Some(&Unit::Bytes),
            cap.metric_type(),
        )?)?;
        let held = self.segment.held();
        for (name, help, unit, v) in [
            (
                "kvstore_member_handover_values",
                "values this member would hand a next leader (finished, whole, not freed since)",
                None,
                held.values,
            ),
            (
                "kvstore_member_handover",
                "bytes of the values this member would hand a next leader",
                Some(Unit::Bytes),
                held.bytes,
            ),
        ] {
            let g = ConstGauge::new(v);
            g.encode(e.encode_descriptor(name, help, unit.as_ref(), g.metric_type())?)?;
        }
        encode_transfers(&self.segment.counters, &mut e)?;
        match &self.tiering {
            Some(t) => encode_tier(t, &mut e),
            None => Ok(()),
        }
    }
}
