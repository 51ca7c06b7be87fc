//! The anonymous user, for the public paths only: health (`/healthz`, `/livez`, `/readyz` and
//! their checks) and `/version`, as kube-apiserver's anonymous authentication limited to those
//! paths. Any other request without credentials is 401.

use async_trait::async_trait;

use super::{AuthError, Authenticator, ConnectionInfo, User};

/// Paths anyone may read without credentials (with their sub-paths for the health checks).
pub const PUBLIC_PATHS: &[&str] = &["/healthz", "/livez", "/readyz", "/version"];

/// Whether `path` is public.
pub fn is_public(path: &str) -> bool {
    PUBLIC_PATHS
        .iter()
        .any(|p| path == *p || (*p != "/version" && path.strip_prefix(p).is_some_and(|rest| rest.starts_with('/'))))
}

/// Gives the public paths the anonymous user.
#[derive(Debug, Default)]
pub struct Anonymous;

#[async_trait]
impl Authenticator for Anonymous {
    async fn authenticate(&self, parts: &http::request::Parts, _: &ConnectionInfo) -> Result<Option<User>, AuthError> {
        Ok(is_public(parts.uri.path()).then(User::anonymous))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_health_and_version_are_public() {
        for p in ["/healthz", "/readyz", "/readyz/storage", "/livez/ping", "/version"] {
            assert!(is_public(p), "{p}");
        }
        for p in ["/", "/apis", "/metrics", "/version/x", "/healthzz", "/openapi/v2"] {
            assert!(!is_public(p), "{p}");
        }
    }
}
