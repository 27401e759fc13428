//! What the campaign tells the application: events and status.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use crate::backend::{
    Candidate, FencingToken, Leader, LockLoss, SessionHealth, SessionLoss, Wakeup,
};
use crate::term::Term;

/// Something that happened in a campaign, in order.
#[derive(Clone, Debug)]
pub enum LeadershipEvent {
    /// This candidate became leader. The term's token is cancelled when the term ends.
    Elected(Term),
    /// This candidate's term ended, with why. Sent after the term's token was cancelled
    /// (and after the status stopped saying leader); it may come a moment later than the
    /// cancellation, which never waits for it. To act on the loss itself, select on
    /// [`Term::cancelled`].
    Demoted {
        /// The fencing token of the term that ended.
        fencing_token: FencingToken,
        /// Why it ended.
        reason: DemotionReason,
        /// After an involuntary loss, the instant by which the term's work must have
        /// stopped: the store may hand the lock on soon after. `None` after a voluntary end.
        /// The same as [`Term::stop_by`].
        stop_by: Option<Instant>,
    },
    /// The leader this candidate sees changed (`None`: nobody leads). Also sent for itself.
    /// Shared, since every subscriber gets a copy of every event.
    LeaderChanged(Option<Arc<Leader>>),
}

/// A term's end, as [`on_demoted`](crate::ElectionBuilder::on_demoted) receives it: the
/// fields of [`LeadershipEvent::Demoted`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Demotion {
    /// The fencing token of the term that ended.
    pub fencing_token: FencingToken,
    /// Why it ended.
    pub reason: DemotionReason,
    /// After an involuntary loss, the instant by which the term's work must have stopped;
    /// `None` after a voluntary end. The same as [`Term::stop_by`](crate::Term::stop_by).
    pub stop_by: Option<Instant>,
}

/// Why a term ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DemotionReason {
    /// [`CampaignHandle::resign`](crate::CampaignHandle::resign) was called.
    Resigned,
    /// The worker run by [`Election::run`](crate::Election::run) returned while leader.
    WorkerExited,
    /// The worker failed or panicked.
    WorkerFailed,
    /// The campaign was shut down.
    Shutdown,
    /// The store says our session (lease) is gone: expired, revoked or invalidated.
    SessionExpired,
    /// The election's key was deleted.
    KeyDeleted,
    /// Another session holds the lock now.
    LockTaken,
    /// No renewal was confirmed within `renew_deadline`; the leader fenced itself.
    RenewDeadlineExceeded,
    /// The connection to the store was lost for longer than the session can survive.
    ConnectionLost,
    /// The campaign's task panicked (a bug, in this crate or in code it calls, such as a
    /// `tracing` subscriber). The term was ended as the panic unwound; the campaign reports
    /// the panic in [`Status::problem`] and campaigns again after a back-off.
    CampaignPanicked,
}

impl DemotionReason {
    /// A stable snake_case name, used as the metrics label.
    pub fn as_str(self) -> &'static str {
        match self {
            DemotionReason::Resigned => "resigned",
            DemotionReason::WorkerExited => "worker_exited",
            DemotionReason::WorkerFailed => "worker_failed",
            DemotionReason::Shutdown => "shutdown",
            DemotionReason::SessionExpired => "session_expired",
            DemotionReason::KeyDeleted => "key_deleted",
            DemotionReason::LockTaken => "lock_taken",
            DemotionReason::RenewDeadlineExceeded => "renew_deadline_exceeded",
            DemotionReason::ConnectionLost => "connection_lost",
            DemotionReason::CampaignPanicked => "campaign_panicked",
        }
    }

    /// Whether this process chose to step down (as opposed to losing the lock).
    pub fn is_voluntary(self) -> bool {
        matches!(
            self,
            DemotionReason::Resigned
                | DemotionReason::WorkerExited
                | DemotionReason::WorkerFailed
                | DemotionReason::Shutdown
        )
    }

    pub(crate) fn from_session(loss: SessionLoss) -> Self {
        match loss {
            SessionLoss::Expired => DemotionReason::SessionExpired,
            SessionLoss::Unconfirmed => DemotionReason::ConnectionLost,
            SessionLoss::Closed => DemotionReason::Shutdown,
        }
    }

    pub(crate) fn from_lock(loss: LockLoss) -> Self {
        match loss {
            LockLoss::Deleted => DemotionReason::KeyDeleted,
            LockLoss::Taken => DemotionReason::LockTaken,
            LockLoss::SessionLost => DemotionReason::SessionExpired,
        }
    }
}

impl fmt::Display for DemotionReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a candidate stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Opening a session with the store.
    Connecting,
    /// Trying to acquire the lock.
    Candidate,
    /// Another candidate leads; waiting for the lock to be free.
    Follower,
    /// This candidate leads.
    Leader,
    /// This candidate's term has ended (its token is cancelled): it no longer leads, and is
    /// stopping the term's work and releasing the lock.
    SteppingDown,
    /// Waiting before trying again: after a loss, an error, or during a store's lock-delay.
    CoolingDown {
        /// When the next attempt starts.
        until: Instant,
    },
    /// The campaign has ended.
    Stopped,
}

impl Role {
    /// A stable snake_case name.
    pub fn as_str(&self) -> &'static str {
        match self {
            Role::Connecting => "connecting",
            Role::Candidate => "candidate",
            Role::Follower => "follower",
            Role::Leader => "leader",
            Role::SteppingDown => "stepping_down",
            Role::CoolingDown { .. } => "cooling_down",
            Role::Stopped => "stopped",
        }
    }
}

/// A problem the campaign is working around: why it is waiting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// What went wrong, as the error's message.
    pub message: String,
    /// Since when it has been going wrong (monotonic).
    pub since: Instant,
    /// Since when, by the wall clock.
    pub since_wall: SystemTime,
}

/// A snapshot of a campaign, readable at any time through a
/// [`watch::Receiver`](tokio::sync::watch::Receiver), for health endpoints.
#[derive(Clone, Debug)]
pub struct Status {
    /// The election's name.
    pub election: String,
    /// This candidate.
    pub candidate: Candidate,
    /// Where this candidate stands.
    pub role: Role,
    /// The leader as last seen (this candidate, while it leads).
    pub leader: Option<Leader>,
    /// The current term, while leader.
    pub term: Option<Term>,
    /// The session's health once one is open, read live by [`last_renewal`](Self::last_renewal)
    /// and [`renew_deadline_at`](Self::renew_deadline_at).
    pub(crate) session: Option<tokio::sync::watch::Receiver<SessionHealth>>,
    /// The election's renew deadline.
    pub(crate) renew_deadline: Duration,
    /// The problem the campaign is working around, if any.
    pub problem: Option<Problem>,
    /// Why the last term ended, if one did.
    pub last_demotion: Option<DemotionReason>,
    /// How this candidate learns that the lock may be free while it follows: pushed by the
    /// store (a hand-off in milliseconds) or polled (up to the poll interval). From the
    /// backend's [`BackendInfo::wakeup`](crate::backend::BackendInfo::wakeup).
    pub wakeup: Wakeup,
}

impl Status {
    /// When the last renewal the store confirmed was sent, read live from the session (the
    /// status does not change at each renewal: that would wake every reader of every
    /// election on the session). `None` before a session is open.
    pub fn last_renewal(&self) -> Option<Instant> {
        self.session.as_ref().map(|h| h.borrow().confirmed_sent_at)
    }

    /// While leader: when the term will be fenced if no renewal is confirmed before, read
    /// live like [`last_renewal`](Self::last_renewal).
    pub fn renew_deadline_at(&self) -> Option<Instant> {
        match self.role {
            Role::Leader => self.last_renewal().map(|at| at + self.renew_deadline),
            _ => None,
        }
    }

    /// The session's health, which changes at every confirmed renewal: for what must follow
    /// each renewal (e.g. a watchdog re-armed at the lease's last safe instant). `None` before
    /// a session is open.
    pub fn renewals(&self) -> Option<tokio::sync::watch::Receiver<SessionHealth>> {
        self.session.clone()
    }

    /// Whether this candidate leads right now: its role is [`Role::Leader`] and its term's
    /// token is not cancelled. This turns false the instant the term is cancelled, even in a
    /// snapshot taken a moment before, so nothing that reports leadership from a status can
    /// outlive the term.
    pub fn is_leader(&self) -> bool {
        self.role == Role::Leader && self.term.as_ref().is_some_and(|t| !t.is_cancelled())
    }

    /// The role as it stands now: [`Role::SteppingDown`] for a snapshot that still says
    /// [`Role::Leader`] but whose term has been cancelled since. Report this one.
    pub fn current_role(&self) -> Role {
        match self.role {
            Role::Leader if !self.is_leader() => Role::SteppingDown,
            role => role,
        }
    }
}

/// An unbounded queue with one receiver: what carries events to each subscriber, commands to
/// a campaign, and watch responses to each etcd watch.
///
/// tokio's `mpsc` channel costs about 1.3 to 1.9 KB each, allocated when it is made (its
/// shared state is cache-padded, and its first block of 32 slots comes with it); a campaign
/// had three and an etcd watch one, which was half of what an idle election held. This one
/// holds a `VecDeque` that grows only when something is queued, behind a mutex: the queues
/// here carry a few items per term, never a stream.
///
/// It closes (`recv` returns `None` once empty) when every sender is gone; `send` fails once
/// the receiver is gone.
pub(crate) fn queue<T>() -> (QueueSender<T>, QueueReceiver<T>) {
    let shared = Arc::new(std::sync::Mutex::new(QueueState {
        items: std::collections::VecDeque::new(),
        dropped: 0,
        senders: 1,
        receiver: true,
        waker: None,
    }));
    (
        QueueSender {
            shared: shared.clone(),
        },
        QueueReceiver { shared },
    )
}

struct QueueState<T> {
    items: std::collections::VecDeque<T>,
    /// Items dropped by [`QueueSender::send_bounded`].
    dropped: u64,
    senders: usize,
    receiver: bool,
    waker: Option<std::task::Waker>,
}

/// The sending half of a [`queue`]; cloning it adds a sender.
pub(crate) struct QueueSender<T> {
    shared: Arc<std::sync::Mutex<QueueState<T>>>,
}

/// The receiving half of a [`queue`].
pub(crate) struct QueueReceiver<T> {
    shared: Arc<std::sync::Mutex<QueueState<T>>>,
}

impl<T> fmt::Debug for QueueSender<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueueSender").finish_non_exhaustive()
    }
}

impl<T> fmt::Debug for QueueReceiver<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueueReceiver").finish_non_exhaustive()
    }
}

impl<T> QueueSender<T> {
    /// Queues `item`; gives it back if the receiver is gone.
    pub(crate) fn send(&self, item: T) -> Result<(), T> {
        self.send_bounded(item, usize::MAX)
    }

    /// Queues `item`, dropping the oldest item first while `capacity` are queued (counted,
    /// see [`QueueReceiver::dropped`]); gives it back if the receiver is gone.
    pub(crate) fn send_bounded(&self, item: T, capacity: usize) -> Result<(), T> {
        let mut state = crate::backend::lock(&self.shared);
        if !state.receiver {
            return Err(item);
        }
        while state.items.len() >= capacity.max(1) {
            state.items.pop_front();
            state.dropped += 1;
        }
        state.items.push_back(item);
        let waker = state.waker.take();
        drop(state);
        if let Some(waker) = waker {
            waker.wake();
        }
        Ok(())
    }
}

impl<T> Clone for QueueSender<T> {
    fn clone(&self) -> Self {
        crate::backend::lock(&self.shared).senders += 1;
        QueueSender {
            shared: self.shared.clone(),
        }
    }
}

impl<T> Drop for QueueSender<T> {
    fn drop(&mut self) {
        let mut state = crate::backend::lock(&self.shared);
        state.senders -= 1;
        let waker = match state.senders {
            0 => state.waker.take(),
            _ => None,
        };
        drop(state);
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

impl<T> QueueReceiver<T> {
    /// How many items [`QueueSender::send_bounded`] dropped unread.
    pub(crate) fn dropped(&self) -> u64 {
        crate::backend::lock(&self.shared).dropped
    }

    /// The next item; `None` once the queue is empty and every sender is gone.
    pub(crate) fn poll_recv(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<T>> {
        let mut state = crate::backend::lock(&self.shared);
        if let Some(item) = state.items.pop_front() {
            return std::task::Poll::Ready(Some(item));
        }
        if state.senders == 0 {
            return std::task::Poll::Ready(None);
        }
        match &mut state.waker {
            Some(waker) if waker.will_wake(cx.waker()) => {}
            waker => *waker = Some(cx.waker().clone()),
        }
        std::task::Poll::Pending
    }

    /// The next item; `None` once the queue is empty and every sender is gone. Cancel-safe:
    /// an item is taken only when it is returned.
    pub(crate) async fn recv(&mut self) -> Option<T> {
        std::future::poll_fn(|cx| self.poll_recv(cx)).await
    }
}

impl<T> Drop for QueueReceiver<T> {
    fn drop(&mut self) {
        let mut state = crate::backend::lock(&self.shared);
        state.receiver = false;
        let items = std::mem::take(&mut state.items);
        drop(state);
        drop(items);
    }
}

#[cfg(test)]
mod tests {
    use super::queue;

    #[tokio::test]
    async fn a_queue_delivers_in_order_and_closes_when_every_sender_is_gone() {
        let (tx, mut rx) = queue();
        let other = tx.clone();
        tx.send(1).unwrap();
        other.send(2).unwrap();
        drop(tx);
        assert_eq!(rx.recv().await, Some(1));
        assert_eq!(rx.recv().await, Some(2));
        let waiting = tokio::spawn(async move { rx.recv().await });
        tokio::task::yield_now().await;
        drop(other);
        assert_eq!(waiting.await.unwrap(), None);
    }

    #[tokio::test]
    async fn a_bounded_queue_keeps_the_newest_and_counts_what_it_dropped() {
        let (tx, mut rx) = queue();
        for i in 0..10 {
            tx.send_bounded(i, 3).unwrap();
        }
        assert_eq!(rx.dropped(), 7);
        assert_eq!(rx.recv().await, Some(7));
        assert_eq!(rx.recv().await, Some(8));
        assert_eq!(rx.recv().await, Some(9));
    }

    #[test]
    fn sending_to_a_queue_whose_receiver_is_gone_gives_the_item_back() {
        let (tx, rx) = queue();
        drop(rx);
        assert_eq!(tx.send("event"), Err("event"));
    }
}
