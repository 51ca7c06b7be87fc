//! The REST verbs on our resources: get, list, watch, create, update, patch, delete and
//! deletecollection, on the main resource and on `/status`, with Kubernetes' query parameters
//! (`dryRun`, `fieldManager`, `fieldValidation`, `force`, selectors, paging, `resourceVersion`,
//! `resourceVersionMatch`, watch options) and response shapes (JSON, Table, partial metadata).

// Refusals are whole responses, built once per request; their size does not matter.
#![allow(clippy::result_large_err)]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, header};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use serde_json::{Value, json};

use super::api::{Api, Body, MAX_BODY_BYTES, error, header_str, json_response, not_acceptable, status_response};
use super::auth::User;
use super::fieldmanager::Part;
use super::negotiate::{self, Shape};
use super::request::{Query, ResourcePath};
use super::resource::{Info, MetaFilter, Outcome, Patch, Resource, UpdatePatch, WriteParams};
use super::selectors::{FieldSelector, LabelSelector};
use super::table::{self, IncludeObject};
use super::watch;
use crate::decode::FieldValidation;
use crate::registry::RegistryError;
use crate::registry::generic::DeleteOptions;

/// How long a list waits for a `resourceVersion` ahead of the store before answering 504.
const TOO_LARGE_WAIT: Duration = Duration::from_secs(3);

fn registry_error(info: &Info, name: &str, e: &RegistryError) -> Response<Body> {
    let (code, status) = crate::status::for_resource(info.plural, name, e);
    status_response(code, &status)
}

fn bad_request(msg: impl Into<String>) -> Response<Body> {
    error(400, "BadRequest", msg)
}

fn with_warnings(mut r: Response<Body>, warnings: &[String]) -> Response<Body> {
    for w in warnings {
        let text = format!("299 - {:?}", w.replace('"', "'"));
        if let Ok(v) = HeaderValue::from_str(&text) {
            r.headers_mut().append(header::WARNING, v);
        }
    }
    r
}

fn encode(v: &Value, pretty: bool) -> Vec<u8> {
    if pretty {
        serde_json::to_vec_pretty(v).unwrap_or_default()
    } else {
        serde_json::to_vec(v).unwrap_or_default()
    }
}

/// One request on a resource.
pub async fn handle(
    api: &Arc<Api>,
    res: Arc<dyn Resource>,
    rp: ResourcePath,
    verb: String,
    q: Query,
    req: Request<Incoming>,
    user: &User,
) -> Response<Body> {
    let info = res.info();
    if !info.namespaced && !rp.namespace.is_empty() {
        return error(
            404,
            "NotFound",
            format!(
                "{} is cluster-scoped: use /apis/{}/{}",
                info.plural,
                kvcache_api::API_VERSION,
                info.plural
            ),
        );
    }
    if info.namespaced && rp.namespace.is_empty() && !matches!(verb.as_str(), "list" | "watch") {
        return error(
            404,
            "NotFound",
            format!(
                "{} is namespaced: use /apis/{}/namespaces/<namespace>/{}",
                info.plural,
                kvcache_api::API_VERSION,
                info.plural
            ),
        );
    }
    let part = match rp.subresource.as_str() {
        "" => Part::Main,
        "status" if !rp.name.is_empty() => Part::Status,
        other => {
            return error(
                404,
                "NotFound",
                format!(
                    "the server could not find the requested resource: subresource {other:?} of {}",
                    info.plural
                ),
            );
        }
    };
    if part == Part::Status && !matches!(verb.as_str(), "get" | "update" | "patch") {
        return error(
            405,
            "MethodNotAllowed",
            format!("{} is not supported on {}/status", req.method(), info.plural),
        );
    }
    let accept = header_str(req.headers(), header::ACCEPT);
    let Some(shape) = negotiate::for_objects(&accept) else {
        return not_acceptable(&accept);
    };
    let include = match IncludeObject::parse(q.get("includeObject").unwrap_or_default()) {
        Some(i) => i,
        None => return bad_request("includeObject must be one of Metadata, Object or None"),
    };
    let pretty = q.flag("pretty");
    let ns = rp.namespace.clone();
    match verb.as_str() {
        "get" => match res.get(&ns, &rp.name).await {
            Ok(obj) => render_object(&info, &obj, shape, include, pretty, 200),
            Err(e) => registry_error(&info, &rp.name, &e),
        },
        "list" => list(&res, &info, &ns, &q, shape, include, pretty).await,
        "watch" => watch_request(api, &res, &info, &ns, &q, shape, include).await,
        "create" | "update" | "patch" => write(&res, &info, &rp, &verb, part, &q, req, user, pretty).await,
        "delete" => delete_one(&res, &info, &ns, &rp.name, &q, req, pretty).await,
        "deletecollection" => delete_collection(&res, &info, &ns, &q, req, pretty).await,
        _ => error(
            405,
            "MethodNotAllowed",
            format!("{} is not supported on {}", req.method(), info.plural),
        ),
    }
}

fn render_object(
    info: &Info,
    obj: &Value,
    shape: Shape,
    include: IncludeObject,
    pretty: bool,
    code: u16,
) -> Response<Body> {
    match shape {
        Shape::Table => {
            let rv = obj
                .pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let t = table::table(info.columns, std::slice::from_ref(obj), include, rv, "", true);
            json_response(code, &negotiate::content_type(Shape::Table), encode(&t, pretty))
        }
        Shape::PartialObjectMetadata => json_response(
            code,
            "application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io",
            encode(&table::partial_object_metadata(obj), pretty),
        ),
        _ => json_response(code, "application/json", encode(obj, pretty)),
    }
}

/// The metadata filter of `labelSelector` and `fieldSelector`.
fn filter_of(q: &Query) -> Result<Option<MetaFilter>, String> {
    let labels = LabelSelector::parse(q.get("labelSelector").unwrap_or_default()).map_err(|e| e.0)?;
    let fields = FieldSelector::parse(q.get("fieldSelector").unwrap_or_default()).map_err(|e| e.0)?;
    if labels.is_empty() && fields.is_empty() {
        return Ok(None);
    }
    Ok(Some(Arc::new(
        move |m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
            labels.matches(m.labels.as_ref())
                && fields.matches(
                    m.name.as_deref().unwrap_or_default(),
                    m.namespace.as_deref().unwrap_or_default(),
                )
        },
    )))
}

fn parse_rv(q: &Query) -> Result<Option<u64>, Response<Body>> {
    match q.get("resourceVersion") {
        None | Some("") => Ok(None),
        Some(rv) => rv.parse::<u64>().map(Some).map_err(|_| {
            error(
                400,
                "BadRequest",
                format!("resourceVersion {rv:?} is not valid: resource versions come from a list or an object"),
            )
        }),
    }
}

async fn list(
    res: &Arc<dyn Resource>,
    info: &Info,
    ns: &str,
    q: &Query,
    shape: Shape,
    include: IncludeObject,
    pretty: bool,
) -> Response<Body> {
    if q.has("sendInitialEvents") {
        return invalid_list_options(
            info,
            "sendInitialEvents",
            "sendInitialEvents is forbidden for list; use it with watch=true",
        );
    }
    let filter = match filter_of(q) {
        Ok(f) => f,
        Err(msg) => return bad_request(msg),
    };
    let rv = match parse_rv(q) {
        Ok(rv) => rv,
        Err(r) => return r,
    };
    let rv_match = q.get("resourceVersionMatch").unwrap_or_default();
    let continue_token = q.get("continue").filter(|c| !c.is_empty()).map(str::to_owned);
    if !rv_match.is_empty() && continue_token.is_some() {
        return invalid_list_options(
            info,
            "resourceVersionMatch",
            "resourceVersionMatch is forbidden when continue is provided",
        );
    }
    if !rv_match.is_empty() && q.get("resourceVersion").is_none() {
        return invalid_list_options(
            info,
            "resourceVersionMatch",
            "resourceVersionMatch is forbidden unless resourceVersion is provided",
        );
    }
    let limit = match q.get("limit").filter(|l| !l.is_empty()) {
        None => None,
        Some(l) => match l.parse::<i64>() {
            Ok(n) if n > 0 => usize::try_from(n).ok(),
            Ok(_) => None,
            Err(_) => return bad_request(format!("limit {l:?} is not an integer")),
        },
    };
    let mut revision = None;
    match (rv_match, rv) {
        ("Exact", Some(0)) => {
            return invalid_list_options(
                info,
                "resourceVersionMatch",
                "resourceVersionMatch \"Exact\" is forbidden for resourceVersion \"0\"",
            );
        }
        ("Exact", Some(n)) => revision = Some(n),
        ("" | "NotOlderThan", Some(n)) if n > 0 && continue_token.is_none() => {
            let storage = res.storage().clone();
            if tokio::time::timeout(TOO_LARGE_WAIT, storage.wait_for_revision(n))
                .await
                .is_err()
            {
                let mut status = crate::status::failure(504, "Timeout", "Too large resource version");
                status.details = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::StatusDetails {
                    causes: Some(vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::StatusCause {
                        field: None,
                        message: Some(format!("Too large resource version: {n}")),
                        reason: Some("ResourceVersionTooLarge".into()),
                    }]),
                    retry_after_seconds: Some(1),
                    ..Default::default()
                });
                let mut r = status_response(504, &status);
                r.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                return r;
            }
        }
        ("" | "NotOlderThan", _) => {}
        (other, _) => {
            return invalid_list_options(
                info,
                "resourceVersionMatch",
                &format!("resourceVersionMatch {other:?} is not supported: use Exact or NotOlderThan"),
            );
        }
    }
    let ns = Some(ns).filter(|n| !n.is_empty());
    if shape == Shape::Json && !pretty {
        // The common case (kubectl -o json/yaml, informers): stored bytes, spliced.
        let (items, rv, cont) = match res.list_json(ns, limit, continue_token, revision, filter).await {
            Ok(p) => p,
            Err(e) => return registry_error(info, "", &e),
        };
        let mut meta = json!({"resourceVersion": rv.to_string()});
        if let Some(c) = cont {
            meta["continue"] = json!(c);
        }
        let head = format!(
            r#"{{"kind":"{}List","apiVersion":"{}","metadata":{},"items":["#,
            info.kind,
            kvcache_api::API_VERSION,
            meta
        );
        let mut body = Vec::with_capacity(head.len() + items.iter().map(|i| i.len() + 1).sum::<usize>() + 2);
        body.extend_from_slice(head.as_bytes());
        for (i, item) in items.iter().enumerate() {
            if i > 0 {
                body.push(b',');
            }
            body.extend_from_slice(item);
        }
        body.extend_from_slice(b"]}");
        return json_response(200, "application/json", body);
    }
    let page = match res.list(ns, limit, continue_token, revision, filter).await {
        Ok(p) => p,
        Err(e) => return registry_error(info, "", &e),
    };
    let rv = page.resource_version.to_string();
    let cont = page.continue_token.clone().unwrap_or_default();
    match shape {
        Shape::Table => {
            let t = table::table(info.columns, &page.items, include, &rv, &cont, true);
            json_response(200, &negotiate::content_type(Shape::Table), encode(&t, pretty))
        }
        Shape::PartialObjectMetadata => {
            let items: Vec<Value> = page.items.iter().map(table::partial_object_metadata).collect();
            let mut meta = json!({"resourceVersion": rv});
            if !cont.is_empty() {
                meta["continue"] = json!(cont);
            }
            let body = json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1", "metadata": meta, "items": items});
            json_response(
                200,
                &negotiate::content_type(Shape::PartialObjectMetadata),
                encode(&body, pretty),
            )
        }
        _ => {
            let mut meta = json!({"resourceVersion": rv});
            if !cont.is_empty() {
                meta["continue"] = json!(cont);
            }
            let body = json!({"kind": format!("{}List", info.kind), "apiVersion": kvcache_api::API_VERSION, "metadata": meta, "items": page.items});
            json_response(200, "application/json", encode(&body, pretty))
        }
    }
}

fn invalid_list_options(info: &Info, field: &str, message: &str) -> Response<Body> {
    let mut errs = crate::registry::ErrorList::new();
    errs.forbidden(&crate::registry::Path::new(field), message);
    let e = RegistryError::Invalid {
        kind: "ListOptions",
        name: String::new(),
        errors: errs,
    };
    registry_error(info, "", &e)
}

async fn watch_request(
    api: &Arc<Api>,
    res: &Arc<dyn Resource>,
    info: &Info,
    ns: &str,
    q: &Query,
    shape: Shape,
    include: IncludeObject,
) -> Response<Body> {
    let filter = match filter_of(q) {
        Ok(f) => f,
        Err(msg) => return bad_request(msg),
    };
    let rv = match parse_rv(q) {
        Ok(rv) => rv,
        Err(r) => return r,
    };
    let send_initial = q.get("sendInitialEvents").map(|v| v == "true");
    let bookmarks = q.flag("allowWatchBookmarks");
    let rv_match = q.get("resourceVersionMatch").unwrap_or_default();
    let start = match send_initial {
        Some(initial) => {
            if rv_match != "NotOlderThan" {
                return invalid_list_options(
                    info,
                    "resourceVersionMatch",
                    "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
                );
            }
            if !bookmarks {
                return invalid_list_options(
                    info,
                    "allowWatchBookmarks",
                    "sendInitialEvents requires allowWatchBookmarks=true",
                );
            }
            match (initial, rv) {
                (true, _) => watch::Start::Initial,
                (false, Some(n)) => watch::Start::After(n),
                (false, None) => watch::Start::After(res.storage().current_revision().await.unwrap_or(0)),
            }
        }
        None => {
            if !rv_match.is_empty() && rv_match != "NotOlderThan" {
                return invalid_list_options(
                    info,
                    "resourceVersionMatch",
                    "resourceVersionMatch for watch must be NotOlderThan or unset",
                );
            }
            match rv {
                None | Some(0) => watch::Start::Initial,
                Some(n) => watch::Start::After(n),
            }
        }
    };
    let timeout = match q.get("timeoutSeconds").filter(|t| !t.is_empty()) {
        Some(t) => match t.parse::<u64>() {
            Ok(s) => Duration::from_secs(s),
            Err(_) => return bad_request(format!("timeoutSeconds {t:?} is not a non-negative integer")),
        },
        // 30 to 60 minutes, as genericapiserver (spread so reconnects do not align).
        None => Duration::from_secs(1800 + u64::from(uuid::Uuid::new_v4().as_bytes()[0]) * 7),
    };
    let table_mode = match shape {
        Shape::Table => Some(include),
        _ => None,
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(256);
    let opts = watch::Options {
        namespace: Some(ns.to_owned()).filter(|n| !n.is_empty()),
        start,
        filter,
        bookmarks,
        initial_events_end: send_initial == Some(true),
        timeout,
        table: table_mode,
    };
    let api2 = api.clone();
    let res2 = res.clone();
    api.metrics
        .longrunning
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    tokio::spawn(async move {
        watch::run(api2.clone(), res2, opts, tx).await;
        api2.metrics
            .longrunning
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    });
    let mut rx = rx;
    let stream = futures::stream::poll_fn(move |cx| rx.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b)))));
    let mut r = Response::new(StreamBody::new(stream).boxed());
    let ct = match shape {
        Shape::Table => negotiate::content_type(Shape::Table),
        _ => "application/json".to_owned(),
    };
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_str(&ct).unwrap_or(HeaderValue::from_static("application/json")),
    );
    r
}

/// Bodies past the limit are read to their end (up to this much) and dropped, so that the client
/// finishes sending and reads our 413 instead of seeing its upload cut off.
const DRAIN_LIMIT_BYTES: usize = 64 * 1024 * 1024;

async fn read_body(req: Request<Incoming>) -> Result<(String, Bytes), Response<Body>> {
    let content_type = header_str(req.headers(), header::CONTENT_TYPE);
    let mut body = req.into_body();
    let mut buf = bytes::BytesMut::new();
    let mut total = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| bad_request(format!("reading the request body: {e}")))?;
        let Ok(data) = frame.into_data() else { continue };
        total += data.len();
        if total <= MAX_BODY_BYTES {
            buf.extend_from_slice(&data);
        } else if total > DRAIN_LIMIT_BYTES {
            break;
        }
    }
    if total > MAX_BODY_BYTES {
        return Err(error(
            413,
            "RequestEntityTooLarge",
            format!("the request is too large: {total} bytes or more; the limit is {MAX_BODY_BYTES} bytes"),
        ));
    }
    Ok((content_type, buf.freeze()))
}

fn parse_object_body(content_type: &str, body: &[u8]) -> Result<Value, String> {
    let media = content_type.split(';').next().unwrap_or_default().trim();
    match media {
        "" | "application/json" | "*/*" => {
            serde_json::from_slice(body).map_err(|e| format!("the body is not valid JSON: {e}"))
        }
        "application/yaml" => {
            let text = std::str::from_utf8(body).map_err(|_| "the body is not UTF-8".to_owned())?;
            yaml_serde::from_str(text).map_err(|e| format!("the body is not valid YAML: {e}"))
        }
        other => Err(format!("unsupported:{other}")),
    }
}

fn unsupported_media(ct: &str) -> Response<Body> {
    error(
        415,
        "UnsupportedMediaType",
        format!(
            "the body of the request was in an unknown format ({ct}) - accepted media types include: application/json, application/yaml, application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
        ),
    )
}

fn write_params(
    q: &Query,
    req_headers: &http::HeaderMap,
    verb: &str,
    apply: bool,
) -> Result<WriteParams, Response<Body>> {
    let dry_run = match q.get("dryRun") {
        None | Some("") => false,
        Some("All") => true,
        Some(other) => {
            return Err(bad_request(format!(
                "dryRun {other:?} is not supported: the only valid value is All"
            )));
        }
    };
    let validation = match q.get("fieldValidation") {
        None | Some("") => FieldValidation::Warn,
        Some(v) => match FieldValidation::parse(v) {
            Some(m) => m,
            None => {
                return Err(bad_request(format!(
                    "fieldValidation {v:?} is not supported: use Strict, Warn or Ignore"
                )));
            }
        },
    };
    let manager = match q.get("fieldManager").filter(|m| !m.is_empty()) {
        Some(m) if m.len() > 128 || m.chars().any(|c| c.is_control()) => {
            return Err(bad_request("fieldManager must be at most 128 printable characters"));
        }
        Some(m) => m.to_owned(),
        None if apply => {
            return Err(bad_request(
                "PATCH with application/apply-patch+yaml requires the fieldManager parameter",
            ));
        }
        None => {
            let ua = header_str(req_headers, header::USER_AGENT);
            let first = ua.split('/').next().unwrap_or_default();
            if first.is_empty() {
                "unknown".to_owned()
            } else {
                first.chars().take(128).collect()
            }
        }
    };
    let force = q.flag("force");
    if force && !apply {
        return Err(bad_request(format!(
            "force is only valid for apply patches, not for {verb}"
        )));
    }
    Ok(WriteParams {
        dry_run,
        validation,
        manager,
        force,
    })
}

#[allow(clippy::too_many_arguments)]
async fn write(
    res: &Arc<dyn Resource>,
    info: &Info,
    rp: &ResourcePath,
    verb: &str,
    part: Part,
    q: &Query,
    req: Request<Incoming>,
    _user: &User,
    pretty: bool,
) -> Response<Body> {
    let apply = super::api::is_apply(req.headers());
    let params = match write_params(q, req.headers(), verb, apply) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let method = req.method().clone();
    let (ct, body) = match read_body(req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let ns = rp.namespace.as_str();
    let mut err_name = rp.name.clone();
    let result: Result<Outcome, RegistryError> = match verb {
        "create" => {
            if !rp.name.is_empty() {
                return error(
                    405,
                    "MethodNotAllowed",
                    format!("POST is not supported on an item of {}", info.plural),
                );
            }
            let value = match parse_object_body(&ct, &body) {
                Ok(v) => v,
                Err(m) if m.starts_with("unsupported:") => return unsupported_media(&ct),
                Err(m) => return bad_request(m),
            };
            err_name = value
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            res.create(ns, value, &params).await
        }
        "update" => {
            let value = match parse_object_body(&ct, &body) {
                Ok(v) => v,
                Err(m) if m.starts_with("unsupported:") => return unsupported_media(&ct),
                Err(m) => return bad_request(m),
            };
            res.update(ns, &rp.name, value, part, &params).await
        }
        _ => {
            debug_assert_eq!(method, Method::PATCH);
            let patch = match parse_patch(&ct, &body) {
                Ok(p) => p,
                Err(r) => return r,
            };
            res.patch(ns, &rp.name, patch, part, &params).await
        }
    };
    match result {
        Ok(out) => {
            let code = if out.created { 201 } else { 200 };
            with_warnings(
                if pretty {
                    let v: Value = serde_json::from_slice(&out.object).unwrap_or_default();
                    json_response(code, "application/json", encode(&v, true))
                } else {
                    json_response(code, "application/json", out.object)
                },
                &out.warnings,
            )
        }
        Err(e) => registry_error(info, &err_name, &e),
    }
}

/// Refuses strategic-merge-patch directives, which only make sense with merge keys we do not
/// declare.
fn check_no_directives(v: &Value) -> Result<(), String> {
    match v {
        Value::Object(m) => {
            for (k, child) in m {
                if k.starts_with('$') {
                    return Err(format!(
                        "strategic merge patch directive {k:?} is not supported: every list of this API is atomic; use a JSON patch (--type=json) to edit lists"
                    ));
                }
                check_no_directives(child)?;
            }
            Ok(())
        }
        Value::Array(a) => a.iter().try_for_each(check_no_directives),
        _ => Ok(()),
    }
}

fn parse_patch(ct: &str, body: &[u8]) -> Result<Patch, Response<Body>> {
    let media = ct.split(';').next().unwrap_or_default().trim();
    let json =
        || serde_json::from_slice::<Value>(body).map_err(|e| bad_request(format!("the patch is not valid JSON: {e}")));
    match media {
        "application/json-patch+json" => {
            let ops: json_patch::Patch =
                serde_json::from_slice(body).map_err(|e| bad_request(format!("the JSON patch is not valid: {e}")))?;
            Ok(Patch::Update(UpdatePatch::Json(ops)))
        }
        "application/merge-patch+json" => Ok(Patch::Update(UpdatePatch::Merge(json()?))),
        "application/strategic-merge-patch+json" => {
            let v = json()?;
            check_no_directives(&v).map_err(bad_request)?;
            Ok(Patch::Update(UpdatePatch::Merge(v)))
        }
        "application/apply-patch+yaml" => {
            let text = std::str::from_utf8(body).map_err(|_| bad_request("the apply configuration is not UTF-8"))?;
            let v: Value = yaml_serde::from_str(text)
                .map_err(|e| bad_request(format!("the apply configuration is not valid YAML or JSON: {e}")))?;
            Ok(Patch::Apply(v))
        }
        _ => Err(error(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format ({ct}) - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json"
            ),
        )),
    }
}

/// `DeleteOptions` from the body (kubectl sends one without kind) and the query.
async fn delete_options(q: &Query, req: Request<Incoming>) -> Result<DeleteOptions, Response<Body>> {
    let (_, body) = read_body(req).await?;
    let v: Value = if body.iter().all(u8::is_ascii_whitespace) {
        json!({})
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| bad_request(format!("the DeleteOptions body is not valid JSON: {e}")))?
    };
    let dry_run_body = v.get("dryRun").and_then(Value::as_array).is_some_and(|a| !a.is_empty());
    let dry_run = match q.get("dryRun") {
        None | Some("") => false,
        Some("All") => true,
        Some(other) => {
            return Err(bad_request(format!(
                "dryRun {other:?} is not supported: the only valid value is All"
            )));
        }
    } || dry_run_body;
    let policy = q
        .get("propagationPolicy")
        .map(str::to_owned)
        .or_else(|| v.get("propagationPolicy").and_then(Value::as_str).map(str::to_owned));
    let orphan = q.flag("orphanDependents") || v.get("orphanDependents").and_then(Value::as_bool) == Some(true);
    match policy.as_deref() {
        None | Some("" | "Background") if !orphan => {}
        Some(p @ ("Foreground" | "Orphan")) => {
            return Err(error(
                422,
                "Invalid",
                format!(
                    "propagationPolicy {p} is not supported yet: it needs the Kubernetes garbage collector, which does not run against this server in direct mode; use Background (kubectl delete --cascade=background)"
                ),
            ));
        }
        _ if orphan => {
            return Err(error(
                422,
                "Invalid",
                "orphanDependents is not supported yet: it needs the Kubernetes garbage collector; use propagationPolicy Background",
            ));
        }
        Some(other) => {
            return Err(bad_request(format!(
                "propagationPolicy {other:?} is not valid: use Background"
            )));
        }
        None => {}
    }
    let pre = v.get("preconditions");
    Ok(DeleteOptions {
        dry_run,
        precondition_uid: pre
            .and_then(|p| p.get("uid"))
            .and_then(Value::as_str)
            .map(str::to_owned),
        precondition_resource_version: pre
            .and_then(|p| p.get("resourceVersion"))
            .and_then(Value::as_str)
            .map(str::to_owned),
    })
}

async fn delete_one(
    res: &Arc<dyn Resource>,
    info: &Info,
    ns: &str,
    name: &str,
    q: &Query,
    req: Request<Incoming>,
    pretty: bool,
) -> Response<Body> {
    let opts = match delete_options(q, req).await {
        Ok(o) => o,
        Err(r) => return r,
    };
    match res.delete(ns, name, opts).await {
        Ok((obj, _gone)) => json_response(200, "application/json", encode(&obj, pretty)),
        Err(e) => registry_error(info, name, &e),
    }
}

async fn delete_collection(
    res: &Arc<dyn Resource>,
    info: &Info,
    ns: &str,
    q: &Query,
    req: Request<Incoming>,
    pretty: bool,
) -> Response<Body> {
    let filter = match filter_of(q) {
        Ok(f) => f,
        Err(msg) => return bad_request(msg),
    };
    let opts = match delete_options(q, req).await {
        Ok(o) => o,
        Err(r) => return r,
    };
    let page = match res
        .list(Some(ns).filter(|n| !n.is_empty()), None, None, None, filter)
        .await
    {
        Ok(p) => p,
        Err(e) => return registry_error(info, "", &e),
    };
    let mut deleted = Vec::new();
    for item in &page.items {
        let name = item
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let item_ns = item
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or_default();
        match res.delete(item_ns, name, opts.clone()).await {
            Ok((obj, _)) => deleted.push(obj),
            Err(RegistryError::NotFound { .. }) => {}
            Err(e) => return registry_error(info, name, &e),
        }
    }
    let body = json!({"kind": format!("{}List", info.kind), "apiVersion": kvcache_api::API_VERSION,
                      "metadata": {"resourceVersion": page.resource_version.to_string()}, "items": deleted});
    json_response(200, "application/json", encode(&body, pretty))
}
