//! `patch`: JSON patch, merge patch, strategic merge patch (applied as a merge patch) and
//! server-side apply, by `Content-Type`.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;

use super::response::{bad_request, error};
use super::target::{Reply, Target};
use super::{Api, body, params, response};
use crate::decode::bounded;
use crate::registry::patch::{self, Patch};

pub async fn handle(State(_api): State<Arc<Api>>, t: Target, request_body: Body) -> Reply {
    let media = body::media_type(&t.headers);
    let apply = media == "application/apply-patch+yaml";
    let write = params::write(t.query(), &t.headers, "patch", apply)?;
    let bytes = body::read(request_body).await?;
    let refused = |e| response::registry_error(t.kind, &t.name, &e);
    let json = || bounded::json(&bytes).map_err(body::parse_error);
    let p = match media.as_str() {
        "application/json-patch+json" => {
            let ops: json_patch::Patch = serde_json::from_value(json()?.value)
                .map_err(|e| bad_request(format!("the JSON patch is not valid: {e}")))?;
            Patch::Json(ops)
        }
        "application/merge-patch+json" => Patch::Merge(json()?),
        "application/strategic-merge-patch+json" => patch::strategic(json()?).map_err(refused)?,
        "application/apply-patch+yaml" => {
            let text = std::str::from_utf8(&bytes).map_err(|_| bad_request("the apply configuration is not UTF-8"))?;
            Patch::Apply(bounded::yaml(text).map_err(body::parse_error)?)
        }
        other => {
            return Err(error(
                415,
                "UnsupportedMediaType",
                format!(
                    "the body of the request was in an unknown format ({other}) - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json"
                ),
            ));
        }
    };
    let out = t
        .resource
        .patch(&t.namespace, &t.name, p, t.part, &write)
        .await
        .map_err(refused)?;
    Ok(response::written(out, t.pretty))
}
