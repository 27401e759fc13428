//! The member processes of the checker's sharded and set modes: this program again, under a
//! subcommand, each sent SIGKILL on drop if still running.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The member processes of one scenario, by id.
pub struct Processes {
    this: PathBuf,
    dir: PathBuf,
    children: Vec<(String, Child)>,
}

impl Processes {
    /// None yet; `this` is the program, `dir` where each member's stderr goes
    /// (`<dir>/<id>.stderr`).
    pub fn new(this: PathBuf, dir: PathBuf) -> Processes {
        Processes {
            this,
            dir,
            children: Vec::new(),
        }
    }

    /// Starts member `id` as `this ARGS…`; returns its pid.
    pub fn spawn<I, S>(&mut self, id: &str, args: I) -> Result<u32, String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        let log = std::fs::File::create(self.dir.join(format!("{id}.stderr")))
            .map_err(|e| format!("create {id}'s log: {e}"))?;
        let child = Command::new(&self.this)
            .args(args)
            .env("PGUSER", crate::support::postgres::USER)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("start member {id}: {e}"))?;
        let pid = child.id();
        self.children.push((id.to_owned(), child));
        Ok(pid)
    }

    /// Member `id`'s pid (0 when there is none).
    pub fn pid(&self, id: &str) -> u32 {
        self.children
            .iter()
            .find(|(i, _)| i == id)
            .map_or(0, |(_, c)| c.id())
    }

    /// Sends `signal` to member `id`.
    pub fn signal(&self, id: &str, signal: libc::c_int) {
        let pid = self.pid(id) as i32;
        if pid > 0 {
            // SAFETY: kill(2) on a child of ours, by its pid.
            unsafe { libc::kill(pid, signal) };
        }
    }

    /// SIGCONT and SIGTERM to every member, and waits for each (SIGKILL after 10 s).
    pub fn stop_all(&mut self) {
        for (id, _) in &self.children {
            self.signal(id, libc::SIGCONT);
            self.signal(id, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        for (_, child) in &mut self.children {
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        self.children.clear();
    }
}

impl Drop for Processes {
    fn drop(&mut self) {
        for (_, child) in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
