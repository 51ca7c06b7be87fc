//! A decision cache in front of an authorizer, as kube-apiserver's webhook authorizer keeps one:
//! allowed decisions for a few minutes, denials for a few seconds, at most a fixed number of
//! entries (the least recently used goes first, [`super::remembered`]). With delegated
//! authorization every request would otherwise be a SubjectAccessReview. Keys hash with foldhash
//! (seeded per process): a lookup costs far less than the request.

use std::time::{Duration, Instant};

use async_trait::async_trait;
use parking_lot::Mutex;

use super::remembered::Remembered;
use super::{Attributes, Authorizer, Decision};

/// Decisions kept; past it the least recently used is forgotten.
const MAX_ENTRIES: usize = 10_000;

/// `inner`, with its decisions remembered.
pub struct Cached<A> {
    inner: A,
    allow_ttl: Duration,
    deny_ttl: Duration,
    entries: Mutex<Remembered<Attributes, Decision>>,
}

impl<A> std::fmt::Debug for Cached<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cached")
            .field("entries", &self.entries.lock().len())
            .finish()
    }
}

impl<A: Authorizer> Cached<A> {
    /// kube-apiserver's defaults: allowed for 5 minutes, denied for 30 seconds.
    pub fn new(inner: A) -> Self {
        Self::with_ttls(inner, Duration::from_secs(300), Duration::from_secs(30))
    }

    pub fn with_ttls(inner: A, allow_ttl: Duration, deny_ttl: Duration) -> Self {
        Cached {
            inner,
            allow_ttl,
            deny_ttl,
            entries: Mutex::new(Remembered::new(MAX_ENTRIES)),
        }
    }
}

#[async_trait]
impl<A: Authorizer> Authorizer for Cached<A> {
    async fn authorize(&self, attrs: &Attributes) -> Decision {
        let now = Instant::now();
        if let Some(d) = self.entries.lock().get(attrs, now) {
            return d;
        }
        let decision = self.inner.authorize(attrs).await;
        let ttl = match decision {
            Decision::Allow => self.allow_ttl,
            Decision::Deny(_) => self.deny_ttl,
            Decision::Error(_) => return decision,
        };
        self.entries.lock().insert(attrs.clone(), decision.clone(), now + ttl);
        decision
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Target, User};
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct Counting(AtomicUsize);

    #[async_trait]
    impl Authorizer for Counting {
        async fn authorize(&self, attrs: &Attributes) -> Decision {
            self.0.fetch_add(1, Ordering::Relaxed);
            if attrs.verb == "get" {
                Decision::Allow
            } else {
                Decision::Deny(String::new())
            }
        }
    }

    #[tokio::test]
    async fn a_flood_of_one_off_requests_does_not_push_out_the_decisions_in_use() {
        let c = Cached::new(Counting(AtomicUsize::new(0)));
        c.authorize(&attrs("get")).await;
        // twice the bound of distinct requests (as a caller with a fresh token each time sends),
        // with the real user's request among them
        for i in 0..2 * MAX_ENTRIES {
            c.authorize(&attrs(&format!("junk-{i}"))).await;
            if i % 100 == 0 {
                assert_eq!(c.authorize(&attrs("get")).await, Decision::Allow);
            }
        }
        assert_eq!(
            c.inner.0.load(Ordering::Relaxed),
            1 + 2 * MAX_ENTRIES,
            "the decision in use was asked for once"
        );
        assert_eq!(c.entries.lock().len(), MAX_ENTRIES);
    }

    fn attrs(verb: &str) -> Attributes {
        Attributes {
            user: std::sync::Arc::new(User::new("u", &[])),
            verb: verb.into(),
            target: Target::NonResource { path: "/x".into() },
        }
    }

    #[tokio::test]
    async fn decisions_are_remembered_for_their_ttl() {
        let c = Cached::with_ttls(Counting(AtomicUsize::new(0)), Duration::from_secs(60), Duration::ZERO);
        for _ in 0..3 {
            assert_eq!(c.authorize(&attrs("get")).await, Decision::Allow);
        }
        assert_eq!(c.inner.0.load(Ordering::Relaxed), 1);
        // A zero TTL is never reused.
        c.authorize(&attrs("put")).await;
        c.authorize(&attrs("put")).await;
        assert_eq!(c.inner.0.load(Ordering::Relaxed), 3);
    }
}
