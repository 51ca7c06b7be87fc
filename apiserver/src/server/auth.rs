//! Who is asking and what they may do.
//!
//! Direct mode: a client certificate verified by the TLS layer against our client CA names the
//! user (CN) and groups (O); no certificate is `system:anonymous`. Every authenticated user also
//! gets `system:authenticated`. Authorization is a small static policy: `system:masters` may do
//! everything, `gpustack:viewers` may get, list and watch, any authenticated user may read
//! discovery, OpenAPI and `/version`. Both seams are traits so that delegated authentication
//! (TokenReview, request headers) and authorization (SubjectAccessReview) can replace them.

use rustls_pki_types::CertificateDer;

/// An authenticated (or anonymous) user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub groups: Vec<String>,
}

impl User {
    pub fn anonymous() -> User {
        User {
            name: "system:anonymous".to_owned(),
            groups: vec!["system:unauthenticated".to_owned()],
        }
    }

    pub fn is_anonymous(&self) -> bool {
        self.name == "system:anonymous"
    }
}

/// What a request wants to do, in authorization terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attributes {
    Resource {
        verb: String,
        namespace: String,
        resource: String,
        subresource: String,
        name: String,
    },
    NonResource {
        verb: String,
        path: String,
    },
}

pub trait Authenticator: Send + Sync {
    /// The user of a connection from its verified peer certificates; `Err` is a 401 message.
    fn authenticate(&self, peer: Option<&[CertificateDer<'static>]>) -> Result<User, String>;
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allow,
    /// The reason, appended to the standard 403 message.
    Deny(String),
}

pub trait Authorizer: Send + Sync {
    fn authorize(&self, user: &User, attrs: &Attributes) -> Decision;
}

/// Users from client certificates (the TLS layer already verified the chain).
#[derive(Debug, Default)]
pub struct X509Authenticator;

impl Authenticator for X509Authenticator {
    fn authenticate(&self, peer: Option<&[CertificateDer<'static>]>) -> Result<User, String> {
        let Some(leaf) = peer.and_then(|p| p.first()) else {
            return Ok(User::anonymous());
        };
        let (_, cert) = x509_parser::parse_x509_certificate(leaf.as_ref())
            .map_err(|e| format!("the client certificate cannot be parsed: {e}"))?;
        let subject = cert.subject();
        let name = subject
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .filter(|cn| !cn.is_empty())
            .ok_or("the client certificate has no common name (CN), which names the user")?
            .to_owned();
        let mut groups: Vec<String> = subject
            .iter_organization()
            .filter_map(|o| o.as_str().ok().map(str::to_owned))
            .collect();
        groups.push("system:authenticated".to_owned());
        Ok(User { name, groups })
    }
}

/// The direct-mode policy described in the module comment.
#[derive(Debug, Default)]
pub struct StaticPolicy;

const READ_VERBS: &[&str] = &["get", "list", "watch"];

impl Authorizer for StaticPolicy {
    fn authorize(&self, user: &User, attrs: &Attributes) -> Decision {
        let in_group = |g: &str| user.groups.iter().any(|x| x == g);
        if in_group("system:masters") {
            return Decision::Allow;
        }
        match attrs {
            Attributes::Resource { verb, .. }
                if in_group("gpustack:viewers") && READ_VERBS.contains(&verb.as_str()) =>
            {
                Decision::Allow
            }
            Attributes::NonResource { verb, path } if in_group("system:authenticated") && verb == "get" => {
                let discovery = path == "/api"
                    || path == "/apis"
                    || path.starts_with("/api/")
                    || path.starts_with("/apis/")
                    || path.starts_with("/openapi/")
                    || path == "/version"
                    || path == "/metrics";
                if discovery {
                    Decision::Allow
                } else {
                    Decision::Deny(String::new())
                }
            }
            _ => Decision::Deny(String::new()),
        }
    }
}

/// The standard 403 message.
pub fn forbidden_message(user: &User, attrs: &Attributes) -> String {
    match attrs {
        Attributes::Resource {
            verb,
            namespace,
            resource,
            subresource,
            name,
        } => {
            let res = if subresource.is_empty() {
                resource.clone()
            } else {
                format!("{resource}/{subresource}")
            };
            let subject = if name.is_empty() {
                format!("{res}.{} is forbidden", kvcache_api::GROUP)
            } else {
                format!("{res}.{} {name:?} is forbidden", kvcache_api::GROUP)
            };
            let scope = if namespace.is_empty() {
                "at the cluster scope".to_owned()
            } else {
                format!("in the namespace {namespace:?}")
            };
            format!(
                "{subject}: User {:?} cannot {verb} resource {res:?} in API group {:?} {scope}",
                user.name,
                kvcache_api::GROUP
            )
        }
        Attributes::NonResource { verb, path } => {
            format!("forbidden: User {:?} cannot {verb} path {path:?}", user.name)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(groups: &[&str]) -> User {
        User {
            name: "u".into(),
            groups: groups.iter().map(|g| (*g).to_owned()).collect(),
        }
    }

    fn res(verb: &str) -> Attributes {
        Attributes::Resource {
            verb: verb.into(),
            namespace: "ns".into(),
            resource: "kvcachepoolbindings".into(),
            subresource: String::new(),
            name: "b".into(),
        }
    }

    #[test]
    fn policy() {
        let p = StaticPolicy;
        assert_eq!(p.authorize(&user(&["system:masters"]), &res("delete")), Decision::Allow);
        let viewer = user(&["gpustack:viewers", "system:authenticated"]);
        assert_eq!(p.authorize(&viewer, &res("list")), Decision::Allow);
        assert!(matches!(p.authorize(&viewer, &res("create")), Decision::Deny(_)));
        let anon = User::anonymous();
        assert!(matches!(p.authorize(&anon, &res("get")), Decision::Deny(_)));
        let disc = Attributes::NonResource {
            verb: "get".into(),
            path: "/apis".into(),
        };
        assert_eq!(p.authorize(&user(&["system:authenticated"]), &disc), Decision::Allow);
        assert!(matches!(p.authorize(&anon, &disc), Decision::Deny(_)));
        assert_eq!(
            forbidden_message(&viewer, &res("create")),
            r#"kvcachepoolbindings.worker.gpustack.ai "b" is forbidden: User "u" cannot create resource "kvcachepoolbindings" in API group "worker.gpustack.ai" in the namespace "ns""#
        );
    }
}
