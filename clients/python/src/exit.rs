//! Calls in flight when the interpreter exits.
//!
//! Every network call releases the GIL. If the interpreter finalizes while a call is out (a
//! daemon thread of an engine, or the connector's own connecting thread), CPython before 3.14
//! ends that thread with `pthread_exit` the moment it asks for the GIL back. That unwinds through
//! pyo3's panic guard, which cannot let a foreign unwind pass, and the whole process aborts
//! ("FATAL: exception not rethrown") after the program itself finished fine.
//!
//! So calls leave the GIL only through [`detach`], which counts them, and an `atexit` hook
//! ([`drain`]) runs before finalization starts: it refuses new calls from other threads, gives up
//! the ones out (each answers `TRANSPORT`, as a call given up at its timeout does), and waits
//! until every one has its GIL back. After that no other thread of ours is outside the GIL, so
//! none is there to be ended. The thread that runs the hooks (the one that finalizes, never ended)
//! goes on calling as before: an `atexit` hook of the program's own may still store or read.

use std::future::Future;
use std::sync::LazyLock;
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use kvcache_store::error::{ErrorCode, StoreError as Refusal};
use parking_lot::{Condvar, Mutex};
use pyo3::prelude::*;

/// How long [`drain`] waits for calls it gave up to come back. They stop at their next poll; the
/// only wait left is a copy in progress or a runtime's start, so this bound is never reached in
/// practice and only keeps a wedged thread from holding the exit forever.
const DRAIN_WAIT: Duration = Duration::from_secs(10);

/// Calls that left the GIL and have not yet taken it back, and once the interpreter is exiting,
/// the thread that finalizes it (then no call of another thread leaves the GIL any more).
struct Gate {
    out: Mutex<(usize, Option<ThreadId>)>,
    back: Condvar,
    /// `true` once exiting: calls out select on it and give up.
    stop: tokio::sync::watch::Sender<bool>,
}

static GATE: LazyLock<Gate> = LazyLock::new(|| Gate {
    out: Mutex::new((0, None)),
    back: Condvar::new(),
    stop: tokio::sync::watch::Sender::new(false),
});

fn exiting() -> Refusal {
    Refusal::new(
        ErrorCode::Transport,
        "the Python interpreter is exiting; the call was given up (a reservation it made expires on its own)",
    )
}

/// One call out of the GIL; dropping it, with the GIL held again, counts the call back.
enum Out {
    Counted,
    /// the finalizing thread's call after [`drain`]: nothing waits for it
    Finalizing,
}

impl Out {
    fn leave() -> Result<Out, Refusal> {
        let mut out = GATE.out.lock();
        match out.1 {
            None => {
                out.0 += 1;
                Ok(Out::Counted)
            }
            Some(t) if t == std::thread::current().id() => Ok(Out::Finalizing),
            Some(_) => Err(exiting()),
        }
    }
}

impl Drop for Out {
    fn drop(&mut self) {
        if let Out::Counted = self {
            let mut out = GATE.out.lock();
            out.0 -= 1;
            if out.0 == 0 {
                GATE.back.notify_all();
            }
        }
    }
}

/// Runs `f` with the GIL released; `f` is handed a future that completes once the interpreter
/// is exiting, to give its wait up on. Refused at once when the interpreter is already exiting,
/// unless this is the thread that finalizes it.
pub fn detach<T: Send>(py: Python<'_>, f: impl FnOnce(Stop) -> Result<T, Refusal> + Send) -> Result<T, Refusal> {
    let out = Out::leave()?;
    let stop = match out {
        Out::Counted => Stop(Some(GATE.stop.subscribe())),
        Out::Finalizing => Stop(None),
    };
    let r = py.detach(|| f(stop));
    // the GIL is ours again: only now may the exit go on
    drop(out);
    r
}

/// Completes once the interpreter is exiting (never, for the finalizing thread's calls).
pub struct Stop(Option<tokio::sync::watch::Receiver<bool>>);

impl Stop {
    /// `f`, or [`exiting`]'s refusal once the interpreter exits first.
    pub async fn or<T>(self, f: impl Future<Output = Result<T, Refusal>>) -> Result<T, Refusal> {
        let Some(mut exit) = self.0 else { return f.await };
        tokio::select! {
            r = f => r,
            _ = exit.wait_for(|exiting| *exiting) => Err(exiting()),
        }
    }
}

/// The `atexit` hook: refuses new calls of other threads than this one (which finalizes), gives
/// up the ones out, and waits (GIL released, at most [`DRAIN_WAIT`]) until each has taken the GIL
/// back.
#[pyfunction]
pub fn drain(py: Python<'_>) {
    GATE.out.lock().1 = Some(std::thread::current().id());
    GATE.stop.send_replace(true);
    py.detach(|| {
        let deadline = Instant::now() + DRAIN_WAIT;
        let mut out = GATE.out.lock();
        while out.0 > 0 {
            if GATE.back.wait_until(&mut out, deadline).timed_out() {
                eprintln!(
                    "kvcache: {} store call(s) still out at exit after {} s; the process may abort",
                    out.0,
                    DRAIN_WAIT.as_secs()
                );
                break;
            }
        }
    });
}

/// Registers [`drain`] with `atexit`, from the module's initialization.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let hook = wrap_pyfunction!(drain, m)?;
    m.py().import("atexit")?.call_method1("register", (hook,))?;
    Ok(())
}
