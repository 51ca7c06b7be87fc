//! `kv-store leader`'s flags, defined once: [`LeaderConfig`] is the clap struct the binary parses,
//! the value a library caller builds, and (through [`LeaderConfig::to_args`]) the command line a
//! process runtime spawns. [`LeaderConfig::validate`] holds every check the flags need beyond
//! their syntax; [`LeaderConfig::flag_names`] lists the long flags, read from clap's definition.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::ValueEnum;

use super::ledger::Layout;
use super::placement::AllocationStrategy;
use crate::flags::{self, FastListen, format_size, format_time, push};
use crate::proto::TenantEntry;

mod checks;

/// How a leader runs: every flag of `kv-store leader`.
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct LeaderConfig {
    /// gRPC listen address (Store, Membership, Control).
    #[arg(long, default_value = "127.0.0.1:50051")]
    pub listen: SocketAddr,
    /// The framed metadata port (default: the --listen port + 1, or any port when that is 0);
    /// `off` serves gRPC only.
    #[arg(long, value_parser = FastListen::parse)]
    pub fast_listen: Option<FastListen>,
    /// Serve /metrics, /healthz and /readyz here.
    #[arg(long)]
    pub metrics_listen: Option<SocketAddr>,
    /// Only registered tenants may write; `--multi-tenancy=false` puts everything in one tenant.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub multi_tenancy: bool,
    /// With multi-tenancy off: the block size every client must declare (unset: not checked).
    #[arg(long, requires = "default_dtype")]
    pub default_block_size: Option<u32>,
    /// With multi-tenancy off: the dtype every client must declare (unset: not checked).
    #[arg(long, requires = "default_block_size")]
    pub default_dtype: Option<String>,
    /// How a segment is chosen for a new value.
    #[arg(long, value_enum, default_value = "free-ratio-first")]
    pub allocation_strategy: AllocationStrategy,
    /// How long a get or exists protects a value from eviction and removal (its read lease;
    /// every other "lease" of the store is the election's Kubernetes Lease). The flag keeps its
    /// name, `--lease-ttl`, which backends' `extraArgs` carry.
    #[arg(long = "lease-ttl", default_value = "10s", value_parser = kvcache_units::parse_duration)]
    pub read_lease_ttl: Duration,
    /// A member silent for longer loses its objects.
    #[arg(long, default_value = "10s", value_parser = kvcache_units::parse_duration)]
    pub member_ttl: Duration,
    /// How long a writer has to send a reserved value.
    #[arg(long, default_value = "30s", value_parser = kvcache_units::parse_duration)]
    pub put_ttl: Duration,
    /// Extra wait before an abandoned reservation is reused (longer than a member's 10 s write grace).
    #[arg(long, default_value = "30s", value_parser = kvcache_units::parse_duration)]
    pub put_grace: Duration,
    /// Largest value accepted.
    #[arg(long, default_value = "64Mi", value_parser = flags::parse_size)]
    pub max_value_size: u64,
    /// How a get reads a value only on a member's disk tier: `direct` (the member streams it
    /// from disk to the reader, checked as it goes; the value stays on disk) or `load` (the member
    /// loads it back into memory first, and the reader reads it from there). store/README.md,
    /// "Disk tier", has what each costs.
    #[arg(long, value_enum, default_value = "direct")]
    pub tier_reads: TierReads,
    /// Evict when usage passes this share of capacity.
    #[arg(long, default_value_t = 0.90)]
    pub high_watermark: f64,
    /// Share of capacity freed per eviction round.
    #[arg(long, default_value_t = 0.05)]
    pub eviction_ratio: f64,
    /// Initial ledger entries, NAME=CEILING:BLOCK_SIZE:DTYPE (e.g. team-a=8Gi:64:bfloat16).
    #[arg(long = "tenant", value_parser = flags::parse_tenant)]
    pub tenants: Vec<TenantEntry>,
    /// Keep polling this long after a request instead of sleeping (store/README.md,
    /// "Performance"); 0 never polls.
    #[arg(long, default_value = "200us", value_parser = kvcache_units::parse_duration)]
    pub spin: Duration,
    /// How the serving leader is chosen: `none` (this process serves as soon as it listens) or
    /// `kubernetes` (it serves only while it holds the Lease `--lease`; see `election.rs`).
    #[arg(long, value_enum, default_value = "none")]
    pub election: Election,
    /// With `--election kubernetes`: the Lease, NAMESPACE/NAME.
    #[arg(long = "lease")]
    pub election_lease: Option<String>,
    /// With `--election kubernetes`: the kubeconfig of the Lease API (default: `KUBECONFIG`,
    /// `~/.kube/config`, or the in-cluster service account).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// The identity written into the Lease (default: the advertised gRPC address, HOST:PORT,
    /// which Lease-addressed members connect to).
    #[arg(long)]
    pub identity: Option<String>,
    /// Host written into the advertised address (default: the listen address's).
    #[arg(long)]
    pub advertise_host: Option<String>,
    /// The fast port clients are told to use (`Health.fast_port`), when something in front of
    /// the leaders forwards it (a Service); default: the port this process serves.
    #[arg(long)]
    pub advertise_fast_port: Option<u16>,
    /// How long the Lease is honoured after its holder last renewed it (whole seconds).
    #[arg(long, default_value = "2s", value_parser = kvcache_units::parse_duration)]
    pub lease_duration: Duration,
    /// A holder that has not renewed for this long stops serving (shorter than the lease).
    #[arg(long, default_value = "1500ms", value_parser = kvcache_units::parse_duration)]
    pub renew_deadline: Duration,
    /// Time between a holder's renewals and between a standby's attempts.
    #[arg(long, default_value = "250ms", value_parser = kvcache_units::parse_duration)]
    pub retry_period: Duration,
    /// A file holding the controllers' token: the Control API (SetTenants, GetTenants,
    /// GetMembers, RemoveMember) then takes only calls carrying it (`authorization: Bearer …`).
    #[arg(long)]
    pub control_token_file: Option<PathBuf>,
    /// A file holding the backend's member token: only members carrying it may mount.
    #[arg(long)]
    pub member_token_file: Option<PathBuf>,
    /// A file holding the backend's scrape token: `/metrics` shows the per-tenant series (whose
    /// labels name the cache domains) only to a scrape carrying it (`Authorization: Bearer …`). It
    /// grants nothing else; without it they are shown to a scrape carrying the Control token.
    #[arg(long)]
    pub metrics_token_file: Option<PathBuf>,
    /// A file holding the secret the backend's leaders seal committed values with (every leader of
    /// a backend the same, no member ever): a next leader adopts only what a leader sealed. Without
    /// it a leader seals with a key of its own process, so what members hold survives a new term of
    /// that process but not its restart nor another leader's taking over.
    #[arg(long)]
    pub seal_key_file: Option<PathBuf>,
    /// How often the housekeeping (liveness, reservation reaping, watermark eviction) runs. Not a
    /// flag: the command line cannot set it (tests and embedders can); `to_args` leaves it out.
    #[arg(skip = DEFAULT_EVICTION_INTERVAL)]
    pub eviction_interval: Duration,
    /// TLS on the gRPC and fast ports (`--tls-cert`, `--tls-key`; `tls.rs`).
    #[command(flatten)]
    pub tls: crate::tls::ServeFlags,
}

const DEFAULT_EVICTION_INTERVAL: Duration = Duration::from_millis(100);

/// How a get reads a value only on a member's disk tier (`--tier-reads`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TierReads {
    /// The member streams the value from disk to the reader, hashing it as it goes, and ends with
    /// whether it matched (`wire.rs`, op 7): the disk read overlaps the transfer, and nothing is
    /// evicted from memory for it.
    Direct,
    /// The member reads the value back into memory (evicting there if it must), and the get
    /// answers once it is there: a second read is a memory hit.
    Load,
}

/// How the serving leader is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Election {
    /// No election: the process serves as soon as it listens (one leader per backend).
    None,
    /// A Kubernetes Lease: only the holder serves; the others are standbys.
    Kubernetes,
}

/// The election defaults: a 2 s lease renewed every 250 ms, served at most 1.5 s after the last
/// renewal was sent. client-go's 15 s / 10 s / 2 s make a crash failover take about 15 s; these
/// make it about 2 s (store/README.md, "High availability"), at four Lease writes per second.
pub const ELECTION_TIMINGS: crate::election::Timings = crate::election::Timings {
    lease_duration: Duration::from_secs(2),
    renew_deadline: Duration::from_millis(1500),
    retry_period: Duration::from_millis(250),
};

impl Default for LeaderConfig {
    /// The flags' defaults (a unit test holds the two equal).
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 50051)),
            fast_listen: None,
            metrics_listen: None,
            multi_tenancy: true,
            default_block_size: None,
            default_dtype: None,
            allocation_strategy: AllocationStrategy::FreeRatioFirst,
            tier_reads: TierReads::Direct,
            read_lease_ttl: Duration::from_secs(10),
            member_ttl: Duration::from_secs(10),
            put_ttl: Duration::from_secs(30),
            put_grace: Duration::from_secs(30),
            max_value_size: 64 << 20,
            high_watermark: 0.90,
            eviction_ratio: 0.05,
            tenants: Vec::new(),
            spin: crate::spin::DEFAULT_SPIN,
            election: Election::None,
            election_lease: None,
            kubeconfig: None,
            identity: None,
            control_token_file: None,
            member_token_file: None,
            metrics_token_file: None,
            seal_key_file: None,
            advertise_host: None,
            advertise_fast_port: None,
            lease_duration: ELECTION_TIMINGS.lease_duration,
            renew_deadline: ELECTION_TIMINGS.renew_deadline,
            retry_period: ELECTION_TIMINGS.retry_period,
            eviction_interval: DEFAULT_EVICTION_INTERVAL,
            tls: crate::tls::ServeFlags::default(),
        }
    }
}

impl LeaderConfig {
    /// Members heartbeat four times per TTL, and at least every 500 ms (so they notice a new
    /// leader within half a second of it serving).
    pub fn heartbeat_interval(&self) -> Duration {
        (self.member_ttl / 4).clamp(Duration::from_millis(50), Duration::from_millis(500))
    }

    /// The default tenant's layout when multi-tenancy is off (none: not checked).
    pub fn default_layout(&self) -> Option<Layout> {
        let block_size = self.default_block_size?;
        let dtype = self.default_dtype.clone()?;
        Some(Layout { block_size, dtype })
    }

    /// The fast port's address: `--fast-listen`, else the gRPC port + 1 (any port when `listen`
    /// asks for any); `None` when it is off.
    pub fn fast_addr(&self, listen: SocketAddr) -> Option<SocketAddr> {
        match self.fast_listen {
            Some(FastListen::Off) => None,
            Some(FastListen::At(a)) => Some(a),
            None if listen.port() == 0 => Some(SocketAddr::new(listen.ip(), 0)),
            None => Some(SocketAddr::new(listen.ip(), listen.port().wrapping_add(1))),
        }
    }

    /// The election's timings.
    pub fn timings(&self) -> crate::election::Timings {
        crate::election::Timings {
            lease_duration: self.lease_duration,
            renew_deadline: self.renew_deadline,
            retry_period: self.retry_period,
        }
    }

    /// The Lease of `--election kubernetes`.
    pub fn lease_ref(&self) -> Option<crate::election::kube::LeaseRef> {
        crate::election::kube::LeaseRef::parse(self.election_lease.as_deref()?).ok()
    }

    /// The gRPC address others are told (`--advertise-host` with the bound port).
    pub fn advertised(&self, bound: SocketAddr) -> String {
        match &self.advertise_host {
            Some(h) => format!("{h}:{}", bound.port()),
            None => bound.to_string(),
        }
    }

    /// The flags that parse back to this config (every flag, defaults included, so the spawned
    /// process does not depend on its own defaults). `eviction_interval` is not a flag and is left
    /// out; durations are exact to the microsecond.
    pub fn to_args(&self) -> Vec<String> {
        let mut a = Vec::new();
        push(&mut a, "listen", self.listen);
        if let Some(f) = self.fast_listen {
            push(&mut a, "fast-listen", f);
        }
        if let Some(m) = self.metrics_listen {
            push(&mut a, "metrics-listen", m);
        }
        a.push(format!("--multi-tenancy={}", self.multi_tenancy));
        if let Some(b) = self.default_block_size {
            push(&mut a, "default-block-size", b);
        }
        if let Some(d) = &self.default_dtype {
            push(&mut a, "default-dtype", d);
        }
        if let Some(v) = self.allocation_strategy.to_possible_value() {
            push(&mut a, "allocation-strategy", v.get_name());
        }
        if let Some(v) = self.tier_reads.to_possible_value() {
            push(&mut a, "tier-reads", v.get_name());
        }
        push(&mut a, "lease-ttl", format_time(self.read_lease_ttl));
        push(&mut a, "member-ttl", format_time(self.member_ttl));
        push(&mut a, "put-ttl", format_time(self.put_ttl));
        push(&mut a, "put-grace", format_time(self.put_grace));
        push(&mut a, "max-value-size", format_size(self.max_value_size));
        push(&mut a, "high-watermark", self.high_watermark);
        push(&mut a, "eviction-ratio", self.eviction_ratio);
        for t in &self.tenants {
            push(&mut a, "tenant", flags::format_tenant(t));
        }
        push(&mut a, "spin", format_time(self.spin));
        if let Some(p) = &self.control_token_file {
            push(&mut a, "control-token-file", p.display());
        }
        if let Some(p) = &self.member_token_file {
            push(&mut a, "member-token-file", p.display());
        }
        if let Some(p) = &self.metrics_token_file {
            push(&mut a, "metrics-token-file", p.display());
        }
        if let Some(p) = &self.seal_key_file {
            push(&mut a, "seal-key-file", p.display());
        }
        if let Some(v) = self.election.to_possible_value() {
            push(&mut a, "election", v.get_name());
        }
        if let Some(l) = &self.election_lease {
            push(&mut a, "lease", l);
        }
        if let Some(k) = &self.kubeconfig {
            push(&mut a, "kubeconfig", k.display());
        }
        if let Some(i) = &self.identity {
            push(&mut a, "identity", i);
        }
        if let Some(h) = &self.advertise_host {
            push(&mut a, "advertise-host", h);
        }
        if let Some(p) = self.advertise_fast_port {
            push(&mut a, "advertise-fast-port", p);
        }
        push(&mut a, "lease-duration", format_time(self.lease_duration));
        push(&mut a, "renew-deadline", format_time(self.renew_deadline));
        push(&mut a, "retry-period", format_time(self.retry_period));
        self.tls.to_args(&mut a);
        a
    }

    /// Parses `kv-store leader`'s flags (without the program and subcommand names).
    pub fn parse_args<I, T>(args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        flags::parse_flags(args)
    }

    /// The long names (without dashes) of every flag `kv-store leader` accepts, from clap's
    /// definition of this struct.
    pub fn flag_names() -> Vec<String> {
        flags::long_flags::<Self>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_the_flags_defaults() {
        assert_eq!(
            LeaderConfig::parse_args::<[&str; 0], &str>([]).unwrap(),
            LeaderConfig::default()
        );
        LeaderConfig::default().validate().unwrap();
    }

    #[test]
    fn to_args_parses_back_to_the_same_config() {
        let tenant = |name: &str, ceiling| TenantEntry {
            name: name.into(),
            ceiling,
            block_size: 16,
            dtype: "float16".into(),
            ..Default::default()
        };
        let configs = [
            LeaderConfig::default(),
            LeaderConfig {
                listen: "0.0.0.0:0".parse().unwrap(),
                fast_listen: Some(FastListen::Off),
                metrics_listen: Some("127.0.0.1:9100".parse().unwrap()),
                allocation_strategy: AllocationStrategy::Random,
                tier_reads: TierReads::Load,
                read_lease_ttl: Duration::from_millis(1500),
                member_ttl: Duration::from_secs(120),
                put_ttl: Duration::from_micros(7),
                put_grace: Duration::ZERO,
                max_value_size: 1000,
                high_watermark: 0.123456789,
                eviction_ratio: 1.0,
                tenants: vec![tenant("a", 8 << 30), tenant("b", 12345)],
                spin: Duration::ZERO,
                election: Election::Kubernetes,
                election_lease: Some("kvcache-system/b-leader".into()),
                kubeconfig: Some("/tmp/store.kubeconfig".into()),
                identity: Some("127.0.0.1:7".into()),
                advertise_host: Some("10.0.0.1".into()),
                advertise_fast_port: Some(7001),
                seal_key_file: Some("/etc/kv-store/tokens/seal.key".into()),
                metrics_token_file: Some("/etc/kv-store/tokens/metrics.token".into()),
                lease_duration: Duration::from_secs(15),
                renew_deadline: Duration::from_secs(10),
                retry_period: Duration::from_secs(2),
                tls: crate::tls::ServeFlags {
                    tls_cert: Some("/etc/kv-store/tls/tls.crt".into()),
                    tls_key: Some("/etc/kv-store/tls/tls.key".into()),
                },
                ..Default::default()
            },
            LeaderConfig {
                fast_listen: Some(FastListen::At("[::1]:7000".parse().unwrap())),
                multi_tenancy: false,
                default_block_size: Some(32),
                default_dtype: Some("bfloat16".into()),
                ..Default::default()
            },
        ];
        for cfg in configs {
            let args = cfg.to_args();
            let back = LeaderConfig::parse_args(&args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
            assert_eq!(back, cfg, "{args:?}");
        }
    }

    #[test]
    fn flag_names_are_the_flags_clap_accepts() {
        let names = LeaderConfig::flag_names();
        for n in ["listen", "fast-listen", "tenant", "multi-tenancy", "spin", "put-grace"] {
            assert!(names.iter().any(|f| f == n), "{n} missing from {names:?}");
        }
        assert!(
            !names.iter().any(|f| f == "eviction-interval" || f == "tenants"),
            "{names:?}"
        );
        assert_eq!(names.len(), 32, "{names:?}");
        // every name is a flag the parser knows
        for n in &names {
            let err = LeaderConfig::parse_args([format!("--{n}=x")]).err();
            assert!(
                err.is_none_or(|e| e.kind() != clap::error::ErrorKind::UnknownArgument),
                "--{n}"
            );
        }
    }

    #[test]
    fn checks_say_which_flag_and_what_to_do() {
        let bad = |cfg: LeaderConfig| cfg.validate().unwrap_err();
        let e = bad(LeaderConfig {
            high_watermark: 1.5,
            ..Default::default()
        });
        assert_eq!(e.flag, "high-watermark");
        assert!(e.to_string().contains("between 0 and 1"), "{e}");
        assert_eq!(
            bad(LeaderConfig {
                eviction_ratio: f64::NAN,
                ..Default::default()
            })
            .flag,
            "eviction-ratio"
        );
        assert_eq!(
            bad(LeaderConfig {
                max_value_size: 0,
                ..Default::default()
            })
            .flag,
            "max-value-size"
        );
        assert_eq!(
            bad(LeaderConfig {
                max_value_size: 4 << 30,
                ..Default::default()
            })
            .flag,
            "max-value-size",
            "a value's size is kept in 32 bits"
        );
        assert_eq!(
            bad(LeaderConfig {
                member_ttl: Duration::ZERO,
                ..Default::default()
            })
            .flag,
            "member-ttl"
        );
        let dup = TenantEntry {
            name: "a".into(),
            ceiling: 1,
            block_size: 1,
            dtype: "x".into(),
            ..Default::default()
        };
        let e = bad(LeaderConfig {
            tenants: vec![dup.clone(), dup.clone()],
            ..Default::default()
        });
        assert!(e.flag == "tenant" && e.message.contains("listed twice"), "{e}");
        let e = bad(LeaderConfig {
            multi_tenancy: false,
            tenants: vec![dup],
            ..Default::default()
        });
        assert!(e.message.contains("no ledger"), "{e}");
        let e = LeaderConfig::parse_args(["--fast-listen", "nowhere"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("neither `off` nor"), "{e}");
        let e = LeaderConfig::parse_args(["--tenant", "a=1Gi"]).unwrap_err().to_string();
        assert!(e.contains("NAME=CEILING:BLOCK_SIZE:DTYPE"), "{e}");
    }

    #[test]
    fn the_election_needs_its_lease_and_sane_timings() {
        let elect = |args: &[&str]| LeaderConfig::parse_args(args).unwrap().validate();
        assert_eq!(elect(&["--election", "kubernetes"]).unwrap_err().flag, "lease");
        assert_eq!(
            elect(&["--election", "kubernetes", "--lease", "no-namespace"])
                .unwrap_err()
                .flag,
            "lease"
        );
        elect(&["--election", "kubernetes", "--lease", "ns/b-leader"]).unwrap();
        let e = elect(&[
            "--election",
            "kubernetes",
            "--lease",
            "ns/b-leader",
            "--renew-deadline",
            "3s",
        ])
        .unwrap_err();
        assert!(
            e.flag == "lease-duration" && e.message.contains("renew deadline"),
            "{e}"
        );
        let e = elect(&["--lease", "ns/b-leader"]).unwrap_err();
        assert!(e.message.contains("--election kubernetes"), "{e}");
        assert!(ELECTION_TIMINGS.validate().is_ok());
    }
}
