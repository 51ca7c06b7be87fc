//! `kv-store member`'s flags, defined once: [`MemberConfig`] is the clap struct the binary
//! parses, the value a library caller builds, and (through [`MemberConfig::to_args`]) the command
//! line a process runtime spawns. [`MemberConfig::validate`] holds the checks beyond syntax;
//! [`MemberConfig::flag_names`] lists the long flags, read from clap's definition.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::flags::{self, ConfigError, format_size, format_time, push};

/// `--leader k8s://NAMESPACE/NAME`: follow the holder of an election Lease.
pub const LEASE_SCHEME: &str = "k8s://";

/// `--tier-watermark HIGH:LOW`: two percentages, 1 to 100, LOW below HIGH.
fn parse_watermark(s: &str) -> Result<(u8, u8), String> {
    let (high, low) = s
        .split_once(':')
        .ok_or_else(|| format!("{s:?} is not HIGH:LOW (two percentages, e.g. 90:80)"))?;
    let pct = |v: &str| {
        v.trim()
            .parse::<u8>()
            .ok()
            .filter(|p| (1..=100).contains(p))
            .ok_or_else(|| format!("{v:?} is not a percentage from 1 to 100"))
    };
    let (high, low) = (pct(high)?, pct(low)?);
    if low >= high {
        return Err(format!("the low mark {low} must be below the high mark {high}"));
    }
    Ok((high, low))
}

/// `--tier-file-size`'s default.
pub const DEFAULT_TIER_FILE_SIZE: u64 = 64 << 20;

/// How a member runs: every flag of `kv-store member`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct MemberConfig {
    /// Where the serving leader is: its gRPC address, HOST:PORT (a Service in front of the
    /// leaders), or `k8s://NAMESPACE/NAME` to follow the holder of that election Lease.
    #[arg(long)]
    pub leader: String,
    /// With `--leader k8s://…`: the kubeconfig of the Lease API (default: `KUBECONFIG`,
    /// `~/.kube/config`, or the in-cluster service account).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Bytes of memory this member holds (e.g. 8Gi).
    #[arg(long, value_parser = flags::parse_size)]
    pub capacity: u64,
    /// gRPC (SegmentData) listen address.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// Framed data port listen address.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub data_listen: SocketAddr,
    /// Stable member name (the node); defaults to the host name. Each member on a host needs its
    /// own.
    #[arg(long)]
    pub name: Option<String>,
    /// Where the segment's file goes when the kernel refuses memfds (it is unlinked right after
    /// it is created); normally the segment is a memfd and this is not used.
    #[arg(long, default_value = "/dev/shm")]
    pub shm_dir: PathBuf,
    /// Host written into the addresses given to the leader (default: the listen address's).
    #[arg(long)]
    pub advertise_host: Option<String>,
    /// Serve /metrics, /healthz and /readyz here.
    #[arg(long)]
    pub metrics_listen: Option<SocketAddr>,
    /// Largest value accepted over gRPC.
    #[arg(long, default_value = "64Mi", value_parser = flags::parse_size)]
    pub max_value_size: u64,
    /// Claim the segment's memory as it is written, instead of faulting every page in at start.
    #[arg(long)]
    pub no_prefault: bool,
    /// Also serve the same-host socket, through which a client on this host maps the segment
    /// instead of sending its bytes over TCP (store/README.md, "Same host"). A mapping is the
    /// whole segment, read and write: a client granted one range of one tenant can then read
    /// and overwrite every tenant's bytes on this member, for as long as it keeps the mapping.
    /// Off unless asked for; turn it on only where every engine on the node may see every
    /// tenant's cache (one tenant per backend, or one trust domain).
    #[arg(long)]
    pub same_host: bool,
    /// A file holding the backend's member token, shown to the leader on every mount and
    /// heartbeat (a leader started with `--member-token-file` takes no member without it).
    #[arg(long)]
    pub member_token_file: Option<PathBuf>,
    /// Keep polling this long after a request instead of sleeping (store/README.md,
    /// "Performance"); 0 never polls.
    #[arg(long, default_value = "200us", value_parser = kvcache_units::parse_duration)]
    pub spin: Duration,
    /// A disk tier under the segment, in this directory (which must exist, writable by the
    /// member, and used by no other member): every committed value is copied there, a value
    /// evicted from memory stays readable from it, and its contents are handed to the leader again
    /// after a restart (store/README.md, "Disk tier").
    #[arg(long)]
    pub tier_dir: Option<PathBuf>,
    /// Most bytes of records the disk tier holds (past it, its oldest file goes); 0: the free
    /// space of the directory's file system when the member starts, less a sixteenth, plus what
    /// the tier already holds.
    #[arg(long, default_value = "0", value_parser = flags::parse_size)]
    pub tier_capacity: u64,
    /// Size of the disk tier's files: the unit its eviction drops (oldest first).
    #[arg(long, default_value = "64Mi", value_parser = flags::parse_size)]
    pub tier_file_size: u64,
    /// Most values the disk tier holds (0: no limit but its capacity).
    #[arg(long, default_value_t = 0)]
    pub tier_key_limit: u64,
    /// When the disk tier is full, copy nothing more until values are freed, instead of dropping
    /// its oldest file.
    #[arg(long)]
    pub tier_keep_when_full: bool,
    /// `HIGH:LOW` percent of the disk tier's capacity: past HIGH, its oldest files go until it
    /// holds LOW (e.g. `90:80`).
    #[arg(long, value_parser = parse_watermark)]
    pub tier_watermark: Option<(u8, u8)>,
    /// When the disk tier makes room, drop its least recently used file (appended to or read
    /// from) instead of its oldest.
    #[arg(long)]
    pub tier_lru: bool,
    /// TLS on the gRPC and data ports (`--tls-cert`, `--tls-key`; `tls.rs`).
    #[command(flatten)]
    pub tls: crate::tls::ServeFlags,
    /// TLS to the leader (`--tls-ca`, `--tls-server-name`).
    #[command(flatten)]
    pub dial: crate::tls::DialFlags,
}

impl MemberConfig {
    /// A member of `capacity` bytes for the leader at `leader`, every other flag at its default
    /// (a unit test holds these equal to the flags' defaults).
    pub fn new(leader: impl Into<String>, capacity: u64) -> Self {
        Self {
            leader: leader.into(),
            kubeconfig: None,
            capacity,
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            data_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            name: None,
            shm_dir: PathBuf::from("/dev/shm"),
            advertise_host: None,
            metrics_listen: None,
            max_value_size: 64 << 20,
            no_prefault: false,
            same_host: false,
            member_token_file: None,
            spin: crate::spin::DEFAULT_SPIN,
            tier_dir: None,
            tier_capacity: 0,
            tier_file_size: DEFAULT_TIER_FILE_SIZE,
            tier_key_limit: 0,
            tier_keep_when_full: false,
            tier_watermark: None,
            tier_lru: false,
            tls: crate::tls::ServeFlags::default(),
            dial: crate::tls::DialFlags::default(),
        }
    }

    /// The name the member mounts under: `--name`, else `$HOSTNAME`, else `/etc/hostname`, else
    /// `member-<pid>`.
    pub fn resolved_name(&self) -> String {
        self.name
            .clone()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .or_else(|| {
                std::fs::read_to_string("/etc/hostname")
                    .ok()
                    .map(|s| s.trim().to_string())
            })
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| format!("member-{}", std::process::id()))
    }

    /// The Lease `--leader k8s://NAMESPACE/NAME` names.
    pub fn leader_lease(&self) -> Option<crate::election::kube::LeaseRef> {
        let l = self.leader.strip_prefix(LEASE_SCHEME)?;
        crate::election::kube::LeaseRef::parse(l).ok()
    }

    /// Every check beyond the flags' syntax, each saying what to do.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.capacity == 0 {
            return Err(ConfigError::new("capacity", "must be greater than 0 (e.g. 8Gi)"));
        }
        match self.leader.strip_prefix(LEASE_SCHEME) {
            Some(lease) => {
                crate::election::kube::LeaseRef::parse(lease).map_err(|e| ConfigError::new("leader", e))?;
            }
            None if self.leader.is_empty() || !self.leader.contains(':') => {
                return Err(ConfigError::new(
                    "leader",
                    format!(
                        "{:?} is neither HOST:PORT nor k8s://NAMESPACE/NAME; give the leader's gRPC address or its Lease",
                        self.leader
                    ),
                ));
            }
            None if self.kubeconfig.is_some() => {
                return Err(ConfigError::new(
                    "kubeconfig",
                    "goes with --leader k8s://NAMESPACE/NAME",
                ));
            }
            None => {}
        }
        if self.name.as_deref() == Some("") {
            return Err(ConfigError::new(
                "name",
                "is empty; give the node's name, or leave it out for the host name",
            ));
        }
        if self.max_value_size == 0 {
            return Err(ConfigError::new("max-value-size", "must be greater than 0, e.g. 64Mi"));
        }
        if self.tier_dir.is_none() {
            for (flag, set) in [
                ("tier-capacity", self.tier_capacity != 0),
                ("tier-file-size", self.tier_file_size != DEFAULT_TIER_FILE_SIZE),
                ("tier-key-limit", self.tier_key_limit != 0),
                ("tier-keep-when-full", self.tier_keep_when_full),
                ("tier-watermark", self.tier_watermark.is_some()),
                ("tier-lru", self.tier_lru),
            ] {
                if set {
                    return Err(ConfigError::new(
                        flag,
                        "goes with --tier-dir (the disk tier's directory)",
                    ));
                }
            }
        }
        let files = crate::member::tier::MIN_FILE_SIZE..=crate::member::tier::MAX_FILE_SIZE;
        if !files.contains(&self.tier_file_size) {
            return Err(ConfigError::new(
                "tier-file-size",
                format!("must be {} to {} bytes (e.g. 64Mi)", files.start(), files.end()),
            ));
        }
        if self.tier_capacity != 0 && self.tier_capacity < self.tier_file_size {
            return Err(ConfigError::new(
                "tier-capacity",
                format!(
                    "{} bytes holds not one {}-byte file of the tier (--tier-file-size); give at least that",
                    self.tier_capacity, self.tier_file_size
                ),
            ));
        }
        let unspecified = self.listen.ip().is_unspecified() || self.data_listen.ip().is_unspecified();
        if unspecified && self.advertise_host.is_none() {
            return Err(ConfigError::new(
                "advertise-host",
                "the member listens on an unspecified address (0.0.0.0 or ::); give --advertise-host so engines \
                 know where to connect",
            ));
        }
        Ok(())
    }

    /// The flags that parse back to this config (every flag, defaults included). The path is
    /// written as text, so a non-UTF-8 `shm_dir` does not survive.
    pub fn to_args(&self) -> Vec<String> {
        let mut a = Vec::new();
        push(&mut a, "leader", &self.leader);
        if let Some(k) = &self.kubeconfig {
            push(&mut a, "kubeconfig", k.display());
        }
        push(&mut a, "capacity", format_size(self.capacity));
        push(&mut a, "listen", self.listen);
        push(&mut a, "data-listen", self.data_listen);
        if let Some(n) = &self.name {
            push(&mut a, "name", n);
        }
        push(&mut a, "shm-dir", self.shm_dir.display());
        if let Some(h) = &self.advertise_host {
            push(&mut a, "advertise-host", h);
        }
        if let Some(m) = self.metrics_listen {
            push(&mut a, "metrics-listen", m);
        }
        push(&mut a, "max-value-size", format_size(self.max_value_size));
        if self.no_prefault {
            a.push("--no-prefault".into());
        }
        if self.same_host {
            a.push("--same-host".into());
        }
        if let Some(p) = &self.member_token_file {
            push(&mut a, "member-token-file", p.display());
        }
        push(&mut a, "spin", format_time(self.spin));
        if let Some(d) = &self.tier_dir {
            push(&mut a, "tier-dir", d.display());
            push(&mut a, "tier-capacity", format_size(self.tier_capacity));
            push(&mut a, "tier-file-size", format_size(self.tier_file_size));
            push(&mut a, "tier-key-limit", self.tier_key_limit);
            if self.tier_keep_when_full {
                a.push("--tier-keep-when-full".into());
            }
            if let Some((high, low)) = self.tier_watermark {
                push(&mut a, "tier-watermark", format!("{high}:{low}"));
            }
            if self.tier_lru {
                a.push("--tier-lru".into());
            }
        }
        self.tls.to_args(&mut a);
        self.dial.to_args(&mut a);
        a
    }

    /// Parses `kv-store member`'s flags (without the program and subcommand names).
    pub fn parse_args<I, T>(args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        flags::parse_flags(args)
    }

    /// The long names (without dashes) of every flag `kv-store member` accepts, from clap's
    /// definition of this struct.
    pub fn flag_names() -> Vec<String> {
        flags::long_flags::<Self>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_gives_the_flags_defaults() {
        let parsed = MemberConfig::parse_args(["--leader", "l:1", "--capacity", "1Gi"]).unwrap();
        assert_eq!(parsed, MemberConfig::new("l:1", 1 << 30));
        parsed.validate().unwrap();
        assert!(
            MemberConfig::parse_args(["--capacity", "1Gi"]).is_err(),
            "--leader is required"
        );
    }

    #[test]
    fn to_args_parses_back_to_the_same_config() {
        let configs = [
            MemberConfig::new("127.0.0.1:50051", 8 << 30),
            MemberConfig {
                listen: "0.0.0.0:7000".parse().unwrap(),
                data_listen: "[::]:7001".parse().unwrap(),
                name: Some("node-a".into()),
                shm_dir: PathBuf::from("/tmp/segments dir"),
                advertise_host: Some("node-a.local".into()),
                metrics_listen: Some("127.0.0.1:9101".parse().unwrap()),
                max_value_size: 4097,
                no_prefault: true,
                same_host: true,
                spin: Duration::from_millis(3),
                tier_dir: Some("/var/lib/kv tier".into()),
                tier_capacity: 3 << 30,
                tier_file_size: 16 << 20,
                tier_key_limit: 100_000,
                tier_keep_when_full: true,
                tier_watermark: Some((90, 80)),
                tier_lru: true,
                tls: crate::tls::ServeFlags {
                    tls_cert: Some("/etc/kv-store/tls/tls.crt".into()),
                    tls_key: Some("/etc/kv-store/tls/tls.key".into()),
                },
                dial: crate::tls::DialFlags {
                    tls_ca: Some("/etc/kv-store/tls/ca.crt".into()),
                    tls_server_name: Some("b.kvstore.internal".into()),
                    tls_ca_pem: None,
                },
                ..MemberConfig::new("leader.svc:50051", 1536 << 20)
            },
            MemberConfig {
                kubeconfig: Some("/tmp/store.kubeconfig".into()),
                ..MemberConfig::new("k8s://kvcache-system/b-leader", 1 << 30)
            },
        ];
        for cfg in configs {
            let args = cfg.to_args();
            let back = MemberConfig::parse_args(&args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
            assert_eq!(back, cfg, "{args:?}");
        }
    }

    #[test]
    fn flag_names_and_checks() {
        let names = MemberConfig::flag_names();
        for n in ["leader", "capacity", "name", "no-prefault", "data-listen", "spin"] {
            assert!(names.iter().any(|f| f == n), "{n} missing from {names:?}");
        }
        assert_eq!(names.len(), 25, "{names:?}");
        assert_eq!(parse_watermark("90:80"), Ok((90, 80)));
        for bad in ["90", "80:90", "0:0", "101:50", "a:b"] {
            assert!(parse_watermark(bad).is_err(), "{bad}");
        }
        let e = MemberConfig::new("l:1", 0).validate().unwrap_err();
        assert_eq!(e.to_string(), "--capacity: must be greater than 0 (e.g. 8Gi)");
        let e = MemberConfig {
            listen: "0.0.0.0:0".parse().unwrap(),
            ..MemberConfig::new("l:1", 1)
        }
        .validate()
        .unwrap_err();
        assert_eq!(e.flag, "advertise-host");
        assert_eq!(MemberConfig::new("nowhere", 1).validate().unwrap_err().flag, "leader");
        assert_eq!(
            MemberConfig::new("k8s://no-name", 1).validate().unwrap_err().flag,
            "leader"
        );
        MemberConfig::new("k8s://ns/b-leader", 1).validate().unwrap();
        let e = MemberConfig {
            kubeconfig: Some("/k".into()),
            ..MemberConfig::new("l:1", 1)
        }
        .validate()
        .unwrap_err();
        assert_eq!(e.flag, "kubeconfig");
        let e = MemberConfig {
            tier_capacity: 1 << 30,
            ..MemberConfig::new("l:1", 1)
        }
        .validate()
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "--tier-capacity: goes with --tier-dir (the disk tier's directory)"
        );
        let tiered = MemberConfig {
            tier_dir: Some("/t".into()),
            ..MemberConfig::new("l:1", 1)
        };
        tiered.validate().unwrap();
        let e = MemberConfig {
            tier_capacity: 1 << 20,
            ..tiered.clone()
        }
        .validate()
        .unwrap_err();
        assert_eq!(e.flag, "tier-capacity");
        let e = MemberConfig {
            tier_file_size: 4096,
            ..tiered
        }
        .validate()
        .unwrap_err();
        assert_eq!(e.flag, "tier-file-size");
    }
}
