//! Keeping the segment mounted: mount, heartbeat, and mount again (starting empty) whenever the
//! leader does not know this mount.

use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

use super::segment::Segment;
use crate::error::{ErrorCode, StoreError};
use crate::proto::membership_client::MembershipClient;
use crate::proto::{HeartbeatRequest, MountRequest, MountResponse};
use crate::readiness::{Readiness, ReadinessHandle};

const MIN_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Mounts, heartbeats and remounts for as long as it runs; returns only if `leader` is not a
/// usable address.
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
            Err(e) => {
                tracing::warn!(%leader, error = %e, "mount refused, retrying");
                backoff = pause(backoff).await;
                continue;
            }
        };
        backoff = MIN_BACKOFF;
        readiness.set(Readiness::Serving);
        tracing::info!(
            member_id = mounted.member_id,
            mount_id = mounted.mount_id,
            "segment mounted"
        );
        heartbeat(&mut client, &mounted).await;
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
async fn heartbeat(client: &mut MembershipClient<Channel>, mounted: &MountResponse) {
    let interval = Duration::from_millis(mounted.heartbeat_interval_ms.max(10));
    loop {
        tokio::time::sleep(interval).await;
        let hb = HeartbeatRequest {
            member_id: mounted.member_id,
            mount_id: mounted.mount_id,
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

async fn pause(backoff: Duration) -> Duration {
    tokio::time::sleep(backoff).await;
    (backoff * 2).min(MAX_BACKOFF)
}
