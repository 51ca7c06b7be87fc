//! Content negotiation: what the `Accept` header asks for (plain JSON, a Table, partial object
//! metadata, aggregated discovery) and which request bodies we read.

/// The response shape a client asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    Json,
    Table,
    PartialObjectMetadata,
    /// Aggregated discovery, `v2` or `v2beta1`.
    Discovery(&'static str),
}

/// One media range of an `Accept` header.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Clause {
    media: String,
    as_: Option<String>,
    g: Option<String>,
    v: Option<String>,
}

fn clauses(accept: &str) -> Vec<Clause> {
    accept
        .split(',')
        .map(|c| {
            let mut parts = c.split(';').map(str::trim);
            let mut clause = Clause {
                media: parts.next().unwrap_or_default().to_ascii_lowercase(),
                ..Clause::default()
            };
            for p in parts {
                if let Some((k, v)) = p.split_once('=') {
                    let v = v.trim().to_owned();
                    match k.trim() {
                        "as" => clause.as_ = Some(v),
                        "g" => clause.g = Some(v),
                        "v" => clause.v = Some(v),
                        _ => {}
                    }
                }
            }
            clause
        })
        .collect()
}

fn is_json(media: &str) -> bool {
    matches!(media, "application/json" | "application/*" | "*/*" | "")
}

/// The first clause of `accept` we can produce for an object or list request, or `None` (406).
pub fn for_objects(accept: &str) -> Option<Shape> {
    for c in clauses(accept) {
        if !is_json(&c.media) {
            continue;
        }
        match (c.as_.as_deref(), c.g.as_deref(), c.v.as_deref()) {
            (None, _, _) => return Some(Shape::Json),
            (Some("Table"), Some("meta.k8s.io"), Some("v1" | "v1beta1")) => return Some(Shape::Table),
            (Some("PartialObjectMetadata" | "PartialObjectMetadataList"), Some("meta.k8s.io"), Some("v1")) => {
                return Some(Shape::PartialObjectMetadata);
            }
            _ => {}
        }
    }
    None
}

/// The first clause of `accept` we can produce for `/apis` or `/api`.
pub fn for_discovery(accept: &str) -> Option<Shape> {
    for c in clauses(accept) {
        if !is_json(&c.media) {
            continue;
        }
        match (c.as_.as_deref(), c.g.as_deref(), c.v.as_deref()) {
            (None, _, _) => return Some(Shape::Json),
            (Some("APIGroupDiscoveryList"), Some("apidiscovery.k8s.io"), Some("v2")) => {
                return Some(Shape::Discovery("v2"));
            }
            (Some("APIGroupDiscoveryList"), Some("apidiscovery.k8s.io"), Some("v2beta1")) => {
                return Some(Shape::Discovery("v2beta1"));
            }
            _ => {}
        }
    }
    None
}

/// The `Content-Type` of a response of `shape`.
pub fn content_type(shape: Shape) -> String {
    match shape {
        Shape::Json => "application/json".to_owned(),
        Shape::Table => "application/json;as=Table;v=v1;g=meta.k8s.io".to_owned(),
        Shape::PartialObjectMetadata => "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io".to_owned(),
        Shape::Discovery(v) => format!("application/json;g=apidiscovery.k8s.io;v={v};as=APIGroupDiscoveryList"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubectl_accept_headers() {
        let get = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
        assert_eq!(for_objects(get), Some(Shape::Table));
        assert_eq!(for_objects("application/json"), Some(Shape::Json));
        assert_eq!(for_objects(""), Some(Shape::Json));
        assert_eq!(for_objects("application/vnd.kubernetes.protobuf"), None);
        assert_eq!(
            for_objects("application/vnd.kubernetes.protobuf,application/json"),
            Some(Shape::Json)
        );
        let gc = "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json";
        assert_eq!(for_objects(gc), Some(Shape::PartialObjectMetadata));
        let new = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";
        assert_eq!(for_discovery(new), Some(Shape::Discovery("v2")));
        let old = "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";
        assert_eq!(for_discovery(old), Some(Shape::Discovery("v2beta1")));
        assert_eq!(for_discovery("application/json"), Some(Shape::Json));
    }
}
