//! Hostile input against the real `kv-apiserver serve`, one test per defect a probe of over
//! 1,500 requests found: each answer must be a `metav1.Status`, nothing may be written by a
//! refused request, and the server must stay up with its memory bounded.
//!
//! `KV_APISERVER_BIN=<older kv-apiserver>` runs these against another build (they fail against
//! the build before the fixes).

#![allow(clippy::unwrap_used)]

mod support;

use serde_json::{Value, json};
use support::Server;

const POOLS: &str = "/apis/worker.gpustack.ai/v1/kvcachepools";

/// What one request got back.
#[derive(Debug)]
struct Reply {
    code: u16,
    body: String,
    headers: Vec<String>,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }

    /// Asserts a Status of `code`.
    fn status(&self, code: u16) -> Value {
        assert_eq!(self.code, code, "{self:?}");
        let v = self.json();
        assert_eq!(v["kind"], "Status", "{self:?}");
        assert_eq!(v["code"], code, "{self:?}");
        v
    }
}

/// One request as the admin; the body goes through a file so that any size works.
fn send(s: &Server, method: &str, path: &str, content_type: &str, body: &[u8], extra: &[&str]) -> Reply {
    let dir = tempfile::tempdir().unwrap();
    let (body_file, head_file) = (dir.path().join("body"), dir.path().join("head"));
    std::fs::write(&body_file, body).unwrap();
    let data = format!("@{}", body_file.display());
    let head = head_file.display().to_string();
    let url = s.url(path);
    let mut args = vec!["-s", "-X", method, "-D", &head, "-w", "\n%{http_code}"];
    if !body.is_empty() {
        args.extend(["-H", content_type, "--data-binary", &data]);
    }
    args.extend_from_slice(extra);
    args.push(&url);
    let out = s.curl(&args);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    Reply {
        code: code.trim().parse().unwrap_or(0),
        body: body.to_owned(),
        headers: std::fs::read_to_string(&head_file)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect(),
    }
}

fn pool(name: &str) -> Value {
    json!({"apiVersion": "worker.gpustack.ai/v1", "kind": "KVCachePool", "metadata": {"name": name},
           "spec": {"backends": ["mooncake-dram"], "quota": {"total": "16Gi"}}})
}

fn create(s: &Server, obj: &Value) -> Value {
    let r = send(
        s,
        "POST",
        POOLS,
        "Content-Type: application/json",
        obj.to_string().as_bytes(),
        &[],
    );
    assert_eq!(r.code, 201, "{r:?}");
    r.json()
}

fn get(s: &Server, name: &str) -> Reply {
    send(s, "GET", &format!("{POOLS}/{name}"), "", b"", &[])
}

const JSON_PATCH: &str = "Content-Type: application/json-patch+json";

#[test]
fn a_json_patch_that_nests_a_value_into_itself_is_refused_without_a_crash() {
    let mut s = Server::start();
    create(&s, &pool("deep"));
    // Each copy puts /x at the bottom of its own chain: the depth doubles, 16 operations
    // reach 32,768 levels in a 66 KB body.
    let mut ops = vec![json!({"op": "add", "path": "/x", "value": {"b": {}}})];
    let mut depth = 1;
    while depth < 25_000 {
        ops.push(json!({"op": "copy", "from": "/x", "path": format!("/x{}", "/b".repeat(depth))}));
        depth *= 2;
    }
    let r = send(
        &s,
        "PATCH",
        &format!("{POOLS}/deep"),
        JSON_PATCH,
        Value::Array(ops).to_string().as_bytes(),
        &[],
    );
    let status = r.status(413);
    assert!(status["message"].as_str().unwrap().contains("deeper than"), "{r:?}");
    assert!(s.alive(), "the server died");
}

#[test]
fn json_patch_copies_are_bounded_in_size() {
    let mut s = Server::start();
    let mut p = pool("big");
    p["metadata"]["annotations"] = json!({"big": "x".repeat(40 << 10)});
    create(&s, &p);
    let before = s.peak_rss_kib();
    // 14 doublings of a 40 KiB annotation: over 600 MiB if applied.
    let mut ops = vec![
        json!({"op": "add", "path": "/x", "value": []}),
        json!({"op": "copy", "from": "/metadata/annotations/big", "path": "/x/-"}),
    ];
    for _ in 0..13 {
        ops.push(json!({"op": "copy", "from": "/x", "path": "/x/-"}));
    }
    let body = Value::Array(ops).to_string();
    assert!(body.len() < 1024, "{}", body.len());
    let r = send(&s, "PATCH", &format!("{POOLS}/big"), JSON_PATCH, body.as_bytes(), &[]);
    r.status(413);
    let grown = s.peak_rss_kib().saturating_sub(before);
    assert!(
        grown < 100 << 10,
        "the server grew by {grown} KiB for a {} byte patch",
        body.len()
    );
    // Past 10,000 operations is refused as kube-apiserver refuses it.
    let ops = vec![json!({"op": "test", "path": "/kind", "value": "KVCachePool"}); 10_001];
    let r = send(
        &s,
        "PATCH",
        &format!("{POOLS}/big"),
        JSON_PATCH,
        Value::Array(ops).to_string().as_bytes(),
        &[],
    );
    r.status(413);
    assert!(s.alive());
}

/// A YAML body with one anchored 64 KiB string referenced 3,000 times under `spec.x`.
fn alias_bomb(name: &str) -> String {
    let mut text = format!(
        "apiVersion: worker.gpustack.ai/v1\nkind: KVCachePool\nmetadata:\n  name: {name}\n  annotations:\n    a: &big {}\nspec:\n  backends: [mooncake-dram]\n  quota: {{total: 1Gi}}\n  x: [",
        "y".repeat(64 << 10)
    );
    text.push_str(&vec!["*big"; 3000].join(", "));
    text.push_str("]\n");
    text
}

/// A 14 KB body whose list of 2,000 one-letter items is referenced 2,000 times: 4 million nodes of
/// a few bytes of text each, which cost ~60 bytes each in memory once built.
fn list_bomb(name: &str) -> String {
    format!(
        "apiVersion: worker.gpustack.ai/v1\nkind: KVCachePool\nmetadata:\n  name: {name}\nspec:\n  backends: [mooncake-dram]\n  quota: {{total: 1Gi}}\n  l: &l [{}]\n  x: [{}]\n",
        vec!["a"; 2000].join(", "),
        vec!["*l"; 2000].join(", ")
    )
}

#[test]
fn many_tiny_aliased_nodes_are_bounded_by_what_they_cost_in_memory() {
    let mut s = Server::start();
    let before = s.peak_rss_kib();
    let heap_before = s.metric("process_heap_allocated_bytes").expect("the heap in use");
    let body = list_bomb("tiny");
    assert!(body.len() < 16 << 10, "{} bytes", body.len());
    let r = send(
        &s,
        "POST",
        POOLS,
        "Content-Type: application/yaml",
        body.as_bytes(),
        &[],
    );
    r.status(413);
    assert_eq!(get(&s, "tiny").code, 404, "nothing is created");
    // The heap's peak since the start bounds what the request built (from the heap in use
    // before it): at most three times the 12 MiB bound.
    let peak = s.metric("process_heap_peak_allocated_bytes").expect("the heap's peak");
    let rise = peak - heap_before;
    eprintln!("the heap rose by at most {:.1} MiB", rise / f64::from(1 << 20));
    assert!(
        rise <= 3.0 * f64::from(12 << 20),
        "the heap rose by up to {rise} bytes for a 14 KB body"
    );
    let grown = s.peak_rss_kib().saturating_sub(before);
    eprintln!("the server grew by {grown} KiB");
    // the bound is 12 MiB of built value; the server may hold a small multiple of it, not the
    // ~250 MiB the 4 million nodes would take
    assert!(grown < 64 << 10, "the server grew by {grown} KiB for a 14 KB body");
    assert!(s.alive());
}

#[test]
fn yaml_aliases_cannot_build_more_than_the_bounds() {
    let mut s = Server::start();
    let before = s.peak_rss_kib();
    let heap_before = s.metric("process_heap_allocated_bytes").expect("the heap in use");
    let r = send(
        &s,
        "POST",
        POOLS,
        "Content-Type: application/yaml",
        alias_bomb("bomb").as_bytes(),
        &[],
    );
    r.status(413);
    assert_eq!(get(&s, "bomb").code, 404, "nothing is created");
    let r = send(
        &s,
        "PATCH",
        &format!("{POOLS}/bomb2?fieldManager=t"),
        "Content-Type: application/apply-patch+yaml",
        alias_bomb("bomb2").as_bytes(),
        &[],
    );
    r.status(413);
    assert_eq!(get(&s, "bomb2").code, 404, "nothing is created");
    let rise = s.metric("process_heap_peak_allocated_bytes").expect("the heap's peak") - heap_before;
    assert!(
        rise <= 3.0 * f64::from(12 << 20),
        "the heap rose by up to {rise} bytes for two 85 KB bodies"
    );
    let grown = s.peak_rss_kib().saturating_sub(before);
    assert!(grown < 100 << 10, "the server grew by {grown} KiB for two 85 KB bodies");
    assert!(s.alive());
}

#[test]
fn a_strict_apply_that_is_refused_writes_nothing() {
    let s = Server::start();
    let created = create(&s, &pool("strict"));
    let rv = created["metadata"]["resourceVersion"].clone();
    let config = "apiVersion: worker.gpustack.ai/v1\nkind: KVCachePool\nmetadata:\n  name: strict\n  labels: {added: yes}\nspec:\n  bogus: 1\n";
    let r = send(
        &s,
        "PATCH",
        &format!("{POOLS}/strict?fieldManager=t&fieldValidation=Strict"),
        "Content-Type: application/apply-patch+yaml",
        config.as_bytes(),
        &[],
    );
    let status = r.status(400);
    assert!(status["message"].as_str().unwrap().contains("spec.bogus"), "{r:?}");
    let now = get(&s, "strict").json();
    assert_eq!(now["metadata"]["resourceVersion"], rv, "the refused apply wrote");
    assert!(
        now["metadata"].get("labels").is_none(),
        "the refused apply stored its label"
    );
}

#[test]
fn malformed_delete_options_delete_nothing() {
    let s = Server::start();
    create(&s, &pool("keep"));
    let item = format!("{POOLS}/keep");
    for body in [
        r#"{"dryRun":"All"}"#,
        r#"{"dryRun":1}"#,
        r#"{"preconditions":{"uid":5}}"#,
        "[]",
        r#"{"propagationPolicy":5}"#,
    ] {
        let r = send(
            &s,
            "DELETE",
            &item,
            "Content-Type: application/json",
            body.as_bytes(),
            &[],
        );
        r.status(400);
        assert_eq!(get(&s, "keep").code, 200, "deleted by {body}");
    }
    for query in ["dryRun=&dryRun=All", "gracePeriodSeconds=abc"] {
        let r = send(&s, "DELETE", &format!("{item}?{query}"), "", b"", &[]);
        r.status(400);
        assert_eq!(get(&s, "keep").code, 200, "deleted by ?{query}");
    }
}

#[test]
fn a_body_of_another_api_version_or_kind_is_refused() {
    let s = Server::start();
    let created = create(&s, &pool("typed"));
    for (field, value) in [
        ("apiVersion", "v1"),
        ("apiVersion", "worker.gpustack.ai/v2"),
        ("apiVersion", "apps/v1"),
        ("kind", "Pod"),
        ("kind", "KVCacheBackend"),
        ("kind", "kvcachepool"),
    ] {
        let mut p = pool("other");
        p[field] = json!(value);
        let r = send(
            &s,
            "POST",
            POOLS,
            "Content-Type: application/json",
            p.to_string().as_bytes(),
            &[],
        );
        r.status(400);
        assert_eq!(get(&s, "other").code, 404, "created with {field}: {value}");
        let mut u = created.clone();
        u[field] = json!(value);
        let r = send(
            &s,
            "PUT",
            &format!("{POOLS}/typed"),
            "Content-Type: application/json",
            u.to_string().as_bytes(),
            &[],
        );
        r.status(400);
        let now = get(&s, "typed").json();
        assert_eq!(
            now["metadata"]["resourceVersion"],
            created["metadata"]["resourceVersion"]
        );
        assert_eq!(now["kind"], "KVCachePool");
    }
}

#[test]
fn duplicate_keys_follow_field_validation() {
    let s = Server::start();
    let body = r#"{"apiVersion":"worker.gpustack.ai/v1","kind":"KVCachePool","metadata":{"name":"a","name":"b"},"spec":{"backends":["mooncake-dram"],"quota":{"total":"1Gi"}}}"#;
    let r = send(
        &s,
        "POST",
        &format!("{POOLS}?fieldValidation=Strict"),
        "Content-Type: application/json",
        body.as_bytes(),
        &[],
    );
    let status = r.status(400);
    assert!(
        status["message"]
            .as_str()
            .unwrap()
            .contains("duplicate field \"metadata.name\""),
        "{r:?}"
    );
    assert_eq!(get(&s, "b").code, 404);
    let r = send(
        &s,
        "POST",
        &format!("{POOLS}?fieldValidation=Warn"),
        "Content-Type: application/json",
        body.as_bytes(),
        &[],
    );
    assert_eq!(r.code, 201, "{r:?}");
    assert!(
        r.headers
            .iter()
            .any(|h| h.to_ascii_lowercase().starts_with("warning:") && h.contains("duplicate field")),
        "{:?}",
        r.headers
    );
}

#[test]
fn overlong_paths_get_a_status() {
    let s = Server::start();
    let long = format!("{POOLS}/{}", "a".repeat(70_000));
    // HTTP/1.1: hyper's own 414 carries a Status now.
    let r = send(&s, "GET", &long, "", b"", &["--http1.1"]);
    let status = r.status(414);
    assert_eq!(status["reason"], "RequestURITooLong");
    // HTTP/2: the connection survives the long path; the next request on it is answered.
    let out = s.curl(&[
        "-s",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code} ",
        "--http2",
        &s.url(&long),
        &s.url("/readyz"),
    ]);
    let codes = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        codes.trim_end().ends_with("200"),
        "the connection died with the long path: {codes:?}"
    );
}

#[test]
fn warning_headers_are_capped() {
    let s = Server::start();
    let mut p = pool("noisy");
    // 100,000 unknown fields of spec: one warning each.
    for i in 0..100_000 {
        p["spec"][format!("f{i}")] = json!(1);
    }
    let r = send(
        &s,
        "POST",
        POOLS,
        "Content-Type: application/json",
        p.to_string().as_bytes(),
        &["--http2"],
    );
    assert_eq!(r.code, 201, "an HTTP/2 client could not read the answer: {r:?}");
    let warnings = r
        .headers
        .iter()
        .filter(|h| h.to_ascii_lowercase().starts_with("warning:"))
        .count();
    assert!((1..=300).contains(&warnings), "{warnings} Warning headers");
}

#[test]
fn a_client_that_stalls_in_its_headers_is_disconnected() {
    use std::io::{Read, Write};
    let s = Server::start();
    // TLS by hand (openssl s_client), then half a request head, then nothing.
    let mut child = std::process::Command::new("openssl")
        .args([
            "s_client",
            "-quiet",
            "-alpn",
            "http/1.1",
            "-connect",
            &format!("127.0.0.1:{}", s.port),
        ])
        .arg("-CAfile")
        .arg(s.pki_file("ca.crt"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("openssl s_client");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\n").unwrap();
    stdin.flush().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = stdout.read_to_end(&mut buf);
        let _ = tx.send(buf);
    });
    // The header read timeout is 30 s; the connection must be closed well before a minute.
    let closed = rx.recv_timeout(std::time::Duration::from_secs(60));
    let _ = child.kill();
    let _ = child.wait();
    drop(stdin);
    assert!(closed.is_ok(), "the server kept a stalled connection open for a minute");
}
