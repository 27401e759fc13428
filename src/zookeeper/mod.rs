//! The ZooKeeper backend: one ZooKeeper session per session, ephemeral sequential candidate
//! nodes, and a watch on the one node ahead of yours.
//!
//! ```no_run
//! # async fn demo() -> incumbent::Result<()> {
//! use std::time::Duration;
//! use incumbent::{Election, zookeeper::ZookeeperBackend};
//!
//! let backend = ZookeeperBackend::builder("10.0.0.1:2181,10.0.0.2:2181,10.0.0.3:2181/myapp")
//!     .digest_auth("indexer", std::env::var("ZK_PASSWORD").unwrap_or_default())
//!     .connect()
//!     .await?;
//!
//! let election = Election::builder(backend, "jobs/index-builder")
//!     .candidate("host-a:8080")
//!     .ttl(Duration::from_secs(6))
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
//! - **Session = ZooKeeper session.** [`open_session`](Backend::open_session) connects a
//!   ZooKeeper client whose session timeout is the election's ttl. The server may negotiate
//!   another timeout (it clamps it to its `minSessionTimeout`..`maxSessionTimeout`, by
//!   default 2 to 20 ticks): a shorter one than asked for is refused with
//!   [`Error::InvalidTiming`], since the renew deadline would
//!   outlast the session; a longer one is accepted (failover then takes longer) and reported
//!   by [`ZookeeperSession::negotiated_timeout`]. Elections on the same
//!   [`ZookeeperBackend`] with equal session settings share one ZooKeeper session, closed
//!   when the last of them closes its session, which deletes all their nodes at once.
//! - **Renewals.** The client pings the server by itself when idle, but a ping's answer
//!   says nothing of when the session was last heard of by the ensemble's leader. So the
//!   crate's keep-alive loop sends its own cheap requests every renew interval: a `sync` of
//!   the root, and right behind it, pipelined, an `exists` on the root. The client hands a
//!   request to its connection the moment it is called, so the server heard from the session
//!   no earlier than that; both answers confirm the renewal with that send time. See
//!   [below](#why-renewals-sync) for why a read alone would not do.
//! - **Candidates are ephemeral sequential nodes** named `@<session id>-<slot>-<sequence>`
//!   under `<prefix>/<election>` (a persistent node created on first use). Their data is the
//!   candidate's [`Leader`] value, so observers read who leads. The lowest sequence leads.
//!   `@` cannot occur in an election name, so the children of election `a` that are
//!   candidates never include election `a/b`'s node.
//! - **Followers watch only their predecessor**, with an `exists` watch on the node just ahead
//!   of theirs: a hand-off (one delete) wakes exactly one candidate, which lists the
//!   children once and finds itself first. No herd, no polling.
//! - **Suspended vs expired.** While the client is disconnected the session may or may not
//!   survive: no renewal is confirmed, so the campaign's renew deadline (measured from the
//!   last confirmed send) cancels the term before the server can expire the session. The
//!   client reconnects by itself within the session timeout, with the same session, its
//!   nodes and its watches. When the server says the session expired, the keep-alive
//!   reports [`SessionLoss::Expired`](crate::backend::SessionLoss::Expired), the leader's
//!   watch fires, and the campaign opens a new session and campaigns again.
//! - **No second node on reconnect** (Curator's protected mode). A create whose answer was
//!   lost may still have created the node. Each contender has a name prefix unique to its
//!   session and slot; before creating, the contender lists the election's children and
//!   adopts a node with its prefix that its own earlier create made, so one candidate never
//!   queues twice. A node of its prefix found before its first create was left by an earlier
//!   contender (its release failed) and is deleted, never adopted: a node that led once must
//!   not lead again with the same token.
//!
//! # The fencing token
//!
//! A term's fencing token is the *czxid* of the leader's node: the id of the transaction that
//! created it. Zxids are assigned by the ensemble's leader in one total order, grow with
//! every write (the high 32 bits are the ensemble's epoch, which grows with every leader
//! election, the low 32 bits count writes within the epoch), survive server restarts (they
//! are in the transaction log and snapshots) and never go back. Every later term of an
//! election is a node created later, so its czxid is greater, whichever session created it.
//! The sequence number would not do: it is per parent node and 32-bit, and deleting and
//! recreating the election's node starts it over. Restoring an ensemble from an old backup,
//! or moving to a new ensemble, rewinds zxids: make downstream stores forget the tokens they
//! saw then. Observers see the token in [`Leader::fencing_token`].
//!
//! # Why renewals sync
//!
//! Reads are answered by the server the client is connected to, from its own copy, while
//! only the ensemble's *leader* expires sessions: a follower passes the sessions it heard
//! from on to the leader in its answers to the leader's pings (every half tick). A follower
//! cut off from the rest of the ensemble does not notice for `syncLimit` × `tickTime`, and
//! until then it goes on answering reads, while the leader hears nothing more of the session
//! and expires it a session timeout after the follower's last report. A renewal that is a
//! read would then keep being confirmed, and the term kept, after the session expired and
//! another candidate was elected through the rest of the ensemble (with `tickTime` 500 ms,
//! `syncLimit` 5 and a 2 s ttl, two terms overlapped for over a second).
//!
//! A `sync` is not answered alone: a follower forwards it to the leader and answers it only
//! once the leader's answer comes back, through the same connection that carries the pings.
//! So a cut-off follower that has not noticed yet leaves it unanswered (the renewal is not
//! confirmed, and the term ends at the renew deadline), and one that has noticed closes its
//! clients' connections and serves nothing until it rejoins a quorum (a server in read-only
//! mode refuses a `sync`). An answered `sync` also proves that the leader had not closed the
//! session when the renewal reached it: the leader takes a session's close in line with its
//! requests, answers a `sync` only after every change it proposed before, and a follower
//! applies them in order, closing the session's connection at the close, so the `sync`'s
//! answer never comes. The leader itself stops answering once it loses its quorum (within
//! `syncLimit` ticks), and a new leader gives every session a whole timeout from its
//! election on, so a leader cut off is covered as well.
//!
//! What remains is the leader's view of the session's time. It learns of the session's
//! activity at the follower with the follower's next ping answer, and a request forwarded to
//! it, the `sync` included, does not count. So a follower cut off right after answering a
//! renewal leaves the leader counting the session timeout from the session's activity
//! *before* that renewal (the previous renewal, or a ping of the client), plus up to half a
//! tick for the report. Hence the backend's own rule for the renew deadline
//! ([`DeadlineRule::PreviousActivity`](crate::backend::DeadlineRule::PreviousActivity)):
//! the deadline plus the longest gap between two of the session's requests stays under 17/20
//! of the ttl, which leaves an eighth of the ttl for the half tick (a ttl of four ticks or
//! more) and a fortieth to spare. The gap is the renew interval (a third of the ttl by
//! default), or 7/20 of the ttl where the client pings first, so the renew deadline is half
//! the ttl by default (not 2/3 as on the other stores) and at most `17/20 ttl - min(renew
//! interval, 7/20 ttl)`: a longer one is refused when the election is built. The price is
//! one request to the leader per renewal, and a renewal that must be answered within a sixth
//! of the ttl of being sent; nothing is written, and there is no ping between renewals.
//!
//! # Failure modes
//!
//! - **A leader cut off from the ensemble** stops getting renewals confirmed and cancels its
//!   term at the renew deadline, before the session can expire and a follower can lead.
//! - **The server a leader is connected to cut off from the rest of the ensemble**, its
//!   client port still open: the renewals' `sync`s go unanswered, so the same holds (see
//!   [Why renewals sync](#why-renewals-sync)).
//! - **A paused or restarting server**: the client reconnects (to another server of the
//!   connect string if there is one); a pause shorter than the renew deadline costs nothing.
//!   A standalone server restart keeps sessions alive if it comes back within the timeout.
//! - **Losing one member of three** leaves a quorum; the client moves to a live member. If
//!   that member led the ensemble, the other two elect a leader first and serve nothing
//!   meanwhile (a few ticks, more under load): a campaign's leader keeps its term only if
//!   its next renewal is still answered within its slack, a sixth of the ttl at worst. Give
//!   a longer ttl where the ensemble's own elections take longer than that.
//! - **Wrong credentials**: digest auth that the server refuses ends the session with an
//!   auth failure, reported as [`Error::Unauthorized`], which the
//!   campaign retries only at its longest back-off.
//!
//! # Options
//!
//! See [`ZookeeperBuilder`]: several servers and a chroot in the connect string, digest
//! credentials (also from `INCUMBENT_ZK_AUTH=user:password`), the node prefix (default
//! `/incumbent`) and timeouts. With credentials, nodes are created with the `CREATOR_ALL`
//! ACL (only that user can read or change them); without, with `OPEN_ACL_UNSAFE`.
//!
//! # The client
//!
//! The backend speaks ZooKeeper's protocol through a client of its own, on tokio: one TCP
//! connection and one task per session, which wakes only for a request, an answer, a ping
//! due (7/20 of the session timeout after the last send: never while the session renews)
//! or a connection gone silent (half the session timeout). It keeps the session across reconnects (the next server of the
//! connect string, with the session's id and password, the last transaction it saw, the
//! credentials, and its watches set again with `SetWatches`), sends each request when it is
//! called, and checks every length and path the server sends back. Until 2026-11-28 it was
//! the `zookeeper-client` crate, whose I/O and timers ran on a thread of their own and woke
//! both threads every twentieth of the session timeout: twice the idle CPU of kazoo.

mod builder;
mod client;
mod contender;
mod observer;
mod session;
mod shared;
pub(crate) mod url;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use client as zk;

pub use builder::{
    AUTH_ENV, DEFAULT_CONNECT_TIMEOUT, DEFAULT_PREFIX, DEFAULT_REQUEST_TIMEOUT, ZookeeperBuilder,
};
pub use client::SessionHandle;
pub use contender::ZookeeperContender;
pub use observer::ZookeeperObserver;
pub use session::ZookeeperSession;

use crate::backend::pool::SessionPool;
use crate::backend::{Backend, BackendInfo, Leader, SessionOptions};
use crate::{Error, Result};

const NAME: &str = "zookeeper";

/// The smallest ttl (session timeout) accepted. ZooKeeper's own floor is two ticks (4 s with
/// the default 2 s tick); a server with a shorter tick accepts less, down to this.
pub const MIN_TTL: Duration = Duration::from_millis(500);
/// The largest ttl accepted; ZooKeeper's default ceiling is twenty ticks (40 s).
pub const MAX_TTL: Duration = Duration::from_secs(3_600);

/// Starts the names of candidate nodes; not allowed in election names.
const MARK: char = '@';

/// A connection to a ZooKeeper ensemble, for any number of elections. Cheap to clone: clones
/// share the sessions.
///
/// Made with [`ZookeeperBackend::connect`] or [`ZookeeperBackend::builder`]. `Debug` output
/// shows the servers, chroot, prefix and user name, never the password.
#[derive(Clone)]
pub struct ZookeeperBackend {
    inner: Arc<Inner>,
}

struct Inner {
    settings: Settings,
    sessions: SessionPool<shared::Zk>,
    /// The client observers read with while this process has no campaign session: a
    /// session of its own, opened by `connect` (its check that the ensemble answers), let go
    /// when a campaign session opens, and opened again when needed with none open.
    reader: tokio::sync::Mutex<Option<zk::Client>>,
}

/// What the backend keeps of its settings: the password only inside `auth`, never shown.
#[derive(Clone)]
struct Settings {
    servers: String,
    chroot: Option<String>,
    prefix: String,
    auth: Option<builder::Digest>,
    connect_timeout: Duration,
    request_timeout: Duration,
}

impl fmt::Debug for ZookeeperBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let settings = &self.inner.settings;
        f.debug_struct("ZookeeperBackend")
            .field("servers", &crate::secret::redact(&settings.servers))
            .field(
                "chroot",
                &settings.chroot.as_deref().map(crate::secret::redact),
            )
            .field("prefix", &settings.prefix)
            .field("user", &settings.auth.as_ref().map(|auth| &auth.user))
            .finish_non_exhaustive()
    }
}

impl ZookeeperBackend {
    /// Connects to the ensemble at `connect_string` (`host:port[,host:port…][/chroot]`) with
    /// the default settings and credentials from [`AUTH_ENV`] if set. See
    /// [`ZookeeperBuilder::connect`] for the errors.
    pub async fn connect(connect_string: impl Into<String>) -> Result<ZookeeperBackend> {
        Self::builder(connect_string)
            .auth_from_env()?
            .connect()
            .await
    }

    /// Starts configuring a connection: credentials, node prefix, timeouts.
    pub fn builder(connect_string: impl Into<String>) -> ZookeeperBuilder {
        ZookeeperBuilder::new(connect_string.into())
    }

    /// The servers of the connect string, without the chroot.
    pub fn servers(&self) -> &str {
        &self.inner.settings.servers
    }

    /// The prefix (under the chroot) of every node this backend writes, e.g. `/incumbent`.
    pub fn prefix(&self) -> &str {
        &self.inner.settings.prefix
    }

    /// The node whose children are the candidates of `election`: `<prefix>/<election>`.
    pub fn election_path(&self, election: &str) -> String {
        format!("{}/{election}", self.inner.settings.prefix)
    }

    /// The ids of the ZooKeeper sessions this backend keeps open (one per distinct session
    /// options), as ZooKeeper's tools print them (`0x…`).
    pub fn session_ids(&self) -> Vec<i64> {
        self.inner
            .sessions
            .sessions()
            .iter()
            .map(|session| session.id)
            .collect()
    }

    /// The ZooKeeper sessions this backend keeps open: id and password (the password is not
    /// shown by `Debug`). Another client can attach to such a session with them, e.g. to close
    /// it as an operator would, or in tests to make it expire. Treat them as credentials.
    pub fn session_handles(&self) -> Vec<SessionHandle> {
        self.inner
            .sessions
            .sessions()
            .iter()
            .map(|session| session.info.clone())
            .collect()
    }

    fn new(settings: Settings, reader: zk::Client) -> ZookeeperBackend {
        ZookeeperBackend {
            inner: Arc::new(Inner {
                settings,
                sessions: SessionPool::default(),
                reader: tokio::sync::Mutex::new(Some(reader)),
            }),
        }
    }

    fn acls(&self) -> zk::Acl {
        builder::acl_of(&self.inner.settings)
    }

    /// Connects a client with `timeout` as its session timeout, authenticated and rooted at
    /// the chroot (created if missing).
    async fn client(&self, timeout: Duration) -> Result<zk::Client> {
        builder::open_client(&self.inner.settings, timeout, self.acls()).await
    }

    /// The observers' client: a campaign session's, where this process has one open (one
    /// connection per process), else the reader session, opened again if it ended.
    async fn reader(&self) -> Result<zk::Client> {
        if let Some(client) = self.session_client() {
            return Ok(client);
        }
        let mut reader = self.inner.reader.lock().await;
        if let Some(client) = reader.as_ref()
            && !client.state().is_terminated()
        {
            return Ok(client.clone());
        }
        *reader = None;
        let client = self.client(builder::READER_SESSION_TIMEOUT).await?;
        *reader = Some(client.clone());
        Ok(client)
    }

    /// A live campaign session's client, if this process has one open.
    fn session_client(&self) -> Option<zk::Client> {
        self.inner
            .sessions
            .sessions()
            .iter()
            .filter_map(|session| session.client().ok())
            .find(|client| !client.state().is_terminated())
    }

    /// Lets the reader session go once a campaign session can serve the observers: a
    /// process that campaigns holds one connection to the ensemble. Observers that read
    /// through it keep it until their next read.
    async fn retire_reader(&self) {
        if self.session_client().is_some() {
            self.inner.reader.lock().await.take();
        }
    }

    /// Runs one request, bounded by the request timeout.
    async fn request<T>(
        &self,
        what: &str,
        call: impl Future<Output = std::result::Result<T, zk::Error>>,
    ) -> std::result::Result<T, zk::Error> {
        tokio::time::timeout(self.inner.settings.request_timeout, call)
            .await
            .unwrap_or_else(|_| {
                tracing::debug!(what, "zookeeper request timed out");
                Err(zk::Error::Timeout)
            })
    }

    /// Creates the election's node (and its parents) if missing.
    async fn ensure_election(&self, client: &zk::Client, path: &str) -> Result<()> {
        self.request(
            "creating the election's node",
            client.mkdir(path, self.acls()),
        )
        .await
        .map_err(|e| from_client(e, "creating the election's node"))
    }

    /// Reads the candidates of an election, lowest sequence first. A missing election node
    /// is an empty queue.
    async fn read_queue(&self, client: &zk::Client, path: &str) -> Result<Vec<Child>> {
        match self
            .request("listing the candidates", client.list_children(path))
            .await
        {
            Ok(children) => Ok(queue_of(children)),
            Err(zk::Error::NoNode) => Ok(Vec::new()),
            Err(e) => Err(from_client(e, "listing the candidates")),
        }
    }

    /// Reads the holder of an election: the first candidate's data and czxid. A holder that
    /// vanished between the list and the read is read again.
    async fn read_holder(&self, client: &zk::Client, path: &str) -> Result<Option<Holder>> {
        for _ in 0..3 {
            let queue = self.read_queue(client, path).await?;
            let Some(first) = queue.first() else {
                return Ok(None);
            };
            let node = format!("{path}/{}", first.name);
            match self
                .request("reading the leader", client.get_data(&node))
                .await
            {
                Ok((data, stat)) => {
                    return Ok(Some(Holder {
                        node,
                        leader: leader_of(&data, &stat),
                    }));
                }
                Err(zk::Error::NoNode) => continue,
                Err(e) => return Err(from_client(e, "reading the leader")),
            }
        }
        Err(store("the leader's node kept vanishing while being read"))
    }
}

/// The holder of an election: its node and what it says.
#[derive(Clone, Debug)]
struct Holder {
    node: String,
    leader: Leader,
}

/// A candidate node's name and sequence.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Child {
    name: String,
    sequence: i64,
}

/// The candidates among `children`, lowest sequence first.
fn queue_of(children: Vec<String>) -> Vec<Child> {
    let mut queue: Vec<Child> = children
        .into_iter()
        .filter_map(|name| {
            let sequence = sequence_of(&name)?;
            Some(Child { name, sequence })
        })
        .collect();
    queue.sort_by_key(|child| child.sequence);
    queue
}

/// The sequence number of a candidate node's name (`@…-<digits>`); `None` for other nodes.
fn sequence_of(name: &str) -> Option<i64> {
    if !name.starts_with(MARK) {
        return None;
    }
    let (_, digits) = name.rsplit_once('-')?;
    if digits.len() < 10 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The leader a candidate node describes: its data, with its czxid as the fencing token.
fn leader_of(data: &[u8], stat: &zk::Stat) -> Leader {
    let mut leader = Leader::from_bytes(data);
    leader.fencing_token = Some(token_of(stat.czxid));
    leader
}

/// A czxid as a fencing token. Zxids are positive and only grow.
fn token_of(czxid: i64) -> u64 {
    u64::try_from(czxid).unwrap_or(0)
}

/// An error of the store, for requests it refused.
fn store(reason: impl Into<String>) -> Error {
    Error::Store {
        backend: NAME,
        reason: reason.into(),
    }
}

/// Maps a client error: connection trouble is [`Error::Unavailable`] (transient), refused
/// credentials or permissions [`Error::Unauthorized`], anything else [`Error::Store`].
fn from_client(error: zk::Error, what: &str) -> Error {
    use zk::Error as E;
    let reason = format!("{what}: {error}");
    match error {
        E::NoAuth | E::AuthFailed => Error::Unauthorized {
            backend: NAME,
            reason,
        },
        E::ConnectionLoss
        | E::Timeout
        | E::SessionExpired
        | E::SessionMoved
        | E::Throttled
        | E::ClientClosed
        | E::NotReadOnly => Error::Unavailable {
            backend: NAME,
            reason,
        },
        _ => store(reason),
    }
}

impl Backend for ZookeeperBackend {
    type Session = ZookeeperSession;
    type Observer = ZookeeperObserver;

    fn info(&self) -> BackendInfo {
        BackendInfo {
            // The store hands the lock to the next key in line.
            hand_over: crate::backend::HandOverStyle::Line,
            // The ensemble's leader may count a session's time from its activity before the
            // last renewal: see "Why renewals sync".
            deadline: crate::backend::DeadlineRule::PreviousActivity,
            ..BackendInfo::new(NAME, MIN_TTL, MAX_TTL)
        }
    }

    async fn open_session(&self, options: &SessionOptions) -> Result<ZookeeperSession> {
        let session = session::open(self, options).await?;
        self.retire_reader().await;
        Ok(session)
    }

    async fn observe(&self, election: &str) -> Result<ZookeeperObserver> {
        Ok(ZookeeperObserver::new(self.clone(), election))
    }

    /// Every candidate node of the election, lowest sequence (the holder) first; a node that
    /// vanished between the list and its read is left out.
    async fn participants(&self, election: &str) -> Result<Option<Vec<Leader>>> {
        let client = self.reader().await?;
        let path = self.election_path(election);
        let mut candidates = Vec::new();
        for child in self.read_queue(&client, &path).await? {
            let node = format!("{path}/{}", child.name);
            match self
                .request("reading a candidate", client.get_data(&node))
                .await
            {
                Ok((data, stat)) => candidates.push(leader_of(&data, &stat)),
                Err(zk::Error::NoNode) => {}
                Err(e) => return Err(from_client(e, "reading a candidate")),
            }
        }
        Ok(Some(candidates))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_are_ordered_by_sequence_and_other_children_ignored() {
        let children = vec![
            "@1a-0-0000000012".to_owned(),
            "b".to_owned(),
            "@2b-1-0000000003".to_owned(),
            "@x-0000000abc".to_owned(),
        ];
        let queue = queue_of(children);
        let names: Vec<&str> = queue.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["@2b-1-0000000003", "@1a-0-0000000012"]);
    }
}
