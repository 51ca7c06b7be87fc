//! `KVCachePoolBinding`: a namespace's grant on a pool under a cache domain.
//!
//! The domain (name, block size, dtype) and the pool are fixed for the Binding's life
//! ([`BindingStrategy`]'s `validate_update`); a domain name is held by at most one Binding per
//! backend ([`claims`]), decided in the same storage transaction as the write.
//!
//! | module | owns |
//! |---|---|
//! | [`strategy`] | the hooks: defaults, what an update may not change, the claim, `/status` |
//! | [`validation`] | the object rules |
//! | [`claims`] | the once-per-backend domain claim, kept in storage beside the Binding |

mod claims;
mod strategy;
mod validation;

#[cfg(test)]
mod tests;

pub use self::strategy::{BindingStatusStrategy, BindingStrategy};
