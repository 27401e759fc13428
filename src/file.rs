//! The embedded default: processes on one host elect through an OS advisory lock on a file.
//!
//! Each election is three files in a directory (default `$TMPDIR/incumbent`, see
//! [`FileBackend::in_dir`]), named after the election with `/` written as `+`:
//!
//! - `<name>.lock`: the lock. The leader holds an exclusive `flock` on it; waiting candidates
//!   block in the kernel (in a thread of their own), so a released lock is handed to the next
//!   waiter at once, with no polling. When a leader crashes, even by `kill -9`, the kernel
//!   releases its lock.
//! - `<name>.token`: the fencing token counter, read, incremented and `fsync`ed under the lock
//!   before the new leader is reported, so tokens only grow, across crashes and restarts.
//! - `<name>.leader`: the leader's identity, metadata, token and start time as JSON, replaced
//!   atomically (write, then rename) by each new leader. Others read it to see who leads.
//!
//! There is no session to expire: the lock lives as long as the process (or until released).
//! A leader checks every [`LOCK_CHECK_INTERVAL`] that its lock file is still the one at the
//! path, and reports [`LockLoss::Deleted`] if someone removed or replaced it. Never delete the
//! lock files while candidates run: a deleted lock file lets a second process lock a new one.
//!
//! Observers (and followers, for `LeaderChanged` events) read the leader file every
//! [`OBSERVE_INTERVAL`] and test the lock with a shared, non-blocking `flock`.
//!
//! All candidates must see the same directory on a local file system: `flock` over NFS is
//! not reliable. Unix only.
//!
//! A follower blocks in `flock` on a thread of its own (not tokio's blocking pool), and a
//! blocking call cannot be cancelled: shutting the campaign down leaves that thread waiting
//! until the lock is free (it then lets go at once). Since the thread is not the runtime's,
//! dropping the runtime does not wait for it: a follower's process exits at once, under
//! `#[tokio::main]` too, and the kernel drops the queued `flock` with the process.
//!
//! ```no_run
//! # #[tokio::main] async fn main() -> incumbent::Result<()> {
//! use incumbent::{Election, file::FileBackend};
//!
//! let election = Election::builder(FileBackend::in_dir("/run/myapp/elections"), "indexer")
//!     .candidate("worker-1")
//!     .build()?;
//! election.run(|term| async move { term.cancelled().await }).await?;
//! # Ok(()) }
//! ```

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{ErrorKind, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio::time::{Instant, sleep};

use crate::backend::keepalive::{KeepAlive, Renewal};
use crate::backend::{
    Attempt, Backend, BackendInfo, Candidate, Contender, FencingToken, Leader, LockLoss, Observer,
    Session, SessionHealth, SessionOptions, unix_ms_now,
};
use crate::{Error, Result};

const NAME: &str = "file";

/// How often a leader checks that its lock file is still the one at the path.
pub const LOCK_CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// How often observers read the leader file.
pub const OBSERVE_INTERVAL: Duration = Duration::from_millis(500);

/// Elections among the processes of one host, through lock files in one directory.
#[derive(Clone, Debug)]
pub struct FileBackend {
    dir: Arc<PathBuf>,
}

impl Default for FileBackend {
    fn default() -> Self {
        Self::new()
    }
}

/// The URL form, for messages.
const URL_FORM: &str = "file:///path/to/dir";

/// `file:…`, after the scheme: the lock directory (`None`: the default).
pub(crate) fn parse_url(shown: &str, rest: &str) -> Result<Option<PathBuf>> {
    let path = rest.strip_prefix("//").unwrap_or(rest);
    if !path.is_empty() && !path.starts_with('/') {
        return Err(crate::secret::bad(format!(
            "{shown:?}: a file URL needs an absolute path, as in file:///var/lib/app/elections"
        )));
    }
    Ok(Some(path).filter(|p| !p.is_empty()).map(PathBuf::from))
}

impl FileBackend {
    /// Lock files in `$TMPDIR/incumbent` (usually `/tmp/incumbent`), shared by every process
    /// of this host that uses the default.
    pub fn new() -> Self {
        Self::in_dir(std::env::temp_dir().join("incumbent"))
    }

    /// Lock files in `dir`, created when the first session opens.
    pub fn in_dir(dir: impl Into<PathBuf>) -> Self {
        FileBackend {
            dir: Arc::new(dir.into()),
        }
    }

    /// The backend a URL names: `file:///path/to/dir`, or `file:` for the default directory
    /// of [`new`](FileBackend::new).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a URL of another form, or a relative path.
    pub fn from_url(url: &str) -> Result<FileBackend> {
        let (shown, scheme, rest) = crate::secret::split_url(url, URL_FORM)?;
        if scheme != "file" {
            return Err(crate::secret::wrong_scheme(&shown, URL_FORM));
        }
        Ok(match parse_url(&shown, rest)? {
            Some(dir) => FileBackend::in_dir(dir),
            None => FileBackend::new(),
        })
    }

    /// The directory holding the lock files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn paths(&self, election: &str) -> Paths {
        let stem = election.replace('/', "+");
        Paths {
            lock: self.dir.join(format!("{stem}.lock")),
            token: self.dir.join(format!("{stem}.token")),
            leader: self.dir.join(format!("{stem}.leader")),
        }
    }
}

#[derive(Clone, Debug)]
struct Paths {
    lock: PathBuf,
    token: PathBuf,
    leader: PathBuf,
}

fn io<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> Error + 'a {
    move |source| Error::Io {
        action,
        path: path.to_owned(),
        source,
    }
}

/// Runs blocking file work off the async threads.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(work).await.unwrap_or_else(|e| {
        Err(Error::Store {
            backend: NAME,
            reason: format!("a file task failed: {e}"),
        })
    })
}

impl Backend for FileBackend {
    type Session = FileSession;
    type Observer = FileObserver;

    fn info(&self) -> BackendInfo {
        BackendInfo {
            // The kernel drops a dead process's lock at once.
            frees_dead_holder_at_once: true,
            // A `flock` cannot change hands: the leader names the target in the leader file
            // and releases; whoever gets the lock reads the name under it.
            hand_over: crate::backend::HandOverStyle::Gate,
            ..BackendInfo::new(NAME, Duration::from_millis(1), Duration::from_secs(86_400))
        }
    }

    async fn open_session(&self, options: &SessionOptions) -> Result<FileSession> {
        let dir = self.dir.clone();
        blocking(move || {
            std::fs::create_dir_all(&*dir).map_err(io("cannot create the lock directory", &dir))
        })
        .await?;
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let id = format!(
            "{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        // The lock lives as long as the process: the session has nothing to renew.
        let keepalive = KeepAlive::spawn(NAME, &id, options, Instant::now(), || async {
            Ok(Renewal::Alive)
        });
        Ok(FileSession {
            backend: self.clone(),
            id,
            keepalive,
        })
    }

    async fn observe(&self, election: &str) -> Result<FileObserver> {
        Ok(FileObserver {
            paths: self.paths(election),
            last: None,
        })
    }
}

/// A process's presence in a [`FileBackend`]. It never expires.
#[derive(Debug)]
pub struct FileSession {
    backend: FileBackend,
    id: String,
    keepalive: KeepAlive,
}

impl Session for FileSession {
    type Contender = FileContender;

    fn id(&self) -> String {
        self.id.clone()
    }

    fn health(&self) -> watch::Receiver<SessionHealth> {
        self.keepalive.health()
    }

    async fn contend(&self, election: &str, candidate: &Candidate) -> Result<FileContender> {
        Ok(FileContender {
            paths: self.backend.paths(election),
            candidate: candidate.clone(),
            state: State::Idle,
        })
    }

    async fn close(self) -> Result<()> {
        self.keepalive.stop();
        Ok(())
    }
}

/// One process's claim on one election in a [`FileBackend`].
#[derive(Debug)]
pub struct FileContender {
    paths: Paths,
    candidate: Candidate,
    state: State,
}

#[derive(Debug)]
enum State {
    Idle,
    /// A thread blocks in `flock` for us; it gives the lock up itself if we abandon it.
    Waiting {
        thread: oneshot::Receiver<Result<File>>,
        abandoned: Arc<AtomicBool>,
    },
    /// We hold the lock, but have not taken a token yet.
    Locked(File),
    Held {
        file: File,
        token: FencingToken,
    },
}

impl FileContender {
    fn abandon_waiter(&mut self) {
        if let State::Waiting { abandoned, .. } = &self.state {
            abandoned.store(true, Ordering::SeqCst);
        }
        if matches!(self.state, State::Waiting { .. }) {
            self.state = State::Idle;
        }
    }
}

impl Drop for FileContender {
    fn drop(&mut self) {
        self.abandon_waiter();
    }
}

fn open_lock(path: &Path) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(io("cannot open the lock file", path))
}

/// Takes the next fencing token and publishes the new leader. Runs under the lock.
fn take_office(paths: &Paths, candidate: &Candidate) -> Result<FencingToken> {
    let last = match std::fs::read_to_string(&paths.token) {
        Ok(text) => text.trim().parse::<u64>().map_err(|_| Error::Store {
            backend: NAME,
            reason: format!(
                "the token counter {} does not hold a number; restore it or, when no candidate runs, delete it (tokens then restart at 1)",
                paths.token.display()
            ),
        })?,
        Err(e) if e.kind() == ErrorKind::NotFound => 0,
        Err(e) => return Err(io("cannot read the token counter", &paths.token)(e)),
    };
    let token = last + 1;
    write_atomically(&paths.token, token.to_string().as_bytes())?;
    let leader = Leader {
        candidate: candidate.clone(),
        fencing_token: Some(token),
        since_unix_ms: Some(unix_ms_now()),
    };
    write_atomically(&paths.leader, &leader.to_bytes())?;
    Ok(token)
}

/// Writes `bytes` to a temporary file, syncs it, and renames it over `path`.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(io("cannot write", path))
}

/// Whether `file` is still the file at `path` (not deleted or replaced).
fn still_at(file: &File, path: &Path) -> bool {
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.ino() == b.ino() && a.dev() == b.dev(),
        _ => false,
    }
}

impl Contender for FileContender {
    async fn acquire(&mut self) -> Result<Attempt> {
        if let State::Held { token, .. } = &self.state {
            return Ok(Attempt::Won {
                fencing_token: *token,
            });
        }
        let state = std::mem::replace(&mut self.state, State::Idle);
        let file = match state {
            State::Locked(file) => Some(file),
            State::Waiting {
                mut thread,
                abandoned,
            } => match thread.try_recv() {
                Ok(locked) => locked.ok(),
                Err(oneshot::error::TryRecvError::Empty) => {
                    self.state = State::Waiting { thread, abandoned };
                    None
                }
                Err(oneshot::error::TryRecvError::Closed) => None,
            },
            State::Idle | State::Held { .. } => None,
        };
        let paths = self.paths.clone();
        let candidate = self.candidate.clone();
        let waiting = matches!(self.state, State::Waiting { .. });
        let outcome = blocking(move || {
            let file = match file {
                Some(file) => file,
                None if waiting => return Ok(Err(NotTaken::Held(read_leader(&paths)))),
                None => {
                    let file = open_lock(&paths.lock)?;
                    match file.try_lock() {
                        Ok(()) => file,
                        Err(TryLockError::WouldBlock) => {
                            return Ok(Err(NotTaken::Held(read_leader(&paths))));
                        }
                        Err(TryLockError::Error(e)) => {
                            return Err(io("cannot lock", &paths.lock)(e));
                        }
                    }
                }
            };
            if !still_at(&file, &paths.lock) {
                // Locked a file that was deleted meanwhile: worthless. Try again afresh.
                return Ok(Err(NotTaken::Held(None)));
            }
            if let Some(left) = reserved_for_another(&paths, &candidate.id) {
                // The last leader handed over to another candidate: let go (closing the file
                // lets the next waiter in) until the window ends.
                drop(file);
                return Ok(Err(NotTaken::Reserved(left)));
            }
            let token = take_office(&paths, &candidate)?;
            Ok(Ok((file, token)))
        })
        .await?;
        match outcome {
            Ok((file, token)) => {
                self.state = State::Held { file, token };
                Ok(Attempt::Won {
                    fencing_token: token,
                })
            }
            Err(NotTaken::Held(holder)) => Ok(Attempt::Held { holder }),
            Err(NotTaken::Reserved(left)) => Ok(Attempt::Delayed {
                until: tokio::time::Instant::now() + left,
            }),
        }
    }

    async fn wait(&mut self) -> Result<()> {
        if matches!(self.state, State::Idle) {
            let path = self.paths.lock.clone();
            let abandoned = Arc::new(AtomicBool::new(false));
            let gave_up = abandoned.clone();
            let (sender, thread) = oneshot::channel();
            // A thread of its own, not the runtime's blocking pool: dropping the runtime
            // must not wait for a `flock` that may never return.
            let waiter = move || {
                let locked = open_lock(&path).and_then(|file| {
                    file.lock().map_err(io("cannot lock", &path))?;
                    if gave_up.load(Ordering::SeqCst) {
                        drop(file); // nobody wants it any more: let the next waiter have it
                        return Err(Error::Stopped);
                    }
                    Ok(file)
                });
                // A receiver that is gone drops the file, and with it the lock.
                let _ = sender.send(locked);
            };
            std::thread::Builder::new()
                .name("incumbent-flock".into())
                .spawn(waiter)
                .map_err(io("cannot start a thread to wait for", &self.paths.lock))?;
            self.state = State::Waiting { thread, abandoned };
        }
        if let State::Waiting { thread, .. } = &mut self.state {
            let locked = thread.await;
            self.state = match locked {
                Ok(Ok(file)) => State::Locked(file),
                Ok(Err(e)) => {
                    self.state = State::Idle;
                    return Err(e);
                }
                Err(_) => {
                    self.state = State::Idle;
                    return Err(Error::Store {
                        backend: NAME,
                        reason: "the thread waiting for the lock ended without an answer".into(),
                    });
                }
            };
        }
        Ok(())
    }

    async fn lost(&mut self) -> LockLoss {
        loop {
            sleep(LOCK_CHECK_INTERVAL).await;
            if let State::Held { file, .. } = &self.state
                && !still_at(file, &self.paths.lock)
            {
                return LockLoss::Deleted;
            }
        }
    }

    async fn proclaim(&mut self, leader: &Leader) -> Result<()> {
        let State::Held { token, .. } = &self.state else {
            return Err(Error::Store {
                backend: NAME,
                reason: "cannot proclaim: this candidate does not hold the lock".into(),
            });
        };
        let leader = Leader {
            fencing_token: Some(*token),
            ..leader.clone()
        };
        let path = self.paths.leader.clone();
        blocking(move || write_atomically(&path, &leader.to_bytes())).await
    }

    async fn release(&mut self) -> Result<()> {
        self.abandon_waiter();
        if let State::Held { file, .. } | State::Locked(file) =
            std::mem::replace(&mut self.state, State::Idle)
        {
            // Closing the file releases the lock; the kernel wakes the next waiter.
            drop(file);
        }
        Ok(())
    }
}

/// Why an acquisition did not take the lock.
enum NotTaken {
    /// Another process holds it (the leader, if it could be read).
    Held(Option<Leader>),
    /// It is kept for another candidate, for this long yet.
    Reserved(Duration),
}

/// How long the leader file still keeps the lock for a candidate other than `id`, after a
/// hand-over ([`Leader::handing_over`]): judged by this host's clock, which every candidate
/// of the file backend shares.
fn reserved_for_another(paths: &Paths, id: &str) -> Option<Duration> {
    let bytes = std::fs::read(&paths.leader).ok()?;
    let reservation = Leader::from_bytes(&bytes).handing_over()?;
    if reservation.to == id {
        return None;
    }
    let ends = reservation.at_unix_ms.saturating_add(reservation.window_ms);
    let left = ends.checked_sub(unix_ms_now()).filter(|left| *left > 0)?;
    // A reservation from the future (a clock stepped back) is kept at most its window.
    Some(Duration::from_millis(left.min(reservation.window_ms)))
}

/// The leader, if the lock is held: tested with a shared non-blocking lock.
fn read_leader(paths: &Paths) -> Option<Leader> {
    let file = File::open(&paths.lock).ok()?;
    match file.try_lock_shared() {
        Ok(()) => None, // nobody holds it
        Err(_) => std::fs::read(&paths.leader)
            .ok()
            .map(|bytes| Leader::from_bytes(&bytes)),
    }
}

/// Follows the holder of one election in a [`FileBackend`], reading it every
/// [`OBSERVE_INTERVAL`].
#[derive(Debug)]
pub struct FileObserver {
    paths: Paths,
    last: Option<Option<Leader>>,
}

impl Observer for FileObserver {
    async fn next(&mut self) -> Result<Option<Leader>> {
        loop {
            if self.last.is_some() {
                sleep(OBSERVE_INTERVAL).await;
            }
            let paths = self.paths.clone();
            let leader = blocking(move || Ok(read_leader(&paths))).await?;
            if self.last.as_ref() != Some(&leader) {
                self.last = Some(leader.clone());
                return Ok(leader);
            }
        }
    }
}
