//! What `kv-store leader`'s flags must satisfy beyond their syntax: the election's lease and
//! timings, the limits, the default layout and the tenants given on the command line, each
//! refusal saying which flag and what to do.

use super::{Election, LeaderConfig};
use crate::flags::{self, ConfigError};
use crate::leader::ledger;

impl LeaderConfig {
    /// Every check beyond the flags' syntax, each saying what to do.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_election()?;
        self.validate_limits()?;
        self.validate_default_layout()?;
        self.validate_tenants()
    }

    /// Checks the election flags: `--election kubernetes` needs a Lease and sane timings, and
    /// without it its flags have no use.
    fn validate_election(&self) -> Result<(), ConfigError> {
        match self.election {
            Election::Kubernetes => {
                let lease = self.election_lease.as_deref().ok_or_else(|| {
                    ConfigError::new(
                        "lease",
                        "--election kubernetes needs the Lease to campaign for, NAMESPACE/NAME",
                    )
                })?;
                crate::election::kube::LeaseRef::parse(lease).map_err(|e| ConfigError::new("lease", e))?;
                self.timings()
                    .validate()
                    .map_err(|e| ConfigError::new("lease-duration", e))?;
            }
            Election::None => {
                if self.election_lease.is_some() || self.kubeconfig.is_some() || self.identity.is_some() {
                    return Err(ConfigError::new(
                        "lease",
                        "--lease, --kubeconfig and --identity go with --election kubernetes",
                    ));
                }
            }
        }
        Ok(())
    }

    /// Checks the eviction shares, the largest value and the TTLs and intervals.
    fn validate_limits(&self) -> Result<(), ConfigError> {
        flags::share(
            "high-watermark",
            self.high_watermark,
            "eviction starts above it, e.g. 0.90",
        )?;
        flags::share("eviction-ratio", self.eviction_ratio, "each round frees it, e.g. 0.05")?;
        if self.max_value_size == 0 {
            return Err(ConfigError::new("max-value-size", "must be greater than 0, e.g. 64Mi"));
        }
        // the index keeps a value's size in 32 bits (`index/slots.rs`)
        if self.max_value_size > u64::from(u32::MAX) {
            return Err(ConfigError::new("max-value-size", "must be less than 4Gi, e.g. 64Mi"));
        }
        for (flag, d) in [("lease-ttl", self.read_lease_ttl), ("member-ttl", self.member_ttl)] {
            if d.is_zero() {
                return Err(ConfigError::new(flag, "must be longer than 0, e.g. 10s"));
            }
        }
        if self.put_ttl.is_zero() {
            return Err(ConfigError::new("put-ttl", "must be longer than 0, e.g. 30s"));
        }
        if self.eviction_interval.is_zero() {
            return Err(ConfigError::new(
                "eviction-interval",
                "must be longer than 0 (it is not a flag; set it in code)",
            ));
        }
        Ok(())
    }

    /// Checks the default layout: a block size above 0 and a dtype, given together or not at all.
    fn validate_default_layout(&self) -> Result<(), ConfigError> {
        if self.default_block_size == Some(0) {
            return Err(ConfigError::new("default-block-size", "must be greater than 0 tokens"));
        }
        if self.default_dtype.as_deref() == Some("") {
            return Err(ConfigError::new(
                "default-dtype",
                "is empty; give the dtype clients write in",
            ));
        }
        if self.default_block_size.is_some() != self.default_dtype.is_some() {
            return Err(ConfigError::new(
                "default-block-size",
                "give --default-block-size and --default-dtype together, or neither",
            ));
        }
        Ok(())
    }

    /// Checks `--tenant`: only with multi-tenancy, a valid ledger, and names its syntax can carry.
    fn validate_tenants(&self) -> Result<(), ConfigError> {
        if self.tenants.is_empty() {
            return Ok(());
        }
        if !self.multi_tenancy {
            return Err(ConfigError::new(
                "tenant",
                "with --multi-tenancy=false there is no ledger; drop --tenant or turn multi-tenancy on",
            ));
        }
        ledger::validate(&self.tenants, &[]).map_err(|e| ConfigError::new("tenant", e.message))?;
        if let Some(t) = self.tenants.iter().find(|t| t.name.contains('=')) {
            return Err(ConfigError::new(
                "tenant",
                format!(
                    "tenant name {:?} contains '=', which NAME=CEILING:BLOCK_SIZE:DTYPE cannot carry; rename it",
                    t.name
                ),
            ));
        }
        Ok(())
    }
}
