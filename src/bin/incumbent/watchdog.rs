//! A last line of defence that does not depend on the async runtime: a plain thread that
//! SIGKILLs the command's process group at the last instant the lease is surely ours.
//!
//! The supervisor stops the command itself, earlier (SIGTERM when the term ends, SIGKILL at
//! `min(now + grace, stop_by)`). The watchdog covers the case where the supervisor cannot:
//! the runtime's thread is stuck (in a blocking call, a bug), so no loss is seen and no
//! signal is sent, while the store lets the lease expire and hands the lock on. While the
//! command runs, the supervisor keeps the watchdog armed at "last confirmed renewal's send
//! time + ttl − ttl/10" (pushed forward with every renewal); after an involuntary loss, at the
//! term's `stop_by`. A watchdog that fires has nothing to lose: by then the campaign would
//! have fenced itself had it been able to run.
//!
//! What no thread of ours can cover: this whole process frozen (SIGSTOP, a paused VM). Then
//! the command may outlive the lock, and fencing tokens are the defence.

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

/// Starts the watchdog's thread now, so that arming it later allocates nothing new.
/// Returns whether it runs.
pub fn start() -> bool {
    shared().is_some()
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

/// Stops watching `group` (if it is the one watched). Call it as soon as the group's leader
/// has been reaped, before its id can be reused.
pub fn disarm(group: libc::pid_t) {
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
