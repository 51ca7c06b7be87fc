//! Cluster mode, part 1: our server in aggregated mode behind a real kube-apiserver (built from
//! the kubernetes module), reached by real kubectl through the aggregation layer, with
//! authentication and authorization delegated to the cluster (front proxy, client CA,
//! TokenReview, SubjectAccessReview) and the install manifests of `deploy/`.

mod cluster;
mod support;

use cluster::{ControlPlane, apiservice_available, write_certs};
use support::eventually;
use support::walkthrough::manifest;

#[test]
fn served_through_kube_apiservers_aggregation_with_the_clusters_users_and_rbac() {
    let plane = ControlPlane::start();
    let k = plane.kubectl();
    // deploy/: the namespace, the server's ServiceAccount and every RBAC object for real, then the
    // whole kustomization as a server-side dry run (kube-apiserver validates every object).
    let deploy = cluster::prepare_deploy(&plane);
    let dry = k.ok(&["apply", "-k", deploy.to_str().unwrap(), "--dry-run=server"]);
    for object in [
        "deployment.apps/kvcache-apiserver",
        "statefulset.apps/kvcache-etcd",
        "poddisruptionbudget.policy/kvcache-apiserver",
        "apiservice.apiregistration.k8s.io/v1.worker.gpustack.ai",
        "secret/kvcache-apiserver-tls",
        "service/kvcache-apiserver",
    ] {
        assert!(dry.contains(object), "the dry run names {object}: {dry}");
    }
    assert!(dry.contains("(server dry run)"), "{dry}");

    // Our server, as the ServiceAccount of deploy/ (its token, its RBAC), behind the APIService.
    let server = cluster::start_behind(&plane, &deploy);

    // kubectl through kube-apiserver: aggregated discovery, OpenAPI, our tables.
    let resources = k.ok(&["api-resources", "--api-group=worker.gpustack.ai"]);
    for (plural, short) in [
        ("kvcachebackends", "kvcb"),
        ("kvcachepools", "kvcp"),
        ("kvcachepoolbindings", "kvcpb"),
        ("modeldeployments", "md"),
    ] {
        assert!(
            resources.lines().any(|l| l.starts_with(plural) && l.contains(short)),
            "{plural} ({short}) in {resources}"
        );
    }
    // The aggregator downloads our OpenAPI once the APIService is available.
    let explain = eventually(30, "kubectl explain kvcb.spec through kube-apiserver", || {
        let r = k.run(&["explain", "kvcb.spec"]);
        r.ok.then_some(r.stdout)
    });
    assert!(
        explain.contains("KIND:") && explain.contains("KVCacheBackend"),
        "{explain}"
    );
    assert!(explain.contains("connection"), "{explain}");
    k.ok(&["create", "namespace", "team-a"]);
    for file in ["01-backend.yaml", "02-pool-binding.yaml", "03-model-deployment.yaml"] {
        let out = k.must_apply(&manifest(file));
        assert!(out.contains("created"), "{file}: {out}");
    }
    let table = k.ok(&["get", "kvcb"]);
    let header = table.lines().next().unwrap_or_default();
    for column in ["NAME", "TYPE", "PHASE", "ENDPOINT", "CAPACITY"] {
        assert!(header.contains(column), "our table through kube-apiserver: {table}");
    }
    let wide = k.ok(&["get", "kvcb", "-o", "wide"]);
    assert!(
        wide.lines()
            .next()
            .is_some_and(|h| h.contains("LEADERS") && h.contains("AGE")),
        "{wide}"
    );
    assert!(table.contains("mooncake-dram"), "{table}");
    assert!(k.ok(&["get", "kvcpb", "-n", "team-a"]).contains("team-a"));
    k.ok(&["get", "md", "-n", "team-a"]);

    // RBAC: view may read but not create; no binding, nothing. Through kube-apiserver and
    // directly against our server (where our SubjectAccessReview decides).
    let viewer = plane.user("vera", &[]);
    k.ok(&[
        "create",
        "clusterrolebinding",
        "vera-view",
        "--clusterrole=view",
        "--user=vera",
    ]);
    let nobody = plane.user("nora", &[]);
    let as_viewer = plane.kubectl_as(&viewer.kubeconfig);
    eventually(30, "view aggregates our read rules", || {
        as_viewer.run(&["get", "kvcb"]).ok.then_some(())
    });
    as_viewer.ok(&["get", "kvcb", "mooncake-dram"]);
    as_viewer.ok(&["get", "md", "-n", "team-a"]);
    let refused = as_viewer.apply(&[], &manifest("01-backend.yaml").replace("mooncake-dram", "other"));
    assert!(
        !refused.ok && refused.text().contains("Forbidden"),
        "{}",
        refused.text()
    );
    let refused = plane.kubectl_as(&nobody.kubeconfig).fails(&["get", "kvcb"]);
    assert!(refused.contains("Forbidden"), "{refused}");

    let direct = |u: &cluster::User, args: &[&str]| {
        let mut all = vec![
            "--cert",
            u.cert.to_str().unwrap(),
            "--key",
            u.key.to_str().unwrap(),
            "-s",
        ];
        all.extend_from_slice(args);
        server.curl(&all)
    };
    let backends = server.url("/apis/worker.gpustack.ai/v1/kvcachebackends");
    let (body, code) = direct(&viewer, &[&backends]);
    assert_eq!(code, "200", "{body}");
    assert!(body.contains("mooncake-dram"), "{body}");
    let create = r#"{"apiVersion":"worker.gpustack.ai/v1","kind":"KVCacheBackend","metadata":{"name":"x"},"spec":{"type":"Mooncake","connection":{"external":{"endpoint":"127.0.0.1:1"}}}}"#;
    let (body, code) = direct(
        &viewer,
        &[
            "-X",
            "POST",
            "-H",
            "Content-Type: application/json",
            "-d",
            create,
            &backends,
        ],
    );
    assert_eq!(code, "403", "{body}");
    assert!(
        body.contains(
            r#"User \"vera\" cannot create resource \"kvcachebackends\" in API group \"worker.gpustack.ai\""#
        ),
        "{body}"
    );
    let (body, code) = direct(&nobody, &[&backends]);
    assert_eq!(code, "403", "{body}");

    // A ServiceAccount token, verified by our server through a TokenReview.
    k.ok(&["create", "serviceaccount", "reader", "-n", "team-a"]);
    k.ok(&[
        "create",
        "clusterrolebinding",
        "reader-view",
        "--clusterrole=view",
        "--serviceaccount=team-a:reader",
    ]);
    let reader = plane.token("team-a", "reader");
    let (body, code) = server.curl(&["-s", "-H", &format!("Authorization: Bearer {reader}"), &backends]);
    assert_eq!(code, "200", "{body}");
    let (body, code) = server.curl(&["-s", "-H", "Authorization: Bearer not-a-token", &backends]);
    assert_eq!(code, "401", "{body}");

    // Forged front-proxy headers: no certificate, a user's certificate, and a certificate of the
    // front proxy's CA with a name that is not allowed. Never admin.
    let forged = ["-H", "X-Remote-User: admin", "-H", "X-Remote-Group: system:masters"];
    let (body, code) = server.curl(&[&["-s"][..], &forged, &[&backends]].concat());
    assert_eq!(code, "401", "{body}");
    assert!(
        body.contains("trusted only from kube-apiserver's front proxy"),
        "{body}"
    );
    let (body, code) = direct(&nobody, &[&forged[..], &[&backends]].concat());
    assert_eq!(code, "403", "the headers are ignored, nora stays nora: {body}");
    assert!(body.contains(r#"User \"nora\""#), "{body}");
    let impostor = plane.front_proxy_ca.client("not-the-proxy", &[]).unwrap();
    let (cert, key) = (
        plane.dir.path().join("impostor.crt"),
        plane.dir.path().join("impostor.key"),
    );
    std::fs::write(&cert, &impostor.cert_pem).unwrap();
    std::fs::write(&key, &impostor.key_pem).unwrap();
    let impostor = cluster::User {
        cert,
        key,
        kubeconfig: Default::default(),
    };
    let (body, code) = direct(&impostor, &[&forged[..], &[&backends]].concat());
    assert_eq!(code, "401", "{body}");
    assert!(body.contains("not in the allowed list"), "{body}");

    // The cluster adds a front-proxy CA to kube-system/extension-apiserver-authentication (as a CA
    // rotation does; kube-apiserver keeps the union): a proxy certificate of the new CA is
    // trusted from then on, without a restart of our server.
    let next_ca = kvcache_certs::Authority::new("next-front-proxy-ca").unwrap();
    let next_proxy = next_ca.client("front-proxy-client", &[]).unwrap();
    let (cert, key) = (
        plane.dir.path().join("next-proxy.crt"),
        plane.dir.path().join("next-proxy.key"),
    );
    std::fs::write(&cert, &next_proxy.cert_pem).unwrap();
    std::fs::write(&key, &next_proxy.key_pem).unwrap();
    let next_proxy = cluster::User {
        cert,
        key,
        kubeconfig: Default::default(),
    };
    let as_vera = [
        "-H",
        "X-Remote-User: vera",
        "-H",
        "X-Remote-Group: system:authenticated",
    ];
    let (body, code) = direct(&next_proxy, &[&as_vera[..], &[&backends]].concat());
    assert_eq!(code, "401", "{body}");
    let current = k.ok(&[
        "get",
        "configmap",
        "-n",
        "kube-system",
        "extension-apiserver-authentication",
        "-o",
        "jsonpath={.data.requestheader-client-ca-file}",
    ]);
    let bundle = format!("{}\n{}", current.trim_end(), next_ca.pair.cert_pem);
    let patch = serde_json::json!({"data": {"requestheader-client-ca-file": bundle}}).to_string();
    k.ok(&[
        "patch",
        "configmap",
        "-n",
        "kube-system",
        "extension-apiserver-authentication",
        "--type=merge",
        "-p",
        &patch,
    ]);
    eventually(30, "the new front-proxy CA is trusted without a restart", || {
        let (body, code) = direct(&next_proxy, &[&as_vera[..], &[&backends]].concat());
        (code == "200" && body.contains("mooncake-dram")).then_some(())
    });

    // Rotating the serving certificate while a watch runs through kube-apiserver.
    let watch = k.spawn_lines(&["get", "kvcp", "-w", "--no-headers"]);
    watch.wait_for(&["shared-dram"]);
    let before = server.presented_certificate();
    write_certs(&deploy.join("tls"));
    let rotated = std::fs::read_to_string(deploy.join("tls/tls.crt")).unwrap();
    assert_ne!(before.trim(), rotated.trim());
    eventually(10, "new connections get the rotated certificate", || {
        (server.presented_certificate().trim() == rotated.trim()).then_some(())
    });
    k.must_apply(&support::pool("second-pool", ""));
    watch.wait_for(&["second-pool"]);
    assert!(k.ok(&["get", "kvcb"]).contains("mooncake-dram"));
    assert!(apiservice_available(&k).starts_with("True/"));
}
