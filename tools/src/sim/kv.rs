//! The polled stores, Redis and memcached, as a store model and a backend: one key per
//! election holding the leader, its owner id and its fencing token, taken only while absent,
//! with a token from a counter key; no sessions in the store, only the key's expiry, restarted
//! by the candidate's renewals (the library's own [`KeepAlive`] drives them); followers poll.
//!
//! The backend follows `src/backend/polled` and the two stores step for step, with the
//! fixes:
//!
//! - **a store that forgets** (a restart without persistence): the next token is
//!   `max(counter + 1, store clock in ms, floor + 1)` (the floor: the highest token this
//!   candidate saw), so tokens never go back; a counter below the floor (or missing, when the
//!   candidate saw one) means the store lost its data, and the term begins only a ttl later
//!   ([`Attempt::Delayed`]). Planted bug [`Bug::CounterFromZero`]: `counter + 1`.
//! - **a non-atomic acquire** ([`StoreKind::NonAtomic`], memcached): `get`, `incr` of the
//!   counter (created at the clock when missing), `add` of the key, each a request; then the
//!   settle step reads the counter again and, if it moved, takes a new token and re-stamps the
//!   key before the term begins. Planted bug [`Bug::NoSettle`]: no settle step.
//! - **a lost answer**: a try that finds the key naming this contender's own owner id adopts
//!   it (after the settle step). Planted bug [`Bug::Orphan`]: it follows its own key.
//!
//! Simplifications, each on the safe side or outcome-equivalent: a `gets` + `cas` pair
//! (memcached's renewal, checked rewrite and checked delete) is one request here, as the
//! `cas` makes it one step; keys expire after exactly the ttl (memcached's are stored for a
//! second more); a proclaim rewrites the leader in place (no pending value); a follower's
//! contender and observer do not share their reads, nor wake each other.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use incumbent::backend::keepalive::{KeepAlive, Renewal};
use incumbent::backend::{
    Attempt, Backend, BackendInfo, Candidate, Contender, Leader, LockLoss, Observer, Session,
    SessionHealth, SessionOptions, Wakeup,
};
use incumbent::{Error, Result};
use tokio::sync::watch;
use tokio::time::{Instant, sleep_until};

use super::store::{SimBackend, World};
use super::world::{Bug, State, StoreKind};

const NAME: &str = "sim-kv";

/// The store's clock at the start of a run, in Unix milliseconds: tokens seeded from it
/// dwarf the counter's.
const EPOCH_MS: u64 = 1_700_000_000_000;

/// The election's key.
#[derive(Clone, Debug)]
pub struct Key {
    /// `<session>/<contender>`: whose value it is.
    pub owner: String,
    pub client: usize,
    pub token: u64,
    pub leader: Leader,
    pub expires_at: Instant,
}

/// The store's data: the key and the counter, both forgotten by a restart.
#[derive(Debug, Default)]
pub struct KvState {
    key: Option<Key>,
    counter: Option<u64>,
    /// Per client: the try whose first read found the key naming the client's own owner.
    probes: Vec<Option<(u64, u64)>>,
}

impl KvState {
    pub fn expiry(&self) -> Option<Instant> {
        self.key.as_ref().map(|k| k.expires_at)
    }

    pub fn holder_client(&self) -> Option<usize> {
        self.key.as_ref().map(|k| k.client)
    }
}

/// What a try's first step found.
#[derive(Clone, Debug)]
pub enum Acquired {
    Won { token: u64, went_back: bool },
    Held(Option<Key>),
}

/// What a renewal found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyState {
    Renewed,
    Gone,
    Other,
}

fn names(key: &Option<Key>, owner: &str, token: u64) -> bool {
    key.as_ref()
        .is_some_and(|k| k.owner == owner && k.token == token)
}

impl State {
    /// The store's clock in milliseconds.
    pub fn clock_ms(&self, now: Instant) -> u64 {
        EPOCH_MS + now.duration_since(self.start).as_millis() as u64
    }

    fn bugged(&self, bug: Bug) -> bool {
        self.params.bug == Some(bug)
    }

    /// Notes that a try's first read found the key naming the client's own owner.
    fn probe(&mut self, client: usize, owner: &str, attempt: u64) {
        if let Some(key) = &self.kv.key
            && key.owner == owner
        {
            let token = key.token;
            if self.kv.probes.len() <= client {
                self.kv.probes.resize(client + 1, None);
            }
            self.kv.probes[client] = Some((attempt, token));
        }
    }

    pub(super) fn kv_expire(&mut self, now: Instant) {
        if self.kv.key.as_ref().is_some_and(|k| k.expires_at <= now) {
            let key = self.kv.key.take().expect("checked");
            self.stats.expiries += 1;
            let (client, token) = (key.client, key.token);
            self.record(now, || {
                format!("the key of c{client} (token {token}) expired")
            });
            self.bump();
        }
    }

    fn kv_grant(
        &mut self,
        client: usize,
        owner: &str,
        token: u64,
        leader: &Leader,
        ttl: Duration,
        now: Instant,
    ) {
        self.stats.grants += 1;
        self.record(now, || {
            format!("store grants token {token} to c{client} ({owner})")
        });
        self.check_grant(client, token, now);
        let mut leader = leader.clone();
        leader.fencing_token = Some(token);
        self.kv.key = Some(Key {
            owner: owner.to_owned(),
            client,
            token,
            leader,
            expires_at: now + ttl,
        });
        self.bump();
    }

    /// Redis's acquisition script: one atomic step.
    #[allow(clippy::too_many_arguments)]
    pub fn kv_script(
        &mut self,
        client: usize,
        owner: &str,
        leader: &Leader,
        floor: u64,
        ttl: Duration,
        attempt: u64,
        now: Instant,
    ) -> Acquired {
        self.kv_expire(now);
        if let Some(key) = &self.kv.key {
            let key = key.clone();
            self.probe(client, owner, attempt);
            return Acquired::Held(Some(key));
        }
        let counter = self.kv.counter;
        let raw = counter.unwrap_or(0);
        let token = if self.bugged(Bug::CounterFromZero) {
            raw + 1
        } else {
            (raw + 1).max(self.clock_ms(now)).max(floor + 1)
        };
        let went_back = (counter.is_none() && floor > 0) || raw < floor;
        self.kv.counter = Some(token);
        self.kv_grant(client, owner, token, leader, ttl, now);
        Acquired::Won { token, went_back }
    }

    /// memcached's `get` of the key, as a try's first step.
    pub fn kv_get_first(
        &mut self,
        client: usize,
        owner: &str,
        attempt: u64,
        now: Instant,
    ) -> Option<Key> {
        self.kv_expire(now);
        self.probe(client, owner, attempt);
        self.kv.key.clone()
    }

    pub fn kv_read(&mut self, now: Instant) -> Option<Key> {
        self.kv_expire(now);
        self.kv.key.clone()
    }

    pub fn kv_counter(&self) -> Option<u64> {
        self.kv.counter
    }

    /// memcached's `incr`: nothing when the counter is missing.
    pub fn kv_incr(&mut self, delta: u64) -> Option<u64> {
        let counter = self.kv.counter.as_mut()?;
        *counter += delta;
        Some(*counter)
    }

    /// memcached's `cas` of the counter (by value here: the model has no cas ids): `new`
    /// while it still holds `seen`.
    pub fn kv_cas_counter(&mut self, seen: u64, new: u64) -> bool {
        match &mut self.kv.counter {
            Some(counter) if *counter == seen => {
                *counter = new;
                true
            }
            _ => false,
        }
    }

    /// memcached's `add` of the counter.
    pub fn kv_add_counter(&mut self, start: u64) -> bool {
        if self.kv.counter.is_some() {
            return false;
        }
        self.kv.counter = Some(start);
        true
    }

    /// memcached's `add` of the key.
    #[allow(clippy::too_many_arguments)]
    pub fn kv_add(
        &mut self,
        client: usize,
        owner: &str,
        token: u64,
        leader: &Leader,
        ttl: Duration,
        now: Instant,
    ) -> bool {
        self.kv_expire(now);
        if self.kv.key.is_some() {
            return false;
        }
        self.kv_grant(client, owner, token, leader, ttl, now);
        true
    }

    /// The settle step's checked rewrite: the key still holds our value with `old`; it gets
    /// `new`.
    pub fn kv_restamp(
        &mut self,
        owner: &str,
        old: u64,
        new: u64,
        ttl: Duration,
        now: Instant,
    ) -> bool {
        self.kv_expire(now);
        if !names(&self.kv.key, owner, old) {
            return false;
        }
        let key = self.kv.key.as_mut().expect("checked");
        key.token = new;
        key.leader.fencing_token = Some(new);
        key.expires_at = now + ttl;
        let client = key.client;
        self.record(now, || {
            format!("c{client} re-stamps its key: token {old} -> {new}")
        });
        self.bump();
        true
    }

    /// A renewal of our key: its expiry restarts from now.
    pub fn kv_renew(&mut self, owner: &str, token: u64, ttl: Duration, now: Instant) -> KeyState {
        self.kv_expire(now);
        match &mut self.kv.key {
            None => KeyState::Gone,
            Some(key) if key.owner == owner && key.token == token => {
                key.expires_at = now + ttl;
                KeyState::Renewed
            }
            Some(_) => KeyState::Other,
        }
    }

    pub fn kv_proclaim(&mut self, owner: &str, token: u64, leader: &Leader, now: Instant) -> bool {
        self.kv_expire(now);
        if !names(&self.kv.key, owner, token) {
            return false;
        }
        let key = self.kv.key.as_mut().expect("checked");
        key.leader.candidate = leader.candidate.clone();
        self.bump();
        true
    }

    /// The checked delete.
    pub fn kv_release(&mut self, owner: &str, token: u64, now: Instant) {
        self.kv_expire(now);
        if names(&self.kv.key, owner, token) {
            let client = self.kv.key.as_ref().map_or(0, |k| k.client);
            self.record(now, || {
                format!("c{client} releases its key (token {token})")
            });
            self.kv.key = None;
            self.bump();
        }
    }

    /// A restart without persistence: the key and the counter are gone.
    pub fn kv_restart(&mut self, now: Instant) {
        self.stats.restarts += 1;
        if let Some(key) = self.kv.key.take() {
            self.forgotten.insert(key.token, now);
        }
        let counter = self.kv.counter.take();
        self.record(now, || {
            format!("the store restarts and forgets the key and the counter {counter:?}")
        });
        self.bump();
    }

    pub(super) fn kv_operator_delete(&mut self, now: Instant) {
        if let Some(key) = self.kv.key.take() {
            self.stats.operator_faults += 1;
            self.exempt.insert(key.token);
            let client = key.client;
            self.record(now, || {
                format!("operator deletes the key held by c{client}")
            });
            self.bump();
        }
    }

    /// The orphan check, when a try of `client` returned an answer: if the try's first read
    /// found the key naming the client's own owner, the try must have taken it (the client
    /// holds it now) or that key must be gone (expired, replaced; a late request of an
    /// earlier try may have written a new one since, which the next try adopts). Otherwise
    /// the key names a candidate that does not lead, and nobody renews it: an orphan until it
    /// expires.
    pub fn kv_check_orphan(
        &mut self,
        client: usize,
        owner: &str,
        attempt: u64,
        holds: bool,
        now: Instant,
    ) {
        let probe = self.kv.probes.get_mut(client).and_then(Option::take);
        let Some((probed, token)) = probe else {
            return;
        };
        if probed != attempt || holds {
            return;
        }
        if let Some(key) = &self.kv.key
            && key.owner == owner
            && key.token == token
        {
            let expires = self.ms(key.expires_at);
            let message = format!(
                "c{client}'s try found the key naming its own owner {owner} (token {token}) and left it: an orphan, held by no leader until it expires at {expires:.3} ms"
            );
            self.push_violation(now, message);
        }
    }
}

/// One candidate's client of the polled store (one process: its own floor).
#[derive(Clone)]
pub struct KvBackend {
    net: SimBackend,
    world: Arc<World>,
    client: usize,
    /// The highest token this process saw: the floor of its next acquisition.
    seen: Arc<Mutex<u64>>,
    sessions: Arc<AtomicU64>,
    /// After a release by this process's contender: until when it leaves the key to the
    /// others (`COURTESY_POLLS` = 2 poll intervals), as followers poll.
    courtesy: Arc<Mutex<Option<Instant>>>,
}

impl KvBackend {
    pub fn new(world: Arc<World>, client: usize) -> KvBackend {
        KvBackend {
            net: SimBackend::new(world.clone(), client),
            world,
            client,
            seen: Arc::default(),
            sessions: Arc::default(),
            courtesy: Arc::default(),
        }
    }

    fn saw(&self, token: Option<u64>) -> u64 {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(token) = token {
            *seen = (*seen).max(token);
        }
        *seen
    }

    /// A contender of this process released the key: it leaves it to the others for two
    /// polls.
    fn released(&self) {
        let until = Instant::now() + self.world.lock().params.poll * 2;
        *self.courtesy.lock().unwrap_or_else(|p| p.into_inner()) = Some(until);
    }

    fn courtesy(&self) -> Option<Instant> {
        let until = *self.courtesy.lock().unwrap_or_else(|p| p.into_inner());
        until.filter(|until| *until > Instant::now())
    }

    fn kind(&self) -> StoreKind {
        self.world.lock().params.store
    }

    /// The next poll, jittered by ±25 %.
    fn poll_at(&self) -> Instant {
        let mut state = self.world.lock();
        let poll = state.params.poll;
        let factor = 0.75 + state.rng.f64() * 0.5;
        Instant::now() + poll.mul_f64(factor)
    }
}

fn store_error(reason: String) -> Error {
    Error::Store {
        backend: NAME,
        reason,
    }
}

/// The keys a session renews (one election: at most one).
#[derive(Default)]
struct HeldState {
    key: Option<HeldKey>,
    /// When the last renewal took the list of keys.
    listed_at: Option<Instant>,
}

struct HeldKey {
    owner: String,
    token: u64,
    loss: watch::Sender<Option<LockLoss>>,
}

type Held = Arc<Mutex<HeldState>>;

fn lock(held: &Held) -> std::sync::MutexGuard<'_, HeldState> {
    held.lock().unwrap_or_else(|p| p.into_inner())
}

async fn renew(backend: KvBackend, held: Held, ttl: Duration) -> Result<Renewal> {
    let snapshot = {
        let mut held = lock(&held);
        held.listed_at = Some(Instant::now());
        held.key.as_ref().map(|k| (k.owner.clone(), k.token))
    };
    let Some((owner, token)) = snapshot else {
        backend.net.call(|_, _| ()).await?;
        return Ok(Renewal::Alive);
    };
    let asked = owner.clone();
    let state = backend
        .net
        .call(move |state, now| state.kv_renew(&asked, token, ttl, now))
        .await?;
    let loss = match state {
        KeyState::Renewed => return Ok(Renewal::Alive),
        KeyState::Gone => LockLoss::Deleted,
        KeyState::Other => LockLoss::Taken,
    };
    let mut held = lock(&held);
    if held
        .key
        .as_ref()
        .is_some_and(|k| k.owner == owner && k.token == token)
        && let Some(lost) = held.key.take()
    {
        lost.loss.send_replace(Some(loss));
    }
    Ok(Renewal::Alive)
}

impl Backend for KvBackend {
    type Session = KvSession;
    type Observer = KvObserver;

    fn info(&self) -> BackendInfo {
        let poll = self.world.lock().params.poll;
        BackendInfo {
            wakeup: Wakeup::Poll(poll),
            max_lock_delay: None,
            // Hand-overs are not simulated: `take_over` is the default (an acquire).
            ..BackendInfo::new(NAME, Duration::from_millis(1), Duration::from_secs(86_400))
        }
    }

    async fn open_session(&self, options: &SessionOptions) -> Result<KvSession> {
        let sent = Instant::now();
        self.net.call(|_, _| ()).await?;
        let n = self.sessions.fetch_add(1, Ordering::Relaxed);
        let id = format!("c{}-s{n}", self.client);
        let held: Held = Arc::default();
        let (renewing, renewed, ttl) = (self.clone(), held.clone(), options.ttl);
        let keepalive = KeepAlive::spawn(NAME, &id, options, sent, move || {
            renew(renewing.clone(), renewed.clone(), ttl)
        });
        Ok(KvSession {
            shared: Arc::new(Shared {
                backend: self.clone(),
                id,
                ttl,
                held,
                keepalive,
                contenders: AtomicU64::new(0),
            }),
        })
    }

    async fn observe(&self, _election: &str) -> Result<KvObserver> {
        Ok(KvObserver {
            backend: self.clone(),
            last: None,
            poll_at: None,
        })
    }
}

struct Shared {
    backend: KvBackend,
    id: String,
    ttl: Duration,
    held: Held,
    keepalive: KeepAlive,
    contenders: AtomicU64,
}

/// A process-local session: alive while its renewals are answered.
pub struct KvSession {
    shared: Arc<Shared>,
}

impl Session for KvSession {
    type Contender = KvContender;

    fn id(&self) -> String {
        self.shared.id.clone()
    }

    fn health(&self) -> watch::Receiver<SessionHealth> {
        self.shared.keepalive.health()
    }

    async fn contend(&self, _election: &str, candidate: &Candidate) -> Result<KvContender> {
        let n = self.shared.contenders.fetch_add(1, Ordering::Relaxed);
        Ok(KvContender {
            shared: self.shared.clone(),
            owner: format!("{}/{n}", self.shared.id),
            candidate: candidate.clone(),
            held: None,
            last: None,
            loss: None,
            poll_at: None,
            uncertain: false,
            tries: 0,
        })
    }

    async fn close(self) -> Result<()> {
        self.shared.keepalive.stop();
        let key = lock(&self.shared.held).key.take();
        if let Some(key) = key {
            let (owner, token) = (key.owner, key.token);
            self.shared
                .backend
                .net
                .call(move |state, now| state.kv_release(&owner, token, now))
                .await?;
        }
        Ok(())
    }
}

/// One session's claim on the election's key.
pub struct KvContender {
    shared: Arc<Shared>,
    owner: String,
    candidate: Candidate,
    /// The token while we hold the key.
    held: Option<u64>,
    /// The token of the last term, for `explain`.
    last: Option<u64>,
    loss: Option<watch::Receiver<Option<LockLoss>>>,
    poll_at: Option<Instant>,
    /// Set while an acquire is unanswered, and left set when its answer was lost.
    uncertain: bool,
    tries: u64,
}

impl KvContender {
    fn backend(&self) -> &KvBackend {
        &self.shared.backend
    }

    fn forget(&mut self) {
        let mut held = lock(&self.shared.held);
        if held
            .key
            .as_ref()
            .is_some_and(|k| k.owner == self.owner && Some(k.token) == self.held)
        {
            held.key = None;
        }
        drop(held);
        self.held = None;
        self.loss = None;
    }

    /// memcached's next token: `incr`, or the counter created at the clock, then `incr`.
    async fn next_token(&self) -> Result<(u64, bool)> {
        let net = &self.backend().net;
        if let Some(token) = net.call(|state, _| state.kv_incr(1)).await? {
            return self.raised_to_clock(token, false).await;
        }
        let start = {
            let state = self.backend().world.lock();
            if state.params.bug == Some(Bug::CounterFromZero) {
                0
            } else {
                state.clock_ms(Instant::now())
            }
        };
        net.call(move |state, _| state.kv_add_counter(start))
            .await?;
        let token = net
            .call(|state, _| state.kv_incr(1))
            .await?
            .ok_or_else(|| {
                store_error("the fencing counter vanished right after it was created".into())
            })?;
        self.raised_to_clock(token, true).await
    }

    /// As `src/memcached/store.rs`: a token below the clock is raised to it, by a checked
    /// write of the clock into the counter (`gets` + `cas`), then an `incr`.
    async fn raised_to_clock(&self, mut token: u64, created: bool) -> Result<(u64, bool)> {
        let net = &self.backend().net;
        // The clock once: a token at least the clock when this acquisition began.
        let now = {
            let state = self.backend().world.lock();
            if state.params.bug == Some(Bug::CounterFromZero) {
                return Ok((token, created));
            }
            state.clock_ms(Instant::now())
        };
        for _ in 0..5 {
            if token >= now {
                return Ok((token, created));
            }
            match net.call(|state, _| state.kv_counter()).await? {
                Some(seen) if seen < now => {
                    net.call(move |state, _| state.kv_cas_counter(seen, now))
                        .await?;
                }
                Some(_) => {}
                None => {
                    net.call(move |state, _| state.kv_add_counter(now)).await?;
                }
            }
            token = net
                .call(|state, _| state.kv_incr(1))
                .await?
                .ok_or_else(|| store_error("the fencing counter vanished".into()))?;
        }
        Err(store_error("the fencing counter kept changing".into()))
    }

    /// memcached's acquisition: `get`, the next token, `add`.
    async fn steps(&self, leader: Leader, floor: u64, attempt: u64) -> Result<Acquired> {
        let net = &self.backend().net;
        let (client, owner, ttl) = (self.backend().client, self.owner.clone(), self.shared.ttl);
        let asked = owner.clone();
        if let Some(key) = net
            .call(move |state, now| state.kv_get_first(client, &asked, attempt, now))
            .await?
        {
            return Ok(Acquired::Held(Some(key)));
        }
        let (mut token, created) = self.next_token().await?;
        let went_back = token <= floor || (created && floor > 0);
        let bugged = self.backend().world.lock().params.bug == Some(Bug::CounterFromZero);
        if token <= floor && !bugged {
            token = net
                .call(move |state, _| state.kv_incr(floor + 1 - token))
                .await?
                .ok_or_else(|| store_error("the fencing counter vanished".into()))?;
        }
        let asked = owner.clone();
        let added = net
            .call(move |state, now| state.kv_add(client, &asked, token, &leader, ttl, now))
            .await?;
        if !added {
            let holder = net.call(|state, now| state.kv_read(now)).await?;
            return Ok(Acquired::Held(holder));
        }
        Ok(Acquired::Won { token, went_back })
    }

    /// The settle step (memcached): the counter still at our token, or a new token written
    /// into our key with a checked write. `None`: the key is no longer ours.
    async fn settle(&self, token: u64) -> Result<Option<u64>> {
        let (kind, bug) = {
            let state = self.backend().world.lock();
            (state.params.store, state.params.bug)
        };
        if kind != StoreKind::NonAtomic || bug == Some(Bug::NoSettle) {
            return Ok(Some(token));
        }
        let net = &self.backend().net;
        if net.call(|state, _| state.kv_counter()).await? == Some(token) {
            return Ok(Some(token));
        }
        let (newer, _) = self.next_token().await?;
        let (owner, ttl) = (self.owner.clone(), self.shared.ttl);
        let restamped = net
            .call(move |state, now| state.kv_restamp(&owner, token, newer, ttl, now))
            .await?;
        Ok(restamped.then_some(newer))
    }

    /// The term begins on our key with `token` (see `PolledContender::take`).
    async fn take(
        &mut self,
        token: u64,
        went_back: bool,
        sent: Option<Instant>,
    ) -> Result<Attempt> {
        self.backend().saw(Some(token));
        let (loss, lost) = watch::channel(None);
        let listed_since = {
            let mut held = lock(&self.shared.held);
            held.key = Some(HeldKey {
                owner: self.owner.clone(),
                token,
                loss,
            });
            match (sent, held.listed_at) {
                (Some(sent), Some(listed)) => listed > sent,
                (Some(_), None) => false,
                (None, _) => true,
            }
        };
        self.held = Some(token);
        self.last = Some(token);
        self.loss = Some(lost);
        if listed_since {
            let (owner, ttl) = (self.owner.clone(), self.shared.ttl);
            let renewed = self
                .backend()
                .net
                .call(move |state, now| state.kv_renew(&owner, token, ttl, now))
                .await;
            match renewed {
                Ok(KeyState::Renewed) => {}
                Ok(_) => {
                    self.forget();
                    return Ok(Attempt::Held { holder: None });
                }
                Err(error) => {
                    self.forget();
                    return Err(error);
                }
            }
        }
        if went_back {
            return Ok(Attempt::Delayed {
                until: Instant::now() + self.shared.ttl,
            });
        }
        Ok(Attempt::Won {
            fencing_token: token,
        })
    }

    async fn try_once(&mut self, attempt: u64) -> Result<Attempt> {
        if let Some(fencing_token) = self.held {
            let now = self
                .backend()
                .net
                .call(|state, now| state.kv_read(now))
                .await?;
            if now.is_some_and(|k| k.owner == self.owner && k.token == fencing_token) {
                return Ok(Attempt::Won { fencing_token });
            }
            self.forget();
        }
        if let Some(until) = self.backend().courtesy() {
            return Ok(Attempt::Delayed { until });
        }
        let leader = Leader {
            candidate: self.candidate.clone(),
            fencing_token: None,
            since_unix_ms: None,
        };
        let floor = self.backend().saw(None);
        let (client, owner, ttl) = (self.backend().client, self.owner.clone(), self.shared.ttl);
        let sent = Instant::now();
        self.uncertain = true;
        let acquired = match self.backend().kind() {
            StoreKind::NonAtomic => self.steps(leader, floor, attempt).await?,
            _ => {
                self.backend()
                    .net
                    .call(move |state, now| {
                        state.kv_script(client, &owner, &leader, floor, ttl, attempt, now)
                    })
                    .await?
            }
        };
        self.uncertain = false;
        let adopt = self.backend().world.lock().params.bug != Some(Bug::Orphan);
        match acquired {
            Acquired::Won { token, went_back } => match self.settle(token).await? {
                Some(token) => self.take(token, went_back, Some(sent)).await,
                None => Ok(Attempt::Held { holder: None }),
            },
            Acquired::Held(Some(key)) if adopt && key.owner == self.owner => {
                // Written by a try of ours whose answer was lost: adopt it.
                match self.settle(key.token).await? {
                    Some(token) => self.take(token, false, None).await,
                    None => Ok(Attempt::Held { holder: None }),
                }
            }
            Acquired::Held(key) => {
                let holder = key.map(|k| k.leader);
                self.backend()
                    .saw(holder.as_ref().and_then(|l| l.fencing_token));
                Ok(Attempt::Held { holder })
            }
        }
    }
}

impl Contender for KvContender {
    async fn acquire(&mut self) -> Result<Attempt> {
        self.tries += 1;
        let attempt = self.tries;
        let out = self.try_once(attempt).await;
        if out.is_ok() {
            let client = self.backend().client;
            let holds = self.held.is_some();
            self.backend().world.lock().kv_check_orphan(
                client,
                &self.owner,
                attempt,
                holds,
                Instant::now(),
            );
        }
        out
    }

    async fn wait(&mut self) -> Result<()> {
        let at = match self.poll_at {
            Some(at) => at,
            None => {
                let at = self.backend().poll_at();
                self.poll_at = Some(at);
                at
            }
        };
        sleep_until(at).await;
        self.poll_at = None;
        Ok(())
    }

    async fn lost(&mut self) -> LockLoss {
        let mut health = self.shared.keepalive.health();
        let mut told = None;
        if let Some(loss) = &mut self.loss {
            tokio::select! {
                biased;
                reason = loss.wait_for(Option::is_some) => {
                    told = Some(reason.ok().and_then(|r| *r).unwrap_or(LockLoss::SessionLost));
                }
                _ = health.wait_for(|h| h.lost.is_some()) => {}
            }
        } else {
            let _ = health.wait_for(|h| h.lost.is_some()).await;
        }
        let loss = told.unwrap_or(LockLoss::SessionLost);
        let client = self.backend().client;
        self.backend()
            .world
            .lock()
            .on_loss_seen(client, self.held, loss, Instant::now());
        loss
    }

    /// A vanished key whose counter is gone or below our token: the store lost its data.
    async fn explain(&mut self, loss: LockLoss) -> LockLoss {
        if loss != LockLoss::Deleted {
            return loss;
        }
        let Some(token) = self.last else { return loss };
        match self.backend().net.call(|state, _| state.kv_counter()).await {
            Ok(counter) if counter.is_none_or(|c| c < token) => LockLoss::SessionLost,
            _ => loss,
        }
    }

    async fn proclaim(&mut self, leader: &Leader) -> Result<()> {
        let Some(token) = self.held else {
            return Err(store_error("cannot proclaim: not held".into()));
        };
        let (owner, leader) = (self.owner.clone(), leader.clone());
        let done = self
            .backend()
            .net
            .call(move |state, now| state.kv_proclaim(&owner, token, &leader, now))
            .await?;
        if done {
            Ok(())
        } else {
            Err(store_error(
                "cannot proclaim: the key is no longer ours".into(),
            ))
        }
    }

    async fn release(&mut self) -> Result<()> {
        let net = self.backend().net.clone();
        let owner = self.owner.clone();
        let Some(token) = self.held else {
            if !std::mem::take(&mut self.uncertain) {
                return Ok(());
            }
            // An acquire's answer was lost: the key may be ours without our knowing.
            if let Some(key) = net.call(|state, now| state.kv_read(now)).await?
                && key.owner == owner
            {
                net.call(move |state, now| state.kv_release(&owner, key.token, now))
                    .await?;
                self.backend().released();
            }
            return Ok(());
        };
        self.forget();
        let released = net
            .call(move |state, now| state.kv_release(&owner, token, now))
            .await;
        self.backend().released();
        released
    }
}

impl Drop for KvContender {
    fn drop(&mut self) {
        self.forget();
    }
}

/// Polls the key; reports each change of holder.
pub struct KvObserver {
    backend: KvBackend,
    last: Option<Option<Leader>>,
    poll_at: Option<Instant>,
}

impl Observer for KvObserver {
    async fn next(&mut self) -> Result<Option<Leader>> {
        loop {
            if self.last.is_some() {
                let at = match self.poll_at {
                    Some(at) => at,
                    None => {
                        let at = self.backend.poll_at();
                        self.poll_at = Some(at);
                        at
                    }
                };
                sleep_until(at).await;
                self.poll_at = None;
            }
            let key = self
                .backend
                .net
                .call(|state, now| state.kv_read(now))
                .await?;
            let leader = key.map(|k| k.leader);
            self.backend
                .saw(leader.as_ref().and_then(|l| l.fencing_token));
            if self.last.as_ref() != Some(&leader) {
                self.last = Some(leader.clone());
                return Ok(leader);
            }
        }
    }
}
