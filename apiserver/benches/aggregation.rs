//! The same API three ways on one machine, in one run, against one real kube-apiserver and etcd
//! (the cluster-mode harness of `tests/e2e/cluster.rs`):
//!
//! - **(a) direct**: our server in aggregated mode (`--auth delegated`, embedded storage), reached
//!   directly with a client certificate of the cluster's CA;
//! - **(b) aggregated**: the same server through kube-apiserver's aggregation layer (kube-apiserver
//!   authenticates, authorizes and proxies every request to us);
//! - **(c) CRDs**: the way the reference serves this API, the four kinds as CustomResourceDefinitions
//!   on the same kube-apiserver and etcd. Their schemas are ours (from our OpenAPI document, made
//!   structural), under the group `crd.worker.gpustack.ai` so they do not collide with the
//!   APIService.
//!
//! Every client is the harness's administrator (`system:masters`, exempt from priority and
//! fairness), on HTTP/2 as kubectl and client-go use it. Measured for each: creates/s with 64
//! concurrent requests (10,000 pools), get latency p50/p99 (one client, by name), a list of the
//! 10,000 pools (JSON, median of 5), and watch latency p50/p99 with 100 watchers (one pool patched
//! 200 times, from the start of each write to its event at each watcher). This is a report:
//! nothing is asserted. Goal: (a) at least 3x the creates/s of (c), and at most a third of its get
//! p99.
//!
//! Run with `cargo bench -p kvcache-apiserver --bench aggregation` (after `scripts/build-kube`).

#[path = "../../tests/e2e/cluster.rs"]
mod cluster;
#[path = "support/h2.rs"]
mod h2;
#[path = "../../tests/e2e/support.rs"]
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use h2::{Client, percentile};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{Value, json};
use tokio::task::JoinSet;

const WRITERS: usize = 64;
const OBJECTS: usize = 10_000;
const GETS: usize = 3_000;
const GET_WARM_UP: usize = 300;
const WATCHERS: usize = 100;
const UPDATES: usize = 200;
const CRD_GROUP: &str = "crd.worker.gpustack.ai";

/// One way to reach the API.
struct Target {
    name: &'static str,
    port: u16,
    server_name: String,
    tls: tokio_rustls::TlsConnector,
    /// The pools collection.
    pools: String,
}

impl Target {
    fn endpoint(&self) -> h2::Endpoint {
        h2::Endpoint {
            port: self.port,
            server_name: self.server_name.clone(),
            tls: self.tls.clone(),
        }
    }
}

fn connector(ca_pem: &str, client: &kvcache_certs::CertPair) -> anyhow::Result<tokio_rustls::TlsConnector> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(ca?)?;
    }
    let chain = CertificateDer::pem_slice_iter(client.cert_pem.as_bytes()).collect::<Result<Vec<_>, _>>()?;
    let key = PrivateKeyDer::from_pem_slice(client.key_pem.as_bytes())?;
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)?;
    // Go's servers speak HTTP/2 only when ALPN chose it.
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

fn pool_body(group: &str, i: usize) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": format!("{group}/v1"), "kind": "KVCachePool",
        "metadata": {"name": format!("pool-{i:05}"), "labels": {"bench": "aggregation"}},
        "spec": {"backends": ["mooncake-dram"], "quota": {"total": "16Gi"}},
    }))
    .unwrap_or_default()
}

fn group_of(t: &Target) -> &str {
    if t.pools.contains(CRD_GROUP) {
        CRD_GROUP
    } else {
        kvcache_api::GROUP
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

async fn creates(t: &Target) -> anyhow::Result<f64> {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let shared = Client::connect(&t.endpoint()).await?;
    let group = group_of(t).to_owned();
    let started = Instant::now();
    let mut set = JoinSet::new();
    for _ in 0..WRITERS {
        let (mut c, next, pools, group) = (shared.clone(), next.clone(), t.pools.clone(), group.clone());
        set.spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= OBJECTS {
                    return anyhow::Ok(());
                }
                let (code, body) = c.send("POST", &pools, "application/json", pool_body(&group, i)).await?;
                if code != 201 {
                    bail!("create returned {code}: {}", String::from_utf8_lossy(&body));
                }
            }
        });
    }
    while let Some(r) = set.join_next().await {
        r??;
    }
    Ok(OBJECTS as f64 / started.elapsed().as_secs_f64())
}

async fn gets(t: &Target) -> anyhow::Result<(Duration, Duration)> {
    let mut c = Client::connect(&t.endpoint()).await?;
    let mut lat = Vec::with_capacity(GETS);
    for i in 0..GET_WARM_UP + GETS {
        let path = format!("{}/pool-{:05}", t.pools, (i * 7919) % OBJECTS);
        let at = Instant::now();
        let (code, body) = c.get(&path).await?;
        if code != 200 {
            bail!("get returned {code}: {}", String::from_utf8_lossy(&body));
        }
        if i >= GET_WARM_UP {
            lat.push(at.elapsed());
        }
    }
    lat.sort();
    Ok((percentile(&lat, 0.5), percentile(&lat, 0.99)))
}

async fn list(t: &Target) -> anyhow::Result<(Duration, usize)> {
    let mut c = Client::connect(&t.endpoint()).await?;
    let mut times = Vec::new();
    let mut items = 0;
    for _ in 0..5 {
        let at = Instant::now();
        let (code, body) = c.get(&t.pools).await?;
        times.push(at.elapsed());
        if code != 200 {
            bail!("list returned {code}");
        }
        items = serde_json::from_slice::<Value>(&body)?["items"]
            .as_array()
            .map_or(0, Vec::len);
    }
    times.sort();
    Ok((times[times.len() / 2], items))
}

async fn watch_latency(t: &Target) -> anyhow::Result<(Duration, Duration, usize)> {
    let load = h2::WatchLoad {
        readers: WATCHERS,
        stalled: 0,
        updates: UPDATES,
    };
    let d = h2::watch_latency(&t.endpoint(), &t.pools, load).await?;
    Ok((d.p50, d.p99, d.delivered))
}

/// What one target measured.
struct Figures {
    creates: f64,
    get: (Duration, Duration),
    list: (Duration, usize),
    watch: (Duration, Duration, usize),
}

async fn measure(t: &Target) -> anyhow::Result<Figures> {
    let creates = creates(t).await.with_context(|| format!("{}: creates", t.name))?;
    // Let background work after the burst (compaction, caches) settle before timing reads.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let get = gets(t).await.with_context(|| format!("{}: gets", t.name))?;
    let list = list(t).await.with_context(|| format!("{}: list", t.name))?;
    let watch = watch_latency(t).await.with_context(|| format!("{}: watch", t.name))?;
    Ok(Figures {
        creates,
        get,
        list,
        watch,
    })
}

/// Resolves `$ref`s and makes a schema structural, as a CRD requires: single-`allOf` wrappers
/// merged into their node, string `oneOf`s (documented enums) folded into one string type, our
/// group-version-kind markers dropped.
fn structural(schema: &Value, components: &serde_json::Map<String, Value>, depth: usize) -> Value {
    let Some(node) = schema.as_object() else {
        return schema.clone();
    };
    if depth > 64 {
        return json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true});
    }
    if let Some(Value::String(r)) = node.get("$ref") {
        let name = r.trim_start_matches("#/components/schemas/");
        let mut target = structural(&components[name], components, depth + 1);
        if let (Some(t), Some(d)) = (target.as_object_mut(), node.get("description")) {
            t.insert("description".into(), d.clone());
        }
        return target;
    }
    let mut out = serde_json::Map::new();
    if let Some(Value::Array(all)) = node.get("allOf")
        && all.len() == 1
        && let Value::Object(inner) = structural(&all[0], components, depth + 1)
    {
        out.extend(inner);
    }
    for (k, v) in node {
        match k.as_str() {
            "allOf" | "x-kubernetes-group-version-kind" | "$ref" => {}
            "properties" => {
                let props = v
                    .as_object()
                    .map(|p| {
                        p.iter()
                            .map(|(n, s)| (n.clone(), structural(s, components, depth + 1)))
                            .collect()
                    })
                    .unwrap_or_default();
                out.insert(k.clone(), Value::Object(props));
            }
            "items" | "additionalProperties" if v.is_object() => {
                out.insert(k.clone(), structural(v, components, depth + 1));
            }
            "oneOf" => {
                let variants = v.as_array().cloned().unwrap_or_default();
                if variants.iter().all(|x| x["type"] == "string") {
                    out.insert("type".into(), json!("string"));
                    let enums: Vec<Value> = variants
                        .iter()
                        .filter_map(|x| x["enum"].as_array())
                        .flatten()
                        .cloned()
                        .collect();
                    if variants.iter().all(|x| x["enum"].is_array()) {
                        out.insert("enum".into(), Value::Array(enums));
                    }
                } else {
                    out.insert("type".into(), json!("object"));
                    out.insert("x-kubernetes-preserve-unknown-fields".into(), json!(true));
                }
            }
            _ => {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    // A field of any value (no type) must say so in a structural schema.
    if !out.contains_key("type") && !out.contains_key("x-kubernetes-int-or-string") {
        out.insert("x-kubernetes-preserve-unknown-fields".into(), json!(true));
    }
    Value::Object(out)
}

/// The four kinds as CRDs, with the spec and status schemas of our OpenAPI document.
fn crds(openapi: &Value) -> anyhow::Result<Vec<Value>> {
    let components = openapi["components"]["schemas"]
        .as_object()
        .context("our OpenAPI document has no components")?;
    let mut out = Vec::new();
    for kind in kvcache_apiserver::registry::kinds::KINDS.iter() {
        let schema = &components[&format!("ai.gpustack.worker.v1.{}", kind.kind)];
        let part = |p: &str| structural(&schema["properties"][p], components, 0);
        out.push(json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": format!("{}.{CRD_GROUP}", kind.plural)},
            "spec": {
                "group": CRD_GROUP,
                "scope": if kind.namespaced() { "Namespaced" } else { "Cluster" },
                "names": {"plural": kind.plural, "singular": kind.singular, "kind": kind.kind, "listKind": format!("{}List", kind.kind)},
                "versions": [{
                    "name": "v1", "served": true, "storage": true,
                    "subresources": {"status": {}},
                    "schema": {"openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "apiVersion": {"type": "string"}, "kind": {"type": "string"},
                            "metadata": {"type": "object"},
                            "spec": part("spec"), "status": part("status"),
                        },
                    }},
                }],
            },
        }));
    }
    Ok(out)
}

fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let plane = cluster::ControlPlane::start();
    let deploy = cluster::prepare_deploy(&plane);
    let server = cluster::start_behind(&plane, &deploy);
    let admin = plane.cluster_ca.client("bench-admin", &["system:masters"])?;
    let kube_tls = connector(&plane.cluster_ca.pair.cert_pem, &admin)?;
    let ours_ca = std::fs::read_to_string(deploy.join("tls/ca.crt"))?;
    let direct = Target {
        name: "(a) our server, direct",
        port: server.port,
        server_name: format!("{}.{}.svc", cluster::SERVICE, cluster::NAMESPACE),
        tls: connector(&ours_ca, &admin)?,
        pools: format!("/apis/{}/v1/kvcachepools", kvcache_api::GROUP),
    };
    let aggregated = Target {
        name: "(b) our server through kube-apiserver",
        port: plane.port,
        server_name: "localhost".into(),
        tls: kube_tls.clone(),
        pools: format!("/apis/{}/v1/kvcachepools", kvcache_api::GROUP),
    };
    let crd = Target {
        name: "(c) CRDs on kube-apiserver",
        port: plane.port,
        server_name: "localhost".into(),
        tls: kube_tls,
        pools: format!("/apis/{CRD_GROUP}/v1/kvcachepools"),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;

    // The CRDs, from our own schemas.
    let openapi: Value = runtime.block_on(async {
        let mut c = Client::connect(&direct.endpoint()).await?;
        let (code, body) = c.get(&format!("/openapi/v3/apis/{}/v1", kvcache_api::GROUP)).await?;
        anyhow::ensure!(code == 200, "our OpenAPI document: {code}");
        anyhow::Ok(serde_json::from_slice(&body)?)
    })?;
    let k = plane.kubectl();
    for crd in crds(&openapi)? {
        let r = k.apply(&[], &serde_json::to_string(&crd)?);
        anyhow::ensure!(r.ok, "creating a CRD: {}", r.text());
    }
    k.ok(&[
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        &format!("crd/kvcachepools.{CRD_GROUP}"),
    ]);

    let kube_version: Value = serde_json::from_str(&k.ok(&["get", "--raw", "/version"]))?;
    let etcd_version = std::process::Command::new("/usr/bin/etcd").arg("--version").output()?;
    println!(
        "one machine, one run, on loopback: {} (Debian), kube-apiserver {}, our server",
        String::from_utf8_lossy(&etcd_version.stdout)
            .lines()
            .next()
            .unwrap_or("etcd"),
        kube_version["gitVersion"].as_str().unwrap_or("?")
    );
    println!(
        "clients: HTTP/2, the harness administrator (system:masters), a tokio runtime with 2 worker threads in this process"
    );
    println!();
    let mut all = Vec::new();
    // (a) and (b) share one server: (b) creates under another name prefix would double the
    // objects, so (b) runs on a fresh collection by deleting (a)'s pools first.
    for t in [&direct, &aggregated, &crd] {
        if t.name.starts_with("(b)") {
            runtime.block_on(async {
                let mut c = Client::connect(&direct.endpoint()).await?;
                let (code, body) = c
                    .send(
                        "DELETE",
                        &format!("{}?labelSelector=bench%3Daggregation", direct.pools),
                        "application/json",
                        Vec::new(),
                    )
                    .await?;
                anyhow::ensure!(
                    code == 200,
                    "deleting (a)'s pools: {code} {}",
                    String::from_utf8_lossy(&body)
                );
                anyhow::Ok(())
            })?;
        }
        let f = runtime.block_on(measure(t))?;
        println!("{}:", t.name);
        println!("  creates/s ({OBJECTS} pools, {WRITERS} concurrent): {:.0}", f.creates);
        println!(
            "  get by name (one client, {GETS}): p50 {:.2} ms, p99 {:.2} ms",
            ms(f.get.0),
            ms(f.get.1)
        );
        println!("  list of {} pools: {:.1} ms (median of 5)", f.list.1, ms(f.list.0));
        println!(
            "  watch, {WATCHERS} watchers x {UPDATES} updates ({} deliveries): p50 {:.2} ms, p99 {:.2} ms",
            f.watch.2,
            ms(f.watch.0),
            ms(f.watch.1)
        );
        println!();
        all.push(f);
    }
    let (a, b, c) = (&all[0], &all[1], &all[2]);
    println!("ratios against (c) CRDs:");
    println!(
        "  creates/s: (a) {:.2}x, (b) {:.2}x   [goal (a) >= 3x]",
        a.creates / c.creates,
        b.creates / c.creates
    );
    println!(
        "  get p99: (a) {:.2} of (c), (b) {:.2} of (c)   [goal (a) <= 0.33]",
        ms(a.get.1) / ms(c.get.1),
        ms(b.get.1) / ms(c.get.1)
    );
    println!(
        "  list: (a) {:.2} of (c), (b) {:.2} of (c); watch p99: (a) {:.2} of (c), (b) {:.2} of (c)",
        ms(a.list.0) / ms(c.list.0),
        ms(b.list.0) / ms(c.list.0),
        ms(a.watch.1) / ms(c.watch.1),
        ms(b.watch.1) / ms(c.watch.1)
    );
    Ok(())
}
