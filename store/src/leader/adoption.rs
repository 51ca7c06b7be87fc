//! A new term keeps the cache: members hand over what they hold when they mount
//! (`MountRequest.holdings`), and the leader adopts each value it can stand behind.
//!
//! A holding is adopted when
//! - its seal verifies (`grant::SealKey`): a leader of this backend sealed exactly this tag at this
//!   offset, size and epoch once the value was committed, so the tenant and key are the leader's
//!   word (neither a writer's nor a member's), and the value was committed;
//! - its tenant is in this term's ledger, held by the same Binding (the tag's uid), with the same
//!   block layout (a tenant re-registered with another layout, or given to another Binding, starts
//!   empty), and the key is not already held;
//! - its range lies inside the segment, aligned, and overlaps nothing adopted before it;
//! - the member checked its bytes against the checksum taken when its write finished (a value it
//!   could not vouch for is not reported at all: `member/segment/handover.rs`).
//!
//! Adopted values are committed, unleased, charged to their tenant like a put (so a tenant whose
//! new grant is smaller is over its grant, and eviction takes its least recently used values
//! first, by the usual rules, in the order the members last used them, across members), and
//! reported to `WatchBlocks` streams as `BlockStored`. They get allocation numbers of this term,
//! which the answer tells the member. They keep their seals: a seal names the term that
//! committed the value, any term of the backend verifies it, and one made anew would prove
//! nothing more (the member could keep the old one anyway), so none is made. Everything else is
//! free space.
//!
//! A large report comes in pages (`member/mount.rs`): the mount carries the first and says more
//! follow (`MountRequest.more_holdings`), and each further page is a `Handover` call adopted the
//! same way. Until the last page the leader places nothing new in that segment: a free range
//! there may be what a later page holds, and a put's bytes written over a held value would let
//! a later page hand over bytes its seal no longer covers. No page is larger than the member
//! makes it, so no report is cut short, however many values a member holds.
//!
//! A page's seals are checked outside the state lock ([`Vouching`]):
//! under it the leader only checks the ledger, takes the ranges and files the objects. A member
//! may send its next page before the last is answered (`HandoverRequest.first` says where each
//! starts), so one page is checked while the one before it is adopted; pages are adopted in the
//! report's order, a page that came early waiting ([`PageTurn::Early`]).
//!
//! A member's report waits for the ledger ([`LEDGER_WAIT`]): a leader that has none yet this term
//! refuses the mount with `LEDGER_PENDING`, which the member retries within 100 ms, so no tenant's
//! values are dropped only because the controllers had not yet sent the ledger.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::mounted::Mounted;
use super::objects::{Object, ObjectState, Resident, charge};
use super::placement::aligned;
use super::state::State;
use super::tenant::Tenant;
use crate::error::{ErrorCode, Result, StoreError};
use crate::grant::{Placed, SealKey, Tag, TagRef};
use crate::proto::{HandoverRequest, HandoverResponse, Holding};

/// How long into a term a member's report waits for a ledger before the leader adopts against
/// whatever ledger it has (possibly none: everything is freed).
pub const LEDGER_WAIT: Duration = Duration::from_secs(5);

impl State {
    /// Refuses a mount that reports holdings while this term has no ledger yet (for at most
    /// [`LEDGER_WAIT`] into the term).
    pub(super) fn check_ledger_for(&self, holdings: usize, now: Instant) -> Result<()> {
        if holdings == 0 || self.ledger_known || now.saturating_duration_since(self.started) >= LEDGER_WAIT {
            return Ok(());
        }
        Err(StoreError::new(
            ErrorCode::LedgerPending,
            format!(
                "this leader has no tenant ledger yet in this term (epoch {}), and this member holds {} values to \
                 hand over; retry in a moment (the controllers send the ledger on their first sight of a new term; \
                 after {} s the leader adopts without it)",
                self.epoch,
                holdings,
                LEDGER_WAIT.as_secs()
            ),
        ))
    }

    /// What this term checks a page's seals against, outside the state lock.
    pub fn vouching(&self) -> Vouching {
        Vouching {
            key: Arc::clone(&self.seal_key),
            epoch: self.epoch,
            max_value_size: self.cfg.max_value_size,
        }
    }

    /// Adopts a further page of a mount's report, reading it and checking its seals here (under
    /// the state lock): the member-facing path does both outside it (`grpc.rs`). A page that
    /// starts past what was adopted so far is refused.
    pub fn handover(&mut self, req: &HandoverRequest, now: Instant) -> Result<HandoverResponse> {
        let mut req = req.clone();
        unpack_page(&mut req)?;
        let vouching = self.vouching();
        let sealed = vouching.sealed_all(&req.holdings);
        match self.handover_sealed(&req, &vouching, &sealed, now)? {
            PageTurn::Adopted(adopted) => Ok(HandoverResponse { adopted }),
            PageTurn::Early => Err(StoreError::new(
                ErrorCode::InvalidArgument,
                "this page starts past what the leader adopted of the report so far",
            )),
        }
    }

    /// Adopts a further page of a mount's report whose seals were checked against `vouching`
    /// (`sealed[i]`: whether holding i's seal verified and its tag reads);
    /// the last page lets the segment's free space be placed in again. Answers, per holding, the
    /// allocation it is adopted under (0: not adopted), or that the pages before it have not all
    /// come. The report of a member that fell behind on what it was told adopts nothing
    /// (`Handover::trusted`); a page after the last, or sent twice, is refused.
    pub fn handover_sealed(
        &mut self,
        req: &HandoverRequest,
        vouching: &Vouching,
        sealed: &[bool],
        now: Instant,
    ) -> Result<PageTurn> {
        let m = match self.members.get_mut(&req.member_id) {
            Some(m)
                if m.mount_id == req.mount_id
                    && (req.instance_id == 0 || m.instance_id == req.instance_id)
                    && vouching.epoch == self.epoch =>
            {
                m
            }
            _ => {
                return Err(StoreError::new(
                    ErrorCode::StaleMount,
                    "this leader does not know this mount (it restarted, or the member was silent past its TTL); \
                     mount again and report from the start",
                ));
            }
        };
        m.last_seen = now;
        let most = m.alloc.capacity() / super::placement::ALIGN;
        let Some(report) = m.handing_over else {
            return Err(StoreError::new(
                ErrorCode::InvalidArgument,
                "this mount's report has ended (its mount said no more pages follow, or a page said it was the last)",
            ));
        };
        let before = report.reported;
        match req.first {
            0 => {}
            first if first > before => return Ok(PageTurn::Early),
            first if first < before => {
                return Err(StoreError::new(
                    ErrorCode::InvalidArgument,
                    format!(
                        "this page starts at holding {first} of the report, and the leader has adopted {before} \
                         holdings of it already: each page is sent once"
                    ),
                ));
            }
            _ => {}
        }
        let reported = before + req.holdings.len() as u64;
        if reported > most {
            return Err(StoreError::new(
                ErrorCode::InvalidArgument,
                format!(
                    "this mount's report has reached {reported} holdings, and its segment holds at most {most} values"
                ),
            ));
        }
        m.handing_over = (!req.last).then_some(super::mounted::Handover { reported, ..report });
        let sealed: &[bool] = if report.trusted { sealed } else { &[] };
        let mut adopted = self.adopt_sealed(req.member_id, &req.holdings, sealed, before);
        adopted.resize(req.holdings.len(), 0);
        tracing::debug!(
            member_id = req.member_id,
            held = req.holdings.len(),
            adopted = adopted.iter().filter(|a| **a != 0).count(),
            last = req.last,
            "a page of a member's report adopted"
        );
        Ok(PageTurn::Adopted(adopted))
    }

    /// Adopts what a freshly mounted member holds (one page of its report, `before` holdings
    /// after its start); returns, per holding, the allocation it is adopted under (0: not
    /// adopted).
    pub(super) fn adopt(&mut self, member_id: u64, holdings: &[Holding], before: u64) -> Vec<u64> {
        let sealed = self.vouching().sealed_all(holdings);
        self.adopt_sealed(member_id, holdings, &sealed, before)
    }

    /// Adopts the holdings whose seals verified (`sealed[i]`, one per holding, or none at all);
    /// returns, per holding, the allocation it is adopted under (0: not adopted). The member and
    /// each run of holdings of one tenant are looked up once, not once a holding.
    fn adopt_sealed(&mut self, member_id: u64, holdings: &[Holding], sealed: &[bool], before: u64) -> Vec<u64> {
        let mut answer = Vec::with_capacity(holdings.len());
        // per tenant and value size, the keys adopted, for the block logs (a page is mostly runs
        // of one tenant and size)
        let mut stored: Vec<((&str, u64), Vec<&str>)> = Vec::new();
        let State {
            members,
            tenants,
            next_allocation,
            adopted,
            tick,
            ..
        } = self;
        let mut taker = members.get_mut(&member_id).map(|m| Taker {
            member_id,
            member: m,
            next_allocation,
            adopted,
            now: *tick,
        });
        let mut tenant: Option<(&str, &mut Tenant)> = None;
        for (i, (h, &sealed)) in holdings.iter().zip(sealed).enumerate() {
            // read again here: reading a tag is a few bounds checks, and the checked page could
            // not hand over tags that borrow from it
            let (Some(tag), Some(taker)) = (sealed.then(|| TagRef::decode(&h.tag)).flatten(), taker.as_mut()) else {
                answer.push(0);
                continue;
            };
            if tenant.as_ref().is_none_or(|(name, _)| *name != tag.tenant) {
                tenant = tenants.get_mut(tag.tenant).map(|t| (tag.tenant, t));
            }
            let adopted = match &mut tenant {
                Some((_, t)) if holds(t, &tag) => taker.take(t, h, tag.key, before + i as u64),
                _ => None,
            };
            answer.push(adopted.unwrap_or(0));
            if adopted.is_some() {
                match stored.last_mut() {
                    Some((at, keys)) if *at == (tag.tenant, h.size) => keys.push(tag.key),
                    _ => stored.push(((tag.tenant, h.size), vec![tag.key])),
                }
            }
        }
        let epoch = self.epoch;
        for ((tenant, size), keys) in stored {
            if let Some(t) = self.tenants.get_mut(tenant) {
                t.log.stored_keys(epoch, &keys, size);
            }
        }
        if !holdings.is_empty() {
            self.recompute_grants();
        }
        answer
    }

    /// The tag of a value a member hands over, when this term can stand behind it: its seal
    /// verifies ([`Vouching::sealed`]), and its tenant is of this term's ledger, held by the same
    /// Binding with the same block layout (`placed` is what the seal names).
    pub(super) fn vouched(&self, tag: &[u8], placed: &Placed, seal: &[u8]) -> Option<Tag> {
        let tag = self.vouching().sealed(tag, placed, seal)?;
        self.in_ledger(&tag).then(|| tag.to_owned())
    }

    /// Whether a tag's tenant is of this term's ledger, held by the same Binding (the tag's uid)
    /// with the same block layout.
    fn in_ledger(&self, tag: &TagRef<'_>) -> bool {
        self.tenants.get(tag.tenant).is_some_and(|t| holds(t, tag))
    }
}

/// Whether `t` is the tenant a tag names as this term's ledger has it: held by the same Binding
/// (the tag's uid) with the same block layout.
fn holds(t: &Tenant, tag: &TagRef<'_>) -> bool {
    let same_layout = match &t.layout {
        Some(l) => l.block_size == tag.block_size && l.dtype == tag.dtype,
        None => tag.block_size == 0 && tag.dtype.is_empty(),
    };
    same_layout && t.uid == tag.uid
}

/// What adopting takes from the state besides a tenant: the member whose report it is, the
/// term's next allocation number, the adoption's count, and the term's clock.
struct Taker<'s> {
    member_id: u64,
    member: &'s mut Mounted,
    next_allocation: &'s mut u64,
    adopted: &'s mut super::state::Adopted,
    now: u64,
}

impl Taker<'_> {
    /// Files holding `h` under `key` in tenant `t` (a tenant of the ledger the holding's tag
    /// names) when there is room and its range is free; returns its allocation. `place` is the
    /// holding's place in its report: it orders values its member last used within the same
    /// millisecond.
    fn take(&mut self, t: &mut Tenant, h: &Holding, key: &str, place: u64) -> Option<u64> {
        if !t.objects.has_room() {
            return None;
        }
        let len = aligned(h.size);
        if !self.member.alloc.take(h.offset, len) {
            return None;
        }
        let allocation = *self.next_allocation;
        // by the time of its last use on the member, never after this term's own operations
        let within_ms = place.min(super::state::TICKS_PER_MS - 1);
        let last_used = (super::state::tick_at(h.last_used_unix_ms) + within_ms).min(self.now);
        let object = Object {
            member: self.member_id,
            mount_id: self.member.mount_id,
            memory: Some(Resident {
                offset: h.offset,
                allocation,
                ready: true,
            }),
            disk: None,
            size: h.size,
            len,
            charge: charge(len, key.len()),
            state: ObjectState::Committed,
            lease_until: None,
            last_used,
        };
        let charged = object.charge;
        if t.objects.insert_new(key, object) != Ok(true) {
            // the key is held already (from another member, or twice in a report)
            self.member.alloc.release(h.offset, len);
            return None;
        }
        t.used += charged;
        *self.next_allocation += 1;
        self.adopted.objects += 1;
        self.adopted.bytes += h.size;
        self.member.objects += 1;
        Some(allocation)
    }
}

/// Reads a page's packed holdings (`crate::holdings`) into its messages; a page carries its
/// holdings one way or the other, not both.
pub fn unpack_page(req: &mut HandoverRequest) -> Result<()> {
    if req.packed.is_empty() {
        return Ok(());
    }
    if !req.holdings.is_empty() {
        return Err(StoreError::new(
            ErrorCode::InvalidArgument,
            "this page carries its holdings both as messages and packed; send one or the other",
        ));
    }
    req.holdings = crate::holdings::unpack(&std::mem::take(&mut req.packed))?;
    Ok(())
}

/// Where a page of a report stands: adopted (for a page of holdings, per holding, its
/// allocation, 0 where not adopted), or come before a page that precedes it.
#[derive(Debug, PartialEq, Eq)]
pub enum PageTurn<R = Vec<u64>> {
    Adopted(R),
    Early,
}

/// What a term checks seals against: its seal key, its epoch and the largest value it takes. A
/// copy is taken under the state lock and used outside it, so the hashing of a page's seals does
/// not hold up the leader's other calls.
#[derive(Debug, Clone)]
pub struct Vouching {
    key: Arc<SealKey>,
    epoch: u64,
    max_value_size: u64,
}

impl Vouching {
    /// The tag of a held value whose seal this term can stand behind: a size this leader takes,
    /// an epoch not after its own, a seal of the backend's leaders over exactly this tag and
    /// placement, and a valid key (the ledger's part is [`State::vouched`]'s).
    pub fn sealed<'a>(&self, tag: &'a [u8], placed: &Placed, seal: &[u8]) -> Option<TagRef<'a>> {
        if placed.size == 0 || placed.size > self.max_value_size || placed.epoch > self.epoch {
            return None;
        }
        if !self.key.verifies(tag, placed, seal) {
            return None;
        }
        let tag = TagRef::decode(tag)?;
        State::check_key(tag.key).ok()?;
        Some(tag)
    }

    /// Whether each holding's seal verifies and its tag reads ([`Vouching::sealed`]).
    pub fn sealed_all(&self, holdings: &[Holding]) -> Vec<bool> {
        holdings
            .iter()
            .map(|h| {
                let placed = Placed {
                    offset: h.offset,
                    size: h.size,
                    epoch: h.epoch,
                };
                self.sealed(&h.tag, &placed, &h.seal).is_some()
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
