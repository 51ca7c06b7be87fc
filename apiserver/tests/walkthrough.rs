//! The walkthrough manifests (`tests/fixtures/walkthrough/`, copied from the shared examples)
//! applied with the real `kvcache-apiserver` binary to a fresh data directory: every object is
//! admitted, stored with its defaults, survives a restart of the process, and a re-apply of an
//! unchanged manifest changes nothing.

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::process::{Command, Output};

fn fixtures() -> PathBuf {
    PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/walkthrough")
}

fn cli(data: &std::path::Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kv-apiserver"))
        .arg("--data-dir")
        .arg(data)
        .args(args)
        .output()
        .expect("run kvcache-apiserver")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn walkthrough_applies_in_order_and_keeps_its_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let f = |name: &str| fixtures().join(name).display().to_string();

    let out = cli(
        &data,
        &[
            "apply",
            "-f",
            &f("01-backend.yaml"),
            "-f",
            &f("02-pool-binding.yaml"),
            "-f",
            &f("03-model-deployment.yaml"),
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "kvcachebackend.worker.gpustack.ai/mooncake-dram created\n\
         kvcachepool.worker.gpustack.ai/shared-dram created\n\
         kvcachepoolbinding.worker.gpustack.ai/team-a created\n\
         modeldeployment.worker.gpustack.ai/qwen-chat created\n"
    );

    // Defaults are stored, in a new process (the data survived the first one).
    let out = cli(&data, &["get", "kvcb", "mooncake-dram"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let backend: serde_json::Value = yaml_serde::from_str(stdout(&out).trim_start_matches("---\n")).unwrap();
    assert_eq!(backend["spec"]["transport"]["protocol"], "Auto");
    assert_eq!(backend["spec"]["connection"]["managed"]["leader"]["replicas"], 1);
    assert_eq!(
        backend["spec"]["connection"]["managed"]["leader"]["electionBackend"],
        "Kubernetes"
    );
    assert_eq!(backend["spec"]["connection"]["managed"]["leader"]["multiTenancy"], true);
    assert_eq!(backend["metadata"]["generation"], 1);

    let out = cli(&data, &["get", "kvcpb", "team-a", "-n", "team-a"]);
    let binding: serde_json::Value = yaml_serde::from_str(stdout(&out).trim_start_matches("---\n")).unwrap();
    assert_eq!(binding["spec"]["domain"]["name"], "default");

    let out = cli(&data, &["get", "md", "-A"]);
    let md: serde_json::Value = yaml_serde::from_str(stdout(&out).trim_start_matches("---\n")).unwrap();
    assert_eq!(md["spec"]["kvCache"]["connector"], "Mooncake");
    assert_eq!(md["spec"]["roles"][0]["kind"], "Server");

    // Re-applying the same manifest is a no-op; step 4 raises the leader to three replicas.
    let out = cli(&data, &["apply", "-f", &f("01-backend.yaml")]);
    assert_eq!(
        stdout(&out),
        "kvcachebackend.worker.gpustack.ai/mooncake-dram unchanged\n"
    );
    let out = cli(&data, &["apply", "-f", &f("04-high-availability.yaml")]);
    assert_eq!(
        stdout(&out),
        "kvcachebackend.worker.gpustack.ai/mooncake-dram configured\n"
    );
    let out = cli(&data, &["get", "kvcb", "mooncake-dram"]);
    let backend: serde_json::Value = yaml_serde::from_str(stdout(&out).trim_start_matches("---\n")).unwrap();
    assert_eq!(backend["spec"]["connection"]["managed"]["leader"]["replicas"], 3);
    assert_eq!(backend["metadata"]["generation"], 2);
}

#[test]
fn a_second_binding_for_the_same_domain_is_refused_naming_the_holder() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let out = cli(&data, &["apply", "-f", &fixtures().display().to_string()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let other = dir.path().join("team-b.yaml");
    std::fs::write(
        &other,
        "apiVersion: worker.gpustack.ai/v1\nkind: KVCachePoolBinding\nmetadata: {name: team-b, namespace: team-b}\n\
         spec: {poolRef: {name: shared-dram}, quota: {ceiling: 4Gi}, domain: {blockSize: 64, dtype: bfloat16}}\n",
    )
    .unwrap();
    let out = cli(&data, &["apply", "-f", &other.display().to_string()]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("Error from server (Invalid)"), "{err}");
    assert!(err.contains("spec.domain.name: Duplicate value: \"default\""), "{err}");
    assert!(err.contains("team-a/team-a"), "{err}");
}

#[test]
fn strict_decoding_refuses_unknown_fields_in_manifests() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "apiVersion: worker.gpustack.ai/v1\nkind: KVCachePool\nmetadata: {name: p}\n\
         spec: {backends: [b], quota: {total: 1Gi}, metadata: {}}\n",
    )
    .unwrap();
    let out = cli(&dir.path().join("data"), &["apply", "-f", &bad.display().to_string()]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("strict decoding error: unknown field \"spec.metadata\""),
        "{}",
        stderr(&out)
    );
}

/// `kv-apiserver render` admits what it renders as the server does: what the server refuses
/// (a zero capacity, a disk tier at a relative path, a prefill role without a decode role) is
/// refused with the server's words, every refusal at once, and nothing is printed.
#[test]
fn render_refuses_what_the_server_refuses_and_prints_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let backend = std::fs::read_to_string(fixtures().join("01-backend.yaml")).unwrap();
    let deployment = std::fs::read_to_string(fixtures().join("03-model-deployment.yaml")).unwrap();
    let zero = dir.path().join("zero.yaml");
    std::fs::write(
        &zero,
        backend.replace("capacityPerMember: 8Gi", "capacityPerMember: \"0\""),
    )
    .unwrap();
    let disks = dir.path().join("disks.yaml");
    std::fs::write(
        &disks,
        backend.replace("name: mooncake-dram", "name: with-disks").replace(
            "capacityPerMember: 8Gi",
            "capacityPerMember: 8Gi\n          localDisks:\n            - path: var/lib/kvcache\n              capacity: 100Gi",
        ),
    )
    .unwrap();
    let prefill = dir.path().join("prefill.yaml");
    std::fs::write(
        &prefill,
        deployment.replace("    - name: server\n", "    - name: server\n      kind: Prefill\n"),
    )
    .unwrap();
    let out = cli(
        dir.path(),
        &[
            "render",
            "-f",
            &zero.display().to_string(),
            "-f",
            &disks.display().to_string(),
            "-f",
            &prefill.display().to_string(),
        ],
    );
    assert!(!out.status.success());
    assert_eq!(stdout(&out), "", "a refused render prints no object");
    let err = stderr(&out);
    for (file, said) in [
        (
            "zero.yaml",
            "capacityPerMember: Invalid value: \"0\": must be greater than 0",
        ),
        (
            "disks.yaml",
            "localDisks[0].path: Invalid value: \"var/lib/kvcache\": must be an absolute path",
        ),
        ("prefill.yaml", "Prefill"),
    ] {
        assert!(
            err.contains(&format!(
                "Error from server (Invalid): error when applying {}",
                dir.path().join(file).display()
            )) && err.lines().any(|l| l.contains(file) && l.contains(said)),
            "{file}: {said}: {err}"
        );
    }
    assert!(err.contains("3 object(s) were refused; nothing rendered"), "{err}");
}

/// `kv-apiserver render` of steps 1-3 and 5 (with the cluster configuration next to the fixture) is
/// what `tests/fixtures/rendered/` holds, byte for byte: a change to what the controllers render
/// shows up in review as a change to that file.
#[test]
fn rendered_objects_match_the_checked_in_fixture() {
    let dir = tempfile::tempdir().unwrap();
    let f = |name: &str| fixtures().join(name).display().to_string();
    let config = fixtures().join("../rendered/config.yaml").display().to_string();
    let out = cli(
        dir.path(),
        &[
            "--config",
            &config,
            "render",
            "-f",
            &f("01-backend.yaml"),
            "-f",
            &f("02-pool-binding.yaml"),
            "-f",
            &f("03-model-deployment.yaml"),
            "-f",
            &f("05-prefill-decode.yaml"),
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let fixture = fixtures().join("../rendered/walkthrough-01-03-05.yaml");
    let want = std::fs::read_to_string(&fixture).unwrap();
    assert!(
        stdout(&out) == want,
        "kv-apiserver render differs from {}; if the change is intended, write its output there",
        fixture.display()
    );
    // What renders nothing says so.
    assert!(want.contains("# KVCachePool shared-dram: renders no workload"));
    // Both engine replicas, attached through the Binding in the same files.
    for pod in ["name: qwen-chat-server-0", "name: qwen-chat-server-1"] {
        assert!(want.contains(pod), "{pod}");
    }
    assert!(want.contains("value: mooncake-dram-leader.gpustack-system.svc:50051"));
    // Step 5: the prefill/decode deployment's engines, each with its kv_role, and its router
    // (a Deployment, its Service, and a headless Service per role that the router resolves).
    for object in [
        "name: qwen-pd-prefill-0",
        "name: qwen-pd-decode-0",
        "name: qwen-pd-prefill-workers",
        "name: qwen-pd-decode-workers",
        "kind: Deployment\nmetadata:\n  annotations:\n    note.gpustack.ai/model-deployment: qwen-pd",
        "- decode=qwen-pd-decode-workers.team-a.svc.cluster.local:8000",
    ] {
        assert!(want.contains(object), "{object}");
    }
    for kv_role in [r#""kv_role":"kv_both""#, r#""kv_role":"kv_consumer""#] {
        assert!(want.contains(kv_role), "{kv_role}");
    }
}

/// `kv-apiserver render` of a backend with a disk tier is `tests/fixtures/rendered/tiered-backend.yaml`,
/// byte for byte: the member DaemonSet mounts the node's directory (a hostPath of type Directory)
/// where `--tier-dir` names it, with the tier's flags and the preStop hook `GET /flushed`, after
/// the init container `tier-survey`.
#[test]
fn a_tiered_backend_renders_as_the_checked_in_fixture() {
    let dir = tempfile::tempdir().unwrap();
    let rendered = fixtures().join("../rendered");
    let config = rendered.join("config.yaml").display().to_string();
    let input = rendered.join("tiered-backend.input.yaml").display().to_string();
    let out = cli(dir.path(), &["--config", &config, "render", "-f", &input]);
    assert!(out.status.success(), "{}", stderr(&out));
    let fixture = rendered.join("tiered-backend.yaml");
    let want = std::fs::read_to_string(&fixture).unwrap();
    assert!(
        stdout(&out) == want,
        "kv-apiserver render differs from {}; if the change is intended, write its output there",
        fixture.display()
    );
    for needed in [
        "- hostPath:\n          path: /mnt/nvme/kvcache\n          type: Directory\n        name: tier",
        "- --tier-dir\n        - /mnt/nvme/kvcache",
        "- --tier-lru",
        "lifecycle:\n          preStop:\n            httpGet:\n              path: /flushed\n              port: metrics",
        "name: tier-survey",
        "- /dev/termination-log",
    ] {
        assert!(want.contains(needed), "{needed}");
    }
}
