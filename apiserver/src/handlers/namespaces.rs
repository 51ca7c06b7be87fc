//! `/api/v1/namespaces[/<name>]`: the Namespaces of direct mode ([`crate::namespaces`]) —
//! create, get, list (JSON or a Table), watch and delete; updates and patches are refused with
//! 405.

use std::sync::Arc;

use axum::body::Body;
use serde_json::Value;

use super::Api;
use super::body;
use super::plain::{self, refused};
use super::response;
use crate::namespaces::{self, NAMESPACES};
use crate::request_info::RequestInfo;

type Request = http::Request<Body>;
type Response = axum::response::Response;

pub async fn handle(api: Arc<Api>, info: &RequestInfo, req: Request) -> Response {
    let Some(r) = info.resource.as_ref() else {
        return response::not_found(req.uri().path());
    };
    if !r.subresource.is_empty() {
        return response::error(
            405,
            "MethodNotAllowed",
            format!(
                "namespaces/{} is not served in direct mode (namespaces are created, read, listed and deleted)",
                r.subresource
            ),
        );
    }
    let pretty = info.query.flag("pretty");
    let answer = |v: Result<Value, crate::plain::Refusal>, code: u16| match v {
        Ok(v) => response::json(code, response::encode(&v, pretty)),
        Err(e) => refused(e),
    };
    match (info.verb, r.name.is_empty()) {
        ("create", true) => {
            let headers = req.headers().clone();
            match body::read(req.into_body())
                .await
                .and_then(|b| body::core_object(&headers, &b, "Namespace"))
            {
                Ok(value) => answer(namespaces::create(&api.storage, &value, info.dry_run).await, 201),
                Err(r) => r,
            }
        }
        ("get", false) => answer(namespaces::get(&api.storage, &r.name).await, 200),
        ("delete", false) => answer(namespaces::delete(&api.storage, &r.name, info.dry_run).await, 200),
        ("list", true) => list(&api, info, &super::accept(&req), pretty).await,
        ("watch", _) => match plain::by_name(info) {
            Ok(keep) => plain::watch(&api, info, &NAMESPACES, None, keep).await,
            Err(r) => r,
        },
        (_, item) => response::method_not_allowed(
            req.method(),
            if item {
                "a namespace (namespaces are created, read and deleted in direct mode)"
            } else {
                "namespaces (delete them one at a time)"
            },
        ),
    }
}

/// Every namespace the selectors admit, in one page.
async fn list(api: &Api, info: &RequestInfo, accept: &str, pretty: bool) -> Response {
    let keep = match plain::by_name(info) {
        Ok(k) => k,
        Err(r) => return r,
    };
    match namespaces::list(&api.storage).await {
        Ok((all, revision)) => {
            let items: Vec<Value> = all.into_iter().filter(|v| keep(v)).collect();
            plain::respond_list(info, &NAMESPACES, &items, revision, String::new(), accept, pretty)
        }
        Err(e) => refused(e),
    }
}
