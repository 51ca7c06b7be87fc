//! `kubectl get` output: the `meta.k8s.io/v1` Table, the columns every kind starts and ends with
//! (`NAME`, `AGE`), and the human-readable ages kubectl prints verbatim. Each kind's own columns
//! are in the table of kinds ([`crate::registry::kinds`]).

use serde_json::{Value, json};

/// One printed column: where its cell comes from.
#[derive(Debug, Clone, Copy)]
pub struct Column {
    pub name: &'static str,
    /// `string`, `integer`, `date`.
    pub type_: &'static str,
    pub description: &'static str,
    /// 0 shows by default; 1 only with `-o wide`.
    pub priority: u8,
    pub cell: fn(&Value) -> Value,
}

const NAME_DESCRIPTION: &str = "Name must be unique within a namespace. Cannot be updated.";
const AGE_DESCRIPTION: &str = "CreationTimestamp is the time the object was created, shown as an age.";

pub fn at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(v, |v, k| v.get(k))
}

/// A string (or number) at `path`, or an empty cell.
pub fn text(v: &Value, path: &[&str]) -> Value {
    match at(v, path) {
        Some(Value::String(s)) => Value::String(s.clone()),
        Some(Value::Number(n)) => Value::String(n.to_string()),
        Some(Value::Bool(b)) => Value::String(b.to_string()),
        _ => Value::String(String::new()),
    }
}

fn name_cell(v: &Value) -> Value {
    text(v, &["metadata", "name"])
}

fn age_cell(v: &Value) -> Value {
    let created = at(v, &["metadata", "creationTimestamp"]).and_then(Value::as_str);
    let age = created
        .and_then(|c| c.parse::<k8s_openapi::jiff::Timestamp>().ok())
        .map(|t| {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(0));
            let secs = now - t.as_second();
            human_duration(secs.max(0).unsigned_abs())
        });
    Value::String(age.unwrap_or_else(|| "<unknown>".to_owned()))
}

/// The `NAME` column every kind starts with.
pub const NAME: Column = Column {
    name: "Name",
    type_: "string",
    description: NAME_DESCRIPTION,
    priority: 0,
    cell: name_cell,
};

/// The `AGE` column; `priority` 1 shows it only with `-o wide`.
pub const fn age(priority: u8) -> Column {
    Column {
        name: "Age",
        type_: "date",
        description: AGE_DESCRIPTION,
        priority,
        cell: age_cell,
    }
}

/// A string column.
pub const fn col(name: &'static str, description: &'static str, cell: fn(&Value) -> Value) -> Column {
    Column {
        name,
        type_: "string",
        description,
        priority: 0,
        cell,
    }
}

/// What each row carries besides its cells (`?includeObject=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IncludeObject {
    #[default]
    Metadata,
    Object,
    None,
}

impl IncludeObject {
    pub fn parse(s: &str) -> Option<IncludeObject> {
        match s {
            "" | "Metadata" => Some(IncludeObject::Metadata),
            "Object" => Some(IncludeObject::Object),
            "None" => Some(IncludeObject::None),
            _ => None,
        }
    }
}

/// The column definitions of a Table.
pub fn column_definitions(columns: &[Column]) -> Value {
    Value::Array(
        columns
            .iter()
            .map(|c| {
                json!({
                    "name": c.name,
                    "type": c.type_,
                    "format": if c.name == "Name" { "name" } else { "" },
                    "description": c.description,
                    "priority": c.priority,
                })
            })
            .collect(),
    )
}

/// One row for `obj`.
pub fn row(columns: &[Column], obj: &Value, include: IncludeObject) -> Value {
    let cells: Vec<Value> = columns.iter().map(|c| (c.cell)(obj)).collect();
    let mut row = json!({ "cells": cells });
    match include {
        IncludeObject::Metadata => row["object"] = partial_object_metadata(obj),
        IncludeObject::Object => row["object"] = obj.clone(),
        IncludeObject::None => {}
    }
    row
}

/// `PartialObjectMetadata` of `obj`.
pub fn partial_object_metadata(obj: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata").cloned().unwrap_or_else(|| json!({})),
    })
}

/// A Table of `objects`. `headers` is false for the watch events after the first.
pub fn table(
    columns: &[Column],
    objects: &[Value],
    include: IncludeObject,
    resource_version: &str,
    continue_token: &str,
    headers: bool,
) -> Value {
    let mut t = json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version, "continue": continue_token},
        "rows": objects.iter().map(|o| row(columns, o, include)).collect::<Vec<_>>(),
    });
    if headers {
        t["columnDefinitions"] = column_definitions(columns);
    }
    t
}

/// apimachinery's `HumanDuration`: `45s`, `3m12s`, `59m`, `5h3m`, `20h`, `3d4h`, `300d`, `3y20d`.
pub fn human_duration(secs: u64) -> String {
    let (m, h, d) = (60, 3600, 86400);
    let y = 365 * d;
    if secs < 2 * m {
        format!("{secs}s")
    } else if secs < 10 * m {
        let s = secs % m;
        if s == 0 {
            format!("{}m", secs / m)
        } else {
            format!("{}m{s}s", secs / m)
        }
    } else if secs < 3 * h {
        format!("{}m", secs / m)
    } else if secs < 8 * h {
        let mm = (secs % h) / m;
        if mm == 0 {
            format!("{}h", secs / h)
        } else {
            format!("{}h{mm}m", secs / h)
        }
    } else if secs < 48 * h {
        format!("{}h", secs / h)
    } else if secs < 8 * d {
        let hh = (secs % d) / h;
        if hh == 0 {
            format!("{}d", secs / d)
        } else {
            format!("{}d{hh}h", secs / d)
        }
    } else if secs < 2 * y {
        format!("{}d", secs / d)
    } else if secs < 8 * y {
        let dd = (secs % y) / d;
        if dd == 0 {
            format!("{}y", secs / y)
        } else {
            format!("{}y{dd}d", secs / y)
        }
    } else {
        format!("{}y", secs / y)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_durations_follow_apimachinery() {
        let cases = [
            (0, "0s"),
            (119, "119s"),
            (120, "2m"),
            (192, "3m12s"),
            (3599, "59m"),
            (5 * 3600 + 180, "5h3m"),
            (20 * 3600, "20h"),
            (3 * 86400 + 4 * 3600, "3d4h"),
            (300 * 86400, "300d"),
            (3 * 365 * 86400 + 20 * 86400, "3y20d"),
            (9 * 365 * 86400, "9y"),
        ];
        for (secs, want) in cases {
            assert_eq!(human_duration(secs), want, "{secs}");
        }
    }
}
