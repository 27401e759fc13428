//! The wire: one script per step, over one multiplexed connection.

use std::sync::LazyLock;
use std::time::Duration;

use ::redis::Script;
use ::redis::aio::ConnectionManager;

use super::notify::Notifier;
use super::{NAME, Notifications, RedisConfig, from_redis};
use crate::backend::polled::{Acquired, Claim, KeyState, Store};
use crate::{Error, Result};

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

/// Replaces KEYS[1]'s value ARGV[1] with ARGV[2] (ttl ARGV[3] milliseconds). Returns 1 if it
/// did.
static REPLACE: LazyLock<Script> = LazyLock::new(|| {
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

/// Deletes KEYS[1] if its value is ARGV[1]. Returns 1 if it did.
static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
",
    )
});

/// The Redis part of a [`RedisBuilder`](super::RedisBuilder): the connection, and whether
/// followers use keyspace notifications.
#[derive(Clone, Debug)]
pub struct Settings {
    pub(super) config: RedisConfig,
    pub(super) notifications: Notifications,
}

/// A Redis server, as the polling core uses it: one multiplexed connection (reconnected by
/// the `redis` crate's `ConnectionManager`), and the keyspace notifications when they are on.
pub struct RedisStore {
    pub(super) config: RedisConfig,
    pub(super) conn: ConnectionManager,
    pub(super) notifier: Option<Notifier>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("config", &self.config)
            .field("notifications", &self.notifier.is_some())
            .finish_non_exhaustive()
    }
}

fn millis(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX)
}

impl crate::backend::polled::sealed::Sealed for RedisStore {}

impl Store for RedisStore {
    const NAME: &'static str = NAME;

    async fn ping(&self) -> Result<()> {
        let _: String = ::redis::cmd("PING")
            .query_async(&mut self.conn.clone())
            .await
            .map_err(from_redis)?;
        Ok(())
    }

    async fn read(&self, key: &str) -> Result<Option<Vec<u8>>> {
        ::redis::cmd("GET")
            .arg(key)
            .query_async(&mut self.conn.clone())
            .await
            .map_err(from_redis)
    }

    async fn counter(&self, counter: &str) -> Result<Option<u64>> {
        ::redis::cmd("GET")
            .arg(counter)
            .query_async(&mut self.conn.clone())
            .await
            .map_err(from_redis)
    }

    async fn acquire(&self, claim: Claim<'_>) -> Result<Acquired> {
        let (outcome, answer): (i64, Vec<u8>) = ACQUIRE
            .key(claim.key)
            .key(claim.counter)
            .arg(claim.before)
            .arg(claim.after)
            .arg(millis(claim.ttl))
            .arg(claim.floor)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(from_redis)?;
        if outcome == 0 {
            return Ok(Acquired::Held(Some(answer)));
        }
        let token = std::str::from_utf8(&answer)
            .ok()
            .and_then(|token| token.parse().ok())
            .ok_or_else(|| Error::Store {
                backend: NAME,
                reason: format!(
                    "the acquire script returned {:?}, not a token",
                    String::from_utf8_lossy(&answer)
                ),
            })?;
        Ok(Acquired::Won {
            token,
            went_back: outcome == 2,
        })
    }

    async fn renew(&self, held: &[(String, Vec<u8>)], ttl: Duration) -> Result<Vec<KeyState>> {
        let mut invocation = RENEW.prepare_invoke();
        for (key, _) in held {
            invocation.key(key);
        }
        invocation.arg(millis(ttl));
        for (_, value) in held {
            invocation.arg(value);
        }
        let results: Vec<i64> = invocation
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(from_redis)?;
        Ok(results
            .into_iter()
            .map(|result| match result {
                1 => KeyState::Renewed,
                0 => KeyState::Gone,
                _ => KeyState::Other,
            })
            .collect())
    }

    async fn replace(&self, key: &str, ours: &[u8], new: &[u8], ttl: Duration) -> Result<bool> {
        let done: i64 = REPLACE
            .key(key)
            .arg(ours)
            .arg(new)
            .arg(millis(ttl))
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(from_redis)?;
        Ok(done == 1)
    }

    async fn release(&self, key: &str, ours: &[u8]) -> Result<()> {
        let _: i64 = RELEASE
            .key(key)
            .arg(ours)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(from_redis)?;
        Ok(())
    }

    fn subscribe(&self, key: &str) -> Option<tokio::sync::watch::Receiver<u64>> {
        self.notifier.as_ref().map(|n| n.subscribe(key))
    }
}
