//! A running `kv-apiserver serve` on a free loopback port with a fresh data directory, and the
//! clients that drive it: real kubectl binaries (each version with its own cache directory) and
//! curl for requests kubectl cannot shape (Accept headers, raw watches, no credentials).

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

#[path = "../support/eventually.rs"]
mod wait;
#[allow(unused_imports)]
pub use wait::{POLL, eventually, eventually_async, eventually_within, poll_within};

#[path = "../support/values.rs"]
mod values;
#[allow(unused_imports)]
pub use values::random_bytes;

#[path = "../support/etcd.rs"]
mod etcd;
/// A single-member etcd (Debian's `/usr/bin/etcd`) on loopback ports; killed when dropped.
#[allow(unused_imports)]
pub use etcd::EtcdProcess as Etcd;
/// A loopback port for a process a test starts (the server's own picker).
#[allow(unused_imports)]
pub use kvcache_apiserver::runtime::local::loopback_port;

#[path = "../support/kubectl.rs"]
mod which_kubectl;
/// Where kubectl of a release is: built by scripts/build-kubectl, else the Google Cloud SDK's.
pub use which_kubectl::kubectl_path;

/// The kubectl versions every core scenario runs against.
pub const VERSIONS: &[&str] = &["1.27", "1.30", "1.33"];

/// The server process; killed when dropped (before its etcd, if it has one).
pub struct Server {
    child: Child,
    pub dir: tempfile::TempDir,
    pub port: u16,
    /// The etcd of a server started with `KV_TEST_STORAGE=etcd`.
    etcd: Option<Etcd>,
    /// `--pki-dir`, when given.
    pki_dir: Option<PathBuf>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            // what the processes it ran wrote (their logs) is what explains a failure
            self.dir.disable_cleanup(true);
            eprintln!("the server's data directory is kept: {}", self.dir.path().display());
        }
    }
}

/// The server binary: this build's, or another one named by `KV_APISERVER_BIN` (to run a test
/// against an older build and watch it fail).
pub fn server_binary() -> PathBuf {
    std::env::var_os("KV_APISERVER_BIN")
        .map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_kv-apiserver")), PathBuf::from)
}

impl Server {
    /// The API alone (`--controllers=false`): objects are stored and nothing runs. With
    /// `KV_TEST_STORAGE=etcd` the server stores them in an etcd of its own (the kubectl suite
    /// runs that way too in `.ci/run`).
    pub fn start() -> Server {
        if std::env::var("KV_TEST_STORAGE").as_deref() == Ok("etcd") {
            let etcd = Etcd::start();
            let storage = etcd.storage_flag();
            let mut s = Server::start_with(&["--controllers=false", "--storage", &storage]);
            s.etcd = Some(etcd);
            return s;
        }
        Server::start_with(&["--controllers=false"])
    }

    /// The server with `extra` flags.
    pub fn start_with(extra: &[&str]) -> Server {
        Server::start_in(tempfile::tempdir().expect("temp dir"), extra)
    }

    /// The server with `extra` flags and `dir` as its data directory (kept across tries on
    /// other ports, and handed back by [`Server::stop_keeping_dir`]).
    pub fn start_in(dir: tempfile::TempDir, extra: &[&str]) -> Server {
        let mut dir = Some(dir);
        for _ in 0..5 {
            let data = dir.take().expect("the data directory");
            let port = loopback_port();
            let child = Command::new(server_binary())
                .args([
                    "serve",
                    "--listen",
                    &format!("127.0.0.1:{port}"),
                    "--watch-bookmark-interval",
                    "1",
                    "--watch-history",
                    "100",
                ])
                .args(extra)
                .arg("--data-dir")
                .arg(data.path())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start kv-apiserver");
            let pki_dir = extra
                .iter()
                .position(|a| *a == "--pki-dir")
                .and_then(|i| extra.get(i + 1))
                .map(PathBuf::from);
            let mut server = Server {
                child,
                dir: data,
                port,
                etcd: None,
                pki_dir,
            };
            if server.wait_ready() {
                return server;
            }
            dir = Some(server.stop_keeping_dir());
        }
        panic!("kv-apiserver did not become ready on any of 5 ports");
    }

    /// Kills the server and returns its data directory, to start another server on it.
    pub fn stop_keeping_dir(mut self) -> tempfile::TempDir {
        let _ = self.child.kill();
        let _ = self.child.wait();
        std::mem::replace(&mut self.dir, tempfile::tempdir().expect("temp dir"))
    }

    fn wait_ready(&mut self) -> bool {
        poll_within(Duration::from_secs(30), wait::POLL, || {
            if let Ok(Some(_)) = self.child.try_wait() {
                return Some(false);
            }
            let ready = self.kubeconfig().exists()
                && String::from_utf8_lossy(&self.curl_anon(&["-s", &self.url("/readyz")]).stdout) == "ok";
            ready.then_some(true)
        })
        .unwrap_or(false)
    }

    /// The value of the unlabelled metric `name` on `/metrics`.
    pub fn metric(&self, name: &str) -> Option<f64> {
        self.get_body("/metrics", &[])
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
    }

    /// How many watch requests the server has answered so far (`apiserver_request_total` with
    /// verb WATCH): a counter, so a waiter never misses one that came and went.
    pub fn watch_requests(&self) -> u64 {
        self.get_body("/metrics", &[])
            .lines()
            .filter(|l| l.starts_with("apiserver_request_total{verb=\"WATCH\""))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    }

    /// Waits until the server has answered `n` watch requests in all. A watch resumes from the
    /// revision of the list before it, so once it is answered no later change can be missed.
    pub fn wait_for_watch_requests(&self, n: u64) {
        eventually(20, &format!("the server saw {n} watch requests"), || {
            (self.watch_requests() >= n).then_some(())
        });
    }

    /// Sends SIGTERM and waits for the process to exit.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        eventually(20, "kv-apiserver exited after SIGTERM", || {
            self.child.try_wait().ok().flatten()
        })
    }

    /// Whether the process still runs and answers `/readyz`.
    pub fn alive(&mut self) -> bool {
        if !matches!(self.child.try_wait(), Ok(None)) {
            return false;
        }
        let out = self.curl_anon(&["-s", &self.url("/readyz")]);
        String::from_utf8_lossy(&out.stdout) == "ok"
    }

    /// The most memory the process has held so far (`VmHWM`), in KiB.
    pub fn peak_rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    }

    pub fn pki_file(&self, file: &str) -> PathBuf {
        self.pki(file)
    }

    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig")
    }

    pub fn viewer_kubeconfig(&self) -> PathBuf {
        self.dir.path().join("viewer.kubeconfig")
    }

    pub fn url(&self, path: &str) -> String {
        format!("https://127.0.0.1:{}{path}", self.port)
    }

    fn pki(&self, file: &str) -> PathBuf {
        self.pki_dir
            .clone()
            .unwrap_or_else(|| self.dir.path().join("pki"))
            .join(file)
    }

    /// kubectl `version` as the admin.
    pub fn kubectl(&self, version: &str) -> Kubectl {
        Kubectl {
            bin: kubectl_path(version),
            kubeconfig: self.kubeconfig(),
            cache: self.dir.path().join(format!("cache-{version}")),
        }
    }

    pub fn kubectl_with(&self, version: &str, kubeconfig: &Path) -> Kubectl {
        Kubectl {
            bin: kubectl_path(version),
            kubeconfig: kubeconfig.to_owned(),
            cache: self
                .dir
                .path()
                .join(format!("cache-{version}-{}", kubeconfig.display()).replace('/', "_")),
        }
    }

    /// curl as the admin (client certificate), trusting our CA.
    pub fn curl(&self, args: &[&str]) -> Output {
        let mut c = Command::new("curl");
        c.arg("--cacert").arg(self.pki("ca.crt"));
        c.arg("--cert").arg(self.pki("admin.crt"));
        c.arg("--key").arg(self.pki("admin.key"));
        c.args(["--max-time", "20"]).args(args);
        c.output().expect("run curl")
    }

    /// curl with no client certificate.
    pub fn curl_anon(&self, args: &[&str]) -> Output {
        let mut c = Command::new("curl");
        c.arg("--cacert").arg(self.pki("ca.crt"));
        c.args(["--max-time", "20"]).args(args);
        c.output().expect("run curl")
    }

    /// A body from curl as the admin, with `extra` arguments.
    pub fn get_body(&self, path: &str, extra: &[&str]) -> String {
        let url = self.url(path);
        let mut args = vec!["-s"];
        args.extend_from_slice(extra);
        args.push(&url);
        String::from_utf8_lossy(&self.curl(&args).stdout).into_owned()
    }
}

/// One kubectl binary bound to one kubeconfig and cache directory.
pub struct Kubectl {
    bin: PathBuf,
    kubeconfig: PathBuf,
    cache: PathBuf,
}

/// What a kubectl run printed.
#[derive(Debug)]
pub struct Run {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn text(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }
}

impl Kubectl {
    /// kubectl `version` with `kubeconfig`, caching under `cache`.
    pub fn new(version: &str, kubeconfig: &Path, cache: &Path) -> Kubectl {
        Kubectl {
            bin: kubectl_path(version),
            kubeconfig: kubeconfig.to_owned(),
            cache: cache.to_owned(),
        }
    }

    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.bin);
        c.env("KUBECONFIG", &self.kubeconfig)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .arg("--cache-dir")
            .arg(&self.cache)
            .args(args);
        c
    }

    pub fn run(&self, args: &[&str]) -> Run {
        self.run_stdin(args, None)
    }

    pub fn run_stdin(&self, args: &[&str], stdin: Option<&str>) -> Run {
        let mut c = self.command(args);
        c.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().expect("run kubectl");
        if let Some(text) = stdin {
            use std::io::Write;
            let mut pipe = child.stdin.take().expect("stdin");
            pipe.write_all(text.as_bytes()).expect("write stdin");
        }
        let out = child.wait_with_output().expect("kubectl output");
        Run {
            ok: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Runs and requires success.
    pub fn ok(&self, args: &[&str]) -> String {
        let r = self.run(args);
        assert!(r.ok, "kubectl {args:?} failed: {}", r.text());
        r.stdout
    }

    /// Runs and requires failure; returns what it printed.
    pub fn fails(&self, args: &[&str]) -> String {
        let r = self.run(args);
        assert!(!r.ok, "kubectl {args:?} should have failed but printed: {}", r.text());
        r.text()
    }

    pub fn apply(&self, args: &[&str], manifest: &str) -> Run {
        let mut all = vec!["apply", "-f", "-"];
        all.extend_from_slice(args);
        self.run_stdin(&all, Some(manifest))
    }

    /// `kubectl apply -f -` that must succeed.
    pub fn must_apply(&self, manifest: &str) -> String {
        let r = self.apply(&[], manifest);
        assert!(r.ok, "kubectl apply failed: {}\n{manifest}", r.text());
        r.stdout
    }

    /// Starts a long-running kubectl (a watch); its stdout lines arrive on the receiver.
    pub fn spawn_lines(&self, args: &[&str]) -> Background {
        let mut child = self
            .command(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start kubectl");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Background { child, lines: rx }
    }
}

/// A background process whose lines can be awaited; killed when dropped.
pub struct Background {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Background {
    /// Waits for a line containing every `needle`; returns every line seen up to it.
    pub fn wait_for(&self, needles: &[&str]) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut seen = Vec::new();
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let hit = needles.iter().all(|n| line.contains(n));
                    seen.push(line);
                    if hit {
                        return seen;
                    }
                }
                Err(_) => break,
            }
        }
        panic!("no line containing {needles:?} within 20s; saw {seen:#?}");
    }

    pub fn wait_exit(mut self) -> bool {
        eventually(30, "background kubectl exited", || self.child.try_wait().ok().flatten()).success()
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn pool(name: &str, extra_labels: &str) -> String {
    format!(
        "apiVersion: worker.gpustack.ai/v1\nkind: KVCachePool\nmetadata:\n  name: {name}\n  labels: {{{extra_labels}}}\nspec:\n  backends: [mooncake-dram]\n  quota:\n    total: 16Gi\n"
    )
}

pub fn binding(ns: &str, name: &str, pool: &str, ceiling: &str) -> String {
    format!(
        "apiVersion: worker.gpustack.ai/v1\nkind: KVCachePoolBinding\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec:\n  poolRef:\n    name: {pool}\n  quota:\n    ceiling: {ceiling}\n  domain:\n    name: {name}\n    blockSize: 64\n    dtype: bfloat16\n"
    )
}

#[path = "../support/engines.rs"]
pub mod engines;

#[path = "../support/words.rs"]
pub mod words;

/// The walkthrough's manifests and what tests read of its objects.
pub mod walkthrough {
    use std::collections::BTreeSet;

    use super::{Kubectl, Server, eventually};

    pub fn manifest(file: &str) -> String {
        let path = format!("{}/../tests/fixtures/walkthrough/{file}", env!("CARGO_MANIFEST_DIR"));
        std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{path}: {e}"))
            .replace("capacityPerMember: 8Gi", "capacityPerMember: 1Gi")
            .replace("total: 16Gi", "total: 2Gi")
            .replace("ceiling: 8Gi", "ceiling: 1Gi")
    }

    /// The flags that make `kv-store` (`tenants`, `bench`) trust the walkthrough backend's store:
    /// the local runtime serves every store port with TLS, under the CA it keeps in the data
    /// directory, for the backend's store name.
    pub fn store_tls(s: &Server) -> Vec<String> {
        vec![
            "--tls-ca".into(),
            s.dir.path().join("store-tls/ca.crt").display().to_string(),
            "--tls-server-name".into(),
            "mooncake-dram.kvstore.internal".into(),
        ]
    }

    /// `kubectl get <what> -o jsonpath=<path>`, empty when it fails.
    pub fn jp(k: &Kubectl, what: &[&str], path: &str) -> String {
        let mut args = vec!["get"];
        args.extend_from_slice(what);
        let p = format!("jsonpath={path}");
        args.extend(["-o", &p]);
        let r = k.run(&args);
        if r.ok { r.stdout } else { String::new() }
    }

    /// Waits until a jsonpath reads `want`.
    pub fn wait_jp(k: &Kubectl, what: &[&str], path: &str, want: &str) {
        eventually(60, &format!("{what:?} {path} = {want:?}"), || {
            (jp(k, what, path) == want).then_some(())
        });
    }

    /// `status|reason|message` of a condition.
    pub fn condition(k: &Kubectl, what: &[&str], type_: &str) -> String {
        jp(
            k,
            what,
            &format!(
                "{{.status.conditions[?(@.type==\"{type_}\")].status}}|{{.status.conditions[?(@.type==\"{type_}\")].reason}}|{{.status.conditions[?(@.type==\"{type_}\")].message}}"
            ),
        )
    }

    pub const KVCB: &[&str] = &["kvcb", "mooncake-dram"];
    pub const KVCP: &[&str] = &["kvcp", "shared-dram"];
    pub const KVCPB: &[&str] = &["-n", "team-a", "kvcpb", "team-a"];
    pub const MD: &[&str] = &["-n", "team-a", "md", "qwen-chat"];

    pub fn wait_ready_backend(k: &Kubectl, capacity: &str) {
        eventually(60, "kvcb Ready with the full capacity", || {
            (jp(k, KVCB, "{.status.phase} {.status.capacity.total}") == format!("Ready {capacity}")).then_some(())
        });
    }

    pub fn wait_granted(k: &Kubectl, effective: &str) {
        eventually(60, "kvcpb QuotaGranted with EFFECTIVE", || {
            let c = condition(k, KVCPB, "QuotaGranted");
            let e = jp(k, KVCPB, "{.status.effectiveQuota}");
            (c.starts_with("True|Granted|") && e == effective).then_some(())
        });
    }

    pub fn wait_attached(k: &Kubectl) {
        eventually(60, "md CacheAttached True", || {
            condition(k, MD, "CacheAttached")
                .starts_with("True|CacheActive|")
                .then_some(())
        });
    }

    /// The leader's gRPC port, from the published Client endpoint.
    pub fn leader_port(k: &Kubectl) -> String {
        let ep = jp(k, KVCB, "{.status.endpoints[?(@.name==\"Client\")].address}");
        ep.rsplit(':').next().unwrap_or_default().to_owned()
    }

    /// kv-store processes of `s`'s store whose front listens on `port` (leaders, members, engines).
    pub fn store_processes(s: &Server, port: &str) -> BTreeSet<(u32, String)> {
        let mut out = BTreeSet::new();
        let needle = format!("127.0.0.1:{port}");
        // leaders reach the Lease API with this server's store kubeconfig
        let data_dir = s.dir.path().display().to_string();
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if !cmd.contains("kv-store") {
                continue;
            }
            let environ = std::fs::read(entry.path().join("environ")).unwrap_or_default();
            if cmd.contains(&needle) || cmd.contains(&data_dir) || String::from_utf8_lossy(&environ).contains(&needle) {
                out.insert((pid, cmd));
            }
        }
        out
    }

    pub fn alive(pid: u32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
    }
}
