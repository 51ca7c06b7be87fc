//! Keeping the segment mounted: mount, heartbeat, and mount again (starting empty) whenever the
//! leader does not know this mount. Every mount names this process's instance id; a leader that
//! sees the member's name held by another live process refuses with `MEMBER_NAME_TAKEN`, and this
//! member then retries, one warning per attempt, for twice the leader's member TTL (long enough
//! for a holder that died to expire) before it gives up with that refusal. It never evicts the
//! holder.

use std::time::{Duration, Instant};

use tonic::transport::{Channel, Endpoint};

use super::segment::Segment;
use crate::error::{ErrorCode, StoreError};
use crate::proto::control_client::ControlClient;
use crate::proto::membership_client::MembershipClient;
use crate::proto::{HealthRequest, HeartbeatRequest, MountRequest, MountResponse};
use crate::readiness::{Readiness, ReadinessHandle};

const MIN_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// The member TTL assumed of a leader that does not say (its own default).
const DEFAULT_MEMBER_TTL: Duration = Duration::from_secs(10);

/// Mounts, heartbeats and remounts until the leader refuses this member's name for longer than
/// the bound; only that returns (with the refusal).
pub(super) async fn stay_mounted(
    leader: &str,
    req: MountRequest,
    segment: &Segment,
    readiness: &ReadinessHandle,
) -> Result<(), StoreError> {
    let endpoint = Endpoint::from_shared(format!("http://{leader}")).map_err(|e| {
        StoreError::new(
            ErrorCode::InvalidArgument,
            format!("--leader {leader:?} is not a usable HOST:PORT: {e}"),
        )
    })?;
    let mut backoff = MIN_BACKOFF;
    // when the name was first refused, and how long refusals are retried
    let mut refused: Option<(Instant, Duration)> = None;
    loop {
        segment.set_mount(0);
        readiness.set(Readiness::Starting);
        let channel = match endpoint.connect().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(%leader, error = %crate::error::chain(&e), "leader unreachable, retrying");
                backoff = pause(backoff).await;
                continue;
            }
        };
        let mut client = MembershipClient::new(channel.clone());
        let mounted = match mount(&mut client, &req, segment).await {
            Ok(m) => m,
            Err(e) if e.code == ErrorCode::MemberNameTaken => {
                let (since, bound) = match refused {
                    Some(r) => r,
                    None => *refused.insert((Instant::now(), 2 * member_ttl(&channel).await)),
                };
                if since.elapsed() >= bound {
                    let waited = kvcache_units::format_duration(Duration::from_secs(bound.as_secs().max(1)));
                    return Err(StoreError::new(
                        e.code,
                        format!("{}; gave up after {waited} of refusals", e.message),
                    ));
                }
                let left_ms = bound.saturating_sub(since.elapsed()).as_millis() as u64;
                tracing::warn!(name = %req.name, error = %e, gives_up_in_ms = left_ms, "mount refused, retrying");
                backoff = pause(backoff).await;
                continue;
            }
            Err(e) => {
                tracing::warn!(%leader, error = %e, "mount refused, retrying");
                backoff = pause(backoff).await;
                continue;
            }
        };
        refused = None;
        backoff = MIN_BACKOFF;
        readiness.set(Readiness::Serving);
        tracing::info!(
            member_id = mounted.member_id,
            mount_id = mounted.mount_id,
            "segment mounted"
        );
        heartbeat(&mut client, &mounted, req.instance_id).await;
    }
}

/// One mount: adopt a fresh mount id first (the leader may place values here as soon as it
/// answers), then ask.
async fn mount(
    client: &mut MembershipClient<Channel>,
    req: &MountRequest,
    segment: &Segment,
) -> Result<MountResponse, StoreError> {
    let mount_id = uuid::Uuid::new_v4().as_u64_pair().0 | 1;
    segment.set_mount(mount_id);
    let asked = MountRequest {
        mount_id,
        ..req.clone()
    };
    match client.mount(asked).await {
        Ok(r) => {
            let r = r.into_inner();
            // the leader keeps the member's choice unless it clashes with another mount
            segment.set_mount(r.mount_id);
            Ok(r)
        }
        Err(status) => {
            segment.set_mount(0);
            Err(StoreError::from_status(&status))
        }
    }
}

/// Heartbeats until the leader no longer knows the mount.
async fn heartbeat(client: &mut MembershipClient<Channel>, mounted: &MountResponse, instance_id: u64) {
    let interval = Duration::from_millis(mounted.heartbeat_interval_ms.max(10));
    loop {
        tokio::time::sleep(interval).await;
        let hb = HeartbeatRequest {
            member_id: mounted.member_id,
            mount_id: mounted.mount_id,
            instance_id,
        };
        match client.heartbeat(hb).await {
            Ok(r) if r.get_ref().need_remount => {
                tracing::warn!("leader does not know this mount; remounting empty");
                return;
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %StoreError::from_status(&e), "heartbeat failed"),
        }
    }
}

/// The leader's member TTL, from its `Health`.
async fn member_ttl(channel: &Channel) -> Duration {
    let health = ControlClient::new(channel.clone()).health(HealthRequest {}).await;
    match health.map(|h| h.into_inner().member_ttl_ms) {
        Ok(ms) if ms > 0 => Duration::from_millis(ms),
        _ => DEFAULT_MEMBER_TTL,
    }
}

async fn pause(backoff: Duration) -> Duration {
    tokio::time::sleep(backoff).await;
    (backoff * 2).min(MAX_BACKOFF)
}
