//! The wire: one script per step, over one multiplexed connection.

use std::sync::LazyLock;
use std::time::Duration;

use ::redis::Script;
use ::redis::aio::ConnectionManager;

use super::notify::Notifier;
use super::{NAME, Notifications, RedisConfig, from_redis};
use crate::backend::polled::{Acquired, Claim, KeyState, Renewing, Store, checked_token};
use crate::{Error, Result};

/// Takes KEYS[1] if it does not exist (or holds exactly ARGV[5], a hand-over's escrow, when
/// that is not empty), with a new token from the counter KEYS[2]: the
/// greatest of the counter + 1, the server's clock in milliseconds (`TIME`) and the floor
/// ARGV[4] + 1, so a counter that Redis lost (a restart without persistence, a failover to a
/// replica that missed the last write) starts again above every token handed out before. The
/// value is ARGV[1] .. token .. ARGV[2], with ttl ARGV[3] milliseconds. Returns {1, token}
/// when taken, {2, token} when taken on a counter that was missing or below the floor (Redis
/// lost its data, as this process knows), {0, the holder's value} when not, {3, the counter}
/// when the counter is not a token below 2^53 - 1 (corrupt or hostile: Lua's numbers are
/// doubles, exact only up to there). Tokens are written with `%.0f`, exact for such doubles.
static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local holder = redis.call('GET', KEYS[1])
if holder and (ARGV[5] == '' or holder ~= ARGV[5]) then
  return {0, holder}
end
local raw = redis.call('GET', KEYS[2])
local counter = 0
if raw then
  if not string.match(raw, '^%d+$') or string.len(raw) > 16 then
    return {3, raw}
  end
  counter = tonumber(raw)
  if counter >= 9007199254740991 then
    return {3, raw}
  end
end
local floor = tonumber(ARGV[4])
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local token = math.max(counter + 1, now, floor + 1)
local outcome = 1
if (not raw and floor > 0) or counter < floor then
  outcome = 2
end
local text = string.format('%.0f', token)
redis.call('SET', KEYS[2], text)
redis.call('SET', KEYS[1], ARGV[1] .. text .. ARGV[2], 'PX', ARGV[3])
return {outcome, text}
",
    )
});

/// Renews every held key whose value is still ours, or our pending value. KEYS: the keys;
/// ARGV[1]: the ttl in milliseconds, ARGV[2i] our value of KEYS[i] and ARGV[2i + 1] its
/// pending value ('' for none). Returns per key 1 (renewed), 3 (renewed, holding the pending
/// value), 0 (gone) or 2 (another value).
static RENEW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local out = {}
for i, key in ipairs(KEYS) do
  local v = redis.call('GET', key)
  local pending = ARGV[2 * i + 1]
  if v == ARGV[2 * i] then
    redis.call('PEXPIRE', key, ARGV[1])
    out[i] = 1
  elseif v and pending ~= '' and v == pending then
    redis.call('PEXPIRE', key, ARGV[1])
    out[i] = 3
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
/// did, or if the key holds ARGV[2] already (a retry).
static REPLACE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
if v == ARGV[2] then
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

/// A token as the store holds it (decimal), checked.
fn parse_token(what: &str, text: &[u8]) -> Result<u64> {
    let token = std::str::from_utf8(text)
        .ok()
        .and_then(|t| t.parse().ok())
        .ok_or_else(|| Error::Store {
            backend: NAME,
            reason: format!(
                "{what} holds {:?}, not a fencing token: a corrupt or hostile value, refused \
                 (delete it)",
                String::from_utf8_lossy(text)
            ),
        })?;
    checked_token(NAME, what, token)
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
        let value: Option<Vec<u8>> = ::redis::cmd("GET")
            .arg(counter)
            .query_async(&mut self.conn.clone())
            .await
            .map_err(from_redis)?;
        value.map(|v| parse_token(counter, &v)).transpose()
    }

    async fn acquire(&self, claim: Claim<'_>) -> Result<Acquired> {
        let (outcome, answer): (i64, Vec<u8>) = ACQUIRE
            .key(claim.key)
            .key(claim.counter)
            .arg(claim.before)
            .arg(claim.after)
            .arg(millis(claim.ttl))
            .arg(claim.floor)
            .arg(claim.escrow.unwrap_or_default())
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(from_redis)?;
        match outcome {
            0 => Ok(Acquired::Held {
                value: Some(answer),
                expires_in: None,
            }),
            1 | 2 => Ok(Acquired::Won {
                token: parse_token(claim.counter, &answer)?,
                went_back: outcome == 2,
            }),
            _ => Err(Error::Store {
                backend: NAME,
                reason: format!(
                    "the fencing counter {} holds {:?}, not a token below 2^53 - 1: a corrupt \
                     or hostile value, refused (delete it; the next token is seeded from the \
                     server's clock)",
                    claim.counter,
                    String::from_utf8_lossy(&answer)
                ),
            }),
        }
    }

    async fn renew(&self, held: &[Renewing], ttl: Duration) -> Result<Vec<KeyState>> {
        let mut invocation = RENEW.prepare_invoke();
        for renewing in held {
            invocation.key(&renewing.key);
        }
        invocation.arg(millis(ttl));
        for renewing in held {
            invocation
                .arg(&renewing.value)
                .arg(renewing.pending.as_deref().unwrap_or_default());
        }
        let results: Vec<i64> = invocation
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(from_redis)?;
        Ok(results
            .into_iter()
            .map(|result| match result {
                1 => KeyState::Renewed,
                3 => KeyState::RenewedPending,
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
