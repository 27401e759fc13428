//! `incumbent run --backend zk://...` against a real ZooKeeper server: two candidates, one
//! leads and runs its command with a fencing token; when it is stopped (SIGTERM), the other
//! takes over with a greater token. Needs ZooKeeper and Java (`scripts/install-test-deps`); a
//! missing one fails the test. Every wait is bounded and every process killed at the end.

use std::fs;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::support::zookeeper::ZookeeperServer;
use tokio::time::{Instant, sleep};

const BIN: &str = env!("CARGO_BIN_EXE_incumbent");

/// Appends `pid token` to the file named by its first argument, then sleeps (same pid).
const RECORD: &str = r#"echo "$$ $INCUMBENT_FENCING_TOKEN" >> "$0"; exec sleep 600"#;

/// A candidate process, killed and reaped on drop.
struct Candidate(Child);

impl Drop for Candidate {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn candidate(backend: &str, id: &str, ledger: &Path) -> Candidate {
    let child = Command::new(BIN)
        .args([
            "run",
            "--backend",
            backend,
            "--election",
            "jobs/zk",
            "--id",
            id,
        ])
        .args(["--ttl", "4s", "--grace", "2s", "--", "sh", "-c", RECORD])
        .arg(ledger)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start incumbent run");
    Candidate(child)
}

/// The `(pid, token)` lines of the ledger.
fn terms(ledger: &Path) -> Vec<(i32, u64)> {
    fs::read_to_string(ledger)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let (pid, token) = line.split_once(' ')?;
            Some((pid.parse().ok()?, token.trim().parse().ok()?))
        })
        .collect()
}

async fn until_terms(ledger: &Path, count: usize) -> Vec<(i32, u64)> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let seen = terms(ledger);
        if seen.len() >= count {
            return seen;
        }
        assert!(
            Instant::now() < deadline,
            "{count} terms expected, saw {seen:?}"
        );
        sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_on_zookeeper_hands_over_with_a_greater_token() {
    let server = ZookeeperServer::single().await;
    let backend = format!("zk://{}/incumbent-cli", server.connect_string());
    let dir = tempfile::tempdir().expect("temp dir");
    let ledger = dir.path().join("ledger");
    let a = candidate(&backend, "a", &ledger);
    let first = until_terms(&ledger, 1).await;
    let b = candidate(&backend, "b", &ledger);
    sleep(Duration::from_millis(500)).await;
    assert_eq!(terms(&ledger).len(), 1, "one leader at a time");

    // SIGTERM to the leader's supervisor (a): it stops its command, releases, and b leads.
    let leader = i32::try_from(a.0.id()).expect("pid");
    // SAFETY: kill has no memory-safety preconditions.
    unsafe {
        libc::kill(leader, libc::SIGTERM);
    }
    let both = until_terms(&ledger, 2).await;
    assert!(
        both[1].1 > first[0].1,
        "the next term's token grows: {both:?}"
    );
    drop(b);
    drop(a);
}
