//! The examples a user copies exit promptly when told to: within 2 s of SIGTERM (or Ctrl-C),
//! the follower too. A follower on the file backend waits for the lock in a blocking `flock`,
//! which once kept `#[tokio::main]`'s runtime from ever finishing its drop.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::support::http::get;
use crate::support::net::free_addr;

/// How long an example may take to exit after the signal.
const EXIT_WITHIN: Duration = Duration::from_secs(2);
/// How long a replica may take to serve, and to lead.
const PATIENCE: Duration = Duration::from_secs(20);

/// An example's binary, built once per run with every feature, for the whole workspace, as
/// `scripts/test` (`cargo test --workspace --all-features`) builds the examples: a no-op
/// after it (the same features of every dependency, so nothing is rebuilt).
fn example(name: &str) -> PathBuf {
    static BUILT: OnceLock<()> = OnceLock::new();
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>")
        .to_owned();
    BUILT.get_or_init(|| {
        let mut build = crate::support::bin::nested_cargo();
        build
            .args([
                "build",
                "--workspace",
                "--all-features",
                "--example",
                "service",
            ])
            .args(["--example", "health_endpoint"])
            .current_dir(env!("CARGO_MANIFEST_DIR"));
        if profile_dir.ends_with("release") {
            build.arg("--release");
        }
        let status = build.status().expect("cargo runs");
        assert!(status.success(), "cargo build of the examples failed");
    });
    profile_dir.join("examples").join(name)
}

/// A replica of `name` serving on `listen`, its locks in `dir`.
fn replica(name: &str, dir: &Path, listen: SocketAddr) -> Child {
    let url = format!("file://{}", dir.display());
    Command::new(example(name))
        .args(["--backend", &url, "--listen", &listen.to_string()])
        .env("INCUMBENT_BACKEND", &url)
        .env("LISTEN", listen.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the example")
}

/// Waits until the replica on `addr` answers `/readyz` with `status`.
async fn ready(addr: SocketAddr, status: u16) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if get(addr, "/readyz").await.is_ok_and(|r| r.status == status) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{addr} never answered /readyz {status}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Sends `signal` and requires the process to exit within [`EXIT_WITHIN`].
fn exits_after(child: &mut Child, signal: libc::c_int, what: &str) {
    let pid = libc::pid_t::try_from(child.id()).expect("a pid");
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(pid, signal) }, 0, "signal {what}");
    let sent = Instant::now();
    while sent.elapsed() < EXIT_WITHIN {
        if child.try_wait().expect("wait").is_some() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("the {what} did not exit within {EXIT_WITHIN:?} of the signal");
}

/// Two replicas of `example`: the follower, then the leader, exit promptly after `signal`.
async fn leader_and_follower_exit(example: &str, signal: libc::c_int) {
    let dir = tempfile::tempdir().expect("a lock directory");
    let (a, b) = (free_addr(), free_addr());
    let mut leader = replica(example, dir.path(), a);
    ready(a, 200).await;
    let mut follower = replica(example, dir.path(), b);
    ready(b, 503).await;
    exits_after(&mut follower, signal, "follower");
    exits_after(&mut leader, signal, "leader");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_example_exits_within_two_seconds_of_sigterm() {
    leader_and_follower_exit("service", libc::SIGTERM).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_health_endpoint_example_exits_within_two_seconds_of_ctrl_c() {
    leader_and_follower_exit("health_endpoint", libc::SIGINT).await;
}
