//! The lock's steps in the text protocol: `add` takes, `gets` + `cas` renews, replaces and
//! deletes (a `cas` that stores the item already expired), `incr` counts.

use std::time::Duration;

use super::NAME;
use super::client::{Cas, Client};
use crate::backend::SessionOptions;
use crate::backend::polled::{Acquired, Claim, KeyState, Store};
use crate::{Error, Result};

/// The memcached part of a [`MemcachedBuilder`](super::MemcachedBuilder): where the server
/// is, and how long one request may take.
#[derive(Clone, Debug)]
pub struct Settings {
    pub(super) address: String,
    pub(super) timeout: Duration,
}

/// How many times a checked write of our own value is tried while something (our own
/// renewal) changes the item between the `gets` and the `cas`.
const REWRITE_TRIES: u32 = 5;

/// The expiry a key is stored with for a ttl: a second more than the ttl, so that it lives at
/// least the ttl on memcached's one-second clock (see the [module docs](super)).
fn exptime(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_secs()).map_or(i64::MAX, |secs| secs.saturating_add(1))
}

impl Client {
    /// The next token: `incr` of the counter, created (without expiry) when missing at the
    /// current Unix time in milliseconds. A counter that a restart or an eviction lost thus
    /// starts again above every token handed out before, with no candidate having to have
    /// seen them: a term takes far longer than a millisecond, so tokens never overtake the
    /// clock they started from (given hosts' clocks within that margin of each other).
    ///
    /// Also says whether the counter was missing (created now, or by a racing candidate).
    async fn next_token(&self, counter: &str) -> Result<(u64, bool)> {
        if let Some(token) = self.incr(counter, 1).await? {
            return Ok((token, false));
        }
        // A lost `add` race means another candidate just created it: fine either way.
        let start = crate::backend::unix_ms_now().to_string();
        self.add(counter, start.as_bytes(), 0).await?;
        let token = self.incr(counter, 1).await?.ok_or_else(|| Error::Store {
            backend: NAME,
            reason: format!("the fencing counter {counter} vanished right after it was created"),
        })?;
        Ok((token, true))
    }

    /// Rewrites `key`'s value `ours` as `new` with expiry `exptime`, if it is still `ours`:
    /// `Stored`, or `Exists` (another value) or `NotFound`.
    ///
    /// The session's renewal rewrites our value too (same value, new expiry), which changes
    /// the item's cas unique: a `cas` that fails while the value is still ours is tried
    /// again, [`REWRITE_TRIES`] times at most. Without it, a release that met a renewal
    /// left the lock held until it expired.
    async fn rewrite(&self, key: &str, ours: &[u8], new: &[u8], exptime: i64) -> Result<Cas> {
        for _ in 0..REWRITE_TRIES {
            match self.get(key).await? {
                Some(item) if item.value == ours => {
                    match self.cas(key, new, exptime, item.cas).await? {
                        Cas::Exists => continue,
                        done => return Ok(done),
                    }
                }
                Some(_) => return Ok(Cas::Exists),
                None => return Ok(Cas::NotFound),
            }
        }
        Err(Error::Store {
            backend: NAME,
            reason: format!(
                "{key} kept changing under {REWRITE_TRIES} checked writes of our own value"
            ),
        })
    }
}

impl crate::backend::polled::sealed::Sealed for Client {}

impl Store for Client {
    const NAME: &'static str = NAME;

    /// memcached counts expiry in whole seconds.
    fn check(&self, options: &SessionOptions) -> Result<()> {
        if options.ttl.subsec_nanos() == 0 {
            return Ok(());
        }
        Err(Error::InvalidTiming {
            reason: format!(
                "memcached counts expiry in whole seconds: the ttl {:?} must be whole seconds \
                 (e.g. 3s)",
                options.ttl
            ),
        })
    }

    async fn ping(&self) -> Result<()> {
        self.version().await.map(drop)
    }

    async fn read(&self, key: &str) -> Result<Option<Vec<u8>>> {
        Ok(self.get(key).await?.map(|item| item.value))
    }

    async fn counter(&self, counter: &str) -> Result<Option<u64>> {
        let item = self.get(counter).await?;
        Ok(item.and_then(|i| String::from_utf8(i.value).ok()?.trim().parse().ok()))
    }

    /// `gets` the key; when absent, a token from the counter (raised past the floor when it
    /// went back), then `add`. A lost `add` race skips a token, which is harmless.
    async fn acquire(&self, claim: Claim<'_>) -> Result<Acquired> {
        if let Some(item) = self.get(claim.key).await? {
            return Ok(Acquired::Held(Some(item.value)));
        }
        let (mut token, created) = self.next_token(claim.counter).await?;
        // A counter that this candidate saw before and is now missing was lost (a restart,
        // an eviction) with the lock: the last leader may not know yet, so this term waits,
        // as for a counter that went back.
        let went_back = token <= claim.floor || (created && claim.floor > 0);
        if token <= claim.floor {
            token = self
                .incr(claim.counter, claim.floor + 1 - token)
                .await?
                .ok_or_else(|| Error::Store {
                    backend: NAME,
                    reason: format!("the fencing counter {} vanished", claim.counter),
                })?;
        }
        let value = [claim.before, token.to_string().as_bytes(), claim.after].concat();
        let exptime = exptime(claim.ttl).unsigned_abs();
        if !self.add(claim.key, &value, exptime).await? {
            let holder = self.get(claim.key).await?;
            return Ok(Acquired::Held(holder.map(|item| item.value)));
        }
        Ok(Acquired::Won { token, went_back })
    }

    /// One `gets` of every key, a `cas` per key still ours.
    async fn renew(&self, held: &[(String, Vec<u8>)], ttl: Duration) -> Result<Vec<KeyState>> {
        let keys: Vec<&str> = held.iter().map(|(key, _)| key.as_str()).collect();
        let items = self.gets(&keys).await?;
        let mut states = Vec::with_capacity(held.len());
        for (key, value) in held {
            let state = match items.get(key) {
                None => KeyState::Gone,
                Some(item) if item.value != *value => KeyState::Other,
                Some(item) => match self.cas(key, value, exptime(ttl), item.cas).await? {
                    Cas::Stored => KeyState::Renewed,
                    // Changed since the `gets`: by someone else, unless it was us.
                    Cas::Exists => match self.get(key).await? {
                        Some(now) if now.value == *value => KeyState::Renewed,
                        Some(_) => KeyState::Other,
                        None => KeyState::Gone,
                    },
                    Cas::NotFound => KeyState::Gone,
                },
            };
            states.push(state);
        }
        Ok(states)
    }

    async fn replace(&self, key: &str, ours: &[u8], new: &[u8], ttl: Duration) -> Result<bool> {
        Ok(self.rewrite(key, ours, new, exptime(ttl)).await? == Cas::Stored)
    }

    /// The checked delete: a `cas` that stores the item already expired.
    async fn release(&self, key: &str, ours: &[u8]) -> Result<()> {
        self.rewrite(key, ours, ours, -1).await.map(drop)
    }
}
