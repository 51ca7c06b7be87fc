//! `deletecollection`: every object a selector matches, in one namespace or cluster-wide.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use serde_json::json;

use super::target::{Reply, Target};
use super::{Api, body, params, response};

pub async fn handle(State(_api): State<Arc<Api>>, t: Target, request_body: Body) -> Reply {
    let filter = params::filter(t.query(), "")?;
    let bytes = body::read(request_body).await?;
    let opts = params::delete(t.query(), &bytes)?;
    let page = t
        .resource
        .delete_collection(t.list_namespace(), filter, opts)
        .await
        .map_err(|e| response::registry_error(t.kind, "", &e))?;
    let body = json!({"kind": format!("{}List", t.kind.kind), "apiVersion": kvcache_api::API_VERSION,
                      "metadata": {"resourceVersion": page.resource_version.to_string()}, "items": page.items});
    Ok(response::json(200, response::encode(&body, t.pretty)))
}
