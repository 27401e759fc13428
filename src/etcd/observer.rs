//! Following who leads an etcd election: a view of its range on the backend's one watch, and
//! a read when the holder may have changed.

use etcd_client::KeyValue;

use super::watch::{Change, Follow, Interest, Seen, digest};
use super::{EtcdBackend, leader_of};
use crate::Result;
use crate::backend::{Leader, Observer};

/// Follows the holder of one etcd election (the key with the lowest create revision in its
/// range).
///
/// The first [`next`](Observer::next) returns the holder at once. Later calls wait, on a view
/// of the range (on the backend's one watch), for an event that can change the holder (its
/// key deleted or rewritten, or a first key in an empty range), learn the holder again, and
/// return it if its identity, metadata or fencing token changed. The holder is read from etcd
/// only when this process does not know it: a read by a candidate or observer of the
/// election in this process, kept current by the watch since, tells it (a follower's
/// acquisition, for its campaign's observer), until the holder's key is deleted. A change of `since_unix_ms` alone is not reported, but for its
/// first appearance. When the watch lost history (compaction), the holder is read again;
/// `next` returns an error only when a read fails, i.e. the store cannot be reached.
pub struct EtcdObserver {
    backend: EtcdBackend,
    /// The holder as last read: its key and what it says.
    holder: Option<(Vec<u8>, Leader)>,
    follow: Follow,
    /// Events may have changed the holder since the last read.
    stale: bool,
    /// The first holder was returned.
    started: bool,
}

impl std::fmt::Debug for EtcdObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdObserver")
            .field("range", &self.follow.range())
            .field("holder", &self.holder.as_ref().map(|(_, leader)| leader))
            .finish_non_exhaustive()
    }
}

impl EtcdObserver {
    /// `campaigns`: it serves a campaign (see [`Follow::new`]).
    pub(super) async fn start(
        backend: EtcdBackend,
        election: &str,
        campaigns: bool,
    ) -> Result<EtcdObserver> {
        // Before the first read, so that no change after it is missed. The view keeps the
        // range's name (one copy per range in the process).
        let follow = Follow::new(&backend, &backend.election_range(election), campaigns);
        Ok(EtcdObserver {
            backend,
            holder: None,
            follow,
            stale: true,
            started: false,
        })
    }

    /// Learns the holder: from what this process knows of it, if it does (see
    /// [`Follow::known`]), else from a read.
    async fn read(&mut self) -> Result<()> {
        // Every change while the holder is learnt, then only what can change the holder
        // learnt: a change of the new holder's key delivered meanwhile (its term's mark, say)
        // is kept, where the last holder's interest would have dropped it.
        self.follow.attend(Interest::Everything);
        if let Some(known) = self.follow.known() {
            self.holder = known.holder;
        } else {
            let (revision, kv) = self.backend.read_holder(&self.follow.range()).await?;
            self.follow.learn(revision, kv.as_ref());
            self.holder = kv
                .as_ref()
                .map(|kv: &KeyValue| (kv.key().to_vec(), leader_of(kv)));
            self.follow.read_at(revision);
        }
        self.stale = false;
        let key = self.holder.as_ref().map(|(key, _)| digest(key));
        self.follow.attend(Interest::Holder(key));
        Ok(())
    }

    /// Whether a change can change the holder: what the view's [`Interest::Holder`] passes
    /// on (checked here too: the view takes every change while a holder is learnt).
    fn matters(&self, change: &Change) -> bool {
        match &self.holder {
            None => !change.deleted,
            Some((key, _)) => change.key == *key,
        }
    }
}

/// What a change must touch to be reported: the identity, metadata and fencing token, and
/// whether the term's start is known (the winner writes it right after the win: until then
/// the holder's key may be a dead candidate's).
fn identity(holder: &Option<(Vec<u8>, Leader)>) -> Option<Leader> {
    holder.as_ref().map(|(_, leader)| Leader {
        since_unix_ms: leader.since_unix_ms.map(|_| 0),
        ..leader.clone()
    })
}

impl Observer for EtcdObserver {
    async fn next(&mut self) -> Result<Option<Leader>> {
        // The reads and the pause are boxed: `next` is where an idle follower (and a leader,
        // for the request lock) waits, and its future should hold room only for the view.
        if !self.started {
            Box::pin(self.read()).await?;
            self.started = true;
            return Ok(self.holder.as_ref().map(|(_, leader)| leader.clone()));
        }
        let reported = identity(&self.holder);
        loop {
            if self.stale {
                Box::pin(self.read()).await?;
                if identity(&self.holder) != reported {
                    return Ok(self.holder.as_ref().map(|(_, leader)| leader.clone()));
                }
            }
            match self.follow.next().await {
                Seen::Changes(changes) => {
                    self.stale = changes.iter().any(|change| self.matters(change));
                }
                Seen::Gap => self.stale = true,
            }
        }
    }
}
