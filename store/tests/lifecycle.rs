//! The binary at its edges: SIGTERM stops a leader and a member gracefully (exit 0, ports
//! closed); `kv-store bench` against a fresh leader registers its own tenant; a failure at the
//! command line is one line on stderr and exit status 1.

// Helpers outside #[test] fns state expectations with unwrap too (see clippy.toml).
#![allow(clippy::unwrap_used)]

mod common;

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::*;

/// Sends SIGTERM to `p` and waits (up to `bound`) for it to exit; returns how it exited.
fn terminate(p: &mut Proc, bound: Duration) -> std::process::ExitStatus {
    let pid = p.child.id().to_string();
    let sent = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(sent.success(), "kill -TERM {pid}");
    common::eventually_within(bound, "exited after SIGTERM", || p.exited())
}

fn refused(addr: &str) -> bool {
    std::net::TcpStream::connect(addr).is_err()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_a_member_and_a_leader_gracefully() {
    let mut l = leader(&["--tenant", "t=16Mi:64:bfloat16", "--metrics-listen", "127.0.0.1:0"]);
    let addr = l.field("grpc");
    let mut m = member(&addr, "m1", "8Mi");
    let c = client(&addr, "t").await;
    wait_members(&c, 1).await;
    c.put("k", bytes::Bytes::from_static(b"v")).await.unwrap();
    // a pooled data connection and a fast-port connection stay open across the stops
    assert!(c.get("k").await.unwrap().is_some());

    let status = tokio::task::spawn_blocking(move || {
        let s = terminate(&mut m, Duration::from_secs(5));
        (s, m)
    })
    .await
    .unwrap();
    let (status, m) = status;
    assert!(status.success(), "member exit: {status}");
    assert!(
        refused(&m.field("data")) && refused(&m.field("grpc")),
        "member ports closed"
    );

    let fast = format!(
        "127.0.0.1:{}",
        l.announce["fast"].as_str().unwrap().rsplit(':').next().unwrap()
    );
    let metrics = l.field("metrics");
    let status = tokio::task::spawn_blocking(move || terminate(&mut l, Duration::from_secs(5)))
        .await
        .unwrap();
    assert!(status.success(), "leader exit: {status}");
    for a in [&addr, &fast, &metrics] {
        assert!(refused(a), "{a} still accepts");
    }
}

/// Runs `kv-store ARGS` to the end with the default log filter.
fn run(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env_remove("RUST_LOG")
        .env_remove("RUST_BACKTRACE")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn bench_registers_its_tenant_on_a_fresh_leader() {
    let l = leader(&[]);
    let addr = l.field("grpc");
    let _m = member(&addr, "m1", "16Mi");
    let out = run(&[
        "bench",
        "--leader",
        &addr,
        "--ops",
        "20",
        "--sizes",
        "64Ki",
        "--max-time",
        "10s",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench failed:\n{stdout}\n{stderr}");
    let ops: Vec<String> = stdout
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}"));
            assert_eq!(v["size"], 65536, "{l}");
            assert!(v["ops_per_s"].as_f64().unwrap() > 0.0, "{l}");
            v["op"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(ops, ["put", "get", "exists"], "{stdout}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].starts_with("kv-store bench: tenant \"bench\" was not in the leader's ledger; registered it"),
        "{stderr}"
    );

    // the second run finds the tenant and says nothing
    let again = run(&["bench", "--leader", &addr, "--ops", "5", "--sizes", "4Ki"]);
    assert!(again.status.success(), "{}", String::from_utf8_lossy(&again.stderr));
    assert!(again.stderr.is_empty(), "{}", String::from_utf8_lossy(&again.stderr));
}

#[test]
fn failures_at_the_command_line_are_one_line_and_status_1() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = closed.local_addr().unwrap().to_string();
    drop(closed);
    let cases: [(&[&str], &str); 5] = [
        (&["leader", "--fast-listen", "nowhere"], "neither `off` nor"),
        (&["member", "--capacity", "1Gi"], "--leader <LEADER>"),
        (
            &["bench", "--leader", &addr, "--ops", "1"],
            "cannot reach the leader at",
        ),
        (
            &["leader", "--listen", "127.0.0.1:0", "--high-watermark", "1.5"],
            "--high-watermark: ",
        ),
        (
            &["member", "--leader", &addr, "--capacity", "0"],
            "--capacity: must be greater than 0",
        ),
    ];
    for (args, needle) in cases {
        let out = run(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{args:?} printed:\n{stderr}");
        assert!(
            lines[0].starts_with("kv-store: error: ") && lines[0].contains(needle),
            "{args:?}: {stderr}"
        );
        assert!(
            !stderr.contains("Status {") && !stderr.contains("backtrace"),
            "{stderr}"
        );
    }
}

/// `kv-store exec` (how the local runtime runs engines): when the command dies and leaves what
/// it started running (vLLM's engine core, when its API process is killed), that goes too.
#[test]
fn exec_stops_what_its_command_left_running() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    let script = format!("sleep 60 & echo $! > {}; kill -KILL $$", pid_file.display());
    let out = Command::new(BIN)
        .args(["exec", "--", "/bin/sh", "-c", &script])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success(), "the command was killed: exec says so");
    let pid = std::fs::read_to_string(&pid_file).unwrap().trim().to_owned();
    let gone = || std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |st| st.contains(") Z "));
    common::eventually_within(Duration::from_secs(10), "the command's leftover stopped", || {
        gone().then_some(())
    });
}
