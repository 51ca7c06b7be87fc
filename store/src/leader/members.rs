//! Member liveness: mounting a segment, heartbeats, and unmounting a member that went silent
//! (its objects are dropped, because their bytes went with it). A name belongs to one live member
//! process at a time: a mount under a name that another live process holds is refused
//! (`MEMBER_NAME_TAKEN`), never allowed to evict it.
//!
//! Heartbeat answers carry the seals of values committed since the last one
//! ([`Member::sealed`]) and the ranges freed since ([`Member::freed`]): a member hands a next
//! leader only what this leader sealed and has not freed since, so a value never committed (a
//! revoked or abandoned put) is never adopted, and a removed, evicted or reclaimed value does not
//! come back after a failover (unless the leader fails within a heartbeat of freeing it).

use std::time::Instant;

use super::placement::SegmentAllocator;
use super::state::{Member, State};
use crate::error::{ErrorCode, Result, StoreError};
use crate::proto::{HeartbeatRequest, HeartbeatResponse, MountRequest, MountResponse};

/// Most freed ranges one heartbeat answer carries (at most 20 bytes each on the wire); the rest
/// come with the next answers.
pub const FREED_PER_ANSWER: usize = 65_536;

/// Most freed ranges queued for one member (16 bytes each). Past it (a member that stopped
/// answering under a storm of evictions) the oldest are dropped: such a value may be handed to a
/// next leader again, which is safe (its bytes are its key's) and is charged and evicted as any.
pub const FREED_QUEUED: usize = 1 << 20;

impl Member {
    /// Queues a freed range for the member's next heartbeat answer.
    pub fn freed(&mut self, offset: u64, allocation: u64) {
        if self.freed.len() == FREED_QUEUED {
            self.freed.pop_front();
        }
        self.freed.push_back((offset, allocation));
    }

    /// Queues a committed value's seal for the member's next heartbeat answer. Past
    /// [`FREED_QUEUED`] the oldest are dropped: such a value is simply not handed to a next
    /// leader (a miss after a failover, never a wrong byte).
    pub fn sealed(&mut self, offset: u64, allocation: u64, seal: [u8; crate::grant::MAC_LEN]) {
        if self.sealed.len() == FREED_QUEUED {
            self.sealed.pop_front();
        }
        self.sealed.push_back((offset, allocation, seal));
    }
}

impl State {
    /// Mounts a member's segment and adopts what it holds (`adoption.rs`). The same process
    /// mounting again (its instance id matches) replaces its old mount, whose objects are dropped
    /// and adopted again from its report. Another process may take a name only once the holder
    /// has been silent past the member TTL.
    pub fn mount(&mut self, req: &MountRequest, now: Instant) -> Result<MountResponse> {
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
        self.check_ledger_for(&req.holdings, now)?;
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
        let id = self.next_member_id;
        self.next_member_id += 1;
        let taken = self.members.values().any(|m| m.mount_id == req.mount_id);
        let mount_id = if req.mount_id != 0 && !taken {
            req.mount_id
        } else {
            uuid::Uuid::new_v4().as_u64_pair().0 | 1
        };
        self.members.insert(
            id,
            Member {
                name: req.name.clone(),
                data_addr: req.data_addr.clone(),
                grpc_addr: req.grpc_addr.clone(),
                local_addr: req.local_addr.clone(),
                mount_id,
                instance_id: req.instance_id,
                alloc: SegmentAllocator::new(req.capacity),
                objects: 0,
                last_seen: now,
                freed: Default::default(),
                sealed: Default::default(),
                grant_key: self.grant_key.for_mount(mount_id),
            },
        );
        self.recompute_grants();
        let (adopted, seals) = self.adopt(id, &req.holdings, now);
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
            adopted = kept.len(),
            "member mounted"
        );
        Ok(MountResponse {
            adopted,
            seals,
            member_id: id,
            mount_id,
            heartbeat_interval_ms: self.cfg.heartbeat_interval().as_millis() as u64,
            epoch: self.epoch,
            grant_key: grant_key.into(),
        })
    }

    /// Records a heartbeat; `false` means the leader does not know this mount and the member must
    /// mount again.
    pub fn heartbeat(&mut self, hb: &HeartbeatRequest, now: Instant) -> bool {
        match self.members.get_mut(&hb.member_id) {
            Some(m) if m.mount_id == hb.mount_id && (hb.instance_id == 0 || m.instance_id == hb.instance_id) => {
                m.last_seen = now;
                true
            }
            _ => false,
        }
    }

    /// The answer to a heartbeat: remount when the mount is unknown, else the seals of values
    /// committed and the ranges freed since the last answer (at most [`FREED_PER_ANSWER`] each).
    pub fn answer_heartbeat(&mut self, hb: &HeartbeatRequest, now: Instant) -> HeartbeatResponse {
        if !self.heartbeat(hb, now) {
            return HeartbeatResponse {
                need_remount: true,
                ..Default::default()
            };
        }
        let mut answer = HeartbeatResponse::default();
        if let Some(m) = self.members.get_mut(&hb.member_id) {
            let n = m.freed.len().min(FREED_PER_ANSWER);
            (answer.freed_offsets, answer.freed_allocations) = m.freed.drain(..n).unzip();
            let n = m.sealed.len().min(FREED_PER_ANSWER);
            for (offset, allocation, seal) in m.sealed.drain(..n) {
                answer.sealed_offsets.push(offset);
                answer.sealed_allocations.push(allocation);
                answer.seals.push(bytes::Bytes::copy_from_slice(&seal));
            }
        }
        answer
    }

    /// Unmounts members silent for longer than the TTL; returns how many.
    pub fn expire_members(&mut self, now: Instant) -> usize {
        let ttl = self.cfg.member_ttl;
        let dead: Vec<u64> = self
            .members
            .iter()
            .filter(|(_, m)| now.saturating_duration_since(m.last_seen) > ttl)
            .map(|(id, _)| *id)
            .collect();
        for id in &dead {
            tracing::warn!(
                member_id = id,
                ttl_ms = ttl.as_millis() as u64,
                "member silent past its ttl, unmounting"
            );
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

    /// Drops a member and every object whose bytes it held.
    pub(super) fn unmount(&mut self, id: u64) {
        let Some(member) = self.members.remove(&id) else { return };
        let epoch = self.epoch;
        for t in self.tenants.values_mut() {
            let lost: Vec<String> = t
                .objects
                .iter()
                .filter(|(_, o)| o.member == id && o.mount_id == member.mount_id)
                .map(|(k, _)| k.clone())
                .collect();
            if lost.is_empty() {
                continue;
            }
            let mut readable = Vec::new();
            for k in lost {
                if let Some(o) = t.objects.remove(&k)
                    && o.state == super::objects::ObjectState::Committed
                {
                    readable.push(k);
                }
            }
            t.used = t.objects.values().map(|o| o.charge).sum();
            t.log.removed(epoch, readable, super::blocks::Removal::Member);
        }
        self.recompute_grants();
    }
}
