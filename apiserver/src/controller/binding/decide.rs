//! The Binding controller's decision, with no I/O: from what a pass observed (the workloads that
//! use the Binding, its credential, the leader's ledger) to the status to write, the event for a
//! grant that moved, and whether the deletion may complete. The table tests below hold its rules,
//! case by case: a live Binding, a credential rotation and a deleting Binding.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kvcache_api::binding::BindingStatus;
use kvcache_api::common::UsedBy;
use kvcache_api::conditions::binding::{domain_exclusive, quota_granted, quota_observed, releasable};
use kvcache_api::conditions::{self, BindingPhase, ConditionStatus, Observation};
use kvcache_api::{KVCachePoolBinding, Quantity};
use kvcache_store::proto::{GetTenantsResponse, GrantLimit, TenantStatus};

use crate::controller::shared::{self, Next};
use crate::controller::status::{Axes, axes, has_finalizer};
use crate::controller::{human, quantity};

/// What a pass observed.
#[derive(Clone, Debug)]
pub struct Observed {
    /// the ModelDeployments of the namespace that attach through the Binding, by name
    pub used_by: Vec<UsedBy>,
    /// the SHA-256 of the credential replicas are given now
    pub credential_hash: [u8; 32],
    /// a rotation of the credential is under way
    pub rotating: bool,
    /// the leader's ledger, or why it could not be read
    pub leader: Result<GetTenantsResponse, String>,
}

/// What the pass does.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// the status to write (`None`: leave it)
    pub status: Option<BindingStatus>,
    /// nothing holds the deleting Binding: forget its credentials and remove the finalizer
    pub release: bool,
    /// the message of a `GrantChanged` event, when the leader's grant moved
    pub grant_changed: Option<String>,
    pub next: Next,
}

/// How soon a Binding whose credential is rotating is looked at again (the rotation waits on the
/// ledger and on the replicas' rollout).
pub const ROTATION_POLL: Duration = Duration::from_secs(1);

/// The pass's decision.
pub fn decide(b: &KVCachePoolBinding, seen: &Observed, now: &Time, requeue: Duration) -> Decision {
    let mut d = Decision {
        status: None,
        release: false,
        grant_changed: None,
        next: Next::Requeue(requeue),
    };
    let generation = b.metadata.generation;
    let set = |st: &mut BindingStatus, o: Observation| {
        conditions::set(&mut st.conditions, o.generation(generation), now);
    };
    let prev = b.status.clone().unwrap_or_default();
    if b.metadata.deletion_timestamp.is_some() {
        if !has_finalizer(b) {
            d.next = Next::AwaitChange;
        } else if seen.used_by.is_empty() {
            d.release = true;
            d.next = Next::AwaitChange;
        } else {
            let mut st = prev;
            let msg = shared::held_by(&seen.used_by, "Binding");
            set(
                &mut st,
                Observation::new(
                    releasable::TYPE,
                    ConditionStatus::False,
                    releasable::HELD_BY_WORKLOADS,
                    &msg,
                ),
            );
            st.used_by = seen.used_by.clone();
            st.phase = Some(BindingPhase::Deleting);
            st.phase_message = Some(msg);
            d.status = Some(st);
        }
        return d;
    }
    let mut st = BindingStatus {
        conditions: prev.conditions.clone(),
        used_by: seen.used_by.clone(),
        ..BindingStatus::default()
    };
    // Storage admits a domain once per backend, atomically with the write.
    set(
        &mut st,
        Observation::new(
            domain_exclusive::TYPE,
            ConditionStatus::True,
            domain_exclusive::EXCLUSIVE,
            format!(
                "this Binding alone holds the domain {:?} on its backend",
                b.spec.domain_name()
            ),
        ),
    );
    for o in quota(b, seen, &prev, &mut st) {
        set(&mut st, o);
    }
    let (phase, message) = phase(&st);
    st.phase = Some(phase);
    st.phase_message = message;
    if prev.effective_quota.is_some() && st.effective_quota.is_some() && prev.effective_quota != st.effective_quota {
        d.grant_changed = Some(format!(
            "the leader now grants {} (was {})",
            st.effective_quota.as_ref().map(Quantity::as_str).unwrap_or_default(),
            prev.effective_quota.as_ref().map(Quantity::as_str).unwrap_or_default()
        ));
    }
    d.status = Some(st);
    if seen.rotating {
        d.next = Next::Requeue(requeue.min(ROTATION_POLL));
    }
    d
}

/// The figures read from the leader's ledger, and QuotaObserved and QuotaGranted.
fn quota(b: &KVCachePoolBinding, seen: &Observed, prev: &BindingStatus, st: &mut BindingStatus) -> Vec<Observation> {
    let tenant = b.spec.domain_name();
    let t = match &seen.leader {
        Err(e) => return not_scraped(prev, st, e),
        Ok(t) => t,
    };
    if !t.multi_tenancy {
        return no_tenant_ledger(t, st);
    }
    let Some(x) = t.tenants.iter().find(|x| x.name == tenant) else {
        return vec![
            observed(
                quota_observed::TENANT_NOT_IN_LEDGER,
                format!("the leader's ledger has no tenant {tenant:?} yet; the pool writes it"),
            ),
            Observation::new(
                quota_granted::TYPE,
                ConditionStatus::False,
                quota_granted::NO_LEDGER_ENTRY,
                format!("the leader would refuse writes of tenant {tenant:?} until the pool registers it"),
            ),
        ];
    };
    if !x.credential_sha256.iter().any(|h| h.as_ref() == seen.credential_hash) {
        return vec![
            observed(
                quota_observed::OBSERVED,
                format!("read from the leader's ledger: the tenant {tenant:?}"),
            ),
            Observation::new(
                quota_granted::TYPE,
                ConditionStatus::False,
                quota_granted::NO_LEDGER_ENTRY,
                format!(
                    "the leader's ledger does not bind the tenant {tenant:?} to this Binding's credential yet; the pool writes it"
                ),
            ),
        ];
    }
    st.requested_quota = Some(quantity(x.ceiling));
    st.effective_quota = Some(quantity(x.grant));
    st.usage = Some(quantity(x.used));
    st.over_quota = Some(x.over_grant);
    st.blocks = Some(i64::try_from(x.objects).unwrap_or(i64::MAX));
    st.hit_rate = shared::hit_rate(x.hits, x.misses);
    vec![
        observed(
            quota_observed::OBSERVED,
            format!(
                "read from the leader's ledger: the tenant {tenant:?}, its grant and its usage (reserved writes included)"
            ),
        ),
        granted(x, t),
    ]
}

/// A QuotaObserved True observation.
fn observed(reason: conditions::Reason, msg: String) -> Observation {
    Observation::new(quota_observed::TYPE, ConditionStatus::True, reason, msg)
}

/// The ledger could not be read: the last pass's figures are kept, QuotaObserved is False.
fn not_scraped(prev: &BindingStatus, st: &mut BindingStatus, error: &str) -> Vec<Observation> {
    // figures kept from the last pass
    st.requested_quota = prev.requested_quota.clone();
    st.effective_quota = prev.effective_quota.clone();
    st.usage = prev.usage.clone();
    st.over_quota = prev.over_quota;
    vec![Observation::new(
        quota_observed::TYPE,
        ConditionStatus::False,
        quota_observed::MASTER_NOT_SCRAPED,
        error,
    )]
}

/// Multi-tenancy is off: the default tenant's figures, and no quota in force.
fn no_tenant_ledger(t: &GetTenantsResponse, st: &mut BindingStatus) -> Vec<Observation> {
    if let Some(d) = t.tenants.iter().find(|x| x.name == "default") {
        st.usage = Some(quantity(d.used));
        st.blocks = Some(i64::try_from(d.objects).unwrap_or(i64::MAX));
        st.hit_rate = shared::hit_rate(d.hits, d.misses);
    }
    vec![
        observed(
            quota_observed::NO_TENANT_LEDGER,
            "the leader keeps no tenant ledger (multi-tenancy is off)".into(),
        ),
        Observation::new(
            quota_granted::TYPE,
            ConditionStatus::True,
            quota_granted::UNENFORCED,
            "no per-domain quota is in force: writes land in the store's default tenant, bounded only by its capacity",
        ),
    ]
}

/// QuotaGranted for a tenant the ledger binds to this Binding, saying which limit cut its grant.
fn granted(x: &TenantStatus, t: &GetTenantsResponse) -> Observation {
    let why = match x.limited_by() {
        GrantLimit::None => String::new(),
        GrantLimit::PoolTotal => {
            let total = t.pools.iter().find(|p| p.name == x.pool).map(|p| p.total).unwrap_or(0);
            format!(
                ": the Bindings of the pool {:?} ask for more than its total of {}, which they share in proportion",
                x.pool,
                human(total)
            )
        }
        GrantLimit::Capacity => ": the pools on the backend may hand out more than its mounted capacity, which they \
                                  share in proportion (see the pool's CapacityAllocatable)"
            .to_owned(),
    };
    if x.grant > 0 {
        Observation::new(
            quota_granted::TYPE,
            ConditionStatus::True,
            quota_granted::GRANTED,
            format!("granted {} of the {} asked for{why}", human(x.grant), human(x.ceiling)),
        )
    } else {
        let msg = if why.is_empty() {
            "the leader grants nothing: see the pool's CapacityAllocatable (nothing mounted) or its QuotaWithinTotal"
                .to_owned()
        } else {
            format!("the leader grants nothing{why}")
        };
        Observation::new(
            quota_granted::TYPE,
            ConditionStatus::False,
            quota_granted::ZERO_GRANTED,
            msg,
        )
    }
}

/// The Binding's phase over DomainExclusive, QuotaObserved and QuotaGranted, in that order: the
/// first axis that is not True is an Error, a missing one Provisioning, else Ready.
fn phase(st: &BindingStatus) -> (BindingPhase, Option<String>) {
    let order = [domain_exclusive::TYPE, quota_observed::TYPE, quota_granted::TYPE];
    match axes(&st.conditions, &order, |_| false) {
        Axes::Fault(message) => (BindingPhase::Error, Some(message)),
        Axes::Missing(t) => (
            BindingPhase::Provisioning,
            Some(format!("{t} has not been observed yet")),
        ),
        Axes::Clear => (
            BindingPhase::Ready,
            conditions::find(&st.conditions, quota_observed::TYPE).map(|c| c.message.clone()),
        ),
    }
}

#[cfg(test)]
mod tests;
