//! Every kind behind one object-safe trait that speaks JSON, for the handlers: request bodies
//! become typed objects here (with `fieldValidation`), patches are applied to the exact stored
//! version inside the update loop, and field ownership (`managedFields`) follows each write.
//!
//! The typed [`KindRegistry`] owns what may be stored; this module owns how a parsed body becomes the
//! object handed to it.

use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kvcache_api::{Kind, Object};
use parking_lot::Mutex;
use serde_json::Value;

use super::fieldmanager::{self, Part};
use super::generic::{DeleteOptions, Deleted, ListOptions, Predicate, WriteOptions, Written};
use super::patch::{self, Patch};
use super::watch::{Watch, WatchOptions};
use super::{Context, KindRegistry, RegistryError, Strategy, meta};
use crate::decode::{self, FieldValidation, Parsed};
use crate::storage::{KeyValue, Storage, keys};

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

/// A successful write.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The written object, as JSON bytes (serialized once, straight from the typed object).
    pub object: Vec<u8>,
    pub warnings: Vec<String>,
    /// The object was created (201).
    pub created: bool,
}

/// What a delete did.
#[derive(Debug, Clone)]
pub struct Removal {
    /// The object's last state.
    pub object: Value,
    /// False when finalizers keep the object (it is marked for deletion).
    pub gone: bool,
    /// For the client: what holds an object that stays.
    pub warnings: Vec<String>,
}

/// The filter of a list or watch, on metadata only.
pub type MetaFilter = Arc<dyn Fn(&ObjectMeta) -> bool + Send + Sync>;

/// Whether a stored object passes `filter`, decoding only its metadata (and nothing at all
/// without a filter).
pub fn metadata_matches(kv: &KeyValue, filter: Option<&MetaFilter>) -> bool {
    #[derive(serde::Deserialize)]
    struct MetaOnly {
        #[serde(default)]
        metadata: ObjectMeta,
    }
    let Some(f) = filter else { return true };
    serde_json::from_slice::<MetaOnly>(&kv.value).is_ok_and(|m| f(&m.metadata))
}

/// What a list asks for.
#[derive(Clone, Default)]
pub struct ListParams {
    pub limit: Option<usize>,
    pub continue_token: Option<String>,
    /// `resourceVersionMatch=Exact`.
    pub exact_revision: Option<u64>,
    /// `resourceVersion=N` (`NotOlderThan`): wait for it, a little.
    pub min_revision: Option<u64>,
    pub filter: Option<MetaFilter>,
}

/// A page of a list, as values.
#[derive(Debug, Clone)]
pub struct Page {
    pub items: Vec<Value>,
    pub resource_version: u64,
    pub continue_token: Option<String>,
}

/// A page of a list, as ready-to-send JSON objects.
#[derive(Debug, Clone)]
pub struct JsonPage {
    pub items: Vec<Vec<u8>>,
    pub resource_version: u64,
    pub continue_token: Option<String>,
}

/// Every kind, object-safe and in JSON.
#[async_trait]
pub trait Resource: Send + Sync {
    async fn get(&self, namespace: &str, name: &str) -> Result<Value, RegistryError>;
    async fn list(&self, namespace: Option<&str>, params: ListParams) -> Result<Page, RegistryError>;
    /// A list page without decoding (unless the filter needs the metadata).
    async fn list_json(&self, namespace: Option<&str>, params: ListParams) -> Result<JsonPage, RegistryError>;
    async fn create(&self, namespace: &str, body: Parsed, params: &WriteParams) -> Result<Outcome, RegistryError>;
    async fn update(
        &self,
        namespace: &str,
        name: &str,
        body: Parsed,
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
    async fn delete(&self, namespace: &str, name: &str, opts: DeleteOptions) -> Result<Removal, RegistryError>;
    /// Every object matching `filter` deleted (or marked for deletion), as of one list.
    async fn delete_collection(
        &self,
        namespace: Option<&str>,
        filter: Option<MetaFilter>,
        opts: DeleteOptions,
    ) -> Result<Page, RegistryError>;
    async fn watch(&self, namespace: Option<&str>, opts: WatchOptions) -> Result<Watch, RegistryError>;
}

/// A kind's [`Resource`] over `storage` (the constructor the table of kinds holds).
pub fn resource<S: Strategy>(storage: Arc<dyn Storage>, ctx: Context) -> Arc<dyn Resource> {
    Arc::new(Typed {
        registry: KindRegistry::new(storage, S::default(), ctx),
    })
}

fn to_json<K: Kind>(obj: &Object<K>) -> Result<Value, RegistryError> {
    serde_json::to_value(obj).map_err(|e| RegistryError::Internal(format!("encoding {}: {e}", K::KIND)))
}

fn to_bytes<K: Kind>(obj: &Object<K>) -> Result<Vec<u8>, RegistryError> {
    serde_json::to_vec(obj).map_err(|e| RegistryError::Internal(format!("encoding {}: {e}", K::KIND)))
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

/// Decodes a parsed body (unknown fields and duplicate keys judged by `mode`).
pub(crate) fn typed<K: Kind>(
    name: &str,
    body: Parsed,
    mode: FieldValidation,
) -> Result<(Object<K>, Vec<String>), RegistryError> {
    let d = decode::from_parsed::<Object<K>>(body, mode).map_err(|e| RegistryError::from_decode::<K>(name, e))?;
    Ok((d.value, d.warnings))
}

/// Decodes a value the server built (a patched object): unknown fields judged by `mode`.
fn typed_value<K: Kind>(
    name: &str,
    value: Value,
    mode: FieldValidation,
) -> Result<(Object<K>, Vec<String>), RegistryError> {
    let d = decode::from_value::<Object<K>>(value, mode).map_err(|e| RegistryError::from_decode::<K>(name, e))?;
    Ok((d.value, d.warnings))
}

/// A write to the main resource never sets the status (it is cleared on create and kept from the
/// stored object on update), so what a body says there is not even decoded: a stale or foreign
/// status in a manifest cannot refuse the write.
fn drop_status(mut v: Value, part: Part) -> Value {
    if part == Part::Main
        && let Some(m) = v.as_object_mut()
    {
        m.remove("status");
    }
    v
}

fn predicate<K: Kind>(filter: Option<MetaFilter>) -> Option<Predicate<K>> {
    filter.map(|f| {
        let p: Predicate<K> = Arc::new(move |o: &Object<K>| f(&o.metadata));
        p
    })
}

fn list_options<K: Kind>(params: ListParams) -> ListOptions<K> {
    ListOptions {
        limit: params.limit,
        revision: params.exact_revision,
        min_revision: params.min_revision,
        continue_token: params.continue_token,
        predicate: predicate(params.filter),
    }
}

/// Refusals and warnings of the keys a patch body repeats: they are judged by `mode` before
/// anything is written.
fn judge_duplicates<K: Kind>(body: &Parsed, mode: FieldValidation) -> Result<Vec<String>, RegistryError> {
    if body.duplicates.is_empty() || mode == FieldValidation::Ignore {
        return Ok(Vec::new());
    }
    let messages: Vec<String> = body
        .duplicates
        .iter()
        .map(|p| format!("duplicate field {p:?}"))
        .collect();
    if mode == FieldValidation::Strict {
        return Err(RegistryError::from_decode::<K>(
            "",
            decode::DecodeError::BadRequest(format!("strict decoding error: {}", messages.join(", "))),
        ));
    }
    Ok(messages)
}

/// The warnings of what a patch request itself carries (an apply configuration's unknown
/// fields, keys a body repeats), or its refusal.
fn request_warnings<K: Kind>(
    patch: &Patch,
    name: &str,
    part: Part,
    mode: FieldValidation,
) -> Result<Vec<String>, RegistryError> {
    Ok(match patch {
        Patch::Apply(config) => {
            patch::check_apply_identity::<K>(&config.value, name)?;
            let config = Parsed {
                value: drop_status(config.value.clone(), part),
                duplicates: config.duplicates.clone(),
            };
            typed::<K>(name, config, mode)?.1
        }
        Patch::Merge(body) => judge_duplicates::<K>(body, mode)?,
        Patch::Json(_) => Vec::new(),
    })
}

/// One attempt of a patch: `current` patched, decoded, and given its fields' owners, with the
/// decoding's warnings.
fn patched<K: Kind>(
    patch: &Patch,
    current: &Object<K>,
    name: &str,
    part: Part,
    params: &WriteParams,
) -> Result<(Object<K>, Vec<String>), RegistryError> {
    let current_value = to_json(current)?;
    let now = meta::now();
    let (patched, entries) = match patch {
        Patch::Json(_) | Patch::Merge(_) => {
            let v = edited::<K>(patch, &current_value, name)?;
            let entries = match fieldmanager::explicit_managed_fields(&v, &current_value) {
                Some(given) => fieldmanager::from_entries(&given),
                None => fieldmanager::update(
                    &current_value,
                    &v,
                    &fieldmanager::entries_of(current),
                    &params.manager,
                    part,
                    &now,
                ),
            };
            (v, entries)
        }
        Patch::Apply(config) => {
            let a = fieldmanager::apply(
                &current_value,
                &config.value,
                &fieldmanager::entries_of(current),
                &params.manager,
                part,
                params.force,
                &now,
            )
            .map_err(|c| patch::apply_conflict::<K>(name, &c))?;
            (a.object, a.entries)
        }
    };
    // Unknown fields of an applied configuration were judged before the update
    // (`request_warnings`).
    let validation_mode = if matches!(patch, Patch::Apply(_)) {
        FieldValidation::Ignore
    } else {
        params.validation
    };
    let (mut new, warnings) = typed_value::<K>(name, drop_status(patched, part), validation_mode)?;
    if part == Part::Main {
        new.status = current.status.clone();
    }
    new.metadata.managed_fields = Some(fieldmanager::prune(entries, &to_json(&new)?));
    Ok((new, warnings))
}

/// `current` with a JSON or merge patch applied, checked for what a patch may not change.
fn edited<K: Kind>(patch: &Patch, current: &Value, name: &str) -> Result<Value, RegistryError> {
    let mut v = current.clone();
    match patch {
        Patch::Json(ops) => patch::json::<K>(&mut v, ops, name)?,
        Patch::Merge(body) => json_patch::merge(&mut v, &body.value),
        Patch::Apply(_) => {}
    }
    patch::check_patched::<K>(&v, current, name)?;
    Ok(v)
}

/// A kind's registry as a [`Resource`].
struct Typed<S: Strategy> {
    registry: KindRegistry<S>,
}

#[async_trait]
impl<S: Strategy> Resource for Typed<S> {
    async fn get(&self, namespace: &str, name: &str) -> Result<Value, RegistryError> {
        to_json(&self.registry.get(namespace, name).await?)
    }

    async fn list(&self, namespace: Option<&str>, params: ListParams) -> Result<Page, RegistryError> {
        let list = self.registry.list(namespace, list_options(params)).await?;
        Ok(Page {
            items: list.items.iter().map(to_json).collect::<Result<_, _>>()?,
            resource_version: list.resource_version,
            continue_token: list.continue_token,
        })
    }

    async fn list_json(&self, namespace: Option<&str>, params: ListParams) -> Result<JsonPage, RegistryError> {
        let (items, resource_version, continue_token) =
            self.registry.list_json(namespace, list_options(params)).await?;
        Ok(JsonPage {
            items,
            resource_version,
            continue_token,
        })
    }

    async fn create(&self, namespace: &str, body: Parsed, params: &WriteParams) -> Result<Outcome, RegistryError> {
        let name = body
            .value
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let entries = fieldmanager::update(
            &Value::Null,
            &body.value,
            &[],
            &params.manager,
            Part::Main,
            &meta::now(),
        );
        let has_null = entries.iter().any(|e| {
            e.fields
                .iter()
                .any(|p| fieldmanager::value_at(&body.value, p) == Some(&Value::Null))
        });
        let body = Parsed {
            value: drop_status(body.value, Part::Main),
            duplicates: body.duplicates,
        };
        let (mut obj, warnings) = typed::<S::Kind>(&name, body, params.validation)?;
        // Only fields the request sent and the object kept are owned: prune when decoding
        // dropped something (unknown fields, nulls).
        obj.metadata.managed_fields = Some(if warnings.is_empty() && !has_null {
            fieldmanager::to_entries(&entries)
        } else {
            fieldmanager::prune(entries, &to_json(&obj)?)
        });
        let written = self
            .registry
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

    async fn update(
        &self,
        namespace: &str,
        name: &str,
        body: Parsed,
        part: Part,
        params: &WriteParams,
    ) -> Result<Outcome, RegistryError> {
        let requested = body.value.clone();
        let body = Parsed {
            value: drop_status(body.value, part),
            duplicates: body.duplicates,
        };
        let (obj, warnings) = typed::<S::Kind>(name, body, params.validation)?;
        let manager = params.manager.clone();
        let written = self
            .registry
            .replace(
                namespace,
                name,
                obj,
                WriteOptions {
                    dry_run: params.dry_run,
                },
                part,
                |current, new| {
                    if part == Part::Main {
                        // What the stored object will keep (see `drop_status`), so that the
                        // status fields' owners are not pruned.
                        new.status = current.status.clone();
                    }
                    let current_value = to_json(current)?;
                    new.metadata.managed_fields = Some(
                        match fieldmanager::explicit_managed_fields(&requested, &current_value) {
                            Some(given) => given,
                            None => {
                                let entries = fieldmanager::update(
                                    &current_value,
                                    &requested,
                                    &fieldmanager::entries_of(current),
                                    &manager,
                                    part,
                                    &meta::now(),
                                );
                                fieldmanager::prune(entries, &to_json(new)?)
                            }
                        },
                    );
                    Ok(())
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
        // What the request itself carries is judged before anything is written: an apply
        // configuration's unknown fields, and keys a body repeats.
        let mut warnings = request_warnings::<S::Kind>(&patch, name, part, params.validation)?;
        let decode_warnings = Mutex::new(Vec::new());
        let result = self
            .registry
            .update_with(
                namespace,
                name,
                WriteOptions {
                    dry_run: params.dry_run,
                },
                part,
                |current| {
                    let (new, warnings) = patched::<S::Kind>(&patch, current, name, part, params)?;
                    *decode_warnings.lock() = warnings;
                    Ok(new)
                },
            )
            .await;
        let written = match (result, &patch) {
            (Ok(w), _) => w,
            (Err(RegistryError::NotFound { .. }), Patch::Apply(config)) if part == Part::Main => {
                return self
                    .apply_create(namespace, name, &config.value, params, warnings)
                    .await;
            }
            (Err(e), _) => return Err(e),
        };
        warnings.extend(decode_warnings.into_inner());
        outcome(written, warnings, false)
    }

    async fn delete(&self, namespace: &str, name: &str, opts: DeleteOptions) -> Result<Removal, RegistryError> {
        Ok(match self.registry.delete(namespace, name, opts).await? {
            Deleted::Gone(o) => Removal {
                object: to_json(&o)?,
                gone: true,
                warnings: Vec::new(),
            },
            Deleted::Pending(o) => Removal {
                warnings: self.registry.warnings_on_delete(&o).await?,
                object: to_json(&o)?,
                gone: false,
            },
        })
    }

    async fn delete_collection(
        &self,
        namespace: Option<&str>,
        filter: Option<MetaFilter>,
        opts: DeleteOptions,
    ) -> Result<Page, RegistryError> {
        let list = self
            .registry
            .list(
                namespace,
                ListOptions {
                    predicate: predicate(filter),
                    ..ListOptions::default()
                },
            )
            .await?;
        let mut deleted = Vec::new();
        for item in &list.items {
            match self.registry.delete(item.namespace(), item.name(), opts.clone()).await {
                Ok(Deleted::Gone(o) | Deleted::Pending(o)) => deleted.push(to_json(&o)?),
                Err(RegistryError::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(Page {
            items: deleted,
            resource_version: list.resource_version,
            continue_token: None,
        })
    }

    async fn watch(&self, namespace: Option<&str>, opts: WatchOptions) -> Result<Watch, RegistryError> {
        Watch::open(self.registry.storage(), keys::list_prefix::<S::Kind>(namespace), opts).await
    }
}

impl<S: Strategy> Typed<S> {
    /// Server-side apply to an object that does not exist: create it from the configuration.
    async fn apply_create(
        &self,
        namespace: &str,
        name: &str,
        config: &Value,
        params: &WriteParams,
        warnings: Vec<String>,
    ) -> Result<Outcome, RegistryError> {
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
        .map_err(|c| patch::apply_conflict::<S::Kind>(name, &c))?;
        let (mut obj, _) = typed_value::<S::Kind>(name, a.object, FieldValidation::Ignore)?;
        obj.metadata.name = Some(name.to_owned());
        obj.metadata.managed_fields = Some(fieldmanager::prune(a.entries, &to_json(&obj)?));
        let written = self
            .registry
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
}
