//! The one keep-alive loop every backend uses for its sessions.
//!
//! A backend supplies the renewal call (an etcd lease keep-alive, a Consul session renew, a
//! Redis `PEXPIRE`); [`KeepAlive`] calls it every `renew_interval`, records in
//! [`SessionHealth`] when the last *confirmed* renewal was *sent*, retries failures sooner,
//! and declares the session lost when the store says it is gone, or when no renewal has
//! been confirmed for a whole ttl (the store has surely expired it by then).

use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::{Instant, sleep_until, timeout};
use tokio_util::sync::CancellationToken;

use super::{SessionHealth, SessionLoss, SessionOptions};
use crate::{Result, metrics};

/// What one renewal call found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Renewal {
    /// The store confirmed the session is alive and its ttl restarted.
    Alive,
    /// The store says the session no longer exists.
    Gone,
}

/// Retries after a failed renewal come this much sooner than the renew interval, but no
/// sooner than [`MIN_RETRY`], so a store that fails fast is not hammered.
const RETRY_DIVISOR: u32 = 4;
/// The shortest pause between two renewal attempts.
const MIN_RETRY: Duration = Duration::from_millis(50);

/// A running keep-alive loop. Dropping it (or [`KeepAlive::stop`]) stops the loop and marks
/// the session [`SessionLoss::Closed`].
#[derive(Debug)]
pub struct KeepAlive {
    health: watch::Receiver<SessionHealth>,
    stop: CancellationToken,
}

impl KeepAlive {
    /// Starts renewing a session that was created by a request sent at `created_sent_at`.
    ///
    /// `renew` is called every `options.renew_interval`; each call may take at most that long
    /// before it counts as failed. `backend` labels the metrics.
    pub fn spawn<F, Fut>(
        backend: &'static str,
        options: &SessionOptions,
        created_sent_at: Instant,
        mut renew: F,
    ) -> KeepAlive
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: Future<Output = Result<Renewal>> + Send,
    {
        let (tx, health) = watch::channel(SessionHealth {
            confirmed_sent_at: created_sent_at,
            lost: None,
            last_error: None,
        });
        let stop = CancellationToken::new();
        let interval = options.renew_interval;
        let ttl = options.ttl;
        let retry = (interval / RETRY_DIVISOR).max(MIN_RETRY);
        let stopped = stop.clone();
        tokio::spawn(async move {
            let mut next = created_sent_at + interval;
            let loss = loop {
                tokio::select! {
                    biased;
                    () = stopped.cancelled() => break SessionLoss::Closed,
                    () = sleep_until(next) => {}
                }
                let sent = Instant::now();
                let outcome = tokio::select! {
                    biased;
                    () = stopped.cancelled() => break SessionLoss::Closed,
                    outcome = timeout(interval, renew()) => outcome,
                };
                metrics::record_renewal(backend, &outcome, sent.elapsed());
                match outcome {
                    Ok(Ok(Renewal::Alive)) => {
                        tx.send_modify(|h| {
                            h.confirmed_sent_at = sent;
                            h.last_error = None;
                        });
                        next = sent + interval;
                    }
                    Ok(Ok(Renewal::Gone)) => break SessionLoss::Expired,
                    failed => {
                        let error = match failed {
                            Ok(Err(e)) => e.to_string(),
                            _ => format!("renewal not answered within {interval:?}"),
                        };
                        tracing::debug!(backend, %error, "session renewal failed");
                        let confirmed = tx.borrow().confirmed_sent_at;
                        tx.send_modify(|h| h.last_error = Some(error));
                        if Instant::now() >= confirmed + ttl {
                            break SessionLoss::Unconfirmed;
                        }
                        next = (Instant::now() + retry).min(confirmed + ttl);
                    }
                }
            };
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
