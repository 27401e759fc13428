//! Sessions: process-local (a random id), alive as long as one renewal rewrites every key its
//! elections hold.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::watch;
use tokio::time::Instant;

use super::client::Cas;
use super::contender::MemcachedContender;
use super::{MemcachedBackend, NAME};
use crate::Result;
use crate::backend::keepalive::{KeepAlive, Renewal};
use crate::backend::pool::{self, Poolable};
use crate::backend::{Candidate, LockLoss, Session, SessionHealth, SessionOptions, lock};

/// Numbers the session handles of this process.
static NEXT_HANDLE: AtomicU64 = AtomicU64::new(0);

/// A key held by one contender of the session.
pub(super) struct Held {
    /// Our value of the key, compared by every renewal.
    pub value: Vec<u8>,
    /// Set while the value is being changed (proclaim): a renewal that finds neither value
    /// says nothing then; the next one decides.
    pub changing: bool,
    /// Told why, when a renewal finds the key gone or another's.
    pub loss: watch::Sender<Option<LockLoss>>,
}

/// The keys held by a session's contenders, by key.
pub(super) type HeldKeys = Arc<Mutex<HashMap<String, Held>>>;

/// The expiry a key is stored with for a ttl: a second more than the ttl, so that it lives at
/// least the ttl on memcached's one-second clock (see the [module docs](super)).
pub(super) fn exptime(options: &SessionOptions) -> u64 {
    options.ttl.as_secs() + 1
}

/// A session and its keep-alive, shared through the backend's pool.
pub(super) struct Shared {
    pub backend: MemcachedBackend,
    /// A random id, process-local: for logs and owner ids.
    pub id: String,
    pub options: SessionOptions,
    pub held: HeldKeys,
    keepalive: KeepAlive,
}

impl Shared {
    /// The session's health, as the keep-alive reports it.
    pub fn keepalive_health(&self) -> watch::Receiver<SessionHealth> {
        self.keepalive.health()
    }
}

impl Poolable for Shared {
    /// A dropped session releases its keys at once rather than leaving them to expire.
    const DESTROY_ON_DROP: bool = true;

    fn health(&self) -> watch::Receiver<SessionHealth> {
        self.keepalive.health()
    }

    /// Stops the renewals and deletes every key still held (where still ours).
    async fn destroy(&self) -> Result<()> {
        self.keepalive.stop();
        let held: Vec<(String, Vec<u8>)> = lock(&self.held)
            .drain()
            .map(|(key, held)| (key, held.value))
            .collect();
        for (key, value) in held {
            release(&self.backend, &key, &value).await?;
        }
        Ok(())
    }
}

/// The checked delete: `gets`, then a `cas` that stores the item already expired, only while
/// the value is `value`.
pub(super) async fn release(backend: &MemcachedBackend, key: &str, value: &[u8]) -> Result<()> {
    if let Some(item) = backend.client().get(key).await?
        && item.value == value
    {
        backend.client().cas(key, value, -1, item.cas).await?;
    }
    Ok(())
}

/// A session on memcached: a handle on a process-local session that may be shared with
/// other elections of the same [`MemcachedBackend`]. Its liveness is the renewal of its keys.
/// Closing (or dropping) the last handle deletes the keys it still holds.
pub struct MemcachedSession {
    shared: pool::Shared<Shared>,
    /// Tells this handle (one campaign's) apart from the others on the same session.
    handle: u64,
}

impl std::fmt::Debug for MemcachedSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemcachedSession")
            .field("id", &self.shared.id)
            .finish_non_exhaustive()
    }
}

pub(super) async fn open(
    backend: &MemcachedBackend,
    options: &SessionOptions,
) -> Result<MemcachedSession> {
    let shared = backend
        .inner
        .sessions
        .join(options, || create(backend, options))
        .await?;
    Ok(MemcachedSession {
        shared,
        handle: NEXT_HANDLE.fetch_add(1, Ordering::Relaxed),
    })
}

async fn create(backend: &MemcachedBackend, options: &SessionOptions) -> Result<Shared> {
    let sent = Instant::now();
    backend.client().version().await?;
    let id = format!("{:016x}", fastrand::u64(..));
    let held: HeldKeys = Arc::default();
    let renewed = held.clone();
    let renewing = backend.clone();
    let exptime = exptime(options);
    let keepalive = KeepAlive::spawn(NAME, options, sent, move || {
        renew(renewing.clone(), renewed.clone(), exptime)
    });
    tracing::debug!(session = %id, ttl = ?options.ttl, "memcached session started");
    Ok(Shared {
        backend: backend.clone(),
        id,
        options: options.clone(),
        held,
        keepalive,
    })
}

/// One renewal of every held key: one `gets` of them all, a `cas` per key still ours. A key
/// that is no longer ours ends its contender's term; the others are confirmed.
async fn renew(backend: MemcachedBackend, held: HeldKeys, exptime: u64) -> Result<Renewal> {
    let snapshot: Vec<(String, Vec<u8>)> = lock(&held)
        .iter()
        .map(|(key, held)| (key.clone(), held.value.clone()))
        .collect();
    if snapshot.is_empty() {
        backend.client().version().await?;
        return Ok(Renewal::Alive);
    }
    let keys: Vec<&str> = snapshot.iter().map(|(key, _)| key.as_str()).collect();
    let items = backend.client().gets(&keys).await?;
    let exptime = i64::try_from(exptime).unwrap_or(i64::MAX);
    for (key, value) in &snapshot {
        let loss = match items.get(key) {
            None => Some(LockLoss::Deleted),
            Some(item) if item.value != *value => Some(LockLoss::Taken),
            Some(item) => match backend.client().cas(key, value, exptime, item.cas).await? {
                Cas::Stored => None,
                // Changed since the `gets`: by someone else, unless it was us.
                Cas::Exists => match backend.client().get(key).await? {
                    Some(now) if now.value == *value => None,
                    Some(_) => Some(LockLoss::Taken),
                    None => Some(LockLoss::Deleted),
                },
                Cas::NotFound => Some(LockLoss::Deleted),
            },
        };
        let Some(loss) = loss else { continue };
        let mut held = lock(&held);
        if held
            .get(key)
            .is_some_and(|h| h.value == *value && !h.changing)
            && let Some(lost) = held.remove(key)
        {
            drop(held);
            tracing::warn!(%key, ?loss, "memcached: a renewal found the lock no longer ours");
            lost.loss.send_replace(Some(loss));
        }
    }
    Ok(Renewal::Alive)
}

impl Session for MemcachedSession {
    type Contender = MemcachedContender;

    fn id(&self) -> String {
        self.shared.id.clone()
    }

    fn health(&self) -> watch::Receiver<SessionHealth> {
        self.shared.keepalive_health()
    }

    async fn contend(&self, election: &str, candidate: &Candidate) -> Result<MemcachedContender> {
        let backend = &self.shared.backend;
        Ok(MemcachedContender::new(
            backend.clone(),
            self.shared.session(),
            backend.key(election),
            backend.counter_key(election),
            candidate.clone(),
            self.handle,
        ))
    }

    async fn close(self) -> Result<()> {
        self.shared.close().await
    }
}
