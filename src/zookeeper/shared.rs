//! One ZooKeeper session as the elections share it and their contenders use it: below both
//! the session module (which makes contenders) and the contender, so that neither imports
//! the other.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::client as zk;
use tokio::sync::watch;

use super::{NAME, ZookeeperBackend};
use crate::backend::SessionHealth;
use crate::backend::keepalive::KeepAlive;
use crate::backend::lock;
use crate::{Error, Result};

/// A client whose session is open until it is taken out: the session closes when the last
/// clone of the client is dropped, so requests borrow a clone only while they run.
pub(super) type ClientSlot = Arc<Mutex<Option<zk::Client>>>;

/// One ZooKeeper session and its keep-alive, shared through the backend's pool by every
/// [`ZookeeperSession`] with its options.
pub(super) struct Zk {
    pub backend: ZookeeperBackend,
    pub id: i64,
    /// The session's id and password, to re-attach to it.
    pub info: zk::SessionHandle,
    pub client: ClientSlot,
    pub negotiated: Duration,
    pub keepalive: KeepAlive,
    /// The node-name slots `(election, n)` taken by contenders of this session, so that two
    /// campaigns of one election sharing the session get a node each.
    pub slots: Mutex<HashSet<(String, usize)>>,
}

impl Zk {
    pub fn health(&self) -> watch::Receiver<SessionHealth> {
        self.keepalive.health()
    }

    /// A clone of the session's client for one request; an error once the session is closed.
    pub fn client(&self) -> Result<zk::Client> {
        lock(&self.client)
            .clone()
            .ok_or_else(|| Error::Unavailable {
                backend: NAME,
                reason: "the session is closed".to_owned(),
            })
    }

    /// Whether the client knows the session expired (or was closed) in the store.
    pub fn expired(&self) -> bool {
        lock(&self.client)
            .as_ref()
            .is_none_or(|client| client.state() == zk::SessionState::Expired)
    }

    /// Gives a contender's slot back.
    pub fn free_slot(&self, election: &str, n: usize) {
        lock(&self.slots).remove(&(election.to_owned(), n));
    }
}
