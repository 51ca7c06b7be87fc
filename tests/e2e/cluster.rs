//! A real Kubernetes control plane on loopback for the cluster-mode tests: Debian's etcd,
//! kube-apiserver and kube-controller-manager built from the kubernetes module
//! (`scripts/build-kube`), with a PKI of the test's own (the cluster CA for serving and users, the
//! front-proxy CA and its client, a service-account key), and our server in aggregated mode
//! behind it. Everything runs on free ports and is stopped when dropped.
//!
//! How kube-apiserver reaches our server: the APIService names an `ExternalName` Service whose
//! name is `localhost`. The aggregator then dials `localhost:<port>` (the APIService's port) and
//! verifies our serving certificate for `kvcache-apiserver.gpustack-system.svc`, exactly the name
//! it verifies in a cluster. No network namespace, no root, and the same TLS check as production;
//! only the address resolution differs (a ClusterIP needs kube-proxy, which the harness has not).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::support::{Etcd, Kubectl, POLL, loopback_port, poll_within};

pub const NAMESPACE: &str = "gpustack-system";
pub const SERVICE: &str = "kvcache-apiserver";
pub const APISERVICE: &str = "v1.worker.gpustack.ai";

/// The folder with kube-apiserver and kube-controller-manager, built once per version.
pub fn kube_binaries() -> PathBuf {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/build-kube");
    let out = Command::new(script)
        .stderr(Stdio::inherit())
        .output()
        .expect("run scripts/build-kube");
    assert!(out.status.success(), "scripts/build-kube failed");
    PathBuf::from(String::from_utf8(out.stdout).expect("a path").trim())
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

/// A child process killed when dropped.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(bin: &Path, args: &[String], log: &Path) -> Process {
    let log = std::fs::File::create(log).expect("log file");
    Process(
        Command::new(bin)
            .args(args)
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", bin.display())),
    )
}

/// A kubeconfig for `server` with a client certificate.
fn cert_kubeconfig(path: &Path, server: &str, ca_pem: &str, user: &str, pair: &kvcache_certs::CertPair) {
    kvcache_certs::Kubeconfig {
        server,
        ca_pem,
        user: kvcache_certs::KubeconfigUser {
            name: user,
            credentials: pair,
        },
    }
    .write(path)
    .expect("write kubeconfig");
}

/// etcd, kube-apiserver and kube-controller-manager.
pub struct ControlPlane {
    // Field order is drop order: the controller manager and kube-apiserver stop before etcd.
    controller_manager: Process,
    apiserver: Process,
    etcd: Etcd,
    pub dir: tempfile::TempDir,
    pub port: u16,
    /// Signs kube-apiserver's serving certificate and every user's client certificate.
    pub cluster_ca: kvcache_certs::Authority,
    /// Signs the front proxy's client certificate (`front-proxy-client`).
    pub front_proxy_ca: kvcache_certs::Authority,
    /// `system:masters`.
    pub admin: PathBuf,
}

impl ControlPlane {
    /// With the one controller the aggregated-mode test needs (view, edit and admin aggregation).
    pub fn start() -> ControlPlane {
        ControlPlane::start_with(&["clusterrole-aggregation-controller"])
    }

    /// With these kube-controller-manager controllers.
    pub fn start_with(controllers: &[&str]) -> ControlPlane {
        let bins = kube_binaries();
        let mut dir = tempfile::tempdir().expect("temp dir");
        let d = dir.path().to_owned();
        let mut etcd = Etcd::start();
        let mut cluster_ca = kvcache_certs::Authority::new("harness-cluster-ca").expect("issue a test certificate");
        let mut front_proxy_ca =
            kvcache_certs::Authority::new("harness-front-proxy-ca").expect("issue a test certificate");
        let serving = cluster_ca
            .serving(
                &["localhost".into(), "127.0.0.1".into(), "kubernetes.default.svc".into()],
                "kube-apiserver",
            )
            .expect("issue a test certificate");
        let proxy = front_proxy_ca
            .client("front-proxy-client", &[])
            .expect("issue a test certificate");
        let admin_pair = cluster_ca
            .client("harness-admin", &["system:masters"])
            .expect("issue a test certificate");
        let sa_key = rcgen::KeyPair::generate().expect("service-account key");
        for (file, text) in [
            ("ca.crt", cluster_ca.pair.cert_pem.clone()),
            ("front-proxy-ca.crt", front_proxy_ca.pair.cert_pem.clone()),
            ("apiserver.crt", serving.cert_pem.clone()),
            ("apiserver.key", serving.key_pem.clone()),
            ("front-proxy-client.crt", proxy.cert_pem.clone()),
            ("front-proxy-client.key", proxy.key_pem.clone()),
            ("sa.key", sa_key.serialize_pem()),
            ("sa.pub", sa_key.public_key_pem()),
        ] {
            write(&d.join(file), &text);
        }
        // The port is free when picked and taken when kube-apiserver binds it: another test may
        // win it in between. Such a start is tried again on another port.
        let mut attempt = 0;
        let mut plane = loop {
            attempt += 1;
            let port = loopback_port();
            let server = format!("https://127.0.0.1:{port}");
            let admin = d.join("admin.kubeconfig");
            cert_kubeconfig(&admin, &server, &cluster_ca.pair.cert_pem, "harness-admin", &admin_pair);
            let p = |f: &str| d.join(f).display().to_string();
            let args: Vec<String> = [
                format!("--etcd-servers=http://{}", etcd.endpoint),
                "--bind-address=127.0.0.1".into(),
                "--advertise-address=127.0.0.1".into(),
                format!("--secure-port={port}"),
                format!("--tls-cert-file={}", p("apiserver.crt")),
                format!("--tls-private-key-file={}", p("apiserver.key")),
                format!("--client-ca-file={}", p("ca.crt")),
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
                format!("--service-account-key-file={}", p("sa.pub")),
                format!("--service-account-signing-key-file={}", p("sa.key")),
                "--service-cluster-ip-range=10.96.0.0/16".into(),
                "--authorization-mode=RBAC".into(),
                format!("--requestheader-client-ca-file={}", p("front-proxy-ca.crt")),
                "--requestheader-allowed-names=front-proxy-client".into(),
                "--requestheader-username-headers=X-Remote-User".into(),
                "--requestheader-uid-headers=X-Remote-Uid".into(),
                "--requestheader-group-headers=X-Remote-Group".into(),
                "--requestheader-extra-headers-prefix=X-Remote-Extra-".into(),
                format!("--proxy-client-cert-file={}", p("front-proxy-client.crt")),
                format!("--proxy-client-key-file={}", p("front-proxy-client.key")),
                // No kubelet, no kube-proxy: the `kubernetes` Service keeps no endpoints.
                "--endpoint-reconciler-type=none".into(),
                "--profiling=false".into(),
            ]
            .into();
            let apiserver = spawn(&bins.join("kube-apiserver"), &args, &d.join("kube-apiserver.log"));
            let mut plane = ControlPlane {
                controller_manager: Process(Command::new("true").spawn().expect("true")),
                apiserver,
                etcd,
                dir,
                port,
                cluster_ca,
                front_proxy_ca,
                admin,
            };
            if plane.wait_ready() {
                break plane;
            }
            let log = plane.log("kube-apiserver.log");
            assert!(
                attempt < 3 && log.contains("address already in use"),
                "kube-apiserver did not start:\n{log}"
            );
            // Hand etcd, the folder and the PKI to the next attempt.
            let ControlPlane {
                etcd: e,
                dir: d2,
                cluster_ca: c,
                front_proxy_ca: f,
                ..
            } = plane;
            (etcd, dir, cluster_ca, front_proxy_ca) = (e, d2, c, f);
        };
        let kcm_args: Vec<String> = [
            format!("--kubeconfig={}", plane.admin.display()),
            format!("--controllers={}", controllers.join(",")),
            "--leader-elect=false".into(),
            "--secure-port=0".into(),
        ]
        .into();
        plane.controller_manager = spawn(
            &bins.join("kube-controller-manager"),
            &kcm_args,
            &plane.dir.path().join("kube-controller-manager.log"),
        );
        plane
    }

    /// Whether kube-apiserver became ready; `false` when it exited.
    fn wait_ready(&mut self) -> bool {
        let ready = poll_within(Duration::from_secs(90), POLL, || {
            if let Ok(Some(_)) = self.apiserver.0.try_wait() {
                return Some(false);
            }
            (self.kubectl().run(&["get", "--raw", "/readyz"]).stdout == "ok").then_some(true)
        });
        ready.unwrap_or_else(|| {
            panic!(
                "kube-apiserver not ready within 90s:\n{}",
                self.log("kube-apiserver.log")
            )
        })
    }

    /// The tail of one of the harness's logs, for failure messages.
    pub fn log(&self, file: &str) -> String {
        let text = std::fs::read_to_string(self.dir.path().join(file)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// kubectl 1.33 against kube-apiserver, as the harness's administrator.
    pub fn kubectl(&self) -> Kubectl {
        self.kubectl_as(&self.admin)
    }

    pub fn kubectl_as(&self, kubeconfig: &Path) -> Kubectl {
        let cache = self.dir.path().join(format!(
            "cache-{}",
            kubeconfig.file_name().and_then(|n| n.to_str()).unwrap_or("x")
        ));
        Kubectl::new("1.33", kubeconfig, &cache)
    }

    /// A user of the cluster CA (`CN=user`, `O=groups`): its certificate, key and kubeconfig for
    /// kube-apiserver, under `<dir>/<user>.*`.
    pub fn user(&self, user: &str, groups: &[&str]) -> User {
        let pair = self.cluster_ca.client(user, groups).expect("issue a test certificate");
        let d = self.dir.path();
        let (cert, key) = (d.join(format!("{user}.crt")), d.join(format!("{user}.key")));
        write(&cert, &pair.cert_pem);
        write(&key, &pair.key_pem);
        let kubeconfig = d.join(format!("{user}.kubeconfig"));
        cert_kubeconfig(&kubeconfig, &self.url(), &self.cluster_ca.pair.cert_pem, user, &pair);
        User { cert, key, kubeconfig }
    }

    /// A kubeconfig for `server` (trusting `ca_file`) with a bearer token.
    pub fn token_kubeconfig(&self, name: &str, server: &str, ca_pem: &str, token: &str) -> PathBuf {
        use base64::Engine as _;
        let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
        let path = self.dir.path().join(format!("{name}.kubeconfig"));
        write(
            &path,
            &format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\n\
                 users:\n- name: u\n  user:\n    token: {token}\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\n\
                 current-context: x\n"
            ),
        );
        path
    }

    /// `kubectl create token` for a ServiceAccount.
    pub fn token(&self, namespace: &str, service_account: &str) -> String {
        self.kubectl()
            .ok(&["create", "token", service_account, "-n", namespace, "--duration=2h"])
            .trim()
            .to_owned()
    }
}

/// A user's files.
pub struct User {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub kubeconfig: PathBuf,
}

/// Our server in aggregated mode (`--auth delegated`), behind the control plane's aggregator.
pub struct Aggregated {
    process: Process,
    pub port: u16,
    /// `kv-apiserver certs --out`: ca.crt, tls.crt, tls.key, apiservice-cabundle.yaml.
    pub certs: PathBuf,
    pub log: PathBuf,
}

/// `kv-apiserver certs` into `out` (first run creates the CA, later runs rotate the serving
/// certificate).
pub fn write_certs(out: &Path) {
    let status = Command::new(super::support::server_binary())
        .args(["certs", "--out"])
        .arg(out)
        .stdout(Stdio::null())
        .status()
        .expect("run kv-apiserver certs");
    assert!(status.success(), "kv-apiserver certs failed");
}

impl Aggregated {
    /// Starts the server with the credentials in `kubeconfig` (the ServiceAccount of deploy/),
    /// serving the certificates in `certs` (written by [`write_certs`]).
    pub fn start(plane: &ControlPlane, kubeconfig: &Path, certs: &Path, extra: &[&str]) -> Aggregated {
        // A port picked free may be taken by another test before the server binds it: such a
        // start is tried again on another port.
        for _ in 0..3 {
            if let Some(server) = Aggregated::try_start(plane, kubeconfig, certs, extra) {
                return server;
            }
        }
        panic!("kv-apiserver lost its port to another process three times");
    }

    /// One start; `None` when the port was taken.
    fn try_start(plane: &ControlPlane, kubeconfig: &Path, certs: &Path, extra: &[&str]) -> Option<Aggregated> {
        let controllers = extra.iter().any(|a| a.starts_with("--runtime"));
        let port = loopback_port();
        let data = plane.dir.path().join(format!("kv-{port}"));
        let log = plane.dir.path().join(format!("kv-apiserver-{port}.log"));
        let mut args: Vec<String> = vec![
            "serve".into(),
            format!("--listen=127.0.0.1:{port}"),
            "--auth=delegated".into(),
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--tls-cert-file={}", certs.join("tls.crt").display()),
            format!("--tls-private-key-file={}", certs.join("tls.key").display()),
            format!("--controllers={controllers}"),
            format!("--data-dir={}", data.display()),
        ];
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        let process = spawn(&super::support::server_binary(), &args, &log);
        let mut server = Aggregated {
            process,
            port,
            certs: certs.to_owned(),
            log,
        };
        let mut answer = (String::new(), String::new());
        let started = poll_within(Duration::from_secs(30), POLL, || {
            if let Ok(Some(status)) = server.process.0.try_wait() {
                let text = std::fs::read_to_string(&server.log).unwrap_or_default();
                if text.contains("Address already in use") || text.contains("address already in use") {
                    return Some(false);
                }
                panic!("kv-apiserver exited ({status}):\n{text}");
            }
            answer = server.curl(&["-s", &server.url("/readyz")]);
            (answer.0 == "ok").then_some(true)
        });
        match started {
            Some(true) => Some(server),
            Some(false) => None,
            None => panic!(
                "kv-apiserver (aggregated) not ready within 30s: /readyz answered {answer:?}; its log:\n{}",
                std::fs::read_to_string(&server.log).unwrap_or_default()
            ),
        }
    }

    /// A URL on our server under the name its certificate is for (curl resolves it to loopback).
    pub fn url(&self, path: &str) -> String {
        format!("https://{SERVICE}.{NAMESPACE}.svc:{}{path}", self.port)
    }

    /// curl to our server directly, trusting its CA, with `args`; (body, HTTP code).
    pub fn curl(&self, args: &[&str]) -> (String, String) {
        let out = Command::new("curl")
            .arg("--resolve")
            .arg(format!("{SERVICE}.{NAMESPACE}.svc:{}:127.0.0.1", self.port))
            .arg("--cacert")
            .arg(self.certs.join("ca.crt"))
            .args(["--max-time", "20", "-w", "\n%{http_code}"])
            .args(args)
            .output()
            .expect("run curl");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        match text.rsplit_once('\n') {
            Some((body, code)) => (body.to_owned(), code.to_owned()),
            None => (String::new(), text),
        }
    }

    /// The serving certificate a new TLS connection gets (PEM), read with openssl.
    pub fn presented_certificate(&self) -> String {
        let out = Command::new("openssl")
            .args([
                "s_client",
                "-connect",
                &format!("127.0.0.1:{}", self.port),
                "-servername",
                "localhost",
            ])
            .stdin(Stdio::null())
            .output()
            .expect("run openssl s_client");
        let text = String::from_utf8_lossy(&out.stdout);
        let begin = text.find("-----BEGIN CERTIFICATE-----").expect("a certificate");
        let end = text.find("-----END CERTIFICATE-----").expect("a certificate") + "-----END CERTIFICATE-----".len();
        text[begin..end].to_owned()
    }
}

/// `deploy/` copied into `dir`, with `tls/` written by `kv-apiserver certs`.
pub fn deploy_copy(dir: &Path) -> std::path::PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    let out = dir.join("deploy");
    std::fs::create_dir_all(&out).expect("copy deploy/");
    for entry in std::fs::read_dir(&src).expect("copy deploy/") {
        let path = entry.expect("copy deploy/").path();
        if path.extension().is_some_and(|e| e == "yaml") {
            std::fs::copy(&path, out.join(path.file_name().expect("copy deploy/"))).expect("copy deploy/");
        }
    }
    write_certs(&out.join("tls"));
    out
}

pub fn apiservice_available(k: &Kubectl) -> String {
    k.run(&[
        "get",
        "apiservice",
        APISERVICE,
        "-o",
        r#"jsonpath={.status.conditions[?(@.type=="Available")].status}/{.status.conditions[?(@.type=="Available")].message}"#,
    ])
    .stdout
}

/// Points the APIService of deploy/ at the server the test started: an ExternalName Service
/// naming localhost, and the server's port. The APIService is created whole (caBundle from
/// `kv-apiserver certs`, the port), as an install creates it: the aggregator's first OpenAPI
/// download then finds it, instead of backing off for a minute after a 503.
pub fn route_to(k: &Kubectl, deploy: &Path, server: &Aggregated) {
    k.must_apply(&format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {SERVICE}\n  namespace: {NAMESPACE}\nspec:\n  type: ExternalName\n  externalName: localhost\n"
    ));
    let bundle =
        std::fs::read_to_string(deploy.join("tls/apiservice-cabundle.yaml")).expect("read the copy of deploy/");
    let ca = bundle
        .lines()
        .find_map(|l| l.trim().strip_prefix("caBundle: "))
        .expect("the caBundle patch names the CA");
    let apiservice = std::fs::read_to_string(deploy.join("apiservice.yaml")).expect("read the copy of deploy/");
    assert!(apiservice.contains("\nspec:\n") && apiservice.contains("    port: 443\n"));
    let apiservice = apiservice
        .replace("\nspec:\n", &format!("\nspec:\n  caBundle: {ca}\n"))
        .replace("    port: 443\n", &format!("    port: {}\n", server.port));
    k.must_apply(&apiservice);
}

/// deploy/ copied into the plane's folder with certificates, and its namespace, ServiceAccount and
/// RBAC applied for real.
pub fn prepare_deploy(plane: &ControlPlane) -> PathBuf {
    let deploy = deploy_copy(plane.dir.path());
    for file in [
        "namespace.yaml",
        "serviceaccount.yaml",
        "rbac-delegation.yaml",
        "rbac-users.yaml",
        "rbac-runtime.yaml",
    ] {
        plane
            .kubectl()
            .ok(&["apply", "-f", deploy.join(file).to_str().expect("a path")]);
    }
    deploy
}

/// Our server as the ServiceAccount of deploy/ (its token, its RBAC), behind the APIService of
/// deploy/, once kube-apiserver reports it Available.
pub fn start_behind(plane: &ControlPlane, deploy: &Path) -> Aggregated {
    start_behind_with(plane, deploy, &[])
}

/// [`start_behind`] with more flags; `--runtime kubernetes` runs the controllers, whose runtime
/// acts as the same ServiceAccount (`--runtime-kubeconfig`) and binds it in the namespaces it
/// writes to (`--runtime-service-account`), as deploy/deployment.yaml does.
pub fn start_behind_with(plane: &ControlPlane, deploy: &Path, extra: &[&str]) -> Aggregated {
    let k = plane.kubectl();
    let token = plane.token(NAMESPACE, SERVICE);
    let kubeconfig = plane.token_kubeconfig(SERVICE, &plane.url(), &plane.cluster_ca.pair.cert_pem, &token);
    let mut args: Vec<String> = extra.iter().map(|a| (*a).to_owned()).collect();
    if extra.iter().any(|a| a.starts_with("--runtime")) {
        args.push(format!("--runtime-kubeconfig={}", kubeconfig.display()));
        args.push(format!("--runtime-service-account={NAMESPACE}/{SERVICE}"));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = Aggregated::start(plane, &kubeconfig, &deploy.join("tls"), &args);
    route_to(&k, deploy, &server);
    super::support::eventually(60, "the APIService is Available", || {
        apiservice_available(&k).starts_with("True/").then_some(())
    });
    server
}
