//! The crate claims only what it has: every cargo feature does something, and the package's
//! description names only stores it has a backend for.

use std::fs;
use std::path::Path;

fn manifest() -> String {
    fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
        .expect("Cargo.toml")
}

/// Every `.rs` file under `dir`, read.
fn sources(dir: &Path, into: &mut String) {
    for entry in fs::read_dir(dir).expect("read src").flatten() {
        let path = entry.path();
        if path.is_dir() {
            sources(&path, into);
        } else if path.extension().is_some_and(|e| e == "rs") {
            into.push_str(&fs::read_to_string(&path).expect("read a source file"));
        }
    }
}

#[test]
fn every_feature_that_enables_nothing_else_is_used_by_the_code() {
    let manifest = manifest();
    let features = manifest
        .split("[features]")
        .nth(1)
        .and_then(|rest| rest.split("\n[").next())
        .expect("a [features] table");
    let mut code = String::new();
    sources(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut code,
    );
    let mut checked = 0;
    for line in features
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
    {
        let Some((name, enables)) = line.split_once('=') else {
            continue;
        };
        let (name, enables) = (name.trim(), enables.trim());
        if enables == "[]" {
            checked += 1;
            assert!(
                code.contains(&format!("feature = \"{name}\"")),
                "the feature `{name}` enables nothing and no code depends on it: remove it"
            );
        }
    }
    assert!(checked > 0, "at least the `file` feature is checked");
}

#[test]
fn the_description_names_only_stores_with_a_backend() {
    let manifest = manifest();
    let description = manifest
        .lines()
        .find(|l| l.starts_with("description"))
        .expect("a description")
        .to_lowercase();
    let code_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    for (store, module) in [
        ("zookeeper", "zookeeper"),
        ("redis", "redis"),
        ("memcached", "memcached"),
        ("etcd", "etcd"),
        ("consul", "consul"),
    ] {
        if description.contains(store) {
            let exists =
                code_dir.join(module).is_dir() || code_dir.join(format!("{module}.rs")).is_file();
            assert!(
                exists,
                "the description names {store}, which has no backend module"
            );
        }
    }
}
