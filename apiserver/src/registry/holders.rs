//! What holds an object's deletion, read from storage: the pools that name a backend, the
//! Bindings that name a pool, the ModelDeployments that attach through a Binding. One reading for
//! the DELETE that answers with a warning naming them, for the admission that refuses a new
//! dependent of an object being deleted, and (through `controller::shared`) for the conditions
//! a held deletion reports, all in the one "held by …; delete them first" wording.

use kvcache_api::binding::BindingSpec;
use kvcache_api::common::UsedBy;
use kvcache_api::model_deployment::ModelDeploymentSpec;
use kvcache_api::pool::PoolSpec;
use kvcache_api::{Kind, Object};

use super::{RegistryError, decode};
use crate::storage::{ListRequest, Storage, keys};

/// Names listed in a message before "and N more".
const MAX_NAMES: usize = 20;

/// `a, b and 3 more`.
pub fn names(names: &[String]) -> String {
    let shown = names.iter().take(MAX_NAMES).cloned().collect::<Vec<_>>().join(", ");
    if names.len() > MAX_NAMES {
        format!("{shown} and {} more", names.len() - MAX_NAMES)
    } else {
        shown
    }
}

/// Why a deletion waits: `held by KIND/NAME, …; delete them first, then this WHAT's deletion
/// completes`, a namespaced holder as `KIND/NAMESPACE/NAME`.
pub fn held_by(used_by: &[UsedBy], what: &str) -> String {
    let named: Vec<String> = used_by
        .iter()
        .map(|u| match u.namespace.as_str() {
            "" => format!("{}/{}", u.kind, u.name),
            ns => format!("{}/{ns}/{}", u.kind, u.name),
        })
        .collect();
    format!(
        "held by {}; delete them first, then this {what}'s deletion completes",
        names(&named)
    )
}

/// The warning a DELETE answers with while `holders` keep the object `KIND "name"` (a `what`
/// in messages): what holds it, what to delete first, and why kubectl waits.
pub fn delete_warning(kind: &str, name: &str, what: &str, holders: &[UsedBy]) -> String {
    format!(
        "{kind} {name:?} is marked for deletion but {}; kubectl waits until then (--wait=false returns at once)",
        held_by(holders, what)
    )
}

/// Why a new object may not name `KIND "name"`: it is being deleted, and a new dependent would
/// hold that deletion for as long as it lives.
pub fn deleting_reference(kind: &str, name: &str, dependent: &str) -> String {
    format!(
        "{kind} {name:?} is being deleted: a new {dependent} naming it would hold its deletion; name another, or create this {dependent} once {name:?} is gone and created again"
    )
}

/// Whether `obj` is being deleted.
pub fn is_deleting<K: Kind>(obj: &Object<K>) -> bool {
    obj.metadata.deletion_timestamp.is_some()
}

/// Every object of kind `K` (in `namespace`, or everywhere) that `names_it` keeps, as holders.
async fn holders_of<K: Kind>(
    storage: &dyn Storage,
    namespace: Option<&str>,
    names_it: impl Fn(&Object<K>) -> bool,
) -> Result<Vec<UsedBy>, RegistryError> {
    let page = storage
        .list(ListRequest {
            prefix: keys::list_prefix::<K>(namespace),
            ..Default::default()
        })
        .await?;
    let mut out = Vec::new();
    for kv in &page.items {
        let obj = decode::<K>(kv)?;
        if names_it(&obj) {
            out.push(UsedBy {
                kind: K::KIND.into(),
                namespace: if namespace.is_some() {
                    String::new()
                } else {
                    obj.namespace().to_owned()
                },
                name: obj.name().to_owned(),
            });
        }
    }
    out.sort();
    Ok(out)
}

/// The pools that name the backend `name`.
pub async fn of_backend(storage: &dyn Storage, name: &str) -> Result<Vec<UsedBy>, RegistryError> {
    holders_of::<PoolSpec>(storage, None, |p| p.spec.backend() == Some(name)).await
}

/// The Bindings (of every namespace) that name the pool `name`.
pub async fn of_pool(storage: &dyn Storage, name: &str) -> Result<Vec<UsedBy>, RegistryError> {
    holders_of::<BindingSpec>(storage, None, |b| b.spec.pool_name() == name).await
}

/// The ModelDeployments of `namespace` that attach through the Binding `name`.
pub async fn of_binding(storage: &dyn Storage, namespace: &str, name: &str) -> Result<Vec<UsedBy>, RegistryError> {
    holders_of::<ModelDeploymentSpec>(storage, Some(namespace), |m| m.spec.binding_name() == Some(name)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u(kind: &str, ns: &str, name: &str) -> UsedBy {
        UsedBy {
            kind: kind.into(),
            namespace: ns.into(),
            name: name.into(),
        }
    }

    #[test]
    fn a_hold_names_its_holders_and_what_to_do() {
        assert_eq!(
            held_by(
                &[u("KVCachePoolBinding", "team-a", "b"), u("KVCachePool", "", "p")],
                "pool"
            ),
            "held by KVCachePoolBinding/team-a/b, KVCachePool/p; delete them first, then this pool's deletion completes"
        );
        let many: Vec<String> = (0..25).map(|i| i.to_string()).collect();
        assert!(names(&many).ends_with("19 and 5 more"));
    }

    #[test]
    fn the_delete_warning_says_what_holds_it_and_why_kubectl_waits() {
        assert_eq!(
            delete_warning(
                "KVCacheBackend",
                "mooncake-dram",
                "backend",
                &[u("KVCachePool", "", "shared-dram")]
            ),
            "KVCacheBackend \"mooncake-dram\" is marked for deletion but held by KVCachePool/shared-dram; delete them \
             first, then this backend's deletion completes; kubectl waits until then (--wait=false returns at once)"
        );
    }

    /// A held object's DELETE names what holds it, and a new dependent of an object being
    /// deleted is refused at the field that names it; an object nothing holds warns of nothing.
    #[tokio::test]
    async fn held_deletions_warn_and_their_new_dependents_are_refused() {
        use serde_json::json;

        use crate::field::ErrorType::Forbidden;
        use crate::registry::generic::{DeleteOptions, Deleted, WriteOptions};
        use crate::registry::testing::{Expect, Harness, check, decode};

        let h = Harness::new();
        let r = &h.reg;
        let w = WriteOptions::default();
        let held = json!({"finalizers": ["gpustack.ai/controlled"]});
        let meta = |name: &str, ns: Option<&str>| {
            let mut m = held.clone();
            m["name"] = json!(name);
            if let Some(ns) = ns {
                m["namespace"] = json!(ns);
            }
            m
        };
        let backend = json!({"apiVersion": "worker.gpustack.ai/v1", "kind": "KVCacheBackend", "metadata": meta("b", None),
            "spec": {"connection": {"managed": {"leader": {}, "members": [{"nodeSelector": {}, "medium": "DRAM", "capacityPerMember": "8Gi"}]}}}});
        let pool = |name: &str| {
            json!({"apiVersion": "worker.gpustack.ai/v1", "kind": "KVCachePool", "metadata": meta(name, None),
            "spec": {"backends": ["b"], "quota": {"total": "16Gi"}}})
        };
        let binding = |name: &str| {
            json!({"apiVersion": "worker.gpustack.ai/v1", "kind": "KVCachePoolBinding", "metadata": meta(name, Some("team-a")),
            "spec": {"poolRef": {"name": "p"}, "quota": {"ceiling": "8Gi"}, "domain": {"name": name, "blockSize": 64, "dtype": "bfloat16"}}})
        };
        let md = |name: &str| {
            json!({"apiVersion": "worker.gpustack.ai/v1", "kind": "ModelDeployment", "metadata": meta(name, Some("team-a")),
            "spec": {"model": {"name": "m"}, "engine": {"name": "vLLM", "version": "0.29.0"}, "kvCache": {"poolRef": {"name": "t"}},
                     "roles": [{"name": "server", "instanceType": "local-small"}]}})
        };
        r.backends.create("", decode(&backend).unwrap(), w).await.unwrap();
        r.pools.create("", decode(&pool("p")).unwrap(), w).await.unwrap();
        r.bindings
            .create("team-a", decode(&binding("t")).unwrap(), w)
            .await
            .unwrap();
        r.model_deployments
            .create("team-a", decode(&md("m")).unwrap(), w)
            .await
            .unwrap();

        let Deleted::Pending(b) = r.backends.delete("", "b", DeleteOptions::default()).await.unwrap() else {
            panic!("the finalizer holds the backend");
        };
        assert_eq!(
            r.backends.warnings_on_delete(&b).await.unwrap(),
            [delete_warning(
                "KVCacheBackend",
                "b",
                "backend",
                &[u("KVCachePool", "", "p")]
            )]
        );
        let Deleted::Pending(p) = r.pools.delete("", "p", DeleteOptions::default()).await.unwrap() else {
            panic!("the finalizer holds the pool");
        };
        let warned = r.pools.warnings_on_delete(&p).await.unwrap();
        assert!(warned[0].contains("held by KVCachePoolBinding/team-a/t;"), "{warned:?}");
        let Deleted::Pending(t) = r
            .bindings
            .delete("team-a", "t", DeleteOptions::default())
            .await
            .unwrap()
        else {
            panic!("the finalizer holds the Binding");
        };
        let warned = r.bindings.warnings_on_delete(&t).await.unwrap();
        assert!(warned[0].contains("held by ModelDeployment/m;"), "{warned:?}");
        let Deleted::Pending(m) = r
            .model_deployments
            .delete("team-a", "m", DeleteOptions::default())
            .await
            .unwrap()
        else {
            panic!("the finalizer holds the deployment");
        };
        assert!(r.model_deployments.warnings_on_delete(&m).await.unwrap().is_empty());

        let msg = check(
            "a pool naming a deleting backend",
            r.pools
                .create("", decode(&pool("p2")).unwrap(), w)
                .await
                .map(|x| (x.object, x.warnings)),
            Expect::Refused(Forbidden, "spec.backends[0]"),
        );
        assert!(msg.contains("KVCacheBackend \"b\" is being deleted"), "{msg}");
        check(
            "a Binding naming a deleting pool",
            r.bindings
                .create("team-a", decode(&binding("t2")).unwrap(), w)
                .await
                .map(|x| (x.object, x.warnings)),
            Expect::Refused(Forbidden, "spec.poolRef.name"),
        );
        check(
            "a deployment naming a deleting Binding",
            r.model_deployments
                .create("team-a", decode(&md("m2")).unwrap(), w)
                .await
                .map(|x| (x.object, x.warnings)),
            Expect::Refused(Forbidden, "spec.kvCache.poolRef.name"),
        );
        // The held objects themselves stay editable: their references are not re-judged.
        let mut p = r.pools.get("", "p").await.unwrap();
        p.spec.quota.as_mut().unwrap().total = Some("8Gi".into());
        r.pools
            .update("", "p", p, w)
            .await
            .expect("a deleting pool's quota edit");
    }
}
