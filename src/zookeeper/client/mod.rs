//! The crate's own ZooKeeper client: one TCP connection and one tokio task per session,
//! doing only what the backend needs, and waking only when the protocol needs it.
//!
//! Why not a client library: the one this crate used until 2026-11-28 does its I/O and its
//! timers on `async-io`'s reactor thread, next to tokio's, and wakes every twentieth of the
//! session timeout whether or not anything is due. An idle process woke two threads five
//! times a second, and used twice the CPU of a Python client (issue 27).
//!
//! # What it does
//!
//! - **One task per session** owns the connection. A request is handed to it the moment
//!   the method is called (not when its future is first polled), so requests go out in the
//!   order they were made, and the time of the call bounds the time of the send from below.
//!   Requests made back to back leave in one write.
//! - **Answers are matched in order.** ZooKeeper answers a session's requests in the order
//!   it received them; an answer whose id is not the oldest outstanding request's is a
//!   broken stream, and the connection is dropped.
//! - **Pings only when idle**: one when nothing was sent for 7/20 of the negotiated session
//!   timeout, so the server hears from the session at least that often (the margin in the
//!   backend's "Why renewals sync" counts on it). With renewals every third of the timeout,
//!   a session that renews never pings. A connection that brought nothing for half the
//!   session timeout is taken for dead, and the client moves to the next server.
//! - **Reconnects keep the session**: the next server of the connect string is tried with the
//!   session's id and password and the last transaction id seen (a server that is behind
//!   refuses it, and the next one is tried), credentials are sent again, and the one-shot
//!   watches still wanted are set again (`SetWatches`, from the last transaction seen, so
//!   that a change missed while away fires at once). Requests made while disconnected wait
//!   for the connection; those in flight when it broke fail with
//!   [`Error::ConnectionLoss`] (they may or may not have been applied).
//! - **The end of a session is final**: when a server says the session expired, when the
//!   credentials are refused, or when the last [`Client`] is dropped (which sends a close,
//!   so the server deletes the session's ephemeral nodes at once), every watch fires with
//!   the session's state and every request fails.
//! - **One-shot watches** are futures ([`Watcher`]). A dropped watcher costs nothing when its
//!   node changes, and is forgotten when the path is watched again.
//! - **Trust nothing**: every length in an answer is checked against its frame
//!   ([`wire::Reader`]), and a created node's path must lie under the client's root.

mod wire;

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::{Instant, sleep, sleep_until, timeout};

pub use wire::{Acl, CreateMode, EventType, SessionState, Stat, WatchedEvent};
use wire::{ConnectResponse, Frame, Malformed, Reader, ReplyHeader, op, xid};

/// Why a request failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The connection broke before the answer came: the request may or may not have been
    /// applied.
    #[error("the connection to ZooKeeper was lost before the answer came")]
    ConnectionLoss,
    /// The server says the session expired (or another client closed it).
    #[error("the ZooKeeper session expired")]
    SessionExpired,
    /// This client closed the session.
    #[error("the ZooKeeper session was closed by this client")]
    ClientClosed,
    /// The server refused the session's credentials.
    #[error("ZooKeeper refused the credentials")]
    AuthFailed,
    /// The node's ACL does not let the session's credentials do this.
    #[error("the node's ACL does not allow this to the session's credentials")]
    NoAuth,
    /// No node at the path.
    #[error("no such node")]
    NoNode,
    /// A node exists at the path.
    #[error("the node exists")]
    NodeExists,
    /// The node has children.
    #[error("the node has children")]
    NotEmpty,
    /// The node's version is not the one given.
    #[error("the node's version is not the one given")]
    BadVersion,
    /// An ephemeral node cannot have children.
    #[error("an ephemeral node cannot have children")]
    NoChildrenForEphemerals,
    /// The session moved to another server.
    #[error("the session moved to another server")]
    SessionMoved,
    /// The server is in read-only mode.
    #[error("the server is read-only (cut off from its ensemble)")]
    NotReadOnly,
    /// The server is throttling requests.
    #[error("the server is throttling requests")]
    Throttled,
    /// The server timed the request out.
    #[error("the server timed the request out")]
    Timeout,
    /// The ACL is invalid.
    #[error("invalid ACL")]
    InvalidAcl,
    /// The server found the request's arguments invalid.
    #[error("invalid arguments")]
    BadArguments,
    /// The server's answer could not be read.
    #[error("{0}")]
    Malformed(Malformed),
    /// Another error code of the server.
    #[error("ZooKeeper answered with error code {0}")]
    Code(i32),
}

impl Error {
    fn from_code(code: i32) -> Error {
        match code {
            -4 => Error::ConnectionLoss,
            -7 | -122 => Error::Timeout,
            -8 => Error::BadArguments,
            -101 => Error::NoNode,
            -102 => Error::NoAuth,
            -103 => Error::BadVersion,
            -108 => Error::NoChildrenForEphemerals,
            -110 => Error::NodeExists,
            -111 => Error::NotEmpty,
            -112 => Error::SessionExpired,
            -114 => Error::InvalidAcl,
            -115 => Error::AuthFailed,
            -118 => Error::SessionMoved,
            -119 => Error::NotReadOnly,
            -127 => Error::Throttled,
            other => Error::Code(other),
        }
    }

    /// The error every request gets once the session ended in `state`.
    fn of_end(state: SessionState) -> Error {
        match state {
            SessionState::Expired => Error::SessionExpired,
            SessionState::AuthFailed => Error::AuthFailed,
            _ => Error::ClientClosed,
        }
    }
}

impl From<Malformed> for Error {
    fn from(malformed: Malformed) -> Error {
        Error::Malformed(malformed)
    }
}

const AUTH_FAILED: i32 = -115;
const EXPIRED_STATE: i32 = -112;

/// The shortest wait for a server's answer to a connect request.
const MIN_ATTEMPT: Duration = Duration::from_secs(1);
/// The first pause after every server of the connect string failed; it doubles up to
/// [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// The most bytes of requests made back to back that go out in one write (the rest in the
/// next): a burst of thousands (as many elections starting at once) is not one write that
/// could outlast the write timeout.
const MAX_BATCH: usize = 64 << 10;
/// The most room a connection's read buffer keeps once what it held was taken.
const KEPT_BUFFER: usize = 64 << 10;
/// How much of `SetWatches` goes in one frame (ZooKeeper refuses frames over 1 MiB).
const SET_WATCHES_CHUNK: usize = 128 << 10;

/// A session's id and password: what another client needs to attach to the session (as an
/// operator closing it would). Treat it as a credential: `Debug` does not show the password.
#[derive(Clone, PartialEq, Eq)]
pub struct SessionHandle {
    id: i64,
    password: Vec<u8>,
}

impl SessionHandle {
    /// The session id (`0x…` in ZooKeeper's tools).
    pub fn id(&self) -> i64 {
        self.id
    }

    /// The session's password, as the server gave it.
    pub fn password(&self) -> &[u8] {
        &self.password
    }
}

impl fmt::Debug for SessionHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionHandle")
            .field("id", &format_args!("{:#x}", self.id))
            .field("password", &"<redacted>")
            .finish()
    }
}

/// Opens sessions: the session timeout asked for and the credentials.
pub struct Connector {
    timeout: Duration,
    auth: Option<Vec<u8>>,
}

impl Connector {
    /// A session timeout to ask for; the server may grant another.
    pub fn new(timeout: Duration) -> Connector {
        Connector {
            timeout,
            auth: None,
        }
    }

    /// Digest credentials (`user:password`), sent on every connection of the session.
    pub fn with_digest(mut self, auth: Vec<u8>) -> Connector {
        self.auth = Some(auth);
        self
    }

    /// Opens a session on the first server of `servers` (`host:port[,host:port…]`, tried in
    /// turn from a random one) that accepts it. Tries until one does: bound it with a
    /// timeout. Fails at once if the credentials are refused.
    pub async fn connect(self, servers: &str) -> Result<Client, Error> {
        let servers: Vec<String> = servers.split(',').map(with_port).collect();
        let first = fastrand::usize(..servers.len().max(1));
        let mut session = Session {
            next_server: first,
            servers,
            auth: self.auth,
            asked_ms: i32::try_from(self.timeout.as_millis()).unwrap_or(i32::MAX),
            timeout: self.timeout,
            id: 0,
            password: Vec::new(),
            last_zxid: 0,
            xid: 0,
            pending: VecDeque::new(),
            queued: VecDeque::new(),
            watches: HashMap::new(),
            state: watch::Sender::new(SessionState::Disconnected),
        };
        let (conn, response) = session.dial_until_accepted().await?;
        session.id = response.session_id;
        session.password = response.password;
        session.timeout = Duration::from_millis(u64::try_from(response.timeout_ms).unwrap_or(0));
        session.state.send_replace(SessionState::SyncConnected);
        let (commands, receiver) = mpsc::unbounded_channel();
        let inner = Inner {
            commands,
            state: session.state.subscribe(),
            handle: SessionHandle {
                id: session.id,
                password: session.password.clone(),
            },
            timeout: session.timeout,
        };
        tokio::spawn(session.run(conn, receiver));
        Ok(Client {
            inner: Arc::new(inner),
            root: Arc::from(""),
        })
    }
}

/// A handle on one session. Clones share it; dropping the last one closes the session.
/// Paths are absolute under the client's [root](Client::chroot).
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
    /// The chroot, without a trailing `/`; empty for none.
    root: Arc<str>,
}

struct Inner {
    commands: mpsc::UnboundedSender<Command>,
    state: watch::Receiver<SessionState>,
    handle: SessionHandle,
    timeout: Duration,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("session", &format_args!("{:#x}", self.inner.handle.id))
            .field("state", &self.state())
            .finish_non_exhaustive()
    }
}

/// A one-shot watch: [`changed`](Watcher::changed) resolves with the first event on the
/// node, or with the session's end.
#[derive(Debug)]
pub struct Watcher(oneshot::Receiver<WatchedEvent>);

impl Watcher {
    /// The event that fired the watch.
    pub async fn changed(self) -> WatchedEvent {
        self.0.await.unwrap_or(WatchedEvent {
            event_type: EventType::Session,
            session_state: SessionState::Closed,
        })
    }
}

/// Follows the session's state.
#[derive(Debug)]
pub struct StateWatcher(watch::Receiver<SessionState>);

impl StateWatcher {
    /// The next state the session enters.
    pub async fn changed(&mut self) -> SessionState {
        if self.0.changed().await.is_err() {
            let last = *self.0.borrow();
            return if last.is_terminated() {
                last
            } else {
                SessionState::Closed
            };
        }
        *self.0.borrow_and_update()
    }
}

/// What a watch is set on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WatchKind {
    /// An `exists` watch: a data watch if the node exists, an exist watch if not.
    Exists,
    /// A children watch.
    Children,
}

/// A request on its way to the session's task: its frame (the id to be filled in), where
/// its answer goes, and the watch it sets if it succeeds.
struct Command {
    frame: Vec<u8>,
    reply: oneshot::Sender<Result<Vec<u8>, Error>>,
    watch: Option<WatchRequest>,
}

struct WatchRequest {
    /// The path on the server (the root included).
    path: String,
    kind: WatchKind,
    event: oneshot::Sender<WatchedEvent>,
}

type Answer = oneshot::Receiver<Result<Vec<u8>, Error>>;

async fn answer(receiver: Answer) -> Result<Vec<u8>, Error> {
    receiver.await.unwrap_or(Err(Error::ClientClosed))
}

/// An `exists` answer: the node's stat, or `None` for no node.
async fn stat_or_none(receiver: Answer) -> Result<Option<Stat>, Error> {
    match answer(receiver).await {
        Ok(body) => Ok(Some(Reader::new(&body).stat()?)),
        Err(Error::NoNode) => Ok(None),
        Err(e) => Err(e),
    }
}

fn version_of(version: Option<i32>) -> i32 {
    version.unwrap_or(-1)
}

impl Client {
    /// The session's id.
    pub fn session_id(&self) -> i64 {
        self.inner.handle.id
    }

    /// The session's id and password.
    pub fn session(&self) -> &SessionHandle {
        &self.inner.handle
    }

    /// The session timeout the server granted.
    pub fn session_timeout(&self) -> Duration {
        self.inner.timeout
    }

    /// The session's state now.
    pub fn state(&self) -> SessionState {
        *self.inner.state.borrow()
    }

    /// Follows the session's state (without keeping the session open).
    pub fn state_watcher(&self) -> StateWatcher {
        StateWatcher(self.inner.state.clone())
    }

    /// The same session, with paths under `root` (a node path such as `/app`).
    pub fn chroot(mut self, root: &str) -> Client {
        let root = root.trim_end_matches('/');
        self.root = Arc::from(format!("{}{root}", self.root));
        self
    }

    /// `path` on the server.
    fn server_path(&self, path: &str) -> String {
        match (self.root.is_empty(), path) {
            (true, _) => path.to_owned(),
            (false, "/") => self.root.to_string(),
            (false, _) => format!("{}{path}", self.root),
        }
    }

    /// Hands a request to the session's task now.
    fn submit(
        &self,
        frame: Frame,
        watch: Option<(String, WatchKind)>,
    ) -> (Answer, Option<Watcher>) {
        let (reply, answer) = oneshot::channel();
        let (watch, watcher) = match watch {
            Some((path, kind)) => {
                let (event, fired) = oneshot::channel();
                (
                    Some(WatchRequest { path, kind, event }),
                    Some(Watcher(fired)),
                )
            }
            None => (None, None),
        };
        // A task that ended drops the command, and with it `reply`: the answer is then
        // `ClientClosed`.
        let _ = self.inner.commands.send(Command {
            frame: frame.finish(),
            reply,
            watch,
        });
        (answer, watcher)
    }

    fn path_request(&self, opcode: i32, path: &str) -> (Frame, String) {
        let path = self.server_path(path);
        let mut frame = Frame::request(0, opcode);
        frame.str(&path);
        (frame, path)
    }

    /// A `sync` of `path`: answered once the server caught up with the ensemble's leader.
    pub fn sync(&self, path: &str) -> impl Future<Output = Result<(), Error>> + Send + 'static {
        let (frame, _) = self.path_request(op::SYNC, path);
        let (answer_of, _) = self.submit(frame, None);
        async move { answer(answer_of).await.map(drop) }
    }

    /// The node's stat, `None` if there is no node.
    pub fn check_stat(
        &self,
        path: &str,
    ) -> impl Future<Output = Result<Option<Stat>, Error>> + Send + 'static {
        let (answer_of, _) = self.exists(path, false);
        stat_or_none(answer_of)
    }

    /// The node's stat, `None` if there is no node, and a watch that fires when it is
    /// created, changed or deleted.
    pub fn check_and_watch_stat(
        &self,
        path: &str,
    ) -> impl Future<Output = Result<(Option<Stat>, Watcher), Error>> + Send + 'static {
        let (answer_of, watcher) = self.exists(path, true);
        async move {
            let watcher = watcher.ok_or(Error::ClientClosed)?;
            Ok((stat_or_none(answer_of).await?, watcher))
        }
    }

    /// An `exists` request, with a watch or not.
    fn exists(&self, path: &str, watch: bool) -> (Answer, Option<Watcher>) {
        let (mut frame, path) = self.path_request(op::EXISTS, path);
        frame.bool(watch);
        self.submit(frame, watch.then_some((path, WatchKind::Exists)))
    }

    /// The node's data and stat.
    pub fn get_data(
        &self,
        path: &str,
    ) -> impl Future<Output = Result<(Vec<u8>, Stat), Error>> + Send + 'static {
        let (mut frame, _) = self.path_request(op::GET_DATA, path);
        frame.bool(false);
        let (answer_of, _) = self.submit(frame, None);
        async move {
            let body = answer(answer_of).await?;
            let mut reader = Reader::new(&body);
            let data = reader.bytes()?.to_vec();
            Ok((data, reader.stat()?))
        }
    }

    /// Sets the node's data, if its version is `version` (any version for `None`).
    pub fn set_data(
        &self,
        path: &str,
        data: &[u8],
        version: Option<i32>,
    ) -> impl Future<Output = Result<Stat, Error>> + Send + 'static {
        let (mut frame, _) = self.path_request(op::SET_DATA, path);
        frame.bytes(data).i32(version_of(version));
        let (answer_of, _) = self.submit(frame, None);
        async move { Ok(Reader::new(&answer(answer_of).await?).stat()?) }
    }

    /// Creates a node; its path (with the sequence number, for a sequential node) and stat.
    pub fn create(
        &self,
        path: &str,
        data: &[u8],
        mode: CreateMode,
        acl: Acl,
    ) -> impl Future<Output = Result<(String, Stat), Error>> + Send + 'static {
        let (mut frame, _) = self.path_request(op::CREATE2, path);
        frame.bytes(data).acl(acl).i32(mode.flags());
        let (answer_of, _) = self.submit(frame, None);
        let root = self.root.clone();
        async move {
            let body = answer(answer_of).await?;
            let mut reader = Reader::new(&body);
            let created = reader.string()?;
            let stat = reader.stat()?;
            let path = match created.strip_prefix(&*root) {
                Some("") => "/".to_owned(),
                Some(path) if path.starts_with('/') => path.to_owned(),
                _ => return Err(Malformed("a created node's path outside the root").into()),
            };
            Ok((path, stat))
        }
    }

    /// Deletes a node, if its version is `version` (any version for `None`).
    pub fn delete(
        &self,
        path: &str,
        version: Option<i32>,
    ) -> impl Future<Output = Result<(), Error>> + Send + 'static {
        let (mut frame, _) = self.path_request(op::DELETE, path);
        frame.i32(version_of(version));
        let (answer_of, _) = self.submit(frame, None);
        async move { answer(answer_of).await.map(drop) }
    }

    /// The names of the node's children.
    pub fn list_children(
        &self,
        path: &str,
    ) -> impl Future<Output = Result<Vec<String>, Error>> + Send + 'static {
        let (mut frame, _) = self.path_request(op::GET_CHILDREN, path);
        frame.bool(false);
        let (answer_of, _) = self.submit(frame, None);
        async move { Ok(Reader::new(&answer(answer_of).await?).strings()?) }
    }

    /// The names of the node's children, and a watch that fires when they change or the node
    /// is deleted.
    pub fn list_and_watch_children(
        &self,
        path: &str,
    ) -> impl Future<Output = Result<(Vec<String>, Watcher), Error>> + Send + 'static {
        let (mut frame, path) = self.path_request(op::GET_CHILDREN, path);
        frame.bool(true);
        let (answer_of, watcher) = self.submit(frame, Some((path, WatchKind::Children)));
        async move {
            let watcher = watcher.ok_or(Error::ClientClosed)?;
            let children = Reader::new(&answer(answer_of).await?).strings()?;
            Ok((children, watcher))
        }
    }

    /// Creates the persistent node `path` and any missing parent.
    pub async fn mkdir(&self, path: &str, acl: Acl) -> Result<(), Error> {
        let ends = path
            .char_indices()
            .filter(|&(i, c)| c == '/' && i > 0)
            .map(|(i, _)| i)
            .chain(std::iter::once(path.len()));
        for end in ends.filter(|&end| end > 1) {
            match self
                .create(&path[..end], &[], CreateMode::Persistent, acl)
                .await
            {
                Ok(_) | Err(Error::NodeExists) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// The session's task: its connection, its outstanding requests, its watches.
struct Session {
    servers: Vec<String>,
    next_server: usize,
    auth: Option<Vec<u8>>,
    asked_ms: i32,
    /// The negotiated timeout (the one asked for, until the first answer).
    timeout: Duration,
    id: i64,
    password: Vec<u8>,
    last_zxid: i64,
    xid: i32,
    /// Sent, unanswered, oldest first.
    pending: VecDeque<Pending>,
    /// Made while disconnected, to be sent on the next connection.
    queued: VecDeque<Command>,
    watches: HashMap<String, Watches>,
    state: watch::Sender<SessionState>,
}

struct Pending {
    xid: i32,
    reply: oneshot::Sender<Result<Vec<u8>, Error>>,
    watch: Option<WatchRequest>,
}

/// The watchers of one path, as ZooKeeper sorts them: data (set by an `exists` that found
/// the node), exist (by one that did not) and child watches.
#[derive(Default)]
struct Watches {
    data: Vec<oneshot::Sender<WatchedEvent>>,
    exist: Vec<oneshot::Sender<WatchedEvent>>,
    child: Vec<oneshot::Sender<WatchedEvent>>,
}

impl Watches {
    fn is_empty(&self) -> bool {
        self.data.is_empty() && self.exist.is_empty() && self.child.is_empty()
    }

    /// Forgets the watchers whose [`Watcher`] was dropped.
    fn prune(&mut self) {
        for list in [&mut self.data, &mut self.exist, &mut self.child] {
            list.retain(|sender| !sender.is_closed());
        }
    }
}

fn fire(list: &mut Vec<oneshot::Sender<WatchedEvent>>, event: WatchedEvent) {
    for sender in list.drain(..) {
        let _ = sender.send(event);
    }
}

/// One connection to a server, with what was read of it and not yet taken.
struct Conn {
    read: OwnedReadHalf,
    write: OwnedWriteHalf,
    buf: Vec<u8>,
}

/// Why a connection was given up.
#[derive(Debug)]
enum Broken {
    Io,
    Malformed,
    Closed,
}

impl From<std::io::Error> for Broken {
    fn from(_: std::io::Error) -> Broken {
        Broken::Io
    }
}

impl From<Malformed> for Broken {
    fn from(_: Malformed) -> Broken {
        Broken::Malformed
    }
}

impl Conn {
    /// The length of the first whole frame in the buffer, if there is one.
    fn whole_frame(buf: &[u8]) -> Result<Option<usize>, Broken> {
        let Some(head) = buf.get(..4) else {
            return Ok(None);
        };
        let length = i32::from_be_bytes([head[0], head[1], head[2], head[3]]);
        let length = usize::try_from(length).map_err(|_| Broken::Malformed)?;
        if length > wire::MAX_FRAME {
            return Err(Broken::Malformed);
        }
        Ok((buf.len() >= 4 + length).then_some(length))
    }

    /// Reads until a whole frame is in, and takes it.
    async fn next_frame(&mut self) -> Result<Vec<u8>, Broken> {
        loop {
            if let Some(length) = Self::whole_frame(&self.buf)? {
                let frame = self.buf[4..4 + length].to_vec();
                self.buf.drain(..4 + length);
                return Ok(frame);
            }
            if self.read.read_buf(&mut self.buf).await? == 0 {
                return Err(Broken::Closed);
            }
        }
    }
}

/// How a connection ended.
enum Served {
    /// Every client was dropped: close the session on this connection.
    Closing(Conn),
    /// The connection broke: try the next server.
    Lost,
    /// The session ended.
    Ended(SessionState),
}

/// How a connect attempt ended.
enum Dialed {
    Accepted(Conn, ConnectResponse),
    /// Try the next server.
    Failed,
    Ended(SessionState),
}

impl Session {
    /// How long nothing may be sent before a ping: 7/20 of the session timeout
    /// ([`DeadlineRule::PING_AFTER`](crate::backend::DeadlineRule::PING_AFTER), which the
    /// longest renew deadline accepted counts on). The backend's renewals, every third of the
    /// timeout by default, come sooner, so a session that renews never pings; one whose renew
    /// interval is longer pings between its renewals.
    fn ping_interval(&self) -> Duration {
        let (num, den) = crate::backend::DeadlineRule::PING_AFTER;
        self.timeout * num / den
    }

    /// How long a connection may bring nothing before it counts as dead.
    fn read_timeout(&self) -> Duration {
        self.timeout / 2
    }

    /// How long a server may take to accept a connection and the session.
    fn attempt_timeout(&self) -> Duration {
        (self.timeout * 2 / 5).max(MIN_ATTEMPT)
    }

    fn next_xid(&mut self) -> i32 {
        self.xid = if self.xid == i32::MAX {
            1
        } else {
            self.xid + 1
        };
        self.xid
    }

    /// One attempt on the next server: the connection, the session accepted and the
    /// credentials too.
    async fn dial(&mut self) -> Dialed {
        let server = self.servers[self.next_server % self.servers.len()].clone();
        self.next_server = self.next_server.wrapping_add(1);
        let request = wire::connect_request(self.last_zxid, self.asked_ms, self.id, &self.password);
        let auth = self.auth.as_ref().map(|auth| {
            let mut frame = Frame::request(xid::AUTH, op::AUTH);
            frame.i32(0).str("digest").bytes(auth);
            frame.finish()
        });
        let wanted = self.id;
        let attempt = async move {
            let stream = TcpStream::connect(server.as_str()).await?;
            stream.set_nodelay(true)?;
            let (read, mut write) = stream.into_split();
            write.write_all(&request).await?;
            let mut conn = Conn {
                read,
                write,
                buf: Vec::with_capacity(256),
            };
            let response = ConnectResponse::read(&conn.next_frame().await?)?;
            if response.timeout_ms <= 0 {
                return Ok(Err(SessionState::Expired));
            }
            // A session is never 0, and a reconnect is to the session asked for: anything else
            // would carry on as this session in another.
            if response.session_id == 0 || (wanted != 0 && response.session_id != wanted) {
                return Err(Broken::Malformed);
            }
            if let Some(auth) = auth {
                conn.write.write_all(&auth).await?;
                let frame = conn.next_frame().await?;
                let header = ReplyHeader::read(&mut Reader::new(&frame))?;
                if header.xid == xid::AUTH && header.err == AUTH_FAILED {
                    return Ok(Err(SessionState::AuthFailed));
                }
                if header.xid != xid::AUTH || header.err != 0 {
                    return Err(Broken::Malformed);
                }
            }
            Ok::<_, Broken>(Ok((conn, response)))
        };
        match timeout(self.attempt_timeout(), attempt).await {
            Ok(Ok(Ok((conn, response)))) => Dialed::Accepted(conn, response),
            Ok(Ok(Err(state))) => Dialed::Ended(state),
            Ok(Err(broken)) => {
                tracing::debug!(?broken, "a ZooKeeper server did not take the session");
                Dialed::Failed
            }
            Err(_) => Dialed::Failed,
        }
    }

    /// Tries the servers in turn, pausing after each round, until one accepts the session.
    async fn dial_until_accepted(&mut self) -> Result<(Conn, ConnectResponse), Error> {
        let mut backoff = FIRST_BACKOFF;
        loop {
            for _ in 0..self.servers.len() {
                match self.dial().await {
                    Dialed::Accepted(conn, response) => return Ok((conn, response)),
                    Dialed::Ended(state) => return Err(Error::of_end(state)),
                    Dialed::Failed => {}
                }
            }
            sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// The session's life: serve each connection, move to the next server when one breaks,
    /// and end the session for good when the server or the clients say so.
    async fn run(mut self, conn: Conn, mut commands: mpsc::UnboundedReceiver<Command>) {
        let mut conn = Some(conn);
        let ended = loop {
            if let Some(connected) = conn.take() {
                match self.serve(connected, &mut commands).await {
                    Served::Closing(connected) => {
                        self.close(connected).await;
                        break SessionState::Closed;
                    }
                    Served::Ended(state) => break state,
                    Served::Lost => self.disconnected(),
                }
            }
            let dialed = {
                let mut queued = VecDeque::new();
                let dialed = {
                    let dial = self.dial_until_accepted();
                    tokio::pin!(dial);
                    loop {
                        tokio::select! {
                            dialed = &mut dial => break Some(dialed),
                            command = commands.recv() => match command {
                                Some(command) => queued.push_back(command),
                                // Every client is gone, and no server can be reached to close
                                // the session: it expires by itself.
                                None => break None,
                            },
                        }
                    }
                };
                self.queued.append(&mut queued);
                dialed
            };
            match dialed {
                None => break SessionState::Closed,
                Some(Ok((connected, response))) => {
                    self.timeout =
                        Duration::from_millis(u64::try_from(response.timeout_ms).unwrap_or(0));
                    self.state.send_replace(SessionState::SyncConnected);
                    conn = Some(connected);
                }
                Some(Err(Error::AuthFailed)) => break SessionState::AuthFailed,
                Some(Err(_)) => break SessionState::Expired,
            }
        };
        self.end(ended);
        // Whoever still asks hears why the session is over.
        while let Some(command) = commands.recv().await {
            let _ = command.reply.send(Err(Error::of_end(ended)));
        }
    }

    /// Serves one connection until it breaks, the session ends, or every client is gone.
    async fn serve(
        &mut self,
        mut conn: Conn,
        commands: &mut mpsc::UnboundedReceiver<Command>,
    ) -> Served {
        let mut out = self.set_watches();
        while let Some(command) = self.queued.pop_front() {
            self.send(command, &mut out);
        }
        if !out.is_empty() && self.write(&mut conn, &out).await.is_err() {
            return Served::Lost;
        }
        let mut last_sent = Instant::now();
        let mut last_heard = Instant::now();
        loop {
            let ping_at = last_sent + self.ping_interval();
            let dead_at = last_heard + self.read_timeout();
            tokio::select! {
                read = conn.read.read_buf(&mut conn.buf) => {
                    if !matches!(read, Ok(n) if n > 0) {
                        return Served::Lost;
                    }
                    last_heard = Instant::now();
                    match self.take_frames(&mut conn.buf) {
                        Ok(None) => {}
                        Ok(Some(state)) => return Served::Ended(state),
                        Err(_) => return Served::Lost,
                    }
                }
                command = commands.recv() => {
                    let Some(command) = command else {
                        return Served::Closing(conn);
                    };
                    let mut out = Vec::new();
                    self.send(command, &mut out);
                    while out.len() < MAX_BATCH
                        && let Ok(more) = commands.try_recv()
                    {
                        self.send(more, &mut out);
                    }
                    if self.write(&mut conn, &out).await.is_err() {
                        return Served::Lost;
                    }
                    last_sent = Instant::now();
                }
                () = sleep_until(ping_at) => {
                    let ping = Frame::request(xid::PING, op::PING).finish();
                    if self.write(&mut conn, &ping).await.is_err() {
                        return Served::Lost;
                    }
                    last_sent = Instant::now();
                }
                () = sleep_until(dead_at) => {
                    tracing::debug!(
                        session = %format_args!("{:#x}", self.id),
                        "no word from the ZooKeeper server for half the session timeout; trying the next one"
                    );
                    return Served::Lost;
                }
            }
        }
    }

    /// Writes `bytes`, within the read timeout.
    async fn write(&self, conn: &mut Conn, bytes: &[u8]) -> Result<(), Broken> {
        match timeout(self.read_timeout(), conn.write.write_all(bytes)).await {
            Ok(Ok(())) => Ok(()),
            _ => Err(Broken::Io),
        }
    }

    /// Numbers a request and appends its frame to `out`.
    fn send(&mut self, mut command: Command, out: &mut Vec<u8>) {
        let xid = self.next_xid();
        command.frame[4..8].copy_from_slice(&xid.to_be_bytes());
        out.extend_from_slice(&command.frame);
        self.pending.push_back(Pending {
            xid,
            reply: command.reply,
            watch: command.watch,
        });
    }

    /// The `SetWatches` frames that set again the watches still wanted, from the last
    /// transaction seen.
    fn set_watches(&mut self) -> Vec<u8> {
        self.watches.retain(|_, watches| {
            watches.prune();
            !watches.is_empty()
        });
        let mut out = Vec::new();
        let mut lists: [Vec<&str>; 3] = Default::default();
        let mut size = 0;
        let flush = |lists: &mut [Vec<&str>; 3], out: &mut Vec<u8>, last_zxid: i64| {
            if lists.iter().all(Vec::is_empty) {
                return;
            }
            let mut frame = Frame::request(xid::SET_WATCHES, op::SET_WATCHES);
            frame.i64(last_zxid);
            for list in lists.iter_mut() {
                frame.strings(list.drain(..));
            }
            out.extend_from_slice(&frame.finish());
        };
        for (path, watches) in &self.watches {
            for (list, wanted) in lists.iter_mut().zip([
                !watches.data.is_empty(),
                !watches.exist.is_empty(),
                !watches.child.is_empty(),
            ]) {
                if wanted {
                    list.push(path);
                    size += path.len() + 4;
                }
            }
            if size > SET_WATCHES_CHUNK {
                flush(&mut lists, &mut out, self.last_zxid);
                size = 0;
            }
        }
        flush(&mut lists, &mut out, self.last_zxid);
        out
    }

    /// Handles every whole frame read; the state the session ended in, if it did.
    fn take_frames(&mut self, buf: &mut Vec<u8>) -> Result<Option<SessionState>, Broken> {
        let mut at = 0;
        let mut ended = None;
        while ended.is_none()
            && let Some(length) = Conn::whole_frame(&buf[at..])?
        {
            let frame = &buf[at + 4..at + 4 + length];
            at += 4 + length;
            ended = self.take_frame(frame)?;
        }
        buf.drain(..at);
        // A large answer (a long list of children) does not keep its room for the session's
        // life.
        if buf.capacity() > KEPT_BUFFER && buf.len() <= KEPT_BUFFER / 2 {
            buf.shrink_to(KEPT_BUFFER);
        }
        Ok(ended)
    }

    fn take_frame(&mut self, frame: &[u8]) -> Result<Option<SessionState>, Broken> {
        let mut reader = Reader::new(frame);
        let header = ReplyHeader::read(&mut reader)?;
        match header.xid {
            xid::NOTIFICATION => {
                let (kind, state, path) = wire::read_notification(&mut reader)?;
                match EventType::from_code(kind) {
                    Some(EventType::Session) if state == EXPIRED_STATE => {
                        return Ok(Some(SessionState::Expired));
                    }
                    Some(EventType::Session) | None => {}
                    Some(event_type) => self.dispatch(&path, event_type),
                }
                return Ok(None);
            }
            xid::PING | xid::SET_WATCHES => return Ok(None),
            xid::AUTH => {
                return Ok((header.err == AUTH_FAILED).then_some(SessionState::AuthFailed));
            }
            _ => {}
        }
        // Not taken unless it is the answer's: a request whose answer never came fails with
        // the connection.
        if self.pending.front().map(|pending| pending.xid) != Some(header.xid) {
            return Err(Broken::Malformed);
        }
        let pending = self.pending.pop_front().ok_or(Broken::Malformed)?;
        if header.zxid > self.last_zxid {
            self.last_zxid = header.zxid;
        }
        let result = match header.err {
            0 => Ok(body_of(frame)),
            code => Err(Error::from_code(code)),
        };
        if let Some(watch) = pending.watch {
            // The server set the watch if the request succeeded, or if an `exists` found no
            // node (which makes it an exist watch rather than a data watch).
            let watches = match (&result, watch.kind) {
                (Ok(_), _) | (Err(Error::NoNode), WatchKind::Exists) => {
                    let watches = self.watches.entry(watch.path).or_default();
                    watches.prune();
                    Some(watches)
                }
                _ => None,
            };
            if let Some(watches) = watches {
                let list = match (watch.kind, result.is_ok()) {
                    (WatchKind::Children, _) => &mut watches.child,
                    (WatchKind::Exists, true) => &mut watches.data,
                    (WatchKind::Exists, false) => &mut watches.exist,
                };
                list.push(watch.event);
            }
        }
        let _ = pending.reply.send(result);
        Ok(None)
    }

    /// Fires the watches an event on `path` fires.
    fn dispatch(&mut self, path: &str, event_type: EventType) {
        let Some(watches) = self.watches.get_mut(path) else {
            return;
        };
        let event = WatchedEvent {
            event_type,
            session_state: SessionState::SyncConnected,
        };
        match event_type {
            EventType::NodeCreated | EventType::NodeDataChanged => {
                fire(&mut watches.data, event);
                fire(&mut watches.exist, event);
            }
            EventType::NodeDeleted => {
                fire(&mut watches.data, event);
                fire(&mut watches.exist, event);
                fire(&mut watches.child, event);
            }
            EventType::NodeChildrenChanged => fire(&mut watches.child, event),
            EventType::Session => {}
        }
        if watches.is_empty() {
            self.watches.remove(path);
        }
    }

    /// The connection broke: what was in flight fails (it may or may not have been applied);
    /// the watches stay, to be set again on the next connection.
    fn disconnected(&mut self) {
        self.state.send_replace(SessionState::Disconnected);
        for pending in self.pending.drain(..) {
            let _ = pending.reply.send(Err(Error::ConnectionLoss));
        }
    }

    /// Sends the close request and waits (within the read timeout) for its answer, so that
    /// the session's ephemeral nodes are gone when the state says `Closed`.
    async fn close(&mut self, mut conn: Conn) {
        let xid = self.next_xid();
        let frame = Frame::request(xid, op::CLOSE).finish();
        if self.write(&mut conn, &frame).await.is_err() {
            return;
        }
        let (reply, _) = oneshot::channel();
        self.pending.push_back(Pending {
            xid,
            reply,
            watch: None,
        });
        let limit = self.read_timeout();
        let _ = timeout(limit, async {
            while !self.pending.is_empty() {
                match conn.read.read_buf(&mut conn.buf).await {
                    Ok(n) if n > 0 => {}
                    _ => return,
                }
                if !matches!(self.take_frames(&mut conn.buf), Ok(None)) {
                    return;
                }
            }
        })
        .await;
    }

    /// The session is over: every request fails and every watch fires with its state.
    fn end(&mut self, state: SessionState) {
        let error = Error::of_end(state);
        for pending in self.pending.drain(..) {
            let _ = pending.reply.send(Err(error.clone()));
        }
        for command in self.queued.drain(..) {
            let _ = command.reply.send(Err(error.clone()));
        }
        let event = WatchedEvent {
            event_type: EventType::Session,
            session_state: state,
        };
        for (_, mut watches) in self.watches.drain() {
            fire(&mut watches.data, event);
            fire(&mut watches.exist, event);
            fire(&mut watches.child, event);
        }
        self.state.send_replace(state);
    }
}

/// ZooKeeper's client port.
const DEFAULT_PORT: u16 = 2181;

/// A server of the connect string, with [`DEFAULT_PORT`] if it names none (`host`, `[v6]`).
fn with_port(server: &str) -> String {
    let server = server.trim();
    let has_port = match server.strip_prefix('[') {
        Some(v6) => v6.split_once(']').is_some_and(|(_, rest)| !rest.is_empty()),
        None => server.contains(':'),
    };
    if has_port {
        server.to_owned()
    } else {
        format!("{server}:{DEFAULT_PORT}")
    }
}

/// The body of an answer: what follows its 16-byte header.
fn body_of(frame: &[u8]) -> Vec<u8> {
    frame.get(16..).unwrap_or_default().to_vec()
}

#[cfg(test)]
mod tests {
    //! What a server may answer that no real one should: each test is a hostile or scripted
    //! peer on a loopback port. The client's dealings with real servers are in `tests/it`.

    use super::*;
    use tokio::net::TcpListener;

    async fn listener() -> (TcpListener, String) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        (listener, addr)
    }

    async fn read_frame(stream: &mut TcpStream) -> Vec<u8> {
        let mut length = [0; 4];
        stream.read_exact(&mut length).await.expect("a frame");
        let mut frame = vec![0; usize::try_from(i32::from_be_bytes(length)).expect("length")];
        stream.read_exact(&mut frame).await.expect("a frame");
        frame
    }

    fn accept_session(timeout_ms: i32, id: i64) -> Vec<u8> {
        let mut frame = Frame::bare();
        frame
            .i32(0)
            .i32(timeout_ms)
            .i64(id)
            .bytes(&[7; 16])
            .bool(false);
        frame.finish()
    }

    fn reply(xid: i32, err: i32, body: &[u8]) -> Vec<u8> {
        let mut frame = Frame::bare();
        frame.i32(xid).i64(1).i32(err);
        let mut bytes = frame.finish();
        bytes.extend_from_slice(body);
        let length = i32::try_from(bytes.len() - 4).expect("short");
        bytes[..4].copy_from_slice(&length.to_be_bytes());
        bytes
    }

    fn xid_of(request: &[u8]) -> i32 {
        i32::from_be_bytes(request[..4].try_into().expect("4 bytes"))
    }

    /// The session id a connect request asks for (0 for a new session).
    fn session_asked(connect: &[u8]) -> i64 {
        i64::from_be_bytes(connect[16..24].try_into().expect("8 bytes"))
    }

    /// Takes the next connection, reads its connect request and answers it with
    /// `timeout_ms` (0: expired) and session `id`; the stream and the session it asked for.
    async fn accept(listener: &TcpListener, timeout_ms: i32, id: i64) -> (TcpStream, i64) {
        let (mut stream, _) = listener.accept().await.expect("accept");
        let asked = session_asked(&read_frame(&mut stream).await);
        stream
            .write_all(&accept_session(timeout_ms, id))
            .await
            .expect("write");
        (stream, asked)
    }

    #[tokio::test]
    async fn a_hostile_answer_breaks_the_connection_and_nothing_else() {
        let (listener, addr) = listener().await;
        let server = tokio::spawn(async move {
            let mut asked = Vec::new();
            for round in 0..3 {
                let (mut stream, session) = accept(&listener, 3000, 7).await;
                asked.push(session);
                let xid = xid_of(&read_frame(&mut stream).await);
                let answer = match round {
                    // A frame of 2 GiB.
                    0 => i32::MAX.to_be_bytes().to_vec(),
                    // The answer to a request never sent.
                    1 => reply(xid + 5, 0, &[0; 68]),
                    // A created node outside the client's root.
                    _ => {
                        let mut body = Frame::bare();
                        body.str("/elsewhere/a");
                        let mut body = body.finish().split_off(4);
                        body.extend_from_slice(&[0; 68]);
                        reply(xid, 0, &body)
                    }
                };
                stream.write_all(&answer).await.expect("write");
                if round == 2 {
                    return (asked, stream);
                }
            }
            unreachable!()
        });
        let client = Connector::new(Duration::from_secs(3))
            .connect(&addr)
            .await
            .expect("connected")
            .chroot("/app");
        assert_eq!(client.check_stat("/a").await, Err(Error::ConnectionLoss));
        assert_eq!(client.check_stat("/a").await, Err(Error::ConnectionLoss));
        let created = client
            .create("/a", b"", CreateMode::Persistent, Acl::Open)
            .await;
        assert!(matches!(created, Err(Error::Malformed(_))), "{created:?}");
        assert_eq!(client.state(), SessionState::SyncConnected);
        let (asked, _stream) = server.await.expect("server");
        // A new session, then the same one on each reconnect.
        assert_eq!(asked, [0, 7, 7]);
    }

    #[tokio::test]
    async fn a_session_numbered_0_is_not_taken() {
        let (listener, addr) = listener().await;
        tokio::spawn(async move {
            let mut streams = Vec::new();
            for id in [0, 5] {
                let (stream, _) = accept(&listener, 3000, id).await;
                streams.push(stream);
            }
            let _ = streams[1].read(&mut [0; 16]).await;
        });
        let client = timeout(
            Duration::from_secs(5),
            Connector::new(Duration::from_secs(3)).connect(&addr),
        )
        .await
        .expect("in time")
        .expect("connected");
        assert_eq!(client.session_id(), 5);
    }

    #[tokio::test]
    async fn refused_credentials_fail_the_connect() {
        let (listener, addr) = listener().await;
        tokio::spawn(async move {
            let (mut stream, _) = accept(&listener, 3000, 7).await;
            let auth = read_frame(&mut stream).await;
            assert_eq!(xid_of(&auth), xid::AUTH);
            stream
                .write_all(&reply(xid::AUTH, AUTH_FAILED, &[]))
                .await
                .expect("write");
            let _ = stream.read(&mut [0; 16]).await;
        });
        let connected = Connector::new(Duration::from_secs(3))
            .with_digest(b"me:wrong".to_vec())
            .connect(&addr)
            .await;
        assert_eq!(connected.err(), Some(Error::AuthFailed));
    }

    #[tokio::test]
    async fn an_expired_session_fires_every_watch_and_fails_every_request() {
        let (listener, addr) = listener().await;
        tokio::spawn(async move {
            let (mut stream, _) = accept(&listener, 3000, 9).await;
            let xid = xid_of(&read_frame(&mut stream).await);
            stream
                .write_all(&reply(xid, 0, &[0; 68]))
                .await
                .expect("write");
            drop(stream);
            // The reconnect is told the session expired.
            let (mut stream, session) = accept(&listener, 0, 0).await;
            assert_eq!(session, 9);
            let _ = stream.read(&mut [0; 16]).await;
        });
        let client = Connector::new(Duration::from_secs(3))
            .connect(&addr)
            .await
            .expect("connected");
        let (stat, watcher) = client.check_and_watch_stat("/n").await.expect("exists");
        assert!(stat.is_some());
        let event = timeout(Duration::from_secs(5), watcher.changed())
            .await
            .expect("the watch fires");
        assert_eq!(
            event,
            WatchedEvent {
                event_type: EventType::Session,
                session_state: SessionState::Expired
            }
        );
        assert_eq!(client.state(), SessionState::Expired);
        assert_eq!(client.sync("/").await, Err(Error::SessionExpired));
    }

    /// A session with `pending` requests outstanding, as its task holds it.
    fn session_with(pending: usize) -> (Session, Vec<Answer>) {
        let mut session = Session {
            servers: vec!["127.0.0.1:1".to_owned()],
            next_server: 0,
            auth: None,
            asked_ms: 3000,
            timeout: Duration::from_secs(3),
            id: 1,
            password: Vec::new(),
            last_zxid: 0,
            xid: 0,
            pending: VecDeque::new(),
            queued: VecDeque::new(),
            watches: HashMap::new(),
            state: watch::Sender::new(SessionState::SyncConnected),
        };
        let answers = (0..pending)
            .map(|_| {
                let (reply, answer) = oneshot::channel();
                let xid = session.next_xid();
                let (event, _) = oneshot::channel();
                session.pending.push_back(Pending {
                    xid,
                    reply,
                    watch: Some(WatchRequest {
                        path: "/a".to_owned(),
                        kind: WatchKind::Exists,
                        event,
                    }),
                });
                answer
            })
            .collect();
        (session, answers)
    }

    #[test]
    fn set_watches_comes_in_frames_under_zookeepers_limit_and_sets_every_watch() {
        let (mut session, _answers) = session_with(0);
        session.last_zxid = 42;
        let mut wanted = Vec::new();
        let mut watchers = Vec::new();
        for i in 0..6_000 {
            let path = format!("/incumbent/an-election-with-a-long-name-{i:05}");
            let (event, fired) = oneshot::channel();
            watchers.push(fired);
            let watches = session.watches.entry(path.clone()).or_default();
            match i % 3 {
                0 => watches.data.push(event),
                1 => watches.exist.push(event),
                _ => watches.child.push(event),
            }
            wanted.push((i % 3, path));
        }
        // A dropped watcher is not set again.
        let (event, _) = oneshot::channel();
        session
            .watches
            .entry("/gone".to_owned())
            .or_default()
            .data
            .push(event);
        let bytes = session.set_watches();
        let mut got = Vec::new();
        let mut rest = &bytes[..];
        let mut frames = 0;
        while !rest.is_empty() {
            let length = usize::try_from(i32::from_be_bytes(rest[..4].try_into().expect("4")))
                .expect("length");
            assert!(length < 1 << 20, "a frame of {length} B");
            let mut reader = Reader::new(&rest[4..4 + length]);
            assert_eq!(reader.i32(), Ok(xid::SET_WATCHES));
            assert_eq!(reader.i32(), Ok(op::SET_WATCHES));
            assert_eq!(reader.i64(), Ok(42));
            for list in 0..3 {
                for path in reader.strings().expect("a list") {
                    got.push((list, path));
                }
            }
            rest = &rest[4 + length..];
            frames += 1;
        }
        assert!(frames > 1, "{} B in one frame", bytes.len());
        got.sort();
        wanted.sort();
        assert_eq!(got, wanted);
        drop(watchers);
    }

    #[test]
    fn random_bytes_from_a_server_never_panic() {
        let mut rng = fastrand::Rng::with_seed(27);
        for _ in 0..20_000 {
            let (mut session, _answers) = session_with(3);
            // Frames whose declared lengths are mostly plausible, with random fields: a
            // header of a known id now and then, so that bodies get read too.
            let mut buf = Vec::new();
            for _ in 0..rng.usize(1..4) {
                let body_len = rng.usize(0..96);
                let mut body: Vec<u8> = (0..body_len).map(|_| rng.u8(..)).collect();
                if body.len() >= 4 && rng.bool() {
                    let xid = [1, 2, -1, -2, -4, -8][rng.usize(..6)];
                    body[..4].copy_from_slice(&i32::to_be_bytes(xid));
                }
                if body.len() >= 16 && rng.bool() {
                    body[12..16].copy_from_slice(&0i32.to_be_bytes());
                }
                let declared = if rng.u8(..) < 8 {
                    rng.i32(..)
                } else {
                    i32::try_from(body.len()).expect("short")
                };
                buf.extend_from_slice(&declared.to_be_bytes());
                buf.extend_from_slice(&body);
            }
            let _ = session.take_frames(&mut buf);
        }
    }

    #[test]
    fn a_server_without_a_port_gets_zookeepers() {
        assert_eq!(with_port("zk1"), "zk1:2181");
        assert_eq!(with_port(" zk1:2182 "), "zk1:2182");
        assert_eq!(with_port("[::1]"), "[::1]:2181");
        assert_eq!(with_port("[::1]:2182"), "[::1]:2182");
    }

    #[test]
    fn the_password_is_not_in_debug_output() {
        let handle = SessionHandle {
            id: 0x1f,
            password: b"s3cret".to_vec(),
        };
        let shown = format!("{handle:?}");
        assert!(
            shown.contains("0x1f") && !shown.contains("s3cret"),
            "{shown}"
        );
        assert!(!shown.contains(&format!("{:?}", b"s3cret")), "{shown}");
    }
}
