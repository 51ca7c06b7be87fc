//! `get`: one object, as JSON, a Table or partial metadata.

use std::sync::Arc;

use axum::extract::State;
use serde_json::Value;

use super::Api;
use super::params;
use super::response::{self, encode, registry_error};
use super::target::{Reply, Target};
use crate::negotiate::{self, Shape};
use crate::table;

pub async fn handle(State(_api): State<Arc<Api>>, t: Target) -> Reply {
    let include = params::include_object(t.query())?;
    let obj = t
        .resource
        .get(&t.namespace, &t.name)
        .await
        .map_err(|e| registry_error(t.kind, &t.name, &e))?;
    Ok(match t.shape {
        Shape::Table => {
            let rv = obj
                .pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let tbl = table::table(t.kind.columns, std::slice::from_ref(&obj), include, rv, "", true);
            response::bytes(200, &negotiate::content_type(Shape::Table), encode(&tbl, t.pretty))
        }
        Shape::PartialObjectMetadata => response::bytes(
            200,
            "application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io",
            encode(&table::partial_object_metadata(&obj), t.pretty),
        ),
        _ => response::json(200, encode(&obj, t.pretty)),
    })
}
