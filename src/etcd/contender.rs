//! A candidate key in an election's range: acquire, wait for the predecessor, notice loss.

use std::sync::Arc;

use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse, TxnResponse,
};

use super::batch;
use super::lease::{Lease, Revoke, free_key};
use super::watch::{Follow, Interest, Seen, digest, retries};
use super::{EtcdBackend, Queue, error, leader_of, token_of};
use crate::Result;
use crate::backend::{
    Attempt, Candidate, Contender, Leader, LockLoss, SessionLoss, Settling, Unabandoned,
    unix_ms_now,
};

/// How many times [`EtcdContender::acquire`] writes its key when it keeps vanishing at once,
/// before it reports an error.
const MAX_WRITES: usize = 3;
/// How many times the lease is asked about, after the leader's key was deleted, to tell an
/// operator's delete from an expired lease.
const LEASE_CHECKS: usize = 3;
/// How long, in ttls, a leaver waits for the revoke of its lease before it deletes its key
/// itself (see [`EtcdContender::delete_unless_revoked`]): half the time a crashed process's
/// key would stay.
const REVOKE_PATIENCE: f64 = 0.5;

/// One session's claim on one etcd election: the key `<prefix><election>@<lease id>`.
///
/// - [`acquire`](Contender::acquire) writes the key if absent and reads the range: the key
///   with the lowest create revision leads, and its create revision is the fencing token.
///   Calling it again while leading returns the same token.
/// - [`wait`](Contender::wait) waits for the delete of the key just ahead of ours (or of our
///   own) on the backend's one watch. When the key ahead was the holder, its delete seen
///   before any delete of ours makes us the holder, and the next `acquire` wins without
///   reading the range again: a hand-off costs the old leader's delete and one watch event.
/// - [`lost`](Contender::lost) follows the election's range while leading, and resolves as
///   soon as the watch shows our key deleted ([`LockLoss::Deleted`], or
///   [`LockLoss::SessionLost`] when the keep-alive already heard that the lease is gone) or an
///   older key ([`LockLoss::Taken`]). [`explain`](Contender::explain) then asks etcd about
///   the lease, to tell an operator's delete from an expired or revoked lease.
/// - [`release`](Contender::release) deletes the key; a missing key is not an error.
pub struct EtcdContender {
    backend: EtcdBackend,
    lease: Arc<Lease>,
    /// The id of its session handle in the lease's leavers ([`Lease::leaving`]).
    handle: u64,
    /// `<prefix><election>@<lease>[.n]`: the election's range (`<prefix><election>@`) and
    /// this candidate's part of it.
    key: String,
    /// The length of the range at the start of `key`.
    range_len: usize,
    /// Shared with the lease's other contenders of the same candidate
    /// ([`Lease::shared_candidate`]).
    candidate: Arc<Candidate>,
    /// The create revision of our key, once written.
    created: Option<i64>,
    /// When our term began, as written in the key's value once we won.
    since: Option<u64>,
    /// Whether the last acquisition won.
    won: bool,
    /// Whether this contender has sent a write of its key: a key of its name and lease found
    /// before that was left by an earlier contender of the lease (see [`write`](Self::write)).
    wrote: bool,
    /// The write of our key, which runs to its answer even if `acquire` is dropped, so that
    /// `release` deletes after it.
    writing: Unabandoned<Result<Option<(TxnResponse, i64)>>>,
    /// The view of the election's range on the backend's watch, from before the first read of
    /// the range until the release: while following, of the deletes of our predecessor and of
    /// our own key; while leading, of what can end the hold ([`Interest::Held`]).
    follow: Option<Follow>,
    /// While following: whom we wait for.
    waiting: Option<Box<Waiting>>,
    /// From a write of our key until we follow, or lead and the request lock is observed: a
    /// view of the election's request lock (which the write's transaction read), so that this
    /// process knows who holds it and the leader's observer of it need not read it.
    requests: Option<Box<Follow>>,
    /// `wait` saw the delete of the only key older than ours, ahead of any delete of ours, at
    /// this revision: from then on we lead, without reading the range again.
    promoted: Option<i64>,
    /// Nobody will watch the election's request lock ([`Contender::ignore_requests`]): the
    /// write neither reads it nor keeps a view of it.
    ignores_requests: bool,
    /// A loss seen while leading (by [`lost`](Contender::lost), or by the re-read after a
    /// broken watch), kept until the next acquisition, so that dropping `lost`'s future
    /// loses nothing.
    noticed: Option<Noticed>,
}

struct Waiting {
    predecessor: String,
    /// The predecessor's create revision: a key of the same name written later is another
    /// candidacy, behind ours.
    predecessor_created: i64,
    /// The predecessor was the holder, the only key older than ours: its delete alone makes
    /// us the holder (keys older than ours can only go, never come).
    next_in_line: bool,
}

#[derive(Clone, Copy)]
enum Noticed {
    /// Our key is gone; the lease tells why.
    Deleted,
    /// A key older than ours is in the range.
    Taken,
}

impl std::fmt::Debug for EtcdContender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdContender")
            .field("key", &self.key)
            .field("created", &self.created)
            .field("won", &self.won)
            .finish_non_exhaustive()
    }
}

impl EtcdContender {
    pub(super) fn new(
        backend: EtcdBackend,
        lease: Arc<Lease>,
        range_len: usize,
        key: String,
        candidate: Arc<Candidate>,
        handle: u64,
    ) -> Self {
        EtcdContender {
            backend,
            lease,
            handle,
            key,
            range_len,
            candidate,
            created: None,
            since: None,
            won: false,
            wrote: false,
            writing: Unabandoned::new(),
            follow: None,
            waiting: None,
            requests: None,
            ignores_requests: false,
            promoted: None,
            noticed: None,
        }
    }

    /// The election's range, `<prefix><election>@`: the start of our key.
    fn range(&self) -> &str {
        &self.key[..self.range_len]
    }

    /// The candidate key this contender writes.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Our key's value: who we are, when our term began, and, once we lead, its token.
    fn value(&self, leading_since: Option<i64>) -> Vec<u8> {
        Leader {
            candidate: (*self.candidate).clone(),
            fencing_token: leading_since.map(token_of),
            since_unix_ms: self.since,
        }
        .to_bytes()
    }

    fn put_options(&self) -> PutOptions {
        PutOptions::new().with_lease(self.lease.id)
    }

    /// [`release`](Contender::release), or with `leaving` [`leave`](Contender::leave).
    async fn give_up(&mut self, leaving: bool) -> Result<Option<Settling>> {
        self.follow = None;
        self.leave_the_line();
        // A write sent whose answer never came (the acquire was cancelled, e.g. a campaign
        // shut down as it began) may have made the key: delete it too, or it would stay in
        // the line, held by nobody's campaign, for as long as the lease lives.
        let nothing_written = self.created.is_none() && !self.wrote;
        if !nothing_written {
            // Delete after that write's answer, not before it: etcd serves a client's
            // requests concurrently, and a write still on its way could land after the delete.
            self.writing.settle().await;
        }
        // After the write settled: a revoke for the leavers deletes every key of the lease.
        let all_asked = leaving && self.lease.leaving(self.handle);
        if nothing_written {
            return Ok(None);
        }
        let settling = if leaving {
            self.delete_unless_revoked(all_asked).await?
        } else {
            let delete = Txn::new().and_then([TxnOp::delete(self.key.clone(), None)]);
            self.backend
                .batched("deleting the candidate key", self.range(), delete)
                .await?;
            None
        };
        self.forget();
        Ok(settling)
    }

    /// A leaver's delete of its key: none once a revoke of the lease for its leavers deleted
    /// every key of it ([`Lease::leaving`]), and a delete already queued is held (then
    /// dropped) by that revoke: sent only if it fails.
    ///
    /// Once the revoke has started, the rest (its end, or the delete if it fails) is returned
    /// as [`Settling`] for whoever waits for the campaign's shutdown: the campaigns of the
    /// lease then tear down while etcd revokes it (100,000 at once took a second of two cores,
    /// which used to come after the revoke), and the shutdowns still return once it is done.
    ///
    /// So it is too when the revoke has not started but is sure to come (`all_asked`: every
    /// user of the lease was asked to shut down, [`Lease::asked`]): no delete is sent, where
    /// 100,000 leavers used to send theirs in a thousand batches while the last of them were
    /// still on their way out, each delete a change for every process's watch of the
    /// elections. The wait for the revoke is bounded ([`REVOKE_PATIENCE`]): a user still
    /// winding down its work (up to the grace) keeps the others' keys no longer than that.
    async fn delete_unless_revoked(&self, all_asked: bool) -> Result<Option<Settling>> {
        let mut revoke = self.lease.revoke.subscribe();
        let state = *revoke.borrow_and_update();
        if state == Revoke::Done {
            return Ok(None);
        }
        if state == Revoke::Started || all_asked {
            // No delete queued: sent only if the revoke fails, or does not come in time. The
            // delete's future is made only then (this one waits small, 100,000 at once).
            let patience = self.lease.ttl.mul_f64(REVOKE_PATIENCE);
            let (backend, key, range_len) =
                (self.backend.clone(), self.key.clone(), self.range_len);
            let lease = self.lease.id;
            return Ok(Some(Settling::new(async move {
                let revoked = tokio::time::timeout(patience, async {
                    let _ = revoke.wait_for(|r| *r != Revoke::No).await;
                    revoke
                        .wait_for(|r| *r != Revoke::Started)
                        .await
                        .is_ok_and(|r| *r == Revoke::Done)
                })
                .await;
                if revoked != Ok(true)
                    && let Err(error) = Box::pin(delete_key(backend, key, range_len, lease)).await
                {
                    tracing::debug!(%error, "could not delete the candidate key; the lease's expiry will");
                }
            })));
        }
        let mut deleting = Box::pin(delete_key(
            self.backend.clone(),
            self.key.clone(),
            self.range_len,
            self.lease.id,
        ));
        tokio::select! {
            biased;
            changed = revoke.wait_for(|r| *r != Revoke::No) => {
                if changed.is_ok_and(|r| *r == Revoke::Done) {
                    return Ok(None);
                }
            }
            answer = &mut deleting => return answer.map(|()| None),
        }
        // The revoke started with our delete queued, which it holds: whichever ends first.
        Ok(Some(Settling::new(async move {
            tokio::select! {
                biased;
                Ok(_) = revoke.wait_for(|r| *r == Revoke::Done) => {}
                answer = deleting => {
                    if let Err(error) = answer {
                        tracing::debug!(%error, "could not delete the candidate key; the lease's expiry will");
                    }
                }
            }
        })))
    }

    /// Forgets our key (it vanished, or we released it) and whom we waited for.
    fn forget(&mut self) {
        self.created = None;
        self.since = None;
        self.leave_the_line();
    }

    /// Forgets where we stood in the line: whom we waited for, and whether we won.
    fn leave_the_line(&mut self) {
        self.won = false;
        self.waiting = None;
        self.requests = None;
        self.promoted = None;
        self.noticed = None;
    }

    /// Writes our key bound to the lease if it is absent, and learns its create revision. A
    /// key that already exists was written by an earlier attempt whose answer was lost, or,
    /// before our first write, by an earlier contender of the lease that left it behind (its
    /// release failed): that one is deleted, for the caller to write afresh, since a key that
    /// led once must never lead again with the same token.
    ///
    /// The same transaction reads the election's range after the write: `Some(queue)` when
    /// the key is ours to queue with (written now, or adopted), so that the acquisition
    /// needs no second round trip.
    async fn write(&mut self) -> Result<Option<Queue>> {
        let adopt = std::mem::replace(&mut self.wrote, true);
        // A candidate's key says nothing of a term until it wins (`mark_term`): an observer
        // must not read its campaign's start as its term's.
        self.since = None;
        // The election's request lock is read in the same transaction, for the leader's
        // observer of it (`Sightings` of hand-over requests): made before the read, the view
        // lets this process know its holder until it changes, so the observer need not read.
        // (Neither, when nobody will watch the request lock.)
        let requests = (!self.ignores_requests).then(|| self.requests_range());
        let mut view = requests.as_deref().map(|requests| {
            let mut view = Follow::new(&self.backend, requests, true);
            view.attend(Interest::Nothing);
            view
        });
        let holder_options = super::queue_options().with_limit(1);
        let mut written = vec![
            TxnOp::put(self.key.clone(), self.value(None), Some(self.put_options())),
            // Our key is the newest of the range now: the holder, and the two newest (ours
            // and the one just before it), are all of the queue a candidate acts on, and
            // cost etcd (and this process) less than the whole queue.
            TxnOp::get(self.range().to_owned(), Some(holder_options.clone())),
            TxnOp::get(self.range().to_owned(), Some(newest_two())),
        ];
        let mut found = vec![
            TxnOp::get(self.key.clone(), None),
            TxnOp::get(self.range().to_owned(), Some(super::queue_options())),
        ];
        if let Some(requests) = requests {
            written.push(TxnOp::get(requests.clone(), Some(holder_options.clone())));
            found.push(TxnOp::get(requests, Some(holder_options)));
        }
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.key.clone(),
                CompareOp::Equal,
                0,
            )])
            .and_then(written)
            .or_else(found);
        let (backend, range) = (self.backend.clone(), self.range().to_owned());
        let response = self
            .writing
            .run(async move {
                match super::batch::txn(&backend, &range, None, txn).await {
                    Err(super::batch::Failure::Etcd(e)) if error::is_lease_not_found(&e) => {
                        Ok(None)
                    }
                    answer => backend
                        .answer("writing the candidate key", answer)
                        .map(Some),
                }
            })
            .await
            .map_err(|e| error::store(format!("writing the candidate key failed: {e}")))??;
        let backend = &self.backend;
        let Some((response, revision)) = response else {
            return Err(self.lease_gone().await);
        };
        // The range, read in the same transaction (after the write): the queue as of it.
        let mut reads = response
            .op_responses()
            .into_iter()
            .filter_map(|op| match op {
                TxnOpResponse::Get(mut get) => Some(get.take_kvs()),
                _ => None,
            });
        let mut learn = |reads: &mut dyn Iterator<Item = Vec<KeyValue>>, written: bool| {
            let mut candidates = reads.next().unwrap_or_default();
            if written {
                candidates = with_newest(candidates, reads.next().unwrap_or_default());
            }
            if let Some(view) = view.take() {
                let request = reads.next().and_then(|kvs| kvs.into_iter().next());
                view.learn(revision, request.as_ref());
                self.requests = Some(Box::new(view));
            }
            candidates
        };
        if response.succeeded() {
            let candidates = learn(&mut reads, true);
            self.created = Some(revision);
            return Ok(Some(Queue {
                revision,
                candidates,
            }));
        }
        let existing = reads.next().and_then(|kvs| kvs.into_iter().next());
        match existing {
            Some(kv) if kv.lease() == self.lease.id && adopt => {
                let candidates = learn(&mut reads, false);
                self.created = Some(kv.create_revision());
                return Ok(Some(Queue {
                    revision,
                    candidates,
                }));
            }
            Some(kv) if kv.lease() == self.lease.id => {
                let txn = Txn::new()
                    .when([Compare::create_revision(
                        self.key.clone(),
                        CompareOp::Equal,
                        kv.create_revision(),
                    )])
                    .and_then([TxnOp::delete(self.key.clone(), None)]);
                backend
                    .request("deleting a candidate key left behind", || async {
                        backend.kv().txn(txn).await
                    })
                    .await?;
            }
            Some(_) => {
                return Err(error::store(format!(
                    "the key {} exists but is not bound to this session's lease; \
                     delete it (an operator wrote it?)",
                    self.key
                )));
            }
            // Deleted in between: the caller reads, finds it missing, and writes again.
            None => {}
        }
        Ok(None)
    }

    /// Rewrites our key's value with the start of the term and its token, in the background,
    /// if the key is still the one we won with. It is off the hand-off's critical path (one
    /// etcd commit less before `Won`): observers read the token from the key's create
    /// revision anyway, and if the key vanished meanwhile the compare fails and the leader's
    /// watch, which starts before this write, reports the loss.
    fn mark_term(&mut self, created: i64) {
        self.since = Some(unix_ms_now());
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.key.clone(),
                CompareOp::Equal,
                created,
            )])
            .and_then([TxnOp::put(
                self.key.clone(),
                self.value(Some(created)),
                Some(self.put_options()),
            )]);
        let (backend, range) = (self.backend.clone(), self.range().to_owned());
        tokio::spawn(async move {
            let marked = backend
                .batched("marking the start of the term", &range, txn)
                .await;
            if let Err(error) = marked {
                tracing::debug!(%error, "could not mark the start of the term in the key's value");
            }
        });
    }

    /// Why our key is gone: the lease expired or was revoked, or someone deleted the key.
    async fn why_deleted(&self) -> LockLoss {
        if self.lease_lost() {
            return LockLoss::SessionLost;
        }
        let mut retry = retries();
        for _ in 0..LEASE_CHECKS {
            let backend = &self.backend;
            let checked = backend
                .request("checking the lease", || async {
                    backend
                        .lease_client()
                        .time_to_live(self.lease.id, None)
                        .await
                })
                .await;
            match checked {
                Ok(response) if response.ttl() <= 0 => {
                    self.lease.gone();
                    return LockLoss::SessionLost;
                }
                Ok(_) => return LockLoss::Deleted,
                Err(error) => {
                    tracing::debug!(%error, "cannot check the lease after losing the key");
                    retry.pause().await;
                }
            }
        }
        if self.lease_lost() {
            LockLoss::SessionLost
        } else {
            LockLoss::Deleted
        }
    }

    /// While leading, after the watch missed changes: reads the range and notes a loss, or
    /// tells the watch it is caught up. A failed read is tried again after the next pause.
    async fn recheck(&mut self) {
        let own = self.key.as_bytes();
        match self.backend.read_queue(self.range()).await {
            Ok(queue) => match queue.candidates.first() {
                Some(first) if first.key() == own => {
                    if let Some(follow) = self.follow.as_mut() {
                        follow.read_at(queue.revision);
                    }
                }
                _ if queue.candidates.iter().any(|kv| kv.key() == own) => {
                    self.noticed = Some(Noticed::Taken)
                }
                _ => self.noticed = Some(Noticed::Deleted),
            },
            Err(error) => {
                tracing::debug!(%error, "cannot read the election; retrying");
                if let Some(follow) = self.follow.as_mut() {
                    follow.pause().await;
                }
            }
        }
    }

    /// We hold the lock with our key, created at `created`, as seen at `revision`: follow
    /// what can end the hold from there while leading ([`Interest::Held`]), and mark the term
    /// in the key's value unless it was written just now (then it says so already).
    fn win(&mut self, created: i64, revision: i64, fresh: bool) -> Attempt {
        if !self.won {
            if !fresh {
                self.mark_term(created);
            }
            self.won = true;
            self.waiting = None;
            let key = digest(self.key.as_bytes());
            self.follow(Some(revision))
                .attend(Interest::Held { key, created });
        }
        Attempt::Won {
            fencing_token: token_of(created),
        }
    }

    /// The view of the range, made now if there is none: before the range is read (`Some`
    /// the read's revision, else none yet).
    fn follow(&mut self, read: Option<i64>) -> &mut Follow {
        let follow = self
            .follow
            .get_or_insert_with(|| Follow::new(&self.backend, &self.key[..self.range_len], true));
        if let Some(revision) = read {
            follow.read_at(revision);
        }
        follow
    }

    /// The range of the election's request lock (hand-over requests, see
    /// [`switchover`](crate::switchover)).
    fn requests_range(&self) -> String {
        let election =
            self.range()[self.backend.prefix().len()..].trim_end_matches(super::SEPARATOR);
        let requests = crate::switchover::request_name(election);
        self.backend.election_range(&requests)
    }

    /// Whether the keep-alive already heard from etcd that the lease is gone.
    fn lease_lost(&self) -> bool {
        matches!(
            self.lease.health().borrow().lost,
            Some(SessionLoss::Expired)
        )
    }

    /// etcd said "requested lease not found": the session is lost now, for every election
    /// on the lease, not at the next renewal. The error returned to the caller comes after
    /// one yield, so that a caller watching the session's health (the campaign) sees the loss
    /// first, and opens a new session at once instead of backing off as after a failure.
    async fn lease_gone(&self) -> crate::Error {
        self.lease.gone();
        tokio::task::yield_now().await;
        error::store(format!(
            "etcd does not know the lease {:x} any more (expired or revoked); the session is \
             lost",
            self.lease.id
        ))
    }

    /// Whether `kv` is bound to a lease that this backend granted and has since closed or
    /// dropped: a leftover of ours, never a live candidate. Decided from what this process
    /// remembers of its own leases, not from anything in the key's value.
    fn is_leftover(&self, kv: &KeyValue) -> bool {
        is_leftover(&self.backend, self.lease.id, kv)
    }

    /// Deletes the keys of `queue` that are leftovers of ours (see
    /// [`is_leftover`](Self::is_leftover)), each only at its create revision and lease, so
    /// that nothing else can go. Returns whether there were any (the caller reads again).
    async fn clear_leftovers(&self, queue: &Queue) -> Result<bool> {
        let leftovers: Vec<&KeyValue> = queue
            .candidates
            .iter()
            .filter(|kv| self.is_leftover(kv))
            .collect();
        for kv in &leftovers {
            let key = kv.key().to_vec();
            let txn = Txn::new()
                .when([
                    Compare::create_revision(key.clone(), CompareOp::Equal, kv.create_revision()),
                    Compare::lease(key.clone(), CompareOp::Equal, kv.lease()),
                ])
                .and_then([TxnOp::delete(key, None)]);
            let backend = &self.backend;
            let response = backend
                .request(
                    "deleting a candidate key of a lease this process closed",
                    || async { backend.kv().txn(txn).await },
                )
                .await?;
            tracing::info!(
                key = %String::from_utf8_lossy(kv.key()),
                lease = %format_args!("{:x}", kv.lease()),
                deleted = response.succeeded(),
                "deleted a candidate key left by a lease this process closed, rather than wait behind it"
            );
        }
        Ok(!leftovers.is_empty())
    }
}

impl Contender for EtcdContender {
    async fn acquire(&mut self) -> Result<Attempt> {
        self.noticed = None;
        if let Some(revision) = self.promoted.take()
            && let Some(created) = self.created
        {
            return Ok(self.win(created, revision, false));
        }
        let (mut writes, mut clearings) = (0, 0);
        let mut fresh = false;
        let mut written = None;
        // Made before the range is read (by the write, or alone), so that the view misses no
        // change after the read; and open to every change until the read tells which deletes
        // to wait for. A view kept from an earlier wait still wants only the deletes of that
        // wait's keys: the delete of the new predecessor, committed after the read and
        // delivered before the new keys were set, was dropped, and the candidate waited for it
        // forever, first in line and never leading.
        self.follow(None).attend(Interest::Everything);
        loop {
            if self.created.is_none() {
                if writes == MAX_WRITES {
                    break;
                }
                writes += 1;
                written = self.write().await?;
                fresh = true;
            }
            // The write's own read of the range, when it made one: one round trip, not two.
            let queue = match written.take() {
                Some(queue) => queue,
                None => self.backend.read_queue(self.range()).await?,
            };
            self.follow(Some(queue.revision));
            // Our own leftovers (keys of leases this backend closed) are never queued behind:
            // after an outage, etcd may keep such a lease alive for another ttl.
            if clearings < MAX_WRITES && self.clear_leftovers(&queue).await? {
                clearings += 1;
                continue;
            }
            let Some(mine) = queue
                .candidates
                .iter()
                .find(|kv| kv.key() == self.key.as_bytes())
            else {
                // Deleted by an operator, or its lease expired: write it again.
                self.forget();
                fresh = false;
                continue;
            };
            let created = mine.create_revision();
            self.created = Some(created);
            let first = &queue.candidates[0];
            if first.key() == self.key.as_bytes() {
                return Ok(self.win(created, queue.revision, fresh));
            }
            self.won = false;
            let older = queue
                .candidates
                .iter()
                .take_while(|kv| kv.create_revision() < created);
            let next_in_line = older.clone().count() == 1;
            let predecessor = older.last().unwrap_or(first);
            let predecessor_created = predecessor.create_revision();
            let predecessor = String::from_utf8_lossy(predecessor.key()).into_owned();
            // The deletes of the predecessor's key and ours, in revision order (one watch
            // delivers them): next in line, the predecessor's delete seen before any of ours
            // proves ours was still there. Further back, any delete means reading again.
            let keys = vec![
                predecessor.clone().into_bytes(),
                self.key.clone().into_bytes(),
            ];
            self.requests = None;
            let follow = self.follow(None);
            // For this process's observers of the election (the campaign's, to report the
            // leader): they need not read it again.
            follow.learn(queue.revision, Some(first));
            follow.attend(Interest::Deletes(keys));
            self.waiting = Some(Box::new(Waiting {
                predecessor,
                predecessor_created,
                next_in_line,
            }));
            return Ok(Attempt::Held {
                holder: Some(leader_of(first)),
            });
        }
        Err(error::store(format!(
            "the candidate key {} vanished right after each of {MAX_WRITES} writes; is \
             something deleting keys under {:?}?",
            self.key,
            self.backend.prefix()
        )))
    }

    async fn wait(&mut self) -> Result<()> {
        let (Some(waiting), Some(follow)) = (self.waiting.as_mut(), self.follow.as_mut()) else {
            return Ok(());
        };
        loop {
            match follow.next().await {
                // Only the two keys' deletes, in revision order.
                Seen::Changes(changes) => {
                    // Changes come in whole revisions: if ours went in the same revision as
                    // the predecessor's (or earlier), this is no promotion.
                    // When each key went, if it did.
                    let gone = |key: &[u8]| {
                        changes
                            .iter()
                            .find(|change| change.key == key)
                            .map(|change| change.mod_revision)
                    };
                    let ours = gone(self.key.as_bytes());
                    let theirs = gone(waiting.predecessor.as_bytes());
                    if ours.is_none() && theirs.is_none() {
                        continue;
                    }
                    self.promoted = theirs.filter(|_| ours.is_none() && waiting.next_in_line);
                    break;
                }
                Seen::Gap => {}
            }
            // Boxed: `wait` is where a follower idles, and its future should hold room only
            // for the wait on the view.
            let range = &self.key[..self.range_len];
            let queue = Box::pin(self.backend.read_queue(range)).await?;
            let present = |key: &str, created: Option<i64>| {
                queue.candidates.iter().any(|kv| {
                    kv.key() == key.as_bytes() && created.is_none_or(|c| kv.create_revision() == c)
                })
            };
            // A predecessor that turned out to be a leftover of ours (its lease was closed
            // since): back to `acquire`, which deletes it.
            let leftover = queue
                .candidates
                .iter()
                .any(|kv| is_leftover(&self.backend, self.lease.id, kv));
            if leftover
                || !present(&waiting.predecessor, Some(waiting.predecessor_created))
                || !present(&self.key, self.created)
            {
                break;
            }
            follow.read_at(queue.revision);
        }
        self.waiting = None;
        Ok(())
    }

    fn ignore_requests(&mut self) {
        self.ignores_requests = true;
        self.requests = None;
    }

    async fn lost(&mut self) -> LockLoss {
        // Once the leader's observer of the request lock follows it (from the campaign's
        // first turn, before `lost` is polled again), this view's work is done: what it knew
        // is the range's.
        if self.requests.as_ref().is_some_and(|view| view.shared()) {
            self.requests = None;
        }
        loop {
            match self.noticed {
                // Reported at once, with no question to etcd in between: see `explain`.
                Some(Noticed::Taken) => return LockLoss::Taken,
                Some(Noticed::Deleted) if self.lease_lost() => return LockLoss::SessionLost,
                Some(Noticed::Deleted) => return LockLoss::Deleted,
                None => {}
            }
            let (Some(follow), Some(created), true) =
                (self.follow.as_mut(), self.created, self.won)
            else {
                self.noticed = Some(Noticed::Deleted);
                continue;
            };
            let own = self.key.as_bytes();
            match follow.next().await {
                Seen::Changes(changes) => {
                    self.noticed = changes.iter().find_map(|change| {
                        let ours = change.key == own;
                        if change.deleted && ours {
                            Some(Noticed::Deleted)
                        } else if !change.deleted && !ours && change.create_revision < created {
                            Some(Noticed::Taken)
                        } else {
                            None
                        }
                    });
                }
                // Boxed: `lost` is where a leader idles, and its future should hold room
                // only for the wait on the view.
                Seen::Gap => Box::pin(self.recheck()).await,
            }
        }
    }

    /// A deleted key: asks etcd whether the lease behind it is gone.
    async fn explain(&mut self, loss: LockLoss) -> LockLoss {
        match loss {
            LockLoss::Deleted => self.why_deleted().await,
            other => other,
        }
    }

    async fn proclaim(&mut self, leader: &Leader) -> Result<()> {
        let Some(created) = self.created.filter(|_| self.won) else {
            return Err(error::store(
                "cannot proclaim: this candidate does not hold the lock",
            ));
        };
        let previous = std::mem::replace(&mut self.candidate, Arc::new(leader.candidate.clone()));
        let txn = Txn::new()
            .when([
                Compare::create_revision(self.key.clone(), CompareOp::Equal, created),
                Compare::lease(self.key.clone(), CompareOp::Equal, self.lease.id),
            ])
            .and_then([TxnOp::put(
                self.key.clone(),
                self.value(Some(created)),
                Some(self.put_options()),
            )]);
        let backend = &self.backend;
        let written = backend
            .request("proclaiming", || async { backend.kv().txn(txn).await })
            .await;
        match written {
            Ok(response) if response.succeeded() => Ok(()),
            Ok(_) => {
                self.candidate = previous;
                Err(error::store(format!(
                    "cannot proclaim: the key {} is gone or no longer bound to this session",
                    self.key
                )))
            }
            Err(e) => {
                self.candidate = previous;
                Err(e)
            }
        }
    }

    async fn release(&mut self) -> Result<()> {
        self.give_up(false).await.map(drop)
    }

    /// Marks this contender's session handle as leaving, then deletes the key as `release`
    /// does, unless every handle of the lease is leaving meanwhile and one revoke of the
    /// lease deleted all their keys (a mass shutdown: see the [module](super) docs).
    async fn leave(&mut self) -> Result<Option<Settling>> {
        self.give_up(true).await
    }
}

/// A leaver's delete of its `key` (the election's range its first `range_len` bytes, bound to
/// `lease`), as it sends it when no revoke of the lease does the work: made (and queued)
/// only when first polled.
async fn delete_key(backend: EtcdBackend, key: String, range_len: usize, lease: i64) -> Result<()> {
    let range = key[..range_len].to_owned();
    let delete = Txn::new().and_then([TxnOp::delete(key, None)]);
    let answer = batch::txn(&backend, &range, Some(lease), delete).await;
    backend
        .answer("deleting the candidate key", answer)
        .map(drop)
}

/// How the newest two keys of a range are read: by create revision, newest first.
fn newest_two() -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Descend)
        .with_limit(2)
}

/// The part of a queue a fresh candidate acts on, oldest first: the holder (`holder`, at most
/// one key), and the newest two keys (`newest`, newest first: the candidate's own and the one
/// just before it), without repeats.
fn with_newest(holder: Vec<KeyValue>, newest: Vec<KeyValue>) -> Vec<KeyValue> {
    let mut queue = holder;
    for kv in newest.into_iter().rev() {
        if !queue.iter().any(|seen| seen.key() == kv.key()) {
            queue.push(kv);
        }
    }
    queue
}

/// Whether `kv` is bound to a lease that `backend` granted and has since closed or dropped
/// (and which is not `own`, the asking contender's).
fn is_leftover(backend: &EtcdBackend, own: i64, kv: &KeyValue) -> bool {
    kv.lease() != 0 && kv.lease() != own && backend.is_abandoned(kv.lease())
}

impl Drop for EtcdContender {
    fn drop(&mut self) {
        free_key(&self.lease, &self.key);
    }
}
