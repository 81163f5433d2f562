//! The crate's modules flow one way: each top-level module of `src/` sits in
//! one layer and refers (by `crate::` paths) only to modules in its own layer
//! or below, with no circle inside a layer. A new module must be placed here.
//!
//! Read from the bottom up, this is the architecture: pure types, then
//! protocols and pure logic, handles, node-side logic, the actors, the
//! ensure flow over them, configuration, the wiring that builds a node from
//! it, and the front ends.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::pedantic)] // test code: a failed unwrap is a failed test

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Lowest first. Edges may go down or sideways, never up.
const LAYERS: &[(&str, &[&str])] = &[
    ("pure types, bounded reads of outside files", &["domain", "clock", "files", "blocking", "settle"]),
    ("protocols and pure logic", &["cri", "events", "gc", "kubelet_config"]),
    ("handles: faults, metrics, the store", &["fault", "metrics", "store"]),
    ("node-side logic", &["credentials", "pull_records", "embedded"]),
    ("actors", &["actors"]),
    ("the ensure flow", &["ensure"]),
    ("configuration", &["config"]),
    ("wiring", &["error", "telemetry", "connect", "node"]),
    ("front ends", &["api", "cri_front", "http", "daemon", "demo", "sim", "cli"]),
];

/// Modules outside the layering: test support, compiled only for tests.
const EXEMPT: &[&str] = &["testing", "bin", "lib"];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The code of a file without comments and without its inline test module
/// (test files, `tests.rs`, are skipped by the caller).
fn code(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests {") {
        Some(i) => &text[..i],
        None => text,
    };
    text.lines().map(|l| l.find("//").map_or(l, |i| &l[..i])).collect::<Vec<_>>().join("\n")
}

/// Top-level module → the top-level modules its code names through `crate::`.
fn edges(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in files {
        if f.file_name().is_some_and(|n| n == "tests.rs") {
            continue;
        }
        let rel = f.strip_prefix(src).expect("under src");
        let top = rel.iter().next().and_then(|s| s.to_str()).unwrap_or("").trim_end_matches(".rs").to_string();
        let text = std::fs::read_to_string(&f).expect("readable source");
        let code = code(&text);
        let targets = edges.entry(top.clone()).or_default();
        for (i, _) in code.match_indices("crate::") {
            let name: String =
                code[i + "crate::".len()..].chars().take_while(|c| c.is_ascii_lowercase() || *c == '_').collect();
            if !name.is_empty() && name != top {
                targets.insert(name);
            }
        }
    }
    edges
}

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|(_, mods)| mods.contains(&module))
}

/// A circle among `edges`, if any (depth-first search).
fn find_cycle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| p == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.to_string());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in edges.get(node).into_iter().flatten() {
            if let Some(c) = visit(next, edges, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    edges.keys().find_map(|n| visit(n, edges, &mut Vec::new(), &mut done))
}

#[test]
fn modules_depend_only_downward_and_without_circles() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let all = edges(&src);
    let edges: BTreeMap<String, BTreeSet<String>> = all
        .into_iter()
        .filter(|(m, _)| !EXEMPT.contains(&m.as_str()))
        .map(|(m, t)| (m, t.into_iter().filter(|t| !EXEMPT.contains(&t.as_str())).collect()))
        .collect();
    let mut wrong = Vec::new();
    for (module, targets) in &edges {
        let Some(from) = layer_of(module) else {
            wrong.push(format!("module `{module}` is in no layer: place it in LAYERS (tests/layering.rs)"));
            continue;
        };
        for t in targets {
            match layer_of(t) {
                Some(to) if to > from => wrong.push(format!(
                    "`{module}` ({}) uses `crate::{t}` ({}), a layer above it",
                    LAYERS[from].0, LAYERS[to].0
                )),
                _ => {}
            }
        }
    }
    assert!(wrong.is_empty(), "the layering is broken:\n{}", wrong.join("\n"));
    if let Some(cycle) = find_cycle(&edges) {
        panic!("an import circle: {}", cycle.join(" -> "));
    }
}

#[test]
fn the_checker_sees_an_upward_edge_and_a_circle() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("domain.rs"), "use crate::node::Node; // crate::api in a comment\n").expect("write");
    std::fs::write(dir.path().join("node.rs"), "pub fn f() { crate::domain::g() }\n").expect("write");
    std::fs::write(dir.path().join("tests.rs"), "use crate::api;\n").expect("write");
    let e = edges(dir.path());
    assert_eq!(e["domain"], BTreeSet::from(["node".to_string()]));
    assert_eq!(layer_of("node"), Some(7));
    assert!(layer_of("domain") < layer_of("node"));
    assert_eq!(find_cycle(&e), Some(vec!["domain".into(), "node".into(), "domain".into()]));
}
