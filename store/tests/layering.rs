//! The store's modules depend on each other without a circle, at the top (`crate::<module>`) and
//! inside the leader and the member (`super::<module>` and `crate::leader::<module>`): every such
//! path outside tests is an edge, and the graph of those edges has no cycle. So a reader learns
//! each layer bottom-up (the wire and its framing, then the leader's tables, then its services),
//! and a change to one module never has to follow a loop back. Files that only extend a type
//! (`impl State` in `tenants.rs`) name it through the module root, which is not a sibling.

#![allow(clippy::unwrap_used)]

#[path = "../../tests/support/layering.rs"]
mod layering;
#[path = "../../tests/support/shape.rs"]
mod shape;

use std::path::{Path, PathBuf};

use layering::no_circle;

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn the_top_level_modules_depend_on_each_other_without_a_circle() {
    let graph = no_circle(&src(), &["crate::"]);
    assert!(graph.len() > 10, "the scan found the modules: {graph:?}");
    assert!(
        graph.get("leader").is_some_and(|to| to.contains("grant")),
        "the scan sees imports"
    );
}

#[test]
fn the_leaders_and_the_members_modules_depend_on_each_other_without_a_circle() {
    let leader = no_circle(&src().join("leader"), &["super::", "crate::leader::"]);
    assert!(
        leader.get("tenants").is_some_and(|to| to.contains("ledger")),
        "the scan sees the leader's imports: {leader:?}"
    );
    let member = no_circle(&src().join("member"), &["super::", "crate::member::"]);
    assert!(!member.is_empty(), "the scan sees the member's imports");
}

/// Every function outside tests reads as one list of steps and every file holds one job: none
/// over the lengths `tests/support/shape.rs` sets.
#[test]
fn no_function_or_file_outside_tests_is_too_long() {
    shape::assert_within_limits(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
}
