//! The house: the crate's modules, drawn from their own `use crate::…` and `super::…` paths
//! (comments and `#[cfg(test)] mod tests` left out), have no circle. A circle means two
//! modules that cannot be changed or understood one without the other; ARCHITECTURE.md has
//! the drawing and the rule for where a new store's code goes.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Every module of `src/` (the binary's aside) and its source without comments and tests.
fn modules() -> BTreeMap<String, String> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in fs::read_dir(dir).expect("read src/") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                if path.file_name().is_some_and(|n| n != "bin") {
                    walk(&path, out);
                }
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    walk(&src, &mut files);
    files
        .into_iter()
        .filter(|path| path.file_name().is_some_and(|n| n != "incumbent.rs"))
        .map(|path| {
            let relative = path
                .strip_prefix(&src)
                .expect("under src/")
                .with_extension("");
            let name = relative
                .to_string_lossy()
                .trim_end_matches("/mod")
                .replace('/', "::");
            let text = fs::read_to_string(&path).expect("read a module");
            let text = match text.find("#[cfg(test)]\nmod tests") {
                Some(at) => &text[..at],
                None => &text[..],
            };
            let code: Vec<&str> = text
                .lines()
                .filter(|line| !line.trim_start().starts_with("//"))
                .collect();
            (name, code.join("\n"))
        })
        .collect()
}

/// The longest module name that `path` starts with.
fn resolve(path: &str, modules: &BTreeMap<String, String>) -> Option<String> {
    let parts: Vec<&str> = path.split("::").collect();
    (1..=parts.len())
        .rev()
        .map(|n| parts[..n].join("::"))
        .find(|candidate| modules.contains_key(candidate))
}

/// The paths a module names after `crate::` or `super::`, as module paths from the root
/// (a `{…}` group gives one path per item).
fn named(module: &str, code: &str) -> Vec<String> {
    let parent = module.rsplit_once("::").map_or("", |(p, _)| p);
    let mut out = Vec::new();
    for (prefix, base) in [("crate::", String::new()), ("super::", parent.to_owned())] {
        let mut rest = code;
        while let Some(at) = rest.find(prefix) {
            let before = rest[..at].chars().last();
            rest = &rest[at + prefix.len()..];
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue;
            }
            let join = |tail: &str| {
                if base.is_empty() {
                    tail.to_owned()
                } else {
                    format!("{base}::{tail}")
                }
            };
            if let Some(group) = rest.strip_prefix('{') {
                let end = group.find('}').unwrap_or(group.len());
                for item in group[..end].split(',') {
                    let item = item.trim().split("::{").next().unwrap_or("").trim();
                    if !item.is_empty() {
                        out.push(join(item));
                    }
                }
            } else {
                let end = rest
                    .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                    .unwrap_or(rest.len());
                out.push(join(rest[..end].trim_end_matches(':')));
            }
        }
    }
    out
}

/// The circles (strongly connected groups of more than one module), by Tarjan's algorithm.
fn circles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Walk<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in &self.edges[v] {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut group = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    group.push(w.to_owned());
                    if w == v {
                        break;
                    }
                }
                if group.len() > 1 {
                    group.sort();
                    self.found.push(group);
                }
            }
        }
    }
    let mut walk = Walk {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in edges.keys() {
        if !walk.index.contains_key(v.as_str()) {
            walk.visit(v);
        }
    }
    walk.found
}

#[test]
fn the_house_has_no_circle() {
    let modules = modules();
    assert!(modules.len() > 40, "found only {} modules", modules.len());
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, code) in &modules {
        let targets = edges.entry(module.clone()).or_default();
        for path in named(module, code) {
            if let Some(target) = resolve(&path, &modules)
                && target != *module
                && target != "lib"
            {
                targets.insert(target);
            }
        }
    }
    // The checker itself must see the arrows it is about: a store imports the leaf.
    assert!(
        edges["etcd::url"].contains("secret"),
        "{:?}",
        edges["etcd::url"]
    );
    assert!(edges["url"].contains("etcd::url"), "{:?}", edges["url"]);
    let found = circles(&edges);
    assert!(
        found.is_empty(),
        "modules that import each other (directly or round a circle): {found:?}; move the \
         piece they share into a module below both (see ARCHITECTURE.md)"
    );
}
