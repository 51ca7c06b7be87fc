//! The real `kv-router` binary on a free loopback port, with a workers file in a temporary
//! directory; its log kept and printed when a test fails; killed when dropped.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use serde_json::Value;

pub struct Router {
    child: Child,
    pub addr: SocketAddr,
    pub logs: Arc<Mutex<Vec<String>>>,
    pub workers_file: PathBuf,
    _dir: tempfile::TempDir,
}

impl Router {
    /// Starts kv-router with `workers` in its workers file, a 100 ms health interval, and `extra`
    /// flags.
    pub fn start(workers: Value, extra: &[&str]) -> Router {
        Self::start_with_env(workers, extra, &[])
    }

    /// [`start`](Self::start) with `env` added to the router's environment.
    pub fn start_with_env(workers: Value, extra: &[&str], env: &[(&str, &str)]) -> Router {
        let dir = tempfile::tempdir().unwrap();
        let workers_file = dir.path().join("router-workers.json");
        std::fs::write(&workers_file, workers.to_string()).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_kv-router"))
            .args([
                "--listen",
                "127.0.0.1:0",
                "--health-interval-ms",
                "100",
                "--log-level",
                "debug",
            ])
            .arg("--workers-file")
            .arg(&workers_file)
            .args(extra)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let logs = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        let kept = logs.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(addr) = line.split("addr=").nth(1).filter(|_| line.contains("listening")) {
                    let addr = addr.split_whitespace().next().unwrap_or_default().to_string();
                    let _ = tx.send(addr);
                }
                kept.lock().unwrap().push(line);
            }
        });
        let addr = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(a) => a.parse().unwrap(),
            Err(_) => {
                let _ = child.kill();
                panic!("kv-router did not start: {:?}", logs.lock().unwrap());
            }
        };
        Router {
            child,
            addr,
            logs,
            workers_file,
            _dir: dir,
        }
    }

    /// Replaces the workers file atomically (write, then rename), as the local runtime does.
    pub fn write_workers(&self, content: &str) {
        let tmp = self.workers_file.with_extension("tmp");
        std::fs::write(&tmp, content).unwrap();
        std::fs::rename(&tmp, &self.workers_file).unwrap();
    }

    pub fn logged(&self, needle: &str) -> bool {
        self.logs.lock().unwrap().iter().any(|l| l.contains(needle))
    }

    /// `/metrics` as text.
    pub async fn metrics(&self) -> String {
        let (status, body) = super::call(self.addr, "GET", "/metrics", "").await;
        assert_eq!(status, 200);
        String::from_utf8(body.to_vec()).unwrap()
    }

    /// The value of the series written exactly `series` (name and labels), 0 when absent.
    pub async fn metric(&self, series: &str) -> f64 {
        let text = self.metrics().await;
        value(&text, series)
    }
}

/// The value of `series` in a metrics text, 0 when absent.
pub fn value(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')))
        .map(|v| v.trim().parse().unwrap())
        .unwrap_or(0.0)
}

impl Drop for Router {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- kv-router log ---");
            for l in self.logs.lock().unwrap().iter() {
                eprintln!("{l}");
            }
        }
    }
}
