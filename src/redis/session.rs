//! Sessions: process-local (a random id), alive as long as one script renews every key its
//! elections hold.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};

use ::redis::Script;
use tokio::sync::watch;
use tokio::time::Instant;

use super::contender::RedisContender;
use super::{NAME, RedisBackend, from_redis};
use crate::Result;
use crate::backend::keepalive::{KeepAlive, Renewal};
use crate::backend::pool::{self, Poolable};
use crate::backend::{Candidate, LockLoss, Session, SessionHealth, SessionOptions, lock};

/// Renews every held key whose value is still ours. KEYS: the keys; ARGV[1]: the ttl in
/// milliseconds, ARGV[1 + i]: our value of KEYS[i]. Returns per key 1 (renewed), 0 (gone) or
/// 2 (another value).
static RENEW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local out = {}
for i, key in ipairs(KEYS) do
  local v = redis.call('GET', key)
  if v == ARGV[i + 1] then
    redis.call('PEXPIRE', key, ARGV[1])
    out[i] = 1
  elseif v then
    out[i] = 2
  else
    out[i] = 0
  end
end
return out
",
    )
});

/// Deletes KEYS[1] if its value is ARGV[1]. Returns 1 if it did.
pub(super) static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
",
    )
});

/// Numbers the session handles of this process.
static NEXT_HANDLE: AtomicU64 = AtomicU64::new(0);

/// A key held by one contender of the session.
pub(super) struct Held {
    /// Our value of the key, compared by every renewal.
    pub value: String,
    /// Set while the value is being changed (proclaim): a renewal that finds neither value
    /// says nothing then; the next one decides.
    pub changing: bool,
    /// Told why, when a renewal finds the key gone or another's.
    pub loss: watch::Sender<Option<LockLoss>>,
}

/// The keys held by a session's contenders, by key.
pub(super) type HeldKeys = Arc<Mutex<HashMap<String, Held>>>;

/// A session and its keep-alive, shared through the backend's pool by every
/// [`RedisSession`] with its options.
pub(super) struct Shared {
    pub backend: RedisBackend,
    /// A random id, process-local (Redis knows no sessions): for logs and owner ids.
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
        let held: Vec<(String, String)> = lock(&self.held)
            .drain()
            .map(|(key, held)| (key, held.value))
            .collect();
        let mut conn = self.backend.conn();
        for (key, value) in held {
            let _: i64 = RELEASE
                .key(&key)
                .arg(&value)
                .invoke_async(&mut conn)
                .await
                .map_err(from_redis)?;
        }
        Ok(())
    }
}

/// A session on Redis: a handle on a process-local session that may be shared with other
/// elections of the same [`RedisBackend`]. Its liveness is the renewal of its keys: one
/// script renews them all every renew interval. Closing (or dropping) the last handle
/// deletes the keys it still holds.
pub struct RedisSession {
    shared: pool::Shared<Shared>,
    /// Tells this handle (one campaign's) apart from the others on the same session.
    handle: u64,
}

impl std::fmt::Debug for RedisSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSession")
            .field("id", &self.shared.id)
            .finish_non_exhaustive()
    }
}

/// Opens a session: joins a live one with equal options, or starts a new one.
pub(super) async fn open(backend: &RedisBackend, options: &SessionOptions) -> Result<RedisSession> {
    let shared = backend
        .inner
        .sessions
        .join(options, || create(backend, options))
        .await?;
    Ok(RedisSession {
        shared,
        handle: NEXT_HANDLE.fetch_add(1, Ordering::Relaxed),
    })
}

/// Checks that Redis answers, and starts the renewals.
async fn create(backend: &RedisBackend, options: &SessionOptions) -> Result<Shared> {
    let mut conn = backend.conn();
    let sent = Instant::now();
    let _: String = ::redis::cmd("PING")
        .query_async(&mut conn)
        .await
        .map_err(from_redis)?;
    let id = format!("{:016x}", fastrand::u64(..));
    let held: HeldKeys = Arc::default();
    let ttl_ms = u64::try_from(options.ttl.as_millis()).unwrap_or(u64::MAX);
    let renewed = held.clone();
    let keepalive = KeepAlive::spawn(NAME, options, sent, move || {
        renew(conn.clone(), renewed.clone(), ttl_ms)
    });
    tracing::debug!(session = %id, ttl = ?options.ttl, "redis session started");
    Ok(Shared {
        backend: backend.clone(),
        id,
        options: options.clone(),
        held,
        keepalive,
    })
}

/// One renewal of every held key. A key that is no longer ours ends its contender's term;
/// the others are confirmed.
async fn renew(
    mut conn: ::redis::aio::ConnectionManager,
    held: HeldKeys,
    ttl_ms: u64,
) -> Result<Renewal> {
    let snapshot: Vec<(String, String)> = lock(&held)
        .iter()
        .map(|(key, held)| (key.clone(), held.value.clone()))
        .collect();
    if snapshot.is_empty() {
        let _: String = ::redis::cmd("PING")
            .query_async(&mut conn)
            .await
            .map_err(from_redis)?;
        return Ok(Renewal::Alive);
    }
    let mut invocation = RENEW.prepare_invoke();
    for (key, _) in &snapshot {
        invocation.key(key);
    }
    invocation.arg(ttl_ms);
    for (_, value) in &snapshot {
        invocation.arg(value);
    }
    let results: Vec<i64> = invocation
        .invoke_async(&mut conn)
        .await
        .map_err(from_redis)?;
    for ((key, value), result) in snapshot.iter().zip(results) {
        let loss = match result {
            1 => continue,
            0 => LockLoss::Deleted,
            _ => LockLoss::Taken,
        };
        let mut held = lock(&held);
        let ours = held
            .get(key)
            .is_some_and(|h| h.value == *value && !h.changing);
        if ours && let Some(lost) = held.remove(key) {
            drop(held);
            tracing::warn!(%key, ?loss, "redis: a renewal found the lock no longer ours");
            lost.loss.send_replace(Some(loss));
        }
    }
    Ok(Renewal::Alive)
}

impl Session for RedisSession {
    type Contender = RedisContender;

    fn id(&self) -> String {
        self.shared.id.clone()
    }

    fn health(&self) -> watch::Receiver<SessionHealth> {
        self.shared.keepalive.health()
    }

    async fn contend(&self, election: &str, candidate: &Candidate) -> Result<RedisContender> {
        let backend = &self.shared.backend;
        Ok(RedisContender::new(
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
