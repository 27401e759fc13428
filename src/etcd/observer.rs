//! Following who leads an etcd election: a watch on its range, and a read when the holder
//! may have changed.

use etcd_client::{Event, EventType, KeyValue};

use super::watch::{Follow, Seen, Start, Target};
use super::{EtcdBackend, leader_of};
use crate::Result;
use crate::backend::{Leader, Observer};

/// Follows the holder of one etcd election (the key with the lowest create revision in its
/// range).
///
/// The first [`next`](Observer::next) reads the holder at once. Later calls wait, on a watch
/// of the range, for an event that can change the holder (its key deleted or rewritten, or a
/// first key in an empty range), re-read it, and return it if its identity, metadata or
/// fencing token changed. A change of `since_unix_ms` alone is not reported, but for its first appearance. A watch that
/// breaks or is cancelled by compaction is re-established from a fresh read; `next` returns
/// an error only when that read fails, i.e. the store cannot be reached.
pub struct EtcdObserver {
    backend: EtcdBackend,
    range: String,
    /// The holder as last read: its key and what it says.
    holder: Option<(Vec<u8>, Leader)>,
    follow: Option<Follow>,
    /// Events may have changed the holder since the last read.
    stale: bool,
    /// The first holder was returned.
    started: bool,
}

impl std::fmt::Debug for EtcdObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdObserver")
            .field("range", &self.range)
            .field("holder", &self.holder.as_ref().map(|(_, leader)| leader))
            .finish_non_exhaustive()
    }
}

impl EtcdObserver {
    pub(super) async fn start(backend: EtcdBackend, election: &str) -> Result<EtcdObserver> {
        let range = backend.election_range(election);
        Ok(EtcdObserver {
            backend,
            range,
            holder: None,
            follow: None,
            stale: true,
            started: false,
        })
    }

    /// Reads the holder, and tells the watch (or starts one) that changes after the read are
    /// what matters.
    async fn read(&mut self) -> Result<()> {
        let (revision, kv) = self.backend.read_holder(&self.range).await?;
        self.holder = kv
            .as_ref()
            .map(|kv: &KeyValue| (kv.key().to_vec(), leader_of(kv)));
        self.stale = false;
        match self.follow.as_mut() {
            Some(follow) => follow.read_at(revision),
            None => {
                let target = Target::Prefix(self.range.clone().into_bytes());
                let start = Start::After(revision + 1);
                self.follow = Some(Follow::new(&self.backend, vec![target], false, start));
            }
        }
        Ok(())
    }

    /// Whether an event can change the holder.
    fn matters(&self, event: &Event) -> bool {
        let Some(kv) = event.kv() else { return false };
        match &self.holder {
            None => event.event_type() == EventType::Put,
            Some((key, _)) => kv.key() == key.as_slice(),
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
        // for the request lock) waits, and its future should hold room only for the watch.
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
            let Some(follow) = self.follow.as_mut() else {
                self.stale = true;
                continue;
            };
            match follow.next().await {
                Ok(Seen::Events(events)) => {
                    self.stale = events.iter().any(|event| self.matters(event));
                }
                Ok(Seen::Gap) => self.stale = true,
                Err(error) => {
                    tracing::debug!(%error, "the observer's watch broke; re-reading");
                    Box::pin(follow.pause()).await;
                    self.follow = None;
                    self.stale = true;
                }
            }
        }
    }
}
