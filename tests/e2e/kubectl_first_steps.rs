//! What a newcomer meets with kubectl, each on kubectl 1.27, 1.30 and 1.33: namespaces and `auth
//! can-i` in direct mode, the warning of a DELETE that something holds and the refusal of a new
//! dependent of an object being deleted, the warning of a write that cuts grants, phases that
//! tell the cache's state, quantities in columns, and `kubectl explain` texts. Included by the
//! kubectl suite (`tests/e2e/kubectl.rs`).

use super::support::{Server, VERSIONS};

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
        let can = |kubectl: &super::support::Kubectl, args: &[&str]| {
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
