//! `incumbent status`, `observe` and `resign`: reading (and nudging) the leader.

use std::io::Write;
use std::time::{Duration, SystemTime};

use incumbent::Leader;
use incumbent::backend::{Backend, Observer, Session, SessionOptions};
use incumbent::url::{BackendUrl, WithBackend};
use serde_json::json;
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::{Instant, sleep, timeout};

use crate::Failure;
use crate::report::{Reporter, human, leader_json, leader_text, millis, rfc3339};
use crate::retry::{self, Patience};

use crate::run::{RESIGN_KEY, RESIGN_SIGNAL, hostname};

/// How long `observe` waits before reconnecting after the store failed.
const OBSERVE_RETRY: Duration = Duration::from_secs(1);

/// After each change `observe` prints, it reads the leader again this long after, and after
/// each re-read the next delay: an observer may report a new leader as soon as it holds the
/// lock, before the store's record says when its term began (or carries its token), and
/// some stores' observers report a change of `since` alone only with the next change of the
/// leader. A changed `since` or token is a change to print.
const CONFIRM_AFTER: [Duration; 3] = [
    Duration::from_millis(100),
    Duration::from_millis(500),
    Duration::from_secs(2),
];

/// How long `observe` holds back a new leader whose record does not yet say when its term
/// began (etcd and ZooKeeper write it just after the win), so that the hand-off is one line
/// with the true `since` rather than two. A leader whose `since` never comes (a value another
/// program wrote) is printed without it after this.
const HOLD_FOR_SINCE: Duration = Duration::from_millis(600);

/// What `observe` has printed, and a leader it holds back (see [`HOLD_FOR_SINCE`]).
#[derive(Default)]
struct Shown {
    /// The last leader printed; `None` before the first line.
    last: Option<Option<Leader>>,
    /// Until when a new leader without a `since` is held back.
    held_until: Option<Instant>,
}

impl Shown {
    /// Whether `leader` is a change to print now: it differs from the last line, and it says
    /// when its term began, or it has been held back long enough.
    fn worth_printing(&mut self, leader: &Option<Leader>, now: Instant) -> bool {
        if self.last.as_ref() == Some(leader) {
            self.held_until = None;
            return false;
        }
        if let Some(l) = leader
            && l.since_unix_ms.is_none()
            && now < *self.held_until.get_or_insert(now + HOLD_FOR_SINCE)
        {
            return false;
        }
        true
    }

    fn printed(&mut self, leader: Option<Leader>) {
        self.last = Some(leader);
        self.held_until = None;
    }
}

/// The leader, read once with a fresh observer.
async fn read_once<B: Backend>(backend: &B, election: &str) -> incumbent::Result<Option<Leader>> {
    backend.observe(election).await?.next().await
}

/// Completes at the instant; pending without one.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// What `status` and `resign` share: one election, read within `--timeout` of when the
/// program began.
#[derive(Clone)]
pub struct Query {
    pub election: String,
    pub timeout: Duration,
    pub began: Instant,
    pub out: Reporter,
}

impl Query {
    /// The current leader, read within the timeout: a store that cannot be reached is tried
    /// again until then; a permanent error ends the program at once.
    async fn current<B: Backend>(
        &self,
        backend: &B,
    ) -> Result<(B::Observer, Option<Leader>), Failure> {
        let patience = Patience {
            fail_after: Some(self.timeout),
            option: "--timeout",
        };
        let read = patience.run(self.began, &self.out, || async {
            check_lock_directory(backend).await?;
            let mut observer = backend.observe(&self.election).await?;
            let leader = observer.next().await?;
            Ok::<_, incumbent::Error>((observer, leader))
        });
        match timeout(self.timeout.saturating_sub(self.began.elapsed()), read).await {
            Ok(read) => read,
            Err(_) => Err(patience.gave_up(self.began.elapsed(), "the store did not answer")),
        }
    }
}

/// The file backend reads a lock directory that may not exist (nobody has campaigned yet):
/// opening a session makes it, as `run` would, and fails if it cannot be made, so that a bad
/// directory is an error rather than "nobody leads". Other stores report their own errors
/// when read.
async fn check_lock_directory<B: Backend>(backend: &B) -> incumbent::Result<()> {
    if backend.info().name != "file" {
        return Ok(());
    }
    let options = SessionOptions {
        ttl: Duration::from_secs(10),
        renew_interval: Duration::from_secs(3),
        lock_delay: None,
        name: "incumbent:check".into(),
    };
    backend.open_session(&options).await?.close().await
}

/// Writes one line on stdout; `false` once stdout is closed (e.g. `| head -1`).
fn print(line: &str) -> bool {
    writeln!(std::io::stdout().lock(), "{line}").is_ok()
}

/// Runs `follow` until it ends (its error is the program's), or until SIGINT or SIGTERM:
/// `observe`'s exit code 0 either way.
async fn until_interrupted(
    follow: impl std::future::Future<Output = Result<(), Failure>>,
) -> Result<u8, Failure> {
    let mut interrupt = signal(SignalKind::interrupt())
        .map_err(|e| Failure::Runtime(format!("cannot handle signals: {e}")))?;
    let mut terminate = signal(SignalKind::terminate())
        .map_err(|e| Failure::Runtime(format!("cannot handle signals: {e}")))?;
    tokio::select! {
        result = follow => result?,
        _ = interrupt.recv() => {}
        _ = terminate.recv() => {}
    }
    Ok(0)
}

/// After a failed read of the store: a transient failure is reported and tried again after
/// `retry_in` (`Ok`), until `--fail-after` has passed since `failing_since`; any other
/// failure ends the program.
fn keep_trying(
    error: incumbent::Error,
    failing_since: &mut Option<Instant>,
    patience: &Patience,
    out: &Reporter,
    retry_in: Duration,
) -> Result<(), Failure> {
    if !retry::is_transient(&error) {
        return Err(Failure::from(error));
    }
    let since = *failing_since.get_or_insert_with(Instant::now);
    let message = retry::describe(&error);
    if let Some(limit) = patience.fail_after
        && since.elapsed() >= limit
    {
        return Err(patience.gave_up(since.elapsed(), &message));
    }
    out.warn(
        "retrying",
        &format!("{message}; retrying in {}", human(retry_in)),
        json!({ "error": message, "retry_in_ms": millis(retry_in) }),
    );
    Ok(())
}

/// `incumbent status`.
#[derive(Clone)]
pub struct Status {
    pub query: Query,
    pub json: bool,
}

impl WithBackend for Status {
    type Output = Result<u8, Failure>;

    async fn call<B: Backend>(self, backend: B) -> Self::Output {
        let (_, leader) = self.query.current(&backend).await?;
        let Query { election, .. } = &self.query;
        if self.json {
            let leader = leader.as_ref().map(leader_json);
            print(&json!({ "election": election, "leader": leader }).to_string());
            return Ok(0);
        }
        let mut rows = vec![("election", election.clone())];
        match &leader {
            None => rows.push(("leader", "none".into())),
            Some(leader) => {
                rows.push(("leader", leader.candidate.id.clone()));
                if let Some(token) = leader.fencing_token {
                    rows.push(("fencing token", token.to_string()));
                }
                if let Some(since) = leader.since() {
                    let ago = SystemTime::now().duration_since(since).unwrap_or_default();
                    rows.push(("since", format!("{} ({} ago)", rfc3339(since), human(ago))));
                }
                let metadata: Vec<String> = leader
                    .candidate
                    .metadata
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                if !metadata.is_empty() {
                    rows.push(("metadata", metadata.join(" ")));
                }
            }
        }
        for (name, value) in rows {
            print(&format!("{name:<14} {value}"));
        }
        Ok(0)
    }
}

/// `incumbent observe`.
#[derive(Clone)]
pub struct Observe {
    pub election: String,
    pub json: bool,
    /// `--fail-after`.
    pub patience: Patience,
    pub began: Instant,
    pub out: Reporter,
}

impl Observe {
    fn show(&self, leader: Option<&Leader>) -> bool {
        let now = rfc3339(SystemTime::now());
        let line = if self.json {
            json!({ "time": now, "election": self.election, "leader": leader.map(leader_json) })
                .to_string()
        } else {
            let who = match leader {
                Some(l) => match l.since() {
                    Some(since) => format!("leader: {}, since {}", leader_text(l), rfc3339(since)),
                    None => format!("leader: {}", leader_text(l)),
                },
                None => "leader: none".into(),
            };
            format!("{now} {} {who}", self.election)
        };
        print(&line)
    }
}

impl WithBackend for Observe {
    type Output = Result<u8, Failure>;

    async fn call<B: Backend>(self, backend: B) -> Self::Output {
        let out = self.out.for_election(&self.election);
        // A store that cannot be reached is retried (until --fail-after); any other error ends
        // the program.
        let follow = async {
            let mut shown = Shown::default();
            // When to re-read the leader next, and how many re-reads since the last change.
            let mut confirm_at: Option<Instant> = None;
            let mut confirm_step = 0;
            // Since when the store has failed in a row (the start counts: nothing was read yet).
            let mut failing_since = Some(self.began);
            let failed = |e: incumbent::Error, failing_since: &mut Option<Instant>| {
                keep_trying(e, failing_since, &self.patience, &out, OBSERVE_RETRY)
            };
            while let Err(e) = check_lock_directory(&backend).await {
                failed(e, &mut failing_since)?;
                sleep(OBSERVE_RETRY).await;
            }
            loop {
                let mut observer = match backend.observe(&self.election).await {
                    Ok(observer) => observer,
                    Err(e) => {
                        failed(e, &mut failing_since)?;
                        sleep(OBSERVE_RETRY).await;
                        continue;
                    }
                };
                loop {
                    // While waiting for the observer, re-read the leader a little after each
                    // change (see `CONFIRM_AFTER`), and while one is held back (see
                    // `HOLD_FOR_SINCE`): some stores' observers do not report a corrected
                    // `since` alone.
                    let next = {
                        let next = observer.next();
                        tokio::pin!(next);
                        loop {
                            tokio::select! {
                                next = &mut next => break next,
                                () = sleep_until_some(confirm_at) => {
                                    confirm_step += 1;
                                    confirm_at = CONFIRM_AFTER
                                        .get(confirm_step)
                                        .map(|after| Instant::now() + *after);
                                    if let Some(until) = shown.held_until {
                                        let soon = (Instant::now() + CONFIRM_AFTER[0]).min(until);
                                        confirm_at = Some(confirm_at.map_or(soon, |at| at.min(soon)));
                                    }
                                    // A failed re-read changes nothing: the observer reports
                                    // the store's failures.
                                    let Ok(leader) = read_once(&backend, &self.election).await
                                    else {
                                        continue;
                                    };
                                    if shown.worth_printing(&leader, Instant::now()) {
                                        if !self.show(leader.as_ref()) {
                                            return Ok::<(), Failure>(());
                                        }
                                        shown.printed(leader);
                                        confirm_step = 0;
                                        confirm_at = Some(Instant::now() + CONFIRM_AFTER[0]);
                                    }
                                }
                            }
                        }
                    };
                    match next {
                        // After a reconnect the observer may repeat the leader: show changes
                        // only. A change is any change: of the leader, its fencing token, its
                        // metadata, or when its term began.
                        Ok(leader) => {
                            failing_since = None;
                            if shown.worth_printing(&leader, Instant::now()) {
                                if !self.show(leader.as_ref()) {
                                    return Ok::<(), Failure>(());
                                }
                                shown.printed(leader);
                                confirm_step = 0;
                                confirm_at = Some(Instant::now() + CONFIRM_AFTER[0]);
                            } else if shown.held_until.is_some() {
                                // Held back: re-read soon, for its `since`.
                                confirm_step = 0;
                                confirm_at = Some(Instant::now() + CONFIRM_AFTER[0]);
                            }
                        }
                        Err(e) => {
                            failed(e, &mut failing_since)?;
                            sleep(OBSERVE_RETRY).await;
                            break;
                        }
                    }
                }
            }
        };
        until_interrupted(follow).await
    }
}

/// `incumbent resign`.
#[derive(Clone)]
pub struct Resign {
    pub query: Query,
    /// The backend, as given: the leader's process must use the same.
    pub backend: BackendUrl,
    /// How long the leader must not campaign again (`--yield`), queued with the signal.
    pub yield_for: Option<std::time::Duration>,
}

impl WithBackend for Resign {
    type Output = Result<u8, Failure>;

    async fn call<B: Backend>(self, backend: B) -> Self::Output {
        let Query {
            election,
            timeout: limit,
            began,
            ..
        } = &self.query;
        let deadline = *began + *limit;
        let (mut observer, leader) = self.query.current(&backend).await?;
        let Some(leader) = leader else {
            return Err(Failure::Runtime(format!(
                "nobody leads {}; there is nothing to resign",
                election
            )));
        };
        let id = &leader.candidate.id;
        let metadata = &leader.candidate.metadata;
        let (Some(host), Some(pid), Some(RESIGN_SIGNAL)) = (
            metadata.get("host"),
            metadata
                .get("pid")
                .and_then(|p| p.parse::<libc::pid_t>().ok()),
            metadata.get(RESIGN_KEY).map(String::as_str),
        ) else {
            return Err(Failure::Runtime(format!(
                "the leader {id} was not started by `incumbent run`, so it cannot be asked to resign; stop it by its own means"
            )));
        };
        let here = hostname();
        if *host != here {
            return Err(Failure::Runtime(format!(
                "the leader {id} runs on host {host}, not on {here}; run `incumbent resign` on {host}"
            )));
        }
        // The pid comes from the store: whoever can write the election's key chooses it. Only
        // an `incumbent run` of this election, on this backend, that was running when the
        // term began, is asked to resign.
        let process = LeaderProcess::open(pid).map_err(|why| {
            Failure::Runtime(format!(
                "refusing to signal pid {pid}, which the leader {id} names in the store: {why}"
            ))
        })?;
        if let Err(why) = process.verify(election, &self.backend, leader.since_unix_ms) {
            return Err(Failure::Runtime(format!(
                "refusing to signal pid {pid}, which the leader {id} names in the store: {why}"
            )));
        }
        let yield_ms = self
            .yield_for
            .map(|y| u64::try_from(y.as_millis()).unwrap_or(u64::MAX).max(1));
        if let Err(error) = process.signal_with(libc::SIGUSR1, yield_ms) {
            return Err(Failure::Runtime(format!(
                "cannot signal the leader {id} (pid {pid}): {error}{}",
                if error.raw_os_error() == Some(libc::EPERM) {
                    "; run as the leader's user"
                } else {
                    ""
                }
            )));
        }
        match self.yield_for {
            Some(yield_for) => print(&format!(
                "asked {id} (pid {pid} on {host}) to resign and not to campaign again for {}",
                human(yield_for)
            )),
            None => print(&format!("asked {id} (pid {pid} on {host}) to resign")),
        };
        let moved = timeout(deadline.saturating_duration_since(Instant::now()), async {
            loop {
                match observer.next().await {
                    Ok(now) if now.as_ref() == Some(&leader) => {}
                    Ok(now) => return Ok(now),
                    Err(e) => return Err(e),
                }
            }
        })
        .await;
        match moved {
            Ok(Ok(Some(next))) => {
                print(&format!("the leader is now {}", leader_text(&next)));
                Ok(0)
            }
            Ok(Ok(None)) => {
                print("nobody leads now");
                Ok(0)
            }
            Ok(Err(e)) => Err(Failure::Runtime(format!(
                "asked {id} to resign, but could not see the outcome: {e}"
            ))),
            Err(_) => Err(Failure::Runtime(format!(
                "asked {id} to resign, but it still leads after {}",
                human(*limit)
            ))),
        }
    }
}

/// `incumbent switchover`.
#[derive(Clone)]
pub struct Switchover {
    pub query: Query,
    pub to: String,
    pub window: Option<std::time::Duration>,
}

impl WithBackend for Switchover {
    type Output = Result<u8, Failure>;

    async fn call<B: Backend>(self, backend: B) -> Self::Output {
        use incumbent::{Error, HandOverError};
        let Query {
            election,
            timeout: limit,
            began,
            ..
        } = &self.query;
        let info = backend.info();
        let ttl = incumbent::config::DEFAULT_TTL.clamp(info.min_ttl, info.max_ttl);
        let options = incumbent::switchover::RequestOptions {
            session: incumbent::backend::SessionOptions {
                ttl,
                renew_interval: ttl / info.renew_divisor.max(2),
                lock_delay: None,
                name: format!("incumbent switchover to {}", self.to),
            },
            window: self.window,
            timeout: limit.saturating_sub(began.elapsed()),
        };
        match incumbent::switchover::request(&backend, election, &self.to, &options).await {
            Ok(done) => {
                match done.fencing_token {
                    Some(token) => {
                        print(&format!("{} leads {election} now (term {token})", done.to))
                    }
                    None => print(&format!("{} leads {election} now", done.to)),
                };
                Ok(0)
            }
            Err(Error::HandOver(refusal)) => Err(match refusal {
                HandOverError::Lapsed { .. } | HandOverError::NotFinished { .. } => {
                    Failure::Unfinished(refusal.to_string())
                }
                _ => Failure::Refused(refusal.to_string()),
            }),
            Err(Error::Timeout(waited)) => Err(Failure::Unfinished(format!(
                "the switchover to {} did not finish within {}",
                self.to,
                human(waited)
            ))),
            Err(error) => Err(error.into()),
        }
    }
}

/// How much later than the leader's term start its process may seem to have started: the
/// boot time the kernel reports has a resolution of one second, and the wall clock may have
/// been adjusted since.
const START_TOLERANCE_MS: u64 = 2_000;

/// The options of `incumbent` that take a value, so that values are not taken for the
/// subcommand.
const VALUE_OPTIONS: &[&str] = &[
    "--backend",
    "--election",
    "--id",
    "--meta",
    "--ttl",
    "--lock-delay",
    "--grace",
    "--log-format",
    "--timeout",
    "--fail-after",
];

/// What a leader's command line says, as far as `resign` cares.
#[derive(Debug, Default, PartialEq, Eq)]
struct RunLine {
    subcommand: Option<String>,
    election: Option<String>,
    backend: Option<String>,
}

/// Reads `incumbent [OPTIONS] run [OPTIONS] -- CMD…` up to the `--`.
fn parse_run_line(args: &[String]) -> RunLine {
    let mut line = RunLine::default();
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        if arg == "--" {
            break;
        }
        if let Some(option) = arg.strip_prefix("--") {
            let (name, inline) = match option.split_once('=') {
                Some((name, value)) => (format!("--{name}"), Some(value.to_owned())),
                None => (arg.clone(), None),
            };
            if !VALUE_OPTIONS.contains(&name.as_str()) {
                continue;
            }
            let value = match inline {
                Some(value) => Some(value),
                None => args.next().cloned(),
            };
            match name.as_str() {
                "--election" => line.election = value,
                "--backend" => line.backend = value,
                _ => {}
            }
        } else if arg.starts_with('-') {
            // A short flag (-q): none takes a value.
        } else if line.subcommand.is_none() {
            line.subcommand = Some(arg.clone());
        }
    }
    line
}

/// A process named by a leader's metadata, held so that its pid cannot be reused between the
/// checks and the signal (Linux: a pidfd).
struct LeaderProcess {
    pid: libc::pid_t,
    #[cfg(target_os = "linux")]
    pidfd: Option<std::os::fd::OwnedFd>,
}

impl LeaderProcess {
    /// Takes hold of `pid`, refusing pids that must never be signalled.
    fn open(pid: libc::pid_t) -> Result<LeaderProcess, String> {
        if pid <= 1 {
            return Err(format!(
                "{pid} is not the pid of one process (-1, 0 and 1 would signal many, or init)"
            ));
        }
        if u32::try_from(pid).ok() == Some(std::process::id()) {
            return Err("that is this very process".into());
        }
        #[cfg(target_os = "linux")]
        {
            // SAFETY: pidfd_open takes a pid and flags, and returns a new descriptor or -1.
            let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
            let pidfd = if fd >= 0 {
                let fd = std::os::fd::RawFd::try_from(fd).map_err(|e| e.to_string())?;
                // SAFETY: the descriptor was just returned to us, and nothing else owns it.
                Some(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) })
            } else {
                let error = std::io::Error::last_os_error();
                match error.raw_os_error() {
                    Some(libc::ESRCH) => return Err("no such process".into()),
                    // An old kernel: signal by pid (checked just before).
                    Some(libc::ENOSYS) => None,
                    _ => return Err(format!("cannot look at it: {error}")),
                }
            };
            Ok(LeaderProcess { pid, pidfd })
        }
        #[cfg(not(target_os = "linux"))]
        {
            Ok(LeaderProcess { pid })
        }
    }

    /// Checks that the process is an `incumbent run` of `election` on `backend`, started no
    /// later than the term (`since_unix_ms`), so not a process that reused a dead leader's pid.
    fn verify(
        &self,
        election: &str,
        backend: &BackendUrl,
        since_unix_ms: Option<u64>,
    ) -> Result<(), String> {
        let proc = std::path::PathBuf::from(format!("/proc/{}", self.pid));
        let cmdline = std::fs::read(proc.join("cmdline"))
            .map_err(|e| format!("cannot read its command line: {e}"))?;
        let args: Vec<String> = cmdline
            .split(|&b| b == 0)
            .filter(|arg| !arg.is_empty())
            .map(|arg| String::from_utf8_lossy(arg).into_owned())
            .collect();
        let Some((program, rest)) = args.split_first() else {
            return Err("it has no command line (a kernel thread, or a zombie)".into());
        };
        let exe = std::fs::read_link(proc.join("exe")).ok();
        let named_incumbent = |path: &std::path::Path| {
            path.file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| name.trim_end_matches(" (deleted)") == "incumbent")
        };
        if !named_incumbent(std::path::Path::new(program))
            && !exe.as_deref().is_some_and(named_incumbent)
        {
            return Err(format!("it is not incumbent: it runs {program}"));
        }
        let line = parse_run_line(rest);
        if line.subcommand.as_deref() != Some("run") {
            return Err("it is not an `incumbent run`".into());
        }
        if line.election.as_deref() != Some(election) {
            return Err(format!(
                "it runs election {}, not {election}",
                line.election.as_deref().unwrap_or("(none)")
            ));
        }
        let its_backend = match line.backend {
            Some(backend) => backend,
            None => {
                let environ = std::fs::read(proc.join("environ")).map_err(|e| {
                    format!("cannot read its environment, to check its backend: {e}")
                })?;
                environ
                    .split(|&b| b == 0)
                    .find_map(|var| var.strip_prefix(b"INCUMBENT_BACKEND="))
                    .map(|value| String::from_utf8_lossy(value).into_owned())
                    .unwrap_or_else(|| "file:".into())
            }
        };
        match its_backend.parse::<BackendUrl>() {
            Ok(its) if its == *backend => {}
            _ => return Err("it runs the election on another backend".into()),
        }
        if let (Some(since), Some(started)) = (since_unix_ms, started_unix_ms(&proc))
            && started > since.saturating_add(START_TOLERANCE_MS)
        {
            return Err(
                "it started after the leader's term began: the leader's pid now belongs to another process"
                    .into(),
            );
        }
        Ok(())
    }

    /// Sends `signal` to the process with `value` queued alongside (`SI_QUEUE`, as
    /// `sigqueue(3)`), through its pidfd where there is one; without a value, a plain signal.
    fn signal_with(&self, signal: libc::c_int, value: Option<u64>) -> std::io::Result<()> {
        let Some(value) = value else {
            return self.signal(signal);
        };
        #[cfg(all(target_os = "linux", target_pointer_width = "64"))]
        if let Some(pidfd) = &self.pidfd {
            use std::os::fd::AsRawFd;
            /// `siginfo_t` as the kernel reads a queued signal on 64-bit Linux: the signal,
            /// errno, code, then (at 16) the sender's pid and uid and (at 24) the value;
            /// 128 bytes in all.
            #[repr(C)]
            struct Queued {
                signo: libc::c_int,
                errno: libc::c_int,
                code: libc::c_int,
                _pad: libc::c_int,
                pid: libc::pid_t,
                uid: libc::uid_t,
                value: usize,
                _rest: [u8; 96],
            }
            let info = Queued {
                signo: signal,
                errno: 0,
                code: libc::SI_QUEUE,
                _pad: 0,
                // SAFETY: getpid and getuid have no preconditions.
                pid: unsafe { libc::getpid() },
                uid: unsafe { libc::getuid() },
                value: usize::try_from(value).unwrap_or(usize::MAX),
                _rest: [0; 96],
            };
            // SAFETY: pidfd_send_signal reads 128 bytes of siginfo from `info`, which is
            // that size; the descriptor is ours.
            let rc = unsafe {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    pidfd.as_raw_fd(),
                    signal,
                    &info as *const Queued,
                    0,
                )
            };
            return if rc == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            };
        }
        let sigval = libc::sigval {
            sival_ptr: usize::try_from(value).unwrap_or(usize::MAX) as *mut libc::c_void,
        };
        // SAFETY: sigqueue has no memory-safety preconditions; `pid > 1` (see `open`).
        if unsafe { libc::sigqueue(self.pid, signal, sigval) } == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }

    /// Sends `signal` to the process (through its pidfd where there is one).
    fn signal(&self, signal: libc::c_int) -> std::io::Result<()> {
        #[cfg(target_os = "linux")]
        if let Some(pidfd) = &self.pidfd {
            use std::os::fd::AsRawFd;
            // SAFETY: pidfd_send_signal takes a descriptor we own, a signal number, a null
            // siginfo and flags.
            let rc = unsafe {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    pidfd.as_raw_fd(),
                    signal,
                    std::ptr::null::<libc::siginfo_t>(),
                    0,
                )
            };
            return if rc == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            };
        }
        // SAFETY: kill has no memory-safety preconditions; `pid > 1` (see `open`).
        if unsafe { libc::kill(self.pid, signal) } == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }
}

/// When the process of `/proc/<pid>` started, in Unix milliseconds (Linux), if known.
fn started_unix_ms(proc: &std::path::Path) -> Option<u64> {
    let stat = std::fs::read_to_string(proc.join("stat")).ok()?;
    // Field 22, counted from 1; the fields after the command name `(…)` start at field 3.
    let (_, rest) = stat.rsplit_once(") ")?;
    let ticks: u64 = rest.split_whitespace().nth(22 - 3)?.parse().ok()?;
    let boot: u64 = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|line| line.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    // SAFETY: sysconf has no preconditions.
    let per_second = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).ok()?;
    if per_second == 0 {
        return None;
    }
    boot.checked_mul(1000)?
        .checked_add(ticks.checked_mul(1000)? / per_second)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<String> {
        line.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn pids_that_name_many_processes_or_this_one_are_refused_before_anything_is_signalled() {
        for pid in [-1, 0, 1, -42] {
            assert!(LeaderProcess::open(pid).is_err(), "{pid}");
        }
        let me = libc::pid_t::try_from(std::process::id()).expect("pid fits");
        assert!(LeaderProcess::open(me).is_err());
    }

    #[test]
    fn a_process_that_is_not_incumbent_is_refused() {
        // This test binary: alive, ours, but not `incumbent run`.
        let parent = unsafe { libc::getppid() };
        if let Ok(process) = LeaderProcess::open(parent) {
            let backend: BackendUrl = "file:".parse().expect("url");
            assert!(process.verify("jobs/a", &backend, None).is_err());
        }
    }

    #[test]
    fn the_run_line_is_read_up_to_the_double_dash() {
        let line = parse_run_line(&args(
            "--log-format json run --id run --election=jobs/a --backend etcd://h:2379 -- run --election x",
        ));
        assert_eq!(line.subcommand.as_deref(), Some("run"));
        assert_eq!(line.election.as_deref(), Some("jobs/a"));
        assert_eq!(line.backend.as_deref(), Some("etcd://h:2379"));

        let status = parse_run_line(&args("status --election jobs/a"));
        assert_eq!(status.subcommand.as_deref(), Some("status"));

        let smuggled = parse_run_line(&args("observe --election jobs/a -- run"));
        assert_eq!(smuggled.subcommand.as_deref(), Some("observe"));
    }
}

/// `incumbent observe --shards N`: a sharded group's map, printed at the start and at each
/// change (read again every [`SHARD_MAP_EVERY`]).
#[derive(Clone)]
pub struct ObserveShards {
    pub group: String,
    pub shards: u32,
    pub slots: u32,
    pub json: bool,
    /// `--fail-after`.
    pub patience: Patience,
    pub began: Instant,
    pub out: Reporter,
}

/// What `observe --shards` compares to tell a change: each member's claims, each shard's
/// holder.
type MapKey = (Vec<(String, Vec<u32>)>, Vec<Option<String>>);

/// How often `observe --shards` reads the map again: a map is many keys, read one by one.
pub const SHARD_MAP_EVERY: Duration = Duration::from_secs(1);

/// Shards as ranges: `0-3,7,9-10`.
fn ranges(shards: &[u32]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < shards.len() {
        let mut j = i;
        while j + 1 < shards.len() && shards[j + 1] == shards[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            shards[i].to_string()
        } else {
            format!("{}-{}", shards[i], shards[j])
        });
        i = j + 1;
    }
    if out.is_empty() {
        "none".into()
    } else {
        out.join(",")
    }
}

impl ObserveShards {
    fn show(&self, map: &incumbent::sharded::ShardMap) -> bool {
        let now = rfc3339(SystemTime::now());
        let held_by = |id: &str| -> Vec<u32> {
            (0..self.shards)
                .filter(|&k| {
                    map.holders[k as usize]
                        .as_ref()
                        .is_some_and(|h| h.candidate.id == id)
                })
                .collect()
        };
        let unheld: Vec<u32> = (0..self.shards)
            .filter(|&k| map.holders[k as usize].is_none())
            .collect();
        let others: Vec<u32> = (0..self.shards)
            .filter(|&k| {
                map.holders[k as usize]
                    .as_ref()
                    .is_some_and(|h| !map.members.iter().any(|m| m.id == h.candidate.id))
            })
            .collect();
        if self.json {
            let members: Vec<_> = map
                .members
                .iter()
                .map(|m| {
                    json!({
                        "id": m.id,
                        "weight": m.weight,
                        "metadata": m.metadata,
                        "held": held_by(&m.id),
                        "claimed": m.claims,
                    })
                })
                .collect();
            let line = json!({
                "time": now,
                "group": self.group,
                "shards": self.shards,
                "members": members,
                "unheld": unheld,
                "held_by_non_members": others,
            });
            return print(&line.to_string());
        }
        let mut text = format!(
            "{now} {}: {} shards, {} members",
            self.group,
            self.shards,
            map.members.len()
        );
        for m in &map.members {
            let held = held_by(&m.id);
            text.push_str(&format!(
                "\n  {} (weight {}): holds {} [{}], claims {}",
                m.id,
                m.weight,
                held.len(),
                ranges(&held),
                m.claims.len()
            ));
        }
        text.push_str(&format!("\n  nobody holds: {}", ranges(&unheld)));
        if !others.is_empty() {
            text.push_str(&format!(
                "\n  held by processes that are not members: {}",
                ranges(&others)
            ));
        }
        print(&text)
    }
}

impl WithBackend for ObserveShards {
    type Output = Result<u8, Failure>;

    async fn call<B: Backend>(self, backend: B) -> Self::Output {
        let out = self.out.for_election(&self.group);
        let follow = async {
            let mut shown: Option<MapKey> = None;
            let mut failing_since = Some(self.began);
            loop {
                match incumbent::sharded::read_map(&backend, &self.group, self.shards, self.slots)
                    .await
                {
                    Ok(map) => {
                        failing_since = None;
                        let key = (
                            map.members
                                .iter()
                                .map(|m| (m.id.clone(), m.claims.iter().copied().collect()))
                                .collect(),
                            map.holders
                                .iter()
                                .map(|h| h.as_ref().map(|h| h.candidate.id.clone()))
                                .collect(),
                        );
                        if shown.as_ref() != Some(&key) {
                            if !self.show(&map) {
                                return Ok::<(), Failure>(());
                            }
                            shown = Some(key);
                        }
                    }
                    Err(e) => {
                        keep_trying(e, &mut failing_since, &self.patience, &out, SHARD_MAP_EVERY)?
                    }
                }
                sleep(SHARD_MAP_EVERY).await;
            }
        };
        until_interrupted(follow).await
    }
}
