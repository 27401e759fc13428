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
//! | `incumbent_hand_overs_total` | counter | `election`, `outcome` | hand-overs made as leader: `done`, `lapsed`, `refused` ([`CampaignHandle::hand_over`](crate::CampaignHandle::hand_over)); the term's end counts in `incumbent_demotions_total` as `reason="handed_over"`, not as a loss |
//! | `incumbent_shards_owned` | gauge | `group` | shards of a [sharded election](crate::sharded) this process leads, as its shard events say: a shard counts from its `Elected` event to its `Demoted` event (each shard is an election, whose `incumbent_is_leader` drops at the instant its term ends) |
//! | `incumbent_shard_members` | gauge | `group` | members of a sharded election that this process sees |
//! | `incumbent_campaign_attempts_total` | counter | `election`, `result` | acquisition attempts: `won`, `held`, `delayed`, `error` |
//! | `incumbent_renewals_total` | counter | `backend`, `session`, `result` | session renewals: `ok`, `gone`, `error`, `timeout` |
//! | `incumbent_renew_latency_seconds` | histogram | `backend`, `session` | time for one session renewal round trip |
//! | `incumbent_time_to_leader_seconds` | histogram | `election` | failover time: how long the election was without a trusted leader, at most, as the winner measured it ([`Gap::without_leader`](crate::Gap::without_leader)) |
//! | `incumbent_lock_free_to_leader_seconds` | histogram | `election` | how long the election was without a holder, at least: from when the winner saw the lock free to its win ([`Gap::lock_free`](crate::Gap::lock_free)) |
//!
//! The per-election metrics carry a `candidate` label too when the election asks for it
//! ([`ElectionBuilder::label_metrics_with_candidate`](crate::ElectionBuilder::label_metrics_with_candidate)):
//! off by default, since the default candidate id holds the pid and every restart would
//! start new series.
//!
//! `incumbent_time_to_leader_seconds` is what a dashboard's "failover time" means: from the
//! previous leader's last confirmed renewal or release to the win. A waiting candidate cannot
//! see a leader crash; it sees the store free the lock, one ttl after the crashed leader's last
//! renewal. So the figure is the time from the winner seeing the election without a holder
//! (its wait woke, its campaign began with nobody leading, a lock-delay began) to its win,
//! plus the ttl. After a kill -9 it is the real gap to within one renewal interval; after a
//! release (a resign, a clean shutdown) it is one ttl too high, and
//! `incumbent_lock_free_to_leader_seconds`, the same figure without the ttl, is the real one.
//! On the file backend, where the kernel frees a dead holder's lock at once, no ttl is added
//! and the two are the same.
//! When the winner's own process ended the last term (it led, and lost or resigned), both are
//! exactly the time since then. Each term carries both figures: [`Term::gap`](crate::Term::gap).

//! Renewals are per session, and one session serves every election of a process that asks for
//! the same ttl, so they are labelled by the session rather than by election: `session` is the
//! store's own id for it, the one its tools show, so a failing session can be looked up there:
//!
//! | backend | `session` |
//! |---|---|
//! | etcd | the lease id in hex, as `etcdctl lease list` prints it |
//! | Consul | the session id (a UUID), as `/v1/session/list` shows it |
//! | ZooKeeper | the session id in hex (`0x…`), as `zkCli` and the server's log show it |
//! | Redis, memcached | a random id the session draws at its start (these stores have no sessions) |
//! | file | the process id and a session number, `<pid>-<n>` |
//! | memory | the in-process store's session number |
//!
//! The label's cardinality is bounded: one value per live session, so usually one per process
//! and ttl. A session that is lost is replaced by a new one with a new id, and the old series
//! stay in the recorder; `metrics-exporter-prometheus` drops them after a while with
//! `PrometheusBuilder::idle_timeout(MetricKindMask::ALL, Some(...))`. Every result of a session
//! is registered at its start, so `rate(incumbent_renewals_total{result="error"}[5m])` is 0,
//! not absent, while renewals succeed.
//!
//! # Dashboard and alerts
//!
//! The repository's `examples/grafana/incumbent.json` is a Grafana dashboard of these metrics
//! (leader per election, terms won, demotions by reason, failover latency, renewals by session),
//! and `examples/prometheus/incumbent-alerts.yml` holds Prometheus alert rules (an election
//! without a leader, two leaders reported at once, frequent demotions, renewals failing). Load
//! the dashboard with Grafana's *Dashboards → New → Import* (it asks for the Prometheus data
//! source); add the rules file to `rule_files:` in `prometheus.yml` and reload Prometheus. A
//! test (`tests/it/dashboards.rs`) keeps both in step with the names here, and checks the rules
//! with `promtool`.

use std::time::Duration;

/// Gauge: 1 while this candidate leads the election, else 0.
pub const IS_LEADER: &str = "incumbent_is_leader";
/// Counter: terms won.
pub const ELECTIONS_WON: &str = "incumbent_elections_won_total";
/// Counter: terms lost, labelled by `reason`.
pub const DEMOTIONS: &str = "incumbent_demotions_total";
/// Counter: hand-overs this candidate made or refused as leader, labelled by `outcome`:
/// `done` (the target leads), `lapsed` (it did not take office within the window),
/// `refused` (it was not a live candidate, or the line did not clear; nothing moved).
pub const HAND_OVERS: &str = "incumbent_hand_overs_total";
/// Counter: acquisition attempts, labelled by `result`.
pub const CAMPAIGN_ATTEMPTS: &str = "incumbent_campaign_attempts_total";
/// Counter: session renewals, labelled by `backend`, `session` and `result`.
pub const RENEWALS: &str = "incumbent_renewals_total";
/// Histogram: seconds per session renewal, labelled by `backend` and `session`.
pub const RENEW_LATENCY: &str = "incumbent_renew_latency_seconds";
/// Histogram: seconds the election was without a trusted leader, at most: from the previous
/// leader's last confirmed renewal or release to the win ([`Gap::without_leader`](crate::Gap::without_leader)).
pub const TIME_TO_LEADER: &str = "incumbent_time_to_leader_seconds";
/// Histogram: seconds from the winner seeing the election without a holder to its win: the
/// time without a leader, at least ([`Gap::lock_free`](crate::Gap::lock_free)).
pub const LOCK_FREE_TO_LEADER: &str = "incumbent_lock_free_to_leader_seconds";

/// Gauge: the shards of a sharded election this process leads. Each shard is an election
/// too (`<group>/<k>`), with its own `incumbent_is_leader`.
pub const SHARDS_OWNED: &str = "incumbent_shards_owned";
/// Gauge: the members of a sharded election this process sees.
pub const SHARD_MEMBERS: &str = "incumbent_shard_members";

pub(crate) fn shards_owned(group: &str, owned: usize) {
    metrics::gauge!(SHARDS_OWNED, "group" => group.to_owned()).set(owned as f64);
}

pub(crate) fn shard_members(group: &str, members: usize) {
    metrics::gauge!(SHARD_MEMBERS, "group" => group.to_owned()).set(members as f64);
}

/// Every metric name this crate records, for tools that check dashboards and alert rules.
pub const ALL: [&str; 11] = [
    IS_LEADER,
    ELECTIONS_WON,
    DEMOTIONS,
    HAND_OVERS,
    SHARDS_OWNED,
    SHARD_MEMBERS,
    CAMPAIGN_ATTEMPTS,
    RENEWALS,
    RENEW_LATENCY,
    TIME_TO_LEADER,
    LOCK_FREE_TO_LEADER,
];

/// How one session renewal ended, as the `result` label says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RenewalResult {
    /// The store confirmed the session.
    Ok,
    /// The store says the session is gone.
    Gone,
    /// The request failed.
    Error,
    /// No answer in time.
    Timeout,
}

/// The renewal metrics of one session, registered once at its start.
pub(crate) struct RenewalMetrics {
    ok: metrics::Counter,
    gone: metrics::Counter,
    error: metrics::Counter,
    timeout: metrics::Counter,
    latency: metrics::Histogram,
}

impl RenewalMetrics {
    /// Registers the renewal metrics of the session `session` of `backend`.
    pub(crate) fn new(backend: &'static str, session: &str) -> RenewalMetrics {
        let session = metrics::SharedString::from(session.to_owned());
        let counter = |result: &'static str| metrics::counter!(RENEWALS, "backend" => backend, "session" => session.clone(), "result" => result);
        RenewalMetrics {
            ok: counter("ok"),
            gone: counter("gone"),
            error: counter("error"),
            timeout: counter("timeout"),
            latency: metrics::histogram!(RENEW_LATENCY, "backend" => backend, "session" => session.clone()),
        }
    }

    /// Records one renewal's outcome and round trip.
    pub(crate) fn record(&self, result: RenewalResult, latency: Duration) {
        let counter = match result {
            RenewalResult::Ok => &self.ok,
            RenewalResult::Gone => &self.gone,
            RenewalResult::Error => &self.error,
            RenewalResult::Timeout => &self.timeout,
        };
        counter.increment(1);
        self.latency.record(latency.as_secs_f64());
    }
}
