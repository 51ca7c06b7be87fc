//! Bearer tokens, verified by the cluster through a TokenReview (`authentication.k8s.io/v1`),
//! as kube-apiserver's delegated token authenticator. Answers are remembered for a short TTL,
//! keyed by the token's SHA-256 (the token itself is never kept), at most 10,000 of them, the
//! least recently used forgotten first; a review that fails to reach the cluster is not
//! remembered.

use std::time::{Duration, Instant};

use async_trait::async_trait;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::Api;
use kube::api::PostParams;
use parking_lot::Mutex;

use crate::auth::remembered::Remembered;
use crate::auth::{AuthError, Authenticator, ConnectionInfo, User};

/// Answers kept; past it the least recently used is forgotten.
const MAX_ENTRIES: usize = 10_000;

type Digest = [u8; 32];

pub struct TokenReviewer {
    api: Api<TokenReview>,
    ttl: Duration,
    cache: Mutex<Remembered<Digest, Result<User, AuthError>>>,
}

impl std::fmt::Debug for TokenReviewer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenReviewer")
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

impl TokenReviewer {
    pub fn new(client: kube::Client, ttl: Duration) -> TokenReviewer {
        TokenReviewer {
            api: Api::all(client),
            ttl,
            cache: Mutex::new(Remembered::new(MAX_ENTRIES)),
        }
    }

    async fn review(&self, token: &str) -> Result<Result<User, AuthError>, kube::Error> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                audiences: None,
            },
            ..TokenReview::default()
        };
        let answer = self.api.create(&PostParams::default(), &review).await?;
        let status = answer.status.unwrap_or_default();
        Ok(match (status.authenticated, status.user) {
            (Some(true), Some(u)) => {
                let mut user = User {
                    name: u.username.unwrap_or_default(),
                    uid: u.uid.unwrap_or_default(),
                    groups: u.groups.unwrap_or_default(),
                    extra: u.extra.unwrap_or_default().into_iter().collect(),
                };
                super::authenticated(&mut user);
                Ok(user)
            }
            _ => Err(AuthError(match status.error.filter(|e| !e.is_empty()) {
                Some(e) => format!("the cluster refused the bearer token: {e}"),
                None => "the cluster refused the bearer token".to_owned(),
            })),
        })
    }
}

/// The token of an `Authorization: Bearer` header; `None` without the header.
fn bearer(parts: &http::request::Parts) -> Result<Option<&str>, AuthError> {
    let Some(value) = parts.headers.get(http::header::AUTHORIZATION) else {
        return Ok(None);
    };
    let value = value
        .to_str()
        .map_err(|_| AuthError("the Authorization header is not text".into()))?;
    match value.split_once(' ') {
        Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty() => {
            Ok(Some(token.trim()))
        }
        _ => Err(AuthError(
            "only bearer tokens are accepted in the Authorization header (basic credentials are not)".into(),
        )),
    }
}

#[async_trait]
impl Authenticator for TokenReviewer {
    async fn authenticate(&self, parts: &http::request::Parts, _: &ConnectionInfo) -> Result<Option<User>, AuthError> {
        let Some(token) = bearer(parts)? else {
            return Ok(None);
        };
        let digest: Digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes())
            .as_ref()
            .try_into()
            .unwrap_or_default();
        let now = Instant::now();
        if let Some(answer) = self.cache.lock().get(&digest, now) {
            return answer.map(Some);
        }
        let answer = self.review(token).await.map_err(|e| {
            AuthError(format!(
                "the bearer token could not be verified (TokenReview failed): {e}"
            ))
        })?;
        self.cache.lock().insert(digest, answer.clone(), now + self.ttl);
        answer.map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(auth: Option<&str>) -> http::request::Parts {
        let mut b = http::Request::builder();
        if let Some(a) = auth {
            b = b.header("authorization", a);
        }
        b.body(()).unwrap().into_parts().0
    }

    #[test]
    fn only_bearer_tokens_are_taken() {
        assert_eq!(bearer(&parts(None)), Ok(None));
        assert_eq!(bearer(&parts(Some("Bearer abc"))), Ok(Some("abc")));
        assert_eq!(bearer(&parts(Some("bearer  abc "))), Ok(Some("abc")));
        assert!(bearer(&parts(Some("Basic dXNlcjpwYXNz"))).is_err());
        assert!(bearer(&parts(Some("Bearer "))).is_err());
        assert!(bearer(&parts(Some("abc"))).is_err());
    }
}
