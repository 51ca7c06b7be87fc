//! `KVCacheBackend`: defaults, validation, and the rules of an update (the branch, the store
//! type and each member group's medium are fixed; a group's position is its identity; the
//! tenant ledger cannot be withdrawn while pools use the backend).
//!
//! | module | owns |
//! |---|---|
//! | [`strategy`] | the hooks: defaults, what an update may not change, `/status` |
//! | [`validation`] | the object rules and warnings |
//! | [`passthrough`] | the `extraArgs` and `extraEnv` escape hatches |

mod passthrough;
mod strategy;
mod validation;

#[cfg(test)]
mod tests;

pub use self::strategy::{BackendStatusStrategy, BackendStrategy};
