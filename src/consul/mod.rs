//! The Consul backend: a Consul session per candidate, and one KV key per election that the
//! candidates lock with `?acquire=`, as in Consul's leader-election guide.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use incumbent::Election;
//! use incumbent::consul::{ConsulBackend, ConsulConfig};
//!
//! let backend = ConsulBackend::builder(
//!     ConsulConfig::new("https://consul.internal:8501")
//!         .token(std::env::var("CONSUL_HTTP_TOKEN")?)
//!         .datacenter("dc1")
//!         .ca_pem(std::fs::read("/etc/consul.d/ca.pem")?),
//! )
//! .prefix("services/indexer/")
//! .build()?;
//!
//! let election = Election::builder(backend, "jobs/index-builder")
//!     .candidate("host-a:8080")
//!     .ttl(Duration::from_secs(15))
//!     .lock_delay(Duration::from_secs(5))
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
//! For a local agent without ACLs, `ConsulBackend::connect("http://127.0.0.1:8500")?` is all
//! it takes.
//!
//! # How it works
//!
//! - **Session.** [`open_session`](Backend::open_session) creates a Consul session with the
//!   election's ttl, behavior `release`, the election's lock-delay, and no node checks (only
//!   the ttl decides its life, so a session never depends on the agent's `serfHealth` check),
//!   and renews it every renew interval with the crate's one keep-alive loop. Elections on the
//!   same [`ConsulBackend`] with equal session settings (which includes the candidate's
//!   identity) share one Consul session; it is destroyed when the last of them closes.
//! - **Acquire.** Every candidate writes its identity ([`Leader`] as JSON) to the election's
//!   key, `<prefix><election>`, with `PUT ?acquire=<session>`. Consul grants the lock to one
//!   session at a time: the write succeeds only when no session holds the key.
//! - **Two campaigns of one election on one session.** Consul locks per session: a second
//!   `?acquire=` by the session that holds the key succeeds. Two campaigns of one
//!   [`Election`](crate::Election) (or two equal elections on one backend) share a pooled
//!   session, so each session keeps a local *claim* per key: only the contender that claimed
//!   it may acquire or hold the key, and another contender of the same session waits behind
//!   it, woken by the claim being given up (a local notification, no store traffic; its
//!   blocking query on the key goes on meanwhile, so it knows whether the lock is free). The
//!   other way, a session per contender, would cost a session and a keep-alive per campaign
//!   instead of one per backend, and the waiting contender would learn nothing sooner: both
//!   are in this process, and the local claim orders them exactly.
//! - **Followers block, never poll.** A candidate that lost waits with a blocking query on
//!   the key (`?index=`), and tries again as soon as the key's `Session` clears: a release
//!   hands the lock on within a round trip or two.
//! - **The leader watches its key** with consistent blocking reads, and the term ends the
//!   moment a read shows the lock gone, with no further question to Consul first:
//!   [`KeyDeleted`](crate::DemotionReason::KeyDeleted) when the key disappeared,
//!   [`LockTaken`](crate::DemotionReason::LockTaken) when another session holds it, and
//!   [`SessionExpired`](crate::DemotionReason::SessionExpired) when the key lost its session.
//!   Only then, for the `Demoted` event, is our session looked up: a deleted key whose session
//!   is gone is reported as `SessionExpired`, and a key released while our session lives (an
//!   operator's `?release=` with our session id) as `LockTaken`. The keep-alive reports a
//!   vanished session too, at the next renewal. Transient errors while watching are retried
//!   inside with back-off; a Consul that stays unreachable is covered by the renew deadline.
//!
//! # The fencing token
//!
//! A term's token is the key's `ModifyIndex` right after the acquisition, read back with a
//! consistent read of the key (the entry whose `Session` is ours). Modify indexes are Raft
//! indexes of the whole cluster: every later write, hence every later acquisition, has a
//! greater one. Observers see it in [`Leader::fencing_token`]: the value the leader wrote,
//! or the key's `ModifyIndex` while the leader has not rewritten it. The key's `LockIndex` is
//! not used: it counts the acquisitions of one key, but restarts at 1 when the key is deleted
//! and written again, so a later term could carry a smaller number.
//!
//! Tokens grow as long as the cluster keeps its Raft log. A cluster that loses its data (a
//! `-dev` agent restarted, a cluster rebuilt empty) starts its indexes again from low numbers:
//! a candidate then refuses terms whose token did not grow past its own last one, and
//! downstream stores must be told to forget the tokens they saw.
//!
//! # Lock-delay
//!
//! When a session is invalidated (its ttl ran out, or it was destroyed) while holding a lock,
//! Consul refuses to let anyone acquire that key for the session's lock-delay (default 15 s,
//! at most 60 s, [`MAX_LOCK_DELAY`]: a longer one is refused with [`Error::InvalidTiming`],
//! not shortened as Consul itself would; set it per election with
//! [`ElectionBuilder::lock_delay`](crate::ElectionBuilder::lock_delay) or for the whole
//! backend with [`ConsulBuilder::lock_delay`]; zero turns it off). It gives a leader that was
//! cut off time to notice before another takes over. A graceful hand-off releases the lock
//! before destroying the session, so no delay applies.
//!
//! Consul answers a refused `acquire` with a bare "false". Instead of polling (Consul's own
//! `api.Lock` retries every 5 s), candidates compute when the delay ends: each remembers the
//! lock-delay of the holders it sees (read once from their session) and the moment it saw the
//! key's `Session` clear, and [`acquire`](crate::backend::Contender::acquire) returns
//! [`Attempt::Delayed`](crate::backend::Attempt::Delayed) until then plus
//! [`LOCK_DELAY_MARGIN`]. The campaign sleeps until that instant (its status shows
//! [`Role::CoolingDown`](crate::Role::CoolingDown) with it) and tries once more. A candidate
//! that never saw the last holder falls back to [`CONSUL_DEFAULT_LOCK_DELAY`].
//!
//! # Caveats
//!
//! - **The ttl is a lower bound.** Consul invalidates a session between one and two ttls
//!   after its last renewal (it doubles the ttl on its timers), so a crashed leader is
//!   replaced after up to 2 × ttl, plus the lock-delay. The leader's own guarantee does not
//!   depend on it: it fences itself at the renew deadline, before the ttl runs out.
//! - **Locks are advisory.** A plain `PUT` to the election key (without `?acquire=`) changes
//!   its value regardless of the lock, and a `DELETE` removes it; only `?acquire=` respects
//!   the lock. Give the key prefix to incumbent alone (Consul ACLs can enforce it).
//! - **Ttl between 10 s and 24 h.** Those are Consul's limits ([`MIN_TTL`], [`MAX_TTL`]);
//!   [`ElectionBuilder::build`](crate::ElectionBuilder::build) refuses others with
//!   [`Error::InvalidTiming`].
//!
//! # Options
//!
//! [`ConsulConfig`] sets the agent address (`http://` or `https://`), the ACL token (sent as
//! `X-Consul-Token`, never shown by `Debug` or in logs), the datacenter (`?dc=`), the
//! namespace (Consul Enterprise), TLS (a CA to trust, and a client certificate for agents
//! with `verify_incoming`) and the request timeout. [`ConsulBuilder`] adds the key prefix
//! (default [`DEFAULT_PREFIX`]) and the backend's default lock-delay.
//!
//! With ACLs, the token needs `key:write` on the prefix and `session:write` on the agent's
//! node, e.g. `key_prefix "incumbent/" { policy = "write" }` and
//! `session_prefix "" { policy = "write" }`. A token without them makes the campaign report
//! [`Error::Unauthorized`] in its status and retry only at its
//! longest back-off.

pub mod client;
mod contender;
mod error;
mod observer;
mod session;
mod shared;
mod sightings;
pub(crate) mod url;
mod watch;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

pub use client::ConsulConfig;
pub use contender::ConsulContender;
pub use observer::ConsulObserver;
pub use session::ConsulSession;

use self::client::{ConsulClient, KvEntry};
use crate::backend::pool::SessionPool;
use crate::backend::{Backend, BackendInfo, Leader, SessionOptions};
use crate::backoff::Backoff;
use crate::{Error, Result};

const NAME: &str = "consul";

/// The key prefix under which elections live unless [`ConsulBuilder::prefix`] says otherwise.
pub const DEFAULT_PREFIX: &str = "incumbent/";
/// The smallest session ttl Consul accepts.
pub const MIN_TTL: Duration = Duration::from_secs(10);
/// The largest session ttl Consul accepts: a day.
pub const MAX_TTL: Duration = Duration::from_secs(86_400);
/// The lock-delay of a session created without one, as Consul sets it; also what a candidate
/// assumes when it does not know the delay that refuses it.
pub const CONSUL_DEFAULT_LOCK_DELAY: Duration = Duration::from_secs(15);
/// The longest lock-delay Consul accepts ("between 0 and 60 seconds" in Consul's session
/// API; Consul itself shortens longer ones to this, incumbent refuses them).
pub const MAX_LOCK_DELAY: Duration = Duration::from_secs(60);
/// Added to the computed end of a lock-delay before trying again, so that the attempt does
/// not arrive a hair too early (Consul measures the delay on its own clock, from a moment
/// a little before the candidate saw the lock go) and have to wait for a whole fallback.
pub const LOCK_DELAY_MARGIN: Duration = Duration::from_millis(50);
/// The longest one blocking query waits for a change before it is asked again. Short
/// enough that a connection that died silently is noticed within a minute or so, long
/// enough that an idle follower costs one request a minute.
pub const BLOCKING_WAIT: Duration = Duration::from_secs(60);
/// Retries inside [`Contender::lost`](crate::backend::Contender::lost): jittered, from
/// 100 ms up to 5 s, so a Consul that fails fast is not hammered while the leader waits for
/// its renew deadline.
const WATCH_RETRY: Backoff = Backoff {
    initial: Duration::from_millis(100),
    max: Duration::from_secs(5),
};

/// A connection to a Consul agent, for any number of elections. Cheap to clone: clones share
/// the HTTP connection pool, the sessions and what was seen of the lock holders.
///
/// Made with [`ConsulBackend::connect`], [`ConsulBackend::new`] or [`ConsulBackend::builder`].
/// `Debug` output shows the address, datacenter and prefix, never the ACL token or TLS key.
/// See the [module docs](self) for how elections work on Consul.
#[derive(Clone)]
pub struct ConsulBackend {
    inner: Arc<Inner>,
}

struct Inner {
    client: ConsulClient,
    prefix: String,
    /// The lock-delay of sessions whose election sets none; `None`: Consul's default.
    lock_delay: Option<Duration>,
    /// Sessions shared by the elections with equal options.
    sessions: SessionPool<shared::Shared>,
    sightings: sightings::Sightings,
}

impl fmt::Debug for ConsulBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConsulBackend")
            .field("client", &self.inner.client)
            .field("prefix", &self.inner.prefix)
            .field("lock_delay", &self.inner.lock_delay)
            .finish_non_exhaustive()
    }
}

/// Settings for a [`ConsulBackend`] beyond the client's: made by [`ConsulBackend::builder`],
/// finished by [`build`](ConsulBuilder::build), which checks them.
#[derive(Clone, Debug)]
pub struct ConsulBuilder {
    config: ConsulConfig,
    prefix: String,
    lock_delay: Option<Duration>,
}

impl ConsulBuilder {
    /// The prefix of every key this backend writes (default [`DEFAULT_PREFIX`]): the election
    /// `jobs/a` lives at `<prefix>jobs/a`. Usually ends with `/`; may be empty.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The lock-delay of sessions for elections that do not set one with
    /// [`ElectionBuilder::lock_delay`](crate::ElectionBuilder::lock_delay). Default: Consul's
    /// own, [`CONSUL_DEFAULT_LOCK_DELAY`]. A delay above [`MAX_LOCK_DELAY`] is refused by
    /// [`build`](Self::build).
    pub fn lock_delay(mut self, delay: Duration) -> Self {
        self.lock_delay = Some(delay);
        self
    }

    /// Checks the settings and builds the backend. Nothing is sent to Consul yet: an agent
    /// that cannot be reached is reported (and retried) by the campaigns.
    ///
    /// Errors with [`Error::InvalidConfig`] for an unusable address (no host, a scheme other
    /// than `http` or `https`, credentials in it), an ACL token that cannot be sent as an HTTP
    /// header, TLS material that is not PEM, or a prefix that makes no valid key (`a//b`,
    /// `.` or `..` segments) or that has a `?` or `#` (most likely a pasted URL whose query, a
    /// token perhaps, would end up in every key; the message shows it redacted); with
    /// [`Error::InvalidTiming`] for a lock-delay above [`MAX_LOCK_DELAY`].
    pub fn build(self) -> Result<ConsulBackend> {
        if let Some(delay) = self.lock_delay.filter(|d| *d > MAX_LOCK_DELAY) {
            return Err(Error::timing(format!(
                "lock_delay {delay:?} is longer than Consul allows ({MAX_LOCK_DELAY:?}); set \
                 ConsulBuilder::lock_delay to at most that"
            )));
        }
        if self.prefix.contains(['?', '#']) {
            return Err(Error::InvalidConfig {
                backend: NAME,
                reason: format!(
                    "the key prefix {:?} has a '?' or '#', which would put what looks like a \
                     URL's query or fragment into every key; use letters, digits, '/', '.', '_' \
                     or '-' (an ACL token goes in ConsulConfig::token)",
                    crate::secret::redact(&self.prefix)
                ),
            });
        }
        let prefix = self
            .prefix
            .strip_prefix('/')
            .unwrap_or(&self.prefix)
            .to_owned();
        let probe = format!("{prefix}x");
        if probe
            .split('/')
            .any(|segment| segment.is_empty() || segment == "." || segment == "..")
        {
            return Err(Error::InvalidConfig {
                backend: NAME,
                reason: format!(
                    "the key prefix {:?} has an empty, `.` or `..` path segment; use e.g. \"incumbent/\"",
                    self.prefix
                ),
            });
        }
        let client = ConsulClient::new(self.config).map_err(error::from_client)?;
        Ok(ConsulBackend {
            inner: Arc::new(Inner {
                client,
                prefix,
                lock_delay: self.lock_delay,
                sessions: SessionPool::default(),
                sightings: sightings::Sightings::default(),
            }),
        })
    }
}

impl ConsulBackend {
    /// The agent at `address` (e.g. `"http://127.0.0.1:8500"`), without an ACL token, with the
    /// default prefix. See [`ConsulBuilder::build`] for the errors.
    pub fn connect(address: impl Into<String>) -> Result<ConsulBackend> {
        Self::new(ConsulConfig::new(address))
    }

    /// The agent described by `config`, with the default prefix. See [`ConsulBuilder::build`]
    /// for the errors.
    pub fn new(config: ConsulConfig) -> Result<ConsulBackend> {
        Self::builder(config).build()
    }

    /// Starts configuring a backend on the agent described by `config`: key prefix, default
    /// lock-delay.
    pub fn builder(config: ConsulConfig) -> ConsulBuilder {
        ConsulBuilder {
            config,
            prefix: DEFAULT_PREFIX.to_owned(),
            lock_delay: None,
        }
    }

    /// The HTTP client, for anything else you need from the same agent.
    pub fn client(&self) -> &ConsulClient {
        &self.inner.client
    }

    /// The prefix of every key this backend writes.
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// The KV key of `election`: `<prefix><election>`.
    pub fn key(&self, election: &str) -> String {
        format!("{}{election}", self.inner.prefix)
    }

    /// The ids of the Consul sessions this backend keeps alive now (one per distinct session
    /// setting, shared by its elections), for tooling and tests.
    pub fn session_ids(&self) -> Vec<String> {
        let sessions = self.inner.sessions.sessions();
        sessions.iter().map(|shared| shared.id.clone()).collect()
    }

    /// The lock-delay Consul applies to a session with these options.
    fn effective_lock_delay(&self, options: &SessionOptions) -> Option<Duration> {
        options.lock_delay.or(self.inner.lock_delay)
    }

    fn sightings(&self) -> &sightings::Sightings {
        &self.inner.sightings
    }
}

/// The leader a locked key describes: its stored identity, with the fencing token it wrote,
/// or else the key's modify index (which is the token while the value is the one written by
/// the acquisition). A value that is not a [`Leader`] (someone else wrote it) carries no token.
fn leader_of(entry: &KvEntry) -> Leader {
    match serde_json::from_slice::<Leader>(&entry.value) {
        Ok(mut leader) => {
            leader.fencing_token.get_or_insert(entry.modify_index);
            leader
        }
        Err(_) => Leader::from_bytes(&entry.value),
    }
}

/// The session holding `entry`'s lock, if it exists and is locked.
fn holder(entry: Option<&KvEntry>) -> Option<&str> {
    entry.and_then(|e| e.session.as_deref())
}

impl Backend for ConsulBackend {
    type Session = ConsulSession;
    type Observer = ConsulObserver;

    fn info(&self) -> BackendInfo {
        BackendInfo {
            renew_divisor: 2,
            max_lock_delay: Some(MAX_LOCK_DELAY),
            ..BackendInfo::new(NAME, MIN_TTL, MAX_TTL)
        }
    }

    async fn open_session(&self, options: &SessionOptions) -> Result<ConsulSession> {
        session::open(self, options).await
    }

    async fn observe(&self, election: &str) -> Result<ConsulObserver> {
        Ok(ConsulObserver::new(self.clone(), self.key(election)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_must_make_valid_keys() {
        for good in ["incumbent/", "a/b/", "svc-", "", "/leading/"] {
            let backend = ConsulBackend::builder(ConsulConfig::default())
                .prefix(good)
                .build()
                .unwrap_or_else(|e| panic!("{good:?}: {e}"));
            assert!(!backend.key("e").starts_with('/'), "{good:?}");
        }
        for bad in ["a//", "./", "a/../", "//"] {
            let e = ConsulBackend::builder(ConsulConfig::default())
                .prefix(bad)
                .build()
                .unwrap_err();
            assert!(matches!(e, Error::InvalidConfig { .. }), "{bad:?}: {e}");
        }
        let e = ConsulBackend::connect("ftp://x").unwrap_err();
        assert!(matches!(e, Error::InvalidConfig { .. }), "{e}");
    }

    #[test]
    fn prefixes_with_a_query_or_fragment_are_refused_without_echoing_them() {
        for bad in ["p?token=s3cr3t/", "p/?token=s3cr3t", "p#s3cr3t/", "a/b#"] {
            let e = ConsulBackend::builder(ConsulConfig::default())
                .prefix(bad)
                .build()
                .unwrap_err();
            assert!(matches!(e, Error::InvalidConfig { .. }), "{bad:?}: {e}");
            let message = e.to_string();
            assert!(message.contains("'?' or '#'"), "{message}");
            assert!(!message.contains("s3cr3t"), "{message}");
        }
    }

    #[test]
    fn lock_delays_above_consuls_maximum_are_refused() {
        let build = |delay| {
            ConsulBackend::builder(ConsulConfig::default())
                .lock_delay(delay)
                .build()
        };
        assert!(build(MAX_LOCK_DELAY).is_ok());
        let e = build(MAX_LOCK_DELAY + Duration::from_millis(1)).unwrap_err();
        assert!(matches!(e, Error::InvalidTiming { .. }), "{e}");
        assert!(e.to_string().contains("60s"), "{e}");
    }

    #[test]
    fn debug_shows_no_token() {
        let backend =
            ConsulBackend::new(ConsulConfig::new("http://127.0.0.1:8500").token("s3cr3t"))
                .expect("valid");
        let debug = format!("{backend:?}");
        assert!(!debug.contains("s3cr3t"), "{debug}");
        assert!(debug.contains("incumbent/"), "{debug}");
    }

    #[test]
    fn leaders_carry_the_written_token_or_the_modify_index() {
        let entry = |value: &[u8]| KvEntry {
            key: "incumbent/e".into(),
            value: value.to_vec(),
            session: Some("s".into()),
            create_index: 3,
            modify_index: 42,
            lock_index: 1,
        };
        let written = br#"{"id":"a","since_unix_ms":1}"#;
        assert_eq!(leader_of(&entry(written)).fencing_token, Some(42));
        let proclaimed = br#"{"id":"a","fencing_token":40}"#;
        assert_eq!(leader_of(&entry(proclaimed)).fencing_token, Some(40));
        let foreign = leader_of(&entry(b"someone else"));
        assert_eq!(foreign.candidate.id, "someone else");
        assert_eq!(foreign.fencing_token, None);
    }
}
