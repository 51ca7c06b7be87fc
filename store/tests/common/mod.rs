//! Test harness: starts real `kv-store` processes on loopback, reads the address each one
//! announces on its first stdout line, and kills every process it started when dropped.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use kvcache_store::client::Client;
use kvcache_store::proto::{GetMembersRequest, GetTenantsRequest, Scope, TenantStatus};

pub const BIN: &str = env!("CARGO_BIN_EXE_kv-store");

/// A started process, killed (and reaped) on drop.
#[derive(Debug)]
pub struct Proc {
    pub child: Child,
    pub announce: serde_json::Value,
}

impl Proc {
    pub fn start(args: &[&str]) -> Proc {
        Self::start_with_stderr(args, Stdio::inherit())
    }

    /// Like [`start`](Self::start), with the process's stderr sent to `stderr` (e.g. a file).
    pub fn start_with_stderr(args: &[&str], stderr: impl Into<Stdio>) -> Proc {
        let mut child = Command::new(BIN)
            .args(args)
            // KVSTORE_TEST_LOG (e.g. `info`) lets a reader see what the processes did
            .env(
                "RUST_LOG",
                std::env::var("KVSTORE_TEST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("start kv-store");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).expect("read announce line");
        let announce = serde_json::from_str(&line).unwrap_or_else(|e| panic!("bad announce {line:?}: {e}"));
        Proc { child, announce }
    }

    pub fn field(&self, name: &str) -> String {
        self.announce[name]
            .as_str()
            .unwrap_or_else(|| panic!("no {name} in {}", self.announce))
            .to_string()
    }

    /// The exit status, once the process has exited on its own.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().expect("poll kv-store")
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The seal key file every leader of this test process is given (unless a test gives its own),
/// as a backend's leaders share one: a restarted leader adopts what its members hold.
pub fn seal_key_file() -> &'static str {
    static FILE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    FILE.get_or_init(|| {
        // One file for every test process (they all write the same key), in the build's own
        // folder for tests, so none is left behind in /tmp; written whole, then renamed.
        let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
        let p = dir.join("kvstore-test-seal.key");
        let part = dir.join(format!("kvstore-test-seal.key.{}", std::process::id()));
        std::fs::write(&part, "the-leaders-seal-secret-of-this-test\n").expect("write the seal key");
        std::fs::rename(&part, &p).expect("put the seal key in place");
        p.display().to_string()
    })
}

fn leader_args<'a>(listen: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["leader", "--listen", listen];
    if !extra.contains(&"--seal-key-file") {
        args.extend(["--seal-key-file", seal_key_file()]);
    }
    args.extend_from_slice(extra);
    args
}

/// The local runtime's choice of loopback ports: below the kernel's ephemeral range, so a leader
/// restarted on its port ([`leader_at`]) never finds it taken by some other test's outgoing
/// connection.
#[path = "../../../apiserver/src/runtime/local/ports.rs"]
mod ports;

/// Starts a leader on a free loopback port below the ephemeral range, with extra flags.
pub fn leader(extra: &[&str]) -> Proc {
    let listen = format!("127.0.0.1:{}", ports::loopback_port());
    Proc::start(&leader_args(&listen, extra))
}

/// Starts a leader on a given address (for restarts on the same port).
pub fn leader_at(addr: &str, extra: &[&str]) -> Proc {
    Proc::start(&leader_args(addr, extra))
}

/// Starts a member of `capacity` mounted at `leader`, with a metrics listener (`field("metrics")`).
pub fn member(leader: &str, name: &str, capacity: &str) -> Proc {
    member_with(leader, name, capacity, &["--metrics-listen", "127.0.0.1:0"])
}

/// Waits until the members (started by [`member`]) hold, sealed for a next leader, every value the
/// leader holds: its seals reach a member with the member's next heartbeat answer, and only a
/// sealed value is handed over at a failover. Call it with no put in flight.
pub async fn wait_sealed(c: &Client, members: &[&Proc]) {
    let metrics: Vec<String> = members.iter().map(|m| m.field("metrics")).collect();
    eventually("every committed value sealed at its member", || {
        let metrics = metrics.clone();
        async move {
            let objects = match c.control().health(kvcache_store::proto::HealthRequest {}).await {
                Ok(h) => h.into_inner().objects,
                Err(_) => return false,
            };
            let mut held = 0;
            for m in &metrics {
                held += gauge(m, "kvstore_member_handover_values").await;
            }
            held == objects
        }
    })
    .await;
}

/// Starts a member of `capacity` mounted at `leader`, with extra flags.
pub fn member_with(leader: &str, name: &str, capacity: &str, extra: &[&str]) -> Proc {
    let mut args = vec![
        "member",
        "--leader",
        leader,
        "--capacity",
        capacity,
        "--name",
        name,
        "--no-prefault",
    ];
    args.extend_from_slice(extra);
    Proc::start(&args)
}

pub fn scope(tenant: &str) -> Scope {
    Scope {
        tenant: tenant.into(),
        block_size: 64,
        dtype: "bfloat16".into(),
        ..Default::default()
    }
}

pub async fn client(leader: &str, tenant: &str) -> Client {
    Client::connect(leader, scope(tenant)).await.expect("connect to leader")
}

#[path = "../../../tests/support/eventually.rs"]
mod wait;
#[allow(unused_imports)]
pub use wait::eventually_within;

/// Polls `f` until it holds; panics with `what` after 30 s (a liveness bound, far above what any
/// of these conditions needs, not a timing assertion).
pub async fn eventually<F, Fut>(what: &str, f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    wait::eventually_async(Duration::from_secs(30), what, f).await;
}

pub async fn member_count(c: &Client) -> usize {
    c.control()
        .get_members(GetMembersRequest {})
        .await
        .map(|r| r.into_inner().members.len())
        .unwrap_or(0)
}

pub async fn wait_members(c: &Client, n: usize) {
    eventually(&format!("{n} members mounted"), || async { member_count(c).await == n }).await;
}

pub async fn tenant(c: &Client, name: &str) -> TenantStatus {
    let t = c
        .control()
        .get_tenants(GetTenantsRequest {})
        .await
        .expect("get tenants")
        .into_inner();
    t.tenants
        .into_iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("tenant {name} not listed"))
}

#[path = "../../../tests/support/values.rs"]
mod values;
#[allow(unused_imports)]
pub use values::random_bytes;

/// `GET path` of an HTTP endpoint (a leader's or member's metrics listener), status line and
/// headers included; `/metrics` must answer 200 in OpenMetrics text.
pub async fn http_get(addr: &str, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect to the listener");
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .expect("send the request");
    let mut out = String::new();
    s.read_to_string(&mut out).await.expect("read the answer");
    if path == "/metrics" {
        assert!(out.starts_with("HTTP/1.1 200"), "{out}");
        let ctype = "content-type: application/openmetrics-text; version=1.0.0; charset=utf-8";
        assert!(out.to_lowercase().contains(ctype), "{out}");
    }
    out
}

/// A gauge's value from a metrics listener.
pub async fn gauge(metrics: &str, name: &str) -> u64 {
    let text = http_get(metrics, "/metrics").await;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {name} in /metrics:\n{text}"))
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}
