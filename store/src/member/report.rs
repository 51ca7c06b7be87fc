//! Handing a new leader what this member holds, in pages: the mount carries the report's first
//! page ([`first_page`]), and each further page is a `Handover` call ([`hand_over_rest`]), its
//! values packed (`crate::holdings`), four in flight, whose answers are applied in the report's
//! order. However many values the segment holds, none is left out, and no message or answer
//! grows past a page's worth.
//!
//! Until the last page is answered the leader places nothing new in the segment, so the values
//! not answered yet keep their bytes: a remount in the middle (the leader stopped answering)
//! reports them again to whichever leader serves. A leader that refuses a page outright (one
//! that has no `Handover`, or that ended the report) may place values over them, so they are no
//! longer held ([`Segment::end_report`]).

use std::sync::Arc;
use std::time::Duration;

use tonic::transport::Channel;

use super::segment::Segment;
use crate::error::{ErrorCode, StoreError};
use crate::proto::membership_client::MembershipClient;
use crate::proto::{HandoverRequest, Holding, MountResponse};

/// The most tags and seals a page carries: about 3,000 values of the connector's 73-byte keys,
/// which the leader adopts in about 2 ms under its state lock (its other calls wait that long at
/// most). Smaller pages, more of them in flight, keep both processes busy: a page's decoding and
/// adoption on the leader's runtime thread no longer holds up the answer to the one before.
pub const PAGE: usize = 512 << 10;
/// How long a page may take besides its values' share (one millisecond per 50 values): a leader
/// that does not answer within it is taken for gone, and the member mounts again, which costs the
/// leader dropping and adopting everything again, so it is generous.
const PAGE_TIMEOUT: Duration = Duration::from_secs(5);

/// Starts a report to a new leader: its first page, and whether more follow.
pub(super) fn first_page(segment: &Segment) -> (Vec<Holding>, bool) {
    let counts = segment.report();
    tracing::info!(
        values = counts.values,
        bytes = counts.bytes,
        "reporting what this member holds to a new leader"
    );
    let page = segment.page(PAGE);
    (page, segment.unsent() > 0)
}

/// How long a call carrying `values` holdings may take (the mount's too: one that carries none
/// is answered at once by a leader that serves).
pub(super) fn timeout_for(values: usize) -> Duration {
    if values == 0 {
        return Duration::from_secs(1);
    }
    PAGE_TIMEOUT + Duration::from_millis(values as u64 / 50)
}

/// Pages in flight at once: the leader checks some while it adopts another, and this member
/// makes the next and applies answers meanwhile (measured at 1 million values: 2 pages of 2 MiB
/// adopted 95% in 2.44 s, 4 of 512 KiB in 1.98 s).
pub const IN_FLIGHT: usize = 4;

/// Sends the report's further pages under `mounted`, [`IN_FLIGHT`] at a time, applying the
/// answers in the report's order. `Err` means the mount must be made again (the leader stopped
/// answering, or does not know the mount): the pages not answered are reported again then. A page
/// refused otherwise ends the report.
pub(super) async fn hand_over_rest(
    client: &mut MembershipClient<Channel>,
    mounted: &MountResponse,
    instance_id: u64,
    token: Option<&str>,
    segment: &Arc<Segment>,
) -> Result<(), StoreError> {
    let mut pages = 0u64;
    let mut adopted = 0u64;
    // where the next page starts in the report: after the mount's page (its answer has one
    // allocation per holding it carried)
    let mut first = mounted.adopted.len() as u64;
    let mut in_flight = futures::stream::FuturesOrdered::new();
    loop {
        while in_flight.len() < IN_FLIGHT && segment.unsent() > 0 {
            let (sent, packed) = off_thread(segment, |s| s.packed_page(PAGE)).await?;
            let mut asked = tonic::Request::new(HandoverRequest {
                member_id: mounted.member_id,
                mount_id: mounted.mount_id,
                instance_id,
                holdings: Vec::new(),
                last: segment.unsent() == 0,
                first,
                packed,
            });
            first += sent as u64;
            if let Some(t) = token {
                crate::auth::attach(&mut asked, t)?;
            }
            let mut client = client.clone();
            in_flight.push_back(async move {
                let answer = tokio::time::timeout(timeout_for(sent), client.handover(asked)).await;
                (sent, answer)
            });
        }
        let Some((sent, answer)) = futures::StreamExt::next(&mut in_flight).await else {
            break;
        };
        let answer = match answer {
            Ok(Ok(r)) => r.into_inner(),
            Ok(Err(status)) => {
                let e = StoreError::from_status(&status);
                if matches!(
                    e.code,
                    ErrorCode::StaleMount | ErrorCode::Transport | ErrorCode::NotServing
                ) {
                    return Err(e);
                }
                let dropped = segment.end_report();
                tracing::warn!(error = %e, dropped, "the leader refused a page of this member's report; the rest is not held");
                return Ok(());
            }
            Err(_) => {
                return Err(StoreError::new(
                    ErrorCode::Transport,
                    "a page of the report was not answered in time",
                ));
            }
        };
        adopted += off_thread(segment, move |s| s.adopt(sent, &answer.adopted)).await?;
        pages += 1;
    }
    if pages > 0 {
        tracing::info!(
            pages,
            adopted,
            epoch = mounted.epoch,
            "the leader adopted the rest of what this member held"
        );
    }
    Ok(())
}

/// Runs `f` on the segment on the runtime's blocking threads: making a page (hashing its values)
/// and applying an answer take milliseconds, during which the runtime's thread goes on sending
/// the page in flight and reading the next answer.
async fn off_thread<R: Send + 'static>(
    segment: &Arc<Segment>,
    f: impl FnOnce(&Segment) -> R + Send + 'static,
) -> Result<R, StoreError> {
    let segment = Arc::clone(segment);
    tokio::task::spawn_blocking(move || f(&segment))
        .await
        .map_err(|e| StoreError::new(ErrorCode::Internal, format!("a page of the report stopped: {e}")))
}
