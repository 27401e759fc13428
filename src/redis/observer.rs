//! Following the holder of an election: a read at each keyspace notification or poll.

use super::{RedisBackend, from_redis};
use crate::Result;
use crate::backend::{Leader, Observer};

/// Follows the holder of one Redis election: the key's value while it exists, `None` while
/// it does not.
///
/// The first [`next`](Observer::next) reads the key at once; later ones read it again at
/// each keyspace notification for it (when they are on) or jittered poll, and return when the
/// holder changed. An error (Redis cannot be reached) is returned as it comes.
pub struct RedisObserver {
    backend: RedisBackend,
    key: String,
    /// The holder last reported; `None` before the first report.
    last: Option<Option<Leader>>,
    wake: Option<tokio::sync::watch::Receiver<u64>>,
    /// Releases of the key by this backend's contenders.
    local: tokio::sync::watch::Receiver<u64>,
    /// When the pending poll is due.
    poll_at: Option<tokio::time::Instant>,
}

impl std::fmt::Debug for RedisObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisObserver")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl RedisObserver {
    pub(super) fn new(backend: RedisBackend, key: String) -> Self {
        let wake = backend.subscribe(&key);
        let local = backend.releases(&key);
        RedisObserver {
            backend,
            key,
            last: None,
            wake,
            local,
            poll_at: None,
        }
    }
}

impl Observer for RedisObserver {
    async fn next(&mut self) -> Result<Option<Leader>> {
        loop {
            if self.last.is_some() {
                let _ = self
                    .backend
                    .pause(&mut self.wake, &mut self.local, &mut self.poll_at)
                    .await;
            }
            if let Some(wake) = &mut self.wake {
                wake.borrow_and_update();
            }
            self.local.borrow_and_update();
            let mut conn = self.backend.conn();
            let value: Option<Vec<u8>> = ::redis::cmd("GET")
                .arg(&self.key)
                .query_async(&mut conn)
                .await
                .map_err(from_redis)?;
            let leader = value.map(|v| Leader::from_bytes(&v));
            if let Some(leader) = &leader {
                self.backend.saw(&self.key, leader.fencing_token);
            }
            if self.last.as_ref() != Some(&leader) {
                self.last = Some(leader.clone());
                return Ok(leader);
            }
        }
    }
}
