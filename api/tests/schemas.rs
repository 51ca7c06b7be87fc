//! The JSON Schemas of the four kinds, checked into `openapi/schemas/` so that a change to the
//! API's shape shows up in review. Regenerate with `KVCACHE_UPDATE_SCHEMAS=1 cargo test -p kvcache-api`.

use std::path::PathBuf;

use kvcache_api::{Kind, Object};

fn schema_of<K: Kind>() -> (String, String) {
    let schema = schemars::schema_for!(Object<K>);
    let text = serde_json::to_string_pretty(&schema).expect("schema serializes") + "\n";
    (format!("{}.json", K::PLURAL), text)
}

#[test]
fn checked_in_schemas_are_current() {
    let dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"))
        .join("../openapi/schemas");
    let update = std::env::var_os("KVCACHE_UPDATE_SCHEMAS").is_some();
    let schemas = [
        schema_of::<kvcache_api::backend::BackendSpec>(),
        schema_of::<kvcache_api::pool::PoolSpec>(),
        schema_of::<kvcache_api::binding::BindingSpec>(),
        schema_of::<kvcache_api::model_deployment::ModelDeploymentSpec>(),
    ];
    let mut stale = Vec::new();
    for (file, text) in schemas {
        let path = dir.join(&file);
        if update {
            std::fs::write(&path, &text).expect("write schema");
        } else if std::fs::read_to_string(&path).ok().as_deref() != Some(text.as_str()) {
            stale.push(file);
        }
    }
    assert!(
        stale.is_empty(),
        "schemas out of date: {stale:?}; run KVCACHE_UPDATE_SCHEMAS=1 cargo test -p kvcache-api and review the diff"
    );
}

#[test]
fn schema_names_the_group_version_kind_and_hides_the_cross_namespace_field() {
    let (_, text) = schema_of::<kvcache_api::model_deployment::ModelDeploymentSpec>();
    assert!(text.contains("\"x-kubernetes-group-version-kind\""));
    assert!(text.contains("\"kvCache\""));
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let binding_ref = &v["$defs"]["BindingRef"]["properties"];
    assert!(binding_ref.get("name").is_some());
    assert!(
        binding_ref.get("namespace").is_none(),
        "namespace is decoded only to be refused"
    );
}
