//! A granted etcd lease, as sessions share it and contenders hold it: below both, so that
//! the session (which makes contenders) and the contender (which holds the lease) do not
//! import each other.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use super::EtcdBackend;
use crate::backend::keepalive::KeepAlive;
use crate::backend::lock;
use crate::backend::{SessionHealth, SessionLoss};

/// A granted lease and its keep-alive, shared through the backend's pool by every
/// [`EtcdSession`] with its options.
pub(super) struct Lease {
    pub backend: EtcdBackend,
    pub id: i64,
    pub ttl: Duration,
    pub keepalive: KeepAlive,
    /// The health the sessions see: the keep-alive's, forwarded, except that a lease etcd
    /// says it does not know is lost at once ([`Lease::gone`]), without waiting for the next
    /// renewal to hear it.
    pub health: watch::Receiver<SessionHealth>,
    pub health_tx: Arc<watch::Sender<SessionHealth>>,
    /// The candidate keys claimed by contenders of this lease, so that two campaigns for the
    /// same election sharing the lease still get a key each.
    pub keys: Mutex<HashSet<String>>,
}

impl Lease {
    pub fn health(&self) -> watch::Receiver<SessionHealth> {
        self.health.clone()
    }

    /// etcd said it does not know this lease (it expired, or was revoked): the session is
    /// lost ([`SessionLoss::Expired`]) now, and renewing it is pointless.
    pub fn gone(&self) {
        let marked = self.health_tx.send_if_modified(|h| match h.lost {
            Some(_) => false,
            None => {
                h.lost = Some(SessionLoss::Expired);
                true
            }
        });
        if marked {
            tracing::debug!(lease = %format_args!("{:x}", self.id), "etcd does not know the lease any more; the session is lost");
        }
        self.keepalive.stop();
    }
}

/// Gives a contender's key back to its lease when the contender is dropped.
pub(super) fn free_key(lease: &Lease, key: &str) {
    lock(&lease.keys).remove(key);
}
