//! What several controllers read or say the same way, so that no controller imports another: when
//! the next pass comes ([`Next`]), the backend a pool names, the endpoints a backend publishes, a hit rate, a list of names in a
//! message, and the "held by …; delete them first" message a deletion waits on.

use std::time::Duration;

use kube::runtime::controller::Action;
use kube::{Api, Client};
use kvcache_api::backend::EndpointName;
use kvcache_api::{KVCacheBackend, KVCachePool};

/// When a controller's next pass comes, as its pure `decide` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    Requeue(Duration),
    AwaitChange,
}

impl From<Next> for Action {
    fn from(next: Next) -> Action {
        match next {
            Next::Requeue(after) => Action::requeue(after),
            Next::AwaitChange => Action::await_change(),
        }
    }
}

pub use crate::registry::holders::{held_by, names};

/// The address a backend publishes for `which`, once it has.
pub fn endpoint(b: &KVCacheBackend, which: EndpointName) -> Option<String> {
    b.status
        .as_ref()?
        .endpoints
        .iter()
        .find(|e| e.name == Some(which))
        .map(|e| e.address.clone())
}

/// `hits / (hits + misses)` with at most 4 decimals, when there were lookups.
pub fn hit_rate(hits: u64, misses: u64) -> Option<String> {
    let n = hits + misses;
    (n > 0)
        .then(|| {
            let r = hits as f64 / n as f64;
            let s = format!("{:.4}", r.clamp(0.0, 1.0));
            s.trim_end_matches('0').trim_end_matches('.').to_owned()
        })
        .map(|s| if s.is_empty() { "0".into() } else { s })
}

/// The pool named `pool` and the backend it names, each if it exists.
pub async fn pool_and_backend(
    client: &Client,
    pool: &str,
) -> Result<(Option<KVCachePool>, Option<KVCacheBackend>), kube::Error> {
    if pool.is_empty() {
        return Ok((None, None));
    }
    let Some(pool) = Api::<KVCachePool>::all(client.clone()).get_opt(pool).await? else {
        return Ok((None, None));
    };
    let backend = match pool.spec.backend() {
        Some(b) => Api::<KVCacheBackend>::all(client.clone()).get_opt(b).await?,
        None => None,
    };
    Ok((Some(pool), backend))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hit_rates_have_at_most_four_decimals() {
        assert_eq!(hit_rate(0, 0), None);
        assert_eq!(hit_rate(1, 2).as_deref(), Some("0.3333"));
        assert_eq!(hit_rate(5, 0).as_deref(), Some("1"));
        assert_eq!(hit_rate(0, 5).as_deref(), Some("0"));
    }
}
