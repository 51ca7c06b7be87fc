//! The crate's top-level modules depend on each other without a circle: every `crate::<module>`
//! path outside tests is an edge, and the graph of those edges has no cycle. So a reader can
//! learn the modules bottom-up (the storage, then the registry, then the handlers and the
//! controllers, then the server and `app`), and a change to one never has to follow a loop back.

#![allow(clippy::unwrap_used)]

#[path = "../../tests/support/layering.rs"]
mod layering;
#[path = "../../tests/support/shape.rs"]
mod shape;

use std::collections::BTreeSet;
use std::path::Path;

#[test]
fn the_top_level_modules_depend_on_each_other_without_a_circle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = layering::no_circle(&src, &["crate::"]);
    let modules: BTreeSet<&String> = graph.keys().chain(graph.values().flatten()).collect();
    assert!(modules.len() > 20, "the scan found the modules: {modules:?}");
    assert!(
        graph.get("app").is_some_and(|to| to.contains("registry")),
        "the scan sees imports"
    );
}

/// Every function outside tests reads as one list of steps and every file holds one job: none
/// over the lengths `tests/support/shape.rs` sets.
#[test]
fn no_function_or_file_outside_tests_is_too_long() {
    shape::assert_within_limits(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
}
