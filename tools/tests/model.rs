//! A model of the campaign protocol, checked exhaustively with `stateright`.
//!
//! Three candidates, a store with sessions (leases with a ttl), one lock with a lock-delay,
//! renewals that are delayed or lost, a partition per candidate, resign, lease expiry, and the
//! self-fencing rule of [`Engine::lead`]. Time is discrete: one [`Action::Tick`] is one unit,
//! and every age in the state is "ticks since", so the state space is finite without bounding
//! time, and the checker covers runs of any length. MODEL.md says what each action stands for
//! in the code, what is left out, and what the checker found.
//!
//! Run it with `cargo test -p incumbent-tools --test model -- --nocapture` to see the figures
//! and the counterexample of every planted bug.

use std::fmt::Write as _;
use std::time::Instant;

use stateright::{Checker, HasDiscoveries, Model, Path, Property, Representative};

/// The number of candidates.
const N: usize = 3;

/// A bug planted in the model, to show that the checker catches it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    /// The protocol as the code has it. After a voluntary end (resign, shutdown) the work
    /// must stop by `confirmed + ttl - margin` too, `confirmed` being the send time of the
    /// newest renewal confirmed meanwhile (`Engine::wind_down`, `Term::must_stop`).
    Correct,
    /// The code before `Engine::wind_down`: after a resign or a shutdown the worker got its
    /// whole grace, and the lock was released after it, even when renewals failed meanwhile
    /// and the lease expired before the grace ended: the store handed the lock on while the old
    /// worker still ran.
    UncappedGrace,
    /// The leader fences itself a whole ttl after its last confirmed renewal was sent, instead
    /// of `renew_deadline` after (the `sleep_until(deadline)` of `Engine::lead` with
    /// `confirmed + ttl`).
    FenceAtTtl,
    /// The keep-alive records when a confirmation was *received*, not when its renewal was
    /// *sent* (`confirmed_sent_at = Instant::now()` in `KeepAlive`): the deadline and the hard
    /// stop are measured from the wrong instant.
    DeadlineFromReceive,
    /// The hard stop comes at `confirmed + ttl`, without the margin (`Engine::stop_by`).
    StopByAtTtl,
    /// `Engine::run` keeps a session whose lock it could not release, and
    /// `Engine::check_win` is skipped: a session that still holds the lock wins it
    /// again, with the old term's token.
    ReuseSessionSkipCheckWin,
}

/// The protocol's timing, in ticks, and which variant to check.
#[derive(Clone, Debug)]
struct Protocol {
    variant: Variant,
    /// The session ttl: the store expires a session this long after it last heard a renewal.
    ttl: u8,
    /// The leader cancels its term when no renewal sent within this long was confirmed.
    renew_deadline: u8,
    /// The hard stop comes this long before `confirmed + ttl`: `ttl / HARD_STOP_MARGIN_DIVISOR`
    /// in the code, at least one tick here (a positive duration, at the model's resolution).
    margin: u8,
    /// How long the store keeps a lock from everyone after the session holding it was
    /// invalidated (Consul's lock-delay; 0 for etcd).
    lock_delay: u8,
    /// How long a worker is given to return after its term ended, before it is aborted.
    grace: u8,
    /// The cool-down after a loss, before campaigning again.
    backoff: u8,
    /// How many faults a run may have (lost or slow renewals, partitions, resigns).
    faults: u8,
    /// The liveness bound: once faults stop, a leader within this many ticks.
    leader_within: u8,
}

impl Protocol {
    /// The timing the tests check: ttl 5, renew deadline 3, one renewal a tick, a margin of
    /// one tick, a grace as long as the ttl (as the defaults: 10 s each), no lock-delay (etcd).
    fn new(variant: Variant) -> Protocol {
        let faults = std::env::var("INCUMBENT_MODEL_FAULTS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(4);
        Protocol {
            variant,
            ttl: 5,
            renew_deadline: 3,
            margin: 1,
            lock_delay: 0,
            grace: 5,
            backoff: 1,
            faults,
            leader_within: 5,
        }
    }

    /// With a lock-delay, as Consul imposes after a session holding a lock is invalidated.
    fn lock_delay(self, lock_delay: u8) -> Protocol {
        Protocol { lock_delay, ..self }
    }

    fn renew_deadline(self, renew_deadline: u8) -> Protocol {
        Protocol {
            renew_deadline,
            ..self
        }
    }

    /// The promised bound: once faults stop, a leader within a ttl plus the lock-delay. The
    /// worst cases the checker finds: an orphaned session (its candidate could not close it)
    /// that the store last heard from when faults stopped holds the lock until it expires,
    /// then the lock-delay runs; or a resigned leader's worker ignores its cancellation for
    /// the whole grace (here as long as the ttl).
    fn promised_bound(self) -> Protocol {
        Protocol {
            leader_within: self.ttl + self.lock_delay,
            ..self
        }
    }
}

/// Where a candidate's engine is.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
enum Phase {
    /// Cooling down (`Engine::cool_down`), then opening a session if it has none
    /// (`Engine::open_session`), or pursuing with the one it kept.
    Down { wait: u8 },
    /// `Engine::pursue`: acquiring, following (`Contender::wait`), or waiting out a
    /// lock-delay (`Attempt::Delayed`).
    Pursuing,
    /// `Engine::lead`, before the term ends: the term is in force and the worker runs.
    Leading,
    /// `Engine::lead` after the term ended: the worker may still run until it returns or is
    /// aborted (`abort_in` ticks from now: the grace, or the term's `stop_by` if sooner); then
    /// the lock is released.
    SteppingDown {
        worker: bool,
        abort_in: u8,
        voluntary: bool,
    },
}

/// A renewal sent in the previous tick and answered in this one.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
enum Late {
    /// The store heard it when it was sent; the answer comes now.
    Reply,
    /// The store hears it now, and the answer comes now.
    Request,
}

/// What becomes of the renewal a keep-alive sends in a tick. Everything but `Ok` is a fault.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
enum Fate {
    /// The store hears it and the keep-alive has the answer within the tick.
    Ok,
    /// The request is lost: the store never hears it.
    LostRequest,
    /// The store hears it (the lease is renewed) but the answer is lost.
    LostReply,
    /// The store hears it at once; the answer comes in the next tick.
    SlowReply,
    /// The store hears it in the next tick, and the answer comes then.
    SlowRequest,
}

const FATES: [Fate; 5] = [
    Fate::Ok,
    Fate::LostRequest,
    Fate::LostReply,
    Fate::SlowReply,
    Fate::SlowRequest,
];

/// Why a session was lost, as `SessionHealth::lost` says.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
enum Loss {
    /// The store said the session is gone.
    Expired,
    /// No renewal was confirmed for a whole ttl.
    Unconfirmed,
}

/// A candidate's session as its keep-alive sees it (`SessionHealth`, `KeepAlive`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
struct Session {
    /// Ticks since the last confirmed renewal was sent (`confirmed_sent_at`), at most the ttl.
    confirmed: u8,
    lost: Option<Loss>,
    /// A renewal sent in the previous tick, answered in this one.
    late: Option<Late>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
struct Cand {
    phase: Phase,
    session: Option<Session>,
    /// The link to the store is up (no partition).
    link: bool,
    /// `Engine::last_token` is the store's newest token.
    last_current: bool,
}

/// Who holds the lock.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
enum Lock {
    Free,
    /// A candidate's current session.
    Held(u8),
    /// A session its candidate gave up but could not close (partitioned): the store keeps it
    /// until it expires, `age` ticks after it last heard from it.
    Orphan {
        cand: u8,
        age: u8,
    },
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct Store {
    /// Each candidate's current session in the store: ticks since it last heard a renewal,
    /// or `None` once expired or destroyed.
    sessions: [Option<u8>; N],
    lock: Lock,
    /// Ticks of lock-delay left.
    delay: u8,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct State {
    cands: [Cand; N],
    store: Store,
    /// How many more faults may happen.
    faults_left: u8,
    /// Faults have stopped for good.
    calm: bool,
    /// Ticks since faults stopped during which nobody led, at most `leader_within + 1`.
    leaderless: u8,
    /// A term has begun with the store's newest token. Tokens are kept relative to the
    /// store's counter: the lock is exclusive, so a win returns either the holder's token,
    /// which is the newest, or a new one above it, and only "is it the newest" matters.
    term_has_newest: bool,
    /// A term began with a token no greater than an earlier term's.
    token_reused: bool,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
enum Action {
    /// One unit of time passes: the store expires the sessions it has not heard from for a
    /// ttl (lease expiry), late answers arrive, the keep-alives give up on sessions with no
    /// confirmed renewal for a ttl, and send their next renewals, each with its fate.
    Tick([Fate; N]),
    /// `Engine::open_session` (`Backend::open_session`, `KeepAlive::spawn`).
    OpenSession(u8),
    /// `Contender::acquire` returning `Won`, then `Engine::check_win`.
    Acquire(u8),
    /// `Engine::lead`: `sleep_until(deadline)` fires, the term ends (`RenewDeadlineExceeded`).
    SelfFence(u8),
    /// `Engine::lead` / `Engine::pursue` see `health.lost`.
    SessionLost(u8),
    /// `Election::run`'s `Worker::stop` aborts the worker (grace or `stop_by`).
    HardStop(u8),
    /// The worker returns by itself after its term ended (drops its guards).
    WorkerReturns(u8),
    /// `Engine::lead`'s hand-off (`Contender::release`), then `Engine::run`'s choice to keep
    /// the session or close it (`close_in_background`), and the cool-down.
    Release(u8),
    /// Fault: a candidate's link to the store goes down, or comes back.
    Partition(u8),
    Heal(u8),
    /// Fault (an operator's): the leader resigns (`CampaignHandle::resign`).
    Resign(u8),
    /// From now on, no more faults.
    FaultsStop,
}

fn idx(i: usize) -> u8 {
    u8::try_from(i).expect("few candidates")
}

impl Protocol {
    fn deadline(&self) -> u8 {
        match self.variant {
            Variant::FenceAtTtl => self.ttl,
            _ => self.renew_deadline,
        }
    }

    /// Ticks from now to `stop_by = confirmed + ttl - margin` (`Engine::stop_by`).
    fn stop_in(&self, confirmed: u8) -> u8 {
        let margin = match self.variant {
            Variant::StopByAtTtl => 0,
            _ => self.margin,
        };
        (self.ttl - margin).saturating_sub(confirmed)
    }

    fn fresh_session(&self) -> Session {
        Session {
            confirmed: 0,
            lost: None,
            late: None,
        }
    }

    /// Actions that take no time: the engine reacts at once. Time does not pass while one is
    /// enabled.
    fn urgent(&self, s: &State, actions: &mut Vec<Action>) {
        for (i, c) in s.cands.iter().enumerate() {
            let i8 = idx(i);
            match c.phase {
                Phase::Down { wait: 0 } if c.session.is_none() && c.link => {
                    actions.push(Action::OpenSession(i8));
                }
                Phase::Pursuing | Phase::Leading
                    if c.session.as_ref().is_some_and(|x| x.lost.is_some()) =>
                {
                    actions.push(Action::SessionLost(i8));
                }
                Phase::Pursuing if self.can_acquire(s, i) => actions.push(Action::Acquire(i8)),
                Phase::Leading
                    if c.session
                        .as_ref()
                        .is_some_and(|x| x.confirmed >= self.deadline()) =>
                {
                    actions.push(Action::SelfFence(i8));
                }
                Phase::SteppingDown {
                    worker: true,
                    abort_in,
                    voluntary,
                } if abort_in == 0 || (voluntary && self.lease_in_doubt(c)) => {
                    actions.push(Action::HardStop(i8));
                }
                Phase::SteppingDown { worker: false, .. } => actions.push(Action::Release(i8)),
                _ => {}
            }
        }
    }

    /// After a voluntary end, whether the work must stop now (`Engine::wind_down` halting the
    /// term): the session is lost, or no renewal sent in the last `ttl - margin` was
    /// confirmed. Never for `UncappedGrace`.
    fn lease_in_doubt(&self, c: &Cand) -> bool {
        self.variant != Variant::UncappedGrace
            && c.session
                .as_ref()
                .is_none_or(|x| x.lost.is_some() || self.stop_in(x.confirmed) == 0)
    }

    fn can_acquire(&self, s: &State, i: usize) -> bool {
        let c = &s.cands[i];
        let live = c.session.as_ref().is_some_and(|x| x.lost.is_none());
        let free = match s.store.lock {
            Lock::Free => s.store.delay == 0,
            // `acquire` is idempotent: a session that holds the lock wins it again.
            Lock::Held(h) => usize::from(h) == i,
            Lock::Orphan { .. } => false,
        };
        live && c.link && s.store.sessions[i].is_some() && free
    }

    /// `close_in_background`: destroys the session in the store if the store can be reached;
    /// otherwise the store keeps it until it expires, with the lock if it holds it.
    fn abandon(&self, s: &mut State, i: usize) {
        let c = &mut s.cands[i];
        if c.session.take().is_none() {
            return;
        }
        let held = s.store.lock == Lock::Held(idx(i));
        let age = s.store.sessions[i].take();
        if held {
            if c.link {
                s.store.lock = Lock::Free;
                s.store.delay = self.lock_delay;
            } else if let Some(age) = age {
                s.store.lock = Lock::Orphan { cand: idx(i), age };
            }
        }
    }

    fn tick(&self, s: &mut State, fates: [Fate; N]) {
        let leading = s.cands.iter().any(|c| c.phase == Phase::Leading);
        s.leaderless = match (s.calm, leading) {
            (true, false) => (s.leaderless + 1).min(self.leader_within + 1),
            _ => 0,
        };
        // The store: lease expiry, ticks after it last heard a renewal. It expires a session
        // at the start of the tick its ttl runs out, before anything else in that tick.
        s.store.delay = s.store.delay.saturating_sub(1);
        for (i, session) in s.store.sessions.iter_mut().enumerate() {
            if let Some(age) = session {
                *age += 1;
                if *age >= self.ttl {
                    *session = None;
                    if s.store.lock == Lock::Held(idx(i)) {
                        s.store.lock = Lock::Free;
                        s.store.delay = self.lock_delay;
                    }
                }
            }
        }
        if let Lock::Orphan { age, .. } = &mut s.store.lock {
            *age += 1;
            if *age >= self.ttl {
                s.store.lock = Lock::Free;
                s.store.delay = self.lock_delay;
            }
        }
        for (i, fate) in fates.into_iter().enumerate() {
            let c = &mut s.cands[i];
            match &mut c.phase {
                Phase::Down { wait } => *wait = wait.saturating_sub(1),
                Phase::SteppingDown { abort_in, .. } => *abort_in = abort_in.saturating_sub(1),
                _ => {}
            }
            if let Some(x) = &mut c.session
                && x.lost.is_none()
            {
                x.confirmed = (x.confirmed + 1).min(self.ttl);
                // Last tick's renewal, answered now (if the link is still up).
                if let Some(late) = x.late.take()
                    && c.link
                {
                    let store = &mut s.store.sessions[i];
                    let alive = late == Late::Reply || store.is_some();
                    if late == Late::Request && alive {
                        *store = Some(0);
                    }
                    self.answered(x, alive, 1);
                }
                if x.lost.is_none() && x.confirmed >= self.ttl {
                    // `KeepAlive`: no renewal confirmed for a whole ttl.
                    x.lost = Some(Loss::Unconfirmed);
                }
                // `KeepAlive`: the next renewal (one every tick: renew interval = 1 tick).
                if x.lost.is_none() && c.link {
                    let store = &mut s.store.sessions[i];
                    let alive = store.is_some();
                    if alive && matches!(fate, Fate::Ok | Fate::LostReply | Fate::SlowReply) {
                        *store = Some(0);
                    }
                    match fate {
                        Fate::Ok => self.answered(x, alive, 0),
                        Fate::LostRequest | Fate::LostReply => {}
                        Fate::SlowReply => x.late = Some(Late::Reply),
                        Fate::SlowRequest => x.late = Some(Late::Request),
                    }
                }
            }
            // `Engine::run` after the cool-down: pursue with the session it kept, or open a
            // new one if that session was lost meanwhile.
            let kept = match (&c.phase, &c.session) {
                (Phase::Down { wait: 0 }, Some(x)) => Some(x.lost.is_none()),
                _ => None,
            };
            match kept {
                Some(true) => c.phase = Phase::Pursuing,
                Some(false) => self.abandon(s, i),
                None => {}
            }
        }
    }

    /// `KeepAlive` gets the store's answer to a renewal sent `sent` ticks ago.
    fn answered(&self, x: &mut Session, alive: bool, sent: u8) {
        if alive {
            let base = match self.variant {
                Variant::DeadlineFromReceive => 0,
                _ => sent,
            };
            x.confirmed = x.confirmed.min(base);
        } else {
            x.lost = Some(Loss::Expired);
            x.late = None;
        }
    }

    /// `Engine::lead` after the term ends: `stop_by` is `None` for a voluntary end, now for a
    /// session the store gave up, and `confirmed + ttl - margin` otherwise.
    fn end_term(&self, c: &mut Cand, voluntary: bool) {
        let x = c.session.as_ref().expect("a leader has a session");
        let abort_in = if voluntary {
            self.grace
        } else if x.lost == Some(Loss::Expired) {
            0
        } else {
            self.grace.min(self.stop_in(x.confirmed))
        };
        c.phase = Phase::SteppingDown {
            worker: true,
            abort_in,
            voluntary,
        };
    }
}

impl Model for Protocol {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let cand = Cand {
            phase: Phase::Down { wait: 0 },
            session: None,
            link: true,
            last_current: false,
        };
        vec![State {
            cands: [cand.clone(), cand.clone(), cand],
            store: Store {
                sessions: [None; N],
                lock: Lock::Free,
                delay: 0,
            },
            faults_left: self.faults,
            calm: false,
            leaderless: 0,
            term_has_newest: false,
            token_reused: false,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        self.urgent(s, actions);
        let faulty = !s.calm && s.faults_left > 0;
        if actions.is_empty() {
            // Every combination of fates for the renewals sent now, within the fault budget.
            let senders: Vec<bool> = s
                .cands
                .iter()
                .map(|c| c.link && c.session.as_ref().is_some_and(|x| x.lost.is_none()))
                .collect();
            let mut fates = vec![[Fate::Ok; N]];
            if faulty {
                for i in (0..N).filter(|&i| senders[i]) {
                    let mut more = Vec::new();
                    for f in &fates {
                        let used = f.iter().filter(|&&x| x != Fate::Ok).count();
                        if usize::from(s.faults_left) > used {
                            for fate in &FATES[1..] {
                                let mut g = *f;
                                g[i] = *fate;
                                more.push(g);
                            }
                        }
                    }
                    fates.extend(more);
                }
            }
            actions.extend(fates.into_iter().map(Action::Tick));
        }
        for (i, c) in s.cands.iter().enumerate() {
            let i8 = idx(i);
            if matches!(c.phase, Phase::SteppingDown { worker: true, .. }) {
                actions.push(Action::WorkerReturns(i8));
            }
            if !c.link && !s.calm {
                actions.push(Action::Heal(i8));
            }
            if faulty {
                if c.link {
                    actions.push(Action::Partition(i8));
                }
                if c.phase == Phase::Leading {
                    actions.push(Action::Resign(i8));
                }
            }
        }
        if !s.calm && s.cands.iter().all(|c| c.link) {
            actions.push(Action::FaultsStop);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Tick(fates) => {
                let used = fates.iter().filter(|&&f| f != Fate::Ok).count();
                s.faults_left -= u8::try_from(used).expect("few candidates");
                self.tick(&mut s, fates);
            }
            Action::OpenSession(i) => {
                let i = usize::from(i);
                s.store.sessions[i] = Some(0);
                s.cands[i].session = Some(self.fresh_session());
                s.cands[i].phase = Phase::Pursuing;
            }
            Action::Acquire(i) => {
                let iu = usize::from(i);
                if s.store.lock == Lock::Free {
                    // A new token, above every earlier one.
                    s.store.lock = Lock::Held(i);
                    s.term_has_newest = false;
                    for c in &mut s.cands {
                        c.last_current = false;
                    }
                }
                let c = &mut s.cands[iu];
                let x = c.session.as_ref().expect("a candidate has a session");
                let trusted = self.variant == Variant::ReuseSessionSkipCheckWin
                    || (x.confirmed < self.renew_deadline && !c.last_current);
                if trusted {
                    c.phase = Phase::Leading;
                    c.last_current = true;
                    if s.term_has_newest {
                        s.token_reused = true;
                    }
                    s.term_has_newest = true;
                } else {
                    // Released (the link is up), then `Pursuit::SessionLost`.
                    s.store.lock = Lock::Free;
                    self.abandon(&mut s, iu);
                    s.cands[iu].phase = Phase::Down { wait: self.backoff };
                }
            }
            Action::SelfFence(i) => self.end_term(&mut s.cands[usize::from(i)], false),
            Action::SessionLost(i) => {
                let iu = usize::from(i);
                if s.cands[iu].phase == Phase::Leading {
                    self.end_term(&mut s.cands[iu], false);
                } else {
                    self.abandon(&mut s, iu);
                    s.cands[iu].phase = Phase::Down { wait: self.backoff };
                }
            }
            Action::HardStop(i) | Action::WorkerReturns(i) => {
                if let Phase::SteppingDown { worker, .. } = &mut s.cands[usize::from(i)].phase {
                    *worker = false;
                }
            }
            Action::Release(i) => {
                let iu = usize::from(i);
                let Phase::SteppingDown { voluntary, .. } = s.cands[iu].phase else {
                    unreachable!("released while stepping down");
                };
                let released = s.cands[iu].link;
                if released && s.store.lock == Lock::Held(i) {
                    s.store.lock = Lock::Free;
                }
                let alive = s.cands[iu]
                    .session
                    .as_ref()
                    .is_some_and(|x| x.lost.is_none());
                let trusted = match self.variant {
                    Variant::ReuseSessionSkipCheckWin => alive,
                    _ => released && voluntary && alive,
                };
                if !trusted {
                    self.abandon(&mut s, iu);
                }
                s.cands[iu].phase = Phase::Down { wait: self.backoff };
            }
            Action::Partition(i) => {
                s.faults_left -= 1;
                s.cands[usize::from(i)].link = false;
            }
            Action::Heal(i) => s.cands[usize::from(i)].link = true,
            Action::Resign(i) => {
                s.faults_left -= 1;
                self.end_term(&mut s.cands[usize::from(i)], true);
            }
            Action::FaultsStop => s.calm = true,
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("at most one uncancelled term", |_, s: &State| {
                s.cands.iter().filter(|c| c.phase == Phase::Leading).count() <= 1
            }),
            Property::always("no work overlaps another term", |_, s: &State| {
                s.cands.iter().filter(|c| working(c)).count() <= 1
            }),
            Property::always("fencing tokens strictly grow", |_, s: &State| {
                !s.token_reused
            }),
            Property::always(
                "a leader within the bound once faults stop",
                |m: &Protocol, s: &State| s.leaderless <= m.leader_within,
            ),
            // Reachability: the checker sees the situations the properties are about.
            Property::sometimes(
                "a leader fences itself with its lock still held",
                |_, s: &State| {
                    s.cands.iter().enumerate().any(|(i, c)| {
                        matches!(
                            c.phase,
                            Phase::SteppingDown {
                                worker: true,
                                voluntary: false,
                                ..
                            }
                        ) && s.store.lock == Lock::Held(idx(i))
                    })
                },
            ),
            Property::sometimes("an orphaned session holds the lock", |_, s: &State| {
                matches!(s.store.lock, Lock::Orphan { .. })
            }),
            Property::sometimes(
                "a new leader while the old worker winds down",
                |_, s: &State| {
                    s.cands.iter().any(|c| c.phase == Phase::Leading)
                        && s.cands.iter().any(|c| {
                            matches!(c.phase, Phase::SteppingDown { .. } | Phase::Down { .. })
                                && c.session.is_some()
                        })
                },
            ),
        ]
    }
}

/// A candidate whose work may still be running: its term is in force, or it ended and the
/// worker has neither returned nor been aborted.
fn working(c: &Cand) -> bool {
    matches!(
        c.phase,
        Phase::Leading | Phase::SteppingDown { worker: true, .. }
    )
}

impl Representative for State {
    /// The candidates are interchangeable: sort them, and renumber the lock's holder.
    fn representative(&self) -> Self {
        let mut order: Vec<usize> = (0..N).collect();
        order.sort_by(|&a, &b| {
            (&self.cands[a], self.store.sessions[a]).cmp(&(&self.cands[b], self.store.sessions[b]))
        });
        let mut rank = [0u8; N];
        for (new, &old) in order.iter().enumerate() {
            rank[old] = idx(new);
        }
        let mut s = self.clone();
        for (new, &old) in order.iter().enumerate() {
            s.cands[new] = self.cands[old].clone();
            s.store.sessions[new] = self.store.sessions[old];
        }
        s.store.lock = match self.store.lock {
            Lock::Held(h) => Lock::Held(rank[usize::from(h)]),
            Lock::Orphan { cand, age } => Lock::Orphan {
                cand: rank[usize::from(cand)],
                age,
            },
            Lock::Free => Lock::Free,
        };
        s
    }
}

/// The states explored, and the time it took.
struct Figures {
    states: usize,
    unique: usize,
    depth: usize,
    seconds: f64,
}

/// Checks the whole state space, depth first with symmetry reduction.
fn check_all(model: Protocol) -> (impl Checker<Protocol>, Figures) {
    let started = Instant::now();
    let checker = model.checker().threads(2).symmetry().spawn_dfs().join();
    let figures = Figures {
        states: checker.state_count(),
        unique: checker.unique_state_count(),
        depth: checker.max_depth(),
        seconds: started.elapsed().as_secs_f64(),
    };
    (checker, figures)
}

/// Searches breadth first, for the shortest counterexample to `property`.
fn find_counterexample(model: Protocol, property: &'static str) -> (Path<State, Action>, Figures) {
    let started = Instant::now();
    let checker = model
        .checker()
        .threads(1)
        .finish_when(HasDiscoveries::AnyFailures)
        .spawn_bfs()
        .join();
    let figures = Figures {
        states: checker.state_count(),
        unique: checker.unique_state_count(),
        depth: checker.max_depth(),
        seconds: started.elapsed().as_secs_f64(),
    };
    let path = checker.assert_any_discovery(property);
    (path, figures)
}

fn print_figures(title: &str, f: &Figures) {
    println!(
        "{title}: {} states ({} unique), depth {}, {:.1} s",
        f.states, f.unique, f.depth, f.seconds
    );
}

/// The counterexample as one line per action, with the tick it happens in.
fn print_path(path: &Path<State, Action>) -> String {
    let mut out = String::new();
    let mut tick = 0;
    for (state, action) in path.clone().into_vec() {
        let Some(action) = action else {
            let _ = writeln!(out, "  end: {}", summary(&state));
            continue;
        };
        if let Action::Tick(_) = action {
            tick += 1;
        }
        let _ = writeln!(out, "  t={tick:<2} {action:?}");
    }
    out
}

/// A short view of a state: each candidate's phase and the lock.
fn summary(s: &State) -> String {
    let cands: Vec<String> = s
        .cands
        .iter()
        .map(|c| match c.phase {
            Phase::Down { .. } => "down".into(),
            Phase::Pursuing => "pursuing".into(),
            Phase::Leading => "LEADING".into(),
            Phase::SteppingDown { worker: true, .. } => "stepping down, worker running".into(),
            Phase::SteppingDown { .. } => "stepping down".into(),
        })
        .collect();
    format!("candidates [{}], lock {:?}", cands.join(", "), s.store.lock)
}

fn assert_keeps_its_promises(title: &str, model: Protocol) {
    let (checker, figures) = check_all(model.promised_bound());
    print_figures(title, &figures);
    checker.assert_properties();
}

#[test]
fn the_protocol_keeps_its_promises() {
    assert_keeps_its_promises(
        "correct, no lock-delay (etcd)",
        Protocol::new(Variant::Correct),
    );
}

#[test]
fn the_protocol_keeps_its_promises_with_a_lock_delay() {
    assert_keeps_its_promises(
        "correct, lock-delay 2 (Consul)",
        Protocol::new(Variant::Correct).lock_delay(2),
    );
}

#[test]
fn the_protocol_keeps_its_promises_at_the_longest_renew_deadline() {
    // The builder accepts a renew deadline up to ttl - ttl/5: 4 ticks of 5.
    assert_keeps_its_promises(
        "correct, renew deadline 4 (the most the builder accepts)",
        Protocol::new(Variant::Correct).renew_deadline(4),
    );
}

/// The liveness check is not vacuous: one tick less than the promised bound is not enough.
#[test]
fn the_liveness_bound_is_tight() {
    for model in [
        Protocol::new(Variant::Correct),
        Protocol::new(Variant::Correct).lock_delay(2),
    ] {
        let mut model = model.promised_bound();
        model.leader_within -= 1;
        let title = format!(
            "bound {} ticks, lock-delay {}",
            model.leader_within, model.lock_delay
        );
        let (path, figures) =
            find_counterexample(model, "a leader within the bound once faults stop");
        print_figures(&title, &figures);
        println!("no leader for too long:\n{}", print_path(&path));
    }
}

fn assert_caught(variant: Variant, property: &'static str) {
    let (path, figures) = find_counterexample(Protocol::new(variant), property);
    print_figures(&format!("{variant:?}"), &figures);
    println!("counterexample to \"{property}\":\n{}", print_path(&path));
}

#[test]
fn an_uncapped_grace_is_caught() {
    assert_caught(Variant::UncappedGrace, "no work overlaps another term");
}

#[test]
fn fencing_at_the_ttl_is_caught() {
    assert_caught(Variant::FenceAtTtl, "at most one uncancelled term");
}

#[test]
fn a_deadline_from_the_receive_time_is_caught() {
    assert_caught(
        Variant::DeadlineFromReceive,
        "no work overlaps another term",
    );
}

#[test]
fn a_hard_stop_without_margin_is_caught() {
    assert_caught(Variant::StopByAtTtl, "no work overlaps another term");
}

#[test]
fn reusing_a_doubtful_session_without_check_win_is_caught() {
    assert_caught(
        Variant::ReuseSessionSkipCheckWin,
        "fencing tokens strictly grow",
    );
}
