//! What a request is about: the resource path grammar of `/apis/worker.gpustack.ai/v1/...`, the
//! Kubernetes verb, and query parameters.

use std::collections::HashMap;

/// A request on one of our resources.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourcePath {
    /// Empty for cluster-scoped requests and lists across namespaces.
    pub namespace: String,
    pub plural: String,
    /// Empty for collection requests.
    pub name: String,
    /// `status`, or empty.
    pub subresource: String,
}

/// Parses the part after `/apis/worker.gpustack.ai/v1/`; `None` is a 404.
pub fn parse_resource_path(rest: &str) -> Option<ResourcePath> {
    let segs: Vec<&str> = rest.split('/').collect();
    if segs.iter().any(|s| s.is_empty()) {
        return None;
    }
    let (namespace, tail) = match segs.as_slice() {
        ["namespaces", ns, tail @ ..] if !tail.is_empty() => ((*ns).to_owned(), tail),
        tail => (String::new(), tail),
    };
    let p = |plural: &str, name: &str, sub: &str| ResourcePath {
        namespace: namespace.clone(),
        plural: plural.to_owned(),
        name: name.to_owned(),
        subresource: sub.to_owned(),
    };
    match tail {
        [plural] => Some(p(plural, "", "")),
        [plural, name] => Some(p(plural, name, "")),
        [plural, name, sub] => Some(p(plural, name, sub)),
        _ => None,
    }
}

/// Decoded query parameters (the last value wins, as in Go's `Query().Get`... except we keep
/// the first, which is what `Get` returns).
#[derive(Debug, Clone, Default)]
pub struct Query(HashMap<String, String>);

impl Query {
    pub fn parse(q: Option<&str>) -> Query {
        let mut map = HashMap::new();
        for pair in q.unwrap_or_default().split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            map.entry(percent_decode(k)).or_insert_with(|| percent_decode(v));
        }
        Query(map)
    }

    pub fn get(&self, k: &str) -> Option<&str> {
        self.0.get(k).map(String::as_str)
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

    #[test]
    fn resource_paths() {
        let r = parse_resource_path("namespaces/team-a/kvcachepoolbindings/b/status").unwrap();
        assert_eq!(
            (
                r.namespace.as_str(),
                r.plural.as_str(),
                r.name.as_str(),
                r.subresource.as_str()
            ),
            ("team-a", "kvcachepoolbindings", "b", "status")
        );
        let r = parse_resource_path("kvcachebackends").unwrap();
        assert_eq!((r.namespace.as_str(), r.name.as_str()), ("", ""));
        assert!(parse_resource_path("namespaces/x").is_some_and(|r| r.plural == "namespaces"));
        assert!(parse_resource_path("a/b/c/d").is_none());
        assert!(parse_resource_path("a//b").is_none());
    }

    #[test]
    fn query_decoding() {
        let q = Query::parse(Some(
            "fieldSelector=metadata.name%3Da1&labelSelector=env+in+(a%2Cb)&watch=1",
        ));
        assert_eq!(q.get("fieldSelector"), Some("metadata.name=a1"));
        assert_eq!(q.get("labelSelector"), Some("env in (a,b)"));
        assert!(q.flag("watch"));
        assert_eq!(Query::parse(Some("a=%zz%")).get("a"), Some("%zz%"));
    }
}
