//! One session's claim on one election's key, and observers of the key.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::watch;
use tokio::time::Instant;

use super::session::{Held, Shared};
use super::{Acquired, Claim, KeyState, PolledBackend, Renewing, Store, checked_token};
use crate::backend::{
    Attempt, Candidate, Contender, FencingToken, Leader, LockLoss, Observer, lock, unix_ms_now,
};
use crate::{Error, Result};

/// Tells the contenders of one process apart, in owner ids.
static NEXT_CONTENDER: AtomicU64 = AtomicU64::new(0);

/// The stored value around the token: the JSON object of `leader` (without a token) with
/// the owner added, split where `"fencing_token":<token>` goes in.
fn value_parts(leader: &Leader, owner: &str) -> (Vec<u8>, Vec<u8>) {
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
    (VALUE_PREFIX.to_vec(), format!(",{inner}").into_bytes())
}

/// `before`, `token`, `after`: a stored value.
fn value_with(before: &[u8], token: FencingToken, after: &[u8]) -> Vec<u8> {
    [before, token.to_string().as_bytes(), after].concat()
}

/// One session's claim on one election: the key `<prefix><election>`.
///
/// - [`acquire`](Contender::acquire) takes the key while it is absent, with a new token from
///   the election's counter (raised first to the highest token this backend saw, so tokens
///   grow even when the store lost its data; then the lock is led only a ttl later,
///   [`Attempt::Delayed`], when the last leader has surely noticed its loss). Calling it
///   again while leading returns the same token, after checking the key is still ours.
/// - [`wait`](Contender::wait) returns on a change the store pushed (Redis keyspace
///   notifications), a release of the key in this backend, an observer of this backend
///   finding the key free (the campaign's own observer polls too), or after the jittered
///   poll.
/// - [`lost`](Contender::lost) resolves when the session's renewal finds the key gone
///   ([`LockLoss::Deleted`]) or another's ([`LockLoss::Taken`]), or when the session is lost.
///   [`explain`](Contender::explain) tells a vanished key from a store that lost its data
///   (the counter gone or below our token).
/// - [`release`](Contender::release) deletes the key if it still holds our value, and wakes
///   this backend's followers of it. The contenders of the session handle that released it
///   (the resigning campaign's) then leave the free key alone ([`Attempt::Delayed`]) for
///   [`COURTESY_POLLS`](super::COURTESY_POLLS) poll intervals while followers poll, for
///   [`PUSH_COURTESY`](super::PUSH_COURTESY) while the store pushes: followers in other
///   processes learn of the release later than the releasing campaign, and without it a
///   resigning leader's campaign would win its own lock back every time it polls, and
///   whenever the push is slow. Every other campaign, in this process too, may take it at
///   once.
pub struct PolledContender<S: Store> {
    session: Arc<Shared<S>>,
    key: String,
    counter: String,
    candidate: Candidate,
    /// `<session id>/<contender>`: written into the value, so that no two contenders (even
    /// of one session) ever hold the same value.
    owner: String,
    /// The session handle (one per campaign) this contender came from.
    handle: u64,
    /// Our current value while we hold the key.
    value: Vec<u8>,
    /// The fencing token while we hold the lock.
    held: Option<FencingToken>,
    /// The token of the last term, for `explain`.
    last: Option<FencingToken>,
    /// Told by the session's renewal when the key is lost.
    loss: Option<watch::Receiver<Option<LockLoss>>>,
    /// Changes of the key the store pushes, where it does.
    pushed: Option<watch::Receiver<u64>>,
    /// Releases of the key by this backend's contenders.
    local: watch::Receiver<u64>,
    /// The key read free by this backend's observers.
    freed: watch::Receiver<u64>,
    /// When the pending poll of `wait` is due.
    poll_at: Option<Instant>,
    /// Set while an acquire is unanswered, and left set when its answer was lost: the key
    /// may be ours then, and `release` looks.
    uncertain: bool,
}

impl<S: Store> std::fmt::Debug for PolledContender<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolledContender")
            .field("store", &S::NAME)
            .field("key", &self.key)
            .field("owner", &self.owner)
            .field("held", &self.held)
            .finish_non_exhaustive()
    }
}

impl<S: Store> PolledContender<S> {
    pub(super) fn new(
        session: Arc<Shared<S>>,
        election: &str,
        candidate: Candidate,
        handle: u64,
    ) -> Self {
        let backend = &session.backend;
        let (key, counter) = (backend.key(election), backend.counter_key(election));
        let owner = format!(
            "{}/{}",
            session.id,
            NEXT_CONTENDER.fetch_add(1, Ordering::Relaxed)
        );
        let pushed = backend.store().subscribe(&key);
        let local = backend.releases(&key);
        let freed = backend.frees(&key);
        PolledContender {
            session,
            key,
            counter,
            candidate,
            owner,
            handle,
            value: Vec::new(),
            held: None,
            last: None,
            loss: None,
            pushed,
            local,
            freed,
            poll_at: None,
            uncertain: false,
        }
    }

    fn backend(&self) -> &PolledBackend<S> {
        &self.session.backend
    }

    /// Stops renewing our key (if the session still does), without telling a loss.
    fn forget(&mut self) {
        let mut held = lock(&self.session.held);
        if held
            .keys
            .get(&self.key)
            .is_some_and(|h| h.value == self.value)
        {
            held.keys.remove(&self.key);
        }
        drop(held);
        self.held = None;
        self.loss = None;
    }

    /// Our value of the key as the session renews it: the renewal makes a lost proclaim's
    /// value ours once it finds it in the store. With the pending value, if any.
    fn current(&mut self) -> (Vec<u8>, Option<Vec<u8>>) {
        if let Some(held) = lock(&self.session.held).keys.get(&self.key) {
            self.value.clone_from(&held.value);
            return (held.value.clone(), held.pending.clone());
        }
        (self.value.clone(), None)
    }

    fn not_held(&self, what: &str) -> Error {
        Error::Store {
            backend: S::NAME,
            reason: format!(
                "cannot {what}: the lock on {} is not held by this candidate",
                self.key
            ),
        }
    }

    /// The term begins on `value` (the key's value, with `token`): the session renews the
    /// key from now on. `sent`: when the request that wrote it was sent, `None` when not
    /// known (a lost answer's key, found later).
    ///
    /// A renewal that listed the session's keys after `sent` but before the key was
    /// registered here did not restart it, yet its confirmation moves the session's
    /// deadlines past the key's own expiry: then (and for a found key) the key is renewed
    /// once more, alone, before the term may begin, so that `stop_by` is never later than
    /// the key's real expiry.
    async fn take(
        &mut self,
        value: Vec<u8>,
        token: FencingToken,
        went_back: bool,
        sent: Option<Instant>,
    ) -> Result<Attempt> {
        let floor = self.backend().saw(&self.key, Some(token));
        self.backend().read_by_contender(&self.key, &value);
        let (loss, lost) = watch::channel(None);
        let listed_since = {
            let mut held = lock(&self.session.held);
            held.keys.insert(
                self.key.clone(),
                Held {
                    value: value.clone(),
                    pending: None,
                    loss,
                },
            );
            match (sent, held.listed_at) {
                (Some(sent), Some(listed)) => listed > sent,
                (Some(_), None) => false,
                (None, _) => true,
            }
        };
        self.value = value;
        self.held = Some(token);
        self.last = Some(token);
        self.loss = Some(lost);
        if listed_since {
            let renewing = [Renewing {
                key: self.key.clone(),
                value: self.value.clone(),
                pending: None,
            }];
            let ttl = self.session.options.ttl;
            let renewed = self.backend().store().renew(&renewing, ttl).await;
            match renewed.as_deref() {
                Ok([KeyState::Renewed]) => {}
                Ok(_) => {
                    self.forget();
                    return Ok(Attempt::Held { holder: None });
                }
                Err(_) => {
                    // Ours, but not confirmed: the next acquire finds it ours again.
                    self.forget();
                    return renewed.map(|_| Attempt::Held { holder: None });
                }
            }
        }
        if went_back {
            // The counter went back: the store lost its data (a restart, a failover, an
            // eviction), so the last leader may not know yet that its key is gone. It stops
            // within its renew deadline, which is shorter than the ttl: we hold the key (and
            // renew it) but lead only a ttl from now. The next `acquire` finds the key ours.
            let until = Instant::now() + self.session.options.ttl;
            tracing::warn!(
                store = S::NAME,
                key = %self.key,
                floor,
                fencing_token = token,
                "the fencing counter went back (the store lost its data); taking the lock \
                 but leading only after a ttl, when the last leader has surely stopped"
            );
            return Ok(Attempt::Delayed { until });
        }
        Ok(Attempt::Won {
            fencing_token: token,
        })
    }

    /// The holder's value `value` is ours: written by an acquire of this contender whose
    /// answer was lost (a timeout, a frozen server that thawed). The term begins on it, once
    /// the store confirmed no greater token was handed out meanwhile, and the key was renewed.
    async fn adopt(&mut self, value: Vec<u8>) -> Result<Attempt> {
        let Some((token, after)) = split_value(&value) else {
            return Err(self.corrupt(&value));
        };
        let token = checked_token(S::NAME, &self.key, token)?;
        let claim = Claim {
            key: &self.key,
            counter: &self.counter,
            before: VALUE_PREFIX,
            after,
            ttl: self.session.options.ttl,
            floor: 0,
            escrow: None,
        };
        let store = self.session.backend.store();
        let Some(settled) = store.settle(claim, token).await? else {
            return Ok(Attempt::Held { holder: None });
        };
        let value = value_with(VALUE_PREFIX, settled, after);
        tracing::info!(store = S::NAME, key = %self.key, fencing_token = settled, "found the lock ours after an acquire whose answer was lost; taking it");
        self.take(value, settled, false, None).await
    }

    fn corrupt(&self, value: &[u8]) -> Error {
        Error::Store {
            backend: S::NAME,
            reason: format!(
                "{} holds {:?}, which names this candidate's owner id but is not a value \
                 incumbent writes: a corrupt or hostile value (delete the key)",
                self.key,
                String::from_utf8_lossy(value)
            ),
        }
    }
}

/// How long a release after an uncertain acquisition waits before it reads the key a second
/// time: long enough for a write sent just before to have been applied.
const UNCERTAIN_RECHECK: std::time::Duration = std::time::Duration::from_millis(20);

/// How long after the store's expiry of a holder's lease a follower tries again: enough for
/// the expiry to have passed on the store's clock too, never a hot loop.
const EXPIRY_MARGIN: std::time::Duration = std::time::Duration::from_millis(5);

impl<S: Store> PolledContender<S> {
    /// [`acquire`](Contender::acquire), taking the key also while it holds `escrow`.
    ///
    /// From the first write until the outcome is known and kept (the key won and its token
    /// settled, or seen held by another), the key may be ours without our knowing: an
    /// error, or the future dropped (a campaign shut down as it began), leaves `uncertain`
    /// set, and [`release`](Contender::release) then reads the key and frees it if it is ours.
    async fn acquire_or_take_over(&mut self, escrow: Option<Vec<u8>>) -> Result<Attempt> {
        self.uncertain = true;
        let attempt = self.try_acquire(escrow).await;
        if attempt.is_ok() {
            self.uncertain = false;
        }
        attempt
    }

    async fn try_acquire(&mut self, escrow: Option<Vec<u8>>) -> Result<Attempt> {
        // Changes from now on wake `wait`.
        if let Some(pushed) = &mut self.pushed {
            pushed.borrow_and_update();
        }
        self.local.borrow_and_update();
        self.freed.borrow_and_update();
        let session = self.session.clone();
        let store = session.backend.store();
        if let Some(fencing_token) = self.held {
            let (value, pending) = self.current();
            let now = store.read(&self.key).await?;
            if now
                .as_ref()
                .is_some_and(|v| *v == value || Some(v) == pending.as_ref())
            {
                return Ok(Attempt::Won { fencing_token });
            }
            self.forget();
        }
        if let Some(until) = self
            .backend()
            .courtesy(&self.key, self.handle)
            .filter(|_| escrow.is_none())
        {
            // Our campaign released the lock a moment ago and followers poll: those in other
            // processes would lose the race to our own retry every time.
            return Ok(Attempt::Delayed { until });
        }
        let leader = Leader {
            candidate: self.candidate.clone(),
            fencing_token: None,
            since_unix_ms: Some(unix_ms_now()),
        };
        let (before, after) = value_parts(&leader, &self.owner);
        let floor = self.backend().saw(&self.key, None);
        let claim = Claim {
            key: &self.key,
            counter: &self.counter,
            before: &before,
            after: &after,
            ttl: self.session.options.ttl,
            floor,
            escrow: escrow.as_deref(),
        };
        let sent = Instant::now();
        let acquired = store.acquire(claim).await?;
        let (token, went_back) = match acquired {
            Acquired::Won { token, went_back } => (token, went_back),
            Acquired::Held {
                value: Some(value), ..
            } if owner_of(&value).is_some_and(|owner| owner == self.owner) => {
                return self.adopt(value).await;
            }
            Acquired::Held {
                value: holder,
                expires_in,
            } => {
                if let Some(left) = expires_in {
                    // Try again right after the holder's lease runs out (if it is not
                    // renewed meanwhile), or at the next poll, whichever comes first.
                    let due = Instant::now() + left + EXPIRY_MARGIN;
                    let poll = self.poll_at.unwrap_or_else(|| self.backend().next_poll());
                    self.poll_at = Some(poll.min(due));
                }
                if let Some(value) = &holder {
                    self.backend().read_by_contender(&self.key, value);
                }
                let holder = holder.map(|value| Leader::from_bytes(&value));
                if let Some(holder) = &holder {
                    self.backend().saw(&self.key, holder.fencing_token);
                }
                return Ok(Attempt::Held { holder });
            }
        };
        let token = checked_token(S::NAME, &self.counter, token)?;
        let Some(token) = store.settle(claim, token).await? else {
            return Ok(Attempt::Held { holder: None });
        };
        let token = checked_token(S::NAME, &self.counter, token)?;
        self.take(
            value_with(&before, token, &after),
            token,
            went_back,
            Some(sent),
        )
        .await
    }
}

/// What every value starts with: the token comes first.
const VALUE_PREFIX: &[u8] = b"{\"fencing_token\":";

/// A value this crate wrote, split: its token, and what follows the token.
fn split_value(value: &[u8]) -> Option<(u64, &[u8])> {
    let rest = value.strip_prefix(VALUE_PREFIX)?;
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    let token = std::str::from_utf8(&rest[..digits]).ok()?.parse().ok()?;
    Some((token, &rest[digits..]))
}

/// The owner id in a stored value, if it is a value this crate wrote.
fn owner_of(value: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Owned {
        owner: String,
    }
    serde_json::from_slice::<Owned>(value).ok().map(|o| o.owner)
}

impl<S: Store> Contender for PolledContender<S> {
    async fn acquire(&mut self) -> Result<Attempt> {
        self.acquire_or_take_over(None).await
    }

    /// Reads the key: while it still holds a leader's value that names this candidate as
    /// the target of a hand-over, takes it in one conditional write of exactly those bytes.
    async fn take_over(&mut self, _holder: &Leader) -> Result<Attempt> {
        let store = self.session.backend.store();
        let escrow = store.read(&self.key).await?.filter(|value| {
            Leader::from_bytes(value)
                .handing_over()
                .is_some_and(|h| h.to == self.candidate.id)
        });
        self.acquire_or_take_over(escrow).await
    }

    async fn wait(&mut self) -> Result<()> {
        let backend = self.session.backend.clone();
        backend
            .pause(
                &mut self.pushed,
                &mut self.local,
                Some(&mut self.freed),
                &mut self.poll_at,
            )
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

    /// A vanished key whose counter is gone or below our token: the store lost its data.
    async fn explain(&mut self, loss: LockLoss) -> LockLoss {
        if loss != LockLoss::Deleted {
            return loss;
        }
        let Some(token) = self.last else { return loss };
        match self.backend().store().counter(&self.counter).await {
            Ok(counter) if counter.is_none_or(|c| c < token) => {
                tracing::warn!(
                    store = S::NAME,
                    key = %self.key,
                    token,
                    ?counter,
                    "the store lost the lock and its fencing counter: restarted without \
                     persistence, failed over to a replica that lacked them, flushed or evicted"
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

    /// Replaces the value. While the store has not answered, and after an answer that was
    /// lost, the renewal accepts the old value and the new one alike (the request may still
    /// execute), and takes the new one as ours once it finds it: a late proclaim is never
    /// mistaken for the lock being taken.
    async fn proclaim(&mut self, leader: &Leader) -> Result<()> {
        let Some(fencing_token) = self.held else {
            return Err(self.not_held("proclaim"));
        };
        let (before, after) = value_parts(leader, &self.owner);
        let value = value_with(&before, fencing_token, &after);
        let (ours, _) = self.current();
        if let Some(held) = lock(&self.session.held).keys.get_mut(&self.key) {
            held.pending = Some(value.clone());
        }
        let ttl = self.session.options.ttl;
        let done = self
            .backend()
            .store()
            .replace(&self.key, &ours, &value, ttl)
            .await;
        if let Some(held) = lock(&self.session.held).keys.get_mut(&self.key) {
            match done {
                Ok(true) => {
                    held.value.clone_from(&value);
                    held.pending = None;
                }
                // Not ours any more: the renewal tells the loss.
                Ok(false) => held.pending = None,
                // It may still execute: both values stay ours.
                Err(_) => {}
            }
        }
        if !done? {
            return Err(self.not_held("proclaim"));
        }
        self.value = value;
        Ok(())
    }

    async fn release(&mut self) -> Result<()> {
        let session = self.session.clone();
        let store = session.backend.store();
        if self.held.is_none() {
            if !std::mem::take(&mut self.uncertain) {
                return Ok(());
            }
            // An acquire's answer was lost, or the acquire was dropped with a write in
            // flight: the key may be ours without our knowing.
            if self.release_what_is_ours().await? {
                self.backend().released(&self.key, self.handle);
            }
            return Ok(());
        }
        let (value, pending) = self.current();
        self.forget();
        let mut released = store.release(&self.key, &value).await;
        if let Some(pending) = pending {
            released = released.and(store.release(&self.key, &pending).await);
            // The replace that was to write `pending` (a proclaim, the mark of a term's
            // start) went unanswered, its request dropped: it may still land, after both
            // releases, on a store that serves it on another connection (PostgreSQL's pool),
            // and hold the key for a ttl. So the key is read again, as after a lost acquire.
            if released.is_ok() {
                released = self.release_what_is_ours().await.map(drop);
            }
        }
        self.backend().released(&self.key, self.handle);
        released
    }
}

impl<S: Store> PolledContender<S> {
    /// Releases whatever value of ours the key holds, found by reading it. Where the store
    /// could apply a write of ours after a read sent now, that write's answer is awaited
    /// first. A write still on its way may land after a first read, so a read that finds
    /// nothing of ours is made once more after a pause. A write that lands later still
    /// holds the key only until its expiry, one ttl: nobody renews it. Whether it found (and
    /// released) one.
    async fn release_what_is_ours(&self) -> Result<bool> {
        let store = self.session.backend.store();
        store.writes_settled(&self.key).await;
        for pass in 0..2 {
            if pass == 1 {
                tokio::time::sleep(UNCERTAIN_RECHECK).await;
            }
            match store.read(&self.key).await? {
                Some(value) if owner_of(&value).is_some_and(|owner| owner == self.owner) => {
                    store.release(&self.key, &value).await?;
                    return Ok(true);
                }
                _ => {}
            }
        }
        Ok(false)
    }
}

impl<S: Store> Drop for PolledContender<S> {
    /// Stops renewing the key: it expires within a ttl.
    fn drop(&mut self) {
        self.forget();
    }
}

/// Follows the holder of one election: the key's value while it exists, `None` while it
/// does not.
///
/// The first [`next`](Observer::next) reads the key at once; later ones read it again at
/// each change the store pushes, release in this backend or jittered poll, and return when
/// the holder changed. While a contender of the same backend polls the key (a follower's
/// campaign: its observer and its contender), the observer takes the contender's reads as
/// its own and sends none: one request per poll per process. An error (the store cannot be
/// reached) is returned as it comes.
pub struct PolledObserver<S: Store> {
    backend: PolledBackend<S>,
    key: String,
    /// The holder last reported; `None` before the first report.
    last: Option<Option<Leader>>,
    pushed: Option<watch::Receiver<u64>>,
    local: watch::Receiver<u64>,
    /// The reads of the key by this backend's contenders.
    reads: watch::Receiver<Option<Vec<u8>>>,
    poll_at: Option<Instant>,
}

impl<S: Store> std::fmt::Debug for PolledObserver<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolledObserver")
            .field("store", &S::NAME)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl<S: Store> PolledObserver<S> {
    pub(super) fn new(backend: PolledBackend<S>, key: String) -> Self {
        let pushed = backend.store().subscribe(&key);
        let local = backend.releases(&key);
        let reads = backend.reads(&key);
        PolledObserver {
            backend,
            key,
            last: None,
            pushed,
            local,
            reads,
            poll_at: None,
        }
    }

    /// The next value of the key: a contender's read of it, or (at this observer's own
    /// poll, a push or a release) its own. A contender's read postpones the own poll past
    /// the contender's next one (which comes within 1.25 poll intervals).
    async fn next_value(&mut self) -> Result<Option<Vec<u8>>> {
        if self.last.is_some() {
            let PolledObserver {
                backend,
                pushed,
                local,
                reads,
                poll_at,
                ..
            } = self;
            let own_poll = backend.pause(pushed, local, None, poll_at);
            tokio::select! {
                biased;
                Ok(()) = reads.changed() => {
                    let poll = self.backend.inner.poll;
                    self.poll_at = Some(Instant::now() + poll.mul_f64(1.5 + fastrand::f64() * 0.5));
                    return Ok(self.reads.borrow_and_update().clone());
                }
                () = own_poll => {}
            }
        }
        if let Some(pushed) = &mut self.pushed {
            pushed.borrow_and_update();
        }
        self.local.borrow_and_update();
        self.reads.borrow_and_update();
        let Some((value, left)) = self.backend.store().read_expiring(&self.key).await? else {
            return Ok(None);
        };
        if let Some(left) = left {
            // Read again right after the holder's lease runs out, if that comes before the
            // next poll: a holder that died is seen gone at its expiry.
            let due = Instant::now() + left + EXPIRY_MARGIN;
            let poll = self.poll_at.unwrap_or_else(|| self.backend.next_poll());
            self.poll_at = Some(poll.min(due));
        }
        Ok(Some(value))
    }
}

impl<S: Store> Observer for PolledObserver<S> {
    async fn next(&mut self) -> Result<Option<Leader>> {
        loop {
            let value = self.next_value().await?;
            let leader = value.map(|v| Leader::from_bytes(&v));
            if let Some(leader) = &leader {
                self.backend.saw(&self.key, leader.fencing_token);
            }
            if self.last.as_ref() != Some(&leader) {
                if leader.is_none() && self.last.is_some() {
                    self.backend.freed(&self.key);
                }
                self.last = Some(leader.clone());
                return Ok(leader);
            }
        }
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
        let value = value_with(&before, 12_345_678_901_234_567, &after);
        let read = Leader::from_bytes(&value);
        assert_eq!(read.fencing_token, Some(12_345_678_901_234_567));
        assert_eq!(read.candidate, leader.candidate);
        assert_eq!(read.since_unix_ms, Some(5));
        let text = String::from_utf8(value).expect("utf-8");
        assert!(text.contains("\"owner\":\"s/1\""), "{text}");
    }
}
