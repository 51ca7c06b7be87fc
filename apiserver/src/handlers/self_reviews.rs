//! `POST /apis/authorization.k8s.io/v1/selfsubject{access,rules}reviews`: what `kubectl auth
//! can-i` asks, answered from the authorizer that judges this server's own requests (the
//! direct-mode policy), for the user who asks. Nothing is stored.

use std::sync::Arc;

use axum::body::Body;
use k8s_openapi::api::authorization::v1::{
    NonResourceRule, ResourceRule, SelfSubjectAccessReview, SelfSubjectRulesReview, SubjectAccessReviewStatus,
    SubjectRulesReviewStatus,
};
use serde_json::json;

use super::{body, response};
use crate::auth::{Attributes, Authorizer, Decision, ResourceAttributes, Target, User};
use crate::request_info::RequestInfo;

type Request = http::Request<Body>;
type Response = axum::response::Response;

/// The authorizer the filters judged this request with, for the handlers that answer questions
/// about authorization.
#[derive(Clone)]
pub struct AuthorizerHandle(pub Arc<dyn Authorizer>);

pub async fn handle(info: &RequestInfo, req: Request) -> Response {
    let Some(r) = info.resource.as_ref() else {
        return response::not_found(req.uri().path());
    };
    if info.verb != "create" || !r.name.is_empty() {
        return response::method_not_allowed(req.method(), &format!("{} (they are only created)", r.resource));
    }
    let (Some(user), Some(AuthorizerHandle(authz))) = (
        req.extensions().get::<Arc<User>>().cloned(),
        req.extensions().get::<AuthorizerHandle>().cloned(),
    ) else {
        return response::error(500, "InternalError", "the request reached the handler without a user");
    };
    let kind = match r.resource.as_str() {
        "selfsubjectaccessreviews" => "SelfSubjectAccessReview",
        _ => "SelfSubjectRulesReview",
    };
    let headers = req.headers().clone();
    let body = match body::read(req.into_body())
        .await
        .and_then(|b| body::core_object(&headers, &b, kind))
    {
        Ok(v) => v,
        Err(r) => return r,
    };
    let pretty = info.query.flag("pretty");
    let answer = match kind {
        "SelfSubjectAccessReview" => access(body, user, authz.as_ref()).await,
        _ => rules(body, &user, authz.as_ref()),
    };
    match answer {
        Ok(v) => response::json(201, response::encode(&v, pretty)),
        Err(r) => r,
    }
}

fn bad_body(kind: &str, e: serde_json::Error) -> Response {
    response::bad_request(format!("the body is not an authorization.k8s.io/v1 {kind}: {e}"))
}

/// Whether `user` may do what the review's attributes say.
async fn access(
    body: serde_json::Value,
    user: Arc<User>,
    authz: &dyn Authorizer,
) -> Result<serde_json::Value, Response> {
    let mut review: SelfSubjectAccessReview =
        serde_json::from_value(body).map_err(|e| bad_body("SelfSubjectAccessReview", e))?;
    let spec = &review.spec;
    let target = match (&spec.resource_attributes, &spec.non_resource_attributes) {
        (Some(r), None) => Target::Resource(ResourceAttributes {
            group: r.group.clone().unwrap_or_default(),
            version: r.version.clone().unwrap_or_default(),
            resource: r.resource.clone().unwrap_or_default(),
            subresource: r.subresource.clone().unwrap_or_default(),
            namespace: r.namespace.clone().unwrap_or_default(),
            name: r.name.clone().unwrap_or_default(),
        }),
        (None, Some(n)) => Target::NonResource {
            path: n.path.clone().unwrap_or_default(),
        },
        _ => {
            return Err(crate::handlers::plain::refused(crate::plain::invalid(
                "SelfSubjectAccessReview",
                "",
                "spec.resourceAttributes",
                "FieldValueRequired",
                "exactly one of resourceAttributes and nonResourceAttributes must be specified",
            )));
        }
    };
    let verb = match &target {
        Target::Resource(_) => spec.resource_attributes.as_ref().and_then(|r| r.verb.clone()),
        Target::NonResource { .. } => spec.non_resource_attributes.as_ref().and_then(|n| n.verb.clone()),
    }
    .unwrap_or_default();
    let attrs = Attributes { user, verb, target };
    let status = match authz.authorize(&attrs).await {
        Decision::Allow => SubjectAccessReviewStatus {
            allowed: true,
            ..Default::default()
        },
        Decision::Deny(reason) => SubjectAccessReviewStatus {
            allowed: false,
            reason: (!reason.is_empty()).then_some(reason),
            ..Default::default()
        },
        Decision::Error(e) => SubjectAccessReviewStatus {
            allowed: false,
            evaluation_error: Some(e),
            ..Default::default()
        },
    };
    review.status = Some(status);
    serde_json::to_value(&review).map_err(|e| response::error(500, "InternalError", e.to_string()))
}

/// What `user` may do in the review's namespace, as rules.
fn rules(body: serde_json::Value, user: &User, authz: &dyn Authorizer) -> Result<serde_json::Value, Response> {
    let mut review: SelfSubjectRulesReview =
        serde_json::from_value(body).map_err(|e| bad_body("SelfSubjectRulesReview", e))?;
    let namespace = review.spec.namespace.clone().unwrap_or_default();
    review.status = Some(match authz.rules(user, &namespace) {
        Some(r) => SubjectRulesReviewStatus {
            resource_rules: r
                .resources
                .into_iter()
                .map(|(verbs, groups, resources)| ResourceRule {
                    verbs,
                    api_groups: Some(groups),
                    resources: Some(resources),
                    resource_names: None,
                })
                .collect(),
            non_resource_rules: r
                .non_resources
                .into_iter()
                .map(|(verbs, paths)| NonResourceRule {
                    verbs,
                    non_resource_urls: Some(paths),
                })
                .collect(),
            incomplete: false,
            evaluation_error: None,
        },
        None => SubjectRulesReviewStatus {
            incomplete: true,
            evaluation_error: Some(
                "this server's authorizer judges one request at a time; ask with kubectl auth can-i <verb> <resource>"
                    .into(),
            ),
            ..Default::default()
        },
    });
    serde_json::to_value(&review)
        .map(|mut v| {
            v["metadata"] = json!({});
            v
        })
        .map_err(|e| response::error(500, "InternalError", e.to_string()))
}
