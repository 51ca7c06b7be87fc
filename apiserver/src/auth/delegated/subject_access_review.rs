//! Authorization by the cluster: each request's attributes become a SubjectAccessReview
//! (`authorization.k8s.io/v1`), so the cluster's RBAC decides, as kube-apiserver's delegated
//! authorizer. Put [`crate::auth::cache::Cached`] in front: allowed and denied answers are
//! remembered for short TTLs. A review that does not reach the cluster is an error (500), never
//! a decision.

use async_trait::async_trait;
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::Api;
use kube::api::PostParams;

use crate::auth::{Attributes, Authorizer, Decision, Target};

pub struct SubjectAccessReviewer {
    api: Api<SubjectAccessReview>,
}

impl std::fmt::Debug for SubjectAccessReviewer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubjectAccessReviewer").finish_non_exhaustive()
    }
}

impl SubjectAccessReviewer {
    pub fn new(client: kube::Client) -> SubjectAccessReviewer {
        SubjectAccessReviewer { api: Api::all(client) }
    }
}

/// The review that asks about `attrs`.
pub fn review(attrs: &Attributes) -> SubjectAccessReview {
    let user = &attrs.user;
    let nonempty = |s: &str| (!s.is_empty()).then(|| s.to_owned());
    let (resource_attributes, non_resource_attributes) = match &attrs.target {
        Target::Resource(r) => (
            Some(ResourceAttributes {
                group: Some(r.group.clone()),
                version: nonempty(&r.version),
                resource: Some(r.resource.clone()),
                subresource: nonempty(&r.subresource),
                namespace: nonempty(&r.namespace),
                name: nonempty(&r.name),
                verb: Some(attrs.verb.clone()),
                ..ResourceAttributes::default()
            }),
            None,
        ),
        Target::NonResource { path } => (
            None,
            Some(NonResourceAttributes {
                path: Some(path.clone()),
                verb: Some(attrs.verb.clone()),
            }),
        ),
    };
    SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.name.clone()),
            uid: nonempty(&user.uid),
            groups: (!user.groups.is_empty()).then(|| user.groups.clone()),
            extra: (!user.extra.is_empty()).then(|| user.extra.clone().into_iter().collect()),
            resource_attributes,
            non_resource_attributes,
        },
        ..SubjectAccessReview::default()
    }
}

#[async_trait]
impl Authorizer for SubjectAccessReviewer {
    async fn authorize(&self, attrs: &Attributes) -> Decision {
        match self.api.create(&PostParams::default(), &review(attrs)).await {
            Ok(answer) => {
                let status = answer.status.unwrap_or_default();
                if status.allowed {
                    Decision::Allow
                } else {
                    Decision::Deny(status.reason.unwrap_or_default())
                }
            }
            Err(e) => Decision::Error(format!("the SubjectAccessReview failed: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::auth::{ResourceAttributes as Res, User};

    #[test]
    fn attributes_become_the_review_kube_apiserver_expects() {
        let mut user = User::new("alice", &["devs"]);
        user.extra.insert("scopes".into(), vec!["a".into()]);
        let attrs = Attributes {
            user: Arc::new(user),
            verb: "list".into(),
            target: Target::Resource(Res {
                group: "worker.gpustack.ai".into(),
                version: "v1".into(),
                resource: "kvcachepoolbindings".into(),
                subresource: String::new(),
                namespace: "team-a".into(),
                name: String::new(),
            }),
        };
        let json = serde_json::to_value(review(&attrs)).unwrap();
        assert_eq!(
            json["spec"],
            serde_json::json!({
                "user": "alice",
                "groups": ["devs"],
                "extra": {"scopes": ["a"]},
                "resourceAttributes": {
                    "group": "worker.gpustack.ai", "version": "v1", "resource": "kvcachepoolbindings",
                    "namespace": "team-a", "verb": "list"
                }
            })
        );
        let attrs = Attributes {
            target: Target::NonResource { path: "/apis".into() },
            verb: "get".into(),
            ..attrs
        };
        assert_eq!(
            serde_json::to_value(review(&attrs)).unwrap()["spec"]["nonResourceAttributes"],
            serde_json::json!({"path": "/apis", "verb": "get"})
        );
    }
}
