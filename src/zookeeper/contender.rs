//! A candidate node in an election: acquire, wait for the predecessor, notice loss.

use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use super::client as zk;

use super::shared::Zk;
use super::{ZookeeperBackend, from_client, leader_of, store, token_of};
use crate::Result;
use crate::backend::{Attempt, Candidate, Contender, Leader, LockLoss, SessionLoss, unix_ms_now};

/// How many times [`ZookeeperContender::acquire`] creates its node when it keeps vanishing at
/// once, before it reports an error.
const MAX_CREATES: usize = 3;
/// How many times one acquisition follows a predecessor that is gone by the time it is
/// watched, before it reports an error (each time, a node ahead of ours went away).
const MAX_REREADS: usize = 64;
/// The pause before re-arming a watch after a failed request, while leading.
const REARM_PAUSE: Duration = Duration::from_millis(100);

/// A one-shot watch's event, boxed so that it can be polled by reference (cancel-safe).
type Watch = Pin<Box<dyn Future<Output = zk::WatchedEvent> + Send>>;

/// Our candidate node: its name under the election's node, and its czxid (the token).
#[derive(Clone, Debug)]
struct Node {
    name: String,
    czxid: i64,
}

/// One session's claim on one ZooKeeper election: an ephemeral sequential node
/// `<prefix>/<election>/@<session id>-<slot>-<sequence>`.
///
/// - [`acquire`](Contender::acquire) creates the node (once; see the protected-mode check in
///   the [module docs](super)), watches it, and lists the election's candidates: the lowest
///   sequence leads, and its czxid is the fencing token. Otherwise it watches the node just
///   ahead of ours. Calling it again while leading returns the same token.
/// - [`wait`](Contender::wait) returns when the predecessor is gone (or our own node is, or
///   the session ended). A hand-off therefore costs the old leader's delete, one watch event
///   and one list of the children.
/// - [`lost`](Contender::lost) resolves the moment the watch on our node fires with its
///   delete ([`LockLoss::Deleted`], or [`LockLoss::SessionLost`] when the client already
///   knows the session expired) or with the session's expiry.
/// - [`release`](Contender::release) deletes the node; a missing node is not an error.
pub struct ZookeeperContender {
    zk: Arc<Zk>,
    election: String,
    slot: usize,
    /// The election's node.
    path: String,
    /// Our nodes' name before the sequence: `@<session id>-<slot>-`.
    prefix: String,
    candidate: Candidate,
    node: Option<Node>,
    /// When our term began (or our candidacy, until we win), as written in the node.
    since: Option<u64>,
    won: bool,
    /// A create was sent: a node with our prefix may be ours even if its answer was lost.
    sent_create: bool,
    /// The watch on our own node (while following and while leading).
    own: Option<Watch>,
    /// While following: the predecessor's node and the watch on it.
    predecessor: Option<(String, Watch)>,
    /// The predecessor was the holder (the only node ahead of ours).
    next_in_line: bool,
    /// `wait` saw the delete of the holder, ahead of any event about our own node: from then
    /// on we lead, without listing the candidates again.
    promoted: bool,
    /// A loss seen while leading, kept until the next acquisition, so that dropping `lost`'s
    /// future loses nothing.
    noticed: Option<LockLoss>,
}

impl std::fmt::Debug for ZookeeperContender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZookeeperContender")
            .field("path", &self.path)
            .field("node", &self.node)
            .field("won", &self.won)
            .finish_non_exhaustive()
    }
}

/// Polls a watch held in an option, clearing it once it fired.
fn poll_watch(slot: &mut Option<Watch>, cx: &mut Context<'_>) -> Poll<zk::WatchedEvent> {
    let Some(watch) = slot.as_mut() else {
        return Poll::Pending;
    };
    let event = std::task::ready!(watch.as_mut().poll(cx));
    *slot = None;
    Poll::Ready(event)
}

enum Fired {
    Predecessor(zk::WatchedEvent),
    Own(zk::WatchedEvent),
}

impl ZookeeperContender {
    pub(super) fn new(
        zk: Arc<Zk>,
        election: &str,
        slot: usize,
        prefix: String,
        candidate: Candidate,
    ) -> Self {
        let path = zk.backend.election_path(election);
        ZookeeperContender {
            zk,
            election: election.to_owned(),
            slot,
            path,
            prefix,
            candidate,
            node: None,
            since: None,
            won: false,
            sent_create: false,
            own: None,
            predecessor: None,
            next_in_line: false,
            promoted: false,
            noticed: None,
        }
    }

    /// The path of our node, once created.
    pub fn node_path(&self) -> Option<String> {
        self.node
            .as_ref()
            .map(|node| format!("{}/{}", self.path, node.name))
    }

    fn backend(&self) -> &ZookeeperBackend {
        &self.zk.backend
    }

    fn value(&self, token: Option<i64>) -> Vec<u8> {
        Leader {
            candidate: self.candidate.clone(),
            fencing_token: token.map(token_of),
            since_unix_ms: self.since,
        }
        .to_bytes()
    }

    /// Forgets our node (it vanished, or we released it) and every watch that relied on it.
    fn forget(&mut self) {
        self.node = None;
        self.since = None;
        self.won = false;
        self.own = None;
        self.predecessor = None;
        self.promoted = false;
        self.noticed = None;
    }

    /// Creates our node, unless an earlier create of ours made it (its answer lost): the
    /// candidates are listed first, and a node with our prefix is adopted if we sent a create
    /// before, or deleted if not (an earlier contender of this session and slot left it).
    async fn create(&mut self, client: &zk::Client) -> Result<()> {
        let adopt = std::mem::replace(&mut self.sent_create, true);
        let queue = self.backend().read_queue(client, &self.path).await?;
        if let Some(existing) = queue.iter().find(|c| c.name.starts_with(&self.prefix)) {
            let path = format!("{}/{}", self.path, existing.name);
            if adopt {
                let stat = self
                    .backend()
                    .request("reading our candidate node", client.check_stat(&path))
                    .await
                    .map_err(|e| from_client(e, "reading our candidate node"))?;
                if let Some(stat) = stat {
                    self.node = Some(Node {
                        name: existing.name.clone(),
                        czxid: stat.czxid,
                    });
                    return Ok(());
                }
            } else {
                match self
                    .backend()
                    .request(
                        "deleting a candidate node left behind",
                        client.delete(&path, None),
                    )
                    .await
                {
                    Ok(()) | Err(zk::Error::NoNode) => {}
                    Err(e) => return Err(from_client(e, "deleting a candidate node left behind")),
                }
            }
        }
        // A candidate's key says nothing of a term until it wins (`mark_term`): an observer
        // must not read its campaign's start as its term's.
        self.since = None;
        let data = self.value(None);
        let acl = self.backend().acls();
        let mode = zk::CreateMode::EphemeralSequential;
        let node_prefix = format!("{}/{}", self.path, self.prefix);
        let mut created = self
            .backend()
            .request(
                "creating the candidate node",
                client.create(&node_prefix, &data, mode, acl),
            )
            .await;
        if created == Err(zk::Error::NoNode) {
            self.backend().ensure_election(client, &self.path).await?;
            created = self
                .backend()
                .request(
                    "creating the candidate node",
                    client.create(&node_prefix, &data, mode, acl),
                )
                .await;
        }
        let (created, stat) = created.map_err(|e| from_client(e, "creating the candidate node"))?;
        // The server names the node: it must be ours, under the election's node.
        let name = created
            .strip_prefix(&node_prefix)
            .filter(|sequence| !sequence.is_empty() && sequence.bytes().all(|b| b.is_ascii_digit()))
            .map(|sequence| format!("{}{sequence}", self.prefix))
            .ok_or_else(|| {
                store(format!(
                    "ZooKeeper named the created candidate node {created:?}, not \
                     {node_prefix}<sequence>"
                ))
            })?;
        self.node = Some(Node {
            name,
            czxid: stat.czxid,
        });
        Ok(())
    }

    /// Watches our node; `false` if it is gone.
    async fn watch_own(&mut self, client: &zk::Client, node: &Node) -> Result<bool> {
        let path = format!("{}/{}", self.path, node.name);
        let (stat, watcher) = self
            .backend()
            .request(
                "watching our candidate node",
                client.check_and_watch_stat(&path),
            )
            .await
            .map_err(|e| from_client(e, "watching our candidate node"))?;
        match stat {
            Some(stat) if stat.czxid == node.czxid => {
                self.own = Some(Box::pin(watcher.changed()));
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Rewrites our node's value with the start of the term and its token, in the background:
    /// off the hand-off's critical path, since observers read the token from the czxid anyway.
    fn mark_term(&mut self, node: &Node) {
        self.since = Some(unix_ms_now());
        let data = self.value(Some(node.czxid));
        let path = format!("{}/{}", self.path, node.name);
        let Ok(client) = self.zk.client() else { return };
        let call = client.set_data(&path, &data, None);
        tokio::spawn(async move {
            if let Err(error) = call.await {
                tracing::debug!(%error, "could not mark the start of the term in the node's value");
            }
        });
    }

    /// Whether the watch on our own node is armed and has not fired; an event that has
    /// arrived is taken (and our node forgotten if it was deleted).
    fn own_still_watched(&mut self) -> bool {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        match poll_watch(&mut self.own, &mut cx) {
            Poll::Pending => self.own.is_some(),
            Poll::Ready(event) => {
                if event.event_type == zk::EventType::NodeDeleted {
                    self.forget();
                }
                false
            }
        }
    }

    /// Whether the session behind our node is known to be gone.
    fn session_gone(&self) -> bool {
        session_gone(&self.zk)
    }

    /// Why our node is gone, asking the server: a request on the session answers, or fails
    /// because the session expired. Bounded by the request timeout; a server that does not
    /// answer leaves the reason as the client knows it.
    async fn why_deleted(zk: Arc<Zk>) -> LockLoss {
        let Ok(client) = zk.client() else {
            return LockLoss::SessionLost;
        };
        let limit = zk.backend.inner.settings.request_timeout;
        let asked = tokio::time::timeout(limit, async {
            loop {
                match client.check_stat("/").await {
                    Ok(_) => return LockLoss::Deleted,
                    Err(zk::Error::SessionExpired | zk::Error::ClientClosed) => {
                        return LockLoss::SessionLost;
                    }
                    Err(error) => {
                        tracing::debug!(%error, "cannot check the session after losing the node");
                        tokio::time::sleep(REARM_PAUSE).await;
                    }
                }
            }
        })
        .await;
        asked.unwrap_or_else(|_| why_gone(&zk))
    }

    /// Why our node is gone, without asking the store.
    fn why_gone(&self) -> LockLoss {
        why_gone(&self.zk)
    }
}

/// Whether the client or the keep-alive already knows that the session is gone.
fn session_gone(zk: &Zk) -> bool {
    zk.expired()
        || matches!(
            zk.health().borrow().lost,
            Some(SessionLoss::Expired | SessionLoss::Unconfirmed)
        )
}

/// Why a node is gone, as far as the client knows without asking the store.
fn why_gone(zk: &Zk) -> LockLoss {
    if session_gone(zk) {
        LockLoss::SessionLost
    } else {
        LockLoss::Deleted
    }
}

impl Contender for ZookeeperContender {
    async fn acquire(&mut self) -> Result<Attempt> {
        self.noticed = None;
        // The holder's delete arrived before any event about our node: ZooKeeper delivers a
        // session's watch events in zxid order, and no node can be created ahead of ours, so
        // ours is the lowest now.
        if std::mem::take(&mut self.promoted)
            && let Some(node) = self.node.clone()
            && self.own_still_watched()
        {
            self.won = true;
            self.mark_term(&node);
            return Ok(Attempt::Won {
                fencing_token: token_of(node.czxid),
            });
        }
        let client = self.zk.client()?;
        let mut creates = 0;
        for _ in 0..MAX_REREADS {
            let node = match self.node.clone() {
                Some(node) => node,
                None if creates < MAX_CREATES => {
                    creates += 1;
                    self.forget();
                    self.create(&client).await?;
                    continue;
                }
                None => {
                    return Err(store(format!(
                        "the candidate node vanished right after each of {MAX_CREATES} creates; \
                         is something deleting nodes under {:?}?",
                        self.path
                    )));
                }
            };
            if self.own.is_none() && !self.watch_own(&client, &node).await? {
                self.forget();
                continue;
            }
            let queue = self.backend().read_queue(&client, &self.path).await?;
            let Some(position) = queue.iter().position(|c| c.name == node.name) else {
                self.forget();
                continue;
            };
            if position == 0 {
                self.predecessor = None;
                if !self.won {
                    self.won = true;
                    self.mark_term(&node);
                }
                return Ok(Attempt::Won {
                    fencing_token: token_of(node.czxid),
                });
            }
            self.won = false;
            let predecessor = format!("{}/{}", self.path, queue[position - 1].name);
            let (stat, watcher) = self
                .backend()
                .request(
                    "watching the predecessor",
                    client.check_and_watch_stat(&predecessor),
                )
                .await
                .map_err(|e| from_client(e, "watching the predecessor"))?;
            if stat.is_none() {
                // Gone already: list again.
                continue;
            }
            self.predecessor = Some((predecessor, Box::pin(watcher.changed())));
            self.next_in_line = position == 1;
            let first = format!("{}/{}", self.path, queue[0].name);
            let holder = match self
                .backend()
                .request("reading the leader", client.get_data(&first))
                .await
            {
                Ok((data, stat)) => Some(leader_of(&data, &stat)),
                Err(zk::Error::NoNode) => None,
                Err(e) => return Err(from_client(e, "reading the leader")),
            };
            return Ok(Attempt::Held { holder });
        }
        Err(store(format!(
            "the candidates of {:?} kept changing while being read",
            self.election
        )))
    }

    async fn wait(&mut self) -> Result<()> {
        loop {
            if self.predecessor.is_none() {
                return Ok(());
            }
            // Our own node first: an event about it that is already here wins over the
            // predecessor's, so that a promotion never outlives our node.
            let fired = poll_fn(|cx| {
                if let Poll::Ready(event) = poll_watch(&mut self.own, cx) {
                    return Poll::Ready(Fired::Own(event));
                }
                match self.predecessor.as_mut() {
                    Some((_, watch)) => watch.as_mut().poll(cx).map(Fired::Predecessor),
                    None => Poll::Pending,
                }
            })
            .await;
            match fired {
                Fired::Predecessor(event) => {
                    let Some((path, _)) = self.predecessor.take() else {
                        return Ok(());
                    };
                    if event.event_type == zk::EventType::NodeDeleted {
                        self.promoted = self.next_in_line && self.own.is_some();
                    }
                    if event.event_type != zk::EventType::NodeDataChanged {
                        return Ok(());
                    }
                    // The holder marked its term: still there, watch it again.
                    let client = self.zk.client()?;
                    let (stat, watcher) = self
                        .backend()
                        .request(
                            "watching the predecessor",
                            client.check_and_watch_stat(&path),
                        )
                        .await
                        .map_err(|e| from_client(e, "watching the predecessor"))?;
                    if stat.is_none() {
                        return Ok(());
                    }
                    self.predecessor = Some((path, Box::pin(watcher.changed())));
                }
                Fired::Own(event) => {
                    if event.event_type == zk::EventType::NodeDeleted {
                        self.forget();
                    }
                    if event.event_type != zk::EventType::NodeDataChanged {
                        return Ok(());
                    }
                }
            }
        }
    }

    async fn lost(&mut self) -> LockLoss {
        loop {
            if let Some(loss) = self.noticed {
                // Reported at once, with no question to ZooKeeper in between.
                return loss;
            }
            let Some(node) = self.node.clone().filter(|_| self.won) else {
                self.noticed = Some(self.why_gone());
                continue;
            };
            if self.own.is_none() {
                let Ok(client) = self.zk.client() else {
                    self.noticed = Some(LockLoss::SessionLost);
                    continue;
                };
                match self.watch_own(&client, &node).await {
                    Ok(true) => {}
                    Ok(false) => self.noticed = Some(self.why_gone()),
                    Err(error) => {
                        if self.session_gone() {
                            self.noticed = Some(LockLoss::SessionLost);
                        } else {
                            tracing::debug!(%error, "cannot watch the leader's node; retrying");
                            tokio::time::sleep(REARM_PAUSE).await;
                        }
                    }
                }
                continue;
            }
            let event = poll_fn(|cx| poll_watch(&mut self.own, cx)).await;
            match event.event_type {
                zk::EventType::NodeDeleted => self.noticed = Some(self.why_gone()),
                zk::EventType::Session if event.session_state.is_terminated() => {
                    self.noticed = Some(LockLoss::SessionLost)
                }
                // Our own value changed (the term marked, a proclamation): watch again.
                _ => {}
            }
        }
    }

    /// A deleted node: asks the server whether the session behind it is still alive (a
    /// closed or expired session's nodes are deleted before its client hears of it).
    async fn explain(&mut self, loss: LockLoss) -> LockLoss {
        match loss {
            LockLoss::Deleted => Self::why_deleted(self.zk.clone()).await,
            other => other,
        }
    }

    async fn proclaim(&mut self, leader: &Leader) -> Result<()> {
        let Some(node) = self.node.clone().filter(|_| self.won) else {
            return Err(store(
                "cannot proclaim: this candidate does not hold the lock",
            ));
        };
        let previous = std::mem::replace(&mut self.candidate, leader.candidate.clone());
        let data = self.value(Some(node.czxid));
        let path = format!("{}/{}", self.path, node.name);
        let client = self.zk.client()?;
        let written = self
            .backend()
            .request("proclaiming", client.set_data(&path, &data, None))
            .await;
        match written {
            Ok(_) => Ok(()),
            Err(e) => {
                self.candidate = previous;
                Err(match e {
                    zk::Error::NoNode => store(format!("cannot proclaim: the node {path} is gone")),
                    other => from_client(other, "proclaiming"),
                })
            }
        }
    }

    async fn release(&mut self) -> Result<()> {
        self.predecessor = None;
        self.own = None;
        self.won = false;
        self.promoted = false;
        self.noticed = None;
        let client = self.zk.client()?;
        let path = match self.node_path() {
            Some(path) => path,
            // A create was sent and its answer never came (the acquire was cancelled, e.g. a
            // campaign shut down as it began): the node may exist, and nothing else would
            // delete it before the session ends. The session's requests are answered in
            // order, so the list sees it if the create made it.
            None if self.sent_create => {
                let queue = self.backend().read_queue(&client, &self.path).await?;
                match queue.iter().find(|c| c.name.starts_with(&self.prefix)) {
                    Some(left) => format!("{}/{}", self.path, left.name),
                    None => {
                        self.sent_create = false;
                        return Ok(());
                    }
                }
            }
            None => return Ok(()),
        };
        self.sent_create = false;
        match self
            .backend()
            .request("deleting the candidate node", client.delete(&path, None))
            .await
        {
            Ok(()) | Err(zk::Error::NoNode) => {}
            Err(e) => return Err(from_client(e, "deleting the candidate node")),
        }
        self.forget();
        Ok(())
    }
}

impl Drop for ZookeeperContender {
    fn drop(&mut self) {
        self.zk.free_slot(&self.election, self.slot);
    }
}
