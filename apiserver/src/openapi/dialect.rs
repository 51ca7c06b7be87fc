//! The OpenAPI dialect Kubernetes clients read, from the JSON Schema (2020-12) schemars writes:
//! `$ref`s under the document's prefix, nullable unions collapsed, a `$ref` with siblings
//! wrapped in `allOf` (v3 only), lists marked atomic, and doc comments unwrapped.

use serde_json::{Map, Value, json};

/// Rewrites a JSON Schema (2020-12, as schemars writes it) into the OpenAPI dialect;
/// `ref_prefix` is `#/components/schemas/` or `#/definitions/`.
pub(super) fn rewrite(schema: &Value, ref_prefix: &str) -> Value {
    let Value::Object(m) = schema else {
        return schema.clone();
    };
    let v2 = ref_prefix == "#/definitions/";
    let mut out = Map::new();
    for (k, v) in m {
        rewrite_keyword(&mut out, k, v, ref_prefix, v2);
    }
    // A `$ref` with siblings (a description) is wrapped in v3, where siblings of `$ref` are
    // ignored; v2 readers keep them side by side, as Kubernetes' own v2 document does.
    if !v2
        && out.len() > 1
        && let Some(r) = out.remove("$ref")
    {
        out.insert("allOf".into(), json!([{"$ref": r}]));
    }
    if out.get("type").and_then(Value::as_str) == Some("array") {
        out.insert("x-kubernetes-list-type".into(), Value::String("atomic".into()));
    }
    Value::Object(out)
}

/// Adds keyword `k` of a schema, with value `v`, to `out` in the OpenAPI dialect (see
/// [`rewrite`]; `v2` for the v2 document).
fn rewrite_keyword(out: &mut Map<String, Value>, k: &str, v: &Value, ref_prefix: &str, v2: bool) {
    match k {
        "properties" => {
            let props = v
                .as_object()
                .map(|p| {
                    p.iter()
                        .map(|(name, s)| (name.clone(), rewrite(s, ref_prefix)))
                        .collect()
                })
                .unwrap_or_default();
            out.insert(k.to_owned(), Value::Object(props));
        }
        "$ref" => {
            let target = v.as_str().unwrap_or_default();
            let name = target.rsplit('/').next().unwrap_or_default();
            out.insert(k.to_owned(), Value::String(format!("{ref_prefix}{name}")));
        }
        "type" => match v {
            Value::Array(types) => {
                let non_null: Vec<&Value> = types.iter().filter(|t| t.as_str() != Some("null")).collect();
                if let [one] = non_null.as_slice() {
                    out.insert(k.to_owned(), (*one).clone());
                }
            }
            _ => {
                out.insert(k.to_owned(), v.clone());
            }
        },
        "anyOf" | "oneOf" => rewrite_union(out, k, v, ref_prefix, v2),
        "items" | "additionalProperties" => {
            out.insert(k.to_owned(), rewrite(v, ref_prefix));
        }
        "allOf" => rewrite_all_of(out, k, v, ref_prefix, v2),
        "description" => {
            out.insert(
                k.to_owned(),
                Value::String(unwrap_lines(v.as_str().unwrap_or_default())),
            );
        }
        "$schema" | "$defs" | "title" | "const" => {}
        _ => {
            out.insert(k.to_owned(), v.clone());
        }
    }
}

/// An `anyOf` or `oneOf` (`k`) into `out`: a nullable union collapses to its one other arm.
fn rewrite_union(out: &mut Map<String, Value>, k: &str, v: &Value, ref_prefix: &str, v2: bool) {
    let arms: Vec<&Value> = v
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|s| s.get("type").and_then(Value::as_str) != Some("null"))
                .collect()
        })
        .unwrap_or_default();
    if let [one] = arms.as_slice() {
        let one = rewrite(one, ref_prefix);
        if one.get("$ref").is_some() && !v2 {
            out.insert("allOf".into(), Value::Array(vec![one]));
        } else if let Value::Object(fields) = one {
            out.extend(fields);
        }
    } else {
        out.insert(
            k.to_owned(),
            Value::Array(arms.iter().map(|s| rewrite(s, ref_prefix)).collect()),
        );
    }
}

/// An `allOf` (`k`) into `out`, its arms rewritten.
fn rewrite_all_of(out: &mut Map<String, Value>, k: &str, v: &Value, ref_prefix: &str, v2: bool) {
    let arms: Vec<Value> = v
        .as_array()
        .map(|a| a.iter().map(|s| rewrite(s, ref_prefix)).collect())
        .unwrap_or_default();
    // v2 readers (kubectl explain with openapiv2) follow `$ref` but not `allOf`.
    match arms.as_slice() {
        [one] if v2 && one.as_object().is_some_and(|o| o.len() == 1 && o.contains_key("$ref")) => {
            out.insert("$ref".into(), one["$ref"].clone());
        }
        _ => {
            out.insert(k.to_owned(), Value::Array(arms));
        }
    }
}

/// Doc comments are wrapped at the source's line width; kubectl wraps again, so single line
/// breaks become spaces and only blank lines (paragraphs) stay.
fn unwrap_lines(text: &str) -> String {
    text.split("\n\n")
        .map(|para| para.split('\n').map(str::trim).collect::<Vec<_>>().join(" "))
        .collect::<Vec<_>>()
        .join("\n\n")
}
