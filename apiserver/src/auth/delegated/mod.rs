//! Aggregated mode: who is asking is decided with the cluster, as an extension API server behind
//! kube-apiserver's aggregation layer does it (kube's delegated authentication and
//! authorization options).
//!
//! Authentication, in order:
//! 1. [`request_header`]: the user kube-apiserver's front proxy forwards in `X-Remote-*` headers,
//!    trusted only on a connection whose client certificate chains to the front proxy's CA;
//! 2. [`client_ca`]: client certificates of the cluster's client CA;
//! 3. [`token_review`]: bearer tokens, through TokenReview;
//! 4. the anonymous user, for the public health and version paths only.
//!
//! Both CAs and the header names come from the ConfigMap the cluster publishes ([`extension`]),
//! watched, so a rotation applies without a restart. Authorization: `system:masters` and the
//! public paths are allowed here (kube's always-allow group and paths); everything else is a
//! SubjectAccessReview ([`subject_access_review`]) behind the decision cache.
//!
//! | module | owns |
//! |---|---|
//! | [`flags`] | the `--auth delegated` flags and what they resolve to |
//! | [`extension`] | the extension-apiserver-authentication ConfigMap, parsed and watched |
//! | [`verify`] | verifying a certificate chain against one CA bundle |
//! | [`request_header`] | users forwarded by the front proxy |
//! | [`client_ca`] | users from the cluster's client certificates |
//! | [`token_review`] | users from bearer tokens |
//! | [`subject_access_review`] | decisions from the cluster's RBAC |

pub mod client_ca;
pub mod extension;
pub mod flags;
pub mod request_header;
pub mod subject_access_review;
pub mod token_review;
pub mod verify;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::anonymous::{self, Anonymous};
use super::cache::Cached;
use super::{Attributes, Authorizer, Chain, Decision, Target, User};

/// Where the cluster is, and how long answers are remembered.
#[derive(Debug, Clone)]
pub struct DelegatedOptions {
    /// The cluster for TokenReviews and the ConfigMap; `None` infers it (in-cluster configuration
    /// in a Pod).
    pub authentication_kubeconfig: Option<PathBuf>,
    /// The cluster for SubjectAccessReviews; `None` infers it.
    pub authorization_kubeconfig: Option<PathBuf>,
    pub token_ttl: Duration,
    pub allow_ttl: Duration,
    pub deny_ttl: Duration,
}

impl DelegatedOptions {
    /// kube-apiserver's delegated defaults: every answer remembered for 10 seconds.
    pub fn new() -> DelegatedOptions {
        DelegatedOptions {
            authentication_kubeconfig: None,
            authorization_kubeconfig: None,
            token_ttl: Duration::from_secs(10),
            allow_ttl: Duration::from_secs(10),
            deny_ttl: Duration::from_secs(10),
        }
    }
}

impl Default for DelegatedOptions {
    fn default() -> Self {
        DelegatedOptions::new()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DelegatedError {
    #[error("the authentication kubeconfig: {0}")]
    AuthenticationClient(String),
    #[error("the authorization kubeconfig: {0}")]
    AuthorizationClient(String),
    #[error(transparent)]
    Extension(#[from] extension::LoadError),
}

/// The authentication chain and the authorizer of aggregated mode.
#[derive(Clone)]
pub struct Delegated {
    pub authn: Chain,
    pub authz: Arc<dyn Authorizer>,
}

impl std::fmt::Debug for Delegated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delegated")
            .field("authn", &self.authn)
            .finish_non_exhaustive()
    }
}

impl Delegated {
    /// Connects to the cluster and reads its authentication configuration (then keeps watching
    /// it); an error says which permission or file is missing.
    pub async fn start(opts: &DelegatedOptions) -> Result<Delegated, DelegatedError> {
        let authn_client = kvcache_store::election::kube::client(opts.authentication_kubeconfig.as_deref())
            .await
            .map_err(DelegatedError::AuthenticationClient)?;
        let authz_client = kvcache_store::election::kube::client(opts.authorization_kubeconfig.as_deref())
            .await
            .map_err(DelegatedError::AuthorizationClient)?;
        let source = extension::Source::load_and_watch(authn_client.clone()).await?;
        let authn = Chain::new(vec![
            Arc::new(super::InProcess),
            Arc::new(request_header::RequestHeaderAuth::new(source.clone())),
            Arc::new(client_ca::ClientCa::new(source)),
            Arc::new(token_review::TokenReviewer::new(authn_client, opts.token_ttl)),
            Arc::new(Anonymous),
        ]);
        let reviews = subject_access_review::SubjectAccessReviewer::new(authz_client);
        let authz = Arc::new(ClusterAuthorizer {
            reviews: Cached::with_ttls(reviews, opts.allow_ttl, opts.deny_ttl),
        });
        Ok(Delegated { authn, authz })
    }
}

/// The group of this server's own in-process clients (the controllers): allowed here without
/// asking the cluster. Only [`super::InProcess`] hands it out; a user from the network that
/// claims it loses it ([`authenticated`]).
pub const IN_PROCESS_GROUP: &str = "system:kvcache:in-process";

/// Adds `system:authenticated` to an authenticated user who lacks it, as kube's authenticated
/// group adder: the aggregator fetches legacy discovery and OpenAPI as users with no groups, and
/// the cluster's `system:discovery` role is bound to that group.
fn authenticated(user: &mut User) {
    const GROUP: &str = "system:authenticated";
    user.groups.retain(|g| g != IN_PROCESS_GROUP);
    if !user.in_group(GROUP) {
        user.groups.push(GROUP.to_owned());
    }
}

/// `system:masters` and the public paths here; the cluster for the rest.
struct ClusterAuthorizer<A> {
    reviews: Cached<A>,
}

/// Allowed without asking the cluster, as kube's always-allow group and paths.
fn always_allowed(attrs: &Attributes) -> bool {
    attrs.user.in_group("system:masters")
        || attrs.user.in_group(IN_PROCESS_GROUP)
        || matches!(&attrs.target, Target::NonResource { path } if anonymous::is_public(path))
}

#[async_trait]
impl<A: Authorizer> Authorizer for ClusterAuthorizer<A> {
    async fn authorize(&self, attrs: &Attributes) -> Decision {
        if always_allowed(attrs) {
            return Decision::Allow;
        }
        self.reviews.authorize(attrs).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masters_and_health_need_no_review() {
        let at = |user: User, path: &str| Attributes {
            user: Arc::new(user),
            verb: "get".into(),
            target: Target::NonResource { path: path.into() },
        };
        assert!(always_allowed(&at(
            User::new("system:kube-aggregator", &["system:masters"]),
            "/apis"
        )));
        assert!(always_allowed(&at(User::anonymous(), "/readyz")));
        assert!(!always_allowed(&at(
            User::new("alice", &["system:authenticated"]),
            "/apis"
        )));
        assert!(!always_allowed(&at(User::anonymous(), "/metrics")));
        assert!(always_allowed(&at(
            User::new("system:kvcache-controller", &[IN_PROCESS_GROUP]),
            "/apis"
        )));
        // A user from the network never keeps the in-process group.
        let mut claimed = User::new("mallory", &[IN_PROCESS_GROUP]);
        authenticated(&mut claimed);
        assert_eq!(claimed.groups, ["system:authenticated"]);
    }
}
