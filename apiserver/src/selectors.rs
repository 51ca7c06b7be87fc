//! Label and field selectors: the string grammar of `labelSelector` and `fieldSelector`, and
//! matching against an object's metadata.
//!
//! Labels: `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k`, `!k`, `k>n`, `k<n`,
//! joined by commas (AND). Fields: `metadata.name` and `metadata.namespace` with `=`, `==`, `!=`.

use std::collections::BTreeMap;

/// A parse error, worded for the client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SelectorError(pub String);

#[derive(Debug, Clone, PartialEq, Eq)]
enum LabelOp {
    Eq(String),
    NotEq(String),
    In(Vec<String>),
    NotIn(Vec<String>),
    Exists,
    NotExists,
    Gt(i64),
    Lt(i64),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct LabelRequirement {
    key: String,
    op: LabelOp,
}

/// A parsed label selector; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    requirements: Vec<LabelRequirement>,
}

impl LabelSelector {
    pub fn parse(s: &str) -> Result<LabelSelector, SelectorError> {
        let mut requirements = Vec::new();
        for term in split_terms(s)? {
            let term = term.trim();
            if term.is_empty() {
                continue;
            }
            requirements.push(parse_label_term(term)?);
        }
        Ok(LabelSelector { requirements })
    }

    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    pub fn matches(&self, labels: Option<&BTreeMap<String, String>>) -> bool {
        self.requirements.iter().all(|r| {
            let v = labels.and_then(|l| l.get(&r.key));
            match &r.op {
                LabelOp::Eq(want) => v == Some(want),
                LabelOp::NotEq(want) => v != Some(want),
                LabelOp::In(set) => v.is_some_and(|v| set.contains(v)),
                LabelOp::NotIn(set) => !v.is_some_and(|v| set.contains(v)),
                LabelOp::Exists => v.is_some(),
                LabelOp::NotExists => v.is_none(),
                LabelOp::Gt(n) => v.and_then(|v| v.parse::<i64>().ok()).is_some_and(|v| v > *n),
                LabelOp::Lt(n) => v.and_then(|v| v.parse::<i64>().ok()).is_some_and(|v| v < *n),
            }
        })
    }
}

/// Splits on commas that are not inside parentheses.
fn split_terms(s: &str) -> Result<Vec<&str>, SelectorError> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth < 0 {
                    return Err(SelectorError(format!(
                        "unable to parse requirement: unbalanced ')' in {s:?}"
                    )));
                }
            }
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(SelectorError(format!(
            "unable to parse requirement: unbalanced '(' in {s:?}"
        )));
    }
    out.push(&s[start..]);
    Ok(out)
}

fn parse_label_term(term: &str) -> Result<LabelRequirement, SelectorError> {
    let bad = |why: &str| SelectorError(format!("unable to parse requirement: {term:?}: {why}"));
    if let Some(key) = term.strip_prefix('!') {
        let key = check_key(key.trim()).map_err(|e| bad(&e))?;
        return Ok(LabelRequirement {
            key,
            op: LabelOp::NotExists,
        });
    }
    // Set operators: `key in (...)` / `key notin (...)`.
    let words: Vec<&str> = term.splitn(2, char::is_whitespace).collect();
    if words.len() == 2 {
        let rest = words[1].trim_start();
        for (word, negate) in [("notin", true), ("in", false)] {
            if let Some(list) = rest.strip_prefix(word) {
                let list = list.trim();
                let inner = list
                    .strip_prefix('(')
                    .and_then(|l| l.strip_suffix(')'))
                    .ok_or_else(|| bad("expected a parenthesised list of values"))?;
                let values = inner
                    .split(',')
                    .map(|v| check_value(v.trim()).map_err(|e| bad(&e)))
                    .collect::<Result<Vec<_>, _>>()?;
                let key = check_key(words[0]).map_err(|e| bad(&e))?;
                let op = if negate {
                    LabelOp::NotIn(values)
                } else {
                    LabelOp::In(values)
                };
                return Ok(LabelRequirement { key, op });
            }
        }
    }
    for (sym, kind) in [("==", 0), ("!=", 1), ("=", 0), (">", 2), ("<", 3)] {
        if let Some((k, v)) = term.split_once(sym) {
            let key = check_key(k.trim()).map_err(|e| bad(&e))?;
            let v = v.trim();
            let op = match kind {
                0 => LabelOp::Eq(check_value(v).map_err(|e| bad(&e))?),
                1 => LabelOp::NotEq(check_value(v).map_err(|e| bad(&e))?),
                2 => LabelOp::Gt(v.parse().map_err(|_| bad("'>' needs an integer"))?),
                _ => LabelOp::Lt(v.parse().map_err(|_| bad("'<' needs an integer"))?),
            };
            return Ok(LabelRequirement { key, op });
        }
    }
    let key = check_key(term).map_err(|e| bad(&e))?;
    Ok(LabelRequirement {
        key,
        op: LabelOp::Exists,
    })
}

fn check_key(k: &str) -> Result<String, String> {
    let ok = !k.is_empty()
        && k.len() <= 317
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
    if ok {
        Ok(k.to_owned())
    } else {
        Err(format!("invalid label key {k:?}"))
    }
}

fn check_value(v: &str) -> Result<String, String> {
    let ok = v.len() <= 63
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(v.to_owned())
    } else {
        Err(format!("invalid label value {v:?}"))
    }
}

/// The fields a kind can be selected by: each name a client sends, and the JSON path in the
/// object it reads (Events select `source` by `source.component`).
#[derive(Debug, Clone, Copy)]
pub struct SelectableFields {
    /// What the kind is called in a refusal that lists the fields (`events can be selected by
    /// ...`); empty: the refusal is kube-apiserver's own words, without the list.
    pub what: &'static str,
    pub fields: &'static [(&'static str, &'static [&'static str])],
    /// A term with no operator matches an empty value (kubectl 1.27 sends `involvedObject.uid`
    /// for an empty UID); otherwise it is refused.
    pub bare_term_is_empty: bool,
}

/// What every kind can be selected by: `metadata.name` and `metadata.namespace`.
pub const METADATA_FIELDS: SelectableFields = SelectableFields {
    what: "",
    fields: &[
        ("metadata.name", &["metadata", "name"]),
        ("metadata.namespace", &["metadata", "namespace"]),
    ],
    bare_term_is_empty: false,
};

#[derive(Debug, Clone, PartialEq, Eq)]
struct FieldRequirement {
    path: &'static [&'static str],
    value: String,
    equal: bool,
}

/// A parsed field selector: `field=value`, `field==value` and `field!=value` terms over a kind's
/// [`SelectableFields`], all of which must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector {
    requirements: Vec<FieldRequirement>,
}

const NAME: &[&str] = &["metadata", "name"];
const NAMESPACE: &[&str] = &["metadata", "namespace"];

impl FieldSelector {
    /// A selector over `metadata.name` and `metadata.namespace`.
    pub fn parse(s: &str) -> Result<FieldSelector, SelectorError> {
        FieldSelector::parse_for(s, &METADATA_FIELDS)
    }

    /// A selector over the fields `kind` offers.
    pub fn parse_for(s: &str, kind: &SelectableFields) -> Result<FieldSelector, SelectorError> {
        let mut requirements = Vec::new();
        for term in s.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (field, value, equal) = if let Some((f, v)) = term.split_once("!=") {
                (f, v, false)
            } else if let Some((f, v)) = term.split_once("==") {
                (f, v, true)
            } else if let Some((f, v)) = term.split_once('=') {
                (f, v, true)
            } else if kind.bare_term_is_empty {
                (term, "", true)
            } else {
                return Err(SelectorError(format!(
                    "invalid selector: {term:?}; a field selector is field=value, field==value or field!=value"
                )));
            };
            let field = field.trim();
            let Some((_, path)) = kind.fields.iter().find(|(n, _)| n.eq_ignore_ascii_case(field)) else {
                let names: Vec<&str> = kind.fields.iter().map(|(n, _)| *n).collect();
                let hint = if kind.what.is_empty() {
                    String::new()
                } else {
                    format!("; {} can be selected by {}", kind.what, names.join(", "))
                };
                return Err(SelectorError(format!("field label not supported: {field}{hint}")));
            };
            requirements.push(FieldRequirement {
                path,
                value: value.trim().to_owned(),
                equal,
            });
        }
        Ok(FieldSelector { requirements })
    }

    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// Whether an object of this `name` and `namespace` matches (a selector over the metadata).
    pub fn matches(&self, name: &str, namespace: &str) -> bool {
        self.requirements.iter().all(|r| {
            let v = match r.path {
                NAME => name,
                NAMESPACE => namespace,
                _ => "",
            };
            (v == r.value) == r.equal
        })
    }

    /// Whether the JSON object matches (an absent field reads as empty).
    pub fn matches_json(&self, object: &serde_json::Value) -> bool {
        self.requirements.iter().all(|r| {
            let have = r
                .path
                .iter()
                .try_fold(object, |v, k| v.get(*k))
                .and_then(serde_json::Value::as_str)
                .unwrap_or_default();
            (have == r.value) == r.equal
        })
    }

    /// The exact name this selector pins, if any (`metadata.name=x`): a get instead of a scan.
    pub fn exact_name(&self) -> Option<&str> {
        self.requirements
            .iter()
            .find(|r| r.path == NAME && r.equal)
            .map(|r| r.value.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn label_operators() {
        let l = labels(&[("app", "x"), ("tier", "web"), ("n", "5")]);
        let cases = [
            ("app=x", true),
            ("app==x", true),
            ("app!=x", false),
            ("app=x,tier!=db", true),
            ("tier in (web,db)", true),
            ("tier notin (web,db)", false),
            ("env notin (a)", true),
            ("app", true),
            ("!app", false),
            ("!env", true),
            ("n>4", true),
            ("n<4", false),
            ("", true),
            ("env in (a, b),app=x", false),
        ];
        for (sel, want) in cases {
            let s = LabelSelector::parse(sel).unwrap();
            assert_eq!(s.matches(Some(&l)), want, "{sel}");
        }
        assert!(LabelSelector::parse("!app").unwrap().matches(None));
    }

    #[test]
    fn bad_label_selectors_are_refused() {
        for sel in ["app=(", "a b c", "tier in web", "app=x y", "n>x", "k in (a"] {
            assert!(LabelSelector::parse(sel).is_err(), "{sel}");
        }
    }

    #[test]
    fn field_selectors() {
        let s = FieldSelector::parse("metadata.name=a1").unwrap();
        assert!(s.matches("a1", "ns"));
        assert!(!s.matches("a2", "ns"));
        assert_eq!(s.exact_name(), Some("a1"));
        let s = FieldSelector::parse("metadata.namespace!=kube-system,metadata.name==b").unwrap();
        assert!(s.matches("b", "default"));
        assert!(!s.matches("b", "kube-system"));
        let e = FieldSelector::parse("spec.foo=1").unwrap_err();
        assert_eq!(e.0, "field label not supported: spec.foo");
    }
}
