//! How long the walkthrough takes to happen on this machine, with the real manifests (two 8Gi
//! members): `kubectl apply` of step 1 until `kubectl get kvcb` would show `Ready` with the full
//! `16Gi`, and `kubectl apply` of step 3 (after step 2 is granted) until the deployment's
//! `CacheAttached` is `True`. Five runs, each on a fresh `kv-apiserver serve` with the local
//! runtime; the medians are printed. This is a report: nothing is asserted about the numbers.
//!
//! Run with `cargo build --release -p kvcache-store && cargo bench -p kvcache-apiserver --bench
//! walkthrough` (the server starts the `kv-store` next to its own binary).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

const RUNS: usize = 5;
const KUBECTL: &str = "/usr/lib/google-cloud-sdk/bin/kubectl.1.33";

struct Server {
    child: Child,
    dir: tempfile::TempDir,
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

fn manifest(file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/walkthrough")
        .join(file)
}

fn kubectl(dir: &Path, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(KUBECTL)
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

fn start() -> anyhow::Result<Server> {
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
fn until(dir: &Path, what: &[&str], path: &str, want: &str) -> anyhow::Result<Instant> {
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

fn run() -> anyhow::Result<(Duration, Duration)> {
    let s = start()?;
    let d = s.dir.path();
    let apply = |file: &str| -> anyhow::Result<Instant> {
        let t = Instant::now();
        kubectl(d, &["apply", "-f", &manifest(file).display().to_string()])?;
        Ok(t)
    };
    let t1 = apply("01-backend.yaml")?;
    let ready = until(
        d,
        &["kvcb", "mooncake-dram"],
        "{.status.phase} {.status.capacity.total}",
        "Ready 16Gi",
    )?;
    apply("02-pool-binding.yaml")?;
    until(
        d,
        &["-n", "team-a", "kvcpb", "team-a"],
        "{.status.conditions[?(@.type==\"QuotaGranted\")].status} {.status.effectiveQuota}",
        "True 8Gi",
    )?;
    let t3 = apply("03-model-deployment.yaml")?;
    let attached = until(
        d,
        &["-n", "team-a", "md", "qwen-chat"],
        "{.status.conditions[?(@.type==\"CacheAttached\")].status}",
        "True",
    )?;
    Ok((ready - t1, attached - t3))
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() -> anyhow::Result<()> {
    if std::env::args().any(|a| a == "--list") {
        return Ok(());
    }
    println!("the walkthrough on the local runtime (two stand-in nodes, 8Gi members), {RUNS} runs, fresh server each");
    let (mut ready, mut attached) = (Vec::new(), Vec::new());
    for i in 1..=RUNS {
        let (r, a) = run()?;
        println!(
            "run {i}: step 1 apply -> Ready 16Gi {:.2} s; step 3 apply -> CacheAttached {:.2} s",
            r.as_secs_f64(),
            a.as_secs_f64()
        );
        ready.push(r);
        attached.push(a);
    }
    println!(
        "median: step 1 -> Ready with full CAPACITY {:.2} s; step 3 -> CacheAttached {:.2} s",
        median(&mut ready).as_secs_f64(),
        median(&mut attached).as_secs_f64()
    );
    Ok(())
}
