//! Who is asking and what they may do, judged per request by async chains, as kube-apiserver's
//! authentication and authorization filters.
//!
//! Authentication: each [`Authenticator`] looks at the request and its connection and answers
//! with a user, with "not mine" (`None`), or with an error. The [`Chain`] tries them in order and
//! takes the first user; with none the answer is 401 (anonymous access is off except for the
//! public health and version paths, see [`anonymous`]). Authorization: an [`Authorizer`] judges
//! [`Attributes`] shaped like a SubjectAccessReview; a denial is 403. Delegated authentication
//! (request headers, TokenReview) and authorization (SubjectAccessReview) are more of each.
//!
//! | module | owns |
//! |---|---|
//! | [`x509`] | users from verified client certificates |
//! | [`anonymous`] | the anonymous user, for the public paths only |
//! | [`policy`] | the direct-mode authorization policy |
//! | [`cache`] | the decision cache in front of an authorizer |
//! | [`remembered`] | bounded answers with a deadline, least recently used forgotten first |
//! | [`delegated`] | aggregated mode: request headers, the cluster's client CA, TokenReview, SubjectAccessReview |

pub mod anonymous;
pub mod cache;
pub mod delegated;
pub mod policy;
pub mod remembered;
pub mod x509;

/// The user the controllers act as, in this process; the direct-mode policy lets it write
/// status and finalizers.
pub const CONTROLLER_USER: &str = "system:kvcache-controller";

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use async_trait::async_trait;

/// An authenticated user.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct User {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

impl User {
    pub fn new(name: impl Into<String>, groups: &[&str]) -> User {
        User {
            name: name.into(),
            groups: groups.iter().map(|g| (*g).to_owned()).collect(),
            ..User::default()
        }
    }

    pub fn anonymous() -> User {
        User::new("system:anonymous", &["system:unauthenticated"])
    }

    pub fn in_group(&self, group: &str) -> bool {
        self.groups.iter().any(|g| g == group)
    }
}

/// What the transport knows about a request's client.
#[derive(Debug, Clone)]
pub enum ConnectionInfo {
    /// A TLS connection, with the client certificate chain TLS verified against our client CA.
    Tls {
        remote: SocketAddr,
        client: Option<Arc<x509::ClientCertificate>>,
    },
    /// A client inside this process (the controllers), under the identity it was built with.
    InProcess { user: User },
    /// Nothing known about the transport: no credentials but what the request itself carries.
    Unknown,
}

/// Why credentials were refused (401).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct AuthError(pub String);

/// One way of telling who sent a request.
#[async_trait]
pub trait Authenticator: Send + Sync {
    /// The user, `None` when this authenticator does not apply, or why the credentials it
    /// understands are refused.
    async fn authenticate(
        &self,
        parts: &http::request::Parts,
        conn: &ConnectionInfo,
    ) -> Result<Option<User>, AuthError>;
}

/// Authenticators tried in order: the first user wins; with none, the first refusal is reported.
#[derive(Clone, Default)]
pub struct Chain(Vec<Arc<dyn Authenticator>>);

impl std::fmt::Debug for Chain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Chain").field(&self.0.len()).finish()
    }
}

impl Chain {
    pub fn new(authenticators: Vec<Arc<dyn Authenticator>>) -> Chain {
        Chain(authenticators)
    }

    pub async fn authenticate(
        &self,
        parts: &http::request::Parts,
        conn: &ConnectionInfo,
    ) -> Result<Option<User>, AuthError> {
        let mut refused = None;
        for a in &self.0 {
            match a.authenticate(parts, conn).await {
                Ok(Some(user)) => return Ok(Some(user)),
                Ok(None) => {}
                Err(e) => {
                    refused.get_or_insert(e);
                }
            }
        }
        refused.map_or(Ok(None), Err)
    }
}

/// The users of in-process clients, who authenticate by construction.
#[derive(Debug, Default)]
pub struct InProcess;

#[async_trait]
impl Authenticator for InProcess {
    async fn authenticate(&self, _: &http::request::Parts, conn: &ConnectionInfo) -> Result<Option<User>, AuthError> {
        Ok(match conn {
            ConnectionInfo::InProcess { user } => Some(user.clone()),
            ConnectionInfo::Tls { .. } | ConnectionInfo::Unknown => None,
        })
    }
}

/// Bearer tokens and basic credentials, which direct mode has no way to verify: refused, never
/// ignored (delegated TokenReview takes this place in a cluster).
#[derive(Debug, Default)]
pub struct NoTokens;

#[async_trait]
impl Authenticator for NoTokens {
    async fn authenticate(&self, parts: &http::request::Parts, _: &ConnectionInfo) -> Result<Option<User>, AuthError> {
        if parts.headers.contains_key(http::header::AUTHORIZATION) {
            return Err(AuthError(
                "bearer tokens and basic credentials are not accepted by this server in direct mode; use the client certificate of the kubeconfig it wrote".into(),
            ));
        }
        Ok(None)
    }
}

/// A resource request, in SubjectAccessReview terms.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ResourceAttributes {
    pub group: String,
    pub version: String,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
}

/// What a request wants to do.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Target {
    Resource(ResourceAttributes),
    NonResource { path: String },
}

/// Who wants to do what, as a SubjectAccessReview asks it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Attributes {
    pub user: Arc<User>,
    pub verb: String,
    pub target: Target,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allow,
    /// The reason, appended to the standard 403 message when not empty.
    Deny(String),
    /// No decision could be made (the cluster did not answer a SubjectAccessReview): 500, and
    /// never cached.
    Error(String),
}

/// Judges [`Attributes`].
#[async_trait]
pub trait Authorizer: Send + Sync {
    async fn authorize(&self, attrs: &Attributes) -> Decision;

    /// What `user` may do in `namespace`, as rules (a SelfSubjectRulesReview's answer), when
    /// this authorizer can list them; `None` when it only judges one request at a time.
    fn rules(&self, _user: &User, _namespace: &str) -> Option<Rules> {
        None
    }
}

/// What a user may do, as a SelfSubjectRulesReview lists it: `(verbs, apiGroups, resources)`
/// per resource rule, `(verbs, paths)` per non-resource rule; `*` means any.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rules {
    pub resources: Vec<(Vec<String>, Vec<String>, Vec<String>)>,
    pub non_resources: Vec<(Vec<String>, Vec<String>)>,
}

/// The standard 403 message.
pub fn forbidden_message(attrs: &Attributes) -> String {
    let user = &attrs.user.name;
    let verb = &attrs.verb;
    match &attrs.target {
        Target::Resource(r) => {
            let res = if r.subresource.is_empty() {
                r.resource.clone()
            } else {
                format!("{}/{}", r.resource, r.subresource)
            };
            let qualified = if r.group.is_empty() {
                res.clone()
            } else {
                format!("{res}.{}", r.group)
            };
            let subject = if r.name.is_empty() {
                format!("{qualified} is forbidden")
            } else {
                format!("{qualified} {:?} is forbidden", r.name)
            };
            let scope = if r.namespace.is_empty() {
                "at the cluster scope".to_owned()
            } else {
                format!("in the namespace {:?}", r.namespace)
            };
            format!(
                "{subject}: User {user:?} cannot {verb} resource {res:?} in API group {:?} {scope}",
                r.group
            )
        }
        Target::NonResource { path } => format!("forbidden: User {user:?} cannot {verb} path {path:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed(Result<Option<User>, AuthError>);

    #[async_trait]
    impl Authenticator for Fixed {
        async fn authenticate(&self, _: &http::request::Parts, _: &ConnectionInfo) -> Result<Option<User>, AuthError> {
            self.0.clone()
        }
    }

    fn parts() -> http::request::Parts {
        http::Request::new(()).into_parts().0
    }

    #[tokio::test]
    async fn the_chain_takes_the_first_user_and_reports_refusals_only_without_one() {
        let conn = ConnectionInfo::InProcess {
            user: User::new("c", &[]),
        };
        let refuse = || Arc::new(Fixed(Err(AuthError("bad token".into())))) as Arc<dyn Authenticator>;
        let none = || Arc::new(Fixed(Ok(None))) as Arc<dyn Authenticator>;
        let alice = || Arc::new(Fixed(Ok(Some(User::new("alice", &[]))))) as Arc<dyn Authenticator>;
        let chain = Chain::new(vec![none(), refuse(), alice()]);
        assert_eq!(
            chain.authenticate(&parts(), &conn).await.unwrap().unwrap().name,
            "alice"
        );
        let chain = Chain::new(vec![none(), refuse()]);
        assert_eq!(
            chain.authenticate(&parts(), &conn).await,
            Err(AuthError("bad token".into()))
        );
        assert_eq!(Chain::new(vec![none()]).authenticate(&parts(), &conn).await, Ok(None));
        let chain = Chain::new(vec![Arc::new(InProcess)]);
        assert_eq!(chain.authenticate(&parts(), &conn).await.unwrap().unwrap().name, "c");
    }

    #[test]
    fn forbidden_messages_read_like_kube_apiserver() {
        let attrs = Attributes {
            user: Arc::new(User::new("u", &[])),
            verb: "create".into(),
            target: Target::Resource(ResourceAttributes {
                group: "worker.gpustack.ai".into(),
                version: "v1".into(),
                resource: "kvcachepoolbindings".into(),
                subresource: String::new(),
                namespace: "ns".into(),
                name: "b".into(),
            }),
        };
        assert_eq!(
            forbidden_message(&attrs),
            r#"kvcachepoolbindings.worker.gpustack.ai "b" is forbidden: User "u" cannot create resource "kvcachepoolbindings" in API group "worker.gpustack.ai" in the namespace "ns""#
        );
    }
}
