//! `update`: replace an object (or its status) with the body, valid only against the version it
//! names.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;

use super::target::{Reply, Target};
use super::{Api, body, params, response};

pub async fn handle(State(_api): State<Arc<Api>>, t: Target, request_body: Body) -> Reply {
    let write = params::write(t.query(), &t.headers, "update", false)?;
    let bytes = body::read(request_body).await?;
    let parsed = body::object(&t.headers, &bytes)?;
    let out = t
        .resource
        .update(&t.namespace, &t.name, parsed, t.part, &write)
        .await
        .map_err(|e| response::registry_error(t.kind, &t.name, &e))?;
    Ok(response::written(out, t.pretty))
}
