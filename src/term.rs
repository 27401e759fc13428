//! [`Term`]: one stretch of leadership, as the application holds it.

use std::sync::atomic::{AtomicI64, AtomicU32, Ordering, fence};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use futures_util::task::AtomicWaker;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

use crate::backend::{FencingToken, Leader};
use crate::config::Config;

/// One term of leadership: valid from when it is handed out until its token is cancelled.
///
/// The token is cancelled the moment leadership can no longer be trusted: *before* the store
/// could grant the lock to anyone else (see the crate docs on self-fencing). Check
/// [`is_cancelled`](Term::is_cancelled) or select on [`cancelled`](Term::cancelled) around
/// every step of your work, and send [`fencing_token`](Term::fencing_token) with every write
/// to a downstream system so that it can reject a stale leader.
///
/// Cloning is cheap; all clones share one token.
///
/// ```
/// # async fn write(_token: u64, _chunk: u32) {}
/// async fn work(term: incumbent::Term) {
///     for chunk in 0.. {
///         tokio::select! {
///             () = term.cancelled() => return, // leadership lost: stop at once
///             () = write(term.fencing_token(), chunk) => {}
///         }
///     }
/// }
/// ```
#[derive(Clone, Debug)]
pub struct Term {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    election: ElectionConfig,
    leader: Leader,
    fencing_token: FencingToken,
    started: Instant,
    started_at: SystemTime,
    gap: PackedGap,
    /// The cancellation token, made when first asked for ([`Term::cancelled`],
    /// [`Term::cancellation_token`]): a term nobody waits on (a set's member whose work
    /// polls [`Term::is_cancelled`], say) holds none, 113 to 128 bytes less. Whether the
    /// term has ended is the [`OPEN`] bit of `holds`; a token made after the end is made
    /// cancelled ([`Term::token`]).
    cancel: OnceLock<CancellationToken>,
    /// Set, before the token is cancelled, when the term ends involuntarily; or later, when
    /// the lease is about to lapse while a voluntarily ended term's work winds down.
    ///
    /// Kept as nanoseconds from `started` ([`UNSET`] until set), set once: 8 bytes where a
    /// `OnceLock<Instant>` takes 24.
    stop_by: AtomicI64,
    /// Cancelled when the term's work must have stopped: at `stop_by`. Made when first asked
    /// for, by [`Term::must_stop`] (a runner asks once the term has ended) or by the halt: a
    /// term that leads holds none.
    halt: OnceLock<CancellationToken>,
    /// The guards held, and whether the term is in force and hands out more ([`OPEN`],
    /// cleared when it ends: [`Term::is_cancelled`] reads it); woken when the last
    /// goes after the term ended. (A queue whose senders were the guards cost a leading
    /// election 96 bytes more: 100,000 of them hold 10 MB less.)
    holds: AtomicU32,
    guards_gone: AtomicWaker,
}

/// The election a term is of: its settings, shared with its campaign (the name without a
/// copy of its own: a process may hold 100,000 terms), and, for a member of an
/// [`ElectionSet`](crate::ElectionSet), the member's name, shared with the set.
pub(crate) struct ElectionConfig {
    config: Arc<Config>,
    member: Option<Arc<str>>,
}

impl ElectionConfig {
    /// The election of a campaign: its name is the settings'.
    pub(crate) fn of(config: Arc<Config>) -> ElectionConfig {
        ElectionConfig {
            config,
            member: None,
        }
    }

    /// A member of a set: the set's settings, under the member's name.
    pub(crate) fn member(config: Arc<Config>, name: Arc<str>) -> ElectionConfig {
        ElectionConfig {
            config,
            member: Some(name),
        }
    }

    fn name(&self) -> &str {
        self.member.as_deref().unwrap_or(&self.config.name)
    }
}

impl std::fmt::Debug for ElectionConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.name(), f)
    }
}

/// How long an election was without a leader before a term began, as the winner measured it
/// (the figures of [`metrics::TIME_TO_LEADER`](crate::metrics::TIME_TO_LEADER) and
/// [`metrics::LOCK_FREE_TO_LEADER`](crate::metrics::LOCK_FREE_TO_LEADER)).
///
/// A candidate that waits behind a leader cannot see that leader crash: it sees the lock
/// freed, and after a crash the store frees it one ttl after the holder's last confirmed
/// renewal. Most stores do not say whether a lock was released or expired, so the gap is
/// given as two bounds:
///
/// - [`lock_free`](Gap::lock_free), the lower bound: from the moment the winner saw the
///   election without a holder (the lock freed, its own campaign's start with nobody leading,
///   the store's lock-delay) to the win. After a release (a resign, a clean shutdown) this is
///   the whole gap: milliseconds.
/// - [`without_leader`](Gap::without_leader), the upper bound: from the previous holder's last
///   confirmed renewal to the win, that is `lock_free` plus the ttl. After a crash (kill -9, a
///   partition) this is the gap a user sees, to within one renewal interval.
///
/// On the file backend the kernel frees a dead holder's lock at once
/// ([`BackendInfo::frees_dead_holder_at_once`](crate::backend::BackendInfo::frees_dead_holder_at_once)),
/// so there the two figures are the same: the real gap after a crash too. (A frozen holder
/// keeps its lock there until it thaws; the time before that is not seen.)
///
/// When this process ended the previous term itself (it led before, and lost or resigned),
/// the winner knows when the election lost its leader, and both figures are that exact time
/// ([`exact`](Gap::exact)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gap {
    /// From the previous holder's last confirmed renewal or release to the win: the time the
    /// election was without a trusted leader, at most.
    pub without_leader: Duration,
    /// From the moment the winner saw the election without a holder to the win: the time the
    /// election was without a leader, at least.
    pub lock_free: Duration,
    /// Both figures are exact: this process ended the previous term itself.
    pub exact: bool,
}

/// A [`Gap`] in 24 bytes instead of 40: its durations in nanoseconds (a term is kept by
/// every election of a process that leads, 100,000 of them maybe).
#[derive(Clone, Copy, Debug)]
struct PackedGap {
    without_leader: u64,
    lock_free: u64,
    exact: bool,
}

impl PackedGap {
    fn of(gap: Gap) -> PackedGap {
        let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        PackedGap {
            without_leader: nanos(gap.without_leader),
            lock_free: nanos(gap.lock_free),
            exact: gap.exact,
        }
    }

    fn unpacked(self) -> Gap {
        Gap {
            without_leader: Duration::from_nanos(self.without_leader),
            lock_free: Duration::from_nanos(self.lock_free),
            exact: self.exact,
        }
    }
}

/// In [`Inner::stop_by`]: not set.
const UNSET: i64 = i64::MIN;

/// In [`Inner::holds`]: the term is in force and still hands out guards (until it ends).
const OPEN: u32 = 1 << 31;

/// What the campaign waits on after a term ended: its guards all dropped.
#[derive(Debug)]
pub(crate) struct Guards {
    inner: Arc<Inner>,
}

impl Guards {
    /// Completes once the term has ended and every guard is dropped; never before the term
    /// ends.
    pub(crate) fn all_gone(&mut self) -> impl std::future::Future<Output = ()> + '_ {
        std::future::poll_fn(|cx| {
            self.inner.guards_gone.register(cx.waker());
            if self.inner.holds.load(Ordering::Acquire) == 0 {
                std::task::Poll::Ready(())
            } else {
                std::task::Poll::Pending
            }
        })
    }
}

/// Keeps the lock from being released while held, up to the election's grace.
///
/// When a term ends, the campaign cancels its token, then waits until every guard is dropped
/// (or the grace passes) before it releases the lock, so that the next leader never overlaps
/// work that is still winding down. [`Election::run`](crate::Election::run) holds one for its
/// worker; take one with [`Term::hold`] when you run work from a raw campaign.
#[derive(Debug)]
pub struct TermGuard {
    term: Option<Arc<Inner>>,
}

impl Drop for TermGuard {
    fn drop(&mut self) {
        if let Some(inner) = self.term.take()
            && inner.holds.fetch_sub(1, Ordering::AcqRel) == 1
        {
            inner.guards_gone.wake();
        }
    }
}

impl Term {
    pub(crate) fn new(
        election: ElectionConfig,
        leader: Leader,
        fencing_token: FencingToken,
        gap: Gap,
    ) -> (Term, Guards) {
        let term = Term {
            inner: Arc::new(Inner {
                election,
                leader,
                fencing_token,
                started: Instant::now(),
                started_at: SystemTime::now(),
                gap: PackedGap::of(gap),
                cancel: OnceLock::new(),
                stop_by: AtomicI64::new(UNSET),
                halt: OnceLock::new(),
                holds: AtomicU32::new(OPEN),
                guards_gone: AtomicWaker::new(),
            }),
        };
        let guards = Guards {
            inner: term.inner.clone(),
        };
        (term, guards)
    }

    /// Cancels the token and stops handing out guards. Returns once nothing else can hold.
    /// `stop_by`: after an involuntary loss, when the work must have stopped; it is set
    /// before the token is cancelled, so whoever sees the cancellation sees it too.
    pub(crate) fn end(&self, stop_by: Option<Instant>) {
        if let Some(at) = stop_by {
            self.set_stop_by(at);
        }
        // The term ends here: `is_cancelled` reads this bit.
        let holds = self.inner.holds.fetch_and(!OPEN, Ordering::SeqCst);
        // Either this sees a token made before the end, or that token's maker sees the end
        // (`token`): with a fence on both sides, one of them cancels it.
        fence(Ordering::SeqCst);
        if let Some(token) = self.inner.cancel.get() {
            token.cancel();
        }
        if holds == OPEN {
            // No guard was held: the waiter may go on.
            self.inner.guards_gone.wake();
        }
    }

    /// Sets [`stop_by`](Term::stop_by) to `at`, unless it was set already.
    fn set_stop_by(&self, at: Instant) {
        let started = self.inner.started;
        let nanos = |d: Duration| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX);
        let offset = if at >= started {
            nanos(at - started)
        } else {
            -nanos(started - at)
        };
        let _ = self.inner.stop_by.compare_exchange(
            UNSET,
            offset.max(UNSET + 1),
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }

    /// The work must stop now: sets [`stop_by`](Term::stop_by) (unless it was set already)
    /// and completes [`must_stop`](Term::must_stop).
    pub(crate) fn halt(&self, at: Instant) {
        self.set_stop_by(at);
        self.inner.halt.get_or_init(CancellationToken::new).cancel();
    }

    /// The fencing token: greater than that of every earlier term of this election.
    pub fn fencing_token(&self) -> FencingToken {
        self.inner.fencing_token
    }

    /// The election's name.
    pub fn election(&self) -> &str {
        self.inner.election.name()
    }

    /// This leader's identity and metadata, as others read them.
    pub fn leader(&self) -> &Leader {
        &self.inner.leader
    }

    /// When the term began, by the monotonic clock.
    pub fn started(&self) -> Instant {
        self.inner.started
    }

    /// When the term began, by the wall clock.
    pub fn started_at(&self) -> SystemTime {
        self.inner.started_at
    }

    /// How long the election was without a leader before this term, as its winner measured
    /// it: the failover time. See [`Gap`].
    pub fn gap(&self) -> Gap {
        self.inner.gap.unpacked()
    }

    /// After an involuntary loss (renew deadline exceeded, session or lock lost), the
    /// instant by which the term's work must have stopped: from then on the store may hand
    /// the lock to another candidate. It is the last confirmed renewal's send time plus the
    /// ttl, less a margin of a tenth of the ttl, or the moment of the loss when the store has
    /// already taken the lock away. [`Election::run`](crate::Election::run) aborts its
    /// worker then, and `incumbent run` kills its command's process group then, whatever the
    /// grace. `None` while the term lasts and after a voluntary end (resign, shutdown, the
    /// worker's exit), where the lock is kept (and renewed) until the work stops, at most the
    /// grace; unless renewals stop being confirmed meanwhile, so that the lease could lapse
    /// first: then it is set, to that instant, when [`must_stop`](Term::must_stop) completes.
    ///
    /// After an involuntary loss it is set before the token is cancelled: code woken by
    /// [`cancelled`](Term::cancelled) always sees it.
    pub fn stop_by(&self) -> Option<Instant> {
        let offset = self.inner.stop_by.load(Ordering::Acquire);
        let started = self.inner.started;
        (offset != UNSET).then(|| match u64::try_from(offset) {
            Ok(after) => started + Duration::from_nanos(after),
            Err(_) => started
                .checked_sub(Duration::from_nanos(offset.unsigned_abs()))
                .unwrap_or(started),
        })
    }

    /// Completes when the term's work must have stopped, some time after the term was
    /// cancelled: at [`stop_by`](Term::stop_by) after an involuntary loss, or, after a
    /// voluntary end, when renewals stopped being confirmed while the work was winding down
    /// (so the lease could lapse before the grace ends). [`Election::run`](crate::Election::run)
    /// aborts its worker then; if you run work from a raw campaign, kill it then. It is fired
    /// by the campaign's task; `stop_by` is the instant to arm a timer of your own with.
    pub fn must_stop(&self) -> WaitForCancellationFuture<'_> {
        self.inner
            .halt
            .get_or_init(CancellationToken::new)
            .cancelled()
    }

    /// Whether leadership has ended.
    pub fn is_cancelled(&self) -> bool {
        self.inner.holds.load(Ordering::Acquire) & OPEN == 0
    }

    /// The cancellation token, made on first use; cancelled if the term has ended.
    fn token(&self) -> &CancellationToken {
        let token = self.inner.cancel.get_or_init(CancellationToken::new);
        fence(Ordering::SeqCst);
        if self.is_cancelled() {
            token.cancel();
        }
        token
    }

    /// Completes when leadership ends.
    pub fn cancelled(&self) -> WaitForCancellationFuture<'_> {
        self.token().cancelled()
    }

    /// A token cancelled when leadership ends, to hand to code that takes a
    /// [`CancellationToken`]. Cancelling it yourself does not end the term: use
    /// [`CampaignHandle::resign`](crate::CampaignHandle::resign) for that.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.token().child_token()
    }

    /// Delays the release of the lock, after the term ends, until the guard is dropped (at
    /// most the election's grace). A guard taken after the term ended delays nothing.
    pub fn hold(&self) -> TermGuard {
        let holds = &self.inner.holds;
        let taken = holds
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n & OPEN != 0).then_some(n + 1)
            })
            .is_ok();
        TermGuard {
            term: taken.then(|| self.inner.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn term() -> (Term, Guards) {
        let election = crate::Election::builder(crate::memory::MemoryBackend::new(), "t")
            .build()
            .expect("valid settings");
        let leader = Leader {
            candidate: election.config().candidate.clone(),
            fencing_token: Some(7),
            since_unix_ms: None,
        };
        let gap = Gap {
            without_leader: Duration::ZERO,
            lock_free: Duration::ZERO,
            exact: true,
        };
        Term::new(
            ElectionConfig::of(Arc::new(election.config().clone())),
            leader,
            7,
            gap,
        )
    }

    /// The token is made on first use: one made before the end is cancelled by it, one made
    /// after is made cancelled, and either way every waiter and child token sees the end.
    #[tokio::test]
    async fn the_lazily_made_token_sees_the_end_whenever_it_is_made() {
        let (before, _guards) = term();
        let child = before.cancellation_token();
        let waiting = tokio::spawn({
            let term = before.clone();
            async move { term.cancelled().await }
        });
        tokio::task::yield_now().await;
        assert!(!before.is_cancelled() && !child.is_cancelled());
        before.end(None);
        assert!(before.is_cancelled() && child.is_cancelled());
        waiting.await.expect("the waiter woke at the end");

        let (after, _guards) = term();
        assert!(
            after.inner.cancel.get().is_none(),
            "no token until asked for"
        );
        after.end(None);
        assert!(after.is_cancelled());
        assert!(after.cancellation_token().is_cancelled());
        after.cancelled().await;

        // Made and ended at once, from two threads, many times: never a token left uncancelled.
        for _ in 0..200 {
            let (raced, _guards) = term();
            let ending = std::thread::spawn({
                let raced = raced.clone();
                move || raced.end(None)
            });
            let token = raced.cancellation_token();
            ending.join().expect("ended");
            assert!(token.is_cancelled());
        }
    }
}
