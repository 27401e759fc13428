//! The singleton worker: runs a worker only while a campaign leads, and stops it in time.
//!
//! [`Election::run_until`](crate::Election::run_until) drives it in the caller's task;
//! [`Election::start`](crate::Election::start) in a task of its own, behind a [`Runner`]
//! that also gives the campaign's status, resign, proclaim and events.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until};

use crate::campaign::{Campaign, CampaignHandle, Events};
use crate::event::{DemotionReason, LeadershipEvent, Status};
use crate::term::Term;
use crate::{Error, Result};

/// What [`Election::run`](crate::Election::run) does when the worker returns, fails or panics while still leader.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnWorkerExit {
    /// Step down (releasing the lock so another candidate can take over), then campaign
    /// again after the back-off and run the worker again when re-elected. The default: a
    /// singleton that crashed should run somewhere.
    #[default]
    Resign,
    /// Step down and stop: `run` returns `Ok(())` if the worker returned, or
    /// [`Error::Worker`] if it failed or panicked. For one-shot jobs.
    Stop,
}

/// What a worker returns: `()`, or a `Result` whose error is displayed in logs.
pub trait WorkerOutcome: Send + 'static {
    /// `Err` with a message if the worker failed.
    fn into_result(self) -> std::result::Result<(), String>;
}

impl WorkerOutcome for () {
    fn into_result(self) -> std::result::Result<(), String> {
        Ok(())
    }
}

impl<E: std::fmt::Display + Send + 'static> WorkerOutcome for std::result::Result<(), E> {
    fn into_result(self) -> std::result::Result<(), String> {
        self.map_err(|e| e.to_string())
    }
}

/// How the worker is run: the election's grace and its [`OnWorkerExit`] policy.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Policy {
    pub grace: Duration,
    pub on_worker_exit: OnWorkerExit,
}

/// A singleton worker and its campaign, running in a task of their own: what
/// [`Election::start`](crate::Election::start) returns. One candidate, one handle for all
/// of it: the worker (run only while leading, with the hard stop), the status for the health
/// router, resign, proclaim and the events.
///
/// Dropping it shuts the campaign down in the background (the worker is stopped and the lock
/// released); [`shutdown`](Self::shutdown) does the same and waits for it.
#[must_use = "dropping a Runner shuts its campaign down: keep it for as long as the service runs"]
#[derive(Debug)]
pub struct Runner {
    handle: CampaignHandle,
    status: watch::Receiver<Status>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<()>>>,
}

impl Runner {
    pub(crate) fn start<W, Fut>(campaign: Campaign, worker: W, policy: Policy) -> Runner
    where
        W: FnMut(Term) -> Fut + Send + 'static,
        Fut: Future + Send + 'static,
        Fut::Output: WorkerOutcome,
    {
        let handle = campaign.handle();
        let status = campaign.status();
        let (stop, stopped) = oneshot::channel::<()>();
        let shutdown = async move {
            let _ = stopped.await;
        };
        let task = tokio::spawn(drive(campaign, worker, shutdown, policy));
        Runner {
            handle,
            status,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// The campaign's status, for health endpoints and metrics: it says "leader" exactly
    /// while the worker's term lasts.
    pub fn status(&self) -> watch::Receiver<Status> {
        self.status.clone()
    }

    /// A cloneable handle on the campaign (resign, proclaim, subscribe), for other tasks.
    pub fn handle(&self) -> CampaignHandle {
        self.handle.clone()
    }

    /// A new stream of the campaign's events, from now on.
    pub fn subscribe(&self) -> Events {
        self.handle.subscribe()
    }

    /// Steps down if leading (the worker is stopped, then the lock released), and campaigns
    /// again after the back-off. See [`CampaignHandle::resign`].
    pub async fn resign(&self) -> Result<()> {
        self.handle.resign().await
    }

    /// Steps down as [`resign`](Self::resign) does, and does not campaign again for
    /// `duration`. See [`CampaignHandle::resign_for`].
    pub async fn resign_for(&self, duration: std::time::Duration) -> Result<()> {
        self.handle.resign_for(duration).await
    }

    /// Hands the election over to the candidate `to` (the worker stops first, as for a
    /// resign), and returns once `to` leads. See [`CampaignHandle::hand_over`].
    pub async fn hand_over(&self, to: impl Into<String>) -> Result<crate::HandedOver> {
        self.handle.hand_over(to).await
    }

    /// Sets the metadata others read while this candidate leads. See
    /// [`CampaignHandle::proclaim`].
    pub async fn proclaim(&self, metadata: BTreeMap<String, String>) -> Result<()> {
        self.handle.proclaim(metadata).await
    }

    /// Stops the worker (at most the grace, never past the term's hard stop), releases the
    /// lock, closes the session, and waits for all of it. Returns what the runner's task
    /// returned: [`Error::Worker`] if the worker failed under [`OnWorkerExit::Stop`].
    ///
    /// The shutdown starts when this is called, not when the future is first polled, as
    /// [`Campaign::shutdown`](crate::Campaign::shutdown)'s does. To stop many runners,
    /// [`shutdown_all`](Self::shutdown_all) is the cheap way.
    pub fn shutdown(mut self) -> impl Future<Output = Result<()>> + Send + 'static {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        async move { self.finished().await }
    }

    /// Shuts every runner of `runners` down at once, and returns once all have stopped (each
    /// [`shutdown`](Self::shutdown)'s promise): each is asked at this call, then their ends
    /// are awaited in order, in the caller's task. Returns the first error a runner's
    /// shutdown returned (its worker failed under [`OnWorkerExit::Stop`]), once all have
    /// stopped. Cheaper than a task per shutdown, or `join_all` over thousands of them: see
    /// [`Campaign::shutdown_all`](crate::Campaign::shutdown_all).
    pub fn shutdown_all(
        runners: impl IntoIterator<Item = Runner>,
    ) -> impl Future<Output = Result<()>> + Send + 'static {
        crate::campaign::await_in_order(runners.into_iter().map(Runner::shutdown).collect())
    }

    /// Waits until the runner ends by itself: under [`OnWorkerExit::Stop`], once the worker
    /// returned or failed while leading. Pending forever under [`OnWorkerExit::Resign`]
    /// until [`shutdown`](Self::shutdown).
    pub async fn finished(&mut self) -> Result<()> {
        let Some(task) = &mut self.task else {
            return Err(Error::Stopped);
        };
        let joined = task.await;
        self.task = None;
        match joined {
            Ok(result) => result,
            Err(error) => Err(Error::Worker(format!("the runner's task failed: {error}"))),
        }
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Runs `worker(term)` while `campaign` leads, until `shutdown` completes; see
/// [`Election::run_until`](crate::Election::run_until).
pub(crate) async fn drive<W, Fut, S>(
    mut campaign: Campaign,
    mut worker: W,
    shutdown: S,
    policy: Policy,
) -> Result<()>
where
    W: FnMut(Term) -> Fut + Send,
    Fut: Future + Send + 'static,
    Fut::Output: WorkerOutcome,
    S: Future<Output = ()> + Send,
{
    let handle = campaign.handle();
    let grace = policy.grace;
    tokio::pin!(shutdown);
    let mut running: Option<Worker> = None;
    loop {
        // Biased, so that a run is deterministic under a simulated clock: a term's end
        // first, then the campaign's events, then the shutdown.
        tokio::select! {
            biased;
            news = worker_news(&mut running) => {
                let Some(worker) = running.take() else { continue };
                let outcome = match news {
                    // The term ended: the worker was told by its token; stop it in time.
                    WorkerNews::TermEnded => {
                        worker.stop(grace).await;
                        continue;
                    }
                    WorkerNews::Exited(Ok(outcome)) => outcome,
                    WorkerNews::Exited(Err(e)) if e.is_panic() => Err(format!(
                        "panicked: {}",
                        crate::campaign::panic_message(e.into_panic().as_ref())
                    )),
                    WorkerNews::Exited(Err(e)) => Err(e.to_string()),
                };
                let reason = match &outcome {
                    Ok(()) => {
                        tracing::info!("the worker returned while leader");
                        DemotionReason::WorkerExited
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "the worker failed while leader");
                        DemotionReason::WorkerFailed
                    }
                };
                match policy.on_worker_exit {
                    OnWorkerExit::Resign => handle.resign_because(reason).await?,
                    OnWorkerExit::Stop => {
                        handle.resign_because(reason).await?;
                        campaign.shutdown().await?;
                        return outcome.map_err(Error::Worker);
                    }
                }
            },
            event = campaign.recv() => match event {
                Some(LeadershipEvent::Elected(term)) => {
                    let guard = term.hold();
                    let work = worker(term.clone());
                    let task = tokio::spawn(async move {
                        let _guard = guard;
                        work.await.into_result()
                    });
                    running = Some(Worker { task, term });
                }
                Some(LeadershipEvent::Demoted { .. } | LeadershipEvent::LeaderChanged(_)) => {}
                None => {
                    // The campaign ended by itself: its term, if any, was ended with it.
                    if let Some(worker) = running.take() {
                        worker.stop(grace).await;
                    }
                    return Err(Error::Stopped);
                }
            },
            () = &mut shutdown => {
                let stopping = handle.shutdown();
                match running.take() {
                    Some(worker) => {
                        let (stopped, ()) = tokio::join!(stopping, worker.stop(grace));
                        stopped?;
                    }
                    None => stopping.await?,
                }
                return Ok(());
            }
        }
    }
}

/// The worker of one term.
struct Worker {
    task: JoinHandle<std::result::Result<(), String>>,
    term: Term,
}

/// What became of the running worker.
enum WorkerNews {
    /// Its term ended (the worker may still be running).
    TermEnded,
    /// It ended by itself while its term lasted.
    Exited(std::result::Result<std::result::Result<(), String>, tokio::task::JoinError>),
}

/// The next news of the running worker; pending while none runs.
async fn worker_news(running: &mut Option<Worker>) -> WorkerNews {
    let Some(worker) = running else {
        return std::future::pending().await;
    };
    tokio::select! {
        biased;
        () = worker.term.cancelled() => WorkerNews::TermEnded,
        joined = &mut worker.task => WorkerNews::Exited(joined),
    }
}

impl Worker {
    /// Waits for the worker of an ended term to return, then aborts it: after the grace, or
    /// at the term's [`stop_by`](Term::stop_by) if that comes first (an involuntary loss,
    /// where the store may hand the lock on), or when [`Term::must_stop`] says so (renewals
    /// stopped while a voluntarily ended term winds down).
    async fn stop(mut self, grace: Duration) {
        let mut until = Instant::now() + grace;
        if let Some(stop_by) = self.term.stop_by() {
            until = until.min(stop_by);
        }
        let stopped = tokio::select! {
            joined = &mut self.task => { let _ = joined; true }
            () = sleep_until(until) => false,
            // The lease is about to lapse while the worker winds down (renewals stopped).
            () = self.term.must_stop() => false,
        };
        if !stopped {
            self.task.abort();
            let _ = (&mut self.task).await;
            tracing::warn!(
                ?grace,
                stop_by = ?self.term.stop_by().map(|at| at.saturating_duration_since(Instant::now())),
                "the worker did not stop after its term ended; aborted it"
            );
        }
    }
}
