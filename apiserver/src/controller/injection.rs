//! Injection: what an engine replica attached to a cache receives. One function, [`inject`],
//! computes it from the engine, the
//! role kind and the resolved connection; the local runtime passes it to the replica's process
//! (the engine simulator, or the real engine), and a Kubernetes runtime renders the same values
//! into Pods.
//!
//! The role's kind chooses vLLM's `kv_role` ([`vllm_role`]): `Server` and `Prefill` `kv_both`,
//! `Decode` `kv_consumer`.
//!
//! Every engine gets our store's own names (`KVSTORE_LEADER`, `KVSTORE_TENANT`,
//! `KVSTORE_BLOCK_SIZE`, `KVSTORE_DTYPE`). Which connector it loads depends on the store:
//!
//! - **Our store** (a managed backend): our connectors, from the `kvcache` package that the
//!   store's image carries at [`PACKAGE_DIR`] (an init container copies it next to the engine,
//!   and `PYTHONPATH` names it), so the engine's client and the store come from one build. vLLM:
//!   `--kv-transfer-config` naming [`VLLM_CONNECTOR`] in [`VLLM_CONNECTOR_MODULE`], with failed
//!   loads recomputed, and `--block-size` set to the domain's. SGLang: HiCache's `dynamic`
//!   backend with `kvcache.sglang` and `interface_v1`, and `--page-size` set to the domain's.
//! - **The reference's store** (an external backend of `type: Mooncake`): the reference's
//!   connectors, which speak its protocol: vLLM's `MooncakeStoreConnector` with the client
//!   configuration file (`MOONCAKE_CONFIG_PATH`), SGLang's `mooncake` backend with its
//!   `MOONCAKE_*` variables.
//!
//! Where the store serves TLS, engines of our store also get `KVSTORE_TLS_CA_PEM` (the store's CA,
//! which is public) and `KVSTORE_TLS_SERVER_NAME` (the backend's store name).
//!
//! Where the leader binds the tenant to credentials, every engine also gets the Binding's
//! credential as `KVSTORE_CREDENTIAL`, kept apart from the plain environment so a cluster renders
//! it from the Binding's Secret; nothing secret is on a command line or in a file the Pod spec
//! shows. Without a connection a replica receives none of it: never a partial one.

use kvcache_api::model_deployment::{EngineName, RoleKind};
use serde_json::json;

use crate::runtime::credentials::ReplicaCredential;

pub use crate::runtime::{PACKAGE_DIR, VLLM_CONFIG_PATH};
/// Our vLLM connector: its class and module (`clients/python/python/kvcache/vllm/`).
pub const VLLM_CONNECTOR: &str = "KVCacheStoreConnector";
pub const VLLM_CONNECTOR_MODULE: &str = "kvcache.vllm";
/// Our SGLang HiCache backend's module and class (`clients/python/python/kvcache/sglang.py`).
pub const SGLANG_BACKEND_MODULE: &str = "kvcache.sglang";
pub const SGLANG_BACKEND_CLASS: &str = "HiCacheStore";

/// Which store a connection leads to, so which client the engine loads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreKind {
    /// Our leader (a managed backend): engines load our connectors from the `kvcache` package of
    /// the store's image, `package_image`.
    Ours { package_image: String },
    /// A store of the reference's protocol run elsewhere (an external backend): its connectors.
    Mooncake,
}

impl StoreKind {
    /// The store `backend` leads to: ours when this server runs it (its image, else the
    /// `kv-cache-backend-image` setting, carries the package), the reference's when it is external.
    pub fn of(backend: &kvcache_api::backend::BackendSpec, default_image: &str) -> StoreKind {
        if backend.managed().is_some() {
            let image = backend
                .image
                .as_deref()
                .map(str::trim)
                .filter(|i| !i.is_empty())
                .unwrap_or(default_image);
            StoreKind::Ours {
                package_image: image.to_owned(),
            }
        } else {
            StoreKind::Mooncake
        }
    }
}

/// A resolved attachment: the store a replica writes to and the domain it writes under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Connection {
    /// The pool's `clientEndpoint`, HOST:PORT.
    pub endpoint: String,
    pub store: StoreKind,
    /// The Binding's domain name; `None` when the leader keeps no ledger.
    pub tenant: Option<String>,
    pub block_size: i32,
    pub dtype: String,
    /// The transport, in the store's spelling (`tcp`).
    pub protocol: String,
    /// The Binding's current credential; `None` when the leader keeps no ledger.
    pub credential: Option<ReplicaCredential>,
    /// The store's TLS, when it serves TLS (`runtime/store_tls.rs`).
    pub tls: Option<StoreTrust>,
}

/// What a replica trusts the store by: the store's CA (PEM; a CA certificate is public, so it
/// travels in the plain environment) and the name its certificates carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreTrust {
    pub ca_pem: String,
    pub server_name: String,
}

/// The variables telling a replica's client the store's TLS.
pub const STORE_CA_ENV: &str = kvcache_store::tls::CA_PEM_ENV;
pub const STORE_SERVER_NAME_ENV: &str = kvcache_store::tls::SERVER_NAME_ENV;

/// What one replica receives.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Injected {
    pub env: Vec<(String, String)>,
    pub args: Vec<String>,
    /// The reference's vLLM client configuration (the file `MOONCAKE_CONFIG_PATH` names).
    pub client_config: Option<String>,
    /// The tenant's credential, received as `KVSTORE_CREDENTIAL`.
    pub credential: Option<ReplicaCredential>,
    /// The image whose [`PACKAGE_DIR`] an init container copies next to the engine (our store's);
    /// the environment's `PYTHONPATH` names the copy.
    pub package_image: Option<String>,
}

/// The variable naming a replica to our store (`<deployment>/<replica>`): the leader counts the
/// replica's gets, hits and puts under it, which is how a cluster observes a replica's cache use
/// (`CacheAttached`) without asking the engine.
pub const CLIENT_ENV: &str = "KVSTORE_CLIENT";

/// The caller name of replica `replica` of `deployment`, as [`CLIENT_ENV`] carries it and the
/// leader reports it.
pub fn client_name(deployment: &str, replica: &str) -> String {
    format!("{deployment}/{replica}")
}

/// The injection for `engine` in a role of `kind`; empty without a connection. `dtype_owned` is
/// the `model-deployment-kv-cache-dtype-owned` setting.
pub fn inject(engine: EngineName, kind: RoleKind, conn: Option<&Connection>, dtype_owned: bool) -> Injected {
    let Some(c) = conn else {
        return Injected::default();
    };
    let mut env: Vec<(String, String)> = vec![
        ("KVSTORE_LEADER".into(), c.endpoint.clone()),
        ("KVSTORE_BLOCK_SIZE".into(), c.block_size.to_string()),
        ("KVSTORE_DTYPE".into(), c.dtype.clone()),
    ];
    if let Some(t) = &c.tenant {
        env.push(("KVSTORE_TENANT".into(), t.clone()));
    }
    let mut out = Injected {
        credential: c.credential.clone(),
        ..Injected::default()
    };
    match &c.store {
        StoreKind::Ours { package_image } => {
            env.push(("PYTHONPATH".into(), PACKAGE_DIR.into()));
            if let Some(t) = &c.tls {
                env.push((STORE_CA_ENV.into(), t.ca_pem.clone()));
                env.push((STORE_SERVER_NAME_ENV.into(), t.server_name.clone()));
            }
            out.package_image = Some(package_image.clone());
            ours(engine, kind, c, &mut out.args);
        }
        StoreKind::Mooncake => {
            env.push(("MC_TE_METRIC".into(), "1".into()));
            out.client_config = mooncake(engine, kind, c, &mut env, &mut out.args);
        }
    }
    if dtype_owned {
        out.args.extend(["--kv-cache-dtype".into(), c.dtype.clone()]);
    }
    out.env = env;
    out
}

/// Our connectors' flags. The store address, tenant, layout and credential reach them through the
/// `KVSTORE_*` environment, never the command line.
fn ours(engine: EngineName, kind: RoleKind, c: &Connection, args: &mut Vec<String>) {
    match engine {
        EngineName::Vllm => {
            let config = json!({
                "kv_connector": VLLM_CONNECTOR,
                "kv_connector_module_path": VLLM_CONNECTOR_MODULE,
                "kv_role": vllm_role(kind),
                // a block the store fails to deliver is recomputed, never a failed request
                "kv_load_failure_policy": "recompute",
            });
            args.extend([
                "--kv-transfer-config".into(),
                config.to_string(),
                "--block-size".into(),
                c.block_size.to_string(),
            ]);
        }
        EngineName::Sglang => {
            let extra = json!({
                "backend_name": "kvcache",
                "module_path": SGLANG_BACKEND_MODULE,
                "class_name": SGLANG_BACKEND_CLASS,
                "interface_v1": 1,
            });
            args.extend([
                "--enable-hierarchical-cache".into(),
                // pages as two ranges each, so they move by pointer (kvcache.sglang, "direct")
                "--hicache-mem-layout".into(),
                "page_first".into(),
                "--hicache-storage-backend".into(),
                "dynamic".into(),
                "--hicache-storage-backend-extra-config".into(),
                extra.to_string(),
                "--page-size".into(),
                c.block_size.to_string(),
            ]);
        }
    }
}

/// The reference's connectors: vLLM's flags (and its client file, returned), SGLang's
/// variables and flags.
fn mooncake(
    engine: EngineName,
    kind: RoleKind,
    c: &Connection,
    env: &mut Vec<(String, String)>,
    args: &mut Vec<String>,
) -> Option<String> {
    match engine {
        EngineName::Vllm => {
            args.push("--kv-transfer-config".into());
            args.push(json!({"kv_connector": "MooncakeStoreConnector", "kv_role": vllm_role(kind)}).to_string());
            env.push(("MOONCAKE_CONFIG_PATH".into(), VLLM_CONFIG_PATH.into()));
            let mut cfg = json!({
                "metadata_server": "P2PHANDSHAKE",
                "master_server_address": c.endpoint,
                "protocol": c.protocol,
                "device_name": "",
                "mode": "standalone-store",
                "global_segment_size": 0,
                "local_buffer_size": 134_217_728,
            });
            if let Some(t) = &c.tenant {
                cfg["tenant_id"] = json!(t);
            }
            Some(cfg.to_string())
        }
        EngineName::Sglang => {
            args.extend(["--hicache-storage-backend".into(), "mooncake".into()]);
            if kind == RoleKind::Decode {
                args.extend(["--disaggregation-decode-retraction-backup".into(), "cpu_tensor".into()]);
            } else {
                args.push("--enable-hierarchical-cache".into());
            }
            env.extend([
                ("MOONCAKE_MASTER".into(), c.endpoint.clone()),
                ("MOONCAKE_TE_META_DATA_SERVER".into(), "P2PHANDSHAKE".into()),
                ("MOONCAKE_PROTOCOL".into(), c.protocol.clone()),
                ("MOONCAKE_DEVICE".into(), String::new()),
                ("MOONCAKE_GLOBAL_SEGMENT_SIZE".into(), "0".into()),
            ]);
            if let Some(t) = &c.tenant {
                env.push(("MOONCAKE_TENANT_ID".into(), t.clone()));
            }
            None
        }
    }
}

/// vLLM's `kv_role` of a role kind's connector.
///
/// - `Server`: `kv_both`, it saves what it computes and loads what the store has.
/// - `Prefill`: `kv_both`, not `kv_producer`. It saves the handoff (every full prompt block, before
///   it answers), and it also loads the prefixes the store already has: a producer-only prefill
///   would recompute every shared prefix (a system prompt, an earlier turn) that another replica
///   already saved, which is most of the work a prefill replica is there to do.
/// - `Decode`: `kv_consumer`, it loads the handoff and saves nothing; the blocks it generates
///   are not saved (prefill saves the next turn's prompt again when it comes).
pub fn vllm_role(kind: RoleKind) -> &'static str {
    match kind {
        RoleKind::Server | RoleKind::Prefill => "kv_both",
        RoleKind::Decode => "kv_consumer",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IMAGE: &str = "ghcr.io/gpustack/kvcache-store:v0.1.0";

    fn conn(tenant: Option<&str>, store: StoreKind) -> Connection {
        Connection {
            endpoint: "127.0.0.1:7000".into(),
            store,
            tenant: tenant.map(Into::into),
            block_size: 64,
            dtype: "bfloat16".into(),
            protocol: "tcp".into(),
            credential: tenant.map(|_| ReplicaCredential::new("cache", "secret-value")),
            tls: None,
        }
    }

    #[test]
    fn a_store_that_serves_tls_gives_our_engines_its_ca_and_name_and_the_references_nothing() {
        let trust = StoreTrust {
            ca_pem: "-----BEGIN CERTIFICATE-----".into(),
            server_name: "b.kvstore.internal".into(),
        };
        let tls = Connection {
            tls: Some(trust.clone()),
            ..conn(Some("default"), ours())
        };
        for engine in [EngineName::Vllm, EngineName::Sglang] {
            let i = inject(engine, RoleKind::Server, Some(&tls), false);
            assert_eq!(get(&i, STORE_CA_ENV), Some("-----BEGIN CERTIFICATE-----"));
            assert_eq!(get(&i, STORE_SERVER_NAME_ENV), Some("b.kvstore.internal"));
        }
        let plain = inject(
            EngineName::Vllm,
            RoleKind::Server,
            Some(&conn(Some("default"), ours())),
            false,
        );
        assert!(get(&plain, STORE_CA_ENV).is_none());
        let reference = Connection {
            tls: Some(trust),
            ..conn(Some("default"), StoreKind::Mooncake)
        };
        let i = inject(EngineName::Vllm, RoleKind::Server, Some(&reference), false);
        assert!(get(&i, STORE_CA_ENV).is_none() && get(&i, STORE_SERVER_NAME_ENV).is_none());
    }

    fn ours() -> StoreKind {
        StoreKind::Ours {
            package_image: IMAGE.into(),
        }
    }

    fn get<'a>(i: &'a Injected, k: &str) -> Option<&'a str> {
        i.env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
    }

    fn arg<'a>(i: &'a Injected, flag: &str) -> Option<&'a str> {
        let at = i.args.iter().position(|a| a == flag)?;
        i.args.get(at + 1).map(String::as_str)
    }

    #[test]
    fn vllm_on_our_store_loads_our_connector_from_the_stores_package() {
        let i = inject(
            EngineName::Vllm,
            RoleKind::Server,
            Some(&conn(Some("default"), ours())),
            true,
        );
        let cfg: serde_json::Value = serde_json::from_str(arg(&i, "--kv-transfer-config").unwrap()).unwrap();
        assert_eq!(cfg["kv_connector"], VLLM_CONNECTOR);
        assert_eq!(cfg["kv_connector_module_path"], "kvcache.vllm");
        assert_eq!(cfg["kv_role"], "kv_both");
        assert_eq!(cfg["kv_load_failure_policy"], "recompute");
        assert_eq!(
            arg(&i, "--block-size"),
            Some("64"),
            "the engine's blocks are the domain's"
        );
        assert_eq!(arg(&i, "--kv-cache-dtype"), Some("bfloat16"));
        assert_eq!(get(&i, "KVSTORE_LEADER"), Some("127.0.0.1:7000"));
        assert_eq!(get(&i, "KVSTORE_TENANT"), Some("default"));
        assert_eq!(get(&i, "PYTHONPATH"), Some(PACKAGE_DIR));
        assert_eq!(i.package_image.as_deref(), Some(IMAGE));
        assert!(i.client_config.is_none(), "no Mooncake client file for our store");
        assert!(get(&i, "MOONCAKE_CONFIG_PATH").is_none() && get(&i, "MC_TE_METRIC").is_none());
        let c = i.credential.as_ref().unwrap();
        assert_eq!((c.binding.as_str(), c.value.as_str()), ("cache", "secret-value"));
        assert!(
            !i.env.iter().any(|(_, v)| v.contains("secret-value"))
                && !i.args.iter().any(|a| a.contains("secret-value")),
            "the credential travels apart from the environment and the command line"
        );
    }

    #[test]
    fn sglang_on_our_store_loads_our_hicache_backend() {
        let i = inject(
            EngineName::Sglang,
            RoleKind::Server,
            Some(&conn(Some("default"), ours())),
            false,
        );
        assert_eq!(arg(&i, "--hicache-storage-backend"), Some("dynamic"));
        let extra: serde_json::Value =
            serde_json::from_str(arg(&i, "--hicache-storage-backend-extra-config").unwrap()).unwrap();
        assert_eq!(extra["module_path"], SGLANG_BACKEND_MODULE);
        assert_eq!(extra["class_name"], SGLANG_BACKEND_CLASS);
        assert_eq!(extra["interface_v1"], 1);
        assert!(extra.get("endpoint").is_none(), "the store comes from KVSTORE_*");
        assert!(i.args.contains(&"--enable-hierarchical-cache".to_owned()));
        assert_eq!(arg(&i, "--hicache-mem-layout"), Some("page_first"));
        assert_eq!(arg(&i, "--page-size"), Some("64"));
        assert_eq!(get(&i, "PYTHONPATH"), Some(PACKAGE_DIR));
        assert!(!i.env.iter().any(|(k, _)| k.starts_with("MOONCAKE_")));
        assert!(!i.args.contains(&"--kv-cache-dtype".to_owned()));
    }

    #[test]
    fn an_external_mooncake_store_keeps_the_references_connectors() {
        let i = inject(
            EngineName::Vllm,
            RoleKind::Server,
            Some(&conn(Some("default"), StoreKind::Mooncake)),
            true,
        );
        assert!(
            arg(&i, "--kv-transfer-config")
                .unwrap()
                .contains("MooncakeStoreConnector")
        );
        assert_eq!(get(&i, "MOONCAKE_CONFIG_PATH"), Some(VLLM_CONFIG_PATH));
        let cfg: serde_json::Value = serde_json::from_str(i.client_config.as_deref().unwrap()).unwrap();
        assert_eq!(cfg["master_server_address"], "127.0.0.1:7000");
        assert_eq!(cfg["tenant_id"], "default");
        assert!(i.package_image.is_none() && get(&i, "PYTHONPATH").is_none());
        assert!(!i.client_config.unwrap().contains("secret-value"));

        let s = inject(
            EngineName::Sglang,
            RoleKind::Decode,
            Some(&conn(None, StoreKind::Mooncake)),
            false,
        );
        assert_eq!(get(&s, "MOONCAKE_MASTER"), Some("127.0.0.1:7000"));
        assert_eq!(get(&s, "MOONCAKE_TENANT_ID"), None);
        assert_eq!(get(&s, "KVSTORE_TENANT"), None);
        assert!(s.args.contains(&"--disaggregation-decode-retraction-backup".to_owned()));
        assert!(s.client_config.is_none() && s.credential.is_none());
    }

    #[test]
    fn each_role_kind_gets_its_kv_role_on_either_store() {
        let kv_role = |kind, store| {
            let i = inject(EngineName::Vllm, kind, Some(&conn(Some("default"), store)), false);
            let cfg: serde_json::Value = serde_json::from_str(arg(&i, "--kv-transfer-config").unwrap()).unwrap();
            cfg["kv_role"].as_str().unwrap().to_owned()
        };
        for store in [ours(), StoreKind::Mooncake] {
            assert_eq!(kv_role(RoleKind::Server, store.clone()), "kv_both");
            assert_eq!(
                kv_role(RoleKind::Prefill, store.clone()),
                "kv_both",
                "prefill saves the handoff and loads the prefixes the store has"
            );
            assert_eq!(kv_role(RoleKind::Decode, store), "kv_consumer");
        }
        // the halves differ in kv_role alone: same connector, same store, same blocks
        let p = inject(
            EngineName::Vllm,
            RoleKind::Prefill,
            Some(&conn(Some("default"), ours())),
            true,
        );
        let d = inject(
            EngineName::Vllm,
            RoleKind::Decode,
            Some(&conn(Some("default"), ours())),
            true,
        );
        assert_eq!(p.env, d.env);
        assert_eq!(arg(&p, "--block-size"), arg(&d, "--block-size"));
    }

    #[test]
    fn no_connection_injects_nothing() {
        assert_eq!(
            inject(EngineName::Vllm, RoleKind::Server, None, true),
            Injected::default()
        );
    }
}
