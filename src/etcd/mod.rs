//! The etcd backend: a lease per session, revision-ordered candidate keys, and one watch of
//! the key prefix per backend, on which each follower waits for the one key ahead of its own.
//!
//! ```no_run
//! # async fn demo() -> incumbent::Result<()> {
//! use std::time::Duration;
//! use incumbent::{Election, etcd::EtcdBackend};
//!
//! let backend = EtcdBackend::builder([
//!     "http://10.0.0.1:2379",
//!     "http://10.0.0.2:2379",
//!     "http://10.0.0.3:2379",
//! ])
//! .user("indexer", std::env::var("ETCD_PASSWORD").unwrap_or_default())
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
//! # How it works
//!
//! - **Session = lease.** [`open_session`](Backend::open_session) grants an etcd lease with
//!   the election's ttl (rounded up to whole seconds) and keeps it alive with the crate's one
//!   keep-alive loop, one keep-alive message per renew interval. Elections on the same
//!   [`EtcdBackend`] with equal session settings share one lease; it is revoked when the last
//!   of them closes its session, which deletes all their keys at once. When every election on
//!   a lease shuts down together (a process stopping), the lease is revoked as soon as the
//!   last of them starts its release, instead of a delete per key: the deletes still queued
//!   are dropped, and etcd deletes the rest in one revision, as its own `Session.Close`
//!   does (a sharded member's shards and its member slot, too). A lease with one election
//!   (or any other user) that is not shutting down is never revoked for the others; if the
//!   revoke fails, each deletes its own key as usual. The campaigns tear down while etcd
//!   revokes, and each `shutdown()` awaits the revoke (or the delete) before it returns.
//!   Once every campaign on the lease was *asked* to shut down (`shutdown()` called, or the
//!   `Campaign` dropped: counted at the call, before any campaign's task runs), none of them
//!   sends a delete of its own while it waits for the others to stop: the revoke is sure to
//!   come once the last has stopped its work. A leaver waits for it at most half the ttl (a
//!   term still winding down, up to the grace, keeps the others' keys no longer than that),
//!   then deletes its key itself. A campaign started meanwhile takes a new lease.
//! - **Candidates are keys ordered by revision.** Each candidate puts
//!   `<prefix><election>@<lease id in hex>` bound to its lease, only if absent. The key with
//!   the lowest *create revision* in the range `<prefix><election>@` leads. `@` cannot occur in
//!   an election name, so the range of election `a` never includes election `a/b`. Two
//!   campaigns of one election that share a lease (two campaigns of one
//!   [`Election`](crate::Election)) get a key each (`…@<lease>.1` for the second), so they
//!   queue like any two candidates and never both lead. A key that a contender left behind
//!   (its release failed) is deleted and written afresh by the next contender of its name,
//!   never adopted: a key that led once must not lead again with the same token.
//! - **One watch per backend.** An [`EtcdBackend`] watches its whole key prefix with one
//!   watch, from the revision it read when it connected, and routes each event to the
//!   elections of this process whose range holds the key. Ten thousand elections cost etcd
//!   one watcher and one stream, and cost no request beyond their own writes and reads. A
//!   watch that breaks resumes from just after the last revision it delivered, so nothing is
//!   missed and nothing is read again; only when etcd compacted that history meanwhile does
//!   every election read its range again. While none of its elections follows a range (none
//!   has started, or all have stopped), the backend holds no watch, and resumes it the same
//!   way when one starts: a process shutting thousands of elections down does not decode the
//!   changes of the other processes shutting theirs down. Nor does it watch once every
//!   election of the backend was asked to shut down, unless a leader's view of its own key
//!   (its term is on until its campaign ends it) or an observer of your own still follows a
//!   range: the campaigns asked to stop act on no change. The cost: the process hears of
//!   every change under the prefix, also of elections it does not take part in, so give
//!   unrelated services their own prefix ([`EtcdBuilder::prefix`]). At most
//!   [`MAX_REQUESTS_IN_FLIGHT`] other requests are in flight at once; lease keep-alives never
//!   wait behind them. When every slot is busy (thousands of elections starting or stopping
//!   together), waiting writes go out together as the nested transactions of one, at most
//!   one per election in each.
//! - **One request per candidate to start.** A candidate's first write is one transaction
//!   that also reads who holds the election, the key just before its own, and who holds the
//!   election's request lock (hand-over requests). The process keeps both holders current from
//!   its watch, so neither the campaign's observer of the election (to report the leader) nor
//!   the leader's observer of its request lock reads etcd, until a holder's key goes.
//! - **Followers wait only for their predecessor.** A follower waits for the delete of the
//!   key created just before its own, and tries again when it goes: a hand-off wakes exactly
//!   one candidate, not the whole queue. The view of the range is taken from the backend's
//!   watch before the range is read, so a delete in between is neither missed nor late. The
//!   follower next in line (its predecessor is the holder) sees the deletes of the holder's
//!   key and its own in revision order: the holder's delete, seen before any delete of its
//!   own key, makes it the holder at that revision, so it wins on the event without another
//!   read. A hand-off costs one delete and one watch event.
//! - **Losing the key.** The leader follows the election's range: the delete of its key, or
//!   an older key in the range ([`LockTaken`](crate::DemotionReason::LockTaken)), ends the
//!   term the moment the watch event arrives, with no request to etcd first. Only then, for
//!   the `Demoted` event, is the lease looked up: the loss is reported as
//!   [`KeyDeleted`](crate::DemotionReason::KeyDeleted) when an operator deleted the key, or
//!   [`SessionExpired`](crate::DemotionReason::SessionExpired) when the lease is gone
//!   (expired or revoked). If etcd does not answer in time, it stays `KeyDeleted` (or
//!   `SessionExpired` when the keep-alive already heard that the lease is gone).
//!
//! etcd's own Election service is not used: it can grant leadership on a lease that has
//! already expired (etcd-io/etcd#19597). Everything here is plain KV, lease and watch calls,
//! so it works the same on every etcd 3.x.
//!
//! # The fencing token
//!
//! A term's fencing token is the create revision of the leader's key. Revisions are global to
//! the cluster and only grow, so every later term of the election (every later key) has a
//! greater token. Observers see it in [`Leader::fencing_token`]. Compaction and defragmentation
//! do not change revisions; restoring the cluster from a snapshot rewinds them to the
//! snapshot's, so after a restore make downstream stores forget the tokens they saw.
//!
//! # Failure modes
//!
//! - **A leader cut off from the cluster** stops receiving renewal confirmations, and cancels
//!   its term after the renew deadline, before the lease can expire and another candidate can
//!   win. etcd measures the lease on the cluster leader's clock; the leader measures the
//!   deadline on its own, from when it *sent* the last renewal that was confirmed.
//! - **A paused or restarting server**: etcd's keep-alive stream can stall without an error
//!   while the server is paused, and does not reconnect after a restart. A renewal not
//!   answered within the retry period (a quarter of the renew interval) is followed by another
//!   on a fresh stream, while the first keeps waiting; the first one confirmed counts. A pause
//!   shorter than renew deadline − renew interval (ttl/3 with the defaults) costs nothing; a
//!   longer one, up to the renew deadline, only if it starts soon after a confirmed renewal. A
//!   restart costs a renewal or two. A lease outlives a server restart: etcd extends every
//!   lease when it restarts.
//! - **Re-election after an outage.** A leader that fenced itself during an outage closes its
//!   lease and campaigns on a new one. The revoke of the old lease is retried in the
//!   background (jittered back-off from 100 ms up to 1 s, or a quarter of the ttl if shorter)
//!   until etcd revokes it or says it is gone, for up to ten ttls and at least a minute after
//!   the close; an error other than "etcd cannot be reached" ends the retries at once. So when
//!   etcd comes back (and extends every lease by its ttl), the old lease and its keys go within
//!   about a second, not a ttl later. And a contender never queues behind a key of a lease its
//!   own [`EtcdBackend`] granted and has since closed (or dropped): such a key, in its own
//!   election's range, is deleted (only that key, at that create revision and lease) before
//!   the queue is judged. Which leases are ours is what this process remembers (the last
//!   [`ABANDONED_LEASES_KEPT`] closed ones), never what a key's value says.
//! - **A lease etcd does not know** ("requested lease not found" when writing the candidate
//!   key or its value, or a lease whose ttl etcd reports as gone) ends the session at once
//!   ([`SessionLoss::Expired`](crate::backend::SessionLoss::Expired) in its health), so the
//!   campaign opens a new one without waiting for the next renewal.
//! - **Losing one member of three** leaves the other two serving. Requests carry etcd's
//!   "require leader" flag, so a member cut off from the others refuses them instead of
//!   serving stale reads and silent watches, and the client moves to a member that answers.
//! - **ttl below 2 s**: etcd silently extends shorter leases to its minimum (about 1.5 × its
//!   election timeout, so 2 s with default settings), which would make the renew deadline and
//!   the store disagree; [`BackendInfo::min_ttl`] is therefore 2 s.
//! - **Wrong credentials** are [`Error::Unauthorized`](crate::Error::Unauthorized), which the
//!   campaign retries only at its longest back-off: no retry storm.
//!
//! # Options
//!
//! See [`EtcdBuilder`]: several endpoints, user and password (etcd `--auth`), TLS with a CA
//! certificate and an optional client certificate (needs the `etcd-tls` feature, which turns
//! on rustls in `etcd-client`), the key prefix (default `incumbent/`), and timeouts.
//!
//! # Building
//!
//! `etcd-client` compiles etcd's protobuf definitions, so building this feature needs
//! `protoc` and protobuf's well-known types (Debian and Ubuntu: `apt-get install
//! protobuf-compiler libprotobuf-dev`; or set `PROTOC` to a protoc binary).

mod batch;
mod builder;
mod contender;
mod error;
mod lease;
mod observer;
mod session;
mod tls;
pub(crate) mod url;
mod watch;

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

use etcd_client::{
    Client, GetOptions, KeyValue, KvClient, LeaseClient, SortOrder, SortTarget, Txn, TxnResponse,
};

pub use builder::{DEFAULT_CONNECT_TIMEOUT, DEFAULT_PREFIX, DEFAULT_REQUEST_TIMEOUT, EtcdBuilder};
pub use contender::EtcdContender;
pub use observer::EtcdObserver;
pub use session::EtcdSession;

use crate::Result;
use crate::backend::pool::SessionPool;
use crate::backend::{Backend, BackendInfo, Leader, SessionOptions};

const NAME: &str = "etcd";

/// The smallest ttl: etcd extends shorter leases to about 1.5 × its election timeout (2 s
/// with default settings) without saying so.
pub const MIN_TTL: Duration = Duration::from_secs(2);
/// The largest ttl accepted: a day. A leader that dies is replaced after up to this long.
pub const MAX_TTL: Duration = Duration::from_secs(86_400);

/// How many requests (reads, writes, lease grants and revocations) one [`EtcdBackend`] has in
/// flight at most; more wait their turn. A thousand elections that start together, or
/// re-read together after the cluster came back, then send their requests in waves instead
/// of all at once, which spares the cluster a burst and this process the buffers of a
/// thousand concurrent calls. Lease keep-alives and watches do not wait for a slot.
pub const MAX_REQUESTS_IN_FLIGHT: usize = 64;

/// How many closed leases an [`EtcdBackend`] remembers as its own leftovers (see
/// [`EtcdContender`]): far more than a backend closes within the time a lease can outlive its
/// close.
pub const ABANDONED_LEASES_KEPT: usize = 1024;

/// Separates the election name from the lease id in a candidate key. Not allowed in election
/// names, so one election's range never includes another's.
const SEPARATOR: char = '@';

/// A connection to an etcd cluster, for any number of elections. Cheap to clone: clones share
/// the connection and the sessions.
///
/// Made with [`EtcdBackend::connect`] or [`EtcdBackend::builder`]. `Debug` output shows the
/// endpoints, prefix and user name, never the password or TLS key.
#[derive(Clone)]
pub struct EtcdBackend {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    settings: Settings,
    /// Leases shared by the sessions with equal options.
    leases: SessionPool<lease::Lease>,
    /// The one watch of the prefix, which every election of this backend follows.
    watches: watch::Hub,
    /// One permit per request that may be in flight ([`MAX_REQUESTS_IN_FLIGHT`]).
    slots: Arc<Semaphore>,
    /// Transactions waiting for a slot, to go out together ([`batch`]).
    batch: batch::Batch,
    /// The leases this backend granted and has since closed or dropped, newest last, at most
    /// [`ABANDONED_LEASES_KEPT`]: a key bound to one of them is a leftover of ours, never a
    /// live candidate.
    abandoned: std::sync::Mutex<VecDeque<i64>>,
}

/// What the backend keeps of its settings after connecting: no secrets.
#[derive(Clone, Debug)]
struct Settings {
    endpoints: Vec<String>,
    prefix: String,
    user: Option<String>,
    tls: bool,
    request_timeout: Duration,
}

impl fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let settings = &self.inner.settings;
        f.debug_struct("EtcdBackend")
            .field("endpoints", &settings.endpoints)
            .field("prefix", &settings.prefix)
            .field("user", &settings.user)
            .field("tls", &settings.tls)
            .field("request_timeout", &settings.request_timeout)
            .finish_non_exhaustive()
    }
}

impl EtcdBackend {
    /// Connects to the cluster at `endpoints` (client URLs such as `http://127.0.0.1:2379`)
    /// with the default settings. See [`EtcdBuilder::connect`] for the errors.
    pub async fn connect<I, S>(endpoints: I) -> Result<EtcdBackend>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::builder(endpoints).connect().await
    }

    /// Starts configuring a connection to the cluster at `endpoints`: credentials, TLS, key
    /// prefix, timeouts.
    pub fn builder<I, S>(endpoints: I) -> EtcdBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        EtcdBuilder::new(endpoints.into_iter().map(Into::into).collect())
    }

    /// The endpoints, as normalised at connect time.
    pub fn endpoints(&self) -> &[String] {
        &self.inner.settings.endpoints
    }

    /// The prefix of every key this backend writes.
    pub fn prefix(&self) -> &str {
        &self.inner.settings.prefix
    }

    /// The range that holds the candidates of `election`: `<prefix><election>@`.
    pub fn election_range(&self, election: &str) -> String {
        format!("{}{election}{SEPARATOR}", self.inner.settings.prefix)
    }

    fn new(client: Client, settings: Settings) -> EtcdBackend {
        EtcdBackend {
            inner: Arc::new(Inner {
                client,
                watches: watch::Hub::new(&settings.prefix),
                settings,
                leases: SessionPool::default(),
                slots: Arc::new(Semaphore::new(MAX_REQUESTS_IN_FLIGHT)),
                batch: batch::Batch::default(),
                abandoned: std::sync::Mutex::new(VecDeque::new()),
            }),
        }
    }

    fn kv(&self) -> KvClient {
        self.inner.client.kv_client()
    }

    fn lease_client(&self) -> LeaseClient {
        self.inner.client.lease_client()
    }

    fn request_timeout(&self) -> Duration {
        self.inner.settings.request_timeout
    }

    /// Runs one request to etcd: waits for a slot (see [`MAX_REQUESTS_IN_FLIGHT`]), then gives
    /// the request the request timeout. `make` builds the request's future once a slot is
    /// free, and the future is boxed, so a request costs the future that awaits it a closure
    /// and a pointer, not the kilobytes of a gRPC call.
    async fn request<T, F, Fut>(&self, what: &str, make: F) -> Result<T>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let _slot = self
            .inner
            .slots
            .acquire()
            .await
            .map_err(|_| error::unavailable("the backend's request slots are closed"))?;
        error::within(self.request_timeout(), what, make()).await
    }

    /// One cheap read of the prefix: proves the cluster answers and the user may read. Then
    /// starts the backend's watch of the prefix from the read's revision.
    async fn probe(&self) -> Result<()> {
        let options = GetOptions::new().with_prefix().with_count_only();
        let prefix = self.inner.settings.prefix.clone();
        let response = self
            .request("reading the key prefix", || async {
                self.kv().get(prefix, Some(options)).await
            })
            .await?;
        let revision = response.header().map_or(0, |h| h.revision());
        let inner = &self.inner;
        inner
            .watches
            .start(&inner.client, revision, self.request_timeout());
        Ok(())
    }

    /// Runs `txn`, a write in the election range `writes_in`, alone or with others waiting
    /// for a slot ([`batch`]), bounded by the request timeout once sent; with the revision it
    /// was applied at.
    async fn batched(&self, what: &str, writes_in: &str, txn: Txn) -> Result<(TxnResponse, i64)> {
        self.answer(what, batch::txn(self, writes_in, None, txn).await)
    }

    /// A batched transaction's answer, its failure as an error that says what failed.
    fn answer(&self, what: &str, answer: batch::Answer) -> Result<(TxnResponse, i64)> {
        answer.map_err(|failure| match failure {
            batch::Failure::Etcd(error) => error::from_client(error),
            batch::Failure::NoAnswer => error::unavailable(format!(
                "{what}: no answer within {:?}",
                self.request_timeout()
            )),
            batch::Failure::Dropped => {
                error::unavailable(format!("{what}: the backend's requests were closed"))
            }
        })
    }

    /// Reads the candidates of a range, oldest first, with the read's revision.
    async fn read_queue(&self, range: &str) -> Result<Queue> {
        let (revision, candidates) = self
            .read("reading the candidates", range, queue_options())
            .await?;
        Ok(Queue {
            revision,
            candidates,
        })
    }

    /// Reads the holder of a range (its oldest key), with the read's revision.
    async fn read_holder(&self, range: &str) -> Result<(i64, Option<KeyValue>)> {
        let options = queue_options().with_limit(1);
        let (revision, kvs) = self.read("reading the leader", range, options).await?;
        Ok((revision, kvs.into_iter().next()))
    }

    /// Reads a range: its keys, with the read's revision. Not batched (see [`batch`]).
    async fn read(
        &self,
        what: &str,
        range: &str,
        options: GetOptions,
    ) -> Result<(i64, Vec<KeyValue>)> {
        let mut response = self
            .request(what, || async { self.kv().get(range, Some(options)).await })
            .await?;
        let revision = response.header().map_or(0, |h| h.revision());
        Ok((revision, response.take_kvs()))
    }

    /// Remembers that this backend closed (or dropped) the lease `id`: any key still bound
    /// to it is a leftover, which a contender deletes rather than queue behind.
    fn abandon(&self, id: i64) {
        let mut abandoned = crate::backend::lock(&self.inner.abandoned);
        if abandoned.contains(&id) {
            return;
        }
        if abandoned.len() >= ABANDONED_LEASES_KEPT {
            abandoned.pop_front();
        }
        abandoned.push_back(id);
    }

    /// Whether `id` is a lease this backend granted and has since closed or dropped.
    fn is_abandoned(&self, id: i64) -> bool {
        crate::backend::lock(&self.inner.abandoned).contains(&id)
    }

    /// The ids of the leases this backend holds open (one per distinct session options).
    pub fn lease_ids(&self) -> Vec<i64> {
        let leases = self.inner.leases.sessions();
        leases.iter().map(|lease| lease.id).collect()
    }
}

/// The candidates of one election at one revision, oldest first.
/// How a range's candidates are read: every key of the prefix, oldest first.
fn queue_options() -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
}

struct Queue {
    revision: i64,
    candidates: Vec<KeyValue>,
}

/// The leader a candidate key describes: its stored identity, with the key's create revision
/// as the fencing token.
fn leader_of(kv: &KeyValue) -> Leader {
    leader_in(kv.value(), kv.create_revision())
}

/// The leader a candidate key's `value` describes, the key created at `created`.
fn leader_in(value: &[u8], created: i64) -> Leader {
    let mut leader = Leader::from_bytes(value);
    leader.fencing_token = Some(token_of(created));
    leader
}

/// A revision as a fencing token. Revisions start at 1 and only grow.
fn token_of(revision: i64) -> u64 {
    u64::try_from(revision).unwrap_or(0)
}

impl Backend for EtcdBackend {
    type Session = EtcdSession;
    type Observer = EtcdObserver;

    fn info(&self) -> BackendInfo {
        BackendInfo {
            // The store hands the lock to the next key in line.
            hand_over: crate::backend::HandOverStyle::Line,
            ..BackendInfo::new(NAME, MIN_TTL, MAX_TTL)
        }
    }

    async fn open_session(&self, options: &SessionOptions) -> Result<EtcdSession> {
        session::open(self, options).await
    }

    async fn observe(&self, election: &str) -> Result<EtcdObserver> {
        EtcdObserver::start(self.clone(), election, false).await
    }

    /// An observer that serves a campaign: its view no longer keeps the backend's one watch
    /// going once every campaign of the backend was asked to shut down, so that a process
    /// whose campaigns are all stopping decodes none of the others' changes.
    async fn observe_for(&self, election: &str, _session: &EtcdSession) -> Result<EtcdObserver> {
        EtcdObserver::start(self.clone(), election, true).await
    }

    /// Every candidate key of the election, oldest (the holder) first.
    async fn participants(&self, election: &str) -> Result<Option<Vec<Leader>>> {
        let queue = self.read_queue(&self.election_range(election)).await?;
        Ok(Some(queue.candidates.iter().map(leader_of).collect()))
    }
}
