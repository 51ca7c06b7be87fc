//! Domain claims: a cache domain is one tenant of a backend's store, so at most one Binding per
//! backend may hold a domain name.
//!
//! A claim is a key (`/claims/domains/<backend>/<domain>`) written in the same transaction as
//! the Binding; two concurrent creates of the same domain on one backend cannot both commit, and
//! the loser is refused naming the holder. A Binding whose pool does not exist yet is accepted
//! without a claim and takes it on its first write after the pool appears (if the name is still
//! free; otherwise the Binding stays unclaimed and its status reports the contest). The claim is
//! released in the transaction that removes the Binding.
//!
//! This module also checks what needs the pool: the ceiling against the pool's total, the
//! ceilings of all the pool's Bindings against it (a warning of what the grants become), and a
//! second distinct domain on a backend that keeps no tenant ledger.

use kvcache_api::backend::BackendSpec;
use kvcache_api::binding::{BindingSpec, KVCachePoolBinding};
use kvcache_api::pool::{KVCachePool, PoolSpec};
use kvcache_api::quantity::same_quantity;
use serde::{Deserialize, Serialize};

use crate::field::{ErrorList, Path};
use crate::registry::{Admission, Change, Reads, RegistryError};
use crate::storage::{Op, keys};

/// Value of a domain claim key: who holds it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Holder {
    namespace: String,
    name: String,
    uid: String,
    pool: String,
}

/// Value of a Binding's claim record: which claim it holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Held {
    backend: String,
    domain: String,
}

pub async fn admit(change: Change<'_, BindingSpec>, reads: &mut Reads<'_>) -> Result<Admission, RegistryError> {
    let mut out = Admission::default();
    match change {
        Change::Create(b) => {
            let pool = read_pool(b, true, reads, &mut out).await?;
            if let Some(pool) = &pool {
                check_ceiling(b, pool, &mut out.errors);
                warn_of_cuts(b, pool, reads, &mut out).await?;
            }
            if out.errors.is_empty() {
                settle_claim(b, pool.as_ref(), true, reads, &mut out).await?;
            }
        }
        Change::Update { new, old } => {
            let pool = read_pool(new, false, reads, &mut out).await?;
            let ceiling = |b: &KVCachePoolBinding| b.spec.quota.as_ref().and_then(|q| q.ceiling.clone());
            if let Some(pool) = &pool
                && !same_quantity(ceiling(new).as_ref(), ceiling(old).as_ref())
            {
                check_ceiling(new, pool, &mut out.errors);
                warn_of_cuts(new, pool, reads, &mut out).await?;
            }
            if out.errors.is_empty() {
                settle_claim(new, pool.as_ref(), false, reads, &mut out).await?;
            }
        }
        Change::Delete(b) => release(b, reads, &mut out).await?,
    }
    Ok(out)
}

async fn read_pool(
    b: &KVCachePoolBinding,
    creating: bool,
    reads: &mut Reads<'_>,
    out: &mut Admission,
) -> Result<Option<KVCachePool>, RegistryError> {
    let name = b.spec.pool_name();
    let pool = reads.object::<PoolSpec>("", name).await?;
    match &pool {
        None => out.warnings.push(format!(
            "KVCachePool {name:?} does not exist yet: this Binding claims its domain and gets quota once the pool exists"
        )),
        // Only a new Binding: an update keeps working while its pool goes (the pool is fixed).
        Some(p) if creating && crate::registry::holders::is_deleting(p) => out.errors.forbidden(
            &Path::new("spec").child("poolRef").child("name"),
            crate::registry::holders::deleting_reference("KVCachePool", name, "Binding"),
        ),
        Some(_) => {}
    }
    Ok(pool)
}

/// Warns when this Binding's ceiling, with its pool's other Bindings', is more than the pool's
/// total: what every grant in the pool becomes.
async fn warn_of_cuts(
    b: &KVCachePoolBinding,
    pool: &KVCachePool,
    reads: &mut Reads<'_>,
    out: &mut Admission,
) -> Result<(), RegistryError> {
    use crate::registry::grants;
    let (Some(total), Some(this)) = (grants::total_of(pool), grants::ask_of(b)) else {
        return Ok(());
    };
    if !out.errors.is_empty() {
        return Ok(());
    }
    let mut asks = grants::asks_in(pool.name(), Some(&this.binding), reads).await?;
    let name = this.binding.clone();
    asks.push(this);
    out.warnings
        .extend(grants::binding_warning(pool.name(), total, &asks, &name));
    Ok(())
}

fn check_ceiling(b: &KVCachePoolBinding, pool: &KVCachePool, errs: &mut ErrorList) {
    let parse = |q: Option<&kvcache_api::Quantity>| q.and_then(|q| q.parse().ok());
    let ceiling = parse(b.spec.quota.as_ref().and_then(|q| q.ceiling.as_ref()));
    let total_q = pool.spec.quota.as_ref().and_then(|q| q.total.as_ref());
    if let (Some(c), Some(t)) = (ceiling, parse(total_q))
        && c.cmp_value(&t).is_gt()
    {
        errs.invalid(
            &Path::new("spec").child("quota").child("ceiling"),
            b.spec
                .quota
                .as_ref()
                .and_then(|q| q.ceiling.as_ref())
                .map(|q| q.as_str())
                .unwrap_or_default(),
            format!(
                "must not exceed the pool's own total of {} (KVCachePool {:?})",
                total_q.map(|q| q.as_str()).unwrap_or_default(),
                pool.name()
            ),
        );
    }
}

/// Takes (or keeps, or moves) the Binding's claim so that it matches its pool's backend.
async fn settle_claim(
    b: &KVCachePoolBinding,
    pool: Option<&KVCachePool>,
    creating: bool,
    reads: &mut Reads<'_>,
    out: &mut Admission,
) -> Result<(), RegistryError> {
    let domain = b.spec.domain_name();
    let want = pool.and_then(|p| p.spec.backend()).map(|backend| Held {
        backend: backend.to_owned(),
        domain: domain.to_owned(),
    });
    let held_key = keys::binding_claim(b.namespace(), b.name());
    let held: Option<Held> = match reads.get(&held_key).await? {
        Some(kv) => serde_json::from_slice(&kv.value).ok(),
        None => None,
    };
    if held.is_some() && held == want {
        return Ok(());
    }
    if let Some(h) = &held {
        release_claim(b, h, reads, out).await?;
    }
    let (Some(want), Some(pool)) = (want, pool) else {
        if held.is_some() {
            out.ops.push(Op::Delete { key: held_key });
        }
        return Ok(());
    };
    let claim_key = keys::domain_claim(&want.backend, &want.domain);
    let holder: Option<Holder> = match reads.get(&claim_key).await? {
        Some(kv) => serde_json::from_slice(&kv.value).ok(),
        None => None,
    };
    let me = uid(b);
    match holder {
        Some(h) if h.uid == me => {}
        Some(h) => {
            let msg = format!(
                "domain {domain:?} is already claimed on KVCacheBackend {:?} by KVCachePoolBinding {}/{}: a domain is one tenant of the store, so two Bindings on one backend cannot share it. Choose another domain name, or attach through that Binding",
                want.backend, h.namespace, h.name
            );
            if creating {
                out.errors
                    .duplicate(&Path::new("spec").child("domain").child("name"), domain, msg);
            } else {
                out.warnings
                    .push(format!("this Binding does not hold its domain: {msg}"));
                if held.is_some() {
                    out.ops.push(Op::Delete { key: held_key });
                }
            }
            return Ok(());
        }
        None => {
            if creating {
                check_separability(b, pool, &want, reads, out).await?;
                if !out.errors.is_empty() {
                    return Ok(());
                }
            }
            let holder = Holder {
                namespace: b.namespace().to_owned(),
                name: b.name().to_owned(),
                uid: me,
                pool: pool.name().to_owned(),
            };
            out.ops.push(Op::Put {
                key: claim_key,
                value: json(&holder)?,
            });
        }
    }
    out.ops.push(Op::Put {
        key: held_key,
        value: json(&want)?,
    });
    Ok(())
}

async fn release(b: &KVCachePoolBinding, reads: &mut Reads<'_>, out: &mut Admission) -> Result<(), RegistryError> {
    let held_key = keys::binding_claim(b.namespace(), b.name());
    let Some(kv) = reads.get(&held_key).await? else {
        return Ok(());
    };
    if let Ok(h) = serde_json::from_slice::<Held>(&kv.value) {
        release_claim(b, &h, reads, out).await?;
    }
    out.ops.push(Op::Delete { key: held_key });
    Ok(())
}

async fn release_claim(
    b: &KVCachePoolBinding,
    h: &Held,
    reads: &mut Reads<'_>,
    out: &mut Admission,
) -> Result<(), RegistryError> {
    let key = keys::domain_claim(&h.backend, &h.domain);
    if let Some(kv) = reads.get(&key).await?
        && serde_json::from_slice::<Holder>(&kv.value).is_ok_and(|holder| holder.uid == uid(b))
    {
        out.ops.push(Op::Delete { key });
    }
    Ok(())
}

/// A second distinct domain on one backend is refused when the backend is known to keep no
/// tenant ledger (every write would land in one shared default tenant), admitted when it is
/// known to keep one, and admitted with a warning while that is not known.
async fn check_separability(
    b: &KVCachePoolBinding,
    pool: &KVCachePool,
    want: &Held,
    reads: &mut Reads<'_>,
    out: &mut Admission,
) -> Result<(), RegistryError> {
    let prefix = keys::domain_claims_of(&want.backend);
    let neighbours: Vec<(String, Holder)> = reads
        .list(&prefix)
        .await?
        .into_iter()
        .filter_map(|kv| {
            let domain = kv.key.strip_prefix(&prefix)?.to_owned();
            let holder: Holder = serde_json::from_slice(&kv.value).ok()?;
            (domain != want.domain).then_some((domain, holder))
        })
        .collect();
    let Some((domain, holder)) = neighbours.first() else {
        return Ok(());
    };
    let mut observed = observed_ledger(pool);
    for (_, h) in &neighbours {
        if observed.is_some() {
            break;
        }
        if h.pool != pool.name()
            && let Some(p) = reads.object::<PoolSpec>("", &h.pool).await?
        {
            observed = observed_ledger(&p);
        }
    }
    let ledger = match observed {
        Some(v) => Some(v),
        None => reads
            .object::<BackendSpec>("", &want.backend)
            .await?
            .and_then(|backend| backend.spec.declared_multi_tenancy()),
    };
    match ledger {
        Some(false) => out.errors.invalid(
            &Path::new("spec").child("domain").child("name"),
            b.spec.domain_name(),
            format!(
                "KVCacheBackend {:?} keeps no per-tenant ledger, so every write lands in one default tenant: this domain would share and overwrite the cache of domain {domain:?} (KVCachePoolBinding {}/{}). Use that domain, or turn on multiTenancy on the backend",
                want.backend, holder.namespace, holder.name
            ),
        ),
        // The ledger keeps each domain a tenant of its own, and injection gives every replica
        // its tenant: nothing to warn of.
        Some(true) => {}
        None => out.warnings.push(format!(
            "domain {:?} is a second domain on KVCacheBackend {:?} beside {domain:?} (KVCachePoolBinding {}/{}), and whether that backend keeps a tenant ledger is not known yet (it does not exist, or its pools have not read it): without one, both domains write to one shared cache",
            want.domain, want.backend, holder.namespace, holder.name
        )),
    }
    Ok(())
}

/// What a pool has observed about its backend's ledger: `Some(false)` when it reported
/// `QuotaLedgerAvailable=False/MultiTenancyDisabled`, `Some(true)` when available, `None` when
/// unknown (an unreachable ledger is an outage, not an answer).
fn observed_ledger(pool: &KVCachePool) -> Option<bool> {
    let c = pool
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "QuotaLedgerAvailable")?;
    match (c.status.as_str(), c.reason.as_str()) {
        ("True", _) => Some(true),
        ("False", "MultiTenancyDisabled") => Some(false),
        _ => None,
    }
}

fn uid(b: &KVCachePoolBinding) -> String {
    b.metadata.uid.clone().unwrap_or_default()
}

fn json<T: Serialize>(v: &T) -> Result<crate::storage::Value, RegistryError> {
    serde_json::to_vec(v)
        .map(Into::into)
        .map_err(|e| RegistryError::Internal(format!("encoding a domain claim: {e}")))
}
