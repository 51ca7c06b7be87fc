//! Injection: what an engine replica attached to a cache receives (`model-deployment.md` §3.4,
//! `pool-binding-injection.md` §4.3). One function, [`inject`], computes it from the engine, the
//! role kind and the resolved connection; the local runtime passes it to `kv-store engine-sim`
//! as the whole environment, and a Kubernetes runtime renders the same values into Pods.
//!
//! Every engine gets our store's own names (`KVSTORE_LEADER`, `KVSTORE_TENANT`,
//! `KVSTORE_BLOCK_SIZE`, `KVSTORE_DTYPE`) and `MC_TE_METRIC=1`; vLLM gets its connector flags and
//! the client configuration file (`MOONCAKE_CONFIG_PATH`); SGLang gets its `MOONCAKE_*` variables
//! and HiCache flags. Where the leader binds the tenant to credentials, every engine also gets
//! the Binding's credential as `KVSTORE_CREDENTIAL`, kept apart from the plain environment so a
//! cluster renders it from the Binding's Secret. Without a connection a replica receives none of
//! it: never a partial one.

use kvcache_api::model_deployment::{EngineName, RoleKind};
use serde_json::json;

use crate::runtime::credentials::ReplicaCredential;

/// Where the vLLM client configuration file is mounted in a Pod.
pub const VLLM_CONFIG_PATH: &str = "/etc/gpustack/kvcache/mooncake.json";

/// A resolved attachment: the store a replica writes to and the domain it writes under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Connection {
    /// The pool's `clientEndpoint`, HOST:PORT.
    pub endpoint: String,
    /// The Binding's domain name; `None` when the leader keeps no ledger.
    pub tenant: Option<String>,
    pub block_size: i32,
    pub dtype: String,
    /// The transport, in the store's spelling (`tcp`).
    pub protocol: String,
    /// The Binding's current credential; `None` when the leader keeps no ledger.
    pub credential: Option<ReplicaCredential>,
}

/// What one replica receives.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Injected {
    pub env: Vec<(String, String)>,
    pub args: Vec<String>,
    /// vLLM's client configuration (the file `MOONCAKE_CONFIG_PATH` names).
    pub client_config: Option<String>,
    /// The tenant's credential, received as `KVSTORE_CREDENTIAL`.
    pub credential: Option<ReplicaCredential>,
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
        ("MC_TE_METRIC".into(), "1".into()),
    ];
    if let Some(t) = &c.tenant {
        env.push(("KVSTORE_TENANT".into(), t.clone()));
    }
    let mut args = Vec::new();
    let mut client_config = None;
    match engine {
        EngineName::Vllm => {
            let role = match kind {
                RoleKind::Server => "kv_both",
                RoleKind::Prefill => "kv_producer",
                RoleKind::Decode => "kv_consumer",
            };
            args.push("--kv-transfer-config".into());
            args.push(json!({"kv_connector": "MooncakeStoreConnector", "kv_role": role}).to_string());
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
            client_config = Some(cfg.to_string());
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
        }
    }
    if dtype_owned {
        args.extend(["--kv-cache-dtype".into(), c.dtype.clone()]);
    }
    Injected {
        env,
        args,
        client_config,
        credential: c.credential.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn(tenant: Option<&str>) -> Connection {
        Connection {
            endpoint: "127.0.0.1:7000".into(),
            tenant: tenant.map(Into::into),
            block_size: 64,
            dtype: "bfloat16".into(),
            protocol: "tcp".into(),
            credential: tenant.map(|_| ReplicaCredential::new("cache", "secret-value")),
        }
    }

    fn get<'a>(i: &'a Injected, k: &str) -> Option<&'a str> {
        i.env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
    }

    #[test]
    fn vllm_gets_the_connector_the_file_and_our_names() {
        let i = inject(EngineName::Vllm, RoleKind::Server, Some(&conn(Some("default"))), true);
        assert_eq!(get(&i, "KVSTORE_LEADER"), Some("127.0.0.1:7000"));
        assert_eq!(get(&i, "KVSTORE_TENANT"), Some("default"));
        assert_eq!(get(&i, "MOONCAKE_CONFIG_PATH"), Some(VLLM_CONFIG_PATH));
        assert_eq!(i.args[0], "--kv-transfer-config");
        assert!(i.args[1].contains("\"kv_role\":\"kv_both\""));
        assert_eq!(&i.args[2..], ["--kv-cache-dtype", "bfloat16"]);
        let cfg: serde_json::Value = serde_json::from_str(i.client_config.as_deref().unwrap()).unwrap();
        assert_eq!(cfg["master_server_address"], "127.0.0.1:7000");
        assert_eq!(cfg["tenant_id"], "default");
        let c = i.credential.as_ref().unwrap();
        assert_eq!((c.binding.as_str(), c.value.as_str()), ("cache", "secret-value"));
        assert!(
            !i.env.iter().any(|(_, v)| v == "secret-value") && !i.client_config.unwrap().contains("secret-value"),
            "the credential travels apart from the plain environment and the client file"
        );
    }

    #[test]
    fn sglang_gets_its_environment_and_no_tenant_without_a_ledger() {
        let i = inject(EngineName::Sglang, RoleKind::Decode, Some(&conn(None)), false);
        assert_eq!(get(&i, "MOONCAKE_MASTER"), Some("127.0.0.1:7000"));
        assert_eq!(get(&i, "MOONCAKE_TENANT_ID"), None);
        assert_eq!(get(&i, "KVSTORE_TENANT"), None);
        assert!(i.args.contains(&"--disaggregation-decode-retraction-backup".to_owned()));
        assert!(!i.args.contains(&"--kv-cache-dtype".to_owned()));
        assert!(i.client_config.is_none());
        assert!(i.credential.is_none());
    }

    #[test]
    fn no_connection_injects_nothing() {
        assert_eq!(
            inject(EngineName::Vllm, RoleKind::Server, None, true),
            Injected::default()
        );
    }
}
