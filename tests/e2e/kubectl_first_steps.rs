//! What a newcomer meets with kubectl, each on kubectl 1.27, 1.30 and 1.33: namespaces and `auth
//! can-i` in direct mode, the warning of a DELETE that something holds and the refusal of a new
//! dependent of an object being deleted, the warning of a write that cuts grants, phases that
//! tell the cache's state, quantities in columns, a local deployment's ENDPOINT, a defaulted
//! value named as the default in a refusal, and `kubectl explain` texts. Included by the kubectl
//! suite (`tests/e2e/kubectl.rs`).

use super::support::walkthrough::{KVCB, KVCP, KVCPB, MD, condition, jp, manifest, wait_jp};
use super::support::{Kubectl, Server, VERSIONS};

/// `kubectl create namespace`, `get ns` (records and the namespaces objects are in), `delete
/// ns` (refused while it holds objects, naming them; the system namespaces never), and `auth
/// can-i` from the server's own policy: yes for the admin, no for the viewer.
#[test]
fn namespaces_and_auth_can_i() {
    let s = Server::start();
    let admin = s.kubectl("1.33");
    admin.must_apply(&super::support::binding("team-held", "b", "p", "1Gi"));
    for v in VERSIONS {
        let k = s.kubectl(v);
        let ns = format!("team-{}", v.replace('.', "-"));
        let out = k.ok(&["create", "namespace", &ns]);
        assert!(out.contains(&format!("namespace/{ns} created")), "{v}: {out}");
        let r = k.run(&["create", "namespace", &ns]);
        assert!(!r.ok && r.stderr.contains("AlreadyExists"), "{v}: {}", r.text());
        let table = k.ok(&["get", "ns"]);
        let rows: Vec<Vec<&str>> = table.lines().map(|l| l.split_whitespace().collect()).collect();
        assert_eq!(rows[0], ["NAME", "STATUS", "AGE"], "{v}: {table}");
        for name in ["default", "kube-system", "team-held", ns.as_str()] {
            assert!(
                rows.iter().any(|r| r[0] == name && r[1] == "Active"),
                "{v}: {name} missing: {table}"
            );
        }
        assert_eq!(
            k.ok(&[
                "get",
                "namespace",
                &ns,
                "-o",
                "jsonpath={.metadata.labels.kubernetes\\.io/metadata\\.name}"
            ]),
            ns,
            "{v}"
        );
        // Objects in a namespace that holds them: it is implicit, and says so.
        assert_eq!(
            k.ok(&[
                "get",
                "ns",
                "team-held",
                "-o",
                "jsonpath={.metadata.annotations.worker\\.gpustack\\.ai/implicit}"
            ]),
            "true",
            "{v}"
        );
        let r = k.run(&["delete", "ns", "team-held"]);
        assert!(
            !r.ok
                && r.stderr.contains("Conflict")
                && r.stderr.contains("holds KVCachePoolBinding/b; delete them first"),
            "{v}: {}",
            r.text()
        );
        let r = k.run(&["delete", "ns", "default"]);
        assert!(
            !r.ok && r.stderr.contains("Forbidden") && r.stderr.contains("this namespace may not be deleted"),
            "{v}: {}",
            r.text()
        );
        let out = k.ok(&["delete", "namespace", &ns]);
        assert!(out.contains(&format!("namespace \"{ns}\" deleted")), "{v}: {out}");
        let r = k.run(&["get", "ns", &ns]);
        assert!(!r.ok && r.stderr.contains("NotFound"), "{v}: {}", r.text());

        // `kubectl auth can-i` answers from the server's policy.
        let can = |kubectl: &Kubectl, args: &[&str]| {
            let mut a = vec!["auth", "can-i"];
            a.extend_from_slice(args);
            let r = kubectl.run(&a);
            (r.ok, r.stdout.trim().to_owned(), r.stderr)
        };
        let (ok, said, err) = can(&k, &["create", "kvcachepoolbindings", "-n", "team-a"]);
        assert!(ok && said == "yes", "{v}: admin: {said} {err}");
        let viewer = s.kubectl_with(v, &s.viewer_kubeconfig());
        let (ok, said, err) = can(&viewer, &["create", "kvcachepoolbindings", "-n", "team-a"]);
        assert!(!ok && said == "no", "{v}: viewer: {said} {err}");
        let (ok, said, err) = can(&viewer, &["list", "kvcachepoolbindings", "-n", "team-a"]);
        assert!(ok && said == "yes", "{v}: viewer list: {said} {err}");
        let list = viewer.ok(&["auth", "can-i", "--list", "-n", "team-a"]);
        assert!(
            list.contains("selfsubjectaccessreviews.authorization.k8s.io") && list.contains("[get list watch]"),
            "{v}: {list}"
        );
    }
}

/// A server with its controllers (which put their finalizers on live objects), requeueing every
/// 2 s.
fn with_controllers() -> Server {
    Server::start_with(&["--requeue-interval", "2s"])
}

/// Waits until the controllers hold `what` with their finalizer.
fn wait_finalizer(k: &Kubectl, what: &[&str]) {
    wait_jp(k, what, "{.metadata.finalizers[*]}", "gpustack.ai/controlled");
}

/// The walkthrough, then each deletion in the wrong order: the DELETE warns naming what holds
/// the object and what to delete first (on every kubectl, each asking again), and a new pool,
/// Binding or ModelDeployment naming the object being deleted is refused at the field that
/// names it. Deleted in the right order, everything goes.
#[test]
fn a_held_deletion_says_what_holds_it() {
    let s = with_controllers();
    let k = s.kubectl("1.33");
    k.must_apply(&manifest("01-backend.yaml"));
    k.must_apply(&manifest("02-pool-binding.yaml"));
    k.must_apply(&manifest("03-model-deployment.yaml"));
    for what in [KVCB, KVCP, KVCPB, MD] {
        wait_finalizer(&k, what);
    }
    let cases: [(&[&str], &str, String); 3] = [
        (
            KVCB,
            "Warning: KVCacheBackend 'mooncake-dram' is marked for deletion but held by KVCachePool/shared-dram; \
             delete them first, then this backend's deletion completes; kubectl waits until then",
            super::support::pool("p-VERSION", ""),
        ),
        (
            KVCP,
            "Warning: KVCachePool 'shared-dram' is marked for deletion but held by KVCachePoolBinding/team-a/team-a; \
             delete them first, then this pool's deletion completes",
            super::support::binding("team-a", "b-VERSION", "shared-dram", "1Gi"),
        ),
        (
            KVCPB,
            "Warning: KVCachePoolBinding 'team-a' is marked for deletion but held by ModelDeployment/qwen-chat; \
             delete them first, then this Binding's deletion completes",
            manifest("03-model-deployment.yaml").replace("name: qwen-chat", "name: md-VERSION"),
        ),
    ];
    for (what, warning, dependent) in &cases {
        for v in VERSIONS {
            let kv = s.kubectl(v);
            let mut args = vec!["delete", "--wait=false"];
            args.extend_from_slice(what);
            let r = kv.run(&args);
            assert!(r.ok && r.stderr.contains(warning), "{v} {what:?}: {}", r.text());
            let new = dependent.replace("VERSION", &v.replace('.', "-"));
            let r = kv.apply(&[], &new);
            assert!(
                !r.ok && r.stderr.contains("is being deleted: a new") && r.stderr.contains("Forbidden"),
                "{v} {what:?}: {}",
                r.text()
            );
        }
    }
    // The deployment goes, then its Binding, the pool and the backend, processes included.
    k.ok(&["delete", "-n", "team-a", "md", "qwen-chat", "--wait=false"]);
    for what in [MD, KVCPB, KVCP, KVCB] {
        let mut args = vec!["wait", "--for=delete", "--timeout=60s"];
        args.extend_from_slice(what);
        k.ok(&args);
    }
}

/// A write that will cut grants says so when it is made, with what each grant becomes: a
/// Binding whose ceiling is more than its pool has left, and a pool total lowered below what its
/// Bindings ask together. A write within the total says nothing, and neither does a second
/// domain on a backend that keeps a tenant ledger (every pool here is on one such backend).
#[test]
fn a_write_that_cuts_grants_says_what_they_become() {
    let s = Server::start();
    s.kubectl("1.33").must_apply(&manifest("01-backend.yaml"));
    for v in VERSIONS {
        let k = s.kubectl(v);
        let t = v.replace('.', "-");
        let pool = super::support::pool(&format!("cut-{t}"), "").replace("16Gi", "2Gi");
        k.must_apply(&pool);
        let first = super::support::binding("team-cut", &format!("a-{t}"), &format!("cut-{t}"), "1Gi");
        let r = k.apply(&[], &first);
        assert!(r.ok && !r.stderr.contains("Warning"), "{v}: {}", r.text());
        let second = super::support::binding("team-cut", &format!("b-{t}"), &format!("cut-{t}"), "2Gi");
        let r = k.apply(&[], &second);
        let said = format!(
            "Warning: KVCachePool 'cut-{t}' has 2Gi for its Bindings, which ask 3Gi with this one, so the store \
             cuts every grant in the pool in proportion to its ceiling: team-cut/a-{t} 1Gi → 683Mi, \
             team-cut/b-{t} (this Binding) 2Gi → 1.3Gi (the backend's capacity may cut them further)"
        );
        assert!(r.ok && r.stderr.contains(&said), "{v}: {}", r.text());
        let r = k.run(&[
            "patch",
            "kvcp",
            &format!("cut-{t}"),
            "--type=merge",
            "-p",
            r#"{"spec":{"quota":{"total":"1Gi"}}}"#,
        ]);
        let said = format!(
            "Warning: KVCachePool 'cut-{t}': its total 1Gi is less than its Bindings ask together (3Gi), so the \
             store cuts every grant in the pool in proportion to its ceiling: team-cut/a-{t} 1Gi → 341Mi, \
             team-cut/b-{t} 2Gi → 683Mi"
        );
        assert!(r.ok && r.stderr.contains(&said), "{v}: {}", r.text());
        // Raised back within what they ask: nothing to say.
        let r = k.run(&[
            "patch",
            "kvcp",
            &format!("cut-{t}"),
            "--type=merge",
            "-p",
            r#"{"spec":{"quota":{"total":"3Gi"}}}"#,
        ]);
        assert!(r.ok && !r.stderr.contains("Warning"), "{v}: {}", r.text());
    }
}

/// Phases tell the cache's state: a new backend goes Provisioning → Ready, never Degraded on
/// the way and with no Warning event; scaling its leaders up is no Warning either; a
/// ModelDeployment whose Binding does not exist is Degraded, says why in its phase message and
/// CacheAttached, and records a Warning event.
#[test]
fn phases_tell_the_cache_state() {
    let s = with_controllers();
    let k = s.kubectl("1.33");
    let phases = k.spawn_lines(&[
        "get",
        "kvcb",
        "-w",
        "-o",
        "custom-columns=NAME:.metadata.name,PHASE:.status.phase",
    ]);
    k.must_apply(&manifest("01-backend.yaml"));
    let seen = phases.wait_for(&["mooncake-dram", "Ready"]);
    assert!(!seen.iter().any(|l| l.contains("Degraded")), "{seen:#?}");
    let warnings = |k: &Kubectl, ns: &str| {
        k.ok(&[
            "get",
            "events",
            "-n",
            ns,
            "--field-selector",
            "type=Warning",
            "-o",
            "custom-columns=R:.reason,M:.message",
        ])
    };
    k.must_apply(&manifest("04-high-availability.yaml"));
    wait_jp(&k, KVCB, "{.status.leader.replicas}", "3");
    wait_jp(
        &k,
        KVCB,
        "{.status.conditions[?(@.type==\"RolloutComplete\")].status}",
        "True",
    );
    let lonely = manifest("03-model-deployment.yaml")
        .replace("name: qwen-chat", "name: lonely")
        .replace("name: team-a\n  roles", "name: nobody\n  roles");
    let r = k.apply(&[], &lonely);
    assert!(r.ok && r.stderr.contains("'nobody' does not exist"), "{}", r.text());
    let lonely_md: &[&str] = &["-n", "team-a", "md", "lonely"];
    wait_jp(&k, lonely_md, "{.status.phase}", "Degraded");
    for v in VERSIONS {
        let kv = s.kubectl(v);
        let table = kv.ok(&["get", "-n", "team-a", "md", "lonely"]);
        assert!(
            table.lines().nth(1).is_some_and(|l| l.contains("Degraded")),
            "{v}: {table}"
        );
        assert_eq!(
            jp(&kv, lonely_md, "{.status.phaseMessage}"),
            "2 of 2 replicas are ready, the ready replicas run without the shared cache: no KVCachePoolBinding \
             \"nobody\" in the namespace \"team-a\"; an administrator creates it",
            "{v}"
        );
        assert!(
            condition(&kv, lonely_md, "CacheAttached").starts_with("False|BindingNotFound|"),
            "{v}: {}",
            condition(&kv, lonely_md, "CacheAttached")
        );
        let backend_warnings = warnings(&kv, "default");
        assert_eq!(
            backend_warnings.lines().count(),
            1,
            "{v}: only the header: {backend_warnings}"
        );
    }
    super::support::eventually(60, "the Warning event of the deployment without its Binding", || {
        warnings(&k, "team-a").contains("BindingNotFound").then_some(())
    });
}

/// USAGE prints a quantity beside the others (`25Mi`, not `26347104`) on every kubectl.
#[test]
fn usage_columns_print_quantities() {
    let s = Server::start();
    let k = s.kubectl("1.33");
    k.must_apply(&super::support::pool("used", ""));
    k.must_apply(&super::support::binding("team-u", "u", "used", "8Gi"));
    for (what, status) in [
        (&["kvcp", "used"][..], r#"{"status":{"usage":{"total":"26347104"}}}"#),
        (
            &["-n", "team-u", "kvcpb", "u"][..],
            r#"{"status":{"usage":"26347104"}}"#,
        ),
    ] {
        let mut args = vec!["patch"];
        args.extend_from_slice(what);
        args.extend(["--subresource=status", "--type=merge", "-p", status]);
        k.ok(&args);
    }
    for v in VERSIONS {
        let kv = s.kubectl(v);
        for what in [&["kvcp", "used"][..], &["-n", "team-u", "kvcpb", "u"][..]] {
            let mut args = vec!["get"];
            args.extend_from_slice(what);
            let table = kv.ok(&args);
            // kubectl aligns cells under their header (some cells here are empty).
            let at = table
                .lines()
                .next()
                .and_then(|h| h.find("USAGE"))
                .expect("a USAGE column");
            let row = table.lines().nth(1).unwrap_or_default();
            let cell = row.get(at..).unwrap_or_default().split_whitespace().next();
            assert_eq!(cell, Some("25Mi"), "{v} {what:?}: {table}");
        }
    }
}

/// `kubectl explain <field>`: its description as one text, and the values it lists under
/// `ENUM:` (kubectl 1.30 and later print them; 1.27 prints none).
fn explained(k: &Kubectl, field: &str) -> (String, Vec<String>) {
    let out = k.ok(&["explain", field]);
    let block = |title: &str| -> Vec<String> {
        out.lines()
            .skip_while(|l| l.trim() != title)
            .skip(1)
            .take_while(|l| !l.trim().is_empty())
            .map(|l| l.trim().to_owned())
            .collect()
    };
    (block("DESCRIPTION:").join(" "), block("ENUM:"))
}

/// `kubectl explain` prints one text per field (the field's, never the field's then its type's
/// run together), and lists only the values the server accepts: `md.spec.roles.kind` lists
/// `Server`, `Prefill` and `Decode` and says how they combine, which admission still judges when
/// a manifest names them; `md.spec.router.name` names ours, and admission refuses the others. The same for the transports and member media admission refuses.
#[test]
fn explain_texts_read_as_one_and_list_only_accepted_values() {
    let s = Server::start();
    let cases: [(&str, &str, &[&str]); 8] = [
        (
            "md.spec.roles.kind",
            "What the role serves: `Server` (the default, whole requests), or one half of a split request: \
             `Prefill` (computes the prompt's KV and saves it into the shared store) or `Decode` (loads it from \
             the store and generates). `Server` never mixes with the other two; a `Prefill` role needs a \
             `Decode` role and the reverse; only `Server` may appear in more than one role. The halves need \
             `kvCache` (the handoff goes through the store) and vLLM, and a `router` to pair them. Immutable.",
            &["Server", "Prefill", "Decode"],
        ),
        (
            "kvcb.spec.transport.protocol",
            "Data transport: `Auto` (TCP, the default) or `TCP`. `RDMA`, `EFA`, `CANN`, `ROCM`, `MUSA` and \
             `MACA` are not supported yet: the server refuses them.",
            &["Auto", "TCP"],
        ),
        (
            "kvcb.spec.connection.managed.members.medium",
            "Memory that holds each member's segment: `DRAM` (host memory), the only value supported; `VRAM` \
             is not supported yet and the server refuses it. Required; immutable for the group's position.",
            &["DRAM"],
        ),
        (
            "md.spec.engine.name",
            "The engine: `vLLM` or `SGLang`. Required; immutable.",
            &["vLLM", "SGLang"],
        ),
        (
            "md.spec.kvCache",
            "Attachment to a shared cache; absent means none.",
            &[],
        ),
        (
            "md.spec.roles",
            "The roles of the deployment, 1 to 10 with unique names. Roles cannot be added, removed or renamed \
             after create.",
            &[],
        ),
        (
            "kvcb.spec.connection.managed.leader",
            "The leader that coordinates the store. Required; `{}` takes every default.",
            &[],
        ),
        (
            "md.spec.router.name",
            "Which router runs: `kvcache-router` (ours). The reference's external routers (`llm-d-router`, \
             `vllm-router`, `sglang-gateway`) are refused. Required; cannot change while the router block \
             stays.",
            &[],
        ),
    ];
    for v in VERSIONS {
        let k = s.kubectl(v);
        for (field, text, values) in cases {
            let (said, listed) = explained(&k, field);
            assert_eq!(said, text, "{v} {field}");
            if *v != "1.27" {
                assert_eq!(listed, values, "{v} {field}");
            }
        }
        // A value the schema lists is still judged with the other roles: a Prefill role alone is
        // refused, and admission says what to add.
        let prefill = manifest("03-model-deployment.yaml")
            .replace("name: qwen-chat", &format!("name: split-{}", v.replace('.', "-")))
            .replace("    - name: server\n", "    - name: server\n      kind: Prefill\n");
        let r = k.apply(&[], &prefill);
        assert!(
            !r.ok
                && r.stderr
                    .contains("spec.roles[0].kind: Invalid value: \"Prefill\": a Prefill role needs a Decode role"),
            "{v}: {}",
            r.text()
        );
        // The reference's routers are refused by name, naming ours.
        let routed = manifest("03-model-deployment.yaml")
            .replace("name: qwen-chat", &format!("name: routed-{}", v.replace('.', "-")))
            .replace("  roles:\n", "  router:\n    name: vllm-router\n  roles:\n");
        let r = k.apply(&[], &routed);
        assert!(
            !r.ok
                && r.stderr
                    .contains("spec.router.name: Unsupported value: \"vllm-router\"")
                && r.stderr.contains("use \"kvcache-router\", our router"),
            "{v}: {}",
            r.text()
        );
    }
}

/// A Binding that sets no domain name takes `default`; when another Binding on the backend holds
/// it, the refusal (kubectl's message and the Status cause at `spec.domain.name`) says the value
/// is the default and which field chooses another. A Binding that writes `default` itself gets
/// the refusal without that note, and one naming another domain is created.
#[test]
fn a_defaulted_domain_is_named_as_the_default_when_it_collides() {
    let s = Server::start();
    let admin = s.kubectl("1.33");
    admin.must_apply(&manifest("01-backend.yaml"));
    admin.must_apply(&manifest("02-pool-binding.yaml"));
    let note = "(\"default\" is the default: the request does not set spec.domain.name; set spec.domain.name to \
                choose another value)";
    let claimed = "spec.domain.name: Duplicate value: \"default\": domain \"default\" is already claimed on \
                   KVCacheBackend \"mooncake-dram\" by KVCachePoolBinding team-a/team-a";
    for v in VERSIONS {
        let k = s.kubectl(v);
        let t = v.replace('.', "-");
        let unnamed = super::support::binding(&format!("team-{t}"), "b", "shared-dram", "1Gi")
            .replace("    name: b\n    blockSize", "    blockSize");
        let r = k.apply(&[], &unnamed);
        assert!(
            !r.ok && r.stderr.contains(claimed) && r.stderr.contains(note),
            "{v}: {}",
            r.text()
        );
        let named = unnamed.replace("  domain:\n", "  domain:\n    name: default\n");
        let r = k.apply(&[], &named);
        assert!(
            !r.ok && r.stderr.contains(claimed) && !r.stderr.contains("is the default"),
            "{v}: {}",
            r.text()
        );
        let other = unnamed.replace("  domain:\n", &format!("  domain:\n    name: d-{t}\n"));
        let r = k.apply(&[], &other);
        assert!(r.ok, "{v}: {}", r.text());
    }
    // The Status: one cause, at the field, with the note.
    let body = serde_json::json!({
        "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCachePoolBinding",
        "metadata": {"name": "raw", "namespace": "team-raw"},
        "spec": {"poolRef": {"name": "shared-dram"}, "quota": {"ceiling": "1Gi"},
                 "domain": {"blockSize": 64, "dtype": "bfloat16"}},
    })
    .to_string();
    let url = s.url("/apis/worker.gpustack.ai/v1/namespaces/team-raw/kvcachepoolbindings");
    let out = s.curl(&[
        "-s",
        "-X",
        "POST",
        "-H",
        "Content-Type: application/json",
        "--data",
        &body,
        &url,
    ]);
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a Status");
    assert_eq!(
        (&status["kind"], &status["reason"], &status["code"]),
        (&"Status".into(), &"Invalid".into(), &422.into()),
        "{status}"
    );
    let causes = status["details"]["causes"].as_array().expect("causes");
    assert_eq!(causes.len(), 1, "{status}");
    assert_eq!(causes[0]["field"], "spec.domain.name", "{status}");
    assert_eq!(causes[0]["reason"], "FieldValueDuplicate", "{status}");
    let message = causes[0]["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("Duplicate value: \"default\": ") && message.ends_with(note),
        "{message}"
    );
}

/// A local ModelDeployment's ENDPOINT is where its first role's first replica answers (the
/// simulated engine answers `GET /health` there), on every kubectl.
#[test]
fn a_local_deployment_prints_its_endpoint() {
    let s = with_controllers();
    let k = s.kubectl("1.33");
    k.must_apply(&manifest("01-backend.yaml"));
    k.must_apply(&manifest("02-pool-binding.yaml"));
    k.must_apply(&manifest("03-model-deployment.yaml"));
    let endpoint = super::support::eventually(60, "the deployment's endpoint", || {
        let e = jp(&k, MD, "{.status.endpoint}");
        (!e.is_empty()).then_some(e)
    });
    let port = endpoint.strip_prefix("http://127.0.0.1:").expect("a loopback URL");
    assert!(port.parse::<u16>().is_ok(), "{endpoint}");
    super::support::eventually(60, "the first replica answers at the endpoint", || {
        let out = std::process::Command::new("curl")
            .args(["-s", "--max-time", "5", "-o", "/dev/null", "-w", "%{http_code}"])
            .arg(format!("{endpoint}/health"))
            .output()
            .ok()?;
        (out.stdout == b"200").then_some(())
    });
    for v in VERSIONS {
        let table = s.kubectl(v).ok(&["get", "-n", "team-a", "md", "qwen-chat"]);
        let header: Vec<&str> = table.lines().next().unwrap_or_default().split_whitespace().collect();
        let row: Vec<&str> = table.lines().nth(1).unwrap_or_default().split_whitespace().collect();
        let at = header
            .iter()
            .position(|h| *h == "ENDPOINT")
            .expect("an ENDPOINT column");
        assert_eq!(header.len(), row.len(), "{v}: every cell is set: {table}");
        assert_eq!(row[at], endpoint, "{v}: {table}");
    }
}
