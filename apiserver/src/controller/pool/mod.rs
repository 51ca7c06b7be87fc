//! The pool controller: renders the **whole** tenant ledger
//! of the pool's backend, from every Binding of every pool on it and each pool's total, and sets
//! it on the leader with `SetTenants` when it differs from what the leader holds (never a partial
//! ledger); the leader enforces each pool's total. It reports `clientEndpoint`, `usage`,
//! `domains[]`, `usedBy` and the conditions BackendResolved, QuotaLedgerAvailable,
//! QuotaPolicyWritable, QuotaWithinTotal and CapacityAllocatable, and holds its deletion while
//! Bindings reference it (Releasable False, HeldByBindings).
//!
//! A pass observes ([`observe`]: the lists, the credentials, the leader's ledger), decides
//! ([`decide`], pure and table-tested) and writes (the ledger, then the status and the finalizer).
//! When it sets the ledger, it reads it back and decides again, so the status it writes says what
//! the leader holds.

mod decide;
pub mod ledger_render;

use std::sync::Arc;

use futures::StreamExt as _;

use kube::Api;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{self, ObjectRef};
use kvcache_api::{KVCacheBackend, KVCachePool, KVCachePoolBinding};

use super::status::{self, add_finalizer, remove_finalizer};
use super::store_client::LeaderClient;
use super::{Context, KindLabel, Result};
use decide::{Decision, LeaderRead, Observed, decide, leader_to_read};
use ledger_render::Ledger;

const KIND: &str = "KVCachePool";

/// A Binding event wakes the pool it names.
pub fn for_binding(b: KVCachePoolBinding) -> Option<ObjectRef<KVCachePool>> {
    let name = b.spec.pool_name();
    (!name.is_empty()).then(|| ObjectRef::new(name))
}

/// A backend event wakes every pool on it.
pub fn for_backend(pools: &reflector::Store<KVCachePool>, b: &KVCacheBackend) -> Vec<ObjectRef<KVCachePool>> {
    pools
        .state()
        .iter()
        .filter(|p| p.spec.backend() == Some(b.name()))
        .map(|p| ObjectRef::new(p.name()))
        .collect()
}

pub fn error_policy(_: Arc<KVCachePool>, error: &super::Error, ctx: Arc<Context>) -> Action {
    super::retry(KIND, error, &ctx)
}

pub async fn reconcile(obj: Arc<KVCachePool>, ctx: Arc<Context>) -> Result<Action> {
    ctx.metrics.reconciles.get_or_create(&KindLabel { kind: KIND }).inc();
    let api: Api<KVCachePool> = Api::all(ctx.client.clone());
    if obj.metadata.deletion_timestamp.is_none() && add_finalizer(&api, &obj).await? {
        return Ok(Action::await_change());
    }
    // Read the Bindings and set the ledger under the backend's lock (see `Context::ledger_locks`).
    let lock = obj.spec.backend().map(|b| ctx.ledger_lock(b));
    let _guard = match &lock {
        Some(l) => Some(l.lock().await),
        None => None,
    };
    let (mut seen, leader) = observe(&obj, &ctx).await?;
    let now = crate::registry::meta::now();
    let mut d = decide(&obj, &seen, &now, ctx.opts.requeue);
    if let (Some(ledger), Some(leader)) = (d.set_ledger.take(), &leader) {
        seen.leader = set_ledger(leader, ledger, std::mem::take(&mut seen.leader)).await;
        d = decide(&obj, &seen, &now, ctx.opts.requeue);
    }
    write(&api, &obj, d, &ctx).await
}

/// Everything the decision reads, and the channel to the leader when it was read.
async fn observe(obj: &KVCachePool, ctx: &Context) -> Result<(Observed, Option<LeaderClient>)> {
    let bindings = Api::<KVCachePoolBinding>::all(ctx.client.clone())
        .list(&Default::default())
        .await?
        .items;
    let pools = Api::<KVCachePool>::all(ctx.client.clone())
        .list(&Default::default())
        .await?
        .items;
    let keys: Vec<_> = bindings.iter().map(super::credential::key).collect();
    let credentials = ctx.secrets.credentials().of(&keys).await?;
    let backend = match obj.spec.backend() {
        Some(b) => Api::<KVCacheBackend>::all(ctx.client.clone()).get_opt(b).await?,
        None => None,
    };
    let (leader, read) = match leader_to_read(obj, backend.as_ref(), &bindings) {
        None => (None, LeaderRead::NotAsked),
        Some(admin) => match ctx.leader(backend.as_ref(), &admin).await {
            Err(e) => (None, LeaderRead::Unreachable(e.0)),
            Ok(l) => {
                let read = match l.tenants().await {
                    Ok(current) => LeaderRead::Ledger { current, refused: None },
                    Err(e) => LeaderRead::Unreachable(e.0),
                };
                (Some(l), read)
            }
        },
    };
    let seen = Observed {
        pools,
        bindings,
        credentials,
        backend,
        leader: read,
    };
    Ok((seen, leader))
}

/// Sets the whole ledger and reads it back; a refusal leaves the ledger read `before`.
async fn set_ledger(leader: &LeaderClient, ledger: Ledger, before: LeaderRead) -> LeaderRead {
    let (tenants, pools) = (ledger.tenants.len(), ledger.pools.len());
    let written = async {
        let dropped = leader.set_tenants(ledger.tenants, ledger.pools).await?;
        tracing::info!(tenants, pools, dropped, "tenant ledger set");
        leader.tenants().await
    };
    match (written.await, before) {
        (Ok(current), _) => LeaderRead::Ledger { current, refused: None },
        (Err(e), LeaderRead::Ledger { current, .. }) if e.is_refusal() => LeaderRead::Ledger {
            current,
            refused: Some(e.0),
        },
        (Err(e), _) => LeaderRead::Unreachable(e.0),
    }
}

/// Applies the decision: the status, then the finalizer's removal once the release is done.
async fn write(api: &Api<KVCachePool>, obj: &KVCachePool, d: Decision, ctx: &Context) -> Result<Action> {
    if let Some(st) = d.status {
        status::write(api, obj, st, ctx).await?;
    }
    if d.release {
        remove_finalizer(api, obj).await?;
    }
    Ok(d.next.into())
}

/// The pool controller (made by `controller::run`, which shares its cache): a pool's pass runs
/// when it, a Binding on it or its backend changes, when its backend's processes change (the
/// ledger is written again at once, not after the backend's status moved), and, for every pool,
/// when a Binding's credentials change (a handful of pools, each one list and one leader read).
pub(super) async fn controller(
    pools: kube::runtime::Controller<KVCachePool>,
    ctx: Arc<Context>,
    stop: super::Shutdown,
) {
    let client = ctx.client.clone();
    let cfg = kube::runtime::watcher::Config::default;
    let on_backend = {
        let pools = pools.store();
        super::all_changes(&ctx).flat_map(move |c| {
            let refs: Vec<ObjectRef<KVCachePool>> = match c {
                crate::runtime::Changed::Store(backend) => pools
                    .state()
                    .iter()
                    .filter(|p| p.spec.backend() == Some(backend.as_str()))
                    .map(|p| ObjectRef::new(p.name()))
                    .collect(),
                crate::runtime::Changed::Replicas(_) => Vec::new(),
            };
            futures::stream::iter(refs)
        })
    };
    let on_credentials = {
        let pools = pools.store();
        super::credential_changes(&ctx).flat_map(move |_| {
            let refs: Vec<ObjectRef<KVCachePool>> = pools.state().iter().map(|p| ObjectRef::new(p.name())).collect();
            futures::stream::iter(refs)
        })
    };
    let seen = pools.store();
    pools
        .reconcile_on(on_backend)
        .reconcile_on(on_credentials)
        .watches(Api::<KVCachePoolBinding>::all(client.clone()), cfg(), for_binding)
        .watches(Api::<KVCacheBackend>::all(client), cfg(), move |b| {
            for_backend(&seen, &b)
        })
        .graceful_shutdown_on(stop.signal())
        .run(reconcile, error_policy, ctx)
        .for_each(|_| async {})
        .await;
}
