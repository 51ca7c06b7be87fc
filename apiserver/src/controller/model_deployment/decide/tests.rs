use serde_json::json;

use super::*;
use crate::runtime::{CacheReport, WorkloadState};

fn deployment(kv_cache: bool) -> ModelDeployment {
    let mut v = json!({
        "metadata": {"name": "qwen-chat", "namespace": "team-a", "generation": 4},
        "spec": {"model": {"name": "m"}, "engine": {"name": "vLLM"},
                 "roles": [{"name": "server", "replicas": 2}]},
        "status": {"kvCache": {"binding": "old", "pool": "p", "domain": {"name": "d", "blockSize": 64, "dtype": "bfloat16"}}}
    });
    if kv_cache {
        v["spec"]["kvCache"] = json!({"poolRef": {"name": "team-a"}});
    }
    serde_json::from_value(v).unwrap()
}

fn binding(phase: &str, granted: &str, reason: &str) -> KVCachePoolBinding {
    serde_json::from_value(json!({
        "metadata": {"name": "team-a", "namespace": "team-a", "uid": "u1"},
        "spec": {"poolRef": {"name": "p"}, "quota": {"ceiling": "1Gi"},
                 "domain": {"name": "qwen", "blockSize": 64, "dtype": "bfloat16"}},
        "status": {"phase": phase, "conditions": [{"type": "QuotaGranted", "status": granted, "reason": reason,
                   "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
    }))
    .unwrap()
}

fn pool(endpoint: bool) -> KVCachePool {
    let mut v = json!({"metadata": {"name": "p"}, "spec": {"backends": ["b"], "quota": {"total": "2Gi"}}});
    if endpoint {
        v["status"] = json!({"clientEndpoint": "127.0.0.1:7"});
    }
    serde_json::from_value(v).unwrap()
}

fn backend() -> KVCacheBackend {
    serde_json::from_value(json!({
        "metadata": {"name": "b"},
        "spec": {"type": "Mooncake", "connection": {"managed": {"leader": {},
                 "members": [{"medium": "DRAM", "capacityPerMember": "1Gi"}]}}}
    }))
    .unwrap()
}

fn credential(uid: &str) -> TenantCredentials {
    TenantCredentials::mint(uid, "")
}

fn whole(b: KVCachePoolBinding) -> Resolved {
    Resolved {
        binding: Some(b),
        pool: Some(pool(true)),
        backend: Some(backend()),
        credential: Some(credential("u1")),
        store_ca: Some("-----BEGIN CERTIFICATE-----".into()),
    }
}

#[test]
fn what_a_deployment_attaches_to() {
    let ready = || binding("Ready", "True", "Granted");
    let table: Vec<(&str, bool, Resolved, &str, bool)> = vec![
        ("no kvCache", false, Resolved::default(), "True|NotApplicable", false),
        ("no Binding", true, Resolved::default(), "False|BindingNotFound", false),
        (
            "a Binding not ready",
            true,
            whole(binding("Error", "False", "ZeroGranted")),
            "False|BindingNotReady",
            false,
        ),
        (
            "a pool with no endpoint yet",
            true,
            Resolved {
                pool: Some(pool(false)),
                ..whole(ready())
            },
            "False|BindingNotReady",
            false,
        ),
        (
            "no credential yet",
            true,
            Resolved {
                credential: None,
                ..whole(ready())
            },
            "False|BindingNotReady",
            false,
        ),
        (
            "a credential of an earlier Binding of that name",
            true,
            Resolved {
                credential: Some(credential("u0")),
                ..whole(ready())
            },
            "False|BindingNotReady",
            false,
        ),
        ("ready", true, whole(ready()), "True|Registered", true),
        (
            "unenforced: no credential needed",
            true,
            Resolved {
                credential: None,
                ..whole(binding("Ready", "True", "Unenforced"))
            },
            "True|Registered",
            true,
        ),
    ];
    for (name, kv_cache, resolved, want, connected) in table {
        let md = deployment(kv_cache);
        let a = attach(&md, &resolved, "");
        let got = format!("{}|{}", a.registered.status.as_str(), a.registered.reason.as_str());
        assert_eq!(got, want, "{name}: {}", a.registered.message);
        assert_eq!(a.connection.is_some(), connected, "{name}");
        match (kv_cache, &resolved.binding) {
            (false, _) => assert_eq!(a.kv_cache, None, "{name}: cleared"),
            (true, None) => assert_eq!(
                a.kv_cache.as_ref().map(|k| k.binding.as_str()),
                Some("old"),
                "{name}: kept"
            ),
            (true, Some(_)) => assert_eq!(
                a.kv_cache.as_ref().map(|k| k.domain.name.as_str()),
                Some("qwen"),
                "{name}"
            ),
        }
    }
    let c = attach(&deployment(true), &whole(ready()), "").connection.unwrap();
    assert_eq!(
        (c.endpoint.as_str(), c.tenant.as_deref(), c.block_size),
        ("127.0.0.1:7", Some("qwen"), 64)
    );
    assert_eq!(c.credential.map(|x| x.binding), Some("team-a".to_owned()));
    // a store served with TLS: its CA and the backend's store name
    let t = c.tls.unwrap();
    assert_eq!(t.ca_pem, "-----BEGIN CERTIFICATE-----");
    assert!(t.server_name.ends_with(".kvstore.internal"), "{}", t.server_name);
    let plain = Resolved {
        store_ca: None,
        ..whole(ready())
    };
    assert!(attach(&deployment(true), &plain, "").connection.unwrap().tls.is_none());
}

#[test]
fn replicas_are_named_to_our_store_and_read_back_from_its_counts() {
    let config = crate::config::Config::default();
    let c = attach(
        &deployment(true),
        &whole(binding("Ready", "True", "Granted")),
        "store:1",
    )
    .connection
    .unwrap();
    let named: Vec<Option<String>> = replicas(&deployment(true), Some(&c), &config)
        .iter()
        .map(|r| {
            let env = r
                .env
                .iter()
                .find(|(k, _)| k == injection::CLIENT_ENV)
                .map(|(_, v)| v.clone());
            let engine = r
                .engine
                .env
                .iter()
                .find(|(k, _)| k == injection::CLIENT_ENV)
                .map(|(_, v)| v.clone());
            assert_eq!(
                env, engine,
                "the simulator and the engine container carry the same name"
            );
            env
        })
        .collect();
    assert_eq!(
        named,
        [
            Some("qwen-chat/server-0".to_owned()),
            Some("qwen-chat/server-1".to_owned())
        ]
    );
    assert!(
        replicas(&deployment(true), None, &config)
            .iter()
            .all(|r| r.env.is_empty()),
        "no connection, no name"
    );

    let clients = [
        ClientStatus {
            name: "qwen-chat/server-0".into(),
            gets: 8,
            hits: 6,
            puts: 2,
        },
        ClientStatus {
            name: "other/server-1".into(),
            gets: 5,
            hits: 5,
            puts: 0,
        },
    ];
    let own = CacheReport {
        blocks: 1,
        hits: 1,
        stored: 0,
        hit_rate: 1.0,
    };
    let mut observed = vec![
        replica(true, None),
        ReplicaObservation {
            name: "server-1".into(),
            ..replica(true, None)
        },
        ReplicaObservation {
            name: "server-2".into(),
            ..replica(true, Some(own.clone()))
        },
    ];
    with_leader_counts("qwen-chat", &mut observed, &clients);
    assert_eq!(
        observed[0].cache,
        Some(CacheReport {
            blocks: 8,
            hits: 6,
            stored: 2,
            hit_rate: 0.75
        })
    );
    assert_eq!(
        observed[1].cache, None,
        "another deployment's replica of the same name is not ours"
    );
    assert_eq!(observed[2].cache, Some(own), "a replica's own report stands");
}

fn replica(ready: bool, cache: Option<CacheReport>) -> ReplicaObservation {
    ReplicaObservation {
        name: "server-0".into(),
        role: "server".into(),
        state: WorkloadState {
            running: ready,
            ready,
            refused: (!ready).then(|| "not enough memory".to_owned()),
            ..WorkloadState::default()
        },
        cache,
        runs: None,
        url: None,
        events: None,
    }
}

#[test]
fn what_the_replicas_observation_makes() {
    let active = CacheReport {
        blocks: 10,
        hits: 4,
        stored: 6,
        hit_rate: 0.4,
    };
    let idle = CacheReport {
        blocks: 10,
        ..CacheReport::default()
    };
    let table: Vec<(&str, Resolved, Vec<ReplicaObservation>, &str, &str)> = vec![
        (
            "nothing ready: why",
            whole(binding("Ready", "True", "Granted")),
            vec![replica(false, None), replica(false, None)],
            "Starting|0 of 2 replicas are ready; server-0: not enough memory",
            "Unknown|NoReplicaReady",
        ),
        (
            "one of two",
            whole(binding("Ready", "True", "Granted")),
            vec![replica(true, None), replica(false, None)],
            "Degraded|1 of 2 replicas are ready",
            "Unknown|NoObservationAvailable",
        ),
        (
            "both, the cache in use",
            whole(binding("Ready", "True", "Granted")),
            vec![replica(true, Some(active.clone())), replica(true, None)],
            "Ready|",
            "True|CacheActive",
        ),
        (
            "both, every operation failing",
            whole(binding("Ready", "True", "Granted")),
            vec![replica(true, Some(idle)), replica(true, None)],
            "Ready|",
            "False|CacheOperationsFailing",
        ),
        (
            "no Binding: every replica runs, without the cache it asks for",
            Resolved::default(),
            vec![replica(true, Some(active)), replica(true, None)],
            "Degraded|2 of 2 replicas are ready, the ready replicas run without the shared cache: no \
             KVCachePoolBinding \"team-a\" in the namespace \"team-a\"; an administrator creates it",
            "False|BindingNotFound",
        ),
    ];
    let now = crate::registry::meta::now();
    for (name, resolved, observed, phase, cache) in table {
        let md = deployment(true);
        let st = report(&md, &attach(&md, &resolved, ""), &observed, None, &now);
        let got = format!(
            "{}|{}",
            st.phase.map(|p| p.as_str()).unwrap_or_default(),
            st.phase_message.clone().unwrap_or_default()
        );
        assert_eq!(got, phase, "{name}");
        let c = conditions::find(&st.conditions, cache_attached::TYPE).unwrap();
        assert_eq!(format!("{}|{}", c.status, c.reason), cache, "{name}: {}", c.message);
        assert_eq!(c.observed_generation, Some(4), "{name}");
        assert!(
            conditions::find(&st.conditions, domain_registered::TYPE).is_some(),
            "{name}"
        );
        let ready = observed.iter().filter(|r| r.state.ready).count();
        assert_eq!(st.role_summary, Some(format!("{ready}S")), "{name}");
    }
}

#[test]
fn the_endpoint_is_where_the_first_role_first_replica_answers() {
    let mut md = deployment(false);
    md.spec.roles.insert(
        0,
        serde_json::from_value(json!({"name": "chat", "replicas": 2})).unwrap(),
    );
    let at = |role: &str, name: &str, url: Option<&str>| ReplicaObservation {
        name: name.into(),
        role: role.into(),
        url: url.map(str::to_owned),
        ..replica(true, None)
    };
    let observed = vec![
        at("server", "server-0", Some("http://127.0.0.1:1")),
        at("chat", "chat-0", Some("http://127.0.0.1:2")),
        at("chat", "chat-1", Some("http://127.0.0.1:3")),
    ];
    let now = crate::registry::meta::now();
    let attached = attach(&md, &Resolved::default(), "");
    let st = report(&md, &attached, &observed, None, &now);
    assert_eq!(st.endpoint.as_deref(), Some("http://127.0.0.1:2"));
    // A runtime that serves the replicas at no address of its own (a cluster) sets none.
    let observed = vec![at("chat", "chat-0", None), at("server", "server-0", Some("http://x"))];
    assert_eq!(report(&md, &attached, &observed, None, &now).endpoint, None);
}
