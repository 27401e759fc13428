//! `incumbent run` against real etcd and Consul servers: when the leader loses its store (a
//! black-holed link), its command is gone before the next leader's command starts, even when
//! nobody reads its stderr and even when the command ignores SIGTERM under a long `--grace`.
//!
//! Each candidate runs `sh -c SCRIPT <ledger>`: at its start, the script records whether the
//! previous leader's command (its pid in `<ledger>.watch`) was still alive at that instant;
//! the tests assert it was not. Needs the `etcd` and `consul` binaries
//! (`scripts/install-test-deps`); a missing one fails the tests. Every wait is bounded, every
//! process is killed when its test ends, and servers listen on loopback only.

use std::fs;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::support::{ConsulDev, EtcdServer, Proxy};
use tokio::time::{Instant, sleep};

const BIN: &str = env!("CARGO_BIN_EXE_incumbent");
const ELECTION: &str = "jobs/failover";

/// Records `pid token alive|dead` (was the watched pid alive when this command started?),
/// then either sleeps (same pid) or, with `trap '' TERM` in front, ignores SIGTERM.
const CHECK: &str = r#"w=$(cat "$0.watch" 2>/dev/null); s=dead; if [ -n "$w" ]; then case "$(cat /proc/$w/stat 2>/dev/null)" in "") ;; *") Z "*|*") X "*) ;; *) s=alive;; esac; fi; echo "$$ $INCUMBENT_FENCING_TOKEN $s" >> "$0";"#;

fn sleeper() -> String {
    format!("{CHECK} exec sleep 600")
}

/// Ignores SIGTERM, and so do its `sleep`s (an ignored signal stays ignored across exec).
fn stubborn() -> String {
    format!("trap '' TERM; {CHECK} while :; do sleep 0.05; done")
}

/// Whether `pid` is a live process (a zombie is not).
fn alive(pid: i32) -> bool {
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat
        .rsplit_once(") ")
        .and_then(|(_, rest)| rest.chars().next());
    !matches!(state, Some('Z' | 'X') | None)
}

fn kill(pid: i32, signal: i32) {
    // SAFETY: kill has no memory-safety preconditions; only pids of processes we started.
    unsafe {
        libc::kill(pid, signal);
    }
}

/// Polls `done` every 10 ms until it holds or `limit` passes; whether it held.
async fn wait_until(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        sleep(Duration::from_millis(10)).await;
    }
}

/// One start of a command, as the script recorded it.
#[derive(Clone, Debug)]
struct Start {
    pid: i32,
    token: u64,
    /// Whether the watched (previous leader's) command was alive when this one started.
    watched_alive: bool,
}

/// An `incumbent run` process; it and its commands are SIGKILLed on drop.
struct Candidate {
    process: Child,
    ledger: PathBuf,
    log: PathBuf,
}

impl Candidate {
    fn starts(&self) -> Vec<Start> {
        fs::read_to_string(&self.ledger)
            .unwrap_or_default()
            .split_inclusive('\n')
            .filter(|line| line.ends_with('\n'))
            .filter_map(|line| {
                let mut parts = line.split_whitespace();
                Some(Start {
                    pid: parts.next()?.parse().ok()?,
                    token: parts.next()?.parse().ok()?,
                    watched_alive: parts.next()? == "alive",
                })
            })
            .collect()
    }

    fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_else(|_| "(stderr is not a file)".into())
    }

    /// The first start of its command, waiting at most `limit`.
    async fn first_start(&self, limit: Duration) -> Start {
        let mut starts = Vec::new();
        let started = wait_until(limit, || {
            starts = self.starts();
            !starts.is_empty()
        })
        .await;
        assert!(started, "the command did not start; log:\n{}", self.log());
        starts[0].clone()
    }

    /// Has this candidate's command record whether `pid` is alive when it starts.
    fn watch(&self, pid: i32) {
        fs::write(format!("{}.watch", self.ledger.display()), pid.to_string()).expect("watch");
    }

    async fn following(&self) {
        let seen = wait_until(Duration::from_secs(20), || self.log().contains("leader: ")).await;
        assert!(seen, "not following; log:\n{}", self.log());
    }
}

impl Drop for Candidate {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
        for start in self.starts() {
            if alive(start.pid) {
                // Its process group: the command and whatever it started.
                kill(-start.pid, libc::SIGKILL);
            }
        }
    }
}

/// A pipe for stderr that nobody reads, made full by a chatty writer sharing it.
struct FullPipe {
    reader: Option<std::io::PipeReader>,
    writer: std::io::PipeWriter,
}

impl FullPipe {
    fn new() -> FullPipe {
        let (reader, writer) = std::io::pipe().expect("pipe");
        FullPipe {
            reader: Some(reader),
            writer,
        }
    }

    fn stdio(&self) -> Stdio {
        Stdio::from(self.writer.try_clone().expect("dup the pipe"))
    }

    /// Fills the pipe and waits until it is full: every later write to it blocks.
    async fn fill(&self) {
        use std::io::Write;
        let reader = self.reader.as_ref().expect("open pipe");
        // SAFETY: fcntl on a descriptor we own.
        let capacity = unsafe { libc::fcntl(reader.as_raw_fd(), libc::F_GETPIPE_SZ) };
        let capacity = usize::try_from(capacity).expect("F_GETPIPE_SZ");
        let mut chatty = self.writer.try_clone().expect("dup the pipe");
        std::thread::spawn(move || {
            // Blocks while the pipe is full; ends with EPIPE when the test drops the reader.
            let _ = chatty.write_all(&vec![b'.'; capacity * 4]);
        });
        let fd = reader.as_raw_fd();
        let full = wait_until(Duration::from_secs(10), || {
            let mut queued: libc::c_int = 0;
            // SAFETY: FIONREAD writes one int.
            unsafe { libc::ioctl(fd, libc::FIONREAD, &mut queued) };
            usize::try_from(queued).unwrap_or(0) + 4096 >= capacity
        })
        .await;
        assert!(full, "the pipe did not fill up");
    }
}

impl Drop for FullPipe {
    fn drop(&mut self) {
        self.reader = None; // the chatty thread ends
    }
}

/// Starts `incumbent run` on `backend` with `options`, running `sh -c script <ledger>`.
fn candidate(
    dir: &tempfile::TempDir,
    name: &str,
    backend: &str,
    options: &[&str],
    script: &str,
    stderr: Option<Stdio>,
    env: &[(&str, &str)],
) -> Candidate {
    let ledger = dir.path().join(format!("{name}.starts"));
    let log = dir.path().join(format!("{name}.log"));
    let stderr = stderr.unwrap_or_else(|| fs::File::create(&log).expect("log file").into());
    let ledger_arg = ledger.display().to_string();
    let process = Command::new(BIN)
        .args(["run", "--backend", backend, "--election", ELECTION])
        .args(options)
        .args(["--", "sh", "-c", script, &ledger_arg])
        .env_remove("RUST_LOG")
        .env_remove("INCUMBENT_BACKEND")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("spawn incumbent");
    Candidate {
        process,
        ledger,
        log,
    }
}

/// How the leader's trouble is arranged.
#[derive(Clone, Copy, Debug)]
enum Trouble {
    /// Its stderr is a full pipe; its command obeys SIGTERM.
    FullStderr,
    /// Its command ignores SIGTERM; `--grace 30s`.
    IgnoresSigterm,
}

/// A leads through `proxy` (black-holed in the middle of its term), B follows directly; B's
/// command must find A's dead when it starts.
async fn no_overlap(
    direct: &str,
    proxied: &str,
    proxy: &Proxy,
    options: &[&str],
    trouble: Trouble,
    limit: Duration,
    env: &[(&str, &str)],
) {
    let dir = tempfile::tempdir().expect("temp dir");
    let pipe = FullPipe::new();
    let mut a_options = options.to_vec();
    let mut debug = env.to_vec();
    debug.push(("RUST_LOG", "incumbent=debug"));
    let a = match trouble {
        // Debug lines too, so that there is plenty to write while the pipe is full.
        Trouble::FullStderr => candidate(
            &dir,
            "a",
            proxied,
            &a_options,
            &sleeper(),
            Some(pipe.stdio()),
            &debug,
        ),
        Trouble::IgnoresSigterm => {
            a_options.extend(["--grace", "30s"]);
            candidate(&dir, "a", proxied, &a_options, &stubborn(), None, env)
        }
    };
    let first = a.first_start(Duration::from_secs(20)).await;
    if matches!(trouble, Trouble::FullStderr) {
        pipe.fill().await;
    }
    let b = candidate(&dir, "b", direct, options, &sleeper(), None, env);
    b.watch(first.pid);
    b.following().await;
    assert!(alive(first.pid), "the leader's command died early");

    let cut = Instant::now();
    proxy.blackhole(true);
    let second = b.first_start(limit).await;
    let took = cut.elapsed();
    assert!(
        !second.watched_alive,
        "{trouble:?}: the old leader's command {} still ran when the next leader's started \
         ({took:?} after the cut); A's log:\n{}\nB's log:\n{}",
        first.pid,
        a.log(),
        b.log()
    );
    assert!(!alive(first.pid));
    assert!(second.token > first.token, "{second:?} after {first:?}");
    drop(b);
    drop(a);
}

async fn etcd_no_overlap(trouble: Trouble) {
    let etcd = EtcdServer::single().await;
    let proxy = Proxy::start(etcd.client_addr());
    let direct = format!("etcd://{}", etcd.client_addr());
    let proxied = format!("etcd://{}", proxy.addr());
    no_overlap(
        &direct,
        &proxied,
        &proxy,
        &["--ttl", "2s"],
        trouble,
        Duration::from_secs(20),
        &[],
    )
    .await;
}

async fn consul_no_overlap(trouble: Trouble) {
    let consul = ConsulDev::start().await;
    let proxy = Proxy::start(consul.http_addr());
    let direct = format!("consul://{}", consul.http_addr());
    let proxied = format!("consul://{}", proxy.addr());
    // No lock-delay: the next leader may take the lock the moment the session is gone.
    no_overlap(
        &direct,
        &proxied,
        &proxy,
        &["--ttl", "10s", "--lock-delay", "0s"],
        trouble,
        Duration::from_secs(60),
        &[],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_a_leader_with_a_full_stderr_stops_its_command_before_the_next_leader_starts() {
    etcd_no_overlap(Trouble::FullStderr).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_a_command_that_ignores_sigterm_is_killed_before_the_next_leader_starts() {
    etcd_no_overlap(Trouble::IgnoresSigterm).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consul_a_leader_with_a_full_stderr_stops_its_command_before_the_next_leader_starts() {
    consul_no_overlap(Trouble::FullStderr).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consul_a_command_that_ignores_sigterm_is_killed_before_the_next_leader_starts() {
    consul_no_overlap(Trouble::IgnoresSigterm).await;
}

/// The environment of a PostgreSQL candidate: the harness's server trusts user `postgres`.
#[cfg(feature = "postgres")]
const PG_ENV: [(&str, &str); 1] = [("PGUSER", crate::support::postgres::USER)];

#[cfg(feature = "postgres")]
async fn postgres_no_overlap(trouble: Trouble) {
    let server = crate::support::PostgresServer::start().await;
    let proxy = Proxy::start(server.addr());
    let direct = server.url();
    let proxied = format!("postgres://{}/postgres", proxy.addr());
    no_overlap(
        &direct,
        &proxied,
        &proxy,
        &["--ttl", "2s"],
        trouble,
        Duration::from_secs(20),
        &PG_ENV,
    )
    .await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_leader_with_a_full_stderr_stops_its_command_before_the_next_leader_starts() {
    postgres_no_overlap(Trouble::FullStderr).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_command_that_ignores_sigterm_is_killed_before_the_next_leader_starts() {
    postgres_no_overlap(Trouble::IgnoresSigterm).await;
}

/// Behind PgBouncer in transaction mode (two server connections for everyone, no LISTEN:
/// followers poll every 500 ms), a kill -9 of the leader's `incumbent run` strands nothing
/// in the pool: the follower's command starts within the ttl and one poll of the kill, with
/// a greater token, and the row names it. Session advisory locks, the field's usual recipe,
/// stay with the pooled server connection until `server_lifetime` (3,600 s here).
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_through_pgbouncer_a_killed_leader_strands_no_lock() {
    let server = crate::support::PostgresServer::start().await;
    let bouncer = crate::support::PgBouncer::transaction_mode(server.addr(), 2).await;
    let env = [PG_ENV[0], ("INCUMBENT_PG_LISTEN", "off")];
    let (ttl, poll) = (Duration::from_secs(2), Duration::from_millis(500));
    let dir = tempfile::tempdir().expect("temp dir");
    let options = ["--ttl", "2s"];
    let mut a = candidate(&dir, "a", &bouncer.url(), &options, &sleeper(), None, &env);
    let first = a.first_start(Duration::from_secs(20)).await;
    let b = candidate(&dir, "b", &bouncer.url(), &options, &sleeper(), None, &env);
    b.following().await;
    let killed = Instant::now();
    a.process.kill().expect("kill -9 the leader");
    let second = b.first_start(ttl + poll + Duration::from_secs(10)).await;
    let took = killed.elapsed();
    assert!(second.token > first.token, "{second:?} after {first:?}");
    assert!(
        took <= ttl + poll + Duration::from_secs(1),
        "the follower led {took:?} after the kill: a lock stranded in the pool?\n{}",
        b.log()
    );
    let admin = crate::support::postgres::client_at(server.addr()).await;
    let holder: String = admin
        .query_one(
            "SELECT holder FROM incumbent_leases WHERE election = $1",
            &[&ELECTION],
        )
        .await
        .expect("the row")
        .get(0);
    assert!(holder.contains(&second.token.to_string()), "{holder}");
}

#[cfg(any(feature = "postgres", feature = "kubernetes"))]
use crate::support::bin::libfaketime;

/// The field's elector compares the application's clock with the database's, and a skewed
/// host takes the lock early. Here the leader's wall clock runs 5 minutes behind and the
/// follower's 5 minutes ahead (libfaketime; the monotonic clock untouched, as NTP leaves
/// it): the follower never starts while the leader lives, and takes over within the ttl
/// and its margin once the leader is killed, with a greater token.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_candidates_with_skewed_clocks_never_overlap() {
    let server = crate::support::PostgresServer::start().await;
    let faketime = libfaketime();
    let skewed = |offset: &'static str| {
        vec![
            PG_ENV[0],
            ("LD_PRELOAD", faketime.as_str()),
            ("FAKETIME", offset),
            ("DONT_FAKE_MONOTONIC", "1"),
        ]
    };
    let (behind, ahead) = (skewed("-5m"), skewed("+5m"));
    let dir = tempfile::tempdir().expect("temp dir");
    let options = ["--ttl", "2s"];
    let url = server.url();
    let mut a = candidate(&dir, "a", &url, &options, &sleeper(), None, &behind);
    let first = a.first_start(Duration::from_secs(20)).await;
    // The skew is in effect: the leader wrote its term's start by its own wall clock.
    let admin = crate::support::postgres::client_at(server.addr()).await;
    let skew_ms: f64 = admin
        .query_one(
            "SELECT (holder::jsonb->>'since_unix_ms')::float8 \
                    - extract(epoch FROM clock_timestamp())::float8 * 1000 \
               FROM incumbent_leases WHERE election = $1",
            &[&ELECTION],
        )
        .await
        .expect("the row")
        .get(0);
    assert!(
        (-320_000.0..-280_000.0).contains(&skew_ms),
        "the leader's clock is {skew_ms} ms off, not 5 minutes behind"
    );
    let b = candidate(&dir, "b", &url, &options, &sleeper(), None, &ahead);
    b.watch(first.pid);
    b.following().await;
    // Several ttls: a follower that believed its own clock would have taken over by now.
    sleep(Duration::from_secs(6)).await;
    assert!(b.starts().is_empty(), "b started while a led:\n{}", b.log());
    assert!(alive(first.pid));
    let killed = Instant::now();
    a.process.kill().expect("kill -9 the leader");
    let second = b.first_start(Duration::from_secs(20)).await;
    let took = killed.elapsed();
    assert!(second.token > first.token, "{second:?} after {first:?}");
    assert!(
        took < Duration::from_secs(4),
        "b led {took:?} after the kill; log:\n{}",
        b.log()
    );
}

/// client-go's bug of old (kubernetes #47671) was to compare the holder's `renewTime` with
/// the local wall clock. Here the leader's wall clock runs a minute behind and the
/// follower's a minute ahead (libfaketime; the monotonic clock untouched): the follower
/// never starts while the leader lives, though the leader's `renewTime` reads two minutes
/// old to it, and takes over within the ttl and its margin once the leader is killed, with
/// a greater token.
#[cfg(feature = "kubernetes")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_candidates_with_skewed_clocks_never_overlap() {
    use incumbent::kubernetes::k8s_openapi::api::coordination::v1::Lease;
    use incumbent::kubernetes::kube;

    let server = crate::support::kube::KubeServer::start().await;
    let faketime = libfaketime();
    let kubeconfig = server.kubeconfig().display().to_string();
    let skewed = |offset: &'static str| {
        vec![
            ("KUBECONFIG", kubeconfig.as_str()),
            ("LD_PRELOAD", faketime.as_str()),
            ("FAKETIME", offset),
            ("DONT_FAKE_MONOTONIC", "1"),
        ]
    };
    let (behind, ahead) = (skewed("-60s"), skewed("+60s"));
    let dir = tempfile::tempdir().expect("temp dir");
    let options = ["--ttl", "2s"];
    let url = "k8s://default";
    let mut a = candidate(&dir, "a", url, &options, &sleeper(), None, &behind);
    let first = a.first_start(Duration::from_secs(20)).await;
    // The skew is in effect: the leader wrote its renewTime by its own wall clock.
    let client = kube::Client::try_from(server.config().await).expect("a client");
    let lease = kube::Api::<Lease>::namespaced(client, "default")
        .get(&incumbent::kubernetes::lease_name(ELECTION))
        .await
        .expect("the Lease");
    let renewed = lease.spec.and_then(|s| s.renew_time).expect("renewTime").0;
    let skew = renewed.as_millisecond()
        - i64::try_from(incumbent::time::unix_ms(std::time::SystemTime::now())).expect("ms");
    assert!(
        (-65_000..-55_000).contains(&skew),
        "the leader's clock is {skew} ms off, not a minute behind"
    );
    let b = candidate(&dir, "b", url, &options, &sleeper(), None, &ahead);
    b.watch(first.pid);
    b.following().await;
    sleep(Duration::from_secs(6)).await;
    assert!(b.starts().is_empty(), "b started while a led:\n{}", b.log());
    assert!(alive(first.pid));
    let killed = Instant::now();
    a.process.kill().expect("kill -9 the leader");
    let second = b.first_start(Duration::from_secs(20)).await;
    let took = killed.elapsed();
    assert!(second.token > first.token, "{second:?} after {first:?}");
    assert!(!second.watched_alive, "b started while a's command lived");
    assert!(
        took < Duration::from_secs(4),
        "b led {took:?} after the kill; log:\n{}",
        b.log()
    );
}
