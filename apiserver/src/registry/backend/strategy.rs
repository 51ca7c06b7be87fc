//! The hooks of `KVCacheBackend`: defaults, and the rules of an update (the branch, the store
//! type and each member group's medium are fixed; a group's position is its identity; the
//! tenant ledger cannot be withdrawn while pools use the backend), and `/status`.

use kvcache_api::backend::{
    AllocationStrategy, BackendSpec, BackendType, ElectionBackend, KVCacheBackend, MemberAddressing, MemberGroup,
};
use kvcache_api::common::{Protocol, Transport};
use kvcache_api::quantity::Quantity;

use super::validation;
use crate::field::{ErrorList, Path};
use crate::registry::{Context, RegistryError, StatusStrategy, Strategy, holders};
use crate::storage::Storage;

/// Consumers named in a refusal before "and N more".
const MAX_NAMED_CONSUMERS: usize = 20;

#[derive(Debug, Default)]
pub struct BackendStrategy;

#[async_trait::async_trait]
impl Strategy for BackendStrategy {
    type Kind = BackendSpec;
    type Status = BackendStatusStrategy;

    fn apply_defaults(&self, obj: &mut KVCacheBackend, _ctx: &Context) {
        let s = &mut obj.spec;
        s.type_.get_or_insert(BackendType::Mooncake);
        s.transport
            .get_or_insert_with(Transport::default)
            .protocol
            .get_or_insert(Protocol::Auto);
        let Some(m) = s.connection.as_mut().and_then(|c| c.managed.as_mut()) else {
            return;
        };
        if let Some(l) = m.leader.as_mut() {
            l.replicas.get_or_insert(1);
            l.election_backend.get_or_insert(ElectionBackend::Kubernetes);
            l.member_addressing.get_or_insert(MemberAddressing::Service);
            l.allocation_strategy.get_or_insert(AllocationStrategy::FreeRatioFirst);
            l.multi_tenancy.get_or_insert(true);
        }
        for g in &mut m.members {
            // A present transport block means Auto when it names no protocol (the reference's
            // behaviour: `transport: {}` is TCP, not "inherit").
            if let Some(t) = g.transport.as_mut() {
                t.protocol.get_or_insert(Protocol::Auto);
            }
        }
    }

    fn validate(&self, obj: &KVCacheBackend, ctx: &Context) -> ErrorList {
        validation::validate(obj, ctx)
    }

    fn warnings_on_create(&self, obj: &KVCacheBackend, _ctx: &Context) -> Vec<String> {
        validation::warnings(obj)
    }

    async fn warnings_on_delete(
        &self,
        obj: &KVCacheBackend,
        storage: &dyn Storage,
    ) -> Result<Vec<String>, RegistryError> {
        let pools = holders::of_backend(storage, obj.name()).await?;
        Ok(Vec::from_iter((!pools.is_empty()).then(|| {
            holders::delete_warning("KVCacheBackend", obj.name(), "backend", &pools)
        })))
    }

    fn validate_update(&self, new: &KVCacheBackend, old: &KVCacheBackend, ctx: &Context) -> ErrorList {
        let mut errs = ErrorList::new();
        // Flipping the election re-judges the leader's passthrough lists even where they did
        // not change (it changes which flags are derived), so their errors are not ratcheted.
        if leader_election(&new.spec) != leader_election(&old.spec) {
            let leader_lists = "spec.connection.managed.leader.extra";
            for e in validation::validate(new, ctx).0 {
                if e.field.as_str().starts_with(leader_lists) {
                    errs.push(e);
                }
            }
        }
        immutable_fields(new, old, &mut errs);
        group_moves(&new.spec, &old.spec, &mut errs);
        if let (Some(n), Some(o)) = (new.spec.managed(), old.spec.managed()) {
            let members = Path::new("spec").child("connection").child("managed").child("members");
            super::tier::frozen(n, o, &members, &mut errs);
        }
        tenancy_withdrawal(new, old, &mut errs);
        errs
    }

    fn warnings_on_update(&self, new: &KVCacheBackend, _old: &KVCacheBackend, _ctx: &Context) -> Vec<String> {
        validation::warnings(new)
    }
}

fn leader_election(s: &BackendSpec) -> Option<ElectionBackend> {
    s.managed()?.leader.as_ref()?.election_backend
}

fn immutable_fields(new: &KVCacheBackend, old: &KVCacheBackend, errs: &mut ErrorList) {
    let spec = Path::new("spec");
    if new.spec.type_ != old.spec.type_ {
        errs.forbidden(
            &spec.child("type"),
            "the store type cannot change; create a new backend instead",
        );
    }
    let branch = |s: &BackendSpec| (s.managed().is_some(), s.external().is_some());
    if branch(&new.spec) != branch(&old.spec) {
        errs.forbidden(
            &spec.child("connection"),
            "a backend cannot switch between managed and external; create a new backend instead",
        );
    }
    if let (Some(n), Some(o)) = (new.spec.managed(), old.spec.managed()) {
        for (i, (ng, og)) in n.members.iter().zip(&o.members).enumerate() {
            if ng.medium != og.medium {
                errs.forbidden(
                    &spec
                        .child("connection")
                        .child("managed")
                        .child("members")
                        .index(i)
                        .child("medium"),
                    "the medium of a member group cannot change; append a new group and remove this one from the end",
                );
            }
        }
    }
}

/// A group's position is its identity (member `i` runs as `<name>-member-<i>`). Refuses an
/// update that moves a group to another position; appending, removing the last group, and
/// editing a group in place are fine.
fn group_moves(new: &BackendSpec, old: &BackendSpec, errs: &mut ErrorList) {
    let (Some(n), Some(o)) = (new.managed(), old.managed()) else {
        return;
    };
    let (n, o) = (&n.members, &o.members);
    let same = |a: &MemberGroup, b: &MemberGroup| canonical(a) == canonical(b);
    let unchanged_at = |j: usize| j < n.len() && same(&n[j], &o[j]);
    for i in 0..n.len().min(o.len()) {
        if same(&n[i], &o[i]) {
            continue;
        }
        if let Some(j) = (0..o.len()).find(|&j| j != i && same(&n[i], &o[j]) && !unchanged_at(j)) {
            errs.forbidden(
                &Path::new("spec").child("connection").child("managed").child("members").index(i),
                format!(
                    "the group from position {j} has moved here; a group's position is its identity (its members run as <name>-member-<position>), so append new groups or remove groups from the end (or narrow a group's nodeSelector to no nodes) instead of reordering"
                ),
            );
        }
    }
}

/// A group with its quantities in canonical form, so `1Gi` and `1024Mi` compare equal.
fn canonical(g: &MemberGroup) -> MemberGroup {
    let norm = |q: &Option<Quantity>| {
        q.as_ref().map(|q| match q.parse().ok().and_then(|p| p.to_i64_ceil()) {
            Some(bytes) => Quantity::from_bytes(bytes),
            None => q.clone(),
        })
    };
    let mut c = g.clone();
    c.capacity_per_member = norm(&g.capacity_per_member);
    c.local_buffer_size = norm(&g.local_buffer_size);
    c
}

/// Turning the tenant ledger off while pools hold the backend would drop every tenant's quota.
fn tenancy_withdrawal(new: &KVCacheBackend, old: &KVCacheBackend, errs: &mut ErrorList) {
    let tenancy = |b: &KVCacheBackend| {
        b.spec
            .managed()
            .map(|_| b.spec.declared_multi_tenancy().unwrap_or(true))
    };
    if tenancy(old) != Some(true) || tenancy(new) != Some(false) {
        return;
    }
    let used_by = old.status.as_ref().map(|s| s.used_by.as_slice()).unwrap_or_default();
    if used_by.is_empty() {
        return;
    }
    let mut names: Vec<String> = used_by
        .iter()
        .take(MAX_NAMED_CONSUMERS)
        .map(|u| {
            if u.namespace.is_empty() {
                format!("{}/{}", u.kind, u.name)
            } else {
                format!("{}/{}/{}", u.kind, u.namespace, u.name)
            }
        })
        .collect();
    if used_by.len() > MAX_NAMED_CONSUMERS {
        names.push(format!("and {} more", used_by.len() - MAX_NAMED_CONSUMERS));
    }
    errs.forbidden(
        &Path::new("spec")
            .child("connection")
            .child("managed")
            .child("leader")
            .child("multiTenancy"),
        format!(
            "the tenant ledger cannot be turned off while it is in use by {}; delete or move those pools first",
            names.join(", ")
        ),
    );
}

/// `/status` of a backend: written by its controller.
#[derive(Debug, Default)]
pub struct BackendStatusStrategy;

impl StatusStrategy for BackendStatusStrategy {
    type Kind = BackendSpec;

    fn validate_update(&self, new: &KVCacheBackend, _old: &KVCacheBackend) -> ErrorList {
        let mut errs = ErrorList::new();
        let Some(s) = new.status.as_ref() else { return errs };
        let p = Path::new("status");
        crate::registry::validation::conditions(&s.conditions, &p.child("conditions"), &mut errs);
        if let Some(c) = &s.capacity {
            for (name, q) in [("total", &c.total), ("used", &c.used)] {
                if let Some(q) = q {
                    crate::registry::validation::byte_quantity(q, &p.child("capacity").child(name), true, &mut errs);
                }
            }
        }
        errs
    }
}
