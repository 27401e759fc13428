//! Jittered exponential back-off: one kind for the campaign's retries and cool-down, the
//! stores' watch retries and reconnects. It depends on nothing else in the crate, so that
//! both the configuration and the backends can use it.

use std::time::Duration;

/// Default first retry delay after an error or a loss. Jittered.
pub const DEFAULT_BACKOFF_INITIAL: Duration = Duration::from_millis(250);
/// Default longest retry delay: a store that stays down is retried at least this often, and
/// wrong credentials are retried no more often than this (no retry storm).
pub const DEFAULT_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Exponential back-off with "equal jitter" (half the ceiling fixed, half random), used between
/// retries and as the cool-down after a loss.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// The delay after the first failure (the upper end of the jittered range).
    pub initial: Duration,
    /// The largest delay.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: DEFAULT_BACKOFF_INITIAL,
            max: DEFAULT_BACKOFF_MAX,
        }
    }
}

impl Backoff {
    /// The delay before retry number `attempt` (0-based): uniformly random in
    /// `[ceiling/2, ceiling]`, where the ceiling doubles per attempt up to `max`.
    pub fn delay(&self, attempt: u32) -> Duration {
        let ceiling = self
            .initial
            .saturating_mul(1u32 << attempt.min(16))
            .min(self.max);
        let half = ceiling / 2;
        let nanos = u64::try_from((ceiling - half).as_nanos()).unwrap_or(u64::MAX);
        half + Duration::from_nanos(fastrand::u64(0..=nanos))
    }
}

/// A [`Backoff`] in progress: each [`pause`](Retries::pause) sleeps one step longer (up to
/// the maximum), and [`reset`](Retries::reset) starts over after a success.
#[derive(Debug)]
#[cfg_attr(not(feature = "etcd"), allow(dead_code))]
pub(crate) struct Retries {
    backoff: Backoff,
    attempt: u32,
}

#[cfg_attr(not(feature = "etcd"), allow(dead_code))]
impl Retries {
    pub(crate) fn new(backoff: Backoff) -> Self {
        Retries {
            backoff,
            attempt: 0,
        }
    }

    /// Sleeps for the next delay.
    pub(crate) async fn pause(&mut self) {
        let delay = self.backoff.delay(self.attempt);
        self.attempt = self.attempt.saturating_add(1);
        tokio::time::sleep(delay).await;
    }

    /// Starts over from the shortest pause.
    pub(crate) fn reset(&mut self) {
        self.attempt = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_is_jittered_below_a_doubling_ceiling() {
        let b = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(1),
        };
        for attempt in 0..40 {
            let ceiling = Duration::from_millis(100 * (1u64 << attempt.min(4))).min(b.max);
            let d = b.delay(attempt);
            assert!(d >= ceiling / 2 && d <= ceiling, "{attempt}: {d:?}");
        }
    }
    #[tokio::test(start_paused = true)]
    async fn retries_grow_and_start_over() {
        let mut retries = Retries::new(Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_millis(400),
        });
        let mut took = Vec::new();
        for _ in 0..4 {
            let start = tokio::time::Instant::now();
            retries.pause().await;
            took.push(start.elapsed());
        }
        let ceilings = [100, 200, 400, 400].map(Duration::from_millis);
        for (t, c) in took.iter().zip(ceilings) {
            assert!(*t >= c / 2 && *t <= c, "{took:?}");
        }
        retries.reset();
        let start = tokio::time::Instant::now();
        retries.pause().await;
        assert!(start.elapsed() <= Duration::from_millis(100));
    }
}
