//! `create`: a new object from a JSON or YAML body.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use serde_json::Value;

use super::target::{Reply, Target};
use super::{Api, body, params, response};

pub async fn handle(State(_api): State<Arc<Api>>, t: Target, request_body: Body) -> Reply {
    let write = params::write(t.query(), &t.headers, "create", false)?;
    let bytes = body::read(request_body).await?;
    let parsed = body::object(&t.headers, &bytes)?;
    let name = parsed
        .value
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let out = t
        .resource
        .create(&t.namespace, parsed, &write)
        .await
        .map_err(|e| response::registry_error(t.kind, &name, &e))?;
    Ok(response::written(out, t.pretty))
}
