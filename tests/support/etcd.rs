//! The one etcd the tests and benchmarks start: Debian's `/usr/bin/etcd`, a single member on
//! loopback ports in a temporary directory, killed and removed when dropped. Included by path
//! (`#[path]`) in the storage unit tests, the e2e tests and the benchmarks; the includer provides
//! `loopback_port` (the server's own port picker, `runtime::local::loopback_port`).
//!
//! A port picked free can still be taken before etcd binds it: a start whose etcd exits before
//! its client port answers is retried on other ports.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::loopback_port;

pub const ETCD: &str = "/usr/bin/etcd";
const READY_WITHIN: Duration = Duration::from_secs(20);
const TRIES: usize = 5;
/// How often a start or a stop is checked on (a condition polled, not a fixed wait).
const POLL: Duration = Duration::from_millis(20);

/// How to start one.
#[derive(Clone, Debug, Default)]
pub struct Launch {
    /// `https` with TLS flags in `extra`; `http` when empty.
    pub scheme: String,
    pub extra: Vec<String>,
    /// The folder its temporary directory is made in (a disk, for benchmarks); the system's
    /// temporary folder when `None`.
    pub under: Option<PathBuf>,
}

/// A running single-member etcd.
pub struct EtcdProcess {
    child: Child,
    /// `127.0.0.1:<port>`, where clients reach it.
    pub endpoint: String,
    scheme: String,
    dir: tempfile::TempDir,
}

impl Drop for EtcdProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl EtcdProcess {
    /// One on plain HTTP.
    pub fn start() -> EtcdProcess {
        EtcdProcess::start_with(&Launch::default())
    }

    pub fn start_with(opts: &Launch) -> EtcdProcess {
        assert!(
            Path::new(ETCD).exists(),
            "{ETCD} is missing: these tests run against Debian's etcd (./scripts/setup installs it)"
        );
        let scheme = if opts.scheme.is_empty() {
            "http"
        } else {
            opts.scheme.as_str()
        };
        let mut last = String::new();
        for _ in 0..TRIES {
            let dir = match &opts.under {
                Some(p) => tempfile::Builder::new().prefix("etcd-").tempdir_in(p),
                None => tempfile::Builder::new().prefix("etcd-").tempdir(),
            }
            .expect("a temporary directory for etcd");
            let (client, peer) = (loopback_port(), loopback_port());
            let endpoint = format!("127.0.0.1:{client}");
            let log = std::fs::File::create(dir.path().join("etcd.log")).expect("etcd's log file");
            let child = Command::new(ETCD)
                .arg("--name=test")
                .arg(format!("--data-dir={}", dir.path().join("data").display()))
                .arg(format!("--listen-client-urls={scheme}://{endpoint}"))
                .arg(format!("--advertise-client-urls={scheme}://{endpoint}"))
                .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer}"))
                .arg(format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer}"))
                .arg(format!("--initial-cluster=test=http://127.0.0.1:{peer}"))
                .args(["--logger=zap", "--log-level=warn"])
                .args(&opts.extra)
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("etcd's log file"))
                .stderr(log)
                .spawn()
                .expect("start etcd");
            let mut etcd = EtcdProcess {
                child,
                endpoint,
                scheme: scheme.to_owned(),
                dir,
            };
            match etcd.wait_listening() {
                Ok(()) => return etcd,
                Err(e) => last = e,
            }
        }
        panic!("etcd did not start in {TRIES} tries; the last: {last}");
    }

    /// Waits until the client port accepts connections; an etcd that exits first (its port was
    /// taken) is an error with its log.
    fn wait_listening(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            if std::net::TcpStream::connect(&self.endpoint).is_ok() {
                return Ok(());
            }
            if !self.running() {
                return Err(format!("etcd exited:\n{}", self.log_tail()));
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "etcd did not listen within {READY_WITHIN:?}:\n{}",
                    self.log_tail()
                ));
            }
            std::thread::sleep(POLL);
        }
    }

    /// `http://127.0.0.1:<port>` (or `https://`).
    pub fn url(&self) -> String {
        format!("{}://{}", self.scheme, self.endpoint)
    }

    /// `--storage etcd://...` for a server on this etcd.
    pub fn storage_flag(&self) -> String {
        format!("etcd://{}", self.endpoint)
    }

    /// The folder holding its data and log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Whether the process still runs.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// The last lines it logged.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Stops it with SIGTERM, as an operator would, waiting at most `within`; then SIGKILL.
    /// `Err` says it had to be killed.
    pub fn terminate(&mut self, within: Duration) -> Result<(), String> {
        if !self.running() {
            return Ok(());
        }
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if !self.running() {
                return Ok(());
            }
            std::thread::sleep(POLL);
        }
        self.kill();
        Err(format!("etcd ignored SIGTERM for {within:?} and was killed"))
    }

    /// Stops it (SIGKILL) now.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
