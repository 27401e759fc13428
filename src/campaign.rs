//! The campaign: the one state machine, generic over the backend.
//!
//! ```text
//!            ┌────────────┐ session open  ┌───────────┐  Won   ┌────────┐
//!  start ──▶ │ Connecting │ ────────────▶ │ Candidate │ ─────▶ │ Leader │
//!            └────────────┘               └───────────┘        └────────┘
//!                  ▲                   Held │    ▲ wait()          │ lost / deadline /
//!                  │ session lost           ▼    │ returns         │ resign / shutdown
//!                  │                     ┌──────────┐              ▼
//!                  └──────────────────── │ Follower │      cancel term, wait for guards
//!                                        └──────────┘      (≤ grace), release, then
//!                          CoolingDown ◀──────────────────  back-off or lock-delay
//! ```
//!
//! Read [`Engine::run`] top to bottom: [`Engine::open_session`] connects,
//! [`Engine::pursue`] is everything before winning ([`Engine::follow`] the wait behind a
//! holder, [`Engine::wait_until`] a back-off or a lock-delay), [`Engine::lead`] everything
//! while leading ([`Engine::take_office`], [`Engine::hold_office`] until something ends the
//! term, [`Engine::hand_over`] after it is cancelled), and the loop around them is
//! re-election ([`Engine::cool_down`] between terms). Every wait outside a term goes through
//! [`Inbox::unless_interrupted`], so commands and the session's loss are handled one way in
//! every state: a shutdown or a lost session interrupts; a resign or a proclaim is answered
//! (there is no term to end or update) and the wait goes on.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use futures_core::Stream;
use tokio::sync::{oneshot, watch};
use tokio::time::{Instant, sleep, sleep_until, timeout, timeout_at};
use tracing::Instrument;

use crate::backend::{
    Attempt, Backend, Contender, FencingToken, Leader, LockLoss, Observer, Session, SessionHealth,
    Settling, ShutdownNotice, Wakeup, lock, unix_ms_now,
};
use crate::config::Config;
use crate::event::{DemotionReason, LeadershipEvent, Problem, Role, Status};
use crate::fence::{Fence, Freshness};
use crate::queue::{Fanout, QueueReceiver, QueueSender, queue};
use crate::switchover::{
    self, HandOverError, HandOverStyle, HandedOver, Request, presence_name, request_name,
};
use crate::term::{ElectionConfig, Gap, Guards, Term};
use crate::{Error, Result, metrics};

/// A running campaign for one election: a [`Stream`] of [`LeadershipEvent`]s, plus control.
///
/// Made by [`Election::campaign`](crate::Election::campaign). The campaign runs in a task of
/// its own until [`shutdown`](Campaign::shutdown); dropping the `Campaign` shuts it down in the
/// background (the worker is cancelled, the lock released, the session closed).
/// [`handle`](Campaign::handle) gives a cloneable [`CampaignHandle`] for other tasks.
///
/// Events are never dropped: every subscriber has its own unbounded queue, so a slow
/// subscriber never stalls the campaign (events are rare: a few per term).
#[derive(Debug)]
pub struct Campaign {
    events: Events,
    handle: CampaignHandle,
}

/// Control of a running campaign; cheap to clone. It does not keep the campaign alive.
#[derive(Clone, Debug)]
pub struct CampaignHandle {
    shared: Arc<Shared>,
}

/// How many events each subscriber's queue ([`Campaign`], [`Events`]) keeps while they are
/// not read: past it, the oldest is dropped for the newest, so a subscriber that never reads
/// costs a bounded amount of memory and never holds the campaign back. Dropped events are
/// counted ([`Events::missed`], [`Campaign::missed_events`]). Nothing unsafe follows from a
/// dropped event: a [`Term`](crate::Term) carries its own cancellation, and the status
/// always says where the campaign stands.
pub const EVENT_QUEUE_CAPACITY: usize = 1024;

/// A stream of a campaign's [`LeadershipEvent`]s, from when it was subscribed. It ends when
/// the campaign has stopped. At most [`EVENT_QUEUE_CAPACITY`] unread events are kept.
#[derive(Debug)]
pub struct Events {
    rx: QueueReceiver<LeadershipEvent>,
}

#[derive(Debug)]
struct Shared {
    commands: QueueSender<Command>,
    status: watch::Receiver<Status>,
    subscribers: Subscribers,
    /// The [`ShutdownNotice`] of the campaign's session, while it has one: given by whoever
    /// asks the campaign to shut down, at the moment of the ask. The engine (which holds
    /// this weakly) empties it before its session is closed or dropped.
    notice: Mutex<Option<ShutdownNotice>>,
}

impl Shared {
    /// Gives the session's notice, if any (under its lock: the engine cannot close the
    /// session meanwhile).
    fn give_notice(&self) {
        if let Some(notice) = lock(&self.notice).as_ref() {
            notice.give();
        }
    }
}

type Subscribers = Fanout<LeadershipEvent>;

/// Answers a shutdown: with the rest of the release the store is finishing, if any, for the
/// caller to await ([`Contender::leave`]).
type ShutdownDone = oneshot::Sender<Option<Settling>>;

#[derive(Debug)]
enum Command {
    Resign {
        reason: DemotionReason,
        done: oneshot::Sender<()>,
        /// How long not to campaign afterwards ([`CampaignHandle::resign_for`]).
        yield_for: Option<Duration>,
    },
    Shutdown {
        done: Option<ShutdownDone>,
    },
    Proclaim {
        metadata: BTreeMap<String, String>,
        done: oneshot::Sender<Result<()>>,
    },
    HandOver {
        to: String,
        /// The reservation window; `None`: the election's.
        window: Option<Duration>,
        /// Who waits for the outcome; `None` for a request read from the store.
        done: Option<oneshot::Sender<Result<HandedOver>>>,
    },
}

impl Stream for Events {
    type Item = LeadershipEvent;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx)
    }
}

impl Events {
    /// The next event, or `None` once the campaign has stopped.
    pub async fn recv(&mut self) -> Option<LeadershipEvent> {
        self.rx.recv().await
    }

    /// How many events were dropped unread because [`EVENT_QUEUE_CAPACITY`] were waiting.
    pub fn missed(&self) -> u64 {
        self.rx.dropped()
    }
}

impl Stream for Campaign {
    type Item = LeadershipEvent;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Pin::new(&mut self.events).poll_next(cx)
    }
}

impl Campaign {
    /// The next event, or `None` once the campaign has stopped.
    pub async fn recv(&mut self) -> Option<LeadershipEvent> {
        self.events.recv().await
    }

    /// How many events were dropped unread because [`EVENT_QUEUE_CAPACITY`] were waiting.
    pub fn missed_events(&self) -> u64 {
        self.events.missed()
    }

    /// A cloneable handle for other tasks.
    pub fn handle(&self) -> CampaignHandle {
        self.handle.clone()
    }

    /// See [`CampaignHandle::status`].
    pub fn status(&self) -> watch::Receiver<Status> {
        self.handle.status()
    }

    /// See [`CampaignHandle::subscribe`].
    pub fn subscribe(&self) -> Events {
        self.handle.subscribe()
    }

    /// See [`CampaignHandle::resign`].
    pub async fn resign(&self) -> Result<()> {
        self.handle.resign().await
    }

    /// See [`CampaignHandle::resign_for`].
    pub async fn resign_for(&self, duration: Duration) -> Result<()> {
        self.handle.resign_for(duration).await
    }

    /// See [`CampaignHandle::proclaim`].
    pub async fn proclaim(&self, metadata: BTreeMap<String, String>) -> Result<()> {
        self.handle.proclaim(metadata).await
    }

    /// See [`CampaignHandle::hand_over`].
    pub async fn hand_over(&self, to: impl Into<String>) -> Result<HandedOver> {
        self.handle.hand_over(to).await
    }

    /// See [`CampaignHandle::shutdown`]: the shutdown starts when this is called; the
    /// future returned waits for it to end. It holds the campaign until the campaign has
    /// stopped, and frees it while the store finishes the release (the events nobody read,
    /// the status): of many campaigns shut down at once, that work overlaps the store's. To
    /// stop many, [`shutdown_all`](Self::shutdown_all) is the cheap way.
    pub fn shutdown(self) -> impl Future<Output = Result<()>> + Send + 'static {
        let stopping = self.handle.stop();
        async move {
            let settling = stopping.await;
            drop(self);
            if let Some(settling) = settling {
                settling.await;
            }
            Ok(())
        }
    }

    /// Shuts every campaign of `campaigns` down at once, and returns once all have stopped
    /// (each [`shutdown`](Self::shutdown)'s promise). Every campaign is asked at this call,
    /// not when the future is first polled; the future then awaits their ends in order, in
    /// the caller's task.
    ///
    /// This is the cheap way to stop many: a task per shutdown costs more than the
    /// shutdowns (a task each to spawn, schedule and free), and so does `join_all` over
    /// thousands of them, whose `FuturesUnordered` polls again each shutdown that tokio's
    /// per-task budget turned away. Stopping 100,000 etcd campaigns in one process took
    /// 1.7 s (1.8 s of the process's CPU) this way, against 2.0 s (2.6 s of CPU) with a task
    /// each (BENCHMARKS.md, "Scale").
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> incumbent::Result<()> {
    /// use incumbent::{Campaign, Election, memory::MemoryBackend};
    ///
    /// let backend = MemoryBackend::new();
    /// let campaigns: Vec<Campaign> = (0..100)
    ///     .map(|i| Election::builder(backend.clone(), format!("job/{i}")).build().map(|e| e.campaign()))
    ///     .collect::<incumbent::Result<_>>()?;
    /// Campaign::shutdown_all(campaigns).await?;
    /// # Ok(()) }
    /// ```
    pub fn shutdown_all(
        campaigns: impl IntoIterator<Item = Campaign>,
    ) -> impl Future<Output = Result<()>> + Send + 'static {
        await_in_order(campaigns.into_iter().map(Campaign::shutdown).collect())
    }
}

/// Awaits `stopping` (shutdowns already asked) in order, every one of them; the first error,
/// if any, once all have ended.
pub(crate) async fn await_in_order<F>(stopping: Vec<F>) -> Result<()>
where
    F: Future<Output = Result<()>>,
{
    let mut first_error = Ok(());
    for shutdown in stopping {
        if let Err(error) = shutdown.await
            && first_error.is_ok()
        {
            first_error = Err(error);
        }
    }
    first_error
}

impl Drop for Campaign {
    fn drop(&mut self) {
        self.handle.shared.give_notice();
        let _ = self
            .handle
            .shared
            .commands
            .send(Command::Shutdown { done: None });
    }
}

impl CampaignHandle {
    /// The campaign's status, readable at any time and updated at every transition.
    pub fn status(&self) -> watch::Receiver<Status> {
        self.shared.status.clone()
    }

    /// Another stream of the campaign's events, from now on.
    pub fn subscribe(&self) -> Events {
        Events {
            rx: self.shared.subscribers.add(),
        }
    }

    /// Steps down if leading: cancels the term, waits for its guards (at most the grace),
    /// releases the lock, then campaigns again after the back-off, which gives the other
    /// candidates the lock first (on the stores that do not queue their candidates, the
    /// campaign also leaves the lock it released alone for a while: `backend::PUSH_COURTESY`
    /// where the store pushes the release, `backend::polled::COURTESY_POLLS` poll intervals
    /// where followers poll). Returns once the lock is released. A candidate that does not
    /// lead has nothing to give up: it returns at once. Errors with [`Error::Stopped`] if the
    /// campaign has stopped.
    pub async fn resign(&self) -> Result<()> {
        self.resign_because(DemotionReason::Resigned).await
    }

    /// Steps down as [`resign`](Self::resign) does, and does not campaign again for
    /// `duration`, so that this candidate cannot win straight back: a follower leaves the
    /// line at once (its claim is withdrawn from the store) and a leader after its release;
    /// either campaigns again when `duration` has passed. Meanwhile the status says
    /// [`Role::CoolingDown`] until then. A second call extends the wait, never shortens it;
    /// a shutdown ends it. Returns once the lock is released (a leader) or the claim is
    /// withdrawn (a follower). Errors with [`Error::Stopped`] if the campaign has stopped.
    pub async fn resign_for(&self, duration: Duration) -> Result<()> {
        self.send_resign(DemotionReason::Resigned, Some(duration))
            .await
    }

    pub(crate) async fn resign_because(&self, reason: DemotionReason) -> Result<()> {
        self.send_resign(reason, None).await
    }

    async fn send_resign(&self, reason: DemotionReason, yield_for: Option<Duration>) -> Result<()> {
        let (done, wait) = oneshot::channel();
        self.shared
            .commands
            .send(Command::Resign {
                reason,
                done,
                yield_for,
            })
            .map_err(|_| Error::Stopped)?;
        wait.await.map_err(|_| Error::Stopped)
    }

    /// Replaces the leader's metadata, as other candidates, observers and `/leader` read it,
    /// without ending the term (etcd's `Proclaim`): e.g. the address the leader now serves
    /// writes on. The store is updated only while this candidate still holds the lock
    /// (compare-and-act), and the new metadata stays for this campaign's later terms.
    ///
    /// Errors with [`Error::NotLeader`] if this candidate does not lead, or its term ends
    /// before the store confirms; with the store's error if the update fails (the term goes
    /// on, with the old metadata). The update is bounded by the renew deadline: a leader
    /// never waits on it past the moment it must fence itself. While it is in flight, a lost
    /// session still ends the term at once; a lock taken away behind the session's back (an
    /// operator deleting the key) is seen when the store refuses the update, since the
    /// update only applies to a lock that is still ours.
    pub async fn proclaim(&self, metadata: BTreeMap<String, String>) -> Result<()> {
        let (done, wait) = oneshot::channel();
        self.shared
            .commands
            .send(Command::Proclaim { metadata, done })
            .map_err(|_| Error::Stopped)?;
        wait.await.map_err(|_| Error::Stopped)?
    }

    /// Hands the election over to the candidate `to`, and returns once `to` leads.
    ///
    /// Called on the leader, the leader checks that `to` is a live candidate, ends its term
    /// (the work stops first, as for a resign; the [`DemotionReason`] is
    /// [`HandedOver`](DemotionReason::HandedOver)), and keeps the next term for `to` for the
    /// [hand-over window](crate::ElectionBuilder::hand_over_window); every other candidate
    /// waits it out. Called on another candidate, the request goes to the leader through the
    /// store ([`Election::hand_over`](crate::Election::hand_over)), and waits at most the
    /// ttl + the grace + the window. `to` being this candidate is a request for the lead.
    /// The steps, per store, are in [`switchover`](crate::switchover).
    ///
    /// Errors ([`Error::HandOver`]): `to` is not a live candidate (nothing moved); another
    /// hand-over is under way; the target did not take office within the window (the
    /// reservation lapsed, an open election followed); nobody leads. [`Error::Stopped`] if the
    /// campaign has stopped.
    pub async fn hand_over(&self, to: impl Into<String>) -> Result<HandedOver> {
        let (done, wait) = oneshot::channel();
        self.shared
            .commands
            .send(Command::HandOver {
                to: to.into(),
                window: None,
                done: Some(done),
            })
            .map_err(|_| Error::Stopped)?;
        wait.await.map_err(|_| Error::Stopped)?
    }

    /// Stops the campaign: cancels the term if leading, waits for its guards (at most the
    /// grace), releases the lock, closes the session, and returns once all that is done.
    /// When the store finishes the release by itself (etcd revoking a lease every campaign
    /// of which is shutting down), the campaign's state is freed meanwhile and this call
    /// awaits the store. Calling it on a stopped campaign returns at once.
    ///
    /// The shutdown starts when this is called, not when the future is first polled: of many
    /// campaigns shut down together, none goes on campaigning (or takes office) while it
    /// waits for its turn to be polled, and all of them are told at once. The store's
    /// session hears of it at the call too ([`Session::shutdown_notice`]): on etcd, once every
    /// campaign on a lease was told, they leave their keys to one revoke of the lease instead
    /// of a delete each.
    pub fn shutdown(&self) -> impl Future<Output = Result<()>> + Send + use<> {
        let stopping = self.stop();
        async move {
            if let Some(settling) = stopping.await {
                // The campaign has stopped; the store is finishing its release.
                settling.await;
            }
            Ok(())
        }
    }

    /// Tells the campaign to stop, now; the future returned resolves once it has, with the
    /// rest of the release the store is finishing, if any.
    fn stop(&self) -> impl Future<Output = Option<Settling>> + Send + use<> {
        self.shared.give_notice();
        let (done, wait) = oneshot::channel();
        let sent = self
            .shared
            .commands
            .send(Command::Shutdown { done: Some(done) })
            .is_ok();
        async move {
            if sent {
                wait.await.ok().flatten()
            } else {
                None
            }
        }
    }
}

/// Starts a campaign. `before_start` may subscribe to events before the first one is sent.
pub(crate) fn spawn<B: Backend>(
    backend: B,
    config: Arc<Config>,
    before_start: impl FnOnce(&CampaignHandle),
) -> Campaign {
    let (commands_tx, commands) = queue();
    let (status, status_rx) = watch::channel(Status {
        election: config.name.clone(),
        candidate: config.candidate.clone(),
        role: Role::Connecting,
        leader: None,
        term: None,
        session: None,
        renew_deadline: config.renew_deadline,
        problem: None,
        last_demotion: None,
        wakeup: backend.info().wakeup,
    });
    let subscribers = Subscribers::new(EVENT_QUEUE_CAPACITY);
    let events = Events {
        rx: subscribers.add(),
    };
    let request: Requester = {
        let backend = backend.clone();
        let config = config.clone();
        Arc::new(move |to, window| {
            let backend = backend.clone();
            let config = config.clone();
            Box::pin(async move {
                let options = switchover::RequestOptions {
                    session: config.session_options(),
                    window,
                    timeout: config.ttl + config.grace + window.unwrap_or(config.hand_over_window),
                };
                switchover::request(&backend, &config.name, &to, &options).await
            })
        })
    };
    let handle = CampaignHandle {
        shared: Arc::new(Shared {
            commands: commands_tx,
            status: status_rx,
            subscribers: subscribers.clone(),
            notice: Mutex::new(None),
        }),
    };
    let shared = Arc::downgrade(&handle.shared);
    before_start(&handle);
    let span = tracing::info_span!(
        "election",
        election = %config.name,
        candidate = %config.candidate.id,
        backend = backend.info().name,
    );
    let engine = Engine {
        backend,
        config,
        inbox: Inbox {
            commands,
            shutdown_waiters: Vec::new(),
            settling: None,
            yield_until: None,
            transfer: None,
            request,
        },
        status,
        subscribers,
        shared,
        leader_reported: false,
        failures: 0,
        quick_losses: 0,
        last_token: None,
        leaderless: Some(Leaderless::seen()),
        presence: None,
        take_over_from: None,
        tried_take_over: None,
        handled_request: None,
        stepped_aside_for: None,
        priority_requests: 0,
        following: None,
        leader_priority: 0,
    };
    tokio::spawn(engine.supervise().instrument(span));
    Campaign { events, handle }
}

/// Polls a future, turning a panic in it into an `Err` with the panic's payload.
pub(crate) struct CatchUnwind<F>(pub(crate) F);

impl<F: Future + Unpin> Future for CatchUnwind<F> {
    type Output = std::thread::Result<F::Output>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let inner = &mut self.0;
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            std::pin::Pin::new(inner).poll(cx)
        })) {
            Ok(std::task::Poll::Pending) => std::task::Poll::Pending,
            Ok(std::task::Poll::Ready(output)) => std::task::Poll::Ready(Ok(output)),
            Err(panic) => std::task::Poll::Ready(Err(panic)),
        }
    }
}

/// The message of a panic's payload.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

struct Engine<B: Backend> {
    backend: B,
    config: Arc<Config>,
    inbox: Inbox,
    status: watch::Sender<Status>,
    subscribers: Subscribers,
    /// What the campaign's handles share, for the session's shutdown notice
    /// ([`Shared::notice`]). Weak: the engine's hold must not keep the commands' queue open.
    shared: std::sync::Weak<Shared>,
    /// Whether a leader (or none) was reported yet: later, `LeaderChanged` is sent only
    /// when the status's leader changes.
    leader_reported: bool,
    /// Consecutive failures, for the back-off.
    failures: u32,
    /// Consecutive terms that ended within a ttl of starting, for the cool-down: a worker
    /// that fails at once, or a store that takes the lock away at once, must not make the
    /// candidate win and lose in a hot loop.
    quick_losses: u32,
    /// The token of our last term: a new term must have a greater one.
    last_token: Option<FencingToken>,
    /// Since when this candidate has seen the election without a leader (from its start,
    /// the leader's key going, a lock-delay, or its own loss), for the term's [`Gap`]; `None`
    /// while it sees another candidate lead.
    leaderless: Option<Leaderless>,
    /// This candidate's presence record ([`switchover`]), with the id of the session that
    /// holds it, on stores that keep no line of candidates.
    /// (A mutex only to keep the engine `Sync`: it is reached through `&mut self`.)
    presence: Option<Box<(String, Mutex<ContenderOf<B>>)>>,
    /// A leader whose value names this candidate as the target of a hand-over, to take the
    /// lock over from ([`Contender::take_over`]).
    take_over_from: Option<Box<Leader>>,
    /// The last such leader tried, so that a take-over the store refuses is not retried in
    /// a loop.
    tried_take_over: Option<Box<Leader>>,
    /// The id of the last hand-over request read from the store, served once.
    handled_request: Option<String>,
    /// The target of a hand-over for which this candidate stepped out of the line (etcd,
    /// ZooKeeper): it comes back when the target (or anyone) leads, or the window ends.
    stepped_aside_for: Option<Box<(String, Instant)>>,
    /// Requests for the lead this candidate made as a preferred candidate, since it last led:
    /// each doubles the settle time before the next.
    priority_requests: u32,
    /// The leader this candidate has followed without a break, and since when: a preferred
    /// candidate asks for the lead once it has for its settle time.
    following: Option<Box<(String, Instant)>>,
    /// The priority of the leader followed (0 when it has none).
    leader_priority: u32,
}

/// What a follower does about the leader it sees.
enum Heed {
    Follow,
    /// The leader hands over to this candidate: take the lock over.
    TakeOver,
    /// The leader hands over to another candidate, on a store that keeps a line: step out of
    /// it.
    StepAside,
}

/// The priority a leader's metadata publishes; 0 without one (or an unreadable one).
fn priority_of(leader: &Leader) -> u32 {
    leader
        .candidate
        .metadata
        .get(crate::config::PRIORITY_KEY)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0)
}

/// Asks the leader through the store, for a candidate that does not lead.
type Requester = Arc<
    dyn Fn(String, Option<Duration>) -> Pin<Box<dyn Future<Output = Result<HandedOver>> + Send>>
        + Send
        + Sync,
>;

/// Since when a candidate has seen its election without a leader.
#[derive(Clone, Copy, Debug)]
struct Leaderless {
    since: Instant,
    /// This process's own term ended then: the election's last trusted leader is known.
    exact: bool,
}

impl Leaderless {
    /// Seen now, by a candidate that does not know when the last term ended.
    fn seen() -> Leaderless {
        Leaderless {
            since: Instant::now(),
            exact: false,
        }
    }

    /// Now, when this process's own term ended.
    fn own_term_ended() -> Leaderless {
        Leaderless {
            since: Instant::now(),
            exact: true,
        }
    }
}

impl<B: Backend> Drop for Engine<B> {
    fn drop(&mut self) {
        self.stopped();
    }
}

/// The hard stop after an involuntary loss comes this fraction of the ttl (1/10) before the
/// store can expire the lease: room for the kill to land and for clocks that run at slightly
/// different rates.
pub const HARD_STOP_MARGIN_DIVISOR: u32 = 10;

/// Ends its term when dropped, unless it has ended already: a campaign task that panics, or
/// is dropped with its runtime, leaves no trusted term behind.
struct InForce(Term);

impl InForce {
    fn end(&self, stop_by: Option<Instant>) {
        self.0.end(stop_by);
    }
}

impl Drop for InForce {
    fn drop(&mut self) {
        if !self.0.is_cancelled() {
            self.0.end(Some(Instant::now()));
        }
    }
}

type ContenderOf<B> = <<B as Backend>::Session as Session>::Contender;

/// A contender, boxed: it is handed from state to state (pursuing, leading, handing over),
/// and a future that holds one by value holds room for it in every state, sometimes twice
/// (an `async fn`'s argument and its local). Boxed, it is one allocation of its own size.
type Claim<B> = Box<ContenderOf<B>>;

/// How [`Engine::pursue`] ended.
enum Pursuit<C> {
    Won(C, FencingToken),
    /// The session is lost or cannot be trusted: open a new one.
    SessionLost,
    /// A resign asked this candidate not to campaign until [`Inbox::yield_until`]; its claim
    /// is withdrawn.
    Yield,
    Stop,
}

/// A term in office: what [`Engine::take_office`] sets up and [`Engine::hand_over`] ends.
struct Office {
    span: tracing::Span,
    /// The leader as the store shows it, once a proclaim changed its metadata; until then
    /// it is the term's ([`Office::leader`]), and no copy of it is kept here.
    proclaimed: Option<Box<Leader>>,
    fencing_token: FencingToken,
    in_force: InForce,
    /// Completes once every guard of the term is dropped.
    guards: Guards,
}

impl Office {
    /// The leader as the store shows it.
    fn leader(&self) -> &Leader {
        self.proclaimed
            .as_deref()
            .unwrap_or_else(|| self.in_force.0.leader())
    }

    /// The leader as the store shows it, for a proclaim to change.
    fn leader_mut(&mut self) -> &mut Leader {
        let term = &self.in_force.0;
        self.proclaimed
            .get_or_insert_with(|| Box::new(term.leader().clone()))
    }
}

/// How [`Engine::hold_office`] ended; the term is cancelled already.
struct TermEnd {
    reason: DemotionReason,
    /// The lock's loss as the contender saw it, for the backend to explain.
    lock_loss: Option<LockLoss>,
    /// When the work must have stopped (see [`Term::stop_by`]).
    stop_by: Option<Instant>,
    /// A resign waiting to hear that the lock is released.
    resign_done: Option<oneshot::Sender<()>>,
    health: watch::Receiver<SessionHealth>,
    /// The hand-over that ended the term, if one did.
    transfer: Option<Transfer>,
}

/// A hand-over asked of the leader: by a handle (`done` waits for the outcome) or through
/// the store (`request`: the requester's id, to say why in the leader's value if refused).
struct Ask<'a> {
    to: String,
    window: Option<Duration>,
    done: Option<oneshot::Sender<Result<HandedOver>>>,
    request: Option<&'a str>,
}

/// How [`Engine::prepare_hand_over`] ended.
enum Prepared {
    Ready(Transfer),
    /// Refused (or to the leader itself); the answer is sent, the term goes on.
    Refused,
    /// The lock was lost meanwhile: the term ends at once.
    Lost(LockLoss),
}

impl Prepared {
    /// How the term ends, if it does: handed over (`transfer` set) or lost; `None`: it goes on.
    fn ends_term(
        self,
        transfer: &mut Option<Transfer>,
    ) -> Option<(DemotionReason, Option<LockLoss>)> {
        match self {
            Prepared::Ready(ready) => {
                *transfer = Some(ready);
                Some((DemotionReason::HandedOver, None))
            }
            Prepared::Refused => None,
            Prepared::Lost(loss) => Some((DemotionReason::from_lock(loss), Some(loss))),
        }
    }
}

/// Why a hand-over cannot go on.
enum NotReady {
    Refused(Error),
    Lost(LockLoss),
}

impl From<Error> for NotReady {
    fn from(error: Error) -> Self {
        NotReady::Refused(error)
    }
}

/// A hand-over that ended the term: the next one is kept for `to`.
struct Transfer {
    to: String,
    window: Duration,
    /// Who waits for the outcome; `None` for a request read from the store.
    done: Option<oneshot::Sender<Result<HandedOver>>>,
}

/// What interrupted a wait.
enum Interrupt {
    Shutdown,
    SessionLost,
    /// A resign asked not to campaign for a while ([`Inbox::yield_until`]); only while the
    /// candidate has a claim in the store (a wait given the session's fence). The resign
    /// is answered once the claim is withdrawn.
    Yield(Option<oneshot::Sender<()>>),
}

/// The campaign's commands, and who waits for its shutdown.
struct Inbox {
    commands: QueueReceiver<Command>,
    shutdown_waiters: Vec<ShutdownDone>,
    /// The rest of the release the store is finishing for this campaign's shutdown
    /// ([`Contender::leave`]), for its caller to await.
    settling: Option<Settling>,
    /// Until when a resign asked this candidate not to campaign
    /// ([`CampaignHandle::resign_for`]).
    yield_until: Option<Instant>,
    /// The target of the hand-over this candidate is making, while it makes it.
    transfer: Option<String>,
    /// How a candidate that does not lead asks the leader to hand over.
    request: Requester,
}

impl Inbox {
    /// Answers the shutdown's callers, once the campaign has stopped. The rest of a release
    /// the store is finishing goes to the one caller, who awaits it while this campaign's
    /// state is freed; with none (the campaign was dropped) or several, it is awaited here.
    async fn answer_shutdowns(&mut self) {
        let mut waiters = std::mem::take(&mut self.shutdown_waiters);
        if waiters.len() == 1
            && let Some(settling) = self.settling.take()
        {
            // A caller gone meanwhile leaves it to be awaited here.
            if let Err(Some(settling)) = waiters.swap_remove(0).send(Some(settling)) {
                settling.await;
            }
            return;
        }
        if let Some(settling) = self.settling.take() {
            settling.await;
        }
        for done in waiters {
            let _ = done.send(None);
        }
    }

    /// Waits for `work` unless interrupted: by a shutdown (or every handle gone), or, given
    /// the session's `fence`, by the session's loss. Other commands are answered meanwhile
    /// and `work` goes on; an interrupted `work` is dropped. Every wait outside a term is one
    /// of these: the commands are handled in one place, the same way in every state.
    ///
    /// `work` comes pinned by the caller, where it is kept once: taken by value, an `async
    /// fn`'s future holds its argument and the local it is pinned in, twice (a follower's
    /// wait was 1,168 B, its `work` 456 B of it, held twice).
    async fn unless_interrupted<F: Future>(
        &mut self,
        mut fence: Option<&mut Fence>,
        mut work: Pin<&mut F>,
    ) -> Result<F::Output, Interrupt> {
        loop {
            tokio::select! {
                biased;
                command = self.commands.recv() => {
                    let pursuing = fence.is_some();
                    if let Some(interrupt) = self.answer_while_not_leading(command, pursuing) {
                        return Err(interrupt);
                    }
                }
                () = lost_if(fence.as_deref_mut()) => return Err(Interrupt::SessionLost),
                output = work.as_mut() => return Ok(output),
            }
        }
    }

    /// Answers a command that arrives while not leading: a resign has nothing to give up, a
    /// proclaim no term to update; a shutdown interrupts, and so does a resign that asks to
    /// yield, while `pursuing` (the candidate has a claim to withdraw).
    fn answer_while_not_leading(
        &mut self,
        command: Option<Command>,
        pursuing: bool,
    ) -> Option<Interrupt> {
        match command {
            Some(Command::Resign {
                done, yield_for, ..
            }) => {
                if let Some(yield_for) = yield_for {
                    self.yield_for(yield_for);
                    if pursuing {
                        return Some(Interrupt::Yield(Some(done)));
                    }
                }
                let _ = done.send(());
                None
            }
            Some(Command::Shutdown { done }) => {
                self.shutdown_waiters.extend(done);
                Some(Interrupt::Shutdown)
            }
            Some(Command::Proclaim { done, .. }) => {
                let _ = done.send(Err(Error::NotLeader));
                None
            }
            Some(Command::HandOver { to, window, done }) => {
                self.hand_over_elsewhere(to, window, done);
                None
            }
            None => Some(Interrupt::Shutdown),
        }
    }

    /// A hand-over asked of a candidate that does not lead: refused while this candidate is
    /// handing over itself, else asked of the leader through the store, in a task of its own.
    fn hand_over_elsewhere(
        &self,
        to: String,
        window: Option<Duration>,
        done: Option<oneshot::Sender<Result<HandedOver>>>,
    ) {
        let Some(done) = done else { return };
        if let Some(target) = &self.transfer {
            let _ = done.send(Err(HandOverError::InProgress { to: target.clone() }.into()));
            return;
        }
        let asking = (self.request)(to, window);
        tokio::spawn(async move {
            let _ = done.send(asking.await);
        });
    }
}

impl Inbox {
    /// Not to campaign for `duration` from now, or until a later instant already asked.
    fn yield_for(&mut self, duration: Duration) {
        let until = Instant::now() + duration;
        self.yield_until = Some(self.yield_until.map_or(until, |u| u.max(until)));
    }

    /// How long this candidate is still asked not to campaign, if at all.
    fn yielding(&mut self) -> Option<Duration> {
        let left = self
            .yield_until?
            .checked_duration_since(Instant::now())
            .filter(|left| !left.is_zero());
        if left.is_none() {
            self.yield_until = None;
        }
        left
    }
}

impl<B: Backend> Engine<B> {
    /// Runs the campaign; a panic in it never ends it silently. The unwinding ends the term
    /// (its [`InForce`] guard) and drops the session; then the demotion is reported (an event
    /// and the status, with the panic's message as the problem) and the campaign goes on
    /// after a back-off, as after any failure.
    ///
    /// Not an `async fn`: its future would keep the engine twice (the argument and its
    /// local), and the engine is most of an idle election's task.
    #[expect(
        clippy::manual_async_fn,
        reason = "an async fn's future holds its argument twice"
    )]
    fn supervise(mut self) -> impl Future<Output = ()> + Send + 'static {
        async move {
            loop {
                let Err(panic) = CatchUnwind(Box::pin(self.run())).await else {
                    return;
                };
                // The unwinding dropped the session.
                self.forget_session();
                let message = panic_message(panic.as_ref());
                if Box::pin(self.recover(message)).await.is_err() {
                    self.stopped();
                    self.inbox.answer_shutdowns().await;
                    return;
                }
            }
        }
    }

    /// After a panic unwound [`run`](Self::run): says so, then waits the back-off. `Err`:
    /// shut down meanwhile.
    async fn recover(&mut self, message: String) -> Result<(), ()> {
        // The term, if there was one, was cancelled by its guard as the panic unwound.
        let term = self.status.borrow().term.clone();
        let reason = DemotionReason::CampaignPanicked;
        self.status.send_modify(|s| {
            s.term = None;
            if term.is_some() {
                s.last_demotion = Some(reason);
            }
        });
        ::metrics::gauge!(metrics::IS_LEADER, self.labels_base()).set(0.0);
        if let Some(term) = term {
            ::metrics::counter!(
                metrics::DEMOTIONS,
                self.labels_base_with("reason", reason.as_str())
            )
            .increment(1);
            self.subscribers.send(&LeadershipEvent::Demoted {
                fencing_token: term.fencing_token(),
                reason,
                stop_by: term.stop_by(),
            });
            self.leaderless = Some(Leaderless::own_term_ended());
        }
        let delay = self.failed(&Error::CampaignPanicked { message });
        self.cool_down(delay).await
    }

    async fn run(&mut self) {
        tracing::info!("campaign started");
        // Exported from the start: a follower that never led says 0, not nothing.
        ::metrics::gauge!(metrics::IS_LEADER, self.labels_base()).set(0.0);
        let mut session: Option<B::Session> = None;
        loop {
            let current = match session.take() {
                Some(s) if s.health().borrow().lost.is_none() => s,
                stale => {
                    if let Some(s) = stale {
                        self.close_in_background(s);
                    }
                    match Box::pin(self.open_session()).await {
                        Some(s) => {
                            self.set_notice(s.shutdown_notice());
                            s
                        }
                        None => break,
                    }
                }
            };
            match self.pursue(&current).await {
                Pursuit::Won(contender, token) => {
                    let won_at = Instant::now();
                    let (reason, released) = self.lead(&current, contender, token).await;
                    if reason == DemotionReason::Shutdown {
                        session = Some(current);
                        break;
                    }
                    // A session whose lock we could not release, or whose liveness is in
                    // doubt, could win again with the old term's token: start afresh.
                    let trusted = released
                        && !matches!(
                            reason,
                            DemotionReason::RenewDeadlineExceeded
                                | DemotionReason::ConnectionLost
                                | DemotionReason::SessionExpired
                        );
                    if trusted {
                        session = Some(current);
                    } else {
                        self.close_in_background(current);
                    }
                    let backoff = self.config.backoff.delay(self.quick_losses);
                    let delay = self.inbox.yielding().map_or(backoff, |y| y.max(backoff));
                    self.quick_losses = match won_at.elapsed() < self.config.ttl {
                        true => self.quick_losses.saturating_add(1),
                        false => 0,
                    };
                    if self.cool_down(delay).await.is_err() {
                        break;
                    }
                }
                Pursuit::SessionLost => {
                    self.close_in_background(current);
                    // Back off: a store that hands out sessions it loses at once must not
                    // be asked for new ones in a hot loop.
                    let error = Error::Unavailable {
                        backend: self.backend.info().name,
                        reason: "the session was lost; opening a new one".into(),
                    };
                    let delay = self.failed(&error);
                    if self.cool_down(delay).await.is_err() {
                        break;
                    }
                }
                Pursuit::Yield => {
                    session = Some(current);
                    let waited = match self.stepped_aside_for.take().map(|aside| *aside) {
                        Some((to, until)) => self.wait_out_hand_over(&to, until).await,
                        None => {
                            let delay = self.inbox.yielding().unwrap_or_default();
                            self.cool_down(delay).await
                        }
                    };
                    if waited.is_err() {
                        break;
                    }
                }
                Pursuit::Stop => {
                    session = Some(current);
                    break;
                }
            }
        }
        self.forget_session();
        if let Some(s) = session {
            let closing = timeout(self.config.renew_deadline, s.close()).await;
            if !matches!(closing, Ok(Ok(()))) {
                tracing::warn!("could not close the session; the store will expire it");
            }
        }
        self.stopped();
        self.inbox.answer_shutdowns().await;
        tracing::info!("campaign stopped");
    }

    /// Puts the current session's notice in the handles' slot ([`Shared::notice`]).
    fn set_notice(&self, notice: Option<ShutdownNotice>) {
        if let Some(shared) = self.shared.upgrade() {
            *lock(&shared.notice) = notice;
        }
    }

    /// Empties the notice slot: the session is about to be closed or dropped, and a shutdown
    /// asked from now on concerns no session (the next one's notice replaces it).
    fn forget_session(&self) {
        self.set_notice(None);
    }

    /// Closes a session the campaign is done with in a task of its own.
    fn close_in_background(&self, session: B::Session) {
        self.forget_session();
        close_in_background(session);
    }

    /// The campaign's end, however it comes: the status says stopped (never leader), and
    /// every event stream ends. Called again by `Drop` on an unwinding or dropped task.
    fn stopped(&mut self) {
        let mut was_leader = false;
        self.status.send_if_modified(|s| {
            if s.role == Role::Stopped {
                return false;
            }
            // A term stepping down said 0 already, as its role changed (`hand_over`).
            was_leader = s.role == Role::Leader;
            s.role = Role::Stopped;
            s.term = None;
            true
        });
        if was_leader {
            ::metrics::gauge!(metrics::IS_LEADER, self.labels_base()).set(0.0);
        }
        self.subscribers.close();
    }

    /// Opens a session, retrying with back-off. `None`: shut down meanwhile.
    async fn open_session(&mut self) -> Option<B::Session> {
        let options = self.config.session_options();
        loop {
            self.set_role(Role::Connecting);
            let opening = open_within(&self.backend, &options, self.config.ttl);
            let opened = self
                .inbox
                .unless_interrupted(None, pin!(opening))
                .await
                .ok()?;
            match opened {
                Ok(session) => {
                    tracing::debug!(session = %session.id(), "session opened");
                    self.status
                        .send_modify(|s| s.session = Some(session.health()));
                    return Some(session);
                }
                Err(error) => {
                    let delay = self.failed(&error);
                    if self.cool_down(delay).await.is_err() {
                        return None;
                    }
                }
            }
        }
    }

    /// Everything before winning: try to acquire, wait for a change, repeat.
    async fn pursue(&mut self, session: &B::Session) -> Pursuit<Claim<B>> {
        if self.inbox.yielding().is_some() {
            return Pursuit::Yield;
        }
        let mut contender: Claim<B> = match session
            .contend(&self.config.name, &self.config.candidate)
            .await
        {
            Ok(mut c) => {
                if !self.config.switchover_requests {
                    c.ignore_requests();
                }
                Box::new(c)
            }
            Err(error) => {
                tracing::warn!(%error, "could not prepare the claim");
                return Pursuit::SessionLost;
            }
        };
        Box::pin(self.keep_presence(session)).await;
        self.following = None;
        let health = session.health();
        let mut fence = Fence::of(&health, self.config.renew_deadline);
        let mut sightings = Sightings::default();
        loop {
            if health.borrow().lost.is_some() {
                return Pursuit::SessionLost;
            }
            if !matches!(self.status.borrow().role, Role::Follower) {
                self.set_role(Role::Candidate);
            }
            let from = self.take_over_from.take();
            let sent = Instant::now();
            let attempting = async {
                match &from {
                    Some(holder) => contender.take_over(holder).await,
                    None => contender.acquire().await,
                }
            };
            let attempted = self
                .inbox
                .unless_interrupted(Some(&mut fence), Box::pin(attempting).as_mut())
                .await;
            let attempt = match attempted {
                Ok(attempt) => attempt,
                Err(Interrupt::Shutdown) => return Box::pin(self.withdraw(contender)).await,
                Err(Interrupt::SessionLost) => return Pursuit::SessionLost,
                Err(Interrupt::Yield(done)) => {
                    return Box::pin(self.step_aside(contender, done)).await;
                }
            };
            if let Some(from) = from {
                match &attempt {
                    // The store refused this take-over: not again for the same value.
                    Ok(_) => self.tried_take_over = Some(from),
                    // No answer: try it again after the back-off.
                    Err(_) => self.take_over_from = Some(from),
                }
            }
            let interrupt = match attempt {
                Ok(Attempt::Won { fencing_token }) => {
                    ::metrics::counter!(metrics::CAMPAIGN_ATTEMPTS, self.labels("won"))
                        .increment(1);
                    let verdict = self.check_win(&health.borrow(), fencing_token, sent);
                    match verdict {
                        Ok(()) => return Pursuit::Won(contender, fencing_token),
                        Err(why) => {
                            tracing::warn!(
                                fencing_token,
                                "won on an untrusted session ({why}); starting a new session"
                            );
                            let releasing =
                                timeout(self.config.renew_interval, contender.release());
                            let _ = Box::pin(releasing).await;
                            return Pursuit::SessionLost;
                        }
                    }
                }
                Ok(Attempt::Held { holder }) => {
                    ::metrics::counter!(metrics::CAMPAIGN_ATTEMPTS, self.labels("held"))
                        .increment(1);
                    self.recovered();
                    self.set_role(Role::Follower);
                    let heed = match holder {
                        Some(holder) => self.heed(holder),
                        None => Heed::Follow,
                    };
                    match heed {
                        Heed::TakeOver => None,
                        Heed::StepAside => Some(Interrupt::Yield(None)),
                        Heed::Follow => {
                            let following =
                                self.follow(session, &mut contender, &mut fence, &mut sightings);
                            Box::pin(following).await
                        }
                    }
                }
                Ok(Attempt::Delayed { until }) => {
                    ::metrics::counter!(metrics::CAMPAIGN_ATTEMPTS, self.labels("delayed"))
                        .increment(1);
                    self.leaderless.get_or_insert_with(Leaderless::seen);
                    tracing::info!(wait = ?until.saturating_duration_since(Instant::now()), "the lock may not be taken yet (the store's lock-delay, or the others' turn after this campaign released it); waiting");
                    Box::pin(self.wait_until(until, &mut fence)).await
                }
                Err(error) => {
                    ::metrics::counter!(metrics::CAMPAIGN_ATTEMPTS, self.labels("error"))
                        .increment(1);
                    // The store said the session is gone (e.g. etcd's "lease not found"):
                    // open a new one at once, rather than back off as after a failure.
                    if health.borrow().lost.is_some() {
                        return Pursuit::SessionLost;
                    }
                    let delay = self.failed(&error);
                    Box::pin(self.wait_until(Instant::now() + delay, &mut fence)).await
                }
            };
            match interrupt {
                None => {}
                Some(Interrupt::Shutdown) => return Box::pin(self.withdraw(contender)).await,
                Some(Interrupt::SessionLost) => return Pursuit::SessionLost,
                Some(Interrupt::Yield(done)) => {
                    return Box::pin(self.step_aside(contender, done)).await;
                }
            }
        }
    }

    /// A follower's wait: until the contender says to try again, reporting leader changes.
    async fn follow(
        &mut self,
        session: &B::Session,
        contender: &mut ContenderOf<B>,
        fence: &mut Fence,
        sightings: &mut Sightings<B::Observer>,
    ) -> Option<Interrupt> {
        loop {
            let settled = self.settled_at();
            let next = async {
                tokio::select! {
                    biased;
                    waited = contender.wait() => Ok(waited),
                    leader = sightings.next(&self.backend, Some(session), &self.config.name, &self.config) => Err(Some(leader)),
                    () = sleep_until(settled.unwrap_or_else(Instant::now)), if settled.is_some() => Err(None),
                }
            };
            let seen = self.inbox.unless_interrupted(Some(fence), pin!(next)).await;
            match seen {
                Err(interrupt) => return Some(interrupt),
                Ok(Err(None)) => self.ask_for_lead(),
                Ok(Err(Some(None))) => {
                    self.following = None;
                    self.saw_leader(None);
                }
                Ok(Err(Some(Some(leader)))) => match self.heed(leader) {
                    Heed::TakeOver => return None,
                    Heed::StepAside => return Some(Interrupt::Yield(None)),
                    Heed::Follow => {}
                },
                Ok(Ok(Ok(()))) => {
                    // The holder (or our predecessor) may be gone: the election may be
                    // without a leader from now until someone wins.
                    self.leaderless.get_or_insert_with(Leaderless::seen);
                    return None;
                }
                Ok(Ok(Err(error))) => {
                    let delay = self.failed(&error);
                    return self.wait_until(Instant::now() + delay, fence).await;
                }
            }
        }
    }

    /// Takes in a leader seen while following: a hand-over to this candidate is taken over
    /// (escrow stores), one to another candidate makes it step out of the line (line stores);
    /// and a preferred candidate counts how long it has followed the same leader.
    fn heed(&mut self, leader: Leader) -> Heed {
        let me = self.config.candidate.id.as_str();
        let style = self.backend.info().hand_over;
        let reservation = leader.handing_over();
        let heed = match &reservation {
            Some(h) if h.to == me => {
                if style == HandOverStyle::Escrow
                    && self.tried_take_over.as_deref() != Some(&leader)
                {
                    self.take_over_from = Some(Box::new(leader.clone()));
                    Heed::TakeOver
                } else {
                    Heed::Follow
                }
            }
            Some(h) if style == HandOverStyle::Line && leader.candidate.id != me => {
                self.stepped_aside_for =
                    Some(Box::new((h.to.clone(), Instant::now() + h.window())));
                Heed::StepAside
            }
            _ => Heed::Follow,
        };
        if reservation.is_none() && leader.candidate.id != me {
            if self.following.as_deref().map(|(id, _)| id) != Some(&leader.candidate.id) {
                self.following = Some(Box::new((leader.candidate.id.clone(), Instant::now())));
            }
        } else {
            self.following = None;
        }
        self.leader_priority = priority_of(&leader);
        self.saw_leader(Some(leader));
        heed
    }

    /// When a preferred candidate asks for the lead: its settle time (doubled for each
    /// request since it last led) after it began to follow a leader of lower priority.
    fn settled_at(&self) -> Option<Instant> {
        let priority = self.config.priority?;
        let (_, since) = self.following.as_deref()?;
        if self.leader_priority >= priority.level {
            return None;
        }
        let factor = 1u32 << self.priority_requests.min(10);
        Some(*since + priority.settle.saturating_mul(factor))
    }

    /// A preferred candidate asks the leader, through the store, to hand over to it.
    fn ask_for_lead(&mut self) {
        self.priority_requests = self.priority_requests.saturating_add(1);
        if let Some((_, since)) = self.following.as_deref_mut() {
            *since = Instant::now();
        }
        tracing::info!("a preferred candidate: asking the leader to hand over to it");
        let asking = (self.inbox.request)(self.config.candidate.id.clone(), None);
        tokio::spawn(
            async move {
                if let Err(error) = asking.await {
                    tracing::info!(%error, "the request for the lead did not make this candidate lead");
                }
            }
            .in_current_span(),
        );
    }

    /// Whether a win can be trusted: the session is alive and fresh, its answer came within the
    /// renew deadline of the request (`sent`), and the token grew.
    fn check_win(
        &self,
        health: &SessionHealth,
        token: FencingToken,
        sent: Instant,
    ) -> Result<(), &'static str> {
        if health.lost.is_some() {
            return Err("the session is lost");
        }
        if Instant::now() >= health.confirmed_sent_at + self.config.renew_deadline {
            return Err("no renewal confirmed within the renew deadline");
        }
        if Instant::now() >= sent + self.config.renew_deadline {
            // The answer waited (a frozen process, a stalled runtime) longer than the lock
            // can be trusted from its acquisition: it may be another's by now.
            return Err("the acquisition's answer came later than the renew deadline");
        }
        if self.last_token.is_some_and(|last| token <= last) {
            return Err("the fencing token did not grow");
        }
        Ok(())
    }

    /// Everything while leading: take office, hold it, hand it over. Returns why the term
    /// ended, and whether the lock was released.
    async fn lead(
        &mut self,
        session: &B::Session,
        mut contender: Claim<B>,
        fencing_token: FencingToken,
    ) -> (DemotionReason, bool) {
        let mut office = self.take_office(fencing_token);
        let end = self.hold_office(session, &mut contender, &mut office).await;
        // Boxed, as are the other rare paths (opening a session, proclaiming, withdrawing): a
        // future holds room for its largest state, and an idle election should hold only the
        // room for waiting.
        Box::pin(self.hand_over(contender, office, end)).await
    }

    /// The term begins: the token is recorded, and the status, the metrics and the
    /// subscribers say "leader".
    fn take_office(&mut self, fencing_token: FencingToken) -> Office {
        let span = tracing::info_span!("term", term = fencing_token);
        let leader = Leader {
            candidate: self.config.candidate.clone(),
            fencing_token: Some(fencing_token),
            since_unix_ms: Some(unix_ms_now()),
        };
        let gap = self.gap();
        let (term, guards) = Term::new(
            ElectionConfig::of(self.config.clone()),
            leader.clone(),
            fencing_token,
            gap,
        );
        // Ends the term however this task ends, a panic or a dropped runtime included.
        let in_force = InForce(term.clone());
        self.last_token = Some(fencing_token);
        self.priority_requests = 0;
        self.following = None;
        self.take_over_from = None;
        self.tried_take_over = None;
        self.recovered();
        ::metrics::counter!(metrics::ELECTIONS_WON, self.labels_base()).increment(1);
        ::metrics::gauge!(metrics::IS_LEADER, self.labels_base()).set(1.0);
        ::metrics::histogram!(metrics::TIME_TO_LEADER, self.labels_base())
            .record(gap.without_leader.as_secs_f64());
        ::metrics::histogram!(metrics::LOCK_FREE_TO_LEADER, self.labels_base())
            .record(gap.lock_free.as_secs_f64());
        self.status.send_modify(|s| {
            s.role = Role::Leader;
            s.term = Some(term.clone());
        });
        span.in_scope(|| tracing::info!(fencing_token, "elected"));
        self.subscribers
            .send(&LeadershipEvent::Elected(term.clone()));
        self.saw_leader(Some(leader));
        Office {
            span,
            proclaimed: None,
            fencing_token,
            in_force,
            guards,
        }
    }

    /// The term, until something ends it: a lost session or lock, the renew deadline, a
    /// resign or a shutdown. Proclaims are served meanwhile.
    async fn hold_office(
        &mut self,
        session: &B::Session,
        contender: &mut ContenderOf<B>,
        office: &mut Office,
    ) -> TermEnd {
        let mut health = session.health();
        // The session's shared alarm: it wakes this loop only on a transition (the deadline
        // passing, the session lost), not at every renewal.
        let mut fence = Fence::of(&health, self.config.renew_deadline);
        let mut resign_done = None;
        let mut transfer = None;
        // On a polling store, the leader reads the request lock once per renew interval.
        let mut requests = Sightings::paced(&self.backend, self.config.renew_interval);
        let requests_key = request_name(&self.config.name);
        let (reason, lock_loss) = loop {
            // Decided from the health itself: the fence only says when to look again.
            let now = Instant::now();
            match Freshness::of(&health.borrow(), self.config.renew_deadline, now) {
                Freshness::Fresh => {}
                Freshness::Stale => break (DemotionReason::RenewDeadlineExceeded, None),
                Freshness::Lost(loss) => break (DemotionReason::from_session(loss), None),
                Freshness::Gone => break (DemotionReason::ConnectionLost, None),
            }
            tokio::select! {
                biased;
                command = self.inbox.commands.recv() => match command {
                    Some(Command::Resign {
                        reason,
                        done,
                        yield_for,
                    }) => {
                        resign_done = Some(done);
                        if let Some(yield_for) = yield_for {
                            self.inbox.yield_for(yield_for);
                        }
                        break (reason, None);
                    }
                    Some(Command::Shutdown { done }) => {
                        self.inbox.shutdown_waiters.extend(done);
                        break (DemotionReason::Shutdown, None);
                    }
                    Some(Command::Proclaim { metadata, done }) => {
                        let outcome = Box::pin(self.proclaim(
                            contender,
                            &mut health,
                            office.leader_mut(),
                            metadata,
                        ))
                        .await;
                        let _ = done.send(outcome);
                        continue;
                    }
                    Some(Command::HandOver { to, window, done }) => {
                        let ask = Ask { to, window, done, request: None };
                        let prepared = Box::pin(self.prepare_hand_over(contender, &mut health, office, ask)).await;
                        match prepared.ends_term(&mut transfer) {
                            Some(end) => break end,
                            None => continue,
                        }
                    }
                    None => break (DemotionReason::Shutdown, None),
                },
                loss = contender.lost() => break (DemotionReason::from_lock(loss), Some(loss)),
                request = requests.next(&self.backend, Some(session), &requests_key, &self.config), if self.config.switchover_requests => {
                    let Some(request) = request.as_ref().and_then(Request::parse) else { continue };
                    if self.handled_request.as_deref() == Some(request.id.as_str()) {
                        continue;
                    }
                    self.handled_request = Some(request.id.clone());
                    if request.to == self.config.candidate.id
                        || !request.addressed_to(&self.config.candidate.id)
                    {
                        continue;
                    }
                    span_info(&office.span, &format!("a hand-over to {} was requested through the store", request.to));
                    let ask = Ask { to: request.to.clone(), window: request.window, done: None, request: Some(&request.id) };
                    let prepared = Box::pin(self.prepare_hand_over(contender, &mut health, office, ask)).await;
                    match prepared.ends_term(&mut transfer) {
                        Some(end) => break end,
                        None => continue,
                    }
                }
                changed = fence.changed() => if changed.is_err() {
                    break (DemotionReason::ConnectionLost, None);
                },
            }
        };
        let confirmed = health.borrow().confirmed_sent_at;
        // The term ends first: nothing (no logging, no store round trip, no lock a reader of
        // the status holds) stands between seeing the loss and cancelling the term, and
        // `Status::is_leader` turns false with the token, before the status is even updated.
        let stop_by = self.stop_by(reason, confirmed);
        office.in_force.end(stop_by);
        TermEnd {
            reason,
            lock_loss,
            stop_by,
            resign_done,
            health,
            transfer,
        }
    }

    /// A hand-over asked of the leader, up to the moment its term may end: `to` is checked
    /// to be a live candidate and, on stores that keep a line or a gate, named in the
    /// leader's value (and, with a line, the others gone from ahead of it). `None`: refused
    /// (the answer is sent, the term goes on). Bounded by the renew deadline, and abandoned
    /// if the session is lost, as a proclaim is.
    async fn prepare_hand_over(
        &mut self,
        contender: &mut ContenderOf<B>,
        health: &mut watch::Receiver<SessionHealth>,
        office: &Office,
        ask: Ask<'_>,
    ) -> Prepared {
        let Ask {
            to,
            window,
            done,
            request,
        } = ask;
        let window = window.unwrap_or(self.config.hand_over_window);
        if to == self.config.candidate.id {
            if let Some(done) = done {
                let _ = done.send(Ok(HandedOver {
                    to,
                    fencing_token: Some(office.fencing_token),
                }));
            }
            return Prepared::Refused;
        }
        let error = match self
            .ready_for_hand_over(contender, health, office, &to, window)
            .await
        {
            Ok(()) => return Prepared::Ready(Transfer { to, window, done }),
            Err(NotReady::Lost(loss)) => {
                if let Some(done) = done {
                    let _ = done.send(Err(Error::NotLeader));
                }
                return Prepared::Lost(loss);
            }
            Err(NotReady::Refused(error)) => error,
        };
        ::metrics::counter!(
            metrics::HAND_OVERS,
            self.labels_base_with("outcome", "refused")
        )
        .increment(1);
        span_info(&office.span, &format!("hand-over refused: {error}"));
        if let Some(request) = request {
            // The requester, in another process, reads why in the leader's value.
            let _ = within_term(
                health,
                self.config.renew_deadline,
                pin!(contender.proclaim(&office.leader().refusing(request, &error.to_string()))),
            )
            .await;
        }
        if let Some(done) = done {
            let _ = done.send(Err(error));
        }
        Prepared::Refused
    }

    /// The checks of [`prepare_hand_over`](Self::prepare_hand_over), and the naming of the
    /// target on line and gate stores.
    async fn ready_for_hand_over(
        &mut self,
        contender: &mut ContenderOf<B>,
        health: &mut watch::Receiver<SessionHealth>,
        office: &Office,
        to: &str,
        window: Duration,
    ) -> Result<(), NotReady> {
        let to = to.to_owned();
        let (backend, name) = (self.backend.clone(), self.config.name.clone());
        let deadline = self.config.renew_deadline;
        // The reads of the store race the lock's loss, which ends the term at once.
        within_term(
            health,
            deadline,
            pin!(unless_lost(
                contender,
                switchover::check_live(&backend, &name, &to)
            )),
        )
        .await??;
        let style = self.backend.info().hand_over;
        if style != HandOverStyle::Escrow {
            let named = office.leader().handing_over_to(&to, window);
            within_term(health, deadline, pin!(contender.proclaim(&named))).await?;
            if style == HandOverStyle::Line {
                // Bounded by the renew deadline: the term stays trusted meanwhile.
                let until = Instant::now() + deadline;
                let clearing =
                    async { Ok(switchover::line_clear(&backend, &name, &to, until).await) };
                let clear =
                    within_term(health, deadline, pin!(unless_lost(contender, clearing))).await;
                let refusal = match clear {
                    Ok(Err(NotReady::Lost(loss))) => return Err(NotReady::Lost(loss)),
                    Ok(Err(NotReady::Refused(error))) => Some(error),
                    Ok(Ok(Ok(()))) => None,
                    Ok(Ok(Err(ahead))) if ahead.is_empty() => Some(
                        HandOverError::NotACandidate {
                            to: to.clone(),
                            live: None,
                        }
                        .into(),
                    ),
                    Ok(Ok(Err(ahead))) => Some(
                        HandOverError::LineNotClear {
                            to: to.clone(),
                            ahead,
                        }
                        .into(),
                    ),
                    Err(error) => Some(error),
                };
                if let Some(error) = refusal {
                    // The term goes on: the value names nobody again.
                    let _ =
                        within_term(health, deadline, pin!(contender.proclaim(office.leader())))
                            .await;
                    return Err(NotReady::Refused(error));
                }
            }
        }
        Ok(())
    }

    /// After the term was cancelled: the status and the metrics stop saying "leader", the
    /// store is asked why the lock went (if it was taken), the demotion is reported, the
    /// work winds down, and the lock is released. Returns why the term ended, and whether
    /// the lock was released.
    ///
    /// A plain `fn` returning the future: an `async fn`'s future would hold the office and
    /// the term's end twice (as its arguments and as their fields), and at 1,080 B it was
    /// the one block of at least 1 KiB each election allocates as it stops, a size glibc
    /// serves only after merging every small block freed before it (100,000 elections
    /// stopping together spent a tenth of their CPU there).
    fn hand_over(
        &mut self,
        mut contender: Claim<B>,
        office: Office,
        end: TermEnd,
    ) -> impl Future<Output = (DemotionReason, bool)> + '_ {
        let Office {
            span,
            proclaimed,
            fencing_token,
            in_force,
            mut guards,
        } = office;
        let TermEnd {
            reason,
            lock_loss,
            stop_by,
            resign_done,
            mut health,
            transfer,
        } = end;
        async move {
            self.status.send_modify(|s| {
                s.role = Role::SteppingDown;
                s.term = None;
            });
            ::metrics::gauge!(metrics::IS_LEADER, self.labels_base()).set(0.0);
            self.leaderless = Some(Leaderless::own_term_ended());

            // Only now ask the store why the lock went, if the backend can tell more.
            let reason = match lock_loss {
                Some(loss) => timeout(self.config.renew_interval, contender.explain(loss))
                    .await
                    .map_or(reason, DemotionReason::from_lock),
                None => reason,
            };
            ::metrics::counter!(
                metrics::DEMOTIONS,
                self.labels_base_with("reason", reason.as_str())
            )
            .increment(1);
            self.status.send_modify(|s| s.last_demotion = Some(reason));
            span.in_scope(|| tracing::info!(%reason, "demoted"));
            self.subscribers.send(&LeadershipEvent::Demoted {
                fencing_token,
                reason,
                stop_by,
            });

            // Graceful hand-off: wait for the term's guards (the work winding down), then
            // release. The work must stop before the lease can lapse: at `stop_by` after an
            // involuntary loss; after a voluntary end, if renewals stop being confirmed meanwhile.
            if !self
                .wind_down(&in_force.0, &mut guards, &mut health, stop_by)
                .await
            {
                span.in_scope(|| {
                    tracing::warn!("the term's guards were still held; releasing anyway")
                });
            }
            if let Some(transfer) = transfer {
                let leader = proclaimed.map_or_else(|| in_force.0.leader().clone(), |l| *l);
                return Box::pin(self.pass_on(contender, transfer, leader, &mut health, &span))
                    .await;
            }
            let releasing = async {
                match reason {
                    DemotionReason::Shutdown => contender.leave().await,
                    _ => contender.release().await.map(|()| None),
                }
            };
            let released = match timeout(self.config.renew_deadline, releasing).await {
                Ok(Ok(settling)) => {
                    self.inbox.settling = settling;
                    true
                }
                _ => false,
            };
            if !released {
                span.in_scope(|| {
                    tracing::warn!(
                        "could not release the lock; the store will expire it with the session"
                    )
                });
            }
            self.saw_leader(None);
            if let Some(done) = resign_done {
                let _ = done.send(());
            }
            (reason, released)
        }
    }

    /// The end of a hand-over, once the old term's work has stopped: the next term is kept
    /// for the target (escrow: the lock stays ours, naming it; line and gate: released, the
    /// others keeping away) until it leads or the window ends, then the lock is released (a
    /// no-op once the target took it). Returns as [`hand_over`](Self::hand_over) does.
    async fn pass_on(
        &mut self,
        mut contender: Claim<B>,
        transfer: Transfer,
        leader: Leader,
        health: &mut watch::Receiver<SessionHealth>,
        span: &tracing::Span,
    ) -> (DemotionReason, bool) {
        let Transfer { to, window, done } = transfer;
        let until = Instant::now() + window;
        self.inbox.transfer = Some(to.clone());
        let deadline = self.config.renew_deadline;
        let escrow = self.backend.info().hand_over == HandOverStyle::Escrow
            && within_term(
                health,
                self.config.renew_deadline,
                pin!(contender.proclaim(&leader.handing_over_to(&to, window))),
            )
            .await
            .is_ok();
        let mut released =
            escrow || matches!(timeout(deadline, contender.release()).await, Ok(Ok(())));
        let (outcome, shutdown) = {
            let holding = escrow.then_some(&mut *contender);
            self.await_successor(holding, &to, window, until).await
        };
        if escrow {
            released = matches!(timeout(deadline, contender.release()).await, Ok(Ok(())));
        }
        self.inbox.transfer = None;
        let label = if outcome.is_ok() { "done" } else { "lapsed" };
        ::metrics::counter!(metrics::HAND_OVERS, self.labels_base_with("outcome", label))
            .increment(1);
        span.in_scope(|| match &outcome {
            Ok(_) => tracing::info!(to = %to, "handed over"),
            Err(error) => tracing::warn!(to = %to, %error, "the hand-over did not complete"),
        });
        if let Some(done) = done {
            let _ = done.send(outcome);
        }
        let reason = match shutdown {
            true => DemotionReason::Shutdown,
            false => DemotionReason::HandedOver,
        };
        (reason, released)
    }

    /// Follows the election until `to` leads, or `until`. Commands are answered meanwhile
    /// (a hand-over: one is under way); `true` with the outcome when a shutdown came.
    /// `holding`: the escrow's contender, whose loss (the target took the lock) is awaited
    /// too.
    async fn await_successor(
        &mut self,
        mut holding: Option<&mut ContenderOf<B>>,
        to: &str,
        window: Duration,
        until: Instant,
    ) -> (Result<HandedOver>, bool) {
        let mut sightings = Sightings::default();
        let name = self.config.name.clone();
        let mut last_seen: Option<String> = None;
        // The file backend's observers read the leader file every 500 ms: on its host a read
        // is cheap, so the target's win is looked for more often.
        let recheck =
            (self.backend.info().hand_over == HandOverStyle::Gate).then_some(GATE_RECHECK);
        loop {
            let taken = async {
                match holding.as_deref_mut() {
                    Some(contender) => contender.lost().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                command = self.inbox.commands.recv() => match command {
                    Some(Command::Shutdown { done }) => {
                        self.inbox.shutdown_waiters.extend(done);
                        return (Err(Error::Stopped), true);
                    }
                    None => return (Err(Error::Stopped), true),
                    Some(Command::HandOver { done, .. }) => {
                        if let Some(done) = done {
                            let _ = done.send(Err(HandOverError::InProgress { to: to.to_owned() }.into()));
                        }
                    }
                    Some(Command::Resign { done, yield_for, .. }) => {
                        if let Some(yield_for) = yield_for {
                            self.inbox.yield_for(yield_for);
                        }
                        let _ = done.send(());
                    }
                    Some(Command::Proclaim { done, .. }) => {
                        let _ = done.send(Err(Error::NotLeader));
                    }
                },
                leader = sightings.next(&self.backend, None, &name, &self.config) => {
                    self.saw_leader(leader.clone());
                    if let Some(leader) = leader {
                        if switchover::took_office(&leader, to) {
                            return (Ok(HandedOver { to: to.to_owned(), fencing_token: leader.fencing_token }), false);
                        }
                        if leader.candidate.id != self.config.candidate.id {
                            last_seen = Some(leader.candidate.id.clone());
                        }
                    }
                }
                _ = taken => holding = None,
                leader = read_leader(&self.backend, &name, recheck.unwrap_or_default()), if recheck.is_some() => {
                    if let Some(leader) = leader
                        && switchover::took_office(&leader, to)
                    {
                        self.saw_leader(Some(leader.clone()));
                        return (Ok(HandedOver { to: to.to_owned(), fencing_token: leader.fencing_token }), false);
                    }
                }
                () = sleep_until(until) => {
                    // One fresh read: an observer that polls (the file backend's) may not
                    // have looked since the target took office.
                    let fresh = read_leader(&self.backend, &name, Duration::ZERO);
                    if let Ok(Some(leader)) = timeout(self.config.renew_interval, fresh).await {
                        if switchover::took_office(&leader, to) {
                            return (Ok(HandedOver { to: to.to_owned(), fencing_token: leader.fencing_token }), false);
                        }
                        if leader.candidate.id != self.config.candidate.id {
                            last_seen = Some(leader.candidate.id);
                        }
                    }
                    let lapsed = HandOverError::Lapsed { to: to.to_owned(), window, now: last_seen };
                    return (Err(lapsed.into()), false);
                }
            }
        }
    }

    /// Waits for an ended term's guards: at most the grace, and never past the lease's last
    /// safe instant, where the term is halted ([`Term::must_stop`]) and the guards get a last
    /// margin to go. Whether they all went.
    async fn wind_down(
        &self,
        term: &Term,
        guards: &mut Guards,
        health: &mut watch::Receiver<SessionHealth>,
        stop_by: Option<Instant>,
    ) -> bool {
        let ttl = self.config.ttl;
        let margin = ttl / HARD_STOP_MARGIN_DIVISOR;
        let grace_ends = Instant::now() + self.config.grace;
        let mut halted: Option<Instant> = None;
        let mut renewals = stop_by.is_none();
        loop {
            let safe_until =
                stop_by.unwrap_or_else(|| last_safe(health.borrow().confirmed_sent_at, ttl));
            tokio::select! {
                biased;
                () = guards.all_gone() => return true,
                () = sleep_until(grace_ends) => return false,
                () = sleep_until(safe_until), if halted.is_none() => {
                    term.halt(safe_until);
                    halted = Some(safe_until);
                }
                () = sleep_until(halted.map_or(grace_ends, |at| at + margin)), if halted.is_some() => {
                    return false;
                }
                changed = health.changed(), if renewals && halted.is_none() => {
                    renewals = changed.is_ok();
                }
            }
        }
    }

    /// When the work of a term that ended for `reason` must have stopped: see
    /// [`Term::stop_by`]. `confirmed`: when the last confirmed renewal was sent.
    fn stop_by(&self, reason: DemotionReason, confirmed: Instant) -> Option<Instant> {
        stop_by(reason, confirmed, self.config.ttl)
    }

    /// Leaves the queue (or releases) and reports a stop.
    async fn withdraw(&mut self, mut contender: Claim<B>) -> Pursuit<Claim<B>> {
        if let Ok(Ok(settling)) = timeout(self.config.renew_deadline, contender.leave()).await {
            self.inbox.settling = settling;
        }
        self.drop_presence().await;
        Pursuit::Stop
    }

    /// Withdraws the claim for a yield ([`CampaignHandle::resign_for`]): the candidate leaves
    /// the line (or a lock it won meanwhile), answers the resign (`done`), and campaigns
    /// again when the yield ends.
    async fn step_aside(
        &mut self,
        mut contender: Claim<B>,
        done: Option<oneshot::Sender<()>>,
    ) -> Pursuit<Claim<B>> {
        match self.stepped_aside_for.as_deref() {
            Some((to, _)) => {
                tracing::info!(to = %to, "a hand-over is under way: stepping out of the line")
            }
            None => tracing::info!("resigned for a while: withdrawing the claim"),
        }
        let _ = timeout(self.config.renew_deadline, contender.release()).await;
        self.drop_presence().await;
        // The status says so before the resign is answered: its caller reads it next.
        let until = match self.stepped_aside_for.as_deref() {
            Some((_, until)) => *until,
            None => Instant::now() + self.inbox.yielding().unwrap_or_default(),
        };
        self.set_role(Role::CoolingDown { until });
        if let Some(done) = done {
            let _ = done.send(());
        }
        Pursuit::Yield
    }

    /// Takes (or keeps) this candidate's presence record on `session`, on stores that keep
    /// no line of candidates ([`switchover`]): a hand-over checks it. Bounded by the renew
    /// deadline; a failure leaves the candidate without one (a hand-over to it is refused)
    /// until the next attempt.
    async fn keep_presence(&mut self, session: &B::Session) {
        if !self.config.accept_hand_overs || self.backend.info().hand_over == HandOverStyle::Line {
            return;
        }
        let id = session.id();
        if self.presence.as_ref().is_some_and(|p| p.0 != id) {
            // The old session's: it goes with that session.
            self.presence = None;
        }
        let limit = self.config.renew_deadline;
        if self.presence.is_none() {
            let name = presence_name(&self.config.name, &self.config.candidate.id);
            match timeout(limit, session.contend(&name, &self.config.candidate)).await {
                Ok(Ok(mut presence)) => {
                    // A presence record is never asked to hand over.
                    presence.ignore_requests();
                    self.presence = Some(Box::new((id, Mutex::new(presence))));
                }
                _ => return,
            }
        }
        if let Some(presence) = &mut self.presence
            && let (_, presence) = &mut **presence
            && !matches!(
                timeout(limit, switchover::take_presence(get_mut(presence))).await,
                Ok(true)
            )
        {
            tracing::debug!(
                "could not take this candidate's presence record; a hand-over to it is refused \
                 until it can (is another candidate using the same id?)"
            );
        }
    }

    /// Gives up the presence record: this candidate is no longer live (it yields or stops).
    async fn drop_presence(&mut self) {
        if let Some(presence) = self.presence.take()
            && let (_, mut presence) = *presence
        {
            let _ = timeout(self.config.renew_deadline, get_mut(&mut presence).release()).await;
        }
    }

    /// Sleeps until `until`, as [`Role::CoolingDown`], unless interrupted.
    async fn wait_until(&mut self, until: Instant, fence: &mut Fence) -> Option<Interrupt> {
        self.set_role(Role::CoolingDown { until });
        self.inbox
            .unless_interrupted(Some(fence), pin!(sleep_until(until)))
            .await
            .err()
    }

    /// Out of the line while a hand-over to `to` is under way (etcd, ZooKeeper): until a
    /// leader that hands nothing over is seen (the target, or anyone after a lapse), or
    /// `until`. `Err`: shut down meanwhile.
    async fn wait_out_hand_over(&mut self, to: &str, until: Instant) -> Result<(), ()> {
        self.set_role(Role::CoolingDown { until });
        let (backend, config) = (self.backend.clone(), self.config.clone());
        let mut sightings = Sightings::default();
        let waiting = async {
            loop {
                match sightings.next(&backend, None, &config.name, &config).await {
                    Some(leader) if leader.handing_over().is_none() => return Some(leader),
                    _ => {}
                }
            }
        };
        let outcome = self
            .inbox
            .unless_interrupted(None, pin!(timeout_at(until, waiting)))
            .await
            .map_err(|_| ())?;
        if let Ok(leader) = outcome {
            tracing::debug!(to = %to, "the hand-over is done: back in the line");
            self.saw_leader(leader);
        }
        Ok(())
    }

    /// Sleeps for `delay` without a session. `Err`: shut down meanwhile.
    async fn cool_down(&mut self, delay: Duration) -> Result<(), ()> {
        let until = Instant::now() + delay;
        self.set_role(Role::CoolingDown { until });
        self.inbox
            .unless_interrupted(None, pin!(sleep(delay)))
            .await
            .map_err(|_| ())
    }

    /// Writes new metadata into the held lock, bounded by the renew deadline and abandoned
    /// the moment the session is lost: the lead loop then ends the term as it would have.
    async fn proclaim(
        &mut self,
        contender: &mut ContenderOf<B>,
        health: &mut watch::Receiver<SessionHealth>,
        leader: &mut Leader,
        metadata: BTreeMap<String, String>,
    ) -> Result<()> {
        let mut proclaimed = leader.clone();
        proclaimed.candidate.metadata = metadata;
        within_term(
            health,
            self.config.renew_deadline,
            pin!(contender.proclaim(&proclaimed)),
        )
        .await?;
        Arc::make_mut(&mut self.config).candidate = proclaimed.candidate.clone();
        self.status
            .send_modify(|s| s.candidate = proclaimed.candidate.clone());
        *leader = proclaimed.clone();
        self.saw_leader(Some(proclaimed));
        Ok(())
    }

    /// Records a failure; returns how long to wait before the next try.
    fn failed(&mut self, error: &Error) -> Duration {
        let delay = match error {
            Error::Unauthorized { .. } => self.config.backoff.max,
            _ => self.config.backoff.delay(self.failures),
        };
        self.failures = self.failures.saturating_add(1);
        tracing::warn!(%error, retry_in = ?delay, "campaign step failed");
        self.status.send_modify(|s| match &mut s.problem {
            Some(problem) => problem.message = format!("{error}; retrying in {delay:.1?}"),
            None => {
                s.problem = Some(Problem {
                    message: format!("{error}; retrying in {delay:.1?}"),
                    since: Instant::now(),
                    since_wall: SystemTime::now(),
                })
            }
        });
        delay
    }

    fn recovered(&mut self) {
        self.failures = 0;
        if self.status.borrow().problem.is_some() {
            self.status.send_modify(|s| s.problem = None);
        }
    }

    fn set_role(&self, role: Role) {
        self.status.send_if_modified(|s| {
            if s.role == role {
                return false;
            }
            tracing::debug!(from = s.role.as_str(), to = role.as_str(), "transition");
            s.role = role;
            true
        });
    }

    /// The gap before the term this candidate just won (see [`Gap`]): from when it saw the
    /// election without a holder; the upper bound adds the ttl the store waits before it
    /// frees a crashed holder's lock, unless this process ended the last term itself or the
    /// store frees a dead holder's lock at once.
    fn gap(&mut self) -> Gap {
        let seen = self.leaderless.take();
        let lock_free = seen.map_or(Duration::ZERO, |l| l.since.elapsed());
        let exact = seen.is_some_and(|l| l.exact);
        Gap {
            without_leader: if exact || self.backend.info().frees_dead_holder_at_once {
                lock_free
            } else {
                lock_free + self.config.ttl
            },
            lock_free,
            exact,
        }
    }

    fn saw_leader(&mut self, leader: Option<Leader>) {
        match &leader {
            Some(l) if l.candidate.id != self.config.candidate.id => self.leaderless = None,
            Some(_) => {}
            None => {
                self.leaderless.get_or_insert_with(Leaderless::seen);
            }
        }
        if self.leader_reported && self.status.borrow().leader == leader {
            return;
        }
        tracing::info!(
            leader = leader.as_ref().map(|l| l.candidate.id.as_str()),
            "leader changed"
        );
        self.leader_reported = true;
        self.status.send_modify(|s| s.leader = leader.clone());
        self.subscribers
            .send(&LeadershipEvent::LeaderChanged(leader.map(Arc::new)));
    }

    /// `election`, and `candidate` where the election asked for it.
    fn labels_base(&self) -> Vec<::metrics::Label> {
        self.labels_and(None)
    }

    fn labels_base_with(&self, key: &'static str, value: &'static str) -> Vec<::metrics::Label> {
        self.labels_and(Some((key, value)))
    }

    fn labels_and(&self, extra: Option<(&'static str, &'static str)>) -> Vec<::metrics::Label> {
        self.config.metric_labels(&self.config.name, extra)
    }

    fn labels(&self, result: &'static str) -> Vec<::metrics::Label> {
        self.labels_base_with("result", result)
    }
}

/// How often the old leader of a gate store (the file backend) reads the election while it
/// waits for the target of its hand-over to take office.
const GATE_RECHECK: Duration = Duration::from_millis(5);

/// When the work of a term that ended for `reason` must have stopped (see
/// [`Term::stop_by`]); `confirmed`: when the session's last confirmed renewal was sent.
pub(crate) fn stop_by(
    reason: DemotionReason,
    confirmed: Instant,
    ttl: Duration,
) -> Option<Instant> {
    match reason {
        r if r.is_voluntary() => None,
        // The lease may still be alive in the store: it cannot expire before `confirmed +
        // ttl`; stop the work a margin before that.
        DemotionReason::RenewDeadlineExceeded | DemotionReason::ConnectionLost => {
            Some(last_safe(confirmed, ttl))
        }
        // The store has taken the lock away already: the next leader may be starting.
        _ => Some(Instant::now()),
    }
}

/// The last instant a term's work may go on while the session's lease could lapse: a ttl
/// after `confirmed` (the last confirmed renewal's send), less a tenth of the ttl.
pub(crate) fn last_safe(confirmed: Instant, ttl: Duration) -> Instant {
    confirmed + ttl - ttl / HARD_STOP_MARGIN_DIVISOR
}

/// Opens a session, or says that the store gave no answer within `ttl`.
pub(crate) async fn open_within<B: Backend>(
    backend: &B,
    options: &crate::backend::SessionOptions,
    ttl: Duration,
) -> Result<B::Session> {
    timeout(ttl, backend.open_session(options))
        .await
        .unwrap_or_else(|_| {
            Err(Error::Unavailable {
                backend: backend.info().name,
                reason: format!("no answer to opening a session within the ttl ({ttl:?})"),
            })
        })
}

/// The holder of `name`, read once with a fresh observer after `after`; `None` when nobody
/// holds it or the read failed.
async fn read_leader<B: Backend>(backend: &B, name: &str, after: Duration) -> Option<Leader> {
    sleep(after).await;
    let mut observer = backend.observe(name).await.ok()?;
    observer.next().await.ok().flatten()
}

/// The inside of a mutex reached through `&mut`: no lock is taken.
fn get_mut<T>(mutex: &mut Mutex<T>) -> &mut T {
    mutex
        .get_mut()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn span_info(span: &tracing::Span, message: &str) {
    span.in_scope(|| tracing::info!("{message}"));
}

/// Runs `work` while the term can be trusted: `Err(NotLeader)` as soon as the session is
/// lost or no renewal was confirmed within `renew_deadline`, abandoning `work`. Pinned by
/// the caller, as for [`Inbox::unless_interrupted`], so that it is held once.
async fn within_term<T, F: Future<Output = Result<T>>>(
    health: &mut watch::Receiver<SessionHealth>,
    renew_deadline: Duration,
    mut work: Pin<&mut F>,
) -> Result<T> {
    loop {
        let deadline = {
            let h = health.borrow_and_update();
            if h.lost.is_some() {
                return Err(Error::NotLeader);
            }
            h.confirmed_sent_at + renew_deadline
        };
        tokio::select! {
            biased;
            changed = health.changed() => if changed.is_err() {
                return Err(Error::NotLeader);
            },
            () = sleep_until(deadline) => return Err(Error::NotLeader),
            done = work.as_mut() => return done,
        }
    }
}

/// `work`, unless the contender's lock is lost first (`Err`, at once: the term must end).
async fn unless_lost<C: Contender, T>(
    contender: &mut C,
    work: impl Future<Output = Result<T>>,
) -> Result<Result<T, NotReady>> {
    tokio::select! {
        biased;
        loss = contender.lost() => Ok(Err(NotReady::Lost(loss))),
        done = work => done.map(Ok),
    }
}

/// [`Fence::lost`], or never without a session.
async fn lost_if(fence: Option<&mut Fence>) {
    match fence {
        Some(fence) => fence.lost().await,
        None => std::future::pending().await,
    }
}

/// A follower's view of who leads, through the backend's observer: re-created with
/// back-off when it fails, so leader changes that do not wake the follower's own wait
/// (a leader further up the queue) are reported after a store blip too.
struct Sightings<O> {
    observer: Option<O>,
    /// Consecutive failures to observe.
    failures: u32,
    /// When to try again after a failure.
    retry_at: Option<Instant>,
    /// Read once per this long instead of following (see [`Sightings::paced`]).
    pace: Option<Duration>,
    /// When the next paced read is due.
    next_read: Option<Instant>,
}

impl<O> Default for Sightings<O> {
    fn default() -> Self {
        Sightings {
            observer: None,
            failures: 0,
            retry_at: None,
            pace: None,
            next_read: None,
        }
    }
}

impl<O: Observer> Sightings<O> {
    /// Sightings of a key that changes rarely and can wait (the request lock of a
    /// switchover): on a store whose observers poll ([`Wakeup::Poll`]), a read once per
    /// `pace` instead of one per poll interval, so that a leader costs the store no request
    /// per poll for it. Elsewhere the store pushes changes, and they are followed.
    fn paced<B: Backend<Observer = O>>(backend: &B, pace: Duration) -> Self {
        Sightings {
            pace: match backend.info().wakeup {
                Wakeup::Poll(poll) => Some(pace.max(poll)),
                Wakeup::Push => None,
            },
            ..Sightings::default()
        }
    }

    /// The next leader the observer reports (a paced one: what one read says, at each
    /// pace). Cancel-safe: the retry time and the next read survive a drop.
    ///
    /// Only the wait on a live observer is inline: it is where a follower (and a leader, for
    /// the request lock) idles, and a future holds room for its largest state. Reading at a
    /// pace, and creating the observer again, are boxed.
    ///
    /// `session`: the campaign's, for an observer of the campaign's own
    /// ([`Backend::observe_for`]).
    async fn next<B: Backend<Observer = O>>(
        &mut self,
        backend: &B,
        session: Option<&B::Session>,
        name: &str,
        config: &Config,
    ) -> Option<Leader> {
        loop {
            if self.pace.is_none()
                && let Some(observer) = &mut self.observer
            {
                match observer.next().await {
                    Ok(leader) => {
                        self.failures = 0;
                        return leader;
                    }
                    Err(error) => {
                        self.observer = None;
                        self.failed(&error, config);
                        continue;
                    }
                }
            }
            if let Some(leader) = Box::pin(self.rarely(backend, session, name, config)).await {
                return leader;
            }
        }
    }

    /// The paths of [`next`](Self::next) off the idle wait: a paced read (`Some`), or
    /// observing afresh after the back-off (`None`: then wait on the observer, if there is
    /// one now).
    async fn rarely<B: Backend<Observer = O>>(
        &mut self,
        backend: &B,
        session: Option<&B::Session>,
        name: &str,
        config: &Config,
    ) -> Option<Option<Leader>> {
        let observe = || async {
            match session {
                Some(session) => backend.observe_for(name, session).await,
                None => backend.observe(name).await,
            }
        };
        if let Some(pace) = self.pace {
            loop {
                let due = *self.next_read.get_or_insert_with(|| Instant::now() + pace);
                sleep_until(due).await;
                self.next_read = Some(Instant::now() + pace);
                let read = async { observe().await?.next().await };
                match timeout(config.renew_deadline, read).await {
                    Ok(Ok(leader)) => return Some(leader),
                    Ok(Err(error)) => {
                        tracing::debug!(%error, "reading {name} failed; reading it again at the next pace")
                    }
                    Err(_) => tracing::debug!(
                        "reading {name} timed out; reading it again at the next pace"
                    ),
                }
            }
        }
        if let Some(at) = self.retry_at {
            sleep_until(at).await;
        }
        match observe().await {
            Ok(observer) => {
                self.observer = Some(observer);
                self.retry_at = None;
            }
            Err(error) => self.failed(&error, config),
        }
        None
    }

    /// Observing failed: observe again after the back-off.
    fn failed(&mut self, error: &Error, config: &Config) {
        let delay = config.backoff.delay(self.failures);
        self.failures = self.failures.saturating_add(1);
        self.retry_at = Some(Instant::now() + delay);
        tracing::debug!(%error, retry_in = ?delay, "observing the leader failed; observing again after the back-off");
    }
}

fn close_in_background<S: Session>(session: S) {
    tokio::spawn(async move {
        if let Err(error) = session.close().await {
            tracing::debug!(%error, "closing a stale session failed; the store will expire it");
        }
    });
}
