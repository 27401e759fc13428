//! The command each candidate runs while it leads, and the fenced resource it writes to.
//!
//! The worker appends its history to `<ledger>/w-<pid>-<token>.log` (the token in the name,
//! because pids are reused in a long run), one line per event, each written with one
//! `write(2)` on a file opened for appending, so that a `kill -9` loses nothing already
//! written:
//!
//! ```text
//! start <mono ns> <token> <pid> <supervisor pid>
//! beat <mono ns> ok|stale          (every ~10 ms: one write through the fence)
//! stop <mono ns>                   (on SIGTERM, before exiting)
//! ```
//!
//! Times are `CLOCK_MONOTONIC` nanoseconds, which every process on the host shares.
//!
//! The fence is a file under an exclusive `flock`: read the highest token seen, refuse a
//! lower one, else record the token; every attempt is appended to `<fence>/fence.log` under
//! the lock (`A|R <mono ns> <token> <pid> <highest before>`), so that the log's order is the
//! order in which the fence decided.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// How often the worker writes through the fence.
pub const HEARTBEAT: Duration = Duration::from_millis(10);

/// The environment variable that plants a bug in the worker, to show that the checker
/// catches it: `fence-off` (the fence accepts every token) or `escape` (the worker forks a
/// copy of itself into a session of its own, out of the supervisor's reach, which beats on
/// for up to [`ESCAPE_LIFETIME`]).
pub const PLANT: &str = "CHAOS_PLANT";

/// How long an escaped copy of a planted worker lives.
pub const ESCAPE_LIFETIME: Duration = Duration::from_secs(3);

/// The name of the fence's log in the fence directory.
pub const FENCE_LOG: &str = "fence.log";

/// `CLOCK_MONOTONIC` in nanoseconds: comparable between processes on one host, unlike
/// `std::time::Instant`, whose values are opaque.
pub fn mono_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec, which we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    u64::try_from(now.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(now.tv_nsec).unwrap_or(0)
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigterm(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// Runs the worker until SIGTERM (or SIGKILL): `worker LEDGER_DIR FENCE_DIR`, with
/// `INCUMBENT_FENCING_TOKEN` in the environment. Returns the exit code.
pub fn worker(ledger: &Path, fence_dir: &Path) -> i32 {
    let Some(token) = std::env::var("INCUMBENT_FENCING_TOKEN")
        .ok()
        .and_then(|t| t.parse::<u64>().ok())
    else {
        eprintln!("chaos worker: INCUMBENT_FENCING_TOKEN is missing or not a number");
        return 2;
    };
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe { libc::signal(libc::SIGTERM, on_sigterm as *const () as libc::sighandler_t) };
    let pid = std::process::id();
    // SAFETY: getppid has no preconditions.
    let ppid = unsafe { libc::getppid() };
    let mut log = match OpenOptions::new()
        .create(true)
        .append(true)
        .open(ledger.join(format!("w-{pid}-{token}.log")))
    {
        Ok(log) => log,
        Err(e) => {
            eprintln!("chaos worker: open the ledger in {}: {e}", ledger.display());
            return 1;
        }
    };
    let fence = match Fence::open(fence_dir) {
        Ok(fence) => fence,
        Err(e) => {
            eprintln!(
                "chaos worker: open the fence in {}: {e}",
                fence_dir.display()
            );
            return 1;
        }
    };
    let mut record = |line: String| log.write_all(line.as_bytes()).is_ok();
    if !record(format!("start {} {token} {pid} {ppid}\n", mono_ns())) {
        return 1;
    }
    let mut until = None;
    if std::env::var(PLANT).as_deref() == Ok("escape") {
        // SAFETY: this process has one thread; the child only calls setsid and goes on.
        if unsafe { libc::fork() } == 0 {
            // SAFETY: setsid has no preconditions.
            unsafe { libc::setsid() };
            until = Some(std::time::Instant::now() + ESCAPE_LIFETIME);
        }
    }
    while !STOP.load(Ordering::SeqCst) && until.is_none_or(|t| std::time::Instant::now() < t) {
        let line = match fence.write(token, pid) {
            Ok((at, true)) => format!("beat {at} ok\n"),
            Ok((at, false)) => format!("beat {at} stale\n"),
            Err(e) => {
                eprintln!("chaos worker: fence: {e}");
                return 1;
            }
        };
        if !record(line) {
            return 1;
        }
        std::thread::sleep(HEARTBEAT);
    }
    record(format!("stop {}\n", mono_ns()));
    0
}

/// A resource that refuses writes whose token is below the highest it has accepted.
pub struct Fence {
    lock: File,
    state: PathBuf,
    log: File,
    dir: PathBuf,
}

impl Fence {
    /// Opens (creating) the fence kept in `dir`.
    pub fn open(dir: &Path) -> std::io::Result<Fence> {
        let lock = OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("fence.lock"))?;
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(FENCE_LOG))?;
        Ok(Fence {
            lock,
            state: dir.join("fence.highest"),
            log,
            dir: dir.to_path_buf(),
        })
    }

    /// One write with `token`: under the lock, accepted (and `token` recorded as the highest)
    /// unless a higher token was accepted before. Returns when it was decided and whether it
    /// was accepted.
    pub fn write(&self, token: u64, pid: u32) -> std::io::Result<(u64, bool)> {
        let fd = self.lock.as_raw_fd();
        // SAFETY: flock on a descriptor we own; released below or when the process dies.
        if unsafe { libc::flock(fd, libc::LOCK_EX) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let outcome = self.decide(token, pid);
        // SAFETY: as above.
        unsafe { libc::flock(fd, libc::LOCK_UN) };
        outcome
    }

    fn decide(&self, token: u64, pid: u32) -> std::io::Result<(u64, bool)> {
        let highest: u64 = std::fs::read_to_string(&self.state)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        let at = mono_ns();
        let accepted = token >= highest || std::env::var(PLANT).as_deref() == Ok("fence-off");
        if accepted && token > highest {
            // Replaced by a rename, so that a kill -9 never leaves a torn value behind.
            let next = self.dir.join(format!("fence.highest.{pid}"));
            std::fs::write(&next, token.to_string())?;
            std::fs::rename(&next, &self.state)?;
        }
        let verdict = if accepted { 'A' } else { 'R' };
        (&self.log).write_all(format!("{verdict} {at} {token} {pid} {highest}\n").as_bytes())?;
        Ok((at, accepted))
    }
}
