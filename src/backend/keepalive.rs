//! The one keep-alive loop every backend uses for its sessions.
//!
//! A backend supplies the renewal call (an etcd lease keep-alive, a Consul session renew, a
//! Redis `PEXPIRE`); [`KeepAlive`] calls it every `renew_interval`, records in
//! [`SessionHealth`] when the last *confirmed* renewal was *sent*, and declares the session
//! lost when the store says it is gone, or when no renewal has been confirmed for a whole ttl
//! (the store has surely expired it by then).
//!
//! # Slow renewals
//!
//! One slow renewal must not cost a healthy leader its term, so no renewal is given up while
//! it can still help. Like client-go's leader election, which paces its attempts by a retry
//! period inside its renew deadline, the loop works like this:
//!
//! - A renewal is sent every renew interval, counted from the send time of the last
//!   confirmed one.
//! - If the newest renewal has not been answered within the *retry period* (a quarter of the
//!   renew interval, at least 50 ms), another one is sent, and so on at that pace, while the
//!   earlier ones keep waiting for their answers. A request stuck on one stream or connection
//!   does not hold the session hostage, and under a latency longer than the renew interval
//!   renewals are pipelined, so confirmations keep coming at most a latency plus a retry
//!   period apart.
//! - Whichever attempt is confirmed first counts, with *its* send time: the store restarted
//!   the ttl no earlier than it received that attempt. An answer that comes after a later
//!   attempt was confirmed changes nothing.
//! - A failed attempt (an error, as opposed to no answer yet) is retried after the retry
//!   period.
//! - Every attempt is abandoned once the session has surely expired (a ttl after the last
//!   confirmed send), which is also when the loop gives up with [`SessionLoss::Unconfirmed`].
//!
//! So the campaign's renew deadline, not a per-request timeout, is what bounds how long a
//! leader waits for a confirmation. At most about `ttl / retry period` attempts are in flight
//! at once, and only while the store does not answer.

use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::error::Elapsed;
use tokio::time::{Instant, Timeout, sleep_until, timeout_at};
use tokio_util::sync::CancellationToken;

use super::{SessionHealth, SessionLoss, SessionOptions};
use crate::Result;
use crate::metrics::{self, RenewalResult};

/// What one renewal call found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Renewal {
    /// The store confirmed the session is alive and its ttl restarted.
    Alive,
    /// The store says the session no longer exists.
    Gone,
}

/// The retry period is the renew interval divided by this, but no shorter than [`MIN_RETRY`],
/// so a store that fails fast is not hammered.
const RETRY_DIVISOR: u32 = 4;
/// The shortest pause between two renewal attempts.
const MIN_RETRY: Duration = Duration::from_millis(50);

/// The pause between renewal attempts while the newest one is unanswered or failed.
fn retry_period(renew_interval: Duration) -> Duration {
    (renew_interval / RETRY_DIVISOR).max(MIN_RETRY)
}

/// A running keep-alive loop. Dropping it (or [`KeepAlive::stop`]) stops the loop and marks
/// the session [`SessionLoss::Closed`].
#[derive(Debug)]
pub struct KeepAlive {
    health: watch::Receiver<SessionHealth>,
    stop: CancellationToken,
}

/// One renewal call in flight: when it was sent, and the call, bounded by the instant the
/// session surely expired if nothing sent after the last confirmation was confirmed.
struct Attempt<Fut> {
    sent: Instant,
    call: Pin<Box<Timeout<Fut>>>,
}

type Outcome = std::result::Result<Result<Renewal>, Elapsed>;

/// Resolves with the first attempt that finishes, removing it; pending while there is none.
fn poll_attempts<Fut: Future<Output = Result<Renewal>>>(
    attempts: &mut Vec<Attempt<Fut>>,
    cx: &mut Context<'_>,
) -> Poll<(Instant, Outcome)> {
    for i in 0..attempts.len() {
        if let Poll::Ready(outcome) = attempts[i].call.as_mut().poll(cx) {
            let attempt = attempts.swap_remove(i);
            return Poll::Ready((attempt.sent, outcome));
        }
    }
    Poll::Pending
}

impl KeepAlive {
    /// Starts renewing a session that was created by a request sent at `created_sent_at`.
    ///
    /// `renew` is called every `options.renew_interval`, and more often while renewals go
    /// unanswered or fail (see the [module docs](self)); several calls may be in flight at
    /// once. A call runs until it answers or the session has surely expired. `backend` and
    /// `session` (the store's id for the session, as its own tools show it) label the renewal
    /// metrics and logs, so a failing session can be found in the store.
    pub fn spawn<F, Fut>(
        backend: &'static str,
        session: &str,
        options: &SessionOptions,
        created_sent_at: Instant,
        mut renew: F,
    ) -> KeepAlive
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: Future<Output = Result<Renewal>> + Send + 'static,
    {
        let (tx, health) = watch::channel(SessionHealth {
            confirmed_sent_at: created_sent_at,
            lost: None,
            last_error: None,
        });
        let stop = CancellationToken::new();
        let interval = options.renew_interval;
        let ttl = options.ttl;
        let retry = retry_period(interval);
        let stopped = stop.clone();
        let metrics = metrics::RenewalMetrics::new(backend, session);
        let session = session.to_owned();
        tokio::spawn(async move {
            let mut attempts: Vec<Attempt<Fut>> = Vec::new();
            let mut confirmed = created_sent_at;
            // The send time of the newest attempt, and whether it is still unanswered.
            let mut newest = created_sent_at;
            let mut newest_pending = false;
            let mut next = created_sent_at + interval;
            let loss = loop {
                let expires = confirmed + ttl;
                if Instant::now() >= expires {
                    break SessionLoss::Unconfirmed;
                }
                tokio::select! {
                    biased;
                    () = stopped.cancelled() => break SessionLoss::Closed,
                    (sent, outcome) = poll_fn(|cx| poll_attempts(&mut attempts, cx)) => {
                        let result = match &outcome {
                            Ok(Ok(Renewal::Alive)) => RenewalResult::Ok,
                            Ok(Ok(Renewal::Gone)) => RenewalResult::Gone,
                            Ok(Err(_)) => RenewalResult::Error,
                            Err(_) => RenewalResult::Timeout,
                        };
                        metrics.record(result, sent.elapsed());
                        let failure = match outcome {
                            Ok(Ok(Renewal::Alive)) => {
                                if sent > confirmed {
                                    confirmed = sent;
                                    tx.send_modify(|h| {
                                        h.confirmed_sent_at = sent;
                                        h.last_error = None;
                                    });
                                }
                                if sent == newest {
                                    newest_pending = false;
                                    next = sent + interval;
                                }
                                None
                            }
                            Ok(Ok(Renewal::Gone)) => break SessionLoss::Expired,
                            Ok(Err(e)) => Some(e.to_string()),
                            Err(_) => Some(format!(
                                "renewal not answered within {:?}",
                                sent.elapsed()
                            )),
                        };
                        if let Some(error) = failure {
                            tracing::debug!(backend, session = %session, %error, "session renewal failed");
                            tx.send_modify(|h| h.last_error = Some(error));
                            if sent == newest {
                                newest_pending = false;
                                next = Instant::now() + retry;
                            }
                        }
                    }
                    () = sleep_until(expires) => break SessionLoss::Unconfirmed,
                    () = sleep_until(next) => {
                        let sent = Instant::now();
                        if newest_pending {
                            let error = format!(
                                "renewal sent {:?} ago not answered yet; sending another",
                                sent - newest
                            );
                            tracing::debug!(backend, session = %session, %error, "session renewal slow");
                            tx.send_modify(|h| h.last_error = Some(error));
                        }
                        attempts.push(Attempt {
                            sent,
                            call: Box::pin(timeout_at(expires, renew())),
                        });
                        newest = sent;
                        newest_pending = true;
                        next = sent + retry;
                    }
                }
            };
            drop(attempts);
            tx.send_modify(|h| {
                h.lost.get_or_insert(loss);
            });
        });
        KeepAlive { health, stop }
    }

    /// The session's health, updated after every renewal.
    pub fn health(&self) -> watch::Receiver<SessionHealth> {
        self.health.clone()
    }

    /// Stops renewing. The health turns [`SessionLoss::Closed`] unless it was lost before.
    pub fn stop(&self) {
        self.stop.cancel();
    }
}

impl Drop for KeepAlive {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// For backends whose session is their renewal of every held key (Redis, memcached): waits
/// until the held lock is reported lost by the renewal (`loss`, set once), or the session
/// itself is lost. A renewal that forgets a key without a word means the session closed.
#[cfg(any(
    feature = "redis",
    feature = "memcached",
    feature = "postgres",
    feature = "kubernetes"
))]
pub(crate) async fn held_key_lost(
    mut health: watch::Receiver<SessionHealth>,
    loss: Option<&mut watch::Receiver<Option<super::LockLoss>>>,
) -> super::LockLoss {
    if let Some(loss) = loss {
        let told = tokio::select! {
            reason = loss.wait_for(Option::is_some) => reason.ok().and_then(|r| *r),
            _ = health.wait_for(|h| h.lost.is_some()) => return super::LockLoss::SessionLost,
        };
        if let Some(reason) = told {
            return reason;
        }
    }
    let _ = health.wait_for(|h| h.lost.is_some()).await;
    super::LockLoss::SessionLost
}
