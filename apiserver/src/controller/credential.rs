//! Each Binding's tenant credential, from minting to retirement (the states are in
//! [`crate::runtime::credentials`]). The Binding controller is the only writer: it mints a
//! credential when the Binding has none (or has one minted for an earlier Binding of the same
//! name), stages a new one when [`ROTATE_ANNOTATION`] changes, gives it to replicas once the
//! leader's ledger holds it, and retires the old one once no replica runs with it. The pool
//! controller reads them to put their hashes in the ledger; the ModelDeployment controller reads
//! them to inject the current one. Every change wakes both (see [`Context::credentials_changed`]).

use kvcache_api::KVCachePoolBinding;
use kvcache_store::proto::TenantStatus;

use super::{Context, Result};
use crate::runtime::credentials::{BindingKey, ROTATE_ANNOTATION, Rotation, TenantCredentials, fingerprint};

/// The key a Binding's credentials are kept under.
pub fn key(b: &KVCachePoolBinding) -> BindingKey {
    BindingKey::new(b.namespace(), b.name())
}

fn uid(b: &KVCachePoolBinding) -> &str {
    b.metadata.uid.as_deref().unwrap_or_default()
}

/// The rotation `b` asks for: its annotation's value, empty without one.
fn requested(b: &KVCachePoolBinding) -> &str {
    b.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ROTATE_ANNOTATION))
        .map_or("", String::as_str)
}

/// What the leader's ledger says of the Binding's tenant, for moving a rotation on.
#[derive(Clone, Copy, Debug)]
pub enum LedgerView<'a> {
    /// The leader could not be read: nothing moves that needs the ledger.
    Unknown,
    /// The leader keeps no ledger (multi-tenancy is off): no credential is checked.
    Unenforced,
    /// The tenant as the ledger holds it, if it does.
    Tenant(Option<&'a TenantStatus>),
}

async fn keep(ctx: &Context, b: &KVCachePoolBinding, c: &TenantCredentials) -> Result<()> {
    ctx.secrets.credentials().put(&key(b), c).await?;
    let _ = ctx.credentials_changed.send(key(b));
    Ok(())
}

/// The Binding's credentials, minted first when it has none of its own, with a rotation staged
/// when one is asked for and none is under way.
pub async fn ensure(ctx: &Context, b: &KVCachePoolBinding) -> Result<TenantCredentials> {
    let kept = ctx.secrets.credentials().get(&key(b)).await?;
    let mut c = match kept {
        Some(c) if c.uid == uid(b) => c,
        previous => {
            let c = TenantCredentials::mint(uid(b), requested(b));
            tracing::info!(
                binding = %key(b),
                fingerprint = %fingerprint(&c.current),
                replaced = previous.is_some(),
                "tenant credential minted"
            );
            keep(ctx, b, &c).await?;
            return Ok(c);
        }
    };
    if c.rotation == Rotation::Steady && c.rotation_request != requested(b) {
        let next = crate::runtime::tokens::fresh();
        tracing::info!(binding = %key(b), next = %fingerprint(&next), "tenant credential rotation staged");
        c.rotation = Rotation::Staged { next };
        c.rotation_request = requested(b).to_owned();
        keep(ctx, b, &c).await?;
    }
    Ok(c)
}

/// Moves a rotation on as far as the ledger and the replicas allow; returns what it did, for an
/// Event, when it moved.
pub async fn advance(
    ctx: &Context,
    b: &KVCachePoolBinding,
    mut c: TenantCredentials,
    ledger: LedgerView<'_>,
) -> Result<Option<String>> {
    let moved = match std::mem::take(&mut c.rotation) {
        Rotation::Staged { next } => {
            let held = match ledger {
                LedgerView::Unknown => false,
                LedgerView::Unenforced => true,
                LedgerView::Tenant(t) => {
                    let h = kvcache_store::auth::sha256(next.as_bytes());
                    t.is_some_and(|t| t.credential_sha256.iter().any(|x| x.as_ref() == h))
                }
            };
            if held {
                let previous = std::mem::replace(&mut c.current, next);
                let msg = format!(
                    "replicas now receive the credential {}; {} stays valid until none runs with it",
                    fingerprint(&c.current),
                    fingerprint(&previous)
                );
                c.rotation = Rotation::Retiring { previous };
                Some(msg)
            } else {
                c.rotation = Rotation::Staged { next };
                None
            }
        }
        Rotation::Retiring { previous } => {
            let fp = fingerprint(&previous);
            let in_use = ctx
                .runtime
                .credential_in_use(b.namespace(), &fp)
                .await
                .map_err(super::Error::Runtime)?;
            if in_use {
                c.rotation = Rotation::Retiring { previous };
                None
            } else {
                Some(format!(
                    "no replica runs with the credential {fp} any more: it is retired"
                ))
            }
        }
        Rotation::Steady => None,
    };
    if let Some(m) = &moved {
        tracing::info!(binding = %key(b), "{m}");
        keep(ctx, b, &c).await?;
    }
    Ok(moved)
}

/// Whether a rotation is under way (the Binding is looked at again soon while it is).
pub fn rotating(c: &TenantCredentials) -> bool {
    c.rotation != Rotation::Steady
}

/// Forgets the Binding's credentials (its deletion completes).
pub async fn forget(ctx: &Context, b: &KVCachePoolBinding) -> Result<()> {
    ctx.secrets.credentials().remove(&key(b)).await?;
    let _ = ctx.credentials_changed.send(key(b));
    Ok(())
}
