//! Batch puts and gets: one leader round trip reserves (or locates) every key, the bytes of the
//! keys move [`MAX_TRANSFERS`] at a time (each on its own pooled data connection, straight from
//! and into the caller's memory), and one more round trip commits the puts. Answers come key by key, in
//! order; only a refusal of the whole batch (a bad scope, the leader unreachable) is an `Err`.

use std::time::Instant;

use futures::StreamExt;

use super::{Client, PutOutcome, status};
use crate::error::{ErrorCode, Result, StoreError};
use crate::leader::fastport::Method;
use crate::proto::*;

/// Values of one batch moving at once, each on a data connection of its own: well under what a
/// member accepts from one host (`net::MAX_PER_SOURCE`, 512), which a batch of thousands of
/// small values used to pass, its connections beyond refused.
pub const MAX_TRANSFERS: usize = 64;

/// A per-key refusal the leader sent as "CODE: message".
fn refused(text: &str) -> StoreError {
    crate::wire::refusal(text.as_bytes())
}

impl Client {
    async fn batch_put_start(&self, req: BatchPutStartRequest) -> Result<BatchPutStartResponse> {
        match &self.fast {
            Some(f) => f.call(Method::BatchPutStart, &req, self.spin).await,
            None => Ok(self
                .store
                .clone()
                .batch_put_start(req)
                .await
                .map_err(status)?
                .into_inner()),
        }
    }

    async fn batch_put_commit(&self, req: BatchPutCommitRequest) -> Result<BatchPutCommitResponse> {
        match &self.fast {
            Some(f) => f.call(Method::BatchPutCommit, &req, self.spin).await,
            None => Ok(self
                .store
                .clone()
                .batch_put_commit(req)
                .await
                .map_err(status)?
                .into_inner()),
        }
    }

    async fn batch_locate(&self, req: BatchGetRequest) -> Result<BatchGetResponse> {
        match &self.fast {
            Some(f) => f.call(Method::BatchGet, &req, self.spin).await,
            None => Ok(self.store.clone().batch_get(req).await.map_err(status)?.into_inner()),
        }
    }

    /// Stores each `(key, value)`; per key what the put did, or why it was refused. A value
    /// whose write failed is revoked; the others are committed together.
    pub async fn batch_put(&self, items: &[(&str, &[u8])]) -> Result<Vec<Result<PutOutcome>>> {
        let one: Vec<[&[u8]; 1]> = items.iter().map(|(_, v)| [*v]).collect();
        let parts: Vec<(&str, &[&[u8]])> = items.iter().zip(&one).map(|((k, _), v)| (*k, &v[..])).collect();
        self.batch_put_parts(&parts).await
    }

    /// [`Client::batch_put`] of values each held as several slices, one after the other (the
    /// value is their concatenation): gathered straight from them, with no copy of ours first.
    pub async fn batch_put_parts(&self, items: &[(&str, &[&[u8]])]) -> Result<Vec<Result<PutOutcome>>> {
        let start = BatchPutStartRequest {
            scope: Some(self.scope.clone()),
            keys: items.iter().map(|(k, _)| k.to_string()).collect(),
            sizes: items
                .iter()
                .map(|(_, v)| v.iter().map(|p| p.len() as u64).sum())
                .collect(),
        };
        let started = self.batch_put_start(start).await?;
        if started.results.len() != items.len() {
            return Err(StoreError::new(
                ErrorCode::Internal,
                "the leader answered a batch with the wrong number of results",
            ));
        }
        let mut out: Vec<Result<PutOutcome>> = Vec::with_capacity(items.len());
        let mut writes = Vec::new();
        for (i, (r, (_, value))) in started.results.iter().zip(items).enumerate() {
            match &r.reserved {
                None => out.push(Err(refused(&r.error))),
                Some(p) if p.already_exists => out.push(Ok(PutOutcome::AlreadyExisted)),
                Some(p) => match &p.location {
                    Some(loc) => {
                        out.push(Ok(PutOutcome::Stored));
                        writes.push(async move { (i, self.write_parts(loc, p.write_deadline_unix_ms, value).await) });
                    }
                    None => out.push(Err(StoreError::new(ErrorCode::Internal, "the leader sent no location"))),
                },
            }
        }
        let written: Vec<_> = futures::stream::iter(writes)
            .buffer_unordered(MAX_TRANSFERS)
            .collect()
            .await;
        let mut commit = BatchPutCommitRequest {
            scope: Some(self.scope.clone()),
            keys: Vec::with_capacity(written.len()),
            put_ids: Vec::with_capacity(written.len()),
        };
        let mut committed = Vec::with_capacity(written.len());
        for (i, w) in written {
            let put_id = started.results[i].reserved.as_ref().map_or(0, |p| p.put_id);
            match w {
                Ok(()) => {
                    commit.keys.push(items[i].0.to_string());
                    commit.put_ids.push(put_id);
                    committed.push(i);
                }
                Err(e) => {
                    let revoke = PutRevokeRequest {
                        scope: Some(self.scope.clone()),
                        key: items[i].0.to_string(),
                        put_id,
                    };
                    if let Err(re) = self.put_revoke(revoke).await {
                        tracing::debug!(error = %re, "revoke after a failed write failed; the leader reclaims it later");
                    }
                    out[i] = Err(e);
                }
            }
        }
        if !committed.is_empty() {
            self.commit_batch(commit, committed, &mut out).await;
        }
        Ok(out)
    }

    /// Commits the written keys of a batch, the `committed` positions of `out`, and sets each
    /// one the leader refused (or all of them, when the commit itself failed).
    async fn commit_batch(&self, commit: BatchPutCommitRequest, committed: Vec<usize>, out: &mut [Result<PutOutcome>]) {
        match self.batch_put_commit(commit).await {
            Ok(r) => {
                for (i, e) in committed.into_iter().zip(r.errors) {
                    if !e.is_empty() {
                        out[i] = Err(refused(&e));
                    }
                }
            }
            Err(e) => {
                for i in committed {
                    out[i] = Err(e.clone());
                }
            }
        }
    }

    /// Reads each key's value into its buffer; per key the value's length, `None` for a miss, or
    /// why it could not be read (`VALUE_TOO_LARGE` when the buffer is smaller than the value,
    /// which is then not read).
    pub async fn batch_get_into(&self, items: &mut [(&str, &mut [u8])]) -> Result<Vec<Result<Option<usize>>>> {
        let began = Instant::now();
        let req = BatchGetRequest {
            scope: Some(self.scope.clone()),
            keys: items.iter().map(|(k, _)| k.to_string()).collect(),
        };
        let located = self.batch_locate(req).await?;
        if located.results.len() != items.len() {
            return Err(StoreError::new(
                ErrorCode::Internal,
                "the leader answered a batch with the wrong number of results",
            ));
        }
        let mut out: Vec<Result<Option<usize>>> = Vec::with_capacity(items.len());
        let mut reads = Vec::new();
        for (i, (r, (_, buf))) in located.results.iter().zip(items.iter_mut()).enumerate() {
            let Some(loc) = r.location.as_ref().filter(|_| r.found) else {
                out.push(Ok(None));
                continue;
            };
            let len = loc.len as usize;
            if len > buf.len() {
                out.push(Err(StoreError::new(
                    ErrorCode::ValueTooLarge,
                    format!(
                        "the value is {len} bytes and its buffer {}; give a larger one",
                        buf.len()
                    ),
                )));
                continue;
            }
            out.push(Ok(Some(len)));
            let sink = &mut buf[..len];
            reads.push(async move {
                let read = self
                    .read(loc, r.lease_deadline_unix_ms, super::data::Sink::Slice(sink))
                    .await;
                (i, read.and_then(|found| super::check_lease(began, r).map(|()| found)))
            });
        }
        settle(&mut out, reads).await;
        Ok(out)
    }

    /// [`Client::batch_get_into`] of values each scattered into several slices, one after the
    /// other, straight from the member: a value must be exactly as long as its slices together
    /// (otherwise `VALUE_TOO_LARGE`, or `INVALID_ARGUMENT` for a shorter one, and nothing is read).
    pub async fn batch_get_into_parts(
        &self,
        items: &mut [(&str, &mut [&mut [u8]])],
    ) -> Result<Vec<Result<Option<usize>>>> {
        let began = Instant::now();
        let req = BatchGetRequest {
            scope: Some(self.scope.clone()),
            keys: items.iter().map(|(k, _)| k.to_string()).collect(),
        };
        let located = self.batch_locate(req).await?;
        if located.results.len() != items.len() {
            return Err(StoreError::new(
                ErrorCode::Internal,
                "the leader answered a batch with the wrong number of results",
            ));
        }
        let mut out: Vec<Result<Option<usize>>> = Vec::with_capacity(items.len());
        let mut reads = Vec::new();
        for (i, (r, (_, parts))) in located.results.iter().zip(items.iter_mut()).enumerate() {
            let Some(loc) = r.location.as_ref().filter(|_| r.found) else {
                out.push(Ok(None));
                continue;
            };
            let (len, room) = (loc.len as usize, parts.iter().map(|p| p.len()).sum::<usize>());
            if len != room {
                let code = if len > room {
                    ErrorCode::ValueTooLarge
                } else {
                    ErrorCode::InvalidArgument
                };
                out.push(Err(StoreError::new(
                    code,
                    format!("the value is {len} bytes and its parts {room}; give parts of the value's length"),
                )));
                continue;
            }
            out.push(Ok(Some(len)));
            reads.push(async move {
                let read = self
                    .read(loc, r.lease_deadline_unix_ms, super::data::Sink::Parts(parts))
                    .await;
                (i, read.and_then(|found| super::check_lease(began, r).map(|()| found)))
            });
        }
        settle(&mut out, reads).await;
        Ok(out)
    }
}

/// Runs a batch's reads, [`MAX_TRANSFERS`] at a time, each `(i, found)` settling `out[i]`: kept
/// when found, a miss when its copy on disk was damaged, or the error.
async fn settle(
    out: &mut [Result<Option<usize>>],
    reads: Vec<impl std::future::Future<Output = (usize, Result<bool>)>>,
) {
    let read: Vec<_> = futures::stream::iter(reads)
        .buffer_unordered(MAX_TRANSFERS)
        .collect()
        .await;
    for (i, r) in read {
        match r {
            Ok(true) => {}
            Ok(false) => out[i] = Ok(None),
            Err(e) => out[i] = Err(e),
        }
    }
}
