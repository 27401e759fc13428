//! [`Election`]: the builder, callbacks, and the singleton-worker runner.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::Result;
use crate::backend::{Backend, Leader};
use crate::campaign::{self, Campaign};
use crate::config::{Backoff, Config, Draft};
use crate::event::{Demotion, LeadershipEvent};
use crate::runner::{self, OnWorkerExit, Runner, WorkerOutcome};
use crate::term::Term;

type Callback<T> = Arc<dyn Fn(T) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

#[derive(Clone, Default)]
struct Callbacks {
    elected: Option<Callback<Term>>,
    demoted: Option<Callback<Demotion>>,
    leader_changed: Option<Callback<Option<Arc<Leader>>>>,
}

impl Callbacks {
    fn is_empty(&self) -> bool {
        self.elected.is_none() && self.demoted.is_none() && self.leader_changed.is_none()
    }
}

/// A named election, ready to campaign in. Cheap to clone.
///
/// Made with [`Election::builder`]; start it with [`campaign`](Election::campaign) (events
/// and status) or [`run`](Election::run) (a worker that runs only while leader).
pub struct Election<B: Backend> {
    backend: B,
    config: Arc<Config>,
    callbacks: Callbacks,
    on_worker_exit: OnWorkerExit,
}

impl<B: Backend> Clone for Election<B> {
    fn clone(&self) -> Self {
        Election {
            backend: self.backend.clone(),
            config: self.config.clone(),
            callbacks: self.callbacks.clone(),
            on_worker_exit: self.on_worker_exit,
        }
    }
}

impl<B: Backend> fmt::Debug for Election<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Election")
            .field("backend", &self.backend.info().name)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// Builds an [`Election`]; every setting is checked by [`build`](ElectionBuilder::build).
pub struct ElectionBuilder<B: Backend> {
    backend: B,
    draft: Draft,
    callbacks: Callbacks,
    on_worker_exit: OnWorkerExit,
}

impl<B: Backend> fmt::Debug for ElectionBuilder<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ElectionBuilder")
            .field("backend", &self.backend.info().name)
            .field("draft", &self.draft)
            .finish_non_exhaustive()
    }
}

impl<B: Backend> ElectionBuilder<B> {
    /// This candidate's identity, as others will see it (default: `host-pid-xxxx`).
    pub fn candidate(mut self, id: impl Into<String>) -> Self {
        self.draft.candidate_id = Some(id.into());
        self
    }

    /// Adds a metadata entry others can read with the leader, e.g. an address.
    pub fn metadata(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.draft.metadata.insert(key.into(), value.into());
        self
    }

    /// How long the store keeps the session without renewal (default
    /// [`DEFAULT_TTL`](crate::config::DEFAULT_TTL)). A crashed leader is replaced about this
    /// long after it dies.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.draft.ttl = Some(ttl);
        self
    }

    /// How often the session is renewed (default: ttl / 3, or ttl / 2 on Consul, see [`BackendInfo::renew_divisor`](crate::backend::BackendInfo::renew_divisor)). Must be below the renew deadline.
    pub fn renew_interval(mut self, interval: Duration) -> Self {
        self.draft.renew_interval = Some(interval);
        self
    }

    /// A leader with no renewal confirmed within this long (counted from when that renewal
    /// was sent) cancels its term (default: 2/3 of the ttl; at most 4/5 of it; on ZooKeeper
    /// half of it, and less than 4/5: see [`DeadlineRule`](crate::backend::DeadlineRule)).
    pub fn renew_deadline(mut self, deadline: Duration) -> Self {
        self.draft.renew_deadline = Some(deadline);
        self
    }

    /// After our session is invalidated, how long the store keeps the lock from everyone,
    /// where the store supports it (Consul's lock-delay; the memory backend). Default: the
    /// store's own default (Consul: 15 s; memory: none). [`build`](Self::build) refuses a
    /// non-zero delay on a store without lock-delay, and one above the store's maximum
    /// ([`BackendInfo::max_lock_delay`](crate::backend::BackendInfo::max_lock_delay); Consul:
    /// 60 s), with [`Error::InvalidTiming`](crate::Error::InvalidTiming).
    pub fn lock_delay(mut self, delay: Duration) -> Self {
        self.draft.lock_delay = Some(delay);
        self
    }

    /// Retry delays after errors and the cool-down after a loss: jittered, doubling from
    /// `initial` up to `max` (defaults 250 ms and 30 s).
    pub fn backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.draft.backoff = Backoff { initial, max };
        self
    }

    /// How long a cancelled term's work may take to wind down before the lock is released
    /// anyway, and [`run`](Election::run)'s worker is aborted (default 10 s).
    pub fn grace(mut self, grace: Duration) -> Self {
        self.draft.grace = Some(grace);
        self
    }

    /// Labels this election's metrics with the candidate's id too, besides the election's
    /// name (default: off). Off by default because the default candidate id holds the pid,
    /// so every restart would start new series; turn it on with a stable id, e.g. a host name.
    pub fn label_metrics_with_candidate(mut self, on: bool) -> Self {
        self.draft.candidate_label = on;
        self
    }

    /// How long a hand-over keeps the next term for its target
    /// ([`CampaignHandle::hand_over`](crate::CampaignHandle::hand_over)): if the target has not taken office by then, the
    /// reservation lapses and an open election follows (default: the ttl, the time a
    /// crashed leader takes to be replaced anyway). See [`switchover`](crate::switchover).
    pub fn hand_over_window(mut self, window: Duration) -> Self {
        self.draft.hand_over_window = Some(window);
        self
    }

    /// Whether this candidate, while it leads, serves hand-over requests that come through
    /// the store (`incumbent switchover`, [`Election::hand_over`],
    /// [`CampaignHandle::hand_over`](crate::CampaignHandle::hand_over) called on a follower, a candidate of higher
    /// [`priority`](Self::priority)) (default: on). It costs the leader one watch of the
    /// election's request lock (`<election>/.switchover`): on memcached, one read per poll.
    pub fn switchover_requests(mut self, on: bool) -> Self {
        self.draft.switchover_requests = Some(on);
        self
    }

    /// Whether this candidate can be the target of a hand-over (default: on). On the stores
    /// that keep no line of candidates (all but etcd and ZooKeeper) a target must hold a
    /// presence record of its own, `<election>/.candidates/<hash of its id>`, renewed with its
    /// session: one more key per candidate and election. Off: no record, and a hand-over to
    /// this candidate is refused as not live (on etcd and ZooKeeper the store's line shows it
    /// anyway).
    pub fn accept_hand_overs(mut self, on: bool) -> Self {
        self.draft.accept_hand_overs = Some(on);
        self
    }

    /// Makes this a preferred candidate: while it is live, follows, and has seen the same
    /// leader for `settle` (default [`DEFAULT_PRIORITY_SETTLE`](crate::config::DEFAULT_PRIORITY_SETTLE)
    /// with [`priority`](Self::priority)), and that leader's priority is lower (a candidate
    /// without one counts as 0), it asks for a hand-over to itself. A request that does not
    /// make it lead doubles the settle time before the next, so leadership never flaps; two
    /// candidates of equal priority never take it from each other. Kafka's preferred leader,
    /// for any service. The level is published in the metadata (`incumbent.priority`).
    pub fn priority_with_settle(mut self, level: u32, settle: Duration) -> Self {
        self.draft.priority = Some(crate::config::Priority { level, settle });
        self
    }

    /// [`priority_with_settle`](Self::priority_with_settle) with the default settle time.
    pub fn priority(self, level: u32) -> Self {
        self.priority_with_settle(level, crate::config::DEFAULT_PRIORITY_SETTLE)
    }

    /// What [`run`](Election::run) does when the worker ends while leader (default: resign).
    pub fn on_worker_exit(mut self, policy: OnWorkerExit) -> Self {
        self.on_worker_exit = policy;
        self
    }

    /// Called with the term each time this candidate is elected.
    ///
    /// Callbacks run one at a time, in event order, in a task of their own: a slow callback
    /// delays later callbacks, never the campaign. To stop work on loss, select on
    /// [`Term::cancelled`] rather than waiting for `on_demoted`.
    pub fn on_elected<F, Fut>(mut self, f: F) -> Self
    where
        F: Fn(Term) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.callbacks.elected = Some(Arc::new(move |t| Box::pin(f(t))));
        self
    }

    /// Called each time this candidate's term ends (after its token was cancelled), with the
    /// whole [`Demotion`]: the term's token, the reason, and the `stop_by` of an involuntary
    /// loss. See [`on_elected`](Self::on_elected) for how callbacks run.
    pub fn on_demoted<F, Fut>(mut self, f: F) -> Self
    where
        F: Fn(Demotion) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.callbacks.demoted = Some(Arc::new(move |r| Box::pin(f(r))));
        self
    }

    /// Called each time the leader this candidate sees changes (`None`: nobody leads), itself
    /// included. See [`on_elected`](Self::on_elected) for how callbacks run.
    pub fn on_leader_changed<F, Fut>(mut self, f: F) -> Self
    where
        F: Fn(Option<Arc<Leader>>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.callbacks.leader_changed = Some(Arc::new(move |l| Box::pin(f(l))));
        self
    }

    /// Checks every setting against the others and against the backend's limits.
    ///
    /// # Errors
    /// [`Error::InvalidElectionName`](crate::Error::InvalidElectionName), [`Error::InvalidCandidate`](crate::Error::InvalidCandidate) or
    /// [`Error::InvalidTiming`](crate::Error::InvalidTiming), each saying what to change.
    pub fn build(self) -> Result<Election<B>> {
        let config = self.draft.validate(&self.backend.info())?;
        Ok(Election {
            backend: self.backend,
            config: Arc::new(config),
            callbacks: self.callbacks,
            on_worker_exit: self.on_worker_exit,
        })
    }
}

impl<B: Backend> Election<B> {
    /// Starts building an election named `name` on `backend`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use incumbent::{Election, memory::MemoryBackend};
    ///
    /// let election = Election::builder(MemoryBackend::new(), "jobs/index-builder")
    ///     .candidate("host-a:8080")
    ///     .ttl(Duration::from_secs(10))
    ///     .build()?;
    /// # Ok::<(), incumbent::Error>(())
    /// ```
    pub fn builder(backend: B, name: impl Into<String>) -> ElectionBuilder<B> {
        ElectionBuilder {
            backend,
            draft: Draft {
                name: name.into(),
                ..Draft::default()
            },
            callbacks: Callbacks::default(),
            on_worker_exit: OnWorkerExit::default(),
        }
    }

    /// What the worker's runner does when the worker returns.
    pub(crate) fn on_worker_exit(&self) -> OnWorkerExit {
        self.on_worker_exit
    }

    /// The validated settings.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Who leads this election now, as the store says, without campaigning: one read through
    /// the backend's [`Observer`](crate::backend::Observer). `None` while nobody leads.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> incumbent::Result<()> {
    /// use incumbent::{Election, memory::MemoryBackend};
    ///
    /// let election = Election::builder(MemoryBackend::new(), "scheduler").build()?;
    /// assert!(election.leader().await?.is_none());
    /// # Ok(()) }
    /// ```
    pub async fn leader(&self) -> Result<Option<Leader>> {
        use crate::backend::Observer as _;
        let mut observer = self.backend.observe(&self.config.name).await?;
        observer.next().await
    }

    /// Asks the leader to hand the election over to the candidate `to`, without campaigning,
    /// and returns once `to` leads: through the store's request lock, with a session of this
    /// election's ttl, waiting at most `timeout`. `window`: the reservation window the leader
    /// keeps (`None`: its own setting). See [`switchover`](crate::switchover) for the steps
    /// and the errors; `incumbent switchover` is this call.
    pub async fn hand_over(
        &self,
        to: &str,
        window: Option<Duration>,
        timeout: Duration,
    ) -> Result<crate::HandedOver> {
        let options = crate::switchover::RequestOptions {
            session: self.config.session_options(),
            window,
            timeout,
        };
        crate::switchover::request(&self.backend, &self.config.name, to, &options).await
    }

    /// The candidates of this election in the order the store hands it on, the leader
    /// first, read once without campaigning: where the store keeps a queue of candidates
    /// (etcd, ZooKeeper). `None` where the store keeps only the holder (Consul, Redis,
    /// memcached, the file and memory backends): use [`leader`](Self::leader) there.
    pub async fn participants(&self) -> Result<Option<Vec<Leader>>> {
        self.backend.participants(&self.config.name).await
    }

    /// Starts campaigning, and returns the running [`Campaign`]. Must be called from within
    /// a tokio runtime. Each call starts an independent campaign (with its own session).
    pub fn campaign(&self) -> Campaign {
        campaign::spawn(self.backend.clone(), self.config.clone(), |handle| {
            if !self.callbacks.is_empty() {
                let callbacks = self.callbacks.clone();
                let mut events = handle.subscribe();
                tokio::spawn(async move {
                    while let Some(event) = events.recv().await {
                        match event {
                            LeadershipEvent::Elected(term) => {
                                if let Some(f) = &callbacks.elected {
                                    f(term).await;
                                }
                            }
                            LeadershipEvent::Demoted {
                                fencing_token,
                                reason,
                                stop_by,
                            } => {
                                if let Some(f) = &callbacks.demoted {
                                    f(Demotion {
                                        fencing_token,
                                        reason,
                                        stop_by,
                                    })
                                    .await;
                                }
                            }
                            LeadershipEvent::LeaderChanged(leader) => {
                                if let Some(f) = &callbacks.leader_changed {
                                    f(leader).await;
                                }
                            }
                        }
                    }
                });
            }
        })
    }

    /// Starts an [`ElectionSet`](crate::ElectionSet): many elections with these settings (the
    /// candidate, ttl, renew deadline, back-off and grace), on one session, driven by one
    /// task; this election's own name only labels the set in logs. Each member costs a
    /// fraction of a campaign's memory: the way to campaign in thousands of elections from
    /// one process. Callbacks and the worker policy do not apply to a set. Must be called
    /// from within a tokio runtime.
    pub fn set(&self) -> crate::ElectionSet {
        crate::set::ElectionSet::spawn(self.backend.clone(), self.config.clone())
    }

    /// Runs `worker(term)` only while this candidate leads, forever: see
    /// [`run_until`](Election::run_until), with a shutdown signal that never comes.
    pub async fn run<W, Fut>(&self, worker: W) -> Result<()>
    where
        W: FnMut(Term) -> Fut + Send,
        Fut: Future + Send + 'static,
        Fut::Output: WorkerOutcome,
    {
        self.run_until(worker, std::future::pending()).await
    }

    /// Runs `worker(term)` only while this candidate leads, until `shutdown` completes.
    ///
    /// - On election, the worker is spawned with the new [`Term`].
    /// - On loss, the term's token is cancelled; the worker gets the grace to return, then it
    ///   is aborted; only then is the lock released, so the next leader's worker never
    ///   overlaps this one. After an involuntary loss (renew deadline exceeded, session or
    ///   lock lost) the worker is aborted at the term's [`stop_by`](Term::stop_by) if that
    ///   comes before the grace ends: before the store can hand the lock on. An abort takes
    ///   effect at the worker's next `.await`: a worker that blocks a thread cannot be
    ///   stopped, and must check [`Term::is_cancelled`] itself.
    /// - On re-election, the worker is started again with the new term.
    /// - If the worker returns, fails or panics while leader, the
    ///   [`OnWorkerExit`] policy applies (default: resign and campaign again).
    /// - When `shutdown` completes: the worker is cancelled and awaited (at most the grace),
    ///   the lock released and the session closed; then `run_until` returns `Ok(())`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> incumbent::Result<()> {
    /// use incumbent::{Election, memory::MemoryBackend};
    ///
    /// let election = Election::builder(MemoryBackend::new(), "scheduler").build()?;
    /// let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    /// # let _ = stop.send(());
    /// election
    ///     .run_until(
    ///         |term| async move {
    ///             println!("leading with fencing token {}", term.fencing_token());
    ///             term.cancelled().await; // work until leadership ends
    ///         },
    ///         async { let _ = stopped.await; },
    ///     )
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub async fn run_until<W, Fut, S>(&self, worker: W, shutdown: S) -> Result<()>
    where
        W: FnMut(Term) -> Fut + Send,
        Fut: Future + Send + 'static,
        Fut::Output: WorkerOutcome,
        S: Future<Output = ()> + Send,
    {
        let policy = runner::Policy {
            grace: self.config.grace,
            on_worker_exit: self.on_worker_exit,
        };
        runner::drive(self.campaign(), worker, shutdown, policy).await
    }

    /// Starts the singleton worker in a task of its own and returns at once with its
    /// [`Runner`]: the one handle that gives, for one candidate, everything a service needs.
    ///
    /// - The worker runs only while this candidate leads, exactly as with
    ///   [`run_until`](Self::run_until): cancelled on loss, stopped hard at the term's
    ///   [`stop_by`](Term::stop_by) before the store can hand the lock on, started again
    ///   on re-election.
    /// - [`Runner::status`] is the campaign's status, for the health router
    ///   ([`http::router`](crate::http)) and metrics; [`Runner::resign`],
    ///   [`Runner::proclaim`] and [`Runner::subscribe`] act on the same campaign; the
    ///   builder's callbacks run as with [`campaign`](Self::campaign).
    /// - [`Runner::shutdown`] stops the worker, releases the lock and waits; dropping the
    ///   runner does the same in the background.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> incumbent::Result<()> {
    /// use incumbent::{Election, memory::MemoryBackend};
    ///
    /// let election = Election::builder(MemoryBackend::new(), "scheduler").build()?;
    /// let runner = election.start(|term| async move {
    ///     println!("leading with fencing token {}", term.fencing_token());
    ///     term.cancelled().await; // work until leadership ends
    /// });
    /// let mut status = runner.status(); // hand this to the health router
    /// status.wait_for(|s| s.is_leader()).await.expect("the campaign runs");
    /// runner.shutdown().await?; // the worker stops, then the lock is released
    /// assert!(!status.borrow().is_leader());
    /// # Ok(()) }
    /// ```
    pub fn start<W, Fut>(&self, worker: W) -> Runner
    where
        W: FnMut(Term) -> Fut + Send + 'static,
        Fut: Future + Send + 'static,
        Fut::Output: WorkerOutcome,
    {
        let policy = runner::Policy {
            grace: self.config.grace,
            on_worker_exit: self.on_worker_exit,
        };
        Runner::start(self.campaign(), worker, policy)
    }
}
