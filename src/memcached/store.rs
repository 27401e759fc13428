//! The lock's steps in the text protocol: `add` takes, `gets` + `cas` renews, replaces and
//! deletes (a `cas` that stores the item already expired), `incr` counts.

use std::time::Duration;

use super::NAME;
use super::client::{Cas, Client};
use crate::backend::SessionOptions;
use crate::backend::polled::{Acquired, Claim, KeyState, Renewing, Store, checked_token};
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

/// A fencing counter's value, checked (see [`checked_token`]).
fn parse_counter(counter: &str, value: &[u8]) -> Result<u64> {
    let token = std::str::from_utf8(value)
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .ok_or_else(|| Error::Store {
            backend: NAME,
            reason: format!(
                "the fencing counter {counter} holds {:?}, not a number: a corrupt or hostile \
                 value, refused (delete it)",
                String::from_utf8_lossy(value)
            ),
        })?;
    checked_token(NAME, counter, token)
}

/// The error of a fencing counter that vanished between two requests.
fn vanished(counter: &str) -> Error {
    Error::Store {
        backend: NAME,
        reason: format!("the fencing counter {counter} vanished between two requests"),
    }
}

impl Client {
    /// The next token: `incr` of the counter, created (without expiry) when missing at the
    /// current Unix time in milliseconds, and raised to the clock when the result is below it
    /// (a counter created from a clock read long before: an `add` held up on its way). So a
    /// token is at least this host's clock in milliseconds when the term began, and a counter
    /// that a restart, an eviction or `flush_all` lost starts again above every token handed
    /// out before, with no candidate having to have seen them: a term takes far longer than a
    /// millisecond, so tokens never overtake the clock (given hosts' clocks within that margin
    /// of each other).
    ///
    /// Also says whether the counter was missing (created now, or by a racing candidate).
    ///
    /// A counter beyond [`MAX_TOKEN`](crate::backend::polled::MAX_TOKEN) (memcached's `incr`
    /// wraps at 2^64 to 0) is refused: a corrupt or hostile value, never a token.
    async fn next_token(&self, counter: &str) -> Result<(u64, bool)> {
        let (mut token, created) = match self.incr(counter, 1).await? {
            Some(token) => (token, false),
            None => {
                // A lost `add` race means another candidate just created it: fine either way.
                let start = crate::backend::unix_ms_now().to_string();
                self.add(counter, start.as_bytes(), 0).await?;
                (
                    self.incr(counter, 1)
                        .await?
                        .ok_or_else(|| vanished(counter))?,
                    true,
                )
            }
        };
        // The clock once: a token at least the clock when this acquisition began.
        let now = crate::backend::unix_ms_now();
        for _ in 0..REWRITE_TRIES {
            token = checked_token(NAME, counter, token)?;
            if token >= now {
                return Ok((token, created));
            }
            // Below the clock: the counter was created from a clock read long before (an
            // `add` held up on its way, while the counter was created, used and lost again
            // meanwhile). Set it to the clock with a checked write, as Redis's script takes
            // max(counter + 1, clock): an `incr` by the difference, repeated by a racing
            // candidate, would push it past the clock, and a later restart would then send
            // tokens back.
            match self.get(counter).await? {
                Some(item) => {
                    let value = parse_counter(counter, &item.value)?;
                    if value < now {
                        // Lost to a racing write: the next round sees what it wrote.
                        self.cas(counter, now.to_string().as_bytes(), 0, item.cas)
                            .await?;
                    }
                }
                None => {
                    self.add(counter, now.to_string().as_bytes(), 0).await?;
                }
            }
            token = self
                .incr(counter, 1)
                .await?
                .ok_or_else(|| vanished(counter))?;
        }
        Err(Error::Store {
            backend: NAME,
            reason: format!(
                "the fencing counter {counter} kept changing under {REWRITE_TRIES} tries to \
                 raise it to the clock"
            ),
        })
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
                // A retry of a write that was done, whose answer was lost.
                Some(item) if item.value == new => return Ok(Cas::Stored),
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
        let Some(item) = self.get(counter).await? else {
            return Ok(None);
        };
        parse_counter(counter, &item.value).map(Some)
    }

    /// `gets` the key; when absent (or holding the claim's escrow), a token from the counter
    /// (raised past the floor when it went back), then `add` (or a `cas` from the escrow). A
    /// lost race skips a token, which is harmless.
    async fn acquire(&self, claim: Claim<'_>) -> Result<Acquired> {
        let escrow = match self.get(claim.key).await? {
            Some(item) if claim.escrow == Some(item.value.as_slice()) => claim.escrow,
            Some(item) => {
                return Ok(Acquired::Held {
                    value: Some(item.value),
                    expires_in: None,
                });
            }
            None => None,
        };
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
        let taken = match escrow {
            Some(escrow) => {
                self.rewrite(claim.key, escrow, &value, exptime(claim.ttl))
                    .await?
                    == Cas::Stored
            }
            None => {
                self.add(claim.key, &value, exptime(claim.ttl).unsigned_abs())
                    .await?
            }
        };
        if !taken {
            let holder = self.get(claim.key).await?;
            return Ok(Acquired::Held {
                value: holder.map(|item| item.value),
                expires_in: None,
            });
        }
        Ok(Acquired::Won { token, went_back })
    }

    /// The acquisition is three requests (`incr`, then `add`): a candidate whose `add` came
    /// late may hold the key with a token below one that a term begun and ended meanwhile
    /// was given. So the counter is read once more: still our token, and nobody took one
    /// since; otherwise a new token (above theirs) is taken and written into the key with a
    /// checked write, before the term may begin.
    async fn settle(&self, claim: Claim<'_>, token: u64) -> Result<Option<u64>> {
        if self.counter(claim.counter).await? == Some(token) {
            return Ok(Some(token));
        }
        let (newer, _) = self.next_token(claim.counter).await?;
        let ours = [claim.before, token.to_string().as_bytes(), claim.after].concat();
        let restamped = [claim.before, newer.to_string().as_bytes(), claim.after].concat();
        match self
            .rewrite(claim.key, &ours, &restamped, exptime(claim.ttl))
            .await?
        {
            Cas::Stored => Ok(Some(newer)),
            Cas::Exists | Cas::NotFound => Ok(None),
        }
    }

    /// One `gets` of every key, a `cas` per key still ours.
    async fn renew(&self, held: &[Renewing], ttl: Duration) -> Result<Vec<KeyState>> {
        let keys: Vec<&str> = held.iter().map(|r| r.key.as_str()).collect();
        let items = self.gets(&keys).await?;
        let mut states = Vec::with_capacity(held.len());
        for renewing in held {
            let key = &renewing.key;
            let found = |value: &[u8]| {
                if value == renewing.value {
                    Some(KeyState::Renewed)
                } else if renewing.pending.as_deref() == Some(value) {
                    Some(KeyState::RenewedPending)
                } else {
                    None
                }
            };
            let state = match items.get(key) {
                None => KeyState::Gone,
                Some(item) => match found(&item.value) {
                    None => KeyState::Other,
                    Some(state) => {
                        match self.cas(key, &item.value, exptime(ttl), item.cas).await? {
                            Cas::Stored => state,
                            // Changed since the `gets`: by someone else, unless it was us.
                            Cas::Exists => match self.get(key).await? {
                                Some(now) => found(&now.value).unwrap_or(KeyState::Other),
                                None => KeyState::Gone,
                            },
                            Cas::NotFound => KeyState::Gone,
                        }
                    }
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
