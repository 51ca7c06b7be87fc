//! `ModelDeployment`: defaults, validation, and what an update may not change (the model, the
//! engine, the cache attachment, the set of roles and each role's shape).
//!
//! The cache attachment names a Binding by name only, so it always resolves in the deployment's
//! own namespace; a Binding that does not exist yet is accepted and reported in status later.
//!
//! | module | owns |
//! |---|---|
//! | [`strategy`] | the hooks: defaults, what an update may not change, the Binding check, `/status` |
//! | [`validation`] | the object rules: engines, roles, what `extraArgs` and `env` may not set |
//! | [`router`] | role kinds together (prefill/decode), `spec.router` and its `extraArgs`, `kvTransfer` |

mod router;
mod strategy;
mod validation;

#[cfg(test)]
mod tests;

pub use self::strategy::{ModelDeploymentStatusStrategy, ModelDeploymentStrategy};
