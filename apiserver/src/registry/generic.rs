//! The flow every kind shares (Kubernetes' `genericregistry.Store`): get, list, create, update,
//! status update and delete over a [`Storage`], with the strategy's hooks in a fixed order and
//! cross-object admission inside the storage transaction.

use std::sync::Arc;

use kvcache_api::{Kind, Object};

use super::errors::RegistryError;
use super::{Admission, Change, Context, ErrorList, Reads, StatusStrategy, Strategy, decode, encode, meta};
use crate::paging::ContinueToken;
use crate::storage::{KeyValue, ListRequest, Op, Storage, Txn, TxnOutcome, keys};

/// Retries of the read-decide-commit loop before giving up with a conflict.
const MAX_ATTEMPTS: usize = 32;

/// How long a list waits for a `resourceVersion` ahead of the store before answering 504.
const TOO_LARGE_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// The registry of one kind.
pub struct KindRegistry<S: Strategy> {
    storage: Arc<dyn Storage>,
    strategy: S,
    ctx: Context,
}

/// A successful write.
#[derive(Clone, Debug, PartialEq)]
pub struct Written<K: Kind> {
    pub object: Object<K>,
    /// For the client (`Warning: 299` headers).
    pub warnings: Vec<String>,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct WriteOptions {
    /// Run every check, write nothing.
    pub dry_run: bool,
}

#[derive(Clone, Debug, Default)]
pub struct DeleteOptions {
    pub dry_run: bool,
    pub precondition_uid: Option<String>,
    pub precondition_resource_version: Option<String>,
}

/// What a delete did.
#[derive(Clone, Debug, PartialEq)]
pub enum Deleted<K: Kind> {
    /// The object is gone; this was its last state.
    Gone(Object<K>),
    /// Finalizers hold it: `deletionTimestamp` is set and it stays until they are removed.
    Pending(Object<K>),
}

/// A filter on decoded objects (label and field selectors are built on it).
pub type Predicate<K> = Arc<dyn Fn(&Object<K>) -> bool + Send + Sync>;

#[derive(Clone, Default)]
pub struct ListOptions<K: Kind> {
    pub limit: Option<usize>,
    /// Read at exactly this revision (`resourceVersionMatch=Exact`); `None` reads the latest.
    pub revision: Option<u64>,
    /// Read state at least this new (`resourceVersion=N`, `NotOlderThan`): wait a little for it,
    /// then refuse with 504.
    pub min_revision: Option<u64>,
    pub continue_token: Option<String>,
    pub predicate: Option<Predicate<K>>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ObjectList<K: Kind> {
    pub items: Vec<Object<K>>,
    pub resource_version: u64,
    /// Present when more items follow; pass it back to read the next page at the same revision.
    pub continue_token: Option<String>,
}

impl<S: Strategy> KindRegistry<S> {
    pub fn new(storage: Arc<dyn Storage>, strategy: S, ctx: Context) -> Self {
        KindRegistry { storage, strategy, ctx }
    }

    /// The storage under this registry (for watch and revisions).
    pub fn storage(&self) -> &Arc<dyn Storage> {
        &self.storage
    }

    fn key(namespace: &str, name: &str) -> String {
        keys::object_key::<S::Kind>(namespace, name)
    }

    pub async fn get(&self, namespace: &str, name: &str) -> Result<Object<S::Kind>, RegistryError> {
        match self.storage.get(&Self::key(namespace, name)).await? {
            Some(kv) => decode(&kv),
            None => Err(RegistryError::not_found::<S::Kind>(name)),
        }
    }

    /// Lists objects (of one namespace, or of all when `namespace` is `None`), consistently at
    /// one revision across pages.
    pub async fn list(
        &self,
        namespace: Option<&str>,
        opts: ListOptions<S::Kind>,
    ) -> Result<ObjectList<S::Kind>, RegistryError> {
        let (page, revision, continue_token) = self.list_stored(namespace, opts).await?;
        let items = page.iter().map(decode).collect::<Result<Vec<_>, _>>()?;
        Ok(ObjectList {
            items,
            resource_version: revision,
            continue_token,
        })
    }

    /// [`KindRegistry::list`] without decoding: each item is the stored JSON with its
    /// `resourceVersion` spliced in, ready to be sent (a list of thousands of objects is mostly
    /// bytes to copy).
    pub async fn list_json(
        &self,
        namespace: Option<&str>,
        opts: ListOptions<S::Kind>,
    ) -> Result<(Vec<Vec<u8>>, u64, Option<String>), RegistryError> {
        let (page, revision, continue_token) = self.list_stored(namespace, opts).await?;
        let items = page
            .iter()
            .map(super::encoded_with_revision)
            .collect::<Result<Vec<_>, _>>()?;
        Ok((items, revision, continue_token))
    }

    async fn list_stored(
        &self,
        namespace: Option<&str>,
        opts: ListOptions<S::Kind>,
    ) -> Result<(Vec<KeyValue>, u64, Option<String>), RegistryError> {
        let prefix = keys::list_prefix::<S::Kind>(namespace);
        if let Some(min) = opts.min_revision.filter(|m| *m > 0) {
            self.wait_for(min).await?;
        }
        let (revision, start_after) = match &opts.continue_token {
            Some(token) => {
                let t = ContinueToken::decode(token, &prefix).map_err(|e| RegistryError::BadRequest(e.to_string()))?;
                (Some(t.rv), Some(t.start))
            }
            None => (opts.revision, None),
        };
        let filter = opts.predicate.clone().map(|p| {
            let f: crate::storage::ListFilter =
                Arc::new(move |kv: &KeyValue| decode::<S::Kind>(kv).map(|o| p(&o)).unwrap_or(true));
            f
        });
        let page = self
            .storage
            .list(ListRequest {
                prefix,
                revision,
                start_after,
                limit: opts.limit,
                filter,
            })
            .await?;
        let continue_token = match (page.more, page.items.last()) {
            (true, Some(last)) => Some(
                ContinueToken {
                    rv: page.revision,
                    start: last.key.clone(),
                }
                .encode(),
            ),
            _ => None,
        };
        Ok((page.items, page.revision, continue_token))
    }

    /// Returns once reads reflect `revision`, or refuses with 504 after a few seconds (a
    /// `resourceVersion` ahead of the store, as kube-apiserver answers).
    async fn wait_for(&self, revision: u64) -> Result<(), RegistryError> {
        match tokio::time::timeout(TOO_LARGE_WAIT, self.storage.wait_for_revision(revision)).await {
            Ok(r) => Ok(r?),
            Err(_) => Err(RegistryError::TooLargeResourceVersion(revision)),
        }
    }

    /// Creates `obj` in `namespace` (ignored for cluster-scoped kinds).
    pub async fn create(
        &self,
        namespace: &str,
        mut obj: Object<S::Kind>,
        opts: WriteOptions,
    ) -> Result<Written<S::Kind>, RegistryError> {
        meta::prepare_create(&mut obj, namespace)?;
        self.strategy.prepare_for_create(&mut obj);
        let sent = serde_json::to_value(&obj).unwrap_or_default();
        self.strategy.apply_defaults(&mut obj, &self.ctx);
        // A refusal of a value the request never set names it as the default it is.
        let refused = |errs: ErrorList| {
            let defaulted = serde_json::to_value(&obj).unwrap_or_default();
            RegistryError::invalid::<S::Kind>(obj.name(), errs.name_defaulted(&sent, &defaulted))
        };
        let mut errs = meta::validate::<S::Kind>(&obj.metadata);
        errs.extend(self.strategy.validate(&obj, &self.ctx));
        if !errs.is_empty() {
            return Err(refused(errs));
        }
        let mut warnings = self.strategy.warnings_on_create(&obj, &self.ctx);
        let key = Self::key(obj.namespace(), obj.name());
        for _ in 0..MAX_ATTEMPTS {
            let mut reads = Reads::new(self.storage.as_ref());
            if reads.get(&key).await?.is_some() {
                return Err(RegistryError::already_exists::<S::Kind>(obj.name()));
            }
            let admission = self.strategy.admit(Change::Create(&obj), &mut reads, &self.ctx).await?;
            if !admission.errors.is_empty() {
                return Err(refused(admission.errors));
            }
            if opts.dry_run {
                warnings.extend(admission.warnings);
                return Ok(Written { object: obj, warnings });
            }
            let mut ops = vec![Op::Put {
                key: key.clone(),
                value: encode(&obj)?.into(),
            }];
            ops.extend(admission.ops);
            match self.commit(reads, ops).await? {
                Some(revision) => {
                    obj.metadata.resource_version = Some(revision.to_string());
                    warnings.extend(admission.warnings);
                    tracing::debug!(kind = S::Kind::KIND, name = obj.name(), revision, "created");
                    return Ok(Written { object: obj, warnings });
                }
                None => continue,
            }
        }
        Err(RegistryError::modified::<S::Kind>(obj.name()))
    }

    /// Replaces the object (PUT). `obj.metadata.resourceVersion` is required and must match.
    pub async fn update(
        &self,
        namespace: &str,
        name: &str,
        obj: Object<S::Kind>,
        opts: WriteOptions,
    ) -> Result<Written<S::Kind>, RegistryError> {
        self.replace(namespace, name, obj, opts, Subresource::Main, |_, _| Ok(()))
            .await
    }

    /// Replaces the status (PUT on `/status`); everything else is kept as stored.
    pub async fn update_status(
        &self,
        namespace: &str,
        name: &str,
        obj: Object<S::Kind>,
        opts: WriteOptions,
    ) -> Result<Written<S::Kind>, RegistryError> {
        self.replace(namespace, name, obj, opts, Subresource::Status, |_, _| Ok(()))
            .await
    }

    /// A PUT: the client's object, valid only against the version it names and only for the
    /// name and namespace of the URL. `finish` completes the object from the exact stored
    /// version it replaces (field management).
    pub async fn replace(
        &self,
        namespace: &str,
        name: &str,
        obj: Object<S::Kind>,
        opts: WriteOptions,
        subresource: Subresource,
        finish: impl Fn(&Object<S::Kind>, &mut Object<S::Kind>) -> Result<(), RegistryError> + Send + Sync,
    ) -> Result<Written<S::Kind>, RegistryError> {
        let rv = required_resource_version::<S::Kind>(&obj)?;
        check_identity::<S::Kind>(&obj, namespace, name)?;
        self.update_with(namespace, name, opts, subresource, move |current| {
            if current.metadata.resource_version.as_deref() != Some(rv.as_str()) {
                return Err(RegistryError::modified::<S::Kind>(name));
            }
            let mut new = obj.clone();
            finish(current, &mut new)?;
            Ok(new)
        })
        .await
    }

    /// The read-modify-write loop under every update (PUT, patch, status): `mutate` builds the
    /// desired object from the current one; the strategy judges it against that exact version.
    pub async fn update_with(
        &self,
        namespace: &str,
        name: &str,
        opts: WriteOptions,
        subresource: Subresource,
        mutate: impl Fn(&Object<S::Kind>) -> Result<Object<S::Kind>, RegistryError> + Send + Sync,
    ) -> Result<Written<S::Kind>, RegistryError> {
        let key = Self::key(namespace, name);
        for _ in 0..MAX_ATTEMPTS {
            let mut reads = Reads::new(self.storage.as_ref());
            let Some(kv) = reads.get(&key).await? else {
                return Err(RegistryError::not_found::<S::Kind>(name));
            };
            let old: Object<S::Kind> = decode(&kv)?;
            let mut new = mutate(&old)?;
            meta::prepare_update(&mut new, &old)?;
            let mut warnings = Vec::new();
            let status = <S::Status as Default>::default();
            match subresource {
                Subresource::Main => {
                    self.strategy.prepare_for_update(&mut new, &old);
                    self.strategy.apply_defaults(&mut new, &self.ctx);
                    if new.spec != old.spec {
                        new.metadata.generation = Some(old.metadata.generation.unwrap_or(0) + 1);
                    }
                }
                Subresource::Status => status.prepare_for_update(&mut new, &old),
            }
            if unchanged(&new, &old) {
                return Ok(Written { object: old, warnings });
            }
            let mut errs = meta::validate_update::<S::Kind>(&new.metadata, &old.metadata);
            match subresource {
                Subresource::Main if new.spec != old.spec => {
                    errs.extend(self.judge_update(&new, &old));
                    warnings.extend(self.strategy.warnings_on_update(&new, &old, &self.ctx));
                }
                Subresource::Main => {}
                Subresource::Status => errs.extend(status.validate_update(&new, &old)),
            }
            if !errs.is_empty() {
                return Err(RegistryError::invalid::<S::Kind>(name, errs));
            }
            let finished = new.metadata.deletion_timestamp.is_some() && meta::finalizers(&new.metadata).is_empty();
            let change = if finished {
                Change::Delete(&new)
            } else {
                Change::Update { new: &new, old: &old }
            };
            let admission: Admission = self.strategy.admit(change, &mut reads, &self.ctx).await?;
            if !admission.errors.is_empty() {
                return Err(RegistryError::invalid::<S::Kind>(name, admission.errors));
            }
            warnings.extend(admission.warnings);
            if opts.dry_run {
                return Ok(Written { object: new, warnings });
            }
            let own = if finished {
                Op::Delete { key: key.clone() }
            } else {
                Op::Put {
                    key: key.clone(),
                    value: encode(&new)?.into(),
                }
            };
            let mut ops = vec![own];
            ops.extend(admission.ops);
            if let Some(revision) = self.commit(reads, ops).await? {
                new.metadata.resource_version = Some(revision.to_string());
                tracing::debug!(kind = S::Kind::KIND, name, revision, finished, "updated");
                return Ok(Written { object: new, warnings });
            }
        }
        Err(RegistryError::modified::<S::Kind>(name))
    }

    /// Deletes the object, or marks it for deletion while finalizers hold it.
    pub async fn delete(
        &self,
        namespace: &str,
        name: &str,
        opts: DeleteOptions,
    ) -> Result<Deleted<S::Kind>, RegistryError> {
        let key = Self::key(namespace, name);
        for _ in 0..MAX_ATTEMPTS {
            let mut reads = Reads::new(self.storage.as_ref());
            let Some(kv) = reads.get(&key).await? else {
                return Err(RegistryError::not_found::<S::Kind>(name));
            };
            let mut obj: Object<S::Kind> = decode(&kv)?;
            if let Some(uid) = &opts.precondition_uid
                && obj.metadata.uid.as_ref() != Some(uid)
            {
                return Err(RegistryError::precondition::<S::Kind>(
                    name,
                    "UID",
                    uid,
                    obj.metadata.uid.as_deref(),
                ));
            }
            if let Some(rv) = &opts.precondition_resource_version
                && obj.metadata.resource_version.as_ref() != Some(rv)
            {
                let stored = obj.metadata.resource_version.as_deref();
                return Err(RegistryError::precondition::<S::Kind>(
                    name,
                    "ResourceVersion",
                    rv,
                    stored,
                ));
            }
            let (ops, outcome_pending) = if !meta::finalizers(&obj.metadata).is_empty() {
                if obj.metadata.deletion_timestamp.is_some() {
                    return Ok(Deleted::Pending(obj));
                }
                obj.metadata.deletion_timestamp = Some(meta::now());
                obj.metadata.deletion_grace_period_seconds = Some(0);
                (
                    vec![Op::Put {
                        key: key.clone(),
                        value: encode(&obj)?.into(),
                    }],
                    true,
                )
            } else {
                let admission = self.strategy.admit(Change::Delete(&obj), &mut reads, &self.ctx).await?;
                let mut ops = vec![Op::Delete { key: key.clone() }];
                ops.extend(admission.ops);
                (ops, false)
            };
            if opts.dry_run {
                return Ok(if outcome_pending {
                    Deleted::Pending(obj)
                } else {
                    Deleted::Gone(obj)
                });
            }
            if let Some(revision) = self.commit(reads, ops).await? {
                obj.metadata.resource_version = Some(revision.to_string());
                tracing::debug!(
                    kind = S::Kind::KIND,
                    name,
                    revision,
                    pending = outcome_pending,
                    "deleted"
                );
                return Ok(if outcome_pending {
                    Deleted::Pending(obj)
                } else {
                    Deleted::Gone(obj)
                });
            }
        }
        Err(RegistryError::modified::<S::Kind>(name))
    }

    /// The warnings of a DELETE that left `obj` marked for deletion (the strategy's).
    pub async fn warnings_on_delete(&self, obj: &Object<S::Kind>) -> Result<Vec<String>, RegistryError> {
        self.strategy.warnings_on_delete(obj, self.storage.as_ref()).await
    }

    /// The object rules of an update, ratcheted (errors the stored version already had on
    /// fields left unchanged are dropped), then the update-only rules, which are not.
    fn judge_update(&self, new: &Object<S::Kind>, old: &Object<S::Kind>) -> ErrorList {
        let (n, o) = (
            serde_json::to_value(new).unwrap_or_default(),
            serde_json::to_value(old).unwrap_or_default(),
        );
        let mut errs = self
            .strategy
            .validate(new, &self.ctx)
            .ratchet(&self.strategy.validate(old, &self.ctx), &n, &o);
        for e in self.strategy.validate_update(new, old, &self.ctx).0 {
            if !errs.0.contains(&e) {
                errs.push(e);
            }
        }
        errs
    }

    /// Commits `ops` if nothing admission read has changed. `None`: something changed; the
    /// caller re-reads and re-decides (after waiting until that change is readable).
    async fn commit(&self, reads: Reads<'_>, ops: Vec<Op>) -> Result<Option<u64>, RegistryError> {
        let txn = Txn {
            compares: reads.into_compares(),
            ops,
        };
        match self.storage.txn(txn).await? {
            TxnOutcome::Committed { revision } => Ok(Some(revision)),
            TxnOutcome::CompareFailed { revision } => {
                self.storage.wait_for_revision(revision).await?;
                Ok(None)
            }
        }
    }
}

/// Which part of the object an update writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Subresource {
    /// Spec and metadata; the stored status is kept.
    Main,
    /// Status only; spec and metadata are kept.
    Status,
}

fn required_resource_version<K: Kind>(obj: &Object<K>) -> Result<String, RegistryError> {
    match obj.metadata.resource_version.as_deref() {
        Some(rv) if !rv.is_empty() => Ok(rv.to_owned()),
        _ => {
            let mut errs = super::ErrorList::new();
            errs.invalid(
                &super::Path::new("metadata").child("resourceVersion"),
                "",
                "must be specified for an update",
            );
            Err(RegistryError::invalid::<K>(obj.name(), errs))
        }
    }
}

fn check_identity<K: Kind>(obj: &Object<K>, namespace: &str, name: &str) -> Result<(), RegistryError> {
    if obj.name() != name {
        return Err(RegistryError::BadRequest(format!(
            "the name of the object ({}) does not match the name on the URL ({name})",
            obj.name()
        )));
    }
    if K::SCOPE == kvcache_api::Scope::Namespaced && !obj.namespace().is_empty() && obj.namespace() != namespace {
        return Err(RegistryError::BadRequest(
            "the namespace of the provided object does not match the namespace sent on the request".into(),
        ));
    }
    Ok(())
}

/// Equal apart from `resourceVersion`: such an update writes nothing and keeps the revision.
fn unchanged<K: Kind>(new: &Object<K>, old: &Object<K>) -> bool {
    let mut a = new.clone();
    a.metadata.resource_version = old.metadata.resource_version.clone();
    a == *old
}
