//! The API server for `worker.gpustack.ai/v1`: what may be stored, and where it is stored.
//!
//! | module | owns |
//! |---|---|
//! | [`config`] | server configuration read by admission (settings, instance types) |
//! | [`decode`] | request bodies → typed objects, with `fieldValidation` semantics |
//! | [`registry`] | per-kind strategies (defaults, validation, immutability, claims) and the generic store flow |
//! | [`status`] | the `metav1.Status` of every refusal |
//! | [`storage`] | API persistence: the `Storage` trait, its embedded implementation, watch |
//! | [`server`] | the HTTPS API server kubectl talks to (`kv-apiserver serve`) |
//! | [`manifest`] | applying multi-document YAML manifests through the registry (the CLI's `apply`) |

pub mod config;
pub mod decode;
pub mod manifest;
pub mod registry;
pub mod server;
pub mod status;
pub mod storage;
