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
//!   fencing counter** is gone. The counter is created at the current Unix time in
//!   milliseconds, so after a restart it starts again above every earlier token, as long as
//!   the hosts' clocks agree to within the time since the counter was last created.
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
//! restart) relies on the counter's clock-based start above. If the election must not be lost to a
//! cache's memory pressure, use etcd, Consul or ZooKeeper.
//!
//! # How it works
//!
//! - **Acquire.** `gets` the key `<prefix><election>`; when it is absent, `incr` the
//!   counter `<prefix><election>:fencing` (created with `add` at the Unix time in milliseconds, without expiry, when
//!   missing) and `add` the key with the candidate ([`Leader`](crate::Leader) as JSON, with
//!   the new token and a random owner id) and an expiry. `add` succeeds for one candidate
//!   only; the others skipped a token, which is harmless.
//! - **Settle.** The acquisition is three requests, not one atomic step: a candidate whose
//!   `add` came late (a pause, a retransmit) could otherwise lead with a token lower than one
//!   given to a term that began and ended in between. So after the `add`, the counter is read
//!   again: if it moved past our token, a new token is taken with `incr` and written into the
//!   key with a checked write (`gets` + `cas`) before the term begins. Tokens above
//!   [`MAX_TOKEN`] (memcached's `incr` wraps at 2^64, and anyone can write the counter: the
//!   store has no authentication) are refused with a typed error, never used.
//! - **Lost answers.** An `add` (or a proclaim) whose answer was lost may still have run:
//!   the next attempt finds its own owner id in the key and adopts it (after a settle and a
//!   renewal), and renewals accept a late proclaim's value as ours.
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
mod store;
pub(crate) mod url;

use std::time::Duration;

use self::client::Client;
use self::store::Settings;
use crate::backend::polled::{
    self, PolledBackend, PolledBuilder, PolledContender, PolledObserver, PolledSession,
};
pub use crate::backend::polled::{
    COURTESY_POLLS, DEFAULT_POLL_INTERVAL, DEFAULT_PREFIX, MAX_POLL_INTERVAL, MAX_TOKEN,
};
use crate::backend::{BackendInfo, Wakeup};
use crate::{Error, Result};

const NAME: &str = "memcached";

/// The smallest ttl: memcached's expiry has a granularity of a second.
pub const MIN_TTL: Duration = Duration::from_secs(2);
/// The largest ttl: a day (memcached reads expiries above 30 days as timestamps).
pub const MAX_TTL: Duration = Duration::from_secs(86_400);
/// How long one request may take unless [`MemcachedBuilder::timeout`] says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);

/// Settings for a [`MemcachedBackend`]: made by [`MemcachedBackend::builder`], finished by
/// [`connect`](MemcachedBuilder::connect).
pub type MemcachedBuilder = PolledBuilder<Settings>;

impl PolledBuilder<Settings> {
    /// How long one request may take (default [`DEFAULT_TIMEOUT`]).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.store.timeout = timeout;
        self
    }

    /// Checks the settings, connects (`version`), and builds the backend.
    ///
    /// Errors: [`Error::InvalidConfig`] for an address that is not `host:port`, a zero poll
    /// interval, or a prefix with white space or control characters (memcached keys cannot
    /// hold them); [`Error::Unavailable`] when the server cannot be reached.
    pub async fn connect(self) -> Result<MemcachedBackend> {
        self.dial().await.map_err(Error::not_retried)
    }

    /// The one attempt of [`connect`](Self::connect).
    async fn dial(self) -> Result<MemcachedBackend> {
        let invalid = |reason: String| Error::InvalidConfig {
            backend: NAME,
            reason,
        };
        let Settings { address, timeout } = &self.store;
        let valid_address = address
            .rsplit_once(':')
            .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0));
        if !valid_address {
            return Err(invalid(format!(
                "{:?} is not host:port (write e.g. \"127.0.0.1:11211\")",
                crate::secret::redact(address)
            )));
        }
        self.check_poll(NAME)?;
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
        let client = Client::new(address.clone(), *timeout);
        client.version().await?;
        tracing::info!(
            poll = ?self.poll_interval,
            "memcached: followers poll (memcached has no notifications)"
        );
        let info = BackendInfo {
            min_ttl: MIN_TTL,
            max_ttl: MAX_TTL,
            ..polled::info(NAME, Wakeup::Poll(self.poll_interval))
        };
        Ok(PolledBackend::new(
            client,
            self.prefix,
            self.poll_interval,
            info,
        ))
    }
}

/// A connection to one memcached server, for any number of elections. Cheap to clone.
/// See the [module docs](self): the lock can be lost to eviction or a restart.
pub type MemcachedBackend = PolledBackend<Client>;

impl PolledBackend<Client> {
    /// The server at `address` (`host:port`) with default settings. See
    /// [`MemcachedBuilder::connect`] for the errors.
    pub async fn connect(address: impl Into<String>) -> Result<MemcachedBackend> {
        Self::builder(address).connect().await
    }

    /// Starts configuring a backend on the server at `address` (`host:port`).
    pub fn builder(address: impl Into<String>) -> MemcachedBuilder {
        PolledBuilder::new(Settings {
            address: address.into(),
            timeout: DEFAULT_TIMEOUT,
        })
    }
}

/// A session on memcached: process-local, alive as long as one renewal (a multi-key `gets`
/// and a `cas` per key) rewrites every key its elections hold. Closing (or dropping) the
/// last handle deletes the keys it still holds.
pub type MemcachedSession = PolledSession<Client>;
/// One session's claim on one memcached election, the key `<prefix><election>`: `add` with
/// a token from the counter (`incr`); see the [module docs](self).
pub type MemcachedContender = PolledContender<Client>;
/// Follows the holder of one memcached election by polling its key with jitter.
pub type MemcachedObserver = PolledObserver<Client>;
