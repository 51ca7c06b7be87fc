//! The direct-mode authorization policy: `system:masters` may do everything, the controllers
//! (`system:kvcache-controller`) may do everything with our group's resources, Events and Leases,
//! the store's processes (`system:kvcache-store`) may read and write Leases, `gpustack:viewers`
//! may get, list and watch our resources, any authenticated user may read discovery, OpenAPI,
//! `/version` and `/metrics`, and anyone (the anonymous user included) may read the public health
//! and version paths. In a cluster, a SubjectAccessReview authorizer takes its place.

use async_trait::async_trait;

use super::anonymous;
use super::{Attributes, Authorizer, Decision, Target};

const READ_VERBS: &[&str] = &["get", "list", "watch"];
/// What the store's processes do with Leases: campaign (create, get, update), watch for a
/// release, and nothing else.
const LEASE_VERBS: &[&str] = &["create", "get", "list", "watch", "update"];

#[derive(Debug, Default)]
pub struct StaticPolicy;

fn is_discovery(path: &str) -> bool {
    path == "/api"
        || path == "/apis"
        || path.starts_with("/api/")
        || path.starts_with("/apis/")
        || path.starts_with("/openapi/")
        || path == "/version"
        || path == "/metrics"
}

#[async_trait]
impl Authorizer for StaticPolicy {
    async fn authorize(&self, attrs: &Attributes) -> Decision {
        let user = &attrs.user;
        if user.in_group("system:masters") {
            return Decision::Allow;
        }
        // The controllers write every kind of ours, their status and finalizers included.
        if user.name == super::CONTROLLER_USER
            && let Target::Resource(r) = &attrs.target
            && (r.group == kvcache_api::GROUP
                || (r.group.is_empty() && r.resource == "events")
                || r.group == crate::request_info::LEASE_GROUP)
        {
            return Decision::Allow;
        }
        // The store's leaders campaign for their Leases; Lease-addressed members read them.
        if user.name == kvcache_certs::STORE.user
            && let Target::Resource(r) = &attrs.target
            && r.group == crate::request_info::LEASE_GROUP
            && r.resource == "leases"
            && r.subresource.is_empty()
            && LEASE_VERBS.contains(&attrs.verb.as_str())
        {
            return Decision::Allow;
        }
        let reads = matches!(attrs.verb.as_str(), "get" | "head");
        match &attrs.target {
            Target::Resource(_) if user.in_group("gpustack:viewers") && READ_VERBS.contains(&attrs.verb.as_str()) => {
                Decision::Allow
            }
            Target::NonResource { path } if reads && anonymous::is_public(path) => Decision::Allow,
            Target::NonResource { path } if reads && user.in_group("system:authenticated") && is_discovery(path) => {
                Decision::Allow
            }
            _ => Decision::Deny(String::new()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{ResourceAttributes, User};
    use super::*;

    fn res(user: User, verb: &str) -> Attributes {
        Attributes {
            user: std::sync::Arc::new(user),
            verb: verb.into(),
            target: Target::Resource(ResourceAttributes {
                group: "worker.gpustack.ai".into(),
                version: "v1".into(),
                resource: "kvcachepoolbindings".into(),
                subresource: String::new(),
                namespace: "ns".into(),
                name: "b".into(),
            }),
        }
    }

    fn path(user: User, p: &str) -> Attributes {
        Attributes {
            user: std::sync::Arc::new(user),
            verb: "get".into(),
            target: Target::NonResource { path: p.into() },
        }
    }

    #[tokio::test]
    async fn policy() {
        let p = StaticPolicy;
        let admin = User::new("a", &["system:masters"]);
        let viewer = User::new("v", &["gpustack:viewers", "system:authenticated"]);
        let someone = User::new("s", &["system:authenticated"]);
        assert_eq!(p.authorize(&res(admin, "delete")).await, Decision::Allow);
        assert_eq!(p.authorize(&res(viewer.clone(), "list")).await, Decision::Allow);
        assert!(matches!(p.authorize(&res(viewer, "create")).await, Decision::Deny(_)));
        assert!(matches!(
            p.authorize(&res(User::anonymous(), "get")).await,
            Decision::Deny(_)
        ));
        assert_eq!(p.authorize(&path(someone.clone(), "/apis")).await, Decision::Allow);
        assert!(matches!(p.authorize(&path(someone, "/debug")).await, Decision::Deny(_)));
        assert!(matches!(
            p.authorize(&path(User::anonymous(), "/apis")).await,
            Decision::Deny(_)
        ));
        assert_eq!(p.authorize(&path(User::anonymous(), "/readyz")).await, Decision::Allow);
    }

    #[tokio::test]
    async fn the_store_may_campaign_for_leases_and_nothing_else() {
        let p = StaticPolicy;
        let store = || User::new(kvcache_certs::STORE.user, &["system:authenticated"]);
        let lease = |verb: &str| {
            let mut a = res(store(), verb);
            if let Target::Resource(r) = &mut a.target {
                r.group = "coordination.k8s.io".into();
                r.resource = "leases".into();
            }
            a
        };
        for verb in ["create", "get", "update", "watch", "list"] {
            assert_eq!(p.authorize(&lease(verb)).await, Decision::Allow, "{verb}");
        }
        assert!(matches!(p.authorize(&lease("delete")).await, Decision::Deny(_)));
        assert!(matches!(p.authorize(&res(store(), "get")).await, Decision::Deny(_)));
    }
}
