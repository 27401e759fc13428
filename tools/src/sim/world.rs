//! The simulated world: the store's state, the network's fault profile per client, the
//! random source every fault is drawn from, and the checker that watches it all.
//!
//! Everything lives behind one mutex, taken for a moment and never across an `.await`; the
//! whole simulation runs on one thread, so the order in which it is taken is the order of
//! the schedule, which the seed fixes.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::Duration;

use fastrand::Rng;
use incumbent::backend::{Attempt, Candidate, Leader, LockLoss};
use incumbent::{Status, Term};
use std::sync::Arc;

use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use super::kv::KvState;
use super::queue::QueueState;

/// A bug planted in the simulated store or backend, to show that the checker catches it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bug {
    /// The store expires a session half a ttl after its last renewal instead of a whole
    /// ttl: it grants the lock to another session while the leader's lease, as the leader
    /// was promised it, is still alive.
    ShortLease,
    /// The backend reports when a renewal's reply was *received* as the time the renewal was
    /// confirmed, instead of when it was *sent*: a slow reply makes the leader trust a lease
    /// that started earlier than it thinks.
    ReceiveTime,
    /// The store hands out the previous token again after a release, instead of a greater
    /// one.
    TokenReuse,
    /// A polled store (Redis, memcached) that restarted without its data: the next token is
    /// the counter + 1 from a counter that starts again at zero, not
    /// `max(counter + 1, store clock in ms, floor + 1)`.
    CounterFromZero,
    /// memcached's acquisition (`incr`, then `add`) without the settle step: a candidate
    /// whose `add` arrives late leads with a token below one handed out meanwhile.
    NoSettle,
    /// A polled store's contender that does not adopt a key naming its own owner id (written
    /// by an acquisition whose answer was lost): it follows its own orphan until it expires.
    Orphan,
    /// An ordered queue's follower that, once the node it waited for (its predecessor) is
    /// gone, takes itself for the head without looking at the nodes ahead of it: a
    /// predecessor that left the queue (its session expired, it resigned while following)
    /// is not the holder going.
    PredecessorOnly,
}

impl Bug {
    /// Every planted bug.
    pub const ALL: [Bug; 7] = [
        Bug::ShortLease,
        Bug::ReceiveTime,
        Bug::TokenReuse,
        Bug::CounterFromZero,
        Bug::NoSettle,
        Bug::Orphan,
        Bug::PredecessorOnly,
    ];

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Bug::ShortLease => "short-lease",
            Bug::ReceiveTime => "receive-time",
            Bug::TokenReuse => "token-reuse",
            Bug::CounterFromZero => "counter-from-zero",
            Bug::NoSettle => "no-settle",
            Bug::Orphan => "orphan",
            Bug::PredecessorOnly => "predecessor-only",
        }
    }

    /// The store the bug lives in, when no store is chosen: the bugs of the polled stores
    /// need their store.
    pub fn store(self) -> StoreKind {
        match self {
            Bug::ShortLease | Bug::ReceiveTime | Bug::TokenReuse => StoreKind::Consul,
            Bug::CounterFromZero | Bug::Orphan => StoreKind::Forgetful,
            Bug::NoSettle => StoreKind::NonAtomic,
            Bug::PredecessorOnly => StoreKind::Queue,
        }
    }

    /// Parses a name given on the command line.
    pub fn parse(name: &str) -> Option<Bug> {
        Bug::ALL.into_iter().find(|bug| bug.name() == name)
    }
}

/// The store a run simulates.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StoreKind {
    /// Consul: sessions with a ttl, a lock acquired by session, a lock-delay, blocking
    /// queries.
    #[default]
    Consul,
    /// Redis without persistence: one key per election taken with its token in one atomic
    /// step (a script), renewed by the candidate's own renewals, polled by followers; the
    /// store restarts and forgets the key and the fencing counter.
    Forgetful,
    /// memcached: the same key, but taken in steps (`incr` of the counter, then `add` of the
    /// key), each a request of its own; restarts in some runs.
    NonAtomic,
    /// etcd and ZooKeeper: each candidate's node, created with the store's next revision and
    /// attached to its session's lease, queues; the oldest node leads, with its creation
    /// revision as the token, and a follower waits for the nodes ahead of it to go.
    Queue,
}

impl StoreKind {
    pub const ALL: [StoreKind; 4] = [
        StoreKind::Consul,
        StoreKind::Forgetful,
        StoreKind::NonAtomic,
        StoreKind::Queue,
    ];
    /// The stores added after Consul's.
    pub const NEW: [StoreKind; 3] = [StoreKind::Forgetful, StoreKind::NonAtomic, StoreKind::Queue];

    pub fn name(self) -> &'static str {
        match self {
            StoreKind::Consul => "consul",
            StoreKind::Forgetful => "forgetful",
            StoreKind::NonAtomic => "non-atomic",
            StoreKind::Queue => "queue",
        }
    }

    pub fn parse(name: &str) -> Option<StoreKind> {
        StoreKind::ALL.into_iter().find(|kind| kind.name() == name)
    }

    /// Whether followers poll one key (Redis, memcached).
    pub fn polled(self) -> bool {
        matches!(self, StoreKind::Forgetful | StoreKind::NonAtomic)
    }
}

/// How one client's messages fare, drawn anew by the fault schedule.
#[derive(Clone, Copy, Debug)]
pub struct Profile {
    /// Chance that a request, and independently its reply, is lost.
    pub drop: f32,
    /// Chance that the store answers with an error at once.
    pub fail: f32,
    /// Chance that a message (each leg) is held up by a latency spike.
    pub spike: f32,
    /// The longest spike.
    pub spike_max: Duration,
    /// Added to every reply: a congested path from the store back to the client.
    pub slow_replies: Duration,
}

impl Profile {
    /// A healthy network: 1 to 5 ms each way, nothing lost.
    pub const CALM: Profile = Profile {
        drop: 0.0,
        fail: 0.0,
        spike: 0.0,
        spike_max: Duration::ZERO,
        slow_replies: Duration::ZERO,
    };
}

/// The fate of one request, drawn when it is sent.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    /// The store answers with an error at once (after `request`).
    pub fail: bool,
    /// The request never reaches the store.
    pub drop_request: bool,
    /// The store applies the request, but the reply never reaches the client.
    pub drop_reply: bool,
    /// How long the request travels.
    pub request: Duration,
    /// How long the reply travels.
    pub reply: Duration,
}

/// The settings of one simulated run, drawn from its seed.
#[derive(Clone, Debug)]
pub struct Params {
    /// The session ttl of every candidate.
    pub ttl: Duration,
    /// The store's lock-delay after a session holding the lock is invalidated.
    pub lock_delay: Option<Duration>,
    /// After this long the client gives up on a request (the request may still arrive).
    pub request_timeout: Duration,
    /// How long a blocking query waits at the store for a change.
    pub max_wait: Duration,
    /// The campaigns' grace.
    pub grace: Duration,
    /// The campaigns' back-off.
    pub backoff: (Duration, Duration),
    /// Whether the fault schedule may act as an operator (invalidate a session, delete the
    /// key): faults the engine cannot prevent, checked by the prompt-fencing invariant.
    pub operator_faults: bool,
    /// How strong the network faults are, 0 to 1.
    pub intensity: f32,
    /// How long faults are injected; then the network heals and a leader must come.
    pub faults_for: Duration,
    /// A planted bug, if any.
    pub bug: Option<Bug>,
    /// The store simulated.
    pub store: StoreKind,
    /// How often a follower of a polled store polls the key (jittered by ±25 %).
    pub poll: Duration,
    /// Whether the fault schedule restarts the store, which forgets every key and counter
    /// (polled stores).
    pub restarts: bool,
}

impl Params {
    /// How long after the faults stop a leader must be in place: the old lease runs out
    /// (ttl), a stuck request times out, the longest back-off and the lock-delay pass, and a
    /// candidate acquires (two more ttls of slack for renewals and notifications).
    ///
    /// The longest stuck request is a follower's blocking query (`Contender::wait`), not an
    /// ordinary request: one sent just before the heal whose request or reply is lost is only
    /// given up at `max_wait + request_timeout`, as a real client's HTTP timeout for a
    /// blocking query must exceed the wait. If every follower's query is lost that way (seed
    /// 256304: all three, sent 150 ms before the heal, just as the holder's session expired),
    /// nobody tries to acquire until then. The old bound counted `request_timeout` only.
    pub fn liveness_bound(&self) -> Duration {
        if self.store.polled() {
            // No blocking query: a follower polls. A key orphaned or left by a leader that
            // stopped renewing expires within a ttl; a term on a counter that went back begins
            // a ttl after the key was taken; then a poll, a back-off, a stuck request.
            return self.ttl * 4 + self.poll * 2 + self.request_timeout * 2 + self.backoff.1;
        }
        self.ttl * 3
            + self.max_wait
            + self.request_timeout
            + self.backoff.1
            + self.lock_delay.unwrap_or(Duration::ZERO)
    }
}

/// Store requests a candidate may send in one simulated second before it counts as a hot
/// loop. A healthy candidate sends about 3 renewals and a blocking query or two per second;
/// while its renewals go unanswered it sends one every retry period (50 ms at least: 20/s),
/// and its acquisitions back off from 50 ms: the bound leaves room for both at once, and
/// for a burst of wake-ups after a heal, but not for a loop.
pub const HOT_LOOP_BOUND: u32 = 80;

#[derive(Debug)]
pub struct Sess {
    client: usize,
    ttl: Duration,
    expires_at: Instant,
    lock_delay: Duration,
}

#[derive(Debug)]
pub struct Hold {
    session: u64,
    client: usize,
    token: u64,
    leader: Leader,
}

/// What the checker knows of one candidate.
pub struct View {
    status: watch::Receiver<Status>,
    terms: Vec<TermRec>,
    /// The token of the term whose `Demoted` has not come yet.
    awaiting_demoted: Option<u64>,
}

struct TermRec {
    term: Term,
    token: u64,
    cancelled_at: Option<Instant>,
    worker_stopped_at: Option<Instant>,
}

/// Counts for the report.
#[derive(Clone, Copy, Debug, Default)]
pub struct Stats {
    pub requests: u64,
    pub grants: u64,
    pub terms: u64,
    pub expiries: u64,
    pub operator_faults: u64,
    /// Terms that began on a grant an operator had already undone (a reply in flight when
    /// the key was deleted or the session invalidated): exempt from the overlap and token
    /// checks, cancelled as soon as their client hears of the loss.
    pub operator_anomalies: u64,
    /// Terms that began on a grant a store restart had already forgotten (the reply was in
    /// flight when the store lost the key): exempt like the operator's, for the same reason.
    pub restart_anomalies: u64,
    pub max_requests_per_second: u32,
    /// Restarts of a polled store that forgot its data.
    pub restarts: u64,
}

pub struct State {
    pub rng: Rng,
    pub params: Params,
    pub(super) start: Instant,
    pub(super) sessions: BTreeMap<u64, Sess>,
    /// The polled store's key and counter ([`StoreKind::Forgetful`], [`StoreKind::NonAtomic`]).
    pub(super) kv: KvState,
    /// The queue of candidate nodes ([`StoreKind::Queue`]).
    pub(super) queue: QueueState,
    /// Tokens of terms whose key a store restart forgot, with the restart's instant: the
    /// next grant may overlap them (the last leader hears of the loss at its next renewal),
    /// but each must be cancelled within the renew deadline of the restart (no renewal sent
    /// after it can be confirmed), and tokens must still grow.
    pub(super) forgotten: BTreeMap<u64, Instant>,
    /// The candidates' renew deadline (one setting for all).
    pub(super) renew_deadline: Duration,
    next_id: u64,
    holder: Option<Hold>,
    last_token: u64,
    /// Whether the last holder released the lock (for [`Bug::TokenReuse`]).
    released_last: bool,
    delayed_until: Option<Instant>,
    /// Bumped at every change of the lock, and rung on `bell`. Not a `watch` channel: tokio
    /// spreads a watch's waiters over eight queues at random (its own, unseeded, generator),
    /// so the order in which they wake would vary from run to run; a `Notify` wakes its
    /// waiters in the order they came.
    version: u64,
    bell: Arc<Notify>,
    pub profiles: Vec<Profile>,
    views: Vec<View>,
    violations: Vec<String>,
    /// Requests per client per simulated second.
    requests: Vec<BTreeMap<u64, u32>>,
    /// Tokens of terms whose lock an operator took away: the engine cannot stop a grant that
    /// follows; the prompt-fencing check covers them instead.
    pub(super) exempt: BTreeSet<u64>,
    /// When each token's client first saw its lock lost (`Contender::lost` returned).
    loss_seen: BTreeMap<u64, Instant>,
    max_token: u64,
    pub stats: Stats,
    pub calm_since: Option<Instant>,
    hash: u64,
    trace: Option<Vec<String>>,
}

const MAX_VIOLATIONS: usize = 20;

impl State {
    pub fn new(rng: Rng, params: Params, clients: usize, verbose: bool) -> State {
        State {
            rng,
            params,
            start: Instant::now(),
            sessions: BTreeMap::new(),
            kv: KvState::default(),
            queue: QueueState::default(),
            forgotten: BTreeMap::new(),
            renew_deadline: Duration::ZERO,
            next_id: 1,
            holder: None,
            last_token: 0,
            released_last: false,
            delayed_until: None,
            version: 0,
            bell: Arc::new(Notify::new()),
            profiles: vec![Profile::CALM; clients],
            views: Vec::new(),
            violations: Vec::new(),
            requests: vec![BTreeMap::new(); clients],
            exempt: BTreeSet::new(),
            loss_seen: BTreeMap::new(),
            max_token: 0,
            stats: Stats::default(),
            calm_since: None,
            hash: 0xcbf2_9ce4_8422_2325,
            trace: verbose.then(Vec::new),
        }
    }

    /// Milliseconds since the run began, for messages.
    pub fn ms(&self, at: Instant) -> f64 {
        at.duration_since(self.start).as_secs_f64() * 1000.0
    }

    /// Records a step of the history: into the hash that proves replays identical, and into
    /// the printed trace when replaying one seed.
    pub fn record(&mut self, at: Instant, what: impl FnOnce() -> String) {
        let nanos = at.duration_since(self.start).as_nanos() as u64;
        let line = what();
        for byte in nanos.to_le_bytes().iter().chain(line.as_bytes()) {
            self.hash = (self.hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3);
        }
        let ms = self.ms(at);
        if let Some(trace) = &mut self.trace {
            trace.push(format!("{ms:>10.3} ms  {line}"));
        }
    }

    pub fn hash(&self) -> u64 {
        self.hash
    }

    pub fn take_trace(&mut self) -> Vec<String> {
        self.trace.take().unwrap_or_default()
    }

    pub fn violations(&self) -> &[String] {
        &self.violations
    }

    /// Records a broken invariant.
    pub fn push_violation(&mut self, at: Instant, message: String) {
        self.violation(at, message);
    }

    fn violation(&mut self, at: Instant, message: String) {
        self.record(at, || format!("VIOLATION {message}"));
        if self.violations.len() < MAX_VIOLATIONS {
            let ms = self.ms(at);
            self.violations.push(format!("at {ms:.3} ms: {message}"));
        }
    }

    /// Rung at every change of the lock.
    pub fn bell(&self) -> Arc<Notify> {
        self.bell.clone()
    }

    pub fn current_version(&self) -> u64 {
        self.version
    }

    pub(super) fn bump(&mut self) {
        self.version += 1;
        self.bell.notify_waiters();
    }

    // ---- the network ----

    /// Draws the fate of one request of `client`, and counts it.
    pub fn plan(&mut self, client: usize, now: Instant) -> Plan {
        self.stats.requests += 1;
        let second = now.duration_since(self.start).as_secs();
        *self.requests[client].entry(second).or_default() += 1;
        let p = self.profiles[client];
        let rng = &mut self.rng;
        let leg = |rng: &mut Rng| {
            let base = Duration::from_millis(rng.u64(1..=5));
            let spiked = rng.f32() < p.spike;
            let spike = Duration::from_millis(rng.u64(0..=p.spike_max.as_millis() as u64));
            if spiked { base + spike } else { base }
        };
        let request = leg(rng);
        let reply = leg(rng) + p.slow_replies;
        Plan {
            fail: rng.f32() < p.fail,
            drop_request: rng.f32() < p.drop,
            drop_reply: rng.f32() < p.drop,
            request,
            reply,
        }
    }

    /// A notification's latency on a healthy link.
    pub fn notify_latency(&mut self) -> Duration {
        Duration::from_millis(self.rng.u64(1..=5))
    }

    // ---- the store ----

    fn lease(&self, ttl: Duration) -> Duration {
        match self.params.bug {
            Some(Bug::ShortLease) => ttl / 2,
            _ => ttl,
        }
    }

    /// Invalidates every session whose ttl has run out by `now`.
    pub fn expire_due(&mut self, now: Instant) {
        let due: Vec<u64> = self
            .sessions
            .iter()
            .filter(|(_, s)| s.expires_at <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in due {
            self.stats.expiries += 1;
            self.invalidate(id, now, "expired");
        }
        if self.params.store.polled() {
            self.kv_expire(now);
        }
    }

    /// The earliest session (or key) expiry.
    pub fn next_expiry(&self) -> Option<Instant> {
        let sessions = self.sessions.values().map(|s| s.expires_at).min();
        match (sessions, self.kv.expiry()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Ends a session; a lock it held is freed, subject to its lock-delay (as Consul does on
    /// any invalidation, destroy included).
    pub fn invalidate(&mut self, id: u64, now: Instant, why: &str) {
        let Some(session) = self.sessions.remove(&id) else {
            return;
        };
        let client = session.client;
        self.record(now, || format!("c{client} session {id} {why}"));
        if self.params.store == StoreKind::Queue {
            self.queue_drop_session(id, now);
            return;
        }
        if self.holder.as_ref().is_some_and(|h| h.session == id) {
            self.holder = None;
            self.released_last = false;
            if !session.lock_delay.is_zero() {
                self.delayed_until = Some(now + session.lock_delay);
            }
            self.bump();
        }
    }

    pub fn create_session(
        &mut self,
        client: usize,
        ttl: Duration,
        lock_delay: Duration,
        now: Instant,
    ) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let expires_at = now + self.lease(ttl);
        self.sessions.insert(
            id,
            Sess {
                client,
                ttl,
                expires_at,
                lock_delay,
            },
        );
        self.record(now, || format!("c{client} session {id} created"));
        id
    }

    /// Restarts a session's ttl from now, as the store receives the renewal.
    pub fn renew(&mut self, id: u64, now: Instant) -> bool {
        let lease = match self.sessions.get(&id) {
            Some(s) => self.lease(s.ttl),
            None => return false,
        };
        if let Some(s) = self.sessions.get_mut(&id) {
            s.expires_at = s.expires_at.max(now + lease);
        }
        true
    }

    pub fn session_alive(&self, id: u64) -> bool {
        self.sessions.contains_key(&id)
    }

    /// Consul's `?acquire=<session>`: succeeds if nobody holds the lock (or we do) and no
    /// lock-delay is in force. Also returns the store's version, for blocking queries.
    pub fn acquire(
        &mut self,
        client: usize,
        session: u64,
        candidate: &Candidate,
        now: Instant,
    ) -> Result<(Attempt, u64), String> {
        if !self.sessions.contains_key(&session) {
            return Err(format!("session {session} is invalid"));
        }
        if self.params.store == StoreKind::Queue {
            let attempt = self.queue_acquire(client, session, candidate, now);
            return Ok((attempt, self.current_version()));
        }
        let attempt = match &self.holder {
            Some(h) if h.session == session => Attempt::Won {
                fencing_token: h.token,
            },
            Some(h) => Attempt::Held {
                holder: Some(h.leader.clone()),
            },
            None => match self.delayed_until.filter(|until| *until > now) {
                Some(until) => Attempt::Delayed { until },
                None => {
                    let token = match (self.params.bug, self.released_last) {
                        (Some(Bug::TokenReuse), true) => self.last_token,
                        _ => self.last_token + 1,
                    };
                    self.grant(client, session, token, candidate, now);
                    Attempt::Won {
                        fencing_token: token,
                    }
                }
            },
        };
        Ok((attempt, self.current_version()))
    }

    fn grant(
        &mut self,
        client: usize,
        session: u64,
        token: u64,
        candidate: &Candidate,
        now: Instant,
    ) {
        self.stats.grants += 1;
        self.record(now, || {
            format!("store grants token {token} to c{client} (session {session})")
        });
        self.check_grant(client, token, now);
        self.last_token = token;
        self.holder = Some(Hold {
            session,
            client,
            token,
            leader: Leader {
                candidate: candidate.clone(),
                fencing_token: Some(token),
                since_unix_ms: Some(now.duration_since(self.start).as_millis() as u64),
            },
        });
        self.bump();
    }

    /// Consul's `?release=<session>`: frees the lock if this session holds it.
    pub fn release(&mut self, session: u64, now: Instant) {
        if self.params.store == StoreKind::Queue {
            return self.queue_release(session, now);
        }
        if self.holder.as_ref().is_some_and(|h| h.session == session) {
            let client = self.holder.as_ref().map_or(0, |h| h.client);
            self.record(now, || format!("c{client} releases the lock"));
            self.holder = None;
            self.released_last = true;
            self.bump();
        }
    }

    /// Updates the value others read, if this session holds the lock.
    pub fn proclaim(&mut self, session: u64, leader: &Leader) -> bool {
        if self.params.store == StoreKind::Queue {
            return self.queue_proclaim(session, leader);
        }
        match &mut self.holder {
            Some(h) if h.session == session => {
                h.leader.candidate = leader.candidate.clone();
                self.bump();
                true
            }
            _ => false,
        }
    }

    pub fn holder_leader(&self) -> Option<Leader> {
        if self.params.store == StoreKind::Queue {
            return self.queue.head().map(|n| n.leader.clone());
        }
        self.holder.as_ref().map(|h| h.leader.clone())
    }

    pub fn holder_client(&self) -> Option<usize> {
        match self.params.store {
            StoreKind::Queue => return self.queue.head().map(|n| n.client),
            StoreKind::Forgetful | StoreKind::NonAtomic => return self.kv.holder_client(),
            StoreKind::Consul => {}
        }
        self.holder.as_ref().map(|h| h.client)
    }

    /// Whether `session` has lost the lock, and how, as the store sees it now.
    pub fn loss_of(&self, session: u64) -> Option<LockLoss> {
        if self.params.store == StoreKind::Queue {
            return self.queue_loss_of(session);
        }
        match &self.holder {
            Some(h) if h.session == session => None,
            Some(_) => Some(LockLoss::Taken),
            None if self.sessions.contains_key(&session) => Some(LockLoss::Deleted),
            None => Some(LockLoss::SessionLost),
        }
    }

    // ---- operator faults ----

    /// Invalidates the holder's session, as a failing Consul node check would.
    pub fn operator_invalidate(&mut self, now: Instant) {
        match self.params.store {
            StoreKind::Queue => return self.queue_operator_invalidate(now),
            // No sessions in the store: the operator deletes the key.
            StoreKind::Forgetful | StoreKind::NonAtomic => return self.kv_operator_delete(now),
            StoreKind::Consul => {}
        }
        if let Some(h) = &self.holder {
            let (session, token) = (h.session, h.token);
            self.stats.operator_faults += 1;
            self.exempt.insert(token);
            self.invalidate(session, now, "invalidated by the operator");
        }
    }

    /// Deletes the election's key, as an operator would.
    pub fn operator_delete(&mut self, now: Instant) {
        match self.params.store {
            StoreKind::Queue => return self.queue_operator_delete(now),
            StoreKind::Forgetful | StoreKind::NonAtomic => return self.kv_operator_delete(now),
            StoreKind::Consul => {}
        }
        if let Some(h) = self.holder.take() {
            self.stats.operator_faults += 1;
            self.exempt.insert(h.token);
            self.released_last = false;
            let client = h.client;
            self.record(now, || {
                format!("operator deletes the key held by c{client}")
            });
            self.bump();
        }
    }

    // ---- the checker ----

    pub fn add_view(&mut self, status: watch::Receiver<Status>) {
        self.views.push(View {
            status,
            terms: Vec::new(),
            awaiting_demoted: None,
        });
    }

    /// At a grant, no other term may still be in force: every term is cancelled (the hard
    /// rule), and its worker, which honours cancellation and `stop_by`, has stopped.
    pub(super) fn check_grant(&mut self, client: usize, token: u64, now: Instant) {
        let mut found = Vec::new();
        for (c, view) in self.views.iter().enumerate() {
            for rec in view.terms.iter().filter(|r| {
                !self.exempt.contains(&r.token) && !self.forgotten.contains_key(&r.token)
            }) {
                if !rec.term.is_cancelled() {
                    found.push(format!(
                        "the store granted token {token} to c{client} while c{c}'s term {} was not cancelled",
                        rec.token
                    ));
                } else if rec.worker_stopped_at.is_none() {
                    found.push(format!(
                        "the store granted token {token} to c{client} while the worker of c{c}'s term {} was still running",
                        rec.token
                    ));
                }
            }
            let status = view.status.borrow();
            if status.is_leader() {
                let leading = status.term.as_ref().map_or(0, Term::fencing_token);
                if !self.exempt.contains(&leading)
                    && !self.forgotten.contains_key(&leading)
                    && !view.terms.iter().any(|r| r.token == leading)
                {
                    found.push(format!(
                        "the store granted token {token} to c{client} while c{c}'s status says it leads with term {leading}"
                    ));
                }
            }
        }
        for message in found {
            self.violation(now, message);
        }
    }

    /// A campaign's `Elected`: the previous term's `Demoted` came, the token grew, and no
    /// other term is in force.
    pub fn on_elected(&mut self, client: usize, term: &Term, now: Instant) {
        let token = term.fencing_token();
        self.stats.terms += 1;
        self.record(now, || format!("c{client} elected with token {token}"));
        if let Some(previous) = self.views[client].awaiting_demoted {
            self.violation(
                now,
                format!("c{client} was elected with token {token} before the Demoted of its term {previous}: a lost Demoted"),
            );
        }
        let forgotten = self.forgotten.contains_key(&token);
        if self.exempt.contains(&token) {
            self.stats.operator_anomalies += 1;
            self.record(now, || {
                format!("c{client}'s term {token} began on a grant an operator already undid")
            });
        } else if forgotten {
            self.stats.restart_anomalies += 1;
            self.record(now, || {
                format!("c{client}'s term {token} began on a grant a store restart already forgot")
            });
        } else if token <= self.max_token {
            let max = self.max_token;
            self.violation(
                now,
                format!("c{client}'s token {token} did not grow (an earlier term had {max})"),
            );
        }
        if !self.exempt.contains(&token) && !forgotten {
            self.max_token = self.max_token.max(token);
        }
        let mut found = Vec::new();
        for (c, view) in self.views.iter().enumerate() {
            for rec in &view.terms {
                let exempt = self.exempt.contains(&rec.token)
                    || self.exempt.contains(&token)
                    || self.forgotten.contains_key(&rec.token)
                    || forgotten;
                if !rec.term.is_cancelled() && !exempt {
                    found.push(format!(
                        "two terms in force at once: c{client}'s {token} and c{c}'s {}",
                        rec.token
                    ));
                }
            }
        }
        for message in found {
            self.violation(now, message);
        }
        let view = &mut self.views[client];
        view.awaiting_demoted = Some(token);
        view.terms.push(TermRec {
            term: term.clone(),
            token,
            cancelled_at: None,
            worker_stopped_at: None,
        });
    }

    /// A term's token was cancelled (seen by its worker at that instant). It must not come
    /// after its client saw the lock lost: nothing stands between the two.
    pub fn on_cancelled(&mut self, client: usize, token: u64, now: Instant) {
        self.record(now, || format!("c{client} term {token} cancelled"));
        if let Some(rec) = self.views[client]
            .terms
            .iter_mut()
            .find(|r| r.token == token)
        {
            rec.cancelled_at = Some(now);
        }
        // A term whose key a restart forgot overlaps the next one only until the old leader
        // hears of the loss: at most the renew deadline after the restart.
        if let Some(restart) = self.forgotten.get(&token).copied()
            && now > restart + self.renew_deadline
        {
            let late = now.duration_since(restart).as_secs_f64() * 1000.0;
            let deadline = self.renew_deadline;
            self.violation(
                now,
                format!("c{client}'s term {token}, whose key a store restart forgot, was cancelled {late:.3} ms after the restart, past the renew deadline {deadline:?}"),
            );
        }
        if let Some(seen) = self.loss_seen.get(&token).copied()
            && seen < now
        {
            let late = now.duration_since(seen).as_secs_f64() * 1000.0;
            self.violation(
                now,
                format!("c{client}'s term {token} was cancelled {late:.3} ms after its client saw the lock lost"),
            );
        }
    }

    pub fn on_worker_stopped(&mut self, client: usize, token: u64, now: Instant) {
        self.record(now, || format!("c{client} worker of term {token} stopped"));
        if let Some(rec) = self.views[client]
            .terms
            .iter_mut()
            .find(|r| r.token == token)
        {
            rec.worker_stopped_at = Some(now);
        }
    }

    /// A campaign's `Demoted`: for the term in force, after its cancellation.
    pub fn on_demoted(&mut self, client: usize, token: u64, now: Instant) {
        self.record(now, || format!("c{client} demoted from term {token}"));
        let view = &mut self.views[client];
        let expected = view.awaiting_demoted.take();
        let cancelled = view
            .terms
            .iter()
            .any(|r| r.token == token && r.term.is_cancelled());
        if expected != Some(token) {
            self.violation(
                now,
                format!("c{client} was demoted from term {token}, but the term in force was {expected:?}"),
            );
        }
        if !cancelled {
            self.violation(
                now,
                format!("c{client} was demoted from term {token} before its token was cancelled"),
            );
        }
    }

    /// A contender's `lost` returned: its client has seen the loss now.
    pub fn on_loss_seen(
        &mut self,
        client: usize,
        token: Option<u64>,
        loss: LockLoss,
        now: Instant,
    ) {
        self.record(now, || {
            format!("c{client} sees its lock lost ({loss:?}), term {token:?}")
        });
        if let Some(token) = token {
            self.loss_seen.entry(token).or_insert(now);
        }
    }

    /// The periodic step: expire sessions, check that at most one candidate leads, and say
    /// whether a leader is in place (its status says so and the store agrees).
    pub fn tick(&mut self, now: Instant) -> bool {
        self.expire_due(now);
        let leaders: Vec<(usize, u64)> = self
            .views
            .iter()
            .enumerate()
            .filter_map(|(c, v)| {
                let status = v.status.borrow();
                status
                    .is_leader()
                    .then(|| (c, status.term.as_ref().map_or(0, Term::fencing_token)))
            })
            .collect();
        let trusted: Vec<&(usize, u64)> = leaders
            .iter()
            .filter(|(_, t)| !self.exempt.contains(t) && !self.forgotten.contains_key(t))
            .collect();
        if trusted.len() > 1 {
            let message = format!("several candidates lead at once: {trusted:?} (client, token)");
            self.violation(now, message);
        }
        let holder = self.holder_client();
        leaders.iter().any(|(c, _)| Some(*c) == holder)
    }

    /// The checks at the end of a run: every `Demoted` came, every loss seen was acted on,
    /// and no candidate looped hot.
    pub fn finish(&mut self, now: Instant) {
        let settle = self.params.ttl * 2;
        let mut found = Vec::new();
        for (c, view) in self.views.iter().enumerate() {
            if let Some(token) = view.awaiting_demoted
                && let Some(rec) = view.terms.iter().find(|r| r.token == token)
                && rec.cancelled_at.is_some_and(|at| at + settle <= now)
            {
                found.push(format!(
                    "c{c}'s term {token} was cancelled but no Demoted came"
                ));
            }
        }
        for (token, seen) in &self.loss_seen {
            let open = self
                .views
                .iter()
                .flat_map(|v| &v.terms)
                .any(|r| r.token == *token && !r.term.is_cancelled());
            if open {
                found.push(format!(
                    "term {token} was still in force at the end, though its client saw the lock lost at {:.3} ms",
                    self.ms(*seen)
                ));
            }
        }
        for (c, seconds) in self.requests.iter().enumerate() {
            if let Some((second, count)) = seconds.iter().max_by_key(|(_, n)| **n) {
                self.stats.max_requests_per_second = self.stats.max_requests_per_second.max(*count);
                if *count > HOT_LOOP_BOUND {
                    found.push(format!(
                        "c{c} sent {count} requests in simulated second {second} (bound {HOT_LOOP_BOUND}): a hot loop"
                    ));
                }
            }
        }
        for message in found {
            self.violation(now, message);
        }
    }

    /// A one-line summary of the parameters, for the report.
    pub fn describe(&self) -> String {
        let p = &self.params;
        let mut s = String::new();
        let _ = write!(
            s,
            "ttl {:?}, lock-delay {:?}, faults for {:?} at intensity {:.2}, operator faults {}",
            p.ttl, p.lock_delay, p.faults_for, p.intensity, p.operator_faults
        );
        if p.store != StoreKind::Consul {
            let _ = write!(
                s,
                ", store {}, request timeout {:?}",
                p.store.name(),
                p.request_timeout
            );
            if p.store.polled() {
                let _ = write!(s, ", poll {:?}, restarts {}", p.poll, p.restarts);
            }
        }
        if let Some(bug) = p.bug {
            let _ = write!(s, ", planted bug {}", bug.name());
        }
        s
    }
}
