//! The crate's top-level modules depend on each other without a circle: every `crate::<module>`
//! path outside tests is an edge, and the graph of those edges has no cycle. So a reader can
//! learn the modules bottom-up (the storage, then the registry, then the handlers and the
//! controllers, then the server and `app`), and a change to one never has to follow a loop back.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level modules each file's non-test code names as `crate::<module>`.
fn edges(src: &Path) -> BTreeMap<String, BTreeSet<(String, String)>> {
    let mut files = Vec::new();
    sources(src, &mut files);
    let mut edges: BTreeMap<String, BTreeSet<(String, String)>> = BTreeMap::new();
    for file in files {
        let rel = file.strip_prefix(src).unwrap().to_string_lossy().into_owned();
        let name = file.file_name().unwrap().to_string_lossy();
        if name == "tests.rs" || name == "testing.rs" || name.ends_with("_tests.rs") {
            continue;
        }
        let me = rel.split('/').next().unwrap().trim_end_matches(".rs").to_owned();
        let text = std::fs::read_to_string(&file).unwrap();
        let mut lines = text.lines().map(str::trim).peekable();
        while let Some(line) = lines.next() {
            // an inline test module ends the file's code
            if line == "#[cfg(test)]" && lines.peek().is_some_and(|l| l.starts_with("mod ") && l.ends_with('{')) {
                break;
            }
            if line.starts_with("//") {
                continue;
            }
            for (i, _) in line.match_indices("crate::") {
                let module: String = line[i + 7..]
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                    .collect();
                if !module.is_empty() && module != me {
                    edges.entry(me.clone()).or_default().insert((module, rel.clone()));
                }
            }
        }
    }
    edges
}

/// A cycle through `from`, if there is one (depth-first, the path so far in `path`).
fn cycle(
    graph: &BTreeMap<String, BTreeSet<String>>,
    from: &str,
    path: &mut Vec<String>,
    done: &mut BTreeSet<String>,
) -> Option<Vec<String>> {
    if let Some(i) = path.iter().position(|m| m == from) {
        let mut c = path[i..].to_vec();
        c.push(from.to_owned());
        return Some(c);
    }
    if done.contains(from) {
        return None;
    }
    path.push(from.to_owned());
    for next in graph.get(from).into_iter().flatten() {
        if let Some(c) = cycle(graph, next, path, done) {
            return Some(c);
        }
    }
    path.pop();
    done.insert(from.to_owned());
    None
}

#[test]
fn the_top_level_modules_depend_on_each_other_without_a_circle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let edges = edges(&src);
    let graph: BTreeMap<String, BTreeSet<String>> = edges
        .iter()
        .map(|(m, to)| (m.clone(), to.iter().map(|(t, _)| t.clone()).collect()))
        .collect();
    let modules: BTreeSet<&String> = graph.keys().chain(graph.values().flatten()).collect();
    assert!(modules.len() > 20, "the scan found the modules: {modules:?}");
    assert!(
        graph.get("app").is_some_and(|to| to.contains("registry")),
        "the scan sees imports"
    );
    let mut done = BTreeSet::new();
    for m in graph.keys() {
        if let Some(c) = cycle(&graph, m, &mut Vec::new(), &mut done) {
            let why: Vec<String> = c
                .windows(2)
                .map(|w| {
                    let files: Vec<&str> = edges[&w[0]]
                        .iter()
                        .filter(|(t, _)| *t == w[1])
                        .map(|(_, f)| f.as_str())
                        .collect();
                    format!("{} -> {} ({})", w[0], w[1], files.join(", "))
                })
                .collect();
            panic!("an import circle: {}", why.join("; "));
        }
    }
}
