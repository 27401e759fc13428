//! Following the holder of an election with blocking queries on its key.

use super::watch::PendingRead;
use super::{ConsulBackend, error, holder, leader_of};
use crate::Result;
use crate::backend::{Leader, Observer};

/// Follows the holder of one Consul election: the key's value while its lock is held, `None`
/// while it is not (or the key does not exist).
///
/// The first [`next`](Observer::next) reads the key at once; later ones block on it (a
/// blocking query from the index of the last read) until the holder changes. An error (the
/// agent cannot be reached) is returned as it comes; the next call starts from a fresh read.
pub struct ConsulObserver {
    backend: ConsulBackend,
    key: String,
    /// The index of the last read: blocking queries wait for a later one. 0: read at once.
    index: u64,
    /// The holder last reported; `None` before the first report.
    last: Option<Option<Leader>>,
    /// The blocking read in flight, kept when the future of `next` is dropped.
    pending: PendingRead,
}

impl std::fmt::Debug for ConsulObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsulObserver")
            .field("key", &self.key)
            .field("index", &self.index)
            .finish_non_exhaustive()
    }
}

impl ConsulObserver {
    pub(super) fn new(backend: ConsulBackend, key: String) -> Self {
        ConsulObserver {
            backend,
            key,
            index: 0,
            last: None,
            pending: PendingRead::default(),
        }
    }
}

impl Observer for ConsulObserver {
    async fn next(&mut self) -> Result<Option<Leader>> {
        loop {
            let index = if self.last.is_some() { self.index } else { 0 };
            let read = match self
                .pending
                .read_after(
                    self.backend.sightings().reads(),
                    self.backend.client(),
                    &self.key,
                    index,
                    false,
                )
                .await
            {
                Ok(read) => read,
                Err(e) => {
                    self.index = 0;
                    return Err(error::from_client(e));
                }
            };
            self.index = read.index;
            let entry = read.entry.as_ref().filter(|e| e.session.is_some());
            if holder(entry).is_none() {
                self.backend.sightings().cleared(&self.key);
            }
            let leader = entry.map(leader_of);
            if self.last.as_ref() != Some(&leader) {
                self.last = Some(leader.clone());
                return Ok(leader);
            }
        }
    }
}
