//! [`ElectionSet`]: many elections with one election's settings, on one session, driven by
//! one task.
//!
//! A [`Campaign`](crate::Campaign) is a task of its own, with its own status channel, event
//! queue and settings: about 7 KB per election on etcd. A process that campaigns in
//! thousands of elections (a shard each, a tenant each) pays that per election. A set holds
//! each member as a slot of one task's state (its name, its claim in the store, its term
//! while it leads), and runs a member's steps (acquire, wait, hold, release) as small
//! futures of that task, only the step under way: on etcd, 1.3 to 1.6 KB of heap per
//! election, and under 2 KB resident at 10,000 and 100,000 elections in one process
//! (BENCHMARKS.md, "Scale").
//!
//! What a set keeps of the campaign's promises, and what it leaves out, is in
//! [`ElectionSet`]'s docs.

use std::borrow::Borrow;
use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_core::Stream;
use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::task::AtomicWaker;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::{Instant, sleep_until, timeout, timeout_at};

use crate::backend::{
    Attempt, Backend, Contender, FencingToken, Leader, LockLoss, Session, SessionHealth, lock,
    unix_ms_now,
};
use crate::campaign::{CatchUnwind, last_safe, open_within, panic_message, stop_by};
use crate::config::{Config, validate_name};
use crate::error::{Error, Result};
use crate::event::{DemotionReason, LeadershipEvent};
use crate::fence::{Fence, Freshness};
use crate::metrics;
use crate::queue::{Fanout, QueueReceiver};
use crate::term::{ElectionConfig, Gap, Guards, Term};

/// Something that happened to one member of an [`ElectionSet`].
#[derive(Clone, Debug)]
pub struct SetEvent {
    /// The member's election name.
    pub election: Arc<str>,
    /// What happened: [`Elected`](LeadershipEvent::Elected) with the term,
    /// [`Demoted`](LeadershipEvent::Demoted) with why, or
    /// [`LeaderChanged`](LeadershipEvent::LeaderChanged) when the member saw another holder.
    pub event: LeadershipEvent,
}

/// Many elections with one [`Election`](crate::Election)'s settings (candidate, ttl, renew
/// deadline, back-off, grace), on one session of the store, driven by one task.
///
/// Made with [`Election::set`](crate::Election::set). [`join`](Self::join) an election to
/// campaign in it, [`leave`](Self::leave) it to end the term (if any) and release the lock,
/// [`resign`](Self::resign) to step down and campaign again;
/// read a member's term with [`term`](Self::term) and [`is_leader`](Self::is_leader), and
/// every member's events with [`events`](Self::events). [`shutdown`](Self::shutdown) ends
/// every term and releases every lock.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> incumbent::Result<()> {
/// use incumbent::{Election, LeadershipEvent, memory::MemoryBackend};
///
/// let election = Election::builder(MemoryBackend::new(), "tenants").candidate("host-a").build()?;
/// let set = election.set();
/// let mut events = set.events();
/// for tenant in ["tenants/acme", "tenants/globex"] {
///     set.join(tenant)?;
/// }
/// while let Some(e) = events.recv().await {
///     if let LeadershipEvent::Elected(term) = &e.event {
///         println!("{} leads {} (token {})", term.leader().candidate.id, e.election, term.fencing_token());
///     }
///     if set.leading() == 2 { break }
/// }
/// assert!(set.is_leader("tenants/acme"));
/// set.leave("tenants/acme").await?; // its term ends and its lock is released
/// set.shutdown().await?;            // every other one too, then the session ends
/// # Ok(()) }
/// ```
///
/// # What it keeps of a campaign's promises
///
/// - **The term ends first.** A member's term is cancelled the moment its loss is seen,
///   before anything else; [`is_leader`](Self::is_leader) reads the term's token, so it
///   turns false in the same instant. When the session is lost, or no renewal is confirmed
///   within the renew deadline, every member's term ends at once, with the
///   [`stop_by`](Term::stop_by) a campaign would give, and [`must_stop`](Term::must_stop)
///   completes then; the set then starts over on a new session.
/// - **Fencing**: each term's token is the store's, and a win whose token did not grow is
///   refused, as a campaign refuses it.
/// - **Loss is reported** with a reason, after the term's token was cancelled
///   ([`LeadershipEvent::Demoted`]).
/// - **Graceful hand-off**: a member that leaves (or the set shutting down) ends the term,
///   waits for the term's guards ([`Term::hold`]) up to the grace, then releases the lock.
/// - **Followers do not poll** where the store pushes: each member waits with the store's
///   own notification, as a campaign does.
/// - After a loss, the member campaigns again after the back-off.
/// - **A panic ends every term.** A panic in the set's task (a bug, in this crate or in code
///   it calls, such as a `tracing` subscriber) ends every member's term as it unwinds,
///   reported as [`DemotionReason::CampaignPanicked`](crate::DemotionReason::CampaignPanicked)
///   with a `stop_by` of that instant; [`problem`](Self::problem) says why, the events end,
///   and the set has stopped (a campaign starts over instead: build a new set). The locks
///   are left to the session's expiry.
///
/// # What it leaves out
///
/// A set runs no worker of its own (run work from the [`Term`]s it hands out, and stop it at
/// [`must_stop`](Term::must_stop); a [`ShardedElection`](crate::ShardedElection) runs one per
/// shard on a set, with the hard stop); it has no proclaim or hand-over of one member; it
/// keeps no presence record and does not watch the request lock, so a switchover cannot
/// name a member of a set; it serves no health route of its own, and calls no
/// [`on_elected`](crate::ElectionBuilder::on_elected)-style callbacks. Each of those costs
/// memory per election that a set exists to save; use a [`Campaign`](crate::Campaign) for
/// an election that needs them.
///
/// # Metrics
///
/// Each member records the per-election metrics of [`metrics`](crate::metrics), labelled
/// with its own election's name, as a campaign does: `incumbent_is_leader` (1 from the win,
/// 0 the instant the term ends), `incumbent_elections_won_total`,
/// `incumbent_demotions_total`, `incumbent_campaign_attempts_total` and the two failover
/// histograms. Unlike a campaign's, a member's `incumbent_is_leader` is first exported at
/// its first win, not at its join: a set of 100,000 followers adds no series.
pub struct ElectionSet {
    shared: Arc<SetShared>,
    commands: mpsc::UnboundedSender<Command>,
}

impl fmt::Debug for ElectionSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ElectionSet")
            .field("name", &self.shared.name)
            .field("members", &self.len())
            .field("leading", &self.leading())
            .finish_non_exhaustive()
    }
}

/// A stream of an [`ElectionSet`]'s events, from [`ElectionSet::events`]. It ends once the
/// set has stopped.
pub struct SetEvents {
    rx: QueueReceiver<SetEvent>,
}

impl fmt::Debug for SetEvents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SetEvents").finish_non_exhaustive()
    }
}

impl SetEvents {
    /// The next event, or `None` once the set has stopped.
    pub async fn recv(&mut self) -> Option<SetEvent> {
        self.rx.recv().await
    }
}

impl Stream for SetEvents {
    type Item = SetEvent;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx)
    }
}

/// What the set's handle and its task share.
struct SetShared {
    /// The set's own name (its [`Election`](crate::Election)'s), for logs.
    name: String,
    /// The members, by election name, from [`ElectionSet::join`] until their lock is
    /// released after [`ElectionSet::leave`].
    members: Mutex<HashSet<ByName>>,
    /// How many members' terms are in force, as of the task's last step.
    leading: AtomicUsize,
    /// The last failure to open a session or take a step, until the next success.
    problem: Mutex<Option<String>>,
    /// Every subscriber of the events; unbounded, since a set of 100,000 members can elect
    /// them all at once: read them, or drop the stream.
    events: Fanout<SetEvent>,
}

/// A member's interruption: what tells its step under way to return its claim. One step at a
/// time waits on it, so a flag (in the member's state) and a waker do: a `Notify` and its
/// waiting future cost a member about 90 bytes more, in every step.
impl Member {
    /// Raises the interruption: the step waiting on it (or the next one) returns.
    fn interrupt(&self) {
        lock(&self.state).interrupted = true;
        self.waker.wake();
    }

    /// Completes once the interruption is raised, and lowers it.
    fn interrupted(&self) -> impl Future<Output = ()> + '_ {
        std::future::poll_fn(|cx| {
            self.waker.register(cx.waker());
            let mut state = lock(&self.state);
            if std::mem::take(&mut state.interrupted) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
    }
}

/// A member in [`SetShared::members`], found by its name (the set keeps no other copy of it).
struct ByName(Arc<Member>);

impl Borrow<str> for ByName {
    fn borrow(&self) -> &str {
        &self.0.name
    }
}

impl Hash for ByName {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // As `str` hashes, so that a lookup by `&str` finds it.
        (*self.0.name).hash(state);
    }
}

impl PartialEq for ByName {
    fn eq(&self, other: &Self) -> bool {
        self.0.name == other.0.name
    }
}

impl Eq for ByName {}

impl SetShared {
    /// Whether a join asked for `member` again while it was leaving: then it stays, no longer
    /// leaving. If not, it is taken out of the members, under the same lock as a join's look
    /// for it, so that a join never finds (and counts on) a member that is going.
    /// Once the set is stopping (`may_rejoin` false), the member goes whatever was asked.
    fn rejoin_or_forget(&self, member: &Arc<Member>, may_rejoin: bool) -> bool {
        let mut members = lock(&self.members);
        if may_rejoin {
            let mut state = lock(&member.state);
            if std::mem::take(&mut state.rejoin) {
                state.leaving = false;
                return true;
            }
        }
        if members
            .get(&*member.name)
            .is_some_and(|m| Arc::ptr_eq(&m.0, member))
        {
            members.remove(&*member.name);
        }
        false
    }

    /// Takes `member` out of the members, unless a later join of its name took its place.
    fn forget(&self, member: &Arc<Member>) {
        self.rejoin_or_forget(member, false);
    }
}

/// One member, as the handle and the task share it.
struct Member {
    name: Arc<str>,
    /// Woken when the member is interrupted ([`Member::interrupt`]).
    waker: AtomicWaker,
    state: Mutex<MemberState>,
}

struct MemberState {
    /// The term, from the win until the term ends (and a moment after: read it through
    /// [`Term::is_cancelled`]).
    term: Option<Term>,
    /// The holder this member saw last, while following.
    leader: Option<Arc<Leader>>,
    /// [`ElectionSet::leave`] was called: the member goes once its lock is released.
    leaving: bool,
    /// [`ElectionSet::join`] was called again while it was leaving: it campaigns again
    /// once its lock is released.
    rejoin: bool,
    /// The member leaves (or the set stops): its step under way returns its claim.
    interrupted: bool,
    /// Its slot in the task's state, set by the task when the member joins.
    slot: u32,
}

enum Command {
    Join(Arc<Member>),
    /// A leave (or, with `rejoin`, a resign), and why the term ends.
    Leave(Arc<Member>, oneshot::Sender<()>, DemotionReason),
    Shutdown(oneshot::Sender<()>),
}

impl ElectionSet {
    pub(crate) fn spawn<B: Backend>(backend: B, config: Arc<Config>) -> ElectionSet {
        let shared = Arc::new(SetShared {
            name: config.name.clone(),
            members: Mutex::default(),
            leading: AtomicUsize::new(0),
            problem: Mutex::default(),
            events: Fanout::new(usize::MAX),
        });
        let (commands, rx) = mpsc::unbounded_channel();
        let driver = Driver::<B> {
            backend,
            config,
            shared: shared.clone(),
            commands: rx,
            slots: Vec::new(),
            free: Vec::new(),
            live: 0,
            steps: FuturesUnordered::new(),
            starting: 0,
            queued: VecDeque::new(),
            session: None,
            reopen_at: Some(Instant::now()),
            session_failures: 0,
            leaves: HashMap::new(),
            stopping: None,
        };
        let watched = shared.clone();
        tokio::spawn(async move {
            // A panic (a bug, in this crate or in code it calls, such as a `tracing`
            // subscriber) ends every term as it unwinds (`Driver`'s drop), and is reported.
            if let Err(panic) = CatchUnwind(Box::pin(driver.run())).await {
                *lock(&watched.problem) = Some(format!(
                    "the set's task panicked ({}); every term ended and the set has stopped",
                    panic_message(&*panic)
                ));
            }
        });
        ElectionSet { shared, commands }
    }

    /// Campaigns in the election `name` (a full election name, checked as any election's).
    /// Joining an election the set is already in does nothing. Errors:
    /// [`Error::InvalidElectionName`], and [`Error::Stopped`] once the set is shutting down.
    pub fn join(&self, name: &str) -> Result<()> {
        validate_name(name)?;
        let mut members = lock(&self.shared.members);
        if let Some(ByName(member)) = members.get(name) {
            let mut state = lock(&member.state);
            if state.leaving {
                state.rejoin = true;
            }
            return Ok(());
        }
        let name: Arc<str> = Arc::from(name);
        let member = Arc::new(Member {
            name: name.clone(),
            waker: AtomicWaker::new(),
            state: Mutex::new(MemberState {
                term: None,
                leader: None,
                leaving: false,
                rejoin: false,
                interrupted: false,
                slot: u32::MAX,
            }),
        });
        self.commands
            .send(Command::Join(member.clone()))
            .map_err(|_| Error::Stopped)?;
        members.insert(ByName(member));
        Ok(())
    }

    /// Leaves the election `name`: its term (if it leads) ends, its guards are waited for up
    /// to the grace, and its lock is released (or its place in line given up). The leave
    /// starts at this call; the future returned completes once the lock is released, at
    /// once if the set is not in that election.
    pub fn leave(&self, name: &str) -> impl Future<Output = Result<()>> + Send + 'static {
        self.leave_because(name, DemotionReason::Shutdown, false)
    }

    /// Steps down in the election `name` if the set leads it: the term ends at this call
    /// (reported as [`DemotionReason::Resigned`]), its guards are waited for up to the grace,
    /// the lock is released, and the member campaigns again after the back-off, as a
    /// campaign's [`resign`](crate::CampaignHandle::resign) does. A member that follows gives
    /// up its place in line and takes it again. The future returned completes once the lock
    /// is released; at once if the set is not in that election.
    pub fn resign(&self, name: &str) -> impl Future<Output = Result<()>> + Send + 'static {
        self.leave_because(name, DemotionReason::Resigned, true)
    }

    /// A leave of `name` (or a resign, with `rejoin`), reported with `reason`.
    pub(crate) fn leave_because(
        &self,
        name: &str,
        reason: DemotionReason,
        rejoin: bool,
    ) -> impl Future<Output = Result<()>> + Send + 'static {
        let (tx, rx) = oneshot::channel();
        let asked = {
            let members = lock(&self.shared.members);
            members.get(name).map(|ByName(member)| {
                let mut state = lock(&member.state);
                state.leaving = true;
                state.rejoin = rejoin;
                // The term ends at this call; the set's task reports it and releases.
                if let Some(term) = &state.term {
                    term.end(None);
                }
                member.clone()
            })
        };
        let sent = asked.is_some_and(|member| {
            (self.commands)
                .send(Command::Leave(member, tx, reason))
                .is_ok()
        });
        async move {
            if sent {
                let _ = rx.await;
            }
            Ok(())
        }
    }

    /// Ends every member's term, releases every lock and closes the session. It starts at
    /// this call; the future returned completes once every lock is released.
    pub fn shutdown(self) -> impl Future<Output = Result<()>> + Send + 'static {
        let (tx, rx) = oneshot::channel();
        let sent = self.commands.send(Command::Shutdown(tx)).is_ok();
        async move {
            if sent {
                let _ = rx.await;
            }
            Ok(())
        }
    }

    /// Whether this set leads the election `name` now: the member's term is in force. It
    /// turns false the instant the term is cancelled.
    pub fn is_leader(&self, name: &str) -> bool {
        self.term(name).is_some_and(|term| !term.is_cancelled())
    }

    /// The member's term while it leads (check [`Term::is_cancelled`]: a term that just
    /// ended is returned until the set's task has taken note).
    pub fn term(&self, name: &str) -> Option<Term> {
        let members = lock(&self.shared.members);
        let ByName(member) = members.get(name)?;
        lock(&member.state).term.clone()
    }

    /// The holder of the election `name` as the member last saw it: itself while it leads.
    /// `None` before the member has read the election, when nobody holds it, and when the
    /// set is not in it.
    pub fn leader(&self, name: &str) -> Option<Arc<Leader>> {
        let members = lock(&self.shared.members);
        let ByName(member) = members.get(name)?;
        let state = lock(&member.state);
        match &state.term {
            Some(term) if !term.is_cancelled() => Some(Arc::new(term.leader().clone())),
            _ => state.leader.clone(),
        }
    }

    /// How many elections the set is in (a member that is leaving counts until its lock is
    /// released).
    pub fn len(&self) -> usize {
        lock(&self.shared.members).len()
    }

    /// Whether the set is in no election.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many members lead, as of the set's task's last step: a count for dashboards and
    /// benchmarks. A term that was just cancelled may count for a moment more; to act on
    /// one member's lead, read [`is_leader`](Self::is_leader) or its term.
    pub fn leading(&self) -> usize {
        self.shared.leading.load(Ordering::Relaxed)
    }

    /// Why the last step failed (the session could not be opened, a claim could not be
    /// made), until a step succeeds. The set retries with the back-off meanwhile.
    pub fn problem(&self) -> Option<String> {
        lock(&self.shared.problem).clone()
    }

    /// Every member's events from now on, in order. The stream ends once the set has
    /// stopped. Its queue has no bound: read it, or drop it.
    pub fn events(&self) -> SetEvents {
        SetEvents {
            rx: self.shared.events.add(),
        }
    }
}

impl Drop for ElectionSet {
    /// Dropping the set shuts it down in the background (as [`shutdown`](Self::shutdown),
    /// without waiting).
    fn drop(&mut self) {
        let (tx, _rx) = oneshot::channel();
        let _ = self.commands.send(Command::Shutdown(tx));
    }
}

/// How many members of a set make their first claim at once; the others wait in line. A
/// set of 100,000 started at once would otherwise hold 100,000 acquisitions' requests,
/// answers and futures at the same time, and the heap would keep the holes they leave
/// between the members' lasting blocks.
const MAX_STARTING: usize = 512;

type Claim<B> = Box<<<B as Backend>::Session as Session>::Contender>;
type Step<B> = Pin<Box<dyn Future<Output = (usize, Done<B>)> + Send>>;

/// How a member's step ended.
enum Done<B: Backend> {
    /// An acquisition was tried (after the waits asked for): its result, with the claim
    /// made for it, or `None` if the member was interrupted first (or the claim could not
    /// be made: the error).
    Tried {
        claim: Option<Claim<B>>,
        attempt: Option<Result<Attempt>>,
        /// When the step began, or when its wait for the holder ended: the election was seen
        /// without a holder from then on.
        free_since: Instant,
    },
    /// The lock held until it was lost (with why), or `None`: the member was interrupted.
    Held(Claim<B>, Option<LockLoss>),
    /// A loss, explained by the store, and the term it ended.
    Explained(Claim<B>, LockLoss, Term),
    /// The lock released: the claim is kept unless the member is leaving.
    Released(Option<Claim<B>>),
}

/// One member in the task's state.
struct Slot<B: Backend> {
    member: Arc<Member>,
    /// The claim, while no step holds it.
    claim: Option<Claim<B>>,
    /// The term, the task's own copy: while it is in force (cancelled without a lock), and
    /// after it ended until its loss is reported and its lock released (a term that ended
    /// voluntarily is halted if the session ends meanwhile).
    term: Option<Term>,
    /// The guards of the term in force.
    guards: Option<Guards>,
    /// The token of the member's last term (with `has_token`): a win must beat it.
    last_token: FencingToken,
    failures: u32,
    has_token: bool,
    /// `term` is in force.
    in_force: bool,
    /// A step is under way.
    busy: bool,
    /// The step under way makes the member's first claim (it counts in
    /// [`Driver::starting`]).
    starting: bool,
    /// The member waits in [`Driver::queued`] to make its first claim.
    queued: bool,
    /// The term in `term` was lost, and its loss is being explained: not reported yet.
    explaining: bool,
}

struct Driver<B: Backend> {
    backend: B,
    config: Arc<Config>,
    shared: Arc<SetShared>,
    commands: mpsc::UnboundedReceiver<Command>,
    slots: Vec<Option<Slot<B>>>,
    free: Vec<usize>,
    live: usize,
    steps: FuturesUnordered<Step<B>>,
    /// How many steps make a first claim.
    starting: usize,
    /// Slots waiting to make their first claim, in order.
    queued: VecDeque<usize>,
    session: Option<OpenSession<B>>,
    /// When to open a session, while there is none.
    reopen_at: Option<Instant>,
    session_failures: u32,
    /// Whoever waits for a member's leave, by slot: few at a time, so not in every slot.
    leaves: HashMap<usize, Vec<oneshot::Sender<()>>>,
    /// The set is shutting down: whoever waits for that.
    stopping: Option<Vec<oneshot::Sender<()>>>,
}

struct OpenSession<B: Backend> {
    session: Arc<B::Session>,
    health: watch::Receiver<SessionHealth>,
    fence: Fence,
}

impl<B: Backend> OpenSession<B> {
    /// Closes the session (its steps, which held it too, are gone), within `ttl`.
    async fn close(self, ttl: Duration) {
        drop(self.fence);
        if let Ok(session) = Arc::try_unwrap(self.session) {
            let _ = timeout(ttl, session.close()).await;
        }
    }
}

impl<B: Backend> Driver<B> {
    async fn run(mut self) {
        loop {
            if self.stopping.is_some() && self.live == 0 {
                break;
            }
            if self.session.is_none()
                && self.stopping.is_none()
                && self.reopen_at.is_some_and(|at| at <= Instant::now())
            {
                self.open_session().await;
                continue;
            }
            let reopen_at = self.reopen_at.filter(|_| self.session.is_none());
            tokio::select! {
                biased;
                changed = fence_changed(self.session.as_mut()) => {
                    if changed.is_err() {
                        self.session_ended(Freshness::Gone);
                    } else {
                        self.check_session();
                    }
                }
                command = self.commands.recv(), if !self.commands.is_closed() || !self.commands.is_empty() => match command {
                    Some(command) => self.command(command),
                    // Every handle is gone (the drop sent a shutdown first): stop.
                    None => self.shut_down(None),
                },
                Some((slot, done)) = self.steps.next(), if !self.steps.is_empty() => self.done(slot, done),
                () = sleep_until(reopen_at.unwrap_or_else(Instant::now)), if reopen_at.is_some() => {}
            }
        }
        if let Some(open) = self.session.take() {
            open.close(self.config.ttl).await;
        }
        self.shared.events.close();
        for waiter in self.stopping.take().into_iter().flatten() {
            let _ = waiter.send(());
        }
    }

    async fn open_session(&mut self) {
        let options = self.config.session_options();
        let opened = open_within(&self.backend, &options, self.config.ttl).await;
        match opened {
            Ok(session) => {
                let health = session.health();
                let fence = Fence::of(&health, self.config.renew_deadline);
                self.session = Some(OpenSession {
                    session: Arc::new(session),
                    health,
                    fence,
                });
                self.reopen_at = None;
                self.session_failures = 0;
                *lock(&self.shared.problem) = None;
                for index in 0..self.slots.len() {
                    if self.slots[index].as_ref().is_some_and(|s| !s.busy) {
                        self.pursue(index, None, false);
                    }
                }
            }
            Err(error) => {
                let delay = self.failed(&error, self.session_failures);
                self.session_failures = self.session_failures.saturating_add(1);
                self.reopen_at = Some(Instant::now() + delay);
            }
        }
    }

    fn failed(&self, error: &Error, failures: u32) -> Duration {
        let delay = match error {
            Error::Unauthorized { .. } => self.config.backoff.max,
            _ => self.config.backoff.delay(failures),
        };
        tracing::warn!(set = %self.shared.name, %error, retry_in = ?delay, "election set step failed");
        *lock(&self.shared.problem) = Some(format!("{error}; retrying in {delay:.1?}"));
        delay
    }

    fn check_session(&mut self) {
        let Some(open) = &mut self.session else {
            return;
        };
        // Marks the fence's news seen; the decision is the health's own.
        open.fence.now();
        let freshness = Freshness::of(
            &open.health.borrow(),
            self.config.renew_deadline,
            Instant::now(),
        );
        if freshness != Freshness::Fresh {
            self.session_ended(freshness);
        }
    }

    /// The session is lost, or no renewal was confirmed within the renew deadline: every
    /// term ends, every step is dropped (the session's end frees what they held), and the set
    /// starts over on a new session after the back-off.
    fn session_ended(&mut self, freshness: Freshness) {
        let reason = match freshness {
            Freshness::Fresh => return,
            Freshness::Stale => DemotionReason::RenewDeadlineExceeded,
            Freshness::Lost(loss) => DemotionReason::from_session(loss),
            Freshness::Gone => DemotionReason::ConnectionLost,
        };
        let Some(open) = self.session.take() else {
            return;
        };
        let confirmed = open.health.borrow().confirmed_sent_at;
        let stop_by = stop_by(reason, confirmed, self.config.ttl);
        // The terms end first, every one, before anything else is done.
        for slot in self.slots.iter().flatten() {
            if let Some(term) = slot.term.as_ref().filter(|_| slot.in_force) {
                term.end(stop_by);
            }
        }
        let (mut ended, mut winding_down) = (Vec::new(), Vec::new());
        for index in 0..self.slots.len() {
            let Some(slot) = self.slots[index].as_mut() else {
                continue;
            };
            slot.busy = false;
            slot.starting = false;
            slot.queued = false;
            slot.claim = None;
            slot.guards = None;
            let in_force = std::mem::take(&mut slot.in_force);
            let explaining = std::mem::take(&mut slot.explaining);
            match slot.term.take() {
                Some(term) if in_force => {
                    self.ended(index);
                    self.report(index, &term, reason, stop_by);
                    ended.push(term);
                }
                // Lost a moment ago; its explanation is dropped with the steps: the
                // session's end is the reason.
                Some(term) if explaining => self.report(index, &term, reason, term.stop_by()),
                // Ended voluntarily, its work winding down: the lease may lapse now.
                Some(term) => winding_down.push(term),
                None => {}
            }
        }
        halt_at(ended, stop_by);
        let lapse = last_safe(confirmed, self.config.ttl);
        halt_at(winding_down, Some(lapse));
        // Dropping the steps drops their claims: the session's end frees them.
        self.steps = FuturesUnordered::new();
        self.starting = 0;
        self.queued.clear();
        for index in 0..self.slots.len() {
            if self.slots[index]
                .as_ref()
                .is_some_and(|s| lock(&s.member.state).leaving)
            {
                // Joined again meanwhile, it campaigns again on the next session.
                self.left(index);
            }
        }
        tokio::spawn(open.close(self.config.ttl));
        tracing::warn!(set = %self.shared.name, %reason, "election set's session ended; starting over");
        self.reopen_at = Some(Instant::now() + self.config.backoff.delay(0));
    }

    fn command(&mut self, command: Command) {
        match command {
            Command::Join(member) => {
                if self.stopping.is_some() {
                    return self.shared.forget(&member);
                }
                let index = self.free.pop().unwrap_or_else(|| {
                    self.slots.push(None);
                    self.slots.len() - 1
                });
                lock(&member.state).slot = u32::try_from(index).unwrap_or(u32::MAX);
                self.slots[index] = Some(Slot {
                    member,
                    claim: None,
                    term: None,
                    guards: None,
                    last_token: 0,
                    has_token: false,
                    in_force: false,
                    failures: 0,
                    busy: false,
                    starting: false,
                    queued: false,
                    explaining: false,
                });
                self.live += 1;
                if self.session.is_some() {
                    self.pursue(index, None, false);
                }
            }
            Command::Leave(member, done, reason) => {
                let index = lock(&member.state).slot as usize;
                let live = self.slots.get(index).and_then(Option::as_ref);
                if !live.is_some_and(|slot| Arc::ptr_eq(&slot.member, &member)) {
                    let _ = done.send(());
                    return;
                }
                self.leaves.entry(index).or_default().push(done);
                self.interrupt(index, reason);
            }
            Command::Shutdown(done) => self.shut_down(Some(done)),
        }
    }

    fn shut_down(&mut self, done: Option<oneshot::Sender<()>>) {
        let first = self.stopping.is_none();
        self.stopping.get_or_insert_with(Vec::new).extend(done);
        if !first {
            return;
        }
        if let Some(open) = &self.session {
            if let Some(notice) = open.session.shutdown_notice() {
                notice.give();
            }
            open.session.leaving();
        }
        for ByName(member) in lock(&self.shared.members).iter() {
            lock(&member.state).leaving = true;
        }
        for index in 0..self.slots.len() {
            self.interrupt(index, DemotionReason::Shutdown);
        }
    }

    /// The member is leaving (or resigning): its term ends now, for `reason`; its step under
    /// way is interrupted (the release follows when it returns), or the release starts.
    fn interrupt(&mut self, index: usize, reason: DemotionReason) {
        let Some(slot) = self.slots[index].as_mut() else {
            return;
        };
        if let Some(term) = slot.term.clone().filter(|_| slot.in_force) {
            slot.in_force = false;
            term.end(None);
            self.ended(index);
            self.report(index, &term, reason, None);
        }
        let Some(slot) = self.slots[index].as_mut() else {
            return;
        };
        if slot.busy {
            slot.member.interrupt();
        } else {
            self.release(index);
        }
    }

    /// The term of slot `index` was cancelled: the status stops saying leader.
    fn ended(&mut self, index: usize) {
        let Some(slot) = self.slots[index].as_ref() else {
            return;
        };
        self.shared.leading.fetch_sub(1, Ordering::Relaxed);
        {
            let mut state = lock(&slot.member.state);
            state.term = None;
            state.leader = None;
        }
        let labels = self.config.metric_labels(&slot.member.name, None);
        ::metrics::gauge!(metrics::IS_LEADER, labels).set(0.0);
    }

    /// Tells the subscribers that the term of slot `index` ended.
    fn report(&self, index: usize, term: &Term, reason: DemotionReason, stop_by: Option<Instant>) {
        let Some(slot) = self.slots[index].as_ref() else {
            return;
        };
        let labels =
            (self.config).metric_labels(&slot.member.name, Some(("reason", reason.as_str())));
        ::metrics::counter!(metrics::DEMOTIONS, labels).increment(1);
        self.shared.events.send(&SetEvent {
            election: slot.member.name.clone(),
            event: LeadershipEvent::Demoted {
                fencing_token: term.fencing_token(),
                reason,
                stop_by,
            },
        });
    }

    fn done(&mut self, index: usize, done: Done<B>) {
        let stopping = self.stopping.is_some();
        let Some(slot) = self.slots.get_mut(index).and_then(Option::as_mut) else {
            return;
        };
        slot.busy = false;
        let leaving = stopping || lock(&slot.member.state).leaving;
        match done {
            Done::Tried {
                claim,
                attempt,
                free_since,
            } => {
                slot.claim = claim;
                if std::mem::take(&mut slot.starting) {
                    self.starting -= 1;
                    self.start_queued();
                }
                if leaving {
                    return self.release(index);
                }
                let result = match &attempt {
                    Some(Ok(Attempt::Won { .. })) => Some("won"),
                    Some(Ok(Attempt::Held { .. })) => Some("held"),
                    Some(Ok(Attempt::Delayed { .. })) => Some("delayed"),
                    Some(Err(_)) => Some("error"),
                    None => None,
                };
                let Some(slot) = self.slots[index].as_mut() else {
                    return;
                };
                if let Some(result) = result {
                    let labels =
                        (self.config).metric_labels(&slot.member.name, Some(("result", result)));
                    ::metrics::counter!(metrics::CAMPAIGN_ATTEMPTS, labels).increment(1);
                }
                match attempt {
                    Some(Ok(Attempt::Won { fencing_token })) => {
                        self.won(index, fencing_token, free_since)
                    }
                    Some(Ok(Attempt::Held { holder })) => {
                        slot.failures = 0;
                        self.saw(index, holder);
                        self.pursue(index, None, true);
                    }
                    Some(Ok(Attempt::Delayed { until })) => self.pursue(index, Some(until), false),
                    Some(Err(error)) => {
                        let failures = slot.failures;
                        slot.failures = failures.saturating_add(1);
                        let delay = self.failed(&error, failures);
                        self.pursue(index, Some(Instant::now() + delay), false);
                    }
                    // Interrupted, but not leaving (a leave taken back by a join): go on.
                    None => self.pursue(index, None, false),
                }
            }
            Done::Held(claim, loss) => {
                slot.claim = Some(claim);
                match loss {
                    Some(loss) => {
                        let Some(term) = slot.term.clone().filter(|_| slot.in_force) else {
                            return self.release(index);
                        };
                        slot.in_force = false;
                        // The term ends first: the store has taken the lock away already,
                        // and the next leader may be starting, so its work must stop now.
                        let now = Instant::now();
                        term.end(Some(now));
                        term.halt(now);
                        slot.guards = None;
                        slot.explaining = true;
                        self.ended(index);
                        self.explain(index, loss, term);
                    }
                    // Interrupted: the term, if any, ended at the leave.
                    None => self.release(index),
                }
            }
            Done::Explained(claim, loss, term) => {
                slot.claim = Some(claim);
                slot.explaining = false;
                slot.term = None;
                // `stop_by` was set when the term ended, at the loss.
                self.report(
                    index,
                    &term,
                    DemotionReason::from_lock(loss),
                    term.stop_by(),
                );
                self.release(index);
            }
            Done::Released(claim) => {
                slot.claim = claim;
                slot.guards = None;
                slot.term = None;
                if leaving && !self.left(index) {
                    return;
                }
                let delay = self.config.backoff.delay(0);
                self.pursue(index, Some(Instant::now() + delay), false);
            }
        }
    }

    /// The member of slot `index` won with `fencing_token`: its term begins, unless the win
    /// cannot be trusted.
    fn won(&mut self, index: usize, fencing_token: FencingToken, free_since: Instant) {
        let Some(open) = &self.session else { return };
        let Some(slot) = self.slots.get(index).and_then(Option::as_ref) else {
            return;
        };
        let untrusted = {
            let health = open.health.borrow();
            if slot.claim.is_none() {
                Some("the win came without its claim")
            } else if health.lost.is_some() {
                Some("the session is lost")
            } else if Instant::now() >= health.confirmed_sent_at + self.config.renew_deadline {
                Some("no renewal confirmed within the renew deadline")
            } else if Instant::now() >= free_since + self.config.renew_deadline {
                // The answer waited (a frozen process, a stalled task) longer than the lock
                // can be trusted from its acquisition: it may be another's by now.
                Some("the acquisition's answer came later than the renew deadline")
            } else if slot.has_token && fencing_token <= slot.last_token {
                Some("the fencing token did not grow")
            } else {
                None
            }
        };
        if let Some(why) = untrusted {
            let error = Error::Store {
                backend: self.backend.info().name,
                reason: format!("a win was not trusted: {why}"),
            };
            let failures = slot.failures;
            if let Some(slot) = self.slots[index].as_mut() {
                slot.failures = failures.saturating_add(1);
            }
            let delay = self.failed(&error, failures);
            self.pursue(index, Some(Instant::now() + delay), false);
            return;
        }
        let lock_free = free_since.elapsed();
        let gap = Gap {
            without_leader: if self.backend.info().frees_dead_holder_at_once {
                lock_free
            } else {
                lock_free + self.config.ttl
            },
            lock_free,
            exact: false,
        };
        let Some(slot) = self.slots[index].as_mut() else {
            return;
        };
        let Some(claim) = slot.claim.take() else {
            return;
        };
        let leader = Leader {
            candidate: self.config.candidate.clone(),
            fencing_token: Some(fencing_token),
            since_unix_ms: Some(unix_ms_now()),
        };
        let (term, guards) = Term::new(
            ElectionConfig::member(self.config.clone(), slot.member.name.clone()),
            leader,
            fencing_token,
            gap,
        );
        slot.term = Some(term.clone());
        slot.in_force = true;
        slot.guards = Some(guards);
        slot.last_token = fencing_token;
        slot.has_token = true;
        slot.failures = 0;
        {
            let mut state = lock(&slot.member.state);
            state.term = Some(term.clone());
            state.leader = None;
        }
        self.shared.leading.fetch_add(1, Ordering::Relaxed);
        let gap = term.gap();
        let labels = self.config.metric_labels(&slot.member.name, None);
        ::metrics::counter!(metrics::ELECTIONS_WON, labels.clone()).increment(1);
        ::metrics::gauge!(metrics::IS_LEADER, labels.clone()).set(1.0);
        ::metrics::histogram!(metrics::TIME_TO_LEADER, labels.clone())
            .record(gap.without_leader.as_secs_f64());
        ::metrics::histogram!(metrics::LOCK_FREE_TO_LEADER, labels)
            .record(gap.lock_free.as_secs_f64());
        let election = slot.member.name.clone();
        let member = slot.member.clone();
        slot.busy = true;
        self.shared.events.send(&SetEvent {
            election,
            event: LeadershipEvent::Elected(term),
        });
        self.steps.push(Box::pin(hold::<B>(index, member, claim)));
    }

    /// The member of slot `index` saw `holder` hold its election.
    fn saw(&mut self, index: usize, holder: Option<Leader>) {
        let Some(slot) = self.slots[index].as_ref() else {
            return;
        };
        let changed = {
            let mut state = lock(&slot.member.state);
            if state.leader.as_deref() == holder.as_ref() {
                None
            } else {
                let holder = holder.map(Arc::new);
                state.leader = holder.clone();
                Some(holder)
            }
        };
        if let Some(holder) = changed {
            self.shared.events.send(&SetEvent {
                election: slot.member.name.clone(),
                event: LeadershipEvent::LeaderChanged(holder),
            });
        }
    }

    /// Starts the member of slot `index` on an acquisition: after `until`, and after a wait
    /// for the holder to change if `wait`.
    fn pursue(&mut self, index: usize, until: Option<Instant>, wait: bool) {
        let Some(open) = &self.session else { return };
        let Some(slot) = self.slots[index].as_mut() else {
            return;
        };
        if slot.claim.is_none() {
            // A first claim: at most `MAX_STARTING` at once, the others in line.
            if self.starting >= MAX_STARTING {
                if !slot.queued {
                    slot.queued = true;
                    self.queued.push_back(index);
                }
                return;
            }
            self.starting += 1;
            slot.starting = true;
        }
        slot.busy = true;
        let step = pursue::<B>(
            index,
            slot.member.clone(),
            open.session.clone(),
            self.config.clone(),
            slot.claim.take(),
            until,
            wait,
        );
        self.steps.push(Box::pin(step));
    }

    /// Starts the first claims waiting in line, while fewer than `MAX_STARTING` are under way.
    fn start_queued(&mut self) {
        while self.starting < MAX_STARTING {
            let Some(index) = self.queued.pop_front() else {
                return;
            };
            let Some(slot) = self.slots[index].as_mut() else {
                continue;
            };
            if !std::mem::take(&mut slot.queued) || slot.busy {
                continue;
            }
            self.pursue(index, None, false);
        }
    }

    /// Asks the store why the lock of slot `index` was lost.
    fn explain(&mut self, index: usize, loss: LockLoss, term: Term) {
        let Some(slot) = self.slots[index].as_mut() else {
            return;
        };
        let Some(mut claim) = slot.claim.take() else {
            return;
        };
        slot.busy = true;
        let limit = self.config.ttl;
        self.steps.push(Box::pin(async move {
            let loss = timeout(limit, claim.explain(loss)).await.unwrap_or(loss);
            (index, Done::Explained(claim, loss, term))
        }));
    }

    /// Releases the lock of slot `index` (or its place in line), after the guards of a term
    /// that ended voluntarily (up to the grace); for good when the member leaves.
    fn release(&mut self, index: usize) {
        let stopping = self.stopping.is_some();
        let Some(slot) = self.slots[index].as_mut() else {
            return;
        };
        let leaving = stopping || lock(&slot.member.state).leaving;
        let Some(mut claim) = slot.claim.take() else {
            if leaving && !self.left(index) {
                return;
            }
            return self.pursue(index, None, false);
        };
        slot.busy = true;
        let guards = slot.guards.take();
        let ending = slot.term.clone();
        let grace = self.config.grace;
        let limit = self.config.ttl;
        let lapse = (self.session.as_ref())
            .map(|open| last_safe(open.health.borrow().confirmed_sent_at, self.config.ttl));
        self.steps.push(Box::pin(async move {
            if let (Some(mut guards), Some(term)) = (guards, ending) {
                let until = lapse.map_or(Instant::now() + grace, |l| l.min(Instant::now() + grace));
                if timeout_at(until, guards.all_gone()).await.is_err() {
                    term.halt(until);
                }
            }
            if stopping {
                if let Ok(Ok(Some(settling))) = timeout(limit, claim.leave()).await {
                    settling.await;
                }
                (index, Done::Released(None))
            } else {
                let _ = timeout(limit, claim.release()).await;
                (index, Done::Released((!leaving).then_some(claim)))
            }
        }));
    }

    /// The member of slot `index` has let go of its lock while leaving: whoever waits for the
    /// leave is told, and the member goes, unless a join asked for it again meanwhile
    /// (checked under the members' lock, as a join looks: [`SetShared::rejoin_or_forget`]).
    /// Returns whether it stays, to campaign again.
    fn left(&mut self, index: usize) -> bool {
        let Some(slot) = self.slots[index].as_ref() else {
            return false;
        };
        let rejoined = (self.shared).rejoin_or_forget(&slot.member, self.stopping.is_none());
        if !rejoined {
            self.finish(index);
            return false;
        }
        for waiter in self.leaves.remove(&index).into_iter().flatten() {
            let _ = waiter.send(());
        }
        true
    }

    /// The member of slot `index` is gone (and out of the members: [`left`](Self::left)):
    /// its slot is freed and whoever waits is told.
    fn finish(&mut self, index: usize) {
        if self.slots[index].take().is_none() {
            return;
        }
        self.free.push(index);
        self.live -= 1;
        for waiter in self.leaves.remove(&index).into_iter().flatten() {
            let _ = waiter.send(());
        }
    }
}

impl<B: Backend> Drop for Driver<B> {
    /// However the task ends, a panic or a dropped runtime included, no term stays in force:
    /// each ends at once, and is reported (a panic as [`DemotionReason::CampaignPanicked`]).
    fn drop(&mut self) {
        let now = Instant::now();
        let reason = if std::thread::panicking() {
            DemotionReason::CampaignPanicked
        } else {
            DemotionReason::Shutdown
        };
        for slot in self.slots.iter().flatten() {
            if let Some(term) = slot.term.as_ref().filter(|_| slot.in_force) {
                term.end(Some(now));
                term.halt(now);
            }
        }
        for index in 0..self.slots.len() {
            let Some(slot) = self.slots[index].as_mut() else {
                continue;
            };
            if std::mem::take(&mut slot.in_force)
                && let Some(term) = slot.term.clone()
            {
                self.ended(index);
                self.report(index, &term, reason, Some(now));
            }
        }
        self.shared.events.close();
    }
}

/// Completes when the session's published freshness changes; never without a session.
async fn fence_changed<B: Backend>(open: Option<&mut OpenSession<B>>) -> Result<(), ()> {
    match open {
        Some(open) => open.fence.changed().await,
        None => std::future::pending().await,
    }
}

/// Halts `terms` at `stop_by` (at once if it has passed): their work must have stopped.
fn halt_at(terms: Vec<Term>, stop_by: Option<Instant>) {
    let Some(at) = stop_by else { return };
    if terms.is_empty() {
        return;
    }
    if at <= Instant::now() {
        for term in &terms {
            term.halt(at);
        }
        return;
    }
    tokio::spawn(async move {
        sleep_until(at).await;
        for term in &terms {
            term.halt(at);
        }
    });
}

/// One acquisition: the claim made if there is none, a wait for `until`, a wait for the
/// holder to change if `wait`, then `acquire`. Interrupted by a leave.
async fn pursue<B: Backend>(
    index: usize,
    member: Arc<Member>,
    session: Arc<B::Session>,
    config: Arc<Config>,
    claim: Option<Claim<B>>,
    until: Option<Instant>,
    wait: bool,
) -> (usize, Done<B>) {
    let mut free_since = Instant::now();
    let mut claim = match claim {
        Some(claim) => claim,
        None => {
            let made = tokio::select! {
                biased;
                () = member.interrupted() => None,
                made = session.contend(&member.name, &config.candidate) => Some(made),
            };
            match made {
                None => {
                    return (
                        index,
                        Done::Tried {
                            claim: None,
                            attempt: None,
                            free_since,
                        },
                    );
                }
                Some(Err(error)) => {
                    return (
                        index,
                        Done::Tried {
                            claim: None,
                            attempt: Some(Err(error)),
                            free_since,
                        },
                    );
                }
                Some(Ok(mut claim)) => {
                    // A set's members take no hand-over requests.
                    claim.ignore_requests();
                    Box::new(claim)
                }
            }
        }
    };
    let attempt = tokio::select! {
        biased;
        () = member.interrupted() => None,
        attempt = async {
            if let Some(until) = until {
                sleep_until(until).await;
            }
            if wait {
                claim.wait().await?;
            }
            free_since = Instant::now();
            claim.acquire().await
        } => Some(attempt),
    };
    (
        index,
        Done::Tried {
            claim: Some(claim),
            attempt,
            free_since,
        },
    )
}

/// The lock held: until it is lost, or the member is interrupted.
async fn hold<B: Backend>(
    index: usize,
    member: Arc<Member>,
    mut claim: Claim<B>,
) -> (usize, Done<B>) {
    let loss = tokio::select! {
        biased;
        loss = claim.lost() => Some(loss),
        () = member.interrupted() => None,
    };
    (index, Done::Held(claim, loss))
}
