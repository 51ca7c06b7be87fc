//! Member liveness: mounting a segment, heartbeats, and unmounting a member that went silent
//! (its objects are dropped, because their bytes went with it). A name belongs to one live member
//! process at a time: a mount under a name that another live process holds is refused
//! (`MEMBER_NAME_TAKEN`), never allowed to evict it.
//!
//! Heartbeat answers carry the notices the member has not had yet (`notices.rs`): the seals of
//! values committed and the ranges freed. A member hands a next leader only what this leader
//! sealed and has not freed since, so a value never committed (a revoked or abandoned put) is
//! never adopted, and a removed value does not come back after a failover (a `Remove` is answered
//! once the member applied the free). Members poll long: a heartbeat with nothing to tell is held
//! until a notice is queued (`grpc.rs`), so notices arrive within a round trip.

use std::time::Instant;

use super::placement::SegmentAllocator;
use super::state::{Mounted, State};
use crate::error::{ErrorCode, Result, StoreError};
use crate::proto::{HeartbeatRequest, HeartbeatResponse, MountRequest, MountResponse};

impl State {
    /// Mounts a member's segment and adopts what it holds (`adoption.rs`). The same process
    /// mounting again (its instance id matches) replaces its old mount, whose objects are dropped
    /// and adopted again from its report. Another process may take a name only once the holder
    /// has been silent past the member TTL.
    pub fn mount(&mut self, req: &MountRequest, now: Instant) -> Result<MountResponse> {
        check_mount_request(req)?;
        self.check_ledger_for(req.holdings.len() + req.disk_holdings.len(), now)?;
        // a process unmounted for falling behind on what it was told hands over nothing: its
        // report may hold values this leader freed
        let trusted = !self.distrusted.remove(&req.instance_id);
        // a member of another release would not understand the answer to its report
        let understood = req.handover == crate::protocol::HANDOVER;
        if !understood && !req.holdings.is_empty() {
            tracing::warn!(
                name = %req.name,
                handover = req.handover,
                expected = crate::protocol::HANDOVER,
                held = req.holdings.len(),
                "a member of another release reports what it holds in memory; none of it is adopted (run the \
                 backend's leader and members at one release)"
            );
        }
        self.take_name(req, now)?;
        let id = self.next_member_id;
        self.next_member_id += 1;
        let mount_id = self.mount_id_for(req.mount_id);
        let mut member = new_member(req, mount_id, self.grant_key.for_mount(mount_id), now);
        let memory_trusted = trusted && understood;
        member.handing_over = req.more_holdings.then_some(super::mounted::Handover {
            reported: req.holdings.len() as u64,
            trusted: memory_trusted,
        });
        self.members.insert(id, member);
        self.recompute_grants();
        let holdings = if memory_trusted { &req.holdings[..] } else { &[] };
        let disk_holdings = if trusted { &req.disk_holdings[..] } else { &[] };
        let mut adopted = self.adopt(id, holdings, 0);
        adopted.resize(req.holdings.len(), 0);
        let mut disk_adopted = self.adopt_disk(id, disk_holdings, now);
        disk_adopted.resize(req.disk_holdings.len(), false);
        let kept: Vec<u64> = adopted.iter().copied().filter(|a| *a != 0).collect();
        let grant_key = self
            .members
            .get(&id)
            .map(|m| m.grant_key.to_bytes())
            .unwrap_or_default();
        tracing::info!(
            member_id = id,
            name = %req.name,
            capacity = req.capacity,
            held = req.holdings.len(),
            more_to_come = req.more_holdings,
            adopted = kept.len(),
            tier_capacity = req.tier_capacity,
            on_disk = req.disk_holdings.len(),
            adopted_from_disk = disk_adopted.iter().filter(|a| **a).count(),
            "member mounted"
        );
        Ok(MountResponse {
            adopted,
            member_id: id,
            mount_id,
            heartbeat_interval_ms: self.cfg.heartbeat_interval().as_millis() as u64,
            epoch: self.epoch,
            grant_key: grant_key.into(),
            disk_adopted,
        })
    }

    /// Frees `req`'s name for its mount: refuses it while another live process holds it,
    /// else unmounts every member under it (this process's old mount, or a holder silent past
    /// the member TTL).
    fn take_name(&mut self, req: &MountRequest, now: Instant) -> Result<()> {
        let ttl = self.cfg.member_ttl;
        let same_name = self.members.iter().filter(|(_, m)| m.name == req.name);
        let mut old = Vec::new();
        for (id, m) in same_name {
            let silent = now.saturating_duration_since(m.last_seen);
            let same_process = req.instance_id != 0 && m.instance_id == req.instance_id;
            if !same_process && silent <= ttl {
                tracing::warn!(name = %req.name, holder = %m.data_addr, "mount refused: the name is held by a live member");
                return Err(StoreError::new(
                    ErrorCode::MemberNameTaken,
                    format!(
                        "member name {:?} is held by another live member (data address {}, last heartbeat {} ms \
                         ago); give each member on a host its own --name (it defaults to the host name)",
                        req.name,
                        m.data_addr,
                        silent.as_millis()
                    ),
                ));
            }
            old.push(*id);
        }
        for id in old {
            self.unmount(id);
        }
        Ok(())
    }

    /// The mount id a new mount gets: the member's choice, unless it is 0 or another mount has
    /// it, then a fresh random one.
    fn mount_id_for(&self, asked: u64) -> u64 {
        let taken = self.members.values().any(|m| m.mount_id == asked);
        if asked != 0 && !taken {
            asked
        } else {
            uuid::Uuid::new_v4().as_u64_pair().0 | 1
        }
    }

    /// Records a heartbeat (and how far the member applied its notices); `false` means the leader
    /// does not know this mount and the member must mount again.
    pub fn heartbeat(&mut self, hb: &HeartbeatRequest, now: Instant) -> bool {
        match self.members.get_mut(&hb.member_id) {
            Some(m)
                if m.mount_id == hb.mount_id
                    && (hb.instance_id == 0 || m.instance_id == hb.instance_id)
                    && !m.notices.overflowed() =>
            {
                m.last_seen = now;
                m.notices.acknowledge(hb.applied_through);
                self.loads_applied(hb.member_id);
                true
            }
            _ => false,
        }
    }

    /// A heartbeat that has nothing to be told: the member's news to wait on (long polling), or
    /// `None` when the answer is due now (news waits, or the mount is unknown).
    pub fn hold_heartbeat(
        &mut self,
        hb: &HeartbeatRequest,
        now: Instant,
    ) -> Option<std::sync::Arc<tokio::sync::Notify>> {
        if hb.wait_ms == 0 || !self.heartbeat(hb, now) {
            return None;
        }
        let m = self.members.get(&hb.member_id)?;
        (!m.notices.pending()).then(|| m.notices.news())
    }

    /// The answer to a heartbeat: remount when the mount is unknown, else the notices the member
    /// has not had (at most [`super::notices::PER_ANSWER`]).
    pub fn answer_heartbeat(&mut self, hb: &HeartbeatRequest, now: Instant) -> HeartbeatResponse {
        if !self.heartbeat(hb, now) {
            return HeartbeatResponse {
                need_remount: true,
                ..Default::default()
            };
        }
        let mut answer = HeartbeatResponse::default();
        if let Some(m) = self.members.get_mut(&hb.member_id) {
            m.notices.answer(&mut answer);
        }
        answer
    }

    /// Unmounts members silent for longer than the TTL, and members too far behind on their
    /// notices (`notices.rs`); returns how many.
    pub fn expire_members(&mut self, now: Instant) -> usize {
        let ttl = self.cfg.member_ttl;
        let dead: Vec<(u64, bool)> = self
            .members
            .iter()
            .filter(|(_, m)| now.saturating_duration_since(m.last_seen) > ttl || m.notices.overflowed())
            .map(|(id, m)| (*id, m.notices.overflowed()))
            .collect();
        for (id, behind) in &dead {
            if *behind {
                if let Some(m) = self.members.get(id) {
                    self.distrusted.insert(m.instance_id);
                }
                tracing::warn!(
                    member_id = id,
                    queued = super::notices::QUEUED,
                    "member too far behind on what it must be told, unmounting (it mounts again, empty)"
                );
            } else {
                tracing::warn!(
                    member_id = id,
                    ttl_ms = ttl.as_millis() as u64,
                    "member silent past its ttl, unmounting"
                );
            }
            self.unmount(*id);
        }
        dead.len()
    }

    /// Drops the member mounted under `name` (its process ended); returns whether one was.
    pub fn remove_member(&mut self, name: &str) -> bool {
        let ids: Vec<u64> = self
            .members
            .iter()
            .filter(|(_, m)| m.name == name)
            .map(|(id, _)| *id)
            .collect();
        for id in &ids {
            tracing::warn!(
                member_id = id,
                name,
                "member process ended (its supervisor says so), unmounting"
            );
            self.unmount(*id);
        }
        !ids.is_empty()
    }

    /// Drops a member and every object whose bytes it held: in each tenant, only the slots up to
    /// the last of them are walked, and the keys are read out only for a stream that listens.
    pub(super) fn unmount(&mut self, id: u64) {
        let Some(member) = self.members.remove(&id) else { return };
        let epoch = self.epoch;
        for t in self.tenants.values_mut() {
            let listening = t.log.listening();
            let (mut readable, mut any) = (Vec::new(), false);
            let (mut used, mut disk_used) = (t.used, t.disk_used);
            let removed = t.objects.remove_placed_in(id, member.mount_id, |key, o| {
                used = used.saturating_sub(o.charge);
                if o.disk.is_some() {
                    disk_used = disk_used.saturating_sub(o.len);
                }
                if o.state == super::objects::ObjectState::Committed {
                    any = true;
                    if listening {
                        readable.push(key.to_string());
                    }
                }
            });
            if removed == 0 {
                continue;
            }
            (t.used, t.disk_used) = (used, disk_used);
            if any {
                t.log.removed_with(epoch, super::blocks::Removal::Member, || readable);
            }
        }
        self.recompute_grants();
    }
}

/// Refuses a mount that lacks the member's name or addresses, mounts nothing, or reports more
/// holdings than its segment can hold.
fn check_mount_request(req: &MountRequest) -> Result<()> {
    if req.name.is_empty() || req.data_addr.is_empty() || req.grpc_addr.is_empty() {
        return Err(StoreError::new(
            ErrorCode::InvalidArgument,
            "a mount needs the member's name, data_addr and grpc_addr",
        ));
    }
    if req.capacity == 0 {
        return Err(StoreError::new(
            ErrorCode::InvalidArgument,
            "a member with capacity 0 has nothing to mount",
        ));
    }
    // every value takes at least one aligned placement, so no segment holds more
    let most = req.capacity / super::placement::ALIGN;
    if req.holdings.len() as u64 > most {
        return Err(StoreError::new(
            ErrorCode::InvalidArgument,
            format!(
                "this mount reports {} holdings, and a {}-byte segment holds at most {most} values",
                req.holdings.len(),
                req.capacity
            ),
        ));
    }
    // every record takes at least one 4 KiB block of the tier
    let most = req.tier_capacity / 4096;
    if req.disk_holdings.len() as u64 > most {
        return Err(StoreError::new(
            ErrorCode::InvalidArgument,
            format!(
                "this mount reports {} disk holdings, and a {}-byte disk tier holds at most {most} values",
                req.disk_holdings.len(),
                req.tier_capacity
            ),
        ));
    }
    Ok(())
}

/// A freshly mounted member of `req`, under `mount_id`, holding nothing yet.
fn new_member(req: &MountRequest, mount_id: u64, grant_key: crate::grant::GrantKey, now: Instant) -> Mounted {
    Mounted {
        name: req.name.clone(),
        data_addr: req.data_addr.clone(),
        grpc_addr: req.grpc_addr.clone(),
        local_addr: req.local_addr.clone(),
        mount_id,
        instance_id: req.instance_id,
        alloc: SegmentAllocator::new(req.capacity),
        objects: 0,
        tier_capacity: req.tier_capacity,
        tier_used: 0,
        disk: Default::default(),
        loading: Default::default(),
        last_seen: now,
        notices: Default::default(),
        grant_key,
        handing_over: None,
    }
}
