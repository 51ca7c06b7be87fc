//! The ledger applied to the state: replacing it, turning ceilings into grants, and resolving
//! which tenant a request acts for (registration and layout checks), and a tenant's block stream
//! started from its state.

use super::blocks::Subscription;
use super::ledger::{self, Callers, DEFAULT_TENANT, Layout};
use super::state::State;

use crate::error::{ErrorCode, Result, StoreError};
use crate::proto::{GrantLimit, PoolEntry, Scope, TenantEntry};

impl State {
    /// Recomputes every grant from the ceilings, the pools' totals and the mounted capacity.
    pub(super) fn recompute_grants(&mut self) {
        let capacity = self.capacity();
        if !self.cfg.multi_tenancy {
            for t in self.tenants.values_mut() {
                t.ceiling = capacity;
                t.grant = capacity;
                t.limited_by = GrantLimit::None;
            }
            return;
        }
        let pools: Vec<&String> = self.pools.keys().collect();
        let totals: Vec<u64> = self.pools.values().copied().collect();
        let mut names: Vec<String> = self.tenants.keys().cloned().collect();
        names.sort();
        let claims: Vec<ledger::Claim> = names
            .iter()
            .map(|n| {
                let t = &self.tenants[n];
                ledger::Claim {
                    ceiling: t.ceiling,
                    pool: pools.iter().position(|p| **p == t.pool),
                }
            })
            .collect();
        for (name, (grant, limit)) in names.iter().zip(ledger::grants(&claims, &totals, capacity)) {
            if let Some(t) = self.tenants.get_mut(name) {
                t.grant = grant;
                t.limited_by = limit;
            }
        }
    }

    /// Replaces the ledger (its tenants and the pools they count against); returns how many
    /// objects of removed tenants were dropped.
    pub fn set_tenants(&mut self, entries: &[TenantEntry], pools: &[PoolEntry]) -> Result<u64> {
        if !self.cfg.multi_tenancy {
            return Err(StoreError::new(
                ErrorCode::InvalidTenantLedger,
                "multi-tenancy is off on this leader, so it keeps no ledger; start it without --multi-tenancy=false",
            ));
        }
        ledger::validate(entries, pools)?;
        for e in entries {
            if let Some(t) = self.tenants.get(&e.name)
                && t.uid == e.uid
                && let Some(layout) = &t.layout
                && (layout.block_size != e.block_size || layout.dtype != e.dtype)
                && !t.objects.is_empty()
            {
                return Err(StoreError::new(
                    ErrorCode::TenantLayoutImmutable,
                    format!(
                        "tenant {:?} holds {} objects written with block size {} and dtype {:?}; its layout cannot \
                         change to block size {} and dtype {:?} while they exist: register a new tenant (domain) \
                         for the new layout",
                        e.name,
                        t.objects.len(),
                        layout.block_size,
                        layout.dtype,
                        e.block_size,
                        e.dtype
                    ),
                ));
            }
        }
        // a tenant given to another holder (its domain's Binding deleted and another made) is a new
        // tenant: the old holder's values go as if it had left the ledger
        let keep: std::collections::HashSet<&str> = entries
            .iter()
            .filter(|e| self.tenants.get(&e.name).is_none_or(|t| t.uid == e.uid))
            .map(|e| e.name.as_str())
            .collect();
        let removed: Vec<String> = self
            .tenants
            .keys()
            .filter(|n| !keep.contains(n.as_str()))
            .cloned()
            .collect();
        let mut dropped = 0;
        for name in removed {
            dropped += self.drop_every_object(&name);
            if let Some(t) = self.tenants.remove(&name) {
                self.retired.add(&t.counters);
            }
        }
        for e in entries {
            let t = self.tenants.entry(e.name.clone()).or_default();
            t.ceiling = e.ceiling;
            t.pool = e.pool.clone();
            t.credentials = ledger::credentials(e);
            t.uid = e.uid.clone();
            t.layout = Some(Layout {
                block_size: e.block_size,
                dtype: e.dtype.clone(),
            });
        }
        self.pools = pools.iter().map(|p| (p.name.clone(), p.total)).collect();
        self.callers = Callers::of(self.tenants.values().map(|t| t.credentials.as_slice()));
        self.ledger_known = true;
        self.recompute_grants();
        self.ledger_generation.send_modify(|g| *g += 1);
        Ok(dropped)
    }

    /// Drops every object of tenant `name` as the ledger lost it, a page of slots at a time, so
    /// that a tenant of millions of values never has all its keys copied at once; returns how
    /// many.
    fn drop_every_object(&mut self, name: &str) -> u64 {
        let (mut from, mut dropped) = (Some(0), 0);
        while let Some(at) = from {
            let Some(t) = self.tenants.get(name) else { break };
            let (page, next) = t.objects.page(at, super::blocks::PAGE_SLOTS);
            let keys: Vec<String> = page.into_iter().map(|(k, _)| k.to_string()).collect();
            for k in keys {
                if self.drop_object(name, &k, super::blocks::Removal::Ledger).is_some() {
                    dropped += 1;
                }
            }
            from = next;
        }
        dropped
    }

    /// Whether a caller showing `presented` before its request is read (gRPC metadata
    /// [`CREDENTIAL_HEADER`](crate::protocol::CREDENTIAL_HEADER), the fast port's hello) may
    /// send one at all: with multi-tenancy on, only a credential of some tenant in the ledger
    /// admits it, unless a tenant takes calls without one. Which tenant it acts for, and whether
    /// the credential is that tenant's, is checked once the request is read
    /// ([`State::tenant_name`]). The refusal is [`ledger::refused`]'s, which says nothing of who
    /// the tenants are.
    pub fn admits(&self, presented: Option<&str>) -> Result<()> {
        if !self.cfg.multi_tenancy || self.callers.open {
            return Ok(());
        }
        match presented {
            Some(c) if self.callers.hashes.contains(&ledger::credential_hash(c)) => Ok(()),
            _ => Err(ledger::refused_unread()),
        }
    }

    /// The tenant a request acts for, after the registration and layout checks.
    pub(super) fn tenant_name(&self, scope: Option<&Scope>) -> Result<String> {
        let scope = scope.ok_or_else(|| {
            StoreError::new(
                ErrorCode::InvalidArgument,
                "the request has no scope; send tenant, block_size and dtype",
            )
        })?;
        super::clients::check_name(&scope.client)?;
        if !self.cfg.multi_tenancy {
            if let Some(Some(layout)) = self.tenants.get(DEFAULT_TENANT).map(|t| &t.layout) {
                ledger::check_layout(DEFAULT_TENANT, layout, scope)?;
            }
            return Ok(DEFAULT_TENANT.to_string());
        }
        let t = self.tenants.get(&scope.tenant);
        ledger::check_credential(&scope.tenant, t.map(|t| t.credentials.as_slice()), &scope.credential)?;
        let Some(t) = t else {
            return Err(ledger::refused(&scope.tenant));
        };
        if let Some(layout) = &t.layout {
            ledger::check_layout(&scope.tenant, layout, scope)?;
        }
        Ok(scope.tenant.clone())
    }
}

impl State {
    /// Subscribes to the tenant's block log; the stream then takes the blocks it holds in pages
    /// (`blocks.rs`).
    pub fn watch_blocks(&mut self, scope: Option<&Scope>, restart: bool) -> Result<Subscription> {
        let tenant = self.tenant_name(scope)?;
        let t = self
            .tenants
            .get(&tenant)
            .ok_or_else(|| StoreError::new(ErrorCode::Internal, "tenant vanished"))?;
        let ledger = self.ledger_generation.subscribe();
        Subscription::start(&tenant, &t.log, self.epoch, ledger, restart)
    }

    /// A page of the tenant's readable blocks from slot `from` for a stream started in `epoch`
    /// (`blocks.rs`), and where the next page starts.
    pub fn blocks_page(&self, scope: Option<&Scope>, epoch: u64, from: usize) -> Result<super::tenant::BlocksPage> {
        if epoch != self.epoch {
            return Err(StoreError::new(
                ErrorCode::NotServing,
                "a new term started while this stream's snapshot was sent; watch again",
            ));
        }
        let tenant = self.tenant_name(scope)?;
        let t = self
            .tenants
            .get(&tenant)
            .ok_or_else(|| StoreError::new(ErrorCode::NotServing, "the tenant left the ledger; watch again"))?;
        Ok(t.committed_blocks(from, super::blocks::PAGE_SLOTS))
    }
}
