//! The simulated store as an `incumbent` backend: a Consul-like lock (sessions with a ttl
//! on the simulated clock, `acquire`/`release` by session, a lock-delay after invalidation,
//! a fencing counter, blocking queries), reached by each candidate through its own faulty
//! network link.
//!
//! Every request is a message: its fate (fail at once, lost on the way, applied with the
//! reply lost, how long each leg takes) is drawn from the run's seed when it is sent. The
//! store side runs in a task of its own, so a request the client gave up on still arrives
//! and is applied late, as on a real network; delays drawn per message reorder requests of
//! one client (pipelined renewals, an acquisition overtaking a release). A partitioned
//! client's messages are lost (in one direction or both), and with its inbound side cut it
//! hears no notifications.

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use incumbent::backend::keepalive::{KeepAlive, Renewal};
use incumbent::backend::{
    Attempt, Backend, BackendInfo, Candidate, Contender, Leader, LockLoss, Observer, Session,
    SessionHealth, SessionOptions, Wakeup,
};
use incumbent::{Error, Result};
use tokio::sync::{oneshot, watch};
use tokio::time::{Instant, sleep, sleep_until, timeout, timeout_at};

use super::world::{Bug, State};

const NAME: &str = "sim";

/// The simulated world, shared by the store, the clients and the checker.
pub struct World {
    state: Mutex<State>,
    /// Each client's link to the store.
    links: Vec<watch::Sender<Link>>,
}

impl World {
    pub fn new(state: State, clients: usize) -> Arc<World> {
        Arc::new(World {
            state: Mutex::new(state),
            links: (0..clients).map(|_| watch::Sender::new(Link::UP)).collect(),
        })
    }

    /// The state, for a moment (never across an `.await`).
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs a store operation: sessions whose ttl ran out are expired first.
    fn apply<T>(&self, op: impl FnOnce(&mut State, Instant) -> T) -> T {
        let now = Instant::now();
        let mut state = self.lock();
        state.expire_due(now);
        op(&mut state, now)
    }

    /// Waits until the lock's version passes `seen`.
    async fn changed_since(&self, seen: u64) {
        let bell = self.lock().bell();
        loop {
            let rung = bell.notified();
            tokio::pin!(rung);
            rung.as_mut().enable();
            if self.lock().current_version() > seen {
                return;
            }
            rung.await;
        }
    }

    /// Whether the client's requests are lost on the way to the store.
    fn outbound_cut(&self, client: usize) -> bool {
        self.links[client].borrow().outbound_cut
    }

    /// Whether the store's replies and notifications to the client are lost.
    fn inbound_cut(&self, client: usize) -> bool {
        self.links[client].borrow().inbound_cut
    }

    pub fn set_link(&self, client: usize, link: Link) {
        self.links[client].send_replace(link);
    }

    pub fn clients(&self) -> usize {
        self.links.len()
    }

    /// Expires sessions the instant their ttl runs out, so that holders and waiters are told
    /// at once (every store operation also expires what is due).
    pub async fn reap(self: Arc<World>) {
        loop {
            let now = Instant::now();
            let next = {
                let mut state = self.lock();
                state.expire_due(now);
                state.next_expiry()
            };
            sleep_until(next.unwrap_or(now + Duration::from_millis(100))).await;
        }
    }
}

fn unavailable(reason: &str) -> Error {
    Error::Unavailable {
        backend: NAME,
        reason: reason.into(),
    }
}

/// One client's link to the store: a partition cuts both directions or only one (a
/// half-open connection: requests lost while replies to earlier ones still come, or the
/// reverse).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Link {
    pub outbound_cut: bool,
    pub inbound_cut: bool,
}

impl Link {
    pub const UP: Link = Link {
        outbound_cut: false,
        inbound_cut: false,
    };
}

/// One candidate's client of the simulated store.
#[derive(Clone)]
pub struct SimBackend {
    world: Arc<World>,
    client: usize,
}

impl SimBackend {
    pub fn new(world: Arc<World>, client: usize) -> SimBackend {
        SimBackend { world, client }
    }

    /// Sends one request: `op` is applied by the store when (if) the request arrives.
    pub(super) fn call<T, F>(&self, op: F) -> impl Future<Output = Result<T>> + Send + use<T, F>
    where
        T: Send + 'static,
        F: FnOnce(&mut State, Instant) -> T + Send + 'static,
    {
        let world = self.world.clone();
        let client = self.client;
        async move {
            let sent = Instant::now();
            let (plan, deadline) = {
                let mut state = world.lock();
                let deadline = sent + state.params.request_timeout;
                (state.plan(client, sent), deadline)
            };
            if plan.fail {
                sleep(plan.request).await;
                return Err(unavailable("the store answered with an error (injected)"));
            }
            let (tx, rx) = oneshot::channel();
            let store = world.clone();
            tokio::spawn(async move {
                sleep(plan.request).await;
                if plan.drop_request || store.outbound_cut(client) {
                    return;
                }
                let out = store.apply(op);
                sleep(plan.reply).await;
                if plan.drop_reply || store.inbound_cut(client) {
                    return;
                }
                let _ = tx.send(out);
            });
            match timeout_at(deadline, rx).await {
                Ok(Ok(out)) => Ok(out),
                Ok(Err(_)) => {
                    // The message was lost: the client only finds out when it gives up.
                    sleep_until(deadline).await;
                    Err(unavailable("no answer within the request timeout"))
                }
                Err(_) => Err(unavailable("no answer within the request timeout")),
            }
        }
    }

    /// A blocking query: returns when the store's version passes `seen` (or after the
    /// longest wait), with the version and the holder.
    async fn blocking(&self, seen: u64) -> Result<(u64, Option<Leader>)> {
        let sent = Instant::now();
        let (plan, deadline, max_wait) = {
            let mut state = self.world.lock();
            let p = &state.params;
            let (max_wait, deadline) = (p.max_wait, sent + p.max_wait + p.request_timeout);
            (state.plan(self.client, sent), deadline, max_wait)
        };
        sleep(plan.request).await;
        if plan.fail {
            return Err(unavailable("the store answered with an error (injected)"));
        }
        if plan.drop_request || self.world.outbound_cut(self.client) {
            sleep_until(deadline).await;
            return Err(unavailable("no answer to a blocking query"));
        }
        let _ = timeout(max_wait, self.world.changed_since(seen)).await;
        let out = self
            .world
            .apply(|state, _| (state.current_version(), state.holder_leader()));
        sleep(plan.reply).await;
        if plan.drop_reply || self.world.inbound_cut(self.client) {
            sleep_until(deadline).await;
            return Err(unavailable("no answer to a blocking query"));
        }
        Ok(out)
    }

    async fn renew(&self, id: u64) -> Result<Renewal> {
        let alive = self.call(move |state, now| state.renew(id, now)).await?;
        Ok(if alive { Renewal::Alive } else { Renewal::Gone })
    }
}

impl Backend for SimBackend {
    type Session = SimSession;
    type Observer = SimObserver;

    fn info(&self) -> BackendInfo {
        BackendInfo {
            wakeup: Wakeup::Push,
            max_lock_delay: Some(Duration::MAX),
            // Hand-overs are not simulated: `take_over` is the default (an acquire).
            ..BackendInfo::new(NAME, Duration::from_millis(1), Duration::from_secs(86_400))
        }
    }

    async fn open_session(&self, options: &SessionOptions) -> Result<SimSession> {
        let sent = Instant::now();
        let (client, ttl) = (self.client, options.ttl);
        let lock_delay = options.lock_delay.unwrap_or(Duration::ZERO);
        let id = self
            .call(move |state, now| state.create_session(client, ttl, lock_delay, now))
            .await?;
        let renewer = self.clone();
        let keepalive = KeepAlive::spawn(NAME, &id.to_string(), options, sent, move || {
            let renewer = renewer.clone();
            async move { renewer.renew(id).await }
        });
        let bug = self.world.lock().params.bug;
        let health = match bug {
            Some(Bug::ReceiveTime) => receive_time(keepalive.health()),
            _ => keepalive.health(),
        };
        Ok(SimSession {
            backend: self.clone(),
            id,
            keepalive,
            health,
        })
    }

    async fn observe(&self, _election: &str) -> Result<SimObserver> {
        Ok(SimObserver {
            backend: self.clone(),
            seen: None,
        })
    }
}

/// [`Bug::ReceiveTime`]: the health as a backend would report it that stamps a confirmed
/// renewal with the time its reply came, not the time it was sent.
fn receive_time(mut source: watch::Receiver<SessionHealth>) -> watch::Receiver<SessionHealth> {
    let first = source.borrow_and_update().clone();
    let (tx, rx) = watch::channel(first.clone());
    tokio::spawn(async move {
        let mut last_sent = first.confirmed_sent_at;
        while source.changed().await.is_ok() {
            let mut health = source.borrow_and_update().clone();
            if health.confirmed_sent_at != last_sent {
                last_sent = health.confirmed_sent_at;
                health.confirmed_sent_at = Instant::now();
            } else {
                health.confirmed_sent_at = tx.borrow().confirmed_sent_at;
            }
            if tx.send(health).is_err() {
                return;
            }
        }
    });
    rx
}

/// A session in the simulated store, kept alive by the library's own [`KeepAlive`].
pub struct SimSession {
    backend: SimBackend,
    id: u64,
    keepalive: KeepAlive,
    health: watch::Receiver<SessionHealth>,
}

impl Session for SimSession {
    type Contender = SimContender;

    fn id(&self) -> String {
        format!("c{}-s{}", self.backend.client, self.id)
    }

    fn health(&self) -> watch::Receiver<SessionHealth> {
        self.health.clone()
    }

    async fn contend(&self, _election: &str, candidate: &Candidate) -> Result<SimContender> {
        Ok(SimContender {
            backend: self.backend.clone(),
            session: self.id,
            candidate: candidate.clone(),
            token: None,
            seen: 0,
        })
    }

    async fn close(self) -> Result<()> {
        self.keepalive.stop();
        let id = self.id;
        self.backend
            .call(move |state, now| state.invalidate(id, now, "destroyed"))
            .await
    }
}

/// One session's claim on the election.
pub struct SimContender {
    backend: SimBackend,
    session: u64,
    candidate: Candidate,
    /// The token of the lock we hold, as the store last told us.
    token: Option<u64>,
    /// The store version of our last answer, for blocking queries.
    seen: u64,
}

impl Contender for SimContender {
    async fn acquire(&mut self) -> Result<Attempt> {
        let (client, session, candidate) =
            (self.backend.client, self.session, self.candidate.clone());
        let out = self
            .backend
            .call(move |state, now| state.acquire(client, session, &candidate, now))
            .await?;
        let (attempt, version) = out.map_err(|reason| Error::Store {
            backend: NAME,
            reason,
        })?;
        self.seen = version;
        if let Attempt::Won { fencing_token } = attempt {
            self.token = Some(fencing_token);
        }
        Ok(attempt)
    }

    async fn wait(&mut self) -> Result<()> {
        let (version, _) = self.backend.blocking(self.seen).await?;
        self.seen = version;
        Ok(())
    }

    /// The client's watch on the key: a partitioned client hears nothing until the link
    /// heals; a connected one hears of a change a few milliseconds after it happens.
    async fn lost(&mut self) -> LockLoss {
        let world = self.backend.world.clone();
        let client = self.backend.client;
        let mut link = world.links[client].subscribe();
        loop {
            while link.borrow_and_update().inbound_cut {
                if link.changed().await.is_err() {
                    return LockLoss::SessionLost;
                }
            }
            let (loss, version, latency) = {
                let mut state = world.lock();
                (
                    state.loss_of(self.session),
                    state.current_version(),
                    state.notify_latency(),
                )
            };
            if let Some(loss) = loss {
                sleep(latency).await;
                world
                    .lock()
                    .on_loss_seen(client, self.token, loss, Instant::now());
                return loss;
            }
            tokio::select! {
                biased;
                () = world.changed_since(version) => {}
                _ = link.changed() => {}
            }
        }
    }

    /// Asks the store whether our session still exists: a store round trip, as etcd's
    /// backend asks whether the lease behind a deleted key expired.
    async fn explain(&mut self, loss: LockLoss) -> LockLoss {
        let session = self.session;
        match self
            .backend
            .call(move |state, _| state.session_alive(session))
            .await
        {
            Ok(false) => LockLoss::SessionLost,
            _ => loss,
        }
    }

    async fn proclaim(&mut self, leader: &Leader) -> Result<()> {
        let (session, leader) = (self.session, leader.clone());
        let held = self
            .backend
            .call(move |state, _| state.proclaim(session, &leader))
            .await?;
        match held {
            true => Ok(()),
            false => Err(Error::Store {
                backend: NAME,
                reason: "cannot proclaim: this session does not hold the lock".into(),
            }),
        }
    }

    async fn release(&mut self) -> Result<()> {
        let session = self.session;
        self.backend
            .call(move |state, now| state.release(session, now))
            .await?;
        self.token = None;
        Ok(())
    }
}

/// Follows the holder with blocking queries.
pub struct SimObserver {
    backend: SimBackend,
    seen: Option<u64>,
}

impl Observer for SimObserver {
    async fn next(&mut self) -> Result<Option<Leader>> {
        let (version, holder) = match self.seen {
            None => {
                self.backend
                    .call(|state, _| (state.current_version(), state.holder_leader()))
                    .await?
            }
            Some(seen) => self.backend.blocking(seen).await?,
        };
        self.seen = Some(version);
        Ok(holder)
    }
}
