//! Shared by the benchmarks: a throwaway single-member etcd (Debian's `/usr/bin/etcd`) on
//! loopback, and the scratch directory on a real disk where both sides keep their data.

#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use tempfile::TempDir;

pub const ETCD: &str = "/usr/bin/etcd";
const ETCD_READY_TIMEOUT: Duration = Duration::from_secs(20);
const ETCD_STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// Where both sides keep their data: Cargo's tmp directory for this target, on the regular disk.
pub fn scratch_dir() -> anyhow::Result<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let (_, fs_type) = filesystem_of(&dir)?;
    ensure!(
        fs_type != "tmpfs",
        "{} is on tmpfs, where fsync costs nothing; set CARGO_TARGET_DIR to a directory on a disk",
        dir.display()
    );
    Ok(dir)
}

/// The mount point and filesystem type holding `path` (the longest matching mount wins).
pub fn filesystem_of(path: &Path) -> anyhow::Result<(String, String)> {
    let path = path.canonicalize()?;
    let mounts = std::fs::read_to_string("/proc/self/mounts").context("reading /proc/self/mounts")?;
    mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split(' ');
            let (_device, mount, fs_type) = (fields.next()?, fields.next()?, fields.next()?);
            path.starts_with(mount).then(|| (mount.to_owned(), fs_type.to_owned()))
        })
        .max_by_key(|(mount, _)| mount.len())
        .with_context(|| format!("no mount holds {}", path.display()))
}

/// A single-member etcd in a temporary directory, stopped (SIGTERM) and removed on drop.
pub struct EtcdServer {
    child: Child,
    endpoint: String,
    /// Holds `data/` and `etcd.log`; removed after the process is gone.
    dir: TempDir,
}

impl EtcdServer {
    pub fn start(scratch: &Path) -> anyhow::Result<EtcdServer> {
        let dir = tempfile::Builder::new().prefix("etcd-").tempdir_in(scratch)?;
        let (client_port, peer_port) = two_free_ports()?;
        let client_url = format!("http://127.0.0.1:{client_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let log = std::fs::File::create(dir.path().join("etcd.log"))?;
        let child = Command::new(ETCD)
            .arg("--name=bench")
            .arg(format!("--data-dir={}", dir.path().join("data").display()))
            .arg(format!("--listen-client-urls={client_url}"))
            .arg(format!("--advertise-client-urls={client_url}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster=bench={peer_url}"))
            .args(["--logger=zap", "--log-level=warn"])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {ETCD}"))?;
        Ok(EtcdServer {
            child,
            endpoint: client_url,
            dir,
        })
    }

    /// The client URL (`http://127.0.0.1:<port>`).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Connects once etcd answers `status`, retrying for a bounded time.
    pub async fn connect(&mut self) -> anyhow::Result<etcd_client::Client> {
        let deadline = Instant::now() + ETCD_READY_TIMEOUT;
        loop {
            let last_error = match self.try_status().await {
                Ok(client) => return Ok(client),
                Err(e) => e,
            };
            if let Some(status) = self.child.try_wait()? {
                bail!("etcd exited ({status}) before it was ready:\n{}", self.log_tail());
            }
            if Instant::now() >= deadline {
                bail!(
                    "etcd at {} was not ready after {ETCD_READY_TIMEOUT:?} (last error: {last_error:#}):\n{}",
                    self.endpoint,
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn try_status(&self) -> anyhow::Result<etcd_client::Client> {
        let options = etcd_client::ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(1))
            .with_timeout(Duration::from_secs(2));
        let mut client = etcd_client::Client::connect([self.endpoint.as_str()], Some(options)).await?;
        client.status().await?;
        Ok(client)
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Sends SIGTERM and waits (bounded) for the process to exit; SIGKILL if it does not.
    pub fn stop(&mut self) -> anyhow::Result<()> {
        if self.child.try_wait()?.is_some() {
            return Ok(());
        }
        let pid = self.child.id().to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status()?;
        ensure!(sent.success(), "kill -TERM {pid} failed ({sent})");
        let deadline = Instant::now() + ETCD_STOP_TIMEOUT;
        while Instant::now() < deadline {
            if self.child.try_wait()?.is_some() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.child.kill()?;
        self.child.wait()?;
        bail!("etcd ignored SIGTERM for {ETCD_STOP_TIMEOUT:?} and was killed")
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            eprintln!("stopping etcd: {e:#}");
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        // `dir` is removed after this, with the process gone.
    }
}

/// Two distinct free ports on 127.0.0.1, found by binding port 0 and releasing them.
pub fn two_free_ports() -> anyhow::Result<(u16, u16)> {
    let a = TcpListener::bind("127.0.0.1:0")?;
    let b = TcpListener::bind("127.0.0.1:0")?;
    Ok((a.local_addr()?.port(), b.local_addr()?.port()))
}
