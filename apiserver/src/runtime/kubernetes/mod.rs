//! The Kubernetes runtime: the store's leader and members as workloads of a cluster.
//!
//! | module | owns |
//! |---|---|
//! | [`render`] | a backend's plan as Kubernetes objects (Deployment, Service, DaemonSets, RBAC) |

pub mod render;
