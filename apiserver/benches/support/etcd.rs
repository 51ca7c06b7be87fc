//! Shared by the benchmarks: a throwaway single-member etcd (Debian's `/usr/bin/etcd`) on
//! loopback, and the scratch directory on a real disk where both sides keep their data.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};

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

#[path = "../../../tests/support/etcd.rs"]
mod process;
use kvcache_apiserver::runtime::local::loopback_port;

/// A single-member etcd in a temporary directory under the scratch folder (the tests' one
/// launcher), stopped with SIGTERM and removed on drop.
pub struct EtcdServer {
    process: process::EtcdProcess,
}

impl EtcdServer {
    pub fn start(scratch: &Path) -> anyhow::Result<EtcdServer> {
        let process = process::EtcdProcess::start_with(&process::Launch {
            under: Some(scratch.to_path_buf()),
            ..process::Launch::default()
        });
        Ok(EtcdServer { process })
    }

    /// The client URL (`http://127.0.0.1:<port>`).
    pub fn endpoint(&self) -> String {
        self.process.url()
    }

    /// Connects once etcd answers `status`, retrying for a bounded time.
    pub async fn connect(&mut self) -> anyhow::Result<etcd_client::Client> {
        let deadline = Instant::now() + ETCD_READY_TIMEOUT;
        loop {
            let last_error = match self.try_status().await {
                Ok(client) => return Ok(client),
                Err(e) => e,
            };
            if !self.process.running() {
                bail!("etcd exited before it was ready:\n{}", self.process.log_tail());
            }
            if Instant::now() >= deadline {
                bail!(
                    "etcd at {} was not ready after {ETCD_READY_TIMEOUT:?} (last error: {last_error:#}):\n{}",
                    self.endpoint(),
                    self.process.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn try_status(&self) -> anyhow::Result<etcd_client::Client> {
        let options = etcd_client::ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(1))
            .with_timeout(Duration::from_secs(2));
        let mut client = etcd_client::Client::connect([self.endpoint().as_str()], Some(options)).await?;
        client.status().await?;
        Ok(client)
    }

    /// Sends SIGTERM and waits (bounded) for the process to exit; SIGKILL if it does not.
    pub fn stop(&mut self) -> anyhow::Result<()> {
        self.process.terminate(ETCD_STOP_TIMEOUT).map_err(anyhow::Error::msg)
    }
}
