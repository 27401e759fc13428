//! The in-process backend: many candidates in one process share one [`MemoryBackend`].
//!
//! It behaves like a small coordination store, with sessions that expire when not renewed,
//! fencing tokens from a per-election counter, lock-delay after a session is invalidated
//! (as Consul does), and push notifications (no polling). It is useful in its own right,
//! for tasks of one process that must not run a job twice, and it is how the campaign
//! engine is tested with `tokio::time::pause()`: every timer it uses is tokio's.
//!
//! It can also inject faults: [`set_reachability`](MemoryBackend::set_reachability) makes
//! the store fail or hang for one client (one candidate), [`set_latency`](MemoryBackend::set_latency)
//! delays its calls, [`expire_sessions`](MemoryBackend::expire_sessions) invalidates its
//! sessions, [`delete`](MemoryBackend::delete) removes an election's holder as an operator
//! would, [`force_holder`](MemoryBackend::force_holder) hands the lock to someone else, and
//! [`impose_lock_delay`](MemoryBackend::impose_lock_delay) blocks acquisition.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> incumbent::Result<()> {
//! use incumbent::memory::MemoryBackend;
//!
//! let store = MemoryBackend::new();
//! let a = store.client(); // each client is one candidate's connection to the store
//! let b = store.client();
//! # let _ = (a, b);
//! # Ok(()) }
//! ```

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::{Instant, sleep, sleep_until};

use crate::backend::keepalive::{KeepAlive, Renewal};
use crate::backend::pool::{Poolable, SessionPool, Shared};
use crate::backend::{
    Attempt, Backend, BackendInfo, Candidate, Contender, FencingToken, Leader, LockLoss, Observer,
    Session, SessionHealth, SessionOptions, lock, unix_ms_now,
};
use crate::{Error, Result};

const NAME: &str = "memory";

/// How one client reaches the store, for fault injection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reachability {
    /// Calls go through.
    Reachable,
    /// Calls fail at once with [`Error::Unavailable`], as with a refused connection.
    Failing,
    /// Calls hang until the client is reachable again, as with a black-holed network.
    /// Notifications are held back too.
    Hanging,
}

/// An in-process coordination store, and one client's connection to it. Clones share the
/// client; [`client`](MemoryBackend::client) makes another client of the same store.
#[derive(Clone, Debug)]
pub struct MemoryBackend {
    store: Arc<Store>,
    client: Arc<Client>,
}

#[derive(Debug, Default)]
struct Store {
    state: Mutex<State>,
    next_id: AtomicU64,
}

#[derive(Debug, Default)]
struct State {
    sessions: HashMap<u64, SessionEntry>,
    /// Every session's expiry, earliest first.
    expiries: BTreeSet<(Instant, u64)>,
    elections: HashMap<String, ElectionEntry>,
}

#[derive(Debug)]
struct SessionEntry {
    client: u64,
    expires_at: Instant,
    ttl: Duration,
    lock_delay: Duration,
    held: HashSet<String>,
}

#[derive(Debug)]
struct ElectionEntry {
    holder: Option<Holding>,
    last_token: FencingToken,
    delayed_until: Option<Instant>,
    /// Bumped at every change, to wake waiters.
    version: watch::Sender<u64>,
}

#[derive(Clone, Debug)]
struct Holding {
    session: u64,
    /// The contender of that session that holds the lock: the elections of one client with
    /// equal session options share a session, and two campaigns of one election must still
    /// never both hold its lock.
    contender: u64,
    leader: Leader,
}

impl Holding {
    fn is(&self, session: u64, contender: u64) -> bool {
        self.session == session && self.contender == contender
    }
}

#[derive(Debug)]
struct Client {
    id: u64,
    reachability: watch::Sender<Reachability>,
    latency: Mutex<Duration>,
    requests: AtomicU64,
    sessions: SessionPool<Lease>,
}

impl Default for MemoryBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryBackend {
    /// A new, empty store, and a first client of it.
    pub fn new() -> Self {
        let store = Arc::new(Store::default());
        let client = Self::new_client(&store);
        MemoryBackend { store, client }
    }

    /// Another client of the same store, with its own fault switches.
    pub fn client(&self) -> MemoryBackend {
        MemoryBackend {
            store: self.store.clone(),
            client: Self::new_client(&self.store),
        }
    }

    fn new_client(store: &Store) -> Arc<Client> {
        Arc::new(Client {
            id: store.next_id.fetch_add(1, Ordering::Relaxed),
            reachability: watch::Sender::new(Reachability::Reachable),
            latency: Mutex::new(Duration::ZERO),
            requests: AtomicU64::new(0),
            sessions: SessionPool::default(),
        })
    }

    /// Makes this client's calls go through, fail, or hang.
    pub fn set_reachability(&self, reachability: Reachability) {
        self.client.reachability.send_replace(reachability);
    }

    /// Delays every call of this client by `latency`.
    pub fn set_latency(&self, latency: Duration) {
        *lock(&self.client.latency) = latency;
    }

    /// Invalidates every session this client opened, as if their ttl had run out: their
    /// locks are freed, subject to each session's lock-delay.
    pub fn expire_sessions(&self) {
        let mut state = self.store.lock();
        let ids: Vec<u64> = state
            .sessions
            .iter()
            .filter(|(_, s)| s.client == self.client.id)
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            state.invalidate(id, true);
        }
    }

    /// Removes the holder of `election`, as an operator deleting the key would.
    pub fn delete(&self, election: &str) {
        let mut state = self.store.lock();
        if let Some(entry) = state.elections.get_mut(election) {
            if let Some(holding) = entry.holder.take()
                && let Some(session) = state.sessions.get_mut(&holding.session)
            {
                session.held.remove(election);
            }
            if let Some(entry) = state.elections.get(election) {
                entry.version.send_modify(|v| *v += 1);
            }
        }
    }

    /// Gives `election`'s lock to `leader`, under a session no candidate owns, as an
    /// operator or a misbehaving client writing the key would. The holder loses the lock
    /// ([`LockLoss::Taken`]); nobody can acquire it until [`delete`](Self::delete).
    pub fn force_holder(&self, election: &str, leader: Leader) {
        let session = self.store.next_id.fetch_add(1, Ordering::Relaxed);
        let mut state = self.store.lock();
        let entry = state.election(election);
        let previous = entry.holder.replace(Holding {
            session,
            contender: 0,
            leader,
        });
        entry.version.send_modify(|v| *v += 1);
        if let Some(previous) = previous
            && let Some(owner) = state.sessions.get_mut(&previous.session)
        {
            owner.held.remove(election);
        }
    }

    /// Keeps everyone from acquiring `election` for `delay` from now.
    pub fn impose_lock_delay(&self, election: &str, delay: Duration) {
        let mut state = self.store.lock();
        let entry = state.election(election);
        entry.delayed_until = Some(Instant::now() + delay);
        entry.version.send_modify(|v| *v += 1);
    }

    /// The current holder of `election`, read without faults.
    pub fn holder(&self, election: &str) -> Option<Leader> {
        let state = self.store.lock();
        state
            .elections
            .get(election)
            .and_then(|e| e.holder.as_ref().map(|h| h.leader.clone()))
    }

    /// How many sessions are open in the store.
    pub fn session_count(&self) -> usize {
        self.store.lock().sessions.len()
    }

    /// How many requests this client has sent to the store (renewals, acquisitions, reads,
    /// releases, and the wake-ups of waits), to check that nothing polls or loops hot.
    pub fn requests(&self) -> u64 {
        self.client.requests.load(Ordering::Relaxed)
    }

    /// Waits for this client's latency and reachability, as a network call would.
    async fn gate(&self) -> Result<()> {
        self.client.requests.fetch_add(1, Ordering::Relaxed);
        let latency = *lock(&self.client.latency);
        if !latency.is_zero() {
            sleep(latency).await;
        }
        let mut reach = self.client.reachability.subscribe();
        loop {
            match *reach.borrow_and_update() {
                Reachability::Reachable => return Ok(()),
                Reachability::Failing => {
                    return Err(Error::Unavailable {
                        backend: NAME,
                        reason: "the store is unreachable (injected fault)".into(),
                    });
                }
                Reachability::Hanging => {}
            }
            if reach.changed().await.is_err() {
                return Ok(());
            }
        }
    }
}

impl Store {
    /// Locks the state, first expiring every session whose ttl has run out. Expiry needs no
    /// task of its own: every access, and every waiter's timer, enforces it.
    fn lock(&self) -> MutexGuard<'_, State> {
        let mut state = lock(&self.state);
        state.expire_due(Instant::now());
        state
    }
}

impl State {
    fn election(&mut self, name: &str) -> &mut ElectionEntry {
        self.elections
            .entry(name.to_owned())
            .or_insert_with(|| ElectionEntry {
                holder: None,
                last_token: 0,
                delayed_until: None,
                version: watch::Sender::new(0),
            })
    }

    fn expire_due(&mut self, now: Instant) {
        while let Some(&(at, id)) = self.expiries.first() {
            if at > now {
                break;
            }
            self.invalidate(id, true);
        }
    }

    /// When the session holding `election` expires, unless renewed.
    fn holder_expiry(&self, election: &str) -> Option<Instant> {
        let holder = self.elections.get(election)?.holder.as_ref()?;
        self.sessions.get(&holder.session).map(|s| s.expires_at)
    }

    /// Ends a session and frees its locks, with its lock-delay if `delayed`.
    fn invalidate(&mut self, id: u64, delayed: bool) {
        let Some(session) = self.sessions.remove(&id) else {
            return;
        };
        self.expiries.remove(&(session.expires_at, id));
        for name in session.held {
            let entry = self.election(&name);
            if entry.holder.as_ref().is_some_and(|h| h.session == id) {
                entry.holder = None;
                if delayed && !session.lock_delay.is_zero() {
                    entry.delayed_until = Some(Instant::now() + session.lock_delay);
                }
                entry.version.send_modify(|v| *v += 1);
            }
        }
    }
}

impl Backend for MemoryBackend {
    type Session = MemorySession;
    type Observer = MemoryObserver;

    fn info(&self) -> BackendInfo {
        BackendInfo {
            max_lock_delay: Some(Duration::MAX),
            ..BackendInfo::new(NAME, Duration::from_millis(1), Duration::from_secs(86_400))
        }
    }

    async fn open_session(&self, options: &SessionOptions) -> Result<MemorySession> {
        let shared = self
            .client
            .sessions
            .join(options, || self.create_lease(options))
            .await?;
        Ok(MemorySession { shared })
    }

    async fn observe(&self, election: &str) -> Result<MemoryObserver> {
        self.gate().await?;
        let version = self.store.lock().election(election).version.subscribe();
        Ok(MemoryObserver {
            backend: self.clone(),
            election: election.to_owned(),
            version,
            started: false,
        })
    }
}

impl MemoryBackend {
    /// Creates a session in the store and starts keeping it alive.
    async fn create_lease(&self, options: &SessionOptions) -> Result<Lease> {
        let sent = Instant::now();
        self.gate().await?;
        let id = self.store.next_id.fetch_add(1, Ordering::Relaxed);
        let expires_at = sent + options.ttl;
        {
            let mut state = self.store.lock();
            state.sessions.insert(
                id,
                SessionEntry {
                    client: self.client.id,
                    expires_at,
                    ttl: options.ttl,
                    lock_delay: options.lock_delay.unwrap_or(Duration::ZERO),
                    held: HashSet::new(),
                },
            );
            state.expiries.insert((expires_at, id));
            // Created already expired (the request took longer than the ttl): gone at once.
            state.expire_due(Instant::now());
        }
        let client = self.clone();
        let keepalive = KeepAlive::spawn(NAME, &id.to_string(), options, sent, move || {
            let client = client.clone();
            async move { client.renew(id).await }
        });
        Ok(Lease {
            backend: self.clone(),
            id,
            keepalive,
        })
    }

    async fn renew(&self, id: u64) -> Result<Renewal> {
        let sent = Instant::now();
        self.gate().await?;
        let mut guard = self.store.lock();
        let state = &mut *guard;
        Ok(match state.sessions.get_mut(&id) {
            Some(session) => {
                state.expiries.remove(&(session.expires_at, id));
                session.expires_at = session.expires_at.max(sent + session.ttl);
                state.expiries.insert((session.expires_at, id));
                Renewal::Alive
            }
            None => Renewal::Gone,
        })
    }

    /// Waits for a change to `election`, or for its holder's session to expire (which is a
    /// change too), then for this client's reachability.
    async fn changed(&self, election: &str, version: &mut watch::Receiver<u64>) -> Result<()> {
        loop {
            let expiry = self.store.lock().holder_expiry(election);
            tokio::select! {
                changed = version.changed() => {
                    if changed.is_err() {
                        std::future::pending::<()>().await;
                    }
                    break;
                }
                () = sleep_until(expiry.unwrap_or_else(far_future)), if expiry.is_some() => {
                    drop(self.store.lock()); // expires the holder, bumping the version
                }
            }
        }
        self.gate().await
    }
}

fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(86_400 * 365)
}

/// A session in a [`MemoryBackend`]. The elections of one client with equal session options
/// share one session, as with the stores.
#[derive(Debug)]
pub struct MemorySession {
    shared: Shared<Lease>,
}

/// The store session behind [`MemorySession`]s.
#[derive(Debug)]
pub struct Lease {
    backend: MemoryBackend,
    id: u64,
    keepalive: KeepAlive,
}

impl Poolable for Lease {
    fn health(&self) -> watch::Receiver<SessionHealth> {
        self.keepalive.health()
    }

    async fn destroy(&self) -> Result<()> {
        self.keepalive.stop();
        self.backend.gate().await?;
        self.backend.store.lock().invalidate(self.id, false);
        Ok(())
    }
}

impl Session for MemorySession {
    type Contender = MemoryContender;

    fn id(&self) -> String {
        self.shared.id.to_string()
    }

    fn health(&self) -> watch::Receiver<SessionHealth> {
        self.shared.keepalive.health()
    }

    async fn contend(&self, election: &str, candidate: &Candidate) -> Result<MemoryContender> {
        let backend = &self.shared.backend;
        let version = backend.store.lock().election(election).version.subscribe();
        Ok(MemoryContender {
            backend: backend.clone(),
            session: self.shared.id,
            id: backend.store.next_id.fetch_add(1, Ordering::Relaxed),
            election: election.to_owned(),
            candidate: candidate.clone(),
            version,
        })
    }

    async fn close(self) -> Result<()> {
        self.shared.close().await
    }
}

/// One memory session's claim on one election. The store records which contender holds the
/// lock, not only which session: two contenders of one shared session (two campaigns of one
/// election) never both hold it.
#[derive(Debug)]
pub struct MemoryContender {
    backend: MemoryBackend,
    session: u64,
    /// This contender, among all of the store's.
    id: u64,
    election: String,
    candidate: Candidate,
    version: watch::Receiver<u64>,
}

impl MemoryContender {
    /// Makes this contender the election's holder with the next token, and says so (the
    /// caller marks the change seen: `self.version`).
    fn take(&self, state: &mut State) -> FencingToken {
        let entry = state.election(&self.election);
        entry.last_token += 1;
        let fencing_token = entry.last_token;
        entry.holder = Some(Holding {
            session: self.session,
            contender: self.id,
            leader: Leader {
                candidate: self.candidate.clone(),
                fencing_token: Some(fencing_token),
                since_unix_ms: Some(unix_ms_now()),
            },
        });
        entry.version.send_modify(|v| *v += 1);
        if let Some(session) = state.sessions.get_mut(&self.session) {
            session.held.insert(self.election.clone());
        }
        fencing_token
    }
}

impl Contender for MemoryContender {
    async fn acquire(&mut self) -> Result<Attempt> {
        self.backend.gate().await?;
        let mut state = self.backend.store.lock();
        self.version.borrow_and_update();
        if !state.sessions.contains_key(&self.session) {
            return Err(Error::Store {
                backend: NAME,
                reason: "the session no longer exists".into(),
            });
        }
        let now = Instant::now();
        let entry = state.election(&self.election);
        if let Some(holding) = &entry.holder {
            return Ok(match holding.is(self.session, self.id) {
                true => Attempt::Won {
                    fencing_token: entry.last_token,
                },
                false => Attempt::Held {
                    holder: Some(holding.leader.clone()),
                },
            });
        }
        if let Some(until) = entry.delayed_until.filter(|until| *until > now) {
            return Ok(Attempt::Delayed { until });
        }
        let fencing_token = self.take(&mut state);
        self.version.borrow_and_update();
        Ok(Attempt::Won { fencing_token })
    }

    /// Takes the lock from a holder whose value, still as `holder` shows it, names this
    /// candidate as the target of a hand-over.
    async fn take_over(&mut self, holder: &Leader) -> Result<Attempt> {
        let named = holder
            .handing_over()
            .is_some_and(|h| h.to == self.candidate.id);
        let from = {
            self.backend.gate().await?;
            let mut state = self.backend.store.lock();
            if !state.sessions.contains_key(&self.session) {
                return Err(Error::Store {
                    backend: NAME,
                    reason: "the session no longer exists".into(),
                });
            }
            let entry = state.election(&self.election);
            match &entry.holder {
                Some(holding) if named && holding.leader == *holder => {
                    let from = holding.session;
                    if let Some(session) = state.sessions.get_mut(&from) {
                        session.held.remove(&self.election);
                    }
                    let fencing_token = self.take(&mut state);
                    self.version.borrow_and_update();
                    Some(fencing_token)
                }
                _ => None,
            }
        };
        match from {
            Some(fencing_token) => Ok(Attempt::Won { fencing_token }),
            None => self.acquire().await,
        }
    }

    async fn wait(&mut self) -> Result<()> {
        self.backend
            .changed(&self.election, &mut self.version)
            .await
    }

    async fn lost(&mut self) -> LockLoss {
        loop {
            {
                let state = self.backend.store.lock();
                let holder = state
                    .elections
                    .get(&self.election)
                    .and_then(|e| e.holder.as_ref());
                match holder {
                    Some(h) if h.is(self.session, self.id) => {}
                    Some(_) => return LockLoss::Taken,
                    None if state.sessions.contains_key(&self.session) => return LockLoss::Deleted,
                    None => return LockLoss::SessionLost,
                }
                self.version.borrow_and_update();
            }
            // A partitioned client does not hear of the loss until it can reach the store.
            let _ = self
                .backend
                .changed(&self.election, &mut self.version)
                .await;
        }
    }

    async fn proclaim(&mut self, leader: &Leader) -> Result<()> {
        self.backend.gate().await?;
        let mut state = self.backend.store.lock();
        let entry = state.election(&self.election);
        match &mut entry.holder {
            Some(holding) if holding.is(self.session, self.id) => {
                holding.leader.candidate = leader.candidate.clone();
                entry.version.send_modify(|v| *v += 1);
                Ok(())
            }
            _ => Err(Error::Store {
                backend: NAME,
                reason: "cannot proclaim: this session does not hold the lock".into(),
            }),
        }
    }

    async fn release(&mut self) -> Result<()> {
        self.backend.gate().await?;
        let mut state = self.backend.store.lock();
        let entry = state.election(&self.election);
        if entry
            .holder
            .as_ref()
            .is_some_and(|h| h.is(self.session, self.id))
        {
            entry.holder = None;
            entry.version.send_modify(|v| *v += 1);
            if let Some(session) = state.sessions.get_mut(&self.session) {
                session.held.remove(&self.election);
            }
        }
        Ok(())
    }
}

/// Follows the holder of one election in a [`MemoryBackend`].
#[derive(Debug)]
pub struct MemoryObserver {
    backend: MemoryBackend,
    election: String,
    version: watch::Receiver<u64>,
    started: bool,
}

impl Observer for MemoryObserver {
    async fn next(&mut self) -> Result<Option<Leader>> {
        if self.started {
            self.backend
                .changed(&self.election, &mut self.version)
                .await?;
        }
        self.started = true;
        self.version.borrow_and_update();
        Ok(self.backend.holder(&self.election))
    }
}
