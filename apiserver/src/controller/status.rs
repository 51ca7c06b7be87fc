//! Writing what a pass observed: `/status` replaced only when it differs from what is stored (a
//! settled system makes no writes), with an event for every condition that changed, and the finalizer added to live objects and removed once
//! their release is done, each a JSON patch guarded by a `test` of the list it changes.

use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use kvcache_api::{Kind, Object};
use serde_json::json;

use super::{Context, FINALIZER, KindLabel, Result};

/// Replaces the status of `obj` with `status` unless it is already that; returns whether it wrote.
pub async fn write<K>(api: &Api<Object<K>>, obj: &Object<K>, status: K::Status, ctx: &Context) -> Result<bool>
where
    K: Kind,
    Object<K>: kube::Resource<DynamicType = ()>,
{
    if obj.status.as_ref() == Some(&status) {
        return Ok(false);
    }
    let changed = super::events::transitions(
        &super::events::conditions_of(obj.status.as_ref()),
        &super::events::conditions_of(Some(&status)),
    );
    let mut next = obj.clone();
    next.status = Some(status);
    let written = api.replace_status(obj.name(), &PostParams::default(), &next).await?;
    ctx.metrics
        .status_writes
        .get_or_create(&KindLabel { kind: K::KIND })
        .inc();
    for (warning, reason, message) in changed {
        super::events::record(ctx, &written, warning, &reason, &message).await;
    }
    Ok(true)
}

/// Whether `obj` carries our finalizer.
pub fn has_finalizer<K: Kind>(obj: &Object<K>) -> bool {
    obj.metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|n| n == FINALIZER))
}

/// Adds our finalizer to a live object that lacks it; returns whether it did (the object changed,
/// so its watch event brings the next pass).
pub async fn add_finalizer<K>(api: &Api<Object<K>>, obj: &Object<K>) -> Result<bool>
where
    K: Kind,
    Object<K>: kube::Resource<DynamicType = ()>,
{
    if has_finalizer(obj) {
        return Ok(false);
    }
    let patch = match &obj.metadata.finalizers {
        None => json!([{"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]}]),
        Some(list) => json!([
            {"op": "test", "path": "/metadata/finalizers", "value": list},
            {"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER},
        ]),
    };
    api.patch(
        obj.name(),
        &PatchParams::default(),
        &Patch::<()>::Json(serde_json::from_value(patch)?),
    )
    .await?;
    Ok(true)
}

/// Removes our finalizer: the object's release is complete.
pub async fn remove_finalizer<K>(api: &Api<Object<K>>, obj: &Object<K>) -> Result<()>
where
    K: Kind,
    Object<K>: kube::Resource<DynamicType = ()>,
{
    let Some(list) = &obj.metadata.finalizers else {
        return Ok(());
    };
    let Some(i) = list.iter().position(|n| n == FINALIZER) else {
        return Ok(());
    };
    let patch = json!([
        {"op": "test", "path": "/metadata/finalizers", "value": list},
        {"op": "remove", "path": format!("/metadata/finalizers/{i}")},
    ]);
    match api
        .patch(
            obj.name(),
            &PatchParams::default(),
            &Patch::<()>::Json(serde_json::from_value(patch)?),
        )
        .await
    {
        Ok(_) => Ok(()),
        // already gone: the release is complete either way
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Where a kind's phase axes stand, for the pool's and the Binding's phase: the first axis present
/// and not `True` (and not excused) is an Error, else the first missing one is Provisioning, else
/// Ready.
#[derive(Debug, PartialEq, Eq)]
pub enum Axes {
    /// The first axis present and not `True` (and not excused), with its message: `Error`.
    Fault(String),
    /// The first axis not observed yet: `Provisioning`.
    Missing(&'static str),
    /// Every axis `True` (or excused): `Ready`.
    Clear,
}

/// Scans `axes` in order: a present axis that is not `True` is a fault unless `excused` says its
/// reason is no fault; then the first missing one; else clear.
pub fn axes(
    conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    axes: &[kvcache_api::conditions::ConditionType],
    excused: impl Fn(&str) -> bool,
) -> Axes {
    use kvcache_api::conditions::{ConditionStatus, find};
    for t in axes {
        if let Some(c) = find(conditions, *t)
            && c.status != ConditionStatus::True.as_str()
            && !excused(&c.reason)
        {
            return Axes::Fault(c.message.clone());
        }
    }
    match axes.iter().find(|t| find(conditions, **t).is_none()) {
        Some(t) => Axes::Missing(t.as_str()),
        None => Axes::Clear,
    }
}
