//! The `incumbent` command line, run as real processes on the file backend in a temporary
//! directory. One behaviour per test, named for it. Every wait is bounded, and every process
//! a test starts is killed when the test ends, pass or fail.

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_incumbent");
const ELECTION: &str = "jobs/index";
/// How long any wait in these tests may take before the test fails.
const LIMIT: Duration = Duration::from_secs(10);

/// The command each candidate runs: it appends `pid token term-start election` to the file
/// named by its first argument, then becomes a long sleep (same pid).
const SLEEPER: &str = r#"echo "$$ $INCUMBENT_FENCING_TOKEN $INCUMBENT_TERM_STARTED $INCUMBENT_ELECTION" >> "$0"; exec sleep 600"#;

/// Polls `done` every 20 ms until it holds or `limit` passes; whether it held.
fn wait_until(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// Whether `pid` is a live process (a zombie, dead but not yet reaped, is not).
fn alive(pid: i32) -> bool {
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat
        .rsplit_once(") ")
        .and_then(|(_, rest)| rest.chars().next());
    !matches!(state, Some('Z' | 'X') | None)
}

fn signal(pid: u32, signal: i32) {
    let pid = i32::try_from(pid).expect("pid fits");
    // SAFETY: kill has no memory-safety preconditions.
    unsafe {
        libc::kill(pid, signal);
    }
}

/// A process killed (SIGKILL) and reaped on drop.
struct Guard(Child);

impl Guard {
    fn pid(&self) -> u32 {
        self.0.id()
    }

    /// Waits for the process to exit, at most `limit`.
    fn exit_within(&mut self, limit: Duration) -> Option<ExitStatus> {
        let mut status = None;
        wait_until(limit, || {
            status = self.0.try_wait().ok().flatten();
            status.is_some()
        });
        status
    }

    fn is_running(&mut self) -> bool {
        matches!(self.0.try_wait(), Ok(None))
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One start of a candidate's command, as it wrote it.
#[derive(Clone, Debug)]
struct Start {
    pid: i32,
    token: u64,
    term_started: String,
    election: String,
}

/// An `incumbent run` process, its command's starts, and its log.
struct Candidate {
    process: Guard,
    starts: PathBuf,
    log: PathBuf,
}

impl Candidate {
    fn pid(&self) -> u32 {
        self.process.pid()
    }

    fn starts(&self) -> Vec<Start> {
        let text = fs::read_to_string(&self.starts).unwrap_or_default();
        text.split_inclusive('\n')
            .filter(|line| line.ends_with('\n'))
            .filter_map(|line| {
                let mut parts = line.split_whitespace();
                Some(Start {
                    pid: parts.next()?.parse().ok()?,
                    token: parts.next()?.parse().ok()?,
                    term_started: parts.next()?.to_owned(),
                    election: parts.next()?.to_owned(),
                })
            })
            .collect()
    }

    /// The `n`th start (from 1), waiting for it.
    fn start(&self, n: usize) -> Start {
        let mut starts = Vec::new();
        let started = wait_until(LIMIT, || {
            starts = self.starts();
            starts.len() >= n
        });
        assert!(started, "start #{n} did not come; log:\n{}", self.log());
        starts[n - 1].clone()
    }

    fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until this candidate reports a leader other than itself: it is following.
    fn following(&self) {
        let seen = wait_until(LIMIT, || self.log().contains("leader: "));
        assert!(seen, "not following; log:\n{}", self.log());
    }
}

impl Drop for Candidate {
    fn drop(&mut self) {
        // Its commands die with it (parent-death signal); make sure even if that failed.
        signal(self.process.pid(), libc::SIGKILL);
        let _ = self.process.0.wait();
        for start in self.starts() {
            if alive(start.pid) {
                signal(start.pid as u32, libc::SIGKILL);
            }
        }
    }
}

/// A temporary directory holding the lock files and the candidates' files.
struct Sandbox {
    dir: tempfile::TempDir,
}

impl Sandbox {
    fn new() -> Sandbox {
        Sandbox {
            dir: tempfile::tempdir().expect("temporary directory"),
        }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(BIN);
        command
            .args(args)
            .env(
                "INCUMBENT_BACKEND",
                format!("file://{}", self.dir.path().join("locks").display()),
            )
            .env_remove("RUST_LOG")
            .stdin(Stdio::null());
        command
    }

    /// Starts `incumbent run --election ELECTION OPTIONS -- sh -c SCRIPT <starts file>`.
    fn candidate_running(&self, name: &str, options: &[&str], script: &str) -> Candidate {
        let starts = self.dir.path().join(format!("{name}.starts"));
        let log = self.dir.path().join(format!("{name}.log"));
        let mut args = vec!["run", "--election", ELECTION];
        args.extend(options);
        let starts_arg = starts.display().to_string();
        args.extend(["--", "sh", "-c", script, &starts_arg]);
        let process = self
            .command(&args)
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("spawn incumbent");
        Candidate {
            process: Guard(process),
            starts,
            log,
        }
    }

    fn candidate(&self, name: &str) -> Candidate {
        self.candidate_running(name, &[], SLEEPER)
    }

    /// `a` (leading once `start(1)` returns), then `b` and `c` following, each with `--id`
    /// its name.
    fn three_named(&self) -> (Candidate, Candidate, Candidate) {
        let a = self.candidate_running("a", &["--id", "a"], SLEEPER);
        a.start(1);
        let b = self.candidate_running("b", &["--id", "b"], SLEEPER);
        b.following();
        let c = self.candidate_running("c", &["--id", "c"], SLEEPER);
        c.following();
        (a, b, c)
    }

    /// Runs `incumbent ARGS` to completion (at most `LIMIT`).
    fn output(&self, args: &[&str]) -> Output {
        self.output_of(self.command(args))
    }

    fn output_of(&self, mut command: Command) -> Output {
        let mut guard = Guard(
            command
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn incumbent"),
        );
        assert!(guard.exit_within(LIMIT).is_some(), "{command:?} hangs");
        let mut output = Output {
            status: guard.0.wait().expect("status"),
            stdout: Vec::new(),
            stderr: Vec::new(),
        };
        if let Some(mut out) = guard.0.stdout.take() {
            let _ = std::io::Read::read_to_end(&mut out, &mut output.stdout);
        }
        if let Some(mut err) = guard.0.stderr.take() {
            let _ = std::io::Read::read_to_end(&mut err, &mut output.stderr);
        }
        output
    }

    fn status_json(&self) -> Value {
        let output = self.output(&["status", "--election", ELECTION, "--json"]);
        assert!(output.status.success(), "{output:?}");
        serde_json::from_slice(&output.stdout).expect("status --json prints JSON")
    }
}

fn leader_pid(status: &Value) -> Option<u32> {
    status["leader"]["metadata"]["pid"].as_str()?.parse().ok()
}

#[test]
fn only_the_leaders_command_runs_with_the_term_in_its_environment() {
    let sandbox = Sandbox::new();
    let a = sandbox.candidate("a");
    let start = a.start(1);
    let b = sandbox.candidate("b");
    b.following();
    thread::sleep(Duration::from_millis(300));

    assert!(b.starts().is_empty(), "the follower ran its command");
    assert!(alive(start.pid), "the leader's command runs");
    assert!(start.token >= 1);
    assert_eq!(start.election, ELECTION);
    let t = start.term_started.as_bytes();
    assert!(
        t.len() == 24 && t[10] == b'T' && t[23] == b'Z',
        "INCUMBENT_TERM_STARTED is RFC 3339 with milliseconds: {}",
        start.term_started
    );
}

#[test]
fn a_killed_leaders_command_dies_with_it_and_the_follower_takes_over_with_a_larger_token() {
    let sandbox = Sandbox::new();
    let a = sandbox.candidate("a");
    let first = a.start(1);
    let b = sandbox.candidate_running("b", &["--log-format", "json"], SLEEPER);
    b.following();

    signal(a.pid(), libc::SIGKILL);
    assert!(
        wait_until(Duration::from_secs(3), || !alive(first.pid)),
        "the command outlived its incumbent"
    );
    let second = b.start(1);
    assert!(second.token > first.token, "{second:?} after {first:?}");

    // The lines come after the spawn: nothing stands between a win and the command.
    wait_until(Duration::from_secs(3), || {
        b.log().contains(r#""event":"elected""#)
    });
    let log = b.log();
    let elected: Vec<Value> = log
        .lines()
        .map(|line| serde_json::from_str(line).expect("--log-format json: JSON lines"))
        .filter(|event: &Value| event["event"] == "elected")
        .collect();
    assert_eq!(elected.len(), 1, "{log}");
    assert_eq!(elected[0]["fencing_token"], second.token);
    assert_eq!(elected[0]["election"], ELECTION);
    // The failover figures, not how long b campaigned (over a second here): on the file
    // backend the kernel frees a dead holder's lock at once, so the time without a leader is
    // the time the lock was free, milliseconds.
    let lock_free = elected[0]["lock_free_ms"].as_u64().expect("lock_free_ms");
    let without = elected[0]["without_leader_ms"]
        .as_u64()
        .expect("without_leader_ms");
    assert!(lock_free < 1_000, "{log}");
    assert_eq!(without, lock_free, "{log}");
    assert!(
        elected[0]["campaigned_ms"].as_u64().expect("campaigned_ms") > lock_free,
        "{log}"
    );
    assert_eq!(elected[0]["exact"], false, "{log}");
}

#[test]
fn sigterm_stops_the_command_releases_the_lock_at_once_and_exits_0() {
    let sandbox = Sandbox::new();
    let mut a = sandbox.candidate("a");
    let first = a.start(1);
    let b = sandbox.candidate("b");
    b.following();

    let asked = Instant::now();
    signal(a.pid(), libc::SIGTERM);
    let second = b.start(1);
    let handed_over = asked.elapsed();
    assert!(
        !alive(first.pid),
        "the old command still ran when the new one started"
    );
    // The file lock passes to the waiting follower the moment it is released.
    assert!(
        handed_over < Duration::from_secs(1),
        "hand-off took {handed_over:?}"
    );
    assert!(second.token > first.token);
    let status = a.process.exit_within(LIMIT).expect("exits");
    assert_eq!(status.code(), Some(0), "log:\n{}", a.log());
    assert!(a.log().contains("the lock is released"), "{}", a.log());
}

#[test]
fn a_command_that_ignores_sigterm_is_killed_after_the_grace() {
    let sandbox = Sandbox::new();
    let stubborn = r#"trap '' TERM; echo "$$ $INCUMBENT_FENCING_TOKEN $INCUMBENT_TERM_STARTED $INCUMBENT_ELECTION" >> "$0"; while :; do sleep 0.05; done"#;
    let mut a = sandbox.candidate_running("a", &["--grace", "300ms"], stubborn);
    let start = a.start(1);

    let asked = Instant::now();
    signal(a.pid(), libc::SIGTERM);
    let status = a.process.exit_within(LIMIT).expect("exits");
    assert!(asked.elapsed() >= Duration::from_millis(300), "no grace");
    assert_eq!(status.code(), Some(0), "log:\n{}", a.log());
    assert!(!alive(start.pid));
    assert!(a.log().contains("was killed"), "{}", a.log());
}

#[test]
fn status_prints_the_leader_as_json_and_as_a_table() {
    let sandbox = Sandbox::new();
    let a = sandbox.candidate("a");
    let start = a.start(1);

    let status = sandbox.status_json();
    assert_eq!(status["election"], ELECTION);
    assert_eq!(leader_pid(&status), Some(a.pid()));
    assert_eq!(status["leader"]["fencing_token"], start.token);
    assert!(status["leader"]["id"].is_string());
    assert!(status["leader"]["metadata"]["host"].is_string());
    assert!(status["leader"]["since_unix_ms"].is_u64());
    assert!(status["leader"]["since"].is_string());

    let table = sandbox.output(&["status", "--election", ELECTION]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(table.status.success());
    assert!(
        text.contains(&format!("fencing token  {}", start.token)),
        "{text}"
    );
    assert!(text.contains(&format!("pid={}", a.pid())), "{text}");

    let nobody = sandbox.output(&["status", "--election", "jobs/idle", "--json"]);
    let nobody: Value = serde_json::from_slice(&nobody.stdout).expect("JSON");
    assert!(nobody["leader"].is_null());
}

#[test]
fn observe_prints_each_leader_change() {
    let sandbox = Sandbox::new();
    let a = sandbox.candidate("a");
    a.start(1);
    let mut observer = Guard(
        sandbox
            .command(&["observe", "--election", ELECTION, "--json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn observe"),
    );
    let (tx, lines) = mpsc::channel::<Value>();
    let stdout = observer.0.stdout.take().expect("piped stdout");
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx
                .send(serde_json::from_str(&line).expect("one JSON object per line"))
                .is_err()
            {
                return;
            }
        }
    });
    let first = lines.recv_timeout(LIMIT).expect("the current leader");
    assert_eq!(leader_pid(&first), Some(a.pid()), "{first}");

    let b = sandbox.candidate("b");
    b.following();
    signal(a.pid(), libc::SIGTERM);
    let deadline = Instant::now() + LIMIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = lines.recv_timeout(left).expect("the change is printed");
        if leader_pid(&line) == Some(b.pid()) {
            break;
        }
        assert!(line["leader"].is_null(), "an unexpected leader: {line}");
    }

    signal(observer.pid(), libc::SIGINT);
    let status = observer
        .exit_within(LIMIT)
        .expect("observe stops on SIGINT");
    assert_eq!(status.code(), Some(0));
}

#[test]
fn resign_hands_leadership_to_the_follower() {
    let sandbox = Sandbox::new();
    let mut a = sandbox.candidate("a");
    let first = a.start(1);
    let b = sandbox.candidate("b");
    b.following();

    let resign = sandbox.output(&["resign", "--election", ELECTION]);
    let stdout = String::from_utf8_lossy(&resign.stdout);
    assert_eq!(
        resign.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&resign.stderr)
    );
    assert!(stdout.contains("the leader is now"), "{stdout}");
    let second = b.start(1);
    assert!(second.token > first.token);
    assert!(!alive(first.pid), "the resigned leader's command runs on");
    assert!(
        a.process.is_running(),
        "the resigned candidate campaigns on"
    );
    assert_eq!(leader_pid(&sandbox.status_json()), Some(b.pid()));
}

#[test]
fn resign_with_yield_keeps_the_old_leader_from_winning_straight_back() {
    // a leads, b follows; `incumbent resign --yield 4s` hands over to b; b is killed at
    // once (the file backend frees its lock that instant), and still a does not lead
    // before its 4 s have passed; then it does, with a greater token.
    let sandbox = Sandbox::new();
    let a = sandbox.candidate("a");
    let first = a.start(1);
    let b = sandbox.candidate("b");
    b.following();
    let asked = Instant::now();
    let resign = sandbox.output(&["resign", "--election", ELECTION, "--yield", "4s"]);
    let stdout = String::from_utf8_lossy(&resign.stdout);
    assert_eq!(
        resign.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&resign.stderr)
    );
    assert!(stdout.contains("not to campaign again for 4s"), "{stdout}");
    let second = b.start(1);
    assert!(second.token > first.token);
    signal(b.pid(), libc::SIGKILL);
    let third = a.start(2);
    let took = asked.elapsed();
    assert!(
        took >= Duration::from_millis(3900),
        "a led again {took:?} after resigning for 4 s; log:\n{}",
        a.log()
    );
    assert!(third.token > second.token);
    assert!(
        a.log().contains("not campaigning again for 4s"),
        "{}",
        a.log()
    );
}

#[test]
fn resign_refuses_a_yield_above_a_day() {
    let sandbox = Sandbox::new();
    let output = sandbox.output(&["resign", "--election", ELECTION, "--yield", "2d"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--yield is at most"), "{stderr}");
}

#[test]
fn resign_without_a_leader_fails_with_exit_code_1() {
    let sandbox = Sandbox::new();
    let output = sandbox.output(&["resign", "--election", ELECTION]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("nobody leads"), "{stderr}");
}

#[test]
fn a_command_that_exits_makes_the_leader_resign_and_run_it_again_when_re_elected() {
    let sandbox = Sandbox::new();
    let script = r#"echo "$$ $INCUMBENT_FENCING_TOKEN $INCUMBENT_TERM_STARTED $INCUMBENT_ELECTION" >> "$0"; exit 3"#;
    let a = sandbox.candidate_running("a", &[], script);
    let first = a.start(1);
    let second = a.start(2);
    assert!(second.token > first.token, "a new term: {second:?}");
    let log = a.log();
    assert!(log.contains("exit code 3"), "{log}");
    assert!(log.contains("demoted"), "{log}");
}

#[test]
fn exit_with_child_exits_with_the_commands_status_and_releases_the_lock() {
    let sandbox = Sandbox::new();
    let script = r#"echo "$$ $INCUMBENT_FENCING_TOKEN $INCUMBENT_TERM_STARTED $INCUMBENT_ELECTION" >> "$0"; exit 7"#;
    let mut a = sandbox.candidate_running("a", &["--exit-with-child"], script);
    let status = a
        .process
        .exit_within(LIMIT)
        .expect("exits with the command");
    assert_eq!(status.code(), Some(7), "log:\n{}", a.log());
    assert_eq!(a.starts().len(), 1);
    assert!(sandbox.status_json()["leader"].is_null());
}

#[test]
fn usage_and_configuration_errors_exit_2_with_one_line() {
    let sandbox = Sandbox::new();
    let e = ELECTION;
    let mut cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["run", "--election", e, "--backend", "nothing", "--", "true"],
            "no scheme",
        ),
        (
            vec!["run", "--election", e, "--backend", "ftp://x", "--", "true"],
            "unknown scheme",
        ),
        (vec!["run", "--election", e, "sleep", "1"], "after `--`"),
        (vec!["run", "--election", e], "after `--`"),
        (vec!["run", "--election", e, "--"], "after `--`"),
        (vec!["run", "--", "true"], "--election"),
        (
            vec!["run", "--election", e, "--ttl", "10", "--", "true"],
            "no unit",
        ),
        (
            vec!["run", "--election", e, "--grace", "soon", "--", "true"],
            "not a duration",
        ),
        (
            vec![
                "run",
                "--election",
                e,
                "--ttl",
                "999999999999h",
                "--",
                "true",
            ],
            "--ttl <DUR>': `999999999999h` is out of range",
        ),
        (
            vec![
                "run",
                "--election",
                e,
                "--grace",
                "999999999999h",
                "--",
                "true",
            ],
            "out of range",
        ),
        (
            vec!["status", "--election", e, "--timeout", "999999999999h"],
            "out of range",
        ),
        (
            vec![
                "resign",
                "--election",
                e,
                "--timeout",
                "99999999999999999999999s",
            ],
            "out of range",
        ),
        (
            vec!["run", "--election", "/bad", "--", "true"],
            "invalid election name",
        ),
        (
            vec!["run", "--election", e, "--", "/nonexistent/worker"],
            "not an executable file",
        ),
        (
            vec!["run", "--election", e, "--", "no-such-command-here"],
            "not found on PATH",
        ),
        (
            vec!["status", "--election", e, "--backend", "ftp://x"],
            "unknown scheme",
        ),
        (
            vec!["observe", "--election", e, "--backend", "nothing"],
            "no scheme",
        ),
        (
            vec!["resign", "--election", "a//b"],
            "invalid election name",
        ),
        (vec!["frobnicate"], "frobnicate"),
    ];
    if !cfg!(feature = "etcd") {
        cases.push((
            vec![
                "run",
                "--election",
                e,
                "--backend",
                "etcd://127.0.0.1:2379",
                "--",
                "true",
            ],
            "--features etcd",
        ));
    }
    if !cfg!(feature = "consul") {
        cases.push((
            vec![
                "status",
                "--election",
                e,
                "--backend",
                "consul://127.0.0.1:8500",
            ],
            "--features consul",
        ));
    }
    for (args, hint) in cases {
        let output = sandbox.output(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.contains(hint), "{args:?}: {stderr}");
    }

    let mut from_env = sandbox.command(&["status", "--election", e]);
    from_env.env("INCUMBENT_BACKEND", "ftp://x");
    let output = sandbox.output_of(from_env);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("unknown scheme"));
}

// ---- stderr that nobody reads, or that is closed ----

/// A pipe for a process's stderr that the test never reads. `fill` makes it full, so that
/// every further write to it blocks (until the test ends and the read end is closed).
struct UnreadPipe {
    reader: Option<std::io::PipeReader>,
    writer: std::io::PipeWriter,
}

impl UnreadPipe {
    fn new() -> UnreadPipe {
        let (reader, writer) = std::io::pipe().expect("pipe");
        UnreadPipe {
            reader: Some(reader),
            writer,
        }
    }

    /// The write end, for a child's stderr.
    fn stdio(&self) -> Stdio {
        Stdio::from(self.writer.try_clone().expect("dup the pipe"))
    }

    /// Closes the read end: writes fail with EPIPE from now on.
    fn close_reader(&mut self) {
        self.reader = None;
    }

    /// Fills the pipe from a thread of its own (a chatty process sharing the pipe), and waits
    /// until it is full.
    fn fill(&self) {
        use std::io::Write;
        use std::os::fd::AsRawFd;
        let reader = self.reader.as_ref().expect("open pipe");
        // SAFETY: fcntl on a descriptor we own.
        let capacity = unsafe { libc::fcntl(reader.as_raw_fd(), libc::F_GETPIPE_SZ) };
        assert!(capacity > 0, "F_GETPIPE_SZ");
        let capacity = usize::try_from(capacity).expect("size");
        let mut chatty = self.writer.try_clone().expect("dup the pipe");
        thread::spawn(move || {
            // Blocks once the pipe is full; fails (and ends) when the test drops the reader.
            let _ = chatty.write_all(&vec![b'.'; capacity * 4]);
        });
        let fd = reader.as_raw_fd();
        let full = wait_until(LIMIT, || {
            let mut queued: libc::c_int = 0;
            // SAFETY: FIONREAD writes one int.
            unsafe { libc::ioctl(fd, libc::FIONREAD, &mut queued) };
            usize::try_from(queued).unwrap_or(0) + 4096 >= capacity
        });
        assert!(full, "the pipe did not fill up");
        thread::sleep(Duration::from_millis(100));
    }
}

impl Sandbox {
    /// Starts a candidate whose stderr is `stderr`, with `env` added to its environment.
    fn candidate_with(
        &self,
        name: &str,
        options: &[&str],
        script: &str,
        stderr: Stdio,
        env: &[(&str, &str)],
    ) -> Candidate {
        let starts = self.dir.path().join(format!("{name}.starts"));
        let log = self.dir.path().join(format!("{name}.log"));
        let mut args = vec!["run", "--election", ELECTION];
        args.extend(options);
        let starts_arg = starts.display().to_string();
        args.extend(["--", "sh", "-c", script, &starts_arg]);
        let mut command = self.command(&args);
        command.envs(env.iter().copied());
        let process = command
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawn incumbent");
        Candidate {
            process: Guard(process),
            starts,
            log,
        }
    }
}

#[test]
fn a_full_stderr_does_not_keep_sigterm_from_stopping_the_command_and_handing_over() {
    let sandbox = Sandbox::new();
    let pipe = UnreadPipe::new();
    // Info lines too, so that there is plenty to write while the pipe is full.
    let mut a = sandbox.candidate_with(
        "a",
        &[],
        SLEEPER,
        pipe.stdio(),
        &[("RUST_LOG", "incumbent=debug")],
    );
    let first = a.start(1);
    let b = sandbox.candidate("b");
    b.following();
    pipe.fill();

    signal(a.pid(), libc::SIGTERM);
    let second = b.start(1);
    assert!(
        !alive(first.pid),
        "the old command still ran when the next leader's started"
    );
    assert!(second.token > first.token);
    let status = a.process.exit_within(LIMIT).expect("exits");
    assert_eq!(status.code(), Some(0));
}

#[test]
fn a_closed_stderr_neither_panics_nor_wedges_and_sigterm_still_stops_the_command() {
    let sandbox = Sandbox::new();
    let mut pipe = UnreadPipe::new();
    pipe.close_reader();
    // Every event of the library is written (and fails with EPIPE).
    let mut a = sandbox.candidate_with(
        "a",
        &[],
        SLEEPER,
        pipe.stdio(),
        &[("RUST_LOG", "incumbent=debug")],
    );
    let first = a.start(1);
    thread::sleep(Duration::from_millis(300));
    assert!(a.process.is_running(), "incumbent ended by itself");
    assert!(alive(first.pid));

    signal(a.pid(), libc::SIGTERM);
    let status = a.process.exit_within(LIMIT).expect("exits on SIGTERM");
    assert_eq!(status.code(), Some(0));
    assert!(!alive(first.pid), "the command outlived its incumbent");
    assert!(
        sandbox.status_json()["leader"].is_null(),
        "the lock is held"
    );
}

#[test]
fn a_closed_stderr_fails_nothing_when_the_command_exits_and_restarts() {
    let sandbox = Sandbox::new();
    let mut pipe = UnreadPipe::new();
    pipe.close_reader();
    let script = r#"echo "$$ $INCUMBENT_FENCING_TOKEN $INCUMBENT_TERM_STARTED $INCUMBENT_ELECTION" >> "$0"; exit 3"#;
    let mut a = sandbox.candidate_with("a", &[], script, pipe.stdio(), &[("RUST_LOG", "debug")]);
    let first = a.start(1);
    let second = a.start(2);
    assert!(second.token > first.token);
    assert!(a.process.is_running());
    signal(a.pid(), libc::SIGTERM);
    let status = a.process.exit_within(LIMIT).expect("exits on SIGTERM");
    assert_eq!(status.code(), Some(0));
}

// ---- hard stop on an involuntary loss ----

/// A command that ignores SIGTERM (its `sleep`s too: an ignored signal stays ignored
/// across exec).
const STUBBORN: &str = r#"trap '' TERM; echo "$$ $INCUMBENT_FENCING_TOKEN $INCUMBENT_TERM_STARTED $INCUMBENT_ELECTION" >> "$0"; while :; do sleep 0.05; done"#;

#[test]
fn a_lost_lock_kills_a_command_that_ignores_sigterm_at_once_whatever_the_grace() {
    let sandbox = Sandbox::new();
    let a = sandbox.candidate_running("a", &["--grace", "30s"], STUBBORN);
    let first = a.start(1);
    assert!(alive(first.pid));

    // The store (here, the lock file) takes the lock away: the next leader may start now.
    let locks = sandbox.dir.path().join("locks");
    let lock = fs::read_dir(&locks)
        .expect("lock directory")
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        // The election's, not a candidate's presence record (`jobs+index+.candidates+….lock`).
        .find(|path| path.file_name().is_some_and(|n| n == "jobs+index.lock"))
        .expect("the election's lock file");
    let deleted = Instant::now();
    fs::remove_file(&lock).expect("delete the lock file");
    // The loss is seen at the next renewal (a third of the default 10 s ttl), and the
    // command is killed at once then: well before the 30 s grace, even on a loaded machine
    // running eight tests at a time (5 s was once too short there).
    assert!(
        wait_until(Duration::from_secs(12), || !alive(first.pid)),
        "the command still runs {:?} after the lock was lost; log:\n{}",
        deleted.elapsed(),
        a.log()
    );
    // The kill comes first and the log line after it (nothing stands between seeing the
    // loss and ending the term): the line may not be written yet when the command is gone.
    assert!(
        wait_until(Duration::from_secs(5), || a.log().contains("SIGKILL")),
        "{}",
        a.log()
    );
}

#[test]
fn a_second_sigterm_kills_the_command_at_once_and_ends_the_supervisor() {
    let sandbox = Sandbox::new();
    let mut a = sandbox.candidate_running("a", &["--grace", "30s"], STUBBORN);
    let first = a.start(1);
    signal(a.pid(), libc::SIGTERM);
    thread::sleep(Duration::from_millis(300));
    assert!(alive(first.pid), "the grace was not given");
    let asked = Instant::now();
    signal(a.pid(), libc::SIGTERM);
    let status = a
        .process
        .exit_within(Duration::from_secs(5))
        .expect("exits");
    assert!(
        asked.elapsed() < Duration::from_secs(3),
        "{:?}",
        asked.elapsed()
    );
    assert!(status.code().is_some(), "{status:?}");
    assert!(!alive(first.pid), "log:\n{}", a.log());
}

// ---- the command's environment ----

#[test]
fn the_command_does_not_inherit_the_stores_credentials_unless_asked() {
    let secrets = [
        ("INCUMBENT_ETCD_USER", "user-7f3a"),
        ("INCUMBENT_ETCD_PASSWORD", "secret-etcd-91b2"),
        ("ETCDCTL_USER", "root:secret-ctl-55c1"),
        ("ETCDCTL_PASSWORD", "secret-ctl-8d0e"),
        ("CONSUL_HTTP_TOKEN", "secret-consul-4e6f"),
        ("CONSUL_HTTP_AUTH", "op:secret-auth-3a9b"),
        ("CONSUL_HTTP_TOKEN_FILE", "/run/secret-consul-file-77aa"),
        ("INCUMBENT_ZK_AUTH", "zk:secret-zk-6d1e"),
        ("INCUMBENT_REDIS_USER", "redis-user-0b7c"),
        ("INCUMBENT_REDIS_PASSWORD", "secret-redis-2f8a"),
        ("REDISCLI_AUTH", "secret-rediscli-9e4d"),
    ];
    let mut env = secrets.to_vec();
    env.push(("APP_SETTING", "kept-2c4d"));
    let script = r#"env > "$0.env"; echo "$$ $INCUMBENT_FENCING_TOKEN $INCUMBENT_TERM_STARTED $INCUMBENT_ELECTION" >> "$0"; exec sleep 600"#;

    for (pass, name) in [(false, "a"), (true, "b")] {
        let sandbox = Sandbox::new();
        let options: &[&str] = if pass { &["--pass-credentials"] } else { &[] };
        let log = fs::File::create(sandbox.dir.path().join(format!("{name}.log"))).expect("log");
        let candidate = sandbox.candidate_with(name, options, script, log.into(), &env);
        candidate.start(1);
        let seen = fs::read_to_string(format!("{}.env", candidate.starts.display()))
            .expect("the command's environment");
        assert!(seen.contains("APP_SETTING=kept-2c4d"), "{seen}");
        for (variable, value) in secrets {
            assert_eq!(
                seen.contains(value),
                pass,
                "{variable} with --pass-credentials={pass}:\n{seen}"
            );
        }
    }
}

// ---- resign trusts no pid from the store ----

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length.
    unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    let len = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..len]).into_owned()
}

/// A leader of ELECTION, in this test process, whose metadata names `pid` as an
/// `incumbent run` on this host would.
struct FakeLeader {
    runtime: tokio::runtime::Runtime,
    campaign: Option<incumbent::Campaign>,
}

impl FakeLeader {
    fn new(sandbox: &Sandbox, pid: &str) -> FakeLeader {
        use incumbent::{Election, LeadershipEvent, file::FileBackend};
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let locks = sandbox.dir.path().join("locks");
        let campaign = runtime.block_on(async {
            let election = Election::builder(FileBackend::in_dir(locks), ELECTION)
                .candidate("impostor")
                .metadata("host", hostname())
                .metadata("pid", pid)
                .metadata("resign", "SIGUSR1")
                .build()
                .expect("election");
            let mut campaign = election.campaign();
            let elected = tokio::time::timeout(LIMIT, async {
                while let Some(event) = campaign.recv().await {
                    if matches!(event, LeadershipEvent::Elected(_)) {
                        return true;
                    }
                }
                false
            })
            .await;
            assert_eq!(elected.ok(), Some(true), "the fake leader was not elected");
            campaign
        });
        FakeLeader {
            runtime,
            campaign: Some(campaign),
        }
    }
}

impl Drop for FakeLeader {
    fn drop(&mut self) {
        if let Some(campaign) = self.campaign.take() {
            let _ = self
                .runtime
                .block_on(async { tokio::time::timeout(LIMIT, campaign.shutdown()).await });
        }
    }
}

fn assert_refused(output: &Output) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert!(stderr.contains("refusing to signal"), "{stderr}");
}

#[test]
fn resign_refuses_a_pid_that_would_signal_a_process_group() {
    use std::os::unix::process::CommandExt;
    let sandbox = Sandbox::new();
    let _leader = FakeLeader::new(&sandbox, "0");
    // In a process group of its own: were pid 0 signalled, only resign itself would be hit.
    let mut resign = sandbox.command(&["resign", "--election", ELECTION, "--timeout", "1s"]);
    resign.process_group(0);
    assert_refused(&sandbox.output_of(resign));
}

#[test]
fn resign_refuses_to_signal_itself() {
    use std::io::Write;
    use std::os::unix::process::CommandExt;
    let sandbox = Sandbox::new();
    // A shell that waits, then becomes `incumbent resign` with the same pid; in a process
    // group of its own, and with the environment `Sandbox::command` gives.
    let template = sandbox.command(&[]);
    let mut shell = Command::new("sh");
    shell
        .args([
            "-c",
            r#"read go; exec "$0" resign --election "$1" --timeout 1s"#,
            BIN,
            ELECTION,
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    for (key, value) in template.get_envs() {
        match value {
            Some(value) => shell.env(key, value),
            None => shell.env_remove(key),
        };
    }
    let mut guard = Guard(shell.spawn().expect("spawn sh"));
    let _leader = FakeLeader::new(&sandbox, &guard.pid().to_string());
    let mut stdin = guard.0.stdin.take().expect("stdin");
    stdin.write_all(b"go\n").expect("go");
    drop(stdin);
    let status = guard.exit_within(LIMIT).expect("resign exits");
    let mut stderr = Vec::new();
    if let Some(mut err) = guard.0.stderr.take() {
        let _ = std::io::Read::read_to_end(&mut err, &mut stderr);
    }
    assert_refused(&Output {
        status,
        stdout: Vec::new(),
        stderr,
    });
}

#[test]
fn resign_refuses_to_signal_a_process_that_is_not_an_incumbent_run_of_the_election() {
    let sandbox = Sandbox::new();
    let mut unrelated = Guard(
        Command::new("sleep")
            .arg("60")
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn sleep"),
    );
    let _leader = FakeLeader::new(&sandbox, &unrelated.pid().to_string());
    let output = sandbox.output(&["resign", "--election", ELECTION, "--timeout", "1s"]);
    thread::sleep(Duration::from_millis(100));
    assert!(
        unrelated.is_running(),
        "the unrelated process was signalled"
    );
    assert_refused(&output);
}

#[test]
fn resign_refuses_to_signal_an_incumbent_run_of_another_election() {
    let sandbox = Sandbox::new();
    let mut other = Guard(
        sandbox
            .command(&["run", "--election", "jobs/other", "--", "sleep", "600"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn incumbent"),
    );
    let _leader = FakeLeader::new(&sandbox, &other.pid().to_string());
    let output = sandbox.output(&["resign", "--election", ELECTION, "--timeout", "1s"]);
    assert_refused(&output);
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("jobs/other"),
        "{output:?}"
    );
    thread::sleep(Duration::from_millis(200));
    assert!(
        other.is_running(),
        "the other election's incumbent was signalled"
    );
    signal(other.pid(), libc::SIGTERM);
    assert!(other.exit_within(LIMIT).is_some());
}

#[test]
fn a_follower_exits_at_once_on_sigterm_and_says_it_held_nothing() {
    let sandbox = Sandbox::new();
    let a = sandbox.candidate("a");
    let first = a.start(1);
    let mut b = sandbox.candidate("b");
    b.following();

    let asked = Instant::now();
    signal(b.pid(), libc::SIGTERM);
    let status = b
        .process
        .exit_within(Duration::from_secs(3))
        .unwrap_or_else(|| panic!("the follower still runs; log:\n{}", b.log()));
    assert_eq!(status.code(), Some(0), "log:\n{}", b.log());
    assert!(asked.elapsed() < Duration::from_secs(3));
    assert!(b.starts().is_empty());
    assert!(alive(first.pid), "the leader's command was disturbed");
    let log = b.log();
    assert!(!log.contains("the lock is released"), "{log}");
    assert!(log.contains("did not hold the lock"), "{log}");
}

/// Freezes the main thread of `pid` (a child of this test), and only it, as a call stuck in
/// the async runtime would: `ptrace` seize and interrupt stop one thread, where SIGSTOP would
/// stop the whole process, the watchdog's thread included. The tracing ends when the
/// candidate is SIGKILLed on drop.
fn freeze_main_thread(pid: u32) {
    let pid = libc::pid_t::try_from(pid).expect("pid");
    let null = std::ptr::null_mut::<libc::c_void>();
    // SAFETY: ptrace on our own child; seize and interrupt take no pointers.
    let seized = unsafe { libc::ptrace(libc::PTRACE_SEIZE, pid, null, null) };
    assert_eq!(
        seized,
        0,
        "ptrace(PTRACE_SEIZE) of our own child failed (kernel.yama.ptrace_scope = 3, or a seccomp filter?): {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: as above.
    let interrupted = unsafe { libc::ptrace(libc::PTRACE_INTERRUPT, pid, null, null) };
    assert_eq!(
        interrupted,
        0,
        "ptrace: {}",
        std::io::Error::last_os_error()
    );
}

#[test]
fn the_watchdog_kills_the_command_when_the_supervisors_thread_is_frozen() {
    let sandbox = Sandbox::new();
    let a = sandbox.candidate_running("a", &["--ttl", "2s"], SLEEPER);
    let first = a.start(1);
    // A healthy leader keeps its command for longer than the ttl: the watchdog moves on.
    thread::sleep(Duration::from_secs(3));
    assert!(alive(first.pid), "killed while healthy; log:\n{}", a.log());

    // Freeze only the main thread (the async runtime's), as a stuck call would: the lease
    // is no longer renewed, and nothing on that thread can stop the command.
    freeze_main_thread(a.pid());
    let frozen = Instant::now();
    let killed = wait_until(Duration::from_secs(5), || !alive(first.pid));
    let took = frozen.elapsed();
    // The candidate is SIGKILLed on drop, which ends the tracing too.
    assert!(killed, "the command outlived the lease by {took:?}");
    assert!(took < Duration::from_secs(3), "{took:?}");
}

/// The ttl of the tests of a voluntary stop with a frozen supervisor.
const STOP_TTL: Duration = Duration::from_secs(3);

/// A voluntary stop (`stop`) of a command that ignores SIGTERM, with a `--grace` far longer
/// than the ttl: the session renews during the stop, so the command may run on past one
/// ttl; then the supervisor's thread freezes, renewals stop, and the watchdog must kill the
/// command before the lease can expire (by the last renewal's send time + ttl, which is no
/// later than the freeze + ttl), not when the grace ends.
fn a_voluntary_stop_keeps_the_watchdog_armed(stop: impl FnOnce(&Sandbox, &Candidate)) {
    let sandbox = Sandbox::new();
    let ttl = format!("{}s", STOP_TTL.as_secs());
    let mut a = sandbox.candidate_running("a", &["--ttl", &ttl, "--grace", "60s"], STUBBORN);
    let first = a.start(1);
    stop(&sandbox, &a);
    assert!(
        wait_until(LIMIT, || a.log().contains("stopping the command")),
        "not stopping; log:\n{}",
        a.log()
    );
    // The grace is given while the session renews: the watchdog moves on with the renewals.
    thread::sleep(STOP_TTL + STOP_TTL / 2);
    assert!(
        alive(first.pid),
        "killed during the grace while renewing; log:\n{}",
        a.log()
    );
    assert!(a.process.is_running(), "log:\n{}", a.log());

    freeze_main_thread(a.pid());
    let frozen = Instant::now();
    let killed = wait_until(STOP_TTL * 3, || !alive(first.pid));
    let took = frozen.elapsed();
    assert!(
        killed,
        "the command outlived the lease: still running {took:?} after renewals stopped, with a ttl of {STOP_TTL:?}; log:\n{}",
        a.log()
    );
    assert!(
        took <= STOP_TTL,
        "killed {took:?} after renewals stopped, past the ttl of {STOP_TTL:?}"
    );
}

#[test]
fn after_sigterm_the_watchdog_still_kills_a_command_ignoring_it_before_the_lease_expires() {
    a_voluntary_stop_keeps_the_watchdog_armed(|_, a| signal(a.pid(), libc::SIGTERM));
}

#[test]
fn after_a_resign_the_watchdog_still_kills_a_command_ignoring_sigterm_before_the_lease_expires() {
    a_voluntary_stop_keeps_the_watchdog_armed(|sandbox, a| {
        // It asks, then waits for another leader, which cannot come while the command is
        // being stopped (the lock is kept until it is gone): only the asking counts here.
        let output = sandbox.output(&["resign", "--election", ELECTION, "--timeout", "1s"]);
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            stdout.contains("to resign"),
            "{output:?}; log:\n{}",
            a.log()
        );
    });
}

// ---- failing fast vs retrying: one rule for every backend ----

#[test]
fn a_lock_directory_that_cannot_be_made_ends_every_subcommand_at_once_with_exit_code_2() {
    let sandbox = Sandbox::new();
    let file = sandbox.dir.path().join("not-a-directory");
    fs::write(&file, b"").expect("a plain file");
    let bad = format!("file://{}/locks", file.display());
    let e = ELECTION;
    for args in [
        vec!["run", "--election", e, "--backend", &bad, "--", "true"],
        vec!["status", "--election", e, "--backend", &bad],
        vec!["observe", "--election", e, "--backend", &bad],
        vec!["resign", "--election", e, "--backend", &bad],
    ] {
        let began = Instant::now();
        let output = sandbox.output(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            began.elapsed() < Duration::from_secs(3),
            "{args:?}: not at once"
        );
        assert_eq!(stderr.trim().lines().count(), 1, "{args:?}: {stderr}");
        assert!(
            stderr.contains("cannot create the lock directory"),
            "{args:?}: {stderr}"
        );
        assert!(output.stdout.is_empty(), "{args:?}: prints no leader");
    }
}

/// Against a store nobody answers at: `run` keeps trying without --fail-after, and gives up
/// with exit code 1 after it; `observe` likewise; `status` gives up after --timeout. Each
/// line says where the store is.
#[cfg(any(
    feature = "etcd",
    feature = "consul",
    feature = "redis",
    feature = "memcached"
))]
fn an_unreachable_store_is_retried_until_fail_after(scheme: &str) {
    let (nobody, _refusing) = crate::support::net::refused_addr();
    let backend = format!("{scheme}://{nobody}");
    let backend = backend.as_str();
    let sandbox = Sandbox::new();
    let e = ELECTION;
    let mut forever = Guard(
        sandbox
            .command(&["run", "--election", e, "--backend", backend, "--", "true"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn incumbent"),
    );
    let cases: [(Vec<&str>, &str); 3] = [
        (
            vec![
                "run",
                "--election",
                e,
                "--backend",
                backend,
                "--fail-after",
                "1500ms",
                "--",
                "true",
            ],
            "--fail-after 1.5s",
        ),
        (
            vec![
                "observe",
                "--election",
                e,
                "--backend",
                backend,
                "--fail-after",
                "1500ms",
            ],
            "--fail-after 1.5s",
        ),
        (
            vec![
                "status",
                "--election",
                e,
                "--backend",
                backend,
                "--timeout",
                "1500ms",
            ],
            "--timeout 1.5s",
        ),
    ];
    for (args, option) in cases {
        let began = Instant::now();
        let output = sandbox.output(&args);
        let took = began.elapsed();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(
            took >= Duration::from_millis(1500),
            "{args:?}: gave up after {took:?}, before {option}: {stderr}"
        );
        assert!(took < Duration::from_secs(6), "{args:?}: took {took:?}");
        let last = stderr.trim().lines().last().unwrap_or_default();
        assert!(
            last.contains("giving up") && last.contains(option) && last.contains("unavailable"),
            "{args:?}: {stderr}"
        );
        let address = backend.split_once("://").map_or(backend, |(_, a)| a);
        assert!(
            last.contains(address),
            "{args:?}: names no endpoint: {last}"
        );
        assert!(stderr.contains("retrying in"), "{args:?}: {stderr}");
        for line in stderr.lines() {
            assert!(!repeats_a_part(line), "{args:?}: a repeated chain: {line}");
        }
        assert!(output.stdout.is_empty(), "{args:?}: prints no leader");
    }
    assert!(
        forever.is_running(),
        "without --fail-after, `run` keeps trying"
    );
}

#[cfg(feature = "etcd")]
#[test]
fn an_unreachable_etcd_is_retried_until_fail_after() {
    an_unreachable_store_is_retried_until_fail_after("etcd");
}

#[cfg(feature = "consul")]
#[test]
fn an_unreachable_consul_agent_is_retried_until_fail_after() {
    an_unreachable_store_is_retried_until_fail_after("consul");
}

#[cfg(feature = "redis")]
#[test]
fn an_unreachable_redis_is_retried_until_fail_after() {
    an_unreachable_store_is_retried_until_fail_after("redis");
}

#[cfg(feature = "memcached")]
#[test]
fn an_unreachable_memcached_is_retried_until_fail_after() {
    an_unreachable_store_is_retried_until_fail_after("memcached");
}

/// A host name that cannot resolve (`.invalid` never does) is a store that cannot be reached:
/// retried, like a refused connection (a name may resolve later, as a new service's DNS
/// record appears), and given up at --fail-after (or --timeout), even by a backend whose own
/// connect timeout is longer, never hanging; the last line names the host.
#[test]
fn an_unresolvable_host_is_retried_until_fail_after_on_every_store() {
    let urls = [
        (
            cfg!(feature = "zookeeper"),
            "zk://no-such-host.invalid:2181/x",
        ),
        (cfg!(feature = "redis"), "redis://no-such-host.invalid:6379"),
        (
            cfg!(feature = "memcached"),
            "memcached://no-such-host.invalid:11211",
        ),
        (cfg!(feature = "etcd"), "etcd://no-such-host.invalid:2379"),
        (
            cfg!(feature = "consul"),
            "consul://no-such-host.invalid:8500",
        ),
    ]
    .into_iter()
    .filter_map(|(built, url)| built.then_some(url));
    let sandbox = Sandbox::new();
    for url in urls {
        for (args, option) in [
            (
                vec![
                    "run",
                    "--backend",
                    url,
                    "--election",
                    ELECTION,
                    "--fail-after",
                    "2s",
                    "--",
                    "true",
                ],
                "--fail-after 2s",
            ),
            (
                vec![
                    "status",
                    "--backend",
                    url,
                    "--election",
                    ELECTION,
                    "--timeout",
                    "2s",
                ],
                "--timeout 2s",
            ),
        ] {
            // `status` goes the same way as `run`: tried once, on the store that connects
            // with its own, longer, timeout.
            if args[0] == "status" && !url.starts_with("zk:") {
                continue;
            }
            let began = Instant::now();
            let output = sandbox.output(&args);
            let took = began.elapsed();
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
            assert!(
                took >= Duration::from_secs(2) && took < Duration::from_millis(3500),
                "{args:?}: gave up after {took:?}: {stderr}"
            );
            let last = stderr.trim().lines().last().unwrap_or_default();
            assert!(
                last.contains("giving up")
                    && last.contains(option)
                    && last.contains("unavailable")
                    && last.contains("no-such-host.invalid"),
                "{args:?}: {stderr}"
            );
            for line in stderr.lines() {
                assert!(!repeats_a_part(line), "{args:?}: a repeated chain: {line}");
            }
        }
    }
}

// ---- messages: flags, not builder methods; one chain; no colour; one JSON schema ----

/// Whether some part of a `: `-separated error chain comes twice.
fn repeats_a_part(line: &str) -> bool {
    let parts: Vec<&str> = line.split(": ").collect();
    parts
        .iter()
        .enumerate()
        .any(|(i, part)| parts[i + 1..].contains(part))
}

#[test]
fn error_lines_name_the_flags_not_the_librarys_builder_methods() {
    let sandbox = Sandbox::new();
    // The file backend accepts a ttl of at most a day: the library's message says `.ttl()`.
    let output = sandbox.output(&["run", "--election", ELECTION, "--ttl", "2d", "--", "true"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("--ttl"), "{stderr}");
    assert!(!stderr.contains(".ttl()"), "{stderr}");
    assert!(!stderr.contains("()"), "{stderr}");
}

#[test]
fn lock_delay_on_a_store_without_one_or_above_its_maximum_is_exit_code_2() {
    let sandbox = Sandbox::new();
    let run = |backend: &str, delay: &str| {
        let mut args = vec!["run", "--election", ELECTION, "--lock-delay", delay];
        if !backend.is_empty() {
            args.extend(["--backend", backend]);
        }
        args.extend(["--exit-with-child", "--fail-after", "2s", "--", "true"]);
        sandbox.output(&args)
    };
    let mut cases = vec![("", "5s", "file"), ("memory:", "1s", "")];
    // Consul's agent is not asked before the election is built: nothing need listen.
    #[cfg(feature = "consul")]
    cases.push(("consul://127.0.0.1:1", "61s", "longer than consul allows"));
    // Refused before connecting: an etcd nobody answers at is not tried first.
    #[cfg(feature = "etcd")]
    cases.push(("etcd://127.0.0.1:1", "5s", "etcd has no lock-delay"));
    for (backend, delay, names) in cases {
        let output = run(backend, delay);
        let stderr = String::from_utf8_lossy(&output.stderr);
        if names.is_empty() {
            // The memory backend has a lock-delay: accepted.
            assert_eq!(output.status.code(), Some(0), "{backend}: {stderr}");
            continue;
        }
        assert_eq!(output.status.code(), Some(2), "{backend} {delay}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
        assert!(
            stderr.contains("--lock-delay") && stderr.contains(names),
            "{backend} {delay}: {stderr}"
        );
        assert!(!stderr.contains("()"), "{stderr}");
    }
    // Zero is no lock-delay: every store has that.
    let output = run("", "0s");
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn help_lists_every_environment_variable_read_and_discourages_credentials_in_flags() {
    // Every variable the backend URLs read (src/url.rs), and the others this program reads.
    let source = include_str!("../../src/url.rs");
    let mut variables: Vec<String> = source
        .split('"')
        .skip(1)
        .step_by(2)
        .filter(|s| {
            s.len() > 3 && s.contains('_') && s.chars().all(|c| c.is_ascii_uppercase() || c == '_')
        })
        .map(str::to_owned)
        .collect();
    assert!(variables.iter().any(|v| v == "CONSUL_HTTP_TOKEN_FILE"));
    for also in ["INCUMBENT_BACKEND", "RUST_LOG", "INCUMBENT_ZK_AUTH"] {
        variables.push(also.to_owned());
    }
    let sandbox = Sandbox::new();
    for args in [vec!["--help"], vec!["run", "--help"]] {
        let output = sandbox.output(&args);
        assert_eq!(output.status.code(), Some(0));
        let help = String::from_utf8_lossy(&output.stdout);
        for variable in &variables {
            assert!(
                help.contains(variable.as_str()),
                "{args:?}: {variable}\n{help}"
            );
        }
        assert!(help.contains("`ps`"), "{args:?}: {help}");
        assert!(help.contains("--fail-after"), "{args:?}: {help}");
    }
}

/// A leader's stderr with the library's debug lines, after it ran and stopped on SIGTERM.
fn leader_log(format: &str) -> String {
    let sandbox = Sandbox::new();
    let log_path = sandbox.dir.path().join("a.log");
    let log = fs::File::create(&log_path).expect("log");
    let starts = sandbox.dir.path().join("a.starts");
    let starts_arg = starts.display().to_string();
    // `--log-format` is a global option: it may come before the subcommand.
    let mut command = sandbox.command(&[
        "--log-format",
        format,
        "run",
        "--election",
        ELECTION,
        "--",
        "sh",
        "-c",
        SLEEPER,
        &starts_arg,
    ]);
    command.env("RUST_LOG", "incumbent=debug");
    let mut a = Candidate {
        process: Guard(
            command
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("spawn incumbent"),
        ),
        starts,
        log: log_path,
    };
    a.start(1);
    signal(a.pid(), libc::SIGTERM);
    assert!(a.process.exit_within(LIMIT).is_some(), "{}", a.log());
    a.log()
}

#[test]
fn json_log_lines_share_one_schema_the_librarys_included() {
    let log = leader_log("json");
    let mut events = Vec::new();
    for line in log.lines() {
        let value: Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line:?}\n{log}"));
        let text = |key: &str| {
            value[key]
                .as_str()
                .unwrap_or_else(|| panic!("no {key}: {line}"))
                .to_owned()
        };
        assert!(
            text("time").ends_with('Z') && text("time").len() == 24,
            "{line}"
        );
        assert!(
            ["trace", "debug", "info", "warn", "error"].contains(&text("level").as_str()),
            "{line}"
        );
        assert_eq!(text("election"), ELECTION, "{line}");
        assert!(!text("message").is_empty(), "{line}");
        events.push(text("event"));
    }
    assert!(events.iter().any(|e| e == "log"), "no library line:\n{log}");
    assert!(events.iter().any(|e| e == "elected"), "{log}");
    assert!(events.iter().any(|e| e == "stopped"), "{log}");
}

#[test]
fn text_log_lines_have_no_colour_when_stderr_is_not_a_terminal() {
    let log = leader_log("text");
    assert!(log.contains("debug"), "no library line:\n{log}");
    assert!(!log.contains('\x1b'), "ANSI escapes:\n{log:?}");
}

#[test]
fn switchover_hands_leadership_to_the_named_candidate_and_refuses_one_that_is_not_live() {
    // a leads, b and c follow (each with --id); `switchover --to nobody` is refused with
    // exit code 3 and a still leads; `switchover --to c` exits 0 once c leads, with a greater
    // token, and b never ran its command.
    let sandbox = Sandbox::new();
    let (a, b, c) = sandbox.three_named();
    let first = a.start(1);
    let refused = sandbox.output(&["switchover", "--election", ELECTION, "--to", "nobody"]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("not a live candidate"), "{stderr}");
    assert_eq!(leader_pid(&sandbox.status_json()), Some(a.pid()));
    let done = sandbox.output(&["switchover", "--election", ELECTION, "--to", "c"]);
    let stdout = String::from_utf8_lossy(&done.stdout);
    assert_eq!(
        done.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&done.stderr)
    );
    assert!(stdout.contains("c leads"), "{stdout}");
    let second = c.start(1);
    assert!(second.token > first.token);
    assert!(b.starts().is_empty(), "b ran its command");
    assert!(a.log().contains("handed_over"), "{}", a.log());
}

#[test]
fn switchover_to_a_frozen_target_lapses_with_exit_code_4_and_an_open_election_follows() {
    // c is frozen (SIGSTOP) with its presence still held: the check passes, a hands over,
    // c cannot take office, and after the 1 s window the reservation lapses: exit code 4,
    // and a or b leads.
    let sandbox = Sandbox::new();
    let (a, b, c) = sandbox.three_named();
    let first = a.start(1);
    signal(c.pid(), libc::SIGSTOP);
    let lapsed = sandbox.output(&[
        "switchover",
        "--election",
        ELECTION,
        "--to",
        "c",
        "--window",
        "1s",
    ]);
    signal(c.pid(), libc::SIGCONT);
    let stderr = String::from_utf8_lossy(&lapsed.stderr);
    assert_eq!(lapsed.status.code(), Some(4), "{stderr}");
    assert!(stderr.contains("did not take office"), "{stderr}");
    let next = match leader_pid(&sandbox.status_json()) {
        Some(pid) if pid == a.pid() => a.start(2),
        Some(pid) if pid == b.pid() => b.start(1),
        other => panic!("after the lapse: leader {other:?}"),
    };
    assert!(next.token > first.token);
}
