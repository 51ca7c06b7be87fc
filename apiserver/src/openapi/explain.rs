//! What `kubectl explain` prints of a field: one text, and only the values the server accepts.
//!
//! kubectl prints a field's description and then the description of the type it references, so
//! two texts about the same field would run together (`kvCache`: "Attachment to a shared cache;
//! absent means none. Attachment to a shared KV cache through a KVCachePoolBinding."). Here:
//! - a string enum is inlined into the fields that use them, as Kubernetes' own documents have
//!   them (`{type: string, enum: [...]}`, which kubectl 1.30+ lists under `ENUM:`);
//! - a type of ours drops its own description from the documents when every field that
//!   references it has one (the field's text says what it is there).
//!
//! A value the server refuses is not in the schema at all (`#[schemars(skip)]` in `api/`), so
//! the values listed are the ones admission accepts; the field's description names the others.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

/// Rewrites `schemas` (every definition of the documents, by name) so that each field explains
/// in one text: string enums inlined, and a type's description dropped where its fields have one.
pub(super) fn one_text_per_field(schemas: &mut Map<String, Value>) {
    inline_enums(schemas);
    let (mut all, mut described) = (BTreeMap::new(), BTreeMap::new());
    for s in schemas.values() {
        references(s, &mut all, &mut described);
    }
    for (name, n) in all {
        // Ours only (no dots): kinds and Kubernetes' types keep theirs.
        if described.get(&name) == Some(&n)
            && !name.contains('.')
            && let Some(Value::Object(def)) = schemas.get_mut(&name)
        {
            def.remove("description");
        }
    }
}

/// Counts the references to each type under `v`: every one in `all`, and in `described` those
/// of a field with a description of its own (directly, through a nullable union or `allOf`, or
/// as the items of a list).
fn references(v: &Value, all: &mut BTreeMap<String, usize>, described: &mut BTreeMap<String, usize>) {
    match v {
        Value::Object(m) => {
            if let Some(name) = m.get("$ref").and_then(Value::as_str).and_then(|r| r.rsplit('/').next()) {
                *all.entry(name.to_owned()).or_default() += 1;
            }
            let fields = m.get("properties").and_then(Value::as_object);
            for field in fields.into_iter().flat_map(|p| p.values()) {
                if field.get("description").is_some() {
                    for name in field_refs(field) {
                        *described.entry(name).or_default() += 1;
                    }
                }
            }
            m.values().for_each(|c| references(c, all, described));
        }
        Value::Array(a) => a.iter().for_each(|c| references(c, all, described)),
        _ => {}
    }
}

/// The types a field's schema is: its `$ref`, the one of its union arms, or its items'.
fn field_refs(field: &Value) -> Vec<String> {
    let mut sites = vec![field];
    sites.extend(field.get("items"));
    let arms: Vec<&Value> = sites
        .iter()
        .flat_map(|s| ["anyOf", "oneOf", "allOf"].map(|k| s.get(k)))
        .flatten()
        .filter_map(Value::as_array)
        .flatten()
        .collect();
    sites
        .into_iter()
        .chain(arms)
        .filter_map(|s| s.get("$ref")?.as_str()?.rsplit('/').next())
        .map(str::to_owned)
        .collect()
}

/// Replaces every reference to a string enum in `schemas` by the enum itself, and drops the
/// enum definitions no longer referenced.
fn inline_enums(schemas: &mut Map<String, Value>) {
    let enums: Map<String, Value> = schemas
        .iter()
        .filter_map(|(name, s)| Some((name.clone(), Value::Array(values(s)?))))
        .collect();
    if enums.is_empty() {
        return;
    }
    for s in schemas.values_mut() {
        replace_refs(s, &enums);
    }
    schemas.retain(|name, _| !enums.contains_key(name));
}

/// The values of a string enum schema (`enum` of strings, or a `oneOf` of string constants, as
/// schemars writes an enum whose variants have doc comments); `None` for any other schema.
fn values(s: &Value) -> Option<Vec<Value>> {
    if let Some(Value::Array(vs)) = s.get("enum") {
        return (s.get("type").and_then(Value::as_str) == Some("string") && vs.iter().all(Value::is_string))
            .then(|| vs.clone());
    }
    let arms = s.get("oneOf")?.as_array()?;
    arms.iter()
        .map(|arm| match (arm.get("const"), arm.get("enum")) {
            (Some(c @ Value::String(_)), _) => Some(c.clone()),
            (None, Some(Value::Array(one))) if one.len() == 1 && one[0].is_string() => Some(one[0].clone()),
            _ => None,
        })
        .collect()
}

/// Rewrites, under `v`, each `$ref` to one of `enums` into `type: string` and its values; the
/// schema's own keys (a field's description) stay.
fn replace_refs(v: &mut Value, enums: &Map<String, Value>) {
    match v {
        Value::Object(m) => {
            let target = m
                .get("$ref")
                .and_then(Value::as_str)
                .and_then(|r| r.rsplit('/').next())
                .and_then(|name| enums.get(name));
            if let Some(values) = target.cloned() {
                m.remove("$ref");
                m.insert("type".into(), Value::String("string".into()));
                m.insert("enum".into(), values);
            }
            for child in m.values_mut() {
                replace_refs(child, enums);
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|c| replace_refs(c, enums)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn enum_fields_are_inlined_with_the_field_description_only() {
        let mut schemas: Map<String, Value> = serde_json::from_value(json!({
            "Role": {"type": "object", "properties": {
                "kind": {"description": "What the role serves.", "anyOf": [{"$ref": "#/$defs/RoleKind"}, {"type": "null"}]},
                "phase": {"$ref": "#/$defs/Phase"},
                "other": {"$ref": "#/$defs/Other"},
            }},
            "RoleKind": {"description": "The type's text.", "type": "string", "enum": ["Server"]},
            "Phase": {"description": "A phase.", "oneOf": [
                {"type": "string", "const": "Ready", "description": "Serving."},
                {"type": "string", "enum": ["Failed"]},
            ]},
            "Other": {"type": "object", "properties": {}},
        }))
        .unwrap();
        inline_enums(&mut schemas);
        let props = &schemas["Role"]["properties"];
        assert_eq!(
            props["kind"],
            json!({"description": "What the role serves.", "anyOf": [{"type": "string", "enum": ["Server"]}, {"type": "null"}]})
        );
        assert_eq!(props["phase"], json!({"type": "string", "enum": ["Ready", "Failed"]}));
        assert_eq!(props["other"], json!({"$ref": "#/$defs/Other"}));
        assert!(!schemas.contains_key("RoleKind") && !schemas.contains_key("Phase"));
        assert!(schemas.contains_key("Other"));
    }

    #[test]
    fn a_type_keeps_its_description_only_where_a_field_has_none() {
        let mut schemas: Map<String, Value> = serde_json::from_value(serde_json::json!({
            "Spec": {"description": "The spec type.", "type": "object", "properties": {
                "one": {"description": "Field one.", "anyOf": [{"$ref": "#/$defs/Described"}, {"type": "null"}]},
                "list": {"description": "A list.", "type": "array", "items": {"$ref": "#/$defs/Item"}},
                "bare": {"$ref": "#/$defs/Bare"},
                "again": {"description": "Again.", "$ref": "#/$defs/Bare"},
                "meta": {"description": "Standard.", "$ref": "#/$defs/io.k8s.Meta"},
            }},
            "Described": {"description": "Type text.", "type": "object"},
            "Item": {"description": "Item text.", "type": "object"},
            "Bare": {"description": "Kept.", "type": "object"},
            "io.k8s.Meta": {"description": "Kubernetes' own.", "type": "object"},
        }))
        .unwrap();
        one_text_per_field(&mut schemas);
        let text = |name: &str| schemas[name].get("description").cloned();
        assert_eq!(text("Described"), None);
        assert_eq!(text("Item"), None);
        assert_eq!(text("Bare"), Some(Value::from("Kept.")));
        assert_eq!(text("io.k8s.Meta"), Some(Value::from("Kubernetes' own.")));
        assert_eq!(text("Spec"), Some(Value::from("The spec type.")));
    }
}
