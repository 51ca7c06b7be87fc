//! Kubernetes' request options, parsed from the query (and the body, for `DeleteOptions`) and
//! checked as kube-apiserver checks them: `dryRun`, `fieldManager`, `fieldValidation`, `force`;
//! list options (selectors, paging, `resourceVersion` and `resourceVersionMatch`); watch options
//! (`sendInitialEvents`, bookmarks, `timeoutSeconds`); `DeleteOptions`. A malformed option is a
//! 400 (or a 422 naming the field, for list options), never ignored.

use std::sync::Arc;
use std::time::Duration;

use axum::response::Response;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::response::{bad_request, error, registry_error};
use crate::decode::FieldValidation;
use crate::decode::bounded;
use crate::registry::dynamic::{ListParams, MetaFilter, WriteParams};
use crate::registry::generic::DeleteOptions;
use crate::registry::kinds::KindEntry;
use crate::registry::watch::Start;
use crate::registry::{ErrorList, Path, RegistryError};
use crate::request_info::Query;
use crate::selectors::{FieldSelector, LabelSelector};

/// `dryRun`: every value given must be `All`.
pub fn dry_run(q: &Query) -> Result<bool, Response> {
    let mut dry = false;
    for v in q.all("dryRun") {
        if v != "All" {
            return Err(bad_request(format!(
                "dryRun {v:?} is not supported: the only valid value is All"
            )));
        }
        dry = true;
    }
    Ok(dry)
}

/// The options of a create, update or patch.
pub fn write(q: &Query, headers: &http::HeaderMap, verb: &str, apply: bool) -> Result<WriteParams, Response> {
    let dry_run = dry_run(q)?;
    let validation = match q.get("fieldValidation") {
        None | Some("") => FieldValidation::Warn,
        Some(v) => FieldValidation::parse(v).ok_or_else(|| {
            bad_request(format!(
                "fieldValidation {v:?} is not supported: use Strict, Warn or Ignore"
            ))
        })?,
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
            let ua = headers
                .get(http::header::USER_AGENT)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default();
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

/// The metadata filter of `labelSelector` and `fieldSelector` (and of the name, for a watch of
/// one object).
pub fn filter(q: &Query, name: &str) -> Result<Option<MetaFilter>, Response> {
    let labels = LabelSelector::parse(q.get("labelSelector").unwrap_or_default()).map_err(|e| bad_request(e.0))?;
    let fields = FieldSelector::parse(q.get("fieldSelector").unwrap_or_default()).map_err(|e| bad_request(e.0))?;
    if labels.is_empty() && fields.is_empty() && name.is_empty() {
        return Ok(None);
    }
    let name = name.to_owned();
    Ok(Some(Arc::new(move |m: &ObjectMeta| {
        let n = m.name.as_deref().unwrap_or_default();
        (name.is_empty() || n == name)
            && labels.matches(m.labels.as_ref())
            && fields.matches(n, m.namespace.as_deref().unwrap_or_default())
    })))
}

fn resource_version(q: &Query) -> Result<Option<u64>, Response> {
    match q.get("resourceVersion") {
        None | Some("") => Ok(None),
        Some(rv) => rv.parse::<u64>().map(Some).map_err(|_| {
            bad_request(format!(
                "resourceVersion {rv:?} is not valid: resource versions come from a list or an object"
            ))
        }),
    }
}

/// A 422 on `ListOptions`, as kube-apiserver answers invalid list options.
fn invalid(kind: &KindEntry, field: &str, message: &str) -> Response {
    let mut errs = ErrorList::new();
    errs.forbidden(&Path::new(field), message);
    let e = RegistryError::Invalid {
        kind: "ListOptions",
        name: String::new(),
        errors: errs,
    };
    registry_error(kind, "", &e)
}

/// The options of a list.
pub fn list(q: &Query, kind: &KindEntry) -> Result<ListParams, Response> {
    if q.has("sendInitialEvents") {
        return Err(invalid(
            kind,
            "sendInitialEvents",
            "sendInitialEvents is forbidden for list; use it with watch=true",
        ));
    }
    let filter = filter(q, "")?;
    let rv = resource_version(q)?;
    let rv_match = q.get("resourceVersionMatch").unwrap_or_default();
    let continue_token = q.get("continue").filter(|c| !c.is_empty()).map(str::to_owned);
    if !rv_match.is_empty() && continue_token.is_some() {
        return Err(invalid(
            kind,
            "resourceVersionMatch",
            "resourceVersionMatch is forbidden when continue is provided",
        ));
    }
    if !rv_match.is_empty() && q.get("resourceVersion").is_none() {
        return Err(invalid(
            kind,
            "resourceVersionMatch",
            "resourceVersionMatch is forbidden unless resourceVersion is provided",
        ));
    }
    let limit = match q.get("limit").filter(|l| !l.is_empty()) {
        None => None,
        Some(l) => match l.parse::<i64>() {
            Ok(n) if n > 0 => usize::try_from(n).ok(),
            Ok(_) => None,
            Err(_) => return Err(bad_request(format!("limit {l:?} is not an integer"))),
        },
    };
    let mut params = ListParams {
        limit,
        continue_token,
        filter,
        ..ListParams::default()
    };
    match (rv_match, rv) {
        ("Exact", Some(0)) => {
            return Err(invalid(
                kind,
                "resourceVersionMatch",
                "resourceVersionMatch \"Exact\" is forbidden for resourceVersion \"0\"",
            ));
        }
        ("Exact", Some(n)) => params.exact_revision = Some(n),
        ("" | "NotOlderThan", Some(n)) if n > 0 && params.continue_token.is_none() => params.min_revision = Some(n),
        ("" | "NotOlderThan", _) => {}
        (other, _) => {
            return Err(invalid(
                kind,
                "resourceVersionMatch",
                &format!("resourceVersionMatch {other:?} is not supported: use Exact or NotOlderThan"),
            ));
        }
    }
    Ok(params)
}

/// The options of a watch.
#[derive(Clone)]
pub struct WatchParams {
    pub start: Start,
    pub filter: Option<MetaFilter>,
    pub bookmarks: bool,
    /// `sendInitialEvents=true`: end the initial events with the `k8s.io/initial-events-end`
    /// bookmark.
    pub initial_events_end: bool,
    pub timeout: Duration,
}

pub fn watch(q: &Query, kind: &KindEntry, name: &str) -> Result<WatchParams, Response> {
    let filter = filter(q, name)?;
    let rv = resource_version(q)?;
    let send_initial = q.get("sendInitialEvents").map(|v| v == "true");
    let bookmarks = q.flag("allowWatchBookmarks");
    let rv_match = q.get("resourceVersionMatch").unwrap_or_default();
    let start = match send_initial {
        Some(initial) => {
            if rv_match != "NotOlderThan" {
                return Err(invalid(
                    kind,
                    "resourceVersionMatch",
                    "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
                ));
            }
            if !bookmarks {
                return Err(invalid(
                    kind,
                    "allowWatchBookmarks",
                    "sendInitialEvents requires allowWatchBookmarks=true",
                ));
            }
            match (initial, rv) {
                (true, _) => Start::Initial,
                (false, Some(n)) => Start::After(n),
                (false, None) => Start::Now,
            }
        }
        None => {
            if !rv_match.is_empty() && rv_match != "NotOlderThan" {
                return Err(invalid(
                    kind,
                    "resourceVersionMatch",
                    "resourceVersionMatch for watch must be NotOlderThan or unset",
                ));
            }
            match rv {
                None | Some(0) => Start::Initial,
                Some(n) => Start::After(n),
            }
        }
    };
    let timeout = match q.get("timeoutSeconds").filter(|t| !t.is_empty()) {
        Some(t) => match t.parse::<u64>() {
            Ok(s) => Duration::from_secs(s),
            Err(_) => {
                return Err(bad_request(format!(
                    "timeoutSeconds {t:?} is not a non-negative integer"
                )));
            }
        },
        // 30 to 60 minutes, as genericapiserver (spread so reconnects do not align).
        None => Duration::from_secs(1800 + u64::from(uuid::Uuid::new_v4().as_bytes()[0]) * 7),
    };
    Ok(WatchParams {
        start,
        filter,
        bookmarks,
        initial_events_end: send_initial == Some(true),
        timeout,
    })
}

/// `DeleteOptions` from the body (kubectl sends one without kind) and the query. Every field has
/// its Kubernetes type: `dryRun` a list of `All`, `gracePeriodSeconds` an integer,
/// `preconditions` strings, `propagationPolicy` a string; anything else is a 400 and nothing is
/// deleted.
pub fn delete(q: &Query, body: &[u8]) -> Result<DeleteOptions, Response> {
    let from_body = if body.iter().all(u8::is_ascii_whitespace) {
        k8s_openapi::apimachinery::pkg::apis::meta::v1::DeleteOptions::default()
    } else {
        let parsed = bounded::json(body).map_err(super::body::parse_error)?;
        if !parsed.value.is_object() {
            return Err(bad_request("the DeleteOptions body must be a JSON object"));
        }
        for (field, want) in [
            ("apiVersion", &["v1", "meta.k8s.io/v1"][..]),
            ("kind", &["DeleteOptions"][..]),
        ] {
            if let Some(v) = parsed.value.get(field)
                && !v.as_str().is_some_and(|s| want.contains(&s))
            {
                return Err(bad_request(format!(
                    "the DeleteOptions body has {field} {v}; it must be {}",
                    want.join(" or ")
                )));
            }
        }
        serde_json::from_value(parsed.value)
            .map_err(|e| bad_request(format!("the DeleteOptions body is not valid: {e}")))?
    };
    let mut dry_run = dry_run(q)?;
    for v in from_body.dry_run.iter().flatten() {
        if v != "All" {
            return Err(bad_request(format!(
                "dryRun {v:?} is not supported: the only valid value is All"
            )));
        }
        dry_run = true;
    }
    if let Some(g) = q.get("gracePeriodSeconds")
        && g.parse::<i64>().is_err()
    {
        return Err(bad_request(format!("gracePeriodSeconds {g:?} is not an integer")));
    }
    let orphan = match q.get("orphanDependents") {
        None => from_body.orphan_dependents == Some(true),
        Some("true" | "1" | "True") => true,
        Some("false" | "0" | "False" | "") => false,
        Some(other) => return Err(bad_request(format!("orphanDependents {other:?} is not a boolean"))),
    };
    let policy = q
        .get("propagationPolicy")
        .map(str::to_owned)
        .or(from_body.propagation_policy);
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
    let pre = from_body.preconditions.unwrap_or_default();
    Ok(DeleteOptions {
        dry_run,
        precondition_uid: pre.uid,
        precondition_resource_version: pre.resource_version,
    })
}

/// `includeObject` of a Table.
pub fn include_object(q: &Query) -> Result<crate::table::IncludeObject, Response> {
    crate::table::IncludeObject::parse(q.get("includeObject").unwrap_or_default())
        .ok_or_else(|| bad_request("includeObject must be one of Metadata, Object or None"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Query {
        Query::parse(Some(s))
    }

    #[test]
    fn malformed_delete_options_are_refused() {
        for body in [
            r#"{"dryRun":"All"}"#,
            r#"{"dryRun":1}"#,
            r#"{"preconditions":{"uid":5}}"#,
            "[]",
            r#"{"propagationPolicy":5}"#,
            r#"{"kind":"Pod"}"#,
            "{not json",
        ] {
            assert!(delete(&q(""), body.as_bytes()).is_err(), "{body}");
        }
        for query in [
            "dryRun=&dryRun=All",
            "dryRun=Some",
            "gracePeriodSeconds=abc",
            "orphanDependents=maybe",
        ] {
            assert!(delete(&q(query), b"").is_err(), "{query}");
        }
        let ok = delete(
            &q("dryRun=All"),
            br#"{"kind":"DeleteOptions","apiVersion":"v1","preconditions":{"uid":"u"}}"#,
        )
        .unwrap();
        assert!(ok.dry_run);
        assert_eq!(ok.precondition_uid.as_deref(), Some("u"));
        assert!(
            delete(&q("gracePeriodSeconds=0"), br#"{"dryRun":["All"]}"#)
                .unwrap()
                .dry_run
        );
    }

    #[test]
    fn every_dry_run_value_is_checked() {
        assert_eq!(dry_run(&q("dryRun=All")).ok(), Some(true));
        assert_eq!(dry_run(&q("")).ok(), Some(false));
        assert!(dry_run(&q("dryRun=All&dryRun=x")).is_err());
        assert!(dry_run(&q("dryRun=")).is_err());
    }
}
