//! One session's claim on one election's key: acquire with the fencing counter, wait for a
//! notification or the poll, hear of a loss from the session's renewal.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};

use ::redis::Script;
use tokio::sync::watch;

use super::session::{Held, RELEASE, Shared};
use super::{NAME, RedisBackend, from_redis};
use crate::backend::{
    Attempt, Candidate, Contender, FencingToken, Leader, LockLoss, lock, unix_ms_now,
};
use crate::{Error, Result};

/// Tells the contenders of one process apart, in owner ids.
static NEXT_CONTENDER: AtomicU64 = AtomicU64::new(0);

/// Takes KEYS[1] if it does not exist, with a new token from the counter KEYS[2] (first
/// raised to the floor ARGV[4]); the value is ARGV[1] .. token .. ARGV[2], with ttl ARGV[3]
/// milliseconds. Returns {1, token} when taken, {2, token} when taken on a counter that was
/// below the floor (Redis lost its data), {0, the holder's value} when not.
static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local holder = redis.call('GET', KEYS[1])
if holder then
  return {0, holder}
end
local floor = tonumber(ARGV[4])
local counter = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
local outcome = 1
if counter < floor then
  redis.call('SET', KEYS[2], string.format('%d', floor))
  outcome = 2
end
local token = string.format('%d', redis.call('INCR', KEYS[2]))
redis.call('SET', KEYS[1], ARGV[1] .. token .. ARGV[2], 'NX', 'PX', ARGV[3])
return {outcome, token}
",
    )
});

/// Replaces KEYS[1]'s value ARGV[1] with ARGV[2] (ttl ARGV[3] milliseconds). Returns 1 if it
/// did.
static PROCLAIM: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
",
    )
});

/// One session's claim on one Redis election: the key `<prefix><election>`.
///
/// - [`acquire`](Contender::acquire) runs one script: `INCR` of the counter and
///   `SET NX PX` of the key, atomically, when the key is free. Calling it again while
///   leading returns the same token (after checking the key is still ours).
/// - [`wait`](Contender::wait) returns on a keyspace notification for the key (when they are
///   on), or after the jittered poll interval.
/// - [`lost`](Contender::lost) resolves when the session's renewal finds the key gone
///   ([`LockLoss::Deleted`]) or another's ([`LockLoss::Taken`]), or when the session is lost.
///   [`explain`](Contender::explain) tells a vanished key from a Redis that lost its data.
/// - [`release`](Contender::release) deletes the key if it still holds our value, and wakes
///   this backend's followers of it. While followers poll (notifications off), the contenders
///   of the session handle that released it (the resigning campaign's) leave the free key
///   alone for [`COURTESY_POLLS`](super::COURTESY_POLLS) poll intervals
///   ([`Attempt::Delayed`]): followers in other processes poll, and without it a resigning
///   leader's campaign would win its own lock back every time. Every other campaign, in this
///   process too, may take it at once.
pub struct RedisContender {
    backend: RedisBackend,
    session: Arc<Shared>,
    key: String,
    counter: String,
    candidate: Candidate,
    /// `<session id>/<contender>`: written into the value, so that no two contenders (even
    /// of one session) ever hold the same value.
    owner: String,
    /// Our current value while we hold the key.
    value: String,
    /// The fencing token while we hold the lock.
    held: Option<FencingToken>,
    /// The token of the last term, for `explain`.
    last: Option<FencingToken>,
    /// Told by the session's renewal when the key is lost.
    loss: Option<watch::Receiver<Option<LockLoss>>>,
    /// Keyspace notifications for the key, when on.
    wake: Option<watch::Receiver<u64>>,
    /// Releases of the key by this backend's contenders.
    local: watch::Receiver<u64>,
    /// The session handle (one per campaign) this contender came from: after it released
    /// the key, that handle's contenders leave the key to others for a while.
    handle: u64,
    /// When the pending poll of `wait` is due.
    poll_at: Option<tokio::time::Instant>,
}

impl std::fmt::Debug for RedisContender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisContender")
            .field("key", &self.key)
            .field("owner", &self.owner)
            .field("held", &self.held)
            .finish_non_exhaustive()
    }
}

/// The stored value around the token: the JSON object of `leader` (without a token) with
/// the owner added, split where `"fencing_token":<token>` goes in.
fn value_parts(leader: &Leader, owner: &str) -> (String, String) {
    let mut object = match serde_json::to_value(Leader {
        fencing_token: None,
        ..leader.clone()
    }) {
        Ok(serde_json::Value::Object(object)) => object,
        _ => serde_json::Map::new(),
    };
    object.insert("owner".into(), serde_json::Value::String(owner.to_owned()));
    let rest = serde_json::Value::Object(object).to_string();
    // `rest` is `{...}` with at least the owner inside: the token goes first.
    let inner = rest.strip_prefix('{').unwrap_or(&rest);
    ("{\"fencing_token\":".to_owned(), format!(",{inner}"))
}

impl RedisContender {
    pub(super) fn new(
        backend: RedisBackend,
        session: Arc<Shared>,
        key: String,
        counter: String,
        candidate: Candidate,
        handle: u64,
    ) -> Self {
        let owner = format!(
            "{}/{}",
            session.id,
            NEXT_CONTENDER.fetch_add(1, Ordering::Relaxed)
        );
        let wake = backend.subscribe(&key);
        let local = backend.releases(&key);
        RedisContender {
            backend,
            session,
            key,
            counter,
            candidate,
            owner,
            value: String::new(),
            held: None,
            last: None,
            loss: None,
            wake,
            local,
            handle,
            poll_at: None,
        }
    }

    fn ttl_ms(&self) -> u64 {
        u64::try_from(self.session.options.ttl.as_millis()).unwrap_or(u64::MAX)
    }

    /// Stops renewing our key (if the session still does), without telling a loss.
    fn forget(&mut self) {
        let mut held = lock(&self.session.held);
        if held.get(&self.key).is_some_and(|h| h.value == self.value) {
            held.remove(&self.key);
        }
        drop(held);
        self.held = None;
        self.loss = None;
    }

    async fn get(&self) -> Result<Option<String>> {
        let mut conn = self.backend.conn();
        ::redis::cmd("GET")
            .arg(&self.key)
            .query_async(&mut conn)
            .await
            .map_err(from_redis)
    }
}

impl Contender for RedisContender {
    async fn acquire(&mut self) -> Result<Attempt> {
        // Changes from now on wake `wait`.
        if let Some(wake) = &mut self.wake {
            wake.borrow_and_update();
        }
        self.local.borrow_and_update();
        if let Some(fencing_token) = self.held {
            if self.get().await?.as_deref() == Some(self.value.as_str()) {
                return Ok(Attempt::Won { fencing_token });
            }
            self.forget();
        }
        let leader = Leader {
            candidate: self.candidate.clone(),
            fencing_token: None,
            since_unix_ms: Some(unix_ms_now()),
        };
        if let Some(until) = self.backend.courtesy(&self.key, self.handle) {
            // Our campaign released the lock a moment ago and followers poll: those in other
            // processes would lose the race to our own retry every time.
            return Ok(Attempt::Delayed { until });
        }
        let (before, after) = value_parts(&leader, &self.owner);
        let floor = self.backend.saw(&self.key, None);
        let mut conn = self.backend.conn();
        let (won, answer): (i64, String) = ACQUIRE
            .key(&self.key)
            .key(&self.counter)
            .arg(&before)
            .arg(&after)
            .arg(self.ttl_ms())
            .arg(floor)
            .invoke_async(&mut conn)
            .await
            .map_err(from_redis)?;
        if won == 0 {
            let holder = Leader::from_bytes(answer.as_bytes());
            self.backend.saw(&self.key, holder.fencing_token);
            return Ok(Attempt::Held {
                holder: Some(holder),
            });
        }
        let fencing_token: FencingToken = answer.parse().map_err(|_| Error::Store {
            backend: NAME,
            reason: format!("the acquire script returned {answer:?}, not a token"),
        })?;
        self.backend.saw(&self.key, Some(fencing_token));
        self.value = format!("{before}{fencing_token}{after}");
        let (loss, lost) = watch::channel(None);
        lock(&self.session.held).insert(
            self.key.clone(),
            Held {
                value: self.value.clone(),
                changing: false,
                loss,
            },
        );
        self.held = Some(fencing_token);
        self.last = Some(fencing_token);
        self.loss = Some(lost);
        if won == 2 {
            // The counter went back: Redis lost its data (a restart without persistence, a
            // failover), so the last leader may not know yet that its key is gone. It stops
            // within its renew deadline, which is shorter than the ttl: we hold the key (and
            // renew it) but lead only a ttl from now. The next `acquire` finds the key ours.
            let until = tokio::time::Instant::now() + self.session.options.ttl;
            tracing::warn!(
                key = %self.key,
                floor,
                fencing_token,
                "redis: the fencing counter went back (Redis lost its data); taking the lock \
                 but leading only after a ttl, when the last leader has surely stopped"
            );
            return Ok(Attempt::Delayed { until });
        }
        Ok(Attempt::Won { fencing_token })
    }

    async fn wait(&mut self) -> Result<()> {
        self.backend
            .pause(&mut self.wake, &mut self.local, &mut self.poll_at)
            .await;
        Ok(())
    }

    async fn lost(&mut self) -> LockLoss {
        crate::backend::keepalive::held_key_lost(
            self.session.keepalive_health(),
            self.loss.as_mut(),
        )
        .await
    }

    /// A vanished key whose counter is gone or below our token: Redis lost its data.
    async fn explain(&mut self, loss: LockLoss) -> LockLoss {
        if loss != LockLoss::Deleted {
            return loss;
        }
        let Some(token) = self.last else { return loss };
        let mut conn = self.backend.conn();
        let counter: Result<Option<u64>> = ::redis::cmd("GET")
            .arg(&self.counter)
            .query_async(&mut conn)
            .await
            .map_err(from_redis);
        match counter {
            Ok(counter) if counter.is_none_or(|c| c < token) => {
                tracing::warn!(
                    key = %self.key,
                    token,
                    ?counter,
                    "redis lost the lock and its fencing counter: restarted without \
                     persistence, failed over to a replica that lacked them, or flushed"
                );
                LockLoss::SessionLost
            }
            Ok(_) => loss,
            Err(error) => {
                tracing::debug!(%error, "could not read the fencing counter after losing the lock");
                loss
            }
        }
    }

    async fn proclaim(&mut self, leader: &Leader) -> Result<()> {
        let Some(fencing_token) = self.held else {
            return Err(Error::Store {
                backend: NAME,
                reason: "cannot proclaim: this candidate does not hold the lock".into(),
            });
        };
        let (before, after) = value_parts(leader, &self.owner);
        let value = format!("{before}{fencing_token}{after}");
        if let Some(held) = lock(&self.session.held).get_mut(&self.key) {
            held.changing = true;
        }
        let mut conn = self.backend.conn();
        let done: Result<i64> = PROCLAIM
            .key(&self.key)
            .arg(&self.value)
            .arg(&value)
            .arg(self.ttl_ms())
            .invoke_async(&mut conn)
            .await
            .map_err(from_redis);
        if let Some(held) = lock(&self.session.held).get_mut(&self.key) {
            if done.as_ref().is_ok_and(|d| *d == 1) {
                held.value = value.clone();
            }
            held.changing = false;
        }
        match done? {
            1 => {
                self.value = value;
                Ok(())
            }
            _ => Err(Error::Store {
                backend: NAME,
                reason: format!(
                    "cannot proclaim: the lock on {} is no longer held by this candidate",
                    self.key
                ),
            }),
        }
    }

    async fn release(&mut self) -> Result<()> {
        if self.held.is_none() {
            return Ok(());
        }
        let mut conn = self.backend.conn();
        let released: Result<i64> = RELEASE
            .key(&self.key)
            .arg(&self.value)
            .invoke_async(&mut conn)
            .await
            .map_err(from_redis);
        self.forget();
        self.backend.released(&self.key, self.handle);
        released.map(drop)
    }
}

impl Drop for RedisContender {
    /// Stops renewing the key: it expires within a ttl.
    fn drop(&mut self) {
        self.forget();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_value_is_a_leader_with_the_token_and_the_owner() {
        let leader = Leader {
            candidate: Candidate {
                id: "a".into(),
                metadata: [("k".to_owned(), "v".to_owned())].into(),
            },
            fencing_token: Some(99),
            since_unix_ms: Some(5),
        };
        let (before, after) = value_parts(&leader, "s/1");
        let value = format!("{before}12345678901234567{after}");
        let read = Leader::from_bytes(value.as_bytes());
        assert_eq!(read.fencing_token, Some(12_345_678_901_234_567));
        assert_eq!(read.candidate, leader.candidate);
        assert_eq!(read.since_unix_ms, Some(5));
        assert!(value.contains("\"owner\":\"s/1\""), "{value}");
    }
}
