//! Process-level hand-off: from SIGTERM of the leader's `incumbent run` to the next leader's
//! command printing its first line, split where the time goes. Printed, never asserted.
//!
//! ```text
//! cargo bench --bench handoff_process --all-features            # file and etcd
//! cargo bench --bench handoff_process --all-features -- file    # only these sections
//! INCUMBENT_BASELINE_BIN=/path/to/old/incumbent cargo bench --bench handoff_process --all-features -- etcd
//! HANDOFF_ROUNDS=60 cargo bench --bench handoff_process --all-features   # rounds per section (15; at most 1000)
//! ```
//!
//! With `INCUMBENT_BASELINE_BIN`, each section also runs that build of `incumbent` (another
//! version), its rounds interleaved with this build's, and prints both medians of the first
//! line and their ratio: measured in one run, on one machine, under the same load.
//!
//! Each round starts two `incumbent --log-format json run` processes (a leads, b follows),
//! both running the same command, then sends SIGTERM to a. Each section runs twice: with
//! `sh -c 'echo up; exec sleep 600'`, and with a program that prints at once (a few lines of
//! C compiled here with `cc`: a shell alone takes about 1 ms to print). Two kinds of
//! instants:
//! - when this process reads a line (a reader thread per stream): a's `command_stopped` (its
//!   command is gone), a's `stopped` (lock released, session closed), and the first line of
//!   b's command on b's stdout. Reading through pipes adds the same few microseconds to each.
//! - when b says things happened, from the fields of its `command_started` line (written after
//!   the spawn): the term's start (`term_started_unix_us`, the wall clock of this machine,
//!   compared with the wall clock at SIGTERM), the spawn's start
//!   (`spawn_after_term_start_us`) and its return (`spawn_us` later: `posix_spawn` returns
//!   once the program has been executed).
//!
//! So the hand-off splits into: SIGTERM → a's command stopped → b's term starts (a's release,
//! the store, b's wake-up and acquisition) → b's spawn starts → the program is executed → its
//! first line. The etcd section starts its own one-member etcd on loopback (tests/support).

#[path = "../tests/support/mod.rs"]
mod support;

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const BIN: &str = env!("CARGO_BIN_EXE_incumbent");
/// Rounds per section, unless `HANDOFF_ROUNDS` says otherwise.
const ROUNDS: usize = 15;
const LIMIT: Duration = Duration::from_secs(10);

/// A line read from a child, when it was read.
struct Seen {
    at: Instant,
    who: &'static str,
    stream: &'static str,
    line: String,
}

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn follow(
    stream: impl Read + Send + 'static,
    who: &'static str,
    name: &'static str,
    tx: Sender<Seen>,
) {
    thread::spawn(move || {
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            let seen = Seen {
                at: Instant::now(),
                who,
                stream: name,
                line,
            };
            if tx.send(seen).is_err() {
                return;
            }
        }
    });
}

/// The command each `incumbent run` supervises: it prints a line, then waits to be killed.
#[derive(Clone, Debug)]
enum Workload {
    /// `sh -c 'echo up; exec sleep 600'`: a shell starting costs about 1 ms of its own.
    Shell,
    /// A program that prints at once: the few lines of C in [`UP_C`], compiled here with the
    /// system's `cc` (statically when the C library allows it), the least a command can cost
    /// to start. `etcdctl lock`, the usual comparison, prints its line itself.
    PrintsAtOnce(std::path::PathBuf),
}

impl Workload {
    fn argv(&self) -> Vec<String> {
        match self {
            Workload::Shell => ["sh", "-c", "echo up; exec sleep 600"]
                .map(str::to_owned)
                .to_vec(),
            Workload::PrintsAtOnce(path) => vec![path.display().to_string()],
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Workload::Shell => "sh -c 'echo up; exec sleep 600'",
            Workload::PrintsAtOnce(_) => "a program that prints at once",
        }
    }
}

/// Prints `up`, then sleeps until killed.
const UP_C: &str =
    "#include <unistd.h>\nint main(void) { write(1, \"up\\n\", 3); for (;;) pause(); }\n";

/// Compiles [`UP_C`] into `dir`: statically if the C library allows it, else dynamically.
/// `None`, with the reason printed, when there is no C compiler.
fn prints_at_once(dir: &std::path::Path) -> Option<Workload> {
    let source = dir.join("up.c");
    let program = dir.join("up");
    std::fs::write(&source, UP_C).ok()?;
    for flags in [&["-O2", "-static"][..], &["-O2"][..]] {
        let built = Command::new("cc")
            .args(flags)
            .arg(&source)
            .arg("-o")
            .arg(&program)
            .stderr(Stdio::null())
            .status();
        if built.is_ok_and(|s| s.success()) {
            return Some(Workload::PrintsAtOnce(program));
        }
    }
    println!(
        "(no working `cc`: the \"prints at once\" sections are skipped; install gcc to run them)"
    );
    None
}

fn start(
    bin: &str,
    backend: &str,
    election: &str,
    who: &'static str,
    workload: &Workload,
    tx: &Sender<Seen>,
) -> Proc {
    let mut child = Command::new(bin)
        .args(["--log-format", "json", "run", "--election", election])
        .args(["--backend", backend, "--"])
        .args(workload.argv())
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn incumbent run");
    follow(
        child.stdout.take().expect("stdout"),
        who,
        "stdout",
        tx.clone(),
    );
    follow(
        child.stderr.take().expect("stderr"),
        who,
        "stderr",
        tx.clone(),
    );
    Proc(child)
}

fn event(seen: &Seen) -> Option<String> {
    let value: serde_json::Value = serde_json::from_str(&seen.line).ok()?;
    value["event"].as_str().map(str::to_owned)
}

/// A field of a JSON line, as a number.
fn field(seen: &Seen, name: &str) -> Option<f64> {
    let value: serde_json::Value = serde_json::from_str(&seen.line).ok()?;
    value[name].as_f64()
}

/// Waits for a line of `who` on `stream` (with `event`, on stderr), up to `LIMIT`.
fn wait_for(rx: &Receiver<Seen>, who: &str, stream: &str, wanted: Option<&str>) -> Option<Instant> {
    let deadline = Instant::now() + LIMIT;
    loop {
        let seen = rx
            .recv_timeout(deadline.checked_duration_since(Instant::now())?)
            .ok()?;
        if seen.who == who
            && seen.stream == stream
            && (wanted.is_none() || event(&seen).as_deref() == wanted)
        {
            return Some(seen.at);
        }
    }
}

/// The instants of one hand-off, in microseconds after SIGTERM.
#[derive(Default)]
struct Round {
    command_stopped: f64,
    released: f64,
    term_started: f64,
    spawn_began: f64,
    spawned: f64,
    first_line: f64,
}

fn round(bin: &str, backend: &str, workload: &Workload, n: usize) -> Option<Round> {
    let election = format!("bench/process-{n}-{}", std::process::id());
    let (tx, rx) = channel();
    let a = start(bin, backend, &election, "a", workload, &tx);
    wait_for(&rx, "a", "stdout", None)?;
    let b = start(bin, backend, &election, "b", workload, &tx);
    wait_for(&rx, "b", "stderr", Some("leader"))?;
    thread::sleep(Duration::from_millis(200));
    while rx.try_recv().is_ok() {}
    let sigterm = Instant::now();
    let sigterm_unix_us = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .ok()?
        .as_secs_f64()
        * 1e6;
    // SAFETY: kill has no memory-safety preconditions; the pid is our child's.
    unsafe {
        libc::kill(i32::try_from(a.0.id()).ok()?, libc::SIGTERM);
    }
    let mut r = Round::default();
    let us = |at: Instant| at.duration_since(sigterm).as_secs_f64() * 1e6;
    let deadline = Instant::now() + LIMIT;
    let mut got = 0;
    while got < 4 {
        let seen = rx
            .recv_timeout(deadline.checked_duration_since(Instant::now())?)
            .ok()?;
        let slot = match (seen.who, seen.stream, event(&seen).as_deref()) {
            ("a", "stderr", Some("command_stopped")) => &mut r.command_stopped,
            ("a", "stderr", Some("stopped")) => &mut r.released,
            ("b", "stderr", Some("command_started")) => {
                // NaN from a build without these fields (a baseline).
                let us = |name| field(&seen, name).unwrap_or(f64::NAN);
                r.term_started = us("term_started_unix_us") - sigterm_unix_us;
                r.spawn_began = r.term_started + us("spawn_after_term_start_us");
                r.spawned = r.spawn_began + us("spawn_us");
                got += 1;
                continue;
            }
            ("b", "stdout", _) => &mut r.first_line,
            _ => continue,
        };
        if *slot == 0.0 {
            *slot = us(seen.at);
            got += 1;
        }
    }
    drop(b);
    drop(a);
    Some(r)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

fn section(name: &str, backend: &str, workload: &Workload) {
    let baseline_bin = std::env::var("INCUMBENT_BASELINE_BIN").ok();
    let count = std::env::var("HANDOFF_ROUNDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(ROUNDS)
        .min(1000);
    let mut rounds = Vec::new();
    let mut baseline = Vec::new();
    for n in 0..count {
        if let Some(bin) = &baseline_bin
            && let Some(r) = round(bin, backend, workload, count + n)
        {
            baseline.push(r.first_line);
        }
        rounds.extend(round(BIN, backend, workload, n));
    }
    let med = |f: fn(&Round) -> f64| median(rounds.iter().map(f).collect()) / 1000.0;
    println!(
        "{name}, command {}: {} rounds; medians, ms after SIGTERM of the leader's supervisor:",
        workload.name(),
        rounds.len()
    );
    println!(
        "  old leader's command stopped (line read)     {:7.2}",
        med(|r| r.command_stopped)
    );
    println!(
        "  old leader's lock released (line read)       {:7.2}",
        med(|r| r.released)
    );
    println!(
        "  new leader's term started (its clock)        {:7.2}",
        med(|r| r.term_started)
    );
    println!(
        "  new leader's spawn began (its clock)         {:7.2}",
        med(|r| r.spawn_began)
    );
    println!(
        "  new leader's program executed (its clock)    {:7.2}",
        med(|r| r.spawned)
    );
    println!(
        "  new leader's command's first line (read)     {:7.2}  [target on etcd: <= 3 ms]",
        med(|r| r.first_line)
    );
    println!("  splits (medians of per-round differences), ms:");
    println!(
        "    SIGTERM -> command stopped                  {:7.2}",
        med(|r| r.command_stopped)
    );
    println!(
        "    command stopped -> next term (release, store, wake-up) {:7.2}",
        med(|r| r.term_started - r.command_stopped)
    );
    println!(
        "    term started -> spawn began                 {:7.2}",
        med(|r| r.spawn_began - r.term_started)
    );
    println!(
        "    spawn began -> program executed             {:7.2}",
        med(|r| r.spawned - r.spawn_began)
    );
    println!(
        "    program executed -> its first line          {:7.2}",
        med(|r| r.first_line - r.spawned)
    );
    if let Some(bin) = baseline_bin {
        let this = med(|r| r.first_line);
        let before = median(baseline.clone()) / 1000.0;
        println!(
            "  baseline {bin}: {} rounds, interleaved; first line {before:7.2} ms; this build {this:7.2} ms; ratio baseline/this {:.2}",
            baseline.len(),
            before / this
        );
    }
}

/// The same hand-off with `etcdctl lock`, etcd's own tool, for a ratio measured in the same
/// run: from SIGTERM of the holder (which releases the lock as it exits) to the next holder
/// printing the lock's key (it starts no command: it prints the line itself).
#[cfg(feature = "etcd")]
fn etcdctl_section(endpoint: &str) {
    let count = std::env::var("HANDOFF_ROUNDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(ROUNDS)
        .min(1000);
    let start = |name: &str, who: &'static str, tx: &Sender<Seen>| -> Option<Proc> {
        let mut child = Command::new("etcdctl")
            .args(["--endpoints", endpoint, "lock", name])
            .env("ETCDCTL_API", "3")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        follow(child.stdout.take()?, who, "stdout", tx.clone());
        Some(Proc(child))
    };
    let mut first_lines = Vec::new();
    for n in 0..count {
        let name = format!("bench/etcdctl-{n}-{}", std::process::id());
        let (tx, rx) = channel();
        let Some(a) = start(&name, "a", &tx) else {
            println!(
                "etcdctl lock: `etcdctl` did not start (bash scripts/install-test-deps installs it)"
            );
            return;
        };
        if wait_for(&rx, "a", "stdout", None).is_none() {
            continue;
        }
        let Some(b) = start(&name, "b", &tx) else {
            continue;
        };
        thread::sleep(Duration::from_millis(200));
        let sigterm = Instant::now();
        // SAFETY: kill has no memory-safety preconditions; the pid is our child's.
        unsafe {
            libc::kill(i32::try_from(a.0.id()).unwrap_or(0), libc::SIGTERM);
        }
        if let Some(at) = wait_for(&rx, "b", "stdout", None) {
            first_lines.push(at.duration_since(sigterm).as_secs_f64() * 1e6);
        }
        drop(b);
        drop(a);
    }
    println!(
        "etcd, `etcdctl lock` (same etcd, same run): {} rounds; median from SIGTERM of the holder to the next holder's line: {:.2} ms",
        first_lines.len(),
        median(first_lines) / 1000.0
    );
}

fn main() {
    let only: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let wanted = |name: &str| only.is_empty() || only.iter().any(|o| o == name);
    let programs = tempfile::tempdir().expect("temporary directory");
    let workloads: Vec<Workload> = std::iter::once(Workload::Shell)
        .chain(prints_at_once(programs.path()))
        .collect();
    if wanted("file") {
        let dir = tempfile::tempdir().expect("temporary directory");
        for workload in &workloads {
            section(
                "file",
                &format!("file://{}", dir.path().display()),
                workload,
            );
        }
    }
    #[cfg(feature = "etcd")]
    if wanted("etcd") {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let etcd = runtime.block_on(support::EtcdServer::single());
        for workload in &workloads {
            section("etcd", &format!("etcd://{}", etcd.client_addr()), workload);
        }
        etcdctl_section(&etcd.client_addr().to_string());
        drop(etcd);
    }
}
