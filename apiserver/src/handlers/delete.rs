//! `delete`: one object (it stays, marked for deletion, while finalizers hold it; then the answer
//! carries a `Warning` naming what holds it).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;

use super::target::{Reply, Target};
use super::{Api, body, params, response};

pub async fn handle(State(_api): State<Arc<Api>>, t: Target, request_body: Body) -> Reply {
    let bytes = body::read(request_body).await?;
    let opts = params::delete(t.query(), &bytes)?;
    let removal = t
        .resource
        .delete(&t.namespace, &t.name, opts)
        .await
        .map_err(|e| response::registry_error(t.kind, &t.name, &e))?;
    let reply = response::json(200, response::encode(&removal.object, t.pretty));
    Ok(response::with_warnings(reply, &removal.warnings))
}
