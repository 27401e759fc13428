//! `incumbent observe --json` across a hand-off (`incumbent resign`), on the file backend and
//! on a real etcd and ZooKeeper: the new leader is printed once, and the `since` of that line
//! is when its term began (its command's `INCUMBENT_TERM_STARTED`), not when it began
//! campaigning.
//!
//! Needs the `etcd` and ZooKeeper binaries (`scripts/install-test-deps`). Every wait is bounded, every process
//! a test starts is killed when it ends, and etcd listens on loopback only.

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant, UNIX_EPOCH};

use crate::support::EtcdServer;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_incumbent");
const ELECTION: &str = "jobs/observed";
const LIMIT: Duration = Duration::from_secs(15);

/// How much earlier than the term's start the store's record may say the term began: the
/// store writes it when the lock is taken, a moment before the campaign starts the term.
const SLACK_MS: u64 = 100;

/// Records `pid term-started` in the file named by its first argument, then sleeps (same pid).
const SCRIPT: &str = r#"echo "$$ $INCUMBENT_TERM_STARTED" >> "$0"; exec sleep 600"#;

/// A process killed (SIGKILL) and reaped on drop, with its process group's sleepers.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_until(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while !done() {
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(20));
    }
    true
}

/// `2026-11-22T10:00:00.123Z` in Unix milliseconds.
fn unix_ms(rfc3339: &str) -> u64 {
    let t = humantime::parse_rfc3339(rfc3339).unwrap_or_else(|e| panic!("{rfc3339:?}: {e}"));
    u64::try_from(
        t.duration_since(UNIX_EPOCH)
            .expect("after 1970")
            .as_millis(),
    )
    .expect("fits")
}

struct Candidate {
    process: Guard,
    starts: PathBuf,
    log: PathBuf,
}

impl Candidate {
    fn start(backend: &str, dir: &Path, name: &str) -> Candidate {
        let starts = dir.join(format!("{name}.starts"));
        let log_path = dir.join(format!("{name}.log"));
        let log = fs::File::create(&log_path).expect("log file");
        let process = Command::new(BIN)
            .args(["run", "--election", ELECTION, "--backend", backend, "--"])
            .args(["sh", "-c", SCRIPT])
            .arg(&starts)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn incumbent run");
        Candidate {
            process: Guard(process),
            starts,
            log: log_path,
        }
    }

    fn pid(&self) -> u32 {
        self.process.0.id()
    }

    /// The first start of its command: `(pid, term started, in Unix ms)`.
    fn first_start(&self) -> (i32, u64) {
        let mut first = None;
        let started = wait_until(LIMIT, || {
            first = fs::read_to_string(&self.starts).ok().and_then(|text| {
                let line = text.lines().next()?.to_owned();
                let (pid, started) = line.split_once(' ')?;
                Some((pid.parse().ok()?, unix_ms(started.trim())))
            });
            first.is_some()
        });
        assert!(
            started,
            "the command of pid {} never started; its log:\n{}",
            self.pid(),
            fs::read_to_string(&self.log).unwrap_or_default()
        );
        first.expect("started")
    }
}

impl Drop for Candidate {
    fn drop(&mut self) {
        // SAFETY: kill has no memory-safety preconditions; the pid is our child's.
        unsafe {
            libc::kill(i32::try_from(self.pid()).expect("pid"), libc::SIGKILL);
        }
        let _ = self.process.0.wait();
        if let Ok(text) = fs::read_to_string(&self.starts) {
            for pid in text
                .lines()
                .filter_map(|l| l.split(' ').next()?.parse::<i32>().ok())
            {
                // SAFETY: as above; the pids are our commands'.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
            }
        }
    }
}

fn leader_pid(line: &Value) -> Option<u32> {
    line["leader"]["metadata"]["pid"].as_str()?.parse().ok()
}

/// Two candidates, an `observe --json`, a resign after the second has campaigned for a while:
/// observe prints the new leader once, and that line says its term began when its command was
/// told (not when it began to campaign).
fn since_after_a_hand_off_is_when_the_term_began(backend: &str) {
    let dir = tempfile::tempdir().expect("temporary directory");
    let a = Candidate::start(backend, dir.path(), "a");
    a.first_start();
    let mut observe = Guard(
        Command::new(BIN)
            .args([
                "observe",
                "--election",
                ELECTION,
                "--json",
                "--backend",
                backend,
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn incumbent observe"),
    );
    let (tx, lines) = mpsc::channel::<Value>();
    let stdout = observe.0.stdout.take().expect("piped stdout");
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let value = serde_json::from_str(&line).expect("one JSON object per line");
            if tx.send(value).is_err() {
                return;
            }
        }
    });
    let first = lines.recv_timeout(LIMIT).expect("the current leader");
    assert_eq!(leader_pid(&first), Some(a.pid()), "{first}");

    let b = Candidate::start(backend, dir.path(), "b");
    // b campaigns (behind a) for a while before the hand-off: its campaign's start and its
    // term's start are far apart.
    thread::sleep(Duration::from_millis(1500));
    let resign = Command::new(BIN)
        .args(["resign", "--election", ELECTION, "--backend", backend])
        .stdin(Stdio::null())
        .output()
        .expect("run incumbent resign");
    assert!(
        resign.status.success(),
        "resign: {}",
        String::from_utf8_lossy(&resign.stderr)
    );
    let (_, term_started) = b.first_start();

    // Everything observe prints within 3 s of the hand-off.
    let mut printed = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(3);
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match lines.recv_timeout(left) {
            Ok(line) => printed.push(line),
            Err(_) => break,
        }
    }
    let for_b: Vec<&Value> = printed
        .iter()
        .filter(|line| leader_pid(line) == Some(b.pid()))
        .collect();
    // One line per real change: the hand-off is one change, printed once.
    assert_eq!(
        for_b.len(),
        1,
        "observe printed the new leader {} times; printed: {printed:?}",
        for_b.len()
    );
    let line = for_b[0];
    let since = line["leader"]["since_unix_ms"]
        .as_u64()
        .unwrap_or_else(|| panic!("no since: {line}"));
    assert!(
        since + SLACK_MS >= term_started,
        "observe says the new leader's term began at {since}, {} ms before it did \
         ({term_started}); printed: {printed:?}",
        term_started - since
    );
    assert_eq!(
        unix_ms(line["leader"]["since"].as_str().expect("since")),
        since
    );
}

#[test]
fn observe_prints_when_the_new_leaders_term_began_on_the_file_backend() {
    let dir = tempfile::tempdir().expect("temporary directory");
    since_after_a_hand_off_is_when_the_term_began(&format!(
        "file://{}",
        dir.path().join("locks").display()
    ));
}

#[test]
fn observe_prints_when_the_new_leaders_term_began_on_etcd() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let etcd = runtime.block_on(EtcdServer::single());
    since_after_a_hand_off_is_when_the_term_began(&format!("etcd://{}", etcd.client_addr()));
    drop(etcd);
}

#[test]
#[cfg(feature = "zookeeper")]
fn observe_prints_when_the_new_leaders_term_began_on_zookeeper() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let zookeeper = runtime.block_on(crate::support::ZookeeperServer::single());
    since_after_a_hand_off_is_when_the_term_began(&format!("zk://{}", zookeeper.client_addr()));
    drop(zookeeper);
}

/// `observe --shards --json` shows a sharded group's map: each member, the shards it holds
/// (every shard held once), and none left unheld.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observe_shards_shows_the_map_of_a_sharded_group() {
    use incumbent::ShardedElection;
    use incumbent::etcd::EtcdBackend;

    let server = EtcdServer::single().await;
    let url = format!("etcd://{}", server.client_addr());
    let mut runners = Vec::new();
    for id in ["a", "b"] {
        let backend = EtcdBackend::connect(server.endpoints())
            .await
            .expect("connect");
        let group = ShardedElection::builder(backend, "jobs/sharded", 8)
            .candidate(id)
            .ttl(Duration::from_secs(2))
            .max_members(4)
            .build()
            .expect("valid");
        runners.push(group.start(|_, term| async move { term.cancelled().await }));
    }
    for runner in &runners {
        let mut status = runner.status();
        tokio::time::timeout(LIMIT, status.wait_for(|s| s.owned().len() == 4))
            .await
            .expect("four shards each")
            .expect("running");
    }
    let output = tokio::process::Command::new(BIN)
        .args(["observe", "--backend", &url, "--election", "jobs/sharded"])
        .args(["--shards", "8", "--max-members", "4", "--json"])
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start observe");
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(
        output.stdout.expect("stdout"),
    ));
    let line = tokio::time::timeout(LIMIT, lines.next_line())
        .await
        .expect("a map in time")
        .expect("read")
        .expect("a line");
    let map: Value = serde_json::from_str(&line).expect("JSON");
    assert_eq!(map["group"], "jobs/sharded");
    assert_eq!(map["shards"], 8);
    assert_eq!(map["unheld"], serde_json::json!([]));
    let members = map["members"].as_array().expect("members");
    let ids: Vec<&str> = members.iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), 2, "{line}");
    let mut held: Vec<u64> = members
        .iter()
        .flat_map(|m| {
            m["held"]
                .as_array()
                .unwrap()
                .iter()
                .map(|k| k.as_u64().unwrap())
        })
        .collect();
    held.sort_unstable();
    assert_eq!(held, (0..8).collect::<Vec<u64>>(), "{line}");
    for runner in runners {
        runner.shutdown().await.expect("shutdown");
    }

    // A shard count out of range is refused before anything is read.
    let refused = Command::new(BIN)
        .args([
            "observe",
            "--backend",
            &url,
            "--election",
            "jobs/sharded",
            "--shards",
            "0",
        ])
        .output()
        .expect("run observe");
    assert_eq!(refused.status.code(), Some(2));
}
