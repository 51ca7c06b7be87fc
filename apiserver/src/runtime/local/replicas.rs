//! A ModelDeployment's engine replicas on this machine: one supervised process each (the engine
//! simulator, or the real engine, chosen by [`engines::launch`]) with the environment injection
//! gave it, on a loopback port kept while the replica is planned.

use super::engines;
use super::ports::free_port;
use super::process::{ProcessSpec, Supervised};
use super::store::converge;
use super::{LocalRuntime, State};
use crate::runtime::{Changed, Replica, ReplicaObservation, ReplicaPlan, credentials};

impl LocalRuntime {
    /// Converges the owner's replicas to `plan` (one that runs stays as it is while the plan
    /// holds the rollout), stops those no longer planned, and reports each planned one.
    pub(super) async fn converge_replicas(&self, plan: &ReplicaPlan) -> Vec<ReplicaObservation> {
        let mut state = self.state.lock().await;
        let mut running = state.replicas.remove(&plan.owner).unwrap_or_default();
        let mut out = Vec::new();
        let config = self.opts.config.get();
        let host = engines::Host::current();
        for r in &plan.replicas {
            let port = *state
                .engine_ports
                .entry(format!("{}/{}", plan.owner, r.name))
                .or_insert_with(|| free_port().port());
            let env = self.replica_env(&plan.owner, r);
            let events_dir = self.events_dir();
            let launch = engines::launch(
                &self.opts.store_binary,
                &config.local_runtime,
                &host,
                r,
                env,
                port,
                &events_dir,
            );
            let spec = ProcessSpec {
                program: launch.program,
                args: launch.args,
                env: launch.env,
                log: self.replica_log(&plan.owner, &r.name),
                health: launch.health,
            };
            let hooks = self.notify(Changed::Replicas(plan.owner.clone()));
            let s = match running.remove(&r.name) {
                Some(old) if plan.hold_rollout && old.state().refused.is_none() => old,
                old => converge(old, spec, self.opts.grace, hooks).await,
            };
            out.push(ReplicaObservation {
                name: r.name.clone(),
                role: r.role.clone(),
                state: s.state(),
                cache: s.report(),
                runs: launch.note,
                url: Some(launch.url),
                events: launch.events,
            });
            state
                .replicas
                .entry(plan.owner.clone())
                .or_default()
                .insert(r.name.clone(), s);
        }
        futures::future::join_all(running.into_values().map(Supervised::stop)).await;
        forget_ports(&mut state, plan);
        out
    }

    /// Where real engines publish their KV events (Unix sockets named by their ports), made
    /// when missing.
    fn events_dir(&self) -> std::path::PathBuf {
        let dir = self.opts.data_dir.join("runtime").join("kv-events");
        if let Err(e) = std::fs::create_dir_all(&dir) {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot make the KV events directory");
        }
        dir
    }

    /// Stops the owner's replicas and forgets their ports.
    pub(super) async fn remove_replicas_now(&self, owner: &str) {
        let replicas = {
            let mut state = self.state.lock().await;
            let prefix = format!("{owner}/");
            state.engine_ports.retain(|k, _| !k.starts_with(&prefix));
            state.replicas.remove(owner)
        };
        if let Some(r) = replicas {
            futures::future::join_all(r.into_values().map(Supervised::stop)).await;
        }
    }

    /// Whether a replica or a router in `namespace` runs with the credential of `fingerprint`.
    pub(super) async fn runs_credential(&self, namespace: &str, fingerprint: &str) -> bool {
        let state = self.state.lock().await;
        let prefix = format!("{namespace}/");
        let replicas = state
            .replicas
            .iter()
            .filter(|(owner, _)| owner.starts_with(&prefix))
            .flat_map(|(_, r)| r.values());
        let routers = state
            .routers
            .iter()
            .filter(|(owner, _)| owner.starts_with(&prefix))
            .map(|(_, r)| r);
        replicas.chain(routers).any(|s| {
            s.spec
                .env
                .iter()
                .any(|(k, v)| k == credentials::ENV && credentials::fingerprint(v) == fingerprint)
        })
    }

    /// `<data-dir>/logs/_deployments/<namespace>/<name>/<replica>.log` (`_` is never in a name).
    fn replica_log(&self, owner: &str, replica: &str) -> std::path::PathBuf {
        let file = format!("{replica}.log");
        let mut parts = vec!["_deployments"];
        parts.extend(owner.split('/'));
        parts.push(&file);
        self.log(&parts)
    }

    /// A replica's environment: what injection gave it, then the role's own `env` (as a Pod's
    /// container gets them, so a role may shape the simulated workload with the `KVSTORE_*`
    /// knobs of `kv-store engine-sim`), the credential last, with the client configuration file
    /// written under the data directory (its path replacing the Pod's mount path).
    pub(super) fn replica_env(&self, owner: &str, r: &Replica) -> Vec<(String, String)> {
        // `engine.env` is the injected environment followed by the role's
        let mut env = r.engine.env.clone();
        if let Some(c) = &r.credential {
            env.push((credentials::ENV.to_owned(), c.value.clone()));
        }
        if let Some(cfg) = &r.client_config {
            let path = self
                .opts
                .data_dir
                .join("runtime")
                .join("_deployments")
                .join(owner)
                .join(format!("{}.json", r.name));
            if let Some(dir) = path.parent() {
                let _ = std::fs::create_dir_all(dir);
            }
            let _ = std::fs::write(&path, cfg);
            for (k, v) in env.iter_mut() {
                if k == "MOONCAKE_CONFIG_PATH" {
                    *v = path.display().to_string();
                }
            }
        }
        env
    }
}

/// Forgets the ports of the owner's replicas that are no longer planned (the router's port is
/// the router's to forget, `router.rs`).
fn forget_ports(state: &mut State, plan: &ReplicaPlan) {
    let mut planned: Vec<String> = plan
        .replicas
        .iter()
        .map(|r| format!("{}/{}", plan.owner, r.name))
        .collect();
    planned.push(super::router::port_key(&plan.owner));
    let prefix = format!("{}/", plan.owner);
    state
        .engine_ports
        .retain(|k, _| !k.starts_with(&prefix) || planned.contains(k));
}
