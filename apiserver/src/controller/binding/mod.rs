//! The Binding controller: reads the Binding's tenant back
//! from the leader (`requestedQuota`, `effectiveQuota` — the grant, never computed here, with what
//! cut it — `usage`, `overQuota`, blocks and hit rate), lists the workloads that hold it
//! (`usedBy`), reports DomainExclusive, QuotaObserved and QuotaGranted, keeps its credential
//! (minted, rotated, retired: [`super::credential`]), and holds its deletion while a
//! ModelDeployment uses it (Releasable False, HeldByWorkloads).
//!
//! A pass observes ([`observe`]), decides ([`decide`], pure and table-tested) and writes (the
//! rotation's next step, the status, the events and the finalizer).

mod decide;

use std::sync::Arc;

use futures::StreamExt as _;

use kube::Api;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{self, ObjectRef};
use kvcache_api::backend::EndpointName;
use kvcache_api::common::UsedBy;
use kvcache_api::{KVCachePool, KVCachePoolBinding, ModelDeployment};

use super::credential::LedgerView;
use super::shared;
use super::status::{self, add_finalizer, remove_finalizer};
use super::{Context, KindLabel, Result};
use crate::runtime::credentials::TenantCredentials;
use decide::{Decision, Observed, decide};

const KIND: &str = "KVCachePoolBinding";

/// A deployment event wakes the Binding it attaches through.
pub fn for_deployment(md: ModelDeployment) -> Option<ObjectRef<KVCachePoolBinding>> {
    let name = md.spec.binding_name()?;
    Some(ObjectRef::new(name).within(md.namespace()))
}

/// A pool event wakes its Bindings.
pub fn for_pool(
    bindings: &reflector::Store<KVCachePoolBinding>,
    pool: &KVCachePool,
) -> Vec<ObjectRef<KVCachePoolBinding>> {
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
    let api: Api<KVCachePoolBinding> = Api::namespaced(ctx.client.clone(), obj.namespace());
    let live = obj.metadata.deletion_timestamp.is_none();
    if live && add_finalizer(&api, &obj).await? {
        return Ok(Action::await_change());
    }
    let used_by = used_by(&obj, &ctx).await?;
    let (seen, credentials) = if live {
        let credentials = match super::credential::ensure(&ctx, &obj).await {
            Ok(c) => c,
            Err(e @ super::Error::Credentials(_)) => {
                // where its credential cannot be kept (a namespace the runtime was not let into,
                // say), the Binding says why and what to do
                super::events::record(&ctx, &obj, true, "CredentialNotKept", &e.to_string()).await;
                return Err(e);
            }
            Err(e) => return Err(e),
        };
        (observe(&obj, &ctx, used_by, &credentials).await?, Some(credentials))
    } else {
        (
            // a deletion reads nothing else: it waits on the workloads alone
            Observed {
                used_by,
                credential_hash: [0; 32],
                rotating: false,
                leader: Err(String::new()),
            },
            None,
        )
    };
    let d = decide(&obj, &seen, &crate::registry::meta::now(), ctx.opts.requeue);
    if let Some(c) = credentials {
        // The rotation moved on and is kept: say so now, whatever the rest of this pass meets (a
        // status write that fails would otherwise lose the event, as the next pass sees no move).
        let tenant = obj.spec.domain_name();
        let view = match &seen.leader {
            Err(_) => LedgerView::Unknown,
            Ok(t) if !t.multi_tenancy => LedgerView::Unenforced,
            Ok(t) => LedgerView::Tenant(t.tenants.iter().find(|x| x.name == tenant)),
        };
        if let Some(m) = super::credential::advance(&ctx, &obj, c, view).await? {
            super::events::record(&ctx, &obj, false, "CredentialRotated", &m).await;
        }
    }
    write(&api, &obj, d, &ctx).await
}

/// The ModelDeployments of the Binding's namespace that attach through it, by name.
async fn used_by(obj: &KVCachePoolBinding, ctx: &Context) -> Result<Vec<UsedBy>> {
    let deployments: Api<ModelDeployment> = Api::namespaced(ctx.client.clone(), obj.namespace());
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
    Ok(used_by)
}

/// What a live Binding's decision reads: its credential and the leader's ledger.
async fn observe(
    obj: &KVCachePoolBinding,
    ctx: &Context,
    used_by: Vec<UsedBy>,
    credentials: &TenantCredentials,
) -> Result<Observed> {
    let (_, backend) = shared::pool_and_backend(&ctx.client, obj.spec.pool_name()).await?;
    let leader = match backend.as_ref().and_then(|b| shared::endpoint(b, EndpointName::Admin)) {
        Some(a) => ctx.ledger(backend.as_ref(), &a).await,
        None => Err(format!(
            "the pool {:?} has no backend that publishes an endpoint yet",
            obj.spec.pool_name()
        )),
    };
    Ok(Observed {
        used_by,
        credential_hash: kvcache_store::auth::sha256(credentials.current.as_bytes()),
        rotating: super::credential::rotating(credentials),
        leader,
    })
}

/// Applies the decision: the status and its event, then the release of a deleted Binding.
async fn write(api: &Api<KVCachePoolBinding>, obj: &KVCachePoolBinding, d: Decision, ctx: &Context) -> Result<Action> {
    if let Some(st) = d.status
        && status::write(api, obj, st, ctx).await?
        && let Some(m) = &d.grant_changed
    {
        super::events::record(ctx, obj, false, "GrantChanged", m).await;
    }
    if d.release {
        super::credential::forget(ctx, obj).await?;
        remove_finalizer(api, obj).await?;
    }
    Ok(d.next.into())
}

/// The Binding controller: a Binding's pass runs when it, a deployment naming it or its pool
/// changes, and when its backend's processes change (a new leader serves, a member remounted
/// after a failover), so a grant that was briefly zero while members handed their values over
/// does not show until the next requeue. `pools` is the pool controller's cache.
pub(super) async fn controller(ctx: Arc<Context>, pools: reflector::Store<KVCachePool>, stop: super::Shutdown) {
    let client = ctx.client.clone();
    let cfg = kube::runtime::watcher::Config::default;
    let bindings = kube::runtime::Controller::new(Api::<KVCachePoolBinding>::all(client.clone()), cfg());
    let on_backend = {
        let bindings = bindings.store();
        super::all_changes(&ctx).flat_map(move |c| {
            let refs: Vec<ObjectRef<KVCachePoolBinding>> = match c {
                crate::runtime::Changed::Store(backend) => {
                    let on: std::collections::HashSet<String> = pools
                        .state()
                        .iter()
                        .filter(|p| p.spec.backend() == Some(backend.as_str()))
                        .map(|p| p.name().to_owned())
                        .collect();
                    bindings
                        .state()
                        .iter()
                        .filter(|b| on.contains(b.spec.pool_name()))
                        .map(|b| ObjectRef::new(b.name()).within(b.namespace()))
                        .collect()
                }
                crate::runtime::Changed::Replicas(_) => Vec::new(),
            };
            futures::stream::iter(refs)
        })
    };
    let seen = bindings.store();
    bindings
        .reconcile_on(on_backend)
        .watches(Api::<ModelDeployment>::all(client.clone()), cfg(), for_deployment)
        .watches(Api::<KVCachePool>::all(client), cfg(), move |p| for_pool(&seen, &p))
        .graceful_shutdown_on(stop.signal())
        .run(reconcile, error_policy, ctx)
        .for_each(|_| async {})
        .await;
}
