//! Group commit: transactions that wait for a request slot go out together.
//!
//! While a slot ([`MAX_REQUESTS_IN_FLIGHT`](super::MAX_REQUESTS_IN_FLIGHT)) is free, a
//! transaction goes out alone, at once, as any request does: a lone hand-off pays nothing.
//! When every slot is busy (thousands of elections starting, or shutting down, at once), the
//! transactions queue, and whoever gets the next slot sends everything queued, up to
//! [`MAX_BATCH`], as the nested transactions of one (etcd 3.3 and later): one raft proposal
//! and one round trip for many elections, each nested transaction with its own compares.
//!
//! A batch etcd refuses as a whole (one lease gone, two writes of one key) is sent again one
//! transaction at a time, so each gets its own answer. A transaction whose caller gave up (a
//! timeout, a cancelled release) before it was sent is dropped from the queue unsent; once
//! sent, it runs to its answer, which nobody reads.
//!
//! Acquisitions (the write of a candidate key, with its reads of the election), releases and
//! the marks of a term's start go through it. 100,000 elections in one process lead in about
//! 6 s, where unbatched acquisitions took 20 to 24 s.
//! (Batched acquisitions were tried before, when each election also created its own watches
//! and read its request lock: they were no faster then, since those requests, which no batch
//! takes, were most of the work; with up to 4,096 transactions in flight 100,000 elections
//! never settled, hence [`MAX_BATCHED_IN_FLIGHT`]. BENCHMARKS.md, "Scale".) Plain reads are
//! not batched.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use std::time::Duration;

use etcd_client::{KvClient, Txn, TxnOp, TxnOpResponse, TxnResponse};
use tokio::sync::{OwnedSemaphorePermit, oneshot};
use tokio::time::timeout;

use super::EtcdBackend;

/// At most this many transactions in one: etcd's `--max-txn-ops` (128 by default) bounds the
/// operations at each level of a transaction. 64 against 16: 100,000 elections led in 6.9 to
/// 7.0 s against 7.4 to 8.6 (etcd's CPU 5.1 s against 6.3 to 7.4), and shut down in 4.6 to
/// 5.5 s against 5.6 to 6.2.
pub(super) const MAX_BATCH: usize = 64;

/// A transaction's answer, with the revision it was applied at (a nested transaction's
/// answer has no header of its own).
pub(super) type Answer = Result<(TxnResponse, i64), Failure>;

/// Why a transaction has no answer.
#[derive(Debug)]
pub(super) enum Failure {
    /// etcd's error.
    Etcd(etcd_client::Error),
    /// No answer within the request timeout, counted from when it was sent (as
    /// [`request`](EtcdBackend::request) counts it: the wait for a slot is not counted).
    NoAnswer,
    /// The backend's request slots are closed, or the batch ended without an answer.
    Dropped,
}

struct Pending {
    /// The election range the transaction writes in: at most one transaction per election in
    /// a batch, since every write of a batch lands at one revision, and two keys of one
    /// election created at one revision would tie for the lead (and for the token).
    writes_in: String,
    /// The lease whose revoke makes this transaction needless (a leaving contender's delete
    /// of its key: [`Lease::leaving`](super::lease::Lease::leaving)), if any.
    needless_after: Option<i64>,
    txn: Txn,
    done: oneshot::Sender<Answer>,
}

/// Transactions taken out of the queue while a revoke that makes them needless is on its
/// way: dropped (unanswered) if it succeeds, put back in line if it fails.
pub(super) struct Held(VecDeque<Pending>);

/// At most this many transactions in flight in batches, counted one by one (a batch of 64
/// counts 64): eight full batches. Bounded because, with up to 4,096 in flight (and each
/// election's watches and reads beside them), a mass start of 100,000 elections did not settle
/// (BENCHMARKS.md). 512 against 128 (two full batches): 100,000 elections led in 5.7 s against
/// 6.9, and shut down in 3.4 to 4.9 s against 4.6 to 5.5.
pub(super) const MAX_BATCHED_IN_FLIGHT: u32 = 512;

/// The transactions waiting for a slot.
pub(super) struct Batch {
    queue: Mutex<Queue>,
    /// [`MAX_BATCHED_IN_FLIGHT`] permits.
    in_flight: Arc<tokio::sync::Semaphore>,
}

impl Default for Batch {
    fn default() -> Self {
        Batch {
            queue: Mutex::default(),
            in_flight: Arc::new(tokio::sync::Semaphore::new(MAX_BATCHED_IN_FLIGHT as usize)),
        }
    }
}

#[derive(Default)]
struct Queue {
    pending: VecDeque<Pending>,
    /// A sender task is running: it waits for slots and sends batches until the queue is
    /// empty. One at a time, so that the callers wait on their answers only, not in the
    /// semaphore's line (thousands of callers each taking a slot in turn and finding their
    /// transaction sent already would keep the runtime busy with nothing).
    sending: bool,
}

impl Batch {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Takes the queued transactions that a revoke of `lease` makes needless out of the
    /// queue, in order.
    pub(super) fn hold(&self, lease: i64) -> Held {
        let mut queue = self.lock();
        let (held, kept) = std::mem::take(&mut queue.pending)
            .into_iter()
            .partition(|p| p.needless_after == Some(lease));
        queue.pending = kept;
        Held(held)
    }

    /// Puts `held` back at the front of the line (the revoke failed), and starts a sender if
    /// none runs.
    pub(super) fn put_back(&self, backend: &EtcdBackend, held: Held) {
        if self.restore(held) {
            tokio::spawn(sender(backend.clone()));
        }
    }

    /// Puts `held` back at the front of the line; whether a sender must be started.
    fn restore(&self, held: Held) -> bool {
        let mut queue = self.lock();
        for pending in held.0.into_iter().rev() {
            queue.pending.push_front(pending);
        }
        !queue.pending.is_empty() && !std::mem::replace(&mut queue.sending, true)
    }

    /// The next batch: up to [`MAX_BATCH`] transactions from the front of the queue, in
    /// order, with at most one per election (the others stay at the front for the next).
    /// Looks at no more than `2 · MAX_BATCH` of the queue.
    fn take(&self) -> Vec<Pending> {
        let mut guard = self.lock();
        let queue = &mut guard.pending;
        let mut taken: Vec<Pending> = Vec::new();
        let mut kept = Vec::new();
        while taken.len() < MAX_BATCH
            && taken.len() + kept.len() < 2 * MAX_BATCH
            && let Some(pending) = queue.pop_front()
        {
            // Its caller went (a timeout, a cancelled release): not sent. Dropped here, in
            // the queue's order, rather than searched for when the caller goes: a thousand
            // callers that give up together would each search the whole queue.
            if pending.done.is_closed() {
                continue;
            }
            let clash = taken.iter().any(|t| t.writes_in == pending.writes_in);
            if clash {
                kept.push(pending);
            } else {
                taken.push(pending);
            }
        }
        for pending in kept.into_iter().rev() {
            queue.push_front(pending);
        }
        taken
    }
}

/// Runs `txn`, a write in the election range `writes_in`, alone or with the others waiting
/// for a slot. Timed from its send (see [`Failure::NoAnswer`]).
pub(super) async fn txn(
    backend: &EtcdBackend,
    writes_in: &str,
    needless_after: Option<i64>,
    txn: Txn,
) -> Answer {
    let batch = &backend.inner.batch;
    let (done, answer) = oneshot::channel();
    let start_sender = {
        let mut queue = batch.lock();
        queue.pending.push_back(Pending {
            writes_in: writes_in.to_owned(),
            needless_after,
            txn,
            done,
        });
        !std::mem::replace(&mut queue.sending, true)
    };
    if start_sender {
        tokio::spawn(sender(backend.clone()));
    }
    answer.await.unwrap_or(Err(Failure::Dropped))
}

/// Waits for a slot, sends what is queued on it, and again, until the queue is empty.
async fn sender(backend: EtcdBackend) {
    let batch = &backend.inner.batch;
    loop {
        let Ok(permit) = backend.inner.slots.clone().acquire_owned().await else {
            // Closed slots: nothing can be sent; the callers' answers are dropped.
            let mut queue = batch.lock();
            queue.pending.clear();
            queue.sending = false;
            return;
        };
        let sending = batch.take();
        if sending.is_empty() {
            let mut queue = batch.lock();
            // Under the lock a caller pushes with: one that pushed since `take` sees
            // `sending` still set, and is served by the next turn of this loop.
            if queue.pending.is_empty() {
                queue.sending = false;
                return;
            }
            continue;
        }
        let count = u32::try_from(sending.len()).unwrap_or(u32::MAX);
        // Never closed: `ok()` only to need no panic path.
        let applying = batch.in_flight.clone().acquire_many_owned(count).await.ok();
        let limit = backend.request_timeout();
        tokio::spawn(send(backend.kv(), sending, (permit, applying), limit));
    }
}

/// Sends one batch on its slot and answers each caller.
async fn send(
    mut kv: KvClient,
    mut sending: Vec<Pending>,
    _permits: (OwnedSemaphorePermit, Option<OwnedSemaphorePermit>),
    limit: Duration,
) {
    if sending.len() == 1
        && let Some(one) = sending.pop()
    {
        let _ = one.done.send(alone(&mut kv, one.txn, limit).await);
        return;
    }
    let outer = Txn::new().and_then(
        sending
            .iter()
            .map(|p| TxnOp::txn(p.txn.clone()))
            .collect::<Vec<_>>(),
    );
    let answers = match timeout(limit, kv.txn(outer)).await {
        Err(_) => {
            for pending in sending {
                let _ = pending.done.send(Err(Failure::NoAnswer));
            }
            return;
        }
        Ok(Ok(response)) if response.succeeded() => {
            let revision = response.header().map_or(0, |h| h.revision());
            let answers: Vec<TxnResponse> = response
                .op_responses()
                .into_iter()
                .filter_map(|op| match op {
                    TxnOpResponse::Txn(answer) => Some(answer),
                    _ => None,
                })
                .collect();
            (answers.len() == sending.len()).then_some((answers, revision))
        }
        _ => None,
    };
    match answers {
        Some((answers, revision)) => {
            for (pending, answer) in sending.into_iter().zip(answers) {
                let _ = pending.done.send(Ok((answer, revision)));
            }
        }
        // Refused as a whole: each alone, for its own answer.
        None => {
            let mut each = tokio::task::JoinSet::new();
            for pending in sending {
                let mut kv = kv.clone();
                each.spawn(async move {
                    let _ = pending.done.send(alone(&mut kv, pending.txn, limit).await);
                });
            }
            while each.join_next().await.is_some() {}
        }
    }
}

async fn alone(kv: &mut KvClient, txn: Txn, limit: Duration) -> Answer {
    let response = match timeout(limit, kv.txn(txn)).await {
        Ok(answer) => answer.map_err(Failure::Etcd)?,
        Err(_) => return Err(Failure::NoAnswer),
    };
    let revision = response.header().map_or(0, |h| h.revision());
    Ok((response, revision))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(batch: &Batch, writes_in: &str) -> oneshot::Receiver<Answer> {
        needless_after(batch, writes_in, None)
    }

    fn needless_after(
        batch: &Batch,
        writes_in: &str,
        lease: Option<i64>,
    ) -> oneshot::Receiver<Answer> {
        let (done, answer) = oneshot::channel();
        batch.lock().pending.push_back(Pending {
            writes_in: writes_in.to_owned(),
            needless_after: lease,
            txn: Txn::new(),
            done,
        });
        answer
    }

    fn ranges(pendings: &[Pending]) -> Vec<&str> {
        pendings.iter().map(|p| p.writes_in.as_str()).collect()
    }

    #[test]
    fn a_batch_holds_one_transaction_per_election_and_keeps_the_order() {
        let batch = Batch::default();
        let _answers = [
            pending(&batch, "e1@"),
            pending(&batch, "e1@"),
            pending(&batch, "e2@"),
        ];
        assert_eq!(ranges(&batch.take()), ["e1@", "e2@"]);
        // The second write of e1 waits for the next batch, first in line.
        let _later = pending(&batch, "e3@");
        assert_eq!(ranges(&batch.take()), ["e1@", "e3@"]);
        assert!(batch.take().is_empty());
    }

    #[test]
    fn a_batch_is_bounded() {
        let batch = Batch::default();
        let answers: Vec<_> = (0..MAX_BATCH + 3)
            .map(|i| pending(&batch, &format!("e{i}@")))
            .collect();
        assert_eq!(batch.take().len(), MAX_BATCH);
        assert_eq!(batch.take().len(), 3);
        drop(answers);
    }

    #[test]
    fn a_revoke_holds_the_deletes_it_makes_needless_and_a_failed_one_puts_them_back() {
        let batch = Batch::default();
        let _answers = [
            needless_after(&batch, "e1@", Some(7)),
            pending(&batch, "e2@"),
            needless_after(&batch, "e3@", Some(7)),
            needless_after(&batch, "e4@", Some(8)),
        ];
        let mut held = batch.hold(7);
        assert_eq!(ranges(held.0.make_contiguous()), ["e1@", "e3@"]);
        assert_eq!(
            ranges(batch.lock().pending.make_contiguous()),
            ["e2@", "e4@"]
        );
        // The revoke failed: back at the front, in their order, and a sender is needed.
        assert!(batch.restore(held));
        assert_eq!(
            ranges(batch.lock().pending.make_contiguous()),
            ["e1@", "e3@", "e2@", "e4@"]
        );
        // A sender runs now: a second restore does not start another.
        assert!(!batch.restore(Held(VecDeque::new())));
    }

    #[test]
    fn the_transaction_of_a_caller_that_went_is_not_sent() {
        let batch = Batch::default();
        let gone = pending(&batch, "e1@");
        let _kept = pending(&batch, "e2@");
        drop(gone);
        assert_eq!(ranges(&batch.take()), ["e2@"]);
        assert!(batch.lock().pending.is_empty());
    }
}
