//! The whole pipeline in process, as the controllers will use it: the application built by
//! `App::build`, its pipeline called as a tower `Service` with an in-process identity (no socket,
//! no TLS). Covers each handler, the auth chain (401, 403, non-resource paths), the in-flight
//! (429) and body (413) limits, and a kube-rs client listing and watching one of our kinds.

#![allow(clippy::unwrap_used)]

use std::convert::Infallible;
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use kvcache_apiserver::app::{App, AppOptions};
use kvcache_apiserver::auth::User;
use serde_json::{Value, json};
use tower::ServiceExt;

const POOLS: &str = "/apis/worker.gpustack.ai/v1/kvcachepools";
const BINDINGS: &str = "/apis/worker.gpustack.ai/v1/namespaces/team-a/kvcachepoolbindings";

struct Fixture {
    app: App,
    _dir: tempfile::TempDir,
}

fn app_with(edit: impl FnOnce(&mut AppOptions)) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = AppOptions::new(dir.path());
    edit(&mut opts);
    Fixture {
        app: App::build(opts).unwrap(),
        _dir: dir,
    }
}

fn app() -> Fixture {
    app_with(|_| {})
}

fn admin() -> User {
    User::new("kvcache-admin", &["system:masters", "system:authenticated"])
}

fn viewer() -> User {
    User::new("kvcache-viewer", &["gpustack:viewers", "system:authenticated"])
}

/// An answer, read whole.
#[derive(Debug)]
struct Answer {
    code: StatusCode,
    headers: http::HeaderMap,
    body: Bytes,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("{e}: {:?}", String::from_utf8_lossy(&self.body)))
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// Asserts a Status of `code` and `reason`.
    fn refused(&self, code: u16, reason: &str) -> Value {
        assert_eq!(self.code.as_u16(), code, "{}", self.text());
        let v = self.json();
        assert_eq!(
            (v["kind"].as_str(), v["reason"].as_str()),
            (Some("Status"), Some(reason)),
            "{v}"
        );
        v
    }
}

async fn call(f: &Fixture, user: Option<User>, req: Request<Body>) -> Answer {
    let response = match user {
        Some(u) => f.app.in_process(u).oneshot(req).await.unwrap(),
        None => f.app.service().oneshot(req).await.unwrap(),
    };
    let (parts, body) = response.into_parts();
    Answer {
        code: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

fn req(method: &str, path: &str, content_type: &str, body: impl Into<Body>) -> Request<Body> {
    let mut b = Request::builder().method(method).uri(path);
    if !content_type.is_empty() {
        b = b.header("content-type", content_type);
    }
    b.body(body.into()).unwrap()
}

async fn as_admin(f: &Fixture, method: &str, path: &str, content_type: &str, body: impl Into<Body>) -> Answer {
    call(f, Some(admin()), req(method, path, content_type, body)).await
}

fn pool(name: &str) -> String {
    json!({"apiVersion": "worker.gpustack.ai/v1", "kind": "KVCachePool", "metadata": {"name": name},
           "spec": {"backends": ["mooncake-dram"], "quota": {"total": "16Gi"}}})
    .to_string()
}

#[tokio::test]
async fn every_verb_reaches_its_handler() {
    let f = app();
    // create, get, list
    let a = as_admin(&f, "POST", POOLS, "application/json", pool("p1")).await;
    assert_eq!(a.code, 201, "{}", a.text());
    let created = a.json();
    assert_eq!(created["metadata"]["generation"], 1);
    let got = as_admin(&f, "GET", &format!("{POOLS}/p1"), "", Body::empty())
        .await
        .json();
    assert_eq!(got["metadata"]["uid"], created["metadata"]["uid"]);
    let list = as_admin(&f, "GET", POOLS, "", Body::empty()).await.json();
    assert_eq!(
        (list["kind"].as_str(), list["items"].as_array().map(Vec::len)),
        (Some("KVCachePoolList"), Some(1))
    );
    assert!(
        list["metadata"]["resourceVersion"]
            .as_str()
            .is_some_and(|rv| !rv.is_empty())
    );
    let table = call(
        &f,
        Some(admin()),
        Request::get(POOLS)
            .header("accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
            .body(Body::empty())
            .unwrap(),
    )
    .await
    .json();
    assert_eq!(table["kind"], "Table");
    // update (PUT) needs the current resourceVersion
    let mut put = got.clone();
    put["spec"]["quota"]["total"] = json!("20Gi");
    let a = as_admin(&f, "PUT", &format!("{POOLS}/p1"), "application/json", put.to_string()).await;
    assert_eq!(a.code, 200, "{}", a.text());
    assert_eq!(a.json()["metadata"]["generation"], 2);
    let stale = as_admin(&f, "PUT", &format!("{POOLS}/p1"), "application/json", put.to_string()).await;
    stale.refused(409, "Conflict");
    // patch: merge, JSON, strategic (as merge), apply
    let item = format!("{POOLS}/p1");
    let a = as_admin(
        &f,
        "PATCH",
        &item,
        "application/merge-patch+json",
        r#"{"metadata":{"labels":{"a":"1"}}}"#,
    )
    .await;
    assert_eq!(a.json()["metadata"]["labels"]["a"], "1");
    let a = as_admin(
        &f,
        "PATCH",
        &item,
        "application/json-patch+json",
        r#"[{"op":"replace","path":"/spec/quota/total","value":"24Gi"}]"#,
    )
    .await;
    assert_eq!(a.json()["spec"]["quota"]["total"], "24Gi");
    let a = as_admin(
        &f,
        "PATCH",
        &item,
        "application/strategic-merge-patch+json",
        r#"{"metadata":{"labels":{"b":"2"}}}"#,
    )
    .await;
    assert_eq!(a.json()["metadata"]["labels"]["b"], "2");
    let apply = "apiVersion: worker.gpustack.ai/v1\nkind: KVCachePool\nmetadata: {name: p2}\nspec: {backends: [mooncake-dram], quota: {total: 1Gi}}\n";
    let a = as_admin(
        &f,
        "PATCH",
        &format!("{POOLS}/p2?fieldManager=t"),
        "application/apply-patch+yaml",
        apply,
    )
    .await;
    assert_eq!(a.code, 201, "apply creates: {}", a.text());
    // status
    let a = as_admin(
        &f,
        "PATCH",
        &format!("{item}/status"),
        "application/merge-patch+json",
        r#"{"status":{"phase":"Ready"}}"#,
    )
    .await;
    assert_eq!(a.json()["status"]["phase"], "Ready", "{}", a.text());
    let a = as_admin(
        &f,
        "PATCH",
        &format!("{item}/status"),
        "application/merge-patch+json",
        r#"{"status":{"phase":"Sleepy"}}"#,
    )
    .await;
    a.refused(422, "Invalid");
    // a path with segments past a subresource or a name is no resource: 404, as kube-apiserver
    for extra in [format!("{item}/status/extra"), format!("{item}/x/y")] {
        for method in ["GET", "PATCH", "DELETE"] {
            let a = as_admin(&f, method, &extra, "application/merge-patch+json", "{}").await;
            assert_eq!(a.code, 404, "{method} {extra}: {}", a.text());
        }
    }
    let a = as_admin(
        &f,
        "GET",
        "/apis/worker.gpustack.ai/v1/namespaces/team-a/kvcachepoolbindings/b/status/x",
        "",
        Body::empty(),
    )
    .await;
    assert_eq!(a.code, 404, "{}", a.text());
    // delete, deletecollection
    let a = as_admin(&f, "DELETE", &format!("{POOLS}/p2"), "", Body::empty()).await;
    assert_eq!(a.code, 200);
    as_admin(&f, "GET", &format!("{POOLS}/p2"), "", Body::empty())
        .await
        .refused(404, "NotFound");
    let a = as_admin(&f, "DELETE", &format!("{POOLS}?labelSelector=a%3D1"), "", Body::empty()).await;
    assert_eq!(a.json()["items"].as_array().map(Vec::len), Some(1), "{}", a.text());
    let list = as_admin(&f, "GET", POOLS, "", Body::empty()).await.json();
    assert_eq!(list["items"].as_array().map(Vec::len), Some(0));
    // Namespaced kinds: a namespace is required for one object.
    as_admin(
        &f,
        "GET",
        "/apis/worker.gpustack.ai/v1/kvcachepoolbindings/x",
        "",
        Body::empty(),
    )
    .await
    .refused(404, "NotFound");
    let empty = as_admin(&f, "GET", BINDINGS, "", Body::empty()).await.json();
    assert_eq!(empty["items"], json!([]));
}

#[tokio::test]
async fn a_watch_sends_the_state_then_changes_one_json_event_per_line() {
    let f = app();
    as_admin(&f, "POST", POOLS, "application/json", pool("w1")).await;
    let response = f
        .app
        .in_process(admin())
        .oneshot(req(
            "GET",
            &format!("{POOLS}?watch=true&allowWatchBookmarks=true"),
            "",
            Body::empty(),
        ))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let mut lines = Vec::<Value>::new();
    let mut buf = Vec::new();
    let mut changed = false;
    while lines.len() < 2 {
        let frame = tokio::time::timeout(Duration::from_secs(10), body.frame())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        buf.extend_from_slice(frame.data_ref().unwrap());
        while let Some(at) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=at).collect();
            lines.push(serde_json::from_slice(&line).unwrap());
        }
        if !changed && !lines.is_empty() {
            changed = true;
            as_admin(
                &f,
                "PATCH",
                &format!("{POOLS}/w1"),
                "application/merge-patch+json",
                r#"{"metadata":{"labels":{"x":"y"}}}"#,
            )
            .await;
        }
    }
    assert_eq!(lines[0]["type"], "ADDED", "{lines:?}");
    assert_eq!(lines[1]["type"], "MODIFIED", "{lines:?}");
    for l in &lines {
        assert!(l["object"]["metadata"]["resourceVersion"].as_str().is_some(), "{l}");
    }
}

#[tokio::test]
async fn discovery_openapi_health_and_metrics() {
    let f = app();
    let get = |path: &str| req("GET", path, "", Body::empty());
    let someone = User::new("someone", &["system:authenticated"]);
    for path in [
        "/api",
        "/apis",
        "/apis/worker.gpustack.ai",
        "/apis/worker.gpustack.ai/v1",
        "/version",
        "/openapi/v2",
        "/openapi/v3",
        "/metrics",
    ] {
        let a = call(&f, Some(someone.clone()), get(path)).await;
        assert_eq!(a.code, 200, "{path}: {}", a.text());
    }
    let v3 = call(&f, Some(someone.clone()), get("/openapi/v3")).await.json();
    let url = v3["paths"]["apis/worker.gpustack.ai/v1"]["serverRelativeURL"]
        .as_str()
        .unwrap()
        .to_owned();
    let doc = call(&f, Some(someone.clone()), get(&url)).await.json();
    assert_eq!(doc["openapi"], "3.0.0");
    let agg = call(
        &f,
        Some(someone.clone()),
        Request::get("/apis")
            .header(
                "accept",
                "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
            )
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(agg.json()["kind"], "APIGroupDiscoveryList");
    assert!(agg.headers.contains_key("etag"));
    // Health answers without credentials; a check by path; verbose lists the checks.
    for path in ["/healthz", "/livez", "/readyz", "/readyz/storage"] {
        let a = call(&f, None, get(path)).await;
        assert_eq!((a.code.as_u16(), a.text()), (200, "ok".to_owned()), "{path}");
    }
    let verbose = call(&f, None, get("/readyz?verbose")).await.text();
    assert!(
        verbose.contains("[+]storage ok") && verbose.contains("readyz check passed"),
        "{verbose}"
    );
    call(&f, None, get("/readyz/nope")).await.refused(404, "NotFound");
    f.app.set_unready();
    assert_eq!(call(&f, None, get("/readyz")).await.code, 503);
    // Only GET on the system paths.
    call(&f, Some(admin()), req("POST", "/apis", "application/json", "{}"))
        .await
        .refused(405, "MethodNotAllowed");
    let metrics = call(&f, Some(admin()), get("/metrics")).await.text();
    assert!(metrics.contains("apiserver_request_total{verb=\"GET\""), "{metrics}");
    assert!(
        metrics.contains("apiserver_storage_commit_duration_seconds"),
        "{metrics}"
    );
}

#[tokio::test]
async fn the_auth_chain_refuses_with_401_and_403() {
    let f = app();
    let get = |path: &str| req("GET", path, "", Body::empty());
    // No credentials at all: 401 except on the public paths.
    call(&f, None, get(POOLS)).await.refused(401, "Unauthorized");
    call(&f, None, get("/apis")).await.refused(401, "Unauthorized");
    call(&f, None, get("/metrics")).await.refused(401, "Unauthorized");
    assert_eq!(call(&f, None, get("/version")).await.code, 200);
    // A viewer reads and may not write.
    assert_eq!(call(&f, Some(viewer()), get(POOLS)).await.code, 200);
    let a = call(&f, Some(viewer()), req("POST", POOLS, "application/json", pool("v"))).await;
    let s = a.refused(403, "Forbidden");
    assert!(
        s["message"]
            .as_str()
            .unwrap()
            .contains("cannot create resource \"kvcachepools\""),
        "{s}"
    );
    // An authenticated user outside both groups reads discovery only.
    let someone = User::new("someone", &["system:authenticated"]);
    assert_eq!(call(&f, Some(someone.clone()), get("/apis")).await.code, 200);
    call(&f, Some(someone.clone()), get(POOLS))
        .await
        .refused(403, "Forbidden");
    let s = call(&f, Some(someone), get("/debug/pprof"))
        .await
        .refused(403, "Forbidden");
    assert!(
        s["message"]
            .as_str()
            .unwrap()
            .contains("cannot get path \"/debug/pprof\""),
        "{s}"
    );
    // Server-side apply that would create needs create too.
    let apply = "apiVersion: worker.gpustack.ai/v1\nkind: KVCachePool\nmetadata: {name: v}\n";
    call(
        &f,
        Some(viewer()),
        req(
            "PATCH",
            &format!("{POOLS}/v?fieldManager=t"),
            "application/apply-patch+yaml",
            apply,
        ),
    )
    .await
    .refused(403, "Forbidden");
    // Impersonation is refused, never ignored.
    let imp = Request::get(POOLS)
        .header("impersonate-user", "bob")
        .body(Body::empty())
        .unwrap();
    call(&f, Some(admin()), imp).await.refused(403, "Forbidden");
}

#[tokio::test]
async fn writes_past_the_in_flight_limit_get_429() {
    let f = app_with(|o| o.max_writes_in_flight = 1);
    // A create whose body never ends holds the one write slot.
    let (mut tx, rx) = futures::channel::mpsc::channel::<Result<Bytes, Infallible>>(1);
    tx.try_send(Ok(Bytes::from_static(b"{"))).unwrap();
    let held = tokio::spawn(f.app.in_process(admin()).oneshot(req(
        "POST",
        POOLS,
        "application/json",
        Body::from_stream(rx),
    )));
    // The test runtime has one thread: yielding runs the held request up to its body read.
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    let mut refused = None;
    for _ in 0..200 {
        let a = as_admin(&f, "POST", POOLS, "application/json", pool("x")).await;
        if a.code == 429 {
            refused = Some(a);
            break;
        }
        tokio::task::yield_now().await;
    }
    if refused.is_none() && held.is_finished() {
        let r = held.await.unwrap().unwrap();
        let (p, b) = r.into_parts();
        panic!(
            "the held write ended: {} {:?}",
            p.status,
            b.collect().await.unwrap().to_bytes()
        );
    }
    let a = refused.expect("a second write was admitted while the first held the only slot");
    a.refused(429, "TooManyRequests");
    assert_eq!(a.headers["retry-after"], "1");
    // Reads and watches are counted apart.
    assert_eq!(as_admin(&f, "GET", POOLS, "", Body::empty()).await.code, 200);
    drop(tx);
    let _ = held.await;
}

#[tokio::test]
async fn bodies_past_the_limit_get_413() {
    let f = app();
    let big = vec![b' '; 4 << 20];
    let declared = as_admin(&f, "POST", POOLS, "application/json", big.clone()).await;
    declared.refused(413, "RequestEntityTooLarge");
    // Without a Content-Length, the limit applies as the body is read.
    let (mut tx, rx) = futures::channel::mpsc::channel::<Result<Bytes, Infallible>>(8);
    let sender = tokio::spawn(async move {
        for chunk in big.chunks(64 << 10) {
            if futures::SinkExt::send(&mut tx, Ok(Bytes::copy_from_slice(chunk)))
                .await
                .is_err()
            {
                break;
            }
        }
    });
    let streamed = as_admin(&f, "POST", POOLS, "application/json", Body::from_stream(rx)).await;
    streamed.refused(413, "RequestEntityTooLarge");
    let _ = sender.await;
}

#[tokio::test]
async fn metrics_label_sets_do_not_grow_with_random_paths() {
    let f = app();
    let series = |text: &str| -> std::collections::BTreeSet<String> {
        text.lines()
            .filter(|l| l.starts_with("apiserver_request"))
            .filter_map(|l| l.rsplit_once(' ').map(|(labels, _)| labels.to_owned()))
            .collect()
    };
    let burst = |offset: usize| {
        let f = &f;
        async move {
            for i in offset..offset + 1000 {
                let path = match i % 4 {
                    0 => format!("/random/{i}/{}", i * 7),
                    1 => format!("/apis/worker.gpustack.ai/v1/kind{i}"),
                    2 => format!("/apis/worker.gpustack.ai/v1/kvcachepools/x/sub{i}"),
                    _ => format!("/apis/g{i}/v1/things"),
                };
                let user = (i % 3 != 0).then(admin);
                let method = ["GET", "POST", "BREW", "DELETE"][i % 4];
                call(f, user, req(method, &path, "", Body::empty())).await;
            }
        }
    };
    as_admin(&f, "GET", "/metrics", "", Body::empty()).await;
    burst(0).await;
    let first = series(&as_admin(&f, "GET", "/metrics", "", Body::empty()).await.text());
    burst(100_000).await;
    let second = series(&as_admin(&f, "GET", "/metrics", "", Body::empty()).await.text());
    assert_eq!(first, second, "1,000 other random paths added label values");
}

#[tokio::test]
async fn a_kube_client_lists_and_watches_through_the_router_in_process() {
    use futures::StreamExt;
    use kube::runtime::watcher;
    use kvcache_api::KVCachePool;
    let f = app_with(|o| o.watch_history = 2);
    let client = kube::Client::new(f.app.in_process(admin()), "default");
    let pools: kube::Api<KVCachePool> = kube::Api::all(client);
    let created = pools
        .create(&Default::default(), &serde_json::from_str(&pool("k1")).unwrap())
        .await
        .unwrap();
    let list = pools.list(&Default::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    assert!(list.metadata.resource_version.is_some());
    // kube-runtime's watcher: the initial list, then a change.
    let mut events = watcher(pools.clone(), watcher::Config::default()).boxed();
    let mut initial = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_secs(10), events.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
        {
            watcher::Event::InitApply(p) => initial.push(p),
            watcher::Event::InitDone => break,
            _ => {}
        }
    }
    assert_eq!(initial.len(), 1);
    let mut p = created.clone();
    p.metadata.labels = Some([("changed".to_owned(), "yes".to_owned())].into());
    pools.replace("k1", &Default::default(), &p).await.unwrap();
    let applied = loop {
        if let watcher::Event::Apply(p) = tokio::time::timeout(Duration::from_secs(10), events.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
        {
            break p;
        }
    };
    assert_eq!(applied.metadata.labels.unwrap()["changed"], "yes");
    // A watch from a revision the history no longer holds gets an in-stream 410, which makes
    // the watcher list again.
    for i in 0..4 {
        pools
            .create(
                &Default::default(),
                &serde_json::from_str(&pool(&format!("more{i}"))).unwrap(),
            )
            .await
            .unwrap();
    }
    let rv = created.metadata.resource_version.unwrap();
    let mut raw = pools.watch(&Default::default(), &rv).await.unwrap().boxed();
    match tokio::time::timeout(Duration::from_secs(10), raw.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap()
    {
        kube::api::WatchEvent::Error(e) => assert_eq!(e.code, 410, "{e:?}"),
        other => panic!("expected an in-stream 410, got {other:?}"),
    }
}

#[tokio::test]
async fn core_events_are_created_listed_by_involved_object_and_not_updated() {
    let f = app();
    let discovery = as_admin(&f, "GET", "/api/v1", "", Body::empty()).await;
    assert_eq!(discovery.json()["resources"][0]["name"], "events");
    let event = |name: &str, object: &str| {
        json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": name},
               "involvedObject": {"apiVersion": "worker.gpustack.ai/v1", "kind": "KVCacheBackend", "name": object, "uid": "u-1"},
               "reason": "Serving", "message": "the leader serves", "type": "Normal"})
        .to_string()
    };
    let ctl = User::new("system:kvcache-controller", &["system:authenticated"]);
    for (name, object) in [("a.1", "m"), ("b.1", "other")] {
        let created = call(
            &f,
            Some(ctl.clone()),
            req(
                "POST",
                "/api/v1/namespaces/default/events",
                "application/json",
                event(name, object),
            ),
        )
        .await;
        assert_eq!(created.code, StatusCode::CREATED, "{}", created.text());
        assert!(created.json()["metadata"]["resourceVersion"].as_str().is_some());
    }
    // what kubectl describe asks for
    let listed = as_admin(
        &f,
        "GET",
        "/api/v1/events?fieldSelector=involvedObject.name%3Dm%2CinvolvedObject.namespace%3D%2CinvolvedObject.kind%3DKVCacheBackend%2CinvolvedObject.uid%3Du-1&limit=500",
        "",
        Body::empty(),
    )
    .await;
    let items = listed.json()["items"].as_array().cloned().unwrap_or_default();
    assert_eq!(items.len(), 1, "{}", listed.text());
    assert_eq!(items[0]["metadata"]["name"], "a.1");
    let put = as_admin(
        &f,
        "PUT",
        "/api/v1/namespaces/default/events/a.1",
        "application/json",
        event("a.1", "m"),
    )
    .await;
    put.refused(405, "MethodNotAllowed");
    let bad = as_admin(&f, "GET", "/api/v1/events?fieldSelector=spec.x%3D1", "", Body::empty()).await;
    bad.refused(400, "BadRequest");
    // pages of one list are read at the revision of its first page, with the typed kinds' token
    let first = as_admin(&f, "GET", "/api/v1/events?limit=1", "", Body::empty()).await;
    let token = first.json()["metadata"]["continue"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let revision = first.json()["metadata"]["resourceVersion"].clone();
    assert!(!token.is_empty(), "{}", first.text());
    let created = call(
        &f,
        Some(ctl.clone()),
        req(
            "POST",
            "/api/v1/namespaces/default/events",
            "application/json",
            event("c.1", "m"),
        ),
    )
    .await;
    assert_eq!(created.code, StatusCode::CREATED, "{}", created.text());
    let second = as_admin(
        &f,
        "GET",
        &format!("/api/v1/events?limit=5&continue={token}"),
        "",
        Body::empty(),
    )
    .await;
    let names: Vec<String> = second.json()["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|e| e["metadata"]["name"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(
        names,
        ["b.1"],
        "the event made after the first page is not in this list"
    );
    assert_eq!(second.json()["metadata"]["resourceVersion"], revision);
    let elsewhere = as_admin(
        &f,
        "GET",
        &format!("/apis/coordination.k8s.io/v1/leases?limit=5&continue={token}"),
        "",
        Body::empty(),
    )
    .await;
    elsewhere.refused(400, "BadRequest");
    let missing = as_admin(
        &f,
        "POST",
        "/api/v1/namespaces/default/events",
        "application/json",
        json!({"metadata": {"name": "c"}}).to_string(),
    )
    .await;
    let s = missing.refused(422, "Invalid");
    assert_eq!(s["details"]["causes"][0]["field"], "involvedObject");
    // a viewer reads them, may not write them; the controller may not touch other core resources
    let v = call(
        &f,
        Some(viewer()),
        req("GET", "/api/v1/namespaces/default/events", "", Body::empty()),
    )
    .await;
    assert_eq!(v.code, StatusCode::OK);
    let w = call(
        &f,
        Some(viewer()),
        req(
            "POST",
            "/api/v1/namespaces/default/events",
            "application/json",
            event("d.1", "m"),
        ),
    )
    .await;
    w.refused(403, "Forbidden");
    let pods = call(
        &f,
        Some(ctl),
        req("GET", "/api/v1/namespaces/default/pods", "", Body::empty()),
    )
    .await;
    pods.refused(403, "Forbidden");
}
