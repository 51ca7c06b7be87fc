//! The direct-mode authorization policy: `system:masters` may do everything, the controllers
//! (`system:kvcache-controller`) may do everything with our group's resources, Events and Leases,
//! the store's processes (`system:kvcache-store`) may read and write Leases, `gpustack:viewers`
//! may get, list and watch our resources, any authenticated user may read discovery, OpenAPI,
//! `/version` and `/metrics` and ask what they may do (the self-reviews of `kubectl auth can-i`),
//! and anyone (the anonymous user included) may read the public health and version paths. The
//! same policy is written out as rules for `kubectl auth can-i --list` ([`StaticPolicy::rules`]).
//! In a cluster, a SubjectAccessReview authorizer takes its place.

use async_trait::async_trait;

use super::anonymous;
use super::{Attributes, Authorizer, Decision, Rules, Target, User};
use crate::request_info::{AUTHORIZATION_GROUP, LEASE_GROUP};

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
                || r.group == LEASE_GROUP)
        {
            return Decision::Allow;
        }
        // The store's leaders campaign for their Leases; Lease-addressed members read them.
        if user.name == kvcache_certs::STORE.user
            && let Target::Resource(r) = &attrs.target
            && r.group == LEASE_GROUP
            && r.resource == "leases"
            && r.subresource.is_empty()
            && LEASE_VERBS.contains(&attrs.verb.as_str())
        {
            return Decision::Allow;
        }
        let reads = matches!(attrs.verb.as_str(), "get" | "head");
        match &attrs.target {
            Target::Resource(r)
                if user.in_group("system:authenticated")
                    && r.group == AUTHORIZATION_GROUP
                    && SELF_REVIEWS.contains(&r.resource.as_str())
                    && attrs.verb == "create" =>
            {
                Decision::Allow
            }
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

    fn rules(&self, user: &User, _namespace: &str) -> Option<Rules> {
        Some(StaticPolicy::rules_of(user))
    }
}

/// What every authenticated user may create: the questions about themselves.
const SELF_REVIEWS: &[&str] = &["selfsubjectaccessreviews", "selfsubjectrulesreviews"];

/// The non-resource paths an authenticated user may read (besides the public ones).
const DISCOVERY_PATHS: &[&str] = &[
    "/api",
    "/api/*",
    "/apis",
    "/apis/*",
    "/openapi/*",
    "/version",
    "/metrics",
];

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

impl StaticPolicy {
    /// The policy as rules for `user` (the same in every namespace): what `authorize` allows,
    /// written out.
    pub fn rules_of(user: &User) -> Rules {
        let mut r = Rules::default();
        let mut res = |verbs: &[&str], groups: &[&str], resources: &[&str]| {
            r.resources.push((strings(verbs), strings(groups), strings(resources)));
        };
        if user.in_group("system:masters") {
            res(&["*"], &["*"], &["*"]);
            r.non_resources.push((strings(&["*"]), strings(&["*"])));
            return r;
        }
        if user.name == super::CONTROLLER_USER {
            res(&["*"], &[kvcache_api::GROUP, LEASE_GROUP], &["*"]);
            res(&["*"], &[""], &["events"]);
        }
        if user.name == kvcache_certs::STORE.user {
            res(LEASE_VERBS, &[LEASE_GROUP], &["leases"]);
        }
        if user.in_group("gpustack:viewers") {
            res(READ_VERBS, &["*"], &["*"]);
        }
        if user.in_group("system:authenticated") {
            res(&["create"], &[AUTHORIZATION_GROUP], SELF_REVIEWS);
            r.non_resources.push((strings(&["get"]), strings(DISCOVERY_PATHS)));
        }
        r.non_resources
            .push((strings(&["get"]), strings(anonymous::PUBLIC_PATHS)));
        r
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

    /// The rules `kubectl auth can-i --list` shows allow exactly what `authorize` allows.
    #[tokio::test]
    async fn the_rules_say_what_the_policy_decides() {
        let p = StaticPolicy;
        let users = [
            User::new("a", &["system:masters", "system:authenticated"]),
            User::new("v", &["gpustack:viewers", "system:authenticated"]),
            User::new(super::super::CONTROLLER_USER, &["system:authenticated"]),
            User::new(kvcache_certs::STORE.user, &["system:authenticated"]),
            User::new("s", &["system:authenticated"]),
        ];
        let targets = [
            ("worker.gpustack.ai", "kvcachepoolbindings"),
            ("coordination.k8s.io", "leases"),
            ("", "events"),
            ("", "namespaces"),
            ("authorization.k8s.io", "selfsubjectaccessreviews"),
        ];
        let allows = |r: &Rules, verb: &str, group: &str, resource: &str| {
            let any = |v: &[String], x: &str| v.iter().any(|s| s == "*" || s == x);
            r.resources
                .iter()
                .any(|(verbs, groups, resources)| any(verbs, verb) && any(groups, group) && any(resources, resource))
        };
        for user in users {
            let rules = StaticPolicy::rules_of(&user);
            for (group, resource) in targets {
                for verb in ["get", "list", "create", "update", "delete"] {
                    let mut attrs = res(user.clone(), verb);
                    if let Target::Resource(r) = &mut attrs.target {
                        r.group = group.into();
                        r.resource = resource.into();
                    }
                    let decided = p.authorize(&attrs).await == Decision::Allow;
                    assert_eq!(
                        allows(&rules, verb, group, resource),
                        decided,
                        "{} {verb} {group}/{resource}",
                        user.name
                    );
                }
            }
        }
    }
}
