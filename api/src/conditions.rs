//! Conditions and phases: every condition type and reason each kind reports, as typed constants,
//! the phase of each kind as a type (serialised as the same strings),
//! and [`set`], which records a condition the way `meta.SetStatusCondition` does: the
//! `lastTransitionTime` moves only when the condition's status changes.
//!
//! Condition types and reasons are spelled positively: `True` is the healthy state, `False` a
//! fault. A condition module holds its `TYPE` and the reasons it may carry:
//! `conditions::backend::leader_available::{TYPE, SERVING}`. Some reasons are open-ended (a
//! kubelet waiting reason such as `ImagePullBackOff` becomes `LeaderAvailable`'s reason as it is),
//! which is why [`set`] takes the reason as a string.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The `type` of a condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConditionType(&'static str);

impl ConditionType {
    pub const fn as_str(self) -> &'static str {
        self.0
    }
}

/// The `reason` of a condition: one CamelCase word.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Reason(&'static str);

impl Reason {
    pub const fn as_str(self) -> &'static str {
        self.0
    }
}

impl AsRef<str> for Reason {
    fn as_ref(&self) -> &str {
        self.0
    }
}

/// The `status` of a condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ConditionStatus {
    True,
    False,
    Unknown,
}

impl ConditionStatus {
    pub const fn as_str(self) -> &'static str {
        match self {
            ConditionStatus::True => "True",
            ConditionStatus::False => "False",
            ConditionStatus::Unknown => "Unknown",
        }
    }

    pub fn parse(s: &str) -> Option<ConditionStatus> {
        match s {
            "True" => Some(ConditionStatus::True),
            "False" => Some(ConditionStatus::False),
            "Unknown" => Some(ConditionStatus::Unknown),
            _ => None,
        }
    }
}

/// What a controller observed, for [`set`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observation {
    pub type_: ConditionType,
    pub status: ConditionStatus,
    /// A reason constant, or an open-ended reason such as a kubelet waiting reason.
    pub reason: String,
    /// What the state means and, for a fault, what to do.
    pub message: String,
    /// The `metadata.generation` the observation was made against.
    pub observed_generation: Option<i64>,
}

impl Observation {
    pub fn new(
        type_: ConditionType,
        status: ConditionStatus,
        reason: impl AsRef<str>,
        message: impl Into<String>,
    ) -> Self {
        Observation {
            type_,
            status,
            reason: reason.as_ref().to_owned(),
            message: message.into(),
            observed_generation: None,
        }
    }

    pub fn generation(mut self, generation: Option<i64>) -> Self {
        self.observed_generation = generation;
        self
    }
}

/// Records `observation` in `conditions`, as `meta.SetStatusCondition`: a new type is appended
/// with `lastTransitionTime = now`; an existing one takes the new reason, message and generation,
/// and its `lastTransitionTime` moves to `now` only if its status changed. Returns whether
/// anything changed (a settled controller writes nothing).
pub fn set(conditions: &mut Vec<Condition>, observation: Observation, now: &Time) -> bool {
    let Observation {
        type_,
        status,
        reason,
        message,
        observed_generation,
    } = observation;
    match conditions.iter_mut().find(|c| c.type_ == type_.as_str()) {
        None => {
            conditions.push(Condition {
                last_transition_time: now.clone(),
                message,
                observed_generation,
                reason,
                status: status.as_str().to_owned(),
                type_: type_.as_str().to_owned(),
            });
            true
        }
        Some(c) => {
            let mut changed = false;
            if c.status != status.as_str() {
                c.status = status.as_str().to_owned();
                c.last_transition_time = now.clone();
                changed = true;
            }
            if c.reason != reason {
                c.reason = reason;
                changed = true;
            }
            if c.message != message {
                c.message = message;
                changed = true;
            }
            if c.observed_generation != observed_generation {
                c.observed_generation = observed_generation;
                changed = true;
            }
            changed
        }
    }
}

/// The condition of `type_`, if present.
pub fn find(conditions: &[Condition], type_: ConditionType) -> Option<&Condition> {
    conditions.iter().find(|c| c.type_ == type_.as_str())
}

/// Whether the condition of `type_` is present and `True`.
pub fn is_true(conditions: &[Condition], type_: ConditionType) -> bool {
    find(conditions, type_).is_some_and(|c| c.status == ConditionStatus::True.as_str())
}

/// Removes the condition of `type_`; returns whether it was there.
pub fn remove(conditions: &mut Vec<Condition>, type_: ConditionType) -> bool {
    let before = conditions.len();
    conditions.retain(|c| c.type_ != type_.as_str());
    conditions.len() != before
}

/// A condition module: its `TYPE`, its reasons, and `REASONS` listing them.
macro_rules! condition {
    ($(#[$doc:meta])* $module:ident = $type:literal { $($(#[$rdoc:meta])* $reason:ident = $text:literal),* $(,)? }) => {
        $(#[$doc])*
        pub mod $module {
            use crate::conditions::{ConditionType, Reason};
            pub const TYPE: ConditionType = ConditionType($type);
            $($(#[$rdoc])* pub const $reason: Reason = Reason($text);)*
            /// Every fixed reason of this condition.
            pub const REASONS: &[Reason] = &[$($reason),*];
        }
    };
}

/// A phase: a closed set of CamelCase words, serialised as the word.
macro_rules! phase {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
        pub enum $name {
            $($(#[$vdoc])* $variant),+
        }

        impl $name {
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => stringify!($variant)),+
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

phase!(
    /// Summary of a backend's state.
    BackendPhase {
        /// The workloads are starting, or the leader has not been observed serving yet.
        Provisioning,
        /// The leader serves and nothing is wrong.
        Ready,
        /// The leader serves, but members are missing or spec changes cannot be rendered.
        Degraded,
        /// The leader cannot serve: it is unschedulable, crash-looping or unreachable.
        Error,
        /// Deletion has begun; consumers may still hold the backend.
        Deleting,
    }
);

phase!(
    /// Summary of a pool's state.
    PoolPhase {
        Provisioning,
        Ready,
        Degraded,
        Error,
        Deleting,
    }
);

phase!(
    /// Summary of a Binding's state.
    BindingPhase {
        Provisioning,
        Ready,
        Error,
        Deleting,
    }
);

phase!(
    /// Summary of a ModelDeployment's state.
    ModelDeploymentPhase {
        /// No replica is ready yet.
        Starting,
        /// Every desired replica is ready, with the cache it asks for, and the router (when one
        /// is declared) has a ready replica.
        Ready,
        /// Some replicas are ready, not all; or all are, without the cache they ask for (their
        /// Binding does not exist), or without a ready router.
        Degraded,
        Deleting,
    }
);

/// `KVCacheBackend` conditions.
pub mod backend {
    condition!(
        /// Whether the leader serves. `False` reasons also include kubelet waiting reasons
        /// (`ImagePullBackOff`, `ErrImagePull`, `CreateContainerConfigError`, ...), used as they are.
        leader_available = "LeaderAvailable" {
            SERVING = "Serving",
            NO_ADMIN_ENDPOINT = "NoAdminEndpoint",
            LEADER_STARTING = "LeaderStarting",
            LEADER_UNREACHABLE = "LeaderUnreachable",
            LEADER_UNSCHEDULABLE = "LeaderUnschedulable",
            LEADER_CRASH_LOOPING = "LeaderCrashLooping",
            SERVICE_PLANE_NOT_ACTIVE = "ServicePlaneNotActive",
        }
    );
    condition!(
        /// Whether the store's capacity was read. `False` also takes the leader-read reasons.
        capacity_observed = "CapacityObserved" {
            OBSERVED = "Observed",
            SERVICE_PLANE_NOT_ACTIVE = "ServicePlaneNotActive",
            SCRAPE_FAILED = "ScrapeFailed",
            FAMILY_MISSING = "FamilyMissing",
        }
    );
    condition!(
        /// Whether the member segments are mounted. `False` also takes member Pod fault reasons
        /// (kubelet waiting reasons) and the leader-read reasons.
        members_mounted = "MembersMounted" {
            MOUNTED = "Mounted",
            NO_SEGMENTS = "NoSegments",
            SEGMENTS_SHORT = "SegmentsShort",
            AMBIGUOUS_MEMBER_IDENTITY = "AmbiguousMemberIdentity",
            PODS_UNREADABLE = "PodsUnreadable",
            LISTING_FAILED = "ListingFailed",
            LISTING_TOO_LARGE = "ListingTooLarge",
            LEGACY_MEMBER_STATUS = "LegacyMemberStatus",
            UNSCHEDULABLE = "Unschedulable",
            MEMBER_CRASH_LOOPING = "MemberCrashLooping",
            MEMBER_INIT_CRASH_LOOPING = "MemberInitCrashLooping",
            SEGMENT_LISTING_NOT_SERVED = "SegmentListingNotServed",
            /// The members would need more memory than the machine has (local runtime): they
            /// are not started.
            INSUFFICIENT_MEMORY = "InsufficientMemory",
        }
    );
    condition!(
        /// Whether writes were observed landing in the store.
        pool_writes = "PoolWrites" {
            WRITE_OBSERVED = "WriteObserved",
            ALLOCATION_OBSERVED = "AllocationObserved",
            WRITES_REVOKED = "WritesRevoked",
            READ_FAILED = "ReadFailed",
            SEGMENT_LISTING_NOT_SERVED = "SegmentListingNotServed",
            ALLOCATION_MISSING = "AllocationMissing",
            COUNTERS_MISSING = "CountersMissing",
            NO_WRITES_OBSERVED = "NoWritesObserved",
            WRITE_INCOMPLETE = "WriteIncomplete",
        }
    );
    condition!(
        /// Whether deletion can proceed (no live consumer holds the backend).
        deletable = "Deletable" {
            UNUSED = "Unused",
            IN_USE = "InUse",
        }
    );
    condition!(
        /// Whether the leader's rollout finished.
        rollout_complete = "RolloutComplete" {
            COMPLETE = "Complete",
            PROGRESSING = "Progressing",
            REPLICAS_PENDING = "ReplicasPending",
            UPDATE_NOT_OBSERVED = "UpdateNotObserved",
            WORKLOAD_UNREADABLE = "WorkloadUnreadable",
        }
    );
    condition!(
        /// Whether the leader Lease names a holder.
        election_observed = "ElectionObserved" {
            ELECTING = "Electing",
            NO_HOLDER = "NoHolder",
            LEADER_STARTING = "LeaderStarting",
            LEASE_UNREADABLE = "LeaseUnreadable",
        }
    );
    condition!(
        /// Whether a member group's local disk tier was empty when first used.
        tier_was_empty = "TierWasEmpty" {
            EMPTY = "Empty",
            PREEXISTING_CONTENT = "PreexistingContent",
        }
    );
}

/// `KVCachePool` conditions.
pub mod pool {
    condition!(
        /// Whether the pool's one backend exists and has published its endpoints.
        backend_resolved = "BackendResolved" {
            RESOLVED = "Resolved",
            BACKEND_NOT_SINGULAR = "BackendNotSingular",
            BACKEND_NOT_FOUND = "BackendNotFound",
            ENDPOINTS_NOT_PUBLISHED = "EndpointsNotPublished",
        }
    );
    condition!(
        /// Whether the backend keeps a tenant ledger the pool can write.
        quota_ledger_available = "QuotaLedgerAvailable" {
            AVAILABLE = "Available",
            MULTI_TENANCY_DISABLED = "MultiTenancyDisabled",
            LEDGER_UNREACHABLE = "LedgerUnreachable",
        }
    );
    condition!(
        /// Whether the ledger accepted the pool's domains.
        quota_policy_writable = "QuotaPolicyWritable" {
            WRITABLE = "Writable",
            QUOTA_POLICY_NOT_WRITABLE = "QuotaPolicyNotWritable",
            MULTI_TENANCY_DISABLED = "MultiTenancyDisabled",
            LEDGER_UNREACHABLE = "LedgerUnreachable",
        }
    );
    condition!(
        /// Whether the Bindings' ceilings fit in the pool's total (declarations only).
        quota_within_total = "QuotaWithinTotal" {
            WITHIN_TOTAL = "WithinTotal",
            OVERSUBSCRIBED = "Oversubscribed",
        }
    );
    condition!(
        /// Whether the backend has capacity to grant.
        capacity_allocatable = "CapacityAllocatable" {
            ALLOCATABLE = "Allocatable",
            CAPACITY_NOT_OBSERVED = "CapacityNotObserved",
            NOTHING_TO_ALLOCATE = "NothingToAllocate",
        }
    );
    condition!(
        /// Why deletion is held.
        releasable = "Releasable" {
            HELD_BY_BINDINGS = "HeldByBindings",
            LEDGER_NOT_RELEASED = "LedgerNotReleased",
        }
    );
}

/// `KVCachePoolBinding` conditions.
pub mod binding {
    condition!(
        /// Whether this Binding alone holds its domain on the backend.
        domain_exclusive = "DomainExclusive" {
            EXCLUSIVE = "Exclusive",
            DOMAIN_CLAIMED_BY_MULTIPLE_BINDINGS = "DomainClaimedByMultipleBindings",
        }
    );
    condition!(
        /// Whether the ledger could be read for this domain.
        quota_observed = "QuotaObserved" {
            OBSERVED = "Observed",
            TENANT_NOT_IN_LEDGER = "TenantNotInLedger",
            NO_TENANT_LEDGER = "NoTenantLedger",
            MASTER_NOT_SCRAPED = "MasterNotScraped",
        }
    );
    condition!(
        /// Whether a write to the domain can be served.
        quota_granted = "QuotaGranted" {
            GRANTED = "Granted",
            UNENFORCED = "Unenforced",
            NO_LEDGER_ENTRY = "NoLedgerEntry",
            ZERO_GRANTED = "ZeroGranted",
            GRANT_NOT_EXPORTED = "GrantNotExported",
        }
    );
    condition!(
        /// Why deletion is held.
        releasable = "Releasable" {
            HELD_BY_WORKLOADS = "HeldByWorkloads",
            LEDGER_NOT_RELEASED = "LedgerNotReleased",
            LEDGER_REQUEST_FAILED = "LedgerRequestFailed",
        }
    );
}

/// `ModelDeployment` conditions, those of the supported scope.
pub mod model_deployment {
    condition!(
        /// Whether the Binding the deployment attaches through resolves and is ready.
        domain_registered = "DomainRegistered" {
            REGISTERED = "Registered",
            NOT_APPLICABLE = "NotApplicable",
            BINDING_NOT_FOUND = "BindingNotFound",
            BINDING_NOT_READY = "BindingNotReady",
            BINDING_DELETING = "BindingDeleting",
        }
    );
    condition!(
        /// Whether the cache is observed in effect for the ready replicas.
        cache_attached = "CacheAttached" {
            NOT_APPLICABLE = "NotApplicable",
            UNMANAGED = "Unmanaged",
            NO_REPLICA_READY = "NoReplicaReady",
            CACHE_ACTIVE = "CacheActive",
            CACHE_OPERATIONS_FAILING = "CacheOperationsFailing",
            NO_OBSERVATION_AVAILABLE = "NoObservationAvailable",
            /// The replicas run without the cache they ask for: their Binding does not exist.
            BINDING_NOT_FOUND = "BindingNotFound",
        }
    );
    condition!(
        /// Whether every replica runs the current spec.
        replicas_up_to_date = "ReplicasUpToDate" {
            UP_TO_DATE = "UpToDate",
            ROLLOUT_IN_PROGRESS = "RolloutInProgress",
            REPLACEMENT_IN_PROGRESS = "ReplacementInProgress",
            ROLLOUT_HELD_BY_CACHE = "RolloutHeldByCache",
            ROLLOUT_NOT_OBSERVED = "RolloutNotObserved",
        }
    );
    condition!(
        /// Whether every role kind has a ready replica.
        role_kinds_ready = "RoleKindsReady" {
            ALL_KINDS_READY = "AllKindsReady",
            KINDS_NOT_READY = "KindsNotReady",
            NO_ROLE_STATUSES = "NoRoleStatuses",
        }
    );
    condition!(
        /// Whether the router in front of the roles serves (and, without one, whether anything
        /// has to pair the roles).
        router_ready = "RouterReady" {
            /// A router replica answers `/health` (it has a healthy `Decode` or `Server` worker).
            READY = "Ready",
            /// No router, and no `Prefill`/`Decode` roles that would need one.
            NOT_APPLICABLE = "NotApplicable",
            /// A router is declared and none of its replicas is ready.
            NO_READY_REPLICAS = "NoReadyReplicas",
            /// `Prefill` and `Decode` roles run without a router: nothing pairs them.
            NO_ROUTER = "NoRouter",
            /// The runtime cannot run the router (no image, no `kv-router` binary).
            RENDER_FAILED = "RenderFailed",
        }
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn time(s: &str) -> Time {
        Time(s.parse().unwrap())
    }

    #[test]
    fn transition_time_moves_only_when_the_status_changes() {
        let mut cs = Vec::new();
        let t1 = time("2026-01-01T00:00:00Z");
        let t2 = time("2026-01-01T00:01:00Z");
        let obs =
            |status, reason: Reason, msg: &str| Observation::new(backend::leader_available::TYPE, status, reason, msg);
        use backend::leader_available::*;
        assert!(set(
            &mut cs,
            obs(ConditionStatus::False, LEADER_STARTING, "starting"),
            &t1
        ));
        assert_eq!(cs[0].last_transition_time, t1);
        // Same status, new reason and message: recorded, the transition time stays.
        assert!(set(
            &mut cs,
            obs(ConditionStatus::False, LEADER_CRASH_LOOPING, "crashed"),
            &t2
        ));
        assert_eq!(
            (cs[0].reason.as_str(), cs[0].last_transition_time.clone()),
            ("LeaderCrashLooping", t1.clone())
        );
        // Nothing new: nothing changes.
        assert!(!set(
            &mut cs,
            obs(ConditionStatus::False, LEADER_CRASH_LOOPING, "crashed"),
            &t2
        ));
        // A new status moves it.
        assert!(set(&mut cs, obs(ConditionStatus::True, SERVING, "serving"), &t2));
        assert_eq!(cs[0].last_transition_time, t2);
        assert!(is_true(&cs, TYPE));
        assert_eq!(cs.len(), 1);
        assert!(remove(&mut cs, TYPE) && cs.is_empty());
    }

    #[test]
    fn reasons_are_camel_case_words() {
        let all = [
            backend::leader_available::REASONS,
            backend::members_mounted::REASONS,
            backend::pool_writes::REASONS,
            pool::backend_resolved::REASONS,
            pool::quota_policy_writable::REASONS,
            binding::quota_granted::REASONS,
            binding::releasable::REASONS,
            model_deployment::cache_attached::REASONS,
            model_deployment::router_ready::REASONS,
        ];
        for r in all.iter().flat_map(|rs| rs.iter()) {
            let s = r.as_str();
            assert!(s.chars().next().is_some_and(|c| c.is_ascii_uppercase()), "{s}");
            assert!(s.chars().all(|c| c.is_ascii_alphanumeric()), "{s}");
        }
    }

    #[test]
    fn phases_serialise_as_their_word() {
        assert_eq!(
            serde_json::to_string(&BackendPhase::Provisioning).unwrap(),
            "\"Provisioning\""
        );
        assert_eq!(
            serde_json::from_str::<BindingPhase>("\"Ready\"").unwrap(),
            BindingPhase::Ready
        );
        assert!(serde_json::from_str::<ModelDeploymentPhase>("\"Running\"").is_err());
        assert_eq!(PoolPhase::Error.to_string(), "Error");
    }
}
