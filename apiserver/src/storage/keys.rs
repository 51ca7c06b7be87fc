//! The key layout: where objects and cross-object claims live.
//!
//! ```text
//! /registry/worker.gpustack.ai/<plural>/<name>               cluster-scoped object
//! /registry/worker.gpustack.ai/<plural>/<namespace>/<name>   namespaced object
//! /claims/domains/<backend>/<domain>                         who holds a cache domain on a backend
//! /claims/bindings/<namespace>/<name>                        which domain claim a Binding holds
//! ```
//!
//! Names never contain `/` (they are DNS subdomains or labels, validated before any key is
//! built), so a prefix ending in `/` selects exactly one level.

use kvcache_api::{GROUP, Kind, Scope};

const REGISTRY: &str = "/registry";

/// Prefix of every object of kind `K`.
pub fn kind_prefix<K: Kind>() -> String {
    kind_prefix_of(K::PLURAL)
}

/// Prefix of every object of the kind served as `plural`.
pub fn kind_prefix_of(plural: &str) -> String {
    format!("{REGISTRY}/{GROUP}/{plural}/")
}

/// Prefix of the objects of a namespaced kind in one namespace; the kind prefix for
/// cluster-scoped kinds or when `namespace` is `None`.
pub fn list_prefix<K: Kind>(namespace: Option<&str>) -> String {
    match (K::SCOPE, namespace) {
        (Scope::Namespaced, Some(ns)) => format!("{}{ns}/", kind_prefix::<K>()),
        _ => kind_prefix::<K>(),
    }
}

/// The key of one object. `namespace` is ignored for cluster-scoped kinds.
pub fn object_key<K: Kind>(namespace: &str, name: &str) -> String {
    match K::SCOPE {
        Scope::Cluster => format!("{}{name}", kind_prefix::<K>()),
        Scope::Namespaced => format!("{}{namespace}/{name}", kind_prefix::<K>()),
    }
}

/// Holder of `domain` on `backend`: at most one Binding per (backend, domain).
pub fn domain_claim(backend: &str, domain: &str) -> String {
    format!("/claims/domains/{backend}/{domain}")
}

/// Every domain claim on `backend`.
pub fn domain_claims_of(backend: &str) -> String {
    format!("/claims/domains/{backend}/")
}

/// The claim a Binding holds, so that releasing it never depends on the pool still existing.
pub fn binding_claim(namespace: &str, name: &str) -> String {
    format!("/claims/bindings/{namespace}/{name}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvcache_api::backend::BackendSpec;
    use kvcache_api::binding::BindingSpec;

    #[test]
    fn layout_is_stable() {
        assert_eq!(
            object_key::<BackendSpec>("ignored", "mooncake-dram"),
            "/registry/worker.gpustack.ai/kvcachebackends/mooncake-dram"
        );
        assert_eq!(
            object_key::<BindingSpec>("team-a", "team-a"),
            "/registry/worker.gpustack.ai/kvcachepoolbindings/team-a/team-a"
        );
        assert_eq!(
            list_prefix::<BindingSpec>(Some("team-a")),
            "/registry/worker.gpustack.ai/kvcachepoolbindings/team-a/"
        );
        assert_eq!(
            list_prefix::<BackendSpec>(Some("x")),
            "/registry/worker.gpustack.ai/kvcachebackends/"
        );
        assert_eq!(domain_claim("b", "default"), "/claims/domains/b/default");
        assert!(domain_claim("b", "d").starts_with(&domain_claims_of("b")));
    }
}
