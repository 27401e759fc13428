//! The `index_builder` example end to end: four processes, the leader killed with SIGKILL in
//! the middle of a build, the next leader resuming from the checkpoint, a stale write
//! refused, the index published and read by the followers.
//!
//! On the embedded file backend always; on a real `consul agent -dev` with `--features
//! consul` (a missing `consul` binary fails that test: `scripts/install-test-deps`).

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::Value;
use tokio::process::Command;
use tokio::time::timeout;

/// The example's binary, built once per test run with this test's own features and profile,
/// so that it has the Consul backend when this test does. With every feature (as
/// `scripts/test`, `cargo test --workspace --all-features`, runs it) it is built the way that
/// command builds the examples, so the build is a no-op after it.
fn index_builder() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let exe = std::env::current_exe().expect("the test binary's path");
        let profile_dir = exe
            .parent()
            .and_then(|deps| deps.parent())
            .expect("target/<profile>");
        let features: Vec<&str> = [
            ("file", cfg!(feature = "file")),
            ("etcd", cfg!(feature = "etcd")),
            ("etcd-tls", cfg!(feature = "etcd-tls")),
            ("consul", cfg!(feature = "consul")),
            ("postgres", cfg!(feature = "postgres")),
            ("axum", cfg!(feature = "axum")),
            ("cli", cfg!(feature = "cli")),
        ]
        .into_iter()
        .filter_map(|(name, on)| on.then_some(name))
        .collect();
        let mut build = crate::support::bin::nested_cargo();
        build.args(["build", "--example", "index_builder"]);
        if cfg!(feature = "full") {
            build.args(["--workspace", "--all-features"]);
        } else {
            build
                .arg("--no-default-features")
                .args(["--features", &features.join(",")]);
        }
        build.current_dir(env!("CARGO_MANIFEST_DIR"));
        if profile_dir.ends_with("release") {
            build.arg("--release");
        }
        let status = build.status().expect("cargo runs");
        assert!(
            status.success(),
            "cargo build --example index_builder failed"
        );
        let bin = profile_dir.join("examples").join("index_builder");
        assert!(bin.exists(), "{} is missing", bin.display());
        bin
    })
    .clone()
}

/// Runs the demo with `args` and the variables `env`; returns its timeline and its closing
/// summary.
async fn run_demo(args: &[&str], env: &[(&str, &str)]) -> (String, Value) {
    let run = Command::new(index_builder())
        .args(args)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .output();
    let output = timeout(Duration::from_secs(90), run)
        .await
        .expect("the demo exits by itself")
        .expect("the demo runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    println!("{stdout}");
    assert!(
        output.status.success(),
        "the demo failed: {}",
        output.status
    );
    let summary = stdout
        .lines()
        .find_map(|line| line.strip_prefix("summary "))
        .expect("a summary line");
    let summary = serde_json::from_str(summary).expect("the summary is JSON");
    (stdout, summary)
}

/// What every backend must show.
fn assert_the_story(timeline: &str, summary: &Value) {
    let number = |key: &str| {
        summary[key]
            .as_u64()
            .unwrap_or_else(|| panic!("{key} in {summary}"))
    };
    let first = number("first_token");
    let resumed_from = number("resumed_from");
    let published = number("published_token");

    assert!(timeline.contains("kill -9"), "no kill in:\n{timeline}");
    assert!(
        resumed_from > 0,
        "the next leader started over from chunk 0:\n{timeline}"
    );
    assert!(
        timeline.contains(&format!("RESUMES from chunk {resumed_from}")),
        "{timeline}"
    );

    assert_eq!(summary["stale_write_rejected"], true, "{timeline}");
    assert_eq!(number("killed_token"), first, "{summary}");
    assert!(
        timeline.contains(&format!("stale write REJECTED: token {first} <")),
        "{timeline}"
    );

    assert!(
        published > first,
        "published under token {published}, not above the first leader's {first}"
    );
    assert_eq!(summary["digest_matches_scratch"], true, "{timeline}");

    // Four instances, one killed, one leading: the other two read the index.
    let readers = summary["readers"].as_array().expect("readers");
    assert_eq!(readers.len(), 2, "{summary}");
    for reader in readers {
        let reader = reader.as_str().expect("a name");
        assert_ne!(summary["killed"], reader);
        assert!(
            timeline.contains(&format!(
                "{reader} read index built under token {published}"
            )),
            "{timeline}"
        );
    }
}

#[tokio::test]
async fn on_the_file_backend_the_next_leader_resumes_and_a_stale_write_is_refused() {
    let (timeline, summary) = run_demo(&[], &[]).await;
    assert!(timeline.contains("elect on file://"), "{timeline}");
    assert!(timeline.contains("(flock)"), "{timeline}");
    assert_the_story(&timeline, &summary);
}

#[cfg(feature = "consul")]
#[tokio::test]
async fn on_consul_the_next_leader_resumes_and_a_stale_write_is_refused() {
    let consul = crate::support::ConsulDev::start().await;
    let url = format!("consul://{}", consul.http_addr());
    let (timeline, summary) = run_demo(&["--backend", &url], &[]).await;
    assert!(timeline.contains("the Consul key"), "{timeline}");
    assert_the_story(&timeline, &summary);
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn on_postgres_the_next_leader_resumes_and_a_deposed_leaders_guarded_write_is_refused() {
    let server = crate::support::PostgresServer::start().await;
    let env = [("PGUSER", crate::support::postgres::USER)];
    let (timeline, summary) = run_demo(&["--backend", &server.url()], &env).await;
    assert!(timeline.contains("index_builder_checkpoints"), "{timeline}");
    assert_the_story(&timeline, &summary);
}
