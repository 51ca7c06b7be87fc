//! Each caller's cache use within a tenant: the leader counts gets, hits and puts per
//! `Scope.client` (an engine replica's name, which injection sets as `KVSTORE_CLIENT`), so a
//! controller in a cluster can tell which replicas use the cache without asking them. The table
//! is bounded per tenant: past [`MAX_CLIENTS_PER_TENANT`] names the least recently seen is
//! forgotten, so a caller inventing names costs the leader a fixed amount of memory.
//!
//! A name is the caller's own say-so; it only ever splits the tenant's own counters, so a
//! caller gains nothing by naming itself as another replica of the same tenant.

use std::collections::HashMap;

use crate::error::{ErrorCode, Result, StoreError};
use crate::proto::ClientStatus;

/// How many callers' counters a tenant keeps.
pub const MAX_CLIENTS_PER_TENANT: usize = 256;
/// The longest name a caller may give (a DNS subdomain's length, which fits
/// `<deployment>/<replica>` for any Kubernetes name).
pub const MAX_CLIENT_NAME: usize = 253;

/// What one call did, for its caller's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    /// A read: found (`hit`) or not.
    Get { hit: bool },
    /// A committed write.
    Put,
}

#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    gets: u64,
    hits: u64,
    puts: u64,
    /// the leader's tick at the last call, for forgetting the least recently seen
    last: u64,
}

/// One tenant's callers.
#[derive(Debug, Default)]
pub struct Clients {
    by_name: HashMap<String, Counts>,
}

impl Clients {
    /// Counts one call of `name` at `tick`; a call without a name is counted only in the
    /// tenant's totals.
    pub fn count(&mut self, name: &str, tick: u64, what: Use) {
        if name.is_empty() {
            return;
        }
        if !self.by_name.contains_key(name)
            && self.by_name.len() >= MAX_CLIENTS_PER_TENANT
            && let Some(oldest) = self.by_name.iter().min_by_key(|(_, c)| c.last).map(|(n, _)| n.clone())
        {
            self.by_name.remove(&oldest);
        }
        let c = self.by_name.entry(name.to_owned()).or_default();
        c.last = tick;
        match what {
            Use::Get { hit } => {
                c.gets += 1;
                c.hits += u64::from(hit);
            }
            Use::Put => c.puts += 1,
        }
    }

    /// The callers, most recently seen first.
    pub fn statuses(&self) -> Vec<ClientStatus> {
        let mut v: Vec<(&String, &Counts)> = self.by_name.iter().collect();
        v.sort_by(|a, b| b.1.last.cmp(&a.1.last).then_with(|| a.0.cmp(b.0)));
        v.into_iter()
            .map(|(name, c)| ClientStatus {
                name: name.clone(),
                gets: c.gets,
                hits: c.hits,
                puts: c.puts,
            })
            .collect()
    }
}

/// Refuses a caller name the leader will not keep: too long, or with control characters.
pub fn check_name(name: &str) -> Result<()> {
    if name.len() > MAX_CLIENT_NAME || name.chars().any(char::is_control) {
        return Err(StoreError::new(
            ErrorCode::InvalidArgument,
            format!(
                "the scope's client name must be at most {MAX_CLIENT_NAME} bytes of printable text (KVSTORE_CLIENT); \
                 this one has {} bytes",
                name.len()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn by_name(c: &Clients) -> Vec<(String, u64, u64, u64)> {
        c.statuses()
            .into_iter()
            .map(|s| (s.name, s.gets, s.hits, s.puts))
            .collect()
    }

    #[test]
    fn counts_each_callers_gets_hits_and_puts() {
        let mut c = Clients::default();
        c.count("md/server-0", 1, Use::Put);
        c.count("md/server-0", 2, Use::Get { hit: true });
        c.count("md/server-1", 3, Use::Get { hit: false });
        c.count("", 4, Use::Put);
        assert_eq!(
            by_name(&c),
            vec![("md/server-1".into(), 1, 0, 0), ("md/server-0".into(), 1, 1, 1)]
        );
    }

    #[test]
    fn forgets_the_least_recently_seen_past_the_bound() {
        let mut c = Clients::default();
        for i in 0..MAX_CLIENTS_PER_TENANT as u64 {
            c.count(&format!("c{i}"), i, Use::Put);
        }
        // c0 is seen again, so c1 is the oldest when a new name arrives
        c.count("c0", 1000, Use::Put);
        c.count("new", 1001, Use::Put);
        let names: Vec<String> = c.statuses().into_iter().map(|s| s.name).collect();
        assert_eq!(names.len(), MAX_CLIENTS_PER_TENANT);
        assert_eq!(&names[..2], ["new", "c0"]);
        assert!(!names.contains(&"c1".to_owned()));
    }

    #[test]
    fn refuses_long_or_control_names() {
        assert!(check_name("qwen-chat/server-0").is_ok());
        assert!(check_name("").is_ok());
        assert!(check_name(&"x".repeat(MAX_CLIENT_NAME + 1)).is_err());
        assert!(check_name("a\nb").is_err());
    }
}
