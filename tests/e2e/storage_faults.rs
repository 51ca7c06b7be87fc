//! A real full disk under the embedded storage: the server's data directory sits on a 6 MiB
//! tmpfs of the test's own, so the storage log (4 MiB, preallocated) cannot grow. Writes are then
//! refused with a `ServiceUnavailable` Status that says the disk is full, `/readyz` fails, reads
//! still serve, and once the file system is given room (`mount -o remount,size=…`, as an operator
//! would grow a volume) writing resumes by itself. Nothing acknowledged is lost across a restart.
//!
//! Mounting needs root (the project's machines and CI run as root); the test says so otherwise.
//! The injected faults (ENOSPC and EIO at write and at fsync) are unit tests of the storage,
//! `apiserver/src/storage/embedded/tests.rs`.

#![allow(clippy::unwrap_used)]

mod support;

use std::path::Path;
use std::process::Command;

use serde_json::{Value, json};
use support::{Kubectl, Server, eventually};

/// A tmpfs mounted for the test, unmounted (lazily, after the server is gone) when dropped.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Tmpfs {
        assert!(
            rustix::process::geteuid().is_root(),
            "this test mounts a small tmpfs to fill it, which needs root; run it as root (CI does)"
        );
        let dir = tempfile::tempdir().unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "kvcache-full-disk"])
            .arg(dir.path())
            .status()
            .unwrap()
            .success();
        assert!(ok, "mount -t tmpfs failed");
        Tmpfs { dir }
    }

    fn resize(&self, size: &str) {
        let ok = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(self.dir.path())
            .status()
            .unwrap()
            .success();
        assert!(ok, "remounting the tmpfs failed");
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.dir.path()).status();
    }
}

const BACKEND: &str = "/apis/worker.gpustack.ai/v1/kvcachebackends";

/// The walkthrough's backend, stored and never run (`--controllers=false`).
const MANIFEST: &str = include_str!("../fixtures/walkthrough/01-backend.yaml");
const NAME: &str = "mooncake-dram";

/// PATCHes a 200 KiB annotation (`round` makes it new each time); the HTTP code and the body.
fn fill(server: &Server, scratch: &Path, round: usize) -> (u16, Value, String) {
    let text: String = std::iter::repeat_n(char::from(b'a' + (round % 26) as u8), 200 << 10).collect();
    let body = scratch.join("patch.json");
    std::fs::write(
        &body,
        json!({"metadata": {"annotations": {"fill": text, "round": round.to_string()}}}).to_string(),
    )
    .unwrap();
    let out = server.curl(&[
        "-s",
        "-w",
        "\n%{http_code}",
        "-X",
        "PATCH",
        "-H",
        "Content-Type: application/merge-patch+json",
        "--data-binary",
        &format!("@{}", body.display()),
        &server.url(&format!("{BACKEND}/{NAME}")),
    ]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap();
    (
        code.parse().unwrap(),
        serde_json::from_str(body).unwrap(),
        format!("round {round}"),
    )
}

fn readyz(server: &Server) -> (u16, String) {
    let out = server.curl_anon(&["-s", "-w", "\n%{http_code}", &server.url("/readyz?verbose")]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap();
    (code.parse().unwrap(), body.to_owned())
}

fn round_of(object: &Value) -> &str {
    object["metadata"]["annotations"]["round"].as_str().unwrap_or("")
}

#[test]
fn a_full_disk_refuses_writes_keeps_reads_and_resumes_by_itself() {
    let disk = Tmpfs::mount("6m");
    let scratch = tempfile::tempdir().unwrap();
    let server = Server::start_in(tempfile::tempdir_in(disk.path()).unwrap(), &["--controllers=false"]);
    let created = server.curl(&[
        "-s",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "-X",
        "POST",
        "-H",
        "Content-Type: application/yaml",
        "--data-binary",
        MANIFEST,
        &server.url(BACKEND),
    ]);
    assert_eq!(String::from_utf8_lossy(&created.stdout), "201");

    // Fill the log until the disk is full: every write before the refusal was acknowledged.
    let mut acknowledged = None;
    let mut refusal = None;
    for round in 0..60 {
        let (code, body, what) = fill(&server, scratch.path(), round);
        match code {
            200 => acknowledged = Some(body),
            503 => {
                println!("{what}: refused: {}", body["message"]);
                refusal = Some(body);
                break;
            }
            other => panic!("{what}: HTTP {other}: {body}"),
        }
    }
    let refusal = refusal.expect("a 6 MiB disk must fill up within 60 writes of 200 KiB");
    let acknowledged = acknowledged.expect("some writes fit before the disk filled");
    assert_eq!(refusal["kind"], "Status");
    assert_eq!(refusal["reason"], "ServiceUnavailable");
    assert_eq!(refusal["code"], 503);
    let message = refusal["message"].as_str().unwrap();
    assert!(
        message.contains("out of space") && message.contains("resume by themselves"),
        "{message}"
    );

    // /readyz fails and says why; reads still serve the last acknowledged write
    let (code, body) = readyz(&server);
    assert_ne!(code, 200, "{body}");
    println!("/readyz while full: {code} {body}");
    let got: Value = serde_json::from_str(&server.get_body(&format!("{BACKEND}/{NAME}"), &[])).unwrap();
    assert_eq!(round_of(&got), round_of(&acknowledged));
    assert_eq!(
        got["metadata"]["resourceVersion"],
        acknowledged["metadata"]["resourceVersion"]
    );

    // what a kubectl user sees
    let kubectl = Kubectl::new("1.33", &server.kubeconfig(), &scratch.path().join("kubectl-cache"));
    let said = kubectl.fails(&["annotate", "kvcb", NAME, "note=full"]);
    assert!(
        said.contains("ServiceUnavailable") && said.contains("out of space"),
        "{said}"
    );
    println!("kubectl annotate while full: {said}");
    assert!(kubectl.ok(&["get", "kvcb", NAME, "-o", "name"]).contains(NAME));

    // the volume grows: writing resumes by itself
    disk.resize("64m");
    eventually(20, "/readyz to pass once the disk has room", || {
        (readyz(&server).0 == 200).then_some(())
    });
    let (code, resumed, what) = fill(&server, scratch.path(), 100);
    assert_eq!(code, 200, "{what}: {resumed}");

    // and everything acknowledged is there after a restart
    let dir = server.stop_keeping_dir();
    let server = Server::start_in(dir, &["--controllers=false"]);
    let got: Value = serde_json::from_str(&server.get_body(&format!("{BACKEND}/{NAME}"), &[])).unwrap();
    assert_eq!(round_of(&got), "100");
    assert_eq!(
        got["metadata"]["resourceVersion"],
        resumed["metadata"]["resourceVersion"]
    );
    drop(server);
}
