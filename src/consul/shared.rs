//! One Consul session as the elections share it and their contenders use it: below both the
//! session module (which makes contenders) and the contender, so that neither imports the
//! other.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::watch;

use super::ConsulBackend;
use crate::backend::SessionHealth;
use crate::backend::keepalive::KeepAlive;
use crate::backend::lock;

/// A Consul session and its keep-alive, shared through the backend's pool by every
/// [`ConsulSession`] with its options.
pub(super) struct Shared {
    pub backend: ConsulBackend,
    /// The session id (a UUID; not a secret).
    pub id: String,
    /// The lock-delay Consul applies when this session is invalidated.
    pub lock_delay: Duration,
    pub keepalive: KeepAlive,
    /// Which contender of this session may hold each election key: two campaigns for the
    /// same election sharing the session must not both win (Consul lets a session acquire a
    /// key it already holds). See the [module docs](super) for why.
    pub claims: Mutex<HashMap<String, u64>>,
    /// Bumped whenever a claim is given up, to wake the contenders waiting behind it.
    pub unclaimed: watch::Sender<u64>,
}

impl Shared {
    pub fn health(&self) -> watch::Receiver<SessionHealth> {
        self.keepalive.health()
    }

    /// Lets `contender` try for `key`, unless another contender of this session holds or
    /// tries for it.
    pub fn claim(&self, key: &str, contender: u64) -> bool {
        *lock(&self.claims)
            .entry(key.to_owned())
            .or_insert(contender)
            == contender
    }

    /// Whether `contender` has claimed `key`.
    pub fn claimed_by(&self, key: &str, contender: u64) -> bool {
        lock(&self.claims).get(key) == Some(&contender)
    }

    /// Whether another contender of this session has claimed `key`.
    pub fn claimed_by_other(&self, key: &str, contender: u64) -> bool {
        lock(&self.claims).get(key).is_some_and(|c| *c != contender)
    }

    /// Gives up `contender`'s claim on `key`, if it has one, and wakes the contenders of
    /// this session waiting behind it.
    pub fn unclaim(&self, key: &str, contender: u64) {
        let mut claims = lock(&self.claims);
        if claims.get(key) == Some(&contender) {
            claims.remove(key);
            drop(claims);
            self.unclaimed.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// Changes when a claim is given up (from now on: subscribe before checking a claim).
    pub fn unclaims(&self) -> watch::Receiver<u64> {
        self.unclaimed.subscribe()
    }
}
