//! The backend controller: runs a managed backend's leader and one member per matching node per
//! group through the runtime, and reports what the leader says (`backend.md` §3, with our store's
//! Control API in place of the reference's HTTP admin port): endpoints, capacity, members, the
//! conditions LeaderAvailable, CapacityObserved, MembersMounted, PoolWrites and Deletable, and
//! the phase by the precedence of §3.1. Deletion waits while a pool names the backend.

use std::sync::Arc;

use kube::Api;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kvcache_api::backend::{BackendStatus, Capacity, Endpoint, EndpointName};
use kvcache_api::common::UsedBy;
use kvcache_api::conditions::backend::{capacity_observed, deletable, leader_available, members_mounted, pool_writes};
use kvcache_api::conditions::{self, BackendPhase, ConditionStatus, Observation};
use kvcache_api::{KVCacheBackend, KVCachePool};

use super::leader::{Leader, LeaderView};
use super::status::{self, add_finalizer, has_finalizer, remove_finalizer};
use super::{Context, KindLabel, Result};
use crate::runtime::{StoreObservation, StorePlan};
use members::{member_rows, members_verdict};

mod election;
mod members;
mod plan;
pub use election::HANDOVER;
pub use plan::plan;

const KIND: &str = "KVCacheBackend";

/// A pool event wakes the backend it names.
pub fn for_pool(pool: KVCachePool) -> Option<ObjectRef<KVCacheBackend>> {
    pool.spec.backend().map(ObjectRef::new)
}

pub fn error_policy(_: Arc<KVCacheBackend>, error: &super::Error, ctx: Arc<Context>) -> Action {
    super::retry(KIND, error, &ctx)
}

pub async fn reconcile(obj: Arc<KVCacheBackend>, ctx: Arc<Context>) -> Result<Action> {
    ctx.metrics.reconciles.get_or_create(&KindLabel { kind: KIND }).inc();
    let api: Api<KVCacheBackend> = Api::all(ctx.client.clone());
    let pools: Api<KVCachePool> = Api::all(ctx.client.clone());
    let name = obj.name().to_owned();
    let consumers: Vec<UsedBy> = pools
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter(|p| p.spec.backend() == Some(name.as_str()))
        .map(|p| UsedBy {
            kind: "KVCachePool".into(),
            namespace: String::new(),
            name: p.name().to_owned(),
        })
        .collect();
    let deleting = obj.metadata.deletion_timestamp.is_some();
    if deleting && !has_finalizer(&obj) {
        return Ok(Action::await_change());
    }
    if deleting && consumers.is_empty() {
        // Nothing holds it: stop its processes, delete its election Lease, then let it go.
        if ctx.runtime.remove_store(&name).await {
            election::delete_lease(&ctx, &name).await?;
            remove_finalizer(&api, &obj).await?;
            return Ok(Action::await_change());
        }
        return Ok(Action::requeue(std::time::Duration::from_secs(2)));
    }
    if !deleting && add_finalizer(&api, &obj).await? {
        return Ok(Action::await_change());
    }
    let mut st = observe(&obj, &ctx).await;
    st.used_by = consumers;
    let now = crate::registry::meta::now();
    let generation = obj.metadata.generation;
    let held = deletable_observation(&st.used_by).generation(generation);
    let held_message = held.message.clone();
    conditions::set(&mut st.conditions, held, &now);
    if deleting {
        st.phase = Some(BackendPhase::Deleting);
        st.phase_message = Some(held_message);
    }
    status::write(&api, &obj, st, &ctx).await?;
    Ok(Action::requeue(ctx.opts.requeue))
}

fn deletable_observation(used_by: &[UsedBy]) -> Observation {
    if used_by.is_empty() {
        return Observation::new(
            deletable::TYPE,
            ConditionStatus::True,
            deletable::UNUSED,
            "no pool names this backend",
        );
    }
    Observation::new(
        deletable::TYPE,
        ConditionStatus::False,
        deletable::IN_USE,
        super::shared::held_by(used_by, "backend"),
    )
}

/// One observation pass: run the workloads (managed), read the leader, build the status, then
/// the leader replicas and the election.
async fn observe(obj: &KVCacheBackend, ctx: &Context) -> BackendStatus {
    let (mut st, observed) = read_leader(obj, ctx).await;
    if let Some((plan, _, obs)) = &observed {
        let generation = obj.metadata.generation;
        let now = crate::registry::meta::now();
        let mut set = |st: &mut BackendStatus, o: Observation| {
            conditions::set(&mut st.conditions, o.generation(generation), &now);
        };
        election::observe(&mut st, obj, plan, obs, ctx, &mut set).await;
    }
    st
}

type Observed = Option<(StorePlan, Vec<String>, StoreObservation)>;

/// Runs the workloads (managed) and reads the leader: endpoints, capacity, members, the
/// leader's conditions and the phase.
async fn read_leader(obj: &KVCacheBackend, ctx: &Context) -> (BackendStatus, Observed) {
    let prev = obj.status.clone().unwrap_or_default();
    let generation = obj.metadata.generation;
    let now = crate::registry::meta::now();
    let mut st = BackendStatus {
        conditions: prev.conditions.clone(),
        ..BackendStatus::default()
    };
    let mut set = |st: &mut BackendStatus, o: Observation| {
        conditions::set(&mut st.conditions, o.generation(generation), &now);
    };
    let nodes = ctx.runtime.nodes();
    let planned = plan(obj.name(), &obj.spec, &nodes);
    let mut observed: Option<(StorePlan, Vec<String>, StoreObservation)> = None;
    if let Some((mut plan, unmatched)) = planned {
        plan.uid = obj.metadata.uid.clone().unwrap_or_default();
        plan.existing_only = obj.metadata.deletion_timestamp.is_some();
        let obs = ctx.runtime.ensure_store(&plan).await;
        if let Some(addr) = &obs.client_endpoint {
            st.endpoints = vec![
                Endpoint {
                    name: Some(EndpointName::Client),
                    address: addr.clone(),
                },
                Endpoint {
                    name: Some(EndpointName::Admin),
                    address: addr.clone(),
                },
            ];
        }
        observed = Some((plan, unmatched, obs));
    } else if let Some(ext) = obj.spec.external() {
        st.endpoints = ext.endpoints.clone();
    }
    let admin = st
        .endpoints
        .iter()
        .find(|e| e.name == Some(EndpointName::Admin))
        .map(|e| e.address.clone());
    let Some(admin) = admin else {
        let msg = "no Admin endpoint is published yet";
        fail_leader(
            &mut st,
            &mut set,
            leader_available::NO_ADMIN_ENDPOINT.as_str(),
            msg,
            &prev,
        );
        st.phase = Some(BackendPhase::Error);
        st.phase_message = Some(msg.into());
        return (st, observed);
    };
    let read = async {
        Leader::connect(&admin, ctx.opts.leader_timeout, ctx.runtime.control_token())
            .await?
            .observe()
            .await
    };
    let view = match read.await {
        Ok(v) if v.health.serving => v,
        Ok(v) => {
            let msg = format!(
                "the leader at {admin} answers but does not serve (role {:?}); it is starting or a standby",
                v.health.role
            );
            fail_leader(
                &mut st,
                &mut set,
                leader_available::SERVICE_PLANE_NOT_ACTIVE.as_str(),
                &msg,
                &prev,
            );
            st.phase = Some(BackendPhase::Provisioning);
            st.phase_message = Some(msg);
            return (st, observed);
        }
        Err(e) => {
            let (reason, msg) = match &observed {
                Some((_, _, obs)) => leader_fault(obs, &e.0),
                None => (leader_available::LEADER_UNREACHABLE.as_str().to_owned(), e.0.clone()),
            };
            fail_leader(&mut st, &mut set, &reason, &msg, &prev);
            let starting = reason == leader_available::LEADER_STARTING.as_str();
            st.phase = Some(if starting {
                BackendPhase::Provisioning
            } else {
                BackendPhase::Error
            });
            st.phase_message = Some(msg);
            return (st, observed);
        }
    };
    // A leader keeps nothing across restarts: say since when it serves, so a cold cache is
    // explained (a restart of the leader or of this server moves the time, and records an event).
    let since = observed
        .as_ref()
        .and_then(|(_, _, obs)| obs.leader().ready_since)
        .and_then(|t| k8s_openapi::jiff::Timestamp::try_from(t).ok())
        .map(|t| {
            format!(
                " since {}, when its cache started empty",
                t.strftime("%Y-%m-%dT%H:%M:%SZ")
            )
        })
        .unwrap_or_default();
    set(
        &mut st,
        Observation::new(
            leader_available::TYPE,
            ConditionStatus::True,
            leader_available::SERVING,
            format!("the leader at {admin} serves (role {}){since}", view.health.role),
        ),
    );
    st.capacity = Some(Capacity {
        total: Some(super::quantity(view.health.capacity)),
        used: Some(super::quantity(view.health.used)),
    });
    set(
        &mut st,
        Observation::new(
            capacity_observed::TYPE,
            ConditionStatus::True,
            capacity_observed::OBSERVED,
            format!(
                "the leader reports {} of capacity, {} used",
                super::human(view.health.capacity),
                super::human(view.health.used)
            ),
        ),
    );
    st.members = member_rows(obj, &view, observed.as_ref().map(|(p, _, _)| p));
    set(&mut st, members_verdict(&view, observed.as_ref()));
    set(&mut st, writes_verdict(&view));
    let mounted = conditions::find(&st.conditions, members_mounted::TYPE)
        .filter(|c| c.status == ConditionStatus::False.as_str())
        .map(|c| c.message.clone());
    match mounted {
        Some(why) => {
            st.phase = Some(BackendPhase::Degraded);
            st.phase_message = Some(why);
        }
        None => {
            st.phase = Some(BackendPhase::Ready);
            st.phase_message = None;
        }
    }
    (st, observed)
}

/// The leader cannot be read: LeaderAvailable, CapacityObserved and MembersMounted are False for
/// the same reason, PoolWrites is Unknown, and the member list is kept.
fn fail_leader(
    st: &mut BackendStatus,
    set: &mut impl FnMut(&mut BackendStatus, Observation),
    reason: &str,
    message: &str,
    prev: &BackendStatus,
) {
    for t in [leader_available::TYPE, capacity_observed::TYPE, members_mounted::TYPE] {
        set(st, Observation::new(t, ConditionStatus::False, reason, message));
    }
    set(
        st,
        Observation::new(
            pool_writes::TYPE,
            ConditionStatus::Unknown,
            pool_writes::READ_FAILED,
            "the leader could not be read",
        ),
    );
    st.members = prev.members.clone();
}

/// Why a managed leader that could not be read is not serving, from what the runtime saw.
fn leader_fault(obs: &StoreObservation, error: &str) -> (String, String) {
    let l = &obs.leader();
    if let Some(why) = &l.refused {
        return (leader_available::LEADER_UNSCHEDULABLE.as_str().into(), why.clone());
    }
    if let Some((reason, message)) = l.waiting.as_ref().filter(|(r, _)| r != "CrashLoopBackOff") {
        // The kubelet's own word for why the container does not run (ImagePullBackOff, ...).
        return (reason.clone(), message.clone());
    }
    if !l.ready
        && let Some(exit) = &l.last_exit
    {
        return (
            leader_available::LEADER_CRASH_LOOPING.as_str().into(),
            format!(
                "the leader process ended ({}) and was restarted {} times",
                exit.describe(),
                l.restarts
            ),
        );
    }
    if l.running && l.ready {
        return (leader_available::LEADER_UNREACHABLE.as_str().into(), error.to_owned());
    }
    (
        leader_available::LEADER_STARTING.as_str().into(),
        "the leader process is starting".into(),
    )
}

fn writes_verdict(view: &LeaderView) -> Observation {
    let h = &view.health;
    if h.objects > 0 {
        return Observation::new(
            pool_writes::TYPE,
            ConditionStatus::True,
            pool_writes::WRITE_OBSERVED,
            format!("the store holds {} objects", h.objects),
        );
    }
    if h.used > 0 {
        return Observation::new(
            pool_writes::TYPE,
            ConditionStatus::True,
            pool_writes::ALLOCATION_OBSERVED,
            "space is allocated in the store",
        );
    }
    Observation::new(
        pool_writes::TYPE,
        ConditionStatus::Unknown,
        pool_writes::NO_WRITES_OBSERVED,
        "no write has been observed since the leader started",
    )
}
