//! What a request is about, judged from its method, path and query before anything else runs
//! (as kube-apiserver's `RequestInfoFactory`): a resource request (`/apis/<group>/<version>/
//! [namespaces/<ns>/]<resource>[/<name>[/<subresource>]]`) with its Kubernetes verb, or a
//! non-resource request (discovery, health, metrics). Authorization, limits, metrics and the
//! span all read it; the handlers are then chosen by it.

use std::collections::HashMap;

use http::Method;

use crate::registry::kinds::{self, KindEntry};

/// The group of the Leases served in direct mode (`crate::leases`).
pub const LEASE_GROUP: &str = "coordination.k8s.io";

/// The group of the self-reviews `kubectl auth can-i` creates.
pub const AUTHORIZATION_GROUP: &str = "authorization.k8s.io";

/// The resource part of a resource request. Strings are as sent: they are judged later.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ResourceInfo {
    pub group: String,
    pub version: String,
    /// Empty for cluster-scoped requests and lists across namespaces.
    pub namespace: String,
    pub resource: String,
    /// Empty for collection requests.
    pub name: String,
    /// `status`, or empty.
    pub subresource: String,
}

/// What a request is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestInfo {
    /// The Kubernetes verb (`get`, `list`, `watch`, `create`, `update`, `patch`, `delete`,
    /// `deletecollection`) of a resource request, or the lower-cased method of a non-resource
    /// request; `unknown` for methods neither knows.
    pub verb: &'static str,
    pub method: Method,
    pub path: String,
    /// `None` for a non-resource request.
    pub resource: Option<ResourceInfo>,
    /// `dryRun=All` was asked for.
    pub dry_run: bool,
    /// The query parameters, decoded once.
    pub query: Query,
}

impl RequestInfo {
    /// Judges a request from its method, path and raw query string.
    pub fn parse(method: &Method, path: &str, raw_query: Option<&str>) -> RequestInfo {
        let query = Query::parse(raw_query);
        let dry_run = query.all("dryRun").any(|v| v == "All");
        let resource = resource_of(path);
        let verb = match &resource {
            Some(r) => resource_verb(method, r.name.is_empty(), query.flag("watch")),
            None => non_resource_verb(method),
        };
        RequestInfo {
            verb,
            method: method.clone(),
            path: path.to_owned(),
            resource,
            dry_run,
            query,
        }
    }

    /// The served kind this request names, if any.
    pub fn kind(&self) -> Option<&'static KindEntry> {
        let r = self.resource.as_ref()?;
        if r.group != kvcache_api::GROUP || r.version != kvcache_api::VERSION {
            return None;
        }
        kinds::by_plural(&r.resource)
    }

    /// Whether the request is on the core Events (`/api/v1/.../events`), served in direct mode.
    pub fn is_core_events(&self) -> bool {
        self.resource
            .as_ref()
            .is_some_and(|r| r.group.is_empty() && r.version == "v1" && r.resource == "events")
    }

    /// Whether the request is on the core Namespaces (`/api/v1/namespaces[/<name>]`), served in
    /// direct mode.
    pub fn is_core_namespaces(&self) -> bool {
        self.resource.as_ref().is_some_and(|r| {
            r.group.is_empty() && r.version == "v1" && r.resource == "namespaces" && r.namespace.is_empty()
        })
    }

    /// Whether the request is a self-review of `authorization.k8s.io/v1`
    /// (`selfsubjectaccessreviews`, `selfsubjectrulesreviews`), which every user may create.
    pub fn is_self_review(&self) -> bool {
        self.resource.as_ref().is_some_and(|r| {
            r.group == AUTHORIZATION_GROUP
                && r.version == "v1"
                && matches!(
                    r.resource.as_str(),
                    "selfsubjectaccessreviews" | "selfsubjectrulesreviews"
                )
        })
    }

    /// Whether the request is on `coordination.k8s.io/v1` Leases, served in direct mode.
    pub fn is_leases(&self) -> bool {
        self.resource
            .as_ref()
            .is_some_and(|r| r.group == LEASE_GROUP && r.version == "v1" && r.resource == "leases")
    }

    /// kube-apiserver's metric verb: `LIST`, `WATCH`, `GET`, `POST`, `PUT`, `PATCH`, `DELETE`.
    pub fn metric_verb(&self) -> &'static str {
        match self.verb {
            "watch" => "WATCH",
            "list" => "LIST",
            "get" => "GET",
            "create" => "POST",
            "update" => "PUT",
            "patch" => "PATCH",
            "delete" | "deletecollection" => "DELETE",
            _ => self.method_verb(),
        }
    }

    /// The method as a metric label, from a closed set.
    pub fn method_verb(&self) -> &'static str {
        match self.method {
            Method::GET => "GET",
            Method::HEAD => "HEAD",
            Method::POST => "POST",
            Method::PUT => "PUT",
            Method::PATCH => "PATCH",
            Method::DELETE => "DELETE",
            Method::OPTIONS => "OPTIONS",
            _ => "other",
        }
    }

    /// Whether the request streams (watches): counted apart from the in-flight limits.
    pub fn is_long_running(&self) -> bool {
        self.verb == "watch"
    }
}

fn resource_verb(method: &Method, collection: bool, watch: bool) -> &'static str {
    match *method {
        Method::GET | Method::HEAD if watch => "watch",
        Method::GET | Method::HEAD if collection => "list",
        Method::GET | Method::HEAD => "get",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if collection => "deletecollection",
        Method::DELETE => "delete",
        _ => "unknown",
    }
}

fn non_resource_verb(method: &Method) -> &'static str {
    match *method {
        Method::GET => "get",
        Method::HEAD => "head",
        Method::POST => "post",
        Method::PUT => "put",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        Method::OPTIONS => "options",
        _ => "unknown",
    }
}

/// The resource of `/apis/<group>/<version>/...` with at least a resource segment; discovery of
/// a group or version is a non-resource request, as in Kubernetes.
fn resource_of(path: &str) -> Option<ResourceInfo> {
    // `/api/v1/...` is the core group (""), `/apis/<group>/<version>/...` any other.
    let (segs, core) = match path.strip_prefix("/api/") {
        Some(rest) => (std::iter::once("").chain(rest.split('/')).collect::<Vec<&str>>(), true),
        None => (path.strip_prefix("/apis/")?.split('/').collect(), false),
    };
    if segs.len() < 3 || segs.iter().skip(usize::from(core)).any(|s| s.is_empty()) {
        return None;
    }
    let (group, version, tail) = (segs[0], segs[1], &segs[2..]);
    let (namespace, tail) = match tail {
        ["namespaces", ns, tail @ ..] if !tail.is_empty() => (*ns, tail),
        tail => ("", tail),
    };
    let (resource, name, subresource) = match tail {
        [r] => (*r, "", String::new()),
        [r, n] => (*r, *n, String::new()),
        // Deeper paths (`<name>/status/extra`) are no resource of ours: the whole rest is this
        // resource's subresource, which no kind has, so the request is a 404 as in
        // kube-apiserver, never served as the shorter path.
        [r, n, rest @ ..] => (*r, *n, rest.join("/")),
        [] => return None,
    };
    Some(ResourceInfo {
        group: group.to_owned(),
        version: version.to_owned(),
        namespace: namespace.to_owned(),
        resource: resource.to_owned(),
        name: name.to_owned(),
        subresource,
    })
}

/// Decoded query parameters, every value of each key in order. `get` returns the first, as Go's
/// `url.Values.Get` does.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Query(HashMap<String, Vec<String>>);

impl Query {
    pub fn parse(q: Option<&str>) -> Query {
        let mut map: HashMap<String, Vec<String>> = HashMap::new();
        for pair in q.unwrap_or_default().split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            map.entry(percent_decode(k)).or_default().push(percent_decode(v));
        }
        Query(map)
    }

    pub fn get(&self, k: &str) -> Option<&str> {
        self.0.get(k).and_then(|v| v.first()).map(String::as_str)
    }

    /// Every value given for `k`.
    pub fn all(&self, k: &str) -> impl Iterator<Item = &str> {
        self.0.get(k).into_iter().flatten().map(String::as_str)
    }

    pub fn flag(&self, k: &str) -> bool {
        matches!(self.get(k), Some("true" | "1" | "True"))
    }

    pub fn has(&self, k: &str) -> bool {
        self.0.contains_key(k)
    }
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(method: &str, target: &str) -> RequestInfo {
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        RequestInfo::parse(&method.parse().unwrap(), path, Some(query))
    }

    #[test]
    fn resource_requests_and_their_verbs() {
        let i = info(
            "PUT",
            "/apis/worker.gpustack.ai/v1/namespaces/team-a/kvcachepoolbindings/b/status",
        );
        let r = i.resource.clone().unwrap();
        assert_eq!(
            (
                r.namespace.as_str(),
                r.resource.as_str(),
                r.name.as_str(),
                r.subresource.as_str()
            ),
            ("team-a", "kvcachepoolbindings", "b", "status")
        );
        assert_eq!(i.verb, "update");
        assert_eq!(i.kind().map(|k| k.kind), Some("KVCachePoolBinding"));
        assert_eq!(info("GET", "/apis/worker.gpustack.ai/v1/kvcachebackends").verb, "list");
        assert_eq!(
            info("GET", "/apis/worker.gpustack.ai/v1/kvcachebackends?watch=1").verb,
            "watch"
        );
        assert_eq!(
            info("DELETE", "/apis/worker.gpustack.ai/v1/namespaces/a/md").verb,
            "deletecollection"
        );
        assert_eq!(
            info("GET", "/apis/worker.gpustack.ai/v1/namespaces/x")
                .resource
                .unwrap()
                .resource,
            "namespaces"
        );
        let deep = info("GET", "/apis/worker.gpustack.ai/v1/kvcachebackends/a/status/extra");
        assert_eq!(
            deep.resource.unwrap().subresource,
            "status/extra",
            "no subresource of any kind"
        );
        assert!(info("GET", "/apis/worker.gpustack.ai/v1").resource.is_none());
        assert!(info("GET", "/apis/worker.gpustack.ai/v1/a//b").resource.is_none());
        assert!(info("GET", "/apis/other.io/v1/kvcachepools").kind().is_none());
        let np = info("GET", "/healthz");
        assert_eq!((np.verb, np.resource.is_none()), ("get", true));
        assert_eq!(info("BREW", "/x").verb, "unknown");
        assert!(info("DELETE", "/apis/worker.gpustack.ai/v1/kvcachepools/a?dryRun=All").dry_run);
    }

    #[test]
    fn query_decoding_keeps_every_value() {
        let q = Query::parse(Some(
            "fieldSelector=metadata.name%3Da1&labelSelector=env+in+(a%2Cb)&watch=1&dryRun=&dryRun=All",
        ));
        assert_eq!(q.get("fieldSelector"), Some("metadata.name=a1"));
        assert_eq!(q.get("labelSelector"), Some("env in (a,b)"));
        assert!(q.flag("watch"));
        assert_eq!(q.get("dryRun"), Some(""));
        assert_eq!(q.all("dryRun").collect::<Vec<_>>(), ["", "All"]);
        assert_eq!(Query::parse(Some("a=%zz%")).get("a"), Some("%zz%"));
    }
}
