//! The API server for `worker.gpustack.ai/v1`.
//!
//! | module | owns |
//! |---|---|
//! | [`storage`] | API persistence: the `Storage` trait, its embedded implementation, watch |
pub mod storage;
