//! One session's claim on one election's key: acquire, block until it may be free, notice loss.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::time::sleep;

use super::client::{ConsulError, KvResponse, PutOptions, QueryOptions};
use super::shared::Shared;
use super::watch::PendingRead;
use super::{ConsulBackend, NAME, WATCH_RETRY, error, holder, leader_of};
use crate::backend::{
    Attempt, Candidate, Contender, FencingToken, Leader, LockLoss, Unabandoned, unix_ms_now,
};
use crate::{Error, Result};

/// Tells the contenders of one session apart, for [`Shared::claim`].
static NEXT_CONTENDER: AtomicU64 = AtomicU64::new(0);

/// One session's claim on one Consul election: the key `<prefix><election>`.
///
/// - [`acquire`](Contender::acquire) writes our [`Leader`] to the key with `?acquire=`. On
///   success it reads the key back (consistently): its `ModifyIndex` is the fencing token.
///   The value written carries the term's start (`since_unix_ms`, the wall clock when the
///   request that makes us leader is sent), so the write that makes us leader also says
///   since when: an observer never sees our term with an earlier `since` (such as when we
///   began campaigning), nor without one.
///   Calling it again while leading returns the same token. When Consul refuses though no
///   session holds the key, a lock-delay is running: it returns
///   [`Attempt::Delayed`] with when that delay ends (see the [module docs](super)).
/// - [`wait`](Contender::wait) blocks on the key (a blocking query from the index of the last
///   read) until its `Session` clears. Behind another contender of the same session (another
///   campaign of the same election), it waits for that contender to give up its claim, a
///   local wake-up: see the [module docs](super).
/// - [`lost`](Contender::lost) blocks on the key with consistent reads while leading, and
///   resolves as soon as a read shows the lock gone: [`LockLoss::Deleted`] for a missing key,
///   [`LockLoss::SessionLost`] for a key without a session, [`LockLoss::Taken`] for a key
///   held by another session. [`explain`](Contender::explain) then asks Consul whether our
///   session still exists: a key deleted, released or taken over whose session is gone is a
///   lost session (with no lock-delay another candidate may have the lock by the time we
///   read the key), and a key released while our session lives was released by someone else
///   (`Taken`).
/// - [`release`](Contender::release) releases the lock with `?release=`; a lock we do not
///   hold is left alone. The contenders of the session handle that released it (the
///   resigning campaign's) then leave the free lock alone for
///   [`PUSH_COURTESY`](crate::backend::PUSH_COURTESY) ([`Attempt::Delayed`]): followers in
///   other processes learn of the release through their blocking query, later than the
///   releasing campaign's own retry would come. Every other campaign may take it at once.
pub struct ConsulContender {
    backend: ConsulBackend,
    session: Arc<Shared>,
    /// The session handle (the campaign) it came from: see `release`.
    handle: u64,
    /// This contender, among those of its session.
    id: u64,
    key: String,
    candidate: Candidate,
    /// The value of our last acquisition; written again on release, so the key keeps
    /// saying who led last.
    value: Vec<u8>,
    /// The fencing token while we hold the lock.
    held: Option<FencingToken>,
    /// The index of the last read of the key: blocking queries wait for a later one.
    index: u64,
    /// The blocking read of `wait` or `lost` in flight, kept when their future is dropped.
    pending: PendingRead,
    /// Consecutive failed reads in [`lost`](Contender::lost), for its back-off.
    watch_failures: u32,
    /// The holder that a read in [`wait`](Contender::wait) showed and `wait` has not acted on
    /// yet (it waits behind another contender of our session first), kept here so that
    /// dropping its future loses nothing: the index has moved past that read.
    seen: Option<Option<String>>,
    /// The last `?acquire=` write, which runs to its answer even if its caller is dropped.
    writing: Unabandoned<std::result::Result<bool, ConsulError>>,
}

impl std::fmt::Debug for ConsulContender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsulContender")
            .field("key", &self.key)
            .field("session", &self.session.id)
            .field("held", &self.held)
            .field("index", &self.index)
            .finish_non_exhaustive()
    }
}

impl ConsulContender {
    pub(super) fn new(
        backend: ConsulBackend,
        session: Arc<Shared>,
        handle: u64,
        key: String,
        candidate: Candidate,
    ) -> Self {
        ConsulContender {
            backend,
            session,
            handle,
            id: NEXT_CONTENDER.fetch_add(1, Ordering::Relaxed),
            key,
            candidate,
            value: Vec::new(),
            held: None,
            index: 0,
            pending: PendingRead::default(),
            watch_failures: 0,
            seen: None,
            writing: Unabandoned::new(),
        }
    }

    /// Reads the key, at once.
    async fn read(&self, consistent: bool) -> Result<KvResponse> {
        let options = QueryOptions {
            consistent,
            ..QueryOptions::default()
        };
        self.backend
            .client()
            .kv_get(&self.key, &options)
            .await
            .map_err(error::from_client)
    }

    /// Reads the key once its index passes the last one seen (or [`BLOCKING_WAIT`] passes);
    /// at once when no index is known.
    ///
    /// [`BLOCKING_WAIT`]: super::BLOCKING_WAIT
    async fn read_after_change(&mut self, consistent: bool) -> Result<KvResponse, ConsulError> {
        self.pending
            .read_after(
                self.backend.sightings().reads(),
                self.backend.client(),
                &self.key,
                self.index,
                consistent,
            )
            .await
    }

    /// `PUT ?acquire=`: Consul's verdict.
    ///
    /// The write runs to its answer even if this future is dropped (see [`Unabandoned`]):
    /// Consul serves a client's requests concurrently, and an acquire still on its way could
    /// otherwise land after the release that follows it.
    async fn put_acquire(&mut self, value: Vec<u8>) -> Result<bool> {
        let options = PutOptions {
            acquire: Some(self.session.id.clone()),
            ..PutOptions::default()
        };
        let (backend, key) = (self.backend.clone(), self.key.clone());
        self.writing
            .run(async move { backend.client().kv_put(&key, &value, &options).await })
            .await
            .map_err(|e| Error::Store {
                backend: NAME,
                reason: format!("the acquire request failed: {e}"),
            })?
            .map_err(error::from_client)
    }

    /// `PUT ?acquire=` of our [`Leader`] with the term's start as of now: the value the key
    /// holds from the instant we lead, kept to be written again on release.
    async fn put_acquire_now(&mut self) -> Result<bool> {
        self.value = Leader {
            candidate: self.candidate.clone(),
            fencing_token: None,
            since_unix_ms: Some(unix_ms_now()),
        }
        .to_bytes();
        self.put_acquire(self.value.clone()).await
    }

    /// After a successful acquisition: reads the key back, and takes its modify index as the
    /// fencing token.
    async fn confirm(&mut self) -> Result<Attempt> {
        let read = self.read(true).await?;
        self.index = read.index;
        match read.entry {
            Some(entry) if entry.session.as_deref() == Some(self.session.id.as_str()) => {
                let fencing_token = entry.modify_index;
                self.held = Some(fencing_token);
                self.watch_failures = 0;
                self.backend
                    .sightings()
                    .ours(&self.key, &self.session.id, self.session.lock_delay);
                Ok(Attempt::Won { fencing_token })
            }
            entry => {
                self.session.unclaim(&self.key, self.id);
                Err(Error::Store {
                    backend: NAME,
                    reason: format!(
                        "the lock on {} was gone right after it was acquired (now held by {}); trying again",
                        self.key,
                        holder(entry.as_ref()).unwrap_or("nobody")
                    ),
                })
            }
        }
    }

    /// Reads the lock-delay of a holder we have not seen before.
    async fn learn(&self, session: &str) {
        if !self.backend.sightings().holder(&self.key, session) {
            return;
        }
        match self.backend.client().session_info(session).await {
            Ok(Some(info)) => self
                .backend
                .sightings()
                .learn(&self.key, session, info.lock_delay),
            // Already gone: its lock goes soon, and its delay stays unknown.
            Ok(None) => {}
            Err(error) => tracing::debug!(%error, "could not read the lock holder's session"),
        }
    }
}

impl Contender for ConsulContender {
    async fn acquire(&mut self) -> Result<Attempt> {
        self.seen = None;
        let ours = self.session.id.clone();
        if let Some(fencing_token) = self.held {
            let read = self.read(true).await?;
            self.index = read.index;
            if holder(read.entry.as_ref()) == Some(ours.as_str()) {
                return Ok(Attempt::Won { fencing_token });
            }
            self.held = None;
            self.session.unclaim(&self.key, self.id);
        }
        if let Some(until) = self.backend.sightings().courtesy(&self.key, self.handle) {
            // Our campaign released the lock a moment ago: the followers in other processes
            // learn of it later than its own retry would come.
            return Ok(Attempt::Delayed { until });
        }
        if !self.session.claim(&self.key, self.id) {
            // Another campaign of this election on the same session holds or tries the key.
            let read = self.read(false).await?;
            self.index = read.index;
            return Ok(Attempt::Held {
                holder: read
                    .entry
                    .as_ref()
                    .filter(|e| e.session.is_some())
                    .map(leader_of),
            });
        }
        // On an error the write may still have gone through: the claim stays, so that a
        // release frees the key.
        if self.put_acquire_now().await? {
            return self.confirm().await;
        }
        let read = match self.read(false).await {
            Ok(read) => read,
            Err(e) => {
                self.session.unclaim(&self.key, self.id);
                return Err(e);
            }
        };
        self.index = read.index;
        match holder(read.entry.as_ref()) {
            Some(session) if session == ours => self.confirm().await,
            Some(session) => {
                self.session.unclaim(&self.key, self.id);
                self.learn(session).await;
                Ok(Attempt::Held {
                    holder: read.entry.as_ref().map(leader_of),
                })
            }
            None => {
                // Nobody holds the key, yet Consul refused: a lock-delay runs, or the holder
                // left between the two requests. One more try tells them apart.
                if self.put_acquire_now().await? {
                    return self.confirm().await;
                }
                self.session.unclaim(&self.key, self.id);
                Ok(Attempt::Delayed {
                    until: self.backend.sightings().delayed_until(&self.key),
                })
            }
        }
    }

    /// Moves the lock from the holder's session to ours in one transaction, only while the
    /// key still holds the value that names this candidate as the target of a hand-over
    /// (its modify index unchanged); the new term's token is the key's new modify index.
    async fn take_over(&mut self, _holder: &Leader) -> Result<Attempt> {
        if self.held.is_some() || !self.session.claim(&self.key, self.id) {
            return self.acquire().await;
        }
        let read = match self.read(true).await {
            Ok(read) => read,
            Err(e) => {
                self.session.unclaim(&self.key, self.id);
                return Err(e);
            }
        };
        self.index = read.index;
        let escrow = read.entry.as_ref().filter(|entry| {
            Leader::from_bytes(&entry.value)
                .handing_over()
                .is_some_and(|h| h.to == self.candidate.id)
        });
        let (Some(entry), Some(from)) = (escrow, escrow.and_then(|e| e.session.clone())) else {
            self.session.unclaim(&self.key, self.id);
            return self.acquire().await;
        };
        self.value = Leader {
            candidate: self.candidate.clone(),
            fencing_token: None,
            since_unix_ms: Some(unix_ms_now()),
        }
        .to_bytes();
        let moved = self
            .backend
            .client()
            .kv_move_lock(
                &self.key,
                entry.modify_index,
                &from,
                &self.session.id,
                &self.value,
            )
            .await
            .map_err(error::from_client);
        match moved {
            Ok(true) => self.confirm().await,
            Ok(false) => {
                self.session.unclaim(&self.key, self.id);
                self.acquire().await
            }
            Err(e) => {
                // The transaction may have gone through: the claim stays, so that a release
                // frees the key.
                Err(e)
            }
        }
    }

    async fn wait(&mut self) -> Result<()> {
        loop {
            // Subscribed before the claim is checked, so that no unclaim goes unseen.
            let mut unclaims = self.session.unclaims();
            let behind = self.session.claimed_by_other(&self.key, self.id);
            if !behind && let Some(seen) = self.seen.take() {
                match seen {
                    None => {
                        self.backend.sightings().cleared(&self.key);
                        return Ok(());
                    }
                    // Ours, and no contender of ours claims it: left by a contender that
                    // could not release it.
                    Some(session) if session == self.session.id => return Ok(()),
                    Some(session) => self.learn(&session).await,
                }
            }
            let read = tokio::select! {
                // Behind our own session's other contender, which holds or tries for the
                // lock: only its unclaim lets us in, a local wake-up. The blocking read goes
                // on meanwhile (it outlives this future), so that the key's state is known
                // when the unclaim comes; if no read came back since, one read at once (an
                // unclaim without a release, by a contender dropped while holding the lock,
                // changes nothing in Consul).
                _ = unclaims.changed(), if behind => {
                    if self.seen.is_none() {
                        self.index = 0;
                    }
                    continue;
                }
                read = self.read_after_change(false) => read,
            };
            let read = match read {
                Ok(read) => read,
                Err(e) => {
                    // Start from a fresh read next time: the agent may have restarted empty,
                    // and a blocking query with an index it has not reached waits for nothing.
                    self.index = 0;
                    return Err(error::from_client(e));
                }
            };
            let went_back = read.index < self.index;
            self.index = read.index;
            if went_back {
                // A restored or restarted cluster: look again from the start.
                return Ok(());
            }
            self.seen = Some(holder(read.entry.as_ref()).map(str::to_owned));
        }
    }

    async fn lost(&mut self) -> LockLoss {
        loop {
            if self.watch_failures > 0 {
                sleep(WATCH_RETRY.delay(self.watch_failures - 1)).await;
            }
            let read = match self.read_after_change(true).await {
                Ok(read) => read,
                Err(error) => {
                    tracing::debug!(%error, "watching the lock failed; retrying");
                    self.watch_failures = self.watch_failures.saturating_add(1);
                    self.index = 0;
                    continue;
                }
            };
            self.watch_failures = 0;
            self.index = read.index;
            // Reported at once, with no question to Consul in between: see `explain`.
            match read.entry {
                None => return LockLoss::Deleted,
                Some(entry) => match entry.session {
                    Some(session) if session == self.session.id => {}
                    Some(_) => return LockLoss::Taken,
                    None => {
                        // Most likely our session was invalidated: its lock-delay runs from
                        // now at the latest (a local note, for the next acquisition).
                        self.backend.sightings().cleared(&self.key);
                        return LockLoss::SessionLost;
                    }
                },
            }
        }
    }

    /// Whether our session still exists tells an invalidated session from an operator's
    /// delete or release.
    async fn explain(&mut self, loss: LockLoss) -> LockLoss {
        // A key held by another session is asked about too: with no lock-delay, another
        // candidate can take the lock that our invalidated session let go before our read
        // sees the key, which then shows the other's session, not none.
        let gone = match self.backend.client().session_info(&self.session.id).await {
            Ok(info) => info.is_none(),
            Err(error) => {
                tracing::debug!(%error, "could not read our own session after losing the lock");
                return loss;
            }
        };
        let loss = match (loss, gone) {
            (_, true) => LockLoss::SessionLost,
            // The key was deleted, by an operator: our session lives.
            (LockLoss::Deleted, false) => LockLoss::Deleted,
            // Someone else released our lock (`?release=` with our session id).
            (_, false) => LockLoss::Taken,
        };
        if loss == LockLoss::SessionLost {
            self.backend.sightings().ours_invalidated(
                &self.key,
                &self.session.id,
                self.session.lock_delay,
            );
        }
        loss
    }

    async fn proclaim(&mut self, leader: &Leader) -> Result<()> {
        let Some(fencing_token) = self.held else {
            return Err(Error::Store {
                backend: NAME,
                reason: "cannot proclaim: this candidate does not hold the lock".into(),
            });
        };
        let value = Leader {
            fencing_token: Some(fencing_token),
            ..leader.clone()
        }
        .to_bytes();
        if !self.put_acquire(value.clone()).await? {
            return Err(Error::Store {
                backend: NAME,
                reason: format!(
                    "cannot proclaim: the lock on {} is no longer held by this session",
                    self.key
                ),
            });
        }
        self.value = value;
        Ok(())
    }

    async fn release(&mut self) -> Result<()> {
        // An acquire whose caller was dropped may still be on its way: release after it.
        self.writing.settle().await;
        if !self.session.claimed_by(&self.key, self.id) {
            self.held = None;
            return Ok(());
        }
        let options = PutOptions {
            release: Some(self.session.id.clone()),
            ..PutOptions::default()
        };
        match self
            .backend
            .client()
            .kv_put(&self.key, &self.value, &options)
            .await
        {
            Ok(true) => self.backend.sightings().released(&self.key, self.handle),
            Ok(false) | Err(ConsulError::InvalidSession { .. }) => {
                // Not ours any more. If it was, our session may be gone: remember when, for
                // the lock-delay our next attempt will meet.
                if self.held.is_some()
                    && matches!(
                        self.backend.client().session_info(&self.session.id).await,
                        Ok(None)
                    )
                {
                    self.backend.sightings().ours_invalidated(
                        &self.key,
                        &self.session.id,
                        self.session.lock_delay,
                    );
                }
            }
            Err(e) => return Err(error::from_client(e)),
        }
        self.held = None;
        self.session.unclaim(&self.key, self.id);
        Ok(())
    }
}

impl Drop for ConsulContender {
    fn drop(&mut self) {
        self.session.unclaim(&self.key, self.id);
    }
}
