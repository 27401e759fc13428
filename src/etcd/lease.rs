//! A granted etcd lease, as sessions share it and contenders hold it: below both, so that
//! the session (which makes contenders) and the contender (which holds the lease) do not
//! import each other.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use super::{EtcdBackend, error};
use crate::Result;
use crate::backend::keepalive::KeepAlive;
use crate::backend::lock;
use crate::backend::{Candidate, SessionHealth, SessionLoss};

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
    /// The candidate keys claimed by contenders of this lease ([`key_hash`]), so that two
    /// campaigns for the same election sharing the lease still get a key each.
    pub keys: Mutex<HashSet<u64>>,
    /// Who holds the lease, and who of them is leaving: see [`Lease::leaving`].
    pub leavers: Mutex<Leavers>,
    /// Where a revoke of the lease for its leavers is.
    pub revoke: watch::Sender<Revoke>,
    /// A revoke for the leavers was started ([`Leavers::revoking`], readable without its
    /// lock): the lease is shared no more, so neither its `keys` nor its `leavers` need
    /// keeping, and the campaigns tearing down at once (thousands, on two cores) do not
    /// queue for those two locks to update them.
    pub retired: AtomicBool,
    /// The candidate of the lease's last contender, shared by the next ones with the same
    /// candidate (most often all: one process, one identity), instead of a copy each.
    pub candidate: Mutex<Option<Arc<Candidate>>>,
}

/// A revoke of the lease for its leavers ([`Lease::leaving`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Revoke {
    /// None (or one failed): each leaver deletes its key.
    No,
    /// On its way: the leavers' deletes wait for it.
    Started,
    /// Done: every key of the lease is gone.
    Done,
}

/// The lease's handles ([`EtcdSession`](super::EtcdSession)s) and which of them are
/// leaving: their campaign shuts down, releases its claim and closes the handle next.
#[derive(Debug, Default)]
pub(super) struct Leavers {
    handles: usize,
    /// The ids ([`Lease::handle_id`]) of the leaving handles: only while a shutdown is under
    /// way, so an idle lease holds none.
    leaving: HashSet<u64>,
    /// The ids of the handles whose user was asked to shut down ([`Lease::asked`]), leaving
    /// or not yet: only while a shutdown is under way.
    asked: HashSet<u64>,
    /// The ids of the handles made and not parted, so that the backend's watch hears of
    /// each handle once, whether it was asked or closed first
    /// ([`Hub::left`](super::watch::Hub::left)). Not `handles` derived: a handle is counted
    /// there from `try_join`, before it has an id.
    joined: HashSet<u64>,
    /// A revoke for the leavers was started: the lease is not shared any more.
    revoking: bool,
    /// The next handle's id.
    next_id: u64,
}

impl Lease {
    /// `candidate`, shared with the lease's last contender if it had the same.
    pub fn shared_candidate(&self, candidate: &Candidate) -> Arc<Candidate> {
        let mut last = lock(&self.candidate);
        match &*last {
            Some(shared) if **shared == *candidate => shared.clone(),
            _ => {
                let shared = Arc::new(candidate.clone());
                *last = Some(shared.clone());
                shared
            }
        }
    }

    /// Counts one more handle, unless the lease is being revoked for its leavers.
    pub fn try_join(&self) -> bool {
        let mut leavers = lock(&self.leavers);
        // Nor once every user was asked to shut down: their leavers wait for that revoke.
        if leavers.revoking || leavers.all_asked() {
            return false;
        }
        leavers.handles += 1;
        true
    }

    /// An id for a handle that joined, which its contenders quote to [`leaving`](Self::leaving).
    pub fn handle_id(&self) -> u64 {
        let id = {
            let mut leavers = lock(&self.leavers);
            leavers.next_id += 1;
            let id = leavers.next_id;
            leavers.joined.insert(id);
            id
        };
        self.backend.inner.watches.joined();
        id
    }

    /// The handle `id` left the lease (closed or dropped).
    pub fn parted(self: &Arc<Self>, id: u64) {
        if self.retired.load(Ordering::Acquire) {
            return;
        }
        let unasked = self.change_leavers(|leavers| {
            leavers.handles = leavers.handles.saturating_sub(1);
            leavers.leaving.remove(&id);
            let asked = leavers.asked.remove(&id);
            leavers.joined.remove(&id) && !asked
        });
        if unasked {
            self.backend.inner.watches.left();
        }
    }

    /// The user of handle `id` was asked to shut down (its campaign's
    /// [`ShutdownNotice`](crate::backend::ShutdownNotice), given at the moment of the ask,
    /// before the campaign's task has seen it). Once every handle's user was asked, the
    /// revoke for the leavers is sure to come (after the last of them has left, whose term
    /// has ended by then), so the leavers do not delete their keys one by one meanwhile
    /// ([`leaving`](Self::leaving) tells them). A notice given after its handle parted (a
    /// campaign's task unwinding as it is asked) counts for nothing.
    ///
    /// The backend's watch hears of it too ([`Hub::left`](super::watch::Hub::left)): once
    /// every handle of the backend was asked, its campaigns' views no longer keep it going.
    pub fn asked(&self, id: u64) {
        if self.retired.load(Ordering::Acquire) {
            return;
        }
        let first = {
            let mut leavers = lock(&self.leavers);
            // Only a handle not parted: a notice given after its handle was closed (its
            // campaign's task unwinding as it is asked) was heard of at the close.
            !leavers.revoking && leavers.joined.contains(&id) && leavers.asked.insert(id)
        };
        if first {
            // Its campaign's views no longer keep the backend's watch going.
            self.backend.inner.watches.left();
        }
    }

    /// The handle `id` is leaving for good: its campaign shuts down, and releases its claim
    /// and closes the handle next. Once every handle of the lease is leaving (thousands of
    /// campaigns shutting down at once), one revoke of the lease deletes all their keys, as
    /// etcd's own `Session.Close` does, instead of a delete each (its [`revoke`](Self::revoke)
    /// state tells the contenders still waiting on theirs). A lease with one handle that is
    /// not leaving is never revoked here: its keys stay.
    ///
    /// Returns whether every handle's user was asked to shut down ([`asked`](Self::asked)):
    /// then that revoke is on its way, or sure to come once the others have left.
    pub fn leaving(self: &Arc<Self>, id: u64) -> bool {
        self.change_leavers(|leavers| {
            leavers.leaving.insert(id);
            leavers.all_asked()
        })
    }

    /// Applies `change` to the leavers, and starts the revoke if every handle is leaving now.
    fn change_leavers<T>(self: &Arc<Self>, change: impl FnOnce(&mut Leavers) -> T) -> T {
        let (changed, revoke) = {
            let mut leavers = lock(&self.leavers);
            let changed = change(&mut leavers);
            (changed, leavers.revoke_now())
        };
        if revoke {
            self.retired.store(true, Ordering::Release);
            self.revoke_for_leavers();
        }
        changed
    }

    /// Revokes the lease in a task of its own, for the leavers (see [`leaving`](Self::leaving)),
    /// holding their queued deletes meanwhile. Those are dropped if it succeeds; if it fails,
    /// they go back in line, and the last handle's close revokes the lease as always.
    /// Called with `revoking` just set.
    fn revoke_for_leavers(self: &Arc<Self>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        self.revoke.send_replace(Revoke::Started);
        let lease = self.clone();
        runtime.spawn(async move {
            let backend = &lease.backend;
            let held = backend.inner.batch.hold(lease.id);
            backend.abandon(lease.id);
            match revoke(backend, lease.id).await {
                Ok(()) => {
                    lease.keepalive.stop();
                    lease.revoke.send_replace(Revoke::Done);
                    drop(held);
                    tracing::debug!(lease = %format_args!("{:x}", lease.id), "every handle of the lease was leaving: revoked it, deleting their keys at once");
                }
                Err(error) => {
                    tracing::debug!(%error, "could not revoke the lease for its leavers; they delete their keys one by one");
                    backend.inner.batch.put_back(backend, held);
                    lease.revoke.send_replace(Revoke::No);
                }
            }
        });
    }

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

impl Leavers {
    /// Whether every handle's user was asked to shut down.
    fn all_asked(&self) -> bool {
        self.handles > 0 && self.asked.len() >= self.handles
    }

    /// Whether every handle is leaving now, and nobody started the revoke yet (then this
    /// caller does).
    fn revoke_now(&mut self) -> bool {
        let now = self.handles > 0 && self.leaving.len() == self.handles && !self.revoking;
        self.revoking |= now;
        now
    }
}

/// One revoke; a lease etcd does not know is revoked already.
pub(super) async fn revoke(backend: &EtcdBackend, id: i64) -> Result<()> {
    backend
        .request("revoking the lease (it expires by itself)", || async {
            match backend.lease_client().revoke(id).await {
                Err(e) if error::is_lease_not_found(&e) => Ok(()),
                other => other.map(drop),
            }
        })
        .await
}

/// Gives a contender's key back to its lease when the contender is dropped.
pub(super) fn free_key(lease: &Lease, key: &str) {
    if lease.retired.load(Ordering::Acquire) {
        return;
    }
    lock(&lease.keys).remove(&key_hash(key));
}

/// A candidate key as [`Lease::keys`] holds it: its hash, not a copy of it. Two keys with
/// one hash only make the second campaign take a key with a further suffix.
pub(super) fn key_hash(key: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::hash::DefaultHasher::new();
    key.hash(&mut hasher);
    hasher.finish()
}
