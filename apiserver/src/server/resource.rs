//! The seam between HTTP and the typed registries: every kind behind one object-safe trait that
//! speaks JSON, with field management (`managedFields`) and patches applied on the way in.
//!
//! The registry ([`crate::registry::Store`]) owns what may be stored; this module owns how a
//! request body becomes the object handed to it: decoding with `fieldValidation`, JSON patch,
//! merge patch, server-side apply, and who owns which field afterwards.

use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
use kvcache_api::{Kind, Object, Scope};
use parking_lot::Mutex;
use serde_json::Value;

use super::fieldmanager::{self, Part};
use super::table::Column;
use crate::decode::{self, FieldValidation};
use crate::registry::generic::{DeleteOptions, Deleted, ListOptions, Predicate, Subresource, WriteOptions, Written};
use crate::registry::{RegistryError, Store, Strategy, meta};
use crate::storage::{KeyValue, Storage};

/// Static facts about a resource: its names and how it prints.
#[derive(Debug, Clone, Copy)]
pub struct Info {
    pub kind: &'static str,
    pub plural: &'static str,
    pub singular: &'static str,
    pub short_name: &'static str,
    pub namespaced: bool,
    pub columns: &'static [Column],
}

/// Options of a write.
#[derive(Debug, Clone, Default)]
pub struct WriteParams {
    pub dry_run: bool,
    pub validation: FieldValidation,
    /// `fieldManager`, or the client's user agent.
    pub manager: String,
    /// Apply only: take ownership of conflicting fields.
    pub force: bool,
}

/// A patch body by its content type.
#[derive(Debug, Clone)]
pub enum Patch {
    /// An Update operation that edits the current object.
    Update(UpdatePatch),
    /// `application/apply-patch+yaml`: server-side apply of this configuration.
    Apply(Value),
}

/// The patches of Update operations.
#[derive(Debug, Clone)]
pub enum UpdatePatch {
    /// `application/json-patch+json`.
    Json(json_patch::Patch),
    /// `application/merge-patch+json` (and strategic merge patch: our lists are atomic, so the
    /// two agree once directives are refused).
    Merge(Value),
}

/// A successful write.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The written object, as JSON bytes (serialized once, straight from the typed object).
    pub object: Vec<u8>,
    pub warnings: Vec<String>,
    /// An apply created the object (201).
    pub created: bool,
}

/// The filter of a list or watch, on metadata only.
pub type MetaFilter = Arc<dyn Fn(&k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> bool + Send + Sync>;

/// Whether a stored object passes `filter`, decoding only its metadata (and nothing at all
/// without a filter).
pub fn metadata_matches(kv: &KeyValue, filter: Option<&MetaFilter>) -> bool {
    #[derive(serde::Deserialize)]
    struct MetaOnly {
        #[serde(default)]
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    }
    let Some(f) = filter else { return true };
    serde_json::from_slice::<MetaOnly>(&kv.value).is_ok_and(|m| f(&m.metadata))
}

/// A page of a list.
#[derive(Debug, Clone)]
pub struct Page {
    pub items: Vec<Value>,
    pub resource_version: u64,
    pub continue_token: Option<String>,
}

/// Every kind, object-safe and in JSON.
#[async_trait]
pub trait Resource: Send + Sync {
    fn info(&self) -> Info;
    fn storage(&self) -> &Arc<dyn Storage>;
    /// The storage key prefix of a list or watch.
    fn prefix(&self, namespace: Option<&str>) -> String;

    async fn get(&self, namespace: &str, name: &str) -> Result<Value, RegistryError>;
    async fn list(
        &self,
        namespace: Option<&str>,
        limit: Option<usize>,
        continue_token: Option<String>,
        revision: Option<u64>,
        filter: Option<MetaFilter>,
    ) -> Result<Page, RegistryError>;
    /// A list page as ready-to-send JSON objects (no decoding unless `filter` needs it).
    async fn list_json(
        &self,
        namespace: Option<&str>,
        limit: Option<usize>,
        continue_token: Option<String>,
        revision: Option<u64>,
        filter: Option<MetaFilter>,
    ) -> Result<(Vec<Vec<u8>>, u64, Option<String>), RegistryError>;
    async fn create(&self, namespace: &str, body: Value, params: &WriteParams) -> Result<Outcome, RegistryError>;
    async fn update(
        &self,
        namespace: &str,
        name: &str,
        body: Value,
        part: Part,
        params: &WriteParams,
    ) -> Result<Outcome, RegistryError>;
    async fn patch(
        &self,
        namespace: &str,
        name: &str,
        patch: Patch,
        part: Part,
        params: &WriteParams,
    ) -> Result<Outcome, RegistryError>;
    /// `(last state, gone)`: `gone` is false when finalizers keep the object.
    async fn delete(&self, namespace: &str, name: &str, opts: DeleteOptions) -> Result<(Value, bool), RegistryError>;
}

fn to_json<K: Kind>(obj: &Object<K>) -> Result<Value, RegistryError> {
    serde_json::to_value(obj).map_err(|e| RegistryError::Internal(format!("encoding {}: {e}", K::KIND)))
}

/// The answer to a write: the stored object and every warning, the request's first.
fn outcome<K: Kind>(written: Written<K>, mut warnings: Vec<String>, created: bool) -> Result<Outcome, RegistryError> {
    warnings.extend(written.warnings);
    Ok(Outcome {
        object: to_bytes(&written.object)?,
        warnings,
        created,
    })
}

fn to_bytes<K: Kind>(obj: &Object<K>) -> Result<Vec<u8>, RegistryError> {
    serde_json::to_vec(obj).map_err(|e| RegistryError::Internal(format!("encoding {}: {e}", K::KIND)))
}

/// Decodes a (patched or applied) JSON object, collecting `Warn` warnings.
fn typed<K: Kind>(name: &str, value: Value, mode: FieldValidation) -> Result<(Object<K>, Vec<String>), RegistryError> {
    let d = decode::from_value::<Object<K>>(value, mode).map_err(|e| RegistryError::from_decode::<K>(name, e))?;
    Ok((d.value, d.warnings))
}

fn entries_of<K: Kind>(obj: &Object<K>) -> Vec<fieldmanager::Entry> {
    fieldmanager::from_entries(obj.metadata.managed_fields.as_deref().unwrap_or_default())
}

/// Drops owned paths that do not exist in the stored object (unknown fields a `Warn` request
/// sent, which were pruned).
fn prune(entries: Vec<fieldmanager::Entry>, obj: &Value) -> Vec<ManagedFieldsEntry> {
    let kept: Vec<fieldmanager::Entry> = entries
        .into_iter()
        .map(|mut e| {
            e.fields.retain(|p| fieldmanager::value_at(obj, p).is_some());
            e
        })
        .collect();
    fieldmanager::to_entries(&kept)
}

/// Whether the request set `managedFields` itself (a client resetting or migrating ownership).
fn explicit_managed_fields(requested: &Value, current: &Value) -> Option<Vec<ManagedFieldsEntry>> {
    let req = requested.pointer("/metadata/managedFields")?;
    if Some(req) == current.pointer("/metadata/managedFields") {
        return None;
    }
    let entries: Vec<ManagedFieldsEntry> = serde_json::from_value(req.clone()).unwrap_or_default();
    // `[{}]` clears them.
    Some(entries.into_iter().filter(|e| e.manager.is_some()).collect())
}

/// After a patch: identity fields cannot change, and a `resourceVersion` in the result is a
/// precondition.
fn check_patched<K: Kind>(patched: &Value, current: &Value, name: &str) -> Result<(), RegistryError> {
    for (ptr, what) in [
        ("/metadata/name", "metadata.name"),
        ("/metadata/namespace", "metadata.namespace"),
        ("/apiVersion", "apiVersion"),
        ("/kind", "kind"),
    ] {
        let (p, c) = (patched.pointer(ptr), current.pointer(ptr));
        if p != c && !(p.is_none() && ptr != "/metadata/name") {
            return Err(RegistryError::BadRequest(format!(
                "the patch changes {what} from {} to {}, which cannot be changed",
                c.unwrap_or(&Value::Null),
                p.unwrap_or(&Value::Null)
            )));
        }
    }
    if patched.pointer("/metadata/resourceVersion") != current.pointer("/metadata/resourceVersion") {
        return Err(RegistryError::modified::<K>(name));
    }
    Ok(())
}

fn subresource(part: Part) -> Subresource {
    match part {
        Part::Main => Subresource::Main,
        Part::Status => Subresource::Status,
    }
}

/// A kind's registry with its printed columns: the [`Resource`] of that kind.
pub struct Typed<S: Strategy> {
    store: Store<S>,
    columns: &'static [Column],
}

impl<S: Strategy> Typed<S> {
    pub fn new(store: Store<S>, columns: &'static [Column]) -> Self {
        Typed { store, columns }
    }
}

#[async_trait]
impl<S: Strategy> Resource for Typed<S> {
    fn info(&self) -> Info {
        Info {
            kind: S::Kind::KIND,
            plural: S::Kind::PLURAL,
            singular: S::Kind::SINGULAR,
            short_name: S::Kind::SHORT_NAME,
            namespaced: S::Kind::SCOPE == Scope::Namespaced,
            columns: self.columns,
        }
    }

    fn storage(&self) -> &Arc<dyn Storage> {
        self.store.storage()
    }

    fn prefix(&self, namespace: Option<&str>) -> String {
        crate::storage::keys::list_prefix::<S::Kind>(namespace)
    }

    async fn get(&self, namespace: &str, name: &str) -> Result<Value, RegistryError> {
        to_json(&self.store.get(namespace, name).await?)
    }

    async fn list(
        &self,
        namespace: Option<&str>,
        limit: Option<usize>,
        continue_token: Option<String>,
        revision: Option<u64>,
        filter: Option<MetaFilter>,
    ) -> Result<Page, RegistryError> {
        let predicate: Option<Predicate<S::Kind>> = filter.map(|f| {
            let p: Predicate<S::Kind> = Arc::new(move |o: &Object<S::Kind>| f(&o.metadata));
            p
        });
        let list = self
            .store
            .list(
                namespace,
                ListOptions {
                    limit,
                    revision,
                    continue_token,
                    predicate,
                },
            )
            .await?;
        Ok(Page {
            items: list.items.iter().map(to_json).collect::<Result<_, _>>()?,
            resource_version: list.resource_version,
            continue_token: list.continue_token,
        })
    }

    async fn list_json(
        &self,
        namespace: Option<&str>,
        limit: Option<usize>,
        continue_token: Option<String>,
        revision: Option<u64>,
        filter: Option<MetaFilter>,
    ) -> Result<(Vec<Vec<u8>>, u64, Option<String>), RegistryError> {
        let predicate: Option<Predicate<S::Kind>> = filter.map(|f| {
            let p: Predicate<S::Kind> = Arc::new(move |o: &Object<S::Kind>| f(&o.metadata));
            p
        });
        self.store
            .list_json(
                namespace,
                ListOptions {
                    limit,
                    revision,
                    continue_token,
                    predicate,
                },
            )
            .await
    }

    async fn create(&self, namespace: &str, body: Value, params: &WriteParams) -> Result<Outcome, RegistryError> {
        let name = body
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let entries = fieldmanager::update(&Value::Null, &body, &[], &params.manager, Part::Main, &meta::now());
        let has_null = entries.iter().any(|e| {
            e.fields
                .iter()
                .any(|p| fieldmanager::value_at(&body, p) == Some(&Value::Null))
        });
        let (mut obj, warnings) = typed::<S::Kind>(&name, body, params.validation)?;
        // Only fields the request sent and the object kept are owned: prune when decoding
        // dropped something (unknown fields, nulls).
        obj.metadata.managed_fields = Some(if warnings.is_empty() && !has_null {
            fieldmanager::to_entries(&entries)
        } else {
            prune(entries, &to_json(&obj)?)
        });
        self.create_typed(namespace, obj, params, warnings).await
    }

    async fn update(
        &self,
        namespace: &str,
        name: &str,
        body: Value,
        part: Part,
        params: &WriteParams,
    ) -> Result<Outcome, RegistryError> {
        let (obj, warnings) = typed::<S::Kind>(name, body.clone(), params.validation)?;
        let rv = obj
            .metadata
            .resource_version
            .clone()
            .filter(|rv| !rv.is_empty())
            .ok_or_else(|| {
                let mut errs = crate::registry::ErrorList::new();
                errs.invalid(
                    &crate::registry::Path::new("metadata").child("resourceVersion"),
                    "",
                    "must be specified for an update",
                );
                RegistryError::invalid::<S::Kind>(name, errs)
            })?;
        if obj.name() != name {
            return Err(RegistryError::BadRequest(format!(
                "the name of the object ({}) does not match the name on the URL ({name})",
                obj.name()
            )));
        }
        if S::Kind::SCOPE == Scope::Namespaced && !obj.namespace().is_empty() && obj.namespace() != namespace {
            return Err(RegistryError::BadRequest(
                "the namespace of the provided object does not match the namespace sent on the request".into(),
            ));
        }
        let manager = params.manager.clone();
        let written = self
            .store
            .update_with(
                namespace,
                name,
                WriteOptions {
                    dry_run: params.dry_run,
                },
                subresource(part),
                |current| {
                    if current.metadata.resource_version.as_deref() != Some(rv.as_str()) {
                        return Err(RegistryError::modified::<S::Kind>(name));
                    }
                    let current_value = to_json(current)?;
                    let mut new = obj.clone();
                    new.metadata.managed_fields = Some(match explicit_managed_fields(&body, &current_value) {
                        Some(given) => given,
                        None => {
                            let entries = fieldmanager::update(
                                &current_value,
                                &body,
                                &entries_of(current),
                                &manager,
                                part,
                                &meta::now(),
                            );
                            prune(entries, &to_json(&new)?)
                        }
                    });
                    Ok(new)
                },
            )
            .await?;
        outcome(written, warnings, false)
    }

    async fn patch(
        &self,
        namespace: &str,
        name: &str,
        patch: Patch,
        part: Part,
        params: &WriteParams,
    ) -> Result<Outcome, RegistryError> {
        let decode_warnings = Mutex::new(Vec::new());
        let manager = params.manager.clone();
        let mode = params.validation;
        let result = self
            .store
            .update_with(
                namespace,
                name,
                WriteOptions {
                    dry_run: params.dry_run,
                },
                subresource(part),
                |current| {
                    let current_value = to_json(current)?;
                    let now = meta::now();
                    let (patched, entries) = match &patch {
                        Patch::Update(update) => {
                            let mut v = current_value.clone();
                            match update {
                                UpdatePatch::Json(ops) => {
                                    json_patch::patch(&mut v, ops).map_err(|e| RegistryError::Invalid {
                                        kind: S::Kind::KIND,
                                        name: name.to_owned(),
                                        errors: json_patch_error(&e),
                                    })?;
                                }
                                UpdatePatch::Merge(p) => json_patch::merge(&mut v, p),
                            }
                            check_patched::<S::Kind>(&v, &current_value, name)?;
                            let entries = match explicit_managed_fields(&v, &current_value) {
                                Some(given) => fieldmanager::from_entries(&given),
                                None => {
                                    fieldmanager::update(&current_value, &v, &entries_of(current), &manager, part, &now)
                                }
                            };
                            (v, entries)
                        }
                        Patch::Apply(config) => {
                            check_apply_identity::<S::Kind>(config, name)?;
                            let a = fieldmanager::apply(
                                &current_value,
                                config,
                                &entries_of(current),
                                &manager,
                                part,
                                params.force,
                                &now,
                            )
                            .map_err(|c| apply_conflict::<S::Kind>(name, &c))?;
                            (a.object, a.entries)
                        }
                    };
                    let validation_mode = match patch {
                        // Unknown fields of an applied configuration are judged once, below.
                        Patch::Apply(_) => FieldValidation::Ignore,
                        _ => mode,
                    };
                    let (mut new, warnings) = typed::<S::Kind>(name, patched, validation_mode)?;
                    *decode_warnings.lock() = warnings;
                    new.metadata.managed_fields = Some(prune(entries, &to_json(&new)?));
                    Ok(new)
                },
            )
            .await;
        let mut warnings = match &patch {
            Patch::Apply(config) => typed::<S::Kind>(name, config.clone(), mode)?.1,
            _ => Vec::new(),
        };
        let written = match result {
            Ok(w) => w,
            Err(RegistryError::NotFound { .. }) if matches!(patch, Patch::Apply(_)) && part == Part::Main => {
                return self.apply_create(namespace, name, &patch, params, warnings).await;
            }
            Err(e) => return Err(e),
        };
        warnings.extend(decode_warnings.into_inner());
        outcome(written, warnings, false)
    }

    async fn delete(&self, namespace: &str, name: &str, opts: DeleteOptions) -> Result<(Value, bool), RegistryError> {
        Ok(match self.store.delete(namespace, name, opts).await? {
            Deleted::Gone(o) => (to_json(&o)?, true),
            Deleted::Pending(o) => (to_json(&o)?, false),
        })
    }
}

impl<S: Strategy> Typed<S> {
    /// The registry's create of a decoded object, as an [`Outcome`].
    async fn create_typed(
        &self,
        namespace: &str,
        obj: Object<S::Kind>,
        params: &WriteParams,
        warnings: Vec<String>,
    ) -> Result<Outcome, RegistryError> {
        let written = self
            .store
            .create(
                namespace,
                obj,
                WriteOptions {
                    dry_run: params.dry_run,
                },
            )
            .await?;
        outcome(written, warnings, true)
    }

    /// Server-side apply to an object that does not exist: create it from the configuration.
    async fn apply_create(
        &self,
        namespace: &str,
        name: &str,
        patch: &Patch,
        params: &WriteParams,
        warnings: Vec<String>,
    ) -> Result<Outcome, RegistryError> {
        let Patch::Apply(config) = patch else {
            return Err(RegistryError::not_found::<S::Kind>(name));
        };
        let now = meta::now();
        let a = fieldmanager::apply(
            &Value::Null,
            config,
            &[],
            &params.manager,
            Part::Main,
            params.force,
            &now,
        )
        .map_err(|c| apply_conflict::<S::Kind>(name, &c))?;
        let (mut obj, _) = typed::<S::Kind>(name, a.object, FieldValidation::Ignore)?;
        obj.metadata.name = Some(name.to_owned());
        obj.metadata.managed_fields = Some(prune(a.entries, &to_json(&obj)?));
        self.create_typed(namespace, obj, params, warnings).await
    }
}

fn check_apply_identity<K: Kind>(config: &Value, name: &str) -> Result<(), RegistryError> {
    if !config.is_object() {
        return Err(RegistryError::BadRequest(
            "an applied configuration must be an object".into(),
        ));
    }
    let given = config.pointer("/metadata/name").and_then(Value::as_str);
    if given.is_some_and(|g| g != name) {
        return Err(RegistryError::BadRequest(format!(
            "the name of the object ({}) does not match the name on the URL ({name})",
            given.unwrap_or_default()
        )));
    }
    for (ptr, want) in [("/apiVersion", kvcache_api::API_VERSION), ("/kind", K::KIND)] {
        match config.pointer(ptr).and_then(Value::as_str) {
            Some(v) if v == want => {}
            other => {
                return Err(RegistryError::BadRequest(format!(
                    "an applied configuration needs {}: {want} (got {})",
                    &ptr[1..],
                    other.unwrap_or("nothing")
                )));
            }
        }
    }
    Ok(())
}

fn apply_conflict<K: Kind>(name: &str, conflicts: &[fieldmanager::Conflict]) -> RegistryError {
    let list: Vec<String> = conflicts
        .iter()
        .map(|c| {
            format!(
                "conflict with {:?} using {}: {}",
                c.manager,
                kvcache_api::API_VERSION,
                c.field
            )
        })
        .collect();
    let noun = if conflicts.len() == 1 { "conflict" } else { "conflicts" };
    RegistryError::ApplyConflict {
        resource: crate::registry::errors::qualified_resource::<K>(),
        name: name.to_owned(),
        message: format!("Apply failed with {} {noun}: {}", conflicts.len(), list.join("\n")),
        conflicts: conflicts
            .iter()
            .map(|c| {
                (
                    c.field.clone(),
                    format!("conflict with {:?} using {}", c.manager, kvcache_api::API_VERSION),
                )
            })
            .collect(),
    }
}

fn json_patch_error(e: &json_patch::PatchError) -> crate::registry::ErrorList {
    let mut errs = crate::registry::ErrorList::new();
    errs.invalid(
        &crate::registry::Path::new("patch"),
        "",
        format!("the JSON patch cannot be applied: {e}"),
    );
    errs
}
