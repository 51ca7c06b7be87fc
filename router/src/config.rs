//! The command line of `kv-router` (issue 40's design, "kv-router command line"): one
//! definition of every flag, with its default and its check, so `--help` documents them all.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use crate::workers::Kind;

/// The flags of `kv-router`.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "kv-router",
    version,
    about = "An OpenAI-API router in front of vLLM replicas: least-loaded Server replicas, or \
             prefill then decode with the KV handed over through the store"
)]
pub struct Config {
    /// Address to serve the OpenAI API, /health and /metrics on.
    #[arg(long, default_value = "0.0.0.0:8000", value_name = "ADDR")]
    pub listen: SocketAddr,

    /// The served model name: /v1/models answers with it when no worker answers.
    #[arg(long, value_name = "NAME")]
    pub model: Option<String>,

    /// JSON file {"server":[url...],"prefill":[url...],"decode":[url...]}, re-read when it
    /// changes (checked every 250 ms); a malformed file keeps the last good set.
    #[arg(long, value_name = "PATH")]
    pub workers_file: Option<PathBuf>,

    /// KIND=HOST:PORT, repeatable; KIND is server, prefill or decode. HOST is resolved every
    /// second (a headless Service: one A record per ready Pod) into workers http://IP:PORT.
    #[arg(long = "workers-dns", value_name = "KIND=HOST:PORT", value_parser = parse_dns)]
    pub workers_dns: Vec<DnsSource>,

    /// PUB[,REPLAY]: the ports every `--workers-dns` worker publishes its vLLM KV events on
    /// (`--kv-events-config` endpoint and replay_endpoint), followed to route by what each
    /// engine holds in memory.
    #[arg(long, value_name = "PUB[,REPLAY]", value_parser = parse_event_ports)]
    pub engine_events_ports: Option<EventPorts>,

    /// How an answering worker is chosen: `memory` (what its engine holds, then its load; see
    /// `--load-weight-tokens`), `least-loaded` (the fewest outstanding requests), or
    /// `round-robin` (in turn, whatever the load): the last two to compare with.
    #[arg(long, value_enum, default_value_t = Placement::Memory, value_name = "POLICY")]
    pub placement: Placement,

    /// Prompt tokens one outstanding request on a worker weighs against the prompt tokens its
    /// memory would spare: a worker is chosen for the fewest `tokens to compute + weight ×
    /// outstanding requests`.
    #[arg(long, default_value_t = 512, value_name = "N")]
    pub load_weight_tokens: u64,

    /// Bounds each client request end to end, streamed answers included (504 before the first
    /// byte, the stream cut after it).
    #[arg(long, default_value_t = 600, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub request_timeout_seconds: u64,

    /// Prompts with fewer tokens go straight to decode, and so do prompts of which the store
    /// (when the environment names one) lacks fewer tokens; 0: every prompt goes through
    /// prefill when there are prefill workers.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub disaggregation_threshold_tokens: u64,

    /// How often each worker's /health is checked, in milliseconds.
    #[arg(long, default_value_t = 1000, value_name = "N", value_parser = clap::value_parser!(u64).range(10..))]
    pub health_interval_ms: u64,

    /// Consecutive failures (health checks or connections) that take a worker out.
    #[arg(long, default_value_t = 2, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub unhealthy_after: u32,

    /// Bounds each attempt on a prefill worker, in seconds.
    #[arg(long, default_value_t = 120, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub prefill_timeout_seconds: u64,

    /// Largest request body accepted (413 above it).
    #[arg(long, default_value_t = 8 << 20, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_body_bytes: u64,

    /// Log filter (error, warn, info, debug, trace, or a tracing directive); RUST_LOG wins when set.
    #[arg(long, default_value = "info", value_name = "LEVEL")]
    pub log_level: String,
}

impl Config {
    pub fn request_timeout(&self) -> Duration {
        Duration::from_secs(self.request_timeout_seconds)
    }

    pub fn prefill_timeout(&self) -> Duration {
        Duration::from_secs(self.prefill_timeout_seconds)
    }

    pub fn health_interval(&self) -> Duration {
        Duration::from_millis(self.health_interval_ms)
    }
}

/// One `--workers-dns` source: a name resolved into the workers of one kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsSource {
    pub kind: Kind,
    /// `HOST:PORT`, as `tokio::net::lookup_host` takes it.
    pub target: String,
}

/// `--placement`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Placement {
    Memory,
    LeastLoaded,
    RoundRobin,
}

/// `--engine-events-ports`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventPorts {
    pub events: u16,
    pub replay: Option<u16>,
}

fn parse_event_ports(s: &str) -> Result<EventPorts, String> {
    let port = |p: &str| {
        p.parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("{p:?}: expected a port 1-65535"))
    };
    let (events, replay) = match s.split_once(',') {
        Some((e, r)) => (port(e)?, Some(port(r)?)),
        None => (port(s)?, None),
    };
    Ok(EventPorts { events, replay })
}

fn parse_dns(s: &str) -> Result<DnsSource, String> {
    let (kind, target) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected KIND=HOST:PORT"))?;
    let kind = Kind::parse(kind).ok_or_else(|| format!("{kind:?}: KIND must be server, prefill or decode"))?;
    let (host, port) = target
        .rsplit_once(':')
        .ok_or_else(|| format!("{target:?}: expected HOST:PORT"))?;
    if host.is_empty() || port.parse::<u16>().is_err() {
        return Err(format!("{target:?}: expected HOST:PORT with a port 0-65535"));
    }
    Ok(DnsSource {
        kind,
        target: target.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_sources_parse_and_refuse() {
        let d = parse_dns("prefill=md-prefill-workers.ns.svc:8000").unwrap();
        assert_eq!(d.kind, Kind::Prefill);
        assert_eq!(d.target, "md-prefill-workers.ns.svc:8000");
        assert!(parse_dns("md:8000").is_err());
        assert!(parse_dns("router=md:8000").is_err());
        assert!(parse_dns("decode=md").is_err());
        assert!(parse_dns("decode=:8000").is_err());
        assert!(parse_dns("decode=md:99999").is_err());
        assert_eq!(
            parse_event_ports("5557,5558"),
            Ok(EventPorts {
                events: 5557,
                replay: Some(5558)
            })
        );
        assert_eq!(parse_event_ports("5557").map(|p| p.replay), Ok(None));
        for bad in ["", "0", "5557,", "a,1", "1,2,3"] {
            assert!(parse_event_ports(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn both_spellings_and_defaults() {
        let c = Config::try_parse_from(["kv-router", "--listen=127.0.0.1:9", "--model", "m"]).unwrap();
        assert_eq!(c.listen.port(), 9);
        assert_eq!(c.model.as_deref(), Some("m"));
        assert_eq!(c.request_timeout_seconds, 600);
        assert_eq!(c.disaggregation_threshold_tokens, 0);
        assert_eq!(c.health_interval_ms, 1000);
        assert_eq!(c.unhealthy_after, 2);
        assert_eq!(c.prefill_timeout_seconds, 120);
        assert_eq!(c.max_body_bytes, 8 << 20);
        assert_eq!(c.engine_events_ports, None);
        assert_eq!(c.load_weight_tokens, 512);
        assert_eq!(c.placement, Placement::Memory);
        let rr = Config::try_parse_from(["kv-router", "--placement", "round-robin"]).unwrap();
        assert_eq!(rr.placement, Placement::RoundRobin);
        assert!(Config::try_parse_from(["kv-router", "--placement", "random"]).is_err());
        assert!(Config::try_parse_from(["kv-router", "--request-timeout-seconds", "0"]).is_err());
    }
}
