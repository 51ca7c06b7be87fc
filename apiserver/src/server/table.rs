//! `kubectl get` output: the `meta.k8s.io/v1` Table of each kind, its columns, and the
//! human-readable ages kubectl prints verbatim.

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

fn at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(v, |v, k| v.get(k))
}

/// A string (or number) at `path`, or an empty cell.
fn text(v: &Value, path: &[&str]) -> Value {
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

fn backend_endpoint(v: &Value) -> Value {
    let endpoints = at(v, &["status", "endpoints"]).and_then(Value::as_array);
    let pick = endpoints.and_then(|eps| {
        eps.iter()
            .find(|e| e.get("name").and_then(Value::as_str) == Some("Client"))
            .or_else(|| eps.first())
    });
    pick.map_or_else(|| Value::String(String::new()), |e| text(e, &["address"]))
}

const NAME: Column = Column {
    name: "Name",
    type_: "string",
    description: NAME_DESCRIPTION,
    priority: 0,
    cell: name_cell,
};

const fn age(priority: u8) -> Column {
    Column {
        name: "Age",
        type_: "date",
        description: AGE_DESCRIPTION,
        priority,
        cell: age_cell,
    }
}

const fn col(name: &'static str, description: &'static str, cell: fn(&Value) -> Value) -> Column {
    Column {
        name,
        type_: "string",
        description,
        priority: 0,
        cell,
    }
}

pub const BACKEND_COLUMNS: &[Column] = &[
    NAME,
    col("Type", "spec.type", |v| text(v, &["spec", "type"])),
    col("Phase", "status.phase", |v| text(v, &["status", "phase"])),
    col("Endpoint", "status.endpoints (the Client endpoint)", backend_endpoint),
    col("Capacity", "status.capacity.total", |v| {
        text(v, &["status", "capacity", "total"])
    }),
    age(1),
];

pub const POOL_COLUMNS: &[Column] = &[
    NAME,
    col("Quota", "spec.quota.total", |v| text(v, &["spec", "quota", "total"])),
    col("Usage", "status.usage.total", |v| {
        text(v, &["status", "usage", "total"])
    }),
    col("Phase", "status.phase", |v| text(v, &["status", "phase"])),
    col("Endpoint", "status.clientEndpoint", |v| {
        text(v, &["status", "clientEndpoint"])
    }),
    age(0),
];

pub const BINDING_COLUMNS: &[Column] = &[
    NAME,
    col("Pool", "spec.poolRef.name", |v| text(v, &["spec", "poolRef", "name"])),
    col("Domain", "spec.domain.name", |v| text(v, &["spec", "domain", "name"])),
    col("Effective", "status.effectiveQuota", |v| {
        text(v, &["status", "effectiveQuota"])
    }),
    col("Usage", "status.usage", |v| text(v, &["status", "usage"])),
    col("Phase", "status.phase", |v| text(v, &["status", "phase"])),
    age(0),
];

pub const MODEL_DEPLOYMENT_COLUMNS: &[Column] = &[
    NAME,
    col("Engine", "spec.engine.name", |v| text(v, &["spec", "engine", "name"])),
    col("Roles", "status.roleSummary", |v| text(v, &["status", "roleSummary"])),
    col("Phase", "status.phase", |v| text(v, &["status", "phase"])),
    col("Endpoint", "status.endpoint", |v| text(v, &["status", "endpoint"])),
    age(0),
];

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

    #[test]
    fn backend_row_has_empty_cells_for_missing_status() {
        let obj = json!({"metadata": {"name": "m", "creationTimestamp": "2020-01-01T00:00:00Z"}, "spec": {"type": "Mooncake"}});
        let r = row(BACKEND_COLUMNS, &obj, IncludeObject::Metadata);
        assert_eq!(r["cells"][0], "m");
        assert_eq!(r["cells"][1], "Mooncake");
        assert_eq!(r["cells"][2], "");
        assert_eq!(r["cells"][3], "");
        assert_eq!(r["object"]["kind"], "PartialObjectMetadata");
        let obj = json!({"metadata": {"name": "m"}, "status": {"endpoints": [
            {"name": "Admin", "address": "a:1"}, {"name": "Client", "address": "c:2"}]}});
        assert_eq!(backend_endpoint(&obj), "c:2");
    }
}
