//! A last line of defence that does not depend on the async runtime: a plain thread that
//! SIGKILLs the command's process group at the last instant the lease is surely ours.
//!
//! The supervisor stops the command itself, earlier (SIGTERM when the term ends, SIGKILL at
//! `min(now + grace, stop_by)`). The watchdog covers the case where the supervisor cannot:
//! the runtime's thread is stuck (in a blocking call, a bug), so no loss is seen and no
//! signal is sent, while the store lets the lease expire and hands the lock on.
//!
//! The watchdog stays armed on every path until the command has exited: it is disarmed only
//! by [`forget`], once the command's process has been reaped. While the command runs, and
//! while it is being stopped after a voluntary end (SIGTERM, SIGINT or SIGHUP to this
//! process, a resign, a shutdown), the supervisor keeps it armed at "last confirmed renewal's
//! send time + ttl − ttl/10", pushed forward with every renewal: the lock is kept and renewed
//! until the command is gone, so a command that takes its `--grace` to stop is not cut
//! short, but if the runtime gets stuck the renewals stop, and a command that ignores SIGTERM
//! is killed before the lease can expire rather than when the grace ends. After an
//! involuntary loss, it is armed at the term's `stop_by`. A watchdog that fires has nothing
//! to lose: by then the campaign would have fenced itself had it been able to run.
//!
//! What no thread of ours can cover: this process dying (a crash, `kill -9`). For that there
//! is the *guardian*: a small process forked once at start, before any command runs, that
//! holds the read end of a pipe whose only write end is ours, and shares one page of memory
//! with us where we store the command's process group at each spawn (and 0 when the command
//! is reaped): a store, no system call, no wake-up. When this process dies, however it dies,
//! the kernel closes the write end; the guardian reads end-of-file and SIGKILLs the group last
//! stored, then exits. This replaces the parent-death signal
//! (`PR_SET_PDEATHSIG`), which needs a hook between `fork` and `exec` and so rules out
//! `posix_spawn`, and covers more: the whole group, not only the command, on every Unix.
//! What it does not cover: this process dying in the microseconds between a spawn's return
//! and the group being stored; and a guardian killed on purpose (it ignores the terminal's
//! signals).
//!
//! What no process of ours can cover: this whole process frozen (SIGSTOP, a paused VM). Then
//! the command may outlive the lock, and fencing tokens are the defence.

use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Instant;

#[derive(Clone, Copy, Debug)]
struct Armed {
    group: libc::pid_t,
    at: Instant,
}

#[derive(Default)]
struct Shared {
    armed: Mutex<Option<Armed>>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Option<Armed>> {
        self.armed.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn shared() -> Option<&'static Arc<Shared>> {
    static SHARED: OnceLock<Option<Arc<Shared>>> = OnceLock::new();
    SHARED
        .get_or_init(|| {
            let shared = Arc::new(Shared::default());
            let watched = shared.clone();
            std::thread::Builder::new()
                .name("incumbent-watchdog".into())
                .spawn(move || watch(&watched))
                .ok()?;
            Some(shared)
        })
        .as_ref()
}

/// Starts the watchdog's thread and the guardian process now, before any command runs, so
/// that arming them later allocates nothing new. Returns whether both run.
pub fn start() -> bool {
    shared().is_some() && guardian().is_some()
}

/// What this process shares with the guardian.
struct Guardian {
    /// The group the guardian kills when this process dies (0: none), in a page of memory
    /// shared with it: telling it is a store, with no system call and no wake-up.
    group: &'static AtomicI32,
    /// The write end of the pipe whose end-of-file tells the guardian this process is gone.
    /// Nothing is ever written to it.
    _alive: OwnedFd,
}

/// The guardian, once it runs.
fn guardian() -> Option<&'static Guardian> {
    static GUARDIAN: OnceLock<Option<Guardian>> = OnceLock::new();
    GUARDIAN.get_or_init(start_guardian).as_ref()
}

/// Has the guardian kill process group `group` if this process dies. One group at a time.
pub fn guard(group: libc::pid_t) {
    if group > 1
        && let Some(guardian) = guardian()
    {
        guardian.group.store(group, Ordering::SeqCst);
    }
}

/// The guardian forgets `group` (if it is the one guarded).
fn unguard(group: libc::pid_t) {
    if let Some(guardian) = guardian() {
        let _ = guardian
            .group
            .compare_exchange(group, 0, Ordering::SeqCst, Ordering::SeqCst);
    }
}

/// Forks the guardian (see the module docs). `None` if the shared page, the pipe or the fork
/// could not be had.
fn start_guardian() -> Option<Guardian> {
    // SAFETY: a fresh anonymous mapping, never unmapped: the reference lives as long as the
    // process. An AtomicI32 needs 4 bytes, aligned to 4; a page is both.
    let page = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if page == libc::MAP_FAILED {
        return None;
    }
    // SAFETY: see above; the page is zeroed, a valid AtomicI32 of 0.
    let group: &'static AtomicI32 = unsafe { &*page.cast::<AtomicI32>() };
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` has room for the two descriptors pipe writes.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        return None;
    }
    let [read, write] = fds;
    // Close-on-exec, so that no command holds the write end open (`pipe2` is Linux's; at
    // start nothing else spawns meanwhile). SAFETY: both descriptors are ours.
    unsafe {
        libc::fcntl(read, libc::F_SETFD, libc::FD_CLOEXEC);
        libc::fcntl(write, libc::F_SETFD, libc::FD_CLOEXEC);
    }
    // SAFETY: the child runs only `guardian_main`, which makes async-signal-safe system calls
    // and never returns, allocates, or touches a lock (this process has other threads).
    match unsafe { libc::fork() } {
        0 => unsafe { guardian_main(read, write, group) },
        -1 => {
            // SAFETY: both descriptors are ours and closed once.
            unsafe {
                libc::close(read);
                libc::close(write);
            }
            None
        }
        _ => {
            // SAFETY: `read` is ours and closed once; `write` is ours, owned from here on.
            unsafe {
                libc::close(read);
                Some(Guardian {
                    group,
                    _alive: OwnedFd::from_raw_fd(write),
                })
            }
        }
    }
}

/// The guardian: waits for this process's end (end-of-file on the pipe), then SIGKILLs the
/// group last stored in the shared page.
///
/// # Safety
/// Only in the child of a `fork`, with `read` and `write` the ends of the guardian's pipe.
unsafe fn guardian_main(read: libc::c_int, write: libc::c_int, group: &AtomicI32) -> ! {
    // SAFETY: async-signal-safe system calls on descriptors and signals of this process.
    unsafe {
        libc::close(write);
        // The terminal's signals reach the whole foreground group, this process included:
        // the guardian outlives them, and ends only with the supervisor.
        for signal in [
            libc::SIGINT,
            libc::SIGTERM,
            libc::SIGHUP,
            libc::SIGQUIT,
            libc::SIGUSR1,
            libc::SIGUSR2,
            libc::SIGPIPE,
        ] {
            libc::signal(signal, libc::SIG_IGN);
        }
        let mut byte = 0u8;
        // Nothing is ever written: read returns at end-of-file, when the supervisor is gone.
        while libc::read(read, (&raw mut byte).cast(), 1) == -1
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR)
        {}
        let group = group.load(Ordering::SeqCst);
        if group > 1 {
            libc::kill(-group, libc::SIGKILL);
        }
        libc::_exit(0)
    }
}

/// Kills process group `group` at `at` unless disarmed (or re-armed) before. Re-arming
/// replaces the instant, later or earlier.
pub fn arm(group: libc::pid_t, at: Instant) {
    if group <= 1 {
        return;
    }
    if let Some(shared) = shared() {
        *shared.lock() = Some(Armed { group, at });
        shared.changed.notify_all();
    }
}

/// Forgets `group` altogether: the watchdog is disarmed and the guardian no longer guards it.
/// Call it as soon as the group's leader has been reaped, before its id can be reused.
pub fn forget(group: libc::pid_t) {
    unguard(group);
    disarm(group);
}

/// Stops watching `group` (if it is the one watched); the guardian still guards it. Only
/// [`forget`] calls it, once the group's leader has been reaped: a command that is still
/// running, even one being stopped, stays watched.
fn disarm(group: libc::pid_t) {
    if let Some(shared) = shared() {
        let mut armed = shared.lock();
        if armed.is_some_and(|a| a.group == group) {
            *armed = None;
            shared.changed.notify_all();
        }
    }
}

fn watch(shared: &Shared) {
    let mut armed = shared.lock();
    loop {
        armed = match *armed {
            None => shared
                .changed
                .wait(armed)
                .unwrap_or_else(PoisonError::into_inner),
            Some(Armed { group, at }) => {
                let now = Instant::now();
                if now >= at {
                    // Under the lock: `disarm` cannot slip in between the check and the kill.
                    // SAFETY: kill has no memory-safety preconditions; a negative pid names
                    // a process group, and `group > 1` (see `arm`).
                    unsafe {
                        libc::kill(-group, libc::SIGKILL);
                    }
                    *armed = None;
                    armed
                } else {
                    shared
                        .changed
                        .wait_timeout(armed, at - now)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::CommandExt;
    use std::process::{Command, Stdio};
    use std::time::Duration;

    use super::*;

    /// Whether the child has exited, waiting at most `limit`.
    fn exits_within(child: &mut std::process::Child, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if matches!(child.try_wait(), Ok(Some(_))) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    // One test for both: the watchdog is one per process.
    #[test]
    fn kills_the_group_at_the_instant_unless_disarmed_first() {
        let spawn = || {
            Command::new("sleep")
                .arg("60")
                .stdin(Stdio::null())
                .process_group(0)
                .spawn()
                .expect("spawn sleep")
        };
        let pid = |child: &std::process::Child| libc::pid_t::try_from(child.id()).expect("pid");

        let mut spared = spawn();
        arm(pid(&spared), Instant::now() + Duration::from_millis(200));
        disarm(pid(&spared));
        assert!(!exits_within(&mut spared, Duration::from_millis(600)));
        let _ = spared.kill();
        let _ = spared.wait();

        let mut doomed = spawn();
        let armed = Instant::now();
        arm(pid(&doomed), armed + Duration::from_secs(60));
        // Re-arming moves the instant, earlier too.
        arm(pid(&doomed), armed + Duration::from_millis(200));
        assert!(exits_within(&mut doomed, Duration::from_secs(5)));
        assert!(armed.elapsed() >= Duration::from_millis(200));
    }
}
