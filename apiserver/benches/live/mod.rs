//! What the live benchmarks share: a fresh `kv-apiserver serve` with its controllers and the
//! local runtime, kubectl against it, the walkthrough's manifests, and polling a jsonpath.

#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

#[path = "../../../tests/support/kubectl.rs"]
mod which_kubectl;

/// The kubectl the live benchmarks drive: 1.33, built by scripts/build-kubectl (or the SDK's).
pub fn kubectl_bin() -> PathBuf {
    which_kubectl::kubectl_path("1.33")
}

pub struct Server {
    pub child: Child,
    pub dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        // SIGTERM: the server stops its store processes before it exits
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn manifest(file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/walkthrough")
        .join(file)
}

pub fn kubectl(dir: &Path, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(kubectl_bin())
        .env("KUBECONFIG", dir.join("kubeconfig"))
        .arg("--cache-dir")
        .arg(dir.join("kubectl-cache"))
        .args(args)
        .output()
        .context("running kubectl")?;
    if !out.status.success() {
        bail!("kubectl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

pub fn start() -> anyhow::Result<Server> {
    let dir = tempfile::tempdir()?;
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let store = PathBuf::from(env!("CARGO_BIN_EXE_kv-apiserver")).with_file_name("kv-store");
    if !store.exists() {
        bail!(
            "{} is missing: build it first (cargo build --release -p kvcache-store)",
            store.display()
        );
    }
    let child = Command::new(env!("CARGO_BIN_EXE_kv-apiserver"))
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .arg("--data-dir")
        .arg(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let server = Server { child, dir };
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if server.dir.path().join("kubeconfig").exists() && kubectl(server.dir.path(), &["get", "kvcb"]).is_ok() {
            return Ok(server);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("kv-apiserver did not become ready")
}

/// Polls a jsonpath until it equals `want`; returns when it did.
pub fn until(dir: &Path, what: &[&str], path: &str, want: &str) -> anyhow::Result<Instant> {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut args = vec!["get"];
    args.extend_from_slice(what);
    let p = format!("jsonpath={path}");
    args.extend(["-o", &p]);
    while Instant::now() < deadline {
        if kubectl(dir, &args).is_ok_and(|v| v == want) {
            return Ok(Instant::now());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    bail!("{what:?} {path} did not become {want:?} within 120 s")
}

/// The walkthrough backend's Client endpoint (HOST:PORT), as its status lists it.
pub fn client_endpoint(dir: &Path) -> anyhow::Result<String> {
    kubectl(
        dir,
        &[
            "get",
            "kvcb",
            "mooncake-dram",
            "-o",
            "jsonpath={.status.endpoints[?(@.name==\"Client\")].address}",
        ],
    )
}

/// The walkthrough's tenant, with the Binding's credential as the runtime keeps it under `dir`.
pub fn scope(dir: &Path) -> kvcache_store::proto::Scope {
    let credential = std::fs::read(dir.join("tenant-credentials/team-a/team-a.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|v| v["current"].as_str().map(str::to_owned))
        .unwrap_or_default();
    kvcache_store::proto::Scope {
        tenant: "default".into(),
        block_size: 64,
        dtype: "bfloat16".into(),
        credential,
        ..Default::default()
    }
}

/// The leader processes of the server in `dir`: (pid, its own gRPC address).
pub fn leaders(dir: &Path) -> Vec<(u32, String)> {
    let mine = dir.display().to_string();
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let raw = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&raw).replace('\0', " ");
        if !(cmd.contains("kv-store") && cmd.contains(" leader ") && cmd.contains(&mine)) {
            continue;
        }
        if let Some(addr) = cmd.split("--listen ").nth(1).and_then(|r| r.split(' ').next()) {
            out.push((pid, addr.to_owned()));
        }
    }
    out
}
