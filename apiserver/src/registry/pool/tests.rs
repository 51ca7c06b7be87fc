//! Admission table of `KVCachePool`: exactly one backend (a missing one warns), a total of at
//! least one byte that fits in an int64, no unknown fields, a warning for a managed backend
//! without a tenant ledger, and backends that never change while the quota may.

use kvcache_api::backend::BackendSpec;
use kvcache_api::pool::{KVCachePool, PoolSpec, PoolStatus};
use serde_json::{Value, json};

use crate::field::ErrorType::*;
use crate::registry::RegistryError;
use crate::registry::generic::{DeleteOptions, WriteOptions};
use crate::registry::testing::{Expect, Harness, check, decode, render_refuses_alike, set};

type Edit = fn(&mut Value);

fn pool() -> Value {
    json!({"apiVersion": "worker.gpustack.ai/v1", "kind": "KVCachePool",
           "metadata": {"name": "shared-dram"},
           "spec": {"backends": ["mooncake-dram"], "quota": {"total": "16Gi"}}})
}

fn backend(name: &str, multi_tenancy: Option<bool>, external: bool) -> Value {
    let connection = if external {
        json!({"external": {"endpoints": [{"name": "Client", "address": "s:1"}, {"name": "Admin", "address": "s:2"}]}})
    } else {
        let mut leader = json!({});
        if let Some(m) = multi_tenancy {
            leader["multiTenancy"] = json!(m);
        }
        json!({"managed": {"leader": leader, "members": [{"nodeSelector": {}, "medium": "DRAM", "capacityPerMember": "8Gi"}]}})
    };
    json!({"apiVersion": "worker.gpustack.ai/v1", "kind": "KVCacheBackend", "metadata": {"name": name},
           "spec": {"connection": connection}})
}

pub async fn create_backend(h: &Harness, v: Value) {
    let b = decode::<BackendSpec>(&v).unwrap();
    h.reg.backends.create("", b, WriteOptions::default()).await.unwrap();
}

async fn create(h: &Harness, v: &Value) -> Result<(KVCachePool, Vec<String>), RegistryError> {
    let obj = decode::<PoolSpec>(v)?;
    h.reg
        .pools
        .create("", obj, WriteOptions::default())
        .await
        .map(|w| (w.object, w.warnings))
}

fn cases() -> Vec<(&'static str, Edit, Expect)> {
    vec![
        ("walkthrough pool", |_| {}, Expect::Admitted),
        (
            "no backends",
            |v| set(v, "/spec/backends", json!([])),
            Expect::Refused(Invalid, "spec.backends"),
        ),
        (
            "two backends",
            |v| set(v, "/spec/backends", json!(["a", "b"])),
            Expect::Refused(Invalid, "spec.backends"),
        ),
        (
            "empty backend name",
            |v| set(v, "/spec/backends", json!([""])),
            Expect::Refused(Required, "spec.backends[0]"),
        ),
        (
            "backend that does not exist yet",
            |v| set(v, "/spec/backends", json!(["later"])),
            Expect::Warned("does not exist yet"),
        ),
        (
            "total 0",
            |v| set(v, "/spec/quota/total", json!("0")),
            Expect::Refused(Invalid, "spec.quota.total"),
        ),
        (
            "total negative",
            |v| set(v, "/spec/quota/total", json!("-1Gi")),
            Expect::Refused(Invalid, "spec.quota.total"),
        ),
        (
            "total past int64",
            |v| set(v, "/spec/quota/total", json!("9Ei")),
            Expect::Refused(Invalid, "spec.quota.total"),
        ),
        (
            "total missing",
            |v| set(v, "/spec/quota", json!({})),
            Expect::Refused(Required, "spec.quota.total"),
        ),
        (
            "unknown field",
            |v| set(v, "/spec/eviction", json!({})),
            Expect::BadRequest(r#"unknown field "spec.eviction""#),
        ),
    ]
}

#[tokio::test]
async fn create_admission_table() {
    for (name, edit, expect) in cases() {
        let h = Harness::new();
        let prerequisite = backend("mooncake-dram", None, false);
        create_backend(&h, prerequisite.clone()).await;
        let mut v = pool();
        edit(&mut v);
        let result = create(&h, &v).await;
        if let Err(e) = &result {
            render_refuses_alike(name, &[prerequisite], &v, e).await;
        }
        let msg = check(name, result, expect);
        if name == "total past int64" {
            assert!(
                msg.contains("must not exceed"),
                "overflow is reported before sign: {msg}"
            );
        }
    }
}

#[tokio::test]
async fn warns_about_a_backend_without_a_tenant_ledger() {
    let h = Harness::new();
    create_backend(&h, backend("single", Some(false), false)).await;
    create_backend(&h, backend("ext", None, true)).await;
    let mut v = pool();
    set(&mut v, "/spec/backends", json!(["single"]));
    check(
        "managed without multiTenancy",
        create(&h, &v).await,
        Expect::Warned("keeps no per-tenant ledger"),
    );
    let mut v = pool();
    set(&mut v, "/metadata/name", json!("on-external"));
    set(&mut v, "/spec/backends", json!(["ext"]));
    let (_, warnings) = create(&h, &v).await.unwrap();
    assert!(
        warnings.is_empty(),
        "an external backend is not inspected: {warnings:?}"
    );
}

#[tokio::test]
async fn backends_are_immutable_and_quota_is_not() {
    let h = Harness::new();
    create_backend(&h, backend("mooncake-dram", None, false)).await;
    let (p, _) = create(&h, &pool()).await.unwrap();
    // The backend goes away; the pool stays editable (the backend is not re-read).
    h.reg
        .backends
        .delete("", "mooncake-dram", DeleteOptions::default())
        .await
        .unwrap();
    let mut q = p.clone();
    q.spec.quota.as_mut().unwrap().total = Some("32Gi".into());
    let p = h
        .reg
        .pools
        .update("", p.name(), q, WriteOptions::default())
        .await
        .expect("quota edit")
        .object;
    // Status sent to the main resource is ignored.
    let mut s = p.clone();
    s.status = Some(PoolStatus {
        phase: Some(kvcache_api::conditions::PoolPhase::Ready),
        ..Default::default()
    });
    let p = h
        .reg
        .pools
        .update("", p.name(), s, WriteOptions::default())
        .await
        .unwrap()
        .object;
    assert_eq!(p.status, None, "status belongs to the controller");
    let mut moved = p.clone();
    moved.spec.backends = vec!["other".into()];
    check(
        "move to another backend",
        h.reg
            .pools
            .update("", p.name(), moved.clone(), WriteOptions::default())
            .await
            .map(|w| (w.object, w.warnings)),
        Expect::Refused(Forbidden, "spec.backends"),
    );
    // Still immutable while the pool is being deleted.
    let mut held = p.clone();
    held.metadata.finalizers = Some(vec!["worker.gpustack.ai/kv-cache-pool".into()]);
    let p = h
        .reg
        .pools
        .update("", p.name(), held, WriteOptions::default())
        .await
        .unwrap()
        .object;
    h.reg
        .pools
        .delete("", p.name(), DeleteOptions::default())
        .await
        .unwrap();
    let deleting = h.reg.pools.get("", p.name()).await.unwrap();
    let mut moved = deleting.clone();
    moved.spec.backends = vec!["other".into()];
    check(
        "move while deleting",
        h.reg
            .pools
            .update("", p.name(), moved, WriteOptions::default())
            .await
            .map(|w| (w.object, w.warnings)),
        Expect::Refused(Forbidden, "spec.backends"),
    );
}

#[tokio::test]
async fn lists_page_with_continue_tokens_at_one_revision_and_filter_before_the_limit() {
    use crate::registry::generic::ListOptions;
    use std::sync::Arc;

    let h = Harness::new();
    for i in 0..7 {
        let mut v = pool();
        set(&mut v, "/metadata/name", json!(format!("pool-{i}")));
        set(
            &mut v,
            "/metadata/labels",
            json!({"tier": if i % 2 == 0 { "even" } else { "odd" }}),
        );
        create(&h, &v).await.unwrap();
    }
    let even: crate::registry::generic::Predicate<PoolSpec> = Arc::new(|p: &KVCachePool| {
        p.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("tier"))
            .map(String::as_str)
            == Some("even")
    });
    let first = h
        .reg
        .pools
        .list(
            None,
            ListOptions {
                revision: None,
                min_revision: None,
                limit: Some(2),
                continue_token: None,
                predicate: Some(even.clone()),
            },
        )
        .await
        .unwrap();
    let names = |l: &crate::registry::generic::ObjectList<PoolSpec>| {
        l.items.iter().map(|p| p.name().to_owned()).collect::<Vec<_>>()
    };
    assert_eq!(names(&first), ["pool-0", "pool-2"]);
    // A pool created between pages is not in the next page: pages share the first revision.
    let mut v = pool();
    set(&mut v, "/metadata/name", json!("pool-5a"));
    set(&mut v, "/metadata/labels", json!({"tier": "even"}));
    create(&h, &v).await.unwrap();
    let second = h
        .reg
        .pools
        .list(
            None,
            ListOptions {
                revision: None,
                min_revision: None,
                limit: Some(2),
                continue_token: first.continue_token.clone(),
                predicate: Some(even),
            },
        )
        .await
        .unwrap();
    assert_eq!(names(&second), ["pool-4", "pool-6"]);
    assert_eq!(second.resource_version, first.resource_version);
    assert!(second.continue_token.is_none(), "the last page has no continue token");
    let bad = h
        .reg
        .pools
        .list(
            None,
            ListOptions {
                revision: None,
                min_revision: None,
                limit: None,
                continue_token: Some("not-a-token".into()),
                predicate: None,
            },
        )
        .await;
    assert!(matches!(bad, Err(RegistryError::BadRequest(_))));
}
