//! One renew-deadline timer per session, shared by every election on it.
//!
//! A leader must end its term when no renewal of its session has been confirmed within the
//! election's renew deadline, and every campaign must notice at once when its session is
//! lost. Waiting on the session's health for that would wake every campaign at every renewal:
//! 10,000 leaders on one lease renewed every 2 s are 5,000 wake-ups a second for nothing. So
//! one task per session and renew deadline follows the health and publishes only the
//! transitions ([`Freshness`]); the campaigns wait on those, and an idle process costs one
//! wake-up per renewal, whatever the number of its elections.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::{Instant, sleep_until};

use crate::backend::{SessionHealth, SessionLoss, lock};

/// What a campaign needs to know of its session, as of now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Freshness {
    /// A renewal sent less than the renew deadline ago was confirmed.
    Fresh,
    /// No renewal confirmed within the renew deadline: a leader must end its term. A later
    /// confirmed renewal makes the session fresh again (for the next term).
    Stale,
    /// The session is gone for good.
    Lost(SessionLoss),
    /// The session's health is no longer published (its backend was dropped).
    Gone,
}

impl Freshness {
    /// The freshness of a session with this health, for this renew deadline, at `now`.
    pub fn of(health: &SessionHealth, renew_deadline: Duration, now: Instant) -> Freshness {
        match health.lost {
            Some(loss) => Freshness::Lost(loss),
            None if now >= health.confirmed_sent_at + renew_deadline => Freshness::Stale,
            None => Freshness::Fresh,
        }
    }
}

/// A campaign's view of its session's [`Freshness`]. Clones share the timer.
#[derive(Clone, Debug)]
pub(crate) struct Fence {
    _shared: Arc<Shared>,
    freshness: watch::Receiver<Freshness>,
}

/// What the users of one timer share; the timer runs while one of them is left.
#[derive(Debug)]
struct Shared {
    freshness: watch::Receiver<Freshness>,
}

/// The timers in use: few (one per session and renew deadline), so a list will do.
static FENCES: Mutex<Vec<Entry>> = Mutex::new(Vec::new());

struct Entry {
    health: watch::Receiver<SessionHealth>,
    renew_deadline: Duration,
    shared: Weak<Shared>,
}

impl Fence {
    /// The fence of the session whose health this is, for this renew deadline: the one
    /// already running, or a new one.
    pub fn of(health: &watch::Receiver<SessionHealth>, renew_deadline: Duration) -> Fence {
        let mut fences = lock(&FENCES);
        fences.retain(|e| e.shared.strong_count() > 0);
        let running = fences.iter().find_map(|e| {
            (e.renew_deadline == renew_deadline && e.health.same_channel(health))
                .then(|| e.shared.upgrade())
                .flatten()
        });
        let shared = running.unwrap_or_else(|| {
            let now = Instant::now();
            let first = Freshness::of(&health.borrow(), renew_deadline, now);
            let (sender, freshness) = watch::channel(first);
            tokio::spawn(follow(health.clone(), renew_deadline, sender));
            let shared = Arc::new(Shared { freshness });
            fences.push(Entry {
                health: health.clone(),
                renew_deadline,
                shared: Arc::downgrade(&shared),
            });
            shared
        });
        Fence {
            freshness: shared.freshness.clone(),
            _shared: shared,
        }
    }

    /// The freshness as the timer last published it, marked as seen. It may lag the
    /// session's health by a task's hop: decide from the health itself
    /// ([`Freshness::of`]), and use the fence to know when to look again.
    pub fn now(&mut self) -> Freshness {
        *self.freshness.borrow_and_update()
    }

    /// Completes when the published freshness changes; `Err` once it can no longer change
    /// (the session's health is gone): treat that as a lost connection.
    pub async fn changed(&mut self) -> Result<(), ()> {
        self.freshness.changed().await.map_err(|_| ())
    }

    /// Completes once the session is lost or gone (never while it lives): what a campaign
    /// outside a term waits on.
    pub async fn lost(&mut self) {
        loop {
            if matches!(self.now(), Freshness::Lost(_) | Freshness::Gone) {
                return;
            }
            if self.freshness.changed().await.is_err() {
                return;
            }
        }
    }
}

/// The timer: follows the session's health (one wake-up per renewal), publishes transitions.
async fn follow(
    mut health: watch::Receiver<SessionHealth>,
    renew_deadline: Duration,
    freshness: watch::Sender<Freshness>,
) {
    loop {
        let (state, deadline) = {
            let h = health.borrow_and_update();
            let now = Instant::now();
            let state = Freshness::of(&h, renew_deadline, now);
            freshness.send_if_modified(|f| std::mem::replace(f, state) != state);
            if matches!(state, Freshness::Lost(_)) {
                return;
            }
            (state, h.confirmed_sent_at + renew_deadline)
        };
        tokio::select! {
            biased;
            () = freshness.closed() => return,
            changed = health.changed() => if changed.is_err() {
                freshness.send_replace(Freshness::Gone);
                return;
            },
            () = sleep_until(deadline), if state == Freshness::Fresh => {}
        }
    }
}
