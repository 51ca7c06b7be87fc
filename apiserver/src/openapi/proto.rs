//! The protobuf form of the OpenAPI v2 document (gnostic's `openapi.v2.Document`), encoded by
//! hand from the JSON document: kubectl 1.27 and 1.28 read nothing else before `apply`,
//! `create` and `explain`, and `kubectl explain --output=plaintext-openapiv2` reads the
//! definitions from it.
//!
//! Only what clients read is encoded: `swagger`, `info`, and `definitions` with every schema
//! keyword our documents use (vendor extensions included). Field numbers follow gnostic's
//! `openapiv2/OpenAPIv2.proto`.

use serde_json::{Map, Value};

/// Protobuf wire writer.
#[derive(Default)]
struct Writer(Vec<u8>);

impl Writer {
    fn varint(&mut self, mut v: u64) {
        loop {
            let byte = u8::try_from(v & 0x7f).unwrap_or(0);
            v >>= 7;
            if v == 0 {
                self.0.push(byte);
                return;
            }
            self.0.push(byte | 0x80);
        }
    }

    fn tag(&mut self, field: u32, wire: u8) {
        self.varint((u64::from(field) << 3) | u64::from(wire));
    }

    fn bytes(&mut self, field: u32, b: &[u8]) {
        self.tag(field, 2);
        self.varint(b.len() as u64);
        self.0.extend_from_slice(b);
    }

    fn string(&mut self, field: u32, s: &str) {
        self.bytes(field, s.as_bytes());
    }

    fn message(&mut self, field: u32, m: Writer) {
        self.bytes(field, &m.0);
    }

    fn int64(&mut self, field: u32, v: i64) {
        self.tag(field, 0);
        self.varint(v as u64);
    }

    fn double(&mut self, field: u32, v: f64) {
        self.tag(field, 1);
        self.0.extend_from_slice(&v.to_le_bytes());
    }

    fn boolean(&mut self, field: u32, v: bool) {
        self.tag(field, 0);
        self.varint(u64::from(v));
    }
}

/// `Any { yaml: <value as YAML> }`; JSON text is valid YAML.
fn any(v: &Value) -> Writer {
    let mut w = Writer::default();
    w.string(2, &serde_json::to_string(v).unwrap_or_default());
    w
}

fn named_any(name: &str, v: &Value) -> Writer {
    let mut w = Writer::default();
    w.string(1, name);
    w.message(2, any(v));
    w
}

fn named_schema(name: &str, schema: &Value) -> Writer {
    let mut w = Writer::default();
    w.string(1, name);
    w.message(2, schema_message(schema));
    w
}

/// A `Schema` message from a JSON schema in the v2 dialect.
fn schema_message(schema: &Value) -> Writer {
    let mut w = Writer::default();
    let Value::Object(m) = schema else { return w };
    // The order the fields are written in is the document's bytes: keep it.
    annotations(&mut w, m);
    bounds(&mut w, m);
    str_field(&mut w, m, "pattern", 13);
    for r in m.get("required").and_then(Value::as_array).into_iter().flatten() {
        if let Some(s) = r.as_str() {
            w.string(19, s);
        }
    }
    for e in m.get("enum").and_then(Value::as_array).into_iter().flatten() {
        w.message(20, any(e));
    }
    additional_properties(&mut w, m);
    type_and_items(&mut w, m);
    for s in m.get("allOf").and_then(Value::as_array).into_iter().flatten() {
        w.message(24, schema_message(s));
    }
    if let Some(Value::Object(props)) = m.get("properties") {
        let mut p = Writer::default();
        for (name, s) in props {
            p.message(1, named_schema(name, s));
        }
        w.message(25, p);
    }
    for (k, v) in m.iter().filter(|(k, _)| k.starts_with("x-")) {
        w.message(31, named_any(k, v));
    }
    w
}

/// Writes string keyword `key` of schema `m`, if it has one, as `field`.
fn str_field(w: &mut Writer, m: &Map<String, Value>, key: &str, field: u32) {
    if let Some(s) = m.get(key).and_then(Value::as_str) {
        w.string(field, s);
    }
}

/// Writes `$ref`, `format`, `title`, `description` and `default` (fields 1 to 5).
fn annotations(w: &mut Writer, m: &Map<String, Value>) {
    str_field(w, m, "$ref", 1);
    str_field(w, m, "format", 2);
    str_field(w, m, "title", 3);
    str_field(w, m, "description", 4);
    if let Some(d) = m.get("default") {
        w.message(5, any(d));
    }
}

/// Writes the numeric, boolean and size bounds (and `uniqueItems`, `readOnly`).
fn bounds(w: &mut Writer, m: &Map<String, Value>) {
    for (key, field) in [("multipleOf", 6), ("maximum", 7), ("minimum", 9)] {
        if let Some(n) = m.get(key).and_then(Value::as_f64) {
            w.double(field, n);
        }
    }
    for (key, field) in [
        ("exclusiveMaximum", 8),
        ("exclusiveMinimum", 10),
        ("uniqueItems", 16),
        ("readOnly", 27),
    ] {
        if let Some(b) = m.get(key).and_then(Value::as_bool) {
            w.boolean(field, b);
        }
    }
    for (key, field) in [
        ("maxLength", 11),
        ("minLength", 12),
        ("maxItems", 14),
        ("minItems", 15),
        ("maxProperties", 17),
        ("minProperties", 18),
    ] {
        if let Some(n) = m.get(key).and_then(Value::as_i64) {
            w.int64(field, n);
        }
    }
}

/// Writes `additionalProperties` (field 21): a boolean, or a schema.
fn additional_properties(w: &mut Writer, m: &Map<String, Value>) {
    match m.get("additionalProperties") {
        Some(Value::Bool(b)) => {
            let mut item = Writer::default();
            item.boolean(2, *b);
            w.message(21, item);
        }
        Some(s @ Value::Object(_)) => {
            let mut item = Writer::default();
            item.message(1, schema_message(s));
            w.message(21, item);
        }
        _ => {}
    }
}

/// Writes `type` (field 22) and `items` (field 23).
fn type_and_items(w: &mut Writer, m: &Map<String, Value>) {
    if let Some(t) = m.get("type") {
        let mut item = Writer::default();
        match t {
            Value::String(s) => item.string(1, s),
            Value::Array(a) => a.iter().filter_map(Value::as_str).for_each(|s| item.string(1, s)),
            _ => {}
        }
        w.message(22, item);
    }
    if let Some(items) = m.get("items") {
        let mut item = Writer::default();
        item.message(1, schema_message(items));
        w.message(23, item);
    }
}

/// The `Document` for a v2 JSON document.
pub fn document(v2: &Value) -> Vec<u8> {
    let mut w = Writer::default();
    w.string(1, v2.get("swagger").and_then(Value::as_str).unwrap_or("2.0"));
    let mut info = Writer::default();
    let info_json = v2.get("info").cloned().unwrap_or_default();
    info.string(
        1,
        info_json.get("title").and_then(Value::as_str).unwrap_or("Kubernetes"),
    );
    info.string(2, info_json.get("version").and_then(Value::as_str).unwrap_or("v1"));
    w.message(2, info);
    let empty = Map::new();
    let defs = v2.get("definitions").and_then(Value::as_object).unwrap_or(&empty);
    if !defs.is_empty() {
        let mut d = Writer::default();
        for (name, schema) in defs {
            d.message(1, named_schema(name, schema));
        }
        w.message(9, d);
    }
    w.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn empty_document_is_the_minimal_gnostic_document() {
        let doc = document(&json!({"swagger": "2.0", "info": {"title": "Kubernetes", "version": "v1"}}));
        assert_eq!(
            doc,
            [
                0x0a, 0x03, 0x32, 0x2e, 0x30, 0x12, 0x10, 0x0a, 0x0a, 0x4b, 0x75, 0x62, 0x65, 0x72, 0x6e, 0x65, 0x74,
                0x65, 0x73, 0x12, 0x02, 0x76, 0x31
            ]
        );
    }

    #[test]
    fn varints_and_nested_messages() {
        let mut w = Writer::default();
        w.varint(300);
        assert_eq!(w.0, [0xac, 0x02]);
        let doc = document(&json!({"swagger": "2.0", "info": {"title": "K", "version": "v1"},
            "definitions": {"A": {"type": "object", "properties": {"x": {"type": "string"}}}}}));
        // definitions (field 9, length-delimited) follow swagger and info.
        assert!(doc.windows(1).any(|w| w[0] == (9 << 3 | 2)));
    }
}
