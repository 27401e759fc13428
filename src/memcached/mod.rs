//! The memcached backend: `add` with an expiry takes the lock, `gets` + `cas` renews it, a
//! counter bumped with `incr` gives the fencing token. **Best effort only.**
//!
//! # ⚠ Read this first: memcached can lose the lock at any moment
//!
//! memcached is a cache. It is allowed to forget, and it does:
//!
//! - **Eviction.** Under memory pressure memcached evicts items (least recently used first),
//!   expiry or not. A held lock key can vanish while its leader is healthy, and another
//!   candidate then takes the lock *before the old leader knows*: it learns at its next
//!   renewal (a third of the ttl at most). Two leaders overlap for that long.
//! - **Restart.** memcached keeps nothing across a restart: every lock key **and every
//!   fencing counter** is gone. The counter starts again from zero.
//! - **No replication.** With several memcached servers, a client library's key hashing
//!   sends the key to one of them; a server that leaves takes the lock with it. This backend
//!   talks to one server.
//!
//! So: the fencing token is what protects your data, not the lock. A downstream store must
//! reject writes with a token lower than the highest it has seen. A counter that went back
//! (a token not greater than the last one this backend saw for the election) is detected:
//! the candidate raises the counter past it and takes the lock, but leads only a ttl later,
//! when the last leader has surely noticed its loss; it never hands out a smaller token that
//! it can know about. A candidate that never saw the old tokens (a new process after a
//! restart) cannot know: downstream fencing must. If the election must not be lost to a
//! cache's memory pressure, use etcd, Consul or ZooKeeper.
//!
//! # How it works
//!
//! - **Acquire.** `gets` the key `<prefix><election>`; when it is absent, `incr` the
//!   counter `<prefix><election>:fencing` (created with `add` at 0, without expiry, when
//!   missing) and `add` the key with the candidate ([`Leader`](crate::Leader) as JSON, with
//!   the new token and a random owner id) and an expiry. `add` succeeds for one candidate
//!   only; the others skipped a token, which is harmless.
//! - **One renewal per process.** A session is local to the process: a random id, and the
//!   keys its elections hold. Every renew interval, one multi-key `gets` reads every held
//!   key, and a `cas` per key whose value is still ours rewrites it with a fresh expiry. A
//!   key gone or holding another value ends that election's term at once
//!   ([`LockLoss::Deleted`](crate::backend::LockLoss::Deleted) /
//!   [`LockLoss::Taken`](crate::backend::LockLoss::Taken)).
//! - **Release** is a checked delete: `gets`, then `cas` with a negative expiry (which
//!   stores the item already expired) only while the value is ours.
//! - **Followers poll**, with jitter, every [`MemcachedBuilder::poll_interval`]: memcached
//!   has no notifications. [`BackendInfo::wakeup`] says [`Wakeup::Poll`]. Only a release by
//!   another election of the same [`MemcachedBackend`] wakes them at once.
//!
//! # Expiry in whole seconds
//!
//! memcached counts expiry in whole seconds, on a clock that ticks once a second: an item
//! stored with expiry `n` lives between `n - 1` and `n` seconds. So the ttl must be whole
//! seconds ([`Error::InvalidTiming`] otherwise, when the session is opened), and the key
//! is stored with expiry `ttl + 1` s: it lives at least the ttl, and at most a second longer
//! (so a crashed leader is replaced after up to ttl + 1 s). Expiries above 30 days are
//! taken by memcached as Unix timestamps: the ttl is at most [`MAX_TTL`] (a day).
//!
//! # Options and URLs
//!
//! [`MemcachedBackend::connect`] takes `host:port`; [`MemcachedBackend::builder`] sets the
//! key prefix, the poll interval and the request timeout. The URL form for the CLI and
//! [`BackendUrl`](crate::url::BackendUrl) is `memcached://host:port`. memcached's text
//! protocol has no authentication: keep it on a trusted network.
//!
//! # Why the text protocol, spoken directly
//!
//! The backend needs six commands (`version`, `gets`, `add`, `cas`, `incr`, and `cas` as a
//! checked delete) with a timeout on each, and concurrent renewals that must not queue
//! behind a stuck request. The async memcached crates either lack `gets`/`cas` or pool
//! connections in ways that hide a stuck request; the text protocol is small, stable since
//! memcached 1.4, and fits in one short module (`client.rs`) over tokio's TCP.

mod client;
mod contender;
mod session;

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

pub use contender::{MemcachedContender, MemcachedObserver};
pub use session::MemcachedSession;

use self::client::Client;
use crate::backend::pool::SessionPool;
use crate::backend::{Backend, BackendInfo, SessionOptions, Wakeup, lock};
use crate::{Error, Result};

const NAME: &str = "memcached";

/// The key prefix under which elections live unless [`MemcachedBuilder::prefix`] says
/// otherwise.
pub const DEFAULT_PREFIX: &str = "incumbent/";
/// The smallest ttl: memcached's expiry has a granularity of a second.
pub const MIN_TTL: Duration = Duration::from_secs(2);
/// The largest ttl: a day (memcached reads expiries above 30 days as timestamps).
pub const MAX_TTL: Duration = Duration::from_secs(86_400);
/// How often followers poll unless [`MemcachedBuilder::poll_interval`] says otherwise.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(500);
/// After a release, how many poll intervals the campaign that released the key (the session
/// handle its contender came from) leaves it to followers in other processes, which would
/// otherwise lose the race to its own retry.
pub const COURTESY_POLLS: u32 = 4;
/// How long one request may take unless [`MemcachedBuilder::timeout`] says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);

/// Settings for a [`MemcachedBackend`]: made by [`MemcachedBackend::builder`], finished by
/// [`connect`](MemcachedBuilder::connect).
#[derive(Clone, Debug)]
pub struct MemcachedBuilder {
    address: String,
    prefix: String,
    poll_interval: Duration,
    timeout: Duration,
}

impl MemcachedBuilder {
    /// The prefix of every key this backend writes (default [`DEFAULT_PREFIX`]).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How often followers poll (default [`DEFAULT_POLL_INTERVAL`]), jittered by ±25 %.
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// How long one request may take (default [`DEFAULT_TIMEOUT`]).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Checks the settings, connects (`version`), and builds the backend.
    ///
    /// Errors: [`Error::InvalidConfig`] for an address that is not `host:port`, a zero poll
    /// interval, or a prefix with white space or control characters (memcached keys cannot
    /// hold them); [`Error::Unavailable`] when the server cannot be reached.
    pub async fn connect(self) -> Result<MemcachedBackend> {
        let invalid = |reason: String| Error::InvalidConfig {
            backend: NAME,
            reason,
        };
        let valid_address = self
            .address
            .rsplit_once(':')
            .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0));
        if !valid_address {
            return Err(invalid(format!(
                "{:?} is not host:port (write e.g. \"127.0.0.1:11211\")",
                crate::url::redact(&self.address)
            )));
        }
        if self.poll_interval.is_zero() {
            return Err(invalid(
                "the poll interval must be above zero (e.g. 500ms)".into(),
            ));
        }
        if self.prefix.len() > 100
            || self
                .prefix
                .chars()
                .any(|c| c.is_whitespace() || c.is_control())
        {
            return Err(invalid(format!(
                "the key prefix {:?} has white space or control characters, or is longer than \
                 100 bytes; memcached keys cannot hold them",
                self.prefix
            )));
        }
        let client = Client::new(self.address, self.timeout);
        client.version().await?;
        tracing::info!(
            poll = ?self.poll_interval,
            "memcached: followers poll (memcached has no notifications)"
        );
        Ok(MemcachedBackend {
            inner: Arc::new(Inner {
                client,
                prefix: self.prefix,
                poll_interval: self.poll_interval,
                sessions: SessionPool::default(),
                seen: Mutex::new(HashMap::new()),
                released: Mutex::new(HashMap::new()),
                courtesy: Mutex::new(HashMap::new()),
            }),
        })
    }
}

/// A connection to one memcached server, for any number of elections. Cheap to clone.
/// See the [module docs](self): the lock can be lost to eviction or a restart.
#[derive(Clone)]
pub struct MemcachedBackend {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    prefix: String,
    poll_interval: Duration,
    sessions: SessionPool<session::Shared>,
    /// The highest fencing token seen per election key.
    seen: Mutex<HashMap<String, u64>>,
    /// Bumped per key when a contender of this backend releases it: followers in this
    /// process wake at once instead of at their next poll.
    released: Mutex<HashMap<String, watch::Sender<u64>>>,
    /// Per key released by this backend: until when the session handle that released it
    /// leaves it to the others.
    courtesy: Mutex<HashMap<String, (tokio::time::Instant, u64)>>,
}

impl fmt::Debug for MemcachedBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemcachedBackend")
            .field("address", &self.inner.client.addr())
            .field("prefix", &self.inner.prefix)
            .field("poll_interval", &self.inner.poll_interval)
            .finish_non_exhaustive()
    }
}

impl MemcachedBackend {
    /// The server at `address` (`host:port`) with default settings. See
    /// [`MemcachedBuilder::connect`] for the errors.
    pub async fn connect(address: impl Into<String>) -> Result<MemcachedBackend> {
        Self::builder(address).connect().await
    }

    /// Starts configuring a backend on the server at `address` (`host:port`).
    pub fn builder(address: impl Into<String>) -> MemcachedBuilder {
        MemcachedBuilder {
            address: address.into(),
            prefix: DEFAULT_PREFIX.to_owned(),
            poll_interval: DEFAULT_POLL_INTERVAL,
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// The key of `election`: `<prefix><election>`.
    pub fn key(&self, election: &str) -> String {
        format!("{}{election}", self.inner.prefix)
    }

    /// The fencing counter of `election`: `<prefix><election>:fencing`.
    pub fn counter_key(&self, election: &str) -> String {
        format!("{}{election}:fencing", self.inner.prefix)
    }

    fn client(&self) -> &Client {
        &self.inner.client
    }

    /// Notes a token seen for `key`; returns the highest seen so far.
    fn saw(&self, key: &str, token: Option<u64>) -> u64 {
        let mut seen = lock(&self.inner.seen);
        let highest = seen.entry(key.to_owned()).or_insert(0);
        if let Some(token) = token {
            *highest = (*highest).max(token);
        }
        *highest
    }

    /// Changes whenever a contender of this backend releases `key`.
    fn releases(&self, key: &str) -> watch::Receiver<u64> {
        lock(&self.inner.released)
            .entry(key.to_owned())
            .or_insert_with(|| watch::Sender::new(0))
            .subscribe()
    }

    /// Wakes this backend's followers of `key`.
    fn released(&self, key: &str) {
        let mut released = lock(&self.inner.released);
        if let Some(sender) = released.get(key) {
            if sender.receiver_count() == 0 {
                released.remove(key);
            } else {
                sender.send_modify(|n| *n = n.wrapping_add(1));
            }
        }
    }

    /// Sleeps for the jittered poll interval, or until a contender of this backend
    /// releases the key `wake` follows.
    ///
    /// `poll_at` keeps the next poll's instant across calls whose future was dropped (the
    /// campaign drops a follower's `wait` when an observer reports a change, and calls it
    /// again): the poll keeps its pace instead of starting over.
    async fn pause(
        &self,
        wake: &mut watch::Receiver<u64>,
        poll_at: &mut Option<tokio::time::Instant>,
    ) {
        let at = *poll_at.get_or_insert_with(|| {
            tokio::time::Instant::now()
                + self
                    .inner
                    .poll_interval
                    .mul_f64(0.75 + fastrand::f64() * 0.5)
        });
        tokio::select! {
            _ = wake.changed() => {}
            () = tokio::time::sleep_until(at) => {}
        }
        *poll_at = None;
    }

    /// Starts the courtesy after a contender of session handle `handle` released `key`:
    /// [`COURTESY_POLLS`] poll intervals during which that handle's contenders leave it to
    /// the others.
    fn courtesy_from_now(&self, key: &str, handle: u64) {
        let until = tokio::time::Instant::now() + self.inner.poll_interval * COURTESY_POLLS;
        lock(&self.inner.courtesy).insert(key.to_owned(), (until, handle));
    }

    /// The end of the courtesy for `key`, while it runs and holds `handle` back.
    fn courtesy(&self, key: &str, handle: u64) -> Option<tokio::time::Instant> {
        let mut courtesy = lock(&self.inner.courtesy);
        let now = tokio::time::Instant::now();
        courtesy.retain(|_, (until, _)| *until > now);
        courtesy
            .get(key)
            .filter(|(_, releaser)| *releaser == handle)
            .map(|(until, _)| *until)
    }
}

impl Backend for MemcachedBackend {
    type Session = MemcachedSession;
    type Observer = MemcachedObserver;

    fn info(&self) -> BackendInfo {
        BackendInfo {
            name: NAME,
            min_ttl: MIN_TTL,
            max_ttl: MAX_TTL,
            wakeup: Wakeup::Poll(self.inner.poll_interval),
            renew_divisor: 3,
        }
    }

    async fn open_session(&self, options: &SessionOptions) -> Result<MemcachedSession> {
        if options.ttl.subsec_nanos() != 0 {
            return Err(Error::InvalidTiming {
                reason: format!(
                    "memcached counts expiry in whole seconds: the ttl {:?} must be whole \
                     seconds (e.g. 3s)",
                    options.ttl
                ),
            });
        }
        session::open(self, options).await
    }

    async fn observe(&self, election: &str) -> Result<MemcachedObserver> {
        Ok(MemcachedObserver::new(self.clone(), self.key(election)))
    }
}
