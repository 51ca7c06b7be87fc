//! A backend's store processes on this machine: its front (two loopback ports that forward to
//! the serving leader), its leader replicas and its members, converged to a [`StorePlan`] in
//! named steps ([`LocalRuntime::ensure_store`]), with the files of the backend's tokens and seal
//! key they are given.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use kvcache_store::flags::{FastListen, format_size};
use kvcache_store::leader::{Election, LeaderConfig};
use kvcache_store::member::MemberConfig;

use super::front::{Endpoint, Front};
use super::ports::free_port;
use super::process::{Hooks, ProcessSpec, Supervised};
use super::{LEASE_NAMESPACE, LocalRuntime, State, tls_files};
use crate::runtime::{Changed, MemberPlan, Secrets, StoreObservation, StorePlan, WorkloadState};

/// One backend's store as local processes: its front, its leader replicas and its members.
#[derive(Debug)]
pub(super) struct StoreProcesses {
    pub(super) front: Front,
    /// Each leader replica's own (gRPC, fast) ports, by index; kept while the store lives so a
    /// replica that stays is never restarted.
    leader_ports: Vec<(SocketAddr, SocketAddr)>,
    pub(super) leaders: Vec<Supervised>,
    /// Keyed by member name.
    pub(super) members: HashMap<String, Supervised>,
    /// the plan's `cleanAfterDelete` of its disk tier, as last converged
    clean_tiers: bool,
    /// what each member's tier held before this server first started it: (node, entries, when)
    surveys: HashMap<String, (String, i64, std::time::SystemTime)>,
}

impl StoreProcesses {
    /// Stops every process, members first.
    pub(super) async fn stop(self) {
        futures::future::join_all(self.members.into_values().map(Supervised::stop)).await;
        futures::future::join_all(self.leaders.into_iter().map(Supervised::stop)).await;
    }
}

/// What every process of a backend is given: its member token's file and its TLS files.
struct Shared {
    member_token: Option<PathBuf>,
    tls: Option<tls_files::BackendFiles>,
}

impl LocalRuntime {
    /// Converges `plan`'s processes: the front, then the leaders (the front follows them), then
    /// the members (refused all together when they would need more memory than the machine
    /// has), and reports what runs.
    pub(super) async fn converge_store(&self, plan: &StorePlan) -> StoreObservation {
        let mut state = self.state.lock().await;
        let mut store = match state.stores.remove(&plan.backend) {
            Some(store) => store,
            None => match self.front(&plan.backend) {
                Ok(front) => StoreProcesses {
                    front,
                    leader_ports: Vec::new(),
                    leaders: Vec::new(),
                    members: HashMap::new(),
                    clean_tiers: false,
                    surveys: HashMap::new(),
                },
                Err(e) => return front_refused(&e),
            },
        };
        // one read of the backend's member token for its leaders and members alike
        let shared = Shared {
            member_token: self.member_token_file(&plan.backend),
            tls: self.tls.backend(&plan.backend),
        };
        store.clean_tiers = plan.clean_tiers_after_delete;
        self.converge_leaders(plan, &mut store, &shared).await;
        let refusal = memory_refusal(&state, plan, self.memory_limit());
        self.converge_members(plan, &mut store, &shared, refusal).await;
        let observation = self.observe_store(plan, &store);
        state.stores.insert(plan.backend.clone(), store);
        observation
    }

    /// Leaders: replica i keeps its ports and flags, so scaling never restarts one that stays;
    /// replicas scaled away go from the end. The front then forwards to the serving one.
    async fn converge_leaders(&self, plan: &StorePlan, store: &mut StoreProcesses, shared: &Shared) {
        let replicas = plan.election.as_ref().map_or(1, |e| e.replicas.max(1)) as usize;
        while store.leader_ports.len() < replicas {
            store.leader_ports.push((free_port(), free_port()));
        }
        let mut old_leaders = std::mem::take(&mut store.leaders).into_iter();
        for (i, ports) in store.leader_ports.iter().take(replicas).enumerate() {
            let cfg = self.leader_config(plan, *ports, &store.front, shared);
            let spec = ProcessSpec {
                program: self.opts.store_binary.clone(),
                args: store_args("leader", cfg.to_args()),
                env: [Self::store_env(), plan.leader_env.clone()].concat(),
                log: self.log(&[&plan.backend, &format!("leader-{i}.log")]),
                health: None,
            };
            let mut hooks = self.notify(Changed::Store(plan.backend.clone()));
            let (reselect, notify) = (store.front.reselector(), hooks.on_change.take());
            hooks.on_change = Some(std::sync::Arc::new(move || {
                reselect();
                if let Some(n) = &notify {
                    n();
                }
            }));
            store
                .leaders
                .push(converge(old_leaders.next(), spec, self.opts.grace, hooks).await);
        }
        futures::future::join_all(old_leaders.map(Supervised::stop)).await;
        store.front.set_endpoints(
            store
                .leaders
                .iter()
                .zip(&store.leader_ports)
                .map(|(l, (grpc, fast))| Endpoint {
                    grpc: *grpc,
                    fast: *fast,
                    probe: l.probe(),
                })
                .collect(),
        );
    }

    /// Members: one process per planned member (stopped and marked refused instead when
    /// `refusal` says why they cannot run); members no longer planned are stopped.
    async fn converge_members(
        &self,
        plan: &StorePlan,
        store: &mut StoreProcesses,
        shared: &Shared,
        refusal: Option<String>,
    ) {
        let mut wanted = Vec::new();
        for m in &plan.members {
            let name = m.name(&plan.backend);
            wanted.push(name.clone());
            let cfg = self.member_config(plan, m, &store.front, shared);
            if let Some(dir) = &cfg.tier_dir {
                if let Err(e) = std::fs::create_dir_all(dir) {
                    tracing::warn!(dir = %dir.display(), error = %e, "the member's disk tier directory cannot be made");
                }
                // what it held before its first member here opened it
                if !store.surveys.contains_key(&name) {
                    let reading = (
                        m.node.clone(),
                        kvcache_store::member::tier::survey(dir),
                        std::time::SystemTime::now(),
                    );
                    store.surveys.insert(name.clone(), reading);
                }
            }
            let spec = ProcessSpec {
                program: self.opts.store_binary.clone(),
                args: store_args("member", cfg.to_args()),
                env: [Self::store_env(), m.env.clone()].concat(),
                log: self.log(&[&plan.backend, &format!("member-{}-{}.log", m.group, m.node)]),
                health: None,
            };
            let old = store.members.remove(&name);
            let member = match &refusal {
                Some(why) => {
                    if let Some(old) = old {
                        old.stop().await;
                    }
                    Supervised::refused(spec, why.clone())
                }
                None => {
                    let hooks = self.member_hooks(&plan.backend, store.front.grpc, name.clone());
                    converge(old, spec, self.opts.grace, hooks).await
                }
            };
            store.members.insert(name, member);
        }
        let gone: Vec<String> = store.members.keys().filter(|n| !wanted.contains(n)).cloned().collect();
        for n in gone {
            if let Some(s) = store.members.remove(&n) {
                s.stop().await;
            }
        }
    }

    /// What the planned members' tiers held before their first start here.
    fn tier_survey(&self, plan: &StorePlan, store: &StoreProcesses) -> Option<crate::runtime::TierSurvey> {
        let tiered: Vec<&MemberPlan> = plan.members.iter().filter(|m| m.config.tier_dir.is_some()).collect();
        if tiered.is_empty() {
            return None;
        }
        Some(crate::runtime::TierSurvey {
            expected: tiered.len(),
            readings: tiered
                .iter()
                .filter_map(|m| store.surveys.get(&m.name(&plan.backend)))
                .map(|(node, entries, at)| (node.clone(), *entries, Some(*at)))
                .collect(),
        })
    }

    /// Where a member's disk tier lives on this machine: `<data-dir>/tiers/<backend>/<member>`.
    pub(super) fn tier_dir(&self, backend: &str, member: &str) -> PathBuf {
        self.tiers_of(backend).join(member)
    }

    /// Every tier of a backend's members on this machine.
    fn tiers_of(&self, backend: &str) -> PathBuf {
        self.opts.data_dir.join("tiers").join(backend)
    }

    /// What runs of `plan`, as the controller reads it.
    fn observe_store(&self, plan: &StorePlan, store: &StoreProcesses) -> StoreObservation {
        StoreObservation {
            client_endpoint: Some(store.front.grpc.to_string()),
            rollout: None,
            leaders: store.leaders.iter().map(Supervised::state).collect(),
            lease: plan
                .election
                .as_ref()
                .map(|e| (LEASE_NAMESPACE.to_owned(), e.lease.clone())),
            members: plan
                .members
                .iter()
                .map(|m| {
                    let st = store
                        .members
                        .get(&m.name(&plan.backend))
                        .map(Supervised::state)
                        .unwrap_or_default();
                    (m.clone(), st)
                })
                .collect(),
            tier_survey: self.tier_survey(plan, store),
        }
    }

    /// Stops the backend's processes and forgets its front's ports; empties its members' disk
    /// tiers when its plan said `cleanAfterDelete`.
    pub(super) async fn remove_store_now(&self, backend: &str) {
        let store = self.state.lock().await.stores.remove(backend);
        if let Some(store) = store {
            let clean = store.clean_tiers;
            store.stop().await;
            let tiers = self.tiers_of(backend);
            if clean
                && let Err(e) = std::fs::remove_dir_all(&tiers)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(dir = %tiers.display(), error = %e, "the backend's disk tiers could not be emptied");
            }
        }
        let _ = std::fs::remove_file(self.opts.data_dir.join("runtime").join(format!("{backend}.ports")));
    }

    /// A leader replica's flags: its own ports, the front's fast port advertised, the backend's
    /// tokens, seal key and certificate, and the election's Lease.
    fn leader_config(
        &self,
        plan: &StorePlan,
        ports: (SocketAddr, SocketAddr),
        front: &Front,
        shared: &Shared,
    ) -> LeaderConfig {
        let tls = shared.tls.as_ref();
        let mut cfg = plan.leader.clone();
        cfg.tls = kvcache_store::tls::ServeFlags {
            tls_cert: tls.map(|t| t.cert.clone()),
            tls_key: tls.map(|t| t.key.clone()),
        };
        cfg.listen = ports.0;
        cfg.fast_listen = Some(FastListen::At(ports.1));
        cfg.advertise_fast_port = Some(front.fast.port());
        cfg.metrics_listen = None;
        cfg.spin = Duration::ZERO;
        cfg.control_token_file = self.control_token_of(&plan.backend).map(|(p, _)| p);
        cfg.member_token_file = shared.member_token.clone();
        cfg.metrics_token_file = self.metrics_token_file(&plan.backend);
        cfg.seal_key_file = self.seal_key_file(&plan.backend);
        if let Some(e) = &plan.election {
            cfg.election = Election::Kubernetes;
            cfg.election_lease = Some(format!("{LEASE_NAMESPACE}/{}", e.lease));
            cfg.kubeconfig = Some(self.opts.store_kubeconfig.clone());
        }
        cfg
    }

    /// A member's flags: its name, the leader it mounts at (the front, or the election's Lease
    /// when members follow it), loopback listeners, the machine's shared memory, claimed as it
    /// is written, and the backend's member token and certificate.
    fn member_config(&self, plan: &StorePlan, m: &MemberPlan, front: &Front, shared: &Shared) -> MemberConfig {
        let tls = shared.tls.as_ref();
        let mut cfg = m.config.clone();
        match plan.election.as_ref().filter(|e| e.members_follow_lease) {
            Some(e) => {
                cfg.leader = format!("{}{LEASE_NAMESPACE}/{}", kvcache_store::member::LEASE_SCHEME, e.lease);
                cfg.kubeconfig = Some(self.opts.store_kubeconfig.clone());
            }
            None => {
                cfg.leader = front.grpc.to_string();
                cfg.kubeconfig = None;
            }
        }
        cfg.name = Some(m.name(&plan.backend));
        cfg.listen = SocketAddr::from(([127, 0, 0, 1], 0));
        cfg.data_listen = SocketAddr::from(([127, 0, 0, 1], 0));
        cfg.shm_dir = self.opts.shm_dir.clone();
        cfg.metrics_listen = None;
        cfg.no_prefault = true;
        cfg.spin = Duration::ZERO;
        cfg.member_token_file = shared.member_token.clone();
        if cfg.tier_dir.is_some() {
            // every member of this machine a tier of its own, under the data directory
            cfg.tier_dir = Some(self.tier_dir(&plan.backend, &m.name(&plan.backend)));
        }
        cfg.tls = kvcache_store::tls::ServeFlags {
            tls_cert: tls.map(|t| t.cert.clone()),
            tls_key: tls.map(|t| t.key.clone()),
        };
        cfg.dial = kvcache_store::tls::DialFlags {
            tls_ca: tls.map(|t| t.ca.clone()),
            tls_server_name: tls.map(|_| crate::runtime::store_tls::server_name(&plan.backend)),
            tls_ca_pem: None,
        };
        cfg
    }

    /// A member's hooks: when its process ends, the leader drops its mount at once (it would
    /// otherwise keep the capacity until the member TTL ran out, and refuse the restarted member
    /// its name until then).
    fn member_hooks(&self, backend: &str, leader: SocketAddr, name: String) -> Hooks {
        let mut hooks = self.notify(Changed::Store(backend.to_owned()));
        let token = self.control_token(backend);
        let tls = self.store_tls(backend).ok().flatten();
        hooks.on_exit = Some(std::sync::Arc::new(move || {
            let name = name.clone();
            let token = token.clone();
            let tls = tls.clone();
            Box::pin(async move {
                let removed = tokio::time::timeout(Duration::from_secs(2), async {
                    let client = kvcache_store::client::Client::connect_tls(
                        &leader.to_string(),
                        kvcache_store::proto::Scope::default(),
                        tls,
                    )
                    .await
                    .ok()?;
                    let mut ask = tonic::Request::new(kvcache_store::proto::RemoveMemberRequest { name: name.clone() });
                    if let Some(t) = &token {
                        kvcache_store::auth::attach(&mut ask, t).ok()?;
                    }
                    client.control().remove_member(ask).await.ok()
                })
                .await;
                tracing::info!(member = %name, removed = ?removed.ok().flatten().map(|r| r.into_inner().removed), "member process ended; told the leader");
            })
        }));
        hooks
    }

    /// The backend's front: on the remembered ports when they are still free, else on new ones
    /// (remembered from then on).
    fn front(&self, backend: &str) -> std::io::Result<Front> {
        let file = self.opts.data_dir.join("runtime").join(format!("{backend}.ports"));
        if let Ok(text) = std::fs::read_to_string(&file) {
            let addrs: Vec<SocketAddr> = text.split_whitespace().filter_map(|a| a.parse().ok()).collect();
            if let [grpc, fast] = addrs[..]
                && let Ok(f) = Front::bind(grpc, fast)
            {
                return Ok(f);
            }
        }
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        let f = Front::bind(any, any)?;
        if let Some(dir) = file.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        let _ = std::fs::write(&file, format!("{} {}\n", f.grpc, f.fast));
        Ok(f)
    }

    /// The file of `backend`'s member token, made when missing (`None`, logged, if it cannot be).
    fn member_token_file(&self, backend: &str) -> Option<PathBuf> {
        crate::runtime::tokens::ensure(&self.opts.data_dir, &format!("member-{backend}"))
            .inspect_err(|e| {
                tracing::error!(%backend, error = %e, "cannot write the member token; the leader will mount any member")
            })
            .ok()
            .map(|(p, _)| p)
    }

    /// `backend`'s Control token and its file (`runtime/tokens.rs`), made when missing; `None` if
    /// it could not be written (logged: its leaders then take unauthenticated Control calls).
    pub(super) fn control_token_of(&self, backend: &str) -> Option<(PathBuf, String)> {
        crate::runtime::tokens::ensure(&self.opts.data_dir, &format!("control-{backend}"))
            .inspect_err(|e| {
                tracing::error!(%backend, error = %e, "cannot write the Control token; its leaders will take unauthenticated Control calls")
            })
            .ok()
    }

    /// The file of `backend`'s scrape token (what `/metrics` shows the per-tenant series to),
    /// made when missing (`None`, logged, if it cannot be: the Control token shows them then).
    fn metrics_token_file(&self, backend: &str) -> Option<PathBuf> {
        crate::runtime::tokens::ensure(&self.opts.data_dir, &format!("metrics-{backend}"))
            .inspect_err(|e| tracing::error!(%backend, error = %e, "cannot write the scrape token"))
            .ok()
            .map(|(p, _)| p)
    }

    /// The file of `backend`'s seal key (its leaders' alone), made when missing (`None`, logged, if
    /// it cannot be: each leader process then seals with a key of its own, and a restarted or new
    /// leader adopts nothing its members hold).
    fn seal_key_file(&self, backend: &str) -> Option<PathBuf> {
        crate::runtime::tokens::ensure(&self.opts.data_dir, &format!("seal-{backend}"))
            .inspect_err(|e| {
                tracing::error!(%backend, error = %e, "cannot write the seal key; a failover will not keep the cache")
            })
            .ok()
            .map(|(p, _)| p)
    }
}

/// The observation of a backend whose front could not listen.
fn front_refused(e: &std::io::Error) -> StoreObservation {
    StoreObservation {
        leaders: vec![WorkloadState {
            refused: Some(format!(
                "cannot listen on a loopback port for the backend's front address: {e}"
            )),
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// Why `plan`'s members cannot run, if they cannot: together with the other backends' members
/// they would claim more than `limit` bytes of memory.
fn memory_refusal(state: &State, plan: &StorePlan, limit: u64) -> Option<String> {
    let others: u64 = state
        .stores
        .iter()
        .filter(|(name, _)| **name != plan.backend)
        .flat_map(|(_, s)| s.members.values())
        .filter_map(|m| member_capacity(&m.spec))
        .sum();
    let wanted: u64 = plan.members.iter().map(|m| m.config.capacity).sum();
    (others.saturating_add(wanted) > limit).then(|| {
        format!(
            "the members need {} of memory ({} more for other backends) and this machine has {}; lower capacityPerMember or select fewer nodes",
            format_size(wanted),
            format_size(others),
            format_size(limit)
        )
    })
}

/// The `--capacity` of a member's command line.
fn member_capacity(spec: &ProcessSpec) -> Option<u64> {
    let i = spec.args.iter().position(|a| a == "--capacity")?;
    kvcache_units::parse_bytes(spec.args.get(i + 1)?).ok()
}

/// A `kv-store` command line: the subcommand and its flags, and `--exit-with-stdin`, so the
/// process ends with the server.
pub(super) fn store_args(sub: &str, flags: Vec<String>) -> Vec<String> {
    let mut a = vec!["--exit-with-stdin".to_owned(), sub.to_owned()];
    a.extend(flags);
    a
}

/// `old` when it runs `spec` already (and was not refused); otherwise `old` is stopped and
/// `spec` started.
pub(super) async fn converge(old: Option<Supervised>, spec: ProcessSpec, grace: Duration, hooks: Hooks) -> Supervised {
    match old {
        Some(s) if s.spec == spec && s.state().refused.is_none() => s,
        Some(s) => {
            s.stop().await;
            Supervised::start(spec, grace, hooks)
        }
        None => Supervised::start(spec, grace, hooks),
    }
}
