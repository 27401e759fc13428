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
    /// The term was handed over to a named candidate
    /// ([`CampaignHandle::hand_over`](crate::CampaignHandle::hand_over)): a planned end, not a
    /// loss.
    HandedOver,
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
            DemotionReason::HandedOver => "handed_over",
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
                | DemotionReason::HandedOver
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
