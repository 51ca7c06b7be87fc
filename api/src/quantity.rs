//! Kubernetes `resource.Quantity` on the wire: kept exactly as the user wrote it, parsed by the
//! one exact parser every binary shares (`kvcache_units::quantity`).
//!
//! The wire form is a string (`8Gi`, `1.5G`, `100m`, `1e3`); a JSON number is accepted too and
//! kept as its decimal text, as kube-apiserver does for int-or-string quantities. Parsing is exact:
//! `1Gi` and `1024Mi` compare equal, and a byte count above `i64::MAX` is reported as an overflow
//! rather than silently rounded.

use std::borrow::Cow;
use std::fmt;

pub use kvcache_units::quantity::{ParsedQuantity, QuantityError};

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A quantity as it appears on the wire. Parse it with [`Quantity::parse`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Quantity(pub String);

impl Quantity {
    pub fn new(s: impl Into<String>) -> Self {
        Quantity(s.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Parses the wire form into an exact value.
    pub fn parse(&self) -> Result<ParsedQuantity, QuantityError> {
        ParsedQuantity::parse(&self.0)
    }

    /// The canonical binary-SI spelling of a byte count: the largest power-of-1024 suffix that
    /// divides it exactly (`8589934592` → `8Gi`, `1536Mi` stays `1536Mi`, `1000` stays `1000`).
    pub fn from_bytes(bytes: i64) -> Quantity {
        Quantity(kvcache_units::format_bytes(bytes))
    }
}

impl From<&str> for Quantity {
    fn from(s: &str) -> Self {
        Quantity(s.to_owned())
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for Quantity {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Quantity {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Quantity;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a quantity as a string (\"8Gi\") or a number")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Quantity, E> {
                Ok(Quantity(v.to_owned()))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Quantity, E> {
                Ok(Quantity(v.to_string()))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Quantity, E> {
                Ok(Quantity(v.to_string()))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Quantity, E> {
                if v.is_finite() {
                    Ok(Quantity(v.to_string()))
                } else {
                    Err(E::custom("a quantity must be a finite number"))
                }
            }
        }
        d.deserialize_any(Visitor)
    }
}

impl JsonSchema for Quantity {
    fn schema_name() -> Cow<'static, str> {
        "Quantity".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "A Kubernetes quantity such as 8Gi, 512Mi or 1e9.",
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "x-kubernetes-int-or-string": true
        })
    }
}

/// Semantic equality of two optional quantities: `1Gi` equals `1024Mi`; unparsable values are
/// compared by spelling.
pub fn same_quantity(a: Option<&Quantity>, b: Option<&Quantity>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => match (a.parse(), b.parse()) {
            (Ok(pa), Ok(pb)) => pa == pb,
            _ => a.0 == b.0,
        },
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn semantic_equality() {
        assert!(same_quantity(
            Some(&Quantity::new("8Gi")),
            Some(&Quantity::new("8192Mi"))
        ));
        assert!(!same_quantity(Some(&Quantity::new("1G")), Some(&Quantity::new("1Gi"))));
        assert!(same_quantity(Some(&Quantity::new("x")), Some(&Quantity::new("x"))));
        assert!(!same_quantity(None, Some(&Quantity::new("1"))));
    }

    #[test]
    fn canonical_binary_spelling() {
        assert_eq!(Quantity::from_bytes(8 << 30).0, "8Gi");
        assert_eq!(Quantity::from_bytes(1536 << 20).0, "1536Mi");
    }

    #[test]
    fn numbers_decode_as_quantities() {
        let q: Quantity = serde_json::from_str("8589934592").unwrap();
        assert_eq!(q.0, "8589934592");
        let q: Quantity = serde_json::from_str("\"8Gi\"").unwrap();
        assert_eq!(serde_json::to_string(&q).unwrap(), "\"8Gi\"");
    }
}
