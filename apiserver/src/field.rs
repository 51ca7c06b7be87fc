//! Field paths and field errors, in the shape of Kubernetes' `field.ErrorList`.
//!
//! Every refusal names the field (`spec.connection.managed.members[0].medium`), a reason from the
//! Kubernetes set (`FieldValueRequired`, `FieldValueInvalid`, ...) and a message that says what to
//! do. The HTTP layer turns a list of these into the causes of a `422 Invalid` Status.

use std::fmt;

/// A path to a field: `spec.members[2].extraEnv[FOO]`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Path(String);

impl Path {
    pub fn new(root: &str) -> Path {
        Path(root.to_owned())
    }

    pub fn child(&self, name: &str) -> Path {
        if self.0.is_empty() {
            Path(name.to_owned())
        } else {
            Path(format!("{}.{name}", self.0))
        }
    }

    pub fn index(&self, i: usize) -> Path {
        Path(format!("{}[{i}]", self.0))
    }

    pub fn key(&self, k: &str) -> Path {
        Path(format!("{}[{k}]", self.0))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The kinds of field error Kubernetes reports (`metav1.CauseType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorType {
    Required,
    Invalid,
    NotSupported,
    Duplicate,
    Forbidden,
    TooLong,
    TooMany,
    NotFound,
    TypeInvalid,
}

impl ErrorType {
    /// The cause `reason` on the wire.
    pub fn reason(self) -> &'static str {
        match self {
            ErrorType::Required => "FieldValueRequired",
            ErrorType::Invalid => "FieldValueInvalid",
            ErrorType::NotSupported => "FieldValueNotSupported",
            ErrorType::Duplicate => "FieldValueDuplicate",
            ErrorType::Forbidden => "FieldValueForbidden",
            ErrorType::TooLong => "FieldValueTooLong",
            ErrorType::TooMany => "FieldValueTooMany",
            ErrorType::NotFound => "FieldValueNotFound",
            ErrorType::TypeInvalid => "FieldValueTypeInvalid",
        }
    }

    fn label(self) -> &'static str {
        match self {
            ErrorType::Required => "Required value",
            ErrorType::Invalid => "Invalid value",
            ErrorType::NotSupported => "Unsupported value",
            ErrorType::Duplicate => "Duplicate value",
            ErrorType::Forbidden => "Forbidden",
            ErrorType::TooLong => "Too long",
            ErrorType::TooMany => "Too many",
            ErrorType::NotFound => "Not found",
            ErrorType::TypeInvalid => "Invalid value",
        }
    }

    /// Whether the message shows the offending value (as Kubernetes does).
    fn shows_value(self) -> bool {
        matches!(
            self,
            ErrorType::Invalid
                | ErrorType::NotSupported
                | ErrorType::Duplicate
                | ErrorType::NotFound
                | ErrorType::TypeInvalid
        )
    }
}

/// One refusal of one field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    pub kind: ErrorType,
    pub field: Path,
    /// The offending value, already rendered (JSON-ish: strings quoted).
    pub value: Option<String>,
    pub detail: String,
}

impl FieldError {
    /// The message of the cause, without the field path: `Invalid value: "x": must be ...`.
    pub fn message(&self) -> String {
        let mut m = self.kind.label().to_owned();
        if self.kind.shows_value()
            && let Some(v) = &self.value
        {
            m.push_str(": ");
            m.push_str(v);
        }
        if !self.detail.is_empty() {
            m.push_str(": ");
            m.push_str(&self.detail);
        }
        m
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message())
    }
}

/// The value a field path points to in an object's JSON (`spec.members[0].nodeSelector[k]`).
pub fn value_at<'a>(root: &'a serde_json::Value, path: &Path) -> Option<&'a serde_json::Value> {
    let mut cur = root;
    let mut rest = path.as_str();
    while !rest.is_empty() {
        if let Some(inner) = rest.strip_prefix('[') {
            let end = inner.find(']')?;
            let key = &inner[..end];
            cur = match cur {
                serde_json::Value::Array(a) => a.get(key.parse::<usize>().ok()?)?,
                serde_json::Value::Object(m) => m.get(key)?,
                _ => return None,
            };
            rest = &inner[end + 1..];
        } else {
            let rest_trimmed = rest.strip_prefix('.').unwrap_or(rest);
            let end = rest_trimmed.find(['.', '[']).unwrap_or(rest_trimmed.len());
            cur = cur.get(&rest_trimmed[..end])?;
            rest = &rest_trimmed[end..];
        }
    }
    Some(cur)
}

/// Renders a value the way Kubernetes messages do: strings quoted, numbers bare.
pub fn render(v: impl fmt::Debug) -> String {
    format!("{v:?}")
}

/// An ordered list of field errors.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ErrorList(pub Vec<FieldError>);

impl ErrorList {
    pub fn new() -> Self {
        ErrorList(Vec::new())
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn push(&mut self, e: FieldError) {
        self.0.push(e);
    }

    pub fn extend(&mut self, other: ErrorList) {
        self.0.extend(other.0);
    }

    pub fn iter(&self) -> impl Iterator<Item = &FieldError> {
        self.0.iter()
    }

    pub fn required(&mut self, field: &Path, detail: impl Into<String>) {
        self.push(FieldError {
            kind: ErrorType::Required,
            field: field.clone(),
            value: None,
            detail: detail.into(),
        });
    }

    pub fn invalid(&mut self, field: &Path, value: impl fmt::Debug, detail: impl Into<String>) {
        self.push(FieldError {
            kind: ErrorType::Invalid,
            field: field.clone(),
            value: Some(render(value)),
            detail: detail.into(),
        });
    }

    pub fn forbidden(&mut self, field: &Path, detail: impl Into<String>) {
        self.push(FieldError {
            kind: ErrorType::Forbidden,
            field: field.clone(),
            value: None,
            detail: detail.into(),
        });
    }

    pub fn duplicate(&mut self, field: &Path, value: impl fmt::Debug, detail: impl Into<String>) {
        self.push(FieldError {
            kind: ErrorType::Duplicate,
            field: field.clone(),
            value: Some(render(value)),
            detail: detail.into(),
        });
    }

    pub fn not_supported(&mut self, field: &Path, value: impl fmt::Debug, supported: &[&str]) {
        let list = supported
            .iter()
            .map(|s| format!("{s:?}"))
            .collect::<Vec<_>>()
            .join(", ");
        self.push(FieldError {
            kind: ErrorType::NotSupported,
            field: field.clone(),
            value: Some(render(value)),
            detail: format!("supported values: {list}"),
        });
    }

    pub fn too_long(&mut self, field: &Path, max: usize) {
        self.push(FieldError {
            kind: ErrorType::TooLong,
            field: field.clone(),
            value: None,
            detail: format!("may not be more than {max} bytes"),
        });
    }

    pub fn too_many(&mut self, field: &Path, actual: usize, max: usize) {
        self.push(FieldError {
            kind: ErrorType::TooMany,
            field: field.clone(),
            value: Some(actual.to_string()),
            detail: format!("must have at most {max} items"),
        });
    }

    pub fn not_found(&mut self, field: &Path, value: impl fmt::Debug, detail: impl Into<String>) {
        self.push(FieldError {
            kind: ErrorType::NotFound,
            field: field.clone(),
            value: Some(render(value)),
            detail: detail.into(),
        });
    }

    /// Update ratcheting: drops the errors the stored object already had on a field the update
    /// left unchanged. An update is refused only for what it changed, never for values it did
    /// not touch, so a finalizer removal always passes. `new` and `old` are the two objects as
    /// JSON.
    pub fn ratchet(self, old_errors: &ErrorList, new: &serde_json::Value, old: &serde_json::Value) -> ErrorList {
        ErrorList(
            self.0
                .into_iter()
                .filter(|e| !(old_errors.0.contains(e) && value_at(new, &e.field) == value_at(old, &e.field)))
                .collect(),
        )
    }

    /// Names the defaulted values among the errors: an error on a value that `sent` (the object
    /// as the request gave it) does not set but `defaulted` (the object after defaulting) does
    /// says that the value is the default and which field chooses another, since the user never
    /// wrote it. The field paths stay as they are.
    pub fn name_defaulted(self, sent: &serde_json::Value, defaulted: &serde_json::Value) -> ErrorList {
        ErrorList(
            self.0
                .into_iter()
                .map(|mut e| {
                    if e.value.is_some()
                        && value_at(sent, &e.field).is_none()
                        && let Some(v) = value_at(defaulted, &e.field)
                    {
                        let f = &e.field;
                        e.detail = format!(
                            "{} ({v} is the default: the request does not set {f}; set {f} to choose another value)",
                            e.detail
                        );
                    }
                    e
                })
                .collect(),
        )
    }

    /// A field we decode but do not implement yet: refused, never ignored.
    pub fn not_supported_yet(&mut self, field: &Path, what: &str) {
        self.forbidden(field, format!("{what} is not supported yet; remove this field"));
    }
}

impl fmt::Display for ErrorList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.as_slice() {
            [] => Ok(()),
            [one] => write!(f, "{one}"),
            many => {
                f.write_str("[")?;
                for (i, e) in many.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{e}")?;
                }
                f.write_str("]")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_messages_look_like_kubernetes() {
        let p = Path::new("spec").child("members").index(2).child("extraEnv").key("FOO");
        assert_eq!(p.as_str(), "spec.members[2].extraEnv[FOO]");
        let mut errs = ErrorList::new();
        errs.invalid(
            &Path::new("spec").child("size"),
            -1,
            "must be greater than or equal to 0",
        );
        errs.required(
            &Path::new("spec").child("connection"),
            "name one of managed or external",
        );
        assert_eq!(
            errs.0[0].message(),
            "Invalid value: -1: must be greater than or equal to 0"
        );
        assert_eq!(
            errs.to_string(),
            "[spec.size: Invalid value: -1: must be greater than or equal to 0, spec.connection: Required value: name one of managed or external]"
        );
        let obj = serde_json::json!({"spec": {"members": [{"nodeSelector": {"kubernetes.io/os": "linux"}}]}});
        let p = Path::new("spec")
            .child("members")
            .index(0)
            .child("nodeSelector")
            .key("kubernetes.io/os");
        assert_eq!(value_at(&obj, &p), Some(&serde_json::json!("linux")));
        assert_eq!(value_at(&obj, &Path::new("spec").child("missing")), None);
        let name = Path::new("spec").child("domain").child("name");
        let mut errs = ErrorList::new();
        errs.duplicate(&name, "default", "already claimed");
        errs.duplicate(&Path::new("spec").child("set"), "x", "also taken");
        let sent = serde_json::json!({"spec": {"domain": {}, "set": "x"}});
        let defaulted = serde_json::json!({"spec": {"domain": {"name": "default"}, "set": "x"}});
        assert_eq!(
            errs.name_defaulted(&sent, &defaulted).to_string(),
            "[spec.domain.name: Duplicate value: \"default\": already claimed (\"default\" is the default: the \
             request does not set spec.domain.name; set spec.domain.name to choose another value), \
             spec.set: Duplicate value: \"x\": also taken]"
        );
        let mut e = ErrorList::new();
        e.not_supported(&Path::new("spec.type"), "Redis", &["Mooncake"]);
        assert_eq!(
            e.to_string(),
            r#"spec.type: Unsupported value: "Redis": supported values: "Mooncake""#
        );
    }
}
