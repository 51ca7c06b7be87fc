//! The hooks of `ModelDeployment`: defaults (role kinds, replicas, accelerators from the
//! instance type, router replicas), the fields an update may not change, a warning for a Binding that does not
//! exist yet, and `/status`.

use async_trait::async_trait;
use kvcache_api::binding::BindingSpec;
use kvcache_api::model_deployment::{Connector, ModelDeployment, ModelDeploymentSpec, PortProtocol, RoleKind};
use kvcache_api::quantity::same_quantity;

use super::validation;
use crate::field::{ErrorList, Path};
use crate::registry::{Admission, Change, Context, Reads, RegistryError, StatusStrategy, Strategy, holders};

#[derive(Debug, Default)]
pub struct ModelDeploymentStrategy;

#[async_trait]
impl Strategy for ModelDeploymentStrategy {
    type Kind = ModelDeploymentSpec;
    type Status = ModelDeploymentStatusStrategy;

    fn apply_defaults(&self, obj: &mut ModelDeployment, ctx: &Context) {
        let s = &mut obj.spec;
        if let Some(kv) = s.kv_cache.as_mut() {
            kv.connector.get_or_insert(Connector::Mooncake);
        }
        if let Some(r) = s.router.as_mut() {
            r.replicas.get_or_insert(1);
        }
        for role in &mut s.roles {
            role.kind.get_or_insert(RoleKind::Server);
            role.replicas.get_or_insert(1);
            role.size.get_or_insert(1);
            for port in &mut role.ports {
                port.protocol.get_or_insert(PortProtocol::Tcp);
            }
            // One accelerator per replica when the instance type has any and none is asked for;
            // an explicit 0 is kept.
            let acceleratable = role
                .instance_type
                .as_deref()
                .and_then(|t| ctx.config.get().instance_type(t).cloned())
                .is_some_and(|t| t.accelerators > 0);
            if acceleratable {
                let resources = role.resources.get_or_insert_with(Default::default);
                resources
                    .accelerator
                    .get_or_insert_with(|| kvcache_api::Quantity::new("1"));
            }
        }
    }

    fn validate(&self, obj: &ModelDeployment, ctx: &Context) -> ErrorList {
        validation::validate(obj, ctx)
    }

    fn validate_update(&self, new: &ModelDeployment, old: &ModelDeployment, _ctx: &Context) -> ErrorList {
        let mut errs = ErrorList::new();
        frozen_fields(&new.spec, &old.spec, &mut errs);
        errs
    }

    async fn admit(
        &self,
        change: Change<'_, ModelDeploymentSpec>,
        reads: &mut Reads<'_>,
        _ctx: &Context,
    ) -> Result<Admission, RegistryError> {
        let mut out = Admission::default();
        let Change::Create(md) = change else { return Ok(out) };
        let Some(binding) = md.spec.binding_name() else {
            return Ok(out);
        };
        match reads.object::<BindingSpec>(md.namespace(), binding).await? {
            None => out.warnings.push(format!(
                "KVCachePoolBinding {binding:?} does not exist in namespace {:?} yet: replicas start without the shared cache and attach once it does",
                md.namespace()
            )),
            Some(b) if holders::is_deleting(&b) => out.errors.forbidden(
                &Path::new("spec").child("kvCache").child("poolRef").child("name"),
                holders::deleting_reference("KVCachePoolBinding", binding, "ModelDeployment"),
            ),
            Some(_) => {}
        }
        Ok(out)
    }
}

const IDENTITY: &str = "is part of the deployment's identity and cannot change; create a new ModelDeployment instead";

fn frozen_fields(new: &ModelDeploymentSpec, old: &ModelDeploymentSpec, errs: &mut ErrorList) {
    let spec = Path::new("spec");
    if new.model != old.model {
        errs.forbidden(&spec.child("model"), format!("the model {IDENTITY}"));
    }
    let engine_name = |s: &ModelDeploymentSpec| s.engine.as_ref().and_then(|e| e.name);
    if engine_name(new) != engine_name(old) {
        errs.forbidden(&spec.child("engine").child("name"), format!("the engine {IDENTITY}"));
    }
    if new.kv_cache != old.kv_cache {
        errs.forbidden(
            &spec.child("kvCache"),
            format!("the cache attachment {IDENTITY} (replicas hold the Binding's domain)"),
        );
    }
    if let (Some(a), Some(b)) = (&new.router, &old.router)
        && a.name != b.name
    {
        errs.forbidden(
            &spec.child("router").child("name"),
            "the router's name cannot change in place; remove the router block, then add the new one",
        );
    }
    fn names(s: &ModelDeploymentSpec) -> Vec<&str> {
        let mut v: Vec<&str> = s.roles.iter().map(|r| r.name.as_str()).collect();
        v.sort_unstable();
        v
    }
    if names(new) != names(old) {
        errs.forbidden(
            &spec.child("roles"),
            "roles cannot be added, removed or renamed; create a new ModelDeployment instead (reordering is fine)",
        );
        return;
    }
    for (i, role) in new.roles.iter().enumerate() {
        let Some(before) = old.roles.iter().find(|r| r.name == role.name) else {
            continue;
        };
        let p = spec.child("roles").index(i);
        if role.kind != before.kind {
            errs.forbidden(&p.child("kind"), format!("a role's kind {IDENTITY}"));
        }
        if role.size != before.size {
            errs.forbidden(&p.child("size"), "a role's size cannot change yet");
        }
        if role.instance_type != before.instance_type {
            errs.forbidden(&p.child("instanceType"), "a role's instance type cannot change yet");
        }
        let accel = |r: &kvcache_api::model_deployment::Role| r.resources.as_ref().and_then(|x| x.accelerator.clone());
        let mut a = role.resources.clone();
        let mut b = before.resources.clone();
        if let (Some(a), Some(b)) = (a.as_mut(), b.as_mut()) {
            a.accelerator = None;
            b.accelerator = None;
        }
        if a != b || !same_quantity(accel(role).as_ref(), accel(before).as_ref()) {
            errs.forbidden(&p.child("resources"), "a role's resources cannot change yet");
        }
        if role.command != before.command {
            errs.forbidden(&p.child("command"), "a role's command cannot change yet");
        }
    }
}

/// `/status` of a ModelDeployment: written by its controller.
#[derive(Debug, Default)]
pub struct ModelDeploymentStatusStrategy;

impl StatusStrategy for ModelDeploymentStatusStrategy {
    type Kind = ModelDeploymentSpec;

    fn validate_update(&self, new: &ModelDeployment, _old: &ModelDeployment) -> ErrorList {
        let mut errs = ErrorList::new();
        if let Some(s) = new.status.as_ref() {
            crate::registry::validation::conditions(&s.conditions, &Path::new("status").child("conditions"), &mut errs);
        }
        errs
    }
}
