//! The API server for `worker.gpustack.ai/v1`: what may be stored, and where it is stored.
//!
//! A request passes the filters ([`filters`]), reaches a handler (one per verb), which
//! calls the registry (the rules, per kind), which writes through the storage (versioned keys,
//! watch). [`app`] builds all of it from the configuration.
//!
//! | module | owns |
//! |---|---|
//! | [`app`] | the composition root: storage, hub, auth chain, metrics registry, request pipeline |
//! | [`server`] | the HTTPS listener, connections, graceful shutdown |
//! | [`filters`] | the per-request filters every request passes: metrics, authentication, authorization, in-flight and body limits, span |
//! | [`handlers`] | one handler per verb, discovery, OpenAPI, health; `Routes`, which sends each request to its handler |
//! | [`auth`] | who is asking (authenticators) and what they may do (authorizers) |
//! | [`request_info`] | what a request is about: resource, verb, query |
//! | [`registry`] | the table of kinds (`registry::kinds`), per-kind strategies (defaults, validation, immutability, claims), the generic flow, and the CLI's typed apply (`registry::apply`) |
//! | [`field`] | field paths and the field errors every refusal lists (`metav1.Status` causes) |
//! | [`storage`] | API persistence: the `Storage` trait, its embedded implementation, watch |
//! | [`decode`] | request bodies → bounded values → typed objects, with `fieldValidation` |
//! | [`status`] | the `metav1.Status` of every refusal |
//! | [`metrics`] | the API's Prometheus metrics, with bounded labels |
//! | [`discovery`], [`openapi`] | the documents clients learn the API from |
//! | [`plain`] | built-in kinds stored as plain JSON in direct mode (what Events and Leases share) |
//! | [`events`] | core `v1` Events in direct mode: what the controllers did, for `kubectl describe` |
//! | [`leases`] | `coordination.k8s.io/v1` Leases in direct mode: the store's leader election |
//! | [`namespaces`] | core `v1` Namespaces in direct mode: implicit, listed, created and deleted |
//! | [`paging`] | the continue token of every paged list, typed or plain |
//! | [`table`], [`selectors`], [`negotiate`] | `kubectl get` tables, label and field selectors, `Accept` |
//! | [`controller`] | one reconcile per kind: run the store and the replicas, report what they do |
//! | [`runtime`] | where the store's processes and the replicas run (`local`: child processes) |
//! | [`config`] | server configuration read by admission (settings, instance types) |
//! | [`manifest`] | applying multi-document YAML manifests through the registry (the CLI's `apply`) |
//! | [`render`] | the CLI's `render`: what the controllers would apply in a cluster for a set of manifests, offline |

pub mod app;
pub mod auth;
pub mod config;
pub mod controller;
pub mod decode;
pub mod discovery;
pub mod events;
pub mod field;
pub mod filters;
pub mod handlers;
pub mod leases;
pub mod manifest;
pub mod metrics;
pub mod namespaces;
pub mod negotiate;
pub mod openapi;
pub mod paging;
pub mod plain;
pub mod registry;
pub mod render;
pub mod request_info;
pub mod runtime;
pub mod selectors;
pub mod server;
pub mod status;
pub mod storage;
pub mod table;

/// The workspace's one way for a test to wait on a condition.
#[cfg(test)]
#[path = "../../tests/support/eventually.rs"]
pub(crate) mod eventually;
