//! The direct-mode authorization policy: `system:masters` may do everything, the controllers
//! (`system:kvcache-controller`) may do everything with our group's resources and Events, `gpustack:viewers`
//! may get, list and watch our resources, any authenticated user may read discovery, OpenAPI,
//! `/version` and `/metrics`, and anyone (the anonymous user included) may read the public health
//! and version paths. In a cluster, a SubjectAccessReview authorizer takes its place.

use async_trait::async_trait;

use super::anonymous;
use super::{Attributes, Authorizer, Decision, Target};

const READ_VERBS: &[&str] = &["get", "list", "watch"];

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
        if user.name == crate::controller::CONTROLLER_USER
            && let Target::Resource(r) = &attrs.target
            && (r.group == kvcache_api::GROUP || (r.group.is_empty() && r.resource == "events"))
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
}
