//! The generated protocol types and gRPC stubs for `kvstore.v1` (see `proto/kvstore.proto`).

#![allow(clippy::all, missing_docs, unreachable_pub)]

tonic::include_proto!("kvstore.v1");
