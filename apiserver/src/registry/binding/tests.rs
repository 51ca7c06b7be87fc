//! Admission table of `KVCachePoolBinding`: on create, `poolRef`, the domain's name, block size and
//! dtype, and the quota ceiling against the pool's total; each domain name (`default` when
//! omitted) claimed once per backend, and one domain only on a backend without a tenant ledger;
//! on update, the fields that never change (`poolRef`, the domain) and the ceiling; and the domain
//! claims under concurrency.

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kvcache_api::binding::{BindingSpec, KVCachePoolBinding};
use kvcache_api::pool::{PoolSpec, PoolStatus};
use serde_json::{Value, json};

use crate::config::{Config, Settings};
use crate::field::ErrorType::*;
use crate::registry::generic::{DeleteOptions, Deleted, WriteOptions};
use crate::registry::testing::{Expect, Harness, check, decode, registries, remove, render_refuses_alike, set};
use crate::registry::{RegistryError, meta};

type Edit = fn(&mut Value);

fn binding(ns: &str, name: &str, pool: &str, domain: Option<&str>) -> Value {
    let mut d = json!({"blockSize": 64, "dtype": "bfloat16"});
    if let Some(n) = domain {
        d["name"] = json!(n);
    }
    json!({"apiVersion": "worker.gpustack.ai/v1", "kind": "KVCachePoolBinding",
           "metadata": {"name": name, "namespace": ns},
           "spec": {"poolRef": {"name": pool}, "quota": {"ceiling": "8Gi"}, "domain": d}})
}

fn backend(name: &str, multi_tenancy: bool) -> Value {
    json!({"apiVersion": "worker.gpustack.ai/v1", "kind": "KVCacheBackend", "metadata": {"name": name},
           "spec": {"connection": {"managed": {"leader": {"multiTenancy": multi_tenancy},
                    "members": [{"nodeSelector": {}, "medium": "DRAM", "capacityPerMember": "8Gi"}]}}}})
}

fn pool(name: &str, backend: &str) -> Value {
    json!({"apiVersion": "worker.gpustack.ai/v1", "kind": "KVCachePool", "metadata": {"name": name},
           "spec": {"backends": [backend], "quota": {"total": "16Gi"}}})
}

/// Backends `b1` (multi-tenant), `b2`, `single` (no ledger); pools `p1` and `p1b` on `b1`, `p2`
/// on `b2`, `psingle` on `single`.
/// What [`world`] creates, as manifests.
fn world_objects() -> Vec<Value> {
    let backends = [("b1", true), ("b2", true), ("single", false)].map(|(name, mt)| backend(name, mt));
    let pools = [("p1", "b1"), ("p1b", "b1"), ("p2", "b2"), ("psingle", "single")].map(|(name, b)| pool(name, b));
    backends.into_iter().chain(pools).collect()
}

async fn world(h: &Harness) {
    for (name, mt) in [("b1", true), ("b2", true), ("single", false)] {
        let b = decode::<kvcache_api::backend::BackendSpec>(&backend(name, mt)).unwrap();
        h.reg.backends.create("", b, WriteOptions::default()).await.unwrap();
    }
    for (name, b) in [("p1", "b1"), ("p1b", "b1"), ("p2", "b2"), ("psingle", "single")] {
        create_pool(h, name, b).await;
    }
}

async fn create_pool(h: &Harness, name: &str, backend: &str) {
    let p = decode::<PoolSpec>(&pool(name, backend)).unwrap();
    h.reg.pools.create("", p, WriteOptions::default()).await.unwrap();
}

async fn create(h: &Harness, v: &Value) -> Result<(KVCachePoolBinding, Vec<String>), RegistryError> {
    let obj = decode::<BindingSpec>(v)?;
    let ns = obj.namespace().to_owned();
    h.reg
        .bindings
        .create(&ns, obj, WriteOptions::default())
        .await
        .map(|w| (w.object, w.warnings))
}

async fn update(h: &Harness, b: KVCachePoolBinding) -> Result<(KVCachePoolBinding, Vec<String>), RegistryError> {
    let (ns, name) = (b.namespace().to_owned(), b.name().to_owned());
    h.reg
        .bindings
        .update(&ns, &name, b, WriteOptions::default())
        .await
        .map(|w| (w.object, w.warnings))
}

fn create_cases() -> Vec<(&'static str, Edit, Expect)> {
    vec![
        ("walkthrough binding", |_| {}, Expect::Admitted),
        (
            "empty poolRef",
            |v| set(v, "/spec/poolRef/name", json!("")),
            Expect::Refused(Required, "spec.poolRef.name"),
        ),
        (
            "poolRef missing",
            |v| remove(v, "/spec/poolRef"),
            Expect::Refused(Required, "spec.poolRef.name"),
        ),
        (
            "pool that does not exist yet",
            |v| set(v, "/spec/poolRef/name", json!("later")),
            Expect::Warned("does not exist yet"),
        ),
        (
            "domain team_a",
            |v| set(v, "/spec/domain/name", json!("team_a")),
            Expect::Refused(Invalid, "spec.domain.name"),
        ),
        (
            "domain Team-A",
            |v| set(v, "/spec/domain/name", json!("Team-A")),
            Expect::Refused(Invalid, "spec.domain.name"),
        ),
        (
            "domain _internal",
            |v| set(v, "/spec/domain/name", json!("_internal")),
            Expect::Refused(Invalid, "spec.domain.name"),
        ),
        (
            "domain of 64 characters",
            |v| set(v, "/spec/domain/name", json!("a".repeat(64))),
            Expect::Refused(Invalid, "spec.domain.name"),
        ),
        (
            "domain with a control character",
            |v| set(v, "/spec/domain/name", json!("a\u{1}b")),
            Expect::Refused(Invalid, "spec.domain.name"),
        ),
        (
            "domain missing",
            |v| remove(v, "/spec/domain"),
            Expect::Refused(Required, "spec.domain"),
        ),
        (
            "blockSize 0",
            |v| set(v, "/spec/domain/blockSize", json!(0)),
            Expect::Refused(Invalid, "spec.domain.blockSize"),
        ),
        (
            "blockSize -16",
            |v| set(v, "/spec/domain/blockSize", json!(-16)),
            Expect::Refused(Invalid, "spec.domain.blockSize"),
        ),
        (
            "blockSize missing",
            |v| remove(v, "/spec/domain/blockSize"),
            Expect::Refused(Required, "spec.domain.blockSize"),
        ),
        (
            "blockSize as a string",
            |v| set(v, "/spec/domain/blockSize", json!("64")),
            Expect::Refused(TypeInvalid, "spec.domain.blockSize"),
        ),
        (
            "dtype empty",
            |v| set(v, "/spec/domain/dtype", json!("")),
            Expect::Refused(Required, "spec.domain.dtype"),
        ),
        (
            "dtype BFloat16",
            |v| set(v, "/spec/domain/dtype", json!("BFloat16")),
            Expect::Refused(Invalid, "spec.domain.dtype"),
        ),
        (
            "dtype longer than 32",
            |v| set(v, "/spec/domain/dtype", json!("f".repeat(33))),
            Expect::Refused(TooLong, "spec.domain.dtype"),
        ),
        (
            "dtype fp4_e2m1 (not enumerated)",
            |v| set(v, "/spec/domain/dtype", json!("fp4_e2m1")),
            Expect::Admitted,
        ),
        (
            "dtype auto while engines take the dtype",
            |v| set(v, "/spec/domain/dtype", json!("auto")),
            Expect::Refused(Invalid, "spec.domain.dtype"),
        ),
        (
            "ceiling 0",
            |v| set(v, "/spec/quota/ceiling", json!("0")),
            Expect::Refused(Invalid, "spec.quota.ceiling"),
        ),
        (
            "ceiling past int64",
            |v| set(v, "/spec/quota/ceiling", json!("10Ei")),
            Expect::Refused(Invalid, "spec.quota.ceiling"),
        ),
        (
            "ceiling equal to the pool's total",
            |v| set(v, "/spec/quota/ceiling", json!("16Gi")),
            Expect::Admitted,
        ),
        (
            "ceiling above the pool's total",
            |v| set(v, "/spec/quota/ceiling", json!("17Gi")),
            Expect::Refused(Invalid, "spec.quota.ceiling"),
        ),
        (
            "ceiling missing",
            |v| remove(v, "/spec/quota"),
            Expect::Refused(Required, "spec.quota.ceiling"),
        ),
        (
            "poolRef with a namespace",
            |v| set(v, "/spec/poolRef/namespace", json!("x")),
            Expect::BadRequest(r#"unknown field "spec.poolRef.namespace""#),
        ),
        (
            "flat quotaCeiling (old shape)",
            |v| set(v, "/spec/quotaCeiling", json!("8Gi")),
            Expect::BadRequest(r#"unknown field "spec.quotaCeiling""#),
        ),
    ]
}

#[tokio::test]
async fn create_admission_table() {
    for (name, edit, expect) in create_cases() {
        let h = Harness::new();
        world(&h).await;
        let mut v = binding("team-a", "team-a", "p1", None);
        edit(&mut v);
        let result = create(&h, &v).await;
        if let Err(e) = &result {
            render_refuses_alike(name, &world_objects(), &v, e).await;
        }
        let msg = check(name, result, expect);
        if name == "ceiling above the pool's total" {
            assert!(msg.contains("16Gi"), "names the pool's total: {msg}");
        }
    }
}

#[tokio::test]
async fn dtype_auto_is_accepted_when_engines_do_not_take_the_dtype() {
    let h = Harness::with_config(Config {
        settings: Settings {
            model_deployment_kv_cache_dtype_owned: false,
            ..Default::default()
        },
        ..Default::default()
    });
    world(&h).await;
    let mut v = binding("team-a", "a", "p1", None);
    set(&mut v, "/spec/domain/dtype", json!("auto"));
    let (b, _) = create(&h, &v).await.unwrap();
    // The setting is turned on later: the stored Binding stays updatable.
    let on = registries(h.storage.clone(), Config::default());
    let mut raised = b.clone();
    raised.spec.quota.as_mut().unwrap().ceiling = Some("9Gi".into());
    on.bindings
        .update("team-a", "a", raised, WriteOptions::default())
        .await
        .expect("ceiling edit of a stored auto");
}

#[tokio::test]
async fn omitted_domain_is_default_and_claimed_like_any_other() {
    let h = Harness::new();
    world(&h).await;
    let (a, _) = create(&h, &binding("team-a", "a", "p1", None)).await.unwrap();
    assert_eq!(a.spec.domain.as_ref().unwrap().name.as_deref(), Some("default"));
    let msg = check(
        "second default on the same backend",
        create(&h, &binding("team-b", "b", "p1b", None)).await,
        Expect::Refused(Duplicate, "spec.domain.name"),
    );
    assert!(
        msg.contains("team-a/a") && msg.contains("\"b1\""),
        "names the holder and the backend: {msg}"
    );
    check(
        "same domain on another backend",
        create(&h, &binding("team-b", "b", "p2", None)).await,
        Expect::Admitted,
    );
}

#[tokio::test]
async fn second_distinct_domain_needs_a_ledger() {
    let h = Harness::new();
    world(&h).await;
    create(&h, &binding("team-a", "a", "psingle", Some("one")))
        .await
        .unwrap();
    let refused = create(&h, &binding("team-b", "b", "psingle", Some("two"))).await;
    let msg = check(
        "second domain on a ledger-less backend",
        refused,
        Expect::Refused(Invalid, "spec.domain.name"),
    );
    assert!(
        msg.contains("\"one\"") && msg.contains("team-a/a") && msg.contains("single"),
        "{msg}"
    );

    create(&h, &binding("team-a", "a2", "p1", Some("one"))).await.unwrap();
    let admitted = create(&h, &binding("team-b", "b2", "p1", Some("two"))).await;
    let (_, warnings) = admitted.expect("second domain on a multi-tenant backend");
    assert!(
        !warnings.iter().any(|w| w.contains("second domain")),
        "the ledger keeps them apart: no warning {warnings:?}"
    );
    // A backend that does not exist yet: nobody knows whether it will keep a ledger.
    create_pool(&h, "pghost", "ghost").await;
    create(&h, &binding("team-a", "g1", "pghost", Some("one")))
        .await
        .unwrap();
    check(
        "second domain on a backend not known yet",
        create(&h, &binding("team-b", "g2", "pghost", Some("two"))).await,
        Expect::Warned("whether that backend keeps a tenant ledger is not known yet"),
    );

    // An observed answer wins over the declaration: a pool that saw no ledger.
    let mut p = h.reg.pools.get("", "p2").await.unwrap();
    p.status = Some(PoolStatus {
        conditions: vec![Condition {
            type_: "QuotaLedgerAvailable".into(),
            status: "False".into(),
            reason: "MultiTenancyDisabled".into(),
            message: String::new(),
            last_transition_time: meta::now(),
            observed_generation: None,
        }],
        ..Default::default()
    });
    h.reg
        .pools
        .update_status("", "p2", p, WriteOptions::default())
        .await
        .unwrap();
    create(&h, &binding("team-a", "c", "p2", Some("one"))).await.unwrap();
    let r = create(&h, &binding("team-b", "d", "p2", Some("two"))).await;
    check(
        "observed ledger-less master",
        r,
        Expect::Refused(Invalid, "spec.domain.name"),
    );
}

#[tokio::test]
async fn concurrent_creates_of_one_domain_admit_exactly_one() {
    let h = Harness::new();
    world(&h).await;
    let reg = Arc::new(h);
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let h = reg.clone();
            tokio::spawn(async move {
                let pool = if i % 2 == 0 { "p1" } else { "p1b" };
                create(&h, &binding(&format!("ns-{i}"), "x", pool, Some("shared"))).await
            })
        })
        .collect();
    let mut ok = Vec::new();
    let mut refused = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            Ok((b, _)) => ok.push(b),
            Err(RegistryError::Invalid { errors, .. }) => refused.push(errors.to_string()),
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(ok.len(), 1, "exactly one Binding holds the domain");
    let holder = format!("{}/x", ok[0].namespace());
    assert_eq!(refused.len(), 15);
    assert!(
        refused.iter().all(|m| m.contains(&holder) && m.contains("Duplicate")),
        "{refused:?}"
    );
}

#[tokio::test]
async fn claims_follow_the_bindings_life() {
    let h = Harness::new();
    world(&h).await;
    let (a, _) = create(&h, &binding("team-a", "a", "p1", Some("shared"))).await.unwrap();
    // Re-admitting the holder (any update) never collides with itself.
    let mut relabeled = a.clone();
    relabeled.metadata.labels = Some([("x".to_string(), "y".to_string())].into());
    let (a, _) = update(&h, relabeled).await.unwrap();
    // Deleting the holder releases the domain.
    assert!(matches!(
        h.reg
            .bindings
            .delete("team-a", "a", DeleteOptions::default())
            .await
            .unwrap(),
        Deleted::Gone(_)
    ));
    let _ = a;
    create(&h, &binding("team-b", "b", "p1b", Some("shared")))
        .await
        .expect("domain free again");

    // A Binding created before its pool claims the domain on its first write after the pool
    // exists; whoever claims first wins.
    create(&h, &binding("team-c", "c", "p3", Some("late"))).await.unwrap();
    create(&h, &binding("team-d", "d", "p3", Some("late"))).await.unwrap();
    create_pool(&h, "p3", "b2").await;
    let c = h.reg.bindings.get("team-c", "c").await.unwrap();
    let mut touched = c.clone();
    touched.metadata.labels = Some([("touch".to_string(), "1".to_string())].into());
    update(&h, touched).await.unwrap();
    let d = h.reg.bindings.get("team-d", "d").await.unwrap();
    let mut touched = d.clone();
    touched.metadata.labels = Some([("touch".to_string(), "1".to_string())].into());
    let (_, warnings) = update(&h, touched).await.unwrap();
    assert!(
        warnings.iter().any(|w| w.contains("team-c/c")),
        "the loser is told who holds it: {warnings:?}"
    );
    check(
        "a new Binding for the claimed domain",
        create(&h, &binding("team-e", "e", "p3", Some("late"))).await,
        Expect::Refused(Duplicate, "spec.domain.name"),
    );
}

#[tokio::test]
async fn domain_and_pool_are_immutable() {
    let h = Harness::new();
    world(&h).await;
    let (b, _) = create(&h, &binding("team-a", "a", "p1", Some("dom"))).await.unwrap();
    type Case = (&'static str, fn(&mut KVCachePoolBinding), &'static str);
    let cases: Vec<Case> = vec![
        (
            "poolRef",
            |b| b.spec.pool_ref.as_mut().unwrap().name = "p1b".into(),
            "spec.poolRef.name",
        ),
        (
            "domain name",
            |b| b.spec.domain.as_mut().unwrap().name = Some("other".into()),
            "spec.domain.name",
        ),
        (
            "block size",
            |b| b.spec.domain.as_mut().unwrap().block_size = Some(128),
            "spec.domain.blockSize",
        ),
        (
            "dtype",
            |b| b.spec.domain.as_mut().unwrap().dtype = Some("fp8_e4m3".into()),
            "spec.domain.dtype",
        ),
    ];
    for (name, edit, field) in &cases {
        let mut changed = b.clone();
        edit(&mut changed);
        check(name, update(&h, changed).await, Expect::Refused(Forbidden, field));
    }
    // Several at once: each reported on its own path.
    let mut all = b.clone();
    for (_, edit, _) in &cases {
        edit(&mut all);
    }
    let Err(RegistryError::Invalid { errors, .. }) = update(&h, all).await else {
        panic!()
    };
    let forbidden = errors.iter().filter(|e| e.kind == Forbidden).count();
    assert_eq!(forbidden, 4, "{errors}");

    // Still immutable while the Binding is being deleted.
    let mut held = b.clone();
    held.metadata.finalizers = Some(vec!["worker.gpustack.ai/kv-cache-pool-binding".into()]);
    let (b, _) = update(&h, held).await.unwrap();
    h.reg
        .bindings
        .delete("team-a", "a", DeleteOptions::default())
        .await
        .unwrap();
    let deleting = h.reg.bindings.get("team-a", "a").await.unwrap();
    assert!(deleting.metadata.deletion_timestamp.is_some());
    let mut renamed = deleting.clone();
    renamed.spec.domain.as_mut().unwrap().name = Some("other".into());
    check(
        "rename while deleting",
        update(&h, renamed).await,
        Expect::Refused(Forbidden, "spec.domain.name"),
    );
    let _ = b;
}

#[tokio::test]
async fn ceiling_is_checked_against_the_pool_only_when_it_moves() {
    let h = Harness::new();
    world(&h).await;
    let (b, _) = create(&h, &binding("team-a", "a", "p1", None)).await.unwrap();
    let mut too_big = b.clone();
    too_big.spec.quota.as_mut().unwrap().ceiling = Some("32Gi".into());
    check(
        "raise past the pool",
        update(&h, too_big).await,
        Expect::Refused(Invalid, "spec.quota.ceiling"),
    );
    // The pool shrinks below the ceiling; an unrelated edit is not re-judged.
    let mut p = h.reg.pools.get("", "p1").await.unwrap();
    p.spec.quota.as_mut().unwrap().total = Some("4Gi".into());
    h.reg.pools.update("", "p1", p, WriteOptions::default()).await.unwrap();
    let mut respelled = b.clone();
    respelled.spec.quota.as_mut().unwrap().ceiling = Some("8192Mi".into());
    check(
        "same ceiling, other spelling",
        update(&h, respelled).await,
        Expect::Admitted,
    );
    // With the pool and backend gone, the finalizer can still be removed.
    let mut held = h.reg.bindings.get("team-a", "a").await.unwrap();
    held.metadata.finalizers = Some(vec!["worker.gpustack.ai/kv-cache-pool-binding".into()]);
    update(&h, held).await.unwrap();
    h.reg
        .bindings
        .delete("team-a", "a", DeleteOptions::default())
        .await
        .unwrap();
    h.reg.pools.delete("", "p1", DeleteOptions::default()).await.unwrap();
    h.reg.backends.delete("", "b1", DeleteOptions::default()).await.unwrap();
    let mut done = h.reg.bindings.get("team-a", "a").await.unwrap();
    done.metadata.finalizers = Some(vec![]);
    update(&h, done)
        .await
        .expect("finalizer removal with pool and backend gone");
    assert!(matches!(
        h.reg.bindings.get("team-a", "a").await,
        Err(RegistryError::NotFound { .. })
    ));
}

#[tokio::test]
async fn a_refused_create_carries_no_warning_and_stores_nothing() {
    let h = Harness::new();
    world(&h).await;
    create(&h, &binding("team-a", "a", "p1", Some("one"))).await.unwrap();
    let mut v = binding("team-b", "b", "p1", Some("two"));
    set(&mut v, "/spec/quota/ceiling", json!("17Gi"));
    assert!(matches!(create(&h, &v).await, Err(RegistryError::Invalid { .. })));
    assert!(matches!(
        h.reg.bindings.get("team-b", "b").await,
        Err(RegistryError::NotFound { .. })
    ));
    // The refused Binding claimed nothing: the domain is free.
    create(&h, &binding("team-c", "c", "p1", Some("two")))
        .await
        .expect("domain two is free");
}
