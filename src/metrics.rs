//! Metric names and labels, all in one place.
//!
//! `incumbent` records through the [`metrics`](https://docs.rs/metrics) facade; install any
//! recorder (for example `metrics-exporter-prometheus`) to collect them. Without a recorder
//! they cost nothing.
//!
//! | name | type | labels | meaning |
//! |---|---|---|---|
//! | `incumbent_is_leader` | gauge | `election` | 1 while this candidate leads, else 0 (from the campaign's start) |
//! | `incumbent_elections_won_total` | counter | `election` | terms won |
//! | `incumbent_demotions_total` | counter | `election`, `reason` | terms lost, by [`DemotionReason::as_str`](crate::DemotionReason::as_str) |
//! | `incumbent_campaign_attempts_total` | counter | `election`, `result` | acquisition attempts: `won`, `held`, `delayed`, `error` |
//! | `incumbent_renewals_total` | counter | `backend`, `result` | session renewals: `ok`, `gone`, `error`, `timeout` |
//! | `incumbent_renew_latency_seconds` | histogram | `backend` | time for one session renewal round trip |
//! | `incumbent_time_to_leader_seconds` | histogram | `election` | failover latency: how long the election was without a leader, as seen by the candidate that won |
//!
//! The per-election metrics carry a `candidate` label too when the election asks for it
//! ([`ElectionBuilder::label_metrics_with_candidate`](crate::ElectionBuilder::label_metrics_with_candidate)):
//! off by default, since the default candidate id holds the pid and every restart would
//! start new series.
//!
//! `incumbent_time_to_leader_seconds` counts from the moment the winner saw the election
//! without a leader: its campaign's start with nobody leading, the leader's key gone (its
//! wait woke), the store's lock-delay, or its own loss; waiting behind a healthy leader does
//! not count. A hand-off records about the time of one acquisition; a crash, the time from
//! the store expiring the lease to the win; Consul's lock-delay, the delay.
//!
//! Renewals are per session, and one session serves many elections, so they are labelled by
//! backend only.

use std::time::Duration;

use crate::Result;
use crate::backend::keepalive::Renewal;

/// Gauge: 1 while this candidate leads the election, else 0.
pub const IS_LEADER: &str = "incumbent_is_leader";
/// Counter: terms won.
pub const ELECTIONS_WON: &str = "incumbent_elections_won_total";
/// Counter: terms lost, labelled by `reason`.
pub const DEMOTIONS: &str = "incumbent_demotions_total";
/// Counter: acquisition attempts, labelled by `result`.
pub const CAMPAIGN_ATTEMPTS: &str = "incumbent_campaign_attempts_total";
/// Counter: session renewals, labelled by `backend` and `result`.
pub const RENEWALS: &str = "incumbent_renewals_total";
/// Histogram: seconds per session renewal.
pub const RENEW_LATENCY: &str = "incumbent_renew_latency_seconds";
/// Histogram: seconds the election was without a leader, as seen by the candidate that won.
pub const TIME_TO_LEADER: &str = "incumbent_time_to_leader_seconds";

pub(crate) fn record_renewal(
    backend: &'static str,
    outcome: &std::result::Result<Result<Renewal>, tokio::time::error::Elapsed>,
    latency: Duration,
) {
    let result = match outcome {
        Ok(Ok(Renewal::Alive)) => "ok",
        Ok(Ok(Renewal::Gone)) => "gone",
        Ok(Err(_)) => "error",
        Err(_) => "timeout",
    };
    metrics::counter!(RENEWALS, "backend" => backend, "result" => result).increment(1);
    metrics::histogram!(RENEW_LATENCY, "backend" => backend).record(latency.as_secs_f64());
}
