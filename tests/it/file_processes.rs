//! The file backend with real processes: the candidates are the quickstart example's
//! candidate mode (`quickstart candidate NAME DIR`), which prints its events as JSON lines.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};
use tokio::time::timeout;

/// The quickstart example's binary, built first if `cargo test` was asked for this test only.
fn quickstart() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>");
    let bin = profile_dir.join("examples").join("quickstart");
    if !bin.exists() {
        let status = crate::support::bin::nested_cargo()
            .args(["build", "--example", "quickstart"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("cargo runs");
        assert!(status.success(), "cargo build --example quickstart failed");
    }
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build --example quickstart`",
        bin.display()
    );
    bin
}

struct Candidate {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Candidate {
    fn start(name: &str, dir: &std::path::Path) -> Candidate {
        let mut child = Command::new(quickstart())
            .args(["candidate", name, &dir.to_string_lossy()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("the candidate starts");
        let lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        Candidate { child, lines }
    }

    /// Waits for an event named `event`; returns it.
    async fn until(&mut self, event: &str, limit: Duration) -> Value {
        timeout(limit, async {
            loop {
                let line = self
                    .lines
                    .next_line()
                    .await
                    .expect("read")
                    .expect("the candidate is alive");
                let value: Value = serde_json::from_str(&line).expect("a JSON line");
                if value["event"] == event {
                    return value;
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("no {event} event within {limit:?}"))
    }

    /// Whether `event` arrives within `limit`.
    async fn sees(&mut self, event: &str, limit: Duration) -> bool {
        timeout(limit, self.until(event, limit * 2)).await.is_ok()
    }
}

#[tokio::test]
async fn a_killed_holder_is_replaced_at_once_with_a_greater_token() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut a = Candidate::start("a", dir.path());
    let first = a.until("elected", Duration::from_secs(10)).await["token"]
        .as_u64()
        .expect("token");
    let mut b = Candidate::start("b", dir.path());
    b.until("leader", Duration::from_secs(10)).await;
    assert!(
        !b.sees("elected", Duration::from_millis(300)).await,
        "b led while a held the lock"
    );

    let killed = Instant::now();
    a.child.start_kill().expect("kill -9");
    a.child.wait().await.expect("reaped");
    let second = b.until("elected", Duration::from_secs(5)).await["token"]
        .as_u64()
        .expect("token");
    // The kernel releases a dead process's lock: no ttl to wait for.
    println!("failover after kill -9: {:?}", killed.elapsed());
    assert!(second > first, "token {first} then {second}");
}

#[tokio::test]
async fn a_resigning_process_hands_off_and_tokens_survive_restarts() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut a = Candidate::start("a", dir.path());
    let first = a.until("elected", Duration::from_secs(10)).await["token"]
        .as_u64()
        .expect("token");
    let mut b = Candidate::start("b", dir.path());
    b.until("leader", Duration::from_secs(10)).await;
    let stdin = a.child.stdin.as_mut().expect("stdin");
    stdin.write_all(b"resign\n").await.expect("write");
    assert_eq!(
        a.until("demoted", Duration::from_secs(5)).await["reason"],
        "resigned"
    );
    let second = b.until("elected", Duration::from_secs(5)).await["token"]
        .as_u64()
        .expect("token");
    assert!(second > first);

    // Every process stops; a new one still gets a greater token: the counter is on disk.
    drop(a.child.stdin.take());
    drop(b.child.stdin.take());
    a.child.wait().await.expect("a exits");
    b.child.wait().await.expect("b exits");
    let mut c = Candidate::start("c", dir.path());
    let third = c.until("elected", Duration::from_secs(10)).await["token"]
        .as_u64()
        .expect("token");
    assert!(
        third > second,
        "token {second} then {third} after a restart"
    );
}

#[tokio::test]
async fn a_deleted_lock_file_demotes_the_leader_with_key_deleted() {
    use incumbent::{DemotionReason, Election, LeadershipEvent, file::FileBackend};
    let dir = tempfile::tempdir().expect("temp dir");
    let mut campaign = Election::builder(FileBackend::in_dir(dir.path()), "jobs/x")
        .candidate("a")
        .build()
        .expect("valid")
        .campaign();
    let term = loop {
        if let Some(LeadershipEvent::Elected(term)) = campaign.recv().await {
            break term;
        }
    };
    std::fs::remove_file(dir.path().join("jobs+x.lock")).expect("remove the lock file");
    let reason = timeout(Duration::from_secs(5), async {
        loop {
            if let Some(LeadershipEvent::Demoted { reason, .. }) = campaign.recv().await {
                return reason;
            }
        }
    })
    .await
    .expect("demoted within the lock check interval");
    assert_eq!(reason, DemotionReason::KeyDeleted);
    assert!(term.is_cancelled());
}
