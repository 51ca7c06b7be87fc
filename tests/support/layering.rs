//! The import-circle check both crates' layering tests run (`apiserver/tests/layering.rs`,
//! `store/tests/layering.rs`): the modules directly under a folder, an edge for every path to a
//! sibling that non-test code names, and the first circle among them, with the files of each edge.

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

/// `module -> {(module it names, file that names it)}` for the modules directly under `dir`,
/// from the paths beginning with one of `prefixes` in non-test code.
fn edges(dir: &Path, prefixes: &[&str]) -> BTreeMap<String, BTreeSet<(String, String)>> {
    let mut files = Vec::new();
    sources(dir, &mut files);
    let siblings: BTreeSet<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    let mut edges: BTreeMap<String, BTreeSet<(String, String)>> = BTreeMap::new();
    for file in files {
        let rel = file.strip_prefix(dir).unwrap().to_string_lossy().into_owned();
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
            for prefix in prefixes {
                for (i, _) in line.match_indices(prefix) {
                    let module: String = line[i + prefix.len()..]
                        .chars()
                        .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                        .collect();
                    if module != me && siblings.contains(&module) && module != "mod" {
                        edges.entry(me.clone()).or_default().insert((module, rel.clone()));
                    }
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

/// Panics naming the files of each edge of the first circle among the modules under `dir`;
/// returns the graph otherwise.
pub fn no_circle(dir: &Path, prefixes: &[&str]) -> BTreeMap<String, BTreeSet<String>> {
    let edges = edges(dir, prefixes);
    let graph: BTreeMap<String, BTreeSet<String>> = edges
        .iter()
        .map(|(m, to)| (m.clone(), to.iter().map(|(t, _)| t.clone()).collect()))
        .collect();
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
            panic!("an import circle under {}: {}", dir.display(), why.join("; "));
        }
    }
    graph
}
