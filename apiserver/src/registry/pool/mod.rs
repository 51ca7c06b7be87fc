//! `KVCachePool`: exactly one backend, fixed for the pool's life, and a positive total quota.
//!
//! | module | owns |
//! |---|---|
//! | [`strategy`] | the hooks: defaults, update rules, admission against the backend, `/status` |
//! | [`validation`] | the object rules |

mod strategy;
mod validation;

#[cfg(test)]
mod tests;

pub use self::strategy::{PoolStatusStrategy, PoolStrategy};
