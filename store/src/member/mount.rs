//! Keeping the segment mounted: find the serving leader, mount, heartbeat, and mount again
//! (starting empty) whenever the leader does not know this mount or another leader serves.
//!
//! - **Finding the leader**: `--leader HOST:PORT` is one stable address (a Service in front of
//!   the leaders, which leads to the ready one); `--leader k8s://NAMESPACE/NAME` follows the
//!   holder of that election Lease, read before every mount, after every failed heartbeat, and
//!   whenever a watch says the Lease changed.
//! - **Fencing**: every mount answer carries the leader's epoch. A mount from an epoch older than
//!   one this member has mounted under is refused here (that leader was deposed), and the data
//!   path refuses ranges of older epochs (`segment.rs`).
//! - **Failover**: a heartbeat that fails is retried within 100 ms on a fresh connection (the
//!   old one may lead to a leader that stopped, or hangs); a leader that answers `need_remount`
//!   (it restarted, or a standby took over) gets a new mount at once.
//! - **Handing over**: every mount reports the values this member finished writing and still
//!   holds whole (`segment/handover.rs`), the first page of it, the rest in pages after
//!   (`report.rs`); the answer says which the leader adopted, and those are readable again
//!   under the new mount before its grant key is taken, so no range of the new term is served
//!   before the table is right. A leader with no ledger
//!   yet answers `LEDGER_PENDING`, retried every 100 ms. Heartbeat answers hand over the seals of
//!   values the leader committed since the last one (only a sealed value is held for a next
//!   leader), and name the ranges it freed, which this member then no longer holds; the next
//!   heartbeat says how far it applied them. Heartbeats follow each other at once: the leader
//!   holds one while it has nothing to tell, up to the heartbeat interval (long polling), so what
//!   it tells arrives within a round trip.
//! - **Names**: every mount names this process's instance id; a leader that sees the member's
//!   name held by another live process refuses with `MEMBER_NAME_TAKEN`, and this member then
//!   retries, one warning per attempt, for twice the leader's member TTL (long enough for a
//!   holder that died to expire) before it gives up with that refusal. It never evicts the
//!   holder.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tonic::transport::Channel;

use crate::tls::ClientTls;

use super::segment::Segment;
use super::tiering::{Load, Report, Tiering};
use crate::election::kube::{KubeLeases, LeaseRef};
use crate::error::{ErrorCode, StoreError};
use crate::proto::control_client::ControlClient;
use crate::proto::membership_client::MembershipClient;
use crate::proto::{HealthRequest, HeartbeatRequest, HeartbeatResponse, MountRequest, MountResponse};
use crate::readiness::{Readiness, ReadinessHandle};

const MIN_BACKOFF: Duration = Duration::from_millis(100);
/// At most twice a second while no leader takes the mount, so one that starts serving is found
/// within half a second.
const MAX_BACKOFF: Duration = Duration::from_millis(500);
/// The member TTL assumed of a leader that does not say (its own default).
const DEFAULT_MEMBER_TTL: Duration = Duration::from_secs(10);
/// How long a connection attempt or a heartbeat may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(1);
/// The longest a leader may hold a heartbeat while the disk tier has copies to make or report.
/// A batch copied while a heartbeat is held is reported only once that one comes back: with 50
/// ms, the leader heard of a burst's last copies about 25 ms late on average, a tenth of the time
/// this VM's disk takes for 64 MiB. At 10 ms a copying member's heartbeats come at most 100 a
/// second, and only while it copies.
const REPORT_WAIT: Duration = Duration::from_millis(10);
/// The largest Mount message a leader reads.
pub const MAX_MOUNT_MESSAGE: usize = 64 << 20;

/// Where the serving leader is found.
enum Finder {
    Fixed(String),
    Lease(LeaseRef, Box<KubeLeases>),
}

impl Finder {
    async fn new(leader: &str, kubeconfig: Option<&Path>) -> Result<Finder, StoreError> {
        let Some(lease) = leader.strip_prefix(super::config::LEASE_SCHEME) else {
            return Ok(Finder::Fixed(leader.to_owned()));
        };
        let at = LeaseRef::parse(lease).map_err(|e| StoreError::new(ErrorCode::InvalidArgument, e))?;
        let client = crate::election::kube::client(kubeconfig)
            .await
            .map_err(|e| StoreError::new(ErrorCode::InvalidArgument, e))?;
        Ok(Finder::Lease(at.clone(), Box::new(KubeLeases::new(client, at))))
    }

    /// The serving leader's address now.
    async fn find(&self) -> Result<String, StoreError> {
        match self {
            Finder::Fixed(a) => Ok(a.clone()),
            Finder::Lease(at, leases) => match leases.holder().await {
                Ok(Some(h)) => Ok(h),
                Ok(None) => Err(StoreError::new(
                    ErrorCode::NotServing,
                    format!("the Lease {at} names no holder yet (an election is under way)"),
                )),
                Err(e) => Err(StoreError::new(ErrorCode::Transport, e.to_string())),
            },
        }
    }

    /// Resolves when the leader may have changed (Lease addressing only).
    async fn changed(&self) {
        match self {
            Finder::Fixed(_) => std::future::pending().await,
            Finder::Lease(_, leases) => crate::election::LeaseStore::changed(leases.as_ref()).await,
        }
    }
}

/// Connects to the leader at `addr`, within [`CALL_TIMEOUT`].
async fn connect(addr: &str, tls: Option<&ClientTls>) -> Result<Channel, StoreError> {
    let endpoint = crate::tls::grpc_endpoint(addr, tls).map_err(|e| {
        StoreError::new(
            ErrorCode::InvalidArgument,
            format!("leader address {addr:?} is not a usable HOST:PORT: {e}"),
        )
    })?;
    endpoint
        .connect_timeout(CALL_TIMEOUT)
        .tcp_nodelay(true)
        .connect()
        .await
        .map_err(|e| {
            StoreError::new(
                ErrorCode::Transport,
                format!("leader {addr} unreachable: {}", crate::error::chain(&e)),
            )
        })
}

/// Mounts, heartbeats and remounts until the leader refuses this member's name for longer than
/// the bound; only that returns (with the refusal). `hot` is the data paths' polling window: a
/// heartbeat answer that carries notices keeps it open, as a request does (a removal's answer
/// waits for this member, and the put that follows it should find the member hot).
#[allow(clippy::too_many_arguments)] // one call site; each is a different piece of the member
pub(super) async fn stay_mounted(
    leader: &str,
    kubeconfig: Option<&Path>,
    req: MountRequest,
    token: Option<&str>,
    tls: Option<&ClientTls>,
    segment: &Arc<Segment>,
    tiering: Option<&Arc<Tiering>>,
    readiness: &ReadinessHandle,
    hot: &crate::spin::HotWindow,
) -> Result<(), StoreError> {
    let finder = Finder::new(leader, kubeconfig).await?;
    let mut backoff = MIN_BACKOFF;
    // when the name was first refused, and how long refusals are retried
    let mut refused: Option<(Instant, Duration)> = None;
    loop {
        segment.set_mount(0);
        readiness.set(Readiness::Starting);
        let (addr, channel) = match find_leader(&finder, tls).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(%leader, error = %e, "no leader to mount at, retrying");
                backoff = pause(backoff).await;
                continue;
            }
        };
        let mut client = MembershipClient::new(channel.clone());
        let mounted = match mount(&mut client, &req, token, segment, tiering).await {
            Ok(m) => m,
            Err(e) if e.code == ErrorCode::MemberNameTaken => {
                name_refused(&mut refused, &channel, &req.name, e).await?;
                backoff = pause(backoff).await;
                continue;
            }
            Err(e) if e.code == ErrorCode::LedgerPending => {
                tracing::info!(%addr, "the leader waits for its tenant ledger before it adopts what this member holds; retrying");
                tokio::time::sleep(MIN_BACKOFF).await;
                continue;
            }
            Err(e) => {
                tracing::warn!(%addr, error = %e, "mount refused, retrying");
                backoff = pause(backoff).await;
                continue;
            }
        };
        if let Err(e) = super::report::hand_over_rest(&mut client, &mounted, req.instance_id, token, segment).await {
            tracing::warn!(%addr, error = %e, "handing over the rest of this member's report failed; mounting again");
            continue;
        }
        refused = None;
        backoff = MIN_BACKOFF;
        readiness.set(Readiness::Serving);
        tracing::info!(
            %addr,
            member_id = mounted.member_id,
            mount_id = mounted.mount_id,
            epoch = mounted.epoch,
            "segment mounted"
        );
        heartbeat(
            &finder,
            &addr,
            tls,
            client,
            &mounted,
            req.instance_id,
            token,
            segment,
            tiering,
            hot,
        )
        .await;
    }
}

/// Finds the serving leader and connects to it, returning its address and the channel.
async fn find_leader(finder: &Finder, tls: Option<&ClientTls>) -> Result<(String, Channel), StoreError> {
    let addr = finder.find().await?;
    let channel = connect(&addr, tls).await?;
    Ok((addr, channel))
}

/// Takes a refusal of this member's name (`MEMBER_NAME_TAKEN`, `e`) into account: `Ok` (with a
/// warning) while refusals are retried, the refusal once they have gone on for twice the leader's
/// member TTL since the first, which `refused` records.
async fn name_refused(
    refused: &mut Option<(Instant, Duration)>,
    channel: &Channel,
    name: &str,
    e: StoreError,
) -> Result<(), StoreError> {
    let (since, bound) = match *refused {
        Some(r) => r,
        None => *refused.insert((Instant::now(), 2 * member_ttl(channel).await)),
    };
    if since.elapsed() >= bound {
        let waited = kvcache_units::format_duration(Duration::from_secs(bound.as_secs().max(1)));
        return Err(StoreError::new(
            e.code,
            format!("{}; gave up after {waited} of refusals", e.message),
        ));
    }
    let left_ms = bound.saturating_sub(since.elapsed()).as_millis() as u64;
    tracing::warn!(%name, error = %e, gives_up_in_ms = left_ms, "mount refused, retrying");
    Ok(())
}

/// One mount: adopt a fresh mount id first (the leader may place values here as soon as it
/// answers), then ask; an answer from an epoch older than one seen is refused.
async fn mount(
    client: &mut MembershipClient<Channel>,
    req: &MountRequest,
    token: Option<&str>,
    segment: &Segment,
    tiering: Option<&Arc<Tiering>>,
) -> Result<MountResponse, StoreError> {
    let mount_id = uuid::Uuid::new_v4().as_u64_pair().0 | 1;
    let _in_flight = segment.mounting();
    segment.set_mount(mount_id);
    let (holdings, more_holdings) = super::report::first_page(segment);
    let disk_holdings = tiering.map(|t| t.holdings()).unwrap_or_default();
    let page = holdings.len();
    let asked = MountRequest {
        mount_id,
        holdings,
        disk_holdings: disk_holdings.clone(),
        more_holdings,
        ..req.clone()
    };
    let mut asked = tonic::Request::new(asked);
    if let Some(t) = token {
        crate::auth::attach(&mut asked, t)?;
    }
    // a large report takes longer to send and to adopt
    let timeout = super::report::timeout_for(page + disk_holdings.len());
    match tokio::time::timeout(timeout, client.mount(asked)).await {
        Ok(Ok(r)) => take_mount(segment, tiering, r.into_inner(), page, &disk_holdings),
        Ok(Err(status)) => {
            segment.set_mount(0);
            Err(StoreError::from_status(&status))
        }
        Err(_) => {
            segment.set_mount(0);
            Err(StoreError::new(
                ErrorCode::Transport,
                "the mount was not answered in time",
            ))
        }
    }
}

/// Takes a mount's answer: refuses one from an epoch older than one seen, makes what the leader
/// adopted readable under the new mount before its grant key is taken, and removes the disk
/// records it did not adopt.
fn take_mount(
    segment: &Segment,
    tiering: Option<&Arc<Tiering>>,
    r: MountResponse,
    page: usize,
    disk_holdings: &[crate::proto::DiskHolding],
) -> Result<MountResponse, StoreError> {
    if !segment.see_epoch(r.epoch) {
        segment.set_mount(0);
        return Err(StoreError::new(
            ErrorCode::StaleEpoch,
            format!(
                "the leader serves epoch {}, older than epoch {} this member mounted under: it was deposed",
                r.epoch,
                segment.epoch()
            ),
        ));
    }
    let key = match crate::grant::GrantKey::from_bytes(&r.grant_key) {
        Ok(k) => k,
        Err(e) => {
            segment.set_mount(0);
            return Err(e);
        }
    };
    // the leader keeps the member's choice unless it clashes with another mount
    segment.set_mount(r.mount_id);
    // what was adopted is readable before any grant of the new term verifies
    let adopted = segment.adopt(page, &r.adopted);
    segment.set_grant_key(key);
    if page > 0 {
        tracing::info!(
            reported = page,
            adopted,
            epoch = r.epoch,
            "the leader adopted what this member held"
        );
    }
    if let Some(t) = tiering
        && !disk_holdings.is_empty()
    {
        let removed = t.adopted(disk_holdings, &r.disk_adopted);
        tracing::info!(
            reported = disk_holdings.len(),
            removed,
            epoch = r.epoch,
            "the leader adopted what this member's disk tier holds (the rest is removed)"
        );
    }
    Ok(r)
}

/// Heartbeats until the mount must be made again: the leader does not know it, or another
/// leader holds the Lease. When the leader stops answering, the checksums of what this member
/// holds are checked in the background meanwhile, so the report to the next leader is ready when
/// it serves (`Segment::precheck`).
#[allow(clippy::too_many_arguments)] // one call site; each is a different piece of the mount
async fn heartbeat(
    finder: &Finder,
    addr: &str,
    tls: Option<&ClientTls>,
    mut client: MembershipClient<Channel>,
    mounted: &MountResponse,
    instance_id: u64,
    token: Option<&str>,
    segment: &Arc<Segment>,
    tiering: Option<&Arc<Tiering>>,
    hot: &crate::spin::HotWindow,
) {
    let interval = Duration::from_millis(mounted.heartbeat_interval_ms.max(10));
    let mut failing = false;
    // how far this member applied the leader's notices (`leader/notices.rs`)
    let mut applied: u64 = 0;
    // when the Lease's holder was last read (Lease addressing), and whether it may have moved
    let mut looked = Instant::now();
    let mut moved = false;
    loop {
        // at once while heartbeats succeed (the leader holds each while it has nothing to tell,
        // up to the interval); every 100 ms while they fail: a leader that starts serving (a
        // failover) answers within that, and the member remounts at once
        if failing {
            tokio::select! {
                () = tokio::time::sleep(MIN_BACKOFF) => {}
                () = finder.changed() => moved = true,
            }
        }
        // the Lease is read when it may have moved, and at most once an interval otherwise
        if let Finder::Lease(..) = finder
            && (moved || failing || looked.elapsed() >= interval)
        {
            moved = false;
            looked = Instant::now();
            if lease_moved(finder, addr).await {
                return;
            }
        }
        let (hb, report) = next_heartbeat(mounted, instance_id, interval, applied, tiering, token);
        let call = client.heartbeat(hb);
        let answered = tokio::select! {
            r = tokio::time::timeout(CALL_TIMEOUT.max(interval) + interval, call) => r,
            // the Lease moved while the leader held the heartbeat: look again
            () = finder.changed() => {
                moved = true;
                put_back(tiering, report);
                continue;
            }
        };
        match answered {
            Ok(Ok(r)) if r.get_ref().need_remount => {
                tracing::warn!(%addr, "leader does not know this mount; remounting (handing over what this member holds)");
                return;
            }
            Ok(Ok(r)) => {
                failing = false;
                let r = r.into_inner();
                if let Some(t) = tiering {
                    apply_tier(t, segment, mounted.mount_id, &r).await;
                }
                applied = apply_notices(segment, tiering, mounted.mount_id, r, applied, hot);
            }
            failed => {
                put_back(tiering, report);
                let why = match failed {
                    Ok(Err(s)) => StoreError::from_status(&s).to_string(),
                    _ => "not answered in time".to_owned(),
                };
                if let Some(c) = heartbeat_failed(addr, tls, &why, &mut failing, segment).await {
                    client = c;
                }
            }
        }
    }
}

/// Whether the Lease now names a leader other than the one at `addr` (then the member remounts
/// there); a Lease that cannot be read is no move.
async fn lease_moved(finder: &Finder, addr: &str) -> bool {
    if let Ok(now) = finder.find().await
        && now != addr
    {
        tracing::warn!(from = %addr, to = %now, "another leader holds the Lease; remounting there");
        return true;
    }
    false
}

/// The next heartbeat, with the disk tier's report it carries (put back if it is not delivered).
fn next_heartbeat(
    mounted: &MountResponse,
    instance_id: u64,
    interval: Duration,
    applied: u64,
    tiering: Option<&Arc<Tiering>>,
    token: Option<&str>,
) -> (tonic::Request<HeartbeatRequest>, Option<(Report, u64)>) {
    // while the tier copies, the leader answers within a short wait: it learns of the copies
    // (what eviction keeps) within that, not a whole interval later
    let wait = match tiering {
        Some(t) if t.busy() => interval.min(REPORT_WAIT),
        _ => interval,
    };
    let report = tiering.map(|t| (t.take_report(), t.usage().0));
    let hb = heartbeat_request(mounted, instance_id, wait, applied, report.as_ref(), token);
    (hb, report)
}

/// A report a heartbeat did not deliver goes with the next one.
fn put_back(tiering: Option<&Arc<Tiering>>, report: Option<(Report, u64)>) {
    if let (Some(t), Some((r, _))) = (tiering, report) {
        t.put_back(r);
    }
}

/// The next heartbeat: this mount, how long the leader may hold it, how far the notices were
/// applied, what the disk tier did (its report and usage), with the member token.
fn heartbeat_request(
    mounted: &MountResponse,
    instance_id: u64,
    interval: Duration,
    applied: u64,
    tier: Option<&(Report, u64)>,
    token: Option<&str>,
) -> tonic::Request<HeartbeatRequest> {
    let mut hb = HeartbeatRequest {
        member_id: mounted.member_id,
        mount_id: mounted.mount_id,
        instance_id,
        wait_ms: interval.as_millis() as u64,
        applied_through: applied,
        ..Default::default()
    };
    if let Some((report, used)) = tier {
        hb.tier_used = *used;
        hb.spilled = report.spilled.iter().map(|(h, _)| h.clone()).collect();
        hb.spilled_allocations = report.spilled.iter().map(|(_, a)| *a).collect();
        hb.lost_disk_ids = report.lost.clone();
        hb.failed_read_disk_ids = report.failed_reads.clone();
    }
    let mut hb = tonic::Request::new(hb);
    if let Some(t) = token {
        let _ = crate::auth::attach(&mut hb, t);
    }
    hb
}

/// Applies a heartbeat answer's loads from the disk tier and its disk frees (on the blocking
/// pool), before its seals and frees: a range loaded and freed since the last answer is not held.
/// A load that cannot be applied is in the tier's next report as lost.
async fn apply_tier(tiering: &Arc<Tiering>, segment: &Arc<Segment>, mount_id: u64, r: &HeartbeatResponse) {
    if r.load_disk_ids.is_empty() && r.disk_freed.is_empty() {
        return;
    }
    let loads: Vec<Load> = (0..r.load_disk_ids.len())
        .filter_map(|i| {
            Some(Load {
                disk_id: r.load_disk_ids[i],
                offset: *r.load_offsets.get(i)?,
                allocation: *r.load_allocations.get(i)?,
                seal: r.load_seals.get(i)?.as_ref().try_into().ok()?,
                tag: std::sync::Arc::from(r.load_tags.get(i)?.as_ref()),
            })
        })
        .collect();
    let (t, seg, freed) = (tiering.clone(), segment.clone(), r.disk_freed.clone());
    let applied = tokio::task::spawn_blocking(move || t.apply(&seg, mount_id, &loads, &freed)).await;
    if let Err(e) = applied {
        tracing::warn!(error = %e, "applying the leader's disk tier notices failed");
    }
}

/// Applies a heartbeat answer's notices to the segment (seals, then frees; the disk tier's went
/// first: [`apply_tier`]), queues the values sealed for their copy to the disk tier, and returns
/// how far the notices are now applied; news keeps the polling window open.
fn apply_notices(
    segment: &Segment,
    tiering: Option<&Arc<Tiering>>,
    mount_id: u64,
    r: HeartbeatResponse,
    applied: u64,
    hot: &crate::spin::HotWindow,
) -> u64 {
    // seals first: a value committed and freed since the last answer is not held
    if !r.sealed_offsets.is_empty() {
        segment.seal(mount_id, &r.sealed_offsets, &r.sealed_allocations, &r.seals);
        if let Some(t) = tiering {
            t.sealed(mount_id, &r.sealed_offsets, &r.sealed_allocations);
        }
    }
    if !r.freed_offsets.is_empty() {
        segment.forget(mount_id, &r.freed_offsets, &r.freed_allocations);
    }
    if r.through > applied {
        hot.touch();
    }
    applied.max(r.through)
}

/// After a heartbeat failed (`why`): warns and starts checking what this member holds when the
/// failures begin, and returns a fresh client if a new connection could be made.
async fn heartbeat_failed(
    addr: &str,
    tls: Option<&ClientTls>,
    why: &str,
    failing: &mut bool,
    segment: &Arc<Segment>,
) -> Option<MembershipClient<Channel>> {
    // keep trying: a leader that comes back (or takes over at this address)
    // answers need_remount if it lost the mount
    if !std::mem::replace(failing, true) {
        tracing::warn!(%addr, error = %why, "heartbeat failed; retrying");
        let s = segment.clone();
        drop(tokio::task::spawn_blocking(move || s.precheck()));
    }
    // a fresh connection: the old one may lead to a leader that stopped or hangs
    connect(addr, tls).await.ok().map(MembershipClient::new)
}

/// The leader's member TTL, from its `Health`.
async fn member_ttl(channel: &Channel) -> Duration {
    let health = ControlClient::new(channel.clone()).health(HealthRequest {}).await;
    match health.map(|h| h.into_inner().member_ttl_ms) {
        Ok(ms) if ms > 0 => Duration::from_millis(ms),
        _ => DEFAULT_MEMBER_TTL,
    }
}

/// Sleeps `backoff`, and returns the next one (doubled, at most [`MAX_BACKOFF`]).
async fn pause(backoff: Duration) -> Duration {
    tokio::time::sleep(backoff).await;
    (backoff * 2).min(MAX_BACKOFF)
}
