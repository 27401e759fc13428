//! Following who leads a ZooKeeper election: a watch on the election's children and on the
//! holder's node, and a read when either fires.

use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use super::client as zk;

use super::{Holder, ZookeeperBackend, from_client};
use crate::Result;
use crate::backend::{Leader, Observer};

/// The pause before reading again after a failed read.
const RETRY_PAUSE: Duration = Duration::from_millis(200);

type Watch = Pin<Box<dyn Future<Output = zk::WatchedEvent> + Send>>;

/// Follows the holder of one ZooKeeper election (its candidate node with the lowest
/// sequence).
///
/// The first [`next`](Observer::next) reads the holder at once. Later calls wait for a watch
/// to fire (a candidate joined or left, the holder's value changed, the election's node was
/// created), re-read the holder, and return it if its identity, metadata or fencing token
/// changed, or its term's start appeared (the winner writes it right after the win: until
/// then the holder's node may be a dead candidate's); another change of `since_unix_ms` alone
/// is not reported. Observers read with a session
/// of the backend's own, reconnected if it ends; `next` returns an error only when the
/// ensemble cannot be reached.
pub struct ZookeeperObserver {
    backend: ZookeeperBackend,
    path: String,
    holder: Option<Holder>,
    /// The watches armed by the last read; any of them firing means reading again.
    watches: Vec<Watch>,
    started: bool,
}

impl std::fmt::Debug for ZookeeperObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZookeeperObserver")
            .field("path", &self.path)
            .field("holder", &self.holder.as_ref().map(|holder| &holder.leader))
            .finish_non_exhaustive()
    }
}

/// What a change must touch to be reported: the identity, metadata and fencing token, and
/// whether the term's start is known.
fn identity(holder: &Option<Holder>) -> Option<Leader> {
    holder.as_ref().map(|holder| Leader {
        since_unix_ms: holder.leader.since_unix_ms.map(|_| 0),
        ..holder.leader.clone()
    })
}

impl ZookeeperObserver {
    pub(super) fn new(backend: ZookeeperBackend, election: &str) -> ZookeeperObserver {
        let path = backend.election_path(election);
        ZookeeperObserver {
            backend,
            path,
            holder: None,
            watches: Vec::new(),
            started: false,
        }
    }

    /// Arms the watches, then reads the holder: a change after the watches were set is never
    /// missed.
    async fn read(&mut self) -> Result<()> {
        self.watches.clear();
        let client = self.backend.reader().await?;
        // The election's node may be created between a list that finds none and the watch on
        // its creation: that watch then fires for nothing more (a data watch does not fire
        // for children), so the list is made again, with its child watch. Twice at most: a
        // node once created is only deleted when the election is removed by hand.
        for _ in 0..2 {
            let children = self
                .backend
                .request(
                    "watching the candidates",
                    client.list_and_watch_children(&self.path),
                )
                .await;
            match children {
                Ok((_, watcher)) => {
                    self.watches.push(Box::pin(watcher.changed()));
                    break;
                }
                Err(zk::Error::NoNode) => {
                    // No election node yet: wait for its creation.
                    let (stat, watcher) = self
                        .backend
                        .request(
                            "watching the election's node",
                            client.check_and_watch_stat(&self.path),
                        )
                        .await
                        .map_err(|e| from_client(e, "watching the election's node"))?;
                    self.watches.push(Box::pin(watcher.changed()));
                    if stat.is_none() {
                        break;
                    }
                }
                Err(e) => return Err(from_client(e, "watching the candidates")),
            }
        }
        self.holder = self.backend.read_holder(&client, &self.path).await?;
        if let Some(holder) = &self.holder {
            let watched = self
                .backend
                .request(
                    "watching the leader's node",
                    client.check_and_watch_stat(&holder.node),
                )
                .await;
            match watched {
                Ok((_, watcher)) => self.watches.push(Box::pin(watcher.changed())),
                Err(e) => return Err(from_client(e, "watching the leader's node")),
            }
        }
        Ok(())
    }

    /// Reads, retrying a few times after a failure before reporting it.
    async fn read_with_retries(&mut self) -> Result<()> {
        let mut last = None;
        for _ in 0..3 {
            match self.read().await {
                Ok(()) => return Ok(()),
                Err(error) => {
                    tracing::debug!(%error, "the observer's read failed; retrying");
                    last = Some(error);
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
            }
        }
        Err(last.unwrap_or_else(|| super::store("the observer's read failed")))
    }
}

impl Observer for ZookeeperObserver {
    async fn next(&mut self) -> Result<Option<Leader>> {
        if !self.started {
            self.read_with_retries().await?;
            self.started = true;
            return Ok(self.holder.as_ref().map(|holder| holder.leader.clone()));
        }
        let reported = identity(&self.holder);
        loop {
            if !self.watches.is_empty() {
                poll_fn(|cx| {
                    for watch in &mut self.watches {
                        if watch.as_mut().poll(cx).is_ready() {
                            return Poll::Ready(());
                        }
                    }
                    Poll::Pending
                })
                .await;
            }
            self.read_with_retries().await?;
            if identity(&self.holder) != reported {
                return Ok(self.holder.as_ref().map(|holder| holder.leader.clone()));
            }
        }
    }
}
