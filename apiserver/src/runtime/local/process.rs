//! One supervised child process: started in its own process group with its stdout and stderr
//! in a log file, restarted with exponential back-off when it exits (reset once an instance
//! came up: it announced it serves or stands by, or reported, or its health URL answered, or it
//! ran for a minute), stopped with SIGTERM and then SIGKILL after a grace period. Readiness comes
//! from its stdout, or, for a process with a health URL, from that URL answering 200 (asked every
//! [`HEALTH_PERIOD`]).
//!
//! A child never outlives the server: its standard input is a pipe the supervisor holds, and the
//! store binary runs with `--exit-with-stdin`, so when the server ends in any way (even
//! `kill -9`) the kernel closes the pipe and the child stops. `kill_on_drop` covers the direct
//! child as well when the supervisor itself is dropped.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;

use crate::runtime::{CacheReport, Exit, WorkloadState};

/// First wait before a restart; doubled after every quick exit up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// How long an ended child's output is still read: what it started may hold its pipe open.
const READER_GRACE: Duration = Duration::from_secs(2);
/// A run this long resets the back-off.
const STABLE_RUN: Duration = Duration::from_secs(60);
/// Bytes read from the end of the log for an exit's message.
const LOG_TAIL_BYTES: u64 = 2048;
/// Lines of it kept.
const LOG_TAIL_LINES: usize = 5;
/// How often a health URL is asked.
pub const HEALTH_PERIOD: Duration = Duration::from_secs(1);

/// What to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessSpec {
    pub program: PathBuf,
    pub args: Vec<String>,
    /// The whole environment (nothing is inherited).
    pub env: Vec<(String, String)>,
    pub log: PathBuf,
    /// An HTTP URL that answers 200 while the process is ready (a real engine's `/health`);
    /// `None`: it says it is ready on stdout.
    pub health: Option<String>,
}

/// Called when an instance ended on its own, before it is restarted.
pub type ExitHook = Arc<dyn Fn() -> futures::future::BoxFuture<'static, ()> + Send + Sync>;
/// Called whenever the observed state changes (started, ready, a report, ended).
pub type ChangeHook = Arc<dyn Fn() + Send + Sync>;

/// What to call around a supervised process.
#[derive(Clone, Default)]
pub struct Hooks {
    pub on_exit: Option<ExitHook>,
    pub on_change: Option<ChangeHook>,
}

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hooks").finish_non_exhaustive()
    }
}

impl Hooks {
    fn changed(&self) {
        if let Some(f) = &self.on_change {
            f();
        }
    }
}

/// What the supervisor observed, shared with the runtime.
#[derive(Debug, Default)]
struct Observed {
    state: WorkloadState,
    report: Option<CacheReport>,
    /// The epoch a leader announced with its last readiness line.
    epoch: Option<u64>,
    /// The current instance came up: it announced it serves or stands by, or gave a report.
    came_up: bool,
}

/// A live view of whether a supervised leader serves, and under which epoch (what a Service's
/// endpoints know of a Pod's readiness).
#[derive(Debug, Clone)]
pub struct Probe(Arc<Mutex<Observed>>);

impl Probe {
    /// The epoch it serves under, while it is ready.
    pub fn serving(&self) -> Option<u64> {
        let o = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if o.state.ready {
            Some(o.epoch.unwrap_or(0))
        } else {
            None
        }
    }
}

/// A running supervisor; dropping it does not stop the child (call [`Supervised::stop`]).
#[derive(Debug)]
pub struct Supervised {
    pub spec: ProcessSpec,
    observed: Arc<Mutex<Observed>>,
    stop: CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Supervised {
    /// Starts supervising `spec` (the first start happens at once).
    pub fn start(spec: ProcessSpec, grace: Duration, hooks: Hooks) -> Supervised {
        let observed = Arc::new(Mutex::new(Observed::default()));
        let stop = CancellationToken::new();
        let task = tokio::spawn(supervise(spec.clone(), observed.clone(), stop.clone(), grace, hooks));
        Supervised {
            spec,
            observed,
            stop,
            task: Some(task),
        }
    }

    /// A supervisor that never starts anything: the workload is refused for `why`.
    pub fn refused(spec: ProcessSpec, why: String) -> Supervised {
        let observed = Observed {
            state: WorkloadState {
                refused: Some(why),
                ..WorkloadState::default()
            },
            report: None,
            epoch: None,
            came_up: false,
        };
        Supervised {
            spec,
            observed: Arc::new(Mutex::new(observed)),
            stop: CancellationToken::new(),
            task: None,
        }
    }

    pub fn state(&self) -> WorkloadState {
        self.lock().state.clone()
    }

    pub fn report(&self) -> Option<CacheReport> {
        self.lock().report.clone()
    }

    /// A live view of its readiness and epoch.
    pub fn probe(&self) -> Probe {
        Probe(self.observed.clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Observed> {
        self.observed.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Stops the child (SIGTERM to its group, SIGKILL after the grace) and the supervision.
    pub async fn stop(mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

fn now() -> SystemTime {
    SystemTime::now()
}

/// Runs `spec` until `stop`: starts it, waits for it to end, records the exit and restarts it
/// after the back-off.
async fn supervise(
    spec: ProcessSpec,
    observed: Arc<Mutex<Observed>>,
    stop: CancellationToken,
    grace: Duration,
    hooks: Hooks,
) {
    let s = Supervision {
        spec,
        observed,
        stop,
        grace,
        hooks,
    };
    let mut backoff = FIRST_BACKOFF;
    let mut first = true;
    loop {
        if !first {
            s.set(&|o| o.state.restarts += 1);
        }
        first = false;
        let started = Instant::now();
        let mut child = match spawn(&s.spec).await {
            Ok(child) => child,
            Err(e) => {
                s.spawn_failed(&e);
                tokio::select! {
                    () = tokio::time::sleep(backoff) => {}
                    () = s.stop.cancelled() => return,
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
        };
        let Some(status) = s.run(&mut child).await else {
            return;
        };
        s.exited(&status).await;
        // Back off processes that cannot come up, not ones that ran: an instance that served
        // (or stood by) and was then killed is restarted after the first back-off again.
        let came_up = s.lock().came_up;
        if came_up || started.elapsed() >= STABLE_RUN {
            backoff = FIRST_BACKOFF;
        }
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            () = s.stop.cancelled() => return,
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// What [`supervise`] works with: the process, what it observed, and how to stop and announce.
struct Supervision {
    spec: ProcessSpec,
    observed: Arc<Mutex<Observed>>,
    stop: CancellationToken,
    grace: Duration,
    hooks: Hooks,
}

impl Supervision {
    /// The observed state, locked.
    fn lock(&self) -> std::sync::MutexGuard<'_, Observed> {
        self.observed.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Changes the observed state and announces the change.
    fn set(&self, f: &dyn Fn(&mut Observed)) {
        f(&mut self.lock());
        self.hooks.changed();
    }

    /// Records a start that failed as an exit.
    fn spawn_failed(&self, e: &std::io::Error) {
        let exit = Exit {
            code: None,
            signal: None,
            log_tail: format!("could not start {}: {e}", self.spec.program.display()),
            at: now(),
        };
        self.set(&|o| {
            o.state.running = false;
            o.state.ready = false;
            o.state.last_exit = Some(exit.clone());
        });
    }

    /// Watches the started child until it ends (its exit status), or until `stop`: then it is
    /// terminated and `None` returned.
    async fn run(&self, child: &mut Child) -> Option<std::io::Result<std::process::ExitStatus>> {
        self.set(&|o| {
            o.state.running = true;
            o.state.ready = false;
            o.state.started = Some(now());
            o.came_up = false;
        });
        let reader = child.stdout.take().map(|out| {
            let observed = self.observed.clone();
            let log = self.spec.log.clone();
            tokio::spawn(read_stdout(out, log, observed, self.hooks.clone()))
        });
        let prober = self.spec.health.clone().map(|url| {
            let observed = self.observed.clone();
            tokio::spawn(probe_health(url, observed, self.hooks.clone()))
        });
        // The pipe the child watches: held here until the child is done with.
        let stdin = child.stdin.take();
        let status = tokio::select! {
            status = child.wait() => status,
            () = self.stop.cancelled() => {
                if let Some(p) = &prober { p.abort(); }
                terminate(child, self.grace).await;
                drop(stdin);
                if let Some(r) = reader { r.abort(); }
                self.set(&|o| { o.state.running = false; o.state.ready = false; });
                return None;
            }
        };
        drop(stdin);
        if let Some(p) = prober {
            p.abort();
        }
        if let Some(mut r) = reader {
            // its last lines, unless something it left behind still holds the pipe (a grandchild
            // of an engine): then the restart does not wait on it
            if tokio::time::timeout(READER_GRACE, &mut r).await.is_err() {
                r.abort();
            }
        }
        Some(status)
    }

    /// Records the child's exit (code or signal, its log's tail), runs the exit hook, then
    /// announces it.
    async fn exited(&self, status: &std::io::Result<std::process::ExitStatus>) {
        let (code, signal) = match status {
            Ok(s) => {
                use std::os::unix::process::ExitStatusExt;
                (s.code(), s.signal())
            }
            Err(_) => (None, None),
        };
        let exit = Exit {
            code,
            signal,
            log_tail: tail(&self.spec.log).await,
            at: now(),
        };
        tracing::warn!(program = %self.spec.program.display(), log = %self.spec.log.display(), "{}", exit.describe());
        {
            // recorded first, announced once the exit hook has run (the leader then knows too)
            let mut o = self.lock();
            o.state.running = false;
            o.state.ready = false;
            o.state.last_exit = Some(exit.clone());
        }
        if let Some(hook) = &self.hooks.on_exit {
            hook().await;
        }
        self.hooks.changed();
    }
}

async fn spawn(spec: &ProcessSpec) -> std::io::Result<Child> {
    if let Some(dir) = spec.log.parent() {
        tokio::fs::create_dir_all(dir).await?;
    }
    let log = std::fs::OpenOptions::new().create(true).append(true).open(&spec.log)?;
    let mut cmd = Command::new(&spec.program);
    cmd.args(&spec.args)
        .env_clear()
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log))
        .process_group(0)
        .kill_on_drop(true);
    cmd.spawn()
}

/// Sends SIGTERM to the child's process group, then SIGKILL once `grace` has passed.
async fn terminate(child: &mut Child, grace: Duration) {
    let Some(pid) = child.id().and_then(|p| rustix::process::Pid::from_raw(p as i32)) else {
        return;
    };
    let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::TERM);
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        let _ = child.wait().await;
    }
}

/// Copies the child's stdout into its log, noting readiness and cache reports: a store process
/// announces `{"event":"readiness","state":"serving"}` (a member once mounted, a leader once it
/// serves); an engine prints one report per round.
async fn read_stdout(out: tokio::process::ChildStdout, log: PathBuf, observed: Arc<Mutex<Observed>>, hooks: Hooks) {
    let mut file = match tokio::fs::OpenOptions::new().create(true).append(true).open(&log).await {
        Ok(f) => Some(f),
        Err(e) => {
            tracing::warn!(log = %log.display(), "cannot open the log: {e}");
            None
        }
    };
    let mut lines = BufReader::new(out).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if let Some(f) = file.as_mut() {
            let _ = f.write_all(line.as_bytes()).await;
            let _ = f.write_all(b"\n").await;
        }
        let Ok(value) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        {
            let mut o = observed.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let event = value.get("event").and_then(|e| e.as_str());
            if event == Some("readiness") {
                let state = value.get("state").and_then(|s| s.as_str());
                let ready = state == Some("serving");
                o.came_up |= matches!(state, Some("serving" | "standby"));
                if ready && !o.state.ready {
                    o.state.ready_since = Some(SystemTime::now());
                }
                o.state.ready = ready;
                o.epoch = value.get("epoch").and_then(serde_json::Value::as_u64);
            } else if event == Some("listening") {
                // bound, not yet serving: the readiness line follows
            } else if let Ok(report) = serde_json::from_value::<CacheReport>(value) {
                if !o.state.ready {
                    o.state.ready_since = Some(SystemTime::now());
                }
                o.state.ready = true;
                o.came_up = true;
                o.report = Some(report);
            } else {
                continue;
            }
        }
        hooks.changed();
    }
}

/// Asks `url` every [`HEALTH_PERIOD`] for as long as the task runs (the child's life): ready
/// while it answers 200.
async fn probe_health(url: String, observed: Arc<Mutex<Observed>>, hooks: Hooks) {
    loop {
        let ok = healthy(&url).await;
        let changed = {
            let mut o = observed.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let changed = o.state.ready != ok;
            if ok && !o.state.ready {
                o.state.ready_since = Some(SystemTime::now());
            }
            o.state.ready = ok;
            o.came_up |= ok;
            changed
        };
        if changed {
            hooks.changed();
        }
        tokio::time::sleep(HEALTH_PERIOD).await;
    }
}

/// Whether `GET url` (plain `http://host:port/path`) answers 200 within a second.
async fn healthy(url: &str) -> bool {
    use tokio::io::AsyncReadExt;
    let Some(rest) = url.strip_prefix("http://") else {
        return false;
    };
    let (authority, path) = rest
        .split_once('/')
        .map_or((rest, "/".to_owned()), |(a, p)| (a, format!("/{p}")));
    let ask = async {
        let mut s = tokio::net::TcpStream::connect(authority).await.ok()?;
        let request = format!("GET {path} HTTP/1.0\r\nHost: {authority}\r\n\r\n");
        s.write_all(request.as_bytes()).await.ok()?;
        let mut head = [0u8; 12];
        s.read_exact(&mut head).await.ok()?;
        Some(head.starts_with(b"HTTP/1.") && &head[8..12] == b" 200")
    };
    tokio::time::timeout(Duration::from_secs(1), ask)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}

/// The last lines of a log, joined with ` | `.
async fn tail(log: &PathBuf) -> String {
    use tokio::io::{AsyncReadExt, AsyncSeekExt};
    let Ok(mut f) = tokio::fs::File::open(log).await else {
        return String::new();
    };
    let len = f.metadata().await.map(|m| m.len()).unwrap_or(0);
    let _ = f
        .seek(std::io::SeekFrom::Start(len.saturating_sub(LOG_TAIL_BYTES)))
        .await;
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf).await;
    let text = String::from_utf8_lossy(&buf);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join(" | ")
}

#[cfg(test)]
mod tests;
