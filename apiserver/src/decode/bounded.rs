//! Bodies (JSON or YAML) → `serde_json::Value`, within bounds, noting duplicate keys.
//!
//! Every value the server builds from client input is bounded here: how deep it nests and how
//! much it holds once built. The size is charged as the value is built, each node as it is made:
//! its JSON text plus the memory the node itself takes (a `Value`, and a map entry's key), so a
//! YAML alias referenced a thousand times counts a thousand times, and many tiny nodes count what
//! they cost in memory, not only their few bytes of text. An anchored 64 KiB string referenced
//! 3,000 times is refused after a few dozen expansions instead of building 200 MB, and a list of
//! 2,000 one-letter items referenced 2,000 times after about 300,000 items instead of 4 million
//! (peak memory stays within a small multiple of [`MAX_BUILT_BYTES`]). Nothing here recurses
//! deeper than [`MAX_DEPTH`], so no input can overflow the stack, however it is shaped.
//!
//! Duplicate keys in one object are reported with their path (`metadata.name`): JSON and YAML
//! parsers keep the last value silently, so `fieldValidation=Strict` refuses them and `Warn` warns.

use std::cell::{Cell, RefCell};
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// Deepest nesting a built value may have (the JSON parser's own limit is 128 too).
pub const MAX_DEPTH: usize = 128;

/// Most a built value may hold, counted as its JSON text plus each node's own memory (four times
/// the largest body accepted, 3 MiB, which is room for YAML's verbosity but not for an alias
/// bomb).
pub const MAX_BUILT_BYTES: usize = 12 * 1024 * 1024;

/// What one node of a built value takes in memory besides its text: the `Value` itself.
const NODE: usize = std::mem::size_of::<Value>();
/// What one map entry takes besides its key's text and its value: the key's `String` and the
/// map's own bookkeeping for the entry.
const ENTRY: usize = std::mem::size_of::<String>() + 2 * std::mem::size_of::<usize>();

/// A parsed body.
#[derive(Debug, Clone, PartialEq)]
pub struct Parsed {
    pub value: Value,
    /// Paths of keys that appeared twice in one object (`metadata.name`), in document order.
    pub duplicates: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BoundedError {
    /// Not well-formed JSON or YAML (400).
    #[error("{0}")]
    Syntax(String),
    /// Nested deeper than [`MAX_DEPTH`] (422 in Kubernetes' terms; we answer 400 with the path).
    #[error("the body nests deeper than {MAX_DEPTH} levels at {0}")]
    TooDeep(String),
    /// Would build more than [`MAX_BUILT_BYTES`] (413).
    #[error(
        "the body would build more than {MAX_BUILT_BYTES} bytes once parsed (YAML aliases count each time they are used)"
    )]
    TooLarge,
}

/// Parses a JSON body. JSON cannot build more than it says (it has no aliases) and its parser
/// stops at 128 levels, so the common case is serde_json's own parse; only a body that repeats a
/// key is parsed again, with paths, to name them.
pub fn json(bytes: &[u8]) -> Result<Parsed, BoundedError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let mut repeated = false;
    let value = DupCheck(&mut repeated)
        .deserialize(&mut de)
        .map_err(|e| BoundedError::Syntax(format!("the body is not valid JSON: {e}")))?;
    de.end()
        .map_err(|e| BoundedError::Syntax(format!("trailing data after the JSON object: {e}")))?;
    if !repeated {
        return Ok(Parsed {
            value,
            duplicates: Vec::new(),
        });
    }
    let state = State::default();
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = Seed {
        state: &state,
        depth: 0,
    }
    .deserialize(&mut de)
    .map_err(|e| state.classify(format!("the body is not valid JSON: {e}")))?;
    Ok(state.finish(value))
}

/// Builds a value as serde_json does, noting whether any object repeats a key.
struct DupCheck<'a>(&'a mut bool);

impl<'de> DeserializeSeed<'de> for DupCheck<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for DupCheck<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(DupCheck(&mut *self.0))? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let value = map.next_value_seed(DupCheck(&mut *self.0))?;
            if out.insert(key, value).is_some() {
                *self.0 = true;
            }
        }
        Ok(Value::Object(out))
    }
}

/// Parses one YAML document (a JSON body is YAML too).
pub fn yaml(text: &str) -> Result<Parsed, BoundedError> {
    let state = State::default();
    let value = Seed {
        state: &state,
        depth: 0,
    }
    .deserialize(yaml_serde::Deserializer::from_str(text))
    .map_err(|e| state.classify(format!("the body is not valid YAML: {e}")))?;
    Ok(state.finish(value))
}

/// Parses a stream of YAML documents (`---` separated); empty documents are skipped. The size
/// bound applies to the whole stream.
pub fn yaml_documents(text: &str) -> Result<Vec<Parsed>, BoundedError> {
    let state = State::default();
    let mut out = Vec::new();
    for doc in yaml_serde::Deserializer::from_str(text) {
        let value = Seed {
            state: &state,
            depth: 0,
        }
        .deserialize(doc)
        .map_err(|e| state.classify(format!("not valid YAML: {e}")))?;
        let duplicates = state.duplicates.take();
        state.path.borrow_mut().clear();
        if !value.is_null() {
            out.push(Parsed { value, duplicates });
        }
    }
    Ok(out)
}

/// What the seeds share while one body is parsed.
#[derive(Default)]
struct State {
    built: Cell<usize>,
    path: RefCell<Vec<Segment>>,
    duplicates: RefCell<Vec<String>>,
    /// Set when a bound (not the syntax) stopped the parse.
    exceeded: RefCell<Option<BoundedError>>,
}

enum Segment {
    Key(String),
    Index(usize),
}

impl State {
    fn charge<E: de::Error>(&self, bytes: usize) -> Result<(), E> {
        let total = self.built.get().saturating_add(bytes);
        self.built.set(total);
        if total > MAX_BUILT_BYTES {
            return Err(self.exceed(BoundedError::TooLarge));
        }
        Ok(())
    }

    fn exceed<E: de::Error>(&self, e: BoundedError) -> E {
        let message = e.to_string();
        self.exceeded.borrow_mut().get_or_insert(e);
        E::custom(message)
    }

    fn path_text(&self) -> String {
        let mut out = String::new();
        for seg in self.path.borrow().iter() {
            match seg {
                Segment::Key(k) => {
                    if !out.is_empty() {
                        out.push('.');
                    }
                    out.push_str(k);
                }
                Segment::Index(i) => out.push_str(&format!("[{i}]")),
            }
        }
        if out.is_empty() {
            "the top level".to_owned()
        } else {
            out
        }
    }

    fn classify(&self, syntax: String) -> BoundedError {
        self.exceeded
            .borrow_mut()
            .take()
            .unwrap_or(BoundedError::Syntax(syntax))
    }

    fn finish(&self, value: Value) -> Parsed {
        Parsed {
            value,
            duplicates: self.duplicates.take(),
        }
    }
}

/// Builds one value at `depth`.
#[derive(Clone, Copy)]
struct Seed<'a> {
    state: &'a State,
    depth: usize,
}

impl<'de> DeserializeSeed<'de> for Seed<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

/// Digits of an integer, as JSON would write it.
fn int_len(mut n: u64) -> usize {
    let mut len = 1;
    while n >= 10 {
        n /= 10;
        len += 1;
    }
    len
}

impl<'de> Visitor<'de> for Seed<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        self.state.charge(5 + NODE)?;
        Ok(Value::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        self.state.charge(int_len(v.unsigned_abs()) + 1 + NODE)?;
        Ok(Value::from(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        self.state.charge(int_len(v) + NODE)?;
        Ok(Value::from(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        self.state.charge(24 + NODE)?;
        // JSON has no NaN or infinity; YAML's `.nan` and `.inf` become null, as in Kubernetes.
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        self.state.charge(v.len() + 2 + NODE)?;
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        self.state.charge(v.len() + 2 + NODE)?;
        Ok(Value::String(v))
    }

    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        self.visit_unit()
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        self.deserialize(d)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        self.state.charge(4 + NODE)?;
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let child = self.nested::<A::Error>()?;
        self.state.charge(NODE)?;
        let mut out = Vec::new();
        loop {
            self.state.path.borrow_mut().push(Segment::Index(out.len()));
            let next = seq.next_element_seed(child);
            self.state.path.borrow_mut().pop();
            match next? {
                Some(v) => {
                    self.state.charge(1)?;
                    out.push(v);
                }
                None => break,
            }
        }
        Ok(Value::Array(out))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let child = self.nested::<A::Error>()?;
        self.state.charge(NODE)?;
        let mut out = Map::new();
        while let Some(key) = map.next_key_seed(KeySeed)? {
            self.state.charge(key.len() + 4 + ENTRY)?;
            // The key waits on the path while its value is built (errors name it), then moves
            // into the map: no copy.
            self.state.path.borrow_mut().push(Segment::Key(key));
            let value = map.next_value_seed(child);
            let key = match self.state.path.borrow_mut().pop() {
                Some(Segment::Key(k)) => k,
                _ => return Err(de::Error::custom("the body's nesting could not be followed")),
            };
            let value = value?;
            if out.contains_key(&key) {
                self.state.path.borrow_mut().push(Segment::Key(key));
                let at = self.state.path_text();
                let Some(Segment::Key(key)) = self.state.path.borrow_mut().pop() else {
                    return Err(de::Error::custom("the body's nesting could not be followed"));
                };
                self.state.duplicates.borrow_mut().push(at);
                out.insert(key, value);
                continue;
            }
            out.insert(key, value);
        }
        Ok(Value::Object(out))
    }
}

impl Seed<'_> {
    /// The seed for the children of a container at this depth.
    fn nested<E: de::Error>(self) -> Result<Self, E> {
        if self.depth + 1 > MAX_DEPTH {
            return Err(self.state.exceed(BoundedError::TooDeep(self.state.path_text())));
        }
        self.state.charge(2)?;
        Ok(Seed {
            state: self.state,
            depth: self.depth + 1,
        })
    }
}

/// A map key: a string, or (YAML) a scalar written as its text.
struct KeySeed;

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = String;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for KeySeed {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string key")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
        Ok(v.to_owned())
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<String, E> {
        Ok(v)
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<String, E> {
        Ok(v.to_string())
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<String, E> {
        Ok(v.to_string())
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<String, E> {
        Ok(v.to_string())
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<String, E> {
        Ok(v.to_string())
    }

    fn visit_unit<E: de::Error>(self) -> Result<String, E> {
        Ok("null".to_owned())
    }
}

/// How deep `v` nests, counted without recursion; stops counting past `limit`.
pub fn depth(v: &Value, limit: usize) -> usize {
    let mut deepest = 0;
    let mut stack = vec![(v, 0usize)];
    while let Some((v, d)) = stack.pop() {
        deepest = deepest.max(d);
        if deepest > limit {
            return deepest;
        }
        match v {
            Value::Array(a) => stack.extend(a.iter().map(|c| (c, d + 1))),
            Value::Object(m) => stack.extend(m.values().map(|c| (c, d + 1))),
            _ => {}
        }
    }
    deepest
}

/// What `v` takes written as JSON, counted without recursion; stops counting past `limit`.
pub fn size(v: &Value, limit: usize) -> usize {
    let mut total = 0usize;
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        total = total.saturating_add(match v {
            Value::Null | Value::Bool(_) => 5,
            Value::Number(_) => 8,
            Value::String(s) => s.len() + 2,
            Value::Array(a) => {
                stack.extend(a.iter());
                2 + a.len()
            }
            Value::Object(m) => {
                stack.extend(m.values());
                2 + m.keys().map(|k| k.len() + 4).sum::<usize>()
            }
        });
        if total > limit {
            return total;
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_and_yaml_parse_to_the_same_value() {
        let j = json(br#"{"a":[1,true,null,"x",-2,1.5],"b":{"c":{}}}"#).unwrap();
        let y = yaml("a: [1, true, null, x, -2, 1.5]\nb:\n  c: {}\n").unwrap();
        assert_eq!(j, y);
        assert!(j.duplicates.is_empty());
    }

    #[test]
    fn duplicate_keys_are_reported_with_their_path() {
        let p = json(br#"{"metadata":{"name":"a","name":"b"},"spec":{"x":[{"k":1,"k":2}]}}"#).unwrap();
        assert_eq!(p.duplicates, vec!["metadata.name", "spec.x[0].k"]);
        assert_eq!(
            p.value["metadata"]["name"], "b",
            "the last value wins, as in every parser"
        );
        let p = yaml("kind: A\nkind: B\n").unwrap();
        assert_eq!(p.duplicates, vec!["kind"]);
    }

    #[test]
    fn nesting_is_bounded_without_overflowing_the_stack() {
        let deep = "[".repeat(100_000);
        assert!(matches!(
            json(deep.as_bytes()),
            Err(BoundedError::Syntax(_) | BoundedError::TooDeep(_))
        ));
        let yaml_deep = format!("{}1{}", "[".repeat(5_000), "]".repeat(5_000));
        assert!(yaml(&yaml_deep).is_err());
        let ok = format!("{}1{}", "[".repeat(MAX_DEPTH - 2), "]".repeat(MAX_DEPTH - 2));
        assert!(yaml(&ok).is_ok());
    }

    #[test]
    fn alias_expansion_is_bounded() {
        // One 64 KiB anchored string referenced 3,000 times: 192 MiB once expanded.
        let mut text = format!("a: &big {}\nlist:\n", "x".repeat(64 << 10));
        for _ in 0..3000 {
            text.push_str("- *big\n");
        }
        assert_eq!(yaml(&text), Err(BoundedError::TooLarge));
        // A few references are fine.
        let small = format!("a: &s {}\nb: [*s, *s]\n", "y".repeat(1000));
        assert_eq!(yaml(&small).unwrap().value["b"][1].as_str().map(str::len), Some(1000));
    }

    #[test]
    fn documents_split_and_skip_empty_ones() {
        let docs = yaml_documents("a: 1\n---\n---\nb: 2\nb: 3\n").unwrap();
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[1].duplicates, vec!["b"]);
        assert!(docs[0].duplicates.is_empty());
    }

    #[test]
    fn counters_stop_early() {
        let v = json(br#"{"a":{"b":{"c":[1,2,3]}},"s":"0123456789"}"#).unwrap().value;
        assert_eq!(depth(&v, 100), 4);
        assert!(size(&v, 1000) < 100);
        assert!(size(&v, 10) > 10);
    }
}
