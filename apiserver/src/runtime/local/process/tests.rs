use super::*;

fn sh(script: &str, log: PathBuf) -> ProcessSpec {
    ProcessSpec {
        program: "/bin/sh".into(),
        args: vec!["-c".into(), script.into()],
        env: vec![],
        log,
        health: None,
    }
}

async fn until(s: &Supervised, f: impl Fn(&WorkloadState) -> bool) -> WorkloadState {
    let mut reached = None;
    crate::eventually::eventually_async(Duration::from_secs(30), "the awaited workload state", || {
        let st = s.state();
        let done = f(&st);
        reached = Some(st);
        std::future::ready(done)
    })
    .await;
    reached.expect("polled at least once")
}

#[tokio::test]
async fn an_exit_is_recorded_with_its_log_and_restarted() {
    let dir = tempfile::tempdir().unwrap();
    let s = Supervised::start(
        sh("echo starting >&2; echo broken >&2; exit 3", dir.path().join("x.log")),
        Duration::from_secs(1),
        Hooks::default(),
    );
    let st = until(&s, |st| st.restarts >= 1).await;
    let exit = st.last_exit.unwrap();
    assert_eq!(exit.code, Some(3));
    assert!(exit.log_tail.contains("broken"), "{}", exit.log_tail);
    s.stop().await;
}

/// An engine's API process killed, its engine core left running with the same stdout (as
/// vLLM's can be): the exit is recorded and the restart does not wait for that pipe to close.
#[tokio::test]
async fn an_exit_is_restarted_though_what_it_left_holds_its_stdout() {
    let dir = tempfile::tempdir().unwrap();
    let pids = dir.path().join("pids");
    // out of the group, so only this test's own kill ends it
    let script = format!("setsid sleep 60 & echo $! >> {}; exit 4", pids.display());
    let s = Supervised::start(
        sh(&script, dir.path().join("z.log")),
        Duration::from_secs(1),
        Hooks::default(),
    );
    let st = until(&s, |st| st.restarts >= 1).await;
    assert_eq!(st.last_exit.unwrap().code, Some(4));
    s.stop().await;
    for pid in std::fs::read_to_string(&pids).unwrap_or_default().lines() {
        let _ = std::process::Command::new("kill").args(["-KILL", pid.trim()]).status();
    }
}

#[tokio::test]
async fn stop_terminates_the_whole_group_and_reports() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    // the shell's child (sleep) is in the same group and must go too
    let script = format!(
        "sleep 60 & echo $! > {}; echo '{{\"event\":\"readiness\",\"state\":\"serving\"}}'; wait",
        pidfile.display()
    );
    let s = Supervised::start(
        sh(&script, dir.path().join("y.log")),
        Duration::from_secs(2),
        Hooks::default(),
    );
    until(&s, |st| st.ready).await;
    let pid: i32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
    s.stop().await;
    let gone = || std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |st| st.contains(") Z "));
    tokio::time::timeout(Duration::from_secs(10), async {
        while !gone() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the grandchild was left running");
}

#[tokio::test]
async fn a_health_url_decides_readiness() {
    let dir = tempfile::tempdir().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/health", listener.local_addr().unwrap());
    let mut spec = sh("sleep 30", dir.path().join("h.log"));
    spec.health = Some(url);
    let s = Supervised::start(spec, Duration::from_secs(1), Hooks::default());
    // the first probe gets no answer; the second comes only once the first was judged
    let (unanswered, _) = listener.accept().await.unwrap();
    drop(unanswered);
    let (mut second, _) = listener.accept().await.unwrap();
    assert!(!s.state().ready, "nothing answered yet: not ready");
    let server = tokio::spawn(async move {
        let mut buf = [0u8; 256];
        let _ = tokio::io::AsyncReadExt::read(&mut second, &mut buf).await;
        let _ = second.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").await;
        loop {
            let (mut c, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 256];
            let _ = tokio::io::AsyncReadExt::read(&mut c, &mut buf).await;
            let _ = c.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").await;
        }
    });
    until(&s, |st| st.ready && st.ready_since.is_some()).await;
    server.abort();
    s.stop().await;
}

#[tokio::test]
async fn reports_on_stdout_are_read() {
    let dir = tempfile::tempdir().unwrap();
    let line = r#"{"tenant":"t","blocks":10,"hits":4,"stored":6,"hit_rate":0.4}"#;
    let s = Supervised::start(
        sh(&format!("echo '{line}'; sleep 30"), dir.path().join("z.log")),
        Duration::from_secs(1),
        Hooks::default(),
    );
    until(&s, |st| st.ready).await;
    assert_eq!(s.report().unwrap().hits, 4);
    s.stop().await;
    let log = std::fs::read_to_string(dir.path().join("z.log")).unwrap();
    assert!(log.contains("hit_rate"), "stdout goes to the log too: {log}");
}
