//! A deployment's router on this machine: `kv-router`, found next to `kv-store` (it ships with the
//! store), as one supervised process on a loopback port kept while the router is planned, under
//! `kv-store --exit-with-stdin exec` so it stops with the server like every other child. One
//! process runs whatever `spec.router.replicas` asks: replicas are for spreading load and
//! surviving a node in a cluster, and one machine's loopback address has one listener.
//!
//! Its workers come from `<data-dir>/runtime/_deployments/<namespace>/<name>/router-workers.json`
//! (`--workers-file`), `{"server": [...], "prefill": [...], "decode": [...]}` with the URL of every
//! READY replica of each kind (with where it publishes its KV events, when it does), which the runtime rewrites (a temporary file renamed over it, so
//! the router never reads half a file) at every pass whose replicas changed; the router re-reads
//! it when it changes. The router is ready while its `GET /health` answers 200, which it does once
//! a decode or server worker behind it is healthy. Its environment names the store the replicas
//! use, with their credential, so it follows what the store holds (`RouterPlan::store_env`).

use std::path::{Path, PathBuf};

use super::LocalRuntime;
use super::ports::free_port;
use super::process::{ProcessSpec, Supervised};
use super::store::converge;
use crate::runtime::{Changed, ReplicaObservation, ReplicaPlan, RouterObservation, RouterPlan, worker_kind};

/// The router's binary, next to `kv-store`.
pub const ROUTER_BINARY: &str = "kv-router";
/// The workers file, in the deployment's runtime directory.
pub const WORKERS_FILE: &str = "router-workers.json";

impl LocalRuntime {
    /// Converges the owner's router to `plan.router` (stopped when `None`), its workers file to
    /// the ready ones of `replicas`, and reports it.
    pub(super) async fn converge_router(
        &self,
        plan: &ReplicaPlan,
        replicas: &[ReplicaObservation],
    ) -> Option<RouterObservation> {
        let mut state = self.state.lock().await;
        let old = state.routers.remove(&plan.owner);
        let Some(r) = &plan.router else {
            state.engine_ports.remove(&port_key(&plan.owner));
            drop(state);
            if let Some(old) = old {
                old.stop().await;
            }
            let _ = std::fs::remove_file(self.workers_file(&plan.owner));
            return None;
        };
        let port = *state
            .engine_ports
            .entry(port_key(&plan.owner))
            .or_insert_with(|| free_port().port());
        let file = self.workers_file(&plan.owner);
        let url = format!("http://127.0.0.1:{port}");
        let spec = ProcessSpec {
            program: self.opts.store_binary.clone(),
            args: self.router_args(r, port, &file),
            env: router_env(r),
            log: self.log(&router_log(&plan.owner)),
            health: Some(format!("{url}/health")),
        };
        let binary = self.router_binary();
        let written = write_workers(&file, &workers(r, replicas));
        let s = if !binary.is_file() {
            if let Some(old) = old {
                old.stop().await;
            }
            Supervised::refused(
                spec,
                format!(
                    "the router binary {ROUTER_BINARY} is not next to kv-store ({}); build it with `cargo build -p kvcache-router` (the store's image ships it)",
                    binary.display()
                ),
            )
        } else if let Err(why) = written {
            if let Some(old) = old {
                old.stop().await;
            }
            Supervised::refused(
                spec,
                format!("writing the router's workers file {}: {why}", file.display()),
            )
        } else {
            match old {
                // the cache connection did not resolve (a store failover): the router keeps the
                // store it follows rather than restart without one and again with it
                Some(old) if plan.hold_rollout && old.state().refused.is_none() => old,
                old => {
                    let hooks = self.notify(Changed::Replicas(plan.owner.clone()));
                    converge(old, spec, self.opts.grace, hooks).await
                }
            }
        };
        let st = s.state();
        state.routers.insert(plan.owner.clone(), s);
        Some(RouterObservation {
            replicas: 1,
            ready: i32::from(st.running && st.ready),
            url: Some(url),
            state: st,
        })
    }

    /// Stops the owner's router and forgets its port (the deployment is going).
    pub(super) async fn remove_router_now(&self, owner: &str) {
        let router = {
            let mut state = self.state.lock().await;
            state.engine_ports.remove(&port_key(owner));
            state.routers.remove(owner)
        };
        if let Some(r) = router {
            r.stop().await;
        }
        let _ = std::fs::remove_file(self.workers_file(owner));
    }

    /// `kv-router` next to the `kv-store` binary the runtime runs.
    pub fn router_binary(&self) -> PathBuf {
        self.opts.store_binary.with_file_name(ROUTER_BINARY)
    }

    /// `<data-dir>/runtime/_deployments/<namespace>/<name>/router-workers.json`.
    pub fn workers_file(&self, owner: &str) -> PathBuf {
        let mut p = self.opts.data_dir.join("runtime").join("_deployments");
        p.extend(owner.split('/'));
        p.join(WORKERS_FILE)
    }

    /// `kv-store --exit-with-stdin exec -- kv-router`, then the runtime's flags (where it
    /// listens, its workers file), then the spec's.
    fn router_args(&self, r: &RouterPlan, port: u16, file: &Path) -> Vec<String> {
        let mut args = vec![
            "--exit-with-stdin".to_owned(),
            "exec".to_owned(),
            "--".to_owned(),
            self.router_binary().display().to_string(),
            "--listen".to_owned(),
            format!("127.0.0.1:{port}"),
            "--workers-file".to_owned(),
            file.display().to_string(),
        ];
        args.extend(r.args.iter().cloned());
        args
    }
}

/// The router's environment: the runtime's own for store processes, then the store it follows
/// and the credential it shows it (as a replica's, the credential last).
fn router_env(r: &RouterPlan) -> Vec<(String, String)> {
    let mut env = LocalRuntime::store_env();
    env.extend(r.store_env.iter().cloned());
    if let Some(c) = &r.credential {
        env.push((crate::runtime::credentials::ENV.to_owned(), c.value.clone()));
    }
    env
}

/// The key of the router's port among the engine ports (`_` is never in a replica's name).
pub(super) fn port_key(owner: &str) -> String {
    format!("{owner}/_router")
}

/// `_deployments/<namespace>/<name>/router.log` under the logs.
fn router_log(owner: &str) -> Vec<&str> {
    let mut parts = vec!["_deployments"];
    parts.extend(owner.split('/'));
    parts.push("router.log");
    parts
}

/// The workers file's content: every kind's key, each with the URLs of the ready replicas of its
/// roles, in the plan's order.
pub fn workers(r: &RouterPlan, replicas: &[ReplicaObservation]) -> serde_json::Value {
    let mut out = serde_json::json!({"server": [], "prefill": [], "decode": []});
    for role in &r.roles {
        let entries = replicas
            .iter()
            .filter(|o| o.role == role.role && o.state.running && o.state.ready)
            .filter_map(|o| {
                let url = o.url.clone()?;
                Some(match &o.events {
                    Some(e) => serde_json::json!({"url": url, "events": e.events, "replay": e.replay}),
                    None => serde_json::Value::String(url),
                })
            });
        if let Some(list) = out[worker_kind(role.kind)].as_array_mut() {
            list.extend(entries);
        }
    }
    out
}

/// Writes `content` to `file` when it differs from what is there: into a temporary file beside
/// it, then renamed over it, so a reader sees the old file or the new one, never a part.
fn write_workers(file: &Path, content: &serde_json::Value) -> std::io::Result<()> {
    let text = format!("{content}\n");
    if std::fs::read_to_string(file).is_ok_and(|t| t == text) {
        return Ok(());
    }
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = file.with_extension("json.tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, file)
}

#[cfg(test)]
mod tests {
    use kvcache_api::model_deployment::RoleKind;

    use super::*;
    use crate::runtime::{RouterRole, WorkloadState};

    fn plan() -> RouterPlan {
        RouterPlan {
            name: "kvcache-router".into(),
            replicas: 2,
            image: Ok("i".into()),
            pull_policy: None,
            pull_secrets: vec![],
            args: vec!["--model".into(), "m".into()],
            store_env: vec![("KVSTORE_LEADER".into(), "127.0.0.1:7000".into())],
            credential: Some(crate::runtime::credentials::ReplicaCredential::new("b", "minted")),
            roles: vec![
                RouterRole {
                    role: "prefill".into(),
                    kind: RoleKind::Prefill,
                    port: 8000,
                },
                RouterRole {
                    role: "decode".into(),
                    kind: RoleKind::Decode,
                    port: 8000,
                },
            ],
        }
    }

    fn replica(role: &str, i: u16, ready: bool) -> ReplicaObservation {
        ReplicaObservation {
            name: format!("{role}-{i}"),
            role: role.into(),
            state: WorkloadState {
                running: true,
                ready,
                ..WorkloadState::default()
            },
            url: Some(format!("http://127.0.0.1:{}", 9000 + i)),
            ..ReplicaObservation::default()
        }
    }

    #[test]
    fn the_router_is_told_the_store_and_its_credential() {
        let env = router_env(&plan());
        let at = |name: &str| env.iter().position(|(k, _)| k == name);
        assert_eq!(env[at("KVSTORE_LEADER").unwrap()].1, "127.0.0.1:7000");
        let credential = at(crate::runtime::credentials::ENV).unwrap();
        assert_eq!((credential, env[credential].1.as_str()), (env.len() - 1, "minted"));
    }

    #[test]
    fn the_workers_file_lists_ready_replicas_by_kind() {
        let observed = [
            replica("prefill", 0, true),
            replica("prefill", 1, false),
            replica("decode", 2, true),
            replica("other", 3, true),
        ];
        assert_eq!(
            workers(&plan(), &observed),
            serde_json::json!({"server": [], "prefill": ["http://127.0.0.1:9000"], "decode": ["http://127.0.0.1:9002"]})
        );
    }

    #[test]
    fn the_workers_file_is_replaced_whole_and_only_when_it_changes() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("ns").join("md").join(WORKERS_FILE);
        let a = workers(&plan(), &[replica("decode", 0, true)]);
        write_workers(&file, &a).unwrap();
        let read = |f: &Path| serde_json::from_str::<serde_json::Value>(&std::fs::read_to_string(f).unwrap()).unwrap();
        assert_eq!(read(&file), a);
        // a write renames a new file over it: the same inode means it was not written
        use std::os::unix::fs::MetadataExt as _;
        let before = std::fs::metadata(&file).unwrap().ino();
        write_workers(&file, &a).unwrap();
        assert_eq!(
            std::fs::metadata(&file).unwrap().ino(),
            before,
            "unchanged: not written"
        );
        let b = workers(&plan(), &[]);
        write_workers(&file, &b).unwrap();
        assert_eq!(read(&file), b);
        assert!(
            !file.with_extension("json.tmp").exists(),
            "the temporary file was renamed"
        );
    }

    #[tokio::test]
    async fn a_missing_kv_router_refuses_the_router_and_no_router_stops_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut opts = super::super::LocalOptions::new(dir.path());
        opts.store_binary = dir.path().join("bin").join("kv-store");
        let rt = LocalRuntime::new(opts);
        let mut p = ReplicaPlan {
            owner: "team-a/qwen-pd".into(),
            uid: String::new(),
            replicas: vec![],
            hold_rollout: false,
            router: Some(plan()),
        };
        let o = rt.converge_router(&p, &[replica("decode", 0, true)]).await.unwrap();
        let why = o.state.refused.clone().unwrap_or_default();
        assert!(
            why.contains("kv-router is not next to kv-store") && why.contains("cargo build -p kvcache-router"),
            "{why}"
        );
        assert_eq!((o.replicas, o.ready), (1, 0));
        let file = rt.workers_file("team-a/qwen-pd");
        assert!(file.ends_with("runtime/_deployments/team-a/qwen-pd/router-workers.json"));
        assert!(file.is_file(), "the workers are written even before the router can run");
        let url = o.url.clone().unwrap();
        // the same port on the next pass, the replicas' pass in between included
        rt.converge_replicas(&p).await;
        let again = rt.converge_router(&p, &[]).await.unwrap();
        assert_eq!(again.url, Some(url));
        p.router = None;
        assert!(rt.converge_router(&p, &[]).await.is_none());
        assert!(!file.exists());
        assert!(rt.state.lock().await.routers.is_empty());
    }
}
