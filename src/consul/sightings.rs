//! What a backend has seen of each election key's holders, to know when a lock-delay ends.
//!
//! Consul refuses every `acquire` of a key for the lock-delay of the session that held it,
//! counted from when that session was invalidated, and says only "false". To sleep exactly
//! until the delay ends, candidates remember the last holder they saw on each key, its
//! lock-delay (read from its session once), and when they saw the key's `Session` clear.
//! Every contender and observer of a backend shares what it saw, so a leader that lost its
//! session, and then contends again with a new one, knows its own old delay.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::watch::SharedReads;
use super::{CONSUL_DEFAULT_LOCK_DELAY, LOCK_DELAY_MARGIN};
use crate::backend::lock;

/// The last holder seen on each key.
#[derive(Debug, Default)]
pub(super) struct Sightings {
    seen: Mutex<HashMap<String, Sighting>>,
    /// The blocking reads of keys in flight, shared by the backend's contenders and observers.
    reads: SharedReads,
    /// Keys a campaign (its session handle) released, left to the others for
    /// [`PUSH_COURTESY`](crate::backend::PUSH_COURTESY).
    courtesy: crate::backend::courtesy::Courtesy,
}

#[derive(Debug)]
struct Sighting {
    /// The session last seen holding the key.
    session: String,
    /// Its lock-delay, once known.
    lock_delay: Option<Duration>,
    /// When the key was first seen without that session.
    cleared_at: Option<Instant>,
}

impl Sightings {
    /// The blocking reads of keys in flight.
    pub fn reads(&self) -> &SharedReads {
        &self.reads
    }

    /// The contenders of session handle `handle` released `key`: they leave it to the others
    /// for [`PUSH_COURTESY`](crate::backend::PUSH_COURTESY).
    pub fn released(&self, key: &str, handle: u64) {
        self.courtesy
            .grant(key, handle, crate::backend::PUSH_COURTESY);
    }

    /// The end of the courtesy for `key`, while it runs and holds `handle` back.
    pub fn courtesy(&self, key: &str, handle: u64) -> Option<Instant> {
        self.courtesy.holds_back(key, handle)
    }

    /// `session` holds `key`. Returns whether its lock-delay is still unknown.
    pub fn holder(&self, key: &str, session: &str) -> bool {
        let mut map = lock(&self.seen);
        let sighting = map.entry(key.to_owned()).or_insert_with(|| Sighting {
            session: session.to_owned(),
            lock_delay: None,
            cleared_at: None,
        });
        if sighting.session != session {
            *sighting = Sighting {
                session: session.to_owned(),
                lock_delay: None,
                cleared_at: None,
            };
        }
        sighting.lock_delay.is_none()
    }

    /// The lock-delay of `session`, read from its session info.
    pub fn learn(&self, key: &str, session: &str, lock_delay: Duration) {
        if let Some(sighting) = lock(&self.seen).get_mut(key)
            && sighting.session == session
        {
            sighting.lock_delay = Some(lock_delay);
        }
    }

    /// Our own `session`, with its known `lock_delay`, holds `key`.
    pub fn ours(&self, key: &str, session: &str, lock_delay: Duration) {
        lock(&self.seen).insert(
            key.to_owned(),
            Sighting {
                session: session.to_owned(),
                lock_delay: Some(lock_delay),
                cleared_at: None,
            },
        );
    }

    /// `key` was seen without a holder: if the last holder seen had not been seen to go, it
    /// went now.
    pub fn cleared(&self, key: &str) {
        if let Some(sighting) = lock(&self.seen).get_mut(key) {
            sighting.cleared_at.get_or_insert_with(Instant::now);
        }
    }

    /// Our own `session`, which held `key`, was invalidated: noted now unless seen before.
    pub fn ours_invalidated(&self, key: &str, session: &str, lock_delay: Duration) {
        let mut map = lock(&self.seen);
        match map.get_mut(key) {
            Some(sighting) if sighting.session == session => {
                sighting.lock_delay = Some(lock_delay);
                sighting.cleared_at.get_or_insert_with(Instant::now);
            }
            _ => {
                map.insert(
                    key.to_owned(),
                    Sighting {
                        session: session.to_owned(),
                        lock_delay: Some(lock_delay),
                        cleared_at: Some(Instant::now()),
                    },
                );
            }
        }
    }

    /// When the lock-delay that just refused an `acquire` of `key` ends, plus
    /// [`LOCK_DELAY_MARGIN`]:
    ///
    /// - the last holder's delay from when its `Session` was seen to clear;
    /// - or, when the clearing was not seen (it happened between two reads), from now;
    /// - or, when the last holder or its delay is unknown, or its delay has already ended
    ///   (so another session, unseen, must have held the key since), Consul's default delay
    ///   from now.
    ///
    /// What was known is used up: a second refusal in a row falls back to the default.
    pub fn delayed_until(&self, key: &str) -> Instant {
        let now = Instant::now();
        let seen = lock(&self.seen).remove(key);
        let end = match seen {
            Some(Sighting {
                lock_delay: Some(delay),
                cleared_at,
                ..
            }) => Some(cleared_at.unwrap_or(now) + delay),
            _ => None,
        };
        match end {
            Some(end) if end + LOCK_DELAY_MARGIN > now => end + LOCK_DELAY_MARGIN,
            _ => now + CONSUL_DEFAULT_LOCK_DELAY + LOCK_DELAY_MARGIN,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "incumbent/e";

    #[tokio::test(start_paused = true)]
    async fn the_delay_runs_from_when_the_holder_was_seen_to_go() {
        let sightings = Sightings::default();
        assert!(
            sightings.holder(KEY, "s1"),
            "a new holder's delay is unknown"
        );
        sightings.learn(KEY, "s1", Duration::from_secs(3));
        assert!(!sightings.holder(KEY, "s1"), "known now");
        tokio::time::advance(Duration::from_secs(10)).await;
        let cleared = Instant::now();
        sightings.cleared(KEY);
        tokio::time::advance(Duration::from_secs(1)).await;
        sightings.cleared(KEY); // seen again: the first sighting counts
        assert_eq!(
            sightings.delayed_until(KEY),
            cleared + Duration::from_secs(3) + LOCK_DELAY_MARGIN
        );
        // Used up: a second refusal falls back to Consul's default.
        assert_eq!(
            sightings.delayed_until(KEY),
            Instant::now() + CONSUL_DEFAULT_LOCK_DELAY + LOCK_DELAY_MARGIN
        );
    }

    #[tokio::test(start_paused = true)]
    async fn unknown_or_stale_delays_fall_back_to_consuls_default() {
        let sightings = Sightings::default();
        let fallback = || Instant::now() + CONSUL_DEFAULT_LOCK_DELAY + LOCK_DELAY_MARGIN;
        assert_eq!(
            sightings.delayed_until(KEY),
            fallback(),
            "never saw a holder"
        );
        sightings.holder(KEY, "s1");
        sightings.cleared(KEY);
        assert_eq!(sightings.delayed_until(KEY), fallback(), "delay unknown");
        sightings.holder(KEY, "s2");
        sightings.learn(KEY, "s2", Duration::from_secs(1));
        sightings.cleared(KEY);
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(
            sightings.delayed_until(KEY),
            fallback(),
            "delay already over"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_clearing_not_seen_counts_from_now_and_our_own_loss_is_remembered() {
        let sightings = Sightings::default();
        sightings.holder(KEY, "s1");
        sightings.learn(KEY, "s1", Duration::from_secs(2));
        assert_eq!(
            sightings.delayed_until(KEY),
            Instant::now() + Duration::from_secs(2) + LOCK_DELAY_MARGIN
        );
        sightings.ours(KEY, "mine", Duration::from_secs(5));
        let lost = Instant::now();
        sightings.ours_invalidated(KEY, "mine", Duration::from_secs(5));
        tokio::time::advance(Duration::from_secs(1)).await;
        sightings.ours_invalidated(KEY, "mine", Duration::from_secs(5));
        assert_eq!(
            sightings.delayed_until(KEY),
            lost + Duration::from_secs(5) + LOCK_DELAY_MARGIN
        );
    }
}
