//! What the targets that drive the registry share: one embedded storage in a temporary
//! directory, every kind's registry over it, and the walkthrough's objects already created, so
//! a patch or a paged list has something to work on. Writes are dry runs: the storage does not
//! change between inputs. Each target uses part of it.

#![allow(dead_code)]

use std::sync::{Arc, OnceLock};

use kvcache_apiserver::config::{Config, Live};
use kvcache_apiserver::decode::FieldValidation;
use kvcache_apiserver::decode::bounded;
use kvcache_apiserver::registry::kinds::KINDS;
use kvcache_apiserver::registry::dynamic::WriteParams;
use kvcache_apiserver::registry::{Context, Resource};
use kvcache_apiserver::storage::Storage;
use kvcache_apiserver::storage::embedded::{Embedded, Options};

pub struct World {
    pub rt: tokio::runtime::Runtime,
    /// One per entry of `KINDS`, in its order.
    pub resources: Vec<Arc<dyn Resource>>,
    /// Per kind: the namespace and name of its walkthrough object.
    pub objects: Vec<(String, String)>,
    _dir: tempfile::TempDir,
}

const MANIFESTS: [&str; 3] = [
    include_str!("../../../tests/fixtures/walkthrough/01-backend.yaml"),
    include_str!("../../../tests/fixtures/walkthrough/02-pool-binding.yaml"),
    include_str!("../../../tests/fixtures/walkthrough/03-model-deployment.yaml"),
];

pub fn world() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(|| {
        let dir = tempfile::tempdir().expect("temp dir");
        let options = Options {
            initial_file_bytes: 1 << 20,
            ..Options::default()
        };
        let storage: Arc<dyn Storage> = Arc::new(Embedded::open(dir.path(), options).expect("open storage"));
        let ctx = Context {
            config: Live::new(Config::default()),
        };
        let resources: Vec<Arc<dyn Resource>> = KINDS
            .iter()
            .map(|k| (k.resource)(storage.clone(), ctx.clone()))
            .collect();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let mut objects = vec![(String::new(), String::new()); KINDS.len()];
        for manifest in MANIFESTS {
            for doc in bounded::yaml_documents(manifest).expect("the walkthrough parses") {
                let kind = doc.value["kind"].as_str().expect("a kind").to_owned();
                let at = KINDS.iter().position(|k| k.kind == kind).expect("a served kind");
                let namespace = if KINDS[at].namespaced() {
                    doc.value["metadata"]["namespace"]
                        .as_str()
                        .unwrap_or("default")
                        .to_owned()
                } else {
                    String::new()
                };
                let name = doc.value["metadata"]["name"].as_str().expect("a name").to_owned();
                rt.block_on(resources[at].create(&namespace, doc, &params(false, FieldValidation::Strict)))
                    .unwrap_or_else(|e| panic!("creating the walkthrough's {kind}: {e}"));
                objects[at] = (namespace, name);
            }
        }
        World {
            rt,
            resources,
            objects,
            _dir: dir,
        }
    })
}

pub fn params(dry_run: bool, validation: FieldValidation) -> WriteParams {
    WriteParams {
        dry_run,
        validation,
        manager: "fuzz".to_owned(),
        force: false,
    }
}

/// A validation mode from a byte.
pub fn validation(b: u8) -> FieldValidation {
    match b % 3 {
        0 => FieldValidation::Strict,
        1 => FieldValidation::Warn,
        _ => FieldValidation::Ignore,
    }
}
