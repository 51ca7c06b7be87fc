//! Patches and apply configurations: what each patch type may do to the current object, within
//! bounds.
//!
//! A JSON patch is applied one operation at a time to a working copy (so a failure leaves the
//! stored object untouched), after checking what the operation would build: at most
//! [`MAX_JSON_PATCH_OPERATIONS`] operations (as kube-apiserver), at most
//! [`MAX_ACCUMULATED_COPY_BYTES`] copied in all (a 523-byte patch of 14 `copy` operations
//! otherwise builds 600 MB), and never deeper than [`bounded::MAX_DEPTH`] (a patch that copies a
//! value into itself otherwise nests it until the stack overflows). A merge patch cannot build
//! more than its body; strategic merge patches are merge patches here (every list of this API is
//! atomic) and their directives are refused, never ignored.

use json_patch::PatchOperation;
use kvcache_api::Kind;
use serde_json::Value;

use super::errors::RegistryError;
use super::fieldmanager;
use crate::decode::Parsed;
use crate::decode::bounded::{self, MAX_DEPTH};
use crate::field::{ErrorList, Path};

/// Most operations in one JSON patch, as kube-apiserver.
pub const MAX_JSON_PATCH_OPERATIONS: usize = 10_000;

/// Most bytes the `copy` operations of one JSON patch may duplicate, in all (kube-apiserver's
/// accumulated copy limit is its request body limit too).
pub const MAX_ACCUMULATED_COPY_BYTES: usize = 3 * 1024 * 1024;

/// A patch body by its content type.
#[derive(Debug, Clone)]
pub enum Patch {
    /// `application/json-patch+json`.
    Json(json_patch::Patch),
    /// `application/merge-patch+json`, and strategic merge patch once its directives are refused.
    Merge(Parsed),
    /// `application/apply-patch+yaml`: server-side apply of this configuration.
    Apply(Parsed),
}

/// A strategic merge patch as the merge patch it means here: every list of this API is atomic,
/// so the two agree, and the directives (`$patch`, `$retainKeys`, ...) that only make sense with
/// merge keys are refused.
pub fn strategic(body: Parsed) -> Result<Patch, RegistryError> {
    let mut stack = vec![&body.value];
    while let Some(v) = stack.pop() {
        match v {
            Value::Object(m) => {
                if let Some(k) = m.keys().find(|k| k.starts_with('$')) {
                    return Err(RegistryError::BadRequest(format!(
                        "strategic merge patch directive {k:?} is not supported: every list of this API is atomic; use a JSON patch (--type=json) to edit lists"
                    )));
                }
                stack.extend(m.values());
            }
            Value::Array(a) => stack.extend(a.iter()),
            _ => {}
        }
    }
    Ok(Patch::Merge(body))
}

/// Applies a JSON patch to `doc` for an object of kind `K` named `name`.
pub fn json<K: Kind>(doc: &mut Value, ops: &[PatchOperation], name: &str) -> Result<(), RegistryError> {
    if ops.len() > MAX_JSON_PATCH_OPERATIONS {
        return Err(RegistryError::TooLarge(format!(
            "The allowed maximum operations in a JSON patch is {MAX_JSON_PATCH_OPERATIONS}, got {}",
            ops.len()
        )));
    }
    let mut copied = 0usize;
    for (i, op) in ops.iter().enumerate() {
        let (built, target): (Option<&Value>, Option<&json_patch::jsonptr::PointerBuf>) = match op {
            PatchOperation::Copy(c) => {
                let from = doc.pointer(c.from.as_str()).ok_or_else(|| {
                    invalid::<K>(name, i, &format!("\"from\" path {:?} does not exist", c.from.as_str()))
                })?;
                copied += bounded::size(from, MAX_ACCUMULATED_COPY_BYTES - copied);
                if copied > MAX_ACCUMULATED_COPY_BYTES {
                    return Err(RegistryError::TooLarge(format!(
                        "the JSON patch copies more than {MAX_ACCUMULATED_COPY_BYTES} bytes in all (operation {i})"
                    )));
                }
                (Some(from), Some(&c.path))
            }
            PatchOperation::Move(m) => (doc.pointer(m.from.as_str()), Some(&m.path)),
            PatchOperation::Add(a) => (Some(&a.value), Some(&a.path)),
            PatchOperation::Replace(r) => (Some(&r.value), Some(&r.path)),
            PatchOperation::Remove(_) | PatchOperation::Test(_) => (None, None),
        };
        if let (Some(v), Some(target)) = (built, target)
            && target.count() + bounded::depth(v, MAX_DEPTH) > MAX_DEPTH
        {
            return Err(RegistryError::TooLarge(format!(
                "the JSON patch would nest the object deeper than {MAX_DEPTH} levels (operation {i})"
            )));
        }
        json_patch::patch_unsafe(doc, std::slice::from_ref(op))
            .map_err(|e| invalid::<K>(name, i, &format!("{} at {:?}", e.kind, e.path.as_str())))?;
    }
    Ok(())
}

fn invalid<K: Kind>(name: &str, op: usize, what: &str) -> RegistryError {
    let mut errs = ErrorList::new();
    errs.invalid(
        &Path::new("patch"),
        "",
        format!("the JSON patch cannot be applied: operation {op}: {what}"),
    );
    RegistryError::invalid::<K>(name, errs)
}

/// After a patch: identity fields cannot change, and a `resourceVersion` in the result is a
/// precondition.
pub fn check_patched<K: Kind>(patched: &Value, current: &Value, name: &str) -> Result<(), RegistryError> {
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

/// An applied configuration names this object: the name of the URL, this API version and kind.
pub fn check_apply_identity<K: Kind>(config: &Value, name: &str) -> Result<(), RegistryError> {
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

/// The 409 of an apply that would take fields other managers own.
pub fn apply_conflict<K: Kind>(name: &str, conflicts: &[fieldmanager::Conflict]) -> RegistryError {
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
        resource: super::errors::qualified_resource::<K>(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use kvcache_api::pool::PoolSpec;
    use serde_json::json;

    fn ops(v: Value) -> json_patch::Patch {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_value_copied_into_itself_is_refused_before_it_gets_deep() {
        let mut doc = json!({"spec": {"a": {}}});
        // Each copy nests /spec/a one level deeper: 25,000 of them would overflow the stack.
        let one = json!({"op": "copy", "from": "/spec/a", "path": "/spec/a/a"});
        let patch = ops(Value::Array(vec![one; 5_000]));
        let err = json::<PoolSpec>(&mut doc, &patch.0, "p").unwrap_err();
        assert!(
            matches!(&err, RegistryError::TooLarge(m) if m.contains("deeper than 128")),
            "{err}"
        );
    }

    #[test]
    fn copies_are_bounded_in_all() {
        // 14 doublings of a 40 KiB string: 640 MiB if allowed.
        let mut doc = json!({"metadata": {"annotations": {"a": "x".repeat(40 << 10)}}, "l": []});
        let mut list = vec![json!({"op": "copy", "from": "/metadata/annotations", "path": "/l/-"})];
        for _ in 0..14 {
            list.push(json!({"op": "copy", "from": "/l", "path": "/l/-"}));
        }
        let err = json::<PoolSpec>(&mut doc, &ops(Value::Array(list)).0, "p").unwrap_err();
        assert!(
            matches!(&err, RegistryError::TooLarge(m) if m.contains("copies more than")),
            "{err}"
        );
    }

    #[test]
    fn too_many_operations_are_refused() {
        let one = json!({"op": "test", "path": "/a", "value": 1});
        let patch = ops(Value::Array(vec![one; MAX_JSON_PATCH_OPERATIONS + 1]));
        let err = json::<PoolSpec>(&mut json!({"a": 1}), &patch.0, "p").unwrap_err();
        assert!(matches!(err, RegistryError::TooLarge(_)));
    }

    #[test]
    fn a_failing_operation_names_its_index() {
        let patch = ops(json!([{"op": "add", "path": "/a", "value": 1}, {"op": "remove", "path": "/nope"}]));
        let err = json::<PoolSpec>(&mut json!({}), &patch.0, "p").unwrap_err();
        assert!(err.to_string().contains("operation 1"), "{err}");
    }

    #[test]
    fn strategic_directives_are_refused() {
        let body = bounded::json(br#"{"spec":{"backends":[{"$patch":"delete"}]}}"#).unwrap();
        assert!(matches!(strategic(body), Err(RegistryError::BadRequest(_))));
        let body = bounded::json(br#"{"spec":{"quota":{"total":"1Gi"}}}"#).unwrap();
        assert!(matches!(strategic(body), Ok(Patch::Merge(_))));
    }
}
