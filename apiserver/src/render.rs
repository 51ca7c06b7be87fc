//! What `kv-apiserver render` prints for a set of manifests: every backend's objects and every
//! ModelDeployment's engine Pods, and its router's objects when it declares one (attached through the Binding, Pool and backend found among the
//! same manifests, as the controllers attach them once the Binding is granted), then a comment
//! for each object that renders nothing. Offline: no cluster and no stored state.
//!
//! Every object is first admitted as the server admits it ([`admit`]): created, in the order the
//! kinds name each other, in a scratch storage through the server's own registry, so defaults,
//! validation, the cross-object rules and the "not supported yet" refusals are the server's, and
//! what renders is the object as the server would store it. One refusal renders nothing.

use std::sync::Arc;

use kvcache_api::{KVCacheBackend, KVCachePool, KVCachePoolBinding, ModelDeployment};
use serde_json::Value;

use crate::config::Config;
use crate::decode::bounded::Parsed;
use crate::manifest::{self, ApplyError};
use crate::registry::kinds;

/// Kinds in the order they name each other (a pool names its backend, a Binding its pool, a
/// deployment its Binding).
const ADMISSION_ORDER: [&str; 4] = ["KVCacheBackend", "KVCachePool", "KVCachePoolBinding", "ModelDeployment"];

/// `docs` (each with the file it came from) admitted as the server would create them, in a
/// scratch storage: the objects as stored, or every refusal in kubectl's words (`Error from
/// server (Invalid): error when applying <file>: <message>`).
pub async fn admit(mut docs: Vec<(String, Parsed)>, config: &Config) -> Result<Vec<(String, Value)>, Vec<String>> {
    let scratch = tempfile::tempdir().map_err(|e| vec![format!("error: a scratch directory for admission: {e}")])?;
    let options = crate::storage::embedded::Options {
        initial_file_bytes: 64 << 10,
        ..crate::storage::embedded::Options::default()
    };
    let storage: Arc<dyn crate::storage::Storage> = Arc::new(
        crate::storage::embedded::Embedded::open(scratch.path(), options)
            .map_err(|e| vec![format!("error: a scratch storage for admission: {e}")])?,
    );
    let registry = crate::registry::Registry::new(
        storage,
        crate::registry::Context {
            config: crate::config::Live::new(config.clone()),
        },
    );
    let rank = |v: &Value| {
        let kind = v["kind"].as_str().unwrap_or_default();
        ADMISSION_ORDER
            .iter()
            .position(|k| *k == kind)
            .unwrap_or(ADMISSION_ORDER.len())
    };
    docs.sort_by_key(|(_, d)| rank(&d.value));
    let (mut admitted, mut refused) = (Vec::new(), Vec::new());
    for (file, doc) in docs {
        let (kind, name) = (doc.value["kind"].clone(), doc.value["metadata"]["name"].clone());
        let namespace = doc.value["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_owned();
        let applied = manifest::apply(&registry, doc, &namespace, false).await;
        match applied.result {
            Ok(_) => {
                let stored = match kinds::by_kind(kind.as_str().unwrap_or_default())
                    .and_then(|k| registry.resource(k.plural).map(|(k, r)| (k, r.clone())))
                {
                    Some((entry, resource)) => {
                        let ns = if entry.namespaced() { namespace.as_str() } else { "" };
                        resource.get(ns, name.as_str().unwrap_or_default()).await.ok()
                    }
                    None => None,
                };
                match stored {
                    Some(v) => admitted.push((file, v)),
                    None => refused.push(format!(
                        "error: {file}: {} was admitted but cannot be read back",
                        applied.object
                    )),
                }
            }
            Err(ApplyError::Refused { status, .. }) => refused.push(format!(
                "Error from server ({}): error when applying {file}: {}",
                status.reason.as_deref().unwrap_or_default(),
                status.message.as_deref().unwrap_or_default()
            )),
            Err(e) => refused.push(format!("error: {file}: {e}")),
        }
    }
    if refused.is_empty() { Ok(admitted) } else { Err(refused) }
}

fn yaml(v: &Value) -> Result<String, String> {
    yaml_serde::to_string(v).map_err(|e| format!("writing YAML: {e}"))
}

/// The manifests' objects by kind (the deployments as they came, each with its file).
struct Objects<'a> {
    backends: Vec<KVCacheBackend>,
    pools: Vec<KVCachePool>,
    bindings: Vec<KVCachePoolBinding>,
    deployments: Vec<(&'a str, &'a Value)>,
    /// Pools and Bindings, which render no workload.
    entries: Vec<&'a Value>,
}

impl<'a> Objects<'a> {
    fn read(docs: &'a [(String, Value)]) -> Result<Self, String> {
        let typed = |kind: &'static str| docs.iter().filter(move |(_, v)| v["kind"] == kind);
        fn decode<T: serde::de::DeserializeOwned>(f: &str, v: &Value, kind: &str) -> Result<T, String> {
            serde_json::from_value(v.clone()).map_err(|e| format!("{f}: a {kind}: {e}"))
        }
        Ok(Objects {
            backends: typed("KVCacheBackend")
                .map(|(f, v)| decode(f, v, "KVCacheBackend"))
                .collect::<Result<_, _>>()?,
            pools: typed("KVCachePool")
                .map(|(f, v)| decode(f, v, "KVCachePool"))
                .collect::<Result<_, _>>()?,
            bindings: typed("KVCachePoolBinding")
                .map(|(f, v)| decode(f, v, "KVCachePoolBinding"))
                .collect::<Result<_, _>>()?,
            deployments: typed("ModelDeployment").map(|(f, v)| (f.as_str(), v)).collect(),
            entries: typed("KVCachePool")
                .chain(typed("KVCachePoolBinding"))
                .map(|(_, v)| v)
                .collect(),
        })
    }
}

/// The objects for `docs` (each with where it came from, as [`admit`] returned them), with the
/// store's objects in `namespace`; the error names the manifest that cannot be read as its kind.
pub fn render(docs: &[(String, Value)], namespace: &str, config: &Config) -> Result<String, String> {
    let objects = Objects::read(docs)?;
    let mut out = String::from(
        "# Rendered by kv-apiserver render. The controllers add owner references (with the owners'\n# UIDs) when they apply these.\n",
    );
    let mut endpoints = std::collections::BTreeMap::new();
    for backend in &objects.backends {
        render_backend(backend, &objects, namespace, config, &mut endpoints, &mut out)?;
    }
    for (file, value) in &objects.deployments {
        render_deployment(file, value, &objects, &endpoints, config, &mut out)?;
    }
    for value in &objects.entries {
        out.push_str(&format!(
            "---\n# {} {}: renders no workload (Pools and Bindings are entries in the store's tenant ledger)\n",
            value["kind"].as_str().unwrap_or_default(),
            value["metadata"]["name"].as_str().unwrap_or_default()
        ));
    }
    Ok(out)
}

/// A backend's store objects (an external one renders nothing), and how to make the Secrets'
/// keys its Pods mount; its client endpoint goes into `endpoints`.
fn render_backend(
    backend: &KVCacheBackend,
    objects: &Objects,
    namespace: &str,
    config: &Config,
    endpoints: &mut std::collections::BTreeMap<String, String>,
    out: &mut String,
) -> Result<(), String> {
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
        return Ok(());
    };
    plan.tenant_namespaces = crate::controller::backend::tenant_namespaces(&name, &objects.pools, &objects.bindings);
    endpoints.insert(
        name.clone(),
        crate::runtime::kubernetes::render::leader_address(&plan, namespace),
    );
    let default_image = &config.settings.kv_cache_backend_image;
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
    Ok(())
}

/// A deployment's engine Pods, attached as the controllers would attach it once its Binding is
/// granted (through the Binding, pool and backend among the same manifests).
fn render_deployment(
    file: &str,
    value: &Value,
    objects: &Objects,
    endpoints: &std::collections::BTreeMap<String, String>,
    config: &Config,
    out: &mut String,
) -> Result<(), String> {
    let md: ModelDeployment =
        serde_json::from_value(value.clone()).map_err(|e| format!("{file}: a ModelDeployment: {e}"))?;
    let (ns, name) = (
        md.metadata.namespace.clone().unwrap_or_else(|| "default".into()),
        md.metadata.name.clone().unwrap_or_default(),
    );
    let connection = md
        .spec
        .binding_name()
        .and_then(|b| connection(objects, endpoints, &ns, b, config));
    if md.spec.binding_name().is_some() && connection.is_none() {
        out.push_str(&format!(
            "---\n# ModelDeployment {ns}/{name}: its Binding, Pool or backend is not in these files; rendered without a cache\n"
        ));
    }
    let replicas = crate::controller::model_deployment::replicas(&md, connection.as_ref(), config);
    let plan = crate::runtime::ReplicaPlan {
        owner: format!("{ns}/{name}"),
        uid: String::new(),
        router: crate::controller::model_deployment::router(&md, &replicas, config),
        replicas,
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
    if let Some(router) = &plan.router {
        match &router.image {
            Ok(image) => {
                for object in crate::runtime::kubernetes::router::objects(&plan, router, image) {
                    out.push_str("---\n");
                    out.push_str(&yaml(&object)?);
                }
            }
            Err(why) => out.push_str(&format!("---\n# ModelDeployment {ns}/{name} router: {why}\n")),
        }
    }
    Ok(())
}

/// The cache a deployment in `ns` attached to Binding `binding` gets, when the Binding, its
/// pool and their backend are among the manifests.
fn connection(
    objects: &Objects,
    endpoints: &std::collections::BTreeMap<String, String>,
    ns: &str,
    binding: &str,
    config: &Config,
) -> Option<crate::controller::injection::Connection> {
    let binding = objects.bindings.iter().find(|x| {
        x.metadata.name.as_deref() == Some(binding) && x.metadata.namespace.as_deref().unwrap_or("default") == ns
    })?;
    let pool = objects
        .pools
        .iter()
        .find(|p| p.metadata.name.as_deref() == Some(binding.spec.pool_name()))?;
    let backend_name = pool.spec.backend()?;
    let endpoint = endpoints.get(backend_name)?.clone();
    let backend = objects
        .backends
        .iter()
        .find(|b| b.metadata.name.as_deref() == Some(backend_name))?;
    let domain = binding.spec.domain.clone().unwrap_or_default();
    Some(crate::controller::injection::Connection {
        endpoint,
        store: crate::controller::injection::StoreKind::of(&backend.spec, &config.settings.kv_cache_backend_image),
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
}
