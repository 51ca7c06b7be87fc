//! What `kv-apiserver render` prints for a set of manifests: every backend's objects and every
//! ModelDeployment's engine Pods (attached through the Binding, Pool and backend found among the
//! same manifests, as the controllers attach them once the Binding is granted), then a comment
//! for each object that renders nothing. Offline: no cluster and no stored state.

use kvcache_api::{KVCacheBackend, KVCachePool, KVCachePoolBinding, ModelDeployment};
use serde_json::Value;

use crate::config::Config;

fn yaml(v: &Value) -> Result<String, String> {
    yaml_serde::to_string(v).map_err(|e| format!("writing YAML: {e}"))
}

/// The objects for `docs` (each with where it came from), with the store's objects in
/// `namespace`; the error names the manifest that cannot be read as its kind.
pub fn render(docs: &[(String, Value)], namespace: &str, config: &Config) -> Result<String, String> {
    let typed = |kind: &'static str| docs.iter().filter(move |(_, v)| v["kind"] == kind);
    let backends: Vec<KVCacheBackend> = typed("KVCacheBackend")
        .map(|(f, v)| serde_json::from_value(v.clone()).map_err(|e| format!("{f}: a KVCacheBackend: {e}")))
        .collect::<Result<_, String>>()?;
    let pools: Vec<KVCachePool> = typed("KVCachePool")
        .map(|(f, v)| serde_json::from_value(v.clone()).map_err(|e| format!("{f}: a KVCachePool: {e}")))
        .collect::<Result<_, String>>()?;
    let bindings: Vec<KVCachePoolBinding> = typed("KVCachePoolBinding")
        .map(|(f, v)| serde_json::from_value(v.clone()).map_err(|e| format!("{f}: a KVCachePoolBinding: {e}")))
        .collect::<Result<_, String>>()?;
    let default_image = &config.settings.kv_cache_backend_image;
    let mut out = String::from(
        "# Rendered by kv-apiserver render. The controllers add owner references (with the owners'\n# UIDs) when they apply these.\n",
    );
    let mut endpoints = std::collections::BTreeMap::new();
    for backend in &backends {
        let name = backend.metadata.name.clone().unwrap_or_default();
        let Some((mut plan, _)) = crate::controller::backend::plan(&name, &backend.spec, &[]) else {
            if let Some(client) = backend.spec.external().and_then(|e| {
                e.endpoints
                    .iter()
                    .find(|p| p.name == Some(kvcache_api::backend::EndpointName::Client))
            }) {
                endpoints.insert(name.clone(), client.address.clone());
            }
            out.push_str(&format!("---\n# KVCacheBackend {name}: external, renders nothing\n"));
            continue;
        };
        plan.tenant_namespaces = crate::controller::backend::tenant_namespaces(&name, &pools, &bindings);
        endpoints.insert(
            name.clone(),
            crate::runtime::kubernetes::render::leader_address(&plan, namespace),
        );
        let target = crate::runtime::kubernetes::render::Target::for_plan(&plan, namespace, default_image)
            .map_err(|e| format!("KVCacheBackend {name}: {e}"))?;
        for object in crate::runtime::kubernetes::render::store(&plan, &target) {
            out.push_str("---\n");
            out.push_str(&yaml(&object)?);
        }
        // The token Secrets hold fresh random values, which an offline render cannot make for
        // the controllers: it says how to make them.
        use crate::runtime::kubernetes::render as k8s;
        let keys: Vec<String> = k8s::Token::ALL.iter().map(|t| t.key(&name)).collect();
        let literals: Vec<String> = keys
            .iter()
            .map(|k| format!("--from-literal={k}=$(openssl rand -hex 32)"))
            .collect();
        out.push_str(&format!(
            "---\n# KVCacheBackend {name}: its Pods mount the keys {list} of the Secret {tokens}, and its certificate\n# (keys {name}.tls.crt, {name}.tls.key, {name}.ca.crt) of the Secret {tls}, which the controllers make;\n# applied by hand, make them first, e.g.\n#   kubectl -n {namespace} create secret generic {tokens} {literals}\n",
            list = keys.join(", "),
            tokens = k8s::TOKENS_SECRET,
            tls = k8s::TLS_SECRET,
            literals = literals.join(" "),
        ));
    }
    for (file, value) in typed("ModelDeployment") {
        let md: ModelDeployment =
            serde_json::from_value(value.clone()).map_err(|e| format!("{file}: a ModelDeployment: {e}"))?;
        let (ns, name) = (
            md.metadata.namespace.clone().unwrap_or_else(|| "default".into()),
            md.metadata.name.clone().unwrap_or_default(),
        );
        // Attached as the controllers would attach it once its Binding is granted.
        let connection = md.spec.binding_name().and_then(|b| {
            let binding = bindings.iter().find(|x| {
                x.metadata.name.as_deref() == Some(b) && x.metadata.namespace.as_deref().unwrap_or("default") == ns
            })?;
            let pool = pools
                .iter()
                .find(|p| p.metadata.name.as_deref() == Some(binding.spec.pool_name()))?;
            let backend_name = pool.spec.backend()?;
            let endpoint = endpoints.get(backend_name)?.clone();
            let backend = backends
                .iter()
                .find(|b| b.metadata.name.as_deref() == Some(backend_name))?;
            let domain = binding.spec.domain.clone().unwrap_or_default();
            Some(crate::controller::injection::Connection {
                endpoint,
                store: crate::controller::injection::StoreKind::of(&backend.spec, default_image),
                tenant: Some(binding.spec.domain_name().to_owned()),
                block_size: domain.block_size.unwrap_or(0),
                dtype: domain.dtype.unwrap_or_default(),
                protocol: "tcp".into(),
                // minted by the Binding controller into a Secret when the controllers run;
                // offline there is none to reference
                credential: None,
                // likewise the store's CA, which the runtime keeps in the cluster's Secret
                tls: None,
            })
        });
        if md.spec.binding_name().is_some() && connection.is_none() {
            out.push_str(&format!(
                "---\n# ModelDeployment {ns}/{name}: its Binding, Pool or backend is not in these files; rendered without a cache\n"
            ));
        }
        let plan = crate::runtime::ReplicaPlan {
            owner: format!("{ns}/{name}"),
            uid: String::new(),
            replicas: crate::controller::model_deployment::replicas(&md, connection.as_ref(), config),
            hold_rollout: false,
        };
        for r in &plan.replicas {
            match &r.engine.image {
                Ok(image) => {
                    out.push_str("---\n");
                    out.push_str(&yaml(&crate::runtime::kubernetes::engine_pod::engine_pod(
                        &plan, r, image,
                    ))?);
                }
                Err(why) => out.push_str(&format!(
                    "---\n# ModelDeployment {ns}/{name} replica {}: {why}\n",
                    r.name
                )),
            }
        }
    }
    for (_, value) in typed("KVCachePool").chain(typed("KVCachePoolBinding")) {
        out.push_str(&format!(
            "---\n# {} {}: renders no workload (Pools and Bindings are entries in the store's tenant ledger)\n",
            value["kind"].as_str().unwrap_or_default(),
            value["metadata"]["name"].as_str().unwrap_or_default()
        ));
    }
    Ok(out)
}
