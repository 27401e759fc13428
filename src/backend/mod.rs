//! The lock primitive every store implements, and the types it speaks in.
//!
//! A [`Backend`] is a handle on a store. The campaign engine uses it in three layers:
//!
//! 1. A [`Session`] is the liveness of this process in the store: an etcd lease, a Consul
//!    session, a ZooKeeper session, or a Redis/memcached key TTL refreshed by us. It is opened
//!    with a ttl, kept alive by the backend itself (one keep-alive per session, however many
//!    elections use it), and reports through [`Session::health`] when its last renewal was
//!    confirmed, and when it is lost. A backend may hand the same underlying session to many
//!    elections: closing one handle closes the store's session only when the last user is done.
//! 2. A [`Contender`] is one session's claim on one election. [`Contender::acquire`] tries to
//!    take the lock (or joins the queue, for stores with ordered candidates), [`Contender::wait`]
//!    sleeps until another attempt can succeed, using the store's own notification, and
//!    [`Contender::lost`] resolves when a held lock is taken away.
//! 3. An [`Observer`] follows who holds an election, for followers and for bystanders. A
//!    campaign makes its own with [`Backend::observe_for`], naming its session, so that a
//!    store may stop keeping it up to date once the campaign was asked to shut down
//!    ([`Session::shutdown_notice`]); by default it is [`Backend::observe`].
//!
//! The campaign knows nothing of the store's wire format; the backend knows nothing of terms,
//! events or callbacks. The contract below is what the campaign relies on for its promises:
//! read it before writing a backend.

pub mod keepalive;
#[cfg(any(
    feature = "redis",
    feature = "memcached",
    feature = "postgres",
    feature = "kubernetes"
))]
pub mod polled;
pub mod pool;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::Result;

/// A number that is strictly greater for every new term of an election than for any earlier term.
///
/// Pass it with every write your leader makes to a downstream system, and have that system
/// reject writes whose token is lower than the highest it has seen. Where each store's token
/// comes from is documented on its backend.
pub type FencingToken = u64;

/// Who a candidate is, as other candidates and observers see it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Candidate {
    /// A human-readable identity, unique among the candidates, e.g. `"host-a:8080"`.
    pub id: String,
    /// Free-form metadata others can read, e.g. an address to send writes to.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
}

/// The holder of an election, as read from the store.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Leader {
    /// The leader's identity and metadata.
    #[serde(flatten)]
    pub candidate: Candidate,
    /// The fencing token of the leader's term, where the store exposes it.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub fencing_token: Option<FencingToken>,
    /// When the leader says its term began, in milliseconds since the Unix epoch.
    ///
    /// Consul, Redis, memcached, file and memory write it in the same write that makes the
    /// candidate leader. etcd and ZooKeeper hand leadership over by deleting the predecessor's
    /// key, so the new leader's key already exists: a candidate's key carries no `since`, and
    /// the winner writes it right after the win. An observer can briefly see the new leader
    /// with `None` here, never with the time it began to campaign.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub since_unix_ms: Option<u64>,
}

impl Leader {
    /// Encodes this leader as the JSON value backends store under the election's key.
    pub fn to_bytes(&self) -> Vec<u8> {
        // Serializing a struct of strings and integers into a Vec cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Decodes a stored value. A value another program wrote (not JSON of this shape) is kept
    /// as the identity, so observers still see something useful.
    pub fn from_bytes(bytes: &[u8]) -> Leader {
        serde_json::from_slice(bytes).unwrap_or_else(|_| Leader {
            candidate: Candidate {
                id: String::from_utf8_lossy(bytes).into_owned(),
                metadata: BTreeMap::new(),
            },
            fencing_token: None,
            since_unix_ms: None,
        })
    }

    /// When the term began, if the leader said so.
    pub fn since(&self) -> Option<SystemTime> {
        self.since_unix_ms
            .map(|ms| UNIX_EPOCH + Duration::from_millis(ms))
    }
}

/// Milliseconds since the Unix epoch, now.
pub(crate) fn unix_ms_now() -> u64 {
    crate::time::unix_ms(SystemTime::now())
}

/// The `connect_timeout` and `request_timeout` setters of a store's builder (etcd,
/// ZooKeeper): one text, given the `connect_timeout` doc. The builder has fields of those
/// names, and `DEFAULT_CONNECT_TIMEOUT` and `DEFAULT_REQUEST_TIMEOUT` in scope.
#[cfg_attr(
    not(any(feature = "etcd", feature = "zookeeper")),
    allow(unused_macros)
)]
macro_rules! timeout_setters {
    ($connect_doc:expr) => {
        #[doc = $connect_doc]
        pub fn connect_timeout(mut self, limit: std::time::Duration) -> Self {
            self.connect_timeout = limit;
            self
        }

        /// How long one request may take before it counts as unavailable (default
        /// [`DEFAULT_REQUEST_TIMEOUT`]).
        pub fn request_timeout(mut self, limit: std::time::Duration) -> Self {
            self.request_timeout = limit;
            self
        }
    };
}
#[cfg_attr(
    not(any(feature = "etcd", feature = "zookeeper")),
    allow(unused_imports)
)]
pub(crate) use timeout_setters;

/// A store write that runs to its answer even when the future awaiting it is dropped.
///
/// A write whose future is dropped mid-flight may still land, and on a store that serves
/// one client's requests concurrently (etcd's gRPC streams, HTTP connections), it may land
/// after a delete sent later: a `release` after a cancelled `acquire` would then leave the
/// key behind. [`run`](Self::run) spawns the write, and [`settle`](Self::settle) waits for a
/// write still on its way, so that what follows it is ordered after it. Each write has the
/// request timeout, so a settle is bounded.
#[cfg_attr(not(any(feature = "etcd", feature = "consul")), allow(dead_code))]
pub(crate) struct Unabandoned<T> {
    in_flight: Option<tokio::task::JoinHandle<T>>,
}

#[cfg_attr(not(any(feature = "etcd", feature = "consul")), allow(dead_code))]
impl<T: Send + 'static> Unabandoned<T> {
    pub(crate) fn new() -> Self {
        Unabandoned { in_flight: None }
    }

    /// Runs `write` to its end (after any earlier write still on its way): dropping the
    /// returned future stops the wait, not the write.
    pub(crate) async fn run(
        &mut self,
        write: impl Future<Output = T> + Send + 'static,
    ) -> std::result::Result<T, tokio::task::JoinError> {
        self.settle().await;
        let handle = self.in_flight.insert(tokio::spawn(write));
        let answer = handle.await;
        self.in_flight = None;
        answer
    }

    /// Waits for a write whose awaiting future was dropped, if there is one: from then on,
    /// nothing of it can land.
    pub(crate) async fn settle(&mut self) {
        if let Some(handle) = self.in_flight.as_mut() {
            let _ = handle.await;
            self.in_flight = None;
        }
    }
}

/// Locks a mutex, recovering the data if a panicking thread poisoned it: the backends'
/// critical sections leave their state consistent at each step.
pub(crate) fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// After a release, how long the campaign that released a lock leaves it to candidates in
/// other processes, where the store pushes the release to them and does not queue its
/// candidates (a Kubernetes watch, Redis's keyspace notifications, PostgreSQL's `NOTIFY`,
/// Consul's blocking queries). The push reaches them in milliseconds on a quiet machine, but
/// a loaded API server's watch was seen to take over 100 ms: the resigning campaign's own
/// retry after its back-off (from 50 ms) then won the lock straight back. Every other
/// campaign, in this process too, may take the lock at once; a lone candidate's resign costs
/// it this long. (Stores that queue their candidates, etcd and ZooKeeper, need none: a
/// resigning candidate queues again behind the others.)
pub const PUSH_COURTESY: Duration = Duration::from_millis(500);

/// What keeps a campaign that released a lock off it for a while (see [`PUSH_COURTESY`]).
#[cfg(any(
    feature = "consul",
    feature = "redis",
    feature = "memcached",
    feature = "postgres",
    feature = "kubernetes"
))]
pub(crate) mod courtesy {
    use std::collections::HashMap;
    use std::sync::Mutex;
    use std::time::Duration;

    use tokio::time::Instant;

    use super::lock;

    /// The keys of a backend that a campaign released a moment ago, each with until when
    /// that campaign (its session handle) leaves it to the others, and the handle.
    #[derive(Debug, Default)]
    pub(crate) struct Courtesy(Mutex<HashMap<String, (Instant, u64)>>);

    impl Courtesy {
        /// Session handle `handle` released `key`: it leaves it alone for `lasting`.
        pub(crate) fn grant(&self, key: &str, handle: u64, lasting: Duration) {
            lock(&self.0).insert(key.to_owned(), (Instant::now() + lasting, handle));
        }

        /// The end of the courtesy for `key`, while it runs and holds `handle` back.
        pub(crate) fn holds_back(&self, key: &str, handle: u64) -> Option<Instant> {
            let mut courtesy = lock(&self.0);
            let now = Instant::now();
            courtesy.retain(|_, (until, _)| *until > now);
            courtesy
                .get(key)
                .filter(|(_, releaser)| *releaser == handle)
                .map(|(until, _)| *until)
        }
    }
}

/// The usual renew interval as a fraction of the ttl: three chances to renew before expiry,
/// as etcd's own keep-alive does. Each backend states its own in
/// [`BackendInfo::renew_divisor`].
pub const DEFAULT_RENEW_INTERVAL_DIVISOR: u32 = 3;

/// Default renew deadline as a fraction of the ttl (2/3): a leader that has not confirmed a
/// renewal for this long fences itself, leaving a third of the ttl as margin for clock rate
/// differences and for the worker to notice cancellation before the store can expire the lease.
pub const DEFAULT_RENEW_DEADLINE_FRACTION: (u32, u32) = (2, 3);
/// The smallest gap allowed between the renew deadline and the ttl, as a fraction of the ttl
/// (1/5): the leader must stop trusting itself well before the store can hand the lock on.
pub const MIN_DEADLINE_MARGIN_DIVISOR: u32 = 5;
/// What a backend tells the campaign about itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendInfo {
    /// Short name for logs and metrics, e.g. `"etcd"`.
    pub name: &'static str,
    /// The smallest session ttl the store accepts.
    pub min_ttl: Duration,
    /// The largest session ttl the store accepts.
    pub max_ttl: Duration,
    /// How a follower's [`Contender::wait`] learns that the lock may be free; shown in
    /// [`Status::wakeup`](crate::Status::wakeup) and `/leader`. (An [`Observer`] of a
    /// backend may work differently: the file backend's followers queue on the kernel's lock,
    /// a push, while its observers re-read the lock file.)
    pub wakeup: Wakeup,
    /// The renew interval, as a fraction of the ttl (`ttl / renew_divisor`), when the
    /// election does not set one: 3 for most stores (three chances before expiry, as etcd's
    /// own keep-alive); 2 for Consul, whose ttl is only a lower bound.
    pub renew_divisor: u32,
    /// The longest lock-delay ([`SessionOptions::lock_delay`]) the store accepts; `None`: the
    /// store has no lock-delay, and an election that asks for one (other than zero) is
    /// refused. Consul: 60 s; the memory backend: `Duration::MAX` (no limit of its own).
    pub max_lock_delay: Option<Duration>,
    /// Whether the store frees a dead holder's lock the moment it dies (the file backend: the
    /// kernel drops a dead process's `flock`), rather than when its lease runs out, one ttl
    /// after its last renewal (every other store). A winner counts the time without a
    /// leader ([`Gap::without_leader`](crate::Gap::without_leader)) from the lock being free
    /// when it is `true`, from one ttl before that when it is `false`.
    pub frees_dead_holder_at_once: bool,
    /// How the store keeps the next term for the target of a hand-over
    /// ([`CampaignHandle::hand_over`](crate::CampaignHandle::hand_over)).
    pub hand_over: HandOverStyle,
    /// From what the store counts a session's ttl, which bounds the renew deadline.
    pub deadline: DeadlineRule,
}

/// From what a store counts a session's ttl, and so how long a leader may go on after its
/// last confirmed renewal: the renew deadline's default, and the longest one accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeadlineRule {
    /// The store expires a session a ttl after it received the last renewal it confirmed
    /// (etcd, Consul, Redis, and the others). Renew deadline: 2/3 of the ttl by default
    /// ([`DEFAULT_RENEW_DEADLINE_FRACTION`]), at most the ttl minus a fifth
    /// ([`MIN_DEADLINE_MARGIN_DIVISOR`]).
    Renewal,
    /// The store may count the ttl from the session's activity *before* the last confirmed
    /// renewal, or up to half a tick before even that (an eighth of the ttl, with a ttl of
    /// four ticks or more): ZooKeeper, whose leader expires sessions from what its followers
    /// report of them, every half tick (see the ZooKeeper backend's "Why renewals sync").
    /// The deadline plus the longest gap between
    /// two of the session's requests (the renew interval, or [`PING_AFTER`](Self::PING_AFTER)
    /// of the ttl when the client pings first) must stay under 17/20 of the ttl: at most
    /// `17/20 ttl - min(renew interval, 7/20 ttl)`, half the ttl by default.
    PreviousActivity,
}

impl DeadlineRule {
    /// Under [`PreviousActivity`](Self::PreviousActivity): the client pings after this
    /// fraction of the ttl without a request (7/20), so no two requests of a session are
    /// further apart, whatever the renew interval.
    pub const PING_AFTER: (u32, u32) = (7, 20);

    /// The renew deadline for `ttl` and `renew_interval` when the election does not set one.
    pub fn default_deadline(self, ttl: Duration, renew_interval: Duration) -> Duration {
        match self {
            DeadlineRule::Renewal => {
                let (num, den) = DEFAULT_RENEW_DEADLINE_FRACTION;
                ttl * num / den
            }
            DeadlineRule::PreviousActivity => (ttl / 2).min(self.max_deadline(ttl, renew_interval)),
        }
    }

    /// The longest renew deadline accepted for `ttl` and `renew_interval`.
    pub fn max_deadline(self, ttl: Duration, renew_interval: Duration) -> Duration {
        match self {
            DeadlineRule::Renewal => ttl - ttl / MIN_DEADLINE_MARGIN_DIVISOR,
            DeadlineRule::PreviousActivity => {
                let (num, den) = Self::PING_AFTER;
                let gap = renew_interval.min(ttl * num / den);
                (ttl * 17 / 20).saturating_sub(gap)
            }
        }
    }
}

impl BackendInfo {
    /// A store with ttls in `min_ttl..=max_ttl` that pushes changes to followers, renews
    /// [`DEFAULT_RENEW_INTERVAL_DIVISOR`] times per ttl and has no lock-delay; set the other
    /// fields with struct update syntax.
    pub fn new(name: &'static str, min_ttl: Duration, max_ttl: Duration) -> Self {
        BackendInfo {
            name,
            min_ttl,
            max_ttl,
            wakeup: Wakeup::Push,
            renew_divisor: DEFAULT_RENEW_INTERVAL_DIVISOR,
            max_lock_delay: None,
            frees_dead_holder_at_once: false,
            hand_over: HandOverStyle::Escrow,
            deadline: DeadlineRule::Renewal,
        }
    }
}

/// How a store keeps the next term for the target of a hand-over (see the
/// [`switchover`](crate::switchover) docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandOverStyle {
    /// The leader keeps the lock, naming the target, and the target takes it over in one
    /// conditional write ([`Contender::take_over`]).
    Escrow,
    /// The store hands the lock to the next in its line: the others step out of the line, and
    /// the leader releases once the target is next.
    Line,
    /// The leader names the target and releases; whoever gets the lock reads the name under
    /// it, and lets go unless it is the target.
    Gate,
}

/// How a backend's [`Contender::wait`] learns about changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wakeup {
    /// The store pushes changes (a watch, a blocking query, a kernel lock queue): no polling.
    Push,
    /// The store has no notification; the backend polls at about this interval, with jitter.
    Poll(Duration),
}

/// How a session should be opened. Backends that share sessions share them between
/// elections whose options are equal.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SessionOptions {
    /// How long the store keeps the session alive without a renewal.
    pub ttl: Duration,
    /// How often the backend renews the session.
    pub renew_interval: Duration,
    /// After this session is invalidated, how long the store keeps its locks from anyone,
    /// where the store supports it (Consul's lock-delay). `None`: the store's default.
    pub lock_delay: Option<Duration>,
    /// A label for the session, shown by stores that name sessions.
    pub name: String,
}

/// The liveness of a session, as a [`watch`] value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionHealth {
    /// When the last renewal that the store confirmed was *sent*. The session cannot expire
    /// in the store before this instant plus the ttl.
    pub confirmed_sent_at: Instant,
    /// Set once the session is gone for good; the session cannot recover.
    pub lost: Option<SessionLoss>,
    /// The last renewal error, cleared by the next confirmed renewal.
    pub last_error: Option<String>,
}

/// Why a session ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionLoss {
    /// The store says the session (lease) no longer exists: it expired or was revoked.
    Expired,
    /// No renewal was confirmed within the ttl: the store has surely expired it by now.
    Unconfirmed,
    /// The session was closed by this process.
    Closed,
}

/// The result of one [`Contender::acquire`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Attempt {
    /// We hold the lock. The token is greater than that of every earlier holder.
    Won {
        /// The fencing token of the new term.
        fencing_token: FencingToken,
    },
    /// Another session holds the lock, or is ahead of us in the queue. Call
    /// [`Contender::wait`] before trying again.
    Held {
        /// The current holder, if the store could say.
        holder: Option<Leader>,
    },
    /// Nobody may acquire the lock before `until` (a lock-delay the store imposes after a
    /// session was invalidated). The campaign sleeps until then; no [`Contender::wait`] needed.
    Delayed {
        /// When acquisition can succeed again.
        until: Instant,
    },
}

/// Why a held lock was lost, as [`Contender::lost`] reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockLoss {
    /// The election's key was deleted (by an operator, or by the store).
    Deleted,
    /// Another session holds the lock now.
    Taken,
    /// The session behind the lock is gone.
    SessionLost,
}

/// A handle on a coordination store: the lock primitive the campaign is built on.
///
/// Implementations are cheap to clone (an `Arc` inside) and safe to share between many
/// elections and tasks.
pub trait Backend: Clone + Send + Sync + 'static {
    /// The store's session type.
    type Session: Session;
    /// The store's observer type.
    type Observer: Observer;

    /// Static facts about the backend.
    fn info(&self) -> BackendInfo;

    /// Opens a session (or joins a shared one with the same options) and starts keeping it
    /// alive. Errors: [`Error::Unavailable`](crate::Error::Unavailable) when the store cannot
    /// be reached (the campaign retries), [`Error::Unauthorized`](crate::Error::Unauthorized),
    /// [`Error::InvalidTiming`](crate::Error::InvalidTiming) when the store rejects the ttl.
    fn open_session(
        &self,
        options: &SessionOptions,
    ) -> impl Future<Output = Result<Self::Session>> + Send;

    /// Starts following the holder of `election`. The first [`Observer::next`] returns the
    /// current holder at once.
    fn observe(&self, election: &str) -> impl Future<Output = Result<Self::Observer>> + Send;

    /// [`observe`](Self::observe), for a campaign on `session`: its observer of the leader
    /// while it follows, and a leader's of the election's request lock. Once the session's
    /// [`ShutdownNotice`] was given, the campaign acts on nothing the observer could report
    /// (it takes no office, and stops), so a store that pushes changes to many observers at
    /// once may stop keeping this one up to date (etcd: a process whose campaigns are all
    /// stopping decodes none of the other processes' deletes). The default is `observe`.
    fn observe_for(
        &self,
        election: &str,
        _session: &Self::Session,
    ) -> impl Future<Output = Result<Self::Observer>> + Send {
        self.observe(election)
    }

    /// The candidates of `election` in the order the store hands it on, the holder first
    /// (each with its fencing token where the store gives one), read once: where the store
    /// keeps a queue of candidates (etcd, ZooKeeper). `None` (the default) where it keeps
    /// only the holder: then only [`observe`](Self::observe) can tell who leads.
    fn participants(
        &self,
        _election: &str,
    ) -> impl Future<Output = Result<Option<Vec<Leader>>>> + Send {
        std::future::ready(Ok(None))
    }
}

/// A live session in the store. See the [module docs](self).
pub trait Session: Send + Sync + 'static {
    /// The session's claim type.
    type Contender: Contender;

    /// An opaque identifier of the session, for logs (never a secret).
    fn id(&self) -> String;

    /// The session's liveness: when the last confirmed renewal was sent, and whether it is lost.
    /// Once `lost` is set it stays set.
    fn health(&self) -> watch::Receiver<SessionHealth>;

    /// Prepares a claim on `election`, with `candidate` as the value others will read.
    /// Nothing is written to the store yet.
    fn contend(
        &self,
        election: &str,
        candidate: &Candidate,
    ) -> impl Future<Output = Result<Self::Contender>> + Send;

    /// Says that this handle's user is shutting down: it releases its claims on the handle
    /// (with [`Contender::leave`] or [`Contender::release`]) and closes it next, and makes no
    /// new one. A backend whose session ends in the store with the claims on it may then let
    /// one end of a shared session stand for every release, once all its users are leaving
    /// (etcd: one revoke of the lease). A contender's [`leave`](Contender::leave) says the
    /// same of its handle. The default does nothing.
    fn leaving(&self) {}

    /// A notice for the session's user to give, from any thread, the moment it is asked to
    /// shut down: before its campaign's task has seen the ask, let alone released its claim.
    /// A store can then tell a mass shutdown from a single one at once (etcd: once every
    /// user of a shared lease was asked, none deletes its key one by one; the revoke after
    /// the last of them has left deletes them all). Giving it changes nothing else: the
    /// user still releases its claims and closes the handle as always. `None` (the
    /// default): the store has no use for it.
    fn shutdown_notice(&self) -> Option<ShutdownNotice> {
        None
    }

    /// Ends this handle's use of the session. When no other election uses it, the store's
    /// session is destroyed (lease revoked), releasing anything it still holds at once.
    fn close(self) -> impl Future<Output = Result<()>> + Send;
}

/// One session's claim on one election.
///
/// Contract:
/// - `acquire` is idempotent: calling it again while we hold the lock returns the same
///   [`Attempt::Won`] token.
/// - `wait` returns when another `acquire` may succeed: the holder (or our predecessor in the
///   queue) went away or changed, or, for [`Wakeup::Poll`] backends, the poll interval passed.
///   It may return spuriously; it must not return in a hot loop.
/// - `lost` resolves only when the lock is definitely gone. Transient store errors are retried
///   inside; the campaign's renew deadline covers a store that stays unreachable.
/// - `release` gives up the lock (or leaves the queue) if we hold it; releasing what we do not
///   hold is a no-op, never an error.
/// - Dropping a contender without `release` leaves the lock to the session's expiry.
pub trait Contender: Send + 'static {
    /// Tries to take the lock. See [`Attempt`].
    fn acquire(&mut self) -> impl Future<Output = Result<Attempt>> + Send;

    /// Waits until another [`acquire`](Contender::acquire) may succeed.
    fn wait(&mut self) -> impl Future<Output = Result<()>> + Send;

    /// While the lock is held: resolves when it is lost, with why.
    ///
    /// It must resolve the *instant* the loss is seen, with no store round trip in between:
    /// the campaign cancels the term on it, and the next holder may already lead. Anything
    /// that takes a question to the store to tell one loss from another belongs in
    /// [`explain`](Contender::explain), which the campaign calls after the term has ended.
    fn lost(&mut self) -> impl Future<Output = LockLoss> + Send;

    /// Refines the reason of a loss that [`lost`](Contender::lost) reported, by asking the
    /// store (e.g. whether the lease behind a deleted key expired). Called after the term has
    /// been cancelled, bounded by the campaign; the default keeps the reason as it was.
    fn explain(&mut self, loss: LockLoss) -> impl Future<Output = LockLoss> + Send {
        std::future::ready(loss)
    }

    /// Takes the lock over from `holder`, a leader whose value names this candidate as the
    /// target of a hand-over ([`Leader::handing_over`]), in one conditional write that
    /// succeeds only while that value is still there: the new term's token is greater than
    /// the old one's. Stores of [`HandOverStyle::Escrow`] implement it; the default, for the
    /// others, is [`acquire`](Contender::acquire).
    fn take_over(&mut self, holder: &Leader) -> impl Future<Output = Result<Attempt>> + Send {
        let _ = holder;
        self.acquire()
    }

    /// Updates the value others read (identity and metadata) while holding the lock.
    fn proclaim(&mut self, leader: &Leader) -> impl Future<Output = Result<()>> + Send;

    /// Says that whoever uses this contender will not watch the election's request lock
    /// (the hand-over requests of [`switchover`](crate::switchover)): a campaign built with
    /// [`switchover_requests(false)`](crate::ElectionBuilder::switchover_requests), and every
    /// member of an [`ElectionSet`](crate::ElectionSet). A backend that reads the request lock
    /// with its acquisitions, and keeps a view of it for that watch, may then do neither
    /// (etcd). Called before the first acquisition. The default does nothing.
    fn ignore_requests(&mut self) {}

    /// Gives up the lock, or leaves the queue.
    fn release(&mut self) -> impl Future<Output = Result<()>> + Send;

    /// Gives up the lock, or leaves the queue, for good: the campaign shuts down, and closes
    /// the session it made this contender on right after. A backend whose session ends in
    /// the store with the claims on it may let one end of the session stand for many
    /// releases when every user of a shared session is leaving at once (etcd: one revoke of
    /// the lease instead of a delete per election).
    ///
    /// `Some` is the rest of a release the store is finishing (that revoke, under way): the
    /// campaign then tears down at once, and whoever waits for its shutdown awaits the rest,
    /// so that the shutdown still returns only once the lock is released. The default is
    /// [`release`](Contender::release), with nothing left.
    fn leave(&mut self) -> impl Future<Output = Result<Option<Settling>>> + Send {
        async { self.release().await.map(|()| None) }
    }
}

/// What a session's user calls the moment it is asked to shut down: see
/// [`Session::shutdown_notice`]. It must not block (it takes a lock, and counts).
pub struct ShutdownNotice(Box<dyn Fn() + Send + Sync>);

impl ShutdownNotice {
    /// A notice that calls `notify` each time it is given.
    pub fn new(notify: impl Fn() + Send + Sync + 'static) -> ShutdownNotice {
        ShutdownNotice(Box::new(notify))
    }

    /// Tells the session that its user was asked to shut down.
    pub fn give(&self) {
        (self.0)()
    }
}

impl std::fmt::Debug for ShutdownNotice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ShutdownNotice")
    }
}

/// The rest of a release the store is finishing after [`Contender::leave`] returned: it
/// resolves once the lock is released, or once the store gave up on it (the session's
/// expiry then releases it), within the store's request timeout.
pub struct Settling(Pin<Box<dyn Future<Output = ()> + Send + Sync>>);

impl Settling {
    /// The rest of a release: `settled` resolves when the store is done with it.
    pub fn new(settled: impl Future<Output = ()> + Send + Sync + 'static) -> Settling {
        Settling(Box::pin(settled))
    }
}

impl Future for Settling {
    type Output = ();

    fn poll(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        self.0.as_mut().poll(cx)
    }
}

impl std::fmt::Debug for Settling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Settling")
    }
}

/// Follows the holder of one election.
pub trait Observer: Send + 'static {
    /// The first call returns the current holder (`None`: nobody leads). Later calls wait for
    /// a change and return the new holder; they may return the same holder again after a
    /// reconnect, and never end silently: a broken watch is re-established inside, and an
    /// error is returned only when the store cannot be reached.
    fn next(&mut self) -> impl Future<Output = Result<Option<Leader>>> + Send;
}
