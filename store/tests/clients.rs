//! Callers other than the Rust library's own tests: a Python engine with grpcio stubs generated
//! from our `.proto` at test time, and the engine simulator binary reading its settings from the
//! environment.

// Helpers outside #[test] fns state expectations with unwrap too (see clippy.toml).
#![allow(clippy::unwrap_used)]

mod common;

use std::process::Command;

use common::*;

/// A Python interpreter that has grpcio and grpc_tools, or a failure saying how to get one.
fn python_with_grpc() -> String {
    let mut candidates = vec!["python3".to_string(), "/usr/bin/python3".to_string()];
    if let Ok(p) = std::env::var("KVSTORE_PYTHON") {
        candidates.insert(0, p);
    }
    for py in &candidates {
        let ok = Command::new(py)
            .args(["-c", "import grpc, grpc_tools.protoc"])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if ok {
            return py.clone();
        }
    }
    panic!(
        "no Python with grpcio and grpc_tools (tried {candidates:?}); run scripts/setup, which installs the Debian \
         packages python3-grpcio and python3-grpc-tools, or point KVSTORE_PYTHON at an interpreter that has them"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_grpc_stubs_put_and_get() {
    let py = python_with_grpc();
    let l = leader(&["--tenant", "py=64Mi:64:bfloat16"]);
    let addr = l.field("grpc");
    let _m1 = member(&addr, "m1", "32Mi");
    let _m2 = member(&addr, "m2", "32Mi");
    wait_members(&client(&addr, "py").await, 2).await;
    let out_dir = tempfile::tempdir().unwrap();
    let proto_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/proto");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/roundtrip.py");
    let out = tokio::task::spawn_blocking({
        let out_dir = out_dir.path().to_path_buf();
        move || {
            Command::new(py)
                .arg(script)
                .arg(proto_dir)
                .arg(out_dir)
                .arg(&addr)
                .arg("py")
                .output()
                .expect("run python")
        }
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.trim() == "ok",
        "python failed:\n{stdout}\n{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_sim_shares_prefix_blocks_and_reports_its_hit_rate() {
    let l = leader(&["--tenant", "sim=64Mi:16:bfloat16"]);
    let addr = l.field("grpc");
    let _m1 = member(&addr, "m1", "64Mi");
    wait_members(&client(&addr, "sim").await, 1).await;
    let sim_addr = addr.clone();
    let run = move |rounds: &str| {
        let out = Command::new(BIN)
            .arg("engine-sim")
            .env("MOONCAKE_MASTER", &sim_addr)
            .env("MOONCAKE_TENANT_ID", "sim")
            .env("KVSTORE_BLOCK_SIZE", "16")
            .env("KVSTORE_DTYPE", "bfloat16")
            .env("KVSTORE_SESSIONS", "4")
            .env("KVSTORE_REQUESTS", "8")
            .env("KVSTORE_BLOCK_BYTES", "16Ki")
            .env("KVSTORE_ROUNDS", rounds)
            .output()
            .expect("run engine-sim");
        assert!(
            out.status.success(),
            "engine-sim failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .collect::<Vec<_>>()
    };
    let reports = tokio::task::spawn_blocking(move || run("2")).await.unwrap();
    assert_eq!(reports.len(), 2);
    let first = &reports[0];
    let (blocks, hits) = (first["blocks"].as_u64().unwrap(), first["hits"].as_u64().unwrap());
    assert_eq!(blocks, 4 * 8 * 12, "sessions x requests x (8 prefix + 4 suffix blocks)");
    assert!(hits > 0, "later requests reuse the shared system prompts: {first}");
    let rate = first["hit_rate"].as_f64().unwrap();
    assert!((rate - hits as f64 / blocks as f64).abs() < 1e-9);
    // the second round's prompts share every system-prompt block already stored
    let second_hits = reports[1]["hits"].as_u64().unwrap();
    assert!(
        second_hits >= 4 * 8 * 8,
        "every prefix block hits in round two: {}",
        reports[1]
    );

    // a wrong dtype is refused: the simulator exits non-zero and says why
    let out = Command::new(BIN)
        .arg("engine-sim")
        .env("KVSTORE_LEADER", l.field("grpc"))
        .env("KVSTORE_TENANT", "sim")
        .env("KVSTORE_BLOCK_SIZE", "16")
        .env("KVSTORE_DTYPE", "fp8_e4m3")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("TENANT_LAYOUT_MISMATCH"));
}
