//! The Redis backend: one key per election, taken with `SET NX PX` in a Lua script that also
//! bumps the election's fencing counter, renewed by one script per process.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use incumbent::Election;
//! use incumbent::redis::{RedisBackend, RedisConfig};
//!
//! let backend = RedisBackend::builder(
//!     RedisConfig::new("redis.internal:6379")
//!         .db(2)
//!         .username("indexer")
//!         .password(std::env::var("REDIS_PASSWORD")?),
//! )
//! .prefix("services/indexer/")
//! .connect()
//! .await?;
//!
//! let election = Election::builder(backend, "jobs/index-builder")
//!     .candidate("host-a:8080")
//!     .ttl(Duration::from_secs(10))
//!     .build()?;
//! election
//!     .run(|term| async move {
//!         // pass term.fencing_token() with every write; stop when term.cancelled() fires
//!         term.cancelled().await;
//!     })
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! For a local server without a password, `RedisBackend::connect("127.0.0.1:6379").await?`
//! is all it takes.
//!
//! # Read this first: what one Redis cannot promise
//!
//! Redis is not a consensus system. A lock in Redis is as good as the one server that holds
//! it, and lives only in its memory:
//!
//! - **Restart without persistence** (no RDB, no AOF, or an AOF with `appendfsync` other than
//!   `always`): the lock key and the fencing counter are gone. The leader learns it at its
//!   next renewal (a third of the ttl at most) and ends its term; until then another
//!   candidate may already hold the new key. Its worker is cancelled then, not before: only
//!   the fencing token protects the downstream system in that window.
//! - **Failover** (Sentinel, or a replica promoted by hand): replication is asynchronous, so
//!   the promoted replica may not have the lock key, or may not have the last `INCR` of the
//!   counter. Two candidates can then both believe they lead for up to a renewal interval,
//!   and without fencing both would write. `WAIT` does not close this window (a write
//!   acknowledged by a replica can still be lost when a different one is promoted).
//! - **Eviction**: a server with a `maxmemory-policy` other than `noeviction` (or
//!   `volatile-*` policies, which pick keys with a ttl, like ours) may drop the lock key
//!   under memory pressure. Run elections on a server with `noeviction`.
//! - **Cluster**: not supported; connect to one primary.
//!
//! ## Why no Redlock
//!
//! Redlock (a majority of N independent Redis servers) narrows the failover window, but it
//! depends on bounded clock drift, bounded pauses and bounded network delay for its safety,
//! and it hands out no fencing token: a client paused (GC, swap, SIGSTOP) past its lock's
//! validity wakes up and writes, whatever the lock servers agree on. Martin Kleppmann's
//! "How to do distributed locking" makes the case; this backend takes it: the safety of
//! what the leader writes rests on the **fencing token**, checked by the store it writes
//! to, and the lock is what makes a second leader rare, not impossible. For a lock whose
//! loss must not be possible in these ways, use etcd, Consul or ZooKeeper.
//!
//! # How it works
//!
//! - **Acquire.** One Lua script: if the election's key `<prefix><election>` does not exist,
//!   `INCR` the election's counter `<prefix><election>:fencing` and `SET key value NX PX ttl`,
//!   atomically, where the value is the candidate ([`Leader`](crate::Leader) as JSON) with the new token
//!   and a random owner id inside. So the token is readable from the key by anyone, and
//!   grows with every term even when keys expire in between.
//! - **One renewal per process.** A session is local to the process: a random id, and the
//!   keys its elections hold. Every renew interval, one script renews *all* of them
//!   (`PEXPIRE` where the value is still ours), driven by the crate's keep-alive loop. A
//!   renewal that found every held key still ours confirms the session; a key that is gone
//!   or holds another value ends that election's term at once ([`LockLoss::Deleted`](crate::backend::LockLoss::Deleted) or
//!   [`LockLoss::Taken`](crate::backend::LockLoss::Taken)), without failing the others. With no key held, the renewal is a
//!   `PING`.
//! - **Release and proclaim** are compare-and-act scripts too: they touch the key only while
//!   it holds exactly our value. A graceful hand-off deletes the key at once.
//! - **Followers** ([`Contender::wait`](crate::backend::Contender::wait) and observers)
//!   listen to keyspace notifications (`__keyspace@<db>__:<key>`, events `del`, `expired`,
//!   `set`) on one pub/sub connection per backend, when the server publishes them (see
//!   [`Notifications`]); a hand-off then takes a round trip or two. A jittered poll runs as
//!   well: every [`RedisBuilder::poll_interval`] when notifications are off, every
//!   [`SAFETY_NET_POLL`] as a safety net (a notification lost on a reconnect) when they are
//!   on. Which one is active is logged at connect (`tracing`, info) and shown by
//!   [`BackendInfo::wakeup`]: [`Wakeup::Push`] or [`Wakeup::Poll`].
//!
//! # The fencing token
//!
//! The acquisition's script sets the election's counter to the greatest of: the counter + 1,
//! the **Redis server's clock** in milliseconds (`TIME`), and the highest token this
//! [`RedisBackend`] has seen for the election + 1; that value is the term's token. So tokens
//! never go back, even when Redis forgot the counter (a restart without persistence, a
//! failover to a replica that missed the last write, `FLUSHALL`) and the next leader is a
//! process that never saw the earlier tokens (a deploy, `incumbent run`): a token is at least
//! the server's clock when its term began, and a term that follows began later.
//!
//! What this covers, and what not:
//!
//! - Covered: any loss of the counter, on one server or after a failover, as long as the
//!   clock of the server that hands out the next token is not behind the clock of the one
//!   that handed out the last by more than the time between the two terms' starts.
//! - Not covered: a server clock stepped back (by hand, or NTP stepping rather than slewing)
//!   past the last term's start, or a failover to a replica whose clock is that far behind.
//!   Keep the servers' clocks in sync (NTP slews small offsets).
//! - Tokens run ahead of the clock only by the number of terms that began within the same
//!   millisecond, so they stay close to the Unix time in milliseconds: 13 digits today.
//! - Tokens stay at or below [`MAX_TOKEN`] (2^53 − 1), exact in Lua's doubles and in JSON
//!   readers that use doubles. A counter above it (corrupt or hostile: Redis has no typed
//!   keys) is refused with a typed error; so is a leader's token above it, which is never
//!   taken as a floor.
//! - A downstream store must still reject tokens lower than the highest it saw: that is
//!   what stops a leader that has not yet noticed its loss.
//!
//! After Redis lost its data, the old leader may not know yet that its key is gone: it finds
//! out at its next renewal (a third of the ttl). Where this process saw the earlier token
//! (the counter is now missing or below it), the new term is also *delayed* by a ttl, so the
//! two do not overlap at all; a process that saw nothing leads at once, and the overlap is
//! then bounded by the old leader's renewal interval, with the fencing token refusing the old
//! leader's writes throughout.
//!
//! # Lost answers
//!
//! A request whose answer was lost (a timeout, a frozen server that thaws) may still run.
//! An acquisition that ran without our knowing leaves the key naming this candidate: the
//! next attempt finds its own owner id in it and adopts it (renewing it first), so the key
//! never names a non-leader for longer than the retry back-off; a campaign that stops instead
//! deletes it. A proclaim that ran late is accepted by the renewals as ours (they renew
//! either value until they find one), never mistaken for the lock being taken.
//!
//! When a leader's key vanishes and the counter is gone or below its token,
//! [`explain`](crate::backend::Contender::explain) reports the loss as
//! [`LockLoss::SessionLost`](crate::backend::LockLoss::SessionLost): Redis lost its data (restart without persistence, failover,
//! `FLUSHALL`), logged as a warning.
//!
//! # Options and URLs
//!
//! [`RedisConfig`] sets the address, database, user and password (ACL, `AUTH`; never shown
//! by `Debug` or in logs), TLS and the response timeout. The URL form for the CLI and
//! [`BackendUrl`](crate::url::BackendUrl) is `redis://host:port[/db]`, or
//! `rediss://host:port[/db]` for TLS, with credentials from the environment
//! (`INCUMBENT_REDIS_USER`, `INCUMBENT_REDIS_PASSWORD`, or `REDISCLI_AUTH` as `redis-cli` reads
//! it), never from the URL.
//!
//! **TLS** (feature `redis-tls`: rustls with ring): `RedisConfig::tls` checks the server's
//! certificate against the system's root certificates, `RedisConfig::ca_file` against the CA
//! certificates in a PEM file (`INCUMBENT_REDIS_CA_FILE` for a `rediss://` URL); the host name
//! (or IP address) is checked too. Client certificates are not supported. The `redis` crate
//! takes rustls's process-wide default crypto provider: when none is installed, the first TLS
//! connection installs ring's.

mod notify;
mod store;
pub(crate) mod url;

use std::fmt;
use std::time::Duration;

use ::redis::aio::ConnectionManagerConfig;
use ::redis::{Client, ConnectionAddr, IntoConnectionInfo, RedisConnectionInfo, RedisError};

use crate::backend::polled::{
    self, PolledBackend, PolledBuilder, PolledContender, PolledObserver, PolledSession,
};
pub use crate::backend::polled::{
    COURTESY_POLLS, DEFAULT_POLL_INTERVAL, DEFAULT_PREFIX, MAX_POLL_INTERVAL, MAX_TOKEN,
    PUSH_COURTESY,
};
use crate::backend::{BackendInfo, Wakeup};
use crate::{Error, Result};
use store::{RedisStore, Settings};

/// Settings for a [`RedisBackend`] beyond the connection's: made by
/// [`RedisBackend::builder`], finished by [`connect`](RedisBuilder::connect).
pub type RedisBuilder = PolledBuilder<Settings>;

const NAME: &str = "redis";

/// The smallest ttl: renewals every third of it must fit in, with a few round trips.
pub const MIN_TTL: Duration = Duration::from_secs(1);
/// The largest ttl: a day.
pub const MAX_TTL: Duration = Duration::from_secs(86_400);
/// How often followers poll while keyspace notifications are on, in case one was lost.
pub const SAFETY_NET_POLL: Duration = Duration::from_secs(5);
/// How long one request may take unless [`RedisConfig::timeout`] says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);

/// Where and how to reach Redis.
#[derive(Clone)]
pub struct RedisConfig {
    host: String,
    port: u16,
    /// TLS (`rediss://`), and the CA file that signs the server's certificate (`None`: the
    /// system's roots).
    #[cfg(feature = "redis-tls")]
    tls: Option<Option<std::path::PathBuf>>,
    db: i64,
    username: Option<String>,
    password: Option<String>,
    timeout: Duration,
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConfig")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("tls", &self.tls_shown())
            .field("db", &self.db)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl RedisConfig {
    /// A server at `address`, `host:port` (the port defaults to 6379), database 0, no
    /// credentials. An address with credentials in front, `user:password@host:port` (or
    /// `password@host:port`), is taken apart: they become [`username`](Self::username) and
    /// [`password`](Self::password), never part of the host that `Debug` and errors show.
    pub fn new(address: impl Into<String>) -> Self {
        let address: String = address.into();
        let (credentials, address) = match address.rsplit_once('@') {
            Some((credentials, host)) => (Some(credentials.to_owned()), host.to_owned()),
            None => (None, address),
        };
        let (username, password) = match credentials.as_deref().map(|c| c.split_once(':')) {
            None => (None, None),
            Some(Some((user, password))) => (
                Some(user.to_owned()).filter(|u| !u.is_empty()),
                Some(password.to_owned()),
            ),
            Some(None) => (None, credentials),
        };
        let (host, port) = match address.rsplit_once(':') {
            Some((host, port)) if !host.contains(':') || host.starts_with('[') => {
                // An unparsable port is kept as 0 and refused at connect.
                (host.to_owned(), port.parse().unwrap_or(0))
            }
            _ => (address, 6379),
        };
        RedisConfig {
            host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned(),
            port,
            #[cfg(feature = "redis-tls")]
            tls: None,
            db: 0,
            username,
            password,
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// The database number (`SELECT`), 0 by default.
    pub fn db(mut self, db: i64) -> Self {
        self.db = db;
        self
    }

    /// The ACL user name (Redis 6 and later); without one, `AUTH` uses the password alone.
    pub fn username(mut self, username: impl Into<String>) -> Self {
        self.username = Some(username.into());
        self
    }

    /// The password, sent with `AUTH`. Never shown by `Debug` or in logs.
    pub fn password(mut self, password: impl Into<String>) -> Self {
        self.password = Some(password.into());
        self
    }

    /// How long one request (or connection attempt) may take before it counts as failed;
    /// default [`DEFAULT_TIMEOUT`]. A renewal that fails is retried by the keep-alive.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Talks TLS to the server (`rediss://`), checking its certificate against the system's
    /// root certificates and its host name against `host`. Feature `redis-tls`.
    #[cfg(feature = "redis-tls")]
    pub fn tls(mut self) -> Self {
        self.tls.get_or_insert(None);
        self
    }

    /// Talks TLS to the server, checking its certificate against the CA certificates in the
    /// PEM file at `path` (instead of the system's roots), and its host name against `host`.
    /// The file is read at connect. Feature `redis-tls`.
    #[cfg(feature = "redis-tls")]
    pub fn ca_file(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.tls = Some(Some(path.into()));
        self
    }

    /// How `Debug` shows TLS: off, on with the system's roots, or the CA file.
    fn tls_shown(&self) -> String {
        #[cfg(feature = "redis-tls")]
        match &self.tls {
            None => "off".to_owned(),
            Some(None) => "system roots".to_owned(),
            Some(Some(path)) => format!("CA file {}", path.display()),
        }
        #[cfg(not(feature = "redis-tls"))]
        "off".to_owned()
    }

    fn client(&self) -> Result<Client> {
        if self.host.is_empty() || self.port == 0 {
            return Err(Error::InvalidConfig {
                backend: NAME,
                reason: format!(
                    "{:?} is not host:port (write e.g. \"127.0.0.1:6379\")",
                    crate::secret::redact(&format!("{}:{}", self.host, self.port))
                ),
            });
        }
        let mut redis = RedisConnectionInfo::default().set_db(self.db);
        if let Some(username) = &self.username {
            redis = redis.set_username(username);
        }
        if let Some(password) = &self.password {
            redis = redis.set_password(password);
        }
        #[cfg(feature = "redis-tls")]
        if let Some(ca_file) = &self.tls {
            return self.tls_client(ca_file.as_deref(), redis);
        }
        let info = ConnectionAddr::Tcp(self.host.clone(), self.port)
            .into_connection_info()
            .map_err(from_redis)?
            .set_redis_settings(redis);
        Client::open(info).map_err(from_redis)
    }

    #[cfg(feature = "redis-tls")]
    fn tls_client(
        &self,
        ca_file: Option<&std::path::Path>,
        redis: RedisConnectionInfo,
    ) -> Result<Client> {
        let root_cert = match ca_file {
            Some(path) => Some(std::fs::read(path).map_err(|error| Error::InvalidConfig {
                backend: NAME,
                reason: format!(
                    "cannot read the CA file {}: {error}; name a PEM file of the CA \
                     certificates that sign the Redis server's certificate",
                    path.display()
                ),
            })?),
            None => None,
        };
        // The `redis` crate builds its rustls configuration with the process's default
        // crypto provider; with more than one compiled in (ring here, aws-lc-rs through other
        // dependencies) there is none until someone installs one. An application that chose
        // one keeps it: this only installs ring where nothing was installed.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let info = ConnectionAddr::TcpTls {
            host: self.host.clone(),
            port: self.port,
            insecure: false,
            tls_params: None,
        }
        .into_connection_info()
        .map_err(from_redis)?
        .set_redis_settings(redis);
        let certificates = ::redis::TlsCertificates {
            client_tls: None,
            root_cert,
        };
        Client::build_with_tls(info, certificates).map_err(|error| Error::InvalidConfig {
            backend: NAME,
            reason: format!("the TLS settings are unusable: {error}"),
        })
    }
}

/// Whether followers use keyspace notifications.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Notifications {
    /// Use them when the server publishes them (`notify-keyspace-events` with `K`, `g` and
    /// `x`, or `KA`); otherwise try to turn them on with `CONFIG SET` (adding `Kg$x` to the
    /// flags already set), and poll if that is refused (a managed Redis, an ACL without
    /// `CONFIG`). The default.
    #[default]
    Auto,
    /// Use them when the server publishes them; never change the server's configuration.
    IfEnabled,
    /// Never: followers poll.
    Off,
}

impl PolledBuilder<Settings> {
    /// Whether followers use keyspace notifications; default [`Notifications::Auto`].
    pub fn notifications(mut self, notifications: Notifications) -> Self {
        self.store.notifications = notifications;
        self
    }

    /// Connects (with `PING`), checks keyspace notifications, and builds the backend.
    ///
    /// Errors: [`Error::InvalidConfig`] for an unusable address or a zero poll interval,
    /// [`Error::Unauthorized`] for refused credentials, [`Error::Unavailable`] when the
    /// server cannot be reached.
    pub async fn connect(self) -> Result<RedisBackend> {
        self.dial().await.map_err(Error::not_retried)
    }

    /// The one attempt of [`connect`](Self::connect).
    async fn dial(self) -> Result<RedisBackend> {
        self.check_poll(NAME)?;
        if self.prefix.contains(['?', '#', '*', '[', ']', '\\']) {
            return Err(Error::InvalidConfig {
                backend: NAME,
                reason: format!(
                    "the key prefix {:?} has one of ? # * [ ] \\; use letters, digits, '/', \
                     '.', '_', ':' or '-'",
                    crate::secret::redact(&self.prefix)
                ),
            });
        }
        let Settings {
            config,
            notifications,
        } = self.store;
        let client = config.client()?;
        let manager = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(config.timeout))
            .set_response_timeout(Some(config.timeout))
            .set_number_of_retries(1);
        let mut conn = client
            .get_connection_manager_with_config(manager)
            .await
            .map_err(from_redis)?;
        let _: String = ::redis::cmd("PING")
            .query_async(&mut conn)
            .await
            .map_err(from_redis)?;
        let notifier = match notifications {
            Notifications::Off => {
                tracing::info!(
                    poll = ?self.poll_interval,
                    "redis: keyspace notifications off by configuration; followers poll"
                );
                None
            }
            mode => {
                notify::start(
                    &client,
                    &mut conn,
                    config.db,
                    &self.prefix,
                    mode == Notifications::Auto,
                    config.timeout,
                )
                .await
            }
        };
        let (wakeup, poll) = match notifier {
            Some(_) => {
                tracing::info!(
                    safety_net = ?SAFETY_NET_POLL,
                    "redis: followers wake on keyspace notifications"
                );
                (Wakeup::Push, SAFETY_NET_POLL)
            }
            None => {
                tracing::info!(poll = ?self.poll_interval, "redis: followers poll");
                (Wakeup::Poll(self.poll_interval), self.poll_interval)
            }
        };
        let info = BackendInfo {
            min_ttl: MIN_TTL,
            max_ttl: MAX_TTL,
            ..polled::info(NAME, wakeup)
        };
        let store = RedisStore {
            config,
            conn,
            notifier,
        };
        Ok(PolledBackend::new(store, self.prefix, poll, info))
    }
}

/// A connection to a Redis server, for any number of elections. Cheap to clone: clones
/// share the connection (one multiplexed connection, reconnected by the `redis` crate's
/// `ConnectionManager`), the pub/sub connection and the sessions.
///
/// `Debug` output shows the address, database, user name and prefix, never the password.
/// See the [module docs](self) for how elections work on Redis, and what they cannot survive.
pub type RedisBackend = PolledBackend<RedisStore>;

impl PolledBackend<RedisStore> {
    /// The server at `address` (`host:port`), database 0, without credentials, default
    /// settings. See [`RedisBuilder::connect`] for the errors.
    pub async fn connect(address: impl Into<String>) -> Result<RedisBackend> {
        Self::builder(RedisConfig::new(address)).connect().await
    }

    /// Starts configuring a backend on the server described by `config`.
    pub fn builder(config: RedisConfig) -> RedisBuilder {
        PolledBuilder::new(Settings {
            config,
            notifications: Notifications::Auto,
        })
    }

    /// Whether followers wake on keyspace notifications (else they poll).
    pub fn notifications_active(&self) -> bool {
        self.store().notifier.is_some()
    }
}

/// A session on Redis: process-local, alive as long as one script renews every key its
/// elections hold, every renew interval. Closing (or dropping) the last handle deletes the
/// keys it still holds.
pub type RedisSession = PolledSession<RedisStore>;
/// One session's claim on one Redis election, the key `<prefix><election>`: taken by one
/// script (`INCR` of the counter and `SET NX PX` of the key, atomically); see the
/// [module docs](self).
pub type RedisContender = PolledContender<RedisStore>;
/// Follows the holder of one Redis election: a `GET` of its key at each keyspace
/// notification for it (when they are on) or jittered poll.
pub type RedisObserver = PolledObserver<RedisStore>;

/// Maps a `redis` crate error: refused credentials, an unreachable server, or anything else.
fn from_redis(error: RedisError) -> Error {
    let auth = matches!(error.kind(), ::redis::ErrorKind::AuthenticationFailed)
        || matches!(error.code(), Some("NOPERM" | "WRONGPASS" | "NOAUTH"));
    if auth {
        Error::Unauthorized {
            backend: NAME,
            reason: error.to_string(),
        }
    } else if error.is_io_error()
        || error.is_timeout()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
    {
        Error::Unavailable {
            backend: NAME,
            reason: error.to_string(),
        }
    } else {
        Error::Store {
            backend: NAME,
            reason: error.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_with_a_default_port() {
        let c = RedisConfig::new("h:6380");
        assert_eq!((c.host.as_str(), c.port), ("h", 6380));
        let c = RedisConfig::new("h");
        assert_eq!((c.host.as_str(), c.port), ("h", 6379));
        let c = RedisConfig::new("[::1]:7000");
        assert_eq!((c.host.as_str(), c.port), ("::1", 7000));
        assert!(matches!(
            RedisConfig::new("h:x").client(),
            Err(Error::InvalidConfig { .. })
        ));
    }

    #[test]
    fn debug_shows_no_password() {
        let c = RedisConfig::new("h:1").username("u").password("s3cret");
        let shown = format!("{c:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("\"u\""), "{shown}");
    }
}
