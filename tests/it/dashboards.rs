//! The example Grafana dashboard and Prometheus alert rules stay in step with the crate: they
//! query only metrics `incumbent::metrics` exports, the dashboard shows every one of them, and
//! the rules pass Prometheus's own checker and their unit tests (`promtool`, from
//! `scripts/install-test-deps`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::bin::find_binary;
use incumbent::metrics;

const DASHBOARD: &str = "examples/grafana/incumbent.json";
const RULES: &str = "examples/prometheus/incumbent-alerts.yml";
const RULE_TESTS: &str = "examples/prometheus/incumbent-alerts.test.yml";

/// Suffixes Prometheus exporters add to a histogram's (or summary's) name.
const HISTOGRAM_SUFFIXES: [&str; 3] = ["_bucket", "_sum", "_count"];

fn path(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

fn read(relative: &str) -> String {
    std::fs::read_to_string(path(relative)).unwrap_or_else(|e| panic!("reading {relative}: {e}"))
}

/// The words of `text` that look like one of our metric names: `incumbent_` and what follows.
fn metric_names(text: &str) -> BTreeSet<String> {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices("incumbent_")
        .filter(|(at, _)| !text[..*at].ends_with(word))
        .map(|(at, _)| {
            let rest = &text[at..];
            rest[..rest.find(|c| !word(c)).unwrap_or(rest.len())].to_owned()
        })
        .collect()
}

/// The exported metric a queried name belongs to, if any.
fn exported(name: &str) -> Option<&'static str> {
    metrics::ALL.iter().copied().find(|m| {
        *m == name
            || HISTOGRAM_SUFFIXES
                .iter()
                .any(|suffix| name.strip_suffix(suffix) == Some(m))
    })
}

/// Every query of the dashboard: the panels' `expr` and the variables' `query`.
fn dashboard_queries(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, value) in map {
                match (key.as_str(), value) {
                    ("expr" | "query", serde_json::Value::String(query)) => out.push(query.clone()),
                    _ => dashboard_queries(value, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| dashboard_queries(v, out)),
        _ => {}
    }
}

#[test]
fn the_list_of_all_metrics_is_complete() {
    let source = read("src/metrics.rs");
    let declared: BTreeSet<String> = metric_names(&source)
        .into_iter()
        .filter(|name| source.contains(&format!("&str = \"{name}\";")))
        .collect();
    let listed: BTreeSet<String> = metrics::ALL.iter().map(|m| m.to_string()).collect();
    assert_eq!(
        declared, listed,
        "metrics::ALL is not every name in src/metrics.rs"
    );
}

#[test]
fn the_dashboard_queries_only_exported_metrics_and_shows_them_all() {
    let dashboard: serde_json::Value =
        serde_json::from_str(&read(DASHBOARD)).expect("the dashboard is valid JSON");
    let mut queries = Vec::new();
    dashboard_queries(&dashboard, &mut queries);
    assert!(!queries.is_empty(), "no queries found in {DASHBOARD}");
    let mut shown = BTreeSet::new();
    for query in &queries {
        let names = metric_names(query);
        assert!(!names.is_empty(), "a query of no incumbent metric: {query}");
        for name in names {
            let metric = exported(&name).unwrap_or_else(|| {
                panic!("{DASHBOARD} queries `{name}`, which incumbent does not export: {query}")
            });
            shown.insert(metric);
        }
    }
    let missing: Vec<_> = metrics::ALL
        .iter()
        .filter(|m| !shown.contains(*m))
        .collect();
    assert!(
        missing.is_empty(),
        "{DASHBOARD} has no panel for {missing:?}"
    );
}

#[test]
fn the_alert_rules_query_only_exported_metrics() {
    let names = metric_names(&read(RULES));
    assert!(!names.is_empty());
    for name in names {
        assert!(
            exported(&name).is_some(),
            "{RULES} names `{name}`, which incumbent does not export"
        );
    }
}

/// Runs `promtool` with `args` in the rules' directory; fails with its output.
fn promtool(args: &[&str]) {
    let output = Command::new(find_binary("promtool"))
        .args(args)
        .current_dir(path("examples/prometheus"))
        .output()
        .expect("run promtool");
    assert!(
        output.status.success(),
        "promtool {}: {}\n{}{}",
        args.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn the_alert_rules_pass_promtool_check() {
    promtool(&["check", "rules", file_name(RULES)]);
}

#[test]
fn the_alerts_fire_as_their_unit_tests_expect() {
    promtool(&["test", "rules", file_name(RULE_TESTS)]);
}

fn file_name(relative: &str) -> &str {
    relative.rsplit('/').next().unwrap_or(relative)
}
