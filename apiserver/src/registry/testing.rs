//! Test support for the admission tables: the typed stores over a fresh embedded storage, JSON
//! edits of a base object, and assertions on refusals (reason and field path).

use std::fmt::Debug;
use std::sync::Arc;

use kvcache_api::{Kind, Object};
use serde_json::Value;

use super::backend::BackendStrategy;
use super::binding::BindingStrategy;
use super::model_deployment::ModelDeploymentStrategy;
use super::pool::PoolStrategy;
use super::{Context, KindRegistry, RegistryError};
use crate::config::Config;
use crate::decode::{self, FieldValidation};
use crate::field::ErrorType;
use crate::storage::Storage;
use crate::storage::embedded::{Embedded, Options};

pub struct Harness {
    pub reg: Registries,
    pub storage: Arc<dyn Storage>,
    _dir: tempfile::TempDir,
}

impl Harness {
    pub fn new() -> Self {
        Self::with_config(Config::default())
    }

    pub fn with_config(config: Config) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let options = Options {
            initial_file_bytes: 64 << 10,
            ..Options::default()
        };
        let storage: Arc<dyn Storage> = Arc::new(Embedded::open(dir.path(), options).expect("open storage"));
        Harness {
            reg: registries(storage.clone(), config),
            storage,
            _dir: dir,
        }
    }
}

/// The typed store of every kind, as the admission tables drive them.
pub struct Registries {
    pub backends: KindRegistry<BackendStrategy>,
    pub pools: KindRegistry<PoolStrategy>,
    pub bindings: KindRegistry<BindingStrategy>,
    pub model_deployments: KindRegistry<ModelDeploymentStrategy>,
}

/// Registries over `storage` with another configuration (for settings changed after admission).
pub fn registries(storage: Arc<dyn Storage>, config: Config) -> Registries {
    let ctx = Context {
        config: crate::config::Live::new(config),
    };
    Registries {
        backends: KindRegistry::new(storage.clone(), BackendStrategy, ctx.clone()),
        pools: KindRegistry::new(storage.clone(), PoolStrategy, ctx.clone()),
        bindings: KindRegistry::new(storage.clone(), BindingStrategy, ctx.clone()),
        model_deployments: KindRegistry::new(storage, ModelDeploymentStrategy, ctx),
    }
}

/// Decodes like a strict request body.
pub fn decode<K: Kind>(v: &Value) -> Result<Object<K>, RegistryError> {
    let name = v.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
    decode::from_value::<Object<K>>(v.clone(), FieldValidation::Strict)
        .map(|d| d.value)
        .map_err(|e| RegistryError::from_decode::<K>(name, e))
}

/// Sets the value at a JSON pointer, creating objects on the way.
pub fn set(v: &mut Value, pointer: &str, new: Value) {
    let mut cur = v;
    let parts: Vec<&str> = pointer.trim_start_matches('/').split('/').collect();
    for (i, part) in parts.iter().enumerate() {
        let last = i == parts.len() - 1;
        if let Ok(idx) = part.parse::<usize>()
            && cur.is_array()
        {
            let arr = cur.as_array_mut().expect("array");
            if last {
                if idx < arr.len() {
                    arr[idx] = new;
                } else {
                    arr.push(new);
                }
                return;
            }
            cur = &mut arr[idx];
        } else {
            if !cur.is_object() {
                *cur = Value::Object(Default::default());
            }
            let map = cur.as_object_mut().expect("object");
            if last {
                map.insert((*part).to_owned(), new);
                return;
            }
            cur = map.entry((*part).to_owned()).or_insert(Value::Null);
        }
    }
}

/// Removes the value at a JSON pointer.
pub fn remove(v: &mut Value, pointer: &str) {
    let (parent, key) = pointer.rsplit_once('/').expect("pointer");
    match v.pointer_mut(parent) {
        Some(Value::Object(m)) => {
            m.remove(key);
        }
        Some(Value::Array(a)) => {
            if let Ok(i) = key.parse::<usize>() {
                a.remove(i);
            }
        }
        _ => {}
    }
}

/// What a case expects.
#[derive(Clone, Copy, Debug)]
pub enum Expect {
    Admitted,
    /// Admitted, with a warning containing this text.
    Warned(&'static str),
    /// 422 with a cause of this reason at this field.
    Refused(ErrorType, &'static str),
    /// 400 whose message contains this text.
    BadRequest(&'static str),
}

/// Checks one outcome; returns the refusal message for further assertions.
pub fn check<T: Debug>(case: &str, result: Result<(T, Vec<String>), RegistryError>, expect: Expect) -> String {
    match (expect, result) {
        (Expect::Admitted, Ok(_)) => String::new(),
        (Expect::Warned(text), Ok((_, warnings))) => {
            assert!(
                warnings.iter().any(|w| w.contains(text)),
                "{case}: expected a warning containing {text:?}, got {warnings:?}"
            );
            warnings.join("\n")
        }
        (Expect::Refused(kind, field), Err(RegistryError::Invalid { errors, .. })) => {
            assert!(
                errors.iter().any(|e| e.kind == kind && e.field.as_str() == field),
                "{case}: expected {kind:?} at {field}, got {errors}"
            );
            errors.to_string()
        }
        (Expect::BadRequest(text), Err(RegistryError::BadRequest(msg))) => {
            assert!(
                msg.contains(text),
                "{case}: expected a bad request containing {text:?}, got {msg}"
            );
            msg
        }
        (expect, other) => panic!("{case}: expected {expect:?}, got {other:?}"),
    }
}

/// What `kv-apiserver render` answers for `object` after `prerequisites` (its scratch storage
/// and the server's registry, [`crate::render::admit`]) when the registry refused `object` with
/// `refused`: the same refusal, in the words the server's Status carries. Render and server
/// cannot disagree on any case of an admission table.
pub async fn render_refuses_alike(case: &str, prerequisites: &[Value], object: &Value, refused: &RegistryError) {
    let mut docs: Vec<(String, crate::decode::bounded::Parsed)> = prerequisites
        .iter()
        .map(|v| ("prerequisites.yaml".to_owned(), parsed(v.clone())))
        .collect();
    docs.push(("case.yaml".to_owned(), parsed(object.clone())));
    let plural = object["kind"]
        .as_str()
        .and_then(crate::registry::kinds::by_kind)
        .map_or("", |k| k.plural);
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    let crate::status::Refusal(_, status) = crate::status::for_resource(plural, name, refused);
    let want = format!(
        "Error from server ({}): error when applying case.yaml: {}",
        status.reason.as_deref().unwrap_or_default(),
        status.message.as_deref().unwrap_or_default()
    );
    match crate::render::admit(docs, &Config::default()).await {
        Ok(_) => panic!("{case}: render admitted what the registry refused ({want})"),
        Err(refusals) => assert!(
            refusals.contains(&want),
            "{case}: render refused otherwise than the server:\n  server: {want}\n  render: {refusals:?}"
        ),
    }
}

fn parsed(value: Value) -> crate::decode::bounded::Parsed {
    crate::decode::bounded::Parsed {
        value,
        duplicates: Vec::new(),
    }
}
