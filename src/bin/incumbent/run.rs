//! `incumbent run`: campaign, and run the command only while leader.
//!
//! The [`watchdog`] stays armed from the spawn until the command has been reaped, on every
//! path: while the term lasts and during a voluntary stop (a signal, a resign, a shutdown)
//! at the lease's last safe instant, re-armed from each renewal of the session that holds
//! the lease (renewals go on until the lock is released, after the command is gone); after
//! an involuntary loss at the term's `stop_by`.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use incumbent::backend::{Backend, Observer, Session, SessionHealth, SessionOptions};
use incumbent::url::WithBackend;
use incumbent::{CampaignHandle, Election, LeadershipEvent, Status, Term};
use serde_json::json;
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::watch;
use tokio::time::{Instant, sleep_until};

use crate::Failure;
use crate::process::{self, Next, Running};
use crate::report::{Reporter, human, leader_json, leader_text, millis};
use crate::retry::Patience;
use crate::watchdog;

/// The election's grace exceeds the command's by this much, so that the lock is released
/// only after the command is gone, even when it had to be killed.
const GRACE_MARGIN: Duration = Duration::from_secs(1);

/// The watchdog kills the command a tenth of the ttl before the lease could expire, as the
/// library's `Term::stop_by` does.
const WATCHDOG_MARGIN_DIVISOR: u32 = 10;

/// After a second stop signal, how long the campaign still gets to release the lock.
const FORCED_EXIT_WAIT: Duration = Duration::from_secs(1);

/// Stands for "never" where an instant is needed (about 30 years).
const FAR_FUTURE: Duration = Duration::from_secs(86400 * 365 * 30);

/// A command that exits by itself sooner than this after it started counts as crashing.
const QUICK_EXIT: Duration = Duration::from_secs(10);
/// The delay before running a crashing command again when re-elected; it doubles with
/// every quick exit in a row, up to [`MAX_RESTART_DELAY`], so a command that cannot start is
/// not run in a hot loop. Leadership is handed on at once meanwhile: another host, where the
/// command may work, gets the lock first.
const RESTART_DELAY: Duration = Duration::from_secs(1);
/// The longest delay before running a crashing command again.
const MAX_RESTART_DELAY: Duration = Duration::from_secs(30);

/// The metadata key that tells `incumbent resign` how to ask this candidate to step down.
pub const RESIGN_KEY: &str = "resign";
/// Its value: the signal `incumbent run` handles as "resign".
pub const RESIGN_SIGNAL: &str = "SIGUSR1";

/// The longest `incumbent resign --yield` accepted.
pub const MAX_YIELD: Duration = Duration::from_secs(86_400);

/// The value queued with the last SIGUSR1 (`incumbent resign --yield`: milliseconds not to
/// campaign again), 0 for a plain signal; stored by a signal action, taken by the loop.
static QUEUED_YIELD_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Registers the action that keeps SIGUSR1's queued value, before tokio's own: actions run
/// in the order they were registered, so the value is stored when tokio's stream wakes.
fn keep_queued_values() -> std::io::Result<()> {
    // SAFETY: the action only reads the siginfo and stores into an atomic, which is
    // async-signal-safe.
    unsafe {
        signal_hook_registry::register_sigaction(libc::SIGUSR1, |info: &libc::siginfo_t| {
            let value = if info.si_code == libc::SI_QUEUE {
                info.si_value().sival_ptr as usize as u64
            } else {
                0
            };
            QUEUED_YIELD_MS.store(value, std::sync::atomic::Ordering::SeqCst);
        })?;
    }
    Ok(())
}

/// The settings of one `incumbent run`.
#[derive(Clone)]
pub struct Run {
    pub election: String,
    /// The backend URL, for the log (it holds no credentials).
    pub backend: String,
    pub id: Option<String>,
    pub metadata: Vec<(String, String)>,
    pub ttl: Option<Duration>,
    pub lock_delay: Option<Duration>,
    pub grace: Duration,
    pub exit_with_child: bool,
    /// `--priority` and `--settle`.
    pub priority: Option<(u32, Duration)>,
    /// `--hand-over-window`.
    pub hand_over_window: Option<Duration>,
    /// Whether the command inherits the store's credentials.
    pub pass_credentials: bool,
    pub program: PathBuf,
    pub args: Vec<OsString>,
    /// How long to keep trying a store that cannot be reached.
    pub patience: Patience,
    /// When this program began trying.
    pub began: Instant,
    pub out: Reporter,
}

impl WithBackend for Run {
    type Output = Result<u8, Failure>;

    async fn call<B: Backend>(self, backend: B) -> Self::Output {
        let mut builder = Election::builder(backend.clone(), &self.election);
        if let Some(id) = &self.id {
            builder = builder.candidate(id);
        }
        for (key, value) in &self.metadata {
            builder = builder.metadata(key, value);
        }
        builder = builder
            .metadata("host", hostname())
            .metadata("pid", std::process::id().to_string())
            .metadata(RESIGN_KEY, RESIGN_SIGNAL)
            .grace(self.grace + GRACE_MARGIN);
        if let Some(ttl) = self.ttl {
            builder = builder.ttl(ttl);
        }
        if let Some((level, settle)) = self.priority {
            builder = builder.priority_with_settle(level, settle);
        }
        if let Some(window) = self.hand_over_window {
            builder = builder.hand_over_window(window);
        }
        if let Some(delay) = self.lock_delay {
            builder = builder.lock_delay(delay);
        }
        let election = builder.build()?;
        // Pre-flight: one session and one read, before campaigning, so that a permanent error
        // (a lock directory that cannot be made, refused credentials) ends the program now
        // instead of being retried by the campaign for ever.
        let config = election.config();
        let options = SessionOptions {
            ttl: config.ttl,
            renew_interval: config.renew_interval,
            lock_delay: config.lock_delay,
            name: format!("incumbent:{}", config.candidate.id),
        };
        self.patience
            .run(self.began, &self.out, || {
                preflight(&backend, &options, &self.election, &config.candidate)
            })
            .await?;
        let signals =
            Signals::new().map_err(|e| Failure::Runtime(format!("cannot handle signals: {e}")))?;
        if !watchdog::start() {
            return Err(Failure::Runtime("cannot start the watchdog thread".into()));
        }
        // Read once: nothing but the spawn stands between a win and the command.
        let removed = if self.pass_credentials {
            Vec::new()
        } else {
            process::credentials_in_env()
        };
        let supervisor = Supervisor {
            removed,
            fail_after: self.patience.fail_after,
            out: self.out.for_election(&self.election),
            candidate: election.config().candidate.id.clone(),
            ttl: election.config().ttl,
            settings: self,
            signals,
        };
        // A task of its own rather than the runtime's main future: on the one-thread runtime,
        // a task the campaign wakes at its win runs next, while the main future waits until
        // every task queued meanwhile (the store client's) has run.
        match tokio::spawn(async move { supervisor.run(&election).await }).await {
            Ok(outcome) => outcome,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => Err(Failure::Runtime(format!("the supervisor stopped: {e}"))),
        }
    }
}

/// The signals `incumbent run` handles.
struct Signals {
    interrupt: Signal,
    terminate: Signal,
    hangup: Signal,
    resign: Signal,
}

enum Received {
    /// SIGINT, SIGTERM or SIGHUP (the terminal went away): shut down.
    Stop(&'static str),
    /// SIGUSR1: resign, and with a queued value, do not campaign again for that long.
    Resign(Option<Duration>),
}

impl Signals {
    fn new() -> std::io::Result<Signals> {
        Ok(Signals {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
            hangup: signal(SignalKind::hangup())?,
            resign: {
                keep_queued_values()?;
                signal(SignalKind::user_defined1())?
            },
        })
    }

    async fn recv(&mut self) -> Received {
        tokio::select! {
            Some(()) = self.interrupt.recv() => Received::Stop("SIGINT"),
            Some(()) = self.terminate.recv() => Received::Stop("SIGTERM"),
            Some(()) = self.hangup.recv() => Received::Stop("SIGHUP"),
            Some(()) = self.resign.recv() => {
                let ms = QUEUED_YIELD_MS.swap(0, std::sync::atomic::Ordering::SeqCst);
                let ms = ms.min(u64::try_from(MAX_YIELD.as_millis()).unwrap_or(u64::MAX));
                Received::Resign((ms > 0).then(|| Duration::from_millis(ms)))
            }
            // The signal driver is gone only when the runtime shuts down.
            else => std::future::pending().await,
        }
    }
}

struct Supervisor {
    settings: Run,
    /// The variables the command does not inherit (the store's credentials).
    removed: Vec<OsString>,
    /// `--fail-after`: how long the campaign may fail in a row while not leading.
    fail_after: Option<Duration>,
    out: Reporter,
    candidate: String,
    signals: Signals,
    /// The election's ttl, for the watchdog's deadline.
    ttl: Duration,
}

/// A command being stopped: it has had SIGTERM, and gets SIGKILL at `kill_at`. The watchdog
/// stays armed until it has been reaped.
struct Stopping {
    running: Running,
    kill_at: Instant,
    /// Whether the group has had SIGKILL.
    killed: bool,
    began: Instant,
}

/// Whole microseconds, for the log.
fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

/// How a spawn went.
enum Started {
    /// The command runs: the spawn began at `began` (wall clock) and took `took`.
    Running {
        began: std::time::SystemTime,
        took: Duration,
    },
    /// It could not be started.
    Failed(std::io::Error),
    /// Its term had ended already.
    Cancelled,
}

/// What happened to the command being stopped.
enum StopEvent {
    Exited(std::io::Result<std::process::ExitStatus>),
    KillDue,
}

/// Where the supervisor is in its life.
struct State {
    /// The command, while its term lasts.
    running: Option<Running>,
    /// The health of the session that holds the lease of the command's term, from the spawn
    /// until the command (running or being stopped) has been reaped: each renewal it reports
    /// pushes the watchdog's deadline forward, also while a voluntary stop keeps the lock.
    lease: Option<watch::Receiver<SessionHealth>>,
    /// The command of a term that has ended, until it is gone. A new term's command starts
    /// only after it.
    stopping: Option<Stopping>,
    /// A term whose command starts at the instant, after a restart delay (and once no
    /// command is being stopped).
    pending: Option<(Term, Instant)>,
    /// How many times in a row the command exited within [`QUICK_EXIT`].
    quick_exits: u32,
    /// Shutting down: the campaign's end is the program's end.
    shutting_down: bool,
    /// Whether this candidate led (or was stepping down) when the shutdown began.
    led_at_shutdown: bool,
    /// Between an `Elected` event and its `Demoted`.
    leading: bool,
    /// After a second stop signal: when to give up waiting for the campaign and exit.
    give_up_at: Option<Instant>,
    exit_code: u8,
    /// Since when this candidate has been without a term (`campaigned_ms` of "elected").
    waiting_since: Instant,
    /// Another candidate last reported as leader, so each change is reported once.
    shown_leader: Option<String>,
    /// When `--fail-after` runs out, while the campaign keeps failing and this candidate
    /// does not lead.
    fail_at: Option<Instant>,
}

impl Supervisor {
    async fn run<B: Backend>(mut self, election: &Election<B>) -> Result<u8, Failure> {
        self.out.event(
            "started",
            &format!(
                "campaigning as {} on {} (pid {})",
                self.candidate,
                self.settings.backend,
                std::process::id()
            ),
            json!({ "candidate": self.candidate, "backend": self.settings.backend, "pid": std::process::id() }),
        );
        let mut campaign = election.campaign();
        let handle = campaign.handle();
        let mut status = campaign.status();
        let mut state = State {
            running: None,
            lease: None,
            stopping: None,
            pending: None,
            quick_exits: 0,
            shutting_down: false,
            led_at_shutdown: false,
            leading: false,
            give_up_at: None,
            exit_code: 0,
            waiting_since: Instant::now(),
            shown_leader: None,
            fail_at: None,
        };
        loop {
            tokio::select! {
                // The command comes first: when its term ends, it is signalled before anything
                // else is looked at (and nothing here ever waits on stderr: see `crate::log`).
                biased;
                next = next(&mut state.running) => match next {
                    Next::TermEnded => self.fence(&mut state),
                    Next::Exited(exited) => self.on_exit(exited, &mut state, &handle),
                },
                event = stopping_next(&mut state.stopping) => self.on_stopping(event, &mut state),
                received = self.signals.recv() => self.on_signal(received, &mut state, &handle),
                () = sleep_until_some(state.give_up_at) => {
                    return Err(Failure::Runtime(
                        "stopped without releasing the lock: the campaign did not end in time after a second signal".into(),
                    ));
                }
                Ok(()) = status.changed() => {
                    let status = status.borrow_and_update();
                    self.rearm(&status, &state);
                    state.fail_at = self.fail_at(&status, &state);
                }
                // The lease's renewals (the status does not change at each): each one pushes
                // the watchdog's deadline forward. A session that is gone renews no more: the
                // watchdog stays armed at the last deadline.
                renewed = changed_some(&mut state.lease) => match renewed {
                    Ok(()) => self.rearm(&status.borrow(), &state),
                    Err(()) => state.lease = None,
                },
                () = sleep_until_some(state.fail_at), if !state.shutting_down => {
                    state.fail_at = None;
                    let problem = status.borrow().problem.clone();
                    if let Some(problem) = problem.filter(|_| !state.leading) {
                        let failing = problem.since.elapsed();
                        let message = self.settings.patience.gave_up(failing, &problem.message);
                        self.out.error(&format!("{}; shutting down", message.message()));
                        shut_down(&mut state, &handle, 1);
                    }
                }
                event = campaign.recv() => match event {
                    Some(event) => self.on_event(event, &mut state, &handle, &status),
                    None if state.shutting_down => {
                        let message = if state.led_at_shutdown {
                            "stopped; the lock is released"
                        } else {
                            "stopped (this candidate did not hold the lock)"
                        };
                        self.out.event("stopped", message, json!({ "held": state.led_at_shutdown }));
                        return Ok(state.exit_code);
                    }
                    None => return Err(Failure::Runtime("the campaign stopped unexpectedly".into())),
                },
                () = due(&state.pending), if state.stopping.is_none() => {
                    if let Some((term, _)) = state.pending.take() {
                        self.start(&term, &mut state, &handle, &status);
                    }
                }
            }
        }
    }

    /// The running command's term has ended (or this process is shutting down): SIGTERM to
    /// its group now; SIGKILL after the grace, or at the term's `stop_by` if that is sooner
    /// (an involuntary loss: from then on the store may hand the lock on). The watchdog
    /// thread kills it at `stop_by` even if this thread cannot; after a voluntary end, at the
    /// lease's last safe instant, pushed forward by the renewals that go on until the lock
    /// is released (see [`rearm`](Self::rearm)). Logged only afterwards.
    fn fence(&mut self, state: &mut State) {
        if let Some((message, fields)) = self.fence_quietly(state) {
            self.out.event("command_stopping", &message, fields);
        }
    }

    /// [`fence`](Self::fence), returning the line to log instead of logging it.
    fn fence_quietly(&mut self, state: &mut State) -> Option<(String, serde_json::Value)> {
        let running = state.running.take()?;
        running.terminate();
        let now = Instant::now();
        let stop_by = running.term().stop_by();
        let grace_ends = now
            .checked_add(self.settings.grace)
            .or_else(|| now.checked_add(FAR_FUTURE))
            .unwrap_or(now);
        let kill_at = match stop_by {
            Some(at) => {
                watchdog::arm(running.pid(), at.into_std());
                grace_ends.min(at)
            }
            // A voluntary end: the lock is kept (and renewed) until the command is gone. The
            // watchdog stays armed all along, at the lease's last safe instant, in case this
            // thread gets stuck and the renewals stop while the command ignores SIGTERM.
            None => {
                if let Some(at) = self.lease_safe_until(state) {
                    watchdog::arm(running.pid(), at.into_std());
                }
                grace_ends
            }
        };
        let killed = kill_at <= now;
        if killed {
            running.kill_now();
        }
        let pid = running.pid();
        state.stopping = Some(Stopping {
            running,
            kill_at,
            killed,
            began: now,
        });
        let until = kill_at.saturating_duration_since(now);
        let message = match (stop_by, killed) {
            (_, true) => format!(
                "stopping the command: SIGKILL to process group {pid} (the lease may be gone already)"
            ),
            (Some(_), false) if kill_at < grace_ends => format!(
                "stopping the command: SIGTERM to process group {pid}, SIGKILL in {} (before the lease can expire)",
                human(until)
            ),
            _ => format!(
                "stopping the command: SIGTERM to process group {pid}, SIGKILL after {}",
                human(until)
            ),
        };
        Some((
            message,
            json!({ "pid": pid, "grace_ms": millis(self.settings.grace), "kill_in_ms": millis(until), "killed": killed }),
        ))
    }

    fn on_stopping(&mut self, event: StopEvent, state: &mut State) {
        match event {
            StopEvent::KillDue => {
                let Some(stopping) = &mut state.stopping else {
                    return;
                };
                stopping.running.kill_now();
                stopping.killed = true;
                let pid = stopping.running.pid();
                self.out.event(
                    "command_killing",
                    &format!("the command is still running: SIGKILL to process group {pid}"),
                    json!({ "pid": pid }),
                );
            }
            StopEvent::Exited(exited) => {
                let Some(stopping) = state.stopping.take() else {
                    return;
                };
                stopping.running.sweep();
                // Reaped: the watchdog has forgotten its group; no renewal re-arms it now.
                state.lease = None;
                let pid = stopping.running.pid();
                let took = stopping.began.elapsed();
                // Releases the term's guard: the campaign may release the lock now.
                drop(stopping.running);
                let status = exited
                    .map(process::describe)
                    .unwrap_or_else(|e| format!("an unknown status ({e})"));
                self.out.event(
                    "command_stopped",
                    &format!(
                        "the command {} after {} with {status}",
                        if stopping.killed { "was killed" } else { "stopped" },
                        human(took)
                    ),
                    json!({ "pid": pid, "killed": stopping.killed, "took_ms": millis(took), "status": status }),
                );
            }
        }
    }

    fn on_signal(&mut self, received: Received, state: &mut State, handle: &CampaignHandle) {
        match received {
            Received::Stop(name) if !state.shutting_down => {
                // Signal first: the command gets SIGTERM now (a command already being stopped
                // gets SIGKILL), then the campaign ends the term and releases the lock.
                let hurried = state.stopping.as_mut().map(|stopping| {
                    stopping.running.kill_now();
                    stopping.killed = true;
                    stopping.running.pid()
                });
                let fenced = self.fence_quietly(state);
                shut_down(state, handle, 0);
                self.out.event(
                    "stopping",
                    &format!("{name}: shutting down"),
                    json!({ "signal": name }),
                );
                if let Some((message, fields)) = fenced {
                    self.out.event("command_stopping", &message, fields);
                }
                if let Some(pid) = hurried {
                    self.out.event(
                        "command_killing",
                        &format!("{name} while the command was being stopped: SIGKILL to process group {pid}"),
                        json!({ "signal": name, "pid": pid }),
                    );
                }
            }
            Received::Stop(name) => {
                let mut pids = Vec::new();
                if let Some(running) = &state.running {
                    running.kill_now();
                    pids.push(running.pid());
                }
                if let Some(stopping) = &mut state.stopping {
                    stopping.running.kill_now();
                    stopping.killed = true;
                    pids.push(stopping.running.pid());
                }
                if state.give_up_at.is_none() {
                    state.give_up_at = Some(Instant::now() + FORCED_EXIT_WAIT);
                }
                self.out.event(
                    "killing",
                    &format!(
                        "{name} again: killing the command's process group; exiting within {}",
                        human(FORCED_EXIT_WAIT)
                    ),
                    json!({ "signal": name, "pids": pids }),
                );
            }
            Received::Resign(yield_for)
                if (state.running.is_some() || state.pending.is_some()) && !state.shutting_down =>
            {
                let handle = handle.clone();
                tokio::spawn(async move {
                    match yield_for {
                        Some(yield_for) => handle.resign_for(yield_for).await,
                        None => handle.resign().await,
                    }
                });
                let message = match yield_for {
                    Some(y) => {
                        format!("SIGUSR1: resigning; not campaigning again for {}", human(y))
                    }
                    None => "SIGUSR1: resigning".to_owned(),
                };
                self.out.event(
                    "resigning",
                    &message,
                    json!({ "signal": "SIGUSR1", "yield_ms": yield_for.map(millis) }),
                );
            }
            Received::Resign(Some(yield_for)) if !state.shutting_down => {
                let handle = handle.clone();
                tokio::spawn(async move { handle.resign_for(yield_for).await });
                self.out.event(
                    "resigning",
                    &format!(
                        "SIGUSR1: not leading; not campaigning again for {}",
                        human(yield_for)
                    ),
                    json!({ "signal": "SIGUSR1", "yield_ms": millis(yield_for) }),
                );
            }
            Received::Resign(_) => {
                self.out.event(
                    "resigning",
                    "SIGUSR1: not leading; nothing to resign",
                    json!({ "signal": "SIGUSR1" }),
                );
            }
        }
    }

    /// When to give up, by `--fail-after`: the campaign has had a problem since some instant
    /// and this candidate holds no term. `None` while leading, or without a problem.
    fn fail_at(&self, status: &Status, state: &State) -> Option<Instant> {
        let limit = self.fail_after?;
        if state.leading || state.running.is_some() || state.shutting_down {
            return None;
        }
        let problem = status.problem.as_ref()?;
        problem.since.checked_add(limit)
    }

    /// Keeps the watchdog armed at the lease's last safe instant until the command has been
    /// reaped: the last confirmed renewal's send time + ttl − ttl/10 (as the term's `stop_by`
    /// would be), pushed forward with each renewal the campaign reports, while the term
    /// lasts and while the command is being stopped after a voluntary end (the lock is
    /// renewed until it is gone); at the term's `stop_by` once it has one (an involuntary
    /// loss, or renewals that stopped during the stop).
    fn rearm(&self, status: &Status, state: &State) {
        if let Some(stopping) = &state.stopping {
            let term = stopping.running.term();
            if let Some(at) = term.stop_by().or_else(|| self.lease_safe_until(state)) {
                watchdog::arm(stopping.running.pid(), at.into_std());
            }
            return;
        }
        let Some(running) = &state.running else {
            return;
        };
        let term = running.term();
        let (Some(current), Some(last), Some(_)) = (
            &status.term,
            status.last_renewal(),
            status.renew_deadline_at(),
        ) else {
            return;
        };
        if term.is_cancelled() || current.fencing_token() != term.fencing_token() {
            return;
        }
        let at = last + self.ttl - self.ttl / WATCHDOG_MARGIN_DIVISOR;
        watchdog::arm(running.pid(), at.into_std());
    }

    /// The last instant the lease of the command's term is surely held: its session's last
    /// confirmed renewal's send time + ttl − ttl/10. `None` without a command.
    fn lease_safe_until(&self, state: &State) -> Option<Instant> {
        let confirmed = state.lease.as_ref()?.borrow().confirmed_sent_at;
        Some(confirmed + self.ttl - self.ttl / WATCHDOG_MARGIN_DIVISOR)
    }

    fn on_event(
        &mut self,
        event: LeadershipEvent,
        state: &mut State,
        handle: &CampaignHandle,
        status: &watch::Receiver<Status>,
    ) {
        match event {
            LeadershipEvent::Elected(term) => {
                // The command first: the hand-off is complete only when it runs. Everything
                // else, the lines included, comes after the spawn.
                state.shown_leader = None;
                state.leading = true;
                let delay = restart_delay(state.quick_exits);
                let start_now = !state.shutting_down && delay.is_zero() && state.stopping.is_none();
                let started = start_now.then(|| self.spawn(&term, state, status));
                let token = term.fencing_token();
                let waited = state.waiting_since.elapsed();
                let gap = term.gap();
                // The failover time, as the metrics count it (`incumbent::Gap`); not how long
                // this candidate campaigned.
                let without = if gap.exact {
                    format!("without a leader for {}", human(gap.without_leader))
                } else {
                    format!(
                        "without a leader for at most {} (the lock was free for {})",
                        human(gap.without_leader),
                        human(gap.lock_free)
                    )
                };
                self.out.event(
                    "elected",
                    &format!("elected (fencing token {token}); the election was {without}"),
                    json!({
                        "fencing_token": token,
                        "without_leader_ms": millis(gap.without_leader),
                        "lock_free_ms": millis(gap.lock_free),
                        "exact": gap.exact,
                        "campaigned_ms": millis(waited),
                    }),
                );
                if let Some(started) = started {
                    self.report_start(&term, started, state, handle);
                    return;
                }
                if state.shutting_down {
                    state.led_at_shutdown = true;
                    return;
                }
                if !delay.is_zero() {
                    self.out.event(
                        "command_delayed",
                        &format!(
                            "the command exited early {} time(s) in a row; starting it in {}",
                            state.quick_exits,
                            human(delay)
                        ),
                        json!({ "quick_exits": state.quick_exits, "delay_ms": millis(delay) }),
                    );
                }
                // Also when the last term's command is still being stopped: never two at once.
                state.pending = Some((term, Instant::now() + delay));
            }
            LeadershipEvent::Demoted {
                fencing_token,
                reason,
                stop_by,
            } => {
                // The command was stopped when the term was cancelled, before this event.
                if state
                    .running
                    .as_ref()
                    .is_some_and(|r| r.term().is_cancelled())
                {
                    self.fence(state);
                }
                if state
                    .pending
                    .as_ref()
                    .is_some_and(|(term, _)| term.is_cancelled())
                {
                    state.pending = None;
                }
                state.waiting_since = Instant::now();
                state.leading = false;
                let stop_by_ms =
                    stop_by.map(|at| millis(at.saturating_duration_since(Instant::now())));
                self.out.event(
                    "demoted",
                    &format!("demoted (fencing token {fencing_token}): {reason}"),
                    json!({ "fencing_token": fencing_token, "reason": reason.as_str(), "stop_by_in_ms": stop_by_ms }),
                );
            }
            LeadershipEvent::LeaderChanged(leader) => match leader {
                Some(leader) if leader.candidate.id != self.candidate => {
                    let text = leader_text(&leader);
                    if state.shown_leader.as_deref() != Some(text.as_str()) {
                        self.out.event(
                            "leader",
                            &format!("leader: {text}"),
                            json!({ "leader": leader_json(&leader) }),
                        );
                        state.shown_leader = Some(text);
                    }
                }
                Some(_) => {}
                None => {
                    if state.shown_leader.take().is_some() {
                        self.out
                            .event("leader", "leader: none", json!({ "leader": null }));
                    }
                }
            },
        }
    }

    /// Starts the command for `term`, and reports it; shuts down if it cannot be started.
    fn start(
        &mut self,
        term: &Term,
        state: &mut State,
        handle: &CampaignHandle,
        status: &watch::Receiver<Status>,
    ) {
        let started = self.spawn(term, state, status);
        self.report_start(term, started, state, handle);
    }

    /// Spawns the command for `term` and arms the watchdog: nothing else, so that the
    /// command starts as soon as the term does. [`report_start`](Self::report_start) says
    /// how it went.
    fn spawn(
        &mut self,
        term: &Term,
        state: &mut State,
        status: &watch::Receiver<Status>,
    ) -> Started {
        if term.is_cancelled() {
            return Started::Cancelled; // the term ended meanwhile; its Demoted event is on its way
        }
        let began = std::time::SystemTime::now();
        let clock = Instant::now();
        let s = &self.settings;
        match Running::start(&s.program, &s.args, term, &self.candidate, &self.removed) {
            Ok(running) => {
                let took = clock.elapsed();
                state.running = Some(running);
                state.lease = status.borrow().renewals();
                self.rearm(&status.borrow(), state);
                Started::Running { began, took }
            }
            Err(e) => Started::Failed(e),
        }
    }

    /// Logs how [`spawn`](Self::spawn) went, with the times of the hand-off's last part:
    /// from the term's start to the spawn, and the spawn itself (until the program was
    /// executed). Shuts down if the command could not be started.
    fn report_start(
        &mut self,
        term: &Term,
        started: Started,
        state: &mut State,
        handle: &CampaignHandle,
    ) {
        match started {
            Started::Running { began, took } => {
                let Some(pid) = state.running.as_ref().map(Running::pid) else {
                    return;
                };
                let after_win = began.duration_since(term.started_at()).unwrap_or_default();
                let term_started = term
                    .started_at()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default();
                self.out.event(
                    "command_started",
                    &format!("started {} (pid {pid})", self.settings.program.display()),
                    json!({
                        "pid": pid,
                        "fencing_token": term.fencing_token(),
                        "term_started_unix_us": micros(term_started),
                        "spawn_after_term_start_us": micros(after_win),
                        "spawn_us": micros(took),
                    }),
                );
            }
            Started::Failed(e) => {
                shut_down(state, handle, 1);
                self.out.error(&format!(
                    "cannot start {}: {e}; shutting down",
                    self.settings.program.display()
                ));
            }
            Started::Cancelled => {}
        }
    }

    /// The command exited by itself.
    fn on_exit(
        &mut self,
        exited: std::io::Result<std::process::ExitStatus>,
        state: &mut State,
        handle: &CampaignHandle,
    ) {
        let Some(running) = state.running.take() else {
            return;
        };
        running.sweep();
        // Reaped: the watchdog has forgotten its group; no renewal re-arms it now.
        state.lease = None;
        let uptime = running.uptime();
        let pid = running.pid();
        let term_ended = running.term().is_cancelled();
        drop(running); // releases the term's guard
        state.quick_exits = if uptime < QUICK_EXIT {
            state.quick_exits.saturating_add(1)
        } else {
            0
        };
        let (status, code) = match exited {
            Ok(status) => (process::describe(status), process::exit_code(status)),
            Err(e) => (format!("an unknown status ({e})"), 1),
        };
        let leading = !state.shutting_down && !term_ended;
        let exit_with_child = leading && self.settings.exit_with_child;
        if exit_with_child {
            shut_down(state, handle, code);
        } else if leading {
            let handle = handle.clone();
            tokio::spawn(async move { handle.resign().await });
        }
        self.out.event(
            "command_exited",
            &format!("the command exited with {status} after {}", human(uptime)),
            json!({ "pid": pid, "status": status, "exit_code": code, "uptime_ms": millis(uptime) }),
        );
        if exit_with_child {
            self.out.event(
                "stopping",
                &format!("--exit-with-child: releasing the lock and exiting with {code}"),
                json!({ "exit_code": code }),
            );
        } else if leading {
            self.out.event(
                "resigning",
                "resigning; the command runs again when this process is re-elected",
                json!({}),
            );
        }
    }
}

/// One session opened and closed, one claim prepared, and one read of the leader: what the
/// campaign will do first, so that its errors show before it starts.
async fn preflight<B: Backend>(
    backend: &B,
    options: &SessionOptions,
    election: &str,
    candidate: &incumbent::Candidate,
) -> incumbent::Result<()> {
    let session = backend.open_session(options).await?;
    let contended = session.contend(election, candidate).await.map(drop);
    let closed = session.close().await;
    contended?;
    closed?;
    let mut observer = backend.observe(election).await?;
    observer.next().await?;
    Ok(())
}

/// Starts a graceful shutdown: the campaign ends the term (the command is stopped when it
/// does, if it was not already), releases the lock and stops; the program then exits with
/// `code`.
fn shut_down(state: &mut State, handle: &CampaignHandle, code: u8) {
    state.led_at_shutdown = state.leading || state.running.is_some() || state.stopping.is_some();
    state.shutting_down = true;
    state.exit_code = code;
    let handle = handle.clone();
    tokio::spawn(async move { handle.shutdown().await });
}

/// The delay before running the command again after `quick_exits` quick exits in a row.
fn restart_delay(quick_exits: u32) -> Duration {
    match quick_exits {
        0 => Duration::ZERO,
        n => RESTART_DELAY
            .saturating_mul(1 << (n - 1).min(16))
            .min(MAX_RESTART_DELAY),
    }
}

/// Completes when a delayed start is due; pending while none is.
async fn due(pending: &Option<(Term, Instant)>) {
    match pending {
        Some((_, at)) => sleep_until(*at).await,
        None => std::future::pending().await,
    }
}

/// Completes when the running command exits or its term ends; pending while none runs.
async fn next(running: &mut Option<Running>) -> Next {
    match running {
        Some(running) => running.next().await,
        None => std::future::pending().await,
    }
}

/// Completes when the command being stopped exits, or is due for SIGKILL; pending while no
/// command is being stopped.
async fn stopping_next(stopping: &mut Option<Stopping>) -> StopEvent {
    let Some(stopping) = stopping else {
        return std::future::pending().await;
    };
    let (kill_at, killed) = (stopping.kill_at, stopping.killed);
    let term = stopping.running.term().clone();
    tokio::select! {
        exited = stopping.running.wait() => StopEvent::Exited(exited),
        () = sleep_until(kill_at), if !killed => StopEvent::KillDue,
        // The lease is about to lapse while the command winds down (renewals stopped).
        () = term.must_stop(), if !killed => StopEvent::KillDue,
    }
}

/// Completes at the instant; pending without one.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// This host's name, as `incumbent resign` compares it: the library's, so that the
/// `host` metadata and the check agree.
pub fn hostname() -> String {
    incumbent::config::hostname()
}

/// The next change of a watched value, or never without one. `Err`: its sender is gone.
async fn changed_some<T>(receiver: &mut Option<watch::Receiver<T>>) -> Result<(), ()> {
    match receiver {
        Some(r) => r.changed().await.map_err(|_| ()),
        None => std::future::pending().await,
    }
}
