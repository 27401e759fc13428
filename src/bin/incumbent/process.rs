//! The command `incumbent run` supervises: started in a process group of its own, tied to
//! this process's life, and stopped as a group.

use std::ffi::OsString;
use std::future::Future;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use incumbent::{Term, TermGuard};
use tokio::process::{Child, Command};
use tokio::time::{Instant, timeout};

use crate::report::rfc3339;

/// Finds the program to run: a path with a `/` must be an executable file; a bare name is
/// looked up on `PATH`. Checked once at start, so that a typo fails at once (exit code 2)
/// rather than when this process is first elected.
pub fn resolve(command: &[OsString]) -> Result<PathBuf, String> {
    let Some(program) = command.first().filter(|p| !p.is_empty()) else {
        return Err(
            "no command given after `--`; write e.g. incumbent run --election NAME -- ./worker"
                .into(),
        );
    };
    let path = Path::new(program);
    if program.as_encoded_bytes().contains(&b'/') {
        return if is_executable(path) {
            Ok(path.to_owned())
        } else {
            Err(format!(
                "cannot run {}: it is not an executable file",
                path.display()
            ))
        };
    }
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|dir| dir.join(path))
        .find(|candidate| is_executable(candidate))
        .ok_or_else(|| {
            format!(
                "cannot run {}: not found on PATH; give its path",
                path.display()
            )
        })
}

fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The command, running for one term.
#[derive(Debug)]
pub struct Running {
    child: Child,
    /// The child's pid, which is also its process group's id.
    group: libc::pid_t,
    started: Instant,
    /// Keeps the lock from being released until the command is gone (up to the election's
    /// grace, which is longer than the command's).
    _guard: TermGuard,
}

/// How a command ended when it was stopped.
#[derive(Debug)]
pub struct Stopped {
    /// The command's exit status, if it could be collected.
    pub status: Option<ExitStatus>,
    /// Whether it had to be killed (the grace ran out, or `hurry` completed).
    pub killed: bool,
    /// Whether `hurry` completed before the command exited.
    pub hurried: bool,
    /// How long stopping took.
    pub took: Duration,
}

impl Running {
    /// Starts `program args` for `term`, with the term in its environment.
    ///
    /// Must be called from the main thread (see `main`): on Linux the command is killed when
    /// the thread that started it exits.
    pub fn start(
        program: &Path,
        args: &[OsString],
        term: &Term,
        candidate: &str,
    ) -> io::Result<Running> {
        let mut command = Command::new(program);
        command
            .args(args)
            .env("INCUMBENT_ELECTION", term.election())
            .env("INCUMBENT_CANDIDATE", candidate)
            .env("INCUMBENT_FENCING_TOKEN", term.fencing_token().to_string())
            .env("INCUMBENT_TERM_STARTED", rfc3339(term.started_at()))
            // Its own process group: signalled as one on loss; and not in the terminal's
            // foreground group, so a Ctrl-C reaches only us, and we stop it in order.
            .process_group(0)
            // A background group reading the terminal would be stopped by SIGTTIN.
            .stdin(Stdio::null())
            .kill_on_drop(true);
        die_with_parent(&mut command);
        let guard = term.hold();
        let child = command.spawn()?;
        let group = child
            .id()
            .and_then(|id| libc::pid_t::try_from(id).ok())
            .ok_or_else(|| io::Error::other("the command exited before it could be watched"))?;
        Ok(Running {
            child,
            group,
            started: Instant::now(),
            _guard: guard,
        })
    }

    /// The command's pid.
    pub fn pid(&self) -> libc::pid_t {
        self.group
    }

    /// How long it has been running.
    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    /// Completes when the command exits by itself.
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        self.child.wait().await
    }

    /// Kills whatever is left of the command's process group, after the command exited.
    pub fn sweep(&self) {
        signal_group(self.group, libc::SIGKILL);
    }

    /// SIGKILL to the whole group, now.
    pub fn kill_now(&self) {
        signal_group(self.group, libc::SIGKILL);
    }

    /// Stops the command: SIGTERM to its group, up to `grace` for it to exit (or until
    /// `hurry` completes), then SIGKILL to the group. Anything left in the group is killed
    /// once the command is gone. Dropping the result releases the term's guard.
    pub async fn stop(mut self, grace: Duration, hurry: impl Future<Output = ()>) -> Stopped {
        let began = Instant::now();
        signal_group(self.group, libc::SIGTERM);
        let (exited, hurried) = tokio::select! {
            exited = timeout(grace, self.child.wait()) => (exited.ok(), false),
            () = hurry => (None, true),
        };
        let (status, killed) = match exited {
            Some(status) => (status.ok(), false),
            None => {
                signal_group(self.group, libc::SIGKILL);
                (self.child.wait().await.ok(), true)
            }
        };
        self.sweep();
        Stopped {
            status,
            killed,
            hurried,
            took: began.elapsed(),
        }
    }
}

/// Sends `signal` to every process in group `group`. A group that is already gone is fine.
fn signal_group(group: libc::pid_t, signal: libc::c_int) {
    // SAFETY: kill has no memory-safety preconditions; a negative pid names a process group.
    unsafe {
        libc::kill(-group, signal);
    }
}

/// On Linux, has the kernel SIGKILL the command when this process dies, however it dies.
#[cfg(target_os = "linux")]
fn die_with_parent(command: &mut Command) {
    let parent = libc::pid_t::try_from(std::process::id()).unwrap_or(0);
    // SAFETY: the closure runs in the child between fork and exec, and makes only
    // async-signal-safe system calls (prctl, getppid), without allocating.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) == -1
            {
                return Err(io::Error::last_os_error());
            }
            // We died between fork and prctl: the signal will never come, so do not start.
            if libc::getppid() != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// Elsewhere there is no parent-death signal: the command outlives a `kill -9` of this
/// process (a graceful stop still stops it).
#[cfg(not(target_os = "linux"))]
fn die_with_parent(_command: &mut Command) {}

/// The exit code a shell would report: the status, or 128 + the signal that killed it.
pub fn exit_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(1),
        (None, Some(signal)) => u8::try_from((128 + signal) & 0xff).unwrap_or(1),
        (None, None) => 1,
    }
}

/// `exit code 3`, `signal 15 (SIGTERM)`.
pub fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(signal)) => format!("signal {signal}{}", signal_name(signal)),
        (None, None) => "an unknown status".into(),
    }
}

fn signal_name(signal: libc::c_int) -> &'static str {
    match signal {
        libc::SIGTERM => " (SIGTERM)",
        libc::SIGKILL => " (SIGKILL)",
        libc::SIGINT => " (SIGINT)",
        libc::SIGHUP => " (SIGHUP)",
        libc::SIGSEGV => " (SIGSEGV)",
        libc::SIGABRT => " (SIGABRT)",
        _ => "",
    }
}
