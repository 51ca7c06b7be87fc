//! `list`: a page of a kind's objects, consistent at one revision, as JSON (stored bytes spliced
//! together, the common case of kubectl and informers), a Table or partial metadata.

use std::sync::Arc;

use axum::extract::State;
use serde_json::json;

use super::Api;
use super::params;
use super::response::{self, encode, registry_error};
use super::target::{Reply, Target};
use crate::negotiate::{self, Shape};
use crate::table;

pub async fn handle(State(_api): State<Arc<Api>>, t: Target) -> Reply {
    let include = params::include_object(t.query())?;
    let list_params = params::list(t.query(), t.kind)?;
    let ns = t.list_namespace();
    let api_version = kvcache_api::API_VERSION;
    if t.shape == Shape::Json && !t.pretty {
        let page = t
            .resource
            .list_json(ns, list_params)
            .await
            .map_err(|e| registry_error(t.kind, "", &e))?;
        let mut meta = json!({"resourceVersion": page.resource_version.to_string()});
        if let Some(c) = page.continue_token {
            meta["continue"] = json!(c);
        }
        let head = format!(
            r#"{{"kind":"{}List","apiVersion":"{api_version}","metadata":{meta},"items":["#,
            t.kind.kind
        );
        let mut body = Vec::with_capacity(head.len() + page.items.iter().map(|i| i.len() + 1).sum::<usize>() + 2);
        body.extend_from_slice(head.as_bytes());
        for (i, item) in page.items.iter().enumerate() {
            if i > 0 {
                body.push(b',');
            }
            body.extend_from_slice(item);
        }
        body.extend_from_slice(b"]}");
        return Ok(response::json(200, body));
    }
    let page = t
        .resource
        .list(ns, list_params)
        .await
        .map_err(|e| registry_error(t.kind, "", &e))?;
    let rv = page.resource_version.to_string();
    let cont = page.continue_token.clone().unwrap_or_default();
    let mut meta = json!({"resourceVersion": rv});
    if !cont.is_empty() {
        meta["continue"] = json!(cont);
    }
    Ok(match t.shape {
        Shape::Table => {
            let tbl = table::table(t.kind.columns, &page.items, include, &rv, &cont, true);
            response::bytes(200, &negotiate::content_type(Shape::Table), encode(&tbl, t.pretty))
        }
        Shape::PartialObjectMetadata => {
            let items: Vec<_> = page.items.iter().map(table::partial_object_metadata).collect();
            let body = json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1", "metadata": meta, "items": items});
            response::bytes(
                200,
                &negotiate::content_type(Shape::PartialObjectMetadata),
                encode(&body, t.pretty),
            )
        }
        _ => {
            let body = json!({"kind": format!("{}List", t.kind.kind), "apiVersion": api_version, "metadata": meta, "items": page.items});
            response::json(200, encode(&body, t.pretty))
        }
    })
}
