//! The core of the backends whose followers poll: Redis, memcached and PostgreSQL.
//!
//! Each keeps one key (a row, on PostgreSQL) per election, holding the leader as JSON with its fencing token, taken
//! only while it is absent, with a token from a counter key bumped in the same step. Neither
//! store knows sessions: a session is process-local (a random id and the keys its elections
//! hold), alive as long as one renewal per renew interval rewrites every held key whose value
//! is still ours. Followers poll the key with jitter, unless the store pushes changes (Redis
//! keyspace notifications).
//!
//! What differs between the stores is the wire: a [`Store`] takes the key, renews, replaces
//! and releases values, reads the key and the counter. Everything else is here, once:
//! sessions shared among elections, contenders and observers, the floor of the next token,
//! the wake-ups of a release in this process, and the courtesy that keeps a resigning
//! campaign from winning its own lock back before followers elsewhere had a poll.
//!
//! Users meet these types under their backends' names
//! ([`RedisBackend`](crate::redis::RedisBackend),
//! [`MemcachedContender`](crate::memcached::MemcachedContender), …). [`Store`] is sealed: the
//! stores are this crate's.

mod contender;
mod session;

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

pub use contender::{PolledContender, PolledObserver};
pub use session::PolledSession;

use super::pool::SessionPool;
use super::{Backend, BackendInfo, SessionOptions, Wakeup, lock};
use crate::Result;

/// After a release by a contender of a backend whose followers poll, how many poll intervals
/// the campaign that released the key (the session handle its contender came from) leaves
/// it to followers in other processes: each of them polls at least once in 1.25 intervals,
/// and would otherwise lose the race to the resigning campaign's own retry. Every other
/// campaign, in this process too, may take the key at once.
pub const COURTESY_POLLS: u32 = 2;

pub use super::PUSH_COURTESY;

/// The key prefix under which elections live unless [`PolledBuilder::prefix`] says otherwise.
pub const DEFAULT_PREFIX: &str = "incumbent/";
/// How often followers poll unless [`PolledBuilder::poll_interval`] says otherwise.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(500);

/// The environment variable that sets the poll interval of a store built from its URL
/// (Redis, memcached, PostgreSQL; the CLI's `--backend`), e.g. `INCUMBENT_POLL_INTERVAL=100ms`:
/// a follower's hand-off takes about half of it, and costs one request per poll.
pub const POLL_INTERVAL_ENV: &str = "INCUMBENT_POLL_INTERVAL";
/// The longest poll interval a builder accepts: a follower that polls less often than once
/// an hour is a mistake (and the instants computed from it must not overflow).
pub const MAX_POLL_INTERVAL: Duration = Duration::from_secs(3600);

/// Settings for a backend on a store whose followers poll, made by
/// [`RedisBackend::builder`](crate::redis::RedisBackend::builder) or
/// [`MemcachedBackend::builder`](crate::memcached::MemcachedBackend::builder) and finished by
/// their `connect`. `C` holds the store's own settings.
#[derive(Clone, Debug)]
pub struct PolledBuilder<C> {
    pub(crate) store: C,
    pub(crate) prefix: String,
    pub(crate) poll_interval: Duration,
}

impl<C> PolledBuilder<C> {
    pub(crate) fn new(store: C) -> Self {
        PolledBuilder {
            store,
            prefix: DEFAULT_PREFIX.to_owned(),
            poll_interval: DEFAULT_POLL_INTERVAL,
        }
    }

    /// The prefix of every key this backend writes (default [`DEFAULT_PREFIX`]): the election
    /// `jobs/a` lives at `<prefix>jobs/a`, its fencing counter at `<prefix>jobs/a:fencing`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How often followers poll (default [`DEFAULT_POLL_INTERVAL`]), jittered by ±25 %: a
    /// hand-off takes about half of it, and each follower process sends one request per
    /// poll and election. On Redis, while keyspace notifications are off.
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// The poll interval of [`POLL_INTERVAL_ENV`] (its value `text`) when it is set
    /// (`250ms`, `2s`): what a store's URL form (`from_url`, the CLI's `--backend`) applies,
    /// since the URL has no place for it. Errors:
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig) for a value that is not a whole
    /// number of `ms` or `s`.
    #[cfg_attr(
        not(any(feature = "redis", feature = "memcached", feature = "postgres")),
        allow(dead_code)
    )]
    pub(crate) fn poll_interval_from(
        self,
        text: Option<String>,
        backend: &'static str,
    ) -> Result<Self> {
        let Some(text) = text else {
            return Ok(self);
        };
        let trimmed = text.trim();
        let parsed = match trimmed.strip_suffix("ms") {
            Some(ms) => ms.trim().parse().ok().map(Duration::from_millis),
            None => trimmed
                .strip_suffix('s')
                .and_then(|s| s.trim().parse().ok())
                .map(Duration::from_secs),
        };
        match parsed {
            Some(interval) => Ok(self.poll_interval(interval)),
            None => Err(crate::Error::InvalidConfig {
                backend,
                reason: format!(
                    "{POLL_INTERVAL_ENV}={text:?}: write a whole number of milliseconds or \
                     seconds, e.g. 250ms or 2s"
                ),
            }),
        }
    }

    /// Refuses a zero poll interval, and one above [`MAX_POLL_INTERVAL`].
    #[cfg_attr(
        not(any(feature = "redis", feature = "memcached", feature = "postgres")),
        allow(dead_code)
    )]
    pub(crate) fn check_poll(&self, backend: &'static str) -> Result<()> {
        let reason = if self.poll_interval.is_zero() {
            "the poll interval must be above zero (e.g. 500ms)".to_owned()
        } else if self.poll_interval > MAX_POLL_INTERVAL {
            format!(
                "the poll interval {:?} is above the largest allowed, {MAX_POLL_INTERVAL:?}: \
                 followers would take that long to notice a free lock (e.g. 500ms)",
                self.poll_interval
            )
        } else {
            return Ok(());
        };
        Err(crate::Error::InvalidConfig { backend, reason })
    }
}

/// The highest fencing token a polled store hands out, and the highest this crate takes from
/// one: 2^53 − 1. Up to it, a token is exact in Redis's Lua (whose numbers are doubles) and in
/// JSON readers that use doubles (JavaScript); tokens seeded from the clock in milliseconds
/// stay below it for some 280,000 years. A larger value in the store (a counter or a leader's
/// token) is corrupt or hostile: it is refused with [`Error::Store`](crate::Error::Store),
/// never wrapped or trusted as a floor.
pub const MAX_TOKEN: u64 = (1 << 53) - 1;

/// `token`, if it is a token a polled store can hand out (1 to [`MAX_TOKEN`]); otherwise the
/// error that names `what` held it.
pub(crate) fn checked_token(backend: &'static str, what: &str, token: u64) -> Result<u64> {
    if (1..=MAX_TOKEN).contains(&token) {
        return Ok(token);
    }
    Err(crate::Error::Store {
        backend,
        reason: format!(
            "{what} holds the fencing token {token}, outside 1..={MAX_TOKEN}: a corrupt or \
             hostile value, refused (delete it; incumbent seeds the next token from the clock)"
        ),
    })
}

/// What one key looked like to a renewal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyState {
    /// Still ours: its expiry was restarted.
    Renewed,
    /// It held the [pending](Renewing::pending) value (a proclaim whose answer was lost did
    /// execute): its expiry was restarted, and that value is ours from now on.
    RenewedPending,
    /// Gone.
    Gone,
    /// Another value: someone else holds it.
    Other,
}

/// One key for a renewal to restart: ours while it holds `value` (or `pending`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Renewing {
    /// The election's key.
    pub key: String,
    /// Our value.
    pub value: Vec<u8>,
    /// The value a proclaim wrote without an answer, which the store may hold instead.
    pub pending: Option<Vec<u8>>,
}

/// What taking a key found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Acquired {
    /// Taken, with this token; `went_back` when the counter was below the floor (the store
    /// lost its data) and was raised past it.
    Won {
        /// The new term's token.
        token: u64,
        /// Whether the counter had gone back.
        went_back: bool,
    },
    /// Held by someone.
    Held {
        /// The holder's value, if it could still be read.
        value: Option<Vec<u8>>,
        /// How long the holder's lease has left without a renewal, on the store's clock,
        /// where the store says (PostgreSQL): a follower tries again right after it, not only
        /// at its next poll, so a crashed holder is replaced one ttl after its last renewal.
        expires_in: Option<Duration>,
    },
}

/// One attempt to take an election's key.
#[derive(Clone, Copy, Debug)]
pub struct Claim<'a> {
    /// The election's key.
    pub key: &'a str,
    /// Its fencing counter.
    pub counter: &'a str,
    /// The value is `before`, the token in decimal, `after`.
    pub before: &'a [u8],
    /// See `before`.
    pub after: &'a [u8],
    /// How long the key lives without a renewal.
    pub ttl: Duration,
    /// The highest token seen for the election: the new one must be greater.
    pub floor: u64,
    /// A hand-over's escrow: the key is taken also while it holds exactly these bytes (a
    /// leader's value that names this candidate as its successor), in the same atomic step.
    pub escrow: Option<&'a [u8]>,
}

/// Keeps [`Store`] to this crate's stores.
pub(crate) mod sealed {
    /// Implemented by this crate's stores only.
    pub trait Sealed {}
}

/// The wire of a store whose followers poll: the few operations the core needs. Each is one
/// request (or script) where the store allows it. Sealed: implemented by this crate's Redis
/// and memcached stores.
pub trait Store: sealed::Sealed + fmt::Debug + Send + Sync + 'static {
    /// Short name, for logs, metrics and errors.
    const NAME: &'static str;

    /// What the name of an election's fencing counter adds to its key: `":fencing"` where the
    /// counter is a key of its own (Redis, memcached), `""` where it lives with the holder
    /// (PostgreSQL's row).
    const COUNTER_SUFFIX: &'static str = ":fencing";

    /// Refuses session options the store cannot honour (memcached: a ttl in whole seconds).
    fn check(&self, _options: &SessionOptions) -> Result<()> {
        Ok(())
    }

    /// Whether the store answers (a session's renewal while it holds no key).
    fn ping(&self) -> impl Future<Output = Result<()>> + Send;

    /// The value of `key`, `None` while it is absent.
    fn read(&self, key: &str) -> impl Future<Output = Result<Option<Vec<u8>>>> + Send;

    /// The value of `key` and how long its lease runs yet, where the store tells it in the
    /// same read (PostgreSQL); `None` for the time where it does not (the default). An
    /// observer reads again right after that time: a holder that dies is seen gone at its
    /// expiry, not at the next poll, on a store that pushes no expiry.
    fn read_expiring(
        &self,
        key: &str,
    ) -> impl Future<Output = Result<Option<(Vec<u8>, Option<Duration>)>>> + Send {
        async move { Ok(self.read(key).await?.map(|value| (value, None))) }
    }

    /// The value of a fencing counter, `None` while it is absent.
    fn counter(&self, counter: &str) -> impl Future<Output = Result<Option<u64>>> + Send;

    /// Takes the claim's key if it is absent (or holds the claim's escrow), with a token above
    /// the claim's floor, above
    /// every token the store handed out for the election before (its counter), and, where
    /// the counter can vanish or go back, at least the store's clock in milliseconds.
    fn acquire(&self, claim: Claim<'_>) -> impl Future<Output = Result<Acquired>> + Send;

    /// After `acquire` took the key with `token` (or a lost answer's key was found ours):
    /// makes sure that no greater token was handed out meanwhile, where the acquisition was
    /// not one atomic step (memcached: a candidate's `add` delayed after its `incr`, while
    /// another term began and ended). Returns the token the key holds now, a new one if it
    /// had to be raised, or `None` when the key is no longer ours.
    fn settle(
        &self,
        _claim: Claim<'_>,
        token: u64,
    ) -> impl Future<Output = Result<Option<u64>>> + Send {
        std::future::ready(Ok(Some(token)))
    }

    /// Restarts the expiry of every key of `held` that still holds its value (or its pending
    /// value); one state per key, in order.
    fn renew(
        &self,
        held: &[Renewing],
        ttl: Duration,
    ) -> impl Future<Output = Result<Vec<KeyState>>> + Send;

    /// Replaces `key`'s value `ours` with `new` (expiry `ttl`); whether it was still `ours`.
    fn replace(
        &self,
        key: &str,
        ours: &[u8],
        new: &[u8],
        ttl: Duration,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// Deletes `key` if its value is `ours`.
    fn release(&self, key: &str, ours: &[u8]) -> impl Future<Output = Result<()>> + Send;

    /// A wake-up that changes when the store says `key` changed, where it pushes changes.
    fn subscribe(&self, _key: &str) -> Option<watch::Receiver<u64>> {
        None
    }

    /// Until the writes of `key` by this process's acquisitions, dropped or not, have been
    /// answered, where a later read could overtake one (requests on separate streams of one
    /// connection); nothing where the store answers a connection's requests in order.
    fn writes_settled(&self, _key: &str) -> impl Future<Output = ()> + Send {
        std::future::ready(())
    }
}

/// The base of a polled backend's [`BackendInfo`]; each backend sets its ttl bounds.
pub(crate) fn info(name: &'static str, wakeup: Wakeup) -> BackendInfo {
    BackendInfo {
        wakeup,
        ..BackendInfo::new(name, Duration::ZERO, Duration::MAX)
    }
}

/// A backend on a [`Store`]: [`RedisBackend`](crate::redis::RedisBackend) and
/// [`MemcachedBackend`](crate::memcached::MemcachedBackend). Cheap to clone: clones share
/// the connection and the sessions.
pub struct PolledBackend<S> {
    inner: Arc<Inner<S>>,
}

impl<S> Clone for PolledBackend<S> {
    fn clone(&self) -> Self {
        PolledBackend {
            inner: self.inner.clone(),
        }
    }
}

struct Inner<S> {
    store: S,
    prefix: String,
    /// How followers learn of changes: pushed, or a poll at this interval.
    wakeup: Wakeup,
    /// The pause between two polls of a follower, before jitter.
    poll: Duration,
    info: BackendInfo,
    sessions: SessionPool<session::Shared<S>>,
    /// The highest fencing token seen per election key, the floor of the next acquisition.
    seen: Mutex<HashMap<String, u64>>,
    /// Bumped per key when a contender of this backend releases it: followers and observers
    /// in this process wake at once, whatever the store pushes.
    released: Wakes,
    /// Bumped per key when an observer of this backend reads it free after it was held:
    /// followers in this process try at once instead of at their own next poll.
    freed: Wakes,
    /// The value of each key as a contender of this backend last read it (while it polls),
    /// for this backend's observers of the key: they need not read it themselves.
    reads: Mutex<HashMap<String, watch::Sender<Option<Vec<u8>>>>>,
    /// The keys released by this backend's campaigns, left to the others for a while.
    courtesy: super::courtesy::Courtesy,
}

impl<S: Store> fmt::Debug for PolledBackend<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PolledBackend")
            .field("store", &self.inner.store)
            .field("prefix", &self.inner.prefix)
            .field("wakeup", &self.inner.wakeup)
            .finish_non_exhaustive()
    }
}

impl<S: Store> PolledBackend<S> {
    /// A backend on `store`, its keys under `prefix`. `poll` is the pause between two polls
    /// of a follower (jittered by ±25 %); `info.wakeup` says whether the store pushes changes
    /// (then the poll is a safety net).
    pub(crate) fn new(store: S, prefix: String, poll: Duration, info: BackendInfo) -> Self {
        PolledBackend {
            inner: Arc::new(Inner {
                store,
                prefix,
                wakeup: info.wakeup,
                poll,
                info,
                sessions: SessionPool::default(),
                seen: Mutex::new(HashMap::new()),
                released: Wakes::default(),
                freed: Wakes::default(),
                reads: Mutex::new(HashMap::new()),
                courtesy: super::courtesy::Courtesy::default(),
            }),
        }
    }

    /// The key of `election`: `<prefix><election>`.
    pub fn key(&self, election: &str) -> String {
        format!("{}{election}", self.inner.prefix)
    }

    /// The fencing counter of `election`: `<prefix><election>:fencing` (on PostgreSQL, the
    /// election's row: `<prefix><election>`).
    pub fn counter_key(&self, election: &str) -> String {
        format!("{}{election}{}", self.inner.prefix, S::COUNTER_SUFFIX)
    }

    /// The ids of the sessions this backend keeps alive now (process-local, random), for
    /// tooling and tests.
    pub fn session_ids(&self) -> Vec<String> {
        let sessions = self.inner.sessions.sessions();
        sessions.iter().map(|shared| shared.id.clone()).collect()
    }

    pub(crate) fn store(&self) -> &S {
        &self.inner.store
    }

    /// Notes a token seen for `key`; returns the highest seen so far. A token above
    /// [`MAX_TOKEN`] (a corrupt or hostile value) is not taken as a floor.
    fn saw(&self, key: &str, token: Option<u64>) -> u64 {
        let token = token.filter(|&token| {
            let valid = token <= MAX_TOKEN;
            if !valid {
                tracing::warn!(store = S::NAME, %key, token, "ignoring a fencing token above 2^53 - 1 in the store: a corrupt or hostile value");
            }
            valid
        });
        let mut seen = lock(&self.inner.seen);
        let highest = seen.entry(key.to_owned()).or_insert(0);
        if let Some(token) = token {
            *highest = (*highest).max(token);
        }
        *highest
    }

    /// Changes whenever a contender of this backend releases `key`.
    fn releases(&self, key: &str) -> watch::Receiver<u64> {
        self.inner.released.subscribe(key)
    }

    /// The reads of `key` by this backend's contenders.
    fn reads(&self, key: &str) -> watch::Receiver<Option<Vec<u8>>> {
        lock(&self.inner.reads)
            .entry(key.to_owned())
            .or_insert_with(|| watch::Sender::new(None))
            .subscribe()
    }

    /// A contender read `value` under `key`: this backend's observers of it take it as their
    /// own read.
    fn read_by_contender(&self, key: &str, value: &[u8]) {
        let mut reads = lock(&self.inner.reads);
        if let Some(sender) = reads.get(key) {
            if sender.receiver_count() == 0 {
                reads.remove(key);
            } else {
                sender.send_replace(Some(value.to_vec()));
            }
        }
    }

    /// Changes whenever an observer of this backend finds `key` freed.
    fn frees(&self, key: &str) -> watch::Receiver<u64> {
        self.inner.freed.subscribe(key)
    }

    /// An observer read `key` free after it was held: this backend's followers of it try at
    /// once. A follower process then has two polls of the key (its campaign's contender's,
    /// and its observer's), and the first to see the key free wakes the contender.
    fn freed(&self, key: &str) {
        self.inner.freed.bump(key);
    }

    /// After a contender of session handle `handle` released `key`: wakes this backend's
    /// followers of it, and keeps that handle's contenders off the key for
    /// [`COURTESY_POLLS`] poll intervals while followers poll, for [`PUSH_COURTESY`] while
    /// the store pushes.
    fn released(&self, key: &str, handle: u64) {
        self.inner.released.bump(key);
        let courtesy = match self.inner.wakeup {
            Wakeup::Poll(poll) => poll * COURTESY_POLLS,
            Wakeup::Push => PUSH_COURTESY,
        };
        self.inner.courtesy.grant(key, handle, courtesy);
    }

    /// The end of the courtesy for `key`, while it runs and holds `handle` back.
    fn courtesy(&self, key: &str, handle: u64) -> Option<Instant> {
        self.inner.courtesy.holds_back(key, handle)
    }

    /// When the next poll is due, from now: the poll interval jittered by ±25 %.
    fn next_poll(&self) -> Instant {
        Instant::now() + self.inner.poll.mul_f64(0.75 + fastrand::f64() * 0.5)
    }

    /// Sleeps until the next poll, a change the store pushed for the key, a release of it by
    /// this backend, or (`freed`, for followers) an observer of this backend finding it free.
    ///
    /// `poll_at` keeps the next poll's instant across calls whose future was dropped (the
    /// campaign drops a follower's `wait` when an observer reports a change, and calls it
    /// again): the poll keeps its pace instead of starting over.
    async fn pause(
        &self,
        pushed: &mut Option<watch::Receiver<u64>>,
        local: &mut watch::Receiver<u64>,
        freed: Option<&mut watch::Receiver<u64>>,
        poll_at: &mut Option<Instant>,
    ) {
        let at = *poll_at.get_or_insert_with(|| self.next_poll());
        tokio::select! {
            _ = local.changed() => {}
            () = changed(freed) => {}
            // Nothing pushed, or the store's notifier is gone: only the poll.
            () = changed(pushed.as_mut()) => {}
            () = tokio::time::sleep_until(at) => {}
        }
        *poll_at = None;
    }
}

/// Reconnects of a store's notification connection (Redis's pub/sub, PostgreSQL's
/// `LISTEN`): jittered, from 100 ms up to 5 s.
#[cfg(any(feature = "redis", feature = "postgres", feature = "kubernetes"))]
pub(crate) const RECONNECT: crate::backoff::Backoff = crate::backoff::Backoff {
    initial: Duration::from_millis(100),
    max: Duration::from_secs(5),
};

/// The wake-ups of the keys followed in this process, bumped by a store's notification task
/// (Redis's keyspace notifications, PostgreSQL's `NOTIFY`). Dropping it stops the task.
#[cfg(any(feature = "redis", feature = "postgres", feature = "kubernetes"))]
pub(crate) struct Notifier {
    keys: Arc<Wakes>,
    _stop: tokio_util::sync::DropGuard,
}

#[cfg(any(feature = "redis", feature = "postgres", feature = "kubernetes"))]
impl Notifier {
    /// Wake-ups that the task cancelled by `stop` bumps.
    pub(crate) fn new(keys: Arc<Wakes>, stop: tokio_util::sync::CancellationToken) -> Self {
        Notifier {
            keys,
            _stop: stop.drop_guard(),
        }
    }

    /// A receiver that changes whenever the store says `key` changed.
    pub(crate) fn subscribe(&self, key: &str) -> watch::Receiver<u64> {
        self.keys.subscribe(key)
    }
}

/// Resolves when `wake` changes; never when there is none, or its sender is gone.
async fn changed(wake: Option<&mut watch::Receiver<u64>>) {
    if let Some(wake) = wake
        && wake.changed().await.is_ok()
    {
        return;
    }
    std::future::pending::<()>().await;
}

/// Wake-ups per key: a counter that a bump changes.
#[derive(Default)]
pub(crate) struct Wakes(Mutex<HashMap<String, watch::Sender<u64>>>);

impl Wakes {
    /// A receiver that changes at every bump of `key`.
    pub(crate) fn subscribe(&self, key: &str) -> watch::Receiver<u64> {
        lock(&self.0)
            .entry(key.to_owned())
            .or_insert_with(|| watch::Sender::new(0))
            .subscribe()
    }

    /// Wakes the receivers of `key`; forgets it when there are none.
    pub(crate) fn bump(&self, key: &str) {
        let mut wakes = lock(&self.0);
        if let Some(sender) = wakes.get(key) {
            if sender.receiver_count() == 0 {
                wakes.remove(key);
            } else {
                sender.send_modify(|n| *n = n.wrapping_add(1));
            }
        }
    }

    /// Wakes the receivers of every key.
    #[cfg_attr(
        not(any(feature = "redis", feature = "postgres", feature = "kubernetes")),
        allow(dead_code)
    )]
    pub(crate) fn bump_all(&self) {
        let mut wakes = lock(&self.0);
        wakes.retain(|_, sender| sender.receiver_count() > 0);
        for sender in wakes.values() {
            sender.send_modify(|n| *n = n.wrapping_add(1));
        }
    }
}

impl<S: Store> Backend for PolledBackend<S> {
    type Session = PolledSession<S>;
    type Observer = PolledObserver<S>;

    fn info(&self) -> BackendInfo {
        self.inner.info.clone()
    }

    async fn open_session(&self, options: &SessionOptions) -> Result<PolledSession<S>> {
        self.inner.store.check(options)?;
        session::open(self, options).await
    }

    async fn observe(&self, election: &str) -> Result<PolledObserver<S>> {
        Ok(PolledObserver::new(self.clone(), self.key(election)))
    }
}
