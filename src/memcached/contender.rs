//! One session's claim on one election's key, and observers: both poll.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::watch;

use super::client::Cas;
use super::session::{Held, Shared, exptime, release};
use super::{MemcachedBackend, NAME};
use crate::backend::{
    Attempt, Candidate, Contender, FencingToken, Leader, LockLoss, Observer, lock, unix_ms_now,
};
use crate::{Error, Result};

/// Tells the contenders of one process apart, in owner ids.
static NEXT_CONTENDER: AtomicU64 = AtomicU64::new(0);

/// The stored value: the leader as JSON, with the token and the owner id.
fn value_of(leader: &Leader, fencing_token: FencingToken, owner: &str) -> Vec<u8> {
    let mut object = match serde_json::to_value(Leader {
        fencing_token: Some(fencing_token),
        ..leader.clone()
    }) {
        Ok(serde_json::Value::Object(object)) => object,
        _ => serde_json::Map::new(),
    };
    object.insert("owner".into(), serde_json::Value::String(owner.to_owned()));
    serde_json::Value::Object(object).to_string().into_bytes()
}

/// One session's claim on one memcached election: the key `<prefix><election>`.
///
/// - [`acquire`](Contender::acquire): `gets` the key; when absent, a token from the counter
///   (`incr`), then `add`. A token not greater than the highest this backend saw means the
///   counter went back (memcached restarted or evicted it): the counter is raised past it,
///   and the lock taken but led only a ttl later ([`Attempt::Delayed`]).
/// - [`wait`](Contender::wait) sleeps for the jittered poll interval.
/// - [`lost`](Contender::lost) resolves when the session's renewal finds the key gone or
///   another's, or when the session is lost; [`explain`](Contender::explain) tells a deleted
///   key from a memcached that lost its data (the counter gone or below our token).
/// - [`release`](Contender::release) is a checked delete. For
///   [`COURTESY_POLLS`](super::COURTESY_POLLS) poll intervals after it, `acquire` of the free
///   key by contenders of the session handle that released it (the resigning campaign's)
///   returns [`Attempt::Delayed`]: the followers in other processes poll, and without it a
///   resigning leader's campaign would win its own lock back every time. Every other
///   campaign, in this process too, may take it at once.
pub struct MemcachedContender {
    backend: MemcachedBackend,
    session: Arc<Shared>,
    key: String,
    counter: String,
    candidate: Candidate,
    owner: String,
    value: Vec<u8>,
    held: Option<FencingToken>,
    last: Option<FencingToken>,
    loss: Option<watch::Receiver<Option<LockLoss>>>,
    /// Releases of the key by this backend's contenders.
    wake: watch::Receiver<u64>,
    /// The session handle (one per campaign) this contender came from: after it released
    /// the key, that handle's contenders leave the key to others for a while.
    handle: u64,
    /// When the pending poll of `wait` is due.
    poll_at: Option<tokio::time::Instant>,
}

impl std::fmt::Debug for MemcachedContender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemcachedContender")
            .field("key", &self.key)
            .field("owner", &self.owner)
            .field("held", &self.held)
            .finish_non_exhaustive()
    }
}

impl MemcachedContender {
    pub(super) fn new(
        backend: MemcachedBackend,
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
        let wake = backend.releases(&key);
        MemcachedContender {
            backend,
            session,
            key,
            counter,
            candidate,
            owner,
            value: Vec::new(),
            held: None,
            last: None,
            loss: None,
            wake,
            handle,
            poll_at: None,
        }
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

    /// The next token: `incr` of the counter, created at 0 (without expiry) when missing.
    async fn next_token(&self) -> Result<u64> {
        let client = self.backend.client();
        if let Some(token) = client.incr(&self.counter, 1).await? {
            return Ok(token);
        }
        // A lost `add` race means another candidate just created it: fine either way.
        client.add(&self.counter, b"0", 0).await?;
        client
            .incr(&self.counter, 1)
            .await?
            .ok_or_else(|| Error::Store {
                backend: NAME,
                reason: format!(
                    "the fencing counter {} vanished right after it was created",
                    self.counter
                ),
            })
    }
}

impl Contender for MemcachedContender {
    async fn acquire(&mut self) -> Result<Attempt> {
        // Releases from now on wake `wait`.
        self.wake.borrow_and_update();
        let current = self.backend.client().get(&self.key).await?;
        if let Some(fencing_token) = self.held {
            if current
                .as_ref()
                .is_some_and(|item| item.value == self.value)
            {
                return Ok(Attempt::Won { fencing_token });
            }
            self.forget();
        }
        let client = self.backend.client();
        if current.is_none()
            && let Some(until) = self.backend.courtesy(&self.key, self.handle)
        {
            // Our campaign released the lock a moment ago: the followers in other processes
            // poll, and would lose the race to our own retry every time. Our next attempt
            // comes after their poll, so a release hands the lock on.
            return Ok(Attempt::Delayed { until });
        }
        if let Some(item) = current {
            let holder = Leader::from_bytes(&item.value);
            self.backend.saw(&self.key, holder.fencing_token);
            return Ok(Attempt::Held {
                holder: Some(holder),
            });
        }
        let floor = self.backend.saw(&self.key, None);
        let mut fencing_token = self.next_token().await?;
        let went_back = fencing_token <= floor;
        if went_back {
            // Raised past every token this backend saw: never a smaller token.
            fencing_token = client
                .incr(&self.counter, floor + 1 - fencing_token)
                .await?
                .ok_or_else(|| Error::Store {
                    backend: NAME,
                    reason: format!("the fencing counter {} vanished", self.counter),
                })?;
        }
        let leader = Leader {
            candidate: self.candidate.clone(),
            fencing_token: None,
            since_unix_ms: Some(unix_ms_now()),
        };
        let value = value_of(&leader, fencing_token, &self.owner);
        if !client
            .add(&self.key, &value, exptime(&self.session.options))
            .await?
        {
            // Taken meanwhile; our token is skipped.
            let holder = client
                .get(&self.key)
                .await?
                .map(|item| Leader::from_bytes(&item.value));
            if let Some(holder) = &holder {
                self.backend.saw(&self.key, holder.fencing_token);
            }
            return Ok(Attempt::Held { holder });
        }
        self.backend.saw(&self.key, Some(fencing_token));
        self.value = value;
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
        if went_back {
            let until = tokio::time::Instant::now() + self.session.options.ttl;
            tracing::warn!(
                key = %self.key,
                floor,
                fencing_token,
                "memcached: the fencing counter went back (memcached restarted or evicted it); \
                 taking the lock but leading only after a ttl, when the last leader has surely \
                 stopped"
            );
            return Ok(Attempt::Delayed { until });
        }
        Ok(Attempt::Won { fencing_token })
    }

    async fn wait(&mut self) -> Result<()> {
        self.backend.pause(&mut self.wake, &mut self.poll_at).await;
        Ok(())
    }

    async fn lost(&mut self) -> LockLoss {
        crate::backend::keepalive::held_key_lost(
            self.session.keepalive_health(),
            self.loss.as_mut(),
        )
        .await
    }

    /// A vanished key whose counter is gone or below our token: memcached lost its data.
    async fn explain(&mut self, loss: LockLoss) -> LockLoss {
        if loss != LockLoss::Deleted {
            return loss;
        }
        let Some(token) = self.last else { return loss };
        match self.backend.client().get(&self.counter).await {
            Ok(item) => {
                let counter =
                    item.and_then(|i| String::from_utf8(i.value).ok()?.trim().parse::<u64>().ok());
                if counter.is_none_or(|c| c < token) {
                    tracing::warn!(
                        key = %self.key,
                        token,
                        ?counter,
                        "memcached lost the lock and its fencing counter: restarted or evicted"
                    );
                    LockLoss::SessionLost
                } else {
                    loss
                }
            }
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
        let value = value_of(leader, fencing_token, &self.owner);
        if let Some(held) = lock(&self.session.held).get_mut(&self.key) {
            held.changing = true;
        }
        let client = self.backend.client();
        let done = async {
            match client.get(&self.key).await? {
                Some(item) if item.value == self.value => Ok(client
                    .cas(
                        &self.key,
                        &value,
                        exptime(&self.session.options)
                            .try_into()
                            .unwrap_or(i64::MAX),
                        item.cas,
                    )
                    .await?
                    == Cas::Stored),
                _ => Ok(false),
            }
        }
        .await;
        if let Some(held) = lock(&self.session.held).get_mut(&self.key) {
            if matches!(done, Ok(true)) {
                held.value = value.clone();
            }
            held.changing = false;
        }
        if done? {
            self.value = value;
            Ok(())
        } else {
            Err(Error::Store {
                backend: NAME,
                reason: format!(
                    "cannot proclaim: the lock on {} is no longer held by this candidate",
                    self.key
                ),
            })
        }
    }

    async fn release(&mut self) -> Result<()> {
        if self.held.is_none() {
            return Ok(());
        }
        let released = release(&self.backend, &self.key, &self.value).await;
        self.forget();
        self.backend.courtesy_from_now(&self.key, self.handle);
        self.backend.released(&self.key);
        released
    }
}

impl Drop for MemcachedContender {
    /// Stops renewing the key: it expires within a ttl (and a second).
    fn drop(&mut self) {
        self.forget();
    }
}

/// Follows the holder of one memcached election by polling its key with jitter.
///
/// The first [`next`](Observer::next) reads the key at once; later ones poll until the
/// holder changes. An error (memcached cannot be reached) is returned as it comes.
pub struct MemcachedObserver {
    backend: MemcachedBackend,
    key: String,
    last: Option<Option<Leader>>,
    wake: watch::Receiver<u64>,
    poll_at: Option<tokio::time::Instant>,
}

impl std::fmt::Debug for MemcachedObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemcachedObserver")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl MemcachedObserver {
    pub(super) fn new(backend: MemcachedBackend, key: String) -> Self {
        let wake = backend.releases(&key);
        MemcachedObserver {
            backend,
            key,
            last: None,
            wake,
            poll_at: None,
        }
    }
}

impl Observer for MemcachedObserver {
    async fn next(&mut self) -> Result<Option<Leader>> {
        loop {
            if self.last.is_some() {
                self.backend.pause(&mut self.wake, &mut self.poll_at).await;
            }
            self.wake.borrow_and_update();
            let item = self.backend.client().get(&self.key).await?;
            let leader = item.map(|i| Leader::from_bytes(&i.value));
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
