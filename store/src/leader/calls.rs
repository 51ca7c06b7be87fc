//! The `Store` calls, one function each, written once for both faces: the gRPC service
//! (`grpc.rs`) and the framed fast port (`fastport.rs`) decode a request, call the function
//! here, and encode what it returns. Each takes the leader's lock once and allocates nothing
//! beyond its reply. A removal's answer waits, outside the lock, until the members applied what
//! they were told ([`Durable`]): a value a client removed does not come back after a failover.
//! A get of a value only on a member's disk tier waits, outside the lock, for the member to load
//! it ([`Step::Wait`]), then looks again.

use std::time::{Duration, Instant};

use super::Leader;
use super::notices::Applied;
use super::state::State;
use crate::error::{ErrorCode, Result, StoreError};
use crate::proto::*;

pub fn put_start(leader: &Leader, r: PutStartRequest, now: Instant) -> Result<PutStartResponse> {
    leader.serving(|s| s.put_start(r.scope.as_ref(), &r.key, r.size, now))
}

pub fn put_commit(leader: &Leader, r: PutCommitRequest) -> Result<PutCommitResponse> {
    leader.serving(|s| s.put_commit(r.scope.as_ref(), &r.key, r.put_id))?;
    Ok(PutCommitResponse {})
}

pub fn put_revoke(leader: &Leader, r: PutRevokeRequest) -> Result<PutRevokeResponse> {
    leader.serving(|s| s.put_revoke(r.scope.as_ref(), &r.key, r.put_id))?;
    Ok(PutRevokeResponse {})
}

/// A get's or batch get's answer, or the loads from members' disk tiers it waits for first
/// (`tiered.rs`); then it is asked again ([`get_loaded`], [`batch_get_loaded`]).
#[derive(Debug)]
pub enum Step<T> {
    Done(T),
    Wait(Loads),
}

/// Values on their way from members' disk tiers into memory.
#[derive(Debug)]
pub struct Loads {
    applied: Vec<Applied>,
    /// when the call that waits for them was taken up
    asked: Instant,
}

/// A call's wait for loads, over: when the call was taken up, from which the read leases then
/// granted are told ([`lengthen`]).
#[derive(Debug, Clone, Copy)]
pub struct Loaded {
    asked: Instant,
}

impl Loads {
    /// Resolves once every member applied its loads, at most a few heartbeat intervals (a value
    /// still not in memory then is a miss).
    pub async fn wait(self, leader: &Leader) -> Loaded {
        let within = leader.with(|s| s.cfg.heartbeat_interval()) * 4 + Duration::from_millis(100);
        let all = futures::future::join_all(self.applied.into_iter().map(Applied::wait));
        if tokio::time::timeout(within, all).await.is_err() {
            tracing::warn!("a member did not load a value from its disk tier within {within:?}; answered a miss");
        }
        Loaded { asked: self.asked }
    }
}

/// A read lease granted once a call waited for loads, told as longer by that wait. A client
/// counts a lease from before it sent the call (`client::check_lease`), so without this a load
/// that took longer than the lease made every such get fail as `LEASE_EXPIRED` however fresh
/// its lease was. Safe: the call was sent before it was taken up, so the client's count still
/// ends no later than the lease.
fn lengthen(answer: &mut GetResponse, loaded: Loaded) {
    if answer.found {
        answer.lease_ttl_ms += loaded.asked.elapsed().as_millis() as u64;
    }
}

pub fn get(leader: &Leader, r: &GetRequest, now: Instant) -> Result<Step<GetResponse>> {
    leader.serving(|s| {
        let loads = s.start_loads(r.scope.as_ref(), std::slice::from_ref(&r.key), now)?;
        if loads.is_empty() {
            s.get(r.scope.as_ref(), &r.key, now).map(Step::Done)
        } else {
            Ok(Step::Wait(Loads {
                applied: loads,
                asked: now,
            }))
        }
    })
}

/// A get's second look, once its loads were applied.
pub fn get_loaded(leader: &Leader, r: &GetRequest, loaded: Loaded) -> Result<GetResponse> {
    let mut answer = leader.serving(|s| s.get(r.scope.as_ref(), &r.key, Instant::now()))?;
    lengthen(&mut answer, loaded);
    Ok(answer)
}

/// [`get`] and, after its loads, [`get_loaded`].
pub async fn get_waiting(leader: &Leader, r: GetRequest, now: Instant) -> Result<GetResponse> {
    match get(leader, &r, now)? {
        Step::Done(g) => Ok(g),
        Step::Wait(loads) => {
            let loaded = loads.wait(leader).await;
            get_loaded(leader, &r, loaded)
        }
    }
}

pub fn exists(leader: &Leader, r: ExistsRequest, now: Instant) -> Result<ExistsResponse> {
    let exists = leader.serving(|s| s.exists(r.scope.as_ref(), &r.key, now))?;
    Ok(ExistsResponse { exists })
}

/// What a call's answer waits for: every member's having applied the notices queued for it when
/// the call was done (`notices.rs`), at most a few heartbeat intervals (a member that does not
/// answer that long is unmounted, and its values with it).
#[derive(Debug, Default)]
pub struct Durable(Vec<Applied>);

impl Durable {
    fn now(leader: &Leader) -> Durable {
        Durable(leader.with(State::applied))
    }

    pub async fn wait(self, leader: &Leader) {
        if self.0.is_empty() {
            return;
        }
        let within = leader.with(|s| s.cfg.heartbeat_interval()) * 4 + Duration::from_millis(100);
        let all = futures::future::join_all(self.0.into_iter().map(Applied::wait));
        if tokio::time::timeout(within, all).await.is_err() {
            tracing::warn!("a member did not take a removal within {within:?}; it may come back at a failover");
        }
    }
}

pub fn remove(leader: &Leader, r: RemoveRequest, now: Instant) -> Result<(RemoveResponse, Durable)> {
    let removed = leader.serving(|s| s.remove(r.scope.as_ref(), &r.key, now))?;
    let durable = if removed {
        Durable::now(leader)
    } else {
        Durable::default()
    };
    Ok((RemoveResponse { removed }, durable))
}

fn same_len(a: usize, b: usize, what: &str) -> Result<()> {
    if a == b {
        return Ok(());
    }
    Err(StoreError::new(
        ErrorCode::InvalidArgument,
        format!("{a} keys but {b} {what}; send one per key"),
    ))
}

pub fn batch_exists(leader: &Leader, r: BatchExistsRequest, now: Instant) -> Result<BatchExistsResponse> {
    let exists = leader.serving(|s| {
        r.keys
            .iter()
            .map(|k| s.exists(r.scope.as_ref(), k, now))
            .collect::<Result<Vec<_>>>()
    })?;
    Ok(BatchExistsResponse { exists })
}

pub fn batch_get(leader: &Leader, r: &BatchGetRequest, now: Instant) -> Result<Step<BatchGetResponse>> {
    leader.serving(|s| {
        let loads = s.start_loads(r.scope.as_ref(), &r.keys, now)?;
        if loads.is_empty() {
            batch_look(s, r, now).map(Step::Done)
        } else {
            Ok(Step::Wait(Loads {
                applied: loads,
                asked: now,
            }))
        }
    })
}

/// A batch get's second look, once its loads were applied.
pub fn batch_get_loaded(leader: &Leader, r: &BatchGetRequest, loaded: Loaded) -> Result<BatchGetResponse> {
    let mut answer = leader.serving(|s| batch_look(s, r, Instant::now()))?;
    for a in &mut answer.results {
        lengthen(a, loaded);
    }
    Ok(answer)
}

/// [`batch_get`] and, after its loads, [`batch_get_loaded`].
pub async fn batch_get_waiting(leader: &Leader, r: BatchGetRequest, now: Instant) -> Result<BatchGetResponse> {
    match batch_get(leader, &r, now)? {
        Step::Done(g) => Ok(g),
        Step::Wait(loads) => {
            let loaded = loads.wait(leader).await;
            batch_get_loaded(leader, &r, loaded)
        }
    }
}

fn batch_look(s: &mut State, r: &BatchGetRequest, now: Instant) -> Result<BatchGetResponse> {
    let results = r
        .keys
        .iter()
        .map(|k| s.get(r.scope.as_ref(), k, now))
        .collect::<Result<Vec<_>>>()?;
    Ok(BatchGetResponse { results })
}

/// Key by key; a bad scope or lists of different lengths refuse the whole batch first.
pub fn batch_put_start(leader: &Leader, r: BatchPutStartRequest, now: Instant) -> Result<BatchPutStartResponse> {
    same_len(r.keys.len(), r.sizes.len(), "sizes")?;
    let results = leader.serving(|s| -> Result<Vec<_>> {
        s.tenant_name(r.scope.as_ref())?;
        let each = r.keys.iter().zip(&r.sizes);
        Ok(each
            .map(|(k, size)| match s.put_start(r.scope.as_ref(), k, *size, now) {
                Ok(reserved) => PutStartResult {
                    reserved: Some(reserved),
                    error: String::new(),
                },
                Err(e) => PutStartResult {
                    reserved: None,
                    error: e.to_string(),
                },
            })
            .collect())
    })?;
    Ok(BatchPutStartResponse { results })
}

/// Key by key; a bad scope or lists of different lengths refuse the whole batch first.
pub fn batch_put_commit(leader: &Leader, r: BatchPutCommitRequest) -> Result<BatchPutCommitResponse> {
    same_len(r.keys.len(), r.put_ids.len(), "put_ids")?;
    let errors = leader.serving(|s| -> Result<Vec<_>> {
        s.tenant_name(r.scope.as_ref())?;
        let each = r.keys.iter().zip(&r.put_ids);
        Ok(each
            .map(|(k, id)| {
                s.put_commit(r.scope.as_ref(), k, *id)
                    .err()
                    .map(|e| e.to_string())
                    .unwrap_or_default()
            })
            .collect())
    })?;
    Ok(BatchPutCommitResponse { errors })
}

/// Key by key: a leased key is kept (with its refusal) while the others are removed; a bad scope
/// refuses the whole batch before anything is removed.
pub fn batch_remove(leader: &Leader, r: BatchRemoveRequest, now: Instant) -> Result<(BatchRemoveResponse, Durable)> {
    let (removed, errors) = leader.serving(|s| -> Result<(Vec<_>, Vec<_>)> {
        s.tenant_name(r.scope.as_ref())?;
        Ok(r.keys
            .iter()
            .map(|k| match s.remove(r.scope.as_ref(), k, now) {
                Ok(removed) => (removed, String::new()),
                Err(e) => (false, e.to_string()),
            })
            .unzip())
    })?;
    let durable = if removed.iter().any(|r| *r) {
        Durable::now(leader)
    } else {
        Durable::default()
    };
    Ok((BatchRemoveResponse { removed, errors }, durable))
}
