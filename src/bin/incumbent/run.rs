//! `incumbent run`: campaign, and run the command only while leader.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use incumbent::backend::Backend;
use incumbent::url::WithBackend;
use incumbent::{CampaignHandle, Election, LeadershipEvent, Term};
use serde_json::json;
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::time::{Instant, sleep_until};

use crate::Failure;
use crate::process::{self, Running};
use crate::report::{Reporter, human, leader_json, leader_text, millis};

/// The election's grace exceeds the command's by this much, so that the lock is released
/// only after the command is gone, even when it had to be killed.
const GRACE_MARGIN: Duration = Duration::from_secs(1);

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

/// The settings of one `incumbent run`.
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
    pub program: PathBuf,
    pub args: Vec<OsString>,
    pub out: Reporter,
}

impl WithBackend for Run {
    type Output = Result<u8, Failure>;

    async fn call<B: Backend>(self, backend: B) -> Self::Output {
        let mut builder = Election::builder(backend, &self.election);
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
        if let Some(delay) = self.lock_delay {
            builder = builder.lock_delay(delay);
        }
        let election = builder.build()?;
        let signals =
            Signals::new().map_err(|e| Failure::Runtime(format!("cannot handle signals: {e}")))?;
        Supervisor {
            out: self.out.for_election(&self.election),
            candidate: election.config().candidate.id.clone(),
            settings: self,
            signals,
        }
        .run(&election)
        .await
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
    /// SIGUSR1: resign.
    Resign,
}

impl Signals {
    fn new() -> std::io::Result<Signals> {
        Ok(Signals {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
            hangup: signal(SignalKind::hangup())?,
            resign: signal(SignalKind::user_defined1())?,
        })
    }

    async fn recv(&mut self) -> Received {
        tokio::select! {
            Some(()) = self.interrupt.recv() => Received::Stop("SIGINT"),
            Some(()) = self.terminate.recv() => Received::Stop("SIGTERM"),
            Some(()) = self.hangup.recv() => Received::Stop("SIGHUP"),
            Some(()) = self.resign.recv() => Received::Resign,
            // The signal driver is gone only when the runtime shuts down.
            else => std::future::pending().await,
        }
    }

    /// The next SIGINT, SIGTERM or SIGHUP.
    async fn stop(&mut self) {
        tokio::select! {
            Some(()) = self.interrupt.recv() => {}
            Some(()) = self.terminate.recv() => {}
            Some(()) = self.hangup.recv() => {}
            else => std::future::pending().await,
        }
    }
}

struct Supervisor {
    settings: Run,
    out: Reporter,
    candidate: String,
    signals: Signals,
}

/// Where the supervisor is in its life.
struct State {
    running: Option<Running>,
    /// A term whose command starts at the instant, after a restart delay.
    pending: Option<(Term, Instant)>,
    /// How many times in a row the command exited within [`QUICK_EXIT`].
    quick_exits: u32,
    /// Shutting down: the campaign's end is the program's end.
    stopping: bool,
    exit_code: u8,
    /// Since when this candidate has been without a term, for "elected after …".
    waiting_since: Instant,
    /// Another candidate last reported as leader, so each change is reported once.
    shown_leader: Option<String>,
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
        let mut state = State {
            running: None,
            pending: None,
            quick_exits: 0,
            stopping: false,
            exit_code: 0,
            waiting_since: Instant::now(),
            shown_leader: None,
        };
        loop {
            tokio::select! {
                event = campaign.recv() => match event {
                    Some(event) => self.on_event(event, &mut state, &handle).await,
                    None if state.stopping => {
                        self.out.event("stopped", "stopped; the lock is released", json!({}));
                        return Ok(state.exit_code);
                    }
                    None => return Err(Failure::Runtime("the campaign stopped unexpectedly".into())),
                },
                exited = wait(&mut state.running) => self.on_exit(exited, &mut state, &handle),
                () = due(&state.pending) => {
                    if let Some((term, _)) = state.pending.take() {
                        self.start(&term, &mut state, &handle);
                    }
                }
                received = self.signals.recv() => match received {
                    Received::Stop(name) if !state.stopping => {
                        self.out.event(
                            "stopping",
                            &format!("{name}: shutting down"),
                            json!({ "signal": name }),
                        );
                        shut_down(&mut state, &handle, 0);
                    }
                    Received::Stop(name) => {
                        if let Some(running) = &state.running {
                            self.out.event(
                                "killing",
                                &format!("{name} again: killing the command's process group"),
                                json!({ "signal": name, "pid": running.pid() }),
                            );
                            running.kill_now();
                        }
                    }
                    Received::Resign
                        if (state.running.is_some() || state.pending.is_some()) && !state.stopping =>
                    {
                        self.out.event("resigning", "SIGUSR1: resigning", json!({ "signal": "SIGUSR1" }));
                        let handle = handle.clone();
                        tokio::spawn(async move { handle.resign().await });
                    }
                    Received::Resign => {
                        self.out.event(
                            "resigning",
                            "SIGUSR1: not leading; nothing to resign",
                            json!({ "signal": "SIGUSR1" }),
                        );
                    }
                },
            }
        }
    }

    async fn on_event(
        &mut self,
        event: LeadershipEvent,
        state: &mut State,
        handle: &CampaignHandle,
    ) {
        match event {
            LeadershipEvent::Elected(term) => {
                let token = term.fencing_token();
                let waited = state.waiting_since.elapsed();
                self.out.event(
                    "elected",
                    &format!("elected (fencing token {token}) after {}", human(waited)),
                    json!({ "fencing_token": token, "waited_ms": millis(waited) }),
                );
                state.shown_leader = None;
                if state.stopping {
                    return;
                }
                let delay = restart_delay(state.quick_exits);
                if delay.is_zero() {
                    self.start(&term, state, handle);
                } else {
                    self.out.event(
                        "command_delayed",
                        &format!(
                            "the command exited early {} time(s) in a row; starting it in {}",
                            state.quick_exits,
                            human(delay)
                        ),
                        json!({ "quick_exits": state.quick_exits, "delay_ms": millis(delay) }),
                    );
                    state.pending = Some((term, Instant::now() + delay));
                }
            }
            LeadershipEvent::Demoted {
                fencing_token,
                reason,
            } => {
                state.waiting_since = Instant::now();
                state.pending = None;
                self.out.event(
                    "demoted",
                    &format!("demoted (fencing token {fencing_token}): {reason}"),
                    json!({ "fencing_token": fencing_token, "reason": reason.as_str() }),
                );
                let Some(running) = state.running.take() else {
                    return;
                };
                let pid = running.pid();
                self.out.event(
                    "command_stopping",
                    &format!(
                        "stopping the command: SIGTERM to process group {pid}, SIGKILL after {}",
                        human(self.settings.grace)
                    ),
                    json!({ "pid": pid, "grace_ms": millis(self.settings.grace) }),
                );
                let stopped = running.stop(self.settings.grace, self.signals.stop()).await;
                let status = stopped
                    .status
                    .map(process::describe)
                    .unwrap_or_else(|| "an unknown status".into());
                self.out.event(
                    "command_stopped",
                    &format!(
                        "the command {} after {} with {status}",
                        if stopped.killed { "was killed" } else { "stopped" },
                        human(stopped.took)
                    ),
                    json!({ "pid": pid, "killed": stopped.killed, "took_ms": millis(stopped.took), "status": status }),
                );
                if stopped.hurried && !state.stopping {
                    // A stop signal while the command was being stopped: shut down too.
                    shut_down(state, handle, 0);
                }
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

    /// Starts the command for `term`; shuts down if it cannot be started.
    fn start(&mut self, term: &Term, state: &mut State, handle: &CampaignHandle) {
        if term.is_cancelled() {
            return; // the term ended meanwhile; its Demoted event is on its way
        }
        let s = &self.settings;
        match Running::start(&s.program, &s.args, term, &self.candidate) {
            Ok(running) => {
                self.out.event(
                    "command_started",
                    &format!("started {} (pid {})", s.program.display(), running.pid()),
                    json!({ "pid": running.pid(), "fencing_token": term.fencing_token() }),
                );
                state.running = Some(running);
            }
            Err(e) => {
                self.out.error(&format!(
                    "cannot start {}: {e}; shutting down",
                    s.program.display()
                ));
                shut_down(state, handle, 1);
            }
        }
    }

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
        let uptime = running.uptime();
        let pid = running.pid();
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
        self.out.event(
            "command_exited",
            &format!("the command exited with {status} after {}", human(uptime)),
            json!({ "pid": pid, "status": status, "exit_code": code, "uptime_ms": millis(uptime) }),
        );
        if state.stopping {
            return;
        }
        if self.settings.exit_with_child {
            self.out.event(
                "stopping",
                &format!("--exit-with-child: releasing the lock and exiting with {code}"),
                json!({ "exit_code": code }),
            );
            shut_down(state, handle, code);
        } else {
            self.out.event(
                "resigning",
                "resigning; the command runs again when this process is re-elected",
                json!({}),
            );
            let handle = handle.clone();
            tokio::spawn(async move { handle.resign().await });
        }
    }
}

/// Starts a graceful shutdown: the campaign ends the term (the command is stopped on the
/// `Demoted` event), releases the lock and stops; the program then exits with `code`.
fn shut_down(state: &mut State, handle: &CampaignHandle, code: u8) {
    state.stopping = true;
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

/// Completes when the running command exits; pending while none runs.
async fn wait(running: &mut Option<Running>) -> std::io::Result<std::process::ExitStatus> {
    match running {
        Some(running) => running.wait().await,
        None => std::future::pending().await,
    }
}

/// This host's name, as `incumbent resign` compares it.
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname writes at most that much.
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0;
    let len = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    match std::str::from_utf8(&buf[..len]) {
        Ok(name) if ok && !name.is_empty() => name.to_owned(),
        _ => "localhost".to_owned(),
    }
}
