//! `KVCacheBackend`: defaults, validation, and the rules of an update (the branch, the store
//! type and each member group's medium are fixed; a group's position is its identity; a group's
//! disk tier is neither added, removed nor moved; the tenant ledger cannot be withdrawn while
//! pools use the backend).
//!
//! | module | owns |
//! |---|---|
//! | [`strategy`] | the hooks: defaults, what an update may not change, `/status` |
//! | [`validation`] | the object rules and warnings |
//! | [`passthrough`] | the `extraArgs` and `extraEnv` escape hatches |
//! | [`tier`] | a group's disk tier (`localDisks`): its fields, one per backend, frozen presence and path |

mod passthrough;
mod strategy;
mod tier;
mod validation;

#[cfg(test)]
mod tests;

pub use self::strategy::{BackendStatusStrategy, BackendStrategy};
