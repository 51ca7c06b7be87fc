//! The Binding controller (`pool-binding-injection.md` §2.5–2.7): reads the Binding's tenant back
//! from the leader (`requestedQuota`, `effectiveQuota` — the grant, never computed here — `usage`,
//! `overQuota`, blocks and hit rate), lists the workloads that hold it (`usedBy`), reports
//! DomainExclusive, QuotaObserved and QuotaGranted, and holds its deletion while a
//! ModelDeployment uses it (Releasable False, HeldByWorkloads).

use std::sync::Arc;

use kube::Api;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kvcache_api::binding::BindingStatus;
use kvcache_api::common::UsedBy;
use kvcache_api::conditions::binding::{domain_exclusive, quota_granted, quota_observed, releasable};
use kvcache_api::conditions::{self, BindingPhase, ConditionStatus, Observation};
use kvcache_api::{KVCacheBackend, KVCachePool, KVCachePoolBinding, ModelDeployment, Quantity};

use super::backend::list;
use super::credential::LedgerView;
use super::leader::Leader;
use super::pool::hit_rate;
use super::status::{self, Axes, add_finalizer, has_finalizer, remove_finalizer};
use super::{Context, KindLabel, Result};

const KIND: &str = "KVCachePoolBinding";

/// A deployment event wakes the Binding it attaches through.
pub fn for_deployment(md: ModelDeployment) -> Option<ObjectRef<KVCachePoolBinding>> {
    let name = md.spec.binding_name()?;
    Some(ObjectRef::new(name).within(md.namespace()))
}

/// A pool event wakes its Bindings.
pub fn for_pool(bindings: &Store<KVCachePoolBinding>, pool: &KVCachePool) -> Vec<ObjectRef<KVCachePoolBinding>> {
    bindings
        .state()
        .iter()
        .filter(|b| b.spec.pool_name() == pool.name())
        .map(|b| ObjectRef::new(b.name()).within(b.namespace()))
        .collect()
}

pub fn error_policy(_: Arc<KVCachePoolBinding>, error: &super::Error, ctx: Arc<Context>) -> Action {
    super::retry(KIND, error, &ctx)
}

pub async fn reconcile(obj: Arc<KVCachePoolBinding>, ctx: Arc<Context>) -> Result<Action> {
    ctx.metrics.reconciles.get_or_create(&KindLabel { kind: KIND }).inc();
    let ns = obj.namespace().to_owned();
    let api: Api<KVCachePoolBinding> = Api::namespaced(ctx.client.clone(), &ns);
    let deployments: Api<ModelDeployment> = Api::namespaced(ctx.client.clone(), &ns);
    let mut used_by: Vec<UsedBy> = deployments
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter(|m| m.spec.binding_name() == Some(obj.name()))
        .map(|m| UsedBy {
            kind: "ModelDeployment".into(),
            namespace: String::new(),
            name: m.name().to_owned(),
        })
        .collect();
    used_by.sort_by(|a, b| a.name.cmp(&b.name));
    let generation = obj.metadata.generation;
    let now = crate::registry::meta::now();
    let prev = obj.status.clone().unwrap_or_default();
    let set = |st: &mut BindingStatus, o: Observation| {
        conditions::set(&mut st.conditions, o.generation(generation), &now);
    };

    if obj.metadata.deletion_timestamp.is_some() {
        if !has_finalizer(&obj) {
            return Ok(Action::await_change());
        }
        if used_by.is_empty() {
            super::credential::forget(&ctx, &obj).await?;
            remove_finalizer(&api, &obj).await?;
            return Ok(Action::await_change());
        }
        let mut st = prev;
        let names: Vec<String> = used_by.iter().map(|u| format!("{}/{}", u.kind, u.name)).collect();
        let msg = format!(
            "held by {} in this namespace; delete them first, then this Binding's deletion completes",
            list(&names)
        );
        set(
            &mut st,
            Observation::new(
                releasable::TYPE,
                ConditionStatus::False,
                releasable::HELD_BY_WORKLOADS,
                &msg,
            ),
        );
        st.used_by = used_by;
        st.phase = Some(BindingPhase::Deleting);
        st.phase_message = Some(msg);
        status::write(&api, &obj, st, &ctx).await?;
        return Ok(Action::requeue(ctx.opts.requeue));
    }
    if add_finalizer(&api, &obj).await? {
        return Ok(Action::await_change());
    }
    let credentials = super::credential::ensure(&ctx, &obj).await?;

    let mut st = BindingStatus {
        conditions: prev.conditions.clone(),
        used_by,
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
                obj.spec.domain_name()
            ),
        ),
    );
    let tenant = obj.spec.domain_name().to_owned();
    let backend = resolve_backend(&ctx, obj.spec.pool_name()).await?;
    let admin = backend
        .as_ref()
        .and_then(|b| super::pool::endpoint_of(b, kvcache_api::backend::EndpointName::Admin));
    let read = match &admin {
        Some(a) => match Leader::connect(a, ctx.opts.leader_timeout, ctx.runtime.control_token()).await {
            Ok(l) => l.tenants().await.map_err(|e| e.0),
            Err(e) => Err(e.0),
        },
        None => Err(format!(
            "the pool {:?} has no backend that publishes an endpoint yet",
            obj.spec.pool_name()
        )),
    };
    let view = match &read {
        Err(_) => LedgerView::Unknown,
        Ok(t) if !t.multi_tenancy => LedgerView::Unenforced,
        Ok(t) => LedgerView::Tenant(t.tenants.iter().find(|x| x.name == tenant)),
    };
    let rotating = super::credential::rotating(&credentials);
    let credential_hash = kvcache_store::auth::sha256(credentials.current.as_bytes());
    // The rotation moved on and is kept: say so now, whatever the rest of this pass meets (a
    // status write that fails would otherwise lose the event, as the next pass sees no move).
    if let Some(m) = super::credential::advance(&ctx, &obj, credentials, view).await? {
        super::events::record(&ctx, &obj, false, "CredentialRotated", &m).await;
    }
    match read {
        Err(e) => {
            // figures kept from the last pass
            st.requested_quota = prev.requested_quota.clone();
            st.effective_quota = prev.effective_quota.clone();
            st.usage = prev.usage.clone();
            st.over_quota = prev.over_quota;
            set(
                &mut st,
                Observation::new(
                    quota_observed::TYPE,
                    ConditionStatus::False,
                    quota_observed::MASTER_NOT_SCRAPED,
                    e,
                ),
            );
        }
        Ok(t) if !t.multi_tenancy => {
            set(
                &mut st,
                Observation::new(
                    quota_observed::TYPE,
                    ConditionStatus::True,
                    quota_observed::NO_TENANT_LEDGER,
                    "the leader keeps no tenant ledger (multi-tenancy is off)",
                ),
            );
            set(
                &mut st,
                Observation::new(
                    quota_granted::TYPE,
                    ConditionStatus::True,
                    quota_granted::UNENFORCED,
                    "no per-domain quota is in force: writes land in the store's default tenant, bounded only by its capacity",
                ),
            );
            if let Some(d) = t.tenants.iter().find(|x| x.name == "default") {
                st.usage = Some(super::quantity(d.used));
                st.blocks = Some(i64::try_from(d.objects).unwrap_or(i64::MAX));
                st.hit_rate = hit_rate(d.hits, d.misses);
            }
        }
        Ok(t) => match t.tenants.iter().find(|x| x.name == tenant) {
            None => {
                set(
                    &mut st,
                    Observation::new(
                        quota_observed::TYPE,
                        ConditionStatus::True,
                        quota_observed::TENANT_NOT_IN_LEDGER,
                        format!("the leader's ledger has no tenant {tenant:?} yet; the pool writes it"),
                    ),
                );
                set(
                    &mut st,
                    Observation::new(
                        quota_granted::TYPE,
                        ConditionStatus::False,
                        quota_granted::NO_LEDGER_ENTRY,
                        format!("the leader would refuse writes of tenant {tenant:?} until the pool registers it"),
                    ),
                );
            }
            Some(x) if !x.credential_sha256.iter().any(|h| h.as_ref() == credential_hash) => {
                set(
                    &mut st,
                    Observation::new(
                        quota_observed::TYPE,
                        ConditionStatus::True,
                        quota_observed::OBSERVED,
                        format!("read from the leader's ledger: the tenant {tenant:?}"),
                    ),
                );
                set(
                    &mut st,
                    Observation::new(
                        quota_granted::TYPE,
                        ConditionStatus::False,
                        quota_granted::NO_LEDGER_ENTRY,
                        format!(
                            "the leader's ledger does not bind the tenant {tenant:?} to this Binding's credential yet; the pool writes it"
                        ),
                    ),
                );
            }
            Some(x) => {
                st.requested_quota = Some(super::quantity(x.ceiling));
                st.effective_quota = Some(super::quantity(x.grant));
                st.usage = Some(super::quantity(x.used));
                st.over_quota = Some(x.over_grant);
                st.blocks = Some(i64::try_from(x.objects).unwrap_or(i64::MAX));
                st.hit_rate = hit_rate(x.hits, x.misses);
                set(
                    &mut st,
                    Observation::new(
                        quota_observed::TYPE,
                        ConditionStatus::True,
                        quota_observed::OBSERVED,
                        format!(
                            "read from the leader's ledger: the tenant {tenant:?}, its grant and its usage (reserved writes included)"
                        ),
                    ),
                );
                set(
                    &mut st,
                    if x.grant > 0 {
                        Observation::new(
                            quota_granted::TYPE,
                            ConditionStatus::True,
                            quota_granted::GRANTED,
                            format!(
                                "granted {} of the {} asked for",
                                super::human(x.grant),
                                super::human(x.ceiling)
                            ),
                        )
                    } else {
                        Observation::new(
                            quota_granted::TYPE,
                            ConditionStatus::False,
                            quota_granted::ZERO_GRANTED,
                            "the leader grants nothing: see the pool's CapacityAllocatable (nothing mounted) or its oversubscription",
                        )
                    },
                );
            }
        },
    }
    let (phase, message) = phase(&st);
    st.phase = Some(phase);
    st.phase_message = message;
    let grant_changed =
        prev.effective_quota.is_some() && st.effective_quota.is_some() && prev.effective_quota != st.effective_quota;
    let grant = format!(
        "the leader now grants {} (was {})",
        st.effective_quota.as_ref().map(Quantity::as_str).unwrap_or_default(),
        prev.effective_quota.as_ref().map(Quantity::as_str).unwrap_or_default()
    );
    if status::write(&api, &obj, st, &ctx).await? && grant_changed {
        super::events::record(&ctx, &obj, false, "GrantChanged", &grant).await;
    }
    if rotating {
        // a rotation waits on the ledger and on the replicas' rollout: look again soon
        return Ok(Action::requeue(ctx.opts.requeue.min(std::time::Duration::from_secs(1))));
    }
    Ok(Action::requeue(ctx.opts.requeue))
}

async fn resolve_backend(ctx: &Context, pool: &str) -> Result<Option<KVCacheBackend>> {
    if pool.is_empty() {
        return Ok(None);
    }
    let Some(pool) = Api::<KVCachePool>::all(ctx.client.clone()).get_opt(pool).await? else {
        return Ok(None);
    };
    let Some(backend) = pool.spec.backend() else {
        return Ok(None);
    };
    Ok(Api::<KVCacheBackend>::all(ctx.client.clone()).get_opt(backend).await?)
}

/// §2.7: the first axis that is not True is an Error, a missing one Provisioning, else Ready.
fn phase(st: &BindingStatus) -> (BindingPhase, Option<String>) {
    let axes = [domain_exclusive::TYPE, quota_observed::TYPE, quota_granted::TYPE];
    match status::axes(&st.conditions, &axes, |_| false) {
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
