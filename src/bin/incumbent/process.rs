//! The command `incumbent run` supervises: started in a process group of its own, tied to
//! this process's life (by the guardian process of [`watchdog`]), and stopped as a group.

use std::ffi::OsString;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use incumbent::{Term, TermGuard};
use tokio::process::{Child, Command};
use tokio::time::Instant;

use crate::report::rfc3339;
use crate::watchdog;

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

/// Environment variables that carry the store's credentials (or say where to find them):
/// the command does not inherit them unless `--pass-credentials` asks for it.
pub const CREDENTIAL_VARIABLES: &[&str] = &[
    "INCUMBENT_ETCD_USER",
    "INCUMBENT_ETCD_PASSWORD",
    "INCUMBENT_CONSUL_TOKEN",
    "ETCDCTL_USER",
    "ETCDCTL_PASSWORD",
    "CONSUL_HTTP_TOKEN",
    "CONSUL_HTTP_TOKEN_FILE",
    "CONSUL_HTTP_AUTH",
    "INCUMBENT_ZK_AUTH",
    "REDISCLI_AUTH",
    "PGPASSWORD",
    "PGPASSFILE",
];

/// Prefixes of further variables of the same kind (the store settings `incumbent` reads).
const CREDENTIAL_PREFIXES: &[&str] = &[
    "INCUMBENT_ETCD_",
    "INCUMBENT_CONSUL_",
    "INCUMBENT_ZK_",
    "INCUMBENT_REDIS_",
    "INCUMBENT_PG_",
];

/// The variables of this process's environment that the command must not inherit: read once,
/// at start, so that nothing is left to do between a win and the spawn.
pub fn credentials_in_env() -> Vec<OsString> {
    std::env::vars_os()
        .map(|(name, _)| name)
        .filter(|name| is_credential(name))
        .collect()
}

/// Whether the variable `name` carries (or locates) the store's credentials.
pub fn is_credential(name: &std::ffi::OsStr) -> bool {
    let Some(name) = name.to_str() else {
        return false;
    };
    CREDENTIAL_VARIABLES.contains(&name) || CREDENTIAL_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// The command, running for one term.
#[derive(Debug)]
pub struct Running {
    child: Child,
    /// The child's pid, which is also its process group's id.
    group: libc::pid_t,
    started: Instant,
    /// The term the command runs for.
    term: Term,
    /// Whether the command's exit status has been collected (its pid may be reused since).
    reaped: bool,
    /// Keeps the lock from being released until the command is gone (up to the election's
    /// grace, which is longer than the command's).
    _guard: TermGuard,
}

/// What happened to a running command.
#[derive(Debug)]
pub enum Next {
    /// It exited by itself (its status collected).
    Exited(io::Result<ExitStatus>),
    /// Its term ended: stop it.
    TermEnded,
}

impl Running {
    /// Starts `program args` for `term`, with the term in its environment, and without the
    /// variables in `removed` (the store's credentials, see [`credentials_in_env`]).
    ///
    /// The spawn is a `posix_spawn` (a `vfork`-style clone on Linux: no copy of this
    /// process's page tables), which returns once the program has been executed: nothing
    /// runs in the child between the clone and the `exec` but setting the process group. The
    /// guardian process (see [`watchdog`]) is told the group at once, so that it kills the
    /// group if this process dies, however it dies.
    pub fn start(
        program: &Path,
        args: &[OsString],
        term: &Term,
        candidate: &str,
        removed: &[OsString],
    ) -> io::Result<Running> {
        let mut command = Command::new(program);
        for name in removed {
            command.env_remove(name);
        }
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
        // No `pre_exec` hook: with one, the standard library would fork and copy this
        // process's page tables instead of using posix_spawn.
        let guard = term.hold();
        let child = command.spawn()?;
        let group = child
            .id()
            .and_then(|id| libc::pid_t::try_from(id).ok())
            .filter(|&id| id > 1)
            .ok_or_else(|| io::Error::other("the command exited before it could be watched"))?;
        watchdog::guard(group);
        Ok(Running {
            child,
            group,
            started: Instant::now(),
            term: term.clone(),
            reaped: false,
            _guard: guard,
        })
    }

    /// The command's pid, which is also its process group's id.
    pub fn pid(&self) -> libc::pid_t {
        self.group
    }

    /// The term it runs for.
    pub fn term(&self) -> &Term {
        &self.term
    }

    /// How long it has been running.
    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    /// Completes when the command exits by itself, or when its term ends, whichever first.
    pub async fn next(&mut self) -> Next {
        let term = self.term.clone();
        tokio::select! {
            biased;
            () = term.cancelled() => Next::TermEnded,
            exited = self.wait() => Next::Exited(exited),
        }
    }

    /// Completes when the command exits; the watchdog and the guardian forget its group at once.
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        let exited = self.child.wait().await;
        if exited.is_ok() {
            self.reaped = true;
            // The pid (and so the group's id) may be reused from now on. The window between
            // the reaping just done and this call is a few instructions; the kernel hands
            // out pids in order, so a reuse within it would need all pids to wrap around.
            watchdog::forget(self.group);
        }
        exited
    }

    /// SIGTERM to the whole group, now.
    pub fn terminate(&self) {
        if !self.reaped {
            signal_group(self.group, libc::SIGTERM);
        }
    }

    /// SIGKILL to the whole group, now.
    pub fn kill_now(&self) {
        if !self.reaped {
            signal_group(self.group, libc::SIGKILL);
        }
    }

    /// Kills whatever is left of the command's process group, after the command exited.
    pub fn sweep(&self) {
        // Right after the reaping: processes left in the group keep its id in use.
        signal_group(self.group, libc::SIGKILL);
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if !self.reaped {
            // Not only the command (kill_on_drop): everything in its group.
            signal_group(self.group, libc::SIGKILL);
        }
        watchdog::forget(self.group);
    }
}

/// Sends `signal` to every process in group `group`. A group that is already gone is fine.
fn signal_group(group: libc::pid_t, signal: libc::c_int) {
    if group <= 1 {
        return; // -1 would mean every process we may signal
    }
    // SAFETY: kill has no memory-safety preconditions; a negative pid names a process group.
    unsafe {
        libc::kill(-group, signal);
    }
}

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
