//! A server child process: spawn, readiness, signals, restart, kill on drop.

use std::fs::OpenOptions;
use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc;
use std::time::Duration;

use super::http;

/// How long a server may take to become ready.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// How many log lines a failure report shows.
const LOG_TAIL_LINES: usize = 40;

/// How to tell that a server is ready to serve.
#[derive(Clone, Copy, Debug)]
pub enum Probe {
    /// `GET path` on `addr` answers 200 with a body that `check` accepts.
    Http {
        /// The server's HTTP address.
        addr: SocketAddr,
        /// The path to fetch.
        path: &'static str,
        /// Whether the body says "ready".
        check: fn(&str) -> bool,
    },
    /// A TCP connection to `addr` is accepted (a TLS-only server; the caller checks more).
    Tcp {
        /// The server's address.
        addr: SocketAddr,
    },
}

impl Probe {
    /// Whether the server answers as ready now.
    pub async fn is_ready(&self) -> bool {
        match *self {
            Probe::Http { addr, path, check } => http::get(addr, path)
                .await
                .is_ok_and(|response| response.status == 200 && check(&response.body)),
            Probe::Tcp { addr } => tokio::net::TcpStream::connect(addr).await.is_ok(),
        }
    }

    /// The address probed.
    pub fn addr(&self) -> SocketAddr {
        match *self {
            Probe::Http { addr, .. } | Probe::Tcp { addr } => addr,
        }
    }
}

/// Whether the socket listening on `addr`'s port belongs to `pid` or one of its
/// descendants, or to this process: `None` when no listener is found or `/proc` cannot tell.
fn listener_owner(addr: SocketAddr, pid: u32) -> Option<bool> {
    let table = if addr.is_ipv4() {
        "/proc/net/tcp"
    } else {
        "/proc/net/tcp6"
    };
    let port = format!("{:04X}", addr.port());
    // Lines: `sl local_address rem_address st ... uid timeout inode`; state 0A is LISTEN.
    // Kept as the links a descriptor of such a socket reads: `socket:[inode]`.
    let sockets: Vec<String> = std::fs::read_to_string(table)
        .ok()?
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (_, local_port) = fields.get(1)?.rsplit_once(':')?;
            (local_port == port && *fields.get(3)? == "0A")
                .then(|| fields.get(9).map(|inode| format!("socket:[{inode}]")))?
        })
        .collect();
    if sockets.is_empty() {
        return None;
    }
    // The sockets a process holds; `None` when its descriptors cannot be read (another
    // user's process, `/proc` mounted with `hidepid`).
    let holds = |member: libc::pid_t| -> Option<bool> {
        let fds = std::fs::read_dir(format!("/proc/{member}/fd")).ok()?;
        Some(
            fds.filter_map(Result::ok)
                .filter_map(|fd| std::fs::read_link(fd.path()).ok())
                .any(|link| sockets.iter().any(|s| link.to_str() == Some(s.as_str()))),
        )
    };
    if libc::pid_t::try_from(std::process::id()).is_ok_and(|me| holds(me) == Some(true)) {
        return Some(true);
    }
    let seen: Vec<bool> = family(pid).into_iter().filter_map(holds).collect();
    if seen.is_empty() {
        return None;
    }
    Some(seen.contains(&true))
}

/// A running (or deliberately stopped) server process, killed on drop.
/// Its stdout and stderr go to `<dir>/<name>.log`.
pub struct ServerProcess {
    name: String,
    program: PathBuf,
    args: Vec<String>,
    log_path: PathBuf,
    probe: Probe,
    child: Option<Child>,
}

impl ServerProcess {
    /// Spawns `program args` without waiting for it to be ready (see
    /// `wait_ready`), logging to `<dir>/<name>.log`.
    pub fn spawn(
        name: &str,
        program: PathBuf,
        args: Vec<String>,
        dir: &Path,
        probe: Probe,
    ) -> Self {
        let mut process = ServerProcess {
            name: name.to_owned(),
            program,
            args,
            log_path: dir.join(format!("{name}.log")),
            probe,
            child: None,
        };
        process.start_child();
        process
    }

    /// Waits until the probe succeeds; panics with the log tail when the
    /// process exits or `READY_TIMEOUT` passes first.
    pub async fn wait_ready(&mut self) {
        if let Err(why) = self.try_wait_ready().await {
            panic!("{why}");
        }
    }

    /// Waits until the probe succeeds; the log tail as the error when the process exits
    /// (e.g. a port taken between choosing it and binding it) or `READY_TIMEOUT` passes
    /// first. A process that exited is reaped; one that timed out is killed.
    pub async fn try_wait_ready(&mut self) -> Result<(), String> {
        let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
        loop {
            if self.probe.is_ready().await {
                // The probe may have reached another process's server that took the port
                // between our choosing it and our server binding it (tests run as many
                // processes at once): that one would answer for ours, and two tests would
                // share a store.
                self.verify_listener(self.probe.addr())?;
                return Ok(());
            }
            if let Some(status) = self.child_mut().try_wait().expect("try_wait") {
                self.child = None;
                return Err(format!(
                    "{} exited during startup ({status})\n{}",
                    self.name,
                    self.log_tail()
                ));
            }
            if tokio::time::Instant::now() >= deadline {
                let tail = self.log_tail();
                self.kill9();
                return Err(format!(
                    "{} not ready after {READY_TIMEOUT:?}\n{tail}",
                    self.name
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Checks that the socket listening on `addr` is this server's (its process or a
    /// descendant) or this test process's own (a probe of the harness), not another
    /// process's that took the port first; if not, stops the server and says so.
    pub fn verify_listener(&mut self, addr: SocketAddr) -> Result<(), String> {
        let Some(pid) = self.pid() else {
            return Ok(());
        };
        if listener_owner(addr, pid) != Some(false) {
            return Ok(());
        }
        let tail = self.log_tail();
        self.kill9();
        Err(format!(
            "{}: {addr} answers, but another process listens there (the port was taken)\n{tail}",
            self.name
        ))
    }

    /// The process id, while the process runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the process and its descendants (a server's own children, such as
    /// PostgreSQL's backends) with SIGKILL and reaps it; a no-op when stopped.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let killed = family(child.id());
            for &pid in &killed {
                // SAFETY: kill(2) on our own unreaped child and its descendants.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            // Fails only if it already exited; `wait` reaps it either way.
            let _ = child.kill();
            child.wait().expect("wait for killed server");
            // The descendants are reaped by init, a moment later: until they are gone they
            // may hold what a restart needs (PostgreSQL's backends its shared memory).
            let deadline = std::time::Instant::now() + Duration::from_secs(2);
            while killed.iter().any(|&pid| alive(pid)) && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }

    /// Freezes the process and its descendants (PostgreSQL's backends, each a process group
    /// of its own) with SIGSTOP: it keeps its sockets but answers nothing.
    pub fn pause(&self) {
        self.signal(libc::SIGSTOP);
        // kill(2) returns before every thread has stopped: a request sent at once could
        // still be answered by a thread on the other core. Wait until all are stopped.
        let pid = self.pid().expect("paused process runs");
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        while !all_threads_stopped(pid) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Thaws a paused process and its descendants with SIGCONT.
    pub fn resume(&self) {
        self.signal(libc::SIGCONT);
    }

    /// Kills the process if it runs, starts it again with the same arguments
    /// (so the same ports and data directory) and waits until it is ready.
    ///
    /// A start that fails at once is tried again, a few times, 200 ms apart: a descendant of
    /// the killed process forked after its family was listed can outlive it for a moment
    /// (PostgreSQL then refuses to start: "pre-existing shared memory block is still in
    /// use").
    pub async fn restart(&mut self) {
        self.kill9();
        let mut failures = Vec::new();
        for _ in 0..5 {
            self.start_child();
            match self.try_wait_ready().await {
                Ok(()) => return,
                Err(why) => failures.push(why),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!(
            "{} did not start again after 5 tries:\n{}",
            self.name,
            failures.join("\n")
        );
    }

    /// The last lines of the log, headed by the log's path.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log_path).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n");
        format!("--- last lines of {} ---\n{tail}", self.log_path.display())
    }

    fn start_child(&mut self) {
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .expect("open server log");
        writeln!(
            log,
            "--- {} {}",
            self.program.display(),
            self.args.join(" ")
        )
        .expect("write server log");
        let mut command = Command::new(&self.program);
        // Its own process group: signals reach the server's children too.
        command
            .process_group(0)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log file"))
            .stderr(log);
        let child = spawn_tied_to_process(command).unwrap_or_else(|err| {
            panic!(
                "cannot start {} ({}): {err}",
                self.name,
                self.program.display()
            )
        });
        self.child = Some(child);
    }

    fn child_mut(&mut self) -> &mut Child {
        let name = &self.name;
        self.child
            .as_mut()
            .unwrap_or_else(|| panic!("{name} is not running"))
    }

    fn signal(&self, signal: libc::c_int) {
        let pid = self
            .pid()
            .unwrap_or_else(|| panic!("{} is not running", self.name));
        // The process first: a stopped server forks no new children.
        let root = libc::pid_t::try_from(pid).expect("pid fits pid_t");
        // SAFETY: kill(2) on our own child, which is not reaped yet.
        let rc = unsafe { libc::kill(root, signal) };
        for descendant in family(pid).into_iter().filter(|&p| p != root) {
            // SAFETY: kill(2) on a descendant of our own child.
            unsafe { libc::kill(descendant, signal) };
        }
        assert_eq!(
            rc,
            0,
            "signal {signal} to {}: {}",
            self.name,
            std::io::Error::last_os_error()
        );
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.log_tail());
        }
        self.kill9();
    }
}

type SpawnJob = (Command, mpsc::Sender<std::io::Result<Child>>);

/// Spawns `command` so that it gets SIGKILL when this test process dies, even
/// without unwinding (e.g. a harness timeout). The kernel ties that signal to
/// the spawning *thread*, so spawning happens on one thread that lives as long
/// as the process, not on a test thread that ends with its test.
fn spawn_tied_to_process(mut command: Command) -> std::io::Result<Child> {
    static SPAWNER: OnceLock<mpsc::Sender<SpawnJob>> = OnceLock::new();
    // SAFETY: the pre-exec hook only calls the async-signal-safe prctl(2).
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
    let spawner = SPAWNER.get_or_init(|| {
        let (jobs, receiver) = mpsc::channel::<SpawnJob>();
        std::thread::Builder::new()
            .name("server-spawner".into())
            .spawn(move || {
                for (mut command, reply) in receiver {
                    let _ = reply.send(command.spawn());
                }
            })
            .expect("start the server-spawner thread");
        jobs
    });
    let (reply, result) = mpsc::channel();
    spawner
        .send((command, reply))
        .expect("server-spawner thread is gone");
    result.recv().expect("server-spawner thread is gone")
}

/// Whether every thread of `pid` and of its descendants is stopped (state `T` in
/// `/proc/<pid>/task/*/stat`).
fn all_threads_stopped(pid: u32) -> bool {
    family(pid)
        .into_iter()
        .filter_map(|p| u32::try_from(p).ok())
        .all(threads_stopped)
}

/// `pid` and its descendants, read from `/proc/*/stat` (the parent is field 4).
/// Whether `pid` still runs (a zombie counts as gone: it holds nothing).
fn alive(pid: libc::pid_t) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let (_, rest) = stat.rsplit_once(") ")?;
            rest.chars().next()
        })
        .is_some_and(|state| state != 'Z' && state != 'X')
}

fn family(pid: u32) -> Vec<libc::pid_t> {
    let parents: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let child: u32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).ok()?;
            let (_, rest) = stat.rsplit_once(") ")?;
            Some((child, rest.split(' ').nth(1)?.parse().ok()?))
        })
        .collect();
    let mut family = vec![pid];
    let mut i = 0;
    while i < family.len() {
        let parent = family[i];
        family.extend(
            parents
                .iter()
                .filter(|(_, p)| *p == parent)
                .map(|(child, _)| *child),
        );
        i += 1;
    }
    family
        .into_iter()
        .filter_map(|p| libc::pid_t::try_from(p).ok())
        .collect()
}

/// Whether every thread of `pid` is stopped.
fn threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return true;
    };
    tasks.filter_map(Result::ok).all(|task| {
        std::fs::read_to_string(task.path().join("stat")).is_ok_and(|stat| {
            // The state follows the command's closing parenthesis.
            stat.rsplit_once(") ")
                .is_some_and(|(_, rest)| rest.starts_with('T') || rest.starts_with('t'))
        })
    })
}

/// Starts a server with `start` until it comes up, at most 3 times: a free port can be taken
/// by another process between choosing it and the server binding it (eight tests at a time
/// open many connections), and each try chooses new ports. Panics with every try's log.
pub async fn start_with_retries<T, Fut>(what: &str, mut start: impl FnMut() -> Fut) -> T
where
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let mut failures = Vec::new();
    for _ in 0..3 {
        match start().await {
            Ok(server) => return server,
            Err(why) => failures.push(why),
        }
    }
    panic!(
        "{what} did not start in 3 tries:\n{}",
        failures.join("\n---\n")
    );
}
